"""`ftc bench end-to-end`: how long a user waits for a trained model, from `ftc finetune` to its
results at home, split into where the time went; against the same rows, epochs, batch a rank and lr
in the peer's script (runner/node/hf_trainer.py, Hugging Face Trainer) under a hand-written torchrun
on the same cores, wall to wall.

    ftc bench end-to-end --out docs                              # full MRPC, 3 epochs, 2 local nodes
    ftc bench end-to-end --out runs/e2e --rows 64 --epochs 1     # a tiny slice (tests)

ftc: a cluster of `--nodes` local nodes (each sshd pinned to its own share of this machine's cores)
is made and bootstrapped first, in a private FTC_HOME, outside the timed span (its time is kept as
cluster_up_s); then `ftc finetune` is timed from the command to its return, when the results are home.
The split comes from what the job records (every clock is this machine's): run.json's started_at (the
controller launched the job), results.json's started_at and finished_at (rank 0's program began and
wrote its results), epoch_metrics' pass_seconds (training) and stage_seconds (tokenize, evaluate,
checkpoint, save_model, to_first_step: runner/node/train.py's `timed`).

The peer: `taskset -c CORES python -m torch.distributed.run --standalone --nproc-per-node N -m
runner.node.hf_trainer ... --eval` at its fastest launch (`--peer-launch fastest`, the default: a
rank a physical core, CORES the first hardware thread of each, OMP_NUM_THREADS=1, as the long-jobs
bench finds it fastest) or at ftc's (`ftc`: N and OMP_NUM_THREADS as ftc's ranks had, CORES all of
them); the same rows, model, epochs, batch per rank and lr, so at its fastest launch a global batch
of the batch a rank times the cores (the report gives both sides' global batches). It scores dev after training (ftc after every
epoch) and saves no checkpoint (ftc one per epoch, and the model). Writes OUT/end_to_end.json after
each round, so a run cut short keeps the rounds it finished.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from statistics import median_low

from provision.errors import FtcError, UsageError, option
from provision.values import number, whole, writable_dir

from ..jobspec import glue_dir
from ..node import facts as node_facts
from ..node import glue
from ..node.protocol import RESULTS_FILE
from ..runs import RECORD
from .common import REPO, TAIL, pretrained_model, progress, run_logged
from .long_jobs import PEER_FASTEST

NAME = "end-to-end"
HELP = "`ftc finetune` on local nodes from the command to results at home, split into its phases, against the peer"
FTC = [sys.executable, "-m", "runner.cli"]
CLUSTER = "e2e"
# The demo probe's (docs/probes/demo_settings.txt) 3-epoch setting that reached 0.80 dev accuracy with
# the model's own dropout, at a global batch of 64: a trained model, not the majority class.
DEFAULT_LR = 1e-4
PHASES = ("startup", "tokenization", "training", "evaluation", "checkpoint", "fetch")
RESULT_NAME = "end_to_end.json"
# How the peer is launched: at its own fastest launch (PEER_FASTEST), or at ftc's job's ranks and threads
PEER_LAUNCHES = {"fastest": PEER_FASTEST, "ftc": "ftc's ranks and threads"}


@dataclass(frozen=True)
class Job:
    """The one job both sides run: MRPC's first `rows` training rows (0: all), scored on all of dev."""
    model: str  # a local model directory
    data_dir: str  # a GLUE directory holding mrpc/
    rows: int
    epochs: int
    nodes: int  # ftc's local nodes
    batch_size: int  # per rank
    lr: float


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="runs/bench", help=f"directory for {RESULT_NAME} (default runs/bench)")
    p.add_argument("--work", default=None,
                   help="directory for both jobs' files, kept (default: a temporary one, removed afterwards)")
    p.add_argument("--rows", default="0", help="MRPC training rows (default 0: all 3,668)")
    p.add_argument("--epochs", default="3", help="epochs (default 3)")
    p.add_argument("--nodes", default="2", help="ftc's local nodes, each on its own share of the cores (default 2)")
    p.add_argument("--batch-size", default="32", help="per rank (default 32)")
    p.add_argument("--lr", default=str(DEFAULT_LR), help=f"learning rate (default {DEFAULT_LR:g})")
    p.add_argument("--data-dir", default=None, help="GLUE directory holding mrpc/train.tsv (default: the offline copy)")
    p.add_argument("--model", default=None, help="model directory (default: the packaged MiniLM)")
    p.add_argument("--repeats", default="3", help="rounds of both, the order alternating (default 3)")
    p.add_argument("--peer-launch", default="fastest",
                   help=f"the peer at its fastest launch ({PEER_FASTEST}; the default) or at ftc's ranks and threads (ftc)")


def run(args: argparse.Namespace) -> int:
    return measure(args.job, args.repeats, Path(args.out).resolve(), args.work, args.command_line, args.peer_launch)


