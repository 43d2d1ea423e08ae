"""What the user reads: answers on stdout and progress on stderr, JSON for scripts, the only cluster
picked without a name, help for every flag, a failed job's exception, and a destroy that ends a follower."""

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import FTC, ftc
from helpers import following, held_job, read_until

from runner.node.protocol import line_mark
from runner.report import first_bad_rank, for_terminal, progress, tracebacks

MARK = line_mark("mrpc-1")  # the job's: the training program's logger starts each of its lines with it
IMPI_OUTPUT = f"""\
[0] {MARK} 10:00:01 rank 0/2 (local 0/1) cores [0] threads 1 backend gloo precision bf16 grad_compress bf16 recipe ftc
[0] {MARK} 10:00:02 \x1b[1mcoloured\x1b[0m line
[0] {MARK} 23:59:50 epoch 1/2 step 1/10 loss 0.6957 25.0 samples/s eta 0m23s
[1] Traceback (most recent call last):
[1]   File "/x/train.py", line 9, in main
[1]     load()
[1] ValueError: MRPC row 7 has no label
[1] [W gloo] connection closed by peer
[0] {MARK} 23:59:58 epoch 1/2 step 5/10 loss 0.6381 23.0 samples/s eta 0m13s
[0] {MARK} 23:59:59 epoch 1 dev eval_accuracy 0.6838 eval_f1 0.8122
[0] {MARK} 00:00:04 epoch 2/2 step 6/10 loss 0.6337 22.9 samples/s eta 0m11s

===================================================================================
=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES
"""


def test_job_output_loses_colour_codes_off_a_terminal_but_not_a_traceback():
    shown = [for_terminal(line, colour=False) for line in IMPI_OUTPUT.splitlines()]
    assert "[0] 10:00:02 coloured line" in shown and not any("\x1b" in line for line in shown)
    assert "[1] ValueError: MRPC row 7 has no label" in shown and shown[-1].startswith("=   BAD TERMINATION")
    assert for_terminal("[0] \x1b[1mbold\x1b[0m", colour=True) == "[0] \x1b[1mbold\x1b[0m"
    assert for_terminal("[0] \x1b[1mbold\x1b[0m", colour=False) == "[0] bold"


def test_a_ranks_traceback_is_read_from_output_log_under_either_mpi_prefix():
    assert tracebacks(IMPI_OUTPUT) == {1: ["Traceback (most recent call last):", '  File "/x/train.py", line 9, in main',
                                           "    load()", "ValueError: MRPC row 7 has no label"]}
    openmpi = "\n".join(f"[1,1]<stderr>:{line[4:]}" for line in IMPI_OUTPUT.splitlines() if line.startswith("[1]"))
    assert tracebacks(openmpi)[1][-1] == "ValueError: MRPC row 7 has no label"


def test_a_traceback_written_in_pieces_is_read_whole():
    # Intel MPI on a busy machine: the rank's prefix repeated wherever a write ended mid-line
    output = ("[0] 16:25:09 rank 0/1 (local 0/1) cores [0, 1]\n[0] Traceback (most recent call last):\n"
              '[0]   File "x.py", line 331, in build_model\n[0]     [0] model = load([0] \n'
              "[0]  [0]  [0] ^[0] ^[0] ^\n[0]     [0] raise RuntimeError([0] \n"
              "[0] RuntimeError[0] : [0] sizes do not match[0] \n")
    raised = tracebacks(output)[0]
    assert "    raise RuntimeError(" in raised and raised[-1].rstrip() == "RuntimeError: sizes do not match"


def test_the_failing_rank_is_the_one_mpirun_names_first():
    hydra = IMPI_OUTPUT + "=   RANK 1 PID 12884 RUNNING AT lost-1\n=   KILLED BY SIGNAL: 9 (Killed)\n"
    openmpi = "mpirun noticed that process rank 3 with PID 0 on node n-1 exited on signal 9 (Killed).\n"
    assert (first_bad_rank(hydra), first_bad_rank(openmpi), first_bad_rank(IMPI_OUTPUT)) == (1, 3, None)


def test_progress_lines_give_throughput_over_time_across_midnight():
    steps, dev = progress(IMPI_OUTPUT, MARK)
    assert [s["seconds"] for s in steps] == [0.0, 8.0, 14.0]  # 00:00:04 came after 23:59:59: the next day
    assert [s["samples_per_second"] for s in steps] == [25.0, 23.0, 22.9]
    assert steps[1]["epoch"] == 1.0 and dev == [{"epoch": 1, "eval_accuracy": 0.6838, "eval_f1": 0.8122}]


