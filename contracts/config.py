"""Configuration: one TOML file plus ``VIGIL_<SECTION>_<FIELD>`` overrides.

This is the only module that reads the environment. Values are frozen
dataclasses; secrets are ``Secret`` objects that print as ``***``.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from vigil_gpu_monitor.contracts.codec import MAX_MESSAGE_BYTES
from vigil_gpu_monitor.contracts.errors import ConfigError
from vigil_gpu_monitor.contracts.identity import Signer, parse_keys
from vigil_gpu_monitor.contracts.limits import check as check_ranges
from vigil_gpu_monitor.contracts.limits import hide_password


class Secret:
    """A string that never shows itself in repr, str or logs; ``reveal()`` to use it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The secret value, for handing to a client library."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


def mask_url(url: str) -> str:
    """A URL that is safe to print: the password, and any path or query (webhook URLs
    carry their token there), become ``***``; a Redis database index (``/0``) stays.

    ``redis://user:pw@host:6379/0`` → ``redis://user:***@host:6379/0``;
    ``https://hooks.slack.com/services/T/B/x`` → ``https://hooks.slack.com/***``.
    """
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        netloc = netloc.replace(f":{parts.password}@", ":***@", 1)
    path = parts.path if parts.path.strip("/").isdigit() or parts.path in ("", "/") else "/***"
    return urlunsplit(parts._replace(netloc=netloc, path=path,
                                     query="***" if parts.query else "", fragment=""))


@dataclass(frozen=True)
class KafkaConfig:
    """How every Vigil process reaches Kafka. Empty bootstrap = the local stack's.

    ``security_protocol``: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL. SASL takes
    ``sasl_mechanism`` (SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN), ``sasl_username`` and
    ``sasl_password`` (a secret: set it from the environment); TLS verifies the broker
    against ``ssl_cafile`` (empty: the system's CAs) and, for brokers that require client
    certificates, presents ``ssl_certfile`` / ``ssl_keyfile``. Every client (agent, worker,
    alerter, admin, CLI) gets the same settings.
    """

    bootstrap: str = ""
    topic_prefix: str = ""
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str = ""
    sasl_username: str = ""
    sasl_password: Secret | None = None
    ssl_cafile: str = ""
    # mutual TLS: this client's certificate chain and private key (PEM files), for
    # brokers that require client certificates (ssl.client.auth=required)
    ssl_certfile: str = ""
    ssl_keyfile: str = ""
    samples_partitions: int = 8
    detections_partitions: int = 4
    # vigil.summary/1 from stage-1 to stage-2 workers (docs/sharding.md): a 131,072-GPU
    # job sends ~13 messages a second, so few partitions carry many jobs
    summaries_partitions: int = 4
    samples_retention_hours: float = 24.0
    # replicas of every topic Vigil and its Faust worker create; 0 = the broker's
    # default.replication.factor. A process refuses to start while an existing Vigil
    # topic has fewer replicas than this.
    replication_factor: int = 0
    # min.insync.replicas of the topics Vigil creates; 0 = 2 with three or more replicas
    # (one broker may be lost without refusing acks=all writes), else 1
    min_insync_replicas: int = 0


@dataclass(frozen=True)
class RedisConfig:
    """Where live state goes. Empty url = the local stack's. Passwords belong in the
    URL (``redis://user:pw@host:port/db``) or ``rediss://`` for TLS."""

    url: Secret | None = None
    key_prefix: str = "vigil"
    history_max: int = 10000


