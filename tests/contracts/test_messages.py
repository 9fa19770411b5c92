"""The message TypedDicts make mypy catch a misspelt or missing key."""

from __future__ import annotations

from pathlib import Path

import pytest
from mypy import api

ROOT = Path(__file__).resolve().parents[2]

GOOD = '''
from vigil_gpu_monitor.contracts.messages import Detection, Sample

def where(det: Detection) -> str:
    return f"{det['node']}/{det['gpu']}"

sample: Sample = {"schema": "vigil.sample/1", "ts": 1.0, "job": "j", "node": "n1",
                  "gpus": {"0": {"sm_active": 0.5}}, "host": {}, "nics": {}}
'''
MISSPELT_READ = GOOD + '''
def host(det: Detection) -> str | None:
    return det["nodes"]
'''
MISSPELT_BUILD = GOOD.replace('"node": "n1"', '"nodename": "n1"')


def _mypy(tmp_path: Path, source: str) -> tuple[str, int]:
    snippet = tmp_path / "snippet.py"
    snippet.write_text(source)
    out, err, status = api.run([str(snippet), "--strict", "--no-incremental",
                                "--cache-dir", str(tmp_path / "cache")])
    return out + err, status


def test_well_formed_messages_type_check(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # mypy finds `contracts` from the repository root
    out, status = _mypy(tmp_path, GOOD)
    assert status == 0, out


def test_a_misspelt_key_is_an_error_where_read_and_where_built(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    out, status = _mypy(tmp_path, MISSPELT_READ)
    assert status == 1 and '"Detection" has no key "nodes"' in out, out
    out, status = _mypy(tmp_path, MISSPELT_BUILD)
    assert status == 1 and "nodename" in out and "node" in out, out
