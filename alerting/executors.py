"""Who carries out a remediation action: Slurm, Kubernetes, or a user command.

Each executor has one method, ``execute(action) -> str`` (what it did), and raises
``ExecutorError`` when it could not.
"""

from __future__ import annotations

import json
import shlex
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, Protocol

from contracts.config import Secret
from contracts.errors import VigilError
from contracts.messages import Action


class ExecutorError(VigilError):
    """The executor could not carry out the action."""


class Executor(Protocol):
    name: str

    def execute(self, action: Action) -> str: ...


def _run(argv: list[str], run: Callable[..., subprocess.CompletedProcess[str]],
         timeout: float) -> str:
    """Run ``argv`` (no shell); the command line on success, ``ExecutorError`` otherwise."""
    try:
        done = run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ExecutorError(f"{argv[0]} failed: {exc}") from None
    if done.returncode != 0:
        raise ExecutorError(f"{argv[0]} exit {done.returncode}: {done.stderr.strip()[:300]}")
    return " ".join(shlex.quote(a) for a in argv)


def _reason(action: Action) -> str:
    gpu = f" gpu {action['gpu']}" if action.get("gpu") is not None else ""
    return f"vigil {action['action']}{gpu}: incident {action['incident']}"


class SlurmExecutor:
    """``scontrol update NodeName=… State=DRAIN Reason=…``: no new jobs on the node;
    the reason tells the hardware team which GPU and which incident."""

    name = "slurm"

    def __init__(self, scontrol: str = "scontrol",
                 run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run) -> None:
        self.scontrol = scontrol
        self.run = run

    def execute(self, action: Action) -> str:
        return _run([self.scontrol, "update", f"NodeName={action['node']}", "State=DRAIN",
                     f"Reason={_reason(action)}"], self.run, timeout=60)


class KubernetesExecutor:
    """Cordon the node and taint it ``vigil.dev/gpu-fault=<gpu>:NoSchedule`` through the
    API server, keeping the node's other taints.

    Taints are a list, which a merge patch replaces whole: read, add ours, write back.
    The write carries the ``metadata.resourceVersion`` that was read, so the API server
    refuses it (409 Conflict) if anyone changed the node in between, and we read again
    and retry, up to ``CONFLICT_RETRIES`` times; another writer's taint is never lost.
    """

    name = "kubernetes"
    TAINT = "vigil.dev/gpu-fault"
    CONFLICT_RETRIES = 5

    def __init__(self, api: str, token: Secret | None, ca_file: str = "") -> None:
        self.api = api.rstrip("/")
        self.token = token
        self.context = ssl.create_default_context(cafile=ca_file or None)

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        headers = {"Accept": "application/json"}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token.reveal()}"
        data = None
        if body is not None:
            headers["Content-Type"] = "application/merge-patch+json"
            data = json.dumps(body).encode()
        request = urllib.request.Request(self.api + path, data=data, method=method,
                                         headers=headers)
        try:
            context = self.context if self.api.startswith("https") else None
            with urllib.request.urlopen(request, timeout=30, context=context) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            if exc.code == 409:
                raise _Conflict() from None
            raise ExecutorError(f"Kubernetes {method} {path}: HTTP {exc.code}") from None
        except (OSError, ValueError) as exc:
            raise ExecutorError(f"Kubernetes {method} {path}: {exc}") from None

    def execute(self, action: Action) -> str:
        path = f"/api/v1/nodes/{action['node']}"
        for attempt in range(1, self.CONFLICT_RETRIES + 1):
            node = self._call("GET", path)
            taints = [t for t in node.get("spec", {}).get("taints", []) or []
                      if t.get("key") != self.TAINT]
            taints.append({"key": self.TAINT, "value": str(action.get("gpu") or "node"),
                           "effect": "NoSchedule"})
            version = node.get("metadata", {}).get("resourceVersion")
            try:
                self._call("PATCH", path, {"metadata": {"resourceVersion": version},
                                           "spec": {"unschedulable": True, "taints": taints}})
            except _Conflict:
                continue
            retried = f" after {attempt - 1} conflict(s)" if attempt > 1 else ""
            return f"cordoned {action['node']} and tainted {self.TAINT}{retried}"
        raise ExecutorError(f"Kubernetes node {action['node']} changed under each of "
                            f"{self.CONFLICT_RETRIES} attempts to taint it")


class _Conflict(Exception):
    """The API server refused a write made against an outdated resourceVersion."""


class CommandExecutor:
    """A site's own command: an argv template with ``{action} {node} {gpu} {job}
    {incident}`` placeholders (no shell)."""

    name = "command"

    def __init__(self, template: str) -> None:
        if not template.strip():
            raise ExecutorError("alerter.remediation_command is empty")
        self.template = shlex.split(template)

    def execute(self, action: Action) -> str:
        fields = {k: "" if v is None else str(v) for k, v in action.items()}
        return _run([part.format(**fields) for part in self.template], subprocess.run,
                    timeout=120)
