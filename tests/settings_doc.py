"""docs/settings.md, written from what defines the settings: the Makefile's variables (each `$(call
flag,VAR,option)` hands VAR to ftc as `--option`) and ftc's own argument parser (which commands take
each option, and its help). `make settings-doc` rewrites the file; tests/test_settings_doc.py fails
when it is not current.

    .venv/bin/python tests/settings_doc.py [--out docs/settings.md]
"""

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from runner.cli_parser import build_parser  # noqa: E402

FLAG_CALL = re.compile(r"\$\(call flag,([A-Z0-9_]+),([a-z0-9-]+)\)")
INPUTS = re.compile(r"^INPUTS := ((?:.*\\\n)*.*)$", re.MULTILINE)
# Make variables that are not an option of ftc's own parser: the make target that reads each, and what it takes.
MAKE_ONLY = {
    "SCRIPT": ("launch", "the script every rank runs (a path inside WORKDIR when WORKDIR is given); "
               "default: examples/hf_trainer_glue.py on ../shared's MRPC"),
    "ARGS": ("launch", "the script's arguments, split as a shell would, never run by one"),
    "BOOTSTRAPPER": ("bootstrap", "fabric (default) or ansible: what bootstraps the nodes"),
    "QUICK": ("bench", "1: the quick bench (a 1-layer model, 128 rows: minutes on 2 cores)"),
    "MODE": ("bench", "the bench's mode (default scaling): `ftc bench --help` lists them, docs/bench.md says what each "
             "measures"),
    "SHAPES": ("bench", "MODE=long-jobs: node shapes, nodes x cores per node (default 1x16)"),
    "PRICES": ("aws-catalog", "Karpenter's zz_generated.pricing_aws.go, the prices of the catalog's snapshot"),
    "PORT": ("ec2-emulator", "the emulator's port (default 5000)"),
    "ID": ("runs", "one run's id: `make runs ID=<id>` shows it"),
}
HEADER = """# Settings

Every setting of `make` and `ftc`, written from the Makefile and ftc's argument parser by
`make settings-doc` (a test fails when this file is not current).

**Precedence**: command-line flag (which the Makefile fills from its variable) > environment
variable `FTC_<NAME>` (for example `FTC_NODES=4`; read for the cluster's settings, the job's flags,
`NAME` and `YES`) > config file (`CONFIG=path`, `$FTC_CONFIG`, or `./ftc.toml`: a `[cluster]` table of
the cluster's settings, with the lower-case names) > default. Switches take `1`/`0` (also
`yes`/`no`, `true`/`false`); any other value is refused, never dropped. A value holding a newline is
refused before any recipe runs. Bad input gets one line naming the value and what is allowed, exit
code 2, and nothing is created or changed.

| Make variable | ftc option | commands | what it takes |
|---|---|---|---|
"""


def makefile_variables(makefile: Path) -> tuple[list[str], dict[str, str]]:
    """Every variable the Makefile's recipes read (its INPUTS), and the ftc option each `$(call flag,...)`
    makes of one."""
    text = makefile.read_text()
    options: dict[str, str] = {}
    for var, option in FLAG_CALL.findall(text):
        if var != "VAR":  # the comment that shows the call's form
            options.setdefault(var, option)
    return INPUTS.search(text).group(1).replace("\\", " ").split(), options


def parser_options(parser: argparse.ArgumentParser) -> dict[str, tuple[list[str], str]]:
    """Each `--option` of ftc's commands: the commands that take it and the first help text given."""
    found: dict[str, tuple[list[str], str]] = {}
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for command, sub in subparsers.choices.items():
        for action in sub._actions:
            for option in action.option_strings:
                if not option.startswith("--") or option == "--help":
                    continue
                commands, text = found.get(option, ([], ""))
                help_text = action.help if action.help and action.help != argparse.SUPPRESS else ""
                found[option] = (commands + [command], text or help_text)
    return found


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def settings_table(makefile: Path = REPO / "Makefile") -> str:
    """The table's rows in the Makefile's INPUTS order; a variable neither ftc's parser nor MAKE_ONLY
    describes fails, naming it."""
    parsed = parser_options(build_parser())
    names, options = makefile_variables(makefile)
    rows = []
    for var in sorted(names):
        commands, text = parsed.get(f"--{options.get(var, '')}", ([], ""))
        if var in MAKE_ONLY:
            target, text = MAKE_ONLY[var]
            option, commands = (f"`--{options[var]}`" if var in options else ""), [f"make {target}"]
        elif commands and text:
            option = f"`--{options[var]}`"
        else:
            raise SystemExit(f"the Makefile's {var} has no help in ftc's parser or in {__file__}'s MAKE_ONLY")
        rows.append(f"| `{var}` | {option} | {', '.join(commands)} | {cell(text)} |")
    return HEADER + "\n".join(rows) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "docs" / "settings.md"))
    Path(ap.parse_args().out).write_text(settings_table())


if __name__ == "__main__":
    main()
