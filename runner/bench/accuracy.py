"""`ftc bench accuracy`: the other side of the speed claim. ftc, ftc without dropout (an option) and
the peer (and the 2021 recipe with --with-seed), the same epochs, seed and learning rate, full MRPC,
pretrained weights, scored on MRPC dev; into OUT/accuracy.json."""

import argparse
import json
from concurrent.futures import ThreadPoolExecutor

from provision.errors import UsageError

from ..jobspec import glue_dir
from ..node import facts as node_facts
from .common import add_out, check_numbers, physical_cores, pretrained_model, progress, run_config, run_peer, started, today

NAME = "accuracy"
HELP = "dev accuracy of ftc, ftc without dropout and the peer, same epochs, pretrained weights"
RESULT_NAME = "accuracy.json"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_out(p, RESULT_NAME)
    p.add_argument("--data-dir", default=None, help="GLUE directory holding mrpc/train.tsv")
    p.add_argument("--model", default=None, help="pretrained model directory (default: the packaged MiniLM)")
    p.add_argument("--with-seed", action="store_true", help="also the 2021 recipe (seed)")


def checked(args: argparse.Namespace) -> None:
    """The programs run side by side, a core each at least, on a pretrained model directory."""
    check_numbers(args)
    args.model = pretrained_model(args.model)
    programs, physical = 3 + bool(args.with_seed), len(physical_cores())
    if physical < programs:
        raise UsageError(f"`ftc bench accuracy` runs {programs} programs side by side, a core each at least; this "
                         f"host has {physical} physical core(s): run it on a host with {programs} or more")
    args.data_dir = glue_dir(args.data_dir)


def run(args: argparse.Namespace) -> int:
    """The programs run at once, each on its own share of the cores, at 2 ranks where a share has 2
    cores or more, so that ftc's rank balance and after-backward all-reduce take part: accuracy
    depends on the ranks, not on the cores."""
    out, mpi = started(args.out)
    physical = physical_cores()
    programs = ["ftc", "ftc-dropout-0", "peer"] + (["seed"] if args.with_seed else [])
    share = len(physical) // len(programs)
    ranks = 2 if share >= 2 else 1
    common = ["--model", str(args.model), "--data-dir", str(args.data_dir)]

    def one(i: int) -> dict:
        cores, name = physical[i * share:(i + 1) * share], programs[i]
        if name == "peer":
            return run_peer("accuracy-peer", out, ranks, cores, share // ranks, [*common, "--eval"], pinned=True)
        recipe, extra = ("ftc", ["--dropout", "0"]) if name == "ftc-dropout-0" else (name, [])
        return run_config(f"accuracy-{name}", out, ranks, cores, share // ranks, mpi,
                          ["--task", "mrpc", *common, "--recipe", recipe, *extra, "--no-save", "--log-every", "20"])
    progress(f"accuracy on {node_facts.cpu_info()[0]}: {', '.join(programs)} at once, {ranks} ranks x "
             f"{share // ranks} cores each")
    with ThreadPoolExecutor(len(programs)) as pool:
        rows = dict(zip(programs, pool.map(one, range(len(programs)))))
    keys = ("precision", "world_size", "epochs", "batch_size_per_rank", "lr", "padding", "dropout", "allreduce",
            "balance", "eval_accuracy", "eval_f1", "epoch_metrics")
    report = {"date": today(), "cpu": node_facts.cpu_info()[0], "cores_each": share, "ranks_each": ranks,
              "model": str(args.model), "data": "GLUE MRPC: full train, scored on dev", "command": args.command_line,
              **{name: {k: r[k] for k in keys if k in r} for name, r in rows.items()}}
    for name in ("ftc", "ftc-dropout-0"):
        for metric in ("accuracy", "f1"):
            report[f"{name}_vs_peer_{metric}_points".replace("-", "_")] = round(
                100 * (rows[name][f"eval_{metric}"] - rows["peer"][f"eval_{metric}"]), 2)
    (out / RESULT_NAME).write_text(json.dumps(report, indent=2, allow_nan=False))
    print(json.dumps(report, indent=2, allow_nan=False))
    return 0
