"""The local runtime of real services: a single-node KRaft Kafka and a Redis (and, for
replication tests, KRaft clusters of several brokers; with ``local.slurm``, a real
Slurm controller and nodes: ``vigil.ops.slurmstack``).

`vigil up` starts what the configuration does not point elsewhere, waits until
each answers, and records pid files under ``local.data_dir``; `vigil down` stops
only what those pid files name. Both are idempotent.
"""

from __future__ import annotations

import base64
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.contracts.errors import VigilError
from vigil_gpu_monitor.vigil.progress import Progress

KAFKA_VERSION = "3.9.1"
REPO_ROOT = Path(__file__).resolve().parents[2]
POM = REPO_ROOT / "deploy" / "local" / "pom.xml"
_KAFKA_STARTED = "Kafka Server started"


class StackError(VigilError):
    """The local stack cannot be started; the message says what to install or fix."""


def port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours is not alive
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1]
        return state != "Z"
    except OSError:
        return True


@dataclass
class Service:
    """One managed process: where its pid, log and data live."""

    name: str
    port: int
    root: Path

    @property
    def pidfile(self) -> Path:
        return self.root / f"{self.name}.pid"

    @property
    def logfile(self) -> Path:
        return self.root / "logs" / f"{self.name}.log"

    @property
    def datadir(self) -> Path:
        return self.root / self.name

    def pid(self) -> int | None:
        """The recorded pid when that process is still alive."""
        try:
            pid = int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _pid_alive(pid) else None

    def spawn(self, argv: list[str]) -> int:
        """Start ``argv`` detached from this terminal, logging to ``logfile``."""
        self.logfile.parent.mkdir(parents=True, exist_ok=True)
        with open(self.logfile, "ab") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.pidfile.write_text(str(proc.pid))
        return proc.pid

    def stop(self, timeout: float = 30.0) -> bool:
        """SIGTERM, then SIGKILL after ``timeout``; True if something was stopped."""
        pid = self.pid()
        if pid is None:
            self.pidfile.unlink(missing_ok=True)
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
        self.pidfile.unlink(missing_ok=True)
        return True


def _say(message: str) -> None:
    print(f"vigil: {message}", file=sys.stderr, flush=True)


def _require(tool: str, install_hint: str) -> str:
    found = shutil.which(tool)
    if not found:
        raise StackError(f"{tool} not found: {install_hint}")
    return found


def _tree_bytes(root: Path) -> int:
    """Bytes under ``root`` (0 if absent): how far a download has come."""
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(folder, name))
            except OSError:
                pass  # a file Maven is renaming right now
    return total


def kafka_libs(config: Config) -> Path:
    """The broker's jars, fetched from Maven Central with ``mvn`` the first time."""
    libs = Path(config.local.kafka_cache_dir).expanduser() / f"kafka-{KAFKA_VERSION}" / "libs"
    if (libs / f"kafka_2.13-{KAFKA_VERSION}.jar").exists():
        return libs
    mvn = _require("mvn", "install Maven (apt-get install maven) to fetch Kafka's jars")
    if not POM.exists():
        raise StackError(f"{POM} is missing: run vigil from a checkout of the repository")
    _say(f"fetching Apache Kafka {KAFKA_VERSION} from Maven Central (once, ~50 MB)...")
    tmp = libs.with_name("libs.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    repo = Path("~/.m2/repository").expanduser()
    before = _tree_bytes(repo)
    progress = Progress("vigil: fetching Kafka")
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            [mvn, "-q", "-B", "-f", str(POM), "dependency:copy-dependencies",
             f"-DoutputDirectory={tmp}", "-DincludeScope=runtime"],
            stdout=log, stderr=subprocess.STDOUT, text=True)
        while proc.poll() is None:
            time.sleep(0.5)
            progress.update(f"{(_tree_bytes(repo) - before) / 1e6:.0f} MB downloaded")
        if proc.returncode != 0:
            log.seek(0)
            raise StackError(f"mvn could not fetch Kafka:\n{log.read()[-4000:]}")
    progress.done(f"{(_tree_bytes(repo) - before) / 1e6:.0f} MB downloaded")
    tmp.rename(libs)
    return libs


