"""Streams that are each compared with their peers, bin after bin: what every GPU
(against its node) and every node (against its job) carries from one bin to the
next for the straggler test.

Each stream and metric holds a CUSUM sum of evidence (``detectors/sequential.py``)
for a departure in the direction that a fault moves the metric, and a second sum
the other way (load shed); what the stream has learned about its own normal (its
offset from its peers, its own noise and how much that noise persists); and its
bookkeeping (updates, the bin it was first seen, the bin each sum began to rise).
The state of a stream is one row of floats: a level's streams live as one numpy array
(``StreamTable``) and go to JSON, one flat list per stream, only in a checkpoint.

How a departure is told from normal variation:

- *Noise* is estimated online, per metric, two ways, and the larger is used: the
  robust spread (MAD) of the residuals across all the level's streams in each
  comparable bin, smoothed over a minute, never below the metric's resolution; and
  the stream's own variance. A stream whose noise persists from bin to bin (load
  that wanders slowly) has its noise scaled by ``√((1+ρ)/(1−ρ))``.
- A stream's own noise is learned only from its ordinary bins (within two of its
  noise units): a shift is not spread.
- A stream whose key leaves its level for a while (its node's readings out of the
  window: a lost sample at a 30 s tick) is held as it was, and forgotten after
  ``STREAM_MEMORY_SECONDS``.
- *Static differences* are learned as each stream's offset: a plain mean over its
  first ``TRAINING_BINS`` comparable bins (a moving average of about as many
  while the stream is younger than ``TRAINING_SECONDS``: a warm-up is forgotten),
  then a slow moving average while the stream is quiet. The test may cap the
  offset it uses (GPUs: 10 % of the peers' level), so a GPU already slow when
  Vigil first sees it is not learned as normal. Only streams tested against a cap
  train for ``TRAINING_SECONDS``: one without is not tested while it trains.
  While a stream trains, its offset is not known yet, but the test will never use
  more than the cap: so it is tested from its first bin as if its offset were the
  cap. A departure beyond the cap is a fault whatever the stream goes on to learn,
  and one within it adds no evidence; a GPU slow from the job's start is found in
  its first bins, not after its offset has been learned. Where there is no cap (a
  node against its job) a stream that trains is not tested.
- A departure may come with an *excuse* (``PeerLevel.excuse``): the part of it
  that something other than a fault explains this bin (the clock the power cap
  takes for a hot expert's work). The test and the noise see the departure less
  its excuse (down to 0); the offset is learned from the reading itself, so what
  a stream learns as its normal does not depend on how much was excused while it
  trained.
- A reading that jumps by nature (``MetricSpec.jumps_are_noise``: a node's
  last-period utilisation catches the step's gap or misses it) has its noise taken
  as the standard deviation of the level's readings but the one furthest out
  (their median spread is 0 when most read none), and learns its own noise from
  its jumps.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate
from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

from vigil_gpu_monitor.detectors.robust import MAD_TO_SIGMA, Array, clamp, nanmedian, zero_nan
from vigil_gpu_monitor.detectors.sequential import Cusum, cusum_step

OFFSET_TIME_CONSTANT = 600.0  # seconds: how slowly a stream's own offset adapts
OFFSET_WARMUP_UPDATES = 24  # plain running mean until a stream has this many updates
TRAINING_BINS = 12  # a stream's first compared bins teach its normal (tested against a cap)
# ... and at least its first this many seconds: a job's warm-up (20-60 s of uneven work,
# clocks settling under the power cap) must not be all a stream learns its normal from
TRAINING_SECONDS = 120.0
NOISE_TIME_CONSTANT = 60.0  # seconds: the smoothing of the level-wide noise estimate
VARIANCE_TIME_CONSTANT = 180.0  # seconds: a stream's own variance and autocorrelation
VARIANCE_PRIOR = 4  # bins: a stream's own variance starts from zero with this weight
REL_FLOOR = 0.02  # the noise floor is also this share of the peers' level of the metric
HUBER = 2.5  # what a stream learns from one bin is clipped at this many noise units
ORDINARY = 2.0  # its own noise is learned only from bins within this many of its units
MAX_AUTOCORRELATION = 0.95  # the long-run noise is at most √39 ≈ 6× the per-bin noise
# a stream absent from its level (its node's readings out of the window) is held this
# long, then forgotten: the time its offset takes to learn
STREAM_MEMORY_SECONDS = OFFSET_TIME_CONSTANT


@dataclass(frozen=True)
class MetricSpec:
    """The metrics compared: names, resolution floors of their noise (their unit),
    the direction a fault moves each (+1 up, −1 down), the index of the one whose
    departure is a hardware signature (a lower clock: -1 if none), and how many
    metrics must agree."""

    names: tuple[str, ...]
    floors: Array
    direction: Array
    signature: int
    min_metrics: int
    # the least offset the test uses: 0 where a stream learned to sit below its peers
    # must not lower its own bar (a reading level with its peers is never a departure)
    offset_floor: float = -np.inf
    # per metric: whether its own noise is learned from every calm bin, not only from
    # those within ``ORDINARY`` of its noise units (a reading bimodal by nature, whose
    # jumps are its noise); None: none is
    jumps_are_noise: tuple[bool, ...] | None = None


@dataclass
class Departure:
    """One metric of a stream whose sum passed the threshold."""

    metric: str
    z: float  # this bin's departure in noise units
    value: float
    peer: float
    first: int  # the bin its sum began to rise


@dataclass
class PeerLevel:
    """One comparison level (GPU in node, or node in job) for the latest bin."""

    keys: list[str]
    deviation: Array  # metrics × streams: departure from the peers' median
    valid: NDArray[np.bool_]  # metrics × streams: enough peers, a reading
    peer_level: Array  # metrics × streams: the peers' median (for caps and texts)
    cap: float  # the test uses offsets up to this share of the peers' level (inf: all)
    # residuals measured from their own median: the reference is then the peers'
    # typical level *after* their offsets, which a peer leaving (a silent node, a
    # shrinking job) barely moves, where the plain median of unlike peers (pipeline
    # stages) jumps
    recenter: bool = False
    # metrics × streams: where False, this bin's departure may count against a fault
    # but never for one (learning goes on as usual); None: no gate
    gate: NDArray[np.bool_] | None = None
    # metrics × streams (>= 0): how much of a departure from the stream's own normal,
    # in the direction of a fault, something other than a fault explains this bin
    # (the clock the power cap takes for more work). It is taken from the departure
    # the test sees, not from what the stream learns its normal from; None: nothing
    excuse: Array | None = None


@dataclass
class Outcome:
    """What one bin decided for a level: ``found`` (streams whose sums passed the
    threshold on ``min_metrics`` metrics or more), ``departed`` (on one metric at
    least, not the signature one) and ``shed`` (less busy than their own normal, half
    the threshold on ``min_metrics`` metrics)."""

    found: dict[str, list[Departure]]
    departed: set[str]
    shed: set[str]

# A stream's state, one flat list (JSON-able, in the engine's persisted state): per
# metric, seven fields (sums of evidence, the bins where each began to rise, offsets,
# own variances, lag-1 covariances, last residuals, sums of evidence the other way:
# load shed); then three per stream (updates learned, the bin it was first seen, the
# bin it was last in its level).
SUM, RISE, OFF, VAR, COV, PREV, SHED = range(7)
_FIELDS = 7
_FRESH_FIELDS = (0.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0)


@functools.cache
def _fresh(metrics: int) -> tuple[float, ...]:
    """A new stream's row for ``metrics`` metrics."""
    return (*[v for v in _FRESH_FIELDS for _ in range(metrics)], 0.0, -1.0, -1.0)


