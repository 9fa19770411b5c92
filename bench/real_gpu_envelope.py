"""Issue #45's hardware checks on a real GPU: the envelope's open quantities, measured.

    python3 bench/real_gpu_envelope.py run --out DIR      # ~4.5 min on one GPU (GPU 0)
    python3 bench/real_gpu_envelope.py run --out DIR --checks util,spin   # some of them
    python3 bench/real_gpu_envelope.py report DIR         # the tables again, from DIR
    (or: bash bench/real_gpu.sh envelope)

Three checks, each against the range ``simulator/envelope.py`` draws from:

1. **NVML's utilisation sample period.** GPU 0 runs a known duty cycle (a kernel busy
   for 250 ms of every 500 ms). ``nvmlDeviceGetSamples`` returns the driver's sample
   buffer with a timestamp per sample: the median spacing is the period
   (``util_period``, 1/6-1 s). ``nvmlDeviceGetUtilizationRates`` is polled every
   20 ms beside it: whether it reads the last period (it swings between 0 and 100 %
   with the duty cycle) or a longer mean (it sits near 50 %), and how far a 1 s poll
   lands from the duty cycle's true mean. Power and SM clock samples' spacing too.
2. **Clock and power under a heavy matrix product at the board's limit.** bf16
   8192³ products back to back, on random data and on zeros (which toggle fewer bits,
   so draw less at the same work), then on random data at a 500 W limit. Polled every
   100 ms: power, enforced limit, SM clock, clocks-event reasons. What the simulator
   assumes is checked: a GPU at its limit runs under its maximum clock with the SW
   power cap bit (0x4) set, and draw grows with clock (``physics.py``: draw ~ clock²,
   the exponent measured here over the limits). The draw at the maximum clock that
   this implies is the envelope's ``compute_watts`` (750-1,050 W). ``sweep``: the
   products at 300, 400 and 600 W too; ``train``: a transformer's training steps
   (attention, norms, the optimiser) at 700 and 500 W, the draw a training step has.
3. **``sm_active`` and ``gpu_util`` of a kernel that waits on a flag**, as NCCL's
   kernel waits in a collective that never completes: 2, 8, 24 and 32 CTAs of 512
   threads (NCCL's channels, one CTA a channel) poll a device flag that never flips,
   for 6 s each, and all 132 SMs for comparison. Read through Vigil's own NVML source
   (GPM on Hopper) at 1 s ticks: the envelope's ``waiting_sm`` is channels / SMs.

``run`` writes every reading to ``DIR/records.jsonl`` and the tables to
``DIR/envelope.md``; ``report`` rebuilds the tables from the records. The load runs
in a child process (``load``), so the readings' loop never waits on the GPU.
The GPU's power limit is put back however the run ends.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vigil_gpu_monitor.simulator.physics import IDLE_WATTS

# clocks-event reason bits (nvmlClocksEventReasons)
REASONS = {0x1: "idle", 0x2: "app clocks", 0x4: "SW power cap", 0x8: "HW slowdown",
           0x10: "sync boost", 0x20: "SW thermal", 0x40: "HW thermal",
           0x80: "HW power brake", 0x100: "display clocks"}
DUTY_PERIOD_MS, DUTY_BUSY_MS = 500, 250
SPIN_CTAS = (2, 8, 24, 32, 132)
SPIN_THREADS = 512
SWEEP_WATTS = (300.0, 400.0, 600.0)
DRY = os.environ.get("REAL_GPU_DRY") == "1"  # the fake NVML and no load: plumbing only
SPIN_SOURCE = r"""
extern "C" __global__ void spin(const volatile int* flag, unsigned long long ns, int* out) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    int seen = 0;
    do {
        seen += *flag;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (seen == 0 && t - t0 < ns);
    if (seen) out[blockIdx.x] = seen;
}
"""


# ---------------------------------------------------------------- the load (child)

def _spin_kernel() -> Callable[[int, float], None]:
    """A kernel of ``ctas`` CTAs that polls a flag that never flips for ``seconds``."""
    import cupy as cp

    kernel = cp.RawKernel(SPIN_SOURCE, "spin")
    flag = cp.zeros(1, dtype=cp.int32)
    out = cp.zeros(1024, dtype=cp.int32)

    def run(ctas: int, seconds: float) -> None:
        kernel((ctas,), (SPIN_THREADS,), (flag, cp.uint64(int(seconds * 1e9)), out))
        cp.cuda.Device().synchronize()
    run(1, 0.01)  # compiled and loaded before "ready"
    return run


def _train(seconds: float) -> float:
    """A transformer's training steps back to back (4 layers, width 4,096, 8 × 2,048
    tokens, bf16, AdamW): attention, norms and the optimiser beside the products, a
    lighter draw than products alone. Prints ``ready`` after three steps; tokens/s."""
    import torch

    layer = torch.nn.TransformerEncoderLayer(4096, 32, 16384, batch_first=True,
                                             device="cuda", dtype=torch.bfloat16)
    model = torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-5)
    x = torch.randn(8, 2048, 4096, device="cuda", dtype=torch.bfloat16)

    def step() -> None:
        model(x).float().pow(2).mean().backward()
        optimiser.step()
        optimiser.zero_grad(set_to_none=True)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    print("ready", flush=True)
    end, steps, t0 = time.monotonic() + seconds, 0, time.monotonic()
    while time.monotonic() < end:
        step()
        steps += 1
        if steps % 4 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return 8 * 2048 * steps / (time.monotonic() - t0)


def load(kind: str, seconds: float, ctas: int) -> None:
    """Run one load on GPU 0 for ``seconds``, printing ``ready`` once it is warm and a
    JSON line of what it did at the end."""
    done: dict[str, Any] = {"kind": kind}
    if DRY:  # the plumbing alone, on a machine without a GPU
        print("ready", flush=True)
        time.sleep(seconds)
        print(json.dumps(done), flush=True)
        return
    if kind in ("gemm", "gemm-zeros"):
        import torch

        n = 8192
        make = torch.zeros if kind == "gemm-zeros" else torch.randn
        a = make(n, n, device="cuda", dtype=torch.bfloat16)
        b = make(n, n, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            a @ b
        torch.cuda.synchronize()
        print("ready", flush=True)
        end, products, t0 = time.monotonic() + seconds, 0, time.monotonic()
        while time.monotonic() < end:
            for _ in range(20):
                a @ b
            torch.cuda.synchronize()
            products += 20
        done["tflops"] = 2 * n ** 3 * products / (time.monotonic() - t0) / 1e12
    elif kind == "train":
        done["tokens_per_s"] = _train(seconds)
    elif kind == "spin":
        run = _spin_kernel()
        print("ready", flush=True)
        run(ctas, seconds)
        done["ctas"] = ctas
    elif kind == "duty":  # one CTA busy DUTY_BUSY_MS of every DUTY_PERIOD_MS
        run = _spin_kernel()
        print("ready", flush=True)
        end, busy = time.monotonic() + seconds, []
        start = time.monotonic()
        while start < end:
            t = time.monotonic()
            run(1, DUTY_BUSY_MS / 1000)
            busy.append(time.monotonic() - t)
            start += DUTY_PERIOD_MS / 1000
            time.sleep(max(0.0, start - time.monotonic()))
        done["busy_ms"] = statistics.median(busy) * 1000
    else:
        raise SystemExit(f"no load {kind!r}")
    print(json.dumps(done), flush=True)


# ---------------------------------------------------------------- the readings

class Recorder:
    """Polls GPU 0 through pynvml (fast gauges) and Vigil's NVML source (1 s ticks,
    GPM included), writing each reading as a JSON line."""

    def __init__(self, out: Path) -> None:
        import pynvml

        from vigil_gpu_monitor.producers.nvml import NvmlSource
        from vigil_gpu_monitor.producers.nvml_fake import FakeNvml
        self.nvml: Any = FakeNvml(gpus=1) if DRY else pynvml
        self.source = NvmlSource(self.nvml)
        self.key = sorted(self.source.devices)[0]
        self.h = self.source.devices[self.key]
        self.file = (out / "records.jsonl").open("a")
        self.t0 = time.monotonic()

    def write(self, record: dict[str, Any]) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def call(self, name: str, *args: Any) -> Any:
        try:
            return getattr(self.nvml, name)(*args)
        except self.nvml.NVMLError as exc:
            return f"error: {exc}"

    def info(self) -> dict[str, Any]:
        n, h = self.nvml, self.h
        return {"kind": "info", "name": str(self.call("nvmlDeviceGetName", h)),
                "driver": str(self.call("nvmlSystemGetDriverVersion")),
                "max_sm_clock": self.call("nvmlDeviceGetMaxClockInfo", h, n.NVML_CLOCK_SM),
                "power_default_mw": self.call("nvmlDeviceGetPowerManagementDefaultLimit", h),
                "power_constraints_mw": self.call(
                    "nvmlDeviceGetPowerManagementLimitConstraints", h),
                "enforced_mw": self.call("nvmlDeviceGetEnforcedPowerLimit", h)}

    def measure(self, phase: str, seconds: float, fast: float) -> None:
        """Poll gauges every ``fast`` s and the source every 1 s, for ``seconds``."""
        n, h = self.nvml, self.h
        end = time.monotonic() + seconds
        next_tick = time.monotonic()
        self.source.read(time.monotonic())  # GPM needs a sample before the phase's first
        next_tick += 1.0
        while (now := time.monotonic()) < end:
            util = self.call("nvmlDeviceGetUtilizationRates", h)
            self.write({"kind": "gauge", "phase": phase, "t": now - self.t0,
                        "util": getattr(util, "gpu", None),
                        "power_mw": self.call("nvmlDeviceGetPowerUsage", h),
                        "sm_clock": self.call("nvmlDeviceGetClockInfo", h, n.NVML_CLOCK_SM),
                        "reasons": self.call("nvmlDeviceGetCurrentClocksEventReasons", h),
                        "temp": self.call("nvmlDeviceGetTemperature", h,
                                          n.NVML_TEMPERATURE_GPU),
                        "enforced_mw": self.call("nvmlDeviceGetEnforcedPowerLimit", h)})
            if now >= next_tick:
                reading = self.source.read(now)
                self.write({"kind": "tick", "phase": phase, "t": now - self.t0,
                            **reading.gpus.get(self.key, {})})
                next_tick += 1.0
            time.sleep(max(0.0, min(fast, end - time.monotonic())))

    def samples(self, phase: str, since_us: int) -> None:
        """The driver's sample buffers (utilisation, power, SM clock) since ``since_us``
        (µs since the epoch; 0: all the driver holds)."""
        n = self.nvml
        for name in ("NVML_GPU_UTILIZATION_SAMPLES", "NVML_TOTAL_POWER_SAMPLES",
                     "NVML_PROCESSOR_CLK_SAMPLES"):
            got = self.call("nvmlDeviceGetSamples", self.h, getattr(n, name), since_us)
            if isinstance(got, str):
                self.write({"kind": "samples", "phase": phase, "type": name, "error": got})
                continue
            value_type, samples = got
            field = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")[value_type]
            self.write({"kind": "samples", "phase": phase, "type": name,
                        "values": [[s.timeStamp, getattr(s.sampleValue, field)]
                                   for s in samples]})

    def set_limit(self, watts: float) -> Any:
        return self.call("nvmlDeviceSetPowerManagementLimit", self.h, int(watts * 1000))


def _limit(rec: Recorder, watts: float | None) -> None:
    """Set the board's power limit (recorded with NVML's answer)."""
    if watts is not None:
        rec.write({"kind": "set-limit", "watts": watts, "result": str(rec.set_limit(watts))})


def _phase(rec: Recorder, phase: str, kind: str, seconds: float, fast: float,
           scale: float, ctas: int = 0, skip: float = 3.0) -> None:
    """One load in a child, measured for ``seconds`` from ``skip`` s after it is warm
    (both × ``scale``, and the child's second of slack)."""
    seconds, skip = seconds * scale, skip * scale
    child = subprocess.Popen([sys.executable, __file__, "load", kind, "--seconds",
                              str(seconds + skip + scale), "--ctas", str(ctas)],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    line = child.stdout.readline()
    if line.strip() != "ready":
        child.kill()
        rec.write({"kind": "error", "phase": phase, "error": f"load said {line!r}"})
        return
    rec.write({"kind": "phase", "phase": phase, "t": time.monotonic() - rec.t0})
    time.sleep(skip)
    rec.measure(phase, seconds, fast)
    try:
        out, _ = child.communicate(timeout=skip + 30)
        rec.write({**json.loads(out.strip().splitlines()[-1]), "kind": "load", "phase": phase})
    except (subprocess.TimeoutExpired, json.JSONDecodeError, IndexError) as exc:
        child.kill()
        rec.write({"kind": "error", "phase": phase, "error": repr(exc)})


CHECKS = ("util", "gemm", "spin", "sweep", "train")


def run(out: Path, scale: float, checks: tuple[str, ...] = CHECKS) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "records.jsonl").unlink(missing_ok=True)
    rec = Recorder(out)
    info = rec.info()
    rec.write(info)
    print(json.dumps(info), flush=True)
    default_w = info["power_default_mw"] / 1000 if isinstance(
        info["power_default_mw"], int) else None
    try:
        rec.measure("idle", 3 * scale, 0.1)
        low = 500.0
        constraints = info["power_constraints_mw"]
        if isinstance(constraints, (list, tuple)):
            low = max(low, constraints[0] / 1000)
        if "util" in checks:
            _phase(rec, "duty", "duty", 10, 0.02, scale)
            rec.samples("duty", 0)  # the whole buffer
        if "gemm" in checks:
            _phase(rec, "gemm", "gemm", 25, 0.1, scale)
            _phase(rec, "gemm-zeros", "gemm-zeros", 15, 0.1, scale)
            _limit(rec, low)
            _phase(rec, f"gemm-{low:.0f}w", "gemm", 15, 0.1, scale)
            _limit(rec, default_w)
        if "sweep" in checks:  # the draw-against-clock law over more limits
            for watts in SWEEP_WATTS:
                _limit(rec, watts)
                _phase(rec, f"gemm-{watts:.0f}w", "gemm", 8, 0.1, scale)
            _limit(rec, default_w)
        if "train" in checks:
            _phase(rec, "train", "train", 20, 0.1, scale)
            _limit(rec, low)
            _phase(rec, f"train-{low:.0f}w", "train", 10, 0.1, scale)
            _limit(rec, default_w)
        if "spin" in checks:
            for ctas in SPIN_CTAS:
                _phase(rec, f"spin-{ctas}", "spin", 6, 0.1, scale, ctas=ctas, skip=1.5)
    finally:
        if default_w is not None:
            rec.write({"kind": "set-limit", "watts": default_w,
                       "result": str(rec.set_limit(default_w))})
        rec.file.close()
    text = report(out)
    (out / "envelope.md").write_text(text)
    print(text)


# ---------------------------------------------------------------- the tables

def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))] if ordered else math.nan


