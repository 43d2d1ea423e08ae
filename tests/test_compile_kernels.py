"""Kernels that outlive the cluster, on real local nodes: a compiled job's kernels come home into
FTC_HOME/kernels, the next cluster's first job gets them and starts warm from them, and a cache made
for another setting, or one that cannot be read, is one line each while the job trains; inductor's precompiled
headers travel with the kernels to a job of another key, which compiles without building them again, in place of
one a build cut short left on its node. A
compiled job under DDP runs its first steps eager, then compiled, and notes both rates. And a cold compile runs
beside the training, whose steps run compiled once its kernels are in the cache."""

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import ftc
from helpers import toy_csv, wait_for
from test_train import results_of_run

from runner.node.compile_policy import COMPILED_FILE
from runner.node.compiling import ASIDE_DIR, ASIDE_INPUTS, ASIDE_LOG, ASIDE_OUTCOME, Aside, aside_outcome, aside_stopped
from runner.node.distenv import listen_port
from runner.node.inductor_files import HEADERS_DIR, WHOLE_MARK
from runner.node.protocol import HELD_FILE, KERNEL_CACHE_DIR, RELEASE_FILE, RESULTS_FILE


@pytest.mark.slow
def test_a_new_cluster_starts_warm_from_kernels_an_earlier_one_compiled_and_a_foreign_cache_is_one_line(
        ftc_home, tmp_path, tiny_bert):
    job = ["--train-file", str(toy_csv(tmp_path / "train.csv", 48)),
           "--validation-file", str(toy_csv(tmp_path / "dev.csv", 16, offset=1)), "--model", tiny_bert,
           "--text-columns", "review", "--label-column", "stars", "--epochs", "1", "--batch-size", "1", "--compile", "on"]

    def one_cluster_one_job(name: str) -> str:
        assert ftc("up", "--name", name, "--nodes", "1").returncode == 0
        try:
            done = ftc("finetune", "--name", name, *job, timeout=900)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            return done.stdout
        finally:
            assert ftc("down", "--name", name).returncode == 0

    first = one_cluster_one_job("k1")
    assert "kernels: cold (compiled on the cluster)" in first
    assert "compile: each of 2 BertLayer blocks; the rest runs eager" in first
    # the model traced once: no float of its made dynamo start again, nor config.problem_type at step 2
    assert results_of_run(ftc_home, "k1")["compile_graphs"]["retraced"] == 0
    (kept,) = (ftc_home / "kernels").glob("*.json")
    key = json.loads(kept.read_text())["key"]
    assert key["threads"] == results_of_run(ftc_home, "k1")["threads_per_rank"] and key["shapes"] == "dynamic"
    assert kept.with_suffix(".tgz").stat().st_size > 0
    first_note = json.loads(kept.read_text())["note"]
    assert "cold_s" in first_note and "warm_s" not in first_note
    # no note held a rank's eager rate: the job's first steps ran eager, and both rates came home
    assert "compile: the first 23 steps run eager, to note a rank's eager rate beside the compiled one" in first
    ((layout, rates),) = first_note["rates"].items()
    assert layout == "1 ranks on 1 node(s), gradient none" and rates.keys() == {"eager_tokens_per_s", "compiled_tokens_per_s"}
    assert not list((ftc_home / "runs" / "k1").glob("*/kernels"))  # moved home, not kept twice

    # beside them at home: kernels of another torch, and a cache whose key file is not JSON
    (ftc_home / "kernels" / "foreign.json").write_text(json.dumps({"key": key | {"torch": "0.0.1"}}))
    (ftc_home / "kernels" / "broken.json").write_text("{not json")
    for name in ("foreign", "broken"):
        shutil.copy(kept.with_suffix(".tgz"), ftc_home / "kernels" / f"{name}.tgz")

    second = one_cluster_one_job("k2")
    assert "kernels: warm (from an earlier cluster)" in second and "steps run eager" not in second
    assert ("kernels: the shipped cache foreign was compiled for another setting (torch '0.0.1' here "
            f"{key['torch']!r}); ignored, compiling without it") in second
    assert "kernels: the shipped cache broken cannot be read; ignored, compiling without it" in second
    results = results_of_run(ftc_home, "k2")
    assert (results["compile_cache"], results["compile_cache_from"]) == ("warm", "an earlier cluster")
    assert results["compile_graphs"]["cached"] > 0 and results["compile_graphs"]["retraced"] == 0
    assert results["eval_accuracy"] is not None
    # what the new cluster measured of the kernels came home into their note, beside the first's cold compile
    home_note = json.loads(kept.read_text())["note"]
    assert home_note["warm_s"] > 0 and home_note["cold_s"] > 0, home_note

    listed = json.loads(ftc("runs", "--json").stdout)
    assert {(r["cluster"], r["compile"], r["kernels"]) for r in listed} == {
        ("k1", "on", "cold (compiled on the cluster)"), ("k2", "on", "warm (from an earlier cluster)")}
    shown = ftc("runs", "show", next(r["id"] for r in listed if r["cluster"] == "k2"), env={"COLUMNS": "200"})
    assert "warm (from an earlier cluster)" in shown.stdout

    a_job_of_another_key_takes_the_shipped_headers_in_place_of_ones_cut_short(ftc_home, job, kept, key)


