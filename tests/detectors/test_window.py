"""The window's two stages and its kept matrices give what a rebuild from scratch gives."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.detectors.engine import JobEngine
from vigil_gpu_monitor.detectors.window import JobWindow, WindowView
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator

START = 3_000_000.0


def _rebuilt(window: JobWindow, bins: range) -> WindowView:
    """The same view from a window restored from JSON: nothing kept from earlier steps."""
    copy = JobWindow(window.bin_seconds, json.loads(json.dumps(window.to_state())),
                     window.gpu_metrics, window.nic_metrics)
    assert copy.restored
    return WindowView(copy, bins)


@pytest.mark.parametrize("event", ["none", "node_joins", "node_leaves"])
def test_each_steps_matrices_equal_a_rebuild(event: str) -> None:
    nodes = [f"n{i}" for i in range(4)]
    job = JobSpec("job-w", nodes)
    cluster = Cluster([job], [Fault("slow_gpu", "job-w", "n1", "2", START + 30)])
    engine = JobEngine("job-w", DetectConfig())
    checked = 0
    for sample in Simulator(cluster, START, seed=4).samples(150):
        t = sample["ts"] - START
        if event == "node_joins" and sample["node"] == "n3" and t < 70:
            continue  # n3 appears mid-run: the device list changes
        if event == "node_leaves" and sample["node"] == "n3" and t > 70:
            continue
        engine.ingest(sample)
        before = engine.next_bin
        engine.advance()
        if engine.next_bin != before and engine.next_bin is not None:
            last = engine.next_bin - 1
            bins = range(last - engine.window_bins + 1, last + 1)
            kept, fresh = WindowView(engine.window, bins), _rebuilt(engine.window, bins)
            assert kept.gpus == fresh.gpus and kept.nics == fresh.nics
            for m in engine.window.gpu_metrics:
                np.testing.assert_array_equal(kept.gpu(m), fresh.gpu(m))
            for m in engine.window.nic_metrics:
                np.testing.assert_array_equal(kept.nic(m), fresh.nic(m))
            for m in ("sm_active", "power"):  # against each bin's own rows, device by device
                np.testing.assert_array_equal(kept.gpu(m), _by_device(engine.window, kept, m))
            checked += 1
    assert checked > 20


def _by_device(window: JobWindow, view: WindowView, metric: str) -> np.ndarray:
    """(GPUs × bins) of one metric read from each bin's sealed rows by device name."""
    out = np.full((len(view.gpus), len(view.bins)), np.nan)
    for j, b in enumerate(view.bins):
        means = window.means("g", b, (metric,))
        for i, gpu in enumerate(view.gpus):
            value = means.get(gpu, [None])[0]
            if value is not None:
                out[i, j] = value
    return out


def test_a_checkpoint_writes_each_device_list_once_and_reads_the_previous_layout() -> None:
    job = JobSpec("job-w", [f"n{i}" for i in range(4)])
    engine = JobEngine("job-w", DetectConfig())
    for sample in Simulator(Cluster([job], []), START, seed=4).samples(90):
        engine.ingest(sample)
        engine.advance()
    state = json.loads(json.dumps(engine.window.to_state()))
    assert len(state["sealed"]) >= 12 and len(state["device_lists"]) == 2  # GPUs, NICs
    assert state["open"]  # the newest samples wait in an open bin
    # layout 3 listed the devices in every bin; layouts 3 and 4 kept an open bin's
    # entries as lists of numbers, None for no reading
    widths = {"g": len(engine.window.gpu_metrics), "n": len(engine.window.nic_metrics)}
    listed = {b: {node: {k: {dev: _entries(text, widths[k]) for dev, text in devices.items()}
                         for k, devices in data.items()}
                  for node, data in nodes.items()}
              for b, nodes in state["open"].items()}
    old = {**state, "layout": 3, "open": listed, "sealed": {
        b: {k: {**part, "devices": state["device_lists"][part["devices"]]}
            for k, part in sections.items()} for b, sections in state["sealed"].items()}}
    del old["device_lists"]
    last = (engine.next_bin or 0) - 1
    bins = range(last - engine.window_bins + 1, last + 1)
    restored = [JobWindow(5.0, s, engine.window.gpu_metrics, engine.window.nic_metrics)
                for s in (state, old, {**state, "layout": 4, "open": listed})]
    assert all(w.restored for w in restored)
    assert all(w.open == engine.window.open for w in restored)  # the same packed bytes
    views = [WindowView(w, bins) for w in restored]
    for m in engine.window.gpu_metrics:
        for view in views[1:]:
            np.testing.assert_array_equal(views[0].gpu(m), view.gpu(m))
        np.testing.assert_array_equal(views[0].gpu(m), WindowView(engine.window, bins).gpu(m))
    assert views[0].gpus == views[1].gpus and len(views[0].gpus) == 32