def _reasons(codes: list[int]) -> str:
    counts = Counter(codes)
    parts = []
    for code, count in counts.most_common(4):
        names = [name for bit, name in REASONS.items() if code & bit] or ["none"]
        parts.append(f"0x{code:x} ({' + '.join(names)}) {100 * count / len(codes):.0f} %")
    return "; ".join(parts)


def _rate(load: dict[str, Any]) -> str:
    """What a load got done: TFLOP/s of products or tokens/s of training."""
    if "tflops" in load:
        return f"{load['tflops']:.0f} TFLOP/s"
    if "tokens_per_s" in load:
        return f"{load['tokens_per_s']:.0f} tokens/s"
    return "—"


def implied_compute_watts(power: float, clock: float, max_clock: float) -> float:
    """The envelope's ``compute_watts`` (draw at the maximum clock) that the simulator's
    law, draw = idle + k·clock² (``simulator/physics.py``), gives a GPU measured at
    ``power`` W and ``clock`` MHz under its limit."""
    return IDLE_WATTS + (power - IDLE_WATTS) * (max_clock / clock) ** 2


def read_records(path: Path) -> list[dict[str, Any]]:
    """A run's records: ``path`` is its folder, its ``records.jsonl`` or that gzipped."""
    if path.is_dir():
        path = path / "records.jsonl"
    text = (gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz"
            else path.read_text())
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def sample_period_ms(records: list[dict[str, Any]], buffer: str) -> float:
    """The median spacing of one of ``nvmlDeviceGetSamples``' buffers (ms)."""
    for r in records:
        if r["kind"] == "samples" and r["type"] == buffer and "values" in r:
            stamps = [s[0] for s in r["values"]]
            return _median([(b - a) / 1000 for a, b in itertools.pairwise(stamps) if b > a])
    return math.nan


