"""Post-conditions of a bootstrapped cluster, checked the same way for the Fabric and the
Ansible bootstrap: real ssh between nodes, a real mpirun, the files the runner reads."""

import json
import subprocess
import threading
import time
from pathlib import Path

from conftest import ftc

from provision.bootstrap import hostname_lines

FACT_KEYS = {"physical_cores", "sockets", "numa_nodes", "flags", "native_bf16", "memory_gb", "python",
             "versions", "mpi", "allowed_cpus", "core_cpus", "interface", "cpu_model"}


def wait_for(condition, what: str, timeout: float = 180) -> None:
    """Poll until `condition()` holds: a test waits for the state it needs, never for the clock."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def assert_bootstrapped(home: Path, name: str, nodes: int) -> list[dict]:
    state = json.loads((home / "clusters" / name / "state.json").read_text())
    names = [f"{name}-{i}" for i in range(nodes)]
    facts = []
    for node in state["nodes"]:
        workdir = Path(node["workdir"])
        assert (workdir / "hostfile").read_text().split() == names
        node_facts = json.loads((workdir / "facts.json").read_text())
        assert FACT_KEYS <= set(node_facts), FACT_KEYS - set(node_facts)
        assert node_facts["mpi"] == "impi" and node_facts["physical_cores"] >= 1
        facts.append(node_facts)
    # node 0 reaches node N-1 by name with plain ssh (as Open MPI and users do), with the
    # cluster key, no prompt (BatchMode: a prompt would fail)
    hop = ftc("ssh", "--name", name, "--", f"ssh {names[-1]} 'echo $SSH_CONNECTION'")
    assert hop.returncode == 0, hop.stderr
    last = state["nodes"][-1]
    assert hop.stdout.split()[2:] == [last["private_ip"], str(last["ssh_port"])]
    # mpirun runs on every node, launched as the bootstrap's own check launches it
    mpi = ftc("ssh", "--name", name, "--", "bash jobs/verify-hostname.sh")
    assert mpi.returncode == 0, mpi.stderr
    assert len(hostname_lines(mpi.stdout)) == nodes
    return facts


def following(proc: subprocess.Popen) -> None:
    """Proof that `ftc finetune` (proc) is in its follow loop, where Ctrl-C detaches and a destroyed
    cluster is told: it has printed a line of the job's output (its stdout holds only those)."""
    line = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)
    reader.start()
    wait_for(lambda: line or proc.poll() is not None, "the follower to print the job's first line")
    assert line and line[0], proc.communicate()


def on_two_gloo_ranks(rank_program, rendezvous: Path, *args) -> dict:
    """Run rank_program(rank, rendezvous, *args, out) in two real processes; what each put in
    `out[rank]`. A file rendezvous: a port picked free here could be taken (by the other xdist
    worker) before rank 0 binds it."""
    import torch.multiprocessing as mp
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(rank_program, args=(str(rendezvous), *args, out), nprocs=2, join=True)
        return dict(out)
