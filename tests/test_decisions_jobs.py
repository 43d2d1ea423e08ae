"""The job side's pure decisions, without a node: the training program's arguments, the bench's rank
layout, the sweep's table, what run.json records, and a busy cluster."""

import argparse
import json
from pathlib import Path

import pytest

from provision import state as st
from provision.errors import ClusterBusy, UsageError
from provision.spec import ClusterSpec
from runner.bench.common import rank_layout
from runner.finetune_job import job_settings
from runner.job import refuse_if_busy
from runner.jobspec import JobSpec, job_from_args, train_args
from runner.sweep import markdown, table
from runner.transfer import data_files_on_nodes

# ---- the training program's arguments --------------------------------------------------------------

def test_train_args_of_a_default_job_name_only_what_the_program_needs(monkeypatch):
    monkeypatch.delenv("FTC_HOLD_AT_STEP", raising=False)
    assert train_args(JobSpec(), "/out", "stock", resume=False) == [
        "--task", "mrpc", "--model", "distilbert-base-uncased", "--output-dir", "/out", "--recipe", "ftc",
        "--stack", "stock"]


def test_checkpoint_uri_and_its_former_name_checkpoint_s3_are_one_setting_given_once():
    both = argparse.Namespace(checkpoint_uri="s3://a/x", checkpoint_s3="s3://b/y")
    with pytest.raises(UsageError, match=r"^--checkpoint-uri='s3://a/x' and --checkpoint-s3='s3://b/y' differ; "
                                         r"--checkpoint-s3 is --checkpoint-uri's former name: give one of them$"):
        job_from_args(both, env={})
    from_env = argparse.Namespace(checkpoint_uri="s3://a/x")  # a flag and its former name's variable: refused alike
    with pytest.raises(UsageError, match="differ"):
        job_from_args(from_env, env={"FTC_CHECKPOINT_S3": "s3://b/y"})


def test_train_args_pass_every_setting_given_and_the_intel_stack_adds_ipex(monkeypatch):
    monkeypatch.delenv("FTC_HOLD_AT_STEP", raising=False)
    job = JobSpec(task="rte", model="/m", data_dir="/g", epochs=2, batch_size=8, lr=1e-4, max_train_samples=64,
                  max_eval_samples=32, recipe="seed", precision="bf16", dropout=0.0, allreduce="overlap", compile="on")
    assert train_args(job, "/out", "intel", resume=True) == [
        "--task", "rte", "--model", "/m", "--output-dir", "/out", "--recipe", "seed", "--stack", "intel",
        "--precision", "bf16", "--dropout", "0.0", "--compile", "on", "--allreduce", "overlap", "--data-dir", "/g",
        "--epochs", "2", "--batch-size", "8", "--lr", "0.0001", "--max-train-samples", "64", "--max-eval-samples", "32",
        "--ipex", "--resume"]


def test_train_args_carry_the_tests_hold_point_when_it_is_set(monkeypatch):
    monkeypatch.setenv("FTC_HOLD_AT_STEP", "3")
    assert train_args(JobSpec(), "/out", "stock", resume=False)[-2:] == ["--hold-at-step", "3"]


# ---- the bench's rank layout --------------------------------------------------------------------------

def test_rank_layout_defaults_to_the_hosts_cores_shared_by_the_most_ranks():
    assert rank_layout(None, None, quick=True, physical=16) == ([1, 2], 8)
    assert rank_layout(None, None, quick=False, physical=16) == ([1, 2, 4], 4)
    assert rank_layout([1, 3], 2, quick=False, physical=6) == ([1, 3], 2)
    # one rank alone is measured on the default layout's node, comparable with its rows
    assert rank_layout([1], None, quick=False, physical=16) == ([1], 4)
    assert rank_layout([8], None, quick=False, physical=16) == ([8], 2)


def test_rank_layout_refuses_more_cores_than_the_host_has():
    with pytest.raises(UsageError) as refused:
        rank_layout(None, None, quick=False, physical=2)
    assert str(refused.value) == ("--ranks=1,2,4 with --cores-per-rank=1: 4 ranks x 1 cores > this host's 2 "
                                  "physical cores; give fewer --ranks or --cores-per-rank")


