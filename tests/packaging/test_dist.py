"""The distribution as a user installs it: wheel and sdist metadata, and a node agent
that installs light (`vigil[agent]` into a fresh venv, without Faust, matplotlib or
scipy). Builds with `python -m build` and installs from PyPI, so it is an integration
test; its figures (venv size) are printed into the test log."""

from __future__ import annotations

import email
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

from contracts.codec import decode_sample

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration
HEAVY = ("faust", "matplotlib", "scipy", "numpy", "redis", "grpc")


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
                   check=True, capture_output=True, timeout=600)
    return out


def _wheel(dist: Path) -> Path:
    (wheel,) = dist.glob("vigil-*.whl")
    return wheel


def test_wheel_metadata_names_the_license_and_one_extra_per_role(dist: Path) -> None:
    with zipfile.ZipFile(_wheel(dist)) as whl:
        meta_name = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.message_from_bytes(whl.read(meta_name))
        names = whl.namelist()
    assert meta["License-Expression"] == "Apache-2.0" and meta["License"] is None
    assert {"agent", "kubelet", "worker", "alerter", "report", "all"} <= set(
        meta.get_all("Provides-Extra"))
    requires = meta.get_all("Requires-Dist")
    assert not [r for r in requires if "extra ==" not in r]  # the base install needs nothing
    agent = [r.split(";")[0].lower() for r in requires if "extra == \"agent\"" in r]
    assert not [r for r in agent if r.startswith(HEAVY)], agent
    assert "contracts/schemas/sample-1.json" in names
    assert not [n for n in names if n.startswith("tests/")]


def test_sdist_carries_the_sources_and_schemas(dist: Path) -> None:
    (sdist,) = dist.glob("vigil-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"pyproject.toml", "README.md", "producers/agent.py",
            "contracts/schemas/detection-1.json"} <= names


def test_the_agent_extra_installs_light_and_runs(dist: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    env_dir = tmp_path / "agent-venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python, vigil = env_dir / "bin" / "python", env_dir / "bin" / "vigil"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    f"{_wheel(dist)}[agent]"], check=True, timeout=600)
    run = subprocess.run([str(vigil), "agent", "--sources", "fake-nvml", "--out", "-",
                          "--ticks", "3", "--fast"], cwd=tmp_path, capture_output=True,
                         timeout=120, env={"VIGIL_AGENT_ATTRIBUTION": "static",
                                           "VIGIL_AGENT_JOB": "light", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    samples = [decode_sample(line) for line in run.stdout.splitlines()]
    assert len(samples) == 3 and all(s["job"] == "light" and s["gpus"] for s in samples)
    probe = ("import importlib.util as u, sys; "
             f"print(' '.join(m for m in {HEAVY!r} if u.find_spec(m)))")
    present = subprocess.run([str(python), "-c", probe], capture_output=True, text=True,
                             check=True, cwd=tmp_path).stdout.split()
    assert present == [], f"the agent venv has {present}"
    size = sum(f.stat().st_size for f in env_dir.rglob("*") if f.is_file())
    site = next(env_dir.glob("lib/python*/site-packages"))
    tooling = sum(f.stat().st_size for d in site.glob("pip*") for f in d.rglob("*")
                  if f.is_file())
    with capsys.disabled():
        print(f"\nagent venv: {size / 1e6:.1f} MB in all, {(size - tooling) / 1e6:.1f} MB "
              f"without pip itself")
    assert size - tooling < 80e6
