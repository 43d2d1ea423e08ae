"""The local provider and the Fabric bootstrap, on real OpenSSH servers."""

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, ftc, sshd_pids
from helpers import assert_bootstrapped, wait_for


def state_of(home: Path, name: str) -> dict:
    return json.loads((home / "clusters" / name / "state.json").read_text())


def served_host_key(node: dict) -> str:
    """The host key the node's sshd presents now ('' while it does not answer)."""
    from provision.ssh import fetch_host_key
    from provision.state import NodeInfo
    probe = NodeInfo(index=0, name="probe", id="probe", public_ip=node["public_ip"], private_ip=node["private_ip"],
                     ssh_user="x", ssh_port=node["ssh_port"])
    try:
        return fetch_host_key(probe, timeout=5)
    except Exception:  # noqa: BLE001 - not listening (yet, or again)
        return ""


@pytest.mark.parametrize("nodes", [1, 2, 4])
def test_local_cluster_up_bootstrap_verify_down(ftc_home, nodes):
    proc = ftc("up", "--name", "loc", "--nodes", str(nodes))
    assert proc.returncode == 0, proc.stderr
    assert f"gloo all_reduce over {nodes} rank(s)" in proc.stdout
    total = nodes * (nodes + 1) / 2
    assert str([total, total, 0.0, total, 2 * total]) in proc.stdout
    state = state_of(ftc_home, "loc")
    assert state["phase"] == "bootstrapped"
    addresses = {(n["private_ip"], n["ssh_port"]) for n in state["nodes"]}
    assert len(addresses) == nodes
    if nodes <= os.cpu_count():
        shares = [set(n["cores"]) for n in state["nodes"]]
        assert all(not (a & b) for i, a in enumerate(shares) for b in shares[i + 1:])
    else:
        assert "nodes will share cores" in proc.stderr
    for node in state["nodes"]:
        assert set(os.sched_getaffinity(node["pid"])) == set(node["cores"])
    assert_bootstrapped(ftc_home, "loc", nodes)
    assert len(sshd_pids(ftc_home)) == nodes

    down = ftc("down", "--name", "loc")
    assert down.returncode == 0, down.stderr
    assert sshd_pids(ftc_home) == []
    assert not (ftc_home / "clusters" / "loc").exists()


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


def test_tampered_host_key_is_refused(ftc_home):
    assert ftc("up", "--name", "mitm", "--nodes", "1", "--no-bootstrap").returncode == 0
    node = state_of(ftc_home, "mitm")["nodes"][0]
    key = Path(node["workdir"]) / "ssh_host_ed25519_key"
    key.unlink()
    key.with_suffix(".pub").unlink()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    new_key = " ".join(key.with_suffix(".pub").read_text().split()[:2])
    os.kill(node["pid"], signal.SIGHUP)  # sshd re-executes itself and loads the new key
    wait_for(lambda: served_host_key(node) == new_key, "sshd to serve the new host key")
    proc = ftc("bootstrap", "--name", "mitm", env={"FTC_CONNECT_ATTEMPTS": "3"})
    assert proc.returncode == 1
    assert "node mitm-0: step 'connect' failed: host key mismatch" in proc.stderr
    assert ftc("down", "--name", "mitm").returncode == 0


def test_ssh_runs_a_command_on_the_chosen_node(ftc_home):
    assert ftc("up", "--name", "sh", "--nodes", "2").returncode == 0
    proc = ftc("ssh", "--name", "sh", "--node", "1", "--", "echo $FTC_NODE")
    assert proc.returncode == 0 and proc.stdout.strip() == "sh-1"
    bad = ftc("ssh", "--name", "sh", "--node", "7", "--", "true")
    assert bad.returncode == 2 and "NODE='7'" in bad.stderr
    ftc("down", "--name", "sh", check=True)


def test_clusters_side_by_side_do_not_interfere(ftc_home):
    from conftest import FTC
    names = ["c1", "c2", "c3", "c4"]
    starts = [subprocess.Popen([*FTC, "up", "--name", n, "--nodes", "1", "--no-bootstrap"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for n in names]  # all four at once
    for proc in starts:
        _, err = proc.communicate(timeout=600)  # read while waiting: a full pipe would stall `up`
        assert proc.returncode == 0, err
    nodes = {n: state_of(ftc_home, n)["nodes"][0] for n in names}
    assert len({(n["private_ip"], n["ssh_port"]) for n in nodes.values()}) == 4
    assert len({n["pid"] for n in nodes.values()}) == 4
    assert ftc("down", "--name", "c1").returncode == 0
    for name in names[1:]:
        assert os.path.exists(f"/proc/{nodes[name]['pid']}")
        assert "running" in ftc("status", "--name", name).stdout
        ftc("down", "--name", name, check=True)
    assert sshd_pids(ftc_home) == []


def test_node_port_taken_before_sshd_binds_is_chosen_again(ftc_home):
    """Between the choice of a node's port and sshd's bind, another process may take the port
    (another `up` choosing the same way): sshd exits with "address in use"; `up` chooses again."""
    taken = socket.socket()
    taken.bind(("127.0.0.2", 0))
    taken.listen()
    # `ftc up` whose first port choice is the taken one (a process of its own: sshd is started
    # with a preexec_fn, which a threaded pytest worker must not fork with)
    up = ("import sys; from provision import local; from runner.cli import main; real = local.listen_port; "
          f"chosen = iter([{taken.getsockname()[1]}]); "
          "local.listen_port = lambda host: next(chosen, None) or real(host); "
          "sys.exit(main(['up', '--name', 'port', '--nodes', '1', '--no-bootstrap']))")
    try:
        proc = subprocess.run([sys.executable, "-c", up], capture_output=True, text=True, timeout=300, cwd=REPO)
        assert proc.returncode == 0, proc.stderr
        node = state_of(ftc_home, "port")["nodes"][0]
        assert node["ssh_port"] != taken.getsockname()[1]
        assert "Address already in use" in (Path(node["workdir"]) / "sshd.log").read_text()
        assert served_host_key(node) == node["host_key"]  # the node answers, on its new port
    finally:
        taken.close()
        ftc("down", "--name", "port", check=True)
    assert sshd_pids(ftc_home) == []


def test_second_command_on_a_busy_cluster_is_refused_naming_the_holder(ftc_home):
    from provision import state as st
    assert ftc("up", "--name", "busy", "--nodes", "1", "--no-bootstrap").returncode == 0
    with st.locked("busy", "up"):
        proc = ftc("bootstrap", "--name", "busy")
    assert proc.returncode == 3
    assert f"locked by pid {os.getpid()} (`ftc up`)" in proc.stderr
    ftc("down", "--name", "busy", check=True)


@pytest.mark.slow
def test_stock_stack_installs_into_a_fresh_venv(ftc_home):
    proc = ftc("up", "--name", "fresh", "--nodes", "1", env={"FTC_LOCAL_REUSE_STACK": "0"}, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    node = state_of(ftc_home, "fresh")["nodes"][0]
    facts = json.loads((Path(node["workdir"]) / "facts.json").read_text())
    assert facts["python_executable"] == f"{node['workdir']}/venv/bin/python"
    assert facts["versions"]["torch"].startswith("2.13.0") and facts["versions"]["impi-rt"] == "2021.18.1"
    assert facts["versions"]["transformers"] == "5.24.0"
    ftc("down", "--name", "fresh", check=True)
