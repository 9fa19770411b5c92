"""The distribution as a user installs it: wheel and sdist metadata, the top-level
import names it installs, a node agent that installs light (`vigil-gpu-monitor[agent]`
into a fresh venv, without Faust, matplotlib or scipy) and every role (`[all]`).
Builds with `python -m build` and installs from PyPI, so it is an integration test;
its figures (venv size) are printed into the test log."""

from __future__ import annotations

import email
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

from vigil_gpu_monitor.contracts.codec import decode_sample

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration
HEAVY = ("faust", "matplotlib", "scipy", "numpy", "redis", "grpc")
DIST = "vigil-gpu-monitor"
# Every top-level import name the wheel installs (README, "Installing"); the names it
# must never install are held by test_names.py.
TOP_LEVEL = {"vigil_gpu_monitor"}


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
                   check=True, capture_output=True, timeout=600)
    return out


def _wheel(dist: Path) -> Path:
    (wheel,) = dist.glob("vigil_gpu_monitor-*.whl")
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
    assert "vigil_gpu_monitor/contracts/schemas/sample-1.json" in names
    assert "vigil_gpu_monitor/detectors/hang.py" in names  # real files, not links
    assert not [n for n in names if n.startswith("tests/")]


def test_the_wheel_installs_exactly_the_listed_top_level_names(dist: Path) -> None:
    with zipfile.ZipFile(_wheel(dist)) as whl:
        names = whl.namelist()
        meta = email.message_from_bytes(whl.read(next(
            n for n in names if n.endswith(".dist-info/METADATA"))))
        top_file = next((n for n in names if n.endswith(".dist-info/top_level.txt")), None)
        listed = set(whl.read(top_file).decode().split()) if top_file else None
    assert meta["Name"] == DIST
    packages = {n.split("/")[0] for n in names if n.count("/") == 1 and
                n.endswith("/__init__.py")}
    modules = {n[:-3] for n in names if "/" not in n and n.endswith(".py")}
    assert packages | modules == TOP_LEVEL
    assert listed in (None, TOP_LEVEL)


def test_sdist_carries_the_sources_and_schemas(dist: Path) -> None:
    (sdist,) = dist.glob("vigil_gpu_monitor-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"pyproject.toml", "README.md", "vigil_gpu_monitor/producers/agent.py",
            "vigil_gpu_monitor/contracts/schemas/detection-1.json"} <= names


def test_the_agent_extra_installs_light_and_runs(dist: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    env_dir = tmp_path / "agent-venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python, vigil = env_dir / "bin" / "python", env_dir / "bin" / "vigil"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    f"{DIST}[agent] @ {_wheel(dist).as_uri()}"], check=True, timeout=600)
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


def test_every_role_installs_from_the_wheel(dist: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """`[all]` into a fresh venv: the command runs and replays a trace (numpy, msgspec,
    orjson, zstandard) and each role's modules import."""
    env_dir = tmp_path / "all-venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python, vigil = env_dir / "bin" / "python", env_dir / "bin" / "vigil"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "--no-compile", f"{DIST}[all] @ {_wheel(dist).as_uri()}"], check=True,
                   timeout=900)
    env = {"PATH": "/usr/bin:/bin"}
    version = subprocess.run([str(vigil), "--version"], capture_output=True, text=True,
                             check=True, cwd=tmp_path, env=env).stdout
    assert version.split()[-1] == meta_version(dist)
    trace = tmp_path / "t.jsonl"
    subprocess.run([str(vigil), "simulate", "--out", str(trace), "--duration", "30",
                    "--start", "1000"], check=True, cwd=tmp_path, env=env, timeout=120)
    packed = tmp_path / "t.jsonl.zst"  # zstd traces need only the report extra
    subprocess.run([str(python), "-c", "import sys, zstandard; open(sys.argv[2], 'wb').write("
                    "zstandard.ZstdCompressor().compress(open(sys.argv[1], 'rb').read()))",
                    str(trace), str(packed)], check=True, timeout=60)
    replay = subprocess.run([str(vigil), "replay", str(packed)], capture_output=True,
                            text=True, cwd=tmp_path, env=env, timeout=120)
    assert replay.returncode == 0 and "2 jobs" in replay.stderr, replay.stderr
    probe = ("import vigil_gpu_monitor.streams.app, vigil_gpu_monitor.alerting.service, "
             "vigil_gpu_monitor.producers.nvml, vigil_gpu_monitor.vigil.views.report_html")
    subprocess.run([str(python), "-c", probe], check=True, cwd=tmp_path, timeout=120)


def meta_version(dist: Path) -> str:
    with zipfile.ZipFile(_wheel(dist)) as whl:
        meta = email.message_from_bytes(whl.read(next(
            n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))))
    return str(meta["Version"])
