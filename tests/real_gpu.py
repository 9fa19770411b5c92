"""`bench/real_gpu_check.py` (a script, not a package module) loaded for the tests that
read its output or the real GPU's fixtures."""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench" / "real_gpu_check.py"


@cache
def real_gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("real_gpu_check", BENCH)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
