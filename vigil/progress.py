"""Status lines for long commands (fetching Kafka, replaying or reporting a trace).

On a terminal one line is rewritten in place; otherwise (logs, CI) a line is
printed at most every ``every_seconds``, so a long run shows it is alive without
flooding its log.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """``update(text)`` as often as you like; ``done(text)`` once at the end."""

    def __init__(self, label: str, stream: TextIO | None = None,
                 every_seconds: float | None = None) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.every = every_seconds if every_seconds is not None else (0.2 if self.tty else 10.0)
        self.started = time.monotonic()
        self._last = self.started

    def elapsed(self) -> float:
        """Seconds since this progress began."""
        return time.monotonic() - self.started

    def update(self, text: str) -> None:
        """Show ``text`` if the last line is old enough."""
        now = time.monotonic()
        if now - self._last < self.every:
            return
        self._last = now
        line = f"{self.label}: {text} ({self.elapsed():.0f}s)"
        self.stream.write(f"\r\x1b[K{line}" if self.tty else line + "\n")
        self.stream.flush()

    def done(self, text: str) -> None:
        """The final line, always shown."""
        line = f"{self.label}: {text} in {self.elapsed():.1f}s"
        self.stream.write(f"\r\x1b[K{line}\n" if self.tty else line + "\n")
        self.stream.flush()
