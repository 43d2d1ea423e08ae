"""The bootstrap (Fabric's, on local nodes): a second one skips finished steps, a dead node or a
failed install is named with its step and stays resumable, an interrupted one says how to go on,
its tuning variables are checked first, and the stock stack installs into a fresh venv."""

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import FTC, ftc, sshd_pids
from helpers import only_line, state_of, up_local, wait_for

from provision.stacks import STACKS, UV_VERSION

pytestmark = pytest.mark.slow


def test_second_bootstrap_skips_finished_steps(ftc_home):
    assert ftc("up", "--name", "twice", "--nodes", "2").returncode == 0
    workdirs = [Path(n["workdir"]) for n in state_of(ftc_home, "twice")["nodes"]]
    written = {p: p.stat().st_mtime_ns for w in workdirs for p in (w / "install.sh", w / "hostfile", w / "facts.json")}
    markers = sorted(p.name for w in workdirs for p in (w / ".ftc" / "done").iterdir())
    again = ftc("bootstrap", "--name", "twice")
    assert again.returncode == 0, again.stderr
    assert {p: p.stat().st_mtime_ns for p in written} == written
    assert sorted(p.name for w in workdirs for p in (w / ".ftc" / "done").iterdir()) == markers
    ftc("down", "--name", "twice", check=True)


def test_node_killed_before_bootstrap_is_named_and_reported(ftc_home):
    assert ftc("up", "--name", "kill", "--nodes", "2", "--no-bootstrap").returncode == 0
    victim = state_of(ftc_home, "kill")["nodes"][1]
    os.kill(victim["pid"], signal.SIGKILL)  # queued only: the process goes when it is next scheduled
    wait_for(lambda: victim["pid"] not in sshd_pids(ftc_home), "the killed sshd to be gone")
    status = ftc("status", "--name", "kill")
    assert "kill-1 is dead" in status.stderr
    proc = ftc("bootstrap", "--name", "kill", env={"FTC_CONNECT_ATTEMPTS": "3"})
    assert proc.returncode == 1
    line = proc.stderr.strip().splitlines()[-1]
    assert "node kill-1: step 'connect' failed" in line and "ftc bootstrap --name kill" in line
    assert state_of(ftc_home, "kill")["phase"] == "running"  # resumable
    assert ftc("down", "--name", "kill").returncode == 0
    assert sshd_pids(ftc_home) == []


def test_failing_install_names_node_and_step_and_stays_resumable(ftc_home):
    assert ftc("up", "--name", "inst", "--nodes", "1", "--no-bootstrap").returncode == 0
    node = state_of(ftc_home, "inst")["nodes"][0]
    (Path(node["workdir"]) / "venv").write_text("a file where the venv must go")  # python -m venv fails
    proc = ftc("bootstrap", "--name", "inst", env={"FTC_LOCAL_REUSE_STACK": "0"})
    assert proc.returncode == 1
    line = proc.stderr.strip().splitlines()[-1]
    assert "node inst-0: step 'install' failed" in line and "install.log" in line, line
    assert "ftc bootstrap --name inst" in line
    assert state_of(ftc_home, "inst")["phase"] == "running"  # resumable
    again = ftc("bootstrap", "--name", "inst")  # reusing the controller's stack, as by default
    assert again.returncode == 0, again.stderr
    assert ftc("down", "--name", "inst").returncode == 0


def test_up_interrupted_during_its_bootstrap_says_the_cluster_runs_and_how_to_go_on_or_remove_it(ftc_home, tmp_path):
    release = tmp_path / "release-bootstrap"  # the bootstrap holds there until the test has acted
    proc = subprocess.Popen([*FTC, "up", "--name", "s", "--nodes", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "FTC_HOLD_BOOTSTRAP": str(release)})
    wait_for(lambda: Path(f"{release}.reached").exists() or proc.poll() is not None, "the bootstrap to be held")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert "cluster s still runs (1 local node(s)), not bootstrapped: `ftc bootstrap --name s` continues, " \
           "`ftc down --name s` removes it" in err, err
    assert state_of(ftc_home, "s")["phase"] == "running" and len(sshd_pids(ftc_home)) == 1
    assert ftc("down", "--name", "s").returncode == 0
    assert sshd_pids(ftc_home) == []


def test_a_bad_connect_attempts_is_refused_before_a_bootstrap_changes_anything(ftc_home):
    up_local("late")
    proc = ftc("bootstrap", "--name", "late", env={"FTC_CONNECT_ATTEMPTS": "many"})
    assert proc.returncode == 2 and "FTC_CONNECT_ATTEMPTS='many' is not a whole number" in only_line(proc)
    assert not (ftc_home / "clusters" / "late" / "keys" / "internal").exists()
    assert ftc("down", "--name", "late").returncode == 0


def test_stock_stack_installs_into_a_fresh_venv(ftc_home):
    """With uv and this machine's pip settings: every pin exactly, torch's CPU build from pip's find-links
    (/opt/wheels here), never PyPI's CUDA build. tests/install_compare.py shows pip installs the same."""
    proc = ftc("up", "--name", "fresh", "--nodes", "1", env={"FTC_LOCAL_REUSE_STACK": "0"}, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    workdir = Path(state_of(ftc_home, "fresh")["nodes"][0]["workdir"])
    assert f"installing with uv {UV_VERSION}\n" in (workdir / "install.log").read_text()
    facts = json.loads((workdir / "facts.json").read_text())
    assert facts["python_executable"] == f"{workdir}/venv/bin/python"
    freeze = subprocess.run([f"{workdir}/venv/bin/python", "-m", "pip", "freeze"], capture_output=True, text=True,
                            check=True).stdout.splitlines()
    installed = dict(line.split("==", 1) for line in freeze if "==" in line)
    assert {package: installed.get(package) for package in STACKS["stock"]} \
        == {**STACKS["stock"], "torch": f"{STACKS['stock']['torch']}+cpu"}
    assert not [name for name in installed if name.startswith(("nvidia-", "cuda-"))]
    ftc("down", "--name", "fresh", check=True)

