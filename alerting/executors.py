"""Who carries out a remediation action: Slurm, Kubernetes, or a user command.

Each executor takes nodes out with ``execute(action) -> str`` (what it did) and, for
the repair loop, says who holds a node out (``holder``), runs the site's check
(``check``) and returns a node to service (``release``); each raises
``ExecutorError`` when it could not.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable
from urllib.parse import quote

from vigil_gpu_monitor.contracts.config import Secret
from vigil_gpu_monitor.contracts.errors import VigilError
from vigil_gpu_monitor.contracts.messages import Action
from vigil_gpu_monitor.contracts.names import node_problem


class ExecutorError(VigilError):
    """The executor could not carry out the action."""


class Executor(Protocol):
    name: str

    def execute(self, action: Action) -> str: ...


@dataclass(frozen=True)
class Hold:
    """Whether a node is out of service, and whether Vigil's own drain or taint is what
    holds it (``reason``: the drain reason or taint, for the audit)."""

    out: bool
    by_vigil: bool
    reason: str = ""


@dataclass(frozen=True)
class CheckResult:
    """A verification check's exit status (None: it could not run or timed out) and
    the tail of its output, kept in the audit."""

    rc: int | None
    output: str

    @property
    def passed(self) -> bool:
        return self.rc == 0


@runtime_checkable
class Returner(Protocol):
    """An executor that can also bring a node back (the repair loop needs one)."""

    name: str

    def execute(self, action: Action) -> str: ...

    def holder(self, node: str) -> Hold: ...

    def release(self, node: str) -> str: ...

    def check(self, argv: list[str], timeout: float) -> CheckResult: ...


OUTPUT_KEEP = 2000  # characters of a check's output kept in the audit


def run_check(argv: list[str], timeout: float, env: dict[str, str] | None = None,
              run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run
              ) -> CheckResult:
    """Run a check's ``argv`` (no shell); its status and output, never an exception."""
    if not argv:
        return CheckResult(0, "no check command configured: evidence only")
    try:
        done = run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return CheckResult(None, f"{argv[0]} timed out after {timeout:g}s")
    except OSError as exc:
        return CheckResult(None, f"{argv[0]} could not run: {exc}")
    return CheckResult(done.returncode, (done.stdout + done.stderr)[-OUTPUT_KEEP:])


def _run(argv: list[str], run: Callable[..., subprocess.CompletedProcess[str]],
         timeout: float, env: dict[str, str] | None = None) -> str:
    """Run ``argv`` (no shell); the command line on success, ``ExecutorError`` otherwise."""
    try:
        done = run(argv, capture_output=True, text=True, timeout=timeout,
                   **({"env": env} if env is not None else {}))
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ExecutorError(f"{argv[0]} failed: {exc}") from None
    if done.returncode != 0:
        raise ExecutorError(f"{argv[0]} exit {done.returncode}: {done.stderr.strip()[:300]}")
    return " ".join(shlex.quote(a) for a in argv)


def one_node(node: object, *, lower_case: bool = False) -> str:
    """``node`` if it names exactly one machine; ``ExecutorError`` otherwise.

    Checked again here, whatever the contract let through (an action may come from
    Redis, a replayed audit or a person): Slurm expands host lists (``gpu-[01-04]``,
    ``a,b``) and reads ``ALL`` as every node, a ``/`` or ``..`` reaches another API
    object, a leading ``-`` reads as an option, whitespace splits an argument. Only
    an RFC 1123 host name passes (``contracts.names``); ``lower_case`` for Kubernetes,
    whose node names are lower case."""
    why = node_problem(node)
    if why is None and lower_case and node != str(node).lower():
        why = "has upper case: a Kubernetes node name is lower case"
    if why is not None:
        raise ExecutorError(f"refused node name: {why}; an action names one host")
    return str(node)


REASON_PREFIX = "vigil "  # every drain reason Vigil writes starts so (its ownership mark)


def _reason(action: Action) -> str:
    gpu = f" gpu {action['gpu']}" if action.get("gpu") is not None else ""
    return f"{REASON_PREFIX}{action['action']}{gpu}: incident {action['incident']}"


def vigil_reason(reason: str) -> bool:
    """True for a drain reason Vigil wrote (``vigil <action>…: incident <id>``)."""
    return reason.startswith(REASON_PREFIX) and ": incident " in reason


