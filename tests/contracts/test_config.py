"""Config loading: TOML file, VIGIL_* overrides, type errors, secrets masked."""

from __future__ import annotations

from pathlib import Path

import pytest

from vigil_gpu_monitor.contracts.config import ConfigError, Secret, describe, load, mask_url


def test_defaults_point_at_the_local_stack() -> None:
    cfg = load(env={})
    assert cfg.kafka_bootstrap == "127.0.0.1:19092"
    assert cfg.redis_url == "redis://127.0.0.1:16379/0"
    assert cfg.manages_kafka and cfg.manages_redis


def test_file_then_environment_wins(tmp_path: Path) -> None:
    path = tmp_path / "vigil.toml"
    path.write_text('[kafka]\nbootstrap = "k1:9092"\n[detect]\n'
                    'straggler_false_alarms_per_1000_days = 5.5\n')
    cfg = load(path, env={"VIGIL_KAFKA_BOOTSTRAP": "k2:9092", "VIGIL_DETECT_FIRE_AFTER": "3"})
    assert cfg.kafka_bootstrap == "k2:9092"
    assert cfg.detect.straggler_false_alarms_per_1000_days == 5.5
    assert cfg.detect.fire_after == 3
    assert not cfg.manages_kafka and cfg.manages_redis


def test_config_path_from_environment(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[worker]\napp_id = "w7"\n')
    assert load(env={"VIGIL_CONFIG": str(path)}).worker.app_id == "w7"


@pytest.mark.parametrize(("text", "env", "match"), [
    ("[nope]\na = 1\n", {}, "unknown section"),
    ("[kafka]\nbogus = 1\n", {}, "unknown setting"),
    ("[detect]\nfire_after = 'many'\n", {}, "cannot read"),
    ("[kafka\n", {}, "config file"),
    ("", {"VIGIL_NOSUCH_X": "1"}, "names no config section"),
    ("", {"VIGIL_LOCAL_KAFKA_PORT": "high"}, "cannot read"),
    ("", {"VIGIL_KAFKA_SECURITY_PROTOCOL": "KERBEROS"}, "one of PLAINTEXT, SSL"),
    ("", {"VIGIL_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}, "sasl_mechanism ''"),
    ("", {"VIGIL_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
          "VIGIL_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512"}, "sasl_username and"),
    ("", {"VIGIL_KAFKA_SECURITY_PROTOCOL": "SSL", "VIGIL_KAFKA_SSL_CAFILE": "/nope/ca.pem"},
     "is not a file"),
    ("[agent]\nmax_interval = 64.0\n", {}, "detect.held_seconds 35 must exceed"),
    ("", {"VIGIL_WORKER_FETCH_BYTES_PER_PARTITION": "65536"}, "under the largest sample"),
])
def test_errors_say_what_is_wrong(tmp_path: Path, text: str, env: dict[str, str],
                                  match: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load(path, env=env)


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load(tmp_path / "absent.toml", env={})


def test_secrets_never_print() -> None:
    cfg = load(env={"VIGIL_KAFKA_SASL_PASSWORD": "hunter2",
                    "VIGIL_REDIS_URL": "redis://alice:s3cret@r:6379/0"})
    text = describe(cfg) + repr(cfg) + str(cfg)
    assert "hunter2" not in text and "s3cret" not in text
    assert "redis://alice:***@r:6379/0" in describe(cfg)
    assert cfg.redis_url == "redis://alice:s3cret@r:6379/0"
    assert isinstance(cfg.kafka.sasl_password, Secret)
    assert cfg.kafka.sasl_password.reveal() == "hunter2"
    assert mask_url("redis://r:6379") == "redis://r:6379"
    assert mask_url("https://hooks.slack.com/services/T0/B0/tok") == "https://hooks.slack.com/***"
    assert mask_url("https://x/hook?token=abc") == "https://x/***?***"


def test_kafka_client_settings_for_every_protocol(tmp_path: Path) -> None:
    assert load(env={}).kafka_client == {}
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    cfg = load(env={"VIGIL_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                    "VIGIL_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
                    "VIGIL_KAFKA_SASL_USERNAME": "vigil", "VIGIL_KAFKA_SASL_PASSWORD": "s3cret",
                    "VIGIL_KAFKA_SSL_CAFILE": str(ca)})
    assert cfg.kafka_client == {"security_protocol": "SASL_SSL",
                                "sasl_mechanism": "SCRAM-SHA-512",
                                "sasl_plain_username": "vigil", "sasl_plain_password": "s3cret",
                                "ssl_cafile": str(ca)}
    assert "s3cret" not in repr(cfg) and "s3cret" not in describe(cfg)
