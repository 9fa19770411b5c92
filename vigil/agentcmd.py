"""`vigil agent`: wire the configured sources, sampler and publisher, and run."""

from __future__ import annotations

import argparse
import logging
import re
import signal
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.codec import encode_sample
from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.contracts.errors import ConfigError, VigilError
from vigil_gpu_monitor.contracts.identity import Signer
from vigil_gpu_monitor.contracts.messages import Sample, StepBatch
from vigil_gpu_monitor.contracts.names import node_problem
from vigil_gpu_monitor.contracts.steps import encode_steps
from vigil_gpu_monitor.producers.agent import Agent
from vigil_gpu_monitor.producers.attribution import SlurmJob, StaticJob
from vigil_gpu_monitor.producers.jobsize import JobShards, SlurmJobNodes, fixed_nodes
from vigil_gpu_monitor.producers.metrics import agent_registry
from vigil_gpu_monitor.producers.reading import Source
from vigil_gpu_monitor.producers.sampler import AdaptiveSampler, SamplingConfig

log = logging.getLogger("vigil.agent")
# sources that read the node's GPUs: when they read none, the node is not published
GPU_SOURCES = frozenset({"nvml", "fake-nvml", "dcgm", "trace"})


class JsonLinesSink:
    """Debug output: validated samples as JSON lines to a file or stdout."""

    def __init__(self, path: str) -> None:
        self.fh = sys.stdout.buffer if path == "-" else open(path, "ab")

    def publish(self, sample: Sample) -> None:
        self.fh.write(encode_sample(sample) + b"\n")
        self.fh.flush()

    def publish_steps(self, batch: StepBatch) -> None:
        self.fh.write(encode_steps(batch) + b"\n")
        self.fh.flush()

    def close(self, timeout: float = 0.0) -> bool:
        if self.fh is not sys.stdout.buffer:
            self.fh.close()
        return True


def _start_steps(cfg: Config, args: argparse.Namespace, node: str, job_of: Callable[[], str],
                 sink: Any, stop: threading.Event) -> Callable[[], None]:
    """Receive ``vigil.witness`` records on ``--witness-socket`` and tail ``--log-tail``
    in a thread of their own, and publish the steps (``vigil.steps``, or the debug
    sink); returns what stops it."""
    from vigil_gpu_monitor.producers.logtail import PATTERNS, LogPattern, LogTail
    from vigil_gpu_monitor.producers.steps import BufferedStepPublisher, WitnessReceiver
    steps: Any = sink if args.out else BufferedStepPublisher(
        cfg.kafka_bootstrap, topics.topic(topics.STEPS, cfg.kafka.topic_prefix),
        capacity=cfg.agent.buffer_capacity, signer=node_signer(cfg),  # the worker checks it
        **cfg.kafka_client)
    tail = None
    if args.log_tail:  # at the log's end before the socket is bound: once a job can see
        # the agent listening, every step it logs is read
        pattern = PATTERNS.get(args.log_pattern) or LogPattern("custom", args.log_pattern)
        try:
            tail = LogTail(args.log_tail, pattern, node, job_of() or "")
        except (ValueError, re.error) as exc:
            raise ConfigError(f"agent: --log-pattern: {exc}") from None
    receiver = (WitnessReceiver(args.witness_socket, node, steps, job_of)
                if args.witness_socket else None)

    def loop() -> None:
        while not stop.is_set():
            poll()
            stop.wait(0.5)

    def poll() -> None:
        if receiver is not None:
            receiver.poll()
        if tail is not None:
            tail.job = job_of() or tail.job
            batch = tail.poll()
            if batch is not None and tail.job:
                try:
                    steps.publish_steps(batch)
                except Exception as exc:  # a batch the contract refuses: counted, go on
                    tail.dropped[type(exc).__name__] += 1

    thread = threading.Thread(target=loop, name="vigil-steps", daemon=True)
    thread.start()

    def close() -> None:
        stop.set()
        thread.join(timeout=5)
        poll()  # what arrived since the last poll
        if receiver is not None:
            receiver.close()
            log.info("witness: %d steps received, %d published, refused %s",
                     receiver.received, receiver.published, dict(receiver.invalid))
        if tail is not None:
            tail.close()
            log.info("log tail: %d step lines, dropped %s", tail.parser.matched,
                     dict(tail.dropped))
        if steps is not sink:
            steps.close(timeout=30)
    return close