@dataclass(frozen=True)
class Quorum:
    """This broker's place in a KRaft cluster of several combined broker-controllers
    (tests of replication): its node id, every voter, the shared cluster id, and the
    replication factor the cluster's topics get by default."""

    node_id: int
    voters: str  # "1@127.0.0.1:9093,2@127.0.0.1:9095,…"
    cluster_id: str
    replicas: int

    @staticmethod
    def of(controller_ports: list[int]) -> list[Quorum]:
        """One Quorum per broker of a new cluster with these controller ports."""
        voters = ",".join(f"{i}@127.0.0.1:{port}" for i, port in
                          enumerate(controller_ports, start=1))
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        return [Quorum(i, voters, cluster_id, len(controller_ports))
                for i in range(1, len(controller_ports) + 1)]


def _kafka_properties(config: Config, svc: Service, quorum: Quorum | None = None) -> Path:
    local = config.local
    quorum = quorum or Quorum(1, f"1@127.0.0.1:{local.controller_port}", "", 1)
    replicas, min_isr = str(quorum.replicas), str(2 if quorum.replicas >= 3 else 1)
    props = {
        "process.roles": "broker,controller",
        "node.id": str(quorum.node_id),
        "controller.quorum.voters": quorum.voters,
        "listeners": (f"PLAINTEXT://127.0.0.1:{local.kafka_port},"
                      f"CONTROLLER://127.0.0.1:{local.controller_port}"),
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{local.kafka_port}",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str((svc.datadir / "data").resolve()),
        "num.partitions": "1",
        "default.replication.factor": replicas,
        "min.insync.replicas": min_isr,
        "offsets.topic.replication.factor": replicas,
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": min_isr,
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "false",  # wrong partition counts must fail loudly
        "log.retention.hours": "24",
        "log.segment.bytes": str(64 << 20),
    }
    if local.kafka_sasl:
        props.update(_sasl_properties(config))
    if local.kafka_acls:
        # the admin is the super user; so is the loopback CONTROLLER listener's
        # unauthenticated principal (the broker registers with its controller there,
        # and SCRAM cannot secure a KRaft controller listener); every other principal
        # gets only its role's ACLs (vigil/ops/kafka_acls.py)
        props["authorizer.class.name"] = \
            "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
        props["super.users"] = f"User:{_scram(config)[1]};User:ANONYMOUS"
    if local.kafka_tls:
        props.update(_tls_properties(config, tls_files(svc.datadir / "tls")))
    path = svc.datadir / "server.properties"
    path.touch(mode=0o600)  # it may hold the SASL user's password
    path.chmod(0o600)
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    log4j = svc.datadir / "log4j.properties"
    log4j.write_text(
        "log4j.rootLogger=INFO, stdout\n"
        "log4j.appender.stdout=org.apache.log4j.ConsoleAppender\n"
        "log4j.appender.stdout.layout=org.apache.log4j.PatternLayout\n"
        "log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n\n"
        "log4j.logger.kafka=INFO\nlog4j.logger.org.apache.kafka=WARN\n"
        "log4j.logger.kafka.server.KafkaRaftServer=INFO\n")
    return path


def _scram(config: Config) -> tuple[str, str, str]:
    """(mechanism, user, password) the SASL broker accepts."""
    k = config.kafka
    if k.sasl_mechanism not in ("SCRAM-SHA-256", "SCRAM-SHA-512") or not k.sasl_username \
            or k.sasl_password is None:
        raise StackError("local.kafka_sasl needs kafka.sasl_mechanism (SCRAM-SHA-256/512), "
                         "kafka.sasl_username and kafka.sasl_password")
    return k.sasl_mechanism, k.sasl_username, k.sasl_password.reveal()


