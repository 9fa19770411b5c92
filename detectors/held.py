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

import math
from collections.abc import KeysView, Sequence
from typing import Any

MAX_KEY_SETS = 256  # distinct sets of sent keys shared between devices
HELD_LAYOUT = 3  # the layout of the state below; a checkpoint in another starts empty
READABLE_LAYOUTS = (2, HELD_LAYOUT)  # layout 2 is layout 3 without the shorthand below
# one device: [values, times, newest]: the last published value of each window metric
# and its event time (None: none held), in the window's metric order, and the newest
# of those times. A value None (in a checkpoint) or NaN (in memory) is no value, and
# has no time. ``times`` is None when every value there is was published at
# ``newest`` (a sample replaced them whole): the usual case costs no list of times.
DeviceHeld = list[Any]
HeldState = dict[str, dict[str, dict[str, DeviceHeld]]]  # node → "g"|"n" → device
# node → "g"|"n" → device → the keys of the sample that last replaced its values
# whole, and left nothing held for a metric that sample lacked
SentKeys = dict[str, dict[str, frozenset[str]]]


class HeldReadings:
    """Last published window metrics per node and device; JSON-able for the table.

    A sample carrying every window metric (what a full-rate agent sends) replaces its
    device's values whole, in O(1) (the values are shared with the window and never
    changed in place). So does a sample, in order, lacking the same metrics as the
    one that last replaced them whole (no source sends every catalog metric: a
    source that never exports some leaves the same gaps every time), as nothing is
    held for those. Only other samples (adaptive sampling's, late ones) take the
    per-metric path.
    """

    def __init__(self, hold_seconds: float, state: dict[str, Any] | None = None) -> None:
        self.hold_seconds = hold_seconds
        state = state or {}
        self.state: HeldState = state.get("nodes", {}) \
            if state.get("layout") in READABLE_LAYOUTS else {}
        # node → a time no later than anything held for it (a value's time, a device's
        # newest): the sweep skips a node with nothing older than its cut. Not
        # checkpointed: a node missing here (new, or restored) is visited by the next
        # sweep, which takes its bound.
        self.oldest: dict[str, float] = {}
        self.earliest = -math.inf  # no later than every bound; -inf: some node has none
        # what each device's values were last replaced whole with (not checkpointed:
        # a device missing here takes the per-metric path once), each distinct set of
        # keys held once (a frozenset of 23 keys is ~2 KB: one a GPU was 2.1 KB a GPU)
        self.whole: dict[str, SentKeys] = {}
        self._key_sets: dict[frozenset[str], frozenset[str]] = {}

    def to_state(self) -> dict[str, Any]:
        """The held values, for a checkpoint."""
        return {"layout": HELD_LAYOUT, "nodes": self.state}

    def node(self, node: str, ts: float) -> dict[str, dict[str, DeviceHeld]]:
        """The held values of one node (created empty): ``JobWindow.add`` reads and
        updates them while it folds in the node's sample of time ``ts``. Every time it
        writes there is ``ts`` (or was there already), so the node's bound is lowered
        to ``ts`` here. A new node has no bound until the next sweep visits it (it may
        end up holding nothing, and the sweep drops such a node)."""
        mine = self.state.get(node)
        if mine is None:
            mine = self.state[node] = {"g": {}, "n": {}}
            self.earliest = -math.inf
        else:
            bound = self.oldest.get(node)
            if bound is not None and ts < bound:
                self.oldest[node] = ts
                self.earliest = min(self.earliest, ts)
        return mine

    def sent_keys(self, node: str) -> SentKeys:
        """The node's devices' keys of the sample that last replaced their values
        whole (``fill`` reads and keeps them; a whole replacement of another kind
        must drop the device's)."""
        mine = self.whole.get(node)
        if mine is None:
            mine = self.whole[node] = {"g": {}, "n": {}}
        return mine

    def forget_node(self, node: str) -> None:
        """The node left the job: nothing of it is held any more."""
        self.state.pop(node, None)
        self.oldest.pop(node, None)
        self.whole.pop(node, None)

    @staticmethod
    def remember(kept: dict[str, DeviceHeld], dev: str, values: Sequence[float | None],
                 ts: float) -> None:
        """``dev`` published every metric (``values``) at ``ts``: hold them where newer."""
        mine = kept.get(dev)
        if mine is None or ts >= mine[2]:  # newer than anything held: replace whole
            kept[dev] = [values, None, ts]
            return
        held, times = list(mine[0]), _times(mine, len(values))  # late: where it is newer
        for i, value in enumerate(values):
            at = times[i]
            if at is None or ts >= at:
                held[i], times[i] = value, ts
        kept[dev] = [held, times, mine[2]]

    def fill(self, kept: dict[str, DeviceHeld], whole: dict[str, frozenset[str]], dev: str,
             values: Sequence[float | None], sent: KeysView[str],
             ts: float) -> Sequence[float | None]:
        """``dev``'s values of the window metrics at ``ts``: ``values``, what it sent
        (NaN where it sent nothing, its keys ``sent``), else a value held at most
        ``hold_seconds`` (NaN: no reading); what it sent is remembered. ``whole``:
        the node's section of ``sent_keys``, kept here. (``JobWindow.add`` replaces
        whole, without calling this, a device that lacks what it lacked last time;
        the loop below gives the same result.)"""
        mine = kept.get(dev)
        if mine is None:  # nothing held yet: replaced whole
            kept[dev] = [values, None, ts]
            whole[dev] = self._shared(sent)
            return values
        held, times = list(mine[0]), _times(mine, len(values))
        out = list(values)
        for i, value in enumerate(values):
            at = times[i]
            if value is None or value != value:  # not sent
                if at is not None and 0.0 <= ts - at <= self.hold_seconds:
                    out[i] = held[i]
            elif at is None or ts >= at:
                held[i], times[i] = value, ts
        newest = max(mine[2], ts)
        whole.pop(dev, None)
        if all(at is None or at == newest for at in times):  # replaced whole after all
            kept[dev] = [held, None, newest]
            if all(at is None for at, v in zip(times, values, strict=True)
                   if v is None or v != v):  # nothing held where this one sent nothing
                whole[dev] = self._shared(sent)
        else:
            kept[dev] = [held, times, newest]
        return out

    def _shared(self, sent: KeysView[str]) -> frozenset[str]:
        """``sent`` as a frozenset, one object for every device that sends the same
        keys (at most ``MAX_KEY_SETS`` kept: adaptive sampling makes many)."""
        keys = frozenset(sent)
        if len(self._key_sets) >= MAX_KEY_SETS:
            self._key_sets.clear()
        return self._key_sets.setdefault(keys, keys)

    def forget_before(self, ts: float) -> None:
        """Drop values published before ``ts`` (they can no longer be held), and the
        devices and nodes left with none: memory stays bounded as nodes come and go.
        A node whose bound (``oldest``) is not before ``ts`` holds nothing to drop and
        is not visited; a visited node's bound is taken again from what it keeps."""
        if self.earliest >= ts:  # the usual step: nothing held is that old
            return
        oldest, unknown = self.oldest, -math.inf
        for node in [n for n in self.state if oldest.get(n, unknown) < ts]:
            sections = self.state[node]
            bound = math.inf
            for devices in sections.values():
                # most devices were replaced whole since ``ts``: nothing of theirs to drop
                for dev in [d for d, (_, times, newest) in devices.items()
                            if newest < ts or times is not None]:
                    held, times, newest = devices[dev]
                    if newest < ts:
                        del devices[dev]
                    elif times is not None and any(at is not None and at < ts for at in times):
                        keep = [at is not None and at >= ts for at in times]
                        devices[dev] = [
                            [v if k else None for v, k in zip(held, keep, strict=True)],
                            [at if k else None for at, k in zip(times, keep, strict=True)],
                            newest]
                for _, times, newest in devices.values():
                    if times is None:  # every value published at ``newest``
                        bound = min(bound, newest)
                    else:
                        bound = min(bound, newest, *[at for at in times if at is not None])
            if any(sections.values()):
                oldest[node] = bound
            else:
                del self.state[node]
                oldest.pop(node, None)
                self.whole.pop(node, None)
        self.earliest = min(oldest.values(), default=math.inf)


def _times(mine: DeviceHeld, width: int) -> list[float | None]:
    """A held device's times, one per metric (a copy, to change): None where it holds
    no value."""
    if mine[1] is not None:
        return list(mine[1])
    newest = mine[2]
    return [None if v is None or v != v else newest for v in mine[0]]
