"""Real dcgm-exporter pages (``fixtures/dcgm/real``, provenance in its README) through
the real agent: the dcgm source, the adaptive sampler, the contract's encoder and
decoder. Per page: the GPUs found, the published values equal to the page's (after
unit conversion), no DCGM blank published, and the series skipped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vigil_gpu_monitor.contracts.codec import decode_sample, encode_sample
from vigil_gpu_monitor.producers.agent import Agent
from vigil_gpu_monitor.producers.attribution import StaticJob
from vigil_gpu_monitor.producers.dcgm import INT32_BLANK, DcgmExporterSource
from vigil_gpu_monitor.producers.sampler import AdaptiveSampler, SamplingConfig

REAL = Path(__file__).parent / "fixtures" / "dcgm" / "real"

# page → (GPUs with their values as published, series skipped)
EXPECTED: dict[str, tuple[dict[str, dict[str, float]], dict[tuple[str, str], int]]] = {
    "readme-grouped-help-int64-blank.prom": (
        {"0": {"sm_clock": 139.0, "mem_clock": 405.0}},
        {("other", "unparsable"): 2, ("DCGM_FI_DEV_MEMORY_TEMP", "blank"): 1}),
    "gmt122-2.0.13-error-values.prom": (
        {}, {("DCGM_FI_DEV_COMPUTE_PIDS", "unparsable"): 1,
             ("DCGM_FI_DEV_VGPU_PER_PROCESS_UTILIZATION", "unparsable"): 1}),
    "issue250-v100-3.x-4gpu.prom": (
        {"0": {"pcie_replay": 0.0, "gpu_util": 0.0}, "1": {"pcie_replay": 0.0},
         "2": {"pcie_replay": 0.0}, "3": {"pcie_replay": 0.0}}, {}),
    "issue317-a30-mig-3.3.5.prom": (  # device-level fields: the largest MIG copy
        {"0": {"sm_clock": 1440.0, "temperature": 35.0, "power": 52.746},
         "1": {"sm_clock": 1440.0, "temperature": 35.0, "power": 56.127}}, {}),
    "issue490-h100-pod-labels-some-series.prom": (
        {g: {"gpu_util": 0.0} for g in ("0", "1", "2")}, {}),
    "issue512-h100-mig-gr-engine-pods.prom": ({"0": {"gr_engine_active": 0.0}}, {}),
    "issue713-a100-mig-7g.prom": ({"0": {"sm_clock": 1410.0}}, {}),
}


def _publish(pages: list[str]) -> tuple[list[dict[str, Any]], DcgmExporterSource, Agent]:
    """One agent tick per page; every published sample through the contract."""
    scrapes = iter(pages)
    source = DcgmExporterSource("http://node:9400/metrics", fetch=lambda u, t: next(scrapes))
    samples: list[dict[str, Any]] = []

    class Sink:
        def publish(self, sample: dict[str, Any]) -> None:
            samples.append(decode_sample(encode_sample(sample)))

    clock = [0.0]
    agent = Agent("node", {"dcgm": source}, Sink(), AdaptiveSampler(SamplingConfig()),
                  StaticJob("j"), wall=lambda: 1.9e9 + clock[0], monotonic=lambda: clock[0])
    for i in range(len(pages)):
        clock[0] = float(i)
        agent.tick()
    return samples, source, agent


def test_every_real_page_has_an_expectation() -> None:
    assert sorted(p.name for p in REAL.glob("*.prom")) == sorted(EXPECTED)


@pytest.mark.parametrize("page", sorted(EXPECTED))
def test_a_real_page_through_the_agent(page: str) -> None:
    gpus, skipped = EXPECTED[page]
    samples, source, agent = _publish([(REAL / page).read_text()])
    if not gpus:  # a page with nothing usable: never published as an empty, healthy node
        assert samples == [] and agent.errors == {"blind": 1} and source.errors == {}
        return
    assert len(samples) == 1 and not agent.errors and not agent.dropped
    published = {g: {m: v for m, v in metrics.items() if m != "xid"}
                 for g, metrics in samples[0]["gpus"].items()}
    assert {g: sorted(m) for g, m in published.items()} == {g: sorted(m) for g, m in gpus.items()}
    for gpu, metrics in gpus.items():
        assert published[gpu] == pytest.approx(metrics), gpu
    assert all(v < INT32_BLANK for m in samples[0]["gpus"].values() for v in m.values())
    assert dict(source.skipped) == skipped
    assert source.errors == {}


def test_the_readme_blank_on_a_field_vigil_maps_is_absent_never_published() -> None:
    # derived from the real README page: its blank moved onto a mapped field
    text = (REAL / "readme-grouped-help-int64-blank.prom").read_text()
    derived = text.replace("DCGM_FI_DEV_MEMORY_TEMP{", "DCGM_FI_DEV_GPU_TEMP{")
    samples, source, _ = _publish([derived] * 3)
    assert all("temperature" not in s["gpus"]["0"] for s in samples)
    assert samples[0]["gpus"]["0"]["sm_clock"] == 139.0  # the node is not silent
    assert source.skipped[("DCGM_FI_DEV_GPU_TEMP", "blank")] == 3


@pytest.mark.parametrize(("field", "value"), [
    ("DCGM_FI_DEV_POWER_USAGE", "140737488355328.000000"),  # FP64 blank (synthetic)
    ("DCGM_FI_DEV_GPU_TEMP", "2147483632"),  # int32 blank (synthetic)
    ("DCGM_FI_DEV_GPU_TEMP", "2147483634"),  # int32 not supported (synthetic)
    ("DCGM_FI_DEV_FB_USED", "9223372036854775794"),  # int64 not supported
])
def test_every_blank_kind_on_a_real_page_costs_that_value_only(field: str, value: str) -> None:
    text = (REAL / "issue317-a30-mig-3.3.5.prom").read_text()
    line = (f'{field}{{gpu="1",UUID="GPU-2d20791a-b4a6-ba59-97f1-e95b99fe5b49",'
            f'device="nvidia1"}} {value}\n')
    samples, source, agent = _publish([text + line])
    assert sorted(samples[0]["gpus"]) == ["0", "1"]
    assert samples[0]["gpus"]["1"]["sm_clock"] == 1440.0 and not agent.dropped
    assert source.skipped == {(field, "blank"): 1}


def test_a_broken_line_on_an_otherwise_good_page_costs_that_line() -> None:
    # the 2.0.13 page's broken lines appended to the real V100 page: all 4 GPUs stay
    text = (REAL / "issue250-v100-3.x-4gpu.prom").read_text() + (
        REAL / "gmt122-2.0.13-error-values.prom").read_text()
    samples, source, _ = _publish([text])
    assert sorted(samples[0]["gpus"]) == ["0", "1", "2", "3"]
    assert sum(source.skipped.values()) == 2