# ---- the sweep's table -----------------------------------------------------------------------------------

def test_sweep_table_gives_speedup_and_efficiency_against_one_node_beside_the_2021_recipe():
    report = table("mrpc", [{"nodes": 1, "train_seconds": 100.0}, {"nodes": 2, "train_seconds": 60.0}], "local", "")
    assert report["where"] == "local nodes (one machine, simulated)"
    assert report["rows"][1] == {"nodes": 2, "train_seconds": 60.0, "speedup": 1.667, "efficiency": 0.834,
                                 "recipe_2021_seconds": 279, "recipe_2021_speedup": 1.67}
    assert markdown(report).splitlines()[-2:] == ["| 1 | 1m40s | 1.00x | 1.00 | 7m46s | 1.00x |",
                                                  "| 2 | 1m00s | 1.67x | 0.83 | 4m39s | 1.67x |"]


def test_sweep_table_without_a_one_node_run_has_no_speedup():
    report = table("mrpc", [{"nodes": 2, "train_seconds": 60.0}], "aws", "c6i.16xlarge")
    assert report["where"] == "c6i.16xlarge"
    assert (report["rows"][0]["speedup"], report["rows"][0]["efficiency"]) == (None, None)
    assert markdown(report).splitlines()[-1] == "| 2 | 1m00s | | | 4m39s | 1.67x |"


# ---- what run.json records; one job at a time ----------------------------------------------------------

def test_job_settings_record_an_unset_number_as_null():
    assert job_settings(JobSpec(model="/m", epochs=3)) == {
        "task": "mrpc", "model": "/m", "data_dir": "", "train_file": None, "validation_file": None,
        "precision": "auto", "recipe": "ftc", "epochs": 3, "batch_size": None, "lr": None, "max_train_samples": None,
        "max_eval_samples": None, "dropout": None, "grad_compress": None, "seed": None, "text_columns": None,
        "label_column": None, "compile": "auto", "train_sha256": None, "validation_sha256": None}


def test_refuse_if_busy_names_the_running_job_and_how_to_follow_or_stop_it():
    state = st.ClusterState(name="c", provider="local", spec=ClusterSpec(name="c").to_dict())
    state.jobs = [st.JobInfo(id="old", task="mrpc", remote_dir="/r", results_dir="/y", state="finished")]
    refuse_if_busy(state)  # a finished job does not make the cluster busy
    state.jobs.append(st.JobInfo(id="mrpc-2", task="mrpc", remote_dir="/r", results_dir="/y"))
    with pytest.raises(ClusterBusy) as refused:  # busy, exit code 3: not bad input
        refuse_if_busy(state)
    assert refused.value.exit_code == 3
    assert str(refused.value) == ("cluster 'c' is already running job mrpc-2; `ftc logs --name c -f` follows it, "
                                  "`ftc cancel --name c` stops it")


# ---- where a custom job's data files are read ---------------------------------------------------------

def test_data_files_stay_where_they_are_for_local_nodes_and_are_copied_by_role_elsewhere():
    job = JobSpec(task="custom", train_file="/me/data/rows.csv", validation_file="/me/dev/rows.csv")
    assert data_files_on_nodes(job, "local", "/n/jobs/j") == (job, {})  # the nodes are this machine
    for provider in ("aws", "ssh"):
        on_nodes, copies = data_files_on_nodes(job, provider, "/n/jobs/j")
        assert (on_nodes.train_file, on_nodes.validation_file) == ("/n/jobs/j/data/train.csv", "/n/jobs/j/data/validation.csv")
        assert copies == {"/n/jobs/j/data/train.csv": "/me/data/rows.csv", "/n/jobs/j/data/validation.csv": "/me/dev/rows.csv"}
    glue_job = JobSpec(task="mrpc", data_dir="/g")
    assert data_files_on_nodes(glue_job, "aws", "/n/jobs/j") == (glue_job, {})


