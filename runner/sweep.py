"""`ftc sweep`: the 2021 recipe's table, reproduced. The same fine-tuning job runs on a
cluster of each size in turn (any provider); the cluster is reused when it already has
the size, recreated when not, and torn down at the end (kept with KEEP=1). The table and plot put the
recipe's own figures beside ours.
"""

import json
from dataclasses import replace
from pathlib import Path

from rich.markup import escape

from provision import cluster
from provision import state as st
from provision.errors import EXIT_INTERRUPTED
from provision.providers import default_world, traits
from provision.ui import answer, console

from . import runs
from .job import finetune, refuse_if_busy
from .jobspec import JobSpec, check_ppn_fits, refuse_unreachable_inputs
from .node.protocol import RESULTS_FILE
from .node.units import duration
from .report import pyplot

# The 2021 recipe: distilbert-base-uncased on RECIPE_2021_WHERE, fp32, training time in seconds.
RECIPE_2021_WHERE = default_world().default_instance_type  # ftc's default instance type is the recipe's
RECIPE_2021 = {"mrpc": {1: 7 * 60 + 46, 2: 4 * 60 + 39, 4: 2 * 60 + 36},
               "qqp": {1: 11 * 3600 + 22 * 60, 2: 6 * 3600 + 38 * 60, 4: 3 * 3600 + 51 * 60}}


def sweep(spec, job: JobSpec, node_counts: list[int], out: Path, keep: bool, yes: bool) -> int:
    sizes = sorted(set(node_counts))
    check_before_launch(spec, job, sizes, out)
    rows = []
    try:  # from here on the sweep owns the cluster: it reuses or replaces it, and releases it at the end
        for nodes in sizes:
            sized = replace(spec, nodes=nodes)
            cluster.ensure(sized, yes)
            results_dir = out / f"{nodes}-node"
            code = finetune(spec.name, replace(job, results=str(results_dir)))
            if code != 0:
                how = "was stopped by Ctrl-C" if code == EXIT_INTERRUPTED else f"failed (exit {code})"
                console.print(f"[red]sweep: the job on {nodes} node(s) {how}; its logs: {escape(str(results_dir))}[/]")
                return code
            results = json.loads((results_dir / RESULTS_FILE).read_text())
            rows.append({"nodes": nodes, "train_seconds": results["train_seconds"],
                         "samples_per_second": results["samples_per_second"],
                         "eval": {k: v for k, v in results.items() if k.startswith("eval_")}})
    finally:
        cluster.release(spec.name, keep)
    report = table(job.task, rows, spec.provider, spec.instance_type)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(report, indent=2, allow_nan=False))
    (out / "sweep.md").write_text(markdown(report))
    plot(report, out / "sweep.png")
    answer.print(markdown(report), markup=False)
    console.print(f"wrote {out}/sweep.json, sweep.md, sweep.png", markup=False)
    return 0


def check_before_launch(spec, job: JobSpec, sizes: list[int], out: Path) -> None:
    """What would stop the sweep half-way, refused while nothing has changed: a job running on the
    cluster it would reuse or replace, a PPN some size's nodes cannot hold, a size's results
    directory that already holds a run, a model this machine's nodes cannot load."""
    refuse_unreachable_inputs(job, spec.provider)
    if st.exists(spec.name):
        refuse_if_busy(st.load(spec.name))
    for nodes in sizes:
        check_ppn_fits(replace(spec, nodes=nodes), job)
        runs.refuse_reuse("out", out, out / f"{nodes}-node")


def table(task: str, rows: list[dict], provider: str, instance_type: str) -> dict:
    """Time, speed-up and scaling efficiency per cluster size, ours and the recipe's."""
    base = next((row["train_seconds"] for row in rows if row["nodes"] == 1), None)
    recipe = RECIPE_2021.get(task, {})
    for row in rows:
        n = row["nodes"]
        row["speedup"] = round(base / row["train_seconds"], 3) if base else None
        row["efficiency"] = round(row["speedup"] / n, 3) if base else None
        row["recipe_2021_seconds"] = recipe.get(n)
        row["recipe_2021_speedup"] = round(recipe[1] / recipe[n], 3) if n in recipe else None
    kind = f" ({instance_type})" if traits(provider).instance_types else " (one machine, simulated)"
    where = RECIPE_2021_WHERE if traits(provider).instance_types and instance_type == RECIPE_2021_WHERE else \
        f"{provider} nodes" + kind
    return {"task": task, "provider": provider, "instance_type": instance_type, "where": where, "rows": rows}


def markdown(report: dict) -> str:
    lines = [f"GLUE {report['task'].upper()} fine-tuning time per cluster size on {report['where']}; "
             f"the 2021 recipe's on {RECIPE_2021_WHERE} beside it.", "",
             "| nodes | time | speed-up | efficiency | 2021 recipe time | 2021 speed-up |", "|---|---|---|---|---|---|"]
    for row in report["rows"]:
        recipe = row["recipe_2021_seconds"]
        lines.append(f"| {row['nodes']} | {duration(row['train_seconds'])} | "
                     f"{row['speedup']:.2f}x | {row['efficiency']:.2f} | " if row["speedup"] is not None else
                     f"| {row['nodes']} | {duration(row['train_seconds'])} | | | ")
        lines[-1] += (f"{duration(recipe)} | {row['recipe_2021_speedup']:.2f}x |" if recipe else " | |")
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    plt = pyplot()
    rows = report["rows"]
    nodes = [row["nodes"] for row in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(nodes, [row["train_seconds"] for row in rows], "o-", label=f"ftc ({report['where']})")
    recipe = [(row["nodes"], row["recipe_2021_seconds"]) for row in rows if row["recipe_2021_seconds"]]
    if recipe:
        left.plot(*zip(*recipe), "s--", color="grey", label=f"2021 recipe ({RECIPE_2021_WHERE})")
    left.set_xlabel("nodes")
    left.set_ylabel("training time (s)")
    left.set_xticks(nodes)
    left.legend()
    right.plot(nodes, [row["speedup"] or 0 for row in rows], "o-", label="ftc")
    if recipe:
        right.plot([n for n, _ in recipe], [row["recipe_2021_speedup"] for row in rows if row["recipe_2021_seconds"]],
                   "s--", color="grey", label="2021 recipe")
    right.plot(nodes, nodes, ":", color="green", label="linear")
    right.set_xlabel("nodes")
    right.set_ylabel("speed-up over 1 node")
    right.set_xticks(nodes)
    right.legend()
    fig.suptitle(f"GLUE {report['task'].upper()}: time and speed-up per cluster size")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
