"""FTC_HOME on a full disk (a small tmpfs, filled): `down` still removes the nodes without writing
first, `up` leaves nothing behind, and each command says what happened in one line."""

import os
import subprocess
from pathlib import Path

import pytest
from conftest import ftc, sshd_pids

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root (as the local nodes' sshd does)")]


@pytest.fixture
def small_home(tmp_path, monkeypatch) -> Path:
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], check=True)
    home = mount / "ftc-home"
    monkeypatch.setenv("FTC_HOME", str(home))
    monkeypatch.chdir(tmp_path)
    yield home
    subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(directory: Path) -> None:
    """Every byte of the file system taken (dd stops at 'No space left on device')."""
    subprocess.run(["dd", "if=/dev/zero", f"of={directory}/filler", "bs=64k"], capture_output=True)
    with pytest.raises(OSError, match="No space left"):
        (directory / "probe").write_bytes(b"x" * 65536)


def test_down_on_a_full_disk_removes_the_nodes_in_one_line(small_home):
    assert ftc("up", "--name", "full", "--nodes", "1", "--no-bootstrap").returncode == 0
    assert sshd_pids(small_home)
    fill(small_home.parent)
    down = ftc("down", "--name", "full")
    assert down.returncode == 0, down.stderr
    assert "Traceback" not in down.stderr and "nothing left running" in down.stderr
    assert sshd_pids(small_home) == []
    assert not (small_home / "clusters" / "full").exists()


def test_up_on_a_full_disk_says_so_and_leaves_nothing(small_home):
    (small_home / "clusters").mkdir(parents=True)
    fill(small_home.parent)
    up = ftc("up", "--name", "nospace", "--nodes", "1", "--no-bootstrap")
    assert up.returncode != 0 and "Traceback" not in up.stderr, up.stderr
    assert "no space left" in up.stderr.lower()
    assert sshd_pids(small_home) == []
    assert not (small_home / "clusters" / "nospace").exists()  # no stray lock
