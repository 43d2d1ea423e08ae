"""Bringing a job's files home survives the connection dropping under it: the copy says so and the
job goes on (the next checkpoint, or the copy at the job's end, brings it)."""

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from conftest import ftc

from provision import state as st
from provision.ssh import connect
from runner.transfer import copy_checkpoint

pytestmark = pytest.mark.slow


def sftp_servers_under(sshd_pid: int) -> list[int]:
    """The sftp-server processes the node's sshd started for our session."""
    def parent(pid: int) -> int:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])

    found = []
    for entry in Path("/proc").iterdir():
        try:  # any other process (the other xdist worker's) may end while it is read
            if entry.name.isdigit() and b"sftp-server" in (entry / "cmdline").read_bytes():
                pid = int(entry.name)
                while pid > 1 and pid != sshd_pid:
                    pid = parent(pid)
                if pid == sshd_pid:
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_checkpoint_copy_survives_the_server_dropping_the_connection(ftc_home, tmp_path, capsys):
    ftc("up", "--name", "drop", "--nodes", "1", "--no-bootstrap", check=True)
    try:
        state = st.load("drop")
        conn = connect(state, state.head)
        sftp = conn.sftp()
        servers = sftp_servers_under(state.head.pid)
        assert servers
        for pid in servers:  # hold the server: the copy's first request waits for an answer
            os.kill(pid, signal.SIGSTOP)
        job = st.JobInfo(id="mrpc-1", task="mrpc", remote_dir=f"{state.head.workdir}/jobs/mrpc-1",
                         results_dir=str(tmp_path / "results"))
        sent_before = sftp.sock.out_window_size
        outcome = {}
        copier = threading.Thread(target=lambda: outcome.update(result=copy_checkpoint(conn, job)))
        copier.start()
        while sftp.sock.out_window_size == sent_before:  # the request is on its way to the held server
            assert copier.is_alive(), outcome
            time.sleep(0.01)
        for pid in servers:  # the server dies with the request unanswered: "Server connection dropped"
            os.kill(pid, signal.SIGKILL)
        copier.join(30)
        assert outcome == {"result": None}
        err = capsys.readouterr().err
        assert "copying the checkpoint of job mrpc-1 home failed (SSHException: Server connection dropped" in err
        assert not list((tmp_path / "results").rglob("*.partial"))
        conn.close()
    finally:
        ftc("down", "--name", "drop", check=True)