class StreamTable:
    """One level's streams, live: their keys and one (fields × streams) array, kept
    from bin to bin, a field a contiguous row (the test reads and writes whole
    fields: as (streams × fields) rows, each element was a cache line of its own,
    and turning them into fields and back cost a third of the pass at 131,072
    GPUs). A checkpoint keeps them as a dict of flat lists, one a stream
    (``to_state``); converting every stream between the two at every bin cost a
    quarter of a large job's step (bench/RESULTS.md), so it happens only at a
    checkpoint and a restore."""

    def __init__(self, keys: list[str], columns: Array) -> None:
        self.keys = keys
        self.columns = columns

    @property
    def rows(self) -> Array:
        """(streams × fields): a view of the columns."""
        return self.columns.T

    @classmethod
    def load(cls, stored: StreamTable | dict[str, list[float]] | None) -> StreamTable:
        """The live table of a level's stored streams (a table stays as it is)."""
        if isinstance(stored, StreamTable):
            return stored
        if not stored:
            return cls([], np.empty((0, 0)))
        return cls(list(stored), np.array(list(stored.values()), dtype=np.float64).T.copy())

    def to_state(self) -> dict[str, list[float]]:
        """Key → the stream's flat list of floats (JSON-able)."""
        return dict(zip(self.keys, self.columns.T.tolist(), strict=True))

    def replace(self, keys: list[str], columns: Array, oldest: int) -> None:
        """The level's streams after a bin: ``keys``' ``columns``, and the streams
        absent from this bin's level last in it at bin ``oldest`` or later, held as
        they were.

        A node's readings leave the job's window for a tick or two (a lost sample at
        a 30 s tick, a late batch): what its streams learned (offsets, noise) and the
        evidence they hold must not go with them, or a stall that arrived meanwhile is
        learned afresh as the GPU's normal. Streams absent longer are forgotten (a
        node that left the job), so the table stays bounded."""
        if self.keys and keys != self.keys:
            n = len(keys)
            if self.keys[:n] == keys:  # the same level, streams already held after it
                absent: range | list[int] = range(n, len(self.keys))
            else:
                present = set(keys)
                absent = [i for i, k in enumerate(self.keys) if k not in present]
            held = [i for i in absent if self.columns[-1, i] >= oldest]
            if held:
                keys = keys + [self.keys[i] for i in held]
                kept = self.columns[:, held]
                columns = np.concatenate([columns, kept], axis=1) if n else kept
        self.keys, self.columns = keys, columns

    def columns_for(self, keys: list[str], fresh: tuple[float, ...]) -> Array:
        """(fields × streams) for ``keys`` in order; a key not known starts ``fresh``.
        Where the keys are the table's first streams, a view of the table (read it,
        or copy it before writing)."""
        if keys == self.keys[:len(keys)]:  # the table's first streams (held ones after)
            return self.columns[:, :len(keys)]
        index = {k: i for i, k in enumerate(self.keys)}
        at = np.array([index.get(k, -1) for k in keys], dtype=np.int64)
        columns = np.repeat(np.array(fresh, dtype=np.float64)[:, None], len(keys), axis=1)
        if len(self.keys):
            columns[:, at >= 0] = self.columns[:, at[at >= 0]]
        return columns