@dataclass(frozen=True)
class LocalConfig:
    """The local stack `vigil up` starts when no external service is named."""

    data_dir: str = ".vigil/stack"
    kafka_port: int = 19092
    controller_port: int = 19093
    redis_port: int = 16379
    kafka_heap_mb: int = 512
    kafka_cache_dir: str = "~/.cache/vigil"
    # The local broker requires SASL/SCRAM (kafka.sasl_mechanism, one user: the
    # kafka.sasl_username / sasl_password clients use) instead of PLAINTEXT.
    kafka_sasl: bool = False
    # With kafka_sasl: the broker authorizes every request (KRaft's StandardAuthorizer),
    # the SASL user above is its super user, and one SCRAM principal per role (agent,
    # worker, alerter, reader) gets only its ACLs (vigil/ops/kafka_acls.py)
    kafka_acls: bool = False
    # The local broker listens with TLS only (a CA and certificates made with openssl
    # under data_dir/kafka/tls); "mutual" also requires client certificates.
    kafka_tls: str = ""
    # `vigil up` also starts munged, slurmctld and one slurmd per name in slurm_nodes
    # (Debian's packages, installed with apt-get when missing): a real controller for
    # the repair loop's tests; each slurmd listens on slurmd_port + its index
    slurm: bool = False
    slurmctld_port: int = 16817
    slurmd_port: int = 16818
    slurm_nodes: str = "gpu-01,gpu-02,gpu-03,gpu-04"


@dataclass(frozen=True)
class WorkerConfig:
    """The Faust stream worker."""

    app_id: str = "vigil-worker"
    web_port: int = 6066  # Prometheus /metrics; 0 turns it off
    metrics_bind: str = "127.0.0.1"
    session_timeout_seconds: float = 30.0  # a dead worker's partitions move after this
    checkpoint_steps: int = 6  # evaluated steps between checkpoints of a quiet job
    batch_size: int = 500
    batch_seconds: float = 0.5
    # bytes a fetch may bring per partition (Faust's consumer_max_fetch_size). Faust's
    # 1 MiB holds ~200 samples of 5 KB, and its fetch round trips then cap a worker
    # near 3,300 samples/s whatever it computes; 4 MiB lets it reach ~10,000
    # (bench/RESULTS.md). A fetch can hold this × the partitions a worker holds.
    fetch_bytes_per_partition: int = 4 << 20
    status_seconds: float = 5.0  # job heat and worker health for the live view; 0 = off
    # a stop signal's deadline: Faust's own shutdown can hang (faust issue 484), so a
    # worker still stopping after this exits hard; under Kubernetes' default 30 s grace
    stop_seconds: float = 25.0
    data_dir: str = ".vigil/worker"


@dataclass(frozen=True)
class DetectConfig:
    """Event-time windowing and detector thresholds shared by worker and replay."""

    bin_seconds: float = 5.0
    window_seconds: float = 60.0
    grace_seconds: float = 5.0
    # a metric the agent's adaptive sampling skipped keeps its last published value this
    # long, then absent = no reading. Must exceed agent.max_interval; the default is two
    # of its 16 s intervals plus a margin, so one lost sample does not empty the bins
    held_seconds: float = 35.0
    fire_after: int = 2
    resolve_after: int = 4
    # the straggler test's threshold: false alarms per 1,000 days of one GPU's (or
    # node's) comparison on noise alone (detectors/sequential.py)
    straggler_false_alarms_per_1000_days: float = 1.0
    hang_seconds: float = 10.0
    # a node this long without a sample is silent; a node that loses many messages
    # gets more (detectors/health.py)
    silent_seconds: float = 8.0
    missing_gpu_seconds: float = 10.0
    throttle_seconds: float = 15.0
    health_hold_seconds: float = 300.0
    link_z: float = 4.0
    ib_errors_per_window: float = 10.0
    network_link_share: float = 0.4
    # a job of more nodes than this is split into ceil(nodes / shard_nodes) shards,
    # stage 1 keyed by (job, shard), stage 2 by job (contracts/shards.py,
    # docs/sharding.md); 16-16,384. 1,024: a shard's 1,024 samples/s fit one stage-1
    # worker on a loaded 2-core machine (bench/RESULTS.md)
    shard_nodes: int = 1024


