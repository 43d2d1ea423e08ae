"""Bringing a finished job's results home onto a disk too small for them (a small tmpfs): the free
space is checked against the sizes the node reports before anything is copied, the run is marked
incomplete, no file is left half-copied, and `ftc fetch` finishes the job once there is room."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ftc

from provision import state as st
from provision.ssh import connect
from runner import runs
from runner.node.protocol import CHECKPOINT_FILE
from runner.transfer import copy_checkpoint

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root (as the local nodes' sshd does)")]

MODEL_BYTES = 6 * 2**20


@pytest.fixture
def small_results(tmp_path) -> Path:
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def ended_job(name: str, results: Path, model_bytes: int = MODEL_BYTES, checkpoint_bytes: int = 0) -> st.JobInfo:
    """A job that ended (exit code 1, so that what is reported is its logs) on the head node, its files
    there (a model bigger than the results' disk, output.log, a rank log, a last checkpoint when
    asked), recorded in the cluster's state and in run.json, as `ftc finetune` records one."""
    state = st.load(name)
    job = st.JobInfo(id="mrpc-1", task="mrpc", remote_dir=f"{state.head.workdir}/jobs/mrpc-1", results_dir=str(results))
    remote = Path(job.remote_dir)
    (remote / "model").mkdir(parents=True)
    (remote / "logs").mkdir()
    (remote / "model" / "model.safetensors").write_bytes(os.urandom(model_bytes))
    if checkpoint_bytes:
        (remote / "checkpoints").mkdir()
        (remote / CHECKPOINT_FILE).write_bytes(os.urandom(checkpoint_bytes))
    (remote / "output.log").write_text("done\n")
    (remote / "logs" / "rank0.log").write_text("rank 0 done\n")
    (remote / "exit_code").write_text("1\n")
    state.jobs.append(job)
    st.save(state)
    runs.record_start(state, job, {"task": "mrpc", "model": "m", "nodes": 1, "ranks_per_node": 1})
    return job


def run_status(results: Path) -> str:
    listed = json.loads(ftc("runs", "--json", check=True).stdout)
    return next(r["status"] for r in listed if r["results_dir"] == str(results))


def test_fetch_onto_a_disk_too_small_is_refused_marked_incomplete_and_finished_later(ftc_home, small_results):
    ftc("up", "--name", "fetch", "--nodes", "1", "--no-bootstrap", check=True)
    try:
        results = small_results / "mrpc-1"
        ended_job("fetch", results)
        short = ftc("fetch", "--name", "fetch")
        assert short.returncode == 1 and "Traceback" not in short.stderr, short.stderr
        assert len(short.stderr.strip().splitlines()) == 1, short.stderr
        assert f"need 7.0 MB in {results}, which has" in short.stderr
        assert "`ftc fetch --name fetch` copies what is missing" in short.stderr
        assert not (results / "model").exists() and not list(results.rglob("*.partial"))
        assert run_status(results) == "incomplete"

        subprocess.run(["mount", "-o", "remount,size=32m", str(small_results)], check=True)
        again = ftc("fetch", "--name", "fetch")
        assert again.returncode == 1 and "Traceback" not in again.stderr, again.stderr  # the job's own failure, shown
        assert (results / "model" / "model.safetensors").stat().st_size == MODEL_BYTES
        assert (results / "logs" / "rank0.log").read_text() == "rank 0 done\n"
        assert run_status(results) == "failed"
    finally:
        ftc("down", "--name", "fetch", check=True)


def test_a_copy_cut_short_by_a_full_disk_leaves_no_partial_file_and_an_incomplete_run(ftc_home, small_results):
    """The space was there when measured and is taken meanwhile (another program fills the disk): the
    copy fails, says so in one line, and leaves nothing that looks complete."""
    ftc("up", "--name", "cut", "--nodes", "1", "--no-bootstrap", check=True)
    try:
        results = small_results / "mrpc-1"
        ended_job("cut", results, checkpoint_bytes=256 * 2**20)  # paramiko's prefetch thread still sends when the disk fills
        hook = small_results.parent / "hook"  # the free space measured is a terabyte: the check passes
        hook.mkdir()
        (hook / "sitecustomize.py").write_text("import shutil\nmeasured = shutil.disk_usage\n"
                                               "shutil.disk_usage = lambda path: measured(path)._replace(free=2**40)\n")
        cut = ftc("fetch", "--name", "cut", env={"PYTHONPATH": os.pathsep.join([str(hook), *sys.path])})
        assert cut.returncode == 1 and "Traceback" not in cut.stderr and "Exception in thread" not in cut.stderr, cut.stderr
        assert len(cut.stderr.strip().splitlines()) == 1, cut.stderr
        assert "failed (no space left)" in cut.stderr and "no file is left half-copied" in cut.stderr
        assert not list(results.rglob("*.partial")) and not (results / "model" / "model.safetensors").exists()
        assert not (results / CHECKPOINT_FILE).exists()
        assert run_status(results) == "incomplete"
    finally:
        ftc("down", "--name", "cut", check=True)


def test_fetch_counts_the_checkpoint_in_the_free_space_it_needs(ftc_home, small_results):
    """Room for the results but not for the checkpoint: nothing is copied, in one line."""
    ftc("up", "--name", "ckpt", "--nodes", "1", "--no-bootstrap", check=True)
    try:
        results = small_results / "mrpc-1"
        ended_job("ckpt", results, model_bytes=2**10, checkpoint_bytes=MODEL_BYTES)
        short = ftc("fetch", "--name", "ckpt")
        assert short.returncode == 1 and "Traceback" not in short.stderr and "Exception in thread" not in short.stderr
        assert len(short.stderr.strip().splitlines()) == 1, short.stderr
        assert f"need 7.0 MB in {results}, which has" in short.stderr
        assert not (results / CHECKPOINT_FILE).exists() and not (results / "model").exists()
        assert not list(results.rglob("*.partial"))

        subprocess.run(["mount", "-o", "remount,size=32m", str(small_results)], check=True)
        again = ftc("fetch", "--name", "ckpt")
        assert again.returncode == 1 and "Traceback" not in again.stderr, again.stderr  # the job's own failure, shown
        assert (results / CHECKPOINT_FILE).stat().st_size == MODEL_BYTES
        assert run_status(results) == "failed"
    finally:
        ftc("down", "--name", "ckpt", check=True)


def test_a_checkpoint_with_no_room_while_the_job_runs_is_skipped_in_one_line(ftc_home, small_results, capsys):
    ftc("up", "--name", "room", "--nodes", "1", "--no-bootstrap", check=True)
    try:
        results = small_results / "mrpc-1"
        job = ended_job("room", results, model_bytes=2**10, checkpoint_bytes=MODEL_BYTES)
        state = st.load("room")
        with connect(state, state.head) as conn:
            assert copy_checkpoint(conn, job) is None
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert f"the checkpoint of job mrpc-1 needs 7.0 MB in {results / 'checkpoints'}, which has" in err
        assert "not copied, the job goes on" in err
        assert not list(results.rglob("*.pt*"))
    finally:
        ftc("down", "--name", "room", check=True)
