"""`ftc run` owns its cluster from `up` to the end: whatever stops it, nothing is left running."""

import signal
import subprocess
import time

from conftest import FTC, sshd_pids


def test_run_stopped_during_bootstrap_leaves_nothing_running(ftc_home, minilm, glue_dir):
    run = subprocess.Popen([*FTC, "run", "--name", "early", "--nodes", "2", "--task", "mrpc", "--model", minilm,
                            "--data-dir", str(glue_dir), "--max-train-samples", "8", "--epochs", "1"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    internal_key = ftc_home / "clusters" / "early" / "keys" / "internal.pub"  # made by the bootstrap, under its lock
    while not internal_key.exists():
        assert run.poll() is None, run.communicate()
        time.sleep(0.02)
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=300)
    assert run.returncode == 130 and "nothing left running" in err, err[-2000:]
    assert sshd_pids(ftc_home) == [] and not (ftc_home / "clusters" / "early").exists()