@dataclass(frozen=True)
class AlerterConfig:
    """The alerter: consumer group, channels (each off while its address is empty),
    routes (``"severity>=warning kinds=hang,gpu_health jobs=prod-*"``) and timers."""

    group_id: str = "vigil-alerter"
    metrics_port: int = 6067  # Prometheus /metrics; 0 turns it off
    metrics_bind: str = "127.0.0.1"
    alertmanager_url: str = ""
    alertmanager_route: str = ""
    slack_webhook: Secret | None = None
    slack_route: str = "severity>=warning"
    slack_rate_per_second: float = 1.0
    pagerduty_routing_key: Secret | None = None
    pagerduty_url: str = "https://events.pagerduty.com/v2/enqueue"
    pagerduty_route: str = "severity>=critical"
    pagerduty_rate_per_second: float = 2.0
    webhook_url: str = ""
    webhook_secret: Secret | None = None
    webhook_route: str = ""
    kafka_alerts: bool = False
    kafka_alerts_route: str = ""
    page_after_seconds: float = 60.0
    resend_seconds: float = 60.0
    flap_max: int = 3
    flap_window_seconds: float = 1800.0
    max_attempts: int = 6
    give_up_after_seconds: float = 600.0
    # Remediation: off unless enabled, and a dry run unless dry_run = false.
    remediation_enabled: bool = False
    remediation_dry_run: bool = True
    remediation_executor: str = "slurm"  # slurm | kubernetes | command
    remediation_command: str = ""  # for "command": argv template, {action} {node} {gpu} {job}
    kubernetes_api: str = "https://kubernetes.default.svc"
    kubernetes_token: Secret | None = None
    kubernetes_ca_file: str = ""
    confirm_seconds: float = 120.0
    node_cooldown_seconds: float = 3600.0
    max_actions_per_hour: int = 5
    max_job_share: float = 0.25
    max_fleet_share: float = 0.05
    fleet_nodes: int = 0  # 0: unknown, the fleet-share rail then allows one node at a time
    opt_out: str = ""  # comma-separated node or job patterns never acted on
    repeat_offender_count: int = 2  # actions on one node within 7 days before a person decides
    straggler_cordon_after_seconds: float = 600.0
    # > 0: a straggler is cordoned only if it costs at least this many GPU-hours per
    # hour (evidence.gpu_hours_lost_per_hour) once straggler_cordon_after_seconds passed
    straggler_cordon_gpu_hours_per_hour: float = 0.0
    # an incident costing at least this many GPU-hours per hour is raised to critical
    # (pages); 8 = a whole 8-GPU node's worth lost; 0 turns escalation by cost off
    page_gpu_hours_per_hour: float = 8.0
    # Repair loop (alerting/repair.py): every node Vigil takes out is verified and
    # returned, or held out with a reason. The check is an argv template ({node} {gpu}
    # {job} {incident}; no shell) the executor runs before the evidence window, e.g.
    # "ssh {node} dcgmi diag -r 2"; empty = no check, evidence only.
    repair_check_command: str = ""
    repair_check_timeout_seconds: float = 1800.0
    # after the check passed: this long without a firing gpu_health or link_health
    # detection on the node (and none open at its end); keep it above
    # detect.health_hold_seconds so a fixed fault's incident has resolved by then
    repair_evidence_seconds: float = 900.0
    # a returned node whose same fault fires again within this long is held out and
    # escalated to a person (the repeat-offender rail)
    repair_probation_seconds: float = 86400.0
    # a cordoned straggler is verified this long after it was cordoned (no part to swap)
    repair_straggler_wait_seconds: float = 3600.0
    repair_max_returns_per_hour: int = 10  # returns beyond this wait for the next hour
    gpus_per_node: int = 8  # for GPU-hours held out when a detection does not say
    # read meta.gpu_uuids from the samples topic: a changed UUID on a node awaiting a
    # GPU swap starts its verification
    repair_watch_samples: bool = True
    slurm_conf: str = ""  # SLURM_CONF for scontrol (empty: Slurm's default)


