"""Every in-process bench script runs, at its smallest arguments, as its docstring says.

Nothing imports the scripts under ``bench/``, so they rot silently when the code they
call changes (``bench_sharded_cost.py`` stopped at its first sample once
``ShardEngine.ingest`` took a ``wait``). Here each one that needs neither a broker, Redis,
a GPU nor the network runs as a subprocess, with arguments that still reach its main
code path (the simulator, the engines, the table it prints) in seconds, and must exit 0
and print the lines it always prints; a script that checks something itself (the shards'
detections equal one stage's, ``--check``'s full table, the step checks' passes) fails
the case through its exit status. The figures are not checked: they are measurements.

Each case runs in its own temporary working directory: several scripts write the trace
they simulate under ``.vigil/`` of the working directory and read one already there in
place of simulating it again, so in the checkout an earlier run's trace would be read
(the simulator not exercised) and the checkout would fill. Files of the repository are
given by their absolute paths.

Left out:

- ``bench_agent.py``, ``bench_worker.py``, ``bench_store.py``,
  ``bench_sharded_lag.py``: publish to and consume from a Kafka broker;
  ``bench_producer_outage.py`` also stops and starts the local stack's broker.
- ``bench_worker_parts.py``: ``faust-floor`` and ``faust-drain`` need a broker;
  ``compute`` has a fixed size (256 nodes for 150 s), ~28 s.
- ``bench_foreign.py``: the foreign traces and their scorer live outside the
  repository (``../shared/foreign``), and it replays each whole trace in four variants.
- ``bench_ingest.py``: three runs under valgrind's callgrind, ~51 s even at
  ``--gpus 8 --seconds 20`` (each Python start-up under callgrind is most of it).
- ``bench_cost.py``: its smallest run (``--sizes 2 --seeds 1``) is still 43 cases,
  ~26 s of one core.
- ``bench_sampling.py`` over the simulator: a fixed 31 jobs of 300 s, ~45 s; its
  ``--trace`` mode runs here, over the real H100 trace of ``tests/producers``.
- ``bench_steps.py`` (12-19 s at one seed) and ``bench_workload_cost.py`` (17-19 s at
  one seed): neither runs smaller, and `make test`'s CPU lane runs beside the stack
  tests, whose time it adds to (``tests/detectors/test_steps.py`` runs the step
  checks they call; ``tests/detectors/test_workload.py`` the workload estimates).
- ``real_gpu_check.py``, ``real_gpu.sh``, ``gpu_train.py``: a real GPU (NVML) and
  PyTorch; ``real_gpu_check.py``'s offline ``compare`` and ``phases`` are tested in
  ``tests/producers/test_real_gpu_trace.py``.
  ``real_gpu_envelope.py`` runs here with the fake NVML and no load
  (``REAL_GPU_DRY=1``: its plumbing and tables), and its ``report`` over the real
  H200's first run.

Measured on the shared 2-core machine: the slowest case is ``bench_envelope.py``
(9-12 s); the whole module ~40 s.
"""

from __future__ import annotations

import gzip
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
H100_TRACE = ROOT / "tests" / "producers" / "fixtures" / "real_gpu_h100" / "trace.jsonl.gz"
H200_RUN1 = (ROOT / "tests" / "simulator" / "fixtures" / "real_gpu_h200_envelope"
             / "run1-records.jsonl.gz")
# Far above any case's time here (≤ ~20 s): only a hung script reaches it.
TIMEOUT_SECONDS = 180


def _unpack_h100_trace(workdir: Path) -> None:
    (workdir / "h100.jsonl").write_bytes(gzip.decompress(H100_TRACE.read_bytes()))


