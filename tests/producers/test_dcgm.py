"""dcgm-exporter as it really behaves, through the agent into the detectors.

Fixtures under ``fixtures/dcgm`` are in dcgm-exporter's exposition format: a 3.3 exporter
on its default counters with DCGM's profiling module not loaded (no DCGM_FI_PROF_*), a
4.2 exporter with DCP fields, ``err_code``/``err_msg`` XID labels, lowercase
``hostname``, ``pci_bus_id`` and the windowed XID count, and a 4.2 exporter with one GPU
in MIG mode.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vigil_gpu_monitor.contracts.codec import decode_sample, encode_sample
from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.detectors.engine import ReplayRunner
from vigil_gpu_monitor.producers.agent import Agent
from vigil_gpu_monitor.producers.attribution import StaticJob
from vigil_gpu_monitor.producers.dcgm import PROFILING_FIELDS, DcgmExporterSource, parse
from vigil_gpu_monitor.producers.sampler import AdaptiveSampler, SamplingConfig

FIXTURES = Path(__file__).parent / "fixtures" / "dcgm"
V33 = (FIXTURES / "dcgm-exporter-3.3-default.prom").read_text()
V42 = (FIXTURES / "dcgm-exporter-4.2-dcp.prom").read_text()
MIG = (FIXTURES / "dcgm-exporter-4.2-mig.prom").read_text()
T0 = 1_800_000_000.0


def _set(text: str, field: str, gpu: str, value: float | int, **labels: str) -> str:
    """The exposition with ``field`` of ``gpu`` (and ``labels``) set to ``value``."""
    pattern = re.compile(rf'^({field}\{{gpu="{gpu}",[^}}]*\}}) \S+$', re.M)
    hits = [m for m in pattern.finditer(text)
            if all(f'{k}="{v}"' in m.group(1) for k, v in labels.items())]
    assert len(hits) == 1, (field, gpu, labels)
    m = hits[0]
    return text[:m.start()] + f"{m.group(1)} {value}" + text[m.end():]


def _source(texts: list[str]) -> DcgmExporterSource:
    scrapes: Iterator[str] = iter(texts)
    return DcgmExporterSource("http://node-b:9400/metrics", fetch=lambda url, t: next(scrapes))


def _run(texts: list[str], source: DcgmExporterSource | None = None,
         runner: ReplayRunner | None = None,
         start: float = 0.0) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One agent tick a second over the scrapes, each published sample through the
    contract into the detectors; returns (samples, detections)."""
    source = source or _source(texts)
    clock = [start]
    samples: list[dict[str, Any]] = []

    class Sink:
        def publish(self, sample: dict[str, Any]) -> None:
            samples.append(decode_sample(encode_sample(sample)))

    agent = Agent("node-b", {"dcgm": source}, Sink(), AdaptiveSampler(SamplingConfig()),
                  StaticJob("train-1"), wall=lambda: T0 + clock[0], monotonic=lambda: clock[0])
    runner = runner or ReplayRunner(DetectConfig())
    detections: list[dict[str, Any]] = []
    for i in range(len(texts)):
        clock[0] = start + i
        agent.tick()
        detections.extend(runner.feed(samples[-1]))
    return samples, detections


def _health(detections: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in detections if d["kind"] == "gpu_health" and d["state"] == "firing"]


# -- parsing ---------------------------------------------------------------------------------

def test_3x_default_counters_map_onto_the_catalog_without_profiling_fields() -> None:
    scrape = parse(V33)
    assert sorted(scrape.gpus) == ["0", "1"]
    gpu = scrape.gpus["0"]
    assert gpu["sm_clock"] == 1980.0 and gpu["gpu_util"] == 1.0
    assert gpu["power"] == pytest.approx(612.871) and gpu["mem_used"] == 77003 * (1 << 20)
    assert scrape.gpus["1"]["ecc_dbe"] == 2.0
    assert not any(m in gpu for m in ("sm_active", "tensor_active", "dram_active"))
    assert scrape.xid_gauge == {"0": 0, "1": 43} and not scrape.counting
    assert scrape.uuids["1"].startswith("GPU-1b2c") and scrape.models == {"NVIDIA H100 80GB HBM3"}


def test_4x_label_set_with_dcp_fields_and_xid_count() -> None:
    scrape = parse(V42)
    assert sorted(scrape.gpus) == ["0", "1", "2", "3"]
    gpu = scrape.gpus["2"]
    assert gpu["sm_active"] == pytest.approx(0.915532)
    assert gpu["nvlink_tx"] == pytest.approx(88304118784) and gpu["pcie_width"] == 16
    assert gpu["throttle"] == 0 and "xid" not in gpu  # XIDs are events: see XidWatch
    assert scrape.counting and scrape.xid_counts == {("2", 31): 1.0}


