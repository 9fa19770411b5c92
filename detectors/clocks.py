"""Node clocks that are off: estimate each node's offset from the job's clock and
put its samples back on the job's time.

A node whose clock runs 30 s ahead would carry the job's watermark 30 s forward,
so every other node's samples would arrive "late", be dropped, and those nodes
would look silent; a node 30 s behind would have all its own samples dropped. So
each sample is compared with the *job's clock*: the median of the latest
timestamps of the job's nodes (a majority of sane clocks outvotes a few bad ones).
A node's offset is the running mean of how far its samples sit from that clock
(exponentially weighted, so a drifting clock is followed). Every node's mean
carries the same bias: a sample is its node's newest, while the others' latest
samples are on average half a sampling interval older, so a sane node sits about
+2.5 s from the clock at 5 s sampling. What is corrected is therefore the offset
*relative to the median offset* of the job's nodes: once that is
``MIN_CORRECTION`` or more, the node's samples are shifted by it, and every time a
detection carries is then on the job's clock.

Why a few seconds matter: the watermark follows the job's newest placed sample,
so with a 5 s grace a node 3 s behind and one 3 s ahead, plus 2 s of arrival
reordering, lost one sample in seven of the node behind as late (fleet soak job
80: 1,085 samples of its 16 nodes in 30 minutes; 10 with this correction).
Offsets under ``MIN_CORRECTION`` (half a bin) are left alone, because the
estimate also carries the order samples arrive in: a node whose samples come in
after the next tick of its peers reads up to a sampling interval off (the engine's
reordering test: a sane node at -2 s). At a tick well over a bin that error
outgrows the bin, and offsets under the node's own sampling interval are left alone
too: at dcgm-exporter's 30 s the arrival order alone put sane nodes 7-16 s off for
minutes, and the shift moved their samples behind the watermark (13 of a 4-node
job's 80 samples dropped as late, and with them a tensor-parallel straggler:
envelope seed 211). At a tick of a bin or less nothing changed: leaving offsets
under 5 s alone at a 5 s tick also moved which bins a 32-node MoE job's samples
fell in, and raised a false ``slowdown`` in the fleet soak (job 72). Nodes sampling
at different intervals carry different biases too (up to half the longer interval).

A node moves the job's watermark only once ``ESTABLISHED_SAMPLES`` of its samples
have been placed and its offset is known (a new node's first sample cannot drag
the job's time). Limits: a job of one or two nodes has no majority and is not
corrected (the worker's receive time or the Kafka append time would be the
reference there; not used yet); a job where most clocks are off follows the
majority.
"""

from __future__ import annotations

import statistics
from typing import Any

from vigil_gpu_monitor.contracts.messages import Sample

MIN_CORRECTION = 2.5  # seconds from the median offset: smaller ones are not corrected
# at a tick longer than this (a bin and a half: a 5 s agent's interval, learned with
# its jitter, may read a little over the 5 s bin), an offset under the node's sampling
# interval is not corrected either: arrival order alone makes a sane node read up to
# an interval off
LONG_TICK = 3 * MIN_CORRECTION
ESTABLISHED_SAMPLES = 3
MIN_VOTERS = 3  # nodes needed for a majority; fewer: nodes are not corrected
SMOOTHING = 0.1  # weight of the newest difference once a node is established
FORGET_SECONDS = 600.0  # a node unheard this long no longer votes on the job's clock


