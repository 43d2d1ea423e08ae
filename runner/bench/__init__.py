"""`ftc bench MODE ...`: ftc measured side by side with what users would run instead, on one machine,
reported as ratios. One module a mode (`ftc bench MODE --help` for its options); runner/bench/common.py
holds what they share.

    ftc bench scaling --quick                 # CI: minutes on 2 cores
    ftc bench scaling --ranks 1,4             # the full bench, on a real multi-core host
    ftc bench network c7i.16xlarge --quick    # on an emulated c7i network (root)
    ftc bench long-jobs 1x16                  # a long job's rate on a whole 16-core node
    python -m runner.bench MODE ...           # the same, without ftc's other commands (a device machine)
"""

import argparse
import shlex
import sys

from provision.errors import FtcError, OneLineParser

from . import accuracy, bootstrap, end_to_end, launch, long_jobs, network, scaling

# Each mode: NAME, HELP, add_arguments(parser), checked(args) (every input, before anything is made)
# and run(args) -> exit code.
MODES = (scaling, accuracy, launch, network, long_jobs, end_to_end, bootstrap)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="ftc bench", description=__doc__.split("\n\n")[0])
    modes = p.add_subparsers(dest="mode", metavar="MODE", required=True)
    for mode in MODES:
        sub = modes.add_parser(mode.NAME, help=mode.HELP, description=mode.__doc__.split("\n\n")[0])
        mode.add_arguments(sub)
        sub.set_defaults(run=mode.run, checked=mode.checked)
    return p


def main(argv: list[str] | None = None) -> int:
    """`ftc bench ...` and `python -m runner.bench ...`: every input checked first; a bad one is one
    line and exit code 2, with nothing made."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help"):  # argparse would name a later word
        print(f"error: {argv[0]!r} is not a mode: the mode comes first, `ftc bench MODE [OPTIONS]`; allowed: "
              f"{', '.join(mode.NAME for mode in MODES)}", file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv)
    args.command_line = "ftc bench " + shlex.join(argv)
    try:
        args.checked(args)
        return args.run(args)
    except FtcError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
