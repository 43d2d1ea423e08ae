"""The EC2 emulator's nodes live no longer than it: they go with it on SIGHUP (its terminal closed)
and SIGTERM, a new emulator stops those a killed one left, and a node serves only if the sshd
reached at its address is its own."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, ftc, sshd_pids
from helpers import start_emulator, wait_for

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="the EC2 emulator's nodes need root (namespaces, port 22)")]

sys.path.insert(0, str(REPO / "tests"))
import ec2_emulator  # noqa: E402

UP = ["up", "--provider", "aws", "--nodes", "1", "--ssh-cidr", "203.0.113.7/32", "--yes", "1", "--no-bootstrap"]


def aws_env(url: str) -> dict:
    return {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1", "FTC_AWS_POLL_SECONDS": "0.1"}


def test_emulator_whose_terminal_closes_stops_every_node(ftc_home, tmp_path):
    disks = tmp_path / "disks"
    proc, url, _ = start_emulator(disks)
    up = ftc(*UP, "--name", "hup", env=aws_env(url))
    assert up.returncode == 0, up.stderr[-3000:]
    assert len(sshd_pids(disks)) == 1
    proc.send_signal(signal.SIGHUP)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert out.count("stopped (emulator exiting)") == 1
    assert sshd_pids(disks) == [] and list(disks.iterdir()) == []


def test_new_emulator_stops_the_nodes_a_killed_one_left(ftc_home, tmp_path):
    killed_disks = tmp_path / "killed"
    # a registry of these two emulators' own: another worker's emulator starting meanwhile would stop the
    # node it finds there first, and say so in its own output
    registry = {"FTC_EMULATOR_REGISTRY": str(tmp_path / "registry")}
    killed, url, _ = start_emulator(killed_disks, **registry)
    up = ftc(*UP, "--nodes", "2", "--name", "left", env=aws_env(url))
    assert up.returncode == 0, up.stderr[-3000:]
    instances = sorted(p.name for p in killed_disks.glob("i-*"))
    killed.kill()
    killed.communicate(timeout=60)
    assert len(sshd_pids(killed_disks)) == 2  # the nodes outlived their emulator
    # one record as an emulator wrote it before records held the node's disk: found by its directory instead
    older = Path(registry["FTC_EMULATOR_REGISTRY"]) / instances[1]
    older.write_text(json.dumps({k: v for k, v in json.loads(older.read_text()).items() if k != "disk"}))
    successor, _, before = start_emulator(tmp_path / "successor", **registry)
    try:
        for instance in instances:
            assert any(line.startswith(f"{instance}: stopped, at 127.0.1.") and f"pid {killed.pid})" in line
                       for line in before), before
            assert not (killed_disks / instance).exists()
        assert sshd_pids(killed_disks) == []
    finally:
        successor.terminate()
        successor.communicate(timeout=60)


def test_a_left_record_whose_namespace_number_now_names_another_programs_stops_nothing_there(tmp_path, monkeypatch):
    """The kernel hands a namespace's number to the next namespace made once the last process of the first is
    gone, so a record left by a killed emulator may name another program's (a Slurm node's): its
    processes do not see that node's disk as /home, and live on."""
    other = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "600"])
    try:
        mine = os.readlink("/proc/self/ns/mnt")
        wait_for(lambda: os.readlink(f"/proc/{other.pid}/ns/mnt") != mine, "unshare's namespace of its own")
        namespace = os.readlink(f"/proc/{other.pid}/ns/mnt")
        gone = tmp_path / "gone"
        (gone / "disk").mkdir(parents=True)
        registry = tmp_path / "registry"
        registry.mkdir()
        for instance, disk in (("i-0left", ec2_emulator.file_identity(gone / "disk")), ("i-0older", None)):
            record = {"owner": "999999999:1", "namespace": namespace, "dir": str(gone), "address": "127.0.1.250"}
            (registry / instance).write_text(json.dumps({**record, **({"disk": disk} if disk else {})}))
        monkeypatch.setattr(ec2_emulator, "REGISTRY", registry)
        ec2_emulator.stop_left_nodes()
        assert other.poll() is None and list(registry.iterdir()) == []
    finally:
        other.kill()
        other.wait(10)


def test_a_node_whose_address_answers_with_another_sshd_is_refused(ftc_home, tmp_path):
    """What the emulator checks of every node it boots, against a real sshd: its own host key
    passes; another key (another process's sshd reached at that address) is refused, named."""
    ftc("up", "--name", "other", "--nodes", "1", "--no-bootstrap", check=True)
    try:
        from provision import state as st
        node = st.load("other").head
        own_key = Path(node.workdir) / "ssh_host_ed25519_key.pub"
        ec2_emulator.check_own_sshd(node.public_ip, node.ssh_port, own_key)
        impostor = tmp_path / "impostor"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(impostor)], check=True)
        with pytest.raises(RuntimeError, match=f"{node.public_ip}:{node.ssh_port} answers with another host key"):
            ec2_emulator.check_own_sshd(node.public_ip, node.ssh_port, impostor.with_suffix(".pub"))
    finally:
        ftc("down", "--name", "other", check=True)