def checked(args: argparse.Namespace) -> None:
    """Every input through the shared parsers, the job as `args.job`; a bad one is one line naming it
    (exit 2), nothing made."""
    args.repeats = whole(1, 20)("repeats", args.repeats)
    if args.peer_launch not in PEER_LAUNCHES:
        raise UsageError(f"{option('peer_launch')}={args.peer_launch!r} is not a launch of the peer; allowed: "
                         f"{', '.join(PEER_LAUNCHES)}")
    writable_dir("out", args.out)
    if args.work:
        writable_dir("work", args.work)
    cores = len(os.sched_getaffinity(0))
    nodes = whole(1, cores)("nodes", args.nodes)
    rows = whole(0, 1_000_000)("rows", args.rows)
    if 0 < rows < 32:  # fewer would leave a rank of a global batch without rows
        raise UsageError(f"{option('rows')}={args.rows!r} is out of range; allowed: 0 (all) or 32..1000000")
    args.job = Job(model=str(pretrained_model(args.model)), data_dir=str(glue_dir(args.data_dir)), rows=rows,
                   epochs=whole(1, 100)("epochs", args.epochs), nodes=nodes,
                   batch_size=whole(1, 4096)("batch_size", args.batch_size), lr=number(0, 1)("lr", args.lr))


# ---- the decisions: commands, the split, the report (pure) --------------------------------------------

def job_flags(job: Job) -> list[str]:
    """The rows, epochs, batch and lr, as both programs spell them."""
    return ["--epochs", str(job.epochs), "--batch-size", str(job.batch_size), "--lr", f"{job.lr:g}",
            *(["--max-train-samples", str(job.rows)] if job.rows else [])]


def finetune_command(job: Job, results: Path) -> list[str]:
    """`ftc finetune`'s arguments for the job, its results into `results`. Pure."""
    return ["finetune", "--name", CLUSTER, "--task", "mrpc", "--model", job.model, "--data-dir", job.data_dir,
            *job_flags(job), "--results", str(results)]


