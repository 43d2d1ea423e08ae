"""The history of runs: results at one absolute place whatever directory ftc ran from, listed after the
cluster is destroyed, a run's report and plot, runs compared; and the demo's settings."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, ftc
from helpers import one_error, tiny_job

from runner.node.protocol import line_mark


@pytest.mark.slow
def test_runs_stay_listed_after_a_destroy_and_show_writes_a_report_and_a_plot(ftc_home, tmp_path, tiny_bert, glue_dir):
    first_cwd, other_cwd, elsewhere = tmp_path / "a", tmp_path / "b", tmp_path / "kept" / "mine"
    first_cwd.mkdir()
    other_cwd.mkdir()
    up = ftc("up", "--name", "hist", "--nodes", "2", cwd=first_cwd)
    assert up.returncode == 0 and "│ verification │ ok " in up.stderr  # the verification's own row on the board
    try:
        default = ftc("finetune", "--name", "hist", *tiny_job(tiny_bert, glue_dir, samples=64), cwd=first_cwd)
        assert default.returncode == 0, default.stderr[-2000:]
        assert "dev accuracy" in default.stdout and "results: " in default.stdout  # the answer, on stdout
        # a finished run is never written into: a resume of it (here as another task) is refused, files untouched
        finished = next((ftc_home / "runs" / "hist").glob("mrpc-*"))
        before = {path: path.read_bytes() for path in finished.rglob("*") if path.is_file()}
        again = ftc("finetune", "--name", "hist", "--resume", *tiny_job(tiny_bert, glue_dir, samples=64)[2:], "--task", "qqp",
                    cwd=first_cwd)
        assert again.returncode == 2, again.stderr[-2000:]
        assert f"holds run {finished.name}, which finished; a finished run is never written into" in again.stderr
        assert {path: path.read_bytes() for path in finished.rglob("*") if path.is_file()} == before
        given = ftc("finetune", "--name", "hist", "--results", str(elsewhere), *tiny_job(tiny_bert, glue_dir, samples=64),
                    cwd=other_cwd)
        assert given.returncode == 0, given.stderr[-2000:]
    finally:
        assert ftc("down", "--name", "hist").returncode == 0
    assert not (first_cwd / "runs").exists() and not (other_cwd / "runs").exists()

    listed = ftc("runs", "--json", cwd=tmp_path)
    runs = json.loads(listed.stdout)
    assert len(runs) == 2 and runs[0]["results_dir"] == str(elsewhere)  # newest first
    assert runs[1]["results_dir"] == str(ftc_home / "runs" / "hist" / runs[1]["id"])
    for run in runs:
        assert run["cluster"] == "hist" and run["provider"] == "local" and run["status"] == "finished"
        assert run["nodes"] == 2 and run["ranks_per_node"] == 1 and run["epochs"] == 1 and run["cost_usd"] == 0.0
        assert 0 <= run["metrics"]["eval_accuracy"] <= 1 and run["samples_per_second"] > 0 and run["wall_seconds"] > 0
    table = ftc("runs", cwd=other_cwd)
    assert all(r["id"] in table.stdout for r in runs) and "finished" in table.stdout

    shown = ftc("runs", "show", runs[1]["id"], cwd=other_cwd)
    assert shown.returncode == 0, shown.stderr
    report, plot = Path(runs[1]["results_dir"]) / "report.md", Path(runs[1]["results_dir"]) / "report.png"
    assert f"report: {report}" in shown.stdout and f"plot: {plot}" in shown.stdout
    assert "| epoch | eval_accuracy | eval_f1 | train_loss |" in report.read_text()
    assert plot.read_bytes()[:4] == b"\x89PNG"

    out = tmp_path / "both.png"
    compared = ftc("runs", "compare", runs[0]["id"], runs[1]["id"], "--out", str(out))
    assert compared.returncode == 0 and f"plot: {out}" in compared.stdout and out.read_bytes()[:4] == b"\x89PNG"
    assert all(r["id"] in compared.stdout for r in runs)
    twice = ftc("runs", "compare", runs[0]["id"], runs[0]["id"], runs[1]["id"], "--out", str(tmp_path / "dup.png"))
    assert twice.returncode == 0 and twice.stdout.count(runs[0]["id"]) == 1  # a run named twice is compared once
    alone = ftc("runs", "compare", runs[0]["id"], runs[0]["id"])
    assert alone.returncode == 2 and "name one run; compare needs two or more different runs" in alone.stderr


def test_an_unknown_run_is_refused_in_one_line(ftc_home):
    for args in (["show", "nosuch"], ["compare", "nosuch", "other"]):
        proc = ftc("runs", *args)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
            "error: id='nosuch' is not a run ftc knows; allowed: an id from `ftc runs` (none yet)"]
    assert not (ftc_home / "runs").exists()


def test_the_demo_runs_the_settings_whose_accuracy_the_readme_states():
    """These settings kept dev accuracy >= 0.80 in all 9 probe runs (docs/probes/demo_settings.txt) and
    in `make demo` measured end to end (README, Quickstart): all of MRPC's training pairs, 2 epochs,
    32 per rank on 2 nodes, lr 2e-4, no dropout."""
    dry = subprocess.run(["make", "-n", "-s", "demo"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    line = " ".join(dry.replace("\\\n", " ").split())
    for flag in ("--nodes 2", "--task mrpc", "--lr='2e-4'", "--epochs='2'", "--max-train-samples='0'",
                 "--batch-size='32'", "--dropout='0'"):
        assert flag in line, line


def test_run_resume_refuses_another_cluster_s_run_before_anything_launches(ftc_home, tmp_path, minilm, glue_dir):
    theirs = tmp_path / "theirs" / "mrpc-20261201T000000Z"
    (theirs / "checkpoints").mkdir(parents=True)
    (theirs / "checkpoints" / "last.pt").write_bytes(b"a checkpoint")
    record = {"id": theirs.name, "cluster": "other", "provider": "local", "status": "failed", "task": "mrpc",
              "model": minilm, "nodes": 1, "ranks_per_node": 1, "results_dir": str(theirs)}
    (theirs / "run.json").write_text(json.dumps(record))
    proc = ftc("run", "--name", "mine", "--nodes", "1", "--resume", "--results", str(theirs),
               *tiny_job(minilm, glue_dir, samples=64))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"holds run {theirs.name} of cluster 'other', not 'mine'" in proc.stderr
    assert not (ftc_home / "clusters" / "mine").exists()  # nothing launched
    assert json.loads((theirs / "run.json").read_text()) == record


def test_resume_refuses_another_job_naming_what_differs(ftc_home, tmp_path):
    from provision.errors import UsageError
    from runner import runs
    record = {"id": "mrpc-1", "cluster": "c", "status": "preempted", "task": "mrpc", "model": "m", "data_dir": "",
              "recipe": "ftc", "batch_size": 32, "nodes": 2, "ranks_per_node": 1}
    (tmp_path / "run.json").write_text(json.dumps(record))
    same = {key: record[key] for key in ("task", "model", "data_dir", "recipe", "batch_size")}
    runs.refuse_other_job(tmp_path, "c", {**same, "nodes": 2, "ranks_per_node": 1})  # the same job: resumable
    runs.refuse_other_job(tmp_path, "c", same)  # ranks not planned yet: the rest is checked
    runs.refuse_other_job(tmp_path, "c", {**same, "batch_size": None})  # not given: the recipe's own, not told apart
    runs.refuse_other_job(tmp_path, "c", {**same, "epochs": 3, "precision": "auto", "lr": 2e-5})  # the recipe's, given
    for change, named in (({"task": "qqp"}, "task 'mrpc' -> 'qqp'"), ({"batch_size": 64}, "batch_size 32 -> 64"),
                          ({"batch_size": 16}, "batch_size 32 -> 16"), ({"epochs": 5}, "epochs 3 -> 5"),
                          ({"max_train_samples": 100}, "max_train_samples 0 -> 100"),
                          ({"precision": "bf16"}, "precision 'auto' -> 'bf16'"), ({"dropout": 0.0}, "dropout None -> 0.0"),
                          ({"lr": 1e-4}, "lr 2e-05 -> 0.0001"), ({"nodes": 4, "ranks_per_node": 1}, "world_size 2 -> 4")):
        try:
            runs.refuse_other_job(tmp_path, "c", {**same, **change})
        except UsageError as exc:
            assert f"another job than this one ({named})" in str(exc)
        else:
            raise AssertionError(f"{change} was not refused")
    runs.refuse_other_job(tmp_path, "c", {**same, "grad_compress": "powersgd"})  # a run.json from before it was recorded
    (tmp_path / "run.json").write_text(json.dumps({**record, "grad_compress": None}))
    with pytest.raises(UsageError, match=r"another job than this one \(grad_compress None -> 'powersgd'\)"):
        runs.refuse_other_job(tmp_path, "c", {**same, "grad_compress": "powersgd"})
    (tmp_path / "run.json").write_text(json.dumps({**record, "seed": None}))
    runs.refuse_other_job(tmp_path, "c", {**same, "seed": 42})  # the recipe's seed, given
    with pytest.raises(UsageError, match=r"another job than this one \(seed 42 -> 7\)"):
        runs.refuse_other_job(tmp_path, "c", {**same, "seed": 7})


def test_resume_refuses_changed_data_or_columns_and_run_json_records_them(ftc_home, tmp_path):
    from provision.errors import UsageError
    from runner import runs
    from runner.finetune_job import job_settings
    from runner.jobspec import JobSpec
    train, dev = tmp_path / "train.csv", tmp_path / "dev.csv"
    train.write_text("text,label\na,0\nb,1\n")
    dev.write_text("text,label\na,0\n")
    job = JobSpec(task="custom", train_file=str(train), validation_file=str(dev), text_columns="text")
    recorded = {"id": "custom-1", "cluster": "c", "status": "cancelled", **job_settings(job)}
    (tmp_path / "run.json").write_text(json.dumps(recorded))
    runs.refuse_other_job(tmp_path, "c", job_settings(job))  # the same data and columns: resumable
    train.write_text("text,label\na,0\nb,1\nc,2\n")  # a row more, and a third class
    for settings, named in ((job_settings(job), "train_sha256"),
                            (job_settings(JobSpec(**{**job.__dict__, "text_columns": "other"})), "text_columns"),
                            (job_settings(JobSpec(**{**job.__dict__, "label_column": "stars"})), "label_column")):
        with pytest.raises(UsageError, match=f"another job than this one \\(.*{named} "):
            runs.refuse_other_job(tmp_path, "c", settings)
    earlier = {k: v for k, v in recorded.items() if k not in runs.RECORDED_LATER}  # a run.json from before
    (tmp_path / "run.json").write_text(json.dumps(earlier))
    runs.refuse_other_job(tmp_path, "c", job_settings(job))


GOOD_RUN = {"id": "good", "cluster": "c", "provider": "local", "task": "mrpc", "model": "m", "nodes": 1,
            "ranks_per_node": 1, "started_at": 1000.0, "ended_at": 1100.0, "status": "finished"}


CORRUPT = {  # id: (run.json, results.json), and what is wrong
    "cluster5": ({"id": "cluster5", "cluster": 5}, None, "run.json: cluster is 5"),
    "nodes-text": ({"id": "nodes-text", "provider": "aws", "instance_type": "c6i.large", "nodes": "2",
                    "started_at": 1.0, "ended_at": 5.0}, None, 'run.json: nodes is "2"'),
    "id-list": ({"id": ["x"]}, None, 'run.json: id is ["x"]'),
    "high": ({"id": "high"}, {"eval_accuracy": "high"}, 'results.json: eval_accuracy is "high"'),
    "not-an-object": ([1, 2], None, "run.json is not a JSON object"),
    "bad-epochs": ({"id": "bad-epochs"}, {"epoch_metrics": [{"epoch": 1, "eval_f1": "x"}]},
                   "results.json: epoch_metrics is"),
    "cluster-null": ({"id": "cluster-null", "cluster": None}, None, "run.json: cluster is null"),
    "started-nan": ({"id": "started-nan", "started_at": float("nan")}, None, "run.json: started_at is NaN"),
    "ended-huge": ({"id": "ended-huge", "started_at": 1.0, "ended_at": float("inf")}, None,
                   "run.json: ended_at is Infinity"),
}


def write_run(home: Path, run_id: str, record, results=None) -> Path:
    directory = home / "runs" / "c" / run_id
    directory.mkdir(parents=True)
    (directory / "run.json").write_text(json.dumps(record))
    if results is not None:
        (directory / "results.json").write_text(json.dumps(results))
    return directory


def test_corrupt_runs_are_listed_as_corrupt_and_never_crash_the_history(ftc_home):
    write_run(ftc_home, "good", GOOD_RUN, {"eval_accuracy": 0.5, "samples_per_second": 3.0,
                                           "epoch_metrics": [{"epoch": 1, "eval_accuracy": 0.5, "train_loss": 0.7}]})
    for run_id, (record, results, _) in CORRUPT.items():
        write_run(ftc_home, run_id, record, results)

    listed = ftc("runs", "--json")
    assert listed.returncode == 0, listed.stderr
    by_dir = {Path(r["results_dir"]).name: r for r in json.loads(listed.stdout)}
    assert by_dir["good"]["status"] == "finished" and by_dir["good"]["problem"] == ""
    for run_id, (_, _, problem) in CORRUPT.items():
        assert by_dir[run_id]["status"] == "corrupt" and by_dir[run_id]["problem"].startswith(problem)
    notes = listed.stderr.strip().splitlines()  # one line per corrupt run, naming where it is
    assert len(notes) == len(CORRUPT) and all("corrupt run (" in note for note in notes)

    table = ftc("runs")
    assert table.returncode == 0 and "Traceback" not in table.stderr
    assert table.stderr.strip().splitlines()[-1] == \
        f"every run's curves side by side: `tensorboard --logdir {ftc_home / 'runs'}`"  # README: TensorBoard
    rows = [line.split() for line in table.stdout.splitlines()]
    assert sorted(row[0] for row in rows if row[-1:] == ["corrupt"]) == sorted(CORRUPT)
    shown = ftc("runs", "show", "cluster5")
    assert shown.returncode == 1 and "id='cluster5' is corrupt (run.json: cluster is 5, not a string)" in one_error(shown)
    assert ftc("runs", "show", "good").returncode == 0


def test_log_lines_whose_numbers_are_not_numbers_are_passed_over(ftc_home):
    run = write_run(ftc_home, "odd-log", GOOD_RUN | {"id": "odd-log"})
    mark = line_mark("odd-log")
    (run / "output.log").write_text(f"[0] {mark} 10:00:00 epoch 1/1 step 1/2 loss abc 3.0 samples/s\n"
                                    f"[0] {mark} 10:00:01 epoch 1 dev eval_acc x.y\n"
                                    f"[0] {mark} 10:00:02 epoch 1/1 step 2/2 loss 0.5 1.2.3 samples/s\n"
                                    f"[0] {mark} 10:00:03 epoch 1/1 step 2/2 loss 0.5 3.5 samples/s eta 0s\n"
                                    f"[0] {mark} 10:00:04 epoch 1 dev eval_accuracy 0.6 eval_f1 0.7\n")
    shown = ftc("runs", "show", "odd-log")
    assert shown.returncode == 0, shown.stderr
    report = (run / "report.md").read_text()
    assert "| epoch | eval_accuracy | eval_f1 |" in report and "| 1 | 0.6000 | 0.7000 |" in report


def test_an_index_of_results_elsewhere_that_is_not_utf8_still_lists_its_runs(ftc_home, tmp_path):
    elsewhere = tmp_path / "mine"
    elsewhere.mkdir()
    (elsewhere / "run.json").write_text(json.dumps(GOOD_RUN | {"id": "kept"}))
    (ftc_home / "runs").mkdir(parents=True)
    (ftc_home / "runs" / "elsewhere").write_bytes(b"/tmp/\xff\xfe/gone\n\x00\n" + os.fsencode(elsewhere) + b"\n")
    listed = ftc("runs", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [r["id"] for r in json.loads(listed.stdout)] == ["kept"]


def test_compare_into_a_directory_is_refused(ftc_home, tmp_path):
    for run_id in ("one", "two"):
        write_run(ftc_home, run_id, GOOD_RUN | {"id": run_id})
    plots = tmp_path / "plots.png"
    plots.mkdir()
    proc = ftc("runs", "compare", "one", "two", "--out", str(plots))
    assert proc.returncode == 2 and f"--out='{plots}' is a directory" in one_error(proc)
    assert list(plots.iterdir()) == []



def test_compare_shows_the_settings_that_differ(ftc_home, tmp_path):
    from runner.report import differing_settings
    assert differing_settings([{"id": "a", "lr": 2e-5, "task": "mrpc", "data_dir": ""},
                               {"id": "b", "lr": 2e-4, "task": "mrpc", "dropout": 0.0}]) == \
        {"dropout": [None, 0.0], "lr": [2e-5, 2e-4]}  # an empty data_dir and none are the same
    for run_id, lr, dropout in (("slow-lr", 2e-5, None), ("fast-lr", 2e-4, 0.0)):
        folder = ftc_home / "runs" / "c" / run_id
        folder.mkdir(parents=True)
        (folder / "run.json").write_text(json.dumps({**GOOD_RUN, "id": run_id, "lr": lr, "dropout": dropout,
                                                     "results_dir": str(folder)}))
    out = tmp_path / "cmp.png"
    compared = ftc("runs", "compare", "slow-lr", "fast-lr", "--out", str(out))
    assert compared.returncode == 0, compared.stderr
    table = compared.stdout.split("settings that differ", 1)[1]
    assert "lr" in table and "2e-05" in table and "0.0002" in table and "dropout" in table
    assert "task" not in table and out.read_bytes()[:4] == b"\x89PNG"


# ---- your text is never read as ftc's own log lines ------------------------------------------------------

FORGED_DEV = "12:00:00 epoch 1 dev eval_accuracy 0.9999"  # a dev-metrics line, as the logger once wrote it


@pytest.mark.slow
def test_a_header_cell_holding_a_log_line_is_quoted_and_never_read_as_a_metric(ftc_home, tmp_path, minilm):
    from runner.node import datafiles
    from runner.node.protocol import LOG_MARK_ENV
    cell = f"x\n{FORGED_DEV}\n"
    train = tmp_path / "train.csv"
    train.write_text(f'text,"{cell}"\nit was great,1\nit was awful,0\n')
    with pytest.raises(datafiles.DataProblems) as refused:  # the controller's check, before launch
        datafiles.check(train, train)
    (problem,) = refused.value.problems
    assert "no column 'label' (columns: 'text', 'x\\n12:00:00 epoch 1 dev" in problem and "\n" not in problem, problem

    # The node's own check says the same in its traceback: the real training program, one rank of a job
    run = write_run(ftc_home, "custom-forged", GOOD_RUN | {"id": "custom-forged", "task": "custom",
                                                           "status": "failed"})
    proc = subprocess.run([sys.executable, "-m", "runner.node.train", "--task", "custom", "--model", minilm,
                           "--train-file", str(train), "--validation-file", str(train), "--output-dir", str(run)],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, LOG_MARK_ENV: line_mark("custom-forged")})
    assert proc.returncode == 1 and "DataProblems" in proc.stderr, proc.stderr[-2000:]
    (run / "output.log").write_text(proc.stdout + proc.stderr)
    shown = ftc("runs", "show", "custom-forged")
    assert shown.returncode == 0, shown.stderr
    assert "per epoch" not in shown.stdout and "0.9999" not in shown.stdout, shown.stdout
    assert "No epoch finished." in (run / "report.md").read_text()


FORGING_SCRIPT = r'''
import os, sys
if os.environ["RANK"] != "0":
    sys.exit(0)  # rank 0 alone fails: mpirun stops no rank before it has printed
print("12:00:00 epoch 1/1 step 1/1 loss 0.1000 999.0 samples/s eta 0s", flush=True)
print("12:00:01 epoch 1 dev eval_accuracy 0.9999", flush=True)
print("12:00:02 checkpoint saved: epoch 1 -> /etc/hostname", flush=True)
print("a title\x1b]0;pwned\x07, a cleared screen\x1b[2J\x1b[H, a bell\x07: rank", os.environ["RANK"], flush=True)
sys.exit(3)
'''


@pytest.mark.slow
def test_a_scripts_prints_are_never_read_as_metrics_and_reach_the_terminal_without_codes(ftc_home, cluster,
                                                                                           tmp_path):
    script = tmp_path / "work" / "forge.py"
    script.parent.mkdir()
    script.write_text(FORGING_SCRIPT)
    failed = ftc("launch", "--name", cluster, "--", str(script))
    assert failed.returncode == 3, failed.stderr[-3000:]
    assert f"rank 0 on node {cluster}-0 failed first (exit code 3)" in failed.stderr
    assert "a title, a cleared screen, a bell: rank 0" in failed.stderr  # the last lines of its log
    job = json.loads((ftc_home / "clusters" / cluster / "state.json").read_text())["jobs"][-1]
    assert not (Path(job["results_dir"]) / "checkpoints").exists()  # its "checkpoint saved" line copied nothing
    shown = ftc("runs", "show", job["id"])
    assert shown.returncode == 0, shown.stderr
    assert "a title, a cleared screen, a bell: rank 0" in shown.stdout  # the tail of rank 0's log, as text
    assert "per epoch" not in shown.stdout, shown.stdout
    assert "No epoch finished." in (Path(job["results_dir"]) / "report.md").read_text()
    logs = ftc("logs", "--name", cluster)
    assert "a title, a cleared screen, a bell: rank 0" in logs.stdout
    for text in (failed.stdout, failed.stderr, shown.stdout, logs.stdout):
        assert not any(code in text for code in ("\x1b", "\x07")), repr(text)


def test_a_script_runs_row_heads_its_command_as_such_and_a_missing_output_is_said(ftc_home, tmp_path):
    from runner.report import runs_table, summary_rows
    run = {"id": "script-1", "cluster": "c", "provider": "local", "instance_type": "", "task": "script", "model": "",
           "nodes": 2, "ranks_per_node": 1, "precision": "", "epochs": None, "metrics": {}, "samples_per_second": None,
           "wall_seconds": 3.0, "cost_usd": 0.0, "status": "cancelled", "problem": "", "started_at": 1.0,
           "results_dir": str(tmp_path / "script-1"), "kind": "script", "command": "python train.py --x 1",
           "exit_code": None, "output_bytes": None}
    rows = dict(summary_rows(run))
    assert "model" not in rows and rows["command"] == "python train.py --x 1"
    assert rows["output"] == f"{tmp_path / 'script-1'}/output (none came home)"
    assert "model|command" in [column.header for column in runs_table([run], "runs", 200).columns]
