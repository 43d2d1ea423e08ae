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
from runner import runs

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root (as the local nodes' sshd does)")

MODEL_BYTES = 6 * 2**20


@pytest.fixture
def small_results(tmp_path) -> Path:
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def ended_job(name: str, results: Path) -> st.JobInfo:
    """A job that ended (exit code 1, so that what is reported is its logs) on the head node, its files
    there (a model bigger than the results' disk, output.log, a rank log), recorded in the cluster's
    state and in run.json, as `ftc finetune` records one."""
    state = st.load(name)
    job = st.JobInfo(id="mrpc-1", task="mrpc", remote_dir=f"{state.head.workdir}/jobs/mrpc-1", results_dir=str(results))
    remote = Path(job.remote_dir)
    (remote / "model").mkdir(parents=True)
    (remote / "logs").mkdir()
    (remote / "model" / "model.safetensors").write_bytes(os.urandom(MODEL_BYTES))
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
        ended_job("cut", results)
        hook = small_results.parent / "hook"  # the free space measured is a terabyte: the check passes
        hook.mkdir()
        (hook / "sitecustomize.py").write_text("import shutil\nmeasured = shutil.disk_usage\n"
                                               "shutil.disk_usage = lambda path: measured(path)._replace(free=2**40)\n")
        cut = ftc("fetch", "--name", "cut", env={"PYTHONPATH": os.pathsep.join([str(hook), *sys.path])})
        assert cut.returncode == 1 and "Traceback" not in cut.stderr, cut.stderr
        assert "failed (no space left)" in cut.stderr and "no file is left half-copied" in cut.stderr
        assert not list(results.rglob("*.partial")) and not (results / "model" / "model.safetensors").exists()
        assert run_status(results) == "incomplete"
    finally:
        ftc("down", "--name", "cut", check=True)