def peer_command(job: Job, cores: list[int], ranks: int, threads: int, output_dir: Path) -> tuple[list[str], dict]:
    """The peer as a user writes it by hand: torchrun of `ranks` processes under taskset of `cores`,
    OMP_NUM_THREADS = `threads` (as ftc's ranks had), scoring dev after training. The command and the
    environment it adds. Pure."""
    command = ["taskset", "-c", ",".join(map(str, cores)), sys.executable, "-m", "torch.distributed.run",
               "--standalone", "--nproc-per-node", str(ranks), "-m", "runner.node.hf_trainer", "--task", "mrpc",
               "--model", job.model, "--data-dir", job.data_dir, *job_flags(job), "--eval",
               "--output-dir", str(output_dir)]
    return command, {"OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO)}


def peer_ranks(launch: str, allowed: list[int], core_cpus: list[int], world_size: int,
               threads: int) -> tuple[list[int], int, int]:
    """Where the peer runs (the CPUs its taskset names), its ranks and its threads a rank: at its fastest launch
    a rank on each physical core (`core_cpus`, the first hardware thread of each), else ftc's job's `world_size`
    ranks of `threads` on every `allowed` CPU. Pure."""
    if launch == "fastest":
        return core_cpus, len(core_cpus), 1
    return allowed, world_size, threads


def iso_seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def phase_split(command_start: float, command_end: float, launched_at: float, results: dict) -> dict:
    """`ftc finetune`'s wall time, split: `phases` (PHASES, seconds), `startup_detail` (the controller's
    checks and launch; the launch to rank 0's program; in it, from its start to its first step, less the
    tokenization) and `unaccounted` (between epochs and after the last: the timeline's gather). Times
    are this machine's clock: time.time() around the command, run.json's `launched_at`, results.json.
    Pure; a results.json without stage_seconds (a train.py from before them) is a ValueError."""
    stages = results.get("stage_seconds") or {}
    if "to_first_step" not in stages or "tokenize" not in stages:
        raise ValueError(f"{RESULTS_FILE} has no stage_seconds (tokenize, to_first_step): the nodes' train.py "
                         "predates them")
    started, finished = iso_seconds(results["started_at"]), iso_seconds(results["finished_at"])
    save_model = stages.get("save_model", 0.0)
    detail = {"controller": launched_at - command_start, "launch_to_program": started - launched_at,
              "program_to_first_step": stages["to_first_step"] - stages["tokenize"]}
    phases = {"startup": sum(detail.values()), "tokenization": stages["tokenize"],
              "training": sum(e["pass_seconds"] for e in results["epoch_metrics"]),
              "evaluation": stages.get("evaluate", 0.0),
              "checkpoint": stages.get("checkpoint", 0.0) + save_model,
              "fetch": command_end - finished - save_model}
    wall = command_end - command_start
    return {"phases": {k: round(v, 3) for k, v in phases.items()},
            "startup_detail": {k: round(v, 3) for k, v in detail.items()},
            "unaccounted": round(wall - sum(phases.values()), 3)}


def report(job: Job, ftcs: list[dict], peers: list[dict], machine: str, command: str, date: str,
           peer_launch: str, majority: float) -> dict:
    """end_to_end.json: both sides' wall times over the rounds (medians, [min, max], every run), the
    ratio of the medians, and the split of ftc's median run; what ran; whether each side's model
    scores above `majority` (dev's commonest label's share): a model that does not is not trained, and
    its time is not a time to a trained model. `ftcs` and `peers`: what time_ftc and time_peer
    measured, a round each. Pure."""
    walls = [f["command_end"] - f["command_start"] for f in ftcs]
    ftc, peer = ftcs[walls.index(median_low(walls))], peers[[p["wall_s"] for p in peers].index(
        median_low([p["wall_s"] for p in peers]))]
    results, peer_results = ftc["results"], peer["results"]
    # rounded first: the ratio is the one a reader works out from the walls the report shows
    ftc_wall, peer_wall = round(statistics.median(walls), 3), round(statistics.median(p["wall_s"] for p in peers), 3)
    split = phase_split(ftc["command_start"], ftc["command_end"], ftc["run"]["started_at"], results)
    return {"date": date, "machine": machine, "command": command,
            "job": {"task": "mrpc", **asdict(job), "rows": job.rows or results["train_samples"],
                    "world_size": results["world_size"], "threads_per_rank": results["threads_per_rank"],
                    "precision": results["precision"]},
            "epochs": job.epochs,
            "ftc_wall_s": ftc_wall, "peer_wall_s": peer_wall,
            "speedup": round(peer_wall / ftc_wall, 3), "repeats": len(ftcs),
            "ftc_wall_s_runs": [round(w, 3) for w in walls], "peer_wall_s_runs": [round(p["wall_s"], 3) for p in peers],
            "split_of": "ftc's run of the median wall time (the lower middle of an even count); accuracies from it "
                        "and the peer's likewise",
            "phases": split["phases"], "startup_detail": split["startup_detail"], "unaccounted_s": split["unaccounted"],
            "ftc_accuracy": results.get("eval_accuracy"), "peer_accuracy": peer_results.get("eval_accuracy"),
            "ftc_f1": results.get("eval_f1"), "peer_f1": peer_results.get("eval_f1"),
            "majority_class_accuracy": round(majority, 6),
            "trained": {side: accuracy is not None and accuracy > majority for side, accuracy in
                        (("ftc", results.get("eval_accuracy")), ("peer", peer_results.get("eval_accuracy")))},
            "peer_launch": PEER_LAUNCHES[peer_launch], "peer_world_size": peer_results.get("world_size"),
            # rows a step: the batch a rank times the ranks (the peer at its fastest launch: one a core)
            "global_batch": {"ftc": job.batch_size * results["world_size"],
                             "peer": job.batch_size * (peer_results.get("world_size") or 0)},
            "peer_training_s": round(sum(e["pass_seconds"] for e in peer_results["epoch_metrics"]), 3),
            "cluster_up_s": round(ftc["cluster_up_s"], 3),
            # this machine's 1-minute load average before and after each side: others' work shares its cores
            "load_average": {"ftc": [f["load"] for f in ftcs], "peer": [p["load"] for p in peers]},
            "ftc_command": "ftc " + " ".join(ftc["command"]), "peer_command": " ".join(peer["command"]),
            "not_timed": "the local cluster's up and bootstrap (cluster_up_s), before ftc's command",
            "differences": "ftc scores dev after every epoch and saves a checkpoint each epoch and the model; "
                           "the peer scores dev once, after training, and saves neither; where their ranks differ, "
                           "so do their rows a step (global_batch) and so their optimizer steps"}


def table(r: dict) -> str:
    """The split as a markdown table, for the terminal and docs/performance.md. Pure."""
    wall = r["ftc_wall_s"]
    lines = ["| phase | seconds | share |", "|---|---|---|"]
    lines += [f"| {name} | {r['phases'][name]:.1f} | {100 * r['phases'][name] / wall:.0f}% |" for name in PHASES]
    lines += [f"| ftc wall | {wall:.1f} | 100% |", f"| peer wall (torchrun) | {r['peer_wall_s']:.1f} | |"]
    return "\n".join(lines)


# ---- the measurement (processes) ---------------------------------------------------------------------

def measure(job: Job, repeats: int, out: Path, work: str | None, command: str, peer_launch: str) -> int:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ftc-e2e-") as scratch:
        base = Path(work).resolve() if work else Path(scratch)
        base.mkdir(parents=True, exist_ok=True)
        cores = sorted(os.sched_getaffinity(0))
        core_cpus = node_facts.cpu_topology(cores)["core_cpus"]
        machine = f"{node_facts.cpu_info()[0]}, {len(cores)} cores"
        majority = glue.majority_share([label for *_, label in glue.load_split("mrpc", "dev", job.data_dir)])
        progress(f"end to end on {node_facts.cpu_info()[0]}, cores {cores}: MRPC {job.rows or 'all'} rows, "
                 f"{job.epochs} epochs, {job.nodes} local nodes; the peer at {PEER_LAUNCHES[peer_launch]}")
        ftcs, peers = [], []
        for round_ in range(repeats):  # the order alternates, so neither side always runs on a machine the other warmed
            where = base / f"round-{round_ + 1}" if repeats > 1 else base
            where.mkdir(parents=True, exist_ok=True)
            for side in (("ftc", "peer") if round_ % 2 == 0 else ("peer", "ftc")):
                if side == "ftc":
                    ftcs.append(time_ftc(job, where))
                else:
                    first = ftcs[0]["results"]  # round 1 runs ftc first: at ftc's launch the peer takes its ranks
                    peers.append(time_peer(job, *peer_ranks(peer_launch, cores, core_cpus, first["world_size"],
                                                            first["threads_per_rank"]), where))
            r = report(job, ftcs, peers, machine, command, datetime.now(timezone.utc).strftime("%Y-%m-%d"), peer_launch,
                       majority)
            (out / RESULT_NAME).write_text(json.dumps(r, indent=2, allow_nan=False) + "\n")
    print(table(r))
    print(f"ftc {r['ftc_wall_s']:.1f} s, peer {r['peer_wall_s']:.1f} s: {r['speedup']:.2f}x; dev accuracy ftc "
          f"{r['ftc_accuracy']}, peer {r['peer_accuracy']}; wrote {out / RESULT_NAME}")
    for side in (side for side, trained in r["trained"].items() if not trained):
        progress(f"{side}'s model scores no better than answering dev's commonest label to every pair "
                 f"({r['majority_class_accuracy']:.3f}): it is not trained, so its time is not a time to a trained "
                 "model; more epochs, a larger --lr or fewer rows a step train it")
    return 0


def time_ftc(job: Job, base: Path) -> dict:
    """A private FTC_HOME: up (untimed), `ftc finetune` timed, down. What report() reads of it."""
    env = {**os.environ, "FTC_HOME": str(base / "ftc-home")}
    results = base / "ftc-results"
    try:  # a failed `up` leaves what it started to `down` as well: FTC_HOME goes with the temporary folder
        up_start = time.time()
        run_logged([*FTC, "up", "--name", CLUSTER, "--nodes", str(job.nodes)], "ftc up", base / "ftc-up.log",
                    env=env, cwd=base)
        cluster_up_s = time.time() - up_start
        command, load_before = finetune_command(job, results), os.getloadavg()[0]
        progress(f"ftc: cluster up in {cluster_up_s:.1f} s; timing `ftc {' '.join(command)}`")
        start = time.time()
        run_logged([*FTC, *command], "ftc finetune", base / "ftc-finetune.log", env=env, cwd=base)
        end = time.time()
        load = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    finally:
        down = subprocess.run([*FTC, "down", "--name", CLUSTER], capture_output=True, text=True, env=env, cwd=base)
        (base / "ftc-down.log").write_text(down.stdout + down.stderr)
    if down.returncode != 0:  # its local nodes' sshd may still run: said, not left unnoticed
        raise FtcError(f"ftc down of the bench's cluster failed (exit {down.returncode}); its output ends:\n"
                       + (down.stdout + down.stderr)[-TAIL:])
    progress(f"ftc: {end - start:.1f} s")
    return {"command": command, "command_start": start, "command_end": end, "cluster_up_s": cluster_up_s,
            "load": load, "results": json.loads((results / RESULTS_FILE).read_text()),
            "run": json.loads((results / RECORD).read_text())}


def time_peer(job: Job, cores: list[int], ranks: int, threads: int, base: Path) -> dict:
    """The peer's torchrun, timed wall to wall."""
    output = base / "peer"
    command, added = peer_command(job, cores, ranks, threads, output)
    load_before = os.getloadavg()[0]
    progress(f"peer: timing `{' '.join(command)}`")
    start = time.time()
    run_logged(command, "the peer's torchrun", base / "peer.log", env={**os.environ, **added}, cwd=base)
    wall = time.time() - start
    load = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    progress(f"peer: {wall:.1f} s")
    return {"command": [f"{k}={v}" for k, v in added.items()] + command, "wall_s": wall, "load": load,
            "results": json.loads((output / RESULTS_FILE).read_text())}
