"""The local provider and the Fabric bootstrap, on real OpenSSH servers."""

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, ftc, sshd_pids
from helpers import assert_bootstrapped, only_line, state_of, wait_for

pytestmark = pytest.mark.slow


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
    assert bad.returncode == 2 and "--node='7'" in bad.stderr
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
    up = ("import sys; from provision.providers import local; from runner.cli import main; real = local.listen_port; "
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


def test_an_sshd_that_will_not_start_is_reported_with_what_it_said(ftc_home):
    node_dir = ftc_home / "clusters" / "nostart" / "nodes" / "0"  # left over, with a host key sshd cannot load
    node_dir.mkdir(parents=True)
    (node_dir / "ssh_host_ed25519_key").write_text("not a key\n")
    (node_dir / "ssh_host_ed25519_key.pub").write_text("ssh-ed25519 AAAA nostart-0\n")
    proc = ftc("up", "--name", "nostart", "--nodes", "1")
    assert proc.returncode == 1, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: node nostart-0: sshd exited at start (") and "hostkeys" in line, line
    assert "sshd.log" not in line and "rolled back: nothing left running" in proc.stderr
    assert sshd_pids(ftc_home) == [] and not (ftc_home / "clusters" / "nostart").exists()



def test_nodes_holding_other_node_programs_are_refused_until_a_bootstrap_ships_this_ftcs(ftc_home, minilm, glue_dir):
    """An ftc updated after its cluster's bootstrap would run its jobs on the nodes' older copies of
    runner/node/: the job is refused, naming the command that ships them, and that command does."""
    assert ftc("up", "--name", "old", "--nodes", "1").returncode == 0
    workdir = Path(state_of(ftc_home, "old")["nodes"][0]["workdir"])
    program = workdir / "ftc" / "runner" / "node" / "train.py"
    current = program.read_text()
    # what the nodes hold after `git pull` on the controller: another bundle's files and marker, an
    # older record of what was shipped
    program.write_text("raise SystemExit('an older train.py')\n")
    for marker in (workdir / ".ftc" / "done").glob("files-*"):
        marker.rename(marker.with_name("files-older"))
    (ftc_home / "clusters" / "old" / "node_programs").write_text("older")
    render = ["finetune", "--name", "old", "--render-only", "--task", "mrpc", "--model", str(minilm),
              "--data-dir", str(glue_dir)]
    refused = ftc(*render)
    assert refused.returncode == 2 and refused.stdout == ""
    line = only_line(refused)  # checked before any note about the job
    assert line.startswith("error: --name='old': its nodes hold ftc's node programs as they were") and \
        "`ftc bootstrap --name old` ships them" in line, refused.stderr
    assert ftc("bootstrap", "--name", "old").returncode == 0
    assert program.read_text() == current
    assert ftc(*render).returncode == 0
    assert ftc("down", "--name", "old").returncode == 0