def _entries(text: str, width: int) -> list[list[float | None]]:
    """A device's packed entries (base64) as layout 4 kept them."""
    values = [None if np.isnan(v) else float(v)
              for v in np.frombuffer(base64.b64decode(text), dtype=np.float64)]
    return [values[i:i + width] for i in range(0, len(values), width)]


def test_a_reading_neither_sent_nor_held_is_no_reading_in_the_bin_mean() -> None:
    window = JobWindow(5.0, gpu_metrics=("sm_active", "power"), nic_metrics=())
    for ts, readings in ((10.0, {"sm_active": 0.2, "power": 300.0}), (11.0, {"sm_active": 0.4}),
                         (12.0, {"power": 340.0})):
        window.add({"schema": "vigil.sample/1", "ts": ts, "job": "j", "node": "n",  # type: ignore[typeddict-item]
                    "gpus": {"0": readings}, "host": {}, "nics": {}})
    window.seal(2)
    view = WindowView(window, range(2, 3))
    assert view.gpu("sm_active")[0, 0] == pytest.approx(0.3)
    assert view.gpu("power")[0, 0] == pytest.approx(320.0)


def test_kept_matrices_cannot_be_changed_by_a_detector() -> None:
    engine = JobEngine("job-w", DetectConfig())
    for sample in Simulator(Cluster([JobSpec("job-w", ["a", "b"])], []), START,
                            seed=1).samples(40):
        engine.ingest(sample)
        engine.advance()
    last = (engine.next_bin or 0) - 1
    view = WindowView(engine.window, range(last - 11, last + 1))
    with pytest.raises(ValueError):
        view.gpu("sm_active")[0, 0] = 0.0


def test_a_bin_mean_is_the_mean_of_its_readings_and_link_states_keep_their_best() -> None:
    window = JobWindow(5.0, gpu_metrics=("sm_active", "pcie_gen"), nic_metrics=())
    for ts, active, gen in ((10.0, 0.2, 5), (11.0, 0.4, 3), (12.0, 0.9, 4)):
        window.add({"schema": "vigil.sample/1", "ts": ts, "job": "j", "node": "n",  # type: ignore[typeddict-item]
                    "gpus": {"0": {"sm_active": active, "pcie_gen": gen}}, "host": {},
                    "nics": {}})
    window.add({"schema": "vigil.sample/1", "ts": 13.0, "job": "j", "node": "n",  # type: ignore[typeddict-item]
                "gpus": {"0": {"pcie_gen": 2}}, "host": {}, "nics": {}})
    open_means = window.means("g", 2, ("sm_active", "pcie_gen"))
    window.seal(2)
    assert window.means("g", 2, ("sm_active", "pcie_gen")) == open_means
    [(entity, (active, gen))] = open_means.items()
    assert entity == ("n", "0")
    assert active == pytest.approx(0.5) and gen == 5


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.lists(st.one_of(st.none(), st.floats(0, 1e12)), min_size=3,
                                  max_size=3), min_size=1, max_size=7), min_size=1, max_size=5))
def test_sealed_means_are_pythons_own_arithmetic(devices: list[list[list[float | None]]]
                                                 ) -> None:
    """Devices with different numbers of entries and gaps: each mean is exactly
    ``sum(readings) / len(readings)`` in arrival order (the link state: the largest),
    None → NaN where a metric has no reading."""
    metrics = ("sm_active", "power", "pcie_gen")
    window = JobWindow(5.0, gpu_metrics=metrics, nic_metrics=())
    for dev, entries in enumerate(devices):
        for k, values in enumerate(entries):
            readings = {m: v for m, v in zip(metrics, values, strict=True) if v is not None}
            window.add({"schema": "vigil.sample/1", "ts": 10.0 + k * 0.1, "job": "j",  # type: ignore[typeddict-item]
                        "node": "n", "gpus": {str(dev): readings}, "host": {}, "nics": {}})
    window.seal(2)
    means = window.means("g", 2, metrics)
    for dev, entries in enumerate(devices):
        for i, metric in enumerate(metrics):
            column = [e[i] for e in entries if e[i] is not None]
            expected = (None if not column else max(column) if metric == "pcie_gen"
                        else sum(column) / len(column))
            assert means[("n", str(dev))][i] == expected
