"""An attached job holds one connection to each node for its whole life, handed from phase to phase:
on N nodes the controller logs in at most N+2 times, as the nodes' own sshd count its logins."""

import os
import signal
import socket
from pathlib import Path

import pytest
from conftest import ftc
from helpers import gloo_script, state_of, tiny_job, wait_for

from provision import state as st
from provision.ssh import fingerprint

pytestmark = pytest.mark.slow
NODES = 2


def answers(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=2).close()
        return True
    except OSError:
        return False


def log_every_login(home: Path, name: str) -> None:
    """Each node's sshd made to log its logins (LogLevel INFO), as a changed config is read: sshd
    re-reads it on SIGHUP, under the same pid, and listens again."""
    for node in state_of(home, name)["nodes"]:
        config = Path(node["workdir"]) / "sshd_config"
        config.write_text(config.read_text().replace("LogLevel ERROR", "LogLevel INFO"))
        os.kill(node["pid"], signal.SIGHUP)
    for node in state_of(home, name)["nodes"]:
        wait_for(lambda node=node: answers(node["public_ip"], node["ssh_port"]), f"{node['name']}'s sshd again")


def controller_logins(home: Path, name: str) -> int:
    """The logins by the controller's own key (not the cluster's internal key, which mpirun's hops
    between the nodes use) that the nodes' sshd logged."""
    key = st.access_key_path(name).with_suffix(".pub").read_text().split()
    accepted = f"ssh2: ED25519 {fingerprint(f'{key[0]} {key[1]}')}"
    return sum((Path(node["workdir"]) / "sshd.log").read_text().count(accepted)
               for node in state_of(home, name)["nodes"])


def test_an_attached_finetune_and_launch_log_in_to_each_node_once(ftc_home, tiny_bert, glue_dir, tmp_path):
    assert ftc("up", "--name", "cn", "--nodes", str(NODES)).returncode == 0
    try:
        log_every_login(ftc_home, "cn")
        before = controller_logins(ftc_home, "cn")
        finetune = ftc("finetune", "--name", "cn", *tiny_job(tiny_bert, glue_dir))
        assert finetune.returncode == 0, finetune.stderr[-3000:]
        after_finetune = controller_logins(ftc_home, "cn")
        launch = ftc("launch", "--name", "cn", "--", str(gloo_script(tmp_path / "work")), "hello")
        assert launch.returncode == 0, launch.stderr[-3000:]
        after_launch = controller_logins(ftc_home, "cn")
        logins = {"finetune": after_finetune - before, "launch": after_launch - after_finetune}
        # every node is checked for life before a job starts: at least one login each
        assert all(NODES <= count <= NODES + 2 for count in logins.values()), logins
    finally:
        ftc("down", "--name", "cn")
