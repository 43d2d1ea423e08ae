"""Where the controller's state may live: never under a server's ~/.ftc-node, whose directories are
own servers' clusters (ftc would take each for one of its own, and advise removing its own state)."""

import os

from conftest import ftc, sshd_pids
from helpers import one_error


def test_ftc_home_under_a_servers_node_root_is_refused_in_one_line_before_anything(tmp_path):
    node_root = tmp_path / "home" / ".ftc-node"
    (node_root / "demo" / ".ftc").mkdir(parents=True)  # a server's cluster directory, as `up` claims it
    for home in (node_root, node_root / "controller"):
        for command in (["status"], ["up", "--name", "a", "--nodes", "1", "--no-bootstrap"], ["runs"]):
            refused = ftc(*command, env={"FTC_HOME": str(home)})
            assert refused.returncode == 2, (command, refused.stderr)
            assert refused.stderr.splitlines() == [
                f"error: FTC_HOME={str(home)!r} lies under {str(node_root)!r}, where ftc keeps the clusters of your "
                "own servers (each directory there is one cluster's); keep the controller's state elsewhere: "
                "another FTC_HOME (the default is ~/.ftc)"]
            assert refused.stdout == ""
    assert sorted(p.name for p in node_root.iterdir()) == ["demo"]  # nothing created there


def test_a_directory_merely_named_like_the_node_root_is_a_fine_ftc_home(tmp_path):
    listed = ftc("status", env={"FTC_HOME": str(tmp_path / ".ftc-nodes")})
    assert listed.returncode == 0, listed.stderr


def test_an_ftc_home_that_is_not_utf8_is_refused_before_anything_starts(ftc_home, tmp_path):
    home = os.fsdecode(os.fsencode(str(tmp_path)) + b"/h\xff")
    for argv in (["up", "--name", "u8", "--nodes", "1"], ["status"]):
        proc = ftc(*argv, env={"FTC_HOME": home})
        assert proc.returncode == 2 and "holds a byte that is not UTF-8" in one_error(proc), proc.stderr
    assert not os.path.exists(os.fsencode(str(tmp_path)) + b"/h\xff")
    assert sshd_pids(tmp_path) == []
