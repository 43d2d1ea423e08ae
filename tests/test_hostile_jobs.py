"""What a hostile trial broke on the job side (the second trial, items 2-24 of its report), each as
the user met it: a refused sweep that destroyed a busy cluster, an FTC_HOME that cannot be written,
RESULTS that broke or replaced the history, corrupt runs, a PPN found wrong after paying for
nodes, a bench file trusted blindly, Make switches dropped, flags offered and ignored. Most are
refusals that need no cluster: one line, exit code 2, nothing created or changed."""

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, assert_nothing_left, ftc, sshd_pids
from test_spec import assert_refused

from provision import procs
from provision import state as st
from provision.spec import ClusterSpec


def tiny_job(minilm: str, glue_dir: Path) -> list[str]:
    return ["--task", "mrpc", "--model", minilm, "--data-dir", str(glue_dir), "--max-train-samples", "16",
            "--epochs", "1"]


def make(*args: str, home: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-s", "-C", str(REPO), *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "FTC_HOME": str(home)})


def one_error(proc) -> str:
    """The refusal: exactly one line on stderr, and no traceback."""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


# ---- item 2: a refused sweep changes nothing ------------------------------------------------------

def test_a_sweep_refused_for_a_busy_cluster_leaves_the_cluster_and_its_job_running(ftc_home, tmp_path, minilm,
                                                                                   glue_dir):
    assert ftc("up", "--name", "sw", "--nodes", "1").returncode == 0
    try:
        started = ftc("finetune", "--name", "sw", "--detach", *tiny_job(minilm, glue_dir),
                      env={"FTC_HOLD_AT_STEP": "1"})  # the job waits before its first step: it stays running
        assert started.returncode == 0, started.stderr
        state_file = ftc_home / "clusters" / "sw" / "state.json"
        before, nodes = state_file.read_text(), sshd_pids(ftc_home)
        job = json.loads(before)["jobs"][-1]

        sweep = ftc("sweep", "--name", "sw", "--nodes", "1", *tiny_job(minilm, glue_dir), "--yes", "1",
                    "--out", str(tmp_path / "sweep"))
        assert sweep.returncode == 2
        assert f"cluster 'sw' is already running job {job['id']}" in one_error(sweep)
        assert state_file.read_text() == before and sshd_pids(ftc_home) == nodes
        assert procs.is_same(job["pid"], job["pid_start"])  # the job itself was not touched
        assert not (tmp_path / "sweep").exists()
    finally:
        assert ftc("down", "--name", "sw").returncode == 0


# ---- item 5 (the command's part): status shows what it can of every cluster -------------------------

def test_status_shows_an_unknown_instance_type_and_goes_on_past_a_cluster_it_cannot_read(ftc_home):
    spec = ClusterSpec(name="aaa", provider="aws").to_dict()
    st.save(st.ClusterState(name="aaa", provider="aws", spec={**spec, "instance_type": "bogus"}, phase="running"))
    st.save(st.ClusterState(name="zzz", provider="local", spec=ClusterSpec(name="zzz").to_dict(), phase="running"))
    (ftc_home / "clusters" / "mmm" / "state.json").mkdir(parents=True)  # a state file that is a directory

    every = ftc("status")
    assert every.returncode == 1
    assert "cost unknown ('bogus' is not in ftc's catalog)" in " ".join(every.stdout.split())
    assert "zzz: local, running" in every.stdout  # listed after the two bad ones
    error = one_error(every)
    assert "clusters/mmm/state.json" in error and "`ftc down --name mmm` still cleans up" in error
    one = ftc("status", "--name", "aaa")
    assert one.returncode == 0 and "cost unknown" in one.stdout and "Traceback" not in one.stderr


# ---- item 8: an FTC_HOME that cannot be written -----------------------------------------------------------

@pytest.mark.parametrize("command", [["up", "--name", "v", "--nodes", "1", "--no-bootstrap"], ["down", "--name", "v"]])
@pytest.mark.parametrize("kind", ["a file", "under /proc"])
def test_an_ftc_home_that_cannot_be_written_is_refused_in_one_line(ftc_home, tmp_path, command, kind):
    home = tmp_path / "afile" if kind == "a file" else Path("/proc/ftc")
    if kind == "a file":
        home.write_text("not a directory")
    proc = ftc(*command, env={"FTC_HOME": str(home)})
    assert proc.returncode == 2
    assert one_error(proc).startswith(f"error: FTC_HOME='{home}' is not writable")
    assert not home.exists() or home.read_text() == "not a directory"


# ---- items 9 and 10: RESULTS that would break or replace the history ---------------------------------------

def test_results_with_a_control_character_is_refused(ftc_home, tmp_path):
    for command in (["finetune", "--name", "nowhere", "--results"], ["sweep", "--name", "nowhere", "--out"]):
        proc = ftc(*command, str(tmp_path / "a\nb"))
        assert_refused(proc, "holds a control character", ftc_home)
    assert not (tmp_path / "a\nb").exists()


def test_results_that_hold_another_run_are_refused_before_anything_launches(ftc_home, tmp_path, minilm, glue_dir):
    earlier = {"id": "mrpc-20260101T000000Z", "cluster": "old", "provider": "local", "started_at": 1.0}
    taken, swept = tmp_path / "taken", tmp_path / "swept"
    for directory in (taken, swept / "1-node"):
        directory.mkdir(parents=True)
        (directory / "run.json").write_text(json.dumps(earlier))

    run = ftc("run", "--name", "fresh", "--nodes", "1", "--results", str(taken), *tiny_job(minilm, glue_dir))
    assert_refused(run, f"RESULTS='{taken}' already holds a run", ftc_home)
    sweep = ftc("sweep", "--name", "fresh", "--nodes", "1", "--out", str(swept), *tiny_job(minilm, glue_dir))
    assert_refused(sweep, f"OUT='{swept}' already holds a run ({swept / '1-node' / 'run.json'})", ftc_home)
    # continuing that run is another matter: it resumes in its own directory (here: from no checkpoint)
    resumed = ftc("run", "--name", "fresh", "--nodes", "1", "--results", str(taken), "--resume",
                  *tiny_job(minilm, glue_dir))
    assert_refused(resumed, "--resume: no checkpoint of mrpc", ftc_home)
    assert sshd_pids(ftc_home) == []
    for directory in (taken, swept / "1-node"):
        assert json.loads((directory / "run.json").read_text()) == earlier


# ---- item 12: corrupt runs in the history -------------------------------------------------------------------

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
    rows = [line.split() for line in table.stdout.splitlines()]
    assert sorted(row[0] for row in rows if row[-1:] == ["corrupt"]) == sorted(CORRUPT)
    shown = ftc("runs", "show", "cluster5")
    assert shown.returncode == 1 and "RUN='cluster5' is corrupt (run.json: cluster is 5, not a string)" in one_error(shown)
    assert ftc("runs", "show", "good").returncode == 0


def test_log_lines_whose_numbers_are_not_numbers_are_passed_over(ftc_home):
    run = write_run(ftc_home, "odd-log", GOOD_RUN | {"id": "odd-log"})
    (run / "output.log").write_text("[0] 10:00:00 epoch 1/1 step 1/2 loss abc 3.0 samples/s\n"
                                    "[0] 10:00:01 epoch 1 dev eval_acc x.y\n"
                                    "[0] 10:00:02 epoch 1/1 step 2/2 loss 0.5 1.2.3 samples/s\n"
                                    "[0] 10:00:03 epoch 1/1 step 2/2 loss 0.5 3.5 samples/s eta 0s\n"
                                    "[0] 10:00:04 epoch 1 dev eval_accuracy 0.6 eval_f1 0.7\n")
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


# ---- item 14: PPN checked before any node is launched -------------------------------------------------------

def test_a_ppn_the_nodes_cannot_hold_is_refused_before_any_local_node_starts(ftc_home, minilm, glue_dir):
    run = ftc("run", "--name", "pp", "--nodes", "1", "--ppn", "512", *tiny_job(minilm, glue_dir))
    assert_refused(run, "PPN=512: 512 ranks per node but node pp-0 (its share of this machine's cores)", ftc_home)
    sweep = ftc("sweep", "--name", "pp", "--nodes", "1,2", "--ppn", "512", *tiny_job(minilm, glue_dir))
    assert_refused(sweep, "PPN=512: 512 ranks per node", ftc_home)
    assert sshd_pids(ftc_home) == []


def test_a_ppn_the_instance_type_cannot_hold_is_refused_before_any_ec2_call(aws, ftc_home):
    proc = ftc("run", "--name", "pp", "--provider", "aws", "--instance-type", "c6i.large", "--nodes", "2",
               "--ppn", "2", "--yes", "1", "--ssh-cidr", "203.0.113.7/32")
    assert_refused(proc, "PPN=2: 2 ranks per node but node pp-0 (c6i.large) has only 1 physical cores", ftc_home)
    assert_nothing_left(aws.ec2(), "pp")


# ---- item 15: `ftc plan` checks every figure it takes from a bench file --------------------------------------

def bench_with(tmp_path: Path, change) -> Path:
    bench = json.loads((REPO / "docs" / "bench.json").read_text())
    change(bench)
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    return path


@pytest.mark.parametrize("change, named", [
    (lambda b: b.pop("ftc_samples_per_s"), "(KeyError: 'ftc_samples_per_s')"),
    (lambda b: b["planner"].update(exposure="most"), "EXPOSURE='most' is not a number"),
    (lambda b: b.update(cores_per_rank=0), "CORES_PER_RANK=0 is out of range"),
    (lambda b: b.update(ftc_samples_per_s=-120), "FTC_SAMPLES_PER_S=-120 is out of range"),
    (lambda b: b.update(precision=["bf16"]), "PRECISION=['bf16'] is not known"),
], ids=["rate missing", "share not a number", "no cores", "negative rate", "precision a list"])
def test_plan_refuses_a_bench_file_with_a_bad_figure_naming_the_file_and_the_field(ftc_home, tmp_path, change, named):
    path = bench_with(tmp_path, change)
    proc = ftc("plan", "--bench", str(path))
    assert proc.returncode == 2
    error = one_error(proc)
    assert f"BENCH='{path}'" in error and named in error


def test_plan_refuses_a_rate_too_small_to_plan_with(ftc_home):
    proc = ftc("plan", "--samples-per-s", "1e-300")
    assert proc.returncode == 2 and "SAMPLES_PER_S='1e-300' is out of range" in one_error(proc)


# ---- item 19: `ftc runs compare --out` a directory --------------------------------------------------------

def test_compare_into_a_directory_is_refused(ftc_home, tmp_path):
    for run_id in ("one", "two"):
        write_run(ftc_home, run_id, GOOD_RUN | {"id": run_id})
    plots = tmp_path / "plots.png"
    plots.mkdir()
    proc = ftc("runs", "compare", "one", "two", "--out", str(plots))
    assert proc.returncode == 2 and f"OUT='{plots}' is a directory" in one_error(proc)
    assert list(plots.iterdir()) == []


# ---- item 20: `ftc bench`'s input ---------------------------------------------------------------------------

@pytest.mark.parametrize("flags, named", [
    (["--out", "{tmp}/afile"], "OUT='{tmp}/afile' is not writable"),
    (["--data-dir", "{tmp}/no-glue"], "DATA_DIR='{tmp}/no-glue' has no mrpc/train.tsv"),
    (["--ranks", "1,256", "--cores-per-rank", "1024"], "RANKS=1,256 with CORES_PER_RANK=1024"),
    (["--tokenizer", "{tmp}/no-vocab"], "TOKENIZER='{tmp}/no-vocab' holds no vocab.txt or tokenizer.json"),
    (["--quick=maybe"], "QUICK='maybe' is not a boolean"),
], ids=["out a file", "no data", "too many ranks", "no vocabulary", "quick not a boolean"])
def test_bench_refuses_bad_input_in_one_line_before_making_anything(ftc_home, tmp_path, flags, named):
    (tmp_path / "afile").write_text("a file")
    (tmp_path / "no-vocab").mkdir()
    flags = [f.format(tmp=tmp_path) for f in flags]
    proc = ftc("bench", "--out", str(tmp_path / "bench"), *flags)
    assert proc.returncode == 2 and named.format(tmp=tmp_path) in one_error(proc)
    assert not (tmp_path / "bench").exists()


def test_quick_0_is_the_full_bench_and_every_bench_flag_has_help(ftc_home, tmp_path):
    # the full bench's rank counts (1,2,4), refused here only because no host has 4 x 1024 cores
    proc = ftc("bench", "--quick=0", "--cores-per-rank", "1024", "--out", str(tmp_path / "bench"))
    assert proc.returncode == 2 and "RANKS=1,2,4 with CORES_PER_RANK=1024" in one_error(proc)
    from runner.bench import build_parser
    assert [a.dest for a in build_parser()._actions if not a.help] == []


# ---- item 21: Make switches are parsed, never dropped -----------------------------------------------------

def test_make_passes_every_switch_value_to_ftc_and_quick_0_is_not_quick():
    dry = subprocess.run(["make", "-n", "-s", "bench", "QUICK=0", "run", "RESUME=yes", "KEEP=no"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    dry = " ".join(dry.split())
    assert "bench --quick='0'" in dry and "--keep='no' --resume='yes'" in dry


def test_make_run_honours_resume_yes_and_refuses_a_switch_it_cannot_read(ftc_home, minilm, glue_dir):
    job = [f"MODEL={minilm}", f"DATA_DIR={glue_dir}", "MAX_TRAIN_SAMPLES=16", "EPOCHS=1"]
    resumed = make("run", "NAME=rr", "NODES=1", "RESUME=yes", *job, home=ftc_home)
    assert resumed.returncode != 0 and "--resume: no checkpoint of mrpc" in resumed.stderr  # RESUME=yes is on
    for variable, target in (("RESUME", "run"), ("KEEP", "run"), ("QUICK", "bench")):
        proc = make(target, "NAME=rr", "NODES=1", f"{variable}=maybe", *job, home=ftc_home)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
        assert proc.returncode != 0 and errors == [f"error: {variable}='maybe' is not a boolean; "
                                                   "allowed: 1/0, true/false, yes/no"], proc.stderr
    assert sshd_pids(ftc_home) == [] and not (ftc_home / "clusters").exists()


# ---- items 23 and 24 ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("command, flag", [("run", "--detach"), ("sweep", "--detach"), ("sweep", "--resume")])
def test_a_flag_the_command_would_ignore_is_not_offered(ftc_home, command, flag):
    proc = ftc(command, "--name", "ig", flag)
    assert_refused(proc, f"unrecognized arguments: {flag}", ftc_home)


def test_a_data_dir_that_is_a_file_is_called_a_file(ftc_home, tmp_path):
    afile = tmp_path / "train.tsv"
    afile.write_text("not a directory")
    proc = ftc("finetune", "--name", "nowhere", "--data-dir", str(afile))
    assert_refused(proc, f"DATA_DIR='{afile}' is not a directory", ftc_home)


# ---- item 13, the job side: ~user of no such user -------------------------------------------------

@pytest.mark.parametrize("flag", ["--model", "--data-dir", "--results"])
def test_a_job_path_under_a_home_of_no_such_user_is_refused_by_name(ftc_home, minilm, glue_dir, flag):
    args = dict(zip(tiny_job(minilm, glue_dir)[::2], tiny_job(minilm, glue_dir)[1::2]))
    args[flag] = "~no-such-user-of-ftc/x"
    proc = ftc("run", "--name", "tilde", *[part for pair in args.items() for part in pair])
    line = one_error(proc)
    assert proc.returncode == 2 and "'~no-such-user-of-ftc' names no home directory" in line, line
    assert not (ftc_home / "clusters" / "tilde").exists() and sshd_pids(ftc_home) == []
