"""Messages name a setting and a next command in the form the user runs ftc in: `--text-columns` and
`ftc up --name x` at the ftc command, `TEXT_COLUMNS` and `make cluster NAME=x` through the Makefile
(which sets FTC_VIA_MAKE=1 on its ftc calls)."""

import io

import pytest
from conftest import ftc
from helpers import make, one_error, toy_csv

from provision.errors import UsageError, command, option, switch_on
from provision.providers import own_servers
from runner import runs, script_job
from runner.bench.common import rank_layout

MAKE = {"FTC_VIA_MAKE": "1"}


def errors(made) -> list[str]:
    """ftc's error lines of a make run (make adds its own `make: *** ...` line)."""
    return [line for line in made.stderr.splitlines() if line.startswith("error: ")]


def test_an_option_and_a_command_are_rendered_in_the_users_form():
    assert (option("text_columns", {}), option("text_columns", MAKE)) == ("--text-columns", "TEXT_COLUMNS")
    assert (option("with", {}), option("with", MAKE)) == ("--with", "BOOTSTRAPPER")  # make's name differs
    assert option("FTC_HOME", {}) == option("FTC_HOME", MAKE) == "FTC_HOME"  # an environment variable as it is
    assert command("up", {}, name="ftc") == "ftc up --name ftc"
    assert command("up", MAKE, name="ftc") == "make cluster NAME=ftc"
    assert command("down", MAKE, name="x", region="us-east-1") == "make destroy NAME=x REGION=us-east-1"
    assert command("finetune", {}, name="a b") == "ftc finetune --name 'a b'"  # quoted for the shell
    # operands, typed without a flag at the ftc command (`ftc launch -- SCRIPT ARGS`, `ftc runs show ID`)
    assert (option("script", {}), option("script", MAKE)) == ("script", "SCRIPT")
    assert (option("arg", {}), option("arg", MAKE)) == ("argument", "ARGS")  # one of the ARGS
    assert (option("run", {}), option("run", MAKE)) == ("id", "ID")  # make's name differs
    assert (option("max_workdir_mb", {}), option("max_workdir_mb", MAKE)) == ("--max-workdir-mb", "MAX_WORKDIR_MB")
    assert (switch_on("yes", {}), switch_on("yes", MAKE)) == ("--yes", "YES=1")  # a switch turned on


@pytest.mark.parametrize("via_make", [False, True], ids=["ftc", "make"])
def test_launch_runs_bench_and_host_key_messages_name_the_users_form(ftc_home, tmp_path, monkeypatch, via_make):
    if via_make:
        monkeypatch.setenv("FTC_VIA_MAKE", "1")

    def refusal(step) -> str:
        with pytest.raises(UsageError) as refused:
            step()
        return str(refused.value)

    missing = str(tmp_path / "missing.py")
    assert refusal(lambda: script_job.validate(missing, [])).startswith(
        f"{'SCRIPT' if via_make else 'script'}={missing!r} is not a file")
    assert refusal(lambda: script_job.validate("", [])) == (
        "SCRIPT is missing; give your training script" if via_make else
        "script is missing; give your training script: `ftc launch -- train.py [ARGS...]`")
    assert refusal(lambda: script_job.validate(missing, [], workdir=missing)).startswith(
        f"{'WORKDIR' if via_make else '--workdir'}={missing!r} is not a directory")
    assert refusal(lambda: runs.find("nosuch")) == (
        f"{'ID' if via_make else 'id'}='nosuch' is not a run ftc knows; allowed: an id from "
        f"`{'make runs' if via_make else 'ftc runs'}` (none yet)")
    assert refusal(lambda: rank_layout(None, None, quick=False, physical=2)).startswith(
        "RANKS=1,2,4 with CORES_PER_RANK=1: " if via_make else "--ranks=1,2,4 with --cores-per-rank=1: ")
    monkeypatch.setattr("sys.stdin", io.StringIO())  # no terminal to ask on
    assert refusal(lambda: own_servers._trust([], [], yes=False)).endswith(
        f"then add {'YES=1' if via_make else '--yes'} to trust them; nothing changed")


def test_make_runs_names_the_id_variable(ftc_home):
    made = make("runs", "ID=nosuch", home=ftc_home)
    assert made.returncode == 2 and errors(made) == [
        "error: ID='nosuch' is not a run ftc knows; allowed: an id from `make runs` (none yet)"]


def test_a_cli_user_is_told_the_flags_and_a_make_user_the_variables(ftc_home, tmp_path):
    """The new-user hour's case: `--text-columns` was answered with TEXT_COLUMNS, `make cluster NAME=`."""
    data = toy_csv(tmp_path / "t.csv", 9)
    cli = ftc("finetune", "--name", "nowhere", "--train-file", str(data), "--validation-file", str(data))
    assert one_error(cli) == (f"error: {data}: line 1: no column 'text' (columns: 'review', 'stars'); "
                              "name the file's columns with --text-columns")
    made = make("finetune", "NAME=nowhere", f"TRAIN_FILE={data}", f"VALIDATION_FILE={data}", home=ftc_home)
    assert made.returncode == 2 and errors(made) == [
        f"error: {data}: line 1: no column 'text' (columns: 'review', 'stars'); name the file's columns with TEXT_COLUMNS"]
    cli = ftc("status", "--name", "nosuch")
    assert one_error(cli).startswith("error: --name='nosuch': no cluster of that name") and \
        "start one with `ftc up --name nosuch` or list them with `ftc status`" in cli.stderr
    made = make("status", "NAME=nosuch", home=ftc_home)
    [refusal] = errors(made)
    assert refusal.startswith("error: NAME='nosuch': no cluster of that name") and \
        "start one with `make cluster NAME=nosuch` or list them with `make status`" in refusal
