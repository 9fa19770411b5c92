"""Silences and acknowledgements, kept in Redis so every alerter and the CLI share them.

- ``P:silences``  hash: silence id → {matchers, starts_at, ends_at, by, comment}
- ``P:acks``      hash: incident id → {by, at}

A silence matches a detection when every matcher matches one of its labels
(``kind``, ``severity``, ``job``, ``node``, ``gpu``, ``incident``); a matcher value
may be a shell-style pattern (``prod-*``).
"""

from __future__ import annotations

import fnmatch
import json
import time
import uuid
from typing import Any

import redis


class SilenceStore:
    """Silences and acks of one Vigil deployment (one key prefix)."""

    def __init__(self, client: redis.Redis, prefix: str = "vigil") -> None:
        self.r = client
        self.silences_key = f"{prefix}:silences"
        self.acks_key = f"{prefix}:acks"
        self._last: dict[str, dict[str, Any]] = {}  # silences last read from Redis
        self._acked: set[str] = set()  # acks seen, for when Redis is unreachable

    def add(self, matchers: dict[str, str], seconds: float, by: str, comment: str = "",
            now: float | None = None) -> str:
        """Create a silence for ``seconds``; returns its id."""
        if not matchers:
            raise ValueError("a silence needs at least one matcher")
        now = time.time() if now is None else now
        ident = uuid.uuid4().hex[:12]
        self.r.hset(self.silences_key, ident, json.dumps({
            "matchers": matchers, "starts_at": now, "ends_at": now + seconds, "by": by,
            "comment": comment}))
        return ident

    def expire(self, ident: str) -> bool:
        """End a silence now; False if there was none."""
        return bool(self.r.hdel(self.silences_key, ident))

    def active(self, now: float | None = None) -> dict[str, dict[str, Any]]:
        """Silences in force; expired ones are removed on the way. While Redis is
        unreachable, the silences last read (still within their end time) apply."""
        now = time.time() if now is None else now
        try:
            raw: dict[bytes, bytes] = self.r.hgetall(self.silences_key)  # type: ignore[assignment]
        except redis.RedisError:
            return {k: v for k, v in self._last.items() if v["starts_at"] <= now < v["ends_at"]}
        found = {}
        every = {}
        for key, value in raw.items():
            silence = json.loads(value)
            if silence["ends_at"] <= now:
                self.r.hdel(self.silences_key, key)
                continue
            every[key.decode()] = silence
            if silence["starts_at"] <= now:
                found[key.decode()] = silence
        self._last = every
        return found

    def silenced_by(self, labels: dict[str, str], now: float | None = None) -> str | None:
        """The id of a silence that covers these labels, if any."""
        for ident, silence in self.active(now).items():
            if all(fnmatch.fnmatchcase(labels.get(k, ""), v)
                   for k, v in silence["matchers"].items()):
                return ident
        return None

    def ack(self, incident: str, by: str, now: float | None = None) -> None:
        """Acknowledge an incident: people know, stop re-notifying."""
        self.r.hset(self.acks_key, incident, json.dumps(
            {"by": by, "at": time.time() if now is None else now}))

    def acked(self, incident: str) -> bool:
        """True once acknowledged; while Redis is unreachable, what was last known."""
        try:
            known = bool(self.r.hexists(self.acks_key, incident))
        except redis.RedisError:
            return incident in self._acked
        if known:
            self._acked.add(incident)
        return known
