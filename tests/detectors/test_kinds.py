"""Each detection kind on its own fault, through the same engine replay uses."""

from __future__ import annotations

from typing import Any

import pytest

from vigil_gpu_monitor.contracts.codec import validate_detection
from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.detectors.baseline import StaticRules
from vigil_gpu_monitor.detectors.engine import ReplayRunner
from vigil_gpu_monitor.detectors.health import SILENT_MISSES, TICK_MARGIN, classify_xid
from vigil_gpu_monitor.detectors.links import LinkParams, find_link_faults
from vigil_gpu_monitor.detectors.window import JobWindow, WindowView
from vigil_gpu_monitor.simulator.cluster import Cluster, Event, Fault, JobSpec, Simulator

START = 3_000_000.0
AT = START + 60


def _run(kind: str, job_kind: str = "data_parallel", end: float | None = None,
         severity: float = 1.3, nodes: int = 4, events: list[Event] | None = None,
         duration: float = 180) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Fault]:
    job = JobSpec("j", [f"n{i}" for i in range(nodes)], kind=job_kind, events=events or [])
    job_level = kind in ("hang", "network_phase")
    fault = Fault(kind, "j", None if job_level else "n2",
                  None if job_level or kind in ("node_silent", "nic_degraded") else "5",
                  AT, end, severity)
    samples = list(Simulator(Cluster([job], [fault]), START, seed=11).samples(duration))
    runner = ReplayRunner(DetectConfig())
    dets = [validate_detection(d) for s in samples for d in runner.feed(s)]
    return dets, samples, fault


def _firing(dets: list[dict[str, Any]]) -> list[tuple[str, str | None, str | None]]:
    return [(d["kind"], d["node"], d["gpu"]) for d in dets if d["state"] == "firing"]


@pytest.mark.parametrize(("code", "severity", "words"), [
    (79, "critical", "fallen off the bus"), (48, "critical", "replace"),
    (13, "info", "application"), (94, "critical", "reset"), (12345, "warning", "investigate")])
def test_xid_fires_on_the_sample_that_carries_it(code: int, severity: str, words: str) -> None:
    dets, samples, _ = _run("xid", severity=float(code))
    carrier = next(s for s in samples if s["gpus"].get("5", {}).get("xid") and s["node"] == "n2")
    first = dets[0]
    assert _firing(dets) == [("gpu_health", "n2", "5")]
    assert first["detected_at"] == carrier["ts"] and first["severity"] == severity
    assert words in first["summary"] and str(code) in first["summary"]
    assert classify_xid(code)[1] == severity


def test_ecc_double_bit_error_is_critical_at_once() -> None:
    dets, samples, _ = _run("ecc_dbe")
    carrier = next(s for s in samples if s["node"] == "n2" and s["gpus"]["5"]["ecc_dbe"] > 0)
    assert _firing(dets) == [("gpu_health", "n2", "5")]
    assert dets[0]["detected_at"] == carrier["ts"] and dets[0]["severity"] == "critical"


def test_thermal_slowdown_is_found_well_before_the_static_minute() -> None:
    dets, samples, fault = _run("thermal")
    health = [d for d in dets if d["kind"] == "gpu_health"]
    assert health and health[0]["node"] == "n2" and health[0]["gpu"] == "5"
    rules = StaticRules()
    static = [d for s in samples for d in rules.feed(s)]
    assert health[0]["detected_at"] - fault.start <= 30
    assert min(d["detected_at"] for d in static) - fault.start >= 60


def test_gpu_falling_off_the_bus() -> None:
    dets, _, _ = _run("gpu_lost")
    assert _firing(dets) == [("gpu_health", "n2", "5")]
    assert "79" in dets[0]["summary"]


def test_hang_is_job_level_and_critical() -> None:
    dets, _, fault = _run("hang")
    assert _firing(dets) == [("hang", None, None)]
    assert 0 < dets[0]["detected_at"] - fault.start <= 30 and dets[0]["severity"] == "critical"


@pytest.mark.parametrize("channels", [2, 8, 24, 32, 64])
def test_a_hang_is_found_within_20_s_whatever_the_nccl_channel_count(channels: int) -> None:
    """A spinning NCCL kernel holds one SM per channel (NVIDIA/nccl#1656): a hung job
    reads sm_active channels/132 (0.015 to 0.48), utilisation 100 %, no work."""
    _, samples, fault = _run("hang", duration=120)
    for s in samples:
        if s["ts"] >= fault.start:
            for g, gpu in s["gpus"].items():
                gpu.update(sm_active=channels / 132 * (0.97 + 0.01 * int(g)), gpu_util=1.0)
    runner = ReplayRunner(DetectConfig())
    hangs = [d for s in samples for d in runner.feed(s) if d["kind"] == "hang"]
    assert hangs and 0 < hangs[0]["detected_at"] - fault.start <= 20


