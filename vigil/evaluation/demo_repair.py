"""The demo's last act: one node taken out by Vigil and brought back, on a real Slurm.

After the fault tour, the local stack's Slurm (munged, slurmctld and one slurmd per
``local.slurm_nodes``, ``vigil.ops.slurmstack``) runs a small simulated job on its
nodes. One GPU reports XID 79; Vigil's worker detects it and the alerter, with
remediation enabled and not a dry run (its rails as configured), drains the node
with ``scontrol``. The act shows the drain in ``sinfo`` with Vigil's reason and in
``vigil nodes``, reports the repair (``vigil repair done``), lets the alerter run the
site check and wait out its evidence window, and shows the node RESUMEd and idle in
``sinfo`` and the whole story in ``vigil actions``.

Three waits are shortened so the act takes about a minute; each is printed:
``alerter.confirm_seconds``, ``detect.health_hold_seconds`` and
``alerter.repair_evidence_seconds`` (kept above the hold, as the operator guide
asks). The site check is a harmless ``echo``. If Slurm cannot start here, the act
says so and is skipped; it never claims a repair it did not see.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping

import redis

from vigil_gpu_monitor.alerting.repair import AWAITING, HELD, IN_SERVICE, RepairLog
from vigil_gpu_monitor.alerting.state import LiveState
from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.config import Config, load
from vigil_gpu_monitor.contracts.errors import VigilError
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator
from vigil_gpu_monitor.vigil.ops.kafka_admin import ensure_topics
from vigil_gpu_monitor.vigil.ops.slurmstack import (
    node_names,
    sinfo_states,
    slurm_binary,
    slurm_conf_path,
    slurm_services,
    start_slurm,
    stop_slurm,
)

JOB = "train-7"
GPU = "3"
XID = 79.0  # "GPU has fallen off the bus": Vigil's policy drains the node to replace it
HISTORY = 20.0  # seconds of samples sent at once before the real-time part
XID_AT = 10.0  # seconds into the real-time part
SAMPLES = 180.0  # the most real-time samples the act sends (it ends long before)
SEED = 11
CONFIRM_SECONDS = 5.0  # alerter.confirm_seconds; default 120
HOLD_SECONDS = 5.0  # detect.health_hold_seconds; default 300
EVIDENCE_SECONDS = 10.0  # alerter.repair_evidence_seconds; default 900
CHECK_COMMAND = "echo site check of {node}: PASS"  # alerter.repair_check_command
SINFO_FORMAT = "%10N %10T %E"  # node, state, reason (Slurm pads to the width)
STEP_TIMEOUT = 90.0  # seconds each step may take before the act gives up


def act_env(base: Mapping[str, str], run: str, slurm_conf: str, fleet_nodes: int
            ) -> dict[str, str]:
    """The act's environment: its own topics, consumer groups and Redis prefix (the
    tour's incidents are not its business), remediation on and executed by Slurm,
    and the three shortened waits."""
    tag = f"demo-{run}-repair"
    return dict(base,
                VIGIL_KAFKA_TOPIC_PREFIX=f"{tag}.", VIGIL_WORKER_APP_ID=f"vigil-{tag}",
                VIGIL_ALERTER_GROUP_ID=tag, VIGIL_REDIS_KEY_PREFIX=f"vigil-{tag}",
                VIGIL_ALERTER_METRICS_PORT="0",
                VIGIL_DETECT_HEALTH_HOLD_SECONDS=f"{HOLD_SECONDS:g}",
                VIGIL_ALERTER_REMEDIATION_ENABLED="true",
                VIGIL_ALERTER_REMEDIATION_DRY_RUN="false",
                VIGIL_ALERTER_REMEDIATION_EXECUTOR="slurm",
                VIGIL_ALERTER_SLURM_CONF=slurm_conf,
                VIGIL_ALERTER_FLEET_NODES=str(fleet_nodes),
                VIGIL_ALERTER_CONFIRM_SECONDS=f"{CONFIRM_SECONDS:g}",
                VIGIL_ALERTER_REPAIR_EVIDENCE_SECONDS=f"{EVIDENCE_SECONDS:g}",
                VIGIL_ALERTER_REPAIR_CHECK_COMMAND=CHECK_COMMAND)


def pick_node(states: Mapping[str, str]) -> str | None:
    """The second idle node (the first if only one is): a node someone else drained,
    or a previous run left out, is never touched."""
    idle = [node for node, state in states.items() if state == "idle"]
    return idle[min(1, len(idle) - 1)] if idle else None


def act_cluster(nodes: list[str], node: str, start: float) -> Cluster:
    """One data-parallel job over the Slurm nodes; XID 79 on ``node`` GPU 3."""
    return Cluster([JobSpec(JOB, nodes)],
                   [Fault("xid", JOB, node, GPU, start + XID_AT, severity=XID)])


def act_simulator(cluster: Cluster, start: float) -> Simulator:
    """The act's samples: ``HISTORY`` seconds before ``start``, then real time."""
    return Simulator(cluster, start - HISTORY, seed=SEED)


