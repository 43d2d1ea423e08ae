"""Job commands refused before they change anything: a sweep on a busy cluster, a PPN the nodes
cannot hold (local cores or the instance type), flags a command would ignore."""

import json
from pathlib import Path

import pytest
from conftest import assert_nothing_left, ftc, sshd_pids
from helpers import assert_refused, one_error, tiny_job, wait_for

from provision import procs


@pytest.mark.slow
def test_a_sweep_refused_for_a_busy_cluster_leaves_the_cluster_and_its_job_running(ftc_home, tmp_path, minilm,
                                                                                   glue_dir):
    assert ftc("up", "--name", "sw", "--nodes", "1").returncode == 0
    try:
        started = ftc("finetune", "--name", "sw", "--detach", *tiny_job(minilm, glue_dir),
                      env={"FTC_HOLD_AT_STEP": "1"})  # the job waits before its first step: it stays running
        assert started.returncode == 0, started.stderr
        state_file = ftc_home / "clusters" / "sw" / "state.json"
        before = state_file.read_text()
        job, nodes = json.loads(before)["jobs"][-1], [node["pid"] for node in json.loads(before)["nodes"]]

        sweep = ftc("sweep", "--name", "sw", "--nodes", "1", *tiny_job(minilm, glue_dir), "--yes", "1",
                    "--out", str(tmp_path / "sweep"))
        assert sweep.returncode == 3  # busy, not bad input
        assert f"cluster 'sw' is already running job {job['id']}" in one_error(sweep)
        # every node's sshd still serves (the job's own ssh sessions come and go as mpirun starts)
        assert state_file.read_text() == before and all(pid in sshd_pids(ftc_home) for pid in nodes)
        assert procs.is_same(job["pid"], job["pid_start"])  # the job itself was not touched
        assert not (tmp_path / "sweep").exists()
    finally:
        assert ftc("down", "--name", "sw").returncode == 0


def test_a_ppn_the_nodes_cannot_hold_is_refused_before_any_local_node_starts(ftc_home, minilm, glue_dir):
    run = ftc("run", "--name", "pp", "--nodes", "1", "--ppn", "512", *tiny_job(minilm, glue_dir))
    assert_refused(run, "--ppn=512: 512 ranks per node but node pp-0 (its share of this machine's cores)", ftc_home)
    sweep = ftc("sweep", "--name", "pp", "--nodes", "1,2", "--ppn", "512", *tiny_job(minilm, glue_dir))
    assert_refused(sweep, "--ppn=512: 512 ranks per node", ftc_home)
    assert sshd_pids(ftc_home) == []


@pytest.mark.slow
def test_a_ppn_the_instance_type_cannot_hold_is_refused_before_any_ec2_call(aws, ftc_home):
    proc = ftc("run", "--name", "pp", "--provider", "aws", "--instance-type", "c6i.large", "--nodes", "2",
               "--ppn", "2", "--yes", "1", "--ssh-cidr", "203.0.113.7/32")
    assert_refused(proc, "--ppn=2: 2 ranks per node but node pp-0 (c6i.large) has only 1 physical cores", ftc_home)
    assert_nothing_left(aws.ec2(), "pp")


@pytest.mark.parametrize("command, flag", [("run", "--detach"), ("sweep", "--detach"), ("sweep", "--resume")])
def test_a_flag_the_command_would_ignore_is_not_offered(ftc_home, command, flag):
    proc = ftc(command, "--name", "ig", flag)
    assert_refused(proc, f"unrecognized arguments: {flag}", ftc_home)



@pytest.mark.slow
def test_a_job_that_ended_unfetched_is_not_cancelled_nor_written_over_and_fetch_collects_it(ftc_home, cluster,
                                                                                            minilm, glue_dir):
    started = ftc("finetune", "--name", cluster, "--detach", *tiny_job(minilm, glue_dir))
    assert started.returncode == 0, started.stderr
    job = json.loads((ftc_home / "clusters" / cluster / "state.json").read_text())["jobs"][-1]
    ended = lambda: (Path(job["remote_dir"]) / "exit_code").exists() and not Path(f"/proc/{job['pid']}").exists()  # noqa: E731
    wait_for(ended, "the detached job's launch script to write its exit code and end", timeout=900)

    cancel = ftc("cancel", "--name", cluster)
    assert cancel.returncode == 0, cancel.stderr
    assert f"job {job['id']} already ended (exit code 0); `ftc fetch --name {cluster}` collects its results" \
        in cancel.stderr
    again = ftc("finetune", "--name", cluster, "--resume", "1", *tiny_job(minilm, glue_dir))
    assert again.returncode == 3 and f"cluster {cluster!r}: job {job['id']} ended (exit code 0) but its results are " \
        f"not home yet; `ftc fetch --name {cluster}` collects them, then start the next job" in again.stderr
    fetched = ftc("fetch", "--name", cluster)
    assert fetched.returncode == 0, fetched.stderr
    record = json.loads((Path(job["results_dir"]) / "run.json").read_text())
    assert record["status"] == "finished" and (Path(job["results_dir"]) / "results.json").exists()


@pytest.mark.slow
def test_resume_of_a_job_stopped_before_its_first_checkpoint_is_refused_before_launch(ftc_home, minilm, glue_dir):
    assert ftc("up", "--name", "nock", "--nodes", "1").returncode == 0
    try:
        started = ftc("finetune", "--name", "nock", "--detach", *tiny_job(minilm, glue_dir),
                      env={"FTC_HOLD_AT_STEP": "1"})  # held before its first step: no epoch, no checkpoint
        assert started.returncode == 0, started.stderr
        job = json.loads((ftc_home / "clusters" / "nock" / "state.json").read_text())["jobs"][-1]
        wait_for((Path(job["remote_dir"]) / "held").exists, "the job to hold before its first step")
        assert ftc("cancel", "--name", "nock").returncode == 0
        resumed = ftc("finetune", "--name", "nock", "--resume", "1", *tiny_job(minilm, glue_dir))
        assert resumed.returncode == 2
        assert f"--resume: job {job['id']} saved no checkpoint" in one_error(resumed)
        assert len(json.loads((ftc_home / "clusters" / "nock" / "state.json").read_text())["jobs"]) == 1
    finally:
        assert ftc("down", "--name", "nock").returncode == 0
