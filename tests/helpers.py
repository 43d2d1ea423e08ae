"""What many test files check the same way: a refusal, a cluster's state, a small job, a job held
at a known step, the post-conditions of a bootstrapped cluster (Fabric's and Ansible's alike:
real ssh between nodes, a real mpirun, the files the runner reads), two real gloo ranks."""

import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from conftest import REPO, ftc

from provision.bootstrap import hostname_lines

RESULT_FIELDS = {"task", "model", "stack", "backend", "precision", "nodes", "ranks_per_node", "threads_per_rank",
                 "world_size", "epochs", "train_samples", "train_seconds", "samples_per_second", "epoch_metrics",
                 "eval_accuracy", "eval_f1", "versions", "started_at", "finished_at"}
# `ftc up` of AWS nodes (moto's or the emulator's), not bootstrapped, without a prompt
AWS_UP = ["--provider", "aws", "--ssh-cidr", "203.0.113.7/32", "--yes", "1", "--no-bootstrap"]
NO_SUCH_USER_HOME = "~no-such-user-of-ftc"  # a ~user path whose user does not exist
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


def read_until(proc: subprocess.Popen, stream, until, what: str, hang_s: float = 300) -> list[str]:
    """The lines `stream` (proc's stdout or stderr) gives, up to the first for which until(line) holds (until
    None: to the stream's end). A thread reads them: a process that neither gives that line nor ends within
    `hang_s` is a hang (the line comes within seconds), stopped (stop_hung) and failed, instead of holding the
    suite; one that ends without it fails, with all it said."""
    lines, failed, done = [], [], threading.Event()

    def read() -> None:
        try:
            for line in stream:
                lines.append(line)
                if until is not None and until(line):
                    break
        except Exception as exc:  # noqa: BLE001 - told to the test, not lost in the thread
            failed.append(exc)
        finally:
            done.set()

    threading.Thread(target=read, daemon=True).start()
    if not done.wait(hang_s):
        stop_hung(proc)
        raise AssertionError(f"no {what} within {hang_s:.0f} s:\n{''.join(lines)[-3000:]}")
    if failed:
        raise AssertionError(f"reading up to {what} failed: {failed[0]!r}\n{''.join(lines)[-3000:]}")
    if until is not None and (not lines or not until(lines[-1])):
        try:
            rest = "".join(part or "" for part in proc.communicate(timeout=60))[-3000:]
        except subprocess.TimeoutExpired:  # its stream ended, not the process (or what holds its other pipe)
            stop_hung(proc)
            rest = "(it ran on; stopped)"
        raise AssertionError(f"it ended without {what}:\n{''.join(lines)[-3000:]}\n{rest}")
    return lines


def stop_hung(proc: subprocess.Popen) -> None:
    """A hung `ftc` stopped as a user would: Ctrl-C first, so that it rolls back what it started (a queued
    allocation, a local node), then SIGKILL if it does not end within a minute."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


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


# ---- refusals: what a command prints when it says no ----------------------------------------------

def assert_refused(proc, named: str, home) -> None:
    """Exit code 2, one line that names the bad value, and no cluster left on disk."""
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0], lines
    assert not (home / "clusters").exists() or not any((home / "clusters").iterdir())


def only_line(proc: subprocess.CompletedProcess) -> str:
    """The one line a failure prints on stderr."""
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def last_line(proc: subprocess.CompletedProcess) -> str:
    """The line a command ends on (its error), with no traceback before it."""
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr.strip().splitlines()[-1]


def one_error(proc) -> str:
    """The refusal: exactly one line on stderr, and no traceback."""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def make(*args: str, home: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """`make -s TARGET VAR=...` of the repo's Makefile, with FTC_HOME=home."""
    return subprocess.run(["make", "-s", "-C", str(REPO), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "FTC_HOME": str(home)})


# ---- clusters and jobs ------------------------------------------------------------------------------

def state_path(home: Path, name: str) -> Path:
    return home / "clusters" / name / "state.json"


def state_of(home: Path, name: str) -> dict:
    return json.loads(state_path(home, name).read_text())


def up_local(name: str, home: Path | None = None, nodes: int = 1) -> None:
    """`ftc up` of local nodes, not bootstrapped (in FTC_HOME=home when given)."""
    env = {"FTC_HOME": str(home)} if home else None
    proc = ftc("up", "--name", name, "--nodes", str(nodes), "--no-bootstrap", env=env)
    assert proc.returncode == 0, proc.stderr


def tiny_job(minilm: str, glue_dir: Path, samples: int = 16) -> list[str]:
    """A job of one epoch over `samples` rows of MRPC: enough to launch, train and finish."""
    return ["--task", "mrpc", "--model", minilm, "--data-dir", str(glue_dir),
            "--max-eval-samples", "64", "--max-train-samples", str(samples),
            "--epochs", "1"]


def held_job(home: Path, name: str, proc: subprocess.Popen) -> Path:
    """Wait until the job that `proc` started holds before its FTC_HOLD_AT_STEP step (the
    training program's test hold point): the job's directory on the head node."""
    state = home / "clusters" / name / "state.json"
    while True:
        assert proc.poll() is None, proc.communicate()
        jobs = json.loads(state.read_text()).get("jobs") if state.exists() else None
        if jobs and (Path(jobs[-1]["remote_dir"]) / "held").exists():
            return Path(jobs[-1]["remote_dir"])
        time.sleep(0.1)