def test_every_flag_of_every_subcommand_has_a_help_line():
    import argparse

    from runner.cli_parser import build_parser
    missing = []

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}")
            elif not action.help and not isinstance(action, argparse._HelpAction):
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    walk(build_parser(), "ftc")
    assert missing == []


@pytest.mark.slow
def test_status_and_json_go_to_stdout_and_the_only_cluster_is_picked(ftc_home):
    none = ftc("status", "--json")
    assert none.returncode == 0 and json.loads(none.stdout) == []
    up = ftc("up", "--name", "solo", "--nodes", "1", "--no-bootstrap")
    assert up.returncode == 0 and "not bootstrapped; next: `ftc bootstrap --name solo`" in up.stderr  # a job needs it
    try:
        listed = ftc("status", "--json")
        assert [c["name"] for c in json.loads(listed.stdout)] == ["solo"]
        assert json.loads(listed.stdout)[0]["nodes"][0]["live"] == "running"
        table = ftc("status", "--name", "solo")
        assert "solo-0" in table.stdout and "running" in table.stdout and "solo-0" not in table.stderr
        logs = ftc("logs")  # no name: the only cluster, said on stderr
        assert "cluster solo (the only one)" in logs.stderr
        assert logs.returncode == 2 and "cluster 'solo' has run no job yet" in logs.stderr and logs.stdout == ""
    finally:
        assert ftc("down", "--name", "solo").returncode == 0


def broken_model(minilm: str, where: Path) -> Path:
    """The packaged MiniLM with a config whose layer sizes its weights do not have: it passes the
    controller's checks and every rank raises while loading it."""
    where.mkdir()
    for item in Path(minilm).iterdir():
        if item.name != "config.json":
            (where / item.name).symlink_to(item)
    config = json.loads((Path(minilm) / "config.json").read_text())
    (where / "config.json").write_text(json.dumps({**config, "intermediate_size": 1024}))
    return where


@pytest.mark.slow
def test_a_failed_job_shows_the_ranks_exception_and_a_destroy_ends_the_follower(ftc_home, tmp_path, minilm,
                                                                               glue_dir):
    assert ftc("up", "--name", "out", "--nodes", "1").returncode == 0
    try:
        failed = ftc("finetune", "--name", "out", "--task", "mrpc", "--data-dir", str(glue_dir),
                     "--model", str(broken_model(minilm, tmp_path / "broken")), "--max-train-samples", "64")
        assert failed.returncode == 1, failed.stderr[-2000:]
        job = json.loads((ftc_home / "clusters" / "out" / "state.json").read_text())["jobs"][-1]
        output_log = Path(job["results_dir"]) / "output.log"
        assert "--- rank 0 raised RuntimeError: " in failed.stderr and "    raise RuntimeError(" in failed.stderr
        assert f"rank 0's full log: {output_log}" in failed.stderr
        # transformers' load report: in the rank's log, out of the terminal and of output.log
        assert "LOAD REPORT" in (output_log.parent / "logs" / "rank0.log").read_text()
        assert "LOAD REPORT" not in output_log.read_text() and "LOAD REPORT" not in failed.stdout + failed.stderr
        logs = ftc("logs", "--name", "out")
        assert "LOAD REPORT" not in logs.stdout and "\x1b[" not in logs.stdout

        follower = subprocess.Popen([*FTC, "finetune", "--name", "out", "--task", "mrpc", "--model", minilm,
                                     "--data-dir", str(glue_dir), "--max-eval-samples", "64", "--max-train-samples", "128"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env={**os.environ, "FTC_HOLD_AT_STEP": "2"})
        held_job(ftc_home, "out", follower)  # training: now the cluster goes
        following(follower)
    finally:
        assert ftc("down", "--name", "out").returncode == 0
    _, err = follower.communicate(timeout=120)
    assert follower.returncode == 1 and "error: cluster out was destroyed while job" in err, err[-2000:]
    assert "busy" not in err


@pytest.mark.slow
def test_ctrl_c_during_a_one_shot_run_says_what_it_tore_down(ftc_home, minilm, glue_dir):
    run = subprocess.Popen([*FTC, "run", "--name", "stop", "--nodes", "1", "--task", "mrpc", "--model", minilm,
                            "--data-dir", str(glue_dir), "--epochs", "10"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    read_until(run, run.stdout, lambda line: " step " in line, "a step's line")
    run.send_signal(signal.SIGINT)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 130, err[-2000:]
    assert "interrupted: stopped job mrpc-" in err and "and tore down cluster stop (1 local node(s))" in err
    assert "Reattach" not in err and not (ftc_home / "clusters" / "stop").exists()
