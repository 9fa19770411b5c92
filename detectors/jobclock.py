"""A sharded job's clock, fed back from stage 2 to its stage-1 shards (issue #46,
docs/sharding.md, ``vigil.jobclock/1``).

One stage places each node's samples against the job's clock, the median of every
node's latest timestamp, and corrects a node once its offset from the median offset
reaches ``MIN_CORRECTION`` (at long ticks, its sampling interval:
``detectors/clocks.py``). A shard sees only its nodes: its median is another one,
and it corrects other nodes than one stage does (or none at all: a shard of two
nodes has no majority). So stage 2, which hears every shard,
computes the job's clock from the shards' summaries (each node's latest raw time and
offset) and sends it back; a shard then votes with it:

- the clock is the job's as of bin ``bin``'s summaries, brought to the moment this
  shard sealed that bin (the job's clock is of the moment the job's watermark was
  ``at``; the shard's was ``w`` then: ``clock - (at - w)``), then carried forward
  by how far the shard's own nodes moved since: the median, over its nodes that sent
  since, of each one's latest time now less its latest time at that seal (the shard
  keeps those, ``remember``). Nodes that fell silent do not count, so the clock
  does not slow down with them (a median of the nodes' latest times did: a 2-node
  shard's clock ran at half speed once one node fell silent); nor does a corrected
  node's placed time feed back into it (the shard's watermark did: false silences);
- corrections are measured from the job's median offset, and the job's node count
  decides whether there is a majority at all.

Until the first job clock arrives (or where it says nothing of this shard's nodes),
the shard votes on its own, as before. This is not one stage's computation: the
clock is a summary round trip old and moved on by an estimate, so a node whose
offset sits right at ``MIN_CORRECTION`` may still be corrected a sample earlier or
later than in one stage (bench/RESULTS.md says how often that shows).
"""

from __future__ import annotations

import statistics
from typing import Any

from vigil_gpu_monitor.contracts import JOBCLOCK_SCHEMA
from vigil_gpu_monitor.contracts.messages import JobClock
from vigil_gpu_monitor.detectors.clocks import MIN_VOTERS, ClockOffsets

MAX_SNAPS = 16  # bins a shard remembers its nodes' times of (a job clock older: alone)


class FedClockOffsets(ClockOffsets):
    """A stage-1 shard's clock offsets, voting with the job's clock once fed."""

    def __init__(self, state: dict[str, Any] | None = None) -> None:
        super().__init__(state)
        # the job clock last fed: {"clock", "reference", "voters", "at", "bin"} (or None)
        self.fed: dict[str, Any] | None = (state or {}).get("fed")
        # bin → (the shard's watermark, its nodes' latest times) when it sealed it: not
        # checkpointed (a restored shard votes alone until it has sealed a fed bin)
        self.snaps: dict[int, tuple[float, dict[str, float]]] = {}

    def to_state(self) -> dict[str, Any]:
        """The offsets, what they rest on and the job clock last fed."""
        return {**super().to_state(), "fed": self.fed}

    def remember(self, b: int, watermark: float | None) -> None:
        """The shard sealed bin ``b`` with its watermark at ``watermark``: keep its
        nodes' latest times, what a job clock of that bin is carried forward from."""
        if watermark is None:
            return
        self.snaps[b] = (watermark, dict(self.latest))
        while len(self.snaps) > MAX_SNAPS:
            del self.snaps[min(self.snaps)]

    def take(self, clock: float | None, reference: float | None, voters: int,
             at: float | None, b: int | None) -> None:
        """The job's clock as stage 2 computed it from the summaries of bin ``b``, at
        the moment the job's watermark was ``at``. Without them, the shard goes on
        voting alone. Used from the next vote on."""
        if clock is None or at is None or b is None:
            self.fed = None
            return
        self.fed = {"clock": clock, "reference": reference, "voters": voters, "at": at,
                    "bin": b}
        for old in [k for k in self.snaps if k < b]:
            del self.snaps[old]

    def _usable(self) -> tuple[float, dict[str, float]] | None:
        """The seal the fed clock is carried forward from (None: not fed, or that
        seal is not known here)."""
        fed = getattr(self, "fed", None)  # None while the base class initialises
        return None if fed is None else self.snaps.get(int(fed["bin"]))

    def _voters(self) -> int:
        if self.fed is None or self._usable() is None:
            return len(self.latest)
        return max(len(self.latest), int(self.fed["voters"]))

    def _vote(self) -> None:
        super()._vote()
        snap = self._usable()
        if snap is None or self.fed is None:
            return
        watermark, then = snap
        moved = [ts - then[n] for n, ts in self.latest.items() if n in then and ts > then[n]]
        self.clock = (self.fed["clock"] - (self.fed["at"] - watermark)
                      + (statistics.median(moved) if moved else 0.0))

    def _reference(self) -> float:
        fed = getattr(self, "fed", None)
        if fed is not None and fed["reference"] is not None and self._usable() is not None:
            return float(fed["reference"])
        return super()._reference()


