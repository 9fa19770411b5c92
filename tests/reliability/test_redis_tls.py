"""Redis with AUTH and TLS (issue #49): Debian's redis-server is built with TLS. A
server that listens only with TLS and requires a password refuses a client without
the password, without TLS, or trusting another CA; the alerter, given a ``rediss://``
URL with the password and the CA (docs/security.md), keeps its state there."""

from __future__ import annotations

import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from kafka import KafkaProducer

from tests.integration.ports import free_port
from vigil_gpu_monitor.alerting.state import LiveState
from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.codec import encode_detection
from vigil_gpu_monitor.contracts.config import load
from vigil_gpu_monitor.vigil.ops.kafka_admin import ensure_topics
from vigil_gpu_monitor.vigil.ops.localstack import debian_binary, tls_files

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    """(TLS URL with the password and CA, password, another CA) of a redis-server
    that listens with TLS only and requires a password."""
    root = tmp_path_factory.mktemp("redis-tls")
    files, other = tls_files(root / "tls"), tls_files(root / "other")
    port, password = free_port(), secrets.token_urlsafe(16)
    server = subprocess.Popen(
        [debian_binary("redis-server", "redis-server"), "--port", "0", "--tls-port", str(port),
         "--bind", "127.0.0.1", "--tls-cert-file", str(root / "tls" / "broker.pem"),
         "--tls-key-file", str(root / "tls" / "broker.key"),
         "--tls-ca-cert-file", str(files.ca), "--tls-auth-clients", "no",
         "--requirepass", password, "--save", "", "--appendonly", "no", "--dir", str(root)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"rediss://:{password}@127.0.0.1:{port}/0?ssl_ca_certs={files.ca}"
    deadline = time.monotonic() + 20
    while True:
        try:
            redis.Redis.from_url(url).ping()
            break
        except redis.ConnectionError:
            assert time.monotonic() < deadline and server.poll() is None, "redis did not start"
            time.sleep(0.2)
    try:
        yield url, password, other.ca
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_no_password_no_tls_or_another_ca_is_refused(tls_redis: tuple[str, str, Path]) -> None:
    url, password, other_ca = tls_redis
    port = url.split("@127.0.0.1:")[1].split("/")[0]
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(url.replace(f":{password}@", "@")).get("x")
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(f"redis://:{password}@127.0.0.1:{port}/0",
                             socket_timeout=3).ping()
    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
        redis.Redis.from_url(url.split("?")[0] + f"?ssl_ca_certs={other_ca}").ping()


def test_the_alerter_keeps_its_state_over_tls_with_auth(tls_redis: tuple[str, str, Path],
                                                        isolated_env: dict[str, str]) -> None:
    url, password, _ = tls_redis
    env = dict(isolated_env, VIGIL_REDIS_URL=url)
    cfg = load(env=env)
    ensure_topics(cfg)
    now = time.time()
    det = {"schema": "vigil.detection/1", "id": "tls-1", "kind": "gpu_health",
           "state": "firing", "severity": "warning", "job": "tls-job", "node": "gpu-09",
           "gpu": "1", "started_at": now, "detected_at": now, "metrics": ["xid"],
           "score": 5.0, "summary": "XID 31 on gpu-09 GPU 1", "evidence": {}}
    producer = KafkaProducer(bootstrap_servers=cfg.kafka_bootstrap, acks="all")
    producer.send(topics.topic(topics.DETECTIONS, cfg.kafka.topic_prefix), key=b"tls-job",
                  value=encode_detection(det))  # type: ignore[arg-type]
    producer.flush()
    producer.close()
    done = subprocess.run([sys.executable, "-m", "vigil_gpu_monitor", "alerter",
                           "--max-seconds", "10"],
                          env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-2000:]
    assert password not in done.stdout + done.stderr
    state = LiveState(redis.Redis.from_url(url), cfg.redis.key_prefix)
    assert [(d["id"], d["node"]) for d in state.open_incidents()] == [("tls-1", "gpu-09")]
