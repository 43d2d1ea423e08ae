"""A detached job is known by its pid and start time, recorded at launch: `ftc cancel` and
`ftc down` stop it (and only it), wherever its processes were reparented."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FTC, ftc
from helpers import following, wait_for

from provision import procs
from provision import state as st

pytestmark = pytest.mark.slow


def job_processes(home: Path) -> list[int]:
    """Live processes of a job under this FTC_HOME: the launch script, mpirun, the ranks."""
    found = []
    for pid in procs.pids():
        cmdline = procs.cmdline(pid)
        if str(home).encode() in cmdline and (b"launch.sh" in cmdline or b"runner.node.train" in cmdline):
            found.append(pid)
    return [pid for pid in found if procs.alive(pid)]


def start_detached(home: Path, minilm: str, glue_dir: Path) -> dict:
    assert ftc("up", "--name", "jp", "--nodes", "1").returncode == 0
    started = ftc("finetune", "--name", "jp", "--detach", "--task", "mrpc", "--model", minilm,
                  "--data-dir", str(glue_dir), "--epochs", "10")
    assert started.returncode == 0, started.stderr
    job = json.loads((home / "clusters" / "jp" / "state.json").read_text())["jobs"][-1]
    assert procs.is_same(job["pid"], job["pid_start"])  # recorded at launch: the pid and its start time
    return job


def test_down_stops_a_detached_job(ftc_home, minilm, glue_dir):
    start_detached(ftc_home, minilm, glue_dir)
    assert ftc("down", "--name", "jp").returncode == 0
    deadline = time.monotonic() + 30
    while job_processes(ftc_home):  # SIGTERM, then SIGKILL after the grace period
        assert time.monotonic() < deadline, job_processes(ftc_home)
        time.sleep(0.1)


def test_cancel_stops_a_detached_job(ftc_home, minilm, glue_dir):
    start_detached(ftc_home, minilm, glue_dir)
    try:
        cancel = ftc("cancel", "--name", "jp")
        assert cancel.returncode == 0 and "cancelled" in cancel.stderr, cancel.stderr
        # cancel signals the job's process group; the ranks are not in it (mpirun starts them through
        # ssh, under hydra's proxy), and end when that proxy loses mpirun: cancel does not wait for it
        wait_for(lambda: not job_processes(ftc_home), "the job's processes to end")
        fetched = ftc("fetch", "--name", "jp")  # a cancelled job is no failure: its files come home, exit 0
        assert fetched.returncode == 0 and " was cancelled; what it wrote before is home" in fetched.stderr, fetched.stderr
        job = json.loads((ftc_home / "clusters" / "jp" / "state.json").read_text())["jobs"][-1]
        assert json.loads((Path(job["results_dir"]) / "run.json").read_text())["status"] == "cancelled"
    finally:
        ftc("down", "--name", "jp", check=True)


def test_job_in_an_ftc_home_with_a_space_and_shell_characters_runs_and_runs_nothing_else(ftc_home, tmp_path, monkeypatch,
                                                                                         minilm, glue_dir):
    marker = tmp_path / "ran"
    monkeypatch.setenv("FTC_HOME", str(tmp_path / f"my ftc $(touch {marker})"))  # ftc_home cleared the other FTC_*
    assert ftc("up", "--name", "odd", "--nodes", "1").returncode == 0
    try:
        job = ftc("finetune", "--name", "odd", "--task", "mrpc", "--model", minilm, "--data-dir", str(glue_dir),
                  "--max-eval-samples", "64", "--max-train-samples", "16", "--epochs", "1")
        assert job.returncode == 0, job.stderr[-2000:]
        assert list((tmp_path / f"my ftc $(touch {marker})" / "runs" / "odd").glob("mrpc-*/results.json"))
        assert "eval_accuracy" in job.stdout
    finally:
        assert ftc("down", "--name", "odd").returncode == 0
    assert not marker.exists()


def test_a_follower_whose_node_freezes_says_so_and_exits_non_zero(ftc_home, minilm, glue_dir):
    job = start_detached(ftc_home, minilm, glue_dir)
    head = json.loads((ftc_home / "clusters" / "jp" / "state.json").read_text())["nodes"][0]
    follower = subprocess.Popen([*FTC, "logs", "--name", "jp", "-f"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env={**os.environ, "FTC_FOLLOW_SILENCE_S": "10"})
    frozen: list[int] = []
    try:
        following(follower)  # in its loop, reading the job's output through the head node's sshd
        # the node's sshd and all below it: the follower's session, and the rank mpirun reached through ssh
        frozen = [head["pid"], *procs.descendants(head["pid"])]
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        _, err = follower.communicate(timeout=300)  # a hang guard only: the follower decides after 10 s of silence
        assert follower.returncode == 1, err
        assert f"{head['name']} stopped answering" in err and "Reattach when it answers: `ftc logs --name jp -f`" in err
        assert "Traceback" not in err
        assert procs.is_same(job["pid"], job["pid_start"])  # the follower left: the job's launch script runs on
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        follower.kill()
        ftc("down", "--name", "jp", check=True)


def test_reattaching_to_a_node_whose_sshd_is_frozen_gives_up_within_the_silence_limit(ftc_home):
    """The head node's sshd is stopped before the follower connects (it accepts, then says nothing):
    the follower gives up within about the silence limit, says so in one line, and exits non-zero."""
    ftc("up", "--name", "frozen", "--nodes", "1", "--no-bootstrap", check=True)
    state = st.load("frozen")
    state.jobs.append(st.JobInfo(id="mrpc-1", task="mrpc", remote_dir=f"{state.head.workdir}/jobs/mrpc-1",
                                 results_dir=str(ftc_home / "results")))  # recorded running
    st.save(state)
    os.kill(state.head.pid, signal.SIGSTOP)
    try:
        # a hang guard only: the sshd stays stopped for the whole command, which gives up after 10 s
        follower = ftc("logs", "--name", "frozen", "-f", env={"FTC_FOLLOW_SILENCE_S": "10"}, timeout=300)
        assert follower.returncode == 1, follower.stderr
        err = follower.stderr.strip().splitlines()[-1]
        assert "the node does not answer: no SSH within 10 s" in err, follower.stderr
        assert "Reattach when it answers: `ftc logs --name frozen -f`" in err
        assert "Traceback" not in follower.stderr
    finally:
        os.kill(state.head.pid, signal.SIGCONT)
        ftc("down", "--name", "frozen", check=True)


def test_a_sweep_of_a_nodes_directory_finds_what_works_there_and_never_this_command_or_its_shell(tmp_path):
    node, elsewhere = tmp_path / "node", tmp_path / "elsewhere"
    (node / "home").mkdir(parents=True)
    elsewhere.mkdir()
    inside = subprocess.Popen(["sleep", "600"], cwd=node / "home")
    outside = subprocess.Popen(["sleep", "600"], cwd=elsewhere)
    # a shell working in the node's directory runs the sweep, as a user's shell that ran `ftc down` there
    sweep = (f"import os, sys; sys.path.insert(0, {str(Path(__file__).parents[1])!r}); from provision import procs; "
             f"print(os.getppid(), os.getpid(), *procs.working_in([{str(node)!r}]))")
    try:
        shell = subprocess.run(["sh", "-c", '"$0" -c "$1"; true', sys.executable, sweep], cwd=node,
                               capture_output=True, text=True, check=True, timeout=60)
        shell_pid, sweeper, *found = (int(pid) for pid in shell.stdout.split())
        assert inside.pid in found and outside.pid not in found
        assert shell_pid not in found and sweeper not in found
        assert procs.ancestors(os.getpid())[0] == os.getppid() and 1 not in procs.ancestors(os.getpid())
    finally:
        for proc in (inside, outside):
            proc.kill()
            proc.wait()
