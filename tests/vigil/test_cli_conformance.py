"""Command-line conformance: every subcommand, against every failure class a user meets
(a service down, a file missing, unreadable, a directory, binary, compressed wrongly or
empty, a setting out of range, a driver absent), ends with a non-zero status and exactly
one line on stderr that names the problem, never a traceback.

The matrix runs in-process through ``main(argv)`` (one import, milliseconds a case); a
few cases run as real processes too, to hold the exit status and stderr a shell sees.
Services are "down" by pointing at a loopback port nobody listens on. Refusals that need
a real Redis (unknown incident, silence, node) are in tests/integration/test_cli_acting.py.
"""

from __future__ import annotations

import argparse
import gzip
import logging
import lzma
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from vigil_gpu_monitor.vigil import cli
from vigil_gpu_monitor.vigil.cli import build_parser, main

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ [\w.]+: ")
TRACE = "t.jsonl"  # a valid trace, made once per module in the working directory


def _closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Files of every kind a user might hand over, beside one valid trace."""
    root = tmp_path_factory.mktemp("conformance")
    saved = os.getcwd()
    os.chdir(root)
    try:
        assert main(["simulate", "--out", TRACE, "--duration", "20", "--start", "1000",
                     "--jobs", "1", "--nodes", "2"]) == 0
    finally:
        os.chdir(saved)
    (root / "dir.jsonl").mkdir()
    (root / "binary.jsonl").write_bytes(bytes(range(256)) * 64)
    (root / "empty.jsonl").write_bytes(b"")
    (root / "garbage.jsonl").write_text('{"schema": "vigil.sample/1"}\nnot json\n')
    whole = gzip.compress((root / TRACE).read_bytes())
    (root / "cut.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    (root / "other.gz").write_bytes(gzip.compress(b"hello, not a trace\n"))
    (root / "unreadable.jsonl").write_bytes((root / TRACE).read_bytes())
    (root / "unreadable.jsonl").chmod(0)
    return root


@pytest.fixture
def in_workdir(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Run in the files' folder with a clean VIGIL_* environment; the root logger (which
    ``main`` reconfigures) is restored afterwards."""
    monkeypatch.chdir(workdir)
    for name in list(os.environ):
        if name.startswith("VIGIL_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("VIGIL_LOCAL_DATA_DIR", str(workdir / "stack"))
    monkeypatch.setenv("VIGIL_AGENT_METRICS_PORT", "0")
    monkeypatch.setenv("VIGIL_AGENT_ATTRIBUTION", "static")
    monkeypatch.setenv("VIGIL_AGENT_JOB", "j")
    root = logging.getLogger()
    saved = root.level, list(root.handlers)
    yield workdir
    root.setLevel(saved[0])
    root.handlers[:] = saved[1]
    for own in cli.OWN_PACKAGES:
        logging.getLogger(own).setLevel(logging.NOTSET)


def assert_one_line_failure(code: int, err: str, names: str) -> None:
    """Non-zero, no traceback, and one line besides a daemon's timestamped log records,
    naming the problem (``names``, case-insensitive)."""
    assert code != 0, err
    assert "Traceback" not in err, err
    told = [line for line in err.splitlines() if not LOG_LINE.match(line)]
    assert len(told) == 1, err
    assert told[0].startswith("vigil: error: ") and "(fix: " in told[0], told
    assert names.lower() in told[0].lower(), told


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


# One ordinary invocation per subcommand: each must reach its handler (or fail in it).
EVERY = {
    "up": ["up"], "down": ["down"], "status": ["status"], "config": ["config"],
    "simulate": ["simulate", "--duration", "5"], "replay": ["replay", TRACE],
    "report": ["report", "j"], "worker": ["worker"],
    "agent": ["agent", "--out", "-", "--ticks", "1", "--fast"],
    "select-metrics": ["select-metrics", TRACE],
    "bench": ["bench", "detect", "--sizes", "2", "--seeds", "1"],
    "alerter": ["alerter", "--max-seconds", "1"], "alerts": ["alerts"],
    "top": ["top", "--once"], "silence": ["silence", "list"], "actions": ["actions"],
    "nodes": ["nodes"], "repair": ["repair", "done", "gpu-01"], "ack": ["ack", "x"],
    "goodput": ["goodput"],
}


def test_the_matrix_names_every_subcommand() -> None:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(EVERY) == set(sub.choices)


BAD_SETTINGS = [
    ("VIGIL_DETECT_BIN_SECONDS", "0", "detect.bin_seconds"),
    ("VIGIL_DETECT_HANG_SECONDS", "nan", "detect.hang_seconds"),
    ("VIGIL_DETECT_HANG_SECONDS", "-5", "detect.hang_seconds"),
    ("VIGIL_DETECT_WINDOW_SECONDS", "-60", "detect.window_seconds"),
    ("VIGIL_DETECT_STRAGGLER_FALSE_ALARMS_PER_1000_DAYS", "-1", "straggler_false_alarms"),
    ("VIGIL_ALERTER_MAX_JOB_SHARE", "1.5", "alerter.max_job_share"),
    ("VIGIL_AGENT_METRICS_PORT", "70000", "agent.metrics_port"),
    ("VIGIL_REDIS_URL", "notaurl", "redis.url"),
    ("VIGIL_KAFKA_BOOTSTRAP", "kafka-1", "kafka.bootstrap"),
    ("VIGIL_ALERTER_ALERTMANAGER_URL", "alertmanager:9093", "alerter.alertmanager_url"),
    ("VIGIL_DETECT_FIRE_AFTER", "soon", "detect.fire_after"),
]


@pytest.mark.parametrize(("name", "value", "names"), BAD_SETTINGS)
def test_every_subcommand_refuses_a_setting_out_of_range(
        name: str, value: str, names: str, in_workdir: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(name, value)
    for command, argv in EVERY.items():
        code, err = run(argv, capsys)
        assert_one_line_failure(code, err, names)
        assert command  # the failing command shows in pytest's locals


def test_a_config_file_that_is_missing_a_directory_or_binary(
        in_workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for path in ("missing.toml", "dir.jsonl", "binary.jsonl"):
        code, err = run(["--config", path, "alerts"], capsys)
        assert_one_line_failure(code, err, path)


REDIS_COMMANDS = [["alerts"], ["top", "--once"], ["nodes"], ["actions"], ["silence", "list"],
                  ["silence", "add", "--match", "kind=straggler", "--for", "2h"],
                  ["silence", "expire", "abc"], ["ack", "x"], ["repair", "done", "gpu-01"]]


@pytest.mark.parametrize("argv", REDIS_COMMANDS, ids=" ".join)
def test_redis_down_is_said_not_shown_as_empty(argv: list[str], in_workdir: Path,
                                               monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("VIGIL_REDIS_URL", f"redis://127.0.0.1:{_closed_port()}/0")
    code, err = run(argv, capsys)
    assert_one_line_failure(code, err, "Redis at 127.0.0.1")
    assert capsys.readouterr().out == ""  # no "no active silences" and the like


KAFKA_COMMANDS = [["simulate", "--duration", "5"], ["report", "j"], ["worker"],
                  ["alerter", "--max-seconds", "1"]]


@pytest.mark.parametrize("argv", KAFKA_COMMANDS, ids=" ".join)
def test_kafka_down_is_said_at_once(argv: list[str], in_workdir: Path,
                                    monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("VIGIL_KAFKA_BOOTSTRAP", f"127.0.0.1:{_closed_port()}")
    code, err = run(argv, capsys)
    assert_one_line_failure(code, err, "not reachable")


def test_a_local_port_taken_is_said(in_workdir: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setenv("VIGIL_LOCAL_REDIS_PORT", str(taken.getsockname()[1]))
        monkeypatch.setenv("VIGIL_KAFKA_BOOTSTRAP", "127.0.0.1:9")  # external: not started
        code, err = run(["up"], capsys)
    assert_one_line_failure(code, err, "is taken")


BAD_FILES = [("missing.jsonl", "no such file"), ("dir.jsonl", "is a directory"),
             ("binary.jsonl", "binary data"), ("empty.jsonl", "it is empty"),
             ("garbage.jsonl", "no valid vigil.sample/1 line"),
             ("cut.jsonl.gz", "corrupt or cut short"),
             ("other.gz", "no valid vigil.sample/1 line"),
             ("unreadable.jsonl", "permission denied")]
FILE_COMMANDS = [["replay", "{}"], ["report", "j", "--trace", "{}"], ["select-metrics", "{}"],
                 ["agent", "--sources", "trace", "--trace", "{}", "--out", "-", "--ticks", "1"]]


@pytest.mark.parametrize(("path", "names"), BAD_FILES)
def test_a_bad_file_is_one_line(path: str, names: str, in_workdir: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    if path == "unreadable.jsonl" and os.geteuid() == 0:
        pytest.skip("root reads a file of mode 000")
    for argv in FILE_COMMANDS:
        code, err = run([a.format(path) for a in argv], capsys)
        if argv[0] == "agent":  # the trace source fails inside the agent's first tick
            assert_one_line_failure(code, err, "read no GPU on the first tick")
        else:
            assert_one_line_failure(code, err, names)
            assert path in err


def test_a_report_that_cannot_be_written_is_one_line(in_workdir: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(["report", "job-000", "--trace", TRACE, "--out", "/nonexistent/dir/r.html"],
                    capsys)
    assert_one_line_failure(code, err, "/nonexistent/dir/r.html")


def test_compressed_traces_are_read_by_their_magic_bytes(in_workdir: Path,
                                                         capsys: pytest.CaptureFixture[str],
                                                         ) -> None:
    zstandard = pytest.importorskip("zstandard")
    plain = (in_workdir / TRACE).read_bytes()
    (in_workdir / "packed.bin").write_bytes(gzip.compress(plain))  # no telling name
    (in_workdir / "packed.zst").write_bytes(zstandard.ZstdCompressor().compress(plain))
    (in_workdir / "packed.data").write_bytes(lzma.compress(plain))  # xz, no telling name
    outs = []
    for path in (TRACE, "packed.bin", "packed.zst", "packed.data"):
        assert main(["replay", path]) == 0
        captured = capsys.readouterr()
        assert "1 jobs" in captured.err, captured.err
        outs.append(captured.out)
    assert outs[0] == outs[1] == outs[2] == outs[3]


def test_skipped_lines_are_summarised_once(in_workdir: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    lines = (in_workdir / TRACE).read_text().splitlines(keepends=True)
    (in_workdir / "holes.jsonl").write_text("".join(
        "garbage\n" + line if i % 10 == 0 else line for i, line in enumerate(lines)))
    assert main(["replay", "holes.jsonl"]) == 0
    err = capsys.readouterr().err
    warnings = [x for x in err.splitlines() if "invalid lines skipped" in x]
    assert len(warnings) == 1 and f"{(len(lines) + 9) // 10} invalid lines" in warnings[0]
    assert warnings[0].count("invalid_json") == 3  # the first few, not all


def test_an_absent_driver_or_dead_exporter_is_one_line(in_workdir: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("VIGIL_AGENT_DCGM_URL", f"http://127.0.0.1:{_closed_port()}/metrics")
    code, err = run(["agent", "--sources", "dcgm", "--out", "-", "--ticks", "3"], capsys)
    assert_one_line_failure(code, err, "dcgm: unreachable")
    assert capsys.readouterr().out == ""  # no empty node published as a healthy one
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        code, err = run(["agent", "--sources", "nvml", "--out", "-", "--ticks", "1"], capsys)
        assert_one_line_failure(code, err, "NVML")
    else:
        pynvml.nvmlShutdown()  # a machine with a driver: nothing absent to test


@pytest.mark.parametrize("argv", [
    ["silence", "add", "--match", "kidn=straggler", "--for", "2h"],
    ["silence", "add", "--match", "kind=stragler", "--for", "2h"],
    ["silence", "add", "--match", "severity=urgent"],
    ["silence", "add", "--match", "kind"],
    ["silence", "add", "--match", "kind=straggler", "--for", "soon"],
    ["silence", "add", "--match", "kind=straggler", "--for=-2h"],
    ["silence", "add"],
    ["silence", "expire"],
], ids=" ".join)
def test_silences_no_detection_could_match_are_refused(argv: list[str], in_workdir: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # refused before Redis is asked: a closed port proves nothing was sent
    monkeypatch.setenv("VIGIL_REDIS_URL", f"redis://127.0.0.1:{_closed_port()}/0")
    code, err = run(argv, capsys)
    assert_one_line_failure(code, err, "silence" if len(argv) == 2 else "")
    assert "Redis" not in err


def test_a_bug_is_one_line_and_its_traceback_needs_debug(in_workdir: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str],
                                                         ) -> None:
    from vigil_gpu_monitor.vigil import commands

    def broken(cfg: object, args: object) -> int:
        raise KeyError("boom")

    monkeypatch.setattr(commands, "replay", broken)
    code, err = run(["replay", TRACE], capsys)
    assert code == 70 and "Traceback" not in err and len(err.splitlines()) == 1
    assert "bug in Vigil" in err and "--debug" in err
    code, err = run(["--debug", "replay", TRACE], capsys)
    assert code == 70 and "Traceback" in err and "KeyError: 'boom'" in err


def test_version_and_help_with_a_default_for_every_option(capsys: pytest.CaptureFixture[str],
                                                          ) -> None:
    from vigil_gpu_monitor.vigil import __version__

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"vigil {__version__}"
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in [("vigil", parser), *sub.choices.items()]:
        for action in command._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            assert action.help, f"{name} {action.dest} has no help"
        text = " ".join(command.format_help().split())
        for action in command._actions:
            if action.help is not argparse.SUPPRESS and action.default not in (
                    None, False, argparse.SUPPRESS) and action.option_strings:
                assert (f"(default: {action.default})" in text
                        or "default" in str(action.help)), (name, action.dest)


# The same failures as a shell sees them: exit status 2, one line, no traceback.
PROCESSES = [
    (["replay", "missing.jsonl"], {}, "missing.jsonl"),
    (["replay", "binary.jsonl"], {}, "binary data"),
    (["alerts"], {"VIGIL_REDIS_URL": "redis://127.0.0.1:{port}/0"}, "not reachable"),
    (["simulate", "--duration", "5"], {"VIGIL_KAFKA_BOOTSTRAP": "127.0.0.1:{port}"},
     "not reachable"),
    (["replay", TRACE], {"VIGIL_DETECT_BIN_SECONDS": "0"}, "detect.bin_seconds"),
    (["agent", "--sources", "dcgm", "--out", "-", "--ticks", "1"],
     {"VIGIL_AGENT_DCGM_URL": "http://127.0.0.1:{port}/metrics"}, "dcgm: unreachable"),
]


def test_as_processes(workdir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIGIL_")}
    env.update(VIGIL_AGENT_METRICS_PORT="0", VIGIL_AGENT_ATTRIBUTION="static",
               VIGIL_LOCAL_DATA_DIR=str(workdir / "stack"))
    procs = []
    for argv, extra, names in PROCESSES:  # side by side: one interpreter start in all
        port = _closed_port()
        procs.append((subprocess.Popen(
            [sys.executable, "-m", "vigil_gpu_monitor", *argv], cwd=workdir, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
            env={**env, **{k: v.format(port=port) for k, v in extra.items()}}), names))
    for proc, names in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 2, err
        assert_one_line_failure(proc.returncode, err, names)
