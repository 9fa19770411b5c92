"""A real Slurm controller on this machine, for the repair loop's tests and demo:
``munged`` with its own key and socket, ``slurmctld``, and one ``slurmd`` per node
name (``slurmd -N``), each on its own port, all from Debian's packages (``munge``,
``slurmctld``, ``slurmd``; ``slurm-client`` brings ``scontrol`` and ``sinfo``),
installed with apt-get when missing, like redis-server.

Everything lives under ``local.data_dir/slurm``: ``slurm.conf`` (point ``SLURM_CONF``
at it, or set ``alerter.slurm_conf``), state, spool, pid files and logs. The nodes
stand for GPU nodes; they have no GPUs (no gres), and the plugins are the ones that
need neither systemd nor cgroups (``proctrack/linuxproc``, ``task/none``).
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import time
from pathlib import Path

from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.vigil.ops.localstack import (
    Service,
    StackError,
    _say,
    _wait,
    debian_binary,
    port_open,
)

PACKAGES = {"munged": "munge", "slurmctld": "slurmctld", "slurmd": "slurmd",
            "scontrol": "slurm-client", "sinfo": "slurm-client"}


def slurm_binary(binary: str) -> str:
    """Path of a Slurm or munge binary (``/usr/sbin`` included); installs its Debian
    package with apt-get when missing and running as root, else says what to install."""
    return debian_binary(binary, PACKAGES[binary], ("/usr/sbin", "/usr/bin"))


def slurm_root(config: Config) -> Path:
    return (Path(config.local.data_dir) / "slurm").resolve()


def slurm_conf_path(config: Config) -> Path:
    """The local cluster's slurm.conf (what ``SLURM_CONF`` should name)."""
    return slurm_root(config) / "slurm.conf"


def node_names(config: Config) -> list[str]:
    names = [n.strip() for n in config.local.slurm_nodes.split(",") if n.strip()]
    if not names:
        raise StackError("local.slurm_nodes is empty: name at least one node")
    return names


def slurm_services(config: Config) -> dict[str, Service]:
    """munged, slurmctld and one slurmd per node, in start order."""
    root = slurm_root(config)
    found = {"munged": Service("munged", 0, root),
             "slurmctld": Service("slurmctld", config.local.slurmctld_port, root)}
    for i, node in enumerate(node_names(config)):
        found[f"slurmd-{node}"] = Service(f"slurmd-{node}", config.local.slurmd_port + i, root)
    return found


def write_conf(config: Config) -> Path:
    """slurm.conf for a controller on loopback and the configured nodes."""
    root, local = slurm_root(config), config.local
    host = socket.gethostname()
    nodes = node_names(config)
    lines = [
        "ClusterName=vigil-local", f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={local.slurmctld_port}", f"SlurmdPort={local.slurmd_port}",
        "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge", "CredType=cred/munge",
        f"AuthInfo=socket={root}/munge/munge.socket",
        f"StateSaveLocation={root}/state", f"SlurmdSpoolDir={root}/spool/%n",
        f"SlurmctldPidFile={root}/slurmctld.pid.slurm", f"SlurmdPidFile={root}/slurmd-%n.pid.slurm",
        f"SlurmctldLogFile={root}/logs/slurmctld.slurm.log",
        f"SlurmdLogFile={root}/logs/slurmd-%n.slurm.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none", "SelectType=select/linear",
        "SchedulerType=sched/builtin", "ReturnToService=2", "MpiDefault=none",
        "SwitchType=switch/none", "SlurmdTimeout=300",
    ]
    for i, node in enumerate(nodes):
        lines.append(f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 "
                     f"Port={local.slurmd_port + i} CPUs=1 RealMemory=100 State=UNKNOWN")
    lines.append(f"PartitionName=gpu Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE "
                 "State=UP")
    path = slurm_conf_path(config)
    path.write_text("\n".join(lines) + "\n")
    return path


def sinfo_states(config: Config) -> dict[str, str]:
    """Node → its state as ``sinfo`` prints it (``idle``, ``drained``, ``idle*``…)."""
    done = subprocess.run([slurm_binary("sinfo"), "-h", "-N", "-o", "%N %T"],
                          capture_output=True, text=True, timeout=30,
                          env=dict(os.environ, SLURM_CONF=str(slurm_conf_path(config))))
    if done.returncode != 0:
        raise StackError(f"sinfo failed: {done.stderr.strip()[:500]}")
    return dict(line.split(None, 1) for line in done.stdout.splitlines() if line.strip())


def start_slurm(config: Config, timeout: float = 60.0) -> None:
    """Start munged, slurmctld and the slurmds not already running; wait until every
    node answers (sinfo shows it without ``*``)."""
    binaries = {b: slurm_binary(b) for b in ("munged", "slurmctld", "slurmd", "sinfo")}
    root = slurm_root(config)
    for sub in ("munge", "state", "spool", "logs"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "munge").chmod(0o711)  # munged wants its socket's folder executable by all
    key = root / "munge" / "munge.key"
    if not key.exists():
        key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o600)
    conf = write_conf(config)
    svcs = slurm_services(config)
    for name, svc in svcs.items():
        if svc.pid() is not None:
            continue
        if svc.port and port_open(svc.port):
            raise StackError(f"port {svc.port} for {name} is taken by another process: set "
                             "VIGIL_LOCAL_SLURMCTLD_PORT / VIGIL_LOCAL_SLURMD_PORT or stop it")
        if name == "munged":
            svc.spawn([binaries["munged"], "-F", "--force", f"--key-file={key}",
                       f"--socket={root}/munge/munge.socket",
                       f"--pid-file={root}/munge/munged.pid",
                       f"--log-file={root}/logs/munged.munge.log",
                       f"--seed-file={root}/munge/munged.seed"])
            _wait(svc, 15, lambda: (root / "munge" / "munge.socket").exists())
        elif name == "slurmctld":
            svc.spawn([binaries["slurmctld"], "-D", "-f", str(conf)])
            _wait(svc, 30, lambda: port_open(config.local.slurmctld_port))
        else:
            node = name.removeprefix("slurmd-")
            svc.spawn([binaries["slurmd"], "-D", "-f", str(conf), "-N", node])
    deadline = time.monotonic() + timeout
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = sinfo_states(config)
        if all(not states.get(n, "*").endswith("*") and "unk" not in states.get(n, "unk")
               for n in node_names(config)):
            _say(f"slurm up: slurmctld on 127.0.0.1:{config.local.slurmctld_port}, nodes "
                 f"{', '.join(node_names(config))} (SLURM_CONF={conf})")
            return
        for name, svc in svcs.items():
            if svc.pid() is None:
                tail = svc.logfile.read_text(errors="replace")[-3000:] \
                    if svc.logfile.exists() else ""
                raise StackError(f"{name} exited during start-up; log {svc.logfile}:\n{tail}")
        time.sleep(0.5)
    raise StackError(f"slurm nodes not ready in {timeout:.0f}s: {states}; logs under "
                     f"{root / 'logs'}")


def stop_slurm(config: Config) -> list[str]:
    """Stop what start_slurm started (slurmds first); the names stopped."""
    stopped = []
    for name, svc in reversed(list(slurm_services(config).items())):
        if svc.stop(timeout=15):
            stopped.append(name)
    return stopped