def _feed(cfg: Config, sim: Simulator, stop: threading.Event) -> None:
    """Send the simulated samples as their time comes (the agents' pace)."""
    from vigil_gpu_monitor.producers.publisher import KafkaPublisher

    pub = KafkaPublisher(cfg.kafka_bootstrap, topics.topic(topics.SAMPLES, cfg.kafka.topic_prefix),
                         **cfg.kafka_client)
    try:
        for sample in sim.samples(HISTORY + SAMPLES):
            delay = sample["ts"] - 1.0 - time.time()
            if delay > 0 and stop.wait(delay):
                return
            pub.publish(sample)
    finally:
        pub.close()


def _say(text: str) -> None:
    print(text, flush=True)


def _show(title: str, argv: list[str], env: Mapping[str, str]) -> str:
    """Run a command, print it and its output indented (as an operator would see it)."""
    done = subprocess.run(argv, env=dict(env), capture_output=True, text=True, timeout=60)
    # stderr carries the command's log lines: shown only when it failed
    out = (done.stdout + (done.stderr if done.returncode else "")).rstrip()
    _say(f"  $ {title}\n" + "\n".join(f"    {line}" for line in out.splitlines()))
    return out


def _vigil(env: Mapping[str, str], *args: str) -> str:
    return _show("vigil " + " ".join(f"'{a}'" if " " in a else a for a in args),
                 [sys.executable, "-m", "vigil_gpu_monitor", *args], env)


def _sinfo(cfg: Config) -> str:
    return _show(f"sinfo -N -o '{SINFO_FORMAT}'", [slurm_binary("sinfo"), "-N", "-o",
                                                  SINFO_FORMAT],
                 dict(os.environ, SLURM_CONF=str(slurm_conf_path(cfg))))


def _wait_for(done: Callable[[], bool], timeout: float = STEP_TIMEOUT) -> bool:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def _settled(cfg: Config, node: str, timeout: float = 30.0) -> str:
    """The node's sinfo state once it has no ``*`` (a resumed node shows ``idle*``
    until its slurmd answers the controller's next ping)."""
    state = sinfo_states(cfg).get(node, "unknown")
    deadline = time.monotonic() + timeout
    while state.endswith("*") and time.monotonic() < deadline:
        time.sleep(0.5)
        state = sinfo_states(cfg).get(node, "unknown")
    return state


def start_local_slurm(cfg: Config) -> tuple[Config, bool] | None:
    """The local stack's Slurm, started when not running: (its config, whether this
    call started it), or None after saying why it cannot run here."""
    cfg = dataclasses.replace(cfg, local=dataclasses.replace(cfg.local, slurm=True))
    running = all(svc.pid() is not None for svc in slurm_services(cfg).values())
    try:
        start_slurm(cfg)
    except (VigilError, OSError, subprocess.SubprocessError) as exc:
        _say(f"  SKIPPED: Slurm cannot start on this machine, so no node is taken out "
             f"and brought back in this run.\n  why: {str(exc)[:800]}")
        if not running:
            stop_slurm(cfg)
        return None
    return cfg, not running


def _spawn(name: str, env: Mapping[str, str], log_path: str) -> subprocess.Popen[bytes]:
    with open(log_path, "ab") as log:  # the child keeps its own descriptor
        return subprocess.Popen([sys.executable, "-m", "vigil_gpu_monitor", name], env=dict(env),
                                stdout=log, stderr=subprocess.STDOUT)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def run_act(base_env: Mapping[str, str], run: str, log_dir: str) -> bool | None:
    """The act on the local stack's Slurm: True when the node came back idle and in
    service, False when it did not, None when Slurm cannot run here (skipped)."""
    _say("\n=== last act: Vigil takes a node out of a real Slurm cluster and brings it "
         "back, verified\n  starting the local Slurm (munged, slurmctld, a slurmd per node; "
         "Debian's packages)...")
    started = start_local_slurm(load(env=base_env))
    if started is None:
        return None
    slurm_cfg, ours = started
    try:
        return _act(slurm_cfg, base_env, run, log_dir)
    finally:
        if ours:
            _say("  stopping the Slurm the demo started")
            stop_slurm(slurm_cfg)