@pytest.mark.parametrize(("labels", "gpu"), [
    ('gpu="3",UUID="GPU-x",device="nvidia3",Hostname="n1"', "3"),
    ('gpu="3",UUID="GPU-x",device="nvidia3",hostname="n1"', "3"),
    ('minor_number="5",gpu="3",UUID="GPU-x"', "5"),
    ('UUID="GPU-x",device="nvidia7"', "7"),
])
def test_the_gpu_label_variants(labels: str, gpu: str) -> None:
    scrape = parse(f"DCGM_FI_DEV_GPU_TEMP{{{labels}}} 51\n")
    assert scrape.gpus == {gpu: {"temperature": 51.0}}


def test_mig_instances_are_combined_by_rule_never_overwritten() -> None:
    scrape = parse(MIG)
    assert scrape.mig == {"0"}
    mig, whole = scrape.gpus["0"], scrape.gpus["1"]
    # profiling ratios: weighted by compute slices (3g and 4g of the same GPU)
    assert mig["sm_active"] == pytest.approx((3 * 0.9 + 4 * 0.2) / 7)
    assert mig["tensor_active"] == pytest.approx((3 * 0.6 + 4 * 0.1) / 7)
    assert mig["nvlink_tx"] == pytest.approx(4e6)  # profiling byte rates add up
    assert mig["sm_clock"] == 1755.0 and mig["power"] == pytest.approx(402.5)  # device-level
    assert whole["sm_active"] == pytest.approx(0.91)


def test_nan_and_unknown_fields_are_no_reading() -> None:
    text = _set(V42, "DCGM_FI_DEV_POWER_USAGE", "1", "NaN")
    scrape = parse(text + 'DCGM_FI_DEV_SOMETHING_NEW{gpu="0"} 5\n')
    assert "power" not in scrape.gpus["1"] and "power" in scrape.gpus["0"]


# -- the source: errors, warnings ------------------------------------------------------------

def test_unreachable_and_unparsable_scrapes_are_counted_and_logged_once(
        caplog: pytest.LogCaptureFixture) -> None:
    def refuse(url: str, timeout: float) -> str:
        raise ConnectionRefusedError("nobody home")

    source = DcgmExporterSource("http://127.0.0.1:1/metrics", fetch=refuse)
    with caplog.at_level(logging.WARNING, logger="vigil_gpu_monitor.producers.dcgm"):
        assert source.read(1.0).gpus == {} and source.read(2.0).gpus == {}
    assert source.errors["unreachable"] == 2
    assert len([r for r in caplog.records if "unreachable" in r.message]) == 1
    # one broken line costs that line: the page's other GPU is read, the skip counted
    broken = _source(['DCGM_FI_DEV_GPU_TEMP{gpu="0" 51\nDCGM_FI_DEV_GPU_TEMP{gpu="1"} 52\n'] * 2)
    with caplog.at_level(logging.WARNING, logger="vigil_gpu_monitor.producers.dcgm"):
        assert broken.read(1.0).gpus == {"1": {"temperature": 52.0, "xid": 0.0}}
        broken.read(2.0)
    assert broken.skipped == {("DCGM_FI_DEV_GPU_TEMP", "unparsable"): 2}
    assert len([r for r in caplog.records if "skipped" in r.message]) == 1  # once per field
    binary = _source(["\x00\x01garbage"])  # not text at all: the only failed scrape
    assert binary.read(1.0).gpus == {} and binary.errors["unparsable"] == 1


