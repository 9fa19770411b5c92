"""The Kubernetes executor against a fake API server that, like the real one, answers
409 Conflict to a write carrying an outdated ``metadata.resourceVersion`` and applies
JSON merge patches (RFC 7386: a list is replaced whole)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from vigil_gpu_monitor.alerting.executors import ExecutorError, KubernetesExecutor

ACTION = {"action": "cordon", "node": "gpu-7", "gpu": "3", "job": "j", "incident": "i"}


def _merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out.get(key), value)
    return out


class FakeApiServer:
    """One Node object; ``before_patch`` runs between a client's GET and its PATCH (a
    concurrent writer)."""

    def __init__(self, before_patch: Callable[[FakeApiServer], None] | None = None) -> None:
        self.node: dict[str, Any] = {
            "metadata": {"name": "gpu-7", "resourceVersion": "100"},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present",
                                 "effect": "NoSchedule"}]}}
        self.before_patch = before_patch
        self.conflicts = 0
        self.lock = threading.Lock()

    def write(self, patch: dict[str, Any]) -> int:
        """Apply a merge patch as the API server does; the HTTP status."""
        with self.lock:
            sent = patch.get("metadata", {}).get("resourceVersion")
            if sent is not None and sent != self.node["metadata"]["resourceVersion"]:
                self.conflicts += 1
                return 409
            patch = _merge(patch, {"metadata": {"resourceVersion": None}})
            self.node = _merge(self.node, patch)
            version = int(self.node["metadata"]["resourceVersion"]) + 1
            self.node["metadata"]["resourceVersion"] = str(version)
            return 200

    def add_taint(self, key: str) -> None:
        """Another controller adds a taint (read-modify-write with its own version)."""
        taints = [*self.node["spec"].get("taints", []), {"key": key, "effect": "NoExecute"}]
        assert self.write({"metadata": {"resourceVersion":
                                        self.node["metadata"]["resourceVersion"]},
                           "spec": {"taints": taints}}) == 200


@pytest.fixture
def serve() -> Iterator[Callable[[FakeApiServer], str]]:
    servers: list[ThreadingHTTPServer] = []

    def start(api: FakeApiServer) -> str:
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                with api.lock:
                    self._answer(200, api.node)

            def do_PATCH(self) -> None:
                assert self.headers["Content-Type"] == "application/merge-patch+json"
                patch = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if api.before_patch is not None:
                    hook, api.before_patch = api.before_patch, None
                    hook(api)
                status = api.write(patch)
                self._answer(status, api.node if status == 200 else {
                    "kind": "Status", "reason": "Conflict", "code": 409})

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_cordon_keeps_the_nodes_other_taints(serve: Callable[[FakeApiServer], str]) -> None:
    api = FakeApiServer()
    result = KubernetesExecutor(serve(api), None).execute(ACTION)
    assert "cordoned gpu-7" in result and api.node["spec"]["unschedulable"] is True
    assert [t["key"] for t in api.node["spec"]["taints"]] == [
        "nvidia.com/gpu", KubernetesExecutor.TAINT]
    assert api.node["spec"]["taints"][1]["value"] == "3"


def test_a_concurrent_writers_taint_survives_the_conflict(
        serve: Callable[[FakeApiServer], str]) -> None:
    api = FakeApiServer(before_patch=lambda a: a.add_taint("node.kubernetes.io/unreachable"))
    result = KubernetesExecutor(serve(api), None).execute(ACTION)
    assert api.conflicts == 1 and "after 1 conflict" in result
    assert {t["key"] for t in api.node["spec"]["taints"]} == {
        "nvidia.com/gpu", "node.kubernetes.io/unreachable", KubernetesExecutor.TAINT}


def test_a_node_that_keeps_changing_is_a_clear_failure(
        serve: Callable[[FakeApiServer], str]) -> None:
    class Busy(FakeApiServer):
        def write(self, patch: dict[str, Any]) -> int:
            if "unschedulable" in patch.get("spec", {}):  # ours: someone always got there first
                self.add_taint(f"busy/{self.conflicts}")
            return super().write(patch)

    api = Busy()
    with pytest.raises(ExecutorError, match="changed under each of 5 attempts"):
        KubernetesExecutor(serve(api), None).execute(ACTION)
    assert api.conflicts == 5 and "unschedulable" not in api.node["spec"]


def test_return_removes_only_vigils_taint_and_uncordons_after_a_conflict(
        serve: Callable[[FakeApiServer], str]) -> None:
    api = FakeApiServer()
    ex = KubernetesExecutor(serve(api), None)
    assert ex.holder("gpu-7").out is False
    ex.execute(ACTION)
    assert ex.holder("gpu-7").by_vigil is True
    api.before_patch = lambda a: a.add_taint("node.kubernetes.io/unreachable")
    result = ex.release("gpu-7")
    assert "uncordoned" in result and "after 1 conflict" in result
    assert api.node["spec"]["unschedulable"] is False
    assert {t["key"] for t in api.node["spec"]["taints"]} == {
        "nvidia.com/gpu", "node.kubernetes.io/unreachable"}


def test_a_node_cordoned_by_someone_else_is_not_vigils(
        serve: Callable[[FakeApiServer], str]) -> None:
    api = FakeApiServer()
    api.node["spec"]["unschedulable"] = True  # kubectl cordon by a person
    ex = KubernetesExecutor(serve(api), None)
    hold = ex.holder("gpu-7")
    assert hold.out and not hold.by_vigil
    with pytest.raises(ExecutorError, match="not Vigil's to uncordon"):
        ex.release("gpu-7")
    assert api.node["spec"]["unschedulable"] is True


def test_slurm_node_parsing_tells_vigils_drain_from_a_persons() -> None:
    from vigil_gpu_monitor.alerting.executors import parse_slurm_node

    ours = parse_slurm_node("NodeName=g1 Arch=x86_64\n   State=IDLE+DRAIN ThreadsPerCore=1\n"
                            "   Reason=vigil reset_gpu gpu 3: incident i-1 [root@2026-01-01]\n")
    assert ours.out and ours.by_vigil and ours.reason == "vigil reset_gpu gpu 3: incident i-1"
    person = parse_slurm_node("   State=MIXED+DRAIN \n   Reason=vigil said so [ana@t]\n")
    assert person.out and not person.by_vigil
    assert not parse_slurm_node("   State=IDLE ThreadsPerCore=1\n").out
    with pytest.raises(ExecutorError, match="no State"):
        parse_slurm_node("garbage")
