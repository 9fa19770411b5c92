"""The acting commands against the real Redis: they act on what exists and refuse, in one
line and with a non-zero status, what does not (an unknown incident, silence or node);
`vigil alerts` shows the incident id that `vigil ack` takes. (The refusals that need no
Redis, and every command with Redis down, are in tests/vigil/test_cli_conformance.py.)
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from tests.vigil.test_cli_conformance import assert_one_line_failure
from vigil_gpu_monitor.alerting.silences import SilenceStore
from vigil_gpu_monitor.alerting.state import LiveState
from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.vigil.cli import main

pytestmark = pytest.mark.integration


def _detection(incident: str, state: str = "firing") -> dict[str, Any]:
    at = time.time()
    return {"schema": "vigil.detection/1", "id": incident, "kind": "straggler",
            "state": state, "severity": "warning", "job": "train-1", "node": "gpu-07",
            "gpu": "3", "started_at": at, "detected_at": at, "metrics": ["sm_active"],
            "score": 5.0, "summary": "GPU 3 of gpu-07 is 20 % slower than its peers",
            "evidence": {}}


@pytest.fixture
def env(isolated_env: dict[str, str], isolated_cfg: Config,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[LiveState]:
    for name, value in isolated_env.items():
        if name.startswith("VIGIL_"):
            monkeypatch.setenv(name, value)
    for name in [n for n in os.environ if n.startswith("VIGIL_") and n not in isolated_env]:
        monkeypatch.delenv(name)
    state = LiveState(redis.Redis.from_url(isolated_cfg.redis_url), isolated_cfg.redis.key_prefix)
    state.apply(_detection("straggler-train-1-gpu-07-3"))  # type: ignore[arg-type]
    state.apply(_detection("hang-train-1", "firing"))  # type: ignore[arg-type]
    state.apply(_detection("hang-train-1", "resolved"))  # type: ignore[arg-type]
    yield state


def test_alerts_shows_the_id_that_ack_takes(env: LiveState,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["alerts"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:2] == ["id", "severity"]
    assert "straggler-train-1-gpu-07-3" in out and "hang-train-1" not in out  # open only
    assert main(["ack", "straggler-train-1-gpu-07-3", "--by", "ops"]) == 0
    assert "acknowledged straggler-train-1-gpu-07-3" in capsys.readouterr().out
    assert SilenceStore(env.r, env.prefix).acked("straggler-train-1-gpu-07-3")


def test_ack_refuses_an_incident_that_never_was(env: LiveState,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code, err = main(["ack", "no-such-incident"]), capsys.readouterr().err
    assert_one_line_failure(code, err, "no incident 'no-such-incident'")
    assert not SilenceStore(env.r, env.prefix).acked("no-such-incident")
    # a resolved incident exists: acknowledged, and said to be resolved already
    assert main(["ack", "hang-train-1"]) == 0
    assert "resolved already" in capsys.readouterr().err


def test_silence_add_list_expire_and_refusals(env: LiveState,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["silence", "add", "--match", "kind=strag*", "--match", "job=train-*",
                 "--for", "2h", "--comment", "known"]) == 0
    ident = capsys.readouterr().out.split()[-1]
    assert main(["silence", "list"]) == 0
    assert ident in capsys.readouterr().out
    code, err = main(["silence", "add", "--match", "kidn=straggler", "--for", "2h"]), \
        capsys.readouterr().err
    assert_one_line_failure(code, err, "no detection carries a label 'kidn'")
    code, err = main(["silence", "expire", "nosuchsilence"]), capsys.readouterr().err
    assert_one_line_failure(code, err, "no active silence 'nosuchsilence'")
    assert len(SilenceStore(env.r, env.prefix).active()) == 1  # the misspelt one never added
    assert main(["silence", "expire", ident]) == 0
    assert main(["silence", "list"]) == 0
    assert "no active silences" in capsys.readouterr().out


def test_repair_refuses_a_node_vigil_does_not_hold(env: LiveState,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, err = main(["repair", "done", "gpu-99"]), capsys.readouterr().err
    assert_one_line_failure(code, err, "gpu-99 is in_service")
    assert main(["nodes"]) == 0
    assert "no nodes out of service" in capsys.readouterr().out
