"""What a hostile trial broke (issue 12), each as the user met it: Make variables that hold
shell code, state files that hold anything, a name reused after its state was lost, an
FTC_HOME with a space and a `$(...)` in it, plain ssh between nodes by name."""

import json
import os
import subprocess

import pytest
from conftest import REPO, ftc, sshd_pids
from helpers import assert_bootstrapped
from test_spec import assert_refused

HOSTILE = ['a"; touch {m}; echo "', "x'; touch {m}; echo '", "`touch {m}`", "$$(touch {m})", "$(touch {m})",
           "$(shell touch {m})"]


def make(*args: str, home) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-s", "-C", str(REPO), *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "FTC_HOME": str(home)})


@pytest.mark.parametrize("variable,target", [("NAME", "cluster"), ("OWNER", "cluster"), ("STACK", "cluster"),
                                             ("LR", "demo"), ("BOOTSTRAPPER", "bootstrap")])
@pytest.mark.parametrize("template", HOSTILE)
def test_make_variables_reach_ftc_as_data_never_as_shell_code(ftc_home, tmp_path, variable, target, template):
    marker = tmp_path / "ran"
    value = template.format(m=marker)
    extra = [] if variable == "NAME" else ["NAME=hostile"]
    proc = make(target, f"{variable}={value}", "NODES=1", *extra, home=ftc_home)
    assert not marker.exists(), f"{variable}={value!r} ran as shell code"
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and f"{variable}=" in errors[0], proc.stderr
    assert not (ftc_home / "clusters").exists() or not any((ftc_home / "clusters").glob("*/state.json"))


@pytest.mark.parametrize("content", ["[]", "null", '"x"', '{"spec": "x"}', '{"nodes": 5}', "", "\udcff"])
def test_down_removes_the_nodes_whatever_state_json_holds(ftc_home, content):
    assert ftc("up", "--name", "corrupt", "--nodes", "2", "--no-bootstrap").returncode == 0
    assert len(sshd_pids(ftc_home)) == 2
    (ftc_home / "clusters" / "corrupt" / "state.json").write_bytes(content.encode(errors="surrogateescape"))
    status = ftc("status", "--name", "corrupt")
    assert status.returncode == 1 and "Traceback" not in status.stderr, status.stderr
    down = ftc("down", "--name", "corrupt")
    assert down.returncode == 0, down.stderr
    assert sshd_pids(ftc_home) == []
    assert not (ftc_home / "clusters" / "corrupt").exists()


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


def test_a_name_reused_after_its_state_was_lost_leaves_no_orphans(ftc_home):
    assert ftc("up", "--name", "st", "--nodes", "2", "--no-bootstrap").returncode == 0
    (ftc_home / "clusters" / "st" / "state.json").unlink()
    assert ftc("up", "--name", "st", "--nodes", "1", "--no-bootstrap").returncode == 0
    assert len(sshd_pids(ftc_home)) == 3
    assert ftc("down", "--name", "st").returncode == 0
    assert sshd_pids(ftc_home) == []


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


def test_ssh_into_a_cluster_that_is_not_bootstrapped_gives_a_shell_in_its_workdir(ftc_home):
    assert ftc("up", "--name", "raw", "--nodes", "1", "--no-bootstrap").returncode == 0
    try:
        proc = ftc("ssh", "--name", "raw", "--", "pwd")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == json.loads((ftc_home / "clusters" / "raw" / "state.json").read_text()
                                                 )["nodes"][0]["workdir"]
    finally:
        ftc("down", "--name", "raw", check=True)


def test_config_whose_cluster_is_not_a_table_is_refused(ftc_home, tmp_path):
    config = tmp_path / "ftc.toml"
    config.write_text("cluster = 5\n")
    assert_refused(ftc("up", "--name", "cfg", "--config", str(config)), "'cluster' must be a table", ftc_home)


def test_inventory_to_an_unwritable_path_is_refused(ftc_home):
    assert ftc("up", "--name", "inv", "--nodes", "1", "--no-bootstrap").returncode == 0
    try:
        proc = ftc("inventory", "--name", "inv", "--out", "/proc/nope/inventory.yml")
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "OUT=" in proc.stderr
    finally:
        ftc("down", "--name", "inv", check=True)


@pytest.mark.parametrize("same_process", [False, True])
def test_destroy_signals_a_recorded_job_only_while_its_pid_is_still_that_process(ftc_home, same_process):
    from provision import procs
    assert ftc("up", "--name", "reuse", "--nodes", "1", "--no-bootstrap").returncode == 0
    # A process that holds the pid a finished job had (or, for the control, the job itself).
    other = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        path = ftc_home / "clusters" / "reuse" / "state.json"
        state = json.loads(path.read_text())
        started = procs.start_ticks(other.pid) + (0 if same_process else 1)
        state["jobs"] = [{"id": "mrpc-1", "task": "mrpc", "remote_dir": "/x", "results_dir": "/y", "pid": other.pid,
                          "pid_start": started, "state": "running", "pids_by_node": {"reuse-0": [other.pid]}}]
        path.write_text(json.dumps(state))
        assert ftc("down", "--name", "reuse").returncode == 0
        assert (other.wait(timeout=30) is not None) if same_process else other.poll() is None
    finally:
        other.kill()
        other.wait()
