"""Kubernetes job attribution from the kubelet's PodResources API (v1).

The kubelet serves ``v1.PodResourcesLister/List`` on a local unix socket
(``/var/lib/kubelet/pod-resources/kubelet.sock``): every pod on the node with the
devices its containers hold. The pods holding ``nvidia.com/gpu`` devices are the
node's GPU jobs; nothing of the workload is touched or read beyond that.

A pod's job id is ``namespace/name`` with the replica suffix taken off by
``job_pattern`` (default: ``llm-70b-worker-3`` → ``llm-70b``), so every pod of one
training job maps to the same id. With several GPU jobs on a node, the one holding
most GPUs wins (ties: the lowest id).

The response is decoded by a small protobuf wire-format reader (the messages are
fixed by the v1 API; no generated code or protobuf runtime in the agent). grpcio is
imported only when this attribution is configured. The kubelet is asked at most
every ``refresh_seconds``; when it cannot be reached, the last answer stands and the
error is counted.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from vigil_gpu_monitor.contracts.codec import MAX_ID_CHARS

log = logging.getLogger(__name__)

LIST_METHOD = "/v1.PodResourcesLister/List"
GPU_RESOURCES = ("nvidia.com/gpu",)
DEFAULT_JOB_PATTERN = r"^(?P<job>.+?)(?:-(?:worker|master|launcher|chief|ps|evaluator))?-\d+$"
MAX_RESPONSE_BYTES = 16 << 20


class WireError(ValueError):
    """The bytes are not the protobuf message expected."""


@dataclass(frozen=True)
class PodDevices:
    """One pod and the device ids of one resource its containers hold."""

    namespace: str
    name: str
    resource: str
    device_ids: tuple[str, ...]


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise WireError("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of one message: ints for varints, bytes for
    length-delimited fields; fixed-width fields are skipped."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield number, value
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise WireError("truncated field")
            yield number, buf[pos:pos + size]
            pos += size
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise WireError(f"unsupported wire type {wire}")
        if pos > len(buf):
            raise WireError("truncated fixed-width field")


def _text(value: int | bytes) -> str:
    if not isinstance(value, bytes):
        raise WireError("expected a string")
    return value.decode("utf-8", errors="replace")


def _sub(value: int | bytes) -> bytes:
    if not isinstance(value, bytes):
        raise WireError("expected a message")
    return value


def decode_list_response(raw: bytes) -> list[PodDevices]:
    """``ListPodResourcesResponse`` → one ``PodDevices`` per (pod, resource)."""
    out: list[PodDevices] = []
    for number, pod in fields(raw):
        if number != 1:  # pod_resources
            continue
        name = namespace = ""
        held: dict[str, list[str]] = {}
        for field, value in fields(_sub(pod)):
            if field == 1:
                name = _text(value)
            elif field == 2:
                namespace = _text(value)
            elif field == 3:  # containers
                for c_field, c_value in fields(_sub(value)):
                    if c_field != 2:  # devices
                        continue
                    resource, ids = "", []
                    for d_field, d_value in fields(_sub(c_value)):
                        if d_field == 1:
                            resource = _text(d_value)
                        elif d_field == 2:
                            ids.append(_text(d_value))
                    held.setdefault(resource, []).extend(ids)
        out.extend(PodDevices(namespace, name, res, tuple(ids)) for res, ids in held.items())
    return out


def grpc_lister(socket_path: str, timeout: float = 2.0) -> Callable[[], bytes]:
    """A function that calls List on the kubelet socket and returns the raw response."""
    import grpc

    channel = grpc.insecure_channel(f"unix://{socket_path}", options=[
        ("grpc.max_receive_message_length", MAX_RESPONSE_BYTES)])
    call = channel.unary_unary(LIST_METHOD, request_serializer=lambda _: b"",
                               response_deserializer=lambda raw: raw)

    def list_pods() -> bytes:
        return bytes(call(None, timeout=timeout))

    return list_pods


class KubeletJob:
    """The training job holding this node's GPUs, from the kubelet (cached)."""

    def __init__(self, list_pods: Callable[[], bytes], job_pattern: str = DEFAULT_JOB_PATTERN,
                 refresh_seconds: float = 10.0, resources: tuple[str, ...] = GPU_RESOURCES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.list_pods = list_pods
        self.pattern = re.compile(job_pattern)
        self.refresh = refresh_seconds
        self.resources = resources
        self.clock = clock
        self.job = ""
        self.errors: Counter[str] = Counter()
        self._asked_at: float | None = None

    def job_of_pod(self, namespace: str, name: str) -> str:
        """``namespace/<name without its replica suffix>``."""
        match = self.pattern.match(name)
        base = match.group("job") if match and "job" in match.groupdict() else name
        job = f"{namespace}/{base}" if namespace else base
        return job[:MAX_ID_CHARS]

    def __call__(self) -> str:
        now = self.clock()
        if self._asked_at is not None and now - self._asked_at < self.refresh:
            return self.job
        self._asked_at = now
        try:
            pods = decode_list_response(self.list_pods())
        except WireError as exc:
            self.errors["podresources_decode"] += 1
            log.warning("kubelet PodResources answer not understood: %s", exc)
            return self.job
        except Exception as exc:  # grpc.RpcError and OS errors: keep the last answer
            self.errors["podresources_unreachable"] += 1
            if self.errors["podresources_unreachable"] == 1:
                log.warning("kubelet PodResources unreachable (%s); keeping job %r",
                            type(exc).__name__, self.job)
            return self.job
        gpus: Counter[str] = Counter()
        for pod in pods:
            if pod.resource in self.resources and pod.device_ids:
                gpus[self.job_of_pod(pod.namespace, pod.name)] += len(pod.device_ids)
        ranked = sorted(gpus.items(), key=lambda kv: (-kv[1], kv[0]))
        self.job = ranked[0][0] if ranked else ""
        return self.job