_A = TypeVar("_A", Array, NDArray[np.bool_])


@dataclass
class Comparison:
    """One level's comparison for the latest bin: the level, its test, its live
    streams and its noise memory (both updated by ``advance``)."""

    level: PeerLevel
    test: Cusum
    streams: StreamTable
    noise: dict[str, list[float | None]]


def advance(comparisons: list[Comparison], spec: MetricSpec, comparable: bool, last: int,
            bin_seconds: float) -> list[Outcome]:
    """Advance every stream of each comparison by the latest bin (``comparable``: the
    job is in a phase where peers are compared; otherwise the sums hold and nothing
    is learned); one outcome per comparison. Streams of keys no longer in a level are
    forgotten.

    The levels' streams go side by side, one column each, through one pass of the
    test: every step below is per stream, except each level's noise and reference,
    taken over its own columns. One pass costs about half of one per level (a step
    of a small job is mostly numpy's overhead per call), and the arithmetic per
    stream is the same, so the results are identical to the bit.
    """
    oldest = last - int(STREAM_MEMORY_SECONDS / bin_seconds)
    for c in comparisons:
        if not c.level.keys:
            c.streams.replace([], np.empty((0, 0)), oldest)
    live = [c for c in comparisons if c.level.keys]
    if not live:
        return [Outcome({}, set(), set()) for _ in comparisons]
    m = len(spec.names)
    fresh = _fresh(m)
    sizes = [len(c.level.keys) for c in live]
    spans = [slice(end - n, end) for end, n in zip(accumulate(sizes), sizes, strict=True)]
    # one owned copy of every stream's fields: the pass writes them in place (``f``
    # below is a view), and they become the tables' columns at the end
    table = np.concatenate([c.streams.columns_for(c.level.keys, fresh) for c in live],
                           axis=1)
    n = table.shape[1]
    valid = _joined([c.level.valid for c in live])
    deviation = _joined([c.level.deviation for c in live])
    peer_level = _joined([c.level.peer_level for c in live])
    k, h, clip, ceiling = np.repeat(  # each test's constants, one column a stream
        np.array([(c.test.k, c.test.h, c.test.clip, c.test.ceiling) for c in live]).T,
        sizes, axis=1)
    f = table[:_FIELDS * m].reshape(_FIELDS, m, n)
    count = table[-3].copy()
    born = table[-2].copy()
    before = f[SUM].copy()
    departure = np.where(valid, deviation - f[OFF], np.nan)
    offset = np.fmax(f[OFF], spec.offset_floor)
    beyond = np.zeros(n, dtype=bool)  # learned further off than the cap
    capped_level: NDArray[np.bool_] = np.zeros(n, dtype=bool)  # tested against a cap
    early = np.full(departure.shape, np.nan)  # a training stream's residual to the cap
    training: NDArray[np.bool_] = count < TRAINING_BINS  # its offset not known yet
    if any(np.isfinite(c.level.cap) for c in live):
        bound = _joined([c.level.cap * np.abs(zero_nan(c.level.peer_level))
                         if np.isfinite(c.level.cap) else np.full(c.level.valid.shape, np.inf)
                         for c in live])
        offset = np.clip(offset, -bound, bound)
        beyond = (np.abs(f[OFF]) > bound).any(axis=0)
        capped_level = np.asarray(np.isfinite(bound).any(axis=0), dtype=bool)
        # what it learns can lower its bar at most to the cap: tested against that
        capped = valid & training & np.isfinite(bound)
        early = np.where(capped, deviation - spec.direction[:, None] * bound, np.nan)
    residual = np.where(valid & ~training, deviation - offset, np.nan)
    excused = _excuser(live, spec)
    residual, early = excused(residual), excused(early)
    sigmas, floors = [], []
    for c, span in zip(live, spans, strict=True):
        # nothing compared at this level this bin (too few peers, all training): its
        # residuals are all NaN, and so are their median and spread (the noise is
        # taken over trained streams only: a residual to the cap is not noise)
        unread = bool(np.isnan(residual[:, span]).all())
        if c.level.recenter and not unread:  # the peers' reference after their offsets
            shift = np.expand_dims(nanmedian(residual[:, span], axis=1), 1)
            residual[:, span] = residual[:, span] - shift
            early[:, span] = early[:, span] - shift
        measured, floor = _noise(residual[:, span], peer_level[:, span], spec, comparable,
                                 bin_seconds, c.noise, unread)
        sigmas.append(measured)
        floors.append(floor)
    measured_sigma, floor_sigma = (np.repeat(np.stack(a, axis=1), sizes, axis=1)
                                   for a in (sigmas, floors))  # metrics × streams
    job_sigma = np.fmax(measured_sigma, floor_sigma)
    # the noise that persists is the noise measured (across the level, or the stream's
    # own); the floor is a resolution, not a persistent component: scaling it by the
    # stream's persistence would count a quiet stream's small wander many times over
    scale = np.fmax(floor_sigma, np.fmax(measured_sigma, np.sqrt(f[VAR])) * _persistence(f))
    # load shed is judged against the stream's whole learned normal (uncapped): a GPU
    # that carried hot experts from the start and has lost them
    # (what is excused this bin is no departure from it either)
    seen = excused(departure)
    below = np.where(training, np.nan, seen) / scale
    z = np.where(training, early, residual) / scale
    if any(c.level.gate is not None for c in live):
        gate = _joined([c.level.gate if c.level.gate is not None
                        else np.ones(c.level.valid.shape, dtype=bool) for c in live])
        z = np.where(gate, z, np.minimum(z, 0.0))  # NaN (no reading) stays NaN: held
    if not comparable:  # the sums hold
        z = below = np.full(residual.shape, np.nan)
    toward = spec.direction[:, None]
    f[SUM] = cusum_step(before, toward * z, k, clip, ceiling)
    f[SHED] = cusum_step(f[SHED], -toward * below, k, clip, ceiling)
    born = np.where(born < 0, last, born)
    # a stream that was already beyond the cap while it trained holds a fault older
    # than its training: that fault is dated from the stream's first bin
    start = np.where((count <= TRAINING_BINS) & beyond, born, last)
    f[RISE] = np.where(f[SUM] <= 0, -1.0, np.where(before <= 0, start, f[RISE]))
    if comparable:
        evidence = before.max(axis=0)
        with np.errstate(invalid="ignore"):
            # a bin beyond two of the stream's own noise units teaches nothing of its
            # noise: a stall whose first bins the gate kept from counting (not busier
            # yet) was learned as variance, and its evidence shrank as it lasted
            ordinary = np.abs(seen) <= ORDINARY * scale  # NaN: False
        if spec.jumps_are_noise is not None:
            ordinary |= np.array(spec.jumps_are_noise)[:, None]
        count = _learn(f, count, valid, np.clip(seen, -HUBER * job_sigma, HUBER * job_sigma),
            training | (evidence <= 2 * k), (evidence < h / 4) & ordinary, bin_seconds,
            young=capped_level & ((last - born) * bin_seconds < TRAINING_SECONDS),
            teaches=None if seen is departure else np.clip(
                departure, -HUBER * job_sigma, HUBER * job_sigma))
    table[-3], table[-2], table[-1] = count, born, float(last)
    decided = _Decided(f, z, h, spec)
    outcomes = {}
    for c, span in zip(live, spans, strict=True):
        c.streams.replace(list(c.level.keys), table[:, span], oldest)
        outcomes[id(c)] = decided.outcome(c.level, span)
    return [outcomes.get(id(c), Outcome({}, set(), set())) for c in comparisons]


