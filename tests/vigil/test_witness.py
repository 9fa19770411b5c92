"""``vigil.witness``: standard library only, never blocks, never raises; the agent's
receiver turns its datagrams into ``vigil.step/1``."""

from __future__ import annotations

import ast
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from vigil_gpu_monitor.contracts.messages import StepBatch
from vigil_gpu_monitor.contracts.steps import validate_step_batch
from vigil_gpu_monitor.producers.steps import WitnessReceiver
from vigil_gpu_monitor.vigil import witness as witness_module
from vigil_gpu_monitor.vigil.witness import Witness


class ListSink:
    """A sink that keeps what it is given (the publisher's one method)."""

    def __init__(self) -> None:
        self.batches: list[StepBatch] = []

    def publish_steps(self, batch: StepBatch) -> None:
        self.batches.append(batch)


def _socket(tmp_path: Path) -> str:
    return str(tmp_path / "w.sock")  # AF_UNIX paths are short: tmp_path is


def test_the_witness_imports_the_standard_library_alone() -> None:
    tree = ast.parse(Path(witness_module.__file__).read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
             for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree)
              if isinstance(n, ast.ImportFrom) and n.module}
    assert names <= set(sys.stdlib_module_names) | {"__future__"}


def test_with_no_agent_steps_are_dropped_counted_and_never_raise(tmp_path: Path) -> None:
    w = Witness(job="j", rank=0, gpu="0", path=str(tmp_path / "nobody.sock"),
                flush_seconds=0.0)
    began = time.perf_counter()
    for i in range(2000):
        w.step(compute=0.0001, wall=0.001 + i * 1e-9)
    took = time.perf_counter() - began
    assert w.dropped == 2000 and w.sent == 0 and w.errors == 0
    assert took < 2.0  # 2,000 failed sends: nothing waited


def test_a_full_agent_queue_never_blocks_the_loop(tmp_path: Path) -> None:
    path = _socket(tmp_path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)  # an agent that never reads: its queue fills
    try:
        w = Witness(job="j", rank=0, gpu="0", path=path, flush_seconds=0.0)
        began = time.perf_counter()
        for _ in range(20_000):
            w.step(wall=0.01)
        assert time.perf_counter() - began < 5.0
        assert w.dropped > 0 and w.sent > 0 and w.sent + w.dropped == 20_000
    finally:
        server.close()


def test_bad_arguments_are_not_sent_and_not_raised(tmp_path: Path) -> None:
    w = Witness(job="j", path=str(tmp_path / "x.sock"), flush_seconds=0.0)
    w.step(wall=float("nan"))
    w.step(wall=-1.0)
    w.step(compute=5.0, wall=1.0)  # compute beyond the step: sent without it
    w.step(step="x", wall=1.0)  # type: ignore[arg-type]
    assert w.errors == 1 and w.dropped == 1


def test_the_environment_names_the_rank_and_its_gpu() -> None:
    env = {"SLURM_JOB_ID": "123", "RANK": "9", "LOCAL_RANK": "1",
           "CUDA_VISIBLE_DEVICES": "4,5"}
    w = Witness(env=env, path="/nonexistent/x.sock")
    assert (w.job, w.rank, w.gpu) == ("123", 9, "5")


def test_the_agent_receives_and_publishes_a_valid_batch(tmp_path: Path) -> None:
    sink = ListSink()
    receiver = WitnessReceiver(_socket(tmp_path), "node-1", sink, job_of=lambda: "job-9")
    try:
        ranks = [Witness(job="", rank=r, gpu=str(r), stage=0, dp=r, path=receiver.path,
                         flush_seconds=0.0) for r in range(3)]
        for w in ranks:
            w.step()  # starts the clock
            w.step(compute=0.0)
            w.step(step=7, compute=0.0, wall=0.5)
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as rogue:
            rogue.sendto(b"not json", receiver.path)
            rogue.sendto(b'{"v": 1, "job": "j", "steps": [[1, 2, -3, null]]}', receiver.path)
        assert receiver.poll() == 6
        batch = validate_step_batch(sink.batches[0])
        assert batch["job"] == "job-9" and batch["node"] == "node-1"
        assert sorted(r["rank"] or 0 for r in batch["ranks"]) == [0, 1, 2]
        assert [s["step"] for s in batch["ranks"][0]["steps"]] == [1, 7]
        assert receiver.invalid == {"invalid_json": 1, "out_of_range": 1}
    finally:
        receiver.close()


def test_the_receiver_keeps_running_while_witnesses_come_and_go(tmp_path: Path) -> None:
    sink = ListSink()
    receiver = WitnessReceiver(_socket(tmp_path), "n", sink)
    stop = threading.Event()
    thread = threading.Thread(target=receiver.run, args=(0.01, stop))
    thread.start()
    try:
        w = Witness(job="j", rank=0, path=receiver.path, flush_seconds=0.0)
        for _ in range(50):
            w.step(wall=0.1)
            time.sleep(0.002)  # a fast loop: faster than a full queue (EAGAIN) would drop
        deadline = time.monotonic() + 5
        while receiver.published < w.sent and time.monotonic() < deadline:
            time.sleep(0.01)
        assert w.sent + w.dropped == 50 and w.sent >= 40
        assert receiver.published == w.sent
    finally:
        stop.set()
        thread.join()
        receiver.close()


@pytest.mark.parametrize("batch", [1, 64])
def test_a_step_is_cheap(tmp_path: Path, batch: int) -> None:
    """A loose bound here (a shared machine); ``bench/bench_witness.py`` measures it."""
    sink = ListSink()
    receiver = WitnessReceiver(_socket(tmp_path), "n", sink)
    try:
        w = Witness(job="j", rank=0, gpu="0", path=receiver.path, batch=batch)
        began = time.perf_counter()
        for _ in range(1000):
            w.step(compute=0.5, wall=1.0)
        assert (time.perf_counter() - began) / 1000 < 500e-6
    finally:
        receiver.close()


def test_the_agent_command_publishes_what_witnesses_send(tmp_path: Path) -> None:
    """``vigil agent --witness-socket --log-tail``: the witness's steps and the job log's
    iteration lines come out as vigil.step/1."""
    import json
    import subprocess

    path, out, train_log = _socket(tmp_path), tmp_path / "out.jsonl", tmp_path / "train.log"
    megatron = Path(__file__).parents[1] / "producers" / "fixtures" / "logs" / (
        "megatron_issue756.log")
    train_log.write_text("")
    agent = subprocess.Popen([sys.executable, "-m", "vigil_gpu_monitor", "agent", "--sources",
                              "fake-nvml", "--job", "job-7", "--out", str(out), "--ticks", "12",
                              "--witness-socket", path, "--log-tail", str(train_log)])
    try:
        deadline = time.monotonic() + 30
        while not Path(path).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        w = Witness(job="", rank=3, gpu="3", path=path, flush_seconds=0.0)
        for i in range(5):
            w.step(step=i, compute=0.05, wall=0.1)
        train_log.write_bytes(megatron.read_bytes())
        assert agent.wait(timeout=60) == 0
    finally:
        agent.kill()
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    steps = [m for m in lines if m["schema"] == "vigil.step/1"]
    witnessed = [m for m in steps if m["source"] == "witness"]
    logged = [m for m in steps if m["source"] == "megatron-log"]
    assert [s["step"] for m in witnessed for r in m["ranks"] for s in r["steps"]] == list(
        range(5))
    assert [s["step"] for m in logged for r in m["ranks"] for s in r["steps"]] == [71, 72, 73]
    assert {m["job"] for m in steps} == {"job-7"} and w.sent == 5
