"""Replicated topics on a real three-broker KRaft cluster: every topic Vigil and its
Faust worker create has three replicas and min.insync.replicas 2, and when one broker
is stopped mid-run no sample is lost. An existing under-replicated topic is refused."""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaConsumer
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient
from kafka.errors import KafkaError

from tests.integration.kafka_helpers import log_excerpt, start_worker
from tests.integration.ports import free_port
from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.codec import decode_detection, decode_sample
from vigil_gpu_monitor.contracts.config import Config, load
from vigil_gpu_monitor.contracts.errors import ConfigError
from vigil_gpu_monitor.producers.publisher import BufferedPublisher
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator
from vigil_gpu_monitor.vigil.ops import localstack
from vigil_gpu_monitor.vigil.ops.kafka_admin import ensure_topics

pytestmark = pytest.mark.integration
START = 1_896_000_000.0


@pytest.fixture(scope="module")
def three_brokers(tmp_path_factory: pytest.TempPathFactory,
                  ) -> Iterator[tuple[str, list[localstack.Service]]]:
    """(bootstrap list, brokers) of a fresh three-broker cluster. A port found free can
    be taken by a client's outgoing connection before the broker binds it: one more
    try with other ports then."""
    for attempt in (1, 2):
        root = tmp_path_factory.mktemp("cluster")
        brokers: list[localstack.Service] = []
        try:
            bootstrap = _start_cluster(root, brokers)
        except localstack.StackError:
            for svc in brokers:
                svc.stop()
            if attempt == 2:
                raise
            continue
        try:
            yield bootstrap, brokers
        finally:
            for svc in brokers:  # a cluster thrown away: no controlled shutdown to wait
                svc.stop(timeout=3)  # for (it took 33 s, brokers waiting on each other)
        return


def _start_cluster(root: Path, brokers: list[localstack.Service]) -> str:
    """Start three combined broker-controllers (appended to ``brokers`` as they start);
    the bootstrap list once every one is registered."""
    ports: list[int] = []
    while len(ports) < 6:  # six distinct ports
        port = free_port()
        if port not in ports:
            ports.append(port)
    pairs = list(zip(ports[::2], ports[1::2], strict=True))
    waiters = []
    for quorum, (port, controller) in zip(localstack.Quorum.of([c for _, c in pairs]), pairs,
                                          strict=True):
        cfg = load(env={"VIGIL_LOCAL_DATA_DIR": str(root / f"b{quorum.node_id}"),
                        "VIGIL_LOCAL_KAFKA_PORT": str(port),
                        "VIGIL_LOCAL_CONTROLLER_PORT": str(controller),
                        "VIGIL_LOCAL_KAFKA_HEAP_MB": "384"})
        svc = localstack.services(cfg)["kafka"]
        svc.root.mkdir(parents=True, exist_ok=True)
        brokers.append(svc)
        waiters.append(localstack.start_kafka(cfg, svc, quorum=quorum, wait=False))
    for waiter in waiters:
        waiter()
    bootstrap = ",".join(f"127.0.0.1:{port}" for port, _ in pairs)
    _until_registered(bootstrap, len(brokers))
    return bootstrap