def _act(slurm_cfg: Config, base_env: Mapping[str, str], run: str, log_dir: str) -> bool:
    nodes = node_names(slurm_cfg)
    node = pick_node(sinfo_states(slurm_cfg))
    if node is None:
        _say(f"  FAILED: no idle Slurm node to use ({sinfo_states(slurm_cfg)}); a node an "
             "earlier run left drained comes back with `scontrol update NodeName=<node> "
             f"State=RESUME` (SLURM_CONF={slurm_conf_path(slurm_cfg)})")
        return False
    env = act_env(base_env, run, str(slurm_conf_path(slurm_cfg)), len(nodes))
    cfg = load(env=env)
    ensure_topics(cfg)
    procs = [_spawn(name, env, os.path.join(log_dir, f"{name}-{run}-repair.log"))
             for name in ("worker", "alerter")]
    stop = threading.Event()
    start = time.time() + 5  # give the worker a moment to join its group
    feeder = threading.Thread(target=_feed, daemon=True, args=(
        cfg, act_simulator(act_cluster(nodes, node, start), start), stop))
    _say(f"  Job {JOB} runs on Slurm nodes {', '.join(nodes)}; at t+{XID_AT:.0f}s GPU {GPU} "
         f"of {node} reports XID {XID:.0f} (fallen off the bus).\n"
         "  Remediation: enabled and executed by Slurm (not a dry run), rails as configured.\n"
         f"  Shortened for the demo: alerter.confirm_seconds {CONFIRM_SECONDS:g} (default 120), "
         f"detect.health_hold_seconds {HOLD_SECONDS:g} (300),\n"
         f"  alerter.repair_evidence_seconds {EVIDENCE_SECONDS:g} (900). Site check: "
         f"alerter.repair_check_command = \"{CHECK_COMMAND}\".")
    _sinfo(slurm_cfg)
    feeder.start()
    try:
        return _story(slurm_cfg, cfg, env, node, start)
    finally:
        stop.set()
        _stop(procs)


def _story(slurm_cfg: Config, cfg: Config, env: Mapping[str, str], node: str,
           start: float) -> bool:
    """Out, repaired, verified, back: each step shown as an operator sees it."""
    r = redis.Redis.from_url(cfg.redis_url)
    repairs, state = RepairLog(r, cfg.redis.key_prefix), LiveState(r, cfg.redis.key_prefix)

    def t() -> str:
        return f"t+{time.time() - start:.0f}s"

    if not _wait_for(lambda: repairs.state(node) == AWAITING):
        _say(f"  FAILED: {node} was not taken out within {STEP_TIMEOUT:.0f}s (state "
             f"{repairs.state(node)}); see the act's logs")
        return False
    record = repairs.record(node)
    _say(f"\n  {t()}  Vigil's worker detected it, the alerter waited {CONFIRM_SECONDS:g}s, "
         f"its rails said yes, and it drained {node}:\n    {record.get('summary', '')}")
    _sinfo(slurm_cfg)
    _vigil(env, "nodes")
    if not _wait_for(lambda: not [d for d in state.open_incidents(JOB) if d["node"] == node
                                  and d["kind"] == "gpu_health"]):
        _say(f"  the XID incident on {node} did not resolve within {STEP_TIMEOUT:.0f}s")
        return False
    _say(f"\n  {t()}  the XID incident resolved (no new XID for {HOLD_SECONDS:g}s); a "
         "technician swaps the GPU and reports it:")
    _vigil(env, "repair", "done", node, "--note", f"swapped GPU {GPU}", "--by", "demo")
    _wait_for(lambda: repairs.state(node) in (IN_SERVICE, HELD))
    record = repairs.record(node)
    final = record["state"]
    _say(f"\n  {t()}  the alerter verified the repair (the site check, then "
         f"{EVIDENCE_SECONDS:g}s of evidence): {node} is {final}:\n    {record.get('why', '')}")
    sinfo_state = _settled(slurm_cfg, node)
    _sinfo(slurm_cfg)
    _vigil(env, "actions", "--node", node)
    _vigil(env, "nodes")
    back = final == IN_SERVICE and sinfo_state == "idle"
    _say(f"\n  {node} {'is back in service: idle in Slurm' if back else 'did NOT come back'}"
         f" (Vigil: {final}; sinfo: {sinfo_state})")
    return back