def _excuser(live: list[Comparison], spec: MetricSpec) -> Callable[[Array], Array]:
    """What takes each stream's excuse (``PeerLevel.excuse``) out of a departure
    from its normal: in the direction of a fault, down to 0 at most (a departure
    the other way, or none, is left as it is). The identity where no level has one."""
    if all(c.level.excuse is None for c in live):
        return lambda a: a
    excuse = _joined([np.zeros(c.level.valid.shape) if c.level.excuse is None
                      else c.level.excuse for c in live])
    toward = spec.direction[:, None]

    def excused(a: Array) -> Array:
        return a - toward * np.clip(toward * a, 0.0, excuse)
    return excused


def _joined(parts: list[_A], axis: int = 1) -> _A:
    """The levels' arrays side by side (one level: itself, not copied)."""
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=axis)


class _Decided:
    """What the bin decided for every stream of the pass, each against its own
    level's threshold (``h``, one per stream); ``outcome`` reads one level's."""

    def __init__(self, f: Array, z: Array, h: Array, spec: MetricSpec) -> None:
        self.f, self.z, self.spec = f, z, spec
        self.flagged = f[SUM] >= h
        self.found = self.flagged.sum(axis=0) >= spec.min_metrics
        self.departed = self.flagged.any(axis=0)
        if spec.signature >= 0:
            self.departed &= ~self.flagged[spec.signature]
        # load leaving a stream is told at half the threshold, on ``min_metrics``
        # metrics: a moving expert sheds as fast as the next GPU takes it up, and the
        # shed must be seen by the time the taker's sums pass the threshold
        self.shed = (f[SHED] >= h / 2).sum(axis=0) >= spec.min_metrics

    def outcome(self, level: PeerLevel, span: slice) -> Outcome:
        """The level whose streams are the columns ``span``."""
        keys, names = level.keys, self.spec.names
        found: dict[str, list[Departure]] = {}
        for e in np.nonzero(self.found[span])[0]:
            col = span.start + e
            found[keys[e]] = [
                Departure(names[m], float(self.z[m, col]),
                          float(level.peer_level[m, e] + level.deviation[m, e]),
                          float(level.peer_level[m, e]), int(self.f[RISE][m, col]))
                for m in np.nonzero(self.flagged[:, col])[0]]
        return Outcome(found, {keys[e] for e in np.nonzero(self.departed[span])[0]},
                       {keys[e] for e in np.nonzero(self.shed[span])[0]})