def build_sources(cfg: Config, names: list[str], trace: str | None) -> dict[str, Source]:
    """The configured sources by name."""
    a = cfg.agent
    found: dict[str, Source] = {}
    for name in names:
        if name == "nvml":
            import pynvml

            from vigil_gpu_monitor.producers.nvml import NvmlSource
            found[name] = NvmlSource(pynvml, interval=a.base_interval)
        elif name == "fake-nvml":  # demos and benchmarks on machines without a GPU
            from vigil_gpu_monitor.producers.nvml import NvmlSource
            from vigil_gpu_monitor.producers.nvml_fake import FakeNvml
            found[name] = NvmlSource(FakeNvml(call_cost=a.fake_nvml_call_cost,
                                              h100_costs=a.fake_nvml_h100_costs),
                                     interval=a.base_interval)
        elif name == "infiniband":
            from vigil_gpu_monitor.producers.infiniband import InfinibandSource
            found[name] = InfinibandSource(a.infiniband_root)
        elif name == "host":
            from vigil_gpu_monitor.producers.host import HostSource
            found[name] = HostSource(a.proc_root)
        elif name == "dcgm":
            from vigil_gpu_monitor.producers.dcgm import DcgmExporterSource
            found[name] = DcgmExporterSource(a.dcgm_url)
        elif name == "trace":
            from vigil_gpu_monitor.producers.trace import TraceSource
            if not trace:
                raise ConfigError("the trace source needs --trace FILE")
            found[name] = TraceSource(trace)
        else:
            raise ConfigError(f"unknown agent source {name!r}")
    return found


def _serve_metrics(cfg: Config, agent: Agent, publisher: Any) -> None:
    from prometheus_client import start_http_server

    start_http_server(cfg.agent.metrics_port, addr=cfg.agent.metrics_bind,
                      registry=agent_registry(agent, publisher))


def build_attribution(cfg: Config, job: str | None = None) -> Callable[[], str]:
    """The configured way of knowing the node's job: static, Slurm or Kubernetes."""
    a = cfg.agent
    if a.attribution == "slurm":
        return SlurmJob(a.cgroup_root)
    if a.attribution == "kubernetes":
        from vigil_gpu_monitor.producers.podresources import KubeletJob, grpc_lister
        try:
            return KubeletJob(grpc_lister(a.kubelet_socket), a.kubernetes_job_pattern)
        except re.error as exc:
            raise ConfigError(f"agent.kubernetes_job_pattern: {exc}") from None
    if a.attribution != "static":
        raise ConfigError(f"agent.attribution {a.attribution!r}: static, slurm or kubernetes")
    return StaticJob(job if job is not None else a.job)


def build_shards(cfg: Config) -> JobShards:
    """job → the shard count its samples are keyed over (docs/sharding.md): from the
    job's node count where the scheduler says it (Slurm: the job's environment) or
    ``agent.job_nodes`` says it; unknown: one shard, keyed by job."""
    a = cfg.agent
    if a.job_nodes < 0:
        raise ConfigError(f"agent.job_nodes {a.job_nodes}: a node count, or 0 for unknown")
    nodes_of = (fixed_nodes(a.job_nodes) if a.job_nodes or a.attribution != "slurm"
                else SlurmJobNodes(a.cgroup_root, a.proc_root))
    return JobShards(nodes_of, cfg.detect.shard_nodes)


def sampling_config(cfg: Config) -> SamplingConfig:
    """The agent section's adaptive-sampling settings, refused with the key at fault."""
    a = cfg.agent
    try:
        return SamplingConfig(a.base_interval, a.max_interval, a.peak_change, a.density_band,
                              a.density_min, noise_sigmas=a.noise_sigmas)
    except ValueError as exc:
        raise ConfigError(f"agent: {exc}") from None


