"""A user's text that looks like rich markup (`[exp1]`, `[bold]` in a path, a name, an
exception) is printed as it is, never taken for a style and dropped: through the real `ftc` with an
FTC_HOME and a RESULTS directory that hold brackets, and through the two printers (the failure report,
the bootstrap's node board) that need a job or a bootstrap to reach otherwise."""

import json
import os
import time
from pathlib import Path

import pytest
from conftest import ftc
from helpers import state_of, state_path, up_local


def write_run(results: Path, run_id: str, model: str) -> None:
    """A finished run's record, as ftc writes run.json at launch and end (runner/runs.py)."""
    results.mkdir(parents=True)
    (results / "run.json").write_text(json.dumps({
        "id": run_id, "cluster": "mk", "provider": "local", "instance_type": "", "task": "mrpc", "model": model,
        "precision": "fp32", "status": "finished", "results_dir": str(results), "nodes": 1, "ranks_per_node": 1,
        "epochs": 1, "started_at": time.time() - 60, "ended_at": time.time(), "kind": "finetune"}))


def flat(text: str) -> str:
    """Text without its white space: a table folds a long path or caption across lines."""
    return "".join(text.split())


@pytest.mark.slow
def test_brackets_in_ftc_home_and_results_print_literally(ftc_home, tmp_path, monkeypatch):
    home = tmp_path / "h[exp1]" / "[bold]home"
    monkeypatch.setenv("FTC_HOME", str(home))
    elsewhere = tmp_path / "res[exp1]" / "r1"
    model = "/opt/m[bold]/model"
    up_local("mk", home)
    try:
        # a job of the cluster's that wrote into RESULTS=res[exp1]/r1: status names where its results are
        record = state_of(home, "mk")
        record["jobs"] = [{"id": "mrpc-1", "task": "mrpc", "remote_dir": "jobs/mrpc-1", "results_dir": str(elsewhere),
                           "state": "finished", "started_at": time.time()}]
        state_path(home, "mk").write_text(json.dumps(record))
        status = ftc("status", "--name", "mk")
        assert status.returncode == 0, status.stderr
        assert "mk-0" in status.stdout and f"results: {elsewhere}" in status.stdout, status.stdout

        write_run(elsewhere, "mrpc-1", model)
        write_run(home / "runs" / "mk" / "mrpc-0", "mrpc-0", model)
        (home / "runs" / "elsewhere").write_bytes(os.fsencode(elsewhere) + b"\n")
        listed = ftc("runs")
        assert listed.returncode == 0, listed.stderr
        assert "m[bold]" in listed.stdout, listed.stdout  # the model column: the model's directory name
        assert flat(f"{home / 'runs'}/<cluster>/<id>") in flat(listed.stdout), listed.stdout  # the caption

        shown = ftc("runs", "show", "mrpc-1")
        assert shown.returncode == 0, shown.stderr
        assert "run mrpc-1" in shown.stdout and model in shown.stdout, shown.stdout
        assert flat(f"results │ {elsewhere}") in flat(shown.stdout), shown.stdout
        assert (elsewhere / "report.md").exists()
    finally:
        gone = ftc("down", "--name", "mk")
    assert gone.returncode == 0, gone.stderr
    assert "cluster mk is gone" in gone.stderr


def test_refusals_name_paths_with_brackets_literally(ftc_home, tmp_path):
    results = ftc("finetune", "--name", "nope", "--results", "/proc/r[exp1]/x")
    assert results.returncode == 2 and "'/proc/r[exp1]/x'" in results.stderr, results.stderr
    config = tmp_path / "c[bold].toml"
    missing = ftc("up", "--name", "mk", "--config", str(config))
    assert missing.returncode == 2 and repr(str(config)) in missing.stderr, missing.stderr
    assert not (ftc_home / "clusters").exists() or not any((ftc_home / "clusters").iterdir())