@pytest.mark.parametrize("tick", [15.0, 30.0])
def test_a_hang_seen_at_a_long_tick_pages_once_and_resolves_when_it_ends(tick: float) -> None:
    """At dcgm-exporter's 30 s, a 5 s bin in six holds a sample: the empty bins between
    neither end the hang nor confirm it (judged on the newest bins alone, the hang
    resolved between samples and fired again at each: a page every half minute)."""
    job = JobSpec("j", [f"n{i}" for i in range(4)])
    fault = Fault("hang", "j", None, None, AT, AT + 240)
    runner = ReplayRunner(DetectConfig())
    dets = [d for s in Simulator(Cluster([job], [fault]), START, seed=11, tick=tick
                                 ).samples(AT - START + 420) for d in runner.feed(s)]
    hangs = [(d["state"], d["detected_at"] - AT) for d in dets if d["kind"] == "hang"]
    assert [state for state, _ in hangs] == ["firing", "resolved"], hangs
    assert hangs[0][1] <= 2 * tick + 10 and hangs[1][1] >= 240


def test_gpus_doing_tensor_work_are_not_hung_at_any_sm_level() -> None:
    """The no-progress test reads work: a job whose GPUs read the spin's SM level yet
    still do tensor work (a small kernel, a low-occupancy phase) is not hung."""
    _, samples, fault = _run("hang", duration=120)
    for s in samples:
        if s["ts"] >= fault.start:
            for gpu in s["gpus"].values():
                gpu.update(sm_active=0.2, gpu_util=1.0, tensor_active=0.05)
    runner = ReplayRunner(DetectConfig())
    assert not [d for s in samples for d in runner.feed(s) if d["kind"] == "hang"]


def test_a_gpu_missing_its_utilisation_reading_does_not_veto_a_hang() -> None:
    """One node never reports gpu_util (its readings lost, or longer gaps than the
    hold covers): its GPUs neither confirm nor veto the signature."""
    dets, samples, fault = _run("hang")
    at = next(d["detected_at"] for d in dets if d["kind"] == "hang")
    for s in samples:
        if s["node"] == "n1":
            for gpu in s["gpus"].values():
                gpu.pop("gpu_util", None)
    runner = ReplayRunner(DetectConfig())
    gapped = [d for s in samples for d in runner.feed(s) if d["kind"] == "hang"]
    assert gapped and gapped[0]["detected_at"] == at


def test_gpus_waiting_for_one_that_still_computes_are_not_hung_for_a_minute() -> None:
    """Every GPU but one spins in the collective while that one computes (a hot
    expert in a 30 s step, fleet soak): a wait, not a stuck job, until it lasts."""
    _, samples, fault = _run("hang", duration=200)
    for s in samples:
        if s["node"] == "n2" and s["ts"] >= fault.start:
            s["gpus"]["5"].update(sm_active=0.9, tensor_active=0.4)
    runner = ReplayRunner(DetectConfig())
    hangs = [d for s in samples for d in runner.feed(s) if d["kind"] == "hang"]
    assert hangs and 60 <= hangs[0]["detected_at"] - fault.start <= 80


def test_one_node_still_moving_nvlink_bytes_is_no_hang_though_the_median_is_quiet() -> None:
    """Three nodes of four spin with no work and no traffic; the fourth's GPUs read no
    tensor work but move gradients over NVLink (a 1F1B stage between its forward
    passes, read by a 5 s window at another phase: held-out envelope seed 227). The
    job's median traffic is quiet, yet a collective moves bytes: no hang."""
    _, samples, fault = _run("hang", duration=200)
    for s in samples:
        if s["node"] == "n2" and s["ts"] >= fault.start:
            for gpu in s["gpus"].values():
                gpu.update(nvlink_tx=6e10)
    runner = ReplayRunner(DetectConfig())
    assert not [d for s in samples for d in runner.feed(s) if d["kind"] == "hang"]


def test_checkpoint_and_evaluation_pauses_are_not_hangs() -> None:
    events = [Event("checkpoint", START + 40, START + 100), Event("eval", START + 110,
                                                                  START + 170)]
    job = JobSpec("j", [f"n{i}" for i in range(4)], events=events)
    runner = ReplayRunner(DetectConfig())
    dets = [d for s in Simulator(Cluster([job]), START, seed=2).samples(200)
            for d in runner.feed(s)]
    assert dets == []


def test_silent_node_fires_and_resolves_when_it_returns() -> None:
    dets, _, fault = _run("node_silent", end=AT + 60)
    assert [(d["kind"], d["node"], d["state"]) for d in dets] == [
        ("node_silent", "n2", "firing"), ("node_silent", "n2", "resolved")]
    assert dets[0]["detected_at"] - fault.start <= 30


