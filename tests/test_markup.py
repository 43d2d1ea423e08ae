"""Issue 27.14: a user's text that looks like rich markup (`[exp1]`, `[bold]` in a path, a name, an
exception) is printed as it is, never taken for a style and dropped: through the real `ftc` with an
FTC_HOME and a RESULTS directory that hold brackets, and through the two printers (the failure report,
the bootstrap's node board) that need a job or a bootstrap to reach otherwise."""

import json
import os
import time
from pathlib import Path

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
