"""Ctrl-C while a copy is in flight: one Ctrl-C ends ftc at once, with the cluster's lock free and no
traceback, whatever paramiko was doing. A server of yours (a plain sshd, as in test_hosts.py) whose SFTP
subsystem stalls the copy mid-packet (stalling_sftp.py) holds the copy at the point under test; then
the real `ftc` gets SIGINT."""

import csv
import filecmp
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FTC, REPO, ftc
from helpers import state_of, toy_csv, wait_for
from test_hosts import SFTP, Server, ssh_flags

from runner.transfer import FOLDER_COMPLETE

pytestmark = pytest.mark.slow

HANG_S = 120  # only a hang runs this long after Ctrl-C: a cut copy ends ftc within a second or two


@pytest.fixture
def stalling(ftc_home, tmp_path):
    """A bootstrapped cluster `own` of one server whose SFTP stalls as CONTROL/stall.json says (see
    stalling_sftp.py); (server, its control directory)."""
    key = tmp_path / "user_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    control = tmp_path / "stall"
    control.mkdir()
    relay = f"{sys.executable} {REPO / 'tests' / 'stalling_sftp.py'} {SFTP} {control}"
    server = Server(tmp_path / "server", "127.0.0.121", key, sftp=relay).start()
    try:
        up = ftc("up", "--name", "own", *ssh_flags([server], key), "--yes", "1")
        assert up.returncode == 0, up.stderr[-3000:]
        yield server, control
        assert ftc("down", "--name", "own").returncode == 0
    finally:
        server.stop()


def interrupted(proc: subprocess.Popen, control: Path, what: str) -> tuple[str, str]:
    """Once the relay has stalled the copy: Ctrl-C, and what ftc printed by the time it ended."""
    wait_for(lambda: (control / "stalled").exists() or proc.poll() is not None, f"the copy of {what} to stall")
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    try:
        return proc.communicate(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"ftc still ran {HANG_S} s after Ctrl-C during the copy of {what}:\n{err[-3000:]}")


def big_csv(path: Path, megabytes: int) -> Path:
    """Long reviews, a third of them positive: a file whose copy takes many SFTP packets."""
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["review", "stars"])
        for i in range(megabytes * 2**20 // 200):
            writer.writerow([f"it was {'great' if i % 3 == 0 else 'awful'} " * 14, "pos" if i % 3 == 0 else "neg"])
    return path


def finetune(model: str, train: Path, dev: Path, *more: str) -> subprocess.Popen:
    return subprocess.Popen([*FTC, "finetune", "--name", "own", "--train-file", str(train), "--validation-file",
                             str(dev), "--text-columns", "review", "--label-column", "stars", "--model", model,
                             "--epochs", "1", "--max-eval-samples", "12", *more],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("held", ["/data/train", "/cache/model-"], ids=["data file", "model folder"])
def test_ctrl_c_during_a_copy_before_launch_exits_130_with_the_lock_free(stalling, ftc_home, tmp_path, minilm, held):
    _, control = stalling
    # 1 MB and 3 bytes in: inside a write packet, with the window and sshd's buffers still to fill
    (control / "stall.json").write_text(json.dumps({"path": held, "direction": "upload", "after": 2**20 + 3}))
    train, dev = big_csv(tmp_path / "big.csv", 8), toy_csv(tmp_path / "dev.csv", 12)
    proc = finetune(minilm, train, dev)
    _, err = interrupted(proc, control, held)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("interrupted after"), err[-3000:]
    state = state_of(ftc_home, "own")
    assert state["jobs"] == []  # nothing was launched
    whole = list(Path(state["nodes"][0]["workdir"]).glob(f"cache/model-*/{FOLDER_COMPLETE}"))
    assert bool(whole) == (held != "/cache/model-")  # the model's copy, cut short, does not look whole
    free = ftc("cancel", "--name", "own")  # takes the cluster's lock: free at once
    assert free.returncode == 0 and "has no running job" in free.stdout + free.stderr, free.stderr


def test_ctrl_c_during_the_checkpoint_copy_detaches_and_the_job_goes_on(stalling, ftc_home, tmp_path, minilm):
    server, control = stalling
    # 100 kB and 3 bytes into the checkpoint: inside a data packet, the rest of it still to come
    (control / "stall.json").write_text(json.dumps({"path": "checkpoints/", "direction": "download",
                                                    "after": 100_003}))
    train, dev = toy_csv(tmp_path / "mine.csv", 16), toy_csv(tmp_path / "dev.csv", 12, offset=3)
    started = finetune(minilm, train, dev, "--detach")
    assert started.wait(timeout=600) == 0, started.communicate()
    # a follower (a job started in the foreground stops on Ctrl-C instead, as under torchrun)
    proc = subprocess.Popen([*FTC, "logs", "--name", "own", "-f"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    out, err = interrupted(proc, control, "the checkpoint")
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err and "detached: job " in out + err, err[-3000:]
    job = state_of(ftc_home, "own")["jobs"][-1]
    results = Path(job["results_dir"])
    assert job["state"] == "running" and not list(results.rglob("*.partial"))  # nothing half-copied is left
    (control / "stall.json").unlink()  # the network is well again: reattached, the checkpoint comes home
    again = ftc("logs", "--name", "own", "-f")
    assert again.returncode == 0, again.stderr[-3000:]
    assert filecmp.cmp(results / "checkpoints" / "last.pt", Path(job["remote_dir"]) / "checkpoints" / "last.pt",
                       shallow=False)
