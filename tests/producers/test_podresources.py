"""Kubernetes attribution against a real gRPC server speaking the kubelet's
PodResources v1 messages, built with the protobuf runtime (not with our decoder)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from hypothesis import given, settings
from hypothesis import strategies as st

from vigil_gpu_monitor.producers.podresources import (
    LIST_METHOD,
    KubeletJob,
    WireError,
    decode_list_response,
    grpc_lister,
)

F = descriptor_pb2.FieldDescriptorProto


def _messages() -> dict[str, Any]:
    """The v1 API's messages (k8s.io/kubelet/pkg/apis/podresources/v1/api.proto)."""
    fdp = descriptor_pb2.FileDescriptorProto(name="podresources_v1_test.proto", package="v1",
                                             syntax="proto3")

    def msg(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        m = fdp.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = type_name

    rep, opt = F.LABEL_REPEATED, F.LABEL_OPTIONAL
    msg("NUMANode", ("ID", 1, F.TYPE_INT64, opt, ""))
    msg("TopologyInfo", ("nodes", 1, F.TYPE_MESSAGE, rep, ".v1.NUMANode"))
    msg("ContainerDevices", ("resource_name", 1, F.TYPE_STRING, opt, ""),
        ("device_ids", 2, F.TYPE_STRING, rep, ""),
        ("topology", 3, F.TYPE_MESSAGE, opt, ".v1.TopologyInfo"))
    msg("ContainerResources", ("name", 1, F.TYPE_STRING, opt, ""),
        ("devices", 2, F.TYPE_MESSAGE, rep, ".v1.ContainerDevices"),
        ("cpu_ids", 3, F.TYPE_INT64, rep, ""))
    msg("PodResources", ("name", 1, F.TYPE_STRING, opt, ""),
        ("namespace", 2, F.TYPE_STRING, opt, ""),
        ("containers", 3, F.TYPE_MESSAGE, rep, ".v1.ContainerResources"))
    msg("ListPodResourcesResponse",
        ("pod_resources", 1, F.TYPE_MESSAGE, rep, ".v1.PodResources"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"v1.{name}"))
            for name in ("ListPodResourcesResponse", "PodResources")}


M = _messages()


def _response(pods: list[tuple[str, str, dict[str, list[str]]]]) -> bytes:
    resp = M["ListPodResourcesResponse"]()
    for namespace, name, held in pods:
        pod = resp.pod_resources.add(name=name, namespace=namespace)
        container = pod.containers.add(name="main", cpu_ids=[0, 1, 2])
        for resource, ids in held.items():
            dev = container.devices.add(resource_name=resource, device_ids=ids)
            dev.topology.nodes.add(ID=1)
    return bytes(resp.SerializeToString())


NODE_PODS = [
    ("ml", "llm-70b-worker-3", {"nvidia.com/gpu": [f"GPU-{i:04x}" for i in range(6)],
                                "example.com/nic": ["mlx5_0"]}),
    ("ml", "small-0", {"nvidia.com/gpu": ["GPU-a", "GPU-b"]}),
    ("infra", "node-exporter-x7k2p", {}),
]


class _Kubelet:
    """A gRPC server on a unix socket answering List like the kubelet."""

    def __init__(self, socket: Path, answer: bytes) -> None:
        self.answer, self.calls = answer, 0
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        handler = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
            "List": grpc.unary_unary_rpc_method_handler(
                self._list, request_deserializer=lambda b: b,
                response_serializer=lambda b: b)})
        self.server.add_generic_rpc_handlers((handler,))
        self.server.add_insecure_port(f"unix://{socket}")
        self.server.start()

    def _list(self, request: bytes, context: Any) -> bytes:
        self.calls += 1
        return self.answer


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[tuple[_Kubelet, Path]]:
    sock = tmp_path / "kubelet.sock"
    server = _Kubelet(sock, _response(NODE_PODS))
    yield server, sock
    server.server.stop(None)


def test_method_name_is_the_kubelets() -> None:
    assert LIST_METHOD == "/v1.PodResourcesLister/List"


def test_decodes_what_the_protobuf_runtime_encodes() -> None:
    pods = decode_list_response(_response(NODE_PODS))
    gpus = {(p.namespace, p.name): p.device_ids for p in pods if p.resource == "nvidia.com/gpu"}
    assert gpus == {("ml", "llm-70b-worker-3"): tuple(f"GPU-{i:04x}" for i in range(6)),
                    ("ml", "small-0"): ("GPU-a", "GPU-b")}
    assert any(p.resource == "example.com/nic" for p in pods)


def test_job_holding_most_gpus_over_real_grpc_cached_between_refreshes(
        kubelet: tuple[_Kubelet, Path]) -> None:
    server, sock = kubelet
    now = [0.0]
    job_of = KubeletJob(grpc_lister(str(sock)), refresh_seconds=10.0, clock=lambda: now[0])
    assert job_of() == "ml/llm-70b"  # the job holding most GPUs
    now[0] = 5.0
    assert job_of() == "ml/llm-70b" and server.calls == 1  # cached: the kubelet is spared
    server.answer = _response([("ml", "small-0", {"nvidia.com/gpu": ["GPU-a"]})])
    now[0] = 11.0
    assert job_of() == "ml/small" and server.calls == 2
    server.answer = _response([("infra", "node-exporter-x7k2p", {})])
    now[0] = 22.0
    assert job_of() == ""  # no GPU pod: no job


def test_unreachable_or_garbled_kubelet_keeps_the_last_job_and_counts(
        kubelet: tuple[_Kubelet, Path]) -> None:
    server, sock = kubelet
    now = [0.0]
    job_of = KubeletJob(grpc_lister(str(sock), timeout=1.0), clock=lambda: now[0])
    assert job_of() == "ml/llm-70b"
    server.answer = b"\x0a\xff\xff"  # a truncated message
    now[0] = 20.0
    assert job_of() == "ml/llm-70b" and job_of.errors["podresources_decode"] == 1
    server.server.stop(None).wait()
    now[0] = 40.0
    assert job_of() == "ml/llm-70b" and job_of.errors["podresources_unreachable"] == 1


@pytest.mark.parametrize("name,job", [("llm-70b-worker-3", "ns/llm-70b"),
                                      ("bert-launcher-0", "ns/bert"),
                                      ("sweep-17", "ns/sweep"), ("notebook", "ns/notebook")])
def test_replica_suffix_is_dropped(name: str, job: str) -> None:
    assert KubeletJob(lambda: b"").job_of_pod("ns", name) == job


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_wire_errors(raw: bytes) -> None:
    try:
        decode_list_response(raw)
    except WireError:
        pass
