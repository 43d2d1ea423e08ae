"""`ftc run` owns its cluster from `up` to the end: whatever stops it, nothing is left running."""

import os
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import FTC, sshd_pids
from helpers import wait_for

pytestmark = pytest.mark.slow


def test_run_stopped_during_bootstrap_leaves_nothing_running(ftc_home, minilm, glue_dir, tmp_path):
    release = tmp_path / "release-bootstrap"  # the bootstrap holds there until the test has acted
    run = subprocess.Popen([*FTC, "run", "--name", "early", "--nodes", "2", "--task", "mrpc", "--model", minilm,
                            "--data-dir", str(glue_dir), "--max-eval-samples", "64", "--max-train-samples", "8", "--epochs", "1"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "FTC_HOLD_BOOTSTRAP": str(release)})
    wait_for(lambda: Path(f"{release}.reached").exists() or run.poll() is not None, "the bootstrap to be held")
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=300)
    assert run.returncode == 130 and "nothing left running" in err, err[-2000:]
    assert sshd_pids(ftc_home) == [] and not (ftc_home / "clusters" / "early").exists()
