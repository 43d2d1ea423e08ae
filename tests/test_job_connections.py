"""A bootstrap and an attached job each hold one connection to each node for their whole life, handed
from phase to phase, and `ftc run` one for its bootstrap and its job together: on N nodes the controller logs
in N times, as the nodes' own sshd count its logins."""

import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest
from conftest import FTC, ftc
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


def test_a_run_a_bootstrap_and_an_attached_finetune_and_launch_log_in_to_each_node_once(ftc_home, tiny_bert,
                                                                                        glue_dir, tmp_path):
    release = tmp_path / "release-bootstrap"  # `ftc run`'s bootstrap holds there while its nodes log every login
    run = subprocess.Popen([*FTC, "run", "--name", "cn", "--nodes", str(NODES), "--keep", *tiny_job(tiny_bert, glue_dir)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "FTC_HOLD_BOOTSTRAP": str(release)})
    try:
        wait_for(lambda: Path(f"{release}.reached").exists() or run.poll() is not None, "ftc run's bootstrap held")
        log_every_login(ftc_home, "cn")
        before = controller_logins(ftc_home, "cn")
        release.touch()
        _, err = run.communicate(timeout=900)
        assert run.returncode == 0, err[-3000:]
        after_run = controller_logins(ftc_home, "cn")
        # its steps are done, so it checks each node's markers and the verification's (the head's), then ends
        bootstrap = ftc("bootstrap", "--name", "cn")
        assert bootstrap.returncode == 0, bootstrap.stderr[-3000:]
        after_bootstrap = controller_logins(ftc_home, "cn")
        finetune = ftc("finetune", "--name", "cn", *tiny_job(tiny_bert, glue_dir))
        assert finetune.returncode == 0, finetune.stderr[-3000:]
        after_finetune = controller_logins(ftc_home, "cn")
        launch = ftc("launch", "--name", "cn", "--", str(gloo_script(tmp_path / "work")), "hello")
        assert launch.returncode == 0, launch.stderr[-3000:]
        after_launch = controller_logins(ftc_home, "cn")
        logins = {"run": after_run - before, "bootstrap": after_bootstrap - after_run,
                  "finetune": after_finetune - after_bootstrap, "launch": after_launch - after_finetune}
        # every node is checked for life before a job starts, and reached no more than that once
        assert logins == dict.fromkeys(logins, NODES), logins
    finally:
        run.kill()
        ftc("down", "--name", "cn")