def _noise(residual: Array, peer_level: Array, spec: MetricSpec, comparable: bool,
           bin_seconds: float, noise: dict[str, list[float | None]],
           unread: bool = False) -> tuple[Array, Array]:
    """Each metric's noise across the level, and its floor: the robust spread of the
    residuals across streams, smoothed over comparable bins (0 while none was
    taken), and the metric's resolution. ``unread``: every residual is NaN (no
    spread to take)."""
    with np.errstate(invalid="ignore"):
        level = np.abs(nanmedian(peer_level, axis=1))
    floor = np.fmax(spec.floors, REL_FLOOR * zero_nan(level))
    spread = np.full(len(spec.names), np.nan) if unread else nanmedian(
        np.abs(residual - nanmedian(residual, axis=1)[:, None]), axis=1) * MAD_TO_SIGMA
    if spec.jumps_are_noise is not None and not unread:
        # a reading that jumps (most streams level, a few off by a step's gap) has no
        # median spread: its noise is the standard deviation of the level's readings
        # but the one furthest out (a stream off on its own must not hide in it)
        for m in [i for i, jumps in enumerate(spec.jumps_are_noise) if jumps]:
            spread[m] = np.fmax(spread[m], _spread_but_one(residual[m]))
    known = np.array([np.nan if v is None else v
                      for v in noise.get("sigma", [None] * len(spec.names))])
    if comparable:
        a = min(1.0, bin_seconds / NOISE_TIME_CONSTANT)
        known = np.where(np.isnan(known), spread,
                         np.where(np.isnan(spread), known, known + a * (spread - known)))
        noise["sigma"] = [v if v == v else None for v in known.tolist()]  # NaN: None
    return zero_nan(known), floor


