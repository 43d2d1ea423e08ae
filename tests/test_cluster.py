"""A cluster's life on local nodes as the user sees it: `up` in an FTC_HOME with odd characters,
`status` past clusters it cannot read, `ssh` into a node, `inventory`, and a node that cannot be
reached named in one line."""

import json
import os
import signal

import pytest
from conftest import ftc, sshd_pids
from helpers import assert_bootstrapped, one_error, only_line, state_path, up_local, wait_for

from provision import procs
from provision import state as st
from provision.spec import ClusterSpec


@pytest.mark.slow
def test_ftc_home_with_a_space_and_shell_characters_works_and_runs_nothing(tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    home = tmp_path / f"my ftc $(touch {marker})"
    monkeypatch.setenv("FTC_HOME", str(home))
    monkeypatch.chdir(tmp_path)
    for key in [k for k in os.environ if k.startswith("FTC_") and k != "FTC_HOME"]:
        monkeypatch.delenv(key)
    up = ftc("up", "--name", "odd", "--nodes", "2", timeout=600)
    try:
        assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
        assert_bootstrapped(home, "odd", 2)  # plain `ssh odd-1` from node 0, and mpirun over both
        shell = ftc("ssh", "--name", "odd", "--node", "1", "--", "pwd")
        assert shell.returncode == 0 and shell.stdout.strip().endswith("/nodes/1"), shell.stderr
    finally:
        assert ftc("down", "--name", "odd").returncode == 0
    assert not marker.exists()
    assert sshd_pids(home) == []


@pytest.mark.slow
def test_status_of_every_cluster_goes_on_past_a_corrupt_one(ftc_home):
    for name in ("good", "bad"):
        assert ftc("up", "--name", name, "--nodes", "1", "--no-bootstrap").returncode == 0
    (ftc_home / "clusters" / "bad" / "state.json").write_text('{"spec": "x"}')
    proc = ftc("status")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "good" in proc.stdout + proc.stderr and "bad/state.json is not valid cluster state" in proc.stderr
    for name in ("good", "bad"):
        assert ftc("down", "--name", name).returncode == 0
    assert sshd_pids(ftc_home) == []


@pytest.mark.slow
def test_ssh_into_a_cluster_that_is_not_bootstrapped_gives_a_shell_in_its_workdir(ftc_home):
    assert ftc("up", "--name", "raw", "--nodes", "1", "--no-bootstrap").returncode == 0
    try:
        proc = ftc("ssh", "--name", "raw", "--", "pwd")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == json.loads((ftc_home / "clusters" / "raw" / "state.json").read_text()
                                                 )["nodes"][0]["workdir"]
    finally:
        ftc("down", "--name", "raw", check=True)


@pytest.mark.slow
def test_inventory_to_an_unwritable_path_is_refused(ftc_home):
    assert ftc("up", "--name", "inv", "--nodes", "1", "--no-bootstrap").returncode == 0
    try:
        proc = ftc("inventory", "--name", "inv", "--out", "/proc/nope/inventory.yml")
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "--out=" in proc.stderr
    finally:
        ftc("down", "--name", "inv", check=True)


def test_status_shows_an_unknown_instance_type_and_goes_on_past_a_cluster_it_cannot_read(ftc_home):
    spec = ClusterSpec(name="aaa", provider="aws").to_dict()
    st.save(st.ClusterState(name="aaa", provider="aws", spec={**spec, "instance_type": "bogus"}, phase="running"))
    st.save(st.ClusterState(name="zzz", provider="local", spec=ClusterSpec(name="zzz").to_dict(), phase="running"))
    (ftc_home / "clusters" / "mmm" / "state.json").mkdir(parents=True)  # a state file that is a directory

    every = ftc("status")
    assert every.returncode == 1
    assert "cost unknown ('bogus' is not in ftc's catalog)" in " ".join(every.stdout.split())
    assert "zzz: local, running" in every.stdout  # listed after the two bad ones
    error = one_error(every)
    assert "clusters/mmm/state.json" in error and "`ftc down --name mmm` still cleans up" in error
    one = ftc("status", "--name", "aaa")
    assert one.returncode == 0 and "cost unknown" in one.stdout and "Traceback" not in one.stderr


@pytest.mark.slow
def test_an_unreachable_node_or_a_failed_remote_step_is_one_line_naming_node_and_step(ftc_home):
    up_local("a")
    path = state_path(ftc_home, "a")
    state = json.loads(path.read_text())
    node = state["nodes"][0]
    state["jobs"] = [{"id": "mrpc-1", "task": "mrpc", "remote_dir": f"{node['workdir']}/jobs/never", "results_dir": "/r",
                      "state": "finished"}]
    path.write_text(json.dumps(state))
    logs = ftc("logs", "--name", "a")  # its output.log is not there
    assert logs.returncode == 1 and "node a-0: step 'logs' failed" in only_line(logs)
    os.kill(node["pid"], signal.SIGKILL)
    wait_for(lambda: not procs.alive(node["pid"]), "the killed sshd to be gone")
    logs = ftc("logs", "--name", "a", env={"FTC_CONNECT_ATTEMPTS": "2"})
    line = only_line(logs)
    assert logs.returncode == 1 and "node a-0: step 'connect' failed: no SSH after 2 attempts" in line, line
    assert "`ftc status --name a`" in line
    assert ftc("down", "--name", "a").returncode == 0