def tick_medians(records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """phase → each metric's median over the phase's ticks of Vigil's NVML source."""
    values: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r["kind"] == "tick":
            for name, value in r.items():
                if isinstance(value, (int, float)) and name != "t":
                    values[r["phase"]][name].append(value)
    return {phase: {name: _median(v) for name, v in metrics.items()}
            for phase, metrics in values.items()}


def gauge_readings(records: list[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """phase → the fast poll's readings: power (W), sm_clock, reasons, temp, enforced (W)."""
    out: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r["kind"] != "gauge":
            continue
        for name, field, scale in (("power", "power_mw", 0.001), ("sm_clock", "sm_clock", 1),
                                   ("reasons", "reasons", 1), ("temp", "temp", 1),
                                   ("enforced", "enforced_mw", 0.001), ("util", "util", 1)):
            if isinstance(r.get(field), int):
                out[r["phase"]][name].append(r[field] * scale)
    return out


def report(out: Path) -> str:
    """The checks' tables from a run's records (``read_records``: its folder or file)."""
    records = read_records(out)
    info: dict[str, Any] = next((r for r in records if r["kind"] == "info"), {})
    ticks: dict[str, list[dict[str, Any]]] = defaultdict(list)
    # a load's own line (in the first run's records its "kind" was the load's name:
    # its fields tell it)
    loads = {r["phase"]: r for r in records if "phase" in r
             and ({"tflops", "tokens_per_s", "busy_ms"} & set(r) or r["kind"] == "load")}
    for r in records:
        if r["kind"] == "tick":
            ticks[r["phase"]].append(r)
    lines = [f"GPU: {info.get('name')}, driver {info.get('driver')}, max SM clock "
             f"{info.get('max_sm_clock')} MHz, default power limit "
             f"{info.get('power_default_mw')} mW (limits {info.get('power_constraints_mw')})",
             ""]
    errors = [r for r in records if r["kind"] in ("error", "set-limit")]
    lines += [f"- {r['kind']} {r.get('phase', '')} {r.get('watts', '')} "
              f"{r.get('error', r.get('result', ''))}" for r in errors]
    lines += ["", "### 1. NVML's utilisation sample period", ""]
    lines += ["| buffer | samples | spacing median ms | p10 | p90 | values |",
              "|---|---|---|---|---|---|"]
    for r in records:
        if r["kind"] != "samples":
            continue
        if "error" in r:
            lines.append(f"| {r['type']} | {r['error']} | | | | |")
            continue
        stamps = [s[0] for s in r["values"]]
        gaps = [(b - a) / 1000 for a, b in itertools.pairwise(stamps) if b > a]
        values = [s[1] for s in r["values"]]
        lines.append(f"| {r['type']} | {len(values)} | {_median(gaps):.1f} | "
                     f"{_pct(gaps, 0.1):.1f} | {_pct(gaps, 0.9):.1f} | "
                     f"{', '.join(str(v) for v in values[:12])}… |")
    duty = [g for g in records if g["kind"] == "gauge" and g["phase"] == "duty"
            and isinstance(g["util"], int)]
    if duty:
        utils = [g["util"] for g in duty]
        change_times = [b["t"] for a, b in itertools.pairwise(duty) if b["util"] != a["util"]]
        between = [b - a for a, b in itertools.pairwise(change_times)]
        truth = DUTY_BUSY_MS / DUTY_PERIOD_MS
        one_s = utils[::50]  # a poll every 1 s (every 50th reading at 20 ms)
        lines += ["", f"Polled every 20 ms for {duty[-1]['t'] - duty[0]['t']:.1f} s while "
                  f"one CTA is busy {DUTY_BUSY_MS} ms of every {DUTY_PERIOD_MS} ms (true "
                  f"mean {100 * truth:.0f} %, busy measured "
                  f"{loads.get('duty', {}).get('busy_ms', math.nan):.0f} ms a period):",
                  f"- the value changed {len(change_times)} times; time between changes median "
                  f"{1000 * _median(between):.0f} ms (p10 {1000 * _pct(between, 0.1):.0f}, "
                  f"p90 {1000 * _pct(between, 0.9):.0f});",
                  f"- readings: {100 * sum(u == 0 for u in utils) / len(utils):.0f} % at 0, "
                  f"{100 * sum(u == 100 for u in utils) / len(utils):.0f} % at 100, "
                  f"{100 * sum(0 < u < 100 for u in utils) / len(utils):.0f} % between; "
                  f"mean {statistics.fmean(utils):.1f} %;",
                  f"- a 1 s poll's readings: {', '.join(str(u) for u in one_s)} (sd "
                  f"{statistics.pstdev(one_s) if len(one_s) > 1 else math.nan:.1f} points "
                  f"around a true {100 * truth:.0f} %)."]
    lines += ["", "### 2. Clock and power under bf16 8192³ products", "",
              "| phase | work done | power W median (p90) | enforced limit W | SM clock MHz "
              "median (p10-p90) | temperature °C | clocks-event reasons (share of polls) | "
              "the simulator's compute_watts for it, W |", "|---|---|---|---|---|---|---|---|"]
    max_clock = info.get("max_sm_clock") if isinstance(info.get("max_sm_clock"), int) else None
    points: dict[str, tuple[float, float]] = {}
    readings = gauge_readings(records)
    for phase, got in readings.items():
        if not (phase == "idle" or phase.startswith(("gemm", "train"))) or not got["power"]:
            continue
        power, clock = got["power"], got["sm_clock"]
        p, c = _median(power), _median(clock)
        points[phase] = (p, c)
        implied = (f"{implied_compute_watts(p, c, max_clock):.0f}"
                   if max_clock and phase != "idle" else "—")
        lines.append(
            f"| {phase} | {_rate(loads.get(phase, {}))} | {p:.0f} "
            f"({_pct(power, 0.9):.0f}) | {_median(got['enforced']):.0f} | {c:.0f} "
            f"({_pct(clock, 0.1):.0f}-{_pct(clock, 0.9):.0f}) | {_median(got['temp']):.0f} | "
            f"{_reasons([int(x) for x in got['reasons']])} | {implied} |")
    law = [points[p] for p in points if p == "gemm" or re.fullmatch(r"gemm-\d+w", p)]
    if len({c for _, c in law}) >= 2 and max_clock:
        xs = [math.log(c) for _, c in law]
        ys = [math.log(p - IDLE_WATTS) for p, _ in law]
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        k = (sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
             / sum((x - mx) ** 2 for x in xs))
        lines += ["", f"Products on random data over {len(law)} limits: draw − "
                  f"{IDLE_WATTS:.0f} W ~ clock^{k:.2f} (the simulator's law: ^2)."]
    lines += ["", "### 3. A kernel waiting on a flag that never flips (NCCL's spin)", "",
              "| CTAs of 512 threads | expected CTAs / 132 | sm_active (GPM) | "
              "sm_occupancy | tensor_active | gpu_util | power W | SM clock MHz | reasons |",
              "|---|---|---|---|---|---|---|---|---|"]
    medians = tick_medians(records)
    for ctas in SPIN_CTAS:
        m = medians.get(f"spin-{ctas}")
        if m is None:
            continue
        codes = [int(r["throttle"]) for r in ticks[f"spin-{ctas}"] if "throttle" in r]
        lines.append(
            f"| {ctas} | {ctas / 132:.3f} | {m['sm_active']:.3f} | {m['sm_occupancy']:.3f}"
            f" | {m['tensor_active']:.3f} | {m['gpu_util']:.2f} | {m['power']:.0f} | "
            f"{m['sm_clock']:.0f} | {_reasons(codes)} |")
    lines += ["", "Every tick of Vigil's source per phase (sm_active, gpu_util):", ""]
    for phase, rows in ticks.items():
        lines.append(f"- {phase}: " + ", ".join(
            f"({r.get('sm_active', math.nan):.3f}, {r.get('gpu_util', math.nan):.2f})"
            for r in rows))
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run")
    p_run.add_argument("--out", type=Path, required=True)
    p_run.add_argument("--scale", type=float, default=1.0, help="every phase's length ×")
    p_run.add_argument("--checks", default=",".join(CHECKS),
                       help=f"a comma-separated subset of {','.join(CHECKS)}")
    p_report = sub.add_parser("report")
    p_report.add_argument("dir", type=Path, help="a run's folder, or its records (.jsonl[.gz])")
    p_load = sub.add_parser("load")
    p_load.add_argument("kind")
    p_load.add_argument("--seconds", type=float, required=True)
    p_load.add_argument("--ctas", type=int, default=0)
    args = parser.parse_args()
    if args.command == "run":
        checks = tuple(c for c in args.checks.split(",") if c)
        unknown = set(checks) - set(CHECKS)
        if unknown:
            parser.error(f"no check {', '.join(sorted(unknown))}; known: {', '.join(CHECKS)}")
        run(args.out, args.scale, checks)
    elif args.command == "report":
        print(report(args.dir), end="")
    else:
        load(args.kind, args.seconds, args.ctas)


if __name__ == "__main__":
    main()
