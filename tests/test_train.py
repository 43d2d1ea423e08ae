"""The runner end to end: real 2-node training on a local cluster through the rendered
mpirun script, with the packaged MiniLM model and a slice of real MRPC."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FTC, ftc
from helpers import RESULT_FIELDS, following, held_job

from provision import procs
from runner.node.protocol import SPOT_NOTICE_ENV
from runner.node.spot import IMDS_V2, SpotReader


def job_flags(model: str, glue_dir: Path, samples: int = 256, epochs: int = 2, lr: str = "5e-5") -> list[str]:
    return ["--task", "mrpc", "--model", model, "--data-dir", str(glue_dir),
            "--max-eval-samples", "64", "--max-train-samples", str(samples),
            "--epochs", str(epochs), "--lr", lr]


def state_of(home: Path) -> dict:
    return json.loads((home / "clusters" / "tr" / "state.json").read_text())


def results_of_run(home: Path, name: str) -> dict:
    """The results.json of the one run of cluster `name` (they outlive the cluster)."""
    found = list((home / "runs" / name).glob("*/results.json"))
    assert len(found) == 1, found
    return strict_json(found[0].read_text())


def strict_json(text: str):
    """JSON as strict parsers read it: NaN, Infinity and -Infinity are refused (ftc writes none)."""
    def refuse(constant: str):
        raise AssertionError(f"non-standard JSON constant {constant} in {text[:200]}")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.slow
def test_world_size_mismatch_aborts_before_training(glue_dir, minilm):
    proc = subprocess.run([sys.executable, "-m", "runner.node.train", "--task", "mrpc", "--model", minilm,
                           "--data-dir", str(glue_dir)], capture_output=True, text=True,
                          env={**os.environ, "FTC_WORLD_SIZE": "2"}, timeout=120)
    assert proc.returncode != 0
    assert "world size 1 from the launcher's environment, but 2 ranks were launched" in proc.stderr


@pytest.mark.slow
def test_compile_auto_weighs_what_this_node_measured_and_an_eager_job_notes_its_rate(glue_dir, tiny_bert, tmp_path):
    node = tmp_path / "node"

    def job(name: str, compile_mode: str, steps: int) -> dict:
        out = tmp_path / name
        proc = subprocess.run([sys.executable, "-m", "runner.node.train", "--task", "mrpc", "--model", tiny_bert,
                               "--data-dir", str(glue_dir), "--output-dir", str(out), "--max-train-samples", "64",
                               "--batch-size", "8", "--epochs", "4", "--max-steps", str(steps), "--compile",
                               compile_mode, "--no-eval", "--no-save"], capture_output=True, text=True, timeout=600,
                              env={**os.environ, "FTC_NODE_DIR": str(node)})
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return strict_json((out / "results.json").read_text())

    job("smoke", "off", 4)  # too few steady steps to note a rate by
    assert not list(node.glob("cache/inductor-*/ftc-compiled.json"))
    job("eager", "off", 24)
    (note_file,) = node.glob("cache/inductor-*/ftc-compiled.json")  # the node's, outside the job's folder
    ((signature, noted),) = json.loads(note_file.read_text()).items()
    ((layout, rates),) = noted["rates"].items()
    assert layout == "1 ranks on 1 node(s), gradient none"
    assert set(rates) == {"eager_tokens_per_s"} and rates["eager_tokens_per_s"] > 0
    # As if this node had compiled these kernels before, at a cost their 4 steps cannot save:
    noted.update(cold_s=900.0, warm_s=300.0)
    rates["compiled_tokens_per_s"] = rates["eager_tokens_per_s"] * 1.5
    note_file.write_text(json.dumps({signature: noted}))
    auto = job("auto", "auto", 4)
    assert auto["compile"].startswith("off (measured on this node: a warm compile 300 s; a rank's steps "), auto["compile"]
    assert auto["compile_cache"] == "none"


@pytest.mark.slow
def test_finetune_follow_detach_reattach_and_results(ftc_home, cluster, tiny_bert, glue_dir):
    render = ftc("finetune", "--name", cluster, "--render-only", *job_flags(tiny_bert, glue_dir))
    assert render.returncode == 0 and "mpirun -f" in render.stdout and "-n 2 -ppn 1" in render.stdout
    two_flows = ftc("finetune", "--name", cluster, "--render-only", "--flows", "2", *job_flags(tiny_bert, glue_dir))
    assert re.search(r"^export GLOO_SOCKET_IFNAME=(\w+),\1$", two_flows.stdout, re.M), two_flows.stdout

    # gloo with two connections per peer, the gradient as PowerSGD's factors: the job trains (a rate at
    # which the tiny model's loss clearly falls) and its run records both
    started = ftc("finetune", "--name", cluster, "--detach", "--flows", "2", "--grad-compress", "powersgd",
                  *job_flags(tiny_bert, glue_dir, epochs=3, lr="1e-3"), env={"FTC_HOLD_AT_STEP": "2"})
    assert started.returncode == 0 and "it runs on without this command" in started.stderr, started.stderr
    follower = subprocess.Popen([*FTC, "logs", "--name", cluster, "-f"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    job_dir = held_job(ftc_home, cluster, follower)  # the job is training: now the follower goes away
    following(follower)
    follower.send_signal(signal.SIGINT)
    out, err = follower.communicate(timeout=60)
    assert follower.returncode == 0 and "detached" in err and "ftc logs --name tr -f" in err
    assert state_of(ftc_home)["jobs"][-1]["state"] == "running"
    assert "running" in ftc("status", "--name", cluster).stdout
    (job_dir / "release").touch()

    again = ftc("logs", "--name", cluster, "-f", timeout=900)
    assert again.returncode == 0, again.stderr
    assert "[0]" in again.stdout and "epoch 3 dev eval_accuracy" in again.stdout
    job = state_of(ftc_home)["jobs"][-1]
    assert job["state"] == "finished"
    results_dir = Path(job["results_dir"])
    results = json.loads((results_dir / "results.json").read_text())
    assert RESULT_FIELDS <= set(results), RESULT_FIELDS - set(results)
    assert results["world_size"] == 2 and results["nodes"] == 2 and results["backend"] == "gloo"
    assert results["train_samples"] == 256 and len(results["epoch_metrics"]) == 3
    losses = [e["train_loss"] for e in results["epoch_metrics"]]
    assert losses[-1] < losses[0], losses
    assert 0 <= results["eval_accuracy"] <= 1 and 0 <= results["eval_f1"] <= 1
    assert (results_dir / "model" / "config.json").exists() and (results_dir / "model" / "model.safetensors").exists()
    assert {p.name for p in (results_dir / "logs").iterdir()} == {"rank0.log", "rank1.log"}
    assert "finished" in ftc("status", "--name", cluster).stdout
    run = json.loads((results_dir / "run.json").read_text())
    assert run["flows"] == 2 and run["grad_compress"] == results["grad_compress"] == "powersgd"
    assert_no_secrets(ftc_home, [results_dir, Path(job["remote_dir"])], again.stdout + again.stderr)


def assert_no_secrets(home: Path, directories: list[Path], output: str) -> None:
    """Rendered scripts, logs and results hold no private key (nor a line of one)."""
    keys = [home / "clusters" / "tr" / "keys" / name for name in ("access", "internal")]
    secret_lines = [line for key in keys for line in key.read_text().splitlines()[1:-1] if len(line) > 20]
    assert secret_lines
    texts = [output] + [p.read_text(errors="replace") for d in directories for p in d.rglob("*")
                        if p.is_file() and p.suffix not in (".safetensors", ".pt", ".bin")]
    for text in texts:
        assert "PRIVATE KEY" not in text
        assert not any(line in text for line in secret_lines)


@pytest.mark.slow
def test_one_shot_run_tears_down_after_itself(ftc_home, minilm, glue_dir):
    from conftest import sshd_pids
    proc = ftc("run", "--name", "once", "--nodes", "2", *job_flags(minilm, glue_dir, samples=64, epochs=1), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "eval_accuracy" in proc.stdout and "nothing left running" in proc.stderr
    lines = proc.stderr.splitlines()
    [said] = [i for i, line in enumerate(lines) if line.startswith("expect about ")]
    assert re.match(r"expect about \dm\d\ds of training here \(64 rows x 1 epoch\(s\) on \d+ core\(s\), ", lines[said])
    assert said < min(i for i, line in enumerate(lines) if "started on" in line)  # said before the job starts
    assert sshd_pids(ftc_home) == [] and not (ftc_home / "clusters" / "once").exists()
    assert results_of_run(ftc_home, "once")["world_size"] == 2


@pytest.mark.slow
def test_resume_after_a_killed_run_continues_from_the_checkpoint(ftc_home, cluster, tiny_bert, glue_dir):
    # 128 rows, 2 ranks x 32: 2 steps an epoch; held before step 3, epoch 1 is checkpointed
    follower = subprocess.Popen([*FTC, "finetune", "--name", cluster, *job_flags(tiny_bert, glue_dir, samples=128, epochs=3)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "FTC_HOLD_AT_STEP": "3"})
    job_dir = held_job(ftc_home, cluster, follower)
    job = state_of(ftc_home)["jobs"][-1]
    assert (job_dir / "checkpoints" / "last.pt").exists()
    assert ftc("cancel", "--name", cluster).returncode == 0
    follower.communicate(timeout=120)
    assert state_of(ftc_home)["jobs"][-1]["state"] == "cancelled"

    resumed = ftc("finetune", "--name", cluster, "--resume", *job_flags(tiny_bert, glue_dir, samples=128, epochs=3))
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout
    results = json.loads((Path(job["results_dir"]) / "results.json").read_text())
    assert results["resumed_from_epoch"] >= 1
    assert [e["epoch"] for e in results["epoch_metrics"]] == [1, 2, 3]


@pytest.mark.slow
def test_a_crashed_rank_fails_the_job_fast_with_its_log(ftc_home, cluster, tiny_bert, glue_dir):
    from provision.procs import descendants
    follower = subprocess.Popen([*FTC, "finetune", "--name", cluster, *job_flags(tiny_bert, glue_dir, samples=256)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "FTC_HOLD_AT_STEP": "2"})
    job_dir = held_job(ftc_home, cluster, follower)
    node1 = state_of(ftc_home)["nodes"][1]
    victims = [pid for pid in descendants(node1["pid"]) if b"runner.node.train" in procs.cmdline(pid)]
    assert len(victims) == 1
    os.kill(victims[0], signal.SIGKILL)  # held, both ranks have logged their start: the tail shows it
    (job_dir / "release").touch()
    out, err = follower.communicate(timeout=180)  # bounded: hydra ends the job when a rank dies
    assert follower.returncode == 1
    assert "job failed" in err and "tail of rank" in err
    assert state_of(ftc_home)["jobs"][-1]["state"] == "failed"


@pytest.mark.parametrize("flags,named", [
    (["--task", "squad"], "--task='squad'"),
    (["--data-dir", "/no/such/dir"], "--data-dir='/no/such/dir'"),
    (["--epochs", "0"], "--epochs='0'"),
    (["--batch-size", "x"], "--batch-size='x'"),
    (["--recipe", "fast"], "--recipe='fast'"),
    (["--precision", "fp8"], "--precision='fp8'"),
    (["--model=--help"], "--model='--help'"),
    (["--model=-x/y"], "--model='-x/y'"),
])
def test_bad_job_input_is_refused_before_any_rank_starts(ftc_home, flags, named):
    proc = ftc("finetune", "--name", "nowhere", *flags)
    assert proc.returncode == 2 and named in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_model_path_without_weights_and_missing_data_file_are_refused(ftc_home, tmp_path, glue_dir):
    empty = tmp_path / "model"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    proc = ftc("finetune", "--name", "nowhere", "--model", str(empty))
    assert proc.returncode == 2 and "has no weights" in proc.stderr
    (tmp_path / "glue" / "MRPC").mkdir(parents=True)
    (tmp_path / "glue" / "MRPC" / "train.tsv").write_text("x")
    proc = ftc("finetune", "--name", "nowhere", "--data-dir", str(tmp_path / "glue"))
    assert proc.returncode == 2 and "lacks" in proc.stderr and "dev.tsv" in proc.stderr


@pytest.mark.slow
def test_finetune_without_cluster_or_bootstrap_is_refused(ftc_home):
    proc = ftc("finetune", "--name", "nowhere")
    assert proc.returncode == 2 and "no cluster of that name" in proc.stderr
    assert ftc("up", "--name", "raw", "--nodes", "1", "--no-bootstrap").returncode == 0
    proc = ftc("finetune", "--name", "raw")
    assert proc.returncode == 2 and "is not bootstrapped" in proc.stderr
    ftc("down", "--name", "raw", check=True)


@pytest.mark.slow
def test_node_lost_mid_training_fails_fast_and_run_resume_matches_an_uninterrupted_run(ftc_home, tiny_bert, glue_dir):
    from provision.procs import descendants
    flags = job_flags(tiny_bert, glue_dir, samples=128, epochs=2)  # 2 steps an epoch
    reference = ftc("run", "--name", "ref", "--nodes", "2", *flags, timeout=900)
    assert reference.returncode == 0, reference.stderr[-2000:]
    expected = results_of_run(ftc_home, "ref")

    interrupted = subprocess.Popen([*FTC, "run", "--name", "lost", "--nodes", "2", *flags],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env={**os.environ, "FTC_HOLD_AT_STEP": "3"})
    job_dir = held_job(ftc_home, "lost", interrupted)  # epoch 1 done and checkpointed
    while not list((ftc_home / "runs" / "lost").glob("*/checkpoints/last.pt")):  # and copied home
        assert interrupted.poll() is None, interrupted.communicate()
        time.sleep(0.1)
    node1 = state_of_named(ftc_home, "lost")["nodes"][1]
    ranks = [p for p in descendants(node1["pid"]) if b"runner.node.train" in procs.cmdline(p)]
    assert ranks
    for pid in ranks:  # node 1 is lost
        os.kill(pid, signal.SIGKILL)
    (job_dir / "release").touch()
    _, err = interrupted.communicate(timeout=180)  # fails, bounded, and tears the cluster down
    assert interrupted.returncode == 1 and "job failed" in err and "nothing left running" in err

    resumed = ftc("run", "--name", "lost", "--nodes", "2", "--resume", *flags, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming from" in resumed.stderr
    result = results_of_run(ftc_home, "lost")
    assert result["resumed_from_epoch"] == 1
    assert [e["epoch"] for e in result["epoch_metrics"]] == [1, 2]
    for key in ("eval_accuracy", "eval_f1"):
        assert result[key] == pytest.approx(expected[key], abs=1e-6), (result[key], expected[key])
    assert result["epoch_metrics"][1]["train_loss"] == pytest.approx(expected["epoch_metrics"][1]["train_loss"], rel=1e-3)


def state_of_named(home: Path, name: str) -> dict:
    return json.loads((home / "clusters" / name / "state.json").read_text())


@pytest.mark.slow
def test_checkpoints_are_also_copied_to_s3(aws, ftc_home, cluster, tiny_bert, glue_dir):
    import boto3
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="ftc-checkpoints")
    proc = ftc("finetune", "--name", cluster, "--checkpoint-uri", "s3://ftc-checkpoints/runs",
               *job_flags(tiny_bert, glue_dir, samples=64, epochs=1))
    assert proc.returncode == 0, proc.stderr[-2000:]
    job = state_of(ftc_home)["jobs"][-1]
    local = Path(job["results_dir"]) / "checkpoints" / "last.pt"
    remote = s3.head_object(Bucket="ftc-checkpoints", Key=f"runs/{job['id']}/last.pt")
    assert remote["ContentLength"] == local.stat().st_size > 0
    for flag in ("--checkpoint-uri", "--checkpoint-s3"):  # the former name too, named as typed
        bad = ftc("finetune", "--name", cluster, flag, "http://not-s3")
        assert bad.returncode == 2 and f"{flag}='http://not-s3' is not an S3 URI" in bad.stderr


@pytest.mark.slow
def test_sweep_over_1_and_2_local_nodes_writes_the_2021_table(ftc_home, tiny_bert, glue_dir, tmp_path):
    from conftest import sshd_pids
    out = tmp_path / "sweep"
    proc = ftc("sweep", "--name", "sw", "--nodes", "1,2", "--out", str(out),
               *job_flags(tiny_bert, glue_dir, samples=64, epochs=1), timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "recreating it with 2" in proc.stderr  # the 1-node cluster was not kept for the 2-node run
    report = json.loads((out / "sweep.json").read_text())
    rows = report["rows"]
    assert [row["nodes"] for row in rows] == [1, 2]
    for row, world in zip(rows, (1, 2)):
        assert json.loads((out / f"{world}-node" / "results.json").read_text())["world_size"] == world
        assert row["train_seconds"] > 0 and row["eval"]["eval_accuracy"] > 0
    assert rows[0]["speedup"] == 1.0 and rows[1]["speedup"] == round(rows[0]["train_seconds"] / rows[1]["train_seconds"], 3)
    assert rows[1]["recipe_2021_seconds"] == 279 and rows[1]["recipe_2021_speedup"] == round(466 / 279, 3)
    table = (out / "sweep.md").read_text()
    assert "| 2 |" in table and "4m39s" in table and "simulated" in table
    assert (out / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert sshd_pids(ftc_home) == [] and not (ftc_home / "clusters" / "sw").exists()


@pytest.mark.slow
def test_spot_interruption_checkpoints_then_run_recreates_the_cluster_and_resumes(ftc_home, tiny_bert, glue_dir):
    from conftest import sshd_pids
    from fake_imds import FakeIMDS
    flags = job_flags(tiny_bert, glue_dir, samples=256, epochs=2)  # 4 steps an epoch
    reference = ftc("run", "--name", "steady", "--nodes", "2", *flags, timeout=900)
    assert reference.returncode == 0, reference.stderr[-2000:]
    expected = results_of_run(ftc_home, "steady")

    imds = FakeIMDS()
    try:
        spot_run = subprocess.Popen([*FTC, "run", "--name", "spot", "--nodes", "2", "--spot", "1", *flags],
                                    env={**os.environ, SPOT_NOTICE_ENV: SpotReader(IMDS_V2, imds.url).watch,
                                         "FTC_HOLD_AT_STEP": "2"},
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        job_dir = held_job(ftc_home, "spot", spot_run)  # training is under way: the notice comes now
        imds.armed = True
        while not imds.served:  # the node's watcher has read it
            assert spot_run.poll() is None, spot_run.communicate()
            time.sleep(0.1)
        (job_dir / "release").touch()
        out, err = spot_run.communicate(timeout=900)
    finally:
        imds.close()
    assert spot_run.returncode == 0, err[-3000:]
    assert imds.served == 1 and imds.unauthorized == 0, imds.refused_requests  # IMDSv2: every read carried a token
    assert "spot interruption (1/3): recreating cluster spot" in err
    assert "(spot interruption notice)" in out and "resuming from" not in err.split("recreating")[0]
    assert sshd_pids(ftc_home) == [] and not (ftc_home / "clusters" / "spot").exists()
    result = results_of_run(ftc_home, "spot")
    assert result["resumed_from_batch"] >= 1 and result["steps"] == expected["steps"]
    for key in ("eval_accuracy", "eval_f1"):
        assert result[key] == pytest.approx(expected[key], abs=1e-6), (result[key], expected[key])
    assert result["epoch_metrics"][-1]["train_loss"] == pytest.approx(expected["epoch_metrics"][-1]["train_loss"],
                                                                      rel=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("allreduce, kept", [("comm-core", True), ("overlap", False)])
def test_a_communication_core_starts_gloos_threads_on_the_ranks_last_core_and_computes_on_the_rest(
        glue_dir, tiny_bert, tmp_path, allreduce, kept):
    """Two ranks on two cores, each allowed both: comm-core keeps the last for gloo's threads (read back
    from the threads themselves) and computes on one thread; overlap leaves gloo on both."""
    from runner.node.distenv import listen_port
    cores = sorted(os.sched_getaffinity(0))[:2]
    if len(cores) < 2:
        pytest.skip("needs two cores")
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(listen_port()), "WORLD_SIZE": "2",
           "LOCAL_WORLD_SIZE": "2", "OMP_NUM_THREADS": "2", "OMP_PROC_BIND": "close", "OMP_PLACES": "cores"}
    ranks = [subprocess.Popen(["taskset", "-c", ",".join(map(str, cores)), sys.executable, "-m", "runner.node.train",
                               "--task", "mrpc", "--model", tiny_bert, "--data-dir", str(glue_dir), "--max-train-samples",
                               "64", "--epochs", "1", "--no-eval", "--no-save", "--allreduce", allreduce,
                               "--output-dir", str(tmp_path / f"rank{rank}")],
                              env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    logs = [rank.communicate(timeout=600)[0] for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    results = strict_json((tmp_path / "rank0" / "results.json").read_text())
    assert results["allreduce"] == allreduce and results["world_size"] == 2
    if kept:
        assert results["gloo_threads"] == "kept-core" and results["gloo_thread_cores"] == cores[-1:]
        assert results["threads_per_rank"] == 1
    else:
        assert results["gloo_thread_cores"] == cores and results["threads_per_rank"] == 2
    assert f"allreduce {allreduce} gloo threads on {results['gloo_thread_cores']}" in logs[0]


@pytest.mark.slow
def test_a_communication_core_on_ranks_of_one_core_is_refused_before_anything_starts(ftc_home, cluster, tiny_bert,
                                                                                    glue_dir):
    from provision import state as st
    from provision.bootstrap import load_facts
    cores = min(f.physical_cores for f in load_facts(st.load(cluster)))  # a rank a core: as many ranks as cores
    proc = ftc("finetune", "--name", cluster, *job_flags(tiny_bert, glue_dir), "--allreduce", "comm-core",
               "--ppn", str(cores))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "error: --allreduce=comm-core keeps one of a rank's cores for gloo's threads, but each rank here has 1 core")
    assert state_of(ftc_home)["jobs"] == [] and not (ftc_home / "runs" / cluster).exists()