class SlurmExecutor:
    """``scontrol update NodeName=… State=DRAIN Reason=…``: no new jobs on the node;
    the reason tells the hardware team which GPU and which incident, and marks the
    drain as Vigil's: only a node drained with such a reason is ever resumed."""

    name = "slurm"

    def __init__(self, scontrol: str = "scontrol",
                 run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
                 slurm_conf: str = "") -> None:
        self.scontrol = scontrol
        self.run = run
        self.env = dict(os.environ, SLURM_CONF=slurm_conf) if slurm_conf else None

    def execute(self, action: Action) -> str:
        return _run([self.scontrol, "update", f"NodeName={one_node(action['node'])}",
                     "State=DRAIN",
                     f"Reason={_reason(action)}"], self.run, timeout=60, env=self.env)

    def holder(self, node: str) -> Hold:
        """The node's state and drain reason from ``scontrol show node``."""
        node = one_node(node)
        try:
            done = self.run([self.scontrol, "show", "node", node], capture_output=True,
                            text=True, timeout=60,
                            **({"env": self.env} if self.env is not None else {}))
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ExecutorError(f"{self.scontrol} show node {node} failed: {exc}") from None
        if done.returncode != 0:
            raise ExecutorError(f"{self.scontrol} show node {node} exit {done.returncode}: "
                                f"{done.stderr.strip()[:300]}")
        return parse_slurm_node(done.stdout)

    def release(self, node: str) -> str:
        return _run([self.scontrol, "update", f"NodeName={one_node(node)}", "State=RESUME"],
                    self.run, timeout=60, env=self.env)

    def check(self, argv: list[str], timeout: float) -> CheckResult:
        return run_check(argv, timeout, self.env, self.run)


def parse_slurm_node(text: str) -> Hold:
    """``scontrol show node`` output → Hold: out when its state has DRAIN (or DOWN);
    Vigil's when the reason is one Vigil writes (Slurm appends `` [user@time]``)."""
    state = re.search(r"\bState=(\S+)", text)
    if state is None:
        raise ExecutorError(f"scontrol show node: no State in {text.strip()[:200]!r}")
    found = re.search(r"^\s*Reason=(.*?)(?: \[[^\]]*\])?\s*$", text, re.MULTILINE)
    reason = found.group(1) if found else ""
    flags = set(state.group(1).upper().replace("*", "").split("+"))
    out = bool(flags & {"DRAIN", "DRAINED", "DRAINING", "DOWN"})
    return Hold(out, out and vigil_reason(reason), reason)


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

    @staticmethod
    def node_path(node: str) -> str:
        """The API path of one node: the name checked (``one_node``) and escaped, so
        it is one path segment whatever it holds."""
        return f"/api/v1/nodes/{quote(one_node(node, lower_case=True), safe='')}"

    def execute(self, action: Action) -> str:
        path = self.node_path(action["node"])
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

    def holder(self, node: str) -> Hold:
        """Vigil's when our taint is on the node; out (by someone else) when it is
        cordoned without it."""
        spec = self._call("GET", self.node_path(node)).get("spec", {})
        ours = [t for t in spec.get("taints", []) or [] if t.get("key") == self.TAINT]
        if ours:
            return Hold(True, True, f"taint {self.TAINT}={ours[0].get('value', '')}")
        return Hold(bool(spec.get("unschedulable")), False,
                    "cordoned without Vigil's taint" if spec.get("unschedulable") else "")

    def release(self, node: str) -> str:
        """Remove Vigil's taint and uncordon, keeping every other taint; the same
        ``resourceVersion`` guard and retries as the cordon."""
        path = self.node_path(node)
        for attempt in range(1, self.CONFLICT_RETRIES + 1):
            current = self._call("GET", path)
            taints = current.get("spec", {}).get("taints", []) or []
            if not any(t.get("key") == self.TAINT for t in taints):
                raise ExecutorError(f"Kubernetes node {node} no longer has {self.TAINT}: "
                                    "not Vigil's to uncordon")
            kept = [t for t in taints if t.get("key") != self.TAINT]
            version = current.get("metadata", {}).get("resourceVersion")
            try:
                self._call("PATCH", path, {"metadata": {"resourceVersion": version},
                                           "spec": {"unschedulable": False,
                                                    "taints": kept or None}})
            except _Conflict:
                continue
            retried = f" after {attempt - 1} conflict(s)" if attempt > 1 else ""
            return f"removed {self.TAINT} from {node} and uncordoned it{retried}"
        raise ExecutorError(f"Kubernetes node {node} changed under each of "
                            f"{self.CONFLICT_RETRIES} attempts to uncordon it")

    def check(self, argv: list[str], timeout: float) -> CheckResult:
        return run_check(argv, timeout)


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
        one_node(action["node"])
        fields = {k: "" if v is None else str(v) for k, v in action.items()}
        return _run([part.format(**fields) for part in self.template], subprocess.run,
                    timeout=120)

    def holder(self, node: str) -> Hold:
        """A site command cannot be asked who holds a node: Vigil's own record (the
        repair loop's) is the only word, so the return command must check itself."""
        return Hold(True, True, "site command: ownership not checked by Vigil")

    def release(self, node: str) -> str:
        """The same template with ``{action}`` = ``return``."""
        fields = {"action": "return", "node": one_node(node), "gpu": "", "job": "",
                  "incident": ""}
        return _run([part.format(**fields) for part in self.template], subprocess.run,
                    timeout=120)

    def check(self, argv: list[str], timeout: float) -> CheckResult:
        return run_check(argv, timeout)
