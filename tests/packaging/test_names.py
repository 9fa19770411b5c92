"""Vigil installs one import name of its own, `vigil_gpu_monitor`, never the generic
names of its folders, several of which other PyPI projects install (issue #48). The
wheel's contents are checked in test_dist.py; here, without building: what setuptools
is told to package, the links that make each folder a subpackage, and every import in
the repository (a bare `import detectors` would work from a checkout, where the folders
sit on sys.path, and fail once installed)."""

from __future__ import annotations

import ast
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "vigil_gpu_monitor"
FOLDERS = ("contracts", "producers", "simulator", "detectors", "streams", "alerting", "vigil")
# Import names that other projects on PyPI install (checked on pypi.org, 2026-11-27):
# Vigil must install none of them.
TAKEN = {
    "contracts": "PyContracts and the 'contracts' project",
    "alerting": "alerting 0.0.9.3",
    "detectors": "detectors 0.1.11",
    "simulator": "simulator 1.0.3",
    "streams": "streams 0.1",
    "vigil": "vigil 1.0",
    "vigil_gpu": "vigil-gpu 0.2.0",
}


def test_setuptools_packages_only_the_one_import_name() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert config["tool"]["setuptools"]["packages"]["find"]["include"] == [f"{PACKAGE}*"]
    assert PACKAGE not in TAKEN
    assert config["project"]["scripts"]["vigil"].startswith(f"{PACKAGE}.")


def test_each_folder_is_a_subpackage_through_its_link() -> None:
    for folder in FOLDERS:
        link = ROOT / PACKAGE / folder
        assert link.is_symlink() and link.resolve() == (ROOT / folder).resolve(), folder
        assert (link / "__init__.py").is_file()


def _bare_imports(path: Path, root: Path = ROOT) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        found += [f"{path.relative_to(root)}:{node.lineno} {name}" for name in names
                  if name.split(".")[0] in FOLDERS]
    return found


def test_no_file_imports_a_folder_by_its_bare_name() -> None:
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    files = [ROOT / f for f in tracked if not (ROOT / f).is_symlink()]
    assert len(files) > 100
    offending = [hit for path in files for hit in _bare_imports(path)]
    assert not offending


def test_the_scan_sees_a_bare_import(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("import json\nfrom detectors.hang import x\n"
                       "from vigil_gpu_monitor.vigil import cli\nimport streams.app\n")
    hits = sorted(_bare_imports(planted, root=tmp_path))
    assert hits == ["planted.py:2 detectors.hang", "planted.py:4 streams.app"]
