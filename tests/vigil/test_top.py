"""The live view's frame, rendered from a hand-made snapshot (no Redis needed)."""

from __future__ import annotations

from vigil_gpu_monitor.vigil.views.top import LEVELS, NO_READING, Snapshot, cell, render


def _det(job: str, node: str, gpu: str | None, kind: str, at: float,
         lost: float | None = None) -> dict[str, object]:
    evidence = {} if lost is None else {"gpu_hours_lost_per_hour": lost, "job_gpus": 16,
                                        "job_slowdown": lost / (16 - lost)}
    return {"id": f"{job}-{node}-{gpu}", "kind": kind, "job": job, "node": node, "gpu": gpu,
            "severity": "warning", "detected_at": at, "summary": f"{kind} on {node}",
            "evidence": evidence}


def test_cell_scales_activity_and_marks_no_reading() -> None:
    assert cell(None) == NO_READING
    assert cell(0.0) == LEVELS[0] and cell(1.0) == LEVELS[-1]
    assert LEVELS.index(cell(0.3)) < LEVELS.index(cell(0.9))
    assert cell(7.0) == LEVELS[-1] and cell(-1.0) == LEVELS[0]  # clamped, never an IndexError


def test_frame_shows_heat_incidents_and_pipeline() -> None:
    heat = {f"n{n}/{g}": [0.9, 0.5, 0.6] for n in range(2) for g in range(8)}
    heat["n1/3"] = [0.2, 0.1, None]
    snap = Snapshot(
        taken_at=1000.0,
        jobs={"train": {"job": "train", "heat": heat, "late": 4,
                        "metrics": ["sm_active", "tensor_active", "dram_active"]},
              "quiet": {"job": "quiet", "heat": {"q0/0": [0.5, 0.5, 0.5]}, "late": 0}},
        workers={"w1": {"lag": {"0": 12, "1": 3}, "deadletters": 2, "samples": 900,
                        "jobs": 2, "seen": 990.0},
                 "w2": {"lag": {}, "deadletters": 0, "samples": 1, "jobs": 0, "seen": 900.0}},
        incidents=[_det("train", "n1", "3", "straggler", 980.0),
                   _det("train", "n9", None, "node_silent", 970.0)])
    frame = render(snap, color=False)
    rows = {line.split()[0]: line for line in frame.splitlines() if line.startswith("  n")}
    sm_strip = rows["n1"].split()[1]
    assert sm_strip[3] == cell(0.2) and sm_strip[0] == cell(0.9), rows["n1"]
    assert NO_READING in rows["n1"].split()[3]  # DRAM of GPU 3 was not read
    assert "◀ straggler (GPU 3)" in rows["n1"] and "◀" not in rows["n0"]
    assert frame.index("train") < frame.index("quiet")  # jobs with incidents first
    assert "lag       15" in frame and "dead letters      2" in frame
    assert "STALE" in frame.split("worker w2")[1].splitlines()[0]  # 100 s old heartbeat
    assert "silent agents: n9" in frame
    assert "\x1b[" not in frame


def test_frame_without_data_says_why() -> None:
    frame = render(Snapshot(taken_at=0.0), color=False)
    assert "no job heat yet" in frame and "none" in frame and "no worker heartbeat" in frame


def test_frame_shows_goodput_and_costliest_incident_first() -> None:
    heat = {f"n{n}/{g}": [0.9, 0.5, 0.6] for n in range(2) for g in range(8)}
    snap = Snapshot(
        taken_at=1000.0, jobs={"train": {"job": "train", "heat": heat, "late": 0}},
        incidents=[_det("train", "n0", "1", "link_health", 990.0, lost=0.4),
                   _det("train", "n1", "3", "straggler", 980.0, lost=2.0),
                   _det("train", "n1", "5", "gpu_health", 995.0)])
    frame = render(snap, color=False)
    header = next(line for line in frame.splitlines() if line.startswith("train"))
    assert "goodput 85%" in header and "losing 2.4 GPU-h/h" in header  # 1 - 2.4/16
    listed = frame.split("OPEN INCIDENTS")[1].splitlines()[1:4]
    assert [line.split()[1] for line in listed] == ["straggler", "link_health", "gpu_health"]
    assert "2 GPU-h/h" in listed[0] and "cost ?" in listed[2]


def test_title_counts_the_nodes_vigil_holds_out() -> None:
    frame = render(Snapshot(taken_at=0.0, nodes_out={"held_out": 1, "verifying": 2}),
                   color=False)
    assert "nodes out 3 (1 held_out, 2 verifying)" in frame.splitlines()[0]
    assert "nodes out 0" in render(Snapshot(taken_at=0.0), color=False).splitlines()[0]


def test_frame_says_when_data_is_from_the_future_or_stale() -> None:
    heat = {"n0/0": [0.9, 0.5, 0.6]}
    ahead = render(Snapshot(taken_at=1000.0, jobs={"sim": {"job": "sim", "heat": heat,
                                                           "late": 0, "ts": 1056.0}},
                            incidents=[_det("sim", "n0", "0", "straggler", 1056.0)]),
                   color=False)
    assert "DATA FROM THE FUTURE: 56s ahead" in ahead
    assert "in 56s!" in ahead and "-56s ago" not in ahead
    fresh = render(Snapshot(taken_at=1000.0, jobs={"sim": {"job": "sim", "heat": heat,
                                                           "late": 0, "ts": 990.0}}),
                   color=False)
    assert "FUTURE" not in fresh and "STALE" not in fresh and "no fresh data" not in fresh
    old = render(Snapshot(taken_at=1000.0, jobs={"sim": {"job": "sim", "heat": heat,
                                                         "late": 0, "ts": 900.0}}),
                 color=False)
    assert "STALE: no data for 100s" in old
    assert "no fresh data: the newest job heat is 100s ago" in old