def node_signer(cfg: Config) -> Signer | None:
    """The agent's signer from ``identity.node_key`` or ``identity.node_key_file``
    (None: samples go unsigned)."""
    i = cfg.identity
    key = i.node_key.reveal().strip() if i.node_key else ""
    if not key and i.node_key_file:
        try:
            key = Path(i.node_key_file).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"identity.node_key_file: {exc.strerror}") from None
    return Signer.from_setting(key) if key else None


def run(cfg: Config, args: argparse.Namespace) -> int:
    """Run the agent until SIGTERM/SIGINT (or ``--ticks``); flush the buffer on the way out."""
    a = cfg.agent
    node = a.node or socket.gethostname()
    if node_problem(node) is not None:  # every sample would be refused: say so now
        raise ConfigError(f"agent.node (or the host name) {node_problem(node)}: set "
                          "agent.node to this machine's RFC 1123 host name")
    signer = node_signer(cfg)
    names = [n.strip() for n in (args.sources or a.sources).split(",") if n.strip()]
    sources = build_sources(cfg, names, args.trace)
    job_of = build_attribution(cfg, args.job)
    sampler = AdaptiveSampler(sampling_config(cfg)) if a.adaptive else None
    if args.out:
        sink: Any = JsonLinesSink(args.out)
    else:
        from vigil_gpu_monitor.producers.publisher import BufferedPublisher
        from vigil_gpu_monitor.producers.spool import DiskSpool
        spool = DiskSpool(a.spool_dir, max_bytes=a.spool_max_mb << 20) if a.spool_dir else None
        sink = BufferedPublisher(cfg.kafka_bootstrap,
                                 topics.topic(topics.SAMPLES, cfg.kafka.topic_prefix),
                                 capacity=a.buffer_capacity, spool=spool, signer=signer,
                                 shards=build_shards(cfg), **cfg.kafka_client)
    agent = Agent(node, sources, sink, sampler, job_of, gpu_sources=GPU_SOURCES)
    if a.metrics_port:
        _serve_metrics(cfg, agent, sink)
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    stop_witness = _start_steps(cfg, args, agent.node, job_of, sink, threading.Event()) if (
        getattr(args, "witness_socket", None) or getattr(args, "log_tail", None)) else None
    log.info("agent on %s: sources %s, %s", agent.node, ", ".join(sources),
             f"adaptive {a.base_interval}-{a.max_interval}s" if sampler else "every tick")
    wait = a.base_interval if not (args.ticks and args.fast) else 0
    blind = 0
    try:
        agent.tick()
        if agent.blind_ticks:  # at start: a misconfigured node, told now, not later
            raise VigilError(f"this node's sources read no GPU on the first tick "
                             f"({_failures(agent)}); nothing was published",
                             fix="check each source (--sources, agent.dcgm_url, the NVIDIA "
                             "driver), or `vigil agent --out - --ticks 1` to try")
        stop.wait(wait)
        if args.ticks:
            for _ in range(args.ticks - 1):
                if stop.is_set():
                    break
                agent.tick()
                blind += agent.blind_ticks > 0
                stop.wait(wait)
        else:
            agent.run(a.base_interval, stop)
    finally:
        if stop_witness is not None:
            stop_witness()
        flushed = sink.close(timeout=30)
        for source in sources.values():
            close = getattr(source, "close", None)
            if close:
                close()
        log.info("agent stopped after %d ticks; flushed=%s dropped=%s errors=%s", agent.ticks,
                 flushed, getattr(sink, "dropped", 0), dict(agent.errors))
    if args.ticks and args.ticks > 1 and blind == args.ticks - 1:
        log.error("no source read anything on any tick: nothing was published")
        return 1
    return 0 if flushed else 1


def _failures(agent: Agent) -> str:
    """What each source said when it failed (error counters of the agent and sources)."""
    said = [key.split(":", 1)[1] for key in agent.errors if key.startswith("source:")]
    for name, source in agent.sources.items():
        said.extend(f"{name}: {kind}" for kind in getattr(source, "errors", {}) or {})
    return ", ".join(said) or "every source answered empty"