@dataclass(frozen=True)
class AgentConfig:
    """The node agent: sources, sampling (Moneo's adaptive intervals) and its buffer."""

    node: str = ""  # empty: the host name
    sources: str = "nvml,infiniband,host"  # also: dcgm, fake-nvml
    attribution: str = "static"  # static | slurm | kubernetes
    job: str = ""  # the job for static attribution
    kubelet_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"  # kubernetes
    # kubernetes: pod name → job (namespace/<job>); the default drops "-worker-3" etc.
    kubernetes_job_pattern: str = (
        r"^(?P<job>.+?)(?:-(?:worker|master|launcher|chief|ps|evaluator))?-\d+$")
    base_interval: float = 1.0
    max_interval: float = 16.0
    adaptive: bool = True
    peak_change: float = 0.10  # Moneo: the period's peak moved > 10 % of the collected peak
    density_band: float = 0.10  # Moneo: readings within 10 % of the peak ...
    density_min: float = 0.8  # ... must be at least 80 % of the period's readings
    noise_sigmas: float = 2.5  # an immediate publish must beat the series' own noise
    buffer_capacity: int = 100_000
    spool_dir: str = ""  # overflow of the memory buffer to disk; empty = off
    spool_max_mb: int = 512
    metrics_port: int = 9101  # 0 turns /metrics off
    metrics_bind: str = "127.0.0.1"
    dcgm_url: str = "http://127.0.0.1:9400/metrics"
    infiniband_root: str = "/sys/class/infiniband"
    proc_root: str = "/proc"
    cgroup_root: str = "/sys/fs/cgroup"
    # the node count of this node's jobs, where the scheduler does not tell the agent
    # (Kubernetes, static): samples of a job over detect.shard_nodes are keyed by
    # shard (docs/sharding.md); 0: unknown (Slurm: read from the job's environment;
    # otherwise one shard, keyed by job)
    job_nodes: int = 0
    fake_nvml_call_cost: float = 0.0  # seconds of CPU per call of the fake (benchmarks)
    fake_nvml_h100_costs: bool = False  # the fake's calls at a real H100's measured costs


@dataclass(frozen=True)
class IdentityConfig:
    """Proof that a sample comes from the node it names (``contracts/identity.py``,
    docs/security.md). Keys are ``key-id=hex`` entries, set from the environment."""

    # the worker refuses (dead-letters) every sample without a valid proof
    verify: bool = False
    # the worker's: the fleet master key(s), "k2=hex,k1=hex" while rotating
    master_keys: Secret | None = None
    # the agent's: its own node key ("k1=hex"), issued with
    # `python -m vigil_gpu_monitor.contracts.identity issue NODE`; empty = the agent does not sign
    node_key: Secret | None = None
    # or a file holding it (mode 0600, readable by the agent's user only), written at
    # provisioning: deploy/systemd and deploy/kubernetes use /etc/vigil/node.key
    node_key_file: str = ""