def node_clocks(clocks: ClockOffsets) -> dict[str, list[float | None]]:
    """Each node's latest raw time and offset (None: not estimated): a summary's
    ``clocks``, what stage 2 computes the job's clock from."""
    return {node: [ts, clocks.offset.get(node)] for node, ts in clocks.latest.items()}


class JobClockKeeper:
    """Stage 2's view of its job's clock: each shard's nodes' latest times and offsets
    as its summary of the bin stage 2 last evaluated carried them (summaries of bins
    not evaluated yet wait; their parts add up). One bin's summaries of every shard,
    so that a shard behind sends the same bin later, not other times. Even so, the
    shards sealed that bin at slightly different moments (each when its own newest
    sample passed it): each shard's times are carried to one moment, the job's
    watermark ``W``, by the distance of the shard's own watermark ``w_k`` in that
    summary from it. So ``clock`` is the median of every node's ``latest + W - w_k``,
    sent with ``at = W`` and the bin (measured: shards 0.4 s apart when their
    moments were not aligned)."""

    def __init__(self, shards: int, state: dict[str, Any] | None = None) -> None:
        state = state or {}
        self.shards = shards
        # shard → node → [latest, offset], as of the last evaluated bin
        self.nodes: dict[str, dict[str, list[float | None]]] = state.get("nodes", {})
        self.moment: dict[str, float] = state.get("moment", {})  # shard → its w_k
        # bin → shard → node → [latest, offset], bins not evaluated yet
        self.pending: dict[str, dict[str, dict[str, list[float | None]]]] = state.get(
            "pending", {})
        self.pending_moment: dict[str, dict[str, float]] = state.get("pending_moment", {})
        self.settled: int | None = state.get("settled")

    def to_state(self) -> dict[str, Any]:
        """JSON-able state for stage 2's checkpoint."""
        return {"nodes": self.nodes, "moment": self.moment, "pending": self.pending,
                "pending_moment": self.pending_moment, "settled": self.settled}

    def take(self, shard: int, b: int, clocks: dict[str, list[float | None]],
             max_ts: float | None) -> None:
        """One part of shard ``shard``'s summary of bin ``b`` (``max_ts``: the shard's
        watermark when it sealed ``b``)."""
        if self.settled is not None and b <= self.settled:
            return  # evaluated already: sent again after a restart
        self.pending.setdefault(str(b), {}).setdefault(str(shard), {}).update(clocks)
        if max_ts is not None:
            self.pending_moment.setdefault(str(b), {})[str(shard)] = max_ts

    def settle(self, b: int) -> None:
        """Bin ``b`` is being evaluated: the clocks of it (and of bins before it) are
        the job's now, shard by shard."""
        for at in sorted((k for k in self.pending if int(k) <= b), key=int):
            moments = self.pending_moment.pop(at, {})
            for shard, clocks in self.pending.pop(at).items():
                self.nodes[shard] = clocks
                if shard in moments:
                    self.moment[shard] = moments[shard]
                else:
                    self.moment.pop(shard, None)
        for at in [k for k in self.pending_moment if int(k) <= b]:
            del self.pending_moment[at]
        self.settled = b if self.settled is None else max(self.settled, b)

    def message(self, job: str, bin_seconds: float, next_bin: int | None,
                max_ts: float | None) -> JobClock:
        """The ``vigil.jobclock/1`` to send every shard of the job now."""
        moment = max(self.moment.values(), default=0.0)  # the job's watermark, W
        carried = {k: moment - self.moment.get(k, moment) for k in self.nodes}
        latest = [v[0] + carried[k] for k, part in self.nodes.items() for v in part.values()
                  if v[0] is not None]
        offsets = [v[1] for part in self.nodes.values() for v in part.values()
                   if v[1] is not None]
        return {"schema": JOBCLOCK_SCHEMA, "job": job, "shards": self.shards,
                "bin_seconds": bin_seconds, "next_bin": next_bin, "max_ts": max_ts,
                "clock": statistics.median(latest) if latest else None,
                "reference": statistics.median(offsets) if len(offsets) >= MIN_VOTERS
                else None,
                "voters": len(latest), "at": moment if self.moment else None,
                "bin": self.settled}