def a_job_of_another_key_takes_the_shipped_headers_in_place_of_ones_cut_short(ftc_home, job, kept, key):
    # inductor's precompiled headers came home with the kernels (their lock files did not) ...
    with tarfile.open(kept.with_suffix(".tgz")) as tar:
        packed = {member.name: member for member in tar.getmembers()}
        (header,) = [name for name in packed if name.startswith(f"{HEADERS_DIR}/") and name.endswith(".gch")]
        # marked whole at its size by the job that compiled with it
        assert json.loads(tar.extractfile(packed[header + WHOLE_MARK]).read()) == {"bytes": packed[header].size}
        cut_short = tar.extractfile(packed[header]).read(1 << 20)  # what g++ leaves of a build cut short: a prefix
    assert not [name for name in packed if "locks/" in name]
    # ... and a job of another key (another batch) on a new cluster whose node holds that header cut short (an
    # earlier job cancelled in its compile): the prefix goes, the shipped whole one comes, nothing is built again
    assert ftc("up", "--name", "k3", "--nodes", "1").returncode == 0
    try:
        node_dir = Path(json.loads((ftc_home / "clusters" / "k3" / "state.json").read_text())["nodes"][0]["workdir"])
        left = node_dir / "cache" / f"inductor-{results_of_run(ftc_home, 'k1')['stack']}-{key['threads']}-threads" / header
        left.parent.mkdir(parents=True)
        left.write_bytes(cut_short)
        third = ftc("finetune", "--name", "k3", *job[:-4], "--batch-size", "2", "--compile", "on", timeout=900)
        assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
        assert "kernels: cold (compiled on the cluster)" in third.stdout
        assert (f"kernels: inductor's precompiled header {left.name} removed: no job that compiled with it ended (a "
                "build cut short?); inductor builds it again") in third.stdout
        assert f"kernels: inductor's precompiled headers taken from the shipped cache {kept.stem}" in third.stdout
        assert (left.stat().st_mtime, left.stat().st_size) == (packed[header].mtime, packed[header].size)  # g++ took
        # it as unpacked: nothing rebuilt it
    finally:
        assert ftc("down", "--name", "k3").returncode == 0


def without_kernel_places(env) -> dict:
    """A rank's environment run by hand: its kernel cache in its output directory, no node's."""
    return {name: value for name, value in env.items() if name not in ("TORCHINDUCTOR_CACHE_DIR", "FTC_NODE_DIR")}