class ClockOffsets:
    """Per-node clock offsets of one job; JSON-able state for the table."""

    def __init__(self, state: dict[str, Any] | None = None) -> None:
        state = state or {}
        self.latest: dict[str, float] = state.get("latest", {})  # node → latest raw ts
        self.offset: dict[str, float] = state.get("offset", {})
        self.seen: dict[str, int] = state.get("seen", {})  # samples placed per node
        self.estimates: dict[str, int] = state.get("estimates", {})
        self.clock: float | None = state.get("clock")  # median of the latest raw ts
        # the median offset (a sane node's bias) and the samples since the clock was
        # last voted: both taken at a vote, not from the offsets now, so they are
        # checkpointed too (recomputed at a restore, they moved every correction
        # until the next vote: a restored worker decided other than replay)
        self.reference: float = state.get("reference", self._reference())
        self._since_vote: int = state.get("since_vote", 0)

    def to_state(self) -> dict[str, Any]:
        """The offsets and what they rest on, for a checkpoint."""
        return {"latest": self.latest, "offset": self.offset, "seen": self.seen,
                "estimates": self.estimates, "clock": self.clock,
                "reference": self.reference, "since_vote": self._since_vote}

    def place(self, sample: Sample, learn: bool = True,
              interval: float = 0.0) -> tuple[Sample, bool]:
        """The sample on the job's clock (the same dict when no correction applies),
        and whether its node is established enough to move the job's watermark.
        ``learn``: whether its distance from the job's clock may teach its node's
        offset (not for a sample that waited for the broker: ``detectors/delivery.py``);
        ``interval``: the node's sampling interval (0: not known), which its offset
        must pass to be corrected where it is longer than ``LONG_TICK``."""
        node, ts = sample["node"], sample["ts"]
        newest = ts >= self.latest.get(node, ts)
        if newest:
            self.latest[node] = ts
        self._since_vote += 1
        if node not in self.seen or self.clock is None \
                or self._since_vote >= len(self.latest):
            self._vote()
        count = self.seen[node] = self.seen.get(node, 0) + 1
        voters = self._voters()
        if voters >= MIN_VOTERS and newest and learn and self.clock is not None:
            gap = ts - self.clock
            k = self.estimates[node] = self.estimates.get(node, 0) + 1
            known = self.offset.get(node, gap)
            self.offset[node] = known + max(SMOOTHING, 1.0 / k) * (gap - known)
        shift = self._relative(node)
        least = interval if interval > LONG_TICK else MIN_CORRECTION
        placed = sample if abs(shift) < least else {**sample, "ts": ts - shift}
        established = count >= ESTABLISHED_SAMPLES and (node in self.offset
                                                        or voters < MIN_VOTERS)
        return placed, established

    def on_job_clock(self, node: str, established: bool) -> bool:
        """Whether the node's times are on the job's clock: its offset is estimated,
        or the job has too few nodes to correct any and the node is established. A
        node's first samples, before a majority has voted, are not: how far off its
        clock is is not known yet."""
        return node in self.offset or (established and self._voters() < MIN_VOTERS)

    def alive_at(self, node: str, raw_ts: float) -> float:
        """When a sample stamped ``raw_ts`` by ``node`` was taken, on the job's clock,
        corrected by the whole relative offset (no ``MIN_CORRECTION`` step): what
        silence is judged on. The step that switches a drifting node's correction on
        moves its placed samples back by a second at once, which would read as a gap."""
        return raw_ts - self._relative(node)

    def _voters(self) -> int:
        """How many nodes vote on the job's clock (a stage-1 shard fed the job's
        clock counts the job's, ``detectors/jobclock.py``)."""
        return len(self.latest)

    def _relative(self, node: str) -> float:
        """The node's offset from the job's median offset (0 while it has none)."""
        return self.offset.get(node, self.reference) - self.reference

    def _vote(self) -> None:
        """The job's clock: the median of its nodes' latest raw timestamps (a majority
        of sane clocks outvotes the others); nodes unheard for long stop voting."""
        self._since_vote = 0
        newest = max(self.latest.values())
        for node in [n for n, ts in self.latest.items() if ts < newest - FORGET_SECONDS]:
            for table in (self.latest, self.offset, self.seen, self.estimates):
                table.pop(node, None)
        self.clock = statistics.median(self.latest.values())
        self.reference = self._reference()

    def _reference(self) -> float:
        """The median of the nodes' offsets (0 until a majority has one): the bias
        every sane node shares, which no sample is shifted by."""
        if len(self.offset) < MIN_VOTERS:
            return 0.0
        return statistics.median(self.offset.values())
