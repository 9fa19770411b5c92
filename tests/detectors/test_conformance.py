"""One conformance suite over every detector: deterministic, no I/O, copes with
missing metrics, missing GPUs, gaps, empty and single-GPU jobs, and what it finds
becomes contract-valid detections."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from vigil_gpu_monitor.contracts.codec import validate_detection
from vigil_gpu_monitor.detectors.findings import Finding
from vigil_gpu_monitor.detectors.hang import HangParams, find_hang
from vigil_gpu_monitor.detectors.incidents import IncidentTracker
from vigil_gpu_monitor.detectors.links import LinkParams, find_link_faults
from vigil_gpu_monitor.detectors.network import NetworkParams, find_network_bound
from vigil_gpu_monitor.detectors.straggler import StragglerParams, find_stragglers
from vigil_gpu_monitor.detectors.window import JobWindow, WindowView
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator

START = 2_000_000.0
BIN = 5.0

WINDOW_BINS = 12


def _straggler_in_sequence(window: JobWindow, bins: range) -> list[Finding]:
    """The straggler test is sequential: it is driven bin by bin from the first, with
    its memory, and what it finds at the last bin is the answer."""
    memory: dict[str, Any] = {}
    found: list[Finding] = []
    first = window.first_bin_from(bins[-1] - 10_000)
    for last in range(bins[-1] if first is None else first, bins[-1] + 1):
        found = find_stragglers(WindowView(window, range(last - WINDOW_BINS + 1, last + 1)),
                                StragglerParams(), memory)
    return found


DETECTORS: dict[str, Callable[[JobWindow, range], list[Finding]]] = {
    "straggler": _straggler_in_sequence,
    "hang": lambda w, b: find_hang(WindowView(w, b), HangParams(), {}),
    "links": lambda w, b: find_link_faults(WindowView(w, b), LinkParams()),
    "network": lambda w, b: find_network_bound(WindowView(w, b), NetworkParams()),
}


def _samples(nodes: int, gpus: int, fault: str | None = None) -> list[dict[str, Any]]:
    job = JobSpec("j", [f"n{i}" for i in range(nodes)], gpus_per_node=gpus)
    faults = [Fault(fault, "j", "n1", "1", START + 120)] if fault else []
    return list(Simulator(Cluster([job], faults), START, seed=3).samples(180))


def _mutilate(samples: list[dict[str, Any]], how: str) -> list[dict[str, Any]]:
    out = []
    for i, s in enumerate(copy.deepcopy(samples)):
        if how == "no_metrics":
            s["gpus"] = {g: {} for g in s["gpus"]}
            s["nics"] = {}
        elif how == "sparse":  # every other metric missing, GPUs dropping in and out
            for g, r in list(s["gpus"].items()):
                if (i + int(g)) % 3 == 0:
                    del s["gpus"][g]
                else:
                    for k in list(r)[i % 2::2]:
                        del r[k]
        elif how == "gaps" and 100 <= (s["ts"] - START) < 140:
            continue
        out.append(s)
    return out


def _view(samples: list[dict[str, Any]]) -> tuple[JobWindow, range]:
    window = JobWindow(BIN)
    for s in samples:
        window.add(s)
    last = window.bin_of(max(s["ts"] for s in samples)) if samples else 0
    return window, range(last - WINDOW_BINS + 1, last + 1)


CASES = {
    "empty": lambda: [],
    "single_gpu": lambda: _samples(1, 1),
    "two_nodes_one_gpu": lambda: _samples(2, 1),
    "no_metrics": lambda: _mutilate(_samples(4, 8), "no_metrics"),
    "sparse": lambda: _mutilate(_samples(4, 8), "sparse"),
    "gaps": lambda: _mutilate(_samples(4, 8), "gaps"),
    "healthy": lambda: _samples(4, 8),
    "faulty": lambda: _samples(4, 8, "slow_gpu"),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", sorted(DETECTORS))
def test_detector_conformance(name: str, case: str) -> None:
    samples = CASES[case]()
    detector = DETECTORS[name]
    first = detector(*_view(samples))
    again = detector(*_view(samples))
    assert first == again, "a detector must be a deterministic function of its window"
    if case in ("empty", "single_gpu", "two_nodes_one_gpu", "no_metrics", "healthy"):
        assert first == [], f"{name} accused someone on {case} data"
    tracker = IncidentTracker("j", fire_after=1, resolve_after=1)
    for det in tracker.update(START + 200, first, {f.kind for f in first}):
        validate_detection(json.loads(json.dumps(det)))
        assert det["summary"].endswith(".") and det["metrics"]
    for f in first:
        assert np.isfinite(f.score) and f.score >= 0 and np.isfinite(f.since)


def test_straggler_conformance_case_finds_the_fault() -> None:
    """The 'faulty' case above is not vacuous: the straggler detector sees it."""
    found = DETECTORS["straggler"](*_view(_samples(4, 8, "slow_gpu")))
    assert [(f.node, f.gpu) for f in found] == [("n1", "1")]


def test_detectors_do_no_io(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pure functions: opening files or sockets during detection fails the test."""
    import builtins
    import socket

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("a detector tried to do I/O")

    window, bins = _view(_samples(4, 8, "slow_gpu"))
    monkeypatch.setattr(builtins, "open", forbidden)
    monkeypatch.setattr(socket, "socket", forbidden)
    for detector in DETECTORS.values():
        detector(window, bins)
