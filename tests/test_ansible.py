"""The Ansible bootstrap: same post-conditions as Fabric's, idempotent, and a job runs after it."""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, ftc
from helpers import assert_bootstrapped

from provision import state as st
from provision.bootstrap import node_files


def test_playbook_passes_syntax_check():
    proc = subprocess.run([str(Path(os.sys.executable).parent / "ansible-playbook"), "--syntax-check", "-i",
                           "localhost,", str(REPO / "ansible" / "site.yml")], capture_output=True, text=True,
                          env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible" / "ansible.cfg")})
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
def test_inventory_names_every_node_and_the_pinned_keys(ftc_home):
    import yaml
    up = ftc("up", "--name", "inv", "--nodes", "2", "--no-bootstrap")
    assert up.returncode == 0
    assert "not bootstrapped; next: `ftc bootstrap --name inv`" in up.stderr and "make finetune" not in up.stderr
    proc = ftc("inventory", "--name", "inv")
    data = yaml.safe_load(Path(proc.stdout.strip()).read_text())
    group = data["all"]["children"]["ftc_nodes"]
    assert sorted(group["hosts"]) == ["inv-0", "inv-1"]
    assert "StrictHostKeyChecking=yes" in group["vars"]["ansible_ssh_common_args"]
    assert [n["name"] for n in group["vars"]["ftc_nodes"]] == ["inv-0", "inv-1"]
    ftc("down", "--name", "inv", check=True)


@pytest.mark.slow
def test_ansible_bootstrap_matches_fabric_and_is_idempotent(ftc_home, tiny_bert, glue_dir):
    assert ftc("up", "--name", "ans", "--nodes", "2", "--no-bootstrap").returncode == 0
    env = {**os.environ, "FTC_HOME": str(ftc_home)}
    first = subprocess.run(["make", "-s", "-C", str(REPO), "bootstrap", "BOOTSTRAPPER=ansible", "NAME=ans"],
                           capture_output=True, text=True, env=env, timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    assert_bootstrapped(ftc_home, "ans", 2)
    state = st.ClusterState.from_json((ftc_home / "clusters" / "ans" / "state.json").read_text())
    os.environ["FTC_HOME"] = str(ftc_home)
    for node in state.nodes:  # the very files the Fabric bootstrap writes
        expected = node_files(state, node)
        for name in ("hostfile", "ssh_config", "known_hosts", "env.sh", "bin/ssh"):
            assert (Path(node.workdir) / name).read_text() == expected[name], name
    again = ftc("bootstrap", "--name", "ans", "--with", "ansible", timeout=900)
    assert again.returncode == 0, again.stdout[-3000:]
    changed = [int(c) for c in re.findall(r"changed=(\d+)", again.stdout)]
    assert changed and set(changed) == {0}, again.stdout[-1500:]

    job = ftc("finetune", "--name", "ans", "--task", "mrpc", "--model", tiny_bert, "--data-dir", str(glue_dir),
              "--max-eval-samples", "64", "--max-train-samples", "64", "--epochs", "1", timeout=900)
    assert job.returncode == 0, job.stderr[-2000:]
    results = json.loads((Path(st.ClusterState.from_json(
        (ftc_home / "clusters" / "ans" / "state.json").read_text()).jobs[-1].results_dir) / "results.json").read_text())
    assert results["world_size"] == 2 and "eval_accuracy" in results
    ftc("down", "--name", "ans", check=True)
