"""Every executor checks the node name again before it acts (issue #49): host lists,
``ALL``, paths, options and whitespace never reach ``scontrol``, a site's command
or the Kubernetes API, and what reaches the API is one escaped path segment. The
rails count the nodes an action would touch. (The same names against the real
``slurmctld``: tests/integration/test_names_slurm.py.)"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.alerting.http_recorder import Recorder
from vigil_gpu_monitor.alerting.executors import (
    CommandExecutor,
    ExecutorError,
    KubernetesExecutor,
    SlurmExecutor,
)
from vigil_gpu_monitor.alerting.remediation import nodes_touched
from vigil_gpu_monitor.contracts.messages import Action
from vigil_gpu_monitor.contracts.names import is_node_name

HOSTILE = ["gpu-[01-04]", "gpu-[01,03-04]", "gpu-01,gpu-02", "ALL", "all", "DEFAULT",
           "-h", "--all", "gpu 01", "gpu-01\n", "../gpu-01", "gpu-01/status", "..", ".",
           "gpu-01?watch=1", "gpu-01#x", "%2e%2e", "gpu-01%2fx", "", "gpu*", "gpü"]

# names built from the pieces an attacker would use, around real node names
name_parts = st.sampled_from(["gpu-0", "1", "2", "[", "]", ",", "-", ".", "/", "..", " ",
                              "%2f", "ALL", "?", "#", "\t", "a", "Z", "_", "=", ":"])
names = st.one_of(st.lists(name_parts, min_size=1, max_size=8).map("".join),
                  st.text(max_size=40))


def action(node: str) -> Action:
    return {"id": "a1", "action": "drain_and_replace", "job": "train-1", "node": node,
            "gpu": "3", "incident": "i1", "summary": "", "job_nodes": 4,
            "planned_at": 0.0, "due_at": 0.0}


class RecordingRun:
    """``subprocess.run``'s seam: records argv, answers success."""

    def __init__(self) -> None:
        self.argv: list[list[str]] = []

    def __call__(self, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        self.argv.append(argv)
        return subprocess.CompletedProcess(argv, 0, "NodeName=x State=IDLE\n", "")


@pytest.mark.parametrize("node", HOSTILE)
def test_slurm_refuses_a_name_that_is_not_one_host(node: str) -> None:
    run = RecordingRun()
    ex = SlurmExecutor(run=run)
    for attempt in (lambda: ex.execute(action(node)), lambda: ex.release(node),
                    lambda: ex.holder(node)):
        with pytest.raises(ExecutorError, match="refused node name"):
            attempt()
    assert run.argv == []


@given(names)
@example("gpu-02")
def test_slurm_names_exactly_one_host_or_nothing(node: str) -> None:
    run = RecordingRun()
    try:
        SlurmExecutor(run=run).execute(action(node))
    except ExecutorError:
        assert run.argv == [] and not is_node_name(node)
        return
    [argv] = run.argv
    assert argv[2] == f"NodeName={node}" and is_node_name(node)
    assert not set(node) & set("[],/ \t\n") and not node.startswith("-")


@pytest.fixture(scope="module")
def api() -> Iterator[Recorder]:
    """One recording API server for the module (each start and stop costs 0.5 s)."""
    with Recorder(get_body=json.dumps({"metadata": {"resourceVersion": "1"},
                                       "spec": {}}).encode()) as rec:
        yield rec


@pytest.mark.parametrize("node", HOSTILE + ["GPU-01"])
def test_kubernetes_refuses_before_any_request(api: Recorder, node: str) -> None:
    api.requests.clear()
    ex = KubernetesExecutor(api.url, None)
    for attempt in (lambda: ex.execute(action(node)), lambda: ex.release(node),
                    lambda: ex.holder(node)):
        with pytest.raises(ExecutorError, match="refused node name"):
            attempt()
    assert api.requests == []


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(node=names)
@example(node="gpu-7")
@example(node="node-1.cluster.example")
def test_kubernetes_path_is_one_escaped_segment(api: Recorder, node: str) -> None:
    api.requests.clear()
    try:
        KubernetesExecutor(api.url, None).execute(action(node))
    except ExecutorError as exc:
        assert "refused node name" in str(exc) and api.requests == []
        return
    assert [r.method for r in api.requests] == ["GET", "PATCH"]
    for request in api.requests:
        prefix, _, segment = request.path.rpartition("/")
        assert prefix == "/api/v1/nodes" and segment not in ("", ".", "..")
        assert unquote(segment) == node and is_node_name(node) and node == node.lower()


def test_a_site_command_gets_no_hostile_node_either() -> None:
    ex = CommandExecutor("/bin/true {node}")
    for node in HOSTILE:
        with pytest.raises(ExecutorError, match="refused node name"):
            ex.execute(action(node))


@pytest.mark.parametrize(("node", "touched"), [
    ("gpu-01", 1), ("gpu-[01-04]", 4), ("gpu-[01,03-04]", 3), ("gpu-[01-04],cpu-1", 5),
    ("r[1-2]n[01-03]", 6), ("ALL", None), ("gpu 01", None), ("../x", None)])
def test_rails_count_what_a_name_would_touch(node: str, touched: int | None) -> None:
    assert nodes_touched(node) == touched