def test_missing_profiling_fields_warn_once_naming_them_and_the_fix(
        caplog: pytest.LogCaptureFixture) -> None:
    source = _source([V33] * 5 + [V42, V33])
    with caplog.at_level(logging.WARNING, logger="vigil_gpu_monitor.producers.dcgm"):
        for t in range(5):
            reading = source.read(float(t))
            assert "sm_active" not in reading.gpus["0"]  # absent, not zero
    warnings = [r.message for r in caplog.records]
    assert len(warnings) == 1
    assert all(f in warnings[0] for f in PROFILING_FIELDS) and "counters CSV" in warnings[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vigil_gpu_monitor.producers.dcgm"):
        source.read(5.0)  # the exporter was fixed: nothing to say
        source.read(6.0)  # and broke again: one more warning
    assert len(caplog.records) == 1


# -- XIDs: history is not news ---------------------------------------------------------------

def test_a_stale_xid_fires_nothing_and_a_changed_one_fires_within_a_second() -> None:
    texts = [V33] * 30 + [_set(V33, "DCGM_FI_DEV_XID_ERRORS", "1", 79)] * 10
    samples, detections = _run(texts)
    assert samples[0]["meta"]["xid_history"] == {"1": 43}  # kept as context
    assert all(s["gpus"]["1"].get("xid", 0) == 0 for s in samples[:30])
    fired = _health(detections)
    assert fired, "the new XID 79 was not detected"
    assert {(d["node"], d["gpu"]) for d in fired} == {("node-b", "1")}
    assert fired[0]["evidence"]["xid"] == 79
    assert fired[0]["detected_at"] - (T0 + 30) <= 1.0


def test_an_agent_restart_does_not_replay_the_last_xid_as_news() -> None:
    changed = _set(V33, "DCGM_FI_DEV_XID_ERRORS", "1", 79)
    runner = ReplayRunner(DetectConfig())
    _, before = _run([V33] * 5 + [changed] * 5, runner=runner)
    assert len({d["id"] for d in _health(before)}) == 1
    # a new agent (new source) finds 79 already there: history, not a second event
    samples, after = _run([changed] * 10, runner=runner, start=400.0)
    assert samples[0]["meta"]["xid_history"] == {"1": 79}
    assert all(s["gpus"]["1"].get("xid", 0) == 0 for s in samples)
    assert not [d for d in after if d["kind"] == "gpu_health" and d["state"] == "firing"
                and d["detected_at"] >= T0 + 400]


def test_the_same_xid_twice_is_two_events_with_the_count_metric() -> None:
    again = _set(V42, "DCGM_EXP_XID_ERRORS_COUNT", "2", 2, xid="31")  # gauge stays 31
    samples, detections = _run([V42] * 10 + [again] * 3)
    xids = [s["gpus"]["2"].get("xid", 0) for s in samples]
    assert xids[:10] == [0] * 10 and xids[10] == 31 and xids[11:] == [0, 0]
    assert [d["detected_at"] for d in _health(detections)][:1] == [T0 + 10]


def test_a_count_rise_of_several_xids_publishes_every_one_in_turn() -> None:
    burst = _set(V42, "DCGM_EXP_XID_ERRORS_COUNT", "2", 3, xid="31") + (
        'DCGM_EXP_XID_ERRORS_COUNT{gpu="2",UUID="GPU-0a1b2c3d-0000-4000-8000-000000000002",'
        'window_size_in_ms="300000",xid="48"} 1\n')
    samples, _ = _run([V42] * 3 + [burst] * 5)
    published = [s["gpus"]["2"]["xid"] for s in samples if s["gpus"]["2"].get("xid")]
    assert sorted(published) == [31, 31, 48]  # two more 31s and one 48, none overwritten


def test_a_window_count_that_falls_or_an_exporter_restart_is_not_an_event() -> None:
    aged = V42.replace('xid="31"} 1', 'xid="31"} 0')
    restarted = _set(V42.split("# HELP DCGM_EXP_XID")[0], "DCGM_FI_DEV_XID_ERRORS", "2", 0)
    samples, detections = _run([V42] * 3 + [aged] * 3 + [restarted] * 3)
    assert all(s["gpus"]["2"].get("xid", 0) == 0 for s in samples) and not _health(detections)


def test_a_stale_double_bit_ecc_count_is_a_baseline_and_a_rise_fires() -> None:
    rose = _set(V33, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "1", 3)
    _, quiet = _run([V33] * 20)
    assert not _health(quiet)
    _, detections = _run([V33] * 20 + [rose] * 3)
    fired = _health(detections)
    assert fired and fired[0]["detected_at"] == T0 + 20 and fired[0]["severity"] == "critical"


def test_energy_counter_gives_the_mean_power_between_its_changes() -> None:
    def page(mj: int, hw_slowdown: int) -> str:
        labels = 'gpu="0",UUID="GPU-x",device="nvidia0"'
        return (f"DCGM_FI_DEV_POWER_USAGE{{{labels}}} 100.0\n"
                f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{labels}}} {mj}\n"
                f'DCGM_EXP_CLOCK_EVENTS_COUNT{{{labels},clock_event="hw_slowdown"}} '
                f"{hw_slowdown}\n")

    # the exporter refreshes every 2 s; the agent reads every second
    pages = [page(1_000_000, 0), page(1_000_000, 0), page(1_500_000, 0), page(1_500_000, 0),
             page(2_700_000, 0), page(2_700_000, 1)]
    source = _source(pages)
    power = [source.read(float(t)).gpus["0"] for t in range(len(pages))]
    # first change opens a span; the second closes it: 1.2 kJ over 2 s = 600 W
    assert [p["power"] for p in power] == [100.0, 100.0, 100.0, 100.0, 600.0, 600.0]
    assert [int(p.get("throttle", 0)) for p in power] == [0, 0, 0, 0, 0, 0x8]


@pytest.mark.parametrize(("field", "severity"), [("DCGM_FI_DEV_ROW_REMAP_FAILURE", "critical"),
                                                 ("DCGM_FI_DEV_ROW_REMAP_PENDING", "warning")])
def test_a_row_remap_seen_while_watching_fires_and_one_from_before_does_not(
        field: str, severity: str) -> None:
    def page(flag: int) -> str:
        return V33 + f'{field}{{gpu="1",UUID="GPU-1b2c",device="nvidia1"}} {flag}\n'

    _, before = _run([page(1)] * 20)  # already set when the agent started: history
    assert not _health(before)
    _, detections = _run([page(0)] * 20 + [page(1)] * 3)
    fired = _health(detections)
    assert [(d["gpu"], d["severity"], d["detected_at"]) for d in fired] == [
        ("1", severity, T0 + 20)]
    assert ("replace" in fired[0]["summary"]) == (severity == "critical")