def _until_registered(bootstrap: str, count: int) -> None:
    """Until the cluster's metadata lists every broker (each registers a moment after
    it logs that it started)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        for _ in range(100):
            if len(admin.describe_cluster()["brokers"]) == count:
                return
            time.sleep(0.2)
    finally:
        admin.close()
    raise AssertionError(f"the cluster did not register {count} brokers")


def _env(isolated_env: dict[str, str], bootstrap: str) -> dict[str, str]:
    return dict(isolated_env, VIGIL_KAFKA_BOOTSTRAP=bootstrap)


def _replicas_and_isr(cfg: Config, name: str) -> tuple[set[int], str]:
    """Replica counts of the topic's partitions and its min.insync.replicas, once every
    broker knows the topic (metadata reaches brokers a moment after creation)."""
    admin = KafkaAdminClient(bootstrap_servers=cfg.kafka_bootstrap)
    try:
        for _ in range(50):
            try:
                [topic] = admin.describe_topics([name])
                if not topic["partitions"]:  # the broker asked knows the name, not yet
                    time.sleep(0.2)          # its partitions (seen under load)
                    continue
                found = admin.describe_configs(
                    [ConfigResource(ConfigResourceType.TOPIC, name,
                                    configs=["min.insync.replicas"])], config_filter="all")
                value = found["topic"][name]["min.insync.replicas"]["value"]
                return {len(p["replica_nodes"]) for p in topic["partitions"]}, value
            except (KafkaError, KeyError):
                time.sleep(0.2)
        raise AssertionError(f"{name} could not be described")
    finally:
        admin.close()


def _worker_topics(cfg: Config) -> list[str]:
    admin = KafkaAdminClient(bootstrap_servers=cfg.kafka_bootstrap)
    try:
        return [t for t in admin.list_topics() if t.startswith(cfg.worker.app_id)]
    finally:
        admin.close()


def _wait_for_worker_topics(cfg: Config, worker: subprocess.Popen[bytes]) -> None:
    """Until the worker has declared its changelog and leader topics (its start-up)."""
    for _ in range(300):
        found = _worker_topics(cfg)
        if any("changelog" in t for t in found) and any("leader" in t for t in found):
            return
        assert worker.poll() is None, "the worker exited during start-up"
        time.sleep(0.3)
    raise AssertionError("the worker did not declare its topics")


def test_nothing_is_lost_when_a_broker_stops_mid_run(
        three_brokers: tuple[str, list[localstack.Service]], isolated_env: dict[str, str],
        tmp_path: Path) -> None:
    bootstrap, brokers = three_brokers
    env = _env(isolated_env, bootstrap)
    cfg = load(env=env)
    rep = ensure_topics(cfg)  # kafka.replication_factor 0: the brokers' default, 3
    assert (rep.factor, rep.min_insync) == (3, 2)
    samples_topic = topics.topic(topics.SAMPLES, cfg.kafka.topic_prefix)
    assert _replicas_and_isr(cfg, samples_topic) == ({3}, "2")

    job = JobSpec("replicated", [f"r{i}" for i in range(4)])
    cluster = Cluster([job], [Fault("slow_gpu", job.name, "r2", "6", START + 40)])
    samples = list(Simulator(cluster, START, seed=9).samples(150))
    worker = start_worker(env, str(tmp_path / "worker.log"))
    publisher = BufferedPublisher(cfg.kafka_bootstrap, samples_topic, **cfg.kafka_client)
    try:
        half = len(samples) // 2
        for sample in samples[:half]:
            publisher.publish(sample)
        assert publisher.flush(timeout=60)
        _wait_for_worker_topics(cfg, worker)  # created while three brokers run
        brokers[2].stop()  # one broker of three gone, mid-run
        for sample in samples[half:]:
            publisher.publish(sample)
        assert publisher.close(timeout=120) and publisher.dropped == 0, publisher.errors

        consumer = KafkaConsumer(samples_topic, bootstrap_servers=cfg.kafka_bootstrap,
                                 auto_offset_reset="earliest", consumer_timeout_ms=5000,
                                 group_id=f"check-{uuid.uuid4().hex[:6]}")
        read = [decode_sample(r.value) for r in consumer]
        consumer.close()
        assert len(read) == len(samples)  # every sample survived the broker's loss
        assert {(s["node"], s["ts"]) for s in read} == {(s["node"], s["ts"]) for s in samples}

        detections = KafkaConsumer(topics.topic(topics.DETECTIONS, cfg.kafka.topic_prefix),
                                   bootstrap_servers=cfg.kafka_bootstrap,
                                   auto_offset_reset="earliest", consumer_timeout_ms=1000)
        found: list[dict[str, object]] = []
        for _ in range(120):
            found.extend(decode_detection(r.value) for r in detections)
            if found or worker.poll() is not None:
                break
        detections.close()
        assert [(d["node"], d["gpu"]) for d in found if d["state"] == "firing"] == [
            ("r2", "6")], log_excerpt(tmp_path / "worker.log")
        changelogs = [t for t in _worker_topics(cfg) if "changelog" in t]
        assert changelogs and all(_replicas_and_isr(cfg, t)[0] == {3} for t in changelogs)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)


def test_an_under_replicated_existing_topic_is_refused(
        three_brokers: tuple[str, list[localstack.Service]], isolated_env: dict[str, str],
        ) -> None:
    bootstrap, _ = three_brokers
    cfg = load(env=_env(isolated_env, bootstrap))
    name = topics.topic(topics.DETECTIONS, cfg.kafka.topic_prefix)
    admin = KafkaAdminClient(bootstrap_servers=cfg.kafka_bootstrap)
    admin.create_topics({name: {"num_partitions": 1, "replication_factor": 1}})  # as before
    admin.close()
    with pytest.raises(ConfigError, match=rf"{name} \(1\)"):
        ensure_topics(cfg)