@dataclass(frozen=True)
class Config:
    """Everything Vigil reads from its configuration, one section per stage."""

    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    redis: RedisConfig = field(default_factory=RedisConfig)
    local: LocalConfig = field(default_factory=LocalConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    detect: DetectConfig = field(default_factory=DetectConfig)
    alerter: AlerterConfig = field(default_factory=AlerterConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    identity: IdentityConfig = field(default_factory=IdentityConfig)

    @property
    def kafka_bootstrap(self) -> str:
        """The configured bootstrap servers, or the local stack's."""
        return self.kafka.bootstrap or f"127.0.0.1:{self.local.kafka_port}"

    @property
    def kafka_client(self) -> dict[str, Any]:
        """Security settings for kafka-python clients (empty for PLAINTEXT)."""
        k = self.kafka
        args: dict[str, Any] = {}
        if k.security_protocol != "PLAINTEXT":
            args["security_protocol"] = k.security_protocol
        if k.security_protocol.startswith("SASL_"):
            args.update(sasl_mechanism=k.sasl_mechanism, sasl_plain_username=k.sasl_username,
                        sasl_plain_password=k.sasl_password.reveal() if k.sasl_password else "")
        if k.security_protocol in ("SSL", "SASL_SSL"):
            for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
                if getattr(k, key):
                    args[key] = getattr(k, key)
        return args

    @property
    def redis_url(self) -> str:
        """The configured Redis URL (with its secret), or the local stack's."""
        if self.redis.url is not None:
            return self.redis.url.reveal()
        return f"redis://127.0.0.1:{self.local.redis_port}/0"

    @property
    def manages_kafka(self) -> bool:
        """True when `vigil up` should start Kafka (no external broker named)."""
        return not self.kafka.bootstrap

    @property
    def manages_redis(self) -> bool:
        """True when `vigil up` should start Redis (no external server named)."""
        return self.redis.url is None


def _convert(raw: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        return _convert(raw, inner[0], where)
    try:
        if hint is Secret:
            return raw if isinstance(raw, Secret) else Secret(str(raw))
        if hint is bool:
            if isinstance(raw, bool):
                return raw
            if str(raw).lower() in ("1", "true", "yes", "on"):
                return True
            if str(raw).lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if hint is int:
            if isinstance(raw, bool):
                raise ValueError(raw)
            return int(raw)
        if hint is float:
            return float(raw)
        return str(raw)
    except (TypeError, ValueError):
        name = getattr(hint, "__name__", hint)
        raise ConfigError(f"{where}: cannot read {raw!r} as {name}") from None


def _section(cls: type, values: Mapping[str, Any], where: str) -> Any:
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(values) - known
    if unknown:
        raise ConfigError(f"{where}: unknown setting(s) {sorted(unknown)}")
    return cls(**{k: _convert(v, hints[k], f"{where}.{k}") for k, v in values.items()})


def load(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Read the TOML file (``path``, else ``$VIGIL_CONFIG``, else defaults), then apply
    ``VIGIL_<SECTION>_<FIELD>`` variables, which win."""
    env = os.environ if env is None else env
    path = path or env.get("VIGIL_CONFIG") or None
    data: dict[str, dict[str, Any]] = {}
    if path:
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path}: {exc}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"config file {path} is not UTF-8 text (TOML)") from None
    sections = {f.name: f.type for f in dataclasses.fields(Config)}
    hints = typing.get_type_hints(Config)
    for key in data:
        if key not in sections or not isinstance(data[key], dict):
            raise ConfigError(f"config file: unknown section [{key}]")
    for name, value in env.items():
        if not name.startswith("VIGIL_") or name == "VIGIL_CONFIG":
            continue
        rest = name[len("VIGIL_"):].lower()
        section = next((s for s in sections if rest.startswith(s + "_")), None)
        if section is None:
            raise ConfigError(f"environment: {name} names no config section")
        data.setdefault(section, {})[rest[len(section) + 1:]] = value
    config = Config(**{s: _section(hints[s], data.get(s, {}), s) for s in sections})
    check_ranges(config)
    _check_kafka_security(config.kafka)
    _check_identity(config.identity)
    if config.local.kafka_tls not in ("", "tls", "mutual"):
        raise ConfigError(f"local.kafka_tls {config.local.kafka_tls!r}: '', 'tls' or 'mutual'")
    if config.local.kafka_acls and not config.local.kafka_sasl:
        raise ConfigError("local.kafka_acls needs local.kafka_sasl: a principal per role "
                          "is a SCRAM user")
    if config.local.kafka_tls and config.local.kafka_sasl:
        raise ConfigError("local.kafka_tls and local.kafka_sasl: the local broker does one")
    if config.detect.held_seconds <= config.agent.max_interval:
        raise ConfigError(f"detect.held_seconds {config.detect.held_seconds:g} must exceed "
                          f"agent.max_interval {config.agent.max_interval:g}: a stable metric "
                          "the agent publishes that rarely would otherwise read as missing")
    if config.worker.fetch_bytes_per_partition < MAX_MESSAGE_BYTES:
        raise ConfigError(f"worker.fetch_bytes_per_partition "
                          f"{config.worker.fetch_bytes_per_partition} is under the largest "
                          f"sample ({MAX_MESSAGE_BYTES} bytes): such a sample could never be read")
    return config


KAFKA_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
# The kafka-python producer settings every Vigil producer starts from (the agent's,
# the simulator's, the alerter's; a deployment's client settings go over them).
# kafka-python 3.0 turned idempotence on by default, and its idempotent producer
# (3.0.12, the newest release, and its master) can stall for good after a broker
# outage longer than its delivery timeout: a batch it had sent expires, it drops its
# producer id (``TransactionManager.reset_producer_id``) yet stays READY, and it asks
# for a new id only from UNINITIALIZED, so its sender returns before sending or
# expiring anything, ever (against the real broker, `bench/bench_producer_outage.py`:
# 1,558 of 1,655 records still unanswered 90 s after the broker was back). Without
# idempotence there is no id to lose, and one request in flight a connection keeps a
# partition's retries in order. A retry after a lost answer can write a record twice:
# the worker drops a sample it already holds, and a detection or alert written twice
# carries the same id and state (as after a worker's crash).
KAFKA_PYTHON_PRODUCER: dict[str, Any] = {
    "enable_idempotence": False, "max_in_flight_requests_per_connection": 1}
SASL_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")


def _check_kafka_security(k: KafkaConfig) -> None:
    """Refuse a security setting that could not work, before any client tries it."""
    if k.security_protocol not in KAFKA_PROTOCOLS:
        raise ConfigError(f"kafka.security_protocol {k.security_protocol!r}: one of "
                          f"{', '.join(KAFKA_PROTOCOLS)}")
    if k.security_protocol.startswith("SASL_"):
        if k.sasl_mechanism not in SASL_MECHANISMS:
            raise ConfigError(f"kafka.sasl_mechanism {k.sasl_mechanism!r}: one of "
                              f"{', '.join(SASL_MECHANISMS)}")
        if not k.sasl_username or k.sasl_password is None:
            raise ConfigError("kafka.sasl_username and kafka.sasl_password are needed for "
                              f"{k.security_protocol}")
    for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        path = getattr(k, key)
        if path and not Path(path).is_file():
            raise ConfigError(f"kafka.{key} {path!r} is not a file")
    if bool(k.ssl_certfile) != bool(k.ssl_keyfile):
        raise ConfigError("kafka.ssl_certfile and kafka.ssl_keyfile go together (mutual TLS)")


def _check_identity(i: IdentityConfig) -> None:
    """Keys that parse. (A worker or alerter that verifies without master keys is
    refused when it starts: the agents share the file and never hold them.)"""
    if i.master_keys is not None:
        parse_keys(i.master_keys.reveal(), "identity.master_keys")
    if i.node_key is not None and i.node_key.reveal().strip():
        Signer.from_setting(i.node_key.reveal())
    if i.node_key_file and not Path(i.node_key_file).is_file():
        raise ConfigError(f"identity.node_key_file {i.node_key_file!r} is not a file")


def describe(config: Config) -> str:
    """The effective configuration as TOML-like text with every secret masked."""
    lines: list[str] = []
    for section in dataclasses.fields(config):
        lines.append(f"[{section.name}]")
        for f in dataclasses.fields(getattr(config, section.name)):
            value = getattr(getattr(config, section.name), f.name)
            if isinstance(value, Secret) and f"{section.name}.{f.name}" == "redis.url":
                value = hide_password(value.reveal())  # the host and database stay readable
            elif isinstance(value, Secret):
                value = mask_url(value.reveal()) if "://" in value.reveal() else "***"
            lines.append(f"{f.name} = {value!r}")
        lines.append("")
    return "\n".join(lines)
