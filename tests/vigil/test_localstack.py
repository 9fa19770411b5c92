"""The local stack's bookkeeping and its error messages (no services started here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vigil_gpu_monitor.contracts.config import load
from vigil_gpu_monitor.vigil.ops import localstack


def test_missing_tool_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(localstack.StackError, match="apt-get install maven"):
        localstack._require("mvn", "install Maven (apt-get install maven) to fetch Kafka's jars")


def test_external_services_are_not_managed() -> None:
    cfg = load(env={"VIGIL_KAFKA_BOOTSTRAP": "k:9092", "VIGIL_REDIS_URL": "redis://r:1/0"})
    assert localstack.services(cfg) == {}
    assert localstack.health(cfg) == {"kafka": "external", "redis": "external"}


def test_stale_pid_file_reads_as_down(tmp_path: Path) -> None:
    cfg = load(env={"VIGIL_LOCAL_DATA_DIR": str(tmp_path), "VIGIL_LOCAL_KAFKA_PORT": "1",
                    "VIGIL_LOCAL_REDIS_PORT": "2"})
    svc = localstack.services(cfg)["redis"]
    svc.pidfile.write_text("999999999")
    assert svc.pid() is None
    assert localstack.health(cfg)["redis"] == "down"
    assert svc.stop() is False and not svc.pidfile.exists()


def test_down_only_stops_the_named_services(tmp_path: Path) -> None:
    """The demo stops only what it started: a Redis that was already up keeps running."""
    cfg = load(env={"VIGIL_LOCAL_DATA_DIR": str(tmp_path), "VIGIL_LOCAL_KAFKA_PORT": "1",
                    "VIGIL_LOCAL_REDIS_PORT": "2"})
    svcs = localstack.services(cfg)
    pids = {name: svc.spawn(["sleep", "60"]) for name, svc in svcs.items()}
    try:
        localstack.down(cfg, only=["kafka"])
        assert svcs["kafka"].pid() is None
        assert svcs["redis"].pid() == pids["redis"]
    finally:
        localstack.down(cfg)
    assert svcs["redis"].pid() is None


def test_a_plain_down_stops_the_slurm_that_up_started(tmp_path: Path) -> None:
    """`VIGIL_LOCAL_SLURM=true vigil up`, then `vigil down` without it: Slurm is found by
    its pid files and stopped (here stand-in processes under the Slurm services' names)."""
    from vigil_gpu_monitor.vigil.ops.slurmstack import slurm_services

    env = {"VIGIL_LOCAL_DATA_DIR": str(tmp_path), "VIGIL_LOCAL_SLURM_NODES": "gpu-01"}
    started = load(env={**env, "VIGIL_LOCAL_SLURM": "true"})
    services = slurm_services(started)
    for svc in services.values():
        svc.root.mkdir(parents=True, exist_ok=True)
        svc.spawn(["sleep", "60"])
    pids = {name: svc.pid() for name, svc in services.items()}
    assert all(pids.values()) and set(pids) == {"munged", "slurmctld", "slurmd-gpu-01"}
    plain = load(env={**env, "VIGIL_KAFKA_BOOTSTRAP": "k:9092", "VIGIL_REDIS_URL": "redis://r:1/0"})
    assert localstack.health(plain)["slurm"].startswith("up")
    localstack.down(plain)
    assert all(svc.pid() is None for svc in slurm_services(plain).values())
    assert "slurm" not in localstack.health(plain)


def test_the_acl_broker_authorizes_every_request_with_the_admin_as_super_user(
        tmp_path: Path) -> None:
    from vigil_gpu_monitor.contracts.errors import ConfigError
    from vigil_gpu_monitor.vigil.ops.localstack import Service, _kafka_properties

    env = {"VIGIL_LOCAL_DATA_DIR": str(tmp_path), "VIGIL_LOCAL_KAFKA_SASL": "true",
           "VIGIL_LOCAL_KAFKA_ACLS": "true", "VIGIL_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
           "VIGIL_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "VIGIL_KAFKA_SASL_USERNAME": "boss",
           "VIGIL_KAFKA_SASL_PASSWORD": "pw"}
    cfg = load(env=env)
    svc = Service("kafka", 1, tmp_path)
    svc.datadir.mkdir(parents=True)
    props = _kafka_properties(cfg, svc).read_text()
    assert "StandardAuthorizer" in props and "super.users=User:boss;User:ANONYMOUS" in props
    with pytest.raises(ConfigError, match="needs local.kafka_sasl"):
        load(env={"VIGIL_LOCAL_KAFKA_ACLS": "true"})