@pytest.mark.parametrize("tick", [10.0, 30.0])
def test_an_agent_ticking_slowly_is_not_silent_and_a_silent_node_still_is(tick: float) -> None:
    """dcgm-exporter's default scrape is 30 s: a node is silent after missing several
    of its own ticks, not after ``silent_seconds`` of a 1 s agent: four and a half
    ticks more than it missed, and a tick or two more while its path is known for
    only ten ticks (its loss not yet known to be low). At 30 s: 185 s."""
    job = JobSpec("j", [f"n{i}" for i in range(4)])
    fault = Fault("node_silent", "j", "n2", None, START + 300)
    runner = ReplayRunner(DetectConfig())
    # long enough for the bound below to pass at 30 s (300 + 185 s; a watermark a few
    # seconds past 480 s had it only where a node's clock was misplaced forward)
    dets = [d for s in Simulator(Cluster([job], [fault]), START, seed=5, tick=tick).samples(540)
            for d in runner.feed(s) if d["state"] == "firing"]
    assert [(d["kind"], d["node"]) for d in dets] == [("node_silent", "n2")]
    assert dets[0]["detected_at"] - fault.start <= (SILENT_MISSES + TICK_MARGIN + 2) * tick


def test_pcie_downgrade_under_load_is_a_link_fault() -> None:
    dets, _, _ = _run("pcie_downgrade")
    assert _firing(dets) == [("link_health", "n2", "5")]
    assert "PCIe" in dets[0]["summary"]


def test_degraded_nic_blames_the_node() -> None:
    dets, samples, _ = _run("nic_degraded")
    assert ("link_health", "n2", None) in _firing(dets)
    assert "ib_errors" in {c["metric"] for c in dets[0]["evidence"]["causes"]}
    window = JobWindow(5.0)
    for s in samples:
        window.add(s)
    last = window.bin_of(samples[-1]["ts"]) - 1
    later = find_link_faults(WindowView(window, range(last - 11, last + 1)), LinkParams())
    assert [(f.node, f.gpu) for f in later] == [("n2", None)]
    assert {c["metric"] for c in later[0].evidence["causes"]} == {
        "ib_rate", "ib_errors", "ib_xmit_wait"}


def test_degraded_nvlink() -> None:
    dets, _, _ = _run("nvlink_degraded")
    assert ("link_health", "n2", "5") in _firing(dets)


def test_moe_network_phase_is_network_bound_with_shares() -> None:
    dets, _, _ = _run("network_phase", job_kind="moe")
    assert _firing(dets) == [("network_bound", None, None)]
    ev = dets[0]["evidence"]
    assert ev["communication_share"] >= 0.4 and ev["compute_share"] <= 0.45


def test_slow_node_in_a_pipeline_job_blames_the_node() -> None:
    dets, _, _ = _run("slow_node", job_kind="pipeline", nodes=8, duration=240)
    assert _firing(dets) == [("straggler", "n2", None)]


@pytest.mark.parametrize("job_kind", ["pipeline", "moe"])
def test_healthy_structured_jobs_raise_nothing(job_kind: str) -> None:
    job = JobSpec("j", [f"n{i}" for i in range(8)], kind=job_kind,
                  events=[Event("warmup", START, START + 40)])
    runner = ReplayRunner(DetectConfig())
    dets = [d for s in Simulator(Cluster([job], skew_seconds=3, loss=0.01,
                                         reorder_seconds=2), START, seed=5).samples(300)
            for d in runner.feed(s)]
    assert dets == []


def _pcie_findings(gens: list[float]) -> list[tuple[str, str | None]]:
    """link_health findings of a node whose GPU 3 reads ``gens``, one reading a bin
    (a lossy node's), while its GPUs 0-2 read generation 5, all under load."""
    window = JobWindow(5.0)
    for b, gen in enumerate(gens):
        gpus = {str(g): {"sm_active": 0.3, "tensor_active": 0.1,
                         "pcie_gen": gen if g == 3 else 5.0, "pcie_width": 16.0}
                for g in range(4)}
        window.add({"schema": "vigil.sample/1", "ts": 5.0 * b + 1, "job": "j",  # type: ignore[typeddict-item]
                    "node": "n", "gpus": gpus, "host": {}, "nics": {}})
    last = window.bin_of(5.0 * len(gens))
    view = WindowView(window, range(last - len(gens), last))
    return [(f.node, f.gpu) for f in find_link_faults(view, LinkParams())]


def test_a_link_that_trains_back_up_under_load_is_power_management_not_a_fault() -> None:
    assert _pcie_findings([5, 5, 1, 5, 5, 1, 1, 5, 1, 1, 1, 1]) == []


def test_a_link_low_in_single_readings_for_a_few_bins_is_not_yet_a_fault() -> None:
    """A lossy node in an evaluation pass: one reading a bin, each at generation 1 a
    third of the time; four in a row are bound to happen somewhere in a fleet."""
    assert _pcie_findings([5, 5, 5, 5, 5, 5, 5, 5, 1, 1, 1, 1]) == []


def test_a_link_trained_down_for_good_is_a_fault() -> None:
    assert _pcie_findings([5, 5, 5] + [3] * 12) == [("n", "3")]