@pytest.mark.slow
def test_a_compiled_job_under_ddp_runs_its_first_steps_eager_then_compiled_and_notes_both_rates(
        glue_dir, tiny_bert, tmp_path):
    """Two ranks whose gradients cross through DDP (`--allreduce overlap`), compiled, no note yet: the first
    steps run under the compiler's force_eager stance, which DDP's module lets through, then compiled, and
    the note holds a rank's rate both ways."""
    env = without_kernel_places(os.environ)
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(listen_port()), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
            "OMP_NUM_THREADS": "1"}
    # 100 rows, one a rank a step: 50 steps, 23 of them eager, then 3 to warm up and 24 timed compiled
    ranks = [subprocess.Popen([sys.executable, "-m", "runner.node.train", "--task", "mrpc", "--model", tiny_bert,
                               "--data-dir", str(glue_dir), "--max-train-samples", "100", "--batch-size", "1",
                               "--epochs", "1", "--no-eval", "--no-save", "--allreduce", "overlap", "--compile", "on",
                               "--output-dir", str(tmp_path / f"rank{rank}")],
                              env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    logs = [rank.communicate(timeout=900)[0] for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    assert "compile: the first 23 steps run eager, to note a rank's eager rate beside the compiled one" in logs[0]
    results = json.loads((tmp_path / "rank0" / RESULTS_FILE).read_text())
    assert results["allreduce"] == "overlap" and results["compile_graphs"]["compiled"] > 0
    (note,) = json.loads((tmp_path / "rank0" / KERNEL_CACHE_DIR / COMPILED_FILE).read_text()).values()
    ((layout, rates),) = note["rates"].items()
    assert layout.startswith("2 ranks on 1 node(s)") and rates.keys() == {"eager_tokens_per_s", "compiled_tokens_per_s"}


@pytest.mark.slow
def test_a_cold_compile_runs_beside_the_training_whose_steps_run_compiled_once_its_kernels_are_in_the_cache(
        glue_dir, tiny_bert, tmp_path):
    """A rank of 2 threads, compiled, its cache cold, the compile aside from 2 threads: the node's first rank starts
    the program aside on its last core. The job is held before its first step until the program says it is done;
    from that step the rank runs compiled, its own compile takes every graph from the cache, and the note says a
    warm compile."""
    env = without_kernel_places(os.environ)
    out = tmp_path / "job"
    rank = subprocess.Popen([sys.executable, "-m", "runner.node.train", "--task", "mrpc", "--model", tiny_bert,
                             "--data-dir", str(glue_dir), "--max-train-samples", "64", "--batch-size", "2",
                             "--epochs", "1", "--no-eval", "--no-save", "--compile", "on", "--compile-aside-from", "2",
                             "--hold-at-step", "1", "--output-dir", str(out)],
                            env=env | {"OMP_NUM_THREADS": "2"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    aside = out / ASIDE_DIR / "node-0"
    try:
        wait_for(lambda: (out / HELD_FILE).exists() and (aside / ASIDE_OUTCOME).exists(),
                 "the job held before its first step and the compile aside done", timeout=600)
        (out / RELEASE_FILE).touch()
        log = rank.communicate(timeout=600)[0]
    finally:
        rank.kill()
    assert rank.returncode == 0, log[-3000:]
    assert f"compile: cold: the kernels compile beside the training on core {sorted(os.sched_getaffinity(0))[-1]}" in log
    assert "steps run compiled from step 1" in log, log[-3000:]
    outcome = json.loads((aside / ASIDE_OUTCOME).read_text())
    assert outcome["ok"] and outcome["seconds"] > 0 and not (aside / ASIDE_INPUTS).exists()
    results = json.loads((out / RESULTS_FILE).read_text())
    # the rank's own compile found each graph the program aside made, whatever the widths met: nothing compiled twice
    assert results["compile_cache"] == "cold" and results["compile_graphs"]["compiled"] == 0
    assert results["compile_graphs"]["cached"] > 0
    (note,) = json.loads((out / KERNEL_CACHE_DIR / COMPILED_FILE).read_text()).values()
    assert "warm_s" in note and "cold_s" not in note  # the rank's compile was a warm one
    # its eager steps ran a core short, beside the program aside: no eager rate of a rank's is noted from them
    ((layout, rates),) = note["rates"].items()
    assert layout == "1 ranks on 1 node(s), gradient none" and rates.keys() == {"compiled_tokens_per_s"}


@pytest.mark.slow
def test_a_compile_aside_that_ended_without_a_word_failed_and_one_still_running_at_the_end_is_stopped_whole(tmp_path):
    """The node's first rank speaks for a program aside that exited without an outcome (its other ranks read the
    file); one still running when the job ends is stopped with the processes it started."""
    silent = Aside(tmp_path / "silent", threads=2, process=subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"]))
    silent.process.wait()
    assert aside_outcome(silent) == {"ok": False, "error": f"it exited with 3, see {tmp_path / 'silent' / ASIDE_LOG}"}
    assert aside_outcome(Aside(tmp_path / "silent", threads=2)) == aside_outcome(silent)  # another local rank's view
    (tmp_path / "busy").mkdir()
    busy = Aside(tmp_path / "busy", threads=2, process=subprocess.Popen(
        ["bash", "-c", f"sleep 600 & echo $! > {tmp_path / 'busy' / 'child'}; wait"], start_new_session=True))
    pid_file = tmp_path / "busy" / "child"
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), "the program aside's own child started")
    child = int(pid_file.read_text())
    assert aside_outcome(busy) is None and not aside_stopped(busy)

    def stopped() -> bool:
        try:
            return Path(f"/proc/{child}/stat").read_text().split()[2] == "Z"  # a zombie not reaped yet
        except FileNotFoundError:
            return True
    wait_for(stopped, "the program aside's child stopped with it")
