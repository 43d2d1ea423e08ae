"""Nothing a user gives reaches a shell unquoted: every shell template rendered with values holding a
newline, `$(...)`, backticks, quotes and `;` parses (`bash -n`) and, run with every command made a
no-op, runs none of the commands hidden in those values (a canary file stays absent)."""

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from provision.launch import MPI_FLAVOURS, RankLaunch, RankPlan, render_launch
from provision.stacks import STACKS
from provision.templates import render

# Each hidden command writes the canary by its absolute path: the only command left able to run
# once every other one is a no-op (command_not_found_handle below, PATH emptied).
TOUCH = "/usr/bin/touch"


def hostile(canary: Path) -> str:
    return f"a b\n{TOUCH} {canary}\n$({TOUCH} {canary}) `{TOUCH} {canary}`; {TOUCH} {canary}; 'q\" #"


# Sourced first by the non-interactive bash that runs each script (BASH_ENV): every command not found
# succeeds silently, and the builtins that would stop the script early (set -e, cd to a missing
# folder, exit, sourcing a missing file) do nothing, so every line of the script is reached.
NEUTRAL = """
command_not_found_handle() { return 0; }
set() { :; }
cd() { :; }
exit() { :; }
source() { :; }
"""


def assert_inert(script: str, tmp_path: Path, canary: Path) -> None:
    path = tmp_path / "script.sh"
    path.write_text(script)
    syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr + script
    neutral = tmp_path / "neutral.sh"
    neutral.write_text(NEUTRAL)
    subprocess.run(["/bin/bash", str(path)], capture_output=True, text=True, cwd=tmp_path, timeout=60,
                   env={"BASH_ENV": str(neutral), "PATH": str(tmp_path / "no-such-bin"), "HOME": str(tmp_path)})
    assert not canary.exists(), f"a command hidden in a value ran:\n{script}"


@pytest.mark.parametrize("mpi", MPI_FLAVOURS)
@pytest.mark.parametrize("stack", ["stock", "intel"])
def test_the_launch_script_quotes_every_value(tmp_path, mpi, stack):
    canary = tmp_path / "canary"
    bad = hostile(canary)
    spec = RankLaunch(description=bad, job_dir=bad, hostfile=bad, nodes=2, plan=RankPlan(2, 3, bad), python=bad,
                      module="runner.node.script_rank", pythonpath=bad, args=[bad, bad], mpi=mpi, mpirun=bad,
                      master_addr=bad, gloo_iface=bad, stack=stack, allocator=bad, env_file=bad, as_root=True,
                      env={"MY_SETTING": bad, "FTC_RUN_ID": bad})
    assert_inert(render_launch(spec), tmp_path, canary)
    assert_inert(render_launch(RankLaunch(**{**spec.__dict__, "program": [bad, bad]})), tmp_path, canary)


@pytest.mark.parametrize("given_python", ["", "python"])
def test_the_install_script_quotes_the_venv_and_your_python(tmp_path, given_python):
    canary = tmp_path / "canary"
    bad = hostile(canary)
    script = render("install.sh.j2", stack="stock", venv=bad, pins=STACKS["stock"], reuse_only=False, torch_index="",
                    extra_index="", given_python=bad if given_python else "", min_minor=11, no_system_packages=True)
    assert_inert(script, tmp_path, canary)


def test_the_node_environment_and_ssh_wrapper_quote_the_node_directory(tmp_path):
    canary = tmp_path / "canary"
    me = SimpleNamespace(name="c-0", workdir=hostile(canary))  # names are checked (NAME_RE); folders are not
    for template in ("env.sh.j2", "ssh.sh.j2"):
        assert_inert(render(template, me=me, cluster="c", venv=hostile(canary), own_host=True), tmp_path, canary)


def test_the_neutral_run_would_see_an_unquoted_value(tmp_path):
    """The check itself: the same value written unquoted into a script does run its command."""
    canary = tmp_path / "canary"
    with pytest.raises(AssertionError, match="a command hidden in a value ran"):
        assert_inert(f"#!/usr/bin/env bash\nX=$({TOUCH} {canary})\n", tmp_path, canary)
