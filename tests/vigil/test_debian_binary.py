"""Installing a missing Debian binary while another install runs: `make test` runs two
lanes side by side, and on a new machine promtool's apt-get failed on dpkg's lock while
slurmctld's ran. ``debian_binary`` queues Vigil's installs and looks again once its
turn comes; a failed install says what apt-get answered. Here apt-get is a script
that refuses to run beside itself, as dpkg's lock makes the real one."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from vigil_gpu_monitor.vigil.ops import localstack

FAKE_APT = """#!/bin/sh
# an apt-get that, like dpkg's lock, refuses to run while another runs
echo "$*" >> "{log}"
if ! mkdir "{running}" 2>/dev/null; then
  echo "E: Could not get lock /var/lib/dpkg/lock-frontend" >&2; exit 100
fi
sleep 0.5
case "$*" in
  *" install "*fakepkg*) printf '#!/bin/sh\\n' > "{bin}/fakebin"; chmod +x "{bin}/fakebin" ;;
  *" install "*brokenpkg*) echo "E: Unable to locate package brokenpkg" >&2;
                           rmdir "{running}"; exit 100 ;;
esac
rmdir "{running}"
"""

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="installs only as root")


@pytest.fixture
def apt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake apt-get first on the PATH; returns the folder it installs into."""
    tools, installed = tmp_path / "tools", tmp_path / "bin"
    tools.mkdir()
    installed.mkdir()
    script = tools / "apt-get"
    script.write_text(FAKE_APT.format(log=tmp_path / "apt.log", running=tmp_path / "running",
                                      bin=installed))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    monkeypatch.setattr(localstack, "APT_LOCK", tmp_path / "apt.lock")
    return installed


def test_two_installs_at_once_take_turns_and_the_second_finds_it_installed(
        apt: Path, tmp_path: Path) -> None:
    found: list[str] = []
    errors: list[BaseException] = []

    def install() -> None:
        try:
            found.append(localstack.debian_binary("fakebin", "fakepkg", (str(apt),)))
        except BaseException as exc:  # reported by the test below
            errors.append(exc)

    threads = [threading.Thread(target=install) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert found == [str(apt / "fakebin")] * 2
    calls = (tmp_path / "apt.log").read_text().splitlines()
    # one update and one install, each waiting for any other dpkg user
    assert len(calls) == 2, calls
    assert all(c.startswith("-o DPkg::Lock::Timeout=") for c in calls), calls


def test_a_failed_install_says_what_apt_get_answered(apt: Path) -> None:
    with pytest.raises(localstack.StackError, match="Unable to locate package brokenpkg"):
        localstack.debian_binary("brokenbin", "brokenpkg", (str(apt),))
