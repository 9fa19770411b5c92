"""`contracts/` is imported by every process, the node agent included: it may use the
standard library alone. Checked against the interpreter's own list of standard
modules (`sys.stdlib_module_names`), so a new third-party import cannot slip through
a denylist that does not name it."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

CONTRACTS = Path(__file__).resolve().parents[2] / "contracts"


def _imported_top_levels(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_contracts_imports_nothing_but_the_standard_library_and_itself() -> None:
    allowed = set(sys.stdlib_module_names) | {"vigil_gpu_monitor", "__future__"}
    offending = {f"{path.name}: {name}" for path in sorted(CONTRACTS.rglob("*.py"))
                 for name in _imported_top_levels(path) if name not in allowed}
    assert not offending


def test_the_check_sees_a_third_party_import(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("import json\nfrom numpy import array\nimport orjson as fast\n")
    assert _imported_top_levels(planted) - set(sys.stdlib_module_names) == {"numpy", "orjson"}