def test_no_runs_yet_names_a_home_with_brackets(ftc_home, tmp_path, monkeypatch):
    home = tmp_path / "h[exp1]"
    monkeypatch.setenv("FTC_HOME", str(home))
    listed = ftc("runs")
    assert listed.returncode == 0 and f"no runs under {home / 'runs'} yet" in listed.stderr, listed.stderr


def test_a_failure_report_shows_paths_and_exceptions_literally(tmp_path, capsys):
    from runner import report
    results = tmp_path / "res[exp1]"
    (results / "logs").mkdir(parents=True)
    (results / "output.log").write_text("[0] Traceback (most recent call last):\n"
                                        '[0]   File "/w[bold]/train.py", line 1, in <module>\n'
                                        "[0] ValueError: no file /data[exp1]/train.csv\n")
    report.show_failure(results, 1)
    shown = capsys.readouterr().err
    assert f"results so far in {results}" in shown, shown
    assert "ValueError: no file /data[exp1]/train.csv" in shown and "/w[bold]/train.py" in shown, shown


def test_the_node_board_shows_steps_and_details_literally(capsys):
    from provision.ui import NodeBoard
    with NodeBoard("bootstrap mk", ["mk-0"]) as board:
        board.update("mk-0", "FAILED: install", "pip: no such file /wheels[exp1]/x.whl")
    shown = capsys.readouterr().err
    assert "/wheels[exp1]/x.whl" in shown, shown


# A window title (OSC, ended by BEL), a cleared screen and a cursor move (CSI), a colour (SGR), an 8-bit
# CSI (C1), a backspace and a bell, a hyperlink (OSC 8, ended by ST), a terminal reset; and plain text
# around them that must come through as it is: a tab, non-ASCII, brackets.
CODES = ("a\x1b]0;pwned title\x07b \x1b[2J\x1b[Hc \x1b[31mred\x1b[0m \x9b31m d\x08\x07 é\t[x] "
         "\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\ end\x1bc")


def test_terminal_codes_in_a_ranks_output_never_reach_the_terminal():
    from runner.report import for_terminal, printable
    assert printable(CODES) == "ab c red 31m d é\t[x] link end"
    assert for_terminal(f"[0] {CODES}", colour=True) == "[0] ab c \x1b[31mred\x1b[0m 31m d é\t[x] link end"
    plain = "[1,0]<stdout>:rank 0/2 cores [0, 1] loss 0.5 - naïve 日本 100%"
    assert for_terminal(plain, colour=False) == plain == for_terminal(plain, colour=True)


def test_a_failure_report_passes_no_terminal_code_of_a_ranks_log(tmp_path, capsys):
    from runner import report
    from runner.node.protocol import line_mark
    results = tmp_path / "res"
    (results / "logs").mkdir(parents=True)
    mark = line_mark("mrpc-1")
    # rank 1 killed (no traceback of its own): its log's tail and mpirun's verdict are shown
    (results / "logs" / "rank1.log").write_text(f"{mark} 10:00:00 loading\nwarning: {CODES}\n")
    (results / "output.log").write_text(f"[0] {mark} 10:00:00 rank 0/2\n"
                                        f"=   RANK 1 PID 7 RUNNING AT n-1 {CODES}\n=   KILLED BY SIGNAL: 9\n")
    report.show_failure(results, 9)
    shown = capsys.readouterr().err
    assert "warning: ab c red 31m d é" in shown and "10:00:00 loading" in shown, shown
    assert "RUNNING AT n-1 ab c red" in shown and mark not in shown, shown
    assert not any(code in shown for code in ("\x1b", "\x07", "\x08", "\x9b")), repr(shown)

    # a rank that raised: its exception's message holds the codes
    (results / "output.log").write_text(f"[1] Traceback (most recent call last):\n[1]   File \"x.py\", line 1\n"
                                        f"[1] ValueError: bad {CODES}\n")
    report.show_failure(results, 1)
    shown = capsys.readouterr().err
    assert "ValueError: bad ab c red" in shown and not any(code in shown for code in ("\x1b", "\x07")), repr(shown)
