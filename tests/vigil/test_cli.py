"""The command line: simulate → replay offline, and configuration output."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import jsonschema
import pytest

from vigil_gpu_monitor.contracts import schema_gen
from vigil_gpu_monitor.vigil import cli
from vigil_gpu_monitor.vigil.cli import main


def test_simulate_then_replay_prints_valid_detections(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    labels = tmp_path / "labels.json"
    assert main(["simulate", "--out", str(trace), "--duration", "150", "--start", "1000",
                 "--labels", str(labels)]) == 0
    capsys.readouterr()
    assert main(["replay", str(trace)]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert lines, "replay printed no detection"
    schema = schema_gen.detection_schema()
    for det in lines:
        jsonschema.validate(det, schema)
    fault = json.loads(labels.read_text())[0]
    assert {(d["node"], d["gpu"]) for d in lines} == {(fault["node"], fault["gpu"])}


def test_replay_is_deterministic_and_skips_bad_lines(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    main(["simulate", "--out", str(trace), "--duration", "120", "--start", "5000"])
    with trace.open("a") as fh:
        fh.write('{"schema": "vigil.sample/1", "broken"\n')
    outs = []
    for i in range(2):
        out = tmp_path / f"d{i}.jsonl"
        assert main(["replay", str(trace), "--out", str(out)]) == 0
        outs.append(out.read_text())
    assert outs[0] == outs[1] and outs[0]


def test_config_masks_secrets(capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VIGIL_KAFKA_SASL_PASSWORD", "topsecret")
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    assert "topsecret" not in out and "sasl_password = '***'" in out


def test_bad_config_is_a_clear_error(capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VIGIL_DETECT_FIRE_AFTER", "soon")
    assert main(["config"]) == 2
    assert "detect.fire_after" in capsys.readouterr().err


@pytest.mark.parametrize(("command", "client_info"), [
    ("report", False), ("alerts", False), ("replay", False), ("top", False),
    ("agent", True), ("worker", True), ("alerter", True)])
def test_terminal_commands_hide_client_libraries_info_logs(command: str,
                                                          client_info: bool) -> None:
    root = logging.getLogger()
    saved = root.level, list(root.handlers), logging.getLogger("vigil").level
    try:
        cli.configure_logging(command, verbose=False)
        assert logging.getLogger("kafka.conn").isEnabledFor(logging.INFO) is client_info
        assert logging.getLogger("aiokafka").isEnabledFor(logging.INFO) is client_info
        own = logging.getLogger("vigil_gpu_monitor.vigil.views.report")
        assert own.isEnabledFor(logging.INFO)  # our own stay
        cli.configure_logging(command, verbose=True)
        assert logging.getLogger("kafka.conn").isEnabledFor(logging.DEBUG)
        assert logging.getLogger("vigil_gpu_monitor.vigil.views.report").isEnabledFor(logging.DEBUG)
    finally:
        root.setLevel(saved[0])
        root.handlers[:] = saved[1]
        logging.getLogger("vigil").setLevel(saved[2])
        for own in cli.OWN_PACKAGES:
            logging.getLogger(own).setLevel(logging.NOTSET)


def test_a_missing_extra_is_a_clear_error(capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    def needs_redis(cfg: object, args: object) -> int:
        raise ModuleNotFoundError("No module named 'redis'", name="redis")

    from vigil_gpu_monitor.vigil import commands
    monkeypatch.setattr(commands, "alerts", needs_redis)
    assert cli.main(["alerts"]) == 2
    assert "pip install 'vigil-gpu-monitor[alerter]'" in capsys.readouterr().err


def test_simulate_paces_kafka_samples_in_event_time() -> None:
    from vigil_gpu_monitor.vigil.commands import paced

    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    samples = [{"ts": 100.0 + t, "node": n} for t in (0, 0, 1, 1, 5) for n in ("a",)]
    handed = [(s["ts"], now[0]) for s in paced(samples, 100.0, lambda: now[0], sleep)]  # type: ignore[arg-type]
    assert handed == [(100.0, 0.0), (100.0, 0.0), (101.0, 1.0), (101.0, 1.0), (105.0, 5.0)]
    assert slept == [1.0, 4.0]


def test_config_hides_only_the_password_of_the_redis_url(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VIGIL_REDIS_URL", "rediss://vigil:s3cret@redis.example:6380/2?ssl=1")
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    assert "url = 'rediss://vigil:***@redis.example:6380/2?ssl=1'" in out and "s3cret" not in out
