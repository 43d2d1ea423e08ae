"""The two kinds of failure a user sees, and how a bad command line is reported.

Every message names the value or the resource at fault and says what to do next;
the CLI prints it as one line and exits with the code below.
"""

import argparse
import sys


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
