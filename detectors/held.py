"""Readings the agent's adaptive sampling skipped, held at their last published value.

Moneo's adaptive sampling (``producers/sampler.py``) publishes a stable metric only
every few seconds, up to the agent's ``max_interval``; in between, the node's samples
simply lack it. Binned as they arrive, such a metric would leave most bins empty and a
steady straggler would look like a GPU with no readings. So before a sample is
windowed, every window metric it lacks for a device it *does* report takes that
device's last published value, if that value is at most ``hold_seconds`` old. Beyond
that, absence means "no reading" again, as the contract says. A device missing from
the sample altogether (a GPU that fell off the bus) gets nothing held, and a node
that stops sending gets nothing either: holding never hides a silent node or GPU.
Only windowed metrics are held: per-sample signals (XID, throttle) reach the health
monitor exactly as sent, so one XID is never repeated.
"""

from __future__ import annotations

# node → section ("g" GPUs, "n" NICs) → device → metric → [value, event time]
HeldState = dict[str, dict[str, dict[str, dict[str, list[float]]]]]


class HeldReadings:
    """Last published window metrics per node and device; JSON-able for the table."""

    def __init__(self, hold_seconds: float, state: HeldState | None = None) -> None:
        self.hold_seconds = hold_seconds
        self.state: HeldState = state if state is not None else {}

    def to_state(self) -> HeldState:
        """The held values, for a checkpoint."""
        return self.state

    def node(self, node: str) -> dict[str, dict[str, dict[str, list[float]]]]:
        """The held values of one node (created empty): ``JobWindow.add`` reads and
        updates them while it folds the node's sample in."""
        mine = self.state.get(node)
        if mine is None:
            mine = self.state[node] = {"g": {}, "n": {}}
        return mine

    def forget_before(self, ts: float) -> None:
        """Drop values published before ``ts`` (they can no longer be held), and the
        devices and nodes left with none: memory stays bounded as nodes come and go."""
        for node in list(self.state):
            sections = self.state[node]
            for devices in sections.values():
                for dev in list(devices):
                    held = devices[dev]
                    for name in [n for n, (_, at) in held.items() if at < ts]:
                        del held[name]
                    if not held:
                        del devices[dev]
            if not any(sections.values()):
                del self.state[node]