TINY = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=130)  # RoBERTa's positions start after its padding index: 128 + 2


def tiny_model(target: Path, architecture: str, vocabulary: str) -> Path:
    """A model of `architecture`, a few MB, saved as safetensors; `parameters.txt` beside it holds its size."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(AutoConfig.for_model(architecture, **TINY))
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(vocabulary).save_pretrained(target)
    (target / "parameters.txt").write_text(str(sum(p.numel() for p in model.parameters())))
    return target


GOOD = ["great", "wonderful", "excellent", "lovely", "superb", "fantastic", "delightful", "brilliant"]
BAD = ["awful", "terrible", "horrible", "dreadful", "poor", "nasty", "dismal", "rotten"]


def toy_csv(path: Path, rows: int, offset: int = 0) -> Path:
    """One sentiment word a row, a third of them positive: the majority class ('neg') scores 2/3."""
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["review", "stars"])
        for i in range(rows):
            words, label = (GOOD, "pos") if i % 3 == 0 else (BAD, "neg")
            writer.writerow([f"it was {words[(i + offset) % len(words)]}", label])
    return path


# ---- your own script (`ftc launch`) ----------------------------------------------------------------

# A torchrun-style script: joins gloo from the environment, sums the ranks, reports what it saw, and
# ends WITHOUT leaving the process group (ftc's rank wrapper does that). `--fail-rank R --code C`
# makes rank R exit C after the all_reduce; `--hold` waits for the file `release` in the job's
# directory before ending (a job held at a known point).
GLOO_SCRIPT = '''
import argparse, json, os, socket, sys, time
from pathlib import Path
import torch, torch.distributed as dist
p = argparse.ArgumentParser()
p.add_argument("--fail-rank", type=int, default=-1)
p.add_argument("--code", type=int, default=0)
p.add_argument("--hold", action="store_true")
p.add_argument("words", nargs="*")
args = p.parse_args()
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
out = Path(os.environ["FTC_OUTPUT_DIR"])
out.mkdir(parents=True, exist_ok=True)  # ftc names the folder; the script makes it, as under torchrun
seen = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                        "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "FTC_RUN_ID", "MY_SETTING")}
seen.update(cpus=sorted(os.sched_getaffinity(0)), sum=total.item(), words=args.words, cwd=os.getcwd(),
            path0=sys.path[0], world=dist.get_world_size())
(out / f"rank{dist.get_rank()}.json").write_text(json.dumps(seen))
print("rank", dist.get_rank(), "summed", total.item(), flush=True)
if args.hold:
    print("holding", flush=True)
    (Path(os.environ["FTC_OUTPUT_DIR"]).parent / "held").touch()
    while not (Path(os.environ["FTC_OUTPUT_DIR"]).parent / "release").exists():
        time.sleep(0.2)
if dist.get_rank() == args.fail_rank:
    print(f"rank {args.fail_rank} gives up with {args.code}", flush=True)
    sys.exit(args.code)
'''


def gloo_script(workdir: Path, name: str = "gloo_job.py") -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    script = workdir / name
    script.write_text(GLOO_SCRIPT)
    return script


def last_job(home: Path, name: str) -> dict:
    return state_of(home, name)["jobs"][-1]


def assert_script_runs_across_nodes(home: Path, name: str, tmp_path: Path) -> None:
    """`ftc launch` of gloo_script on a 2-node cluster whose nodes are not this machine's (own servers,
    EC2): it runs on both, rank 0's output comes home, rank 1's stays on its node, its log comes home."""
    script = gloo_script(tmp_path / "script-work")
    proc = ftc("launch", "--name", name, "--", str(script), "hello")
    assert proc.returncode == 0, proc.stderr[-3000:]
    job = last_job(home, name)
    results = Path(job["results_dir"])
    seen = json.loads((results / "output" / "rank0.json").read_text())
    assert seen["world"] == 2 and seen["sum"] == 3.0 and seen["words"] == ["hello"]
    assert "rank 1 summed 3.0" in (results / "logs" / "rank1.log").read_text()


def start_emulator(disks: Path, **env: str) -> tuple[subprocess.Popen, str, list[str]]:
    """`ec2_emulator.py 0` (it binds a free port itself: one picked here could be taken before it
    binds); its URL from the ready line, and the lines it printed before it: the nodes a killed
    emulator left, which it stops first (another test's, on the other worker). Read line by line to
    the ready line: the emulator runs on, so its output never ends."""
    proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "ec2_emulator.py"), "0"],
                            env={**os.environ, **env, "FTC_EMULATOR_DIR": str(disks)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = read_until(proc, proc.stdout, lambda line: line.startswith("EC2 emulator ready: AWS_ENDPOINT_URL="),
                       "the emulator's ready line")
    return proc, lines[-1].split("AWS_ENDPOINT_URL=")[1].split()[0], lines[:-1]
