"""The names the controller and the nodes share are spelled once. Each file of a job's directory and
each word a shell command echoes for ftc to read is declared in runner/node/protocol.py (a provider's
own scripts' words in its module), used from there, and rendered into the templates from there: a
literal spelling elsewhere in runner/, provision/ or templates/ is a second copy that can drift from
the first. Docstrings and comments may name them. And the training program's loop state is one
record, so none of its helpers takes more than 4 parameters."""

import ast
import re
from pathlib import Path

from conftest import REPO

from provision.providers import own_servers
from runner.node import protocol as p

PROTOCOL = "runner/node/protocol.py"
# Folders and bare names of the job's directory: spelled when joined onto a path (`job_dir / "logs"`,
# f"{job}/logs", "$JOB_DIR/logs") or a path begins with one ("logs/..."), since the same words mean other
# things elsewhere (`ftc logs`, run.json's "exit_code", a "model" setting, /path/to/model).
PATH_PARTS = {p.LOGS_DIR, p.DATA_DIR, p.CHECKPOINTS_DIR, p.MODEL_DIR, p.TENSORBOARD_DIR, p.KERNEL_CACHE_DIR,
              p.SCRIPT_WORKDIR, p.EXIT_CODE_FILE, p.HELD_FILE, p.RELEASE_FILE}
# File names: spelled wherever they stand in a string.
FILE_NAMES = {p.LAUNCH_SCRIPT, p.OUTPUT_LOG, p.CHECKPOINT_FILE, p.RESULTS_FILE, p.PREEMPTED_FILE, p.PREEMPTED_NOTE,
              p.REQUIREMENTS_FILE, p.REQUIREMENTS_LOG}
RANK_FILE = re.compile(r"rank(\{\}|\*)\.")  # a rank's log or exit record: f"rank{r}.log", "rank*.exit.json"
# Words a shell command echoes for the controller, and the module that declares each.
TOKENS = {value: PROTOCOL for value in (p.JOB_RUNNING, p.JOB_PREEMPTED, p.LOGIN_REFUSED, p.REQUIREMENTS_SKIPPED,
                                        p.REQUIREMENTS_DONE, p.REQUIREMENTS_FAILED, p.BOOTSTRAP_STEP,
                                        p.BOOTSTRAP_SKIP, p.BOOTSTRAP_FACTS)}
TOKENS |= {own_servers.CLEANED: "provision/providers/own_servers.py", own_servers.NOT_OURS: "provision/providers/own_servers.py"}
# The same letters meaning something else, where they do.
OTHER_MEANINGS = {
    ("runner/report.py", p.JOB_RUNNING): "Intel MPI's own failure message, `RANK n PID p RUNNING AT host`",
    ("runner/jobspec.py", p.DATA_DIR): "../shared/data/glue, the GLUE copy beside the repository",
    ("runner/model_files.py", p.MODEL_DIR): "the packaged MiniLM's folder in its Python package",
    ("provision/bootstrap.py", p.REQUIREMENTS_FAILED): "the node board's word for a failed bootstrap step",
    ("provision/providers/slurm.py", p.JOB_RUNNING): "Slurm's JobState of an allocation that runs",
}
MAX_PARAMETERS = 4


def strings(source: str) -> list[str]:
    """Every string literal of a Python module but its docstrings: an f-string with `{}` for each
    value it formats, and a string joined into a path with `/` (pathlib's operator) with a `/` before
    and after it."""
    tree = ast.parse(source)
    skipped = {id(node.body[0].value) for node in ast.walk(tree)
               if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
               and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    joined = {id(side) for node in ast.walk(tree) if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
              for side in (node.left, node.right)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skipped |= {id(part) for part in node.values}
            found.append("".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped:
            found.append(f"/{node.value}/" if id(node) in joined else node.value)
    return found


def template_text(path: Path) -> list[str]:
    """A template's lines but its comments."""
    return [line for line in path.read_text().splitlines() if not line.lstrip().startswith(("#", "{#"))]


def spellings(relative: str, texts: list[str]) -> list[str]:
    """`relative`'s spellings of a shared name outside the module that declares it."""
    found = []
    for text in texts:
        named = [v for v in PATH_PARTS if re.search(rf"(^|\{{\}}|\$\{{?\w+\}}?\"?)/{v}(?![\w.-])|^{v}/", text)]
        named += [v for v in FILE_NAMES if re.search(rf"(?<![\w.-]){re.escape(v)}(?![\w-]|\.\w)", text)]
        # not a shell variable of that name ($DONE, DONE=...)
        named += [v for v, owner in TOKENS.items() if owner != relative and re.search(rf"(?<![\w$-]){v}(?![\w=-])", text)]
        named += [f"rank{m.group(1)}." for m in RANK_FILE.finditer(text)]
        found += [f"{relative}: {v!r} in {text!r}" for v in named if (relative, v) not in OTHER_MEANINGS]
    return found


def test_no_job_file_name_or_shell_word_is_spelled_outside_the_module_that_declares_it():
    found = []
    for top in ("runner", "provision"):
        for path in sorted((REPO / top).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            if relative != PROTOCOL:
                found += spellings(relative, strings(path.read_text()))
    for path in sorted((REPO / "templates").iterdir()):
        found += spellings(path.relative_to(REPO).as_posix(), template_text(path))
    assert not found, "spelled again instead of used from its declaration:\n" + "\n".join(found)


def test_the_check_finds_each_kind_of_spelling(tmp_path):
    """The check itself: a path joined with `/`, a name in an f-string's shell command, a rank's log,
    a shell word in a template; not a docstring, a comment, nor the same word meaning something else."""
    source = ('"""output.log is named here"""\n'
              'def f(d, r):\n'
              '    # results.json in a comment\n'
              '    return (d / "logs", f"cat {d}/exit_code; tail {d}/output.log", f"rank{r}.log", {"exit_code": 1},\n'
              '            "/path/to/a/model", "launch.sh.j2")\n')
    assert sorted(line.split(": ", 1)[1].split(" in ")[0] for line in spellings("x.py", strings(source))) == \
        ["'exit_code'", "'logs'", "'output.log'", "'rank{}.'"]
    template = tmp_path / "t.sh.j2"
    template.write_text('# echo CLEANED\nDONE="$WD/done"; touch "$DONE/x"\nmkdir "$JOB_DIR/logs"\necho CLEANED\n')
    assert spellings("templates/t.sh.j2", template_text(template)) == [
        "templates/t.sh.j2: 'logs' in 'mkdir \"$JOB_DIR/logs\"'", "templates/t.sh.j2: 'CLEANED' in 'echo CLEANED'"]
    assert spellings("provision/providers/own_servers.py", ['CLEANED = "CLEANED"']) == []


def test_no_helper_of_the_training_program_takes_more_than_4_parameters():
    """The loop's state travels as one record (train.Training), not as a dozen positional parameters."""
    tree = ast.parse((REPO / "runner/node/train.py").read_text())
    wide = [f"{node.name}: {len(names)}" for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
            for names in [[a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                           if a.arg not in ("self", "cls")]]
            if len(names) > MAX_PARAMETERS]
    assert not wide, wide