@dataclass(frozen=True)
class BenchRun:
    """One script at tiny arguments, and the lines (regular expressions, each matched
    against a line of its standard output) it must print."""

    script: str
    args: tuple[str, ...]
    prints: tuple[str, ...]
    prepare: Callable[[Path], None] | None = None  # writes its inputs into the workdir
    env: tuple[tuple[str, str], ...] = ()  # set for its run, beside the inherited ones

    def command(self) -> list[str]:
        return [sys.executable, str(BENCH / self.script), *self.args]


RUNS: dict[str, BenchRun] = {
    "detectors": BenchRun(
        "bench_detectors.py", ("--sizes", "8"),
        (r"GPUs\s+nodes\s+ingest µs/node-sample\s+eval ms/step", r"^\s+8\s+1\s+\d+\s+[\d.]+")),
    "detectors-memory": BenchRun(
        "bench_detectors.py", ("--sizes", "8", "--memory"),
        (r"GPUs\s+heap KB/GPU\s+checkpoint JSON KB/GPU", r"^\s+8\s+[\d.]+\s+[\d.]+\s+[\d.]+$")),
    "envelope": BenchRun(
        "bench_envelope.py", ("--check", "--jobs", "1"),
        (r"^15 scenarios \(5 rows of 3\)", r"^\| parameter \| end \| value \| found \|",
         r"^\| tick \| high \|")),
    "exporter-pages": BenchRun(
        "bench_exporter_pages.py",
        ("--counters", str(ROOT / "deploy" / "dcgm-exporter" / "vigil-counters.csv")),
        (r"^vigil-counters\.csv: \d+ fields enabled, \d+ read by the agent",
         r"^  contract metrics filled", r"^issue250-v100-3\.x-4gpu\.prom: 4 GPUs")),
    "identity": BenchRun(
        "bench_identity.py", ("--nodes", "8", "--seconds", "70", "--rounds", "1"),
        (r"^\d+ node-samples of [\d,]+ bytes", r"Verifier\.check, node key cached +[\d.]+ µs",
         r"processor, verification on : [\d,]+ node-samples/s")),
    "physics": BenchRun(
        "bench_physics.py",
        ("--sizes", "4", "--seeds", "61", "--classes", "slow_40,moe_rotating", "--jobs", "1"),
        (r"^2 scenarios; sizes \(4,\)", r"^\| slow_40 \| 25 %\+ \| held-out \| 1 \|",
         r"^\| moe_rotating \| healthy \| held-out \| 1 \|", r"^held-out: \d+/1 faults found")),
    "replay": BenchRun(
        "bench_replay.py", ("--seconds", "30", "--repeat", "1", "--jobs", "2"),
        (r"mixed\.jsonl: [\d,]+ node-samples", r"^orjson\.loads .* \| replay .* node-samples/s",
         r"--jobs 2: .* same detections$", r"^µs per node-sample: decode \d+")),
    "sampling-trace": BenchRun(
        "bench_sampling.py", ("--trace", "h100.jsonl"),
        (r"^h100\.jsonl: reduction [\d.]+x, peak err p50 .* \(\d+ windows\)",),
        prepare=_unpack_h100_trace),
    "shard-equal": BenchRun(
        "bench_shard_equal.py", ("--simulate-gpus", "64", "--seconds", "120", "--shards", "2,4"),
        (r"^sim-64-120\.jsonl: 2 shards: EQUAL", r"^sim-64-120\.jsonl: 4 shards: EQUAL")),
    "shard-memory": BenchRun(
        "bench_shard_memory.py",
        ("--simulate-gpus", "64", "--seconds", "90", "--shards", "2", "--scale", "1,2",
         "--stage1-seconds", "60"),
        (r"^stage \| GPUs \| held a GPU", r"^1 \| 64 \| ", r"^2 \| 64 \| ", r"^1 \| 128 \| ",
         r"^2 \| 128 \| ")),
    "shard-seam": BenchRun(
        "bench_shard_seam.py", ("--simulate-gpus", "64", "--seconds", "80", "--shards", "2,4"),
        (r"sim-64-80\.jsonl: one stage: [\d,]+ node-bins sealed",
         r"^  4 shards: [\d,]+ of [\d,]+ node-bins bit-identical")),
    "sharded-cost": BenchRun(
        "bench_sharded_cost.py",
        ("--simulate-gpus", "64", "--seconds", "90", "--shards", "2", "--scale", "1,2"),
        (r"^one stage: \d+ us CPU a node-sample",
         r"^stage 1 \(ingest \+ seal \+ summary encoded, all shards\): \d+ us",
         r"^stage 2 at 8 nodes .* detections equal to ShardedJob's: True$",
         r"^stage 2 at 16 nodes \(128 GPUs\)")),
    "stage1-path": BenchRun(
        "bench_stage1_path.py", ("--seconds", "30", "--rounds", "1"),
        (r"^\d+ node-samples, 12 jobs of 2-16 nodes, 2 shards a job",
         r"^Stage1Processor\.handle: .* [1-9][\d,]* summary parts")),
    "stage1-path-parts": BenchRun(
        "bench_stage1_path.py", ("--seconds", "30", "--rounds", "1", "--parts"),
        (r"^ +decode: +[\d.]+ µs", r"^ +fold and seal: +[\d.]+ µs",
         r"^ +summaries encoded: +[\d.]+ µs")),
    "stage2": BenchRun(
        "bench_stage2.py", ("--nodes", "64", "--steps", "2"),
        (r"^nodes \| GPUs \| step ms", r"^64 \| 512 \| \d+ / \d+ / \d+ \| [\d.]+$")),
    "witness": BenchRun(
        "bench_witness.py", ("--steps", "2000"),
        (r"^agent up, default batching +mean .* sent \d+ dropped \d+",
         r"^agent up, a datagram a step +mean", r"^no agent, a send a step +mean")),
    "real-gpu-envelope-dry": BenchRun(
        "real_gpu_envelope.py", ("run", "--out", ".", "--scale", "0.02"),
        (r"^### 1\. NVML's utilisation sample period", r"^\| gemm-500w \| ",
         r"^\| train \| ", r"^### 3\. A kernel waiting on a flag"),
        env=(("REAL_GPU_DRY", "1"),)),
    "real-gpu-envelope-report": BenchRun(
        "real_gpu_envelope.py", ("report", str(H200_RUN1)),
        (r"^\| NVML_GPU_UTILIZATION_SAMPLES \| 71 \| 200\.0 \|",
         r"^\| gemm \| 665 TFLOP/s \| 691 ", r"^\| 24 \| 0\.182 \| 0\.182 \| 0\.045 \|")),
    "fleet-soak": BenchRun(
        "fleet_soak.py", ("--gpu-hours", "1", "--hours-per-job", "0.05", "--procs", "1"),
        (r"^\[ *\d+s\] 1/1 jobs", r"^1 healthy jobs, .* node samples",
         r"^false alarms: \d+")),
}


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


@pytest.mark.parametrize("run", list(RUNS.values()), ids=list(RUNS))
def test_bench_script_runs_at_tiny_arguments(run: BenchRun, tmp_path: Path) -> None:
    if run.prepare is not None:
        run.prepare(tmp_path)
    try:
        done = subprocess.run(run.command(), cwd=tmp_path, capture_output=True, text=True,
                              timeout=TIMEOUT_SECONDS, env={**os.environ, **dict(run.env)})
    except subprocess.TimeoutExpired:
        pytest.fail(f"{run.script} {' '.join(run.args)}: still running after "
                    f"{TIMEOUT_SECONDS} s")
    where = (f"{run.script} {' '.join(run.args)}\n--- stdout:\n{_tail(done.stdout)}"
             f"\n--- stderr:\n{_tail(done.stderr)}")
    assert done.returncode == 0, where
    for line in run.prints:
        assert re.search(line, done.stdout, re.MULTILINE), f"no line /{line}/ in\n{where}"
