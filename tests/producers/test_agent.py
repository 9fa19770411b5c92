"""The agent loop: catalog-only payloads, broken sources, sampling, attribution."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from vigil_gpu_monitor.contracts.catalog import GPU_METRICS, HOST_METRICS, NIC_METRICS
from vigil_gpu_monitor.contracts.codec import encode_sample
from vigil_gpu_monitor.producers.agent import Agent
from vigil_gpu_monitor.producers.attribution import SlurmJob, StaticJob
from vigil_gpu_monitor.producers.nvml import NvmlSource
from vigil_gpu_monitor.producers.nvml_fake import FakeNvml
from vigil_gpu_monitor.producers.reading import Reading
from vigil_gpu_monitor.producers.sampler import AdaptiveSampler, SamplingConfig


class ListSink:
    def __init__(self) -> None:
        self.samples: list[dict[str, Any]] = []

    def publish(self, sample: dict[str, Any]) -> None:
        encode_sample(sample)  # what the real publishers do first
        self.samples.append(sample)


class Leaky:
    """A misbehaving source that offers user data and junk alongside real metrics."""

    def __init__(self, extra: dict[str, float]) -> None:
        self.extra = extra

    def read(self, now: float) -> Reading:
        return Reading(gpus={"0": {"sm_active": 0.5, **self.extra}},
                       host={"cpu_util": 0.2, **self.extra},
                       meta={"cmdline": "python train.py --secret=x", "user": "alice"})


class Broken:
    def read(self, now: float) -> Reading:
        raise OSError("device busy")


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=20), st.floats(0, 1), max_size=5))
def test_payload_holds_only_catalog_metrics(extra: dict[str, float]) -> None:
    clock = iter(range(1000))
    sink = ListSink()
    agent = Agent("n1", {"leaky": Leaky(extra)}, sink, AdaptiveSampler(SamplingConfig()),
                  StaticJob("j"), monotonic=lambda: float(next(clock)))
    agent.tick()
    sample = sink.samples[0]
    assert set(sample["gpus"]["0"]) <= set(GPU_METRICS)
    assert set(sample["host"]) <= set(HOST_METRICS)
    assert all(set(n) <= set(NIC_METRICS) for n in sample["nics"].values())
    assert set(sample["meta"]) <= {"agent", "gpu_models", "gpu_uuids"}
    assert "secret" not in str(sample) and "alice" not in str(sample)


def test_a_broken_source_is_counted_and_the_rest_published() -> None:
    sink = ListSink()
    agent = Agent("n1", {"nvml": NvmlSource(FakeNvml(gpus=2)), "ib": Broken()}, sink, None,
                  StaticJob("j"))
    agent.tick()
    assert len(sink.samples[0]["gpus"]) == 2
    assert agent.errors == {"source:ib:OSError": 1}


def test_adaptive_agent_publishes_far_fewer_values_but_every_gpu_every_tick() -> None:
    clock = iter(range(10_000))
    sink = ListSink()
    sampler = AdaptiveSampler(SamplingConfig())
    agent = Agent("n1", {"nvml": NvmlSource(FakeNvml(gpus=8))}, sink, sampler,
                  StaticJob("j"), monotonic=lambda: float(next(clock)))
    for _ in range(120):
        agent.tick()
    assert all(len(s["gpus"]) == 8 for s in sink.samples)  # GPUs present: alive
    assert sampler.read / sampler.published > 4


def test_slurm_attribution_from_cgroups(tmp_path: Path) -> None:
    assert SlurmJob(tmp_path)() == ""
    (tmp_path / "system.slice/slurmstepd.scope/job_4242/step_0").mkdir(parents=True)
    (tmp_path / "system.slice/slurmstepd.scope/job_4100").mkdir(parents=True)
    slurm = SlurmJob(tmp_path)
    assert slurm() == "4100"  # two jobs: the older (lower) id
    (tmp_path / "cpuset/slurm/uid_1000/job_77").mkdir(parents=True)
    assert SlurmJob(tmp_path)() == "77"


class Sentinel:
    """A source whose power reading is a value the contract refuses."""

    def __init__(self, power: float) -> None:
        self.power = power

    def read(self, now: float) -> Reading:
        return Reading(gpus={"0": {"power": self.power, "temperature": 51.0},
                             "1": {"power": 300.0}})


def test_an_out_of_range_reading_is_dropped_counted_and_the_rest_published(
        caplog: Any) -> None:
    from prometheus_client import generate_latest

    from vigil_gpu_monitor.producers.metrics import agent_registry

    sink = ListSink()
    clock = iter(range(1000))
    agent = Agent("n1", {"s": Sentinel(140737488355328.0)}, sink, None, StaticJob("j"),
                  monotonic=lambda: float(next(clock)))
    with caplog.at_level("WARNING", logger="vigil_gpu_monitor.producers.agent"):
        for _ in range(3):
            agent.tick()
    assert len(sink.samples) == 3 and not agent.errors  # every tick published
    assert sink.samples[-1]["gpus"] == {"0": {"temperature": 51.0}, "1": {"power": 300.0}}
    assert agent.dropped == {("power", "out_of_range"): 3}
    assert len([r for r in caplog.records if "reading dropped" in r.message]) == 1
    page = generate_latest(agent_registry(agent, object())).decode()
    assert ('vigil_agent_readings_dropped_total{metric="power",reason="out_of_range"} 3.0'
            in page)


class Flaky:
    """Fails (or answers empty) until told to read again."""

    def __init__(self, fail: bool) -> None:
        self.fail, self.down = fail, True

    def read(self, now: float) -> Reading:
        if not self.down:
            return Reading(gpus={"0": {"sm_active": 0.5}})
        if self.fail:
            raise OSError("connection refused")
        return Reading()  # dcgm-exporter unreachable: the source counts it, answers empty


def test_a_node_whose_every_source_failed_is_never_published_as_healthy() -> None:
    sink = ListSink()
    raising, empty = Flaky(fail=True), Flaky(fail=False)
    clock = iter(range(1000))
    agent = Agent("n1", {"nvml": raising, "dcgm": empty}, sink, None, StaticJob("j"),
                  monotonic=lambda: float(next(clock)))
    agent.tick()
    agent.tick()
    assert sink.samples == [] and agent.blind_ticks == 2 and agent.errors["blind"] == 2
    empty.down = False  # one source reads again: the node is published, the streak ends
    agent.tick()
    assert len(sink.samples) == 1 and sink.samples[0]["gpus"] and agent.blind_ticks == 0


def test_a_node_whose_gpu_sources_read_no_gpu_is_not_published() -> None:
    """The host still reads, but the GPU source (an unreachable dcgm-exporter) does not:
    a sample without GPUs would read as a healthy node with nothing on it."""

    class Host:
        def read(self, now: float) -> Reading:
            return Reading(host={"cpu_util": 0.3})

    sink = ListSink()
    dcgm = Flaky(fail=False)
    clock = iter(range(1000))
    agent = Agent("n1", {"dcgm": dcgm, "host": Host()}, sink, None, StaticJob("j"),
                  monotonic=lambda: float(next(clock)), gpu_sources=frozenset({"dcgm"}))
    agent.tick()
    assert sink.samples == [] and agent.errors["blind"] == 1
    dcgm.down = False
    agent.tick()
    assert sink.samples[0]["gpus"] and sink.samples[0]["host"]
    alone = Agent("n2", {"host": Host()}, ListSink(), None, StaticJob("j"),
                  gpu_sources=frozenset({"dcgm"}))  # no GPU source configured: host only
    alone.tick()
    assert alone.sink.samples and not alone.errors  # type: ignore[attr-defined]
