"""The two kinds of failure a user sees, and how a bad command line is reported.

Every message names the value or the resource at fault and says what to do next;
the CLI prints it as one line and exits with the code below. A message names a setting and a next
command in the form the user runs ftc in: `--text-columns` and `ftc up --name ftc` at the ftc
command, `TEXT_COLUMNS` and `make cluster NAME=ftc` through the Makefile (`option`, `switch_on`, `command`).
"""

import argparse
import os
import shlex
import sys
from typing import Mapping

# A command stopped by Ctrl-C (or SIGTERM) exits with this code, as a shell's child does on SIGINT.
EXIT_INTERRUPTED = 130


class FtcError(Exception):
    """Something went wrong while doing the work (exit code 1)."""

    exit_code = 1


class UsageError(FtcError):
    """Bad input, refused before anything is created or changed (exit code 2)."""

    exit_code = 2


class ClusterBusy(FtcError):
    """Another ftc command holds the cluster's lock (exit code 3)."""

    exit_code = 3


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2, like every other bad input."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        sys.exit(2)


VIA_MAKE = "FTC_VIA_MAKE"  # the Makefile sets it to 1 on every ftc command it runs
MAKE_NAMES = {"with": "BOOTSTRAPPER", "arg": "ARGS", "run": "ID"}  # settings whose Make variable has another name
# Settings given at the ftc command as words of their own, not flags (`ftc launch -- SCRIPT ARGS`,
# `ftc runs show ID`), and the name a message gives them there.
OPERANDS = {"script": "script", "arg": "argument", "run": "id"}
MAKE_TARGETS = {"up": "cluster", "down": "destroy"}  # ftc commands whose make target has another name


def via_make(env: Mapping[str, str] | None = None) -> bool:
    """Whether this ftc was run by the Makefile (`env`: os.environ when None)."""
    return (os.environ if env is None else env).get(VIA_MAKE) == "1"


def option(key: str, env: Mapping[str, str] | None = None) -> str:
    """A setting named as the user gives it: 'text_columns' is `--text-columns` at the ftc command and
    `TEXT_COLUMNS` through make. A name already in upper case (an environment variable such as
    FTC_HOME) is shown as it is; an operand (OPERANDS) by its name: 'script' is `script` at the ftc
    command. Pure, given `env`."""
    if key.isupper():
        return key
    if via_make(env):
        return MAKE_NAMES.get(key, key.upper())
    return OPERANDS.get(key) or "--" + key.replace("_", "-")


def switch_on(key: str, env: Mapping[str, str] | None = None) -> str:
    """A switch turned on as the user gives it: 'yes' is `--yes` at the ftc command and `YES=1` through
    make. Pure, given `env`."""
    return f"{option(key, env)}=1" if via_make(env) else option(key, env)


def command(verb: str, env: Mapping[str, str] | None = None, **settings: object) -> str:
    """A command to run next, in the user's form: command("up", name="ftc") is `ftc up --name ftc`
    at the ftc command and `make cluster NAME=ftc` through make; each value quoted for the shell.
    Pure, given `env`."""
    make = via_make(env)
    words = ["make", MAKE_TARGETS.get(verb, verb)] if make else ["ftc", verb]
    joint = "=" if make else " "
    words += [f"{option(key, env)}{joint}{shlex.quote(str(value))}" for key, value in settings.items()]
    return " ".join(words)