def _spread_but_one(readings: Array) -> float:
    """The standard deviation of one metric's readings less the one furthest from
    their median (NaN where fewer than three are read)."""
    row = readings[~np.isnan(readings)]
    if row.size < 3:
        return math.nan
    far = int(np.argmax(np.abs(row - np.median(row))))
    return float(np.std(np.delete(row, far), ddof=1))


def _persistence(f: Array) -> Array:
    """How much a stream's noise persists from bin to bin: ``√((1+ρ)/(1−ρ))`` for its
    lag-1 autocorrelation ρ (the long-run standard deviation over the per-bin one).
    Load that wanders slowly (a node's share of rotating MoE experts) moves a
    stream for many bins in a row; summed, that looks like a shift unless its noise
    is counted at the scale on which it persists."""
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = clamp(zero_nan(f[COV] / f[VAR]), 0.0, MAX_AUTOCORRELATION)
    return np.asarray(np.sqrt((1 + rho) / (1 - rho)), dtype=np.float64)


def _learn(f: Array, count: Array, valid: NDArray[np.bool_], residual: Array,
           quiet: Array, calm: Array, bin_seconds: float,
           young: NDArray[np.bool_] | None = None, teaches: Array | None = None) -> Array:
    """What a stream learns from this bin; returns the new update counts.
    ``teaches``: the departure its offset moves toward, where not ``residual`` (the
    departure before its excuse is taken: the offset is the stream's own normal, the
    excuse this bin's); its noise is learned from ``residual`` all the same.

    A ``young`` stream (first seen less than ``TRAINING_SECONDS`` ago) stays in
    training whatever its count: its count stops one short of ``TRAINING_BINS``,
    so its offset is then a moving average of its last ``TRAINING_BINS`` bins or
    so, which forgets the job's warm-up. Learned as a plain mean of its first
    bins, a warm-up's uneven work left a GPU 6 % slower than its peers from the
    start with an offset of 2.3 %, and the rest summed to a false straggler
    within minutes, again and again through the job (the envelope's fleet soak:
    9 of its 23 false alarms, on two jobs).

    - Its *offset* moves towards its departure while it is ``quiet`` (its sums held
      no more than one bin of modest evidence before this bin: judged on the past
      only, so the choice does not bias what is learned), and always while it
      trains: a plain mean over its first updates, then a slow moving average. A
      small fault keeps the sums up, so it is not learned as normal. The offset is
      not capped here (the noise is about the stream's true mean); the test caps it.
    - Its own *variance* moves while it is ``calm`` (sums under a quarter of the
      threshold), once it has trained: a fault during training would read as noise.
      The looser condition lets bursts of legitimate variation (a hot expert that
      sits on a GPU for a few bins, a reading the agent held) into the estimate,
      which the strict one would leave out. At half the threshold, an 8-12 % stall
      (two to four noise units) was learned as the stream's own variance while its
      sum climbed, and the sum stalled below the threshold (issue #45's envelope).
      ``calm`` also leaves out a bin that departs beyond ``ORDINARY`` of the
      stream's own noise units (the caller's choice): where the gate keeps a stall's
      first bins from counting (a GPU not busier yet), its sums stay at zero, and
      without that the stall itself became the stream's noise.
      Its lag-1 *covariance* moves only while it is quiet: a small shift, summed for
      a few bins, would read as noise that persists.

    ``residual`` comes clipped at ``HUBER`` level-wide noise units (a Huber
    estimate): the first bins of a fault barely move what was learned, and a
    stream's own noise can never exceed ``HUBER`` times the level's.
    """
    learn = quiet & np.any(valid, axis=0)
    new_count = np.where(learn, count + 1, count)
    if young is not None:
        new_count = np.where(young, np.minimum(new_count, TRAINING_BINS - 1), new_count)
    a = np.where(new_count <= OFFSET_WARMUP_UPDATES, 1.0 / np.maximum(new_count, 1),
                 min(1.0, bin_seconds / OFFSET_TIME_CONSTANT))
    toward = residual if teaches is None else teaches
    moved = f[OFF] + a * np.where(valid, zero_nan(toward), 0.0)
    known = calm & ~np.isnan(residual) & (count >= TRAINING_BINS)  # once trained
    now = np.where(known, residual, 0.0)
    # a plain mean that starts from a prior of zero worth ``VARIANCE_PRIOR`` bins (the
    # level-wide noise stands in meanwhile), then a moving average
    b = np.fmax(1.0 / np.maximum(new_count - TRAINING_BINS + VARIANCE_PRIOR, 1),
                min(1.0, bin_seconds / VARIANCE_TIME_CONSTANT))
    spread = f[VAR] + b * (now ** 2 - f[VAR])
    lagged = f[COV] + b * (now * f[PREV] - f[COV])
    f[OFF] = np.where(learn, moved, f[OFF])
    f[VAR] = np.where(known, spread, f[VAR])
    f[COV] = np.where(known & quiet, lagged, f[COV])
    f[PREV] = now
    return np.asarray(new_count, dtype=np.float64)