def _sasl_properties(config: Config) -> dict[str, str]:
    """Broker settings for one SASL_PLAINTEXT listener with SCRAM (the controller
    listener stays on loopback in plain text)."""
    mechanism, user, password = _scram(config)
    port, controller = config.local.kafka_port, config.local.controller_port
    return {
        "listeners": (f"SASL_PLAINTEXT://127.0.0.1:{port},"
                      f"CONTROLLER://127.0.0.1:{controller}"),
        "advertised.listeners": f"SASL_PLAINTEXT://127.0.0.1:{port}",
        "listener.security.protocol.map": "SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": mechanism,
        "sasl.mechanism.inter.broker.protocol": mechanism,
        f"listener.name.sasl_plaintext.{mechanism.lower()}.sasl.jaas.config":
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{user}" password="{password}";',
    }


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of the local TLS broker: its CA, its key and chain in one file (Kafka's
    PEM keystore), and a client certificate signed by the same CA (mutual TLS)."""

    ca: Path
    broker_keystore: Path
    client_cert: Path
    client_key: Path


def tls_files(root: Path) -> TlsFiles:
    """Make (once) a self-signed CA, a broker certificate for 127.0.0.1 and localhost,
    and a client certificate, with openssl; 30 days, for local use only."""
    files = TlsFiles(root / "ca.pem", root / "broker-keystore.pem", root / "client.pem",
                     root / "client.key")
    if files.client_key.exists():
        return files
    openssl = _require("openssl", "apt-get install openssl")
    root.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        done = subprocess.run([openssl, *args], capture_output=True, text=True, cwd=root)
        if done.returncode != 0:
            raise StackError(f"openssl {args[0]} failed: {done.stderr[-2000:]}")

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "30", "-subj", "/CN=vigil-local-ca")
    for name, ext in (("broker", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
                      ("client", "extendedKeyUsage=clientAuth")):
        (root / f"{name}.ext").write_text(ext + "\n")
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
            f"{name}.csr", "-subj", f"/CN=vigil-{name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "30", "-extfile", f"{name}.ext")
    files.broker_keystore.write_text((root / "broker.key").read_text()
                                     + (root / "broker.pem").read_text())
    for secret in (root / "ca.key", root / "broker.key", files.broker_keystore,
                   files.client_key):
        secret.chmod(0o600)
    return files


def _tls_properties(config: Config, files: TlsFiles) -> dict[str, str]:
    """Broker settings for one SSL listener (PEM keystore and truststore, KIP-651); the
    controller listener stays on loopback in plain text."""
    port, controller = config.local.kafka_port, config.local.controller_port
    props = {
        "listeners": f"SSL://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
        "advertised.listeners": f"SSL://127.0.0.1:{port}",
        "listener.security.protocol.map": "SSL:SSL,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "SSL",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(files.broker_keystore.resolve()),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(files.ca.resolve()),
    }
    if config.local.kafka_tls == "mutual":
        props["ssl.client.auth"] = "required"
    return props


def _java(config: Config, libs: Path, svc: Service, *args: str) -> list[str]:
    java = _require("java", "install a Java 17 runtime (apt-get install openjdk-17-jre-headless)")
    heap = config.local.kafka_heap_mb
    return [java, f"-Xmx{heap}m", f"-Xms{min(256, heap)}m",
            f"-Dlog4j.configuration=file:{(svc.datadir / 'log4j.properties').resolve()}",
            "-cp", f"{libs}/*", *args]


def start_kafka(config: Config, svc: Service, timeout: float = 120.0,
                quorum: Quorum | None = None, wait: bool = True) -> Callable[[], None]:
    """Format storage once, start the broker, wait for its port and 'started' line.

    With ``quorum`` the broker is one of a KRaft cluster; a broker of a cluster cannot
    finish starting before a majority of its voters runs, so start them all with
    ``wait=False`` and call each returned waiter afterwards."""
    libs = kafka_libs(config)
    svc.datadir.mkdir(parents=True, exist_ok=True)
    props = _kafka_properties(config, svc, quorum)
    if not (svc.datadir / "data" / "meta.properties").exists():
        cluster_id = quorum.cluster_id if quorum else \
            base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        scram: list[str] = []
        if config.local.kafka_sasl:
            mechanism, user, password = _scram(config)
            scram = ["--add-scram", f"{mechanism}=[name={user},password={password}]"]
            if config.local.kafka_acls:
                from vigil_gpu_monitor.vigil.ops.kafka_acls import ROLES, principal, role_password
                for role in ROLES:
                    scram += ["--add-scram", f"{mechanism}=[name={principal(role)},"
                              f"password={role_password(password, role)}]"]
        result = subprocess.run(_java(config, libs, svc, "kafka.tools.StorageTool", "format",
                                      # "=": an id may begin with "-" (base64url), which
                                      # the tool would take for an option
                                      f"--cluster-id={cluster_id}", "-c", str(props),
                                      *scram),
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise StackError(f"Kafka storage format failed: {result.stdout}{result.stderr}")
    offset = svc.logfile.stat().st_size if svc.logfile.exists() else 0
    svc.spawn(_java(config, libs, svc, "kafka.Kafka", str(props)))

    def waiter() -> None:
        _wait(svc, timeout,
              lambda: port_open(svc.port) and _log_has(svc, _KAFKA_STARTED, offset))

    if config.local.kafka_acls:
        waiter = _then_acls(config, waiter)
    if wait:
        waiter()
    return waiter


def _then_acls(config: Config, waiter: Callable[[], None]) -> Callable[[], None]:
    """``waiter``, then Vigil's topics created and every role's ACLs written, as the
    admin (the super user)."""
    def wait_then_grant() -> None:
        from vigil_gpu_monitor.vigil.ops.kafka_acls import apply
        from vigil_gpu_monitor.vigil.ops.kafka_admin import ensure_topics
        waiter()
        ensure_topics(config)
        _say(f"kafka: {apply(config)} ACLs for the agent, worker, alerter and reader roles")
    return wait_then_grant


def _log_has(svc: Service, needle: str, offset: int) -> bool:
    try:
        with open(svc.logfile, "rb") as fh:
            fh.seek(offset)
            return needle.encode() in fh.read()
    except OSError:
        return False


APT_LOCK = Path(tempfile.gettempdir()) / "vigil-apt.lock"
APT_WAIT_SECONDS = 600  # how long apt-get waits for another apt or dpkg to finish


def debian_binary(binary: str, package: str, folders: Iterable[str] = ("/usr/bin",)) -> str:
    """Path of ``binary`` (in ``folders`` or on the PATH); installs Debian's
    ``package`` with apt-get when missing and running as root, else says what to
    install.

    Installs are taken one at a time: `make test` runs its two lanes side by side,
    and two apt-gets at once fail on dpkg's lock (seen on a new machine: promtool's
    install refused while slurmctld's ran, and its test failed). An exclusive lock
    on ``APT_LOCK`` queues Vigil's own installs, the binary is looked for again once
    it is held (the one before may have installed it), and apt-get itself waits up
    to ``APT_WAIT_SECONDS`` for any other apt or dpkg. A failed install says what
    apt-get answered."""
    def find() -> str | None:
        for folder in folders:
            if (Path(folder) / binary).exists():
                return str(Path(folder) / binary)
        return shutil.which(binary)

    found = find()
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise StackError(f"{binary} not found: install it (apt-get install {package})")
    with open(APT_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        found = find()
        if found:
            return found
        _say(f"{binary} missing: installing Debian's {package} with apt-get...")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        wait = f"DPkg::Lock::Timeout={APT_WAIT_SECONDS}"
        answered = ""
        for cmd in (["apt-get", "-o", wait, "update", "-qq"],
                    ["apt-get", "-o", wait, "install", "-y", "-qq", "--no-install-recommends",
                     package]):
            done = subprocess.run(cmd, check=False, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)
            answered = done.stderr.strip() or answered
        found = find()
        if found:
            return found
    raise StackError(f"{binary} not found: install it (apt-get install {package}); "
                     f"apt-get said: {answered[-500:] or 'nothing'}")


def redis_ping(port: int) -> bool:
    """True when a Redis on loopback answers PING."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def start_redis(config: Config, svc: Service, timeout: float = 30.0) -> None:
    """Start redis-server on loopback with its data and log under the stack dir."""
    binary = debian_binary("redis-server", "redis-server")
    svc.datadir.mkdir(parents=True, exist_ok=True)
    svc.spawn([binary, "--port", str(svc.port), "--bind", "127.0.0.1", "--protected-mode", "yes",
               "--dir", str(svc.datadir.resolve()), "--appendonly", "yes", "--save", "",
               "--daemonize", "no"])
    _wait(svc, timeout, lambda: redis_ping(svc.port))


