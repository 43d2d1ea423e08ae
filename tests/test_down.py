"""`ftc down`: it removes the nodes whatever the state holds (corrupt, of wrong types, lost, copied or
renamed), only this FTC_HOME's nodes, a recorded job only while its pid is still that process, and with
AWS out of reach it says what may remain and keeps what a retry needs."""

import json
import subprocess

import pytest
from conftest import assert_nothing_left, ftc, sshd_pids
from helpers import AWS_UP, last_line, only_line, state_of, state_path, up_local

from provision import procs


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_name_reused_after_its_state_was_lost_leaves_no_orphans(ftc_home):
    assert ftc("up", "--name", "st", "--nodes", "2", "--no-bootstrap").returncode == 0
    (ftc_home / "clusters" / "st" / "state.json").unlink()
    assert ftc("up", "--name", "st", "--nodes", "1", "--no-bootstrap").returncode == 0
    assert len(sshd_pids(ftc_home)) == 3
    assert ftc("down", "--name", "st").returncode == 0
    assert sshd_pids(ftc_home) == []


@pytest.mark.slow
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


def remove_aws_credentials(monkeypatch, tmp_path) -> None:
    """boto3 finds no credentials anywhere: no variables, no files, no instance metadata."""
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.mark.slow
@pytest.mark.parametrize("relative", [False, True])
def test_down_in_another_ftc_home_leaves_a_same_named_cluster_whose_path_ends_alike(ftc_home, tmp_path, relative):
    """The other home's path is a tail of this one's: `.../k` against `.../nest/.../k` absolute, or
    `deep/k` from another directory against `.../deep/k`."""
    if relative:
        ours, other, cwd = tmp_path / "deep" / "k", "deep/k", tmp_path / "elsewhere"
    else:
        ours, other, cwd = tmp_path / "nest" / tmp_path.relative_to("/") / "k", str(tmp_path / "k"), tmp_path
    cwd.mkdir(exist_ok=True)
    up_local("v", ours)
    (pid,) = sshd_pids(ours)
    try:
        down = ftc("down", "--name", "v", env={"FTC_HOME": other}, cwd=cwd)
        assert down.returncode == 0, down.stderr
        assert sshd_pids(ours) == [pid] and state_path(ours, "v").exists()
    finally:
        assert ftc("down", "--name", "v", env={"FTC_HOME": str(ours)}).returncode == 0
    assert not procs.alive(pid)


@pytest.mark.slow
def test_down_stops_the_nodes_of_an_ftc_home_with_a_backslash_and_letters_beyond_ascii(ftc_home, tmp_path):
    home = tmp_path / "hôme\\x"  # sshd shows both escaped in its process title
    up_local("esc", home, nodes=2)
    pids = [node["pid"] for node in state_of(home, "esc")["nodes"]]
    assert all(procs.alive(pid) for pid in pids)
    down = ftc("down", "--name", "esc", env={"FTC_HOME": str(home)})
    assert down.returncode == 0, down.stderr
    assert not any(procs.alive(pid) for pid in pids)


@pytest.mark.slow
def test_down_of_a_copied_cluster_directory_leaves_the_original(ftc_home):
    import shutil
    up_local("real")
    (pid,) = sshd_pids(ftc_home)
    shutil.copytree(ftc_home / "clusters" / "real", ftc_home / "clusters" / "backup")
    status = ftc("status", "--name", "backup")
    assert status.returncode == 1 and "records cluster 'real', not 'backup'" in only_line(status)
    down = ftc("down", "--name", "backup")
    assert down.returncode == 0, down.stderr
    assert not (ftc_home / "clusters" / "backup").exists()
    assert "nothing left running" not in down.stderr  # it cannot know: the nodes are another name's
    assert "its state records cluster 'real', whose nodes may still run: `ftc down --name real` removes them" \
        in down.stderr, down.stderr
    assert sshd_pids(ftc_home) == [pid] and state_path(ftc_home, "real").exists()
    assert ftc("down", "--name", "real").returncode == 0
    assert sshd_pids(ftc_home) == []


@pytest.mark.slow
def test_down_of_a_renamed_cluster_directory_names_the_cluster_that_still_runs(ftc_home):
    up_local("real")
    (ftc_home / "clusters" / "real").rename(ftc_home / "clusters" / "new")
    down = ftc("down", "--name", "new")
    assert down.returncode == 0 and "`ftc down --name real` removes them" in down.stderr, down.stderr
    assert len(sshd_pids(ftc_home)) == 1  # told, not guessed: the nodes run from the old name's paths
    assert ftc("down", "--name", "real").returncode == 0  # by the sshd configs under clusters/real
    assert sshd_pids(ftc_home) == []


def set_created_at(state: dict) -> None:
    state["created_at"] = "yesterday"


