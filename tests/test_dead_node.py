"""A cluster with a node that no longer answers: `finetune` refuses before launching, `status` says what to run."""

import json
import os
import signal

import pytest
from conftest import ftc
from helpers import only_line, wait_for

from provision import procs

pytestmark = pytest.mark.slow


def test_finetune_on_a_cluster_with_a_dead_node_refuses_at_once_naming_it_and_down(cluster, ftc_home, minilm, glue_dir):
    state = json.loads((ftc_home / "clusters" / cluster / "state.json").read_text())
    dead = state["nodes"][1]
    os.kill(dead["pid"], signal.SIGKILL)
    wait_for(lambda: not procs.alive(dead["pid"]), "the killed sshd to be gone")
    job = ftc("finetune", "--name", cluster, "--model", minilm, "--data-dir", str(glue_dir), timeout=60)
    line = only_line(job)
    assert job.returncode == 1 and "node tr-1: step 'connect' failed: no SSH after 1 attempts" in line, line
    assert f"`ftc down --name {cluster}`, then `ftc up`" in line and "ftc status" not in line, line
    assert json.loads((ftc_home / "clusters" / cluster / "state.json").read_text())["jobs"] == []  # nothing launched
    shown = ftc("status", "--name", cluster)
    assert "tr-1 is dead" in shown.stderr and f"`ftc down --name {cluster}` removes the cluster" in shown.stderr
    assert "ftc status" not in shown.stdout + shown.stderr