def _wait(svc: Service, timeout: float, ready: Callable[[], bool]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        if svc.pid() is None:
            tail = svc.logfile.read_text(errors="replace")[-3000:] if svc.logfile.exists() else ""
            raise StackError(f"{svc.name} exited during start-up; log {svc.logfile}:\n{tail}")
        time.sleep(0.3)
    svc.stop()
    raise StackError(f"{svc.name} did not become ready in {timeout:.0f}s; see {svc.logfile}")


def services(config: Config) -> dict[str, Service]:
    """The services this configuration manages (external ones are left out)."""
    root = Path(config.local.data_dir)
    found: dict[str, Service] = {}
    if config.manages_kafka:
        found["kafka"] = Service("kafka", config.local.kafka_port, root)
    if config.manages_redis:
        found["redis"] = Service("redis", config.local.redis_port, root)
    return found


def up(config: Config) -> None:
    """Start every managed service that is not already running and healthy."""
    starters: dict[str, Callable[[Config, Service], object]] = {
        "kafka": start_kafka, "redis": start_redis}
    for name, svc in services(config).items():
        if svc.pid() is not None:
            _say(f"{name} already running (pid {svc.pid()}, port {svc.port})")
            continue
        if port_open(svc.port):
            raise StackError(f"port {svc.port} for {name} is taken by another process",
                             fix=f"set VIGIL_LOCAL_{name.upper()}_PORT, or stop that process")
        svc.root.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        starters[name](config, svc)
        _say(f"{name} up on 127.0.0.1:{svc.port} in {time.monotonic() - started:.1f}s "
             f"(log {svc.logfile})")
    if config.local.slurm:
        from vigil_gpu_monitor.vigil.ops.slurmstack import start_slurm
        start_slurm(config)
    if not config.manages_kafka:
        _say(f"using external Kafka {config.kafka_bootstrap}")
    if not config.manages_redis:
        _say("using external Redis from VIGIL_REDIS_URL")


def down(config: Config, only: Iterable[str] | None = None) -> None:
    """Stop the services this stack started (found by pid file); ``only`` those named."""
    wanted = None if only is None else set(only)
    if (wanted is None or "slurm" in wanted) and (config.local.slurm or _slurm_running(config)):
        # by its pid files: a Slurm `VIGIL_LOCAL_SLURM=true vigil up` started is stopped by
        # a plain `vigil down` too
        from vigil_gpu_monitor.vigil.ops.slurmstack import stop_slurm
        stopped = stop_slurm(config)
        _say(f"slurm stopped ({', '.join(stopped)})" if stopped else "slurm was not running")
    for name, svc in services(config).items():
        if wanted is None or name in wanted:
            _say(f"{name} stopped" if svc.stop() else f"{name} was not running")


def _slurm_running(config: Config) -> bool:
    """True when a pid file of the local Slurm names a live process."""
    from vigil_gpu_monitor.vigil.ops.slurmstack import slurm_services
    return any(svc.pid() is not None for svc in slurm_services(config).values())


def health(config: Config) -> dict[str, str]:
    """Service name → 'up (pid N, port P)' / 'down' / 'external'."""
    report: dict[str, str] = {}
    managed = services(config)
    for name in ("kafka", "redis"):
        svc = managed.get(name)
        if svc is None:
            report[name] = "external"
            continue
        pid = svc.pid()
        healthy = redis_ping(svc.port) if name == "redis" else port_open(svc.port)
        report[name] = (f"up (pid {pid}, port {svc.port})" if pid and healthy
                        else f"unhealthy (pid {pid})" if pid else "down")
    if config.local.slurm or _slurm_running(config):
        from vigil_gpu_monitor.vigil.ops.slurmstack import slurm_services
        down_ = [n for n, svc in slurm_services(config).items() if svc.pid() is None]
        report["slurm"] = f"down ({', '.join(down_)})" if down_ else \
            f"up (slurmctld port {config.local.slurmctld_port})"
    return report