def set_ssh_port(state: dict) -> None:
    state["nodes"][0]["ssh_port"] = "22"


def set_spec_nodes(state: dict) -> None:
    state["spec"]["nodes"] = "1"


def set_job_pid(state: dict) -> None:
    state["jobs"] = [{"id": "j", "task": "mrpc", "remote_dir": "/x", "results_dir": "/y", "pid": True}]


@pytest.mark.slow
@pytest.mark.parametrize("spoil", [set_created_at, set_ssh_port, set_spec_nodes, set_job_pid, "directory"])
def test_a_state_of_wrong_types_or_a_directory_is_reported_in_one_line_and_down_removes_the_nodes(ftc_home, spoil):
    up_local("good")
    up_local("bad")
    bad_pid = state_of(ftc_home, "bad")["nodes"][0]["pid"]
    path = state_path(ftc_home, "bad")
    if spoil == "directory":
        path.unlink()
        path.mkdir()
        what = "cannot be read (Is a directory)"
    else:
        state = json.loads(path.read_text())
        spoil(state)
        path.write_text(json.dumps(state))
        what = "is not valid cluster state"
    one = ftc("status", "--name", "bad")
    assert one.returncode == 1 and what in only_line(one)
    every = ftc("status")
    assert every.returncode == 1 and "Traceback" not in every.stderr, every.stderr
    assert "good" in every.stdout and f"bad/state.json {what}" in every.stderr
    down = ftc("down", "--name", "bad")
    assert down.returncode == 0, down.stderr
    assert not procs.alive(bad_pid) and not (ftc_home / "clusters" / "bad").exists()
    assert len(sshd_pids(ftc_home)) == 1
    assert ftc("down", "--name", "good").returncode == 0


@pytest.mark.slow
def test_down_when_aws_cannot_be_asked_says_what_may_remain_and_a_retry_removes_it(aws, ftc_home, monkeypatch,
                                                                                   tmp_path):
    assert ftc("up", "--name", "far", "--nodes", "2", *AWS_UP).returncode == 0
    far_away = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1"}  # nothing listens; no retries
    unreachable = ftc("down", "--name", "far", env=far_away)
    line = only_line(unreachable)
    assert unreachable.returncode == 1 and line.startswith("error: AWS could not be reached ("), line
    assert "us-east-1 (tagged ftc:cluster=far) may remain; run `ftc down --name far` again" in line
    assert state_of(ftc_home, "far")["provider"] == "aws"
    status = ftc("status", "--name", "far", env=far_away)
    assert status.returncode == 0 and "Traceback" not in status.stderr, status.stderr
    assert status.stdout.count("unknown") == 2 and "AWS could not be asked" in status.stdout

    remove_aws_credentials(monkeypatch, tmp_path)
    no_credentials = ftc("down", "--name", "far")
    assert no_credentials.returncode == 1 and "AWS could not be reached (no credentials" in only_line(no_credentials)
    assert state_of(ftc_home, "far")["provider"] == "aws"

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    retry = ftc("down", "--name", "far")
    assert retry.returncode == 0 and "nothing left running" in retry.stderr, retry.stderr
    assert_nothing_left(aws.ec2(), "far")
    assert not (ftc_home / "clusters" / "far").exists()


def test_down_of_a_name_without_state_or_credentials_does_not_claim_aws_is_clean(ftc_home, monkeypatch, tmp_path):
    remove_aws_credentials(monkeypatch, tmp_path)
    proc = ftc("down", "--name", "never")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "nothing left running" not in proc.stderr
    assert "AWS was not searched (no credentials): if it ran there, `ftc down --name never --provider aws " \
           "--region us-east-1` with credentials removes" in proc.stderr
    assert not (ftc_home / "clusters" / "never").exists()

    told = ftc("down", "--name", "never", "--provider", "aws")
    assert told.returncode == 1 and "error: AWS could not be reached (no credentials" in last_line(told)
    assert state_of(ftc_home, "never")["provider"] == "aws"  # so `ftc down --name never` retries there


@pytest.mark.slow
def test_a_bad_aws_tuning_variable_on_down_is_refused_before_anything_is_removed(aws, ftc_home):
    assert ftc("up", "--name", "keep", "--nodes", "1", *AWS_UP).returncode == 0
    before = state_path(ftc_home, "keep").read_text()
    proc = ftc("down", "--name", "keep", env={"FTC_AWS_WAIT_MINUTES": "x"})
    assert proc.returncode == 2 and "FTC_AWS_WAIT_MINUTES='x' is not a number" in last_line(proc), proc.stderr
    assert state_path(ftc_home, "keep").read_text() == before  # not even marked terminating
    assert ftc("down", "--name", "keep").returncode == 0
    assert_nothing_left(aws.ec2(), "keep")