def test_the_bench_s_mfu_divides_by_the_peak_of_every_rank_s_cores():
    from runner.bench.scaling import mfu
    one = mfu(1000.0, 1e8, 1.0, 1)  # 0.1 TFLOP/s of a 1 TFLOP/s rank
    assert one == 0.1 and mfu(4000.0, 1e8, 1.0, 4) == one  # four ranks: four times the work, four times the peak


def test_a_full_disk_after_a_job_may_have_started_points_to_fetch_not_to_a_second_launch():
    from runner.cli import disk_full_advice
    said = disk_full_advice("launch", "/home/me/.ftc")
    assert "`ftc fetch` brings a started job's files home" in said and "`ftc down` deletes them unfetched" in said
    assert "ftc launch` again" not in said
    assert "run `ftc up` again" in disk_full_advice("up", "/home/me/.ftc")


# ---- what comes home ------------------------------------------------------------------------------------

def test_each_kind_says_which_of_the_heads_files_come_home_and_every_nodes_rank_logs_do(tmp_path):
    from runner.finetune_job import FinetuneJob
    from runner.script_job import ScriptJob
    from runner.transfer import comes_home_as, home_checkpoint, results_dir_of, worth_walking
    trained = st.JobInfo("mrpc-1", "mrpc", "/w/jobs/mrpc-1", str(tmp_path))
    script = st.JobInfo("script-1", "script", "/w/jobs/script-1", str(tmp_path), kind="script", output="out/run")
    for kind, job in ((FinetuneJob, trained), (ScriptJob, script)):  # a rank's log, from any node, where it was
        assert comes_home_as(kind, job, "logs/rank3.log", on_head=False) == "logs/rank3.log"
        assert comes_home_as(kind, job, "output.log", on_head=False) is None and worth_walking(kind, job, "logs")
    fine = {relative: comes_home_as(FinetuneJob, trained, relative, on_head=True) for relative in
            ("results.json", "model/config.json", "checkpoints/last.pt", "checkpoints/epoch-1.pt", "data/train.csv")}
    assert fine == {"results.json": "results.json", "model/config.json": "model/config.json",
                    "checkpoints/last.pt": "checkpoints/last.pt", "checkpoints/epoch-1.pt": None, "data/train.csv": None}
    mine = {relative: comes_home_as(ScriptJob, script, relative, on_head=True) for relative in
            ("output.log", "workdir/out/run/model.bin", "workdir/out/run/a/b.txt", "workdir/train.py", "workdir/out/x")}
    assert mine == {"output.log": "output.log", "workdir/out/run/model.bin": "output/model.bin",
                    "workdir/out/run/a/b.txt": "output/a/b.txt", "workdir/train.py": None, "workdir/out/x": None}
    # the script's copy is walked only on the way to its output folder, and inside it
    walked = {folder: worth_walking(ScriptJob, script, folder) for folder in
              ("workdir", "workdir/out", "workdir/out/run", "workdir/out/run/a", "workdir/src", "workdir/out/runs")}
    assert walked == {"workdir": True, "workdir/out": True, "workdir/out/run": True, "workdir/out/run/a": True,
                      "workdir/src": False, "workdir/out/runs": False}
    assert results_dir_of(home_checkpoint(tmp_path / "mrpc-1")) == tmp_path / "mrpc-1"


def test_a_scripts_run_record_holds_its_fields_as_text_and_its_command_never_its_variables():
    from runner.script_job import ScriptJob
    job = ScriptJob(Path("/w"), "train.py", ["--lr", "1e-3"], requirements=Path("/w/req.txt"), data=[Path("/d/rows.csv")],
                    env={"HF_TOKEN": "secret"})
    settings = job.settings(None)
    assert settings == {"workdir": "/w", "output": "output", "requirements": "/w/req.txt", "data": ["/d/rows.csv"],
                        "kind": "script", "task": "script", "model": "", "command": "python train.py --lr 1e-3",
                        "exit_code": None, "output_bytes": None}
    assert "secret" not in json.dumps(settings)
