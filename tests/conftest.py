"""Suite-wide collection: with pytest-xdist (``make test`` runs ``-n 2 --dist
loadgroup``), every test that talks to the local stack runs on one worker, in order,
as it would alone; the tests that need nothing but the CPU share the other."""

from __future__ import annotations

import pytest

STACK_GROUP = "stack"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("integration") or item.get_closest_marker("soak"):
            item.add_marker(pytest.mark.xdist_group(STACK_GROUP))
