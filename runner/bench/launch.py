"""`ftc bench launch`: your own script (examples/hf_trainer_glue.py) under ftc's launch against the
same script under plain torchrun on the same cores, at the largest --ranks; into OUT/bench.json's
`launch`, rewritten after each round."""

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from provision.launch import pick_allocator

from ..node import facts as node_facts
from ..node.protocol import OUTPUT_LOG, SCRIPT_WORKDIR
from .common import (
    REPO,
    add_layout,
    add_out,
    add_workload,
    check_layout,
    check_workload,
    fresh_job_dir,
    model_layers,
    physical_cores,
    progress,
    run_launch_script,
    run_logged,
    started,
    summary,
    today,
    trained_shape,
    write_section,
)

NAME = "launch"
HELP = "your script under ftc's launch against plain torchrun on the same cores"
EXAMPLE = REPO / "examples" / "hf_trainer_glue.py"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_out(p)
    add_workload(p, rows="default 2048; quick: 64", repeats="default 3")
    add_layout(p)


def checked(args: argparse.Namespace) -> None:
    check_workload(args)
    check_layout(args)


def run(args: argparse.Namespace) -> int:
    """The script launched two ways on the same cores and rows, alternating, `repeats` rounds: ftc's
    launch (script_rank through the rendered launch script: each rank on its own cores,
    OMP_NUM_THREADS, the allocator) and plain torchrun as the Hugging Face guide has a user start it
    by hand (OMP_NUM_THREADS = cores per rank, no pinning, no allocator). The rate is the script's own:
    rows over Trainer's train_runtime, one whole pass."""
    out, mpi = started(args.out)
    ranks, per_rank = max(args.ranks), args.cores_per_rank
    cores, rows, repeats = physical_cores()[:ranks * per_rank], args.rows or (64 if args.quick else 2048), args.repeats or 3
    layers = model_layers(args.quick)
    model = trained_shape(out / f"distilbert-{layers}-layers-weights", args.tokenizer, layers)
    workdir = out / "launch-workdir"
    workdir.mkdir(exist_ok=True)
    shutil.copy(EXAMPLE, workdir / EXAMPLE.name)
    script_args = ["--model", str(model), "--train-file", str(args.data_dir / "mrpc" / "train.tsv"),
                   "--validation-file", str(args.data_dir / "mrpc" / "dev.tsv"), "--max-train-samples", str(rows),
                   "--max-eval-samples", "32", "--epochs", "1", "--batch-size", "32"]
    allocator = pick_allocator(node_facts.gather(""))
    progress(f"launch bench on {node_facts.cpu_info()[0]}: {EXAMPLE.name}, {ranks} ranks x {per_rank} cores, {rows} "
             f"rows, {repeats} rounds alternating; ftc's allocator {allocator or 'glibc'}")
    setting = {"script": f"examples/{EXAMPLE.name}", "ranks": ranks, "cores_per_rank": per_rank, "rows_per_pass": rows,
               "repeats": repeats, "cpu": node_facts.cpu_info()[0], "allocator": allocator or "glibc malloc",
               "date": today(), "command": args.command_line,
               "model": "distilbert-base-uncased architecture, random weights"
                 + (f", {layers} layer (quick)" if args.quick else ""),
               "torchrun": "python -m torch.distributed.run --standalone --nproc-per-node N SCRIPT, under taskset of "
                           "the same cores, OMP_NUM_THREADS = cores per rank, no pinning, no allocator",
               "rate": "rows / Trainer's train_runtime, one whole pass; medians, [min, max]"}
    rates: dict[str, list[float]] = {"ftc": [], "torchrun": []}
    for repeat in range(repeats):
        for how in ("ftc", "torchrun") if repeat % 2 == 0 else ("torchrun", "ftc"):
            name = f"launch-{how}-{ranks}-r{repeat}"
            if how == "ftc":
                job_dir, _ = run_launch_script(name, out, ranks, cores, per_rank, mpi, "script_rank",
                                               ["output", EXAMPLE.name, *script_args], allocator, workdir)
                result = json.loads((job_dir / SCRIPT_WORKDIR / "output" / "result.json").read_text())
            else:
                result = by_hand_torchrun(name, out, ranks, cores, per_rank, workdir / EXAMPLE.name, script_args)
            rates[how].append(round(result["train_samples"] / result["train_runtime"], 3))
            progress(f"  {name}: {rates[how][-1]:.1f} rows/s ({result['train_runtime']:.1f} s pass, "
                     f"{result['precision']})")
        row = launch_row(setting, rates)
        report_path = write_section(out, "launch", {**row, "rounds_done": repeat + 1})
    print(f"ftc launch / plain torchrun: {row['launch_speedup']:.2f}x ({row['ftc_rows_per_s']:.1f} vs "
          f"{row['torchrun_rows_per_s']:.1f} rows/s at {ranks} x {per_rank} cores); wrote {report_path} (launch)")
    return 0


def launch_row(setting: dict, rates: dict[str, list[float]]) -> dict:
    """bench.json's launch from the rounds so far: each side's median, [min, max] and runs, and their
    ratio. Pure."""
    row = dict(setting)
    for how, values in rates.items():
        row[f"{how}_rows_per_s"], row[f"{how}_rows_per_s_range"] = summary(values)
        row[f"{how}_rows_per_s_runs"] = values
    row["launch_speedup"] = round(row["ftc_rows_per_s"] / row["torchrun_rows_per_s"], 3)
    return row


def by_hand_torchrun(name: str, out: Path, ranks: int, cores: list[int], per_rank: int, script: Path,
                     script_args: list[str]) -> dict:
    """The script under torchrun as a user starts it by hand: the same cores, OMP_NUM_THREADS = cores
    per rank, no pinning, no allocator. What it wrote (result.json)."""
    job_dir = fresh_job_dir(out, name)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["OMP_NUM_THREADS"] = str(per_rank)
    command = ["taskset", "-c", ",".join(map(str, cores)), sys.executable, "-m", "torch.distributed.run",
               "--standalone", "--nproc-per-node", str(ranks), str(script), *script_args,
               "--output-dir", str(job_dir / "output")]
    run_logged(command, f"bench {name}", job_dir / OUTPUT_LOG, env=env, cwd=job_dir)
    return json.loads((job_dir / "output" / "result.json").read_text())
