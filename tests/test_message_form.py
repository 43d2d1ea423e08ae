"""Messages name a setting and a next command in the form the user runs ftc in: `--text-columns` and
`ftc up --name x` at the ftc command, `TEXT_COLUMNS` and `make cluster NAME=x` through the Makefile
(which sets FTC_VIA_MAKE=1 on its ftc calls)."""

from conftest import ftc
from helpers import make, one_error, toy_csv

from provision.errors import command, option

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
