"""`ftc bench scaling`: ftc's defaults against the 2021 recipe and against the peer users already
have (Hugging Face Trainer through torchrun, pinned and unpinned), at each rank count, measured side
by side in one run on one machine and reported as ratios; the step's timeline at the top rank count,
the raw all-reduce, MFU against a measured GEMM peak, and each of --levers alone against the defaults.

Every ftc configuration is a real run of runner/node/train.py through the rendered mpirun launch
script (templates/launch.sh.j2); the peer is runner/node/hf_trainer.py through torchrun, on the
same cores and rows. OUT/bench.json is written after each rank count (the 2021 recipe runs first), so
a run cut short keeps what it measured (`complete`: false); scaling.md and scaling.png at the end.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

from provision.values import name_list

from ..node import facts as node_facts
from ..report import pyplot
from .common import (
    FULL_LAYERS,
    QUICK_LAYERS,
    REPORT,
    Bench,
    add_grad_compress,
    add_layout,
    add_out,
    add_workload,
    allreduce_seconds,
    check_layout,
    check_workload,
    progress,
    started,
    summary,
    today,
    whole_pass,
)

NAME = "scaling"
HELP = "ftc against the 2021 recipe and the peer at each rank count, the step's timeline, MFU, levers"
# What `--levers` sets against ftc's defaults at the top rank count, each alone.
LEVERS = {
    "overlap": ("gradient all-reduce overlapped with backward in DDP's buckets", ["--allreduce", "overlap"]),
    "balance-speed": ("every global batch split by the ranks' measured speed", ["--balance", "speed"]),
    "dense-embedding": ("every word-embedding row all-reduced", ["--embedding-sync", "dense"]),
    "fp32-wire": ("gradient all-reduced in fp32", ["--grad-compress", "none"]),
    "gloo-inherit": ("gloo's threads on the main thread's one core (what OMP_PROC_BIND leaves them)",
                     ["--gloo-threads", "inherit"]),
    "dropout-0": ("no dropout: attention in PyTorch's fused SDPA kernel (an option, not a default)",
                  ["--dropout", "0"]),
    "no-grad-sync": ("no gradient all-reduce (profiling: ranks drift apart)", ["--no-grad-sync"]),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_out(p, "bench.json, scaling.md, scaling.png")
    add_workload(p, rows="default 2048; quick: 128", repeats="default 3; quick: 2")
    add_layout(p)
    p.add_argument("--levers", default=None, metavar="A,B",
                   help=f"also ftc's defaults against each of these alone at the largest rank count: {', '.join(LEVERS)}")
    p.add_argument("--no-peer", action="store_true", help="leave out Hugging Face Trainer (the peer)")
    add_grad_compress(p)


def checked(args: argparse.Namespace) -> None:
    check_workload(args)
    if args.levers is not None:
        args.levers = name_list(LEVERS, "lever")("levers", args.levers)
    check_layout(args)


def run(args: argparse.Namespace) -> int:
    """The seed recipe once, then each rank count's rounds (bench.json after each), the levers, and
    the report's remaining measurements (GEMM peak, the raw all-reduce)."""
    out, mpi = started(args.out)
    bench = Bench.of(args, out, mpi, rows=(128, 2048), repeats=(2, 3))
    progress(f"bench on {node_facts.cpu_info()[0]}: {len(bench.physical)} physical cores, {bench.cores_per_rank} per "
             f"simulated node, ranks {args.ranks}, {bench.rows} rows per pass, {bench.repeats} repeats, mpirun {mpi}, "
             f"allocator {bench.allocator or 'glibc'}")
    # The seed recipe pads every row to 128, so its rate hardly depends on which rows: a quarter
    # of the rows, once, is enough for the ratio.
    seed = bench.ftc("seed-1", 1, "seed", rows=max(32, bench.rows // 4))
    scaling: list[dict] = []
    for ranks in args.ranks:
        scaling = with_efficiency([*scaling, scaling_row(bench, ranks, with_peer=not args.no_peer)])
        write_report(out, {**measured(bench, args, seed, scaling), "complete": False})
    levers = measure_levers(bench, max(args.ranks), args.levers) if args.levers else []
    report = {**measured(bench, args, seed, scaling), **finished(bench, args, scaling, levers), "complete": True}
    write_report(out, report)
    (out / "scaling.md").write_text(markdown(report))
    plot(report, out / "scaling.png")
    print(markdown(report))
    print(f"wrote {out}/{REPORT}, scaling.md, scaling.png")
    return 0


# Sections other modes write into bench.json; the scaling report is every other key.
SECTIONS = ("launch", "network", "long_jobs")


def write_report(out: Path, report: dict) -> None:
    """The scaling report into OUT/bench.json, in place of an earlier one, beside other modes' sections."""
    path = out / REPORT
    earlier = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**report, **{key: earlier[key] for key in SECTIONS if key in earlier}},
                               indent=2, allow_nan=False))


def scaling_row(bench: Bench, ranks: int, with_peer: bool) -> dict:
    """At `ranks`, `repeats` rounds of ftc, the peer pinned and the peer unpinned, one after the
    other on the same cores and rows; medians and ranges of each. At one rank the two peer launches
    are the same thing (one process on its cores), so it runs once a round."""
    rates: dict[str, list[float]] = {"ftc": [], "pinned": [], "unpinned": []}
    tokens = []
    launches = ("pinned",) if ranks == 1 else ("pinned", "unpinned")
    for repeat in range(bench.repeats):
        run = whole_pass(bench.ftc(f"ftc-{ranks}-r{repeat}", ranks))
        rates["ftc"].append(run["rows_per_s"])
        tokens.append(run["tokens_per_s"])
        for launch_kind in launches if with_peer else ():
            rates[launch_kind].append(whole_pass(bench.peer(f"peer-{ranks}-{launch_kind}-r{repeat}", ranks,
                                                            launch_kind == "pinned"))["rows_per_s"])
    row = {"ranks": ranks}
    row["ftc_rows_per_s"], row["ftc_rows_per_s_range"] = summary(rates["ftc"])
    row["ftc_tokens_per_s"] = summary(tokens)[0]
    row["ftc_rows_per_s_runs"] = rates["ftc"]
    if with_peer:
        medians = {kind: summary(rates[kind])[0] for kind in launches}
        best = max(launches, key=medians.__getitem__)
        row["peer_rows_per_s"], row["peer_rows_per_s_range"] = summary(rates[best])
        row["peer_launch"] = best
        for kind in launches:
            row[f"peer_{kind}_rows_per_s_runs"] = rates[kind]
        row["speedup_vs_peer"] = round(row["ftc_rows_per_s"] / row["peer_rows_per_s"], 3)
    return row


def with_efficiency(scaling: list[dict]) -> list[dict]:
    """Each row's efficiency against one rank's rate (ftc's, and the peer's where it ran); None
    without a 1-rank row. Pure."""
    base = scaling[0] if scaling[0]["ranks"] == 1 else None
    rows = []
    for row in scaling:
        row = {**row, "efficiency": round(row["ftc_rows_per_s"] / (row["ranks"] * base["ftc_rows_per_s"]), 3)
               if base else None}
        if base and "peer_rows_per_s" in row:
            row["peer_efficiency"] = round(row["peer_rows_per_s"] / (row["ranks"] * base["peer_rows_per_s"]), 3)
        rows.append(row)
    return rows


def measure_levers(bench: Bench, top: int, names: list[str]) -> list[dict]:
    """ftc's defaults against each lever alone at `top` ranks, alternating within each round."""
    rates: dict[str, list[float]] = {name: [] for name in ["default", *names]}
    for repeat in range(bench.repeats):
        for name in rates:
            extra = LEVERS[name][1] if name != "default" else []
            rates[name].append(whole_pass(bench.ftc(f"lever-{top}-{name}-r{repeat}", top, extra=extra))["rows_per_s"])
    default = summary(rates["default"])[0]
    rows = []
    for name, values in rates.items():
        median, spread = summary(values)
        rows.append({"lever": name, "setting": LEVERS[name][0] if name != "default" else "ftc defaults",
                     "ranks": top, "rows_per_s": median, "rows_per_s_range": spread, "runs": values,
                     "vs_default": round(median / default, 3)})
    return rows


def measured(bench: Bench, args: argparse.Namespace, seed: dict, scaling: list[dict]) -> dict:
    """The report as far as the rank counts measured so far carry it: what ran, the seed recipe, the
    scaling rows and every run."""
    runs, quick, first = bench.runs, args.quick, scaling[0]
    seed_pass, ftc1 = whole_pass(seed), runs[f"ftc-{first['ranks']}-r0"]
    return {
        "date": today(), "cpu": node_facts.cpu_info()[0],
        "physical_cores": len(bench.physical), "native_bf16": node_facts.native_bf16(node_facts.cpu_info()[1]),
        "cores_per_rank": bench.cores_per_rank, "mpi": bench.mpi, "quick": quick,
        "method": "whole-pass", "rows_per_pass": bench.rows, "repeats": bench.repeats,
        "simulated_nodes": "each rank is one simulated node: a disjoint set of physical cores on one host, "
                           "all-reduce over loopback TCP (gloo), memory bandwidth shared",
        "model": "distilbert-base-uncased architecture (DistilBertConfig), random weights, bert-base-uncased vocabulary"
                 + (f", {QUICK_LAYERS} of its {FULL_LAYERS} layers (quick)" if quick else ""),
        "data": f"the first {bench.rows} rows of GLUE MRPC train, one whole pass per run, timed wall to wall",
        "peer": "Hugging Face Trainer (transformers.Trainer via torchrun): bf16 as ftc's rule decides, "
                "group_by_length sampling, DataCollatorWithPadding(pad_to_multiple_of=8), batch 32 per rank, "
                "OMP_NUM_THREADS = cores per rank; launched pinned (each rank on its own cores) and unpinned "
                "(every rank on all the run's cores), its better median taken",
        "seed_samples_per_s": seed_pass["rows_per_s"], "seed_rows_per_pass": seed["train_samples"],
        "ftc_samples_per_s": first["ftc_rows_per_s"], "ftc_rows_per_s": first["ftc_rows_per_s"],
        "speedup_vs_seed": round(first["ftc_rows_per_s"] / seed_pass["rows_per_s"], 3),
        "peer_samples_per_s": first.get("peer_rows_per_s"), "peer_rows_per_s": first.get("peer_rows_per_s"),
        "speedup_vs_peer": first.get("speedup_vs_peer"),
        "scaling": scaling,
        "precision": ftc1["precision"], "compile": ftc1["compile"], "allocator": bench.allocator or "glibc malloc",
        "versions": ftc1["versions"],
        "command": args.command_line,
        "runs": {name: {**{k: r.get(k) for k in ("recipe", "trainer", "precision", "backend", "grad_compress",
                                                  "allreduce", "balance", "pinned", "world_size", "threads_per_rank",
                                                  "padding", "batch_size_per_rank")}, **whole_pass(r)}
                 for name, r in runs.items()},
    }


def finished(bench: Bench, args: argparse.Namespace, scaling: list[dict], levers: list[dict]) -> dict:
    """What the report adds once every rank count ran: the top count's timeline (its median run), the
    raw all-reduce at each count, the planner's figures, the GEMM peak and MFU."""
    runs, physical, quick = bench.runs, bench.physical, args.quick
    first, top = scaling[0], max(row["ranks"] for row in scaling)
    ftc1, seed = runs[f"ftc-{first['ranks']}-r0"], runs["seed-1"]
    precision = ftc1["precision"]
    cores = physical[:bench.cores_per_rank]
    peak = gemm_peak(cores, "bfloat16" if precision == "bf16" else "float32", 1024 if quick else 4096)
    seed_peak = peak if precision == "fp32" else gemm_peak(cores, "float32", 1024 if quick else 4096)
    tokens_per_row = ftc1["train_tokens"] / ftc1["train_samples"]
    flops_token = model_flops_per_token(bench.model, tokens_per_row)
    seed_tokens = seed["train_tokens"] / seed["train_samples"]
    top_runs = sorted((runs[f"ftc-{top}-r{i}"] for i in range(bench.repeats)), key=lambda r: whole_pass(r)["rows_per_s"])
    timeline_run = top_runs[len(top_runs) // 2]  # the median run's
    allreduce = measure_allreduce(bench.out, scaling, physical, bench.cores_per_rank, bench.mpi, timeline_run)
    return {
        "levers": levers,
        "timeline": {"ranks": top, "allreduce": timeline_run["allreduce"], "balance": timeline_run["balance"],
                     "per_rank": timeline_run["timeline"]},
        "allreduce_idle_s": {str(k): round(v, 4) for k, v in allreduce.items()},
        "planner": planner_figures(timeline_run["timeline"], allreduce.get(top, 0.0)),
        "gemm_peak_tflops": round(peak, 3), "seed_gemm_peak_tflops": round(seed_peak, 3),
        "model_flops_per_token": round(flops_token), "tokens_per_sample": round(tokens_per_row, 1),
        "mfu": mfu(first["ftc_tokens_per_s"], flops_token, peak, first["ranks"]), "mfu_ranks": first["ranks"],
        "seed_mfu": round(whole_pass(seed)["tokens_per_s"] * model_flops_per_token(bench.model, seed_tokens)
                          / (seed_peak * 1e12), 3),
        "backend": runs[f"ftc-{top}-r0"]["backend"],
    }


def measure_allreduce(out: Path, scaling: list[dict], physical: list[int], cores_per_rank: int, mpi: str,
                      several: dict) -> dict[int, float]:
    """The all-reduce of the gradient as `several` (a run of several ranks) sent it, timed at each rank count."""
    return {row["ranks"]: allreduce_seconds(out, row["ranks"], physical[:row["ranks"] * cores_per_rank],
                                            cores_per_rank, mpi, gradient_bytes(several) / 1e6)
            for row in scaling if row["ranks"] > 1}


def planner_figures(timeline: list[dict], allreduce_idle_s: float) -> dict:
    """What `ftc plan` takes from the top rank count, as two separate terms: the raw collective
    (the gradient's all-reduce with idle cores) and its exposure in training (how much longer it
    took there), and the wait for the slowest rank as a share of compute."""
    def mean(key: str) -> float:
        return sum(p[key] for p in timeline) / len(timeline)
    comm, compute, wait = mean("comm_s"), mean("compute_s"), mean("wait_s")
    return {"allreduce_idle_s": round(allreduce_idle_s, 4), "allreduce_in_training_s": round(comm, 4),
            "exposure": round(comm / allreduce_idle_s, 3) if allreduce_idle_s else None,
            "wait_share": round(wait / compute, 4) if compute else None, "compute_s": round(compute, 4)}


def gradient_bytes(run: dict) -> float:
    """The gradient's bytes as a run of several ranks sent them (its results' grad_compress)."""
    from provision.estimate import gradient_bytes as of_precision
    return of_precision(bf16=run["grad_compress"] == "bf16")


def mfu(tokens_per_s: float, flops_per_token: float, peak_tflops_per_rank: float, ranks: int) -> float:
    """Model FLOPs utilisation: the run's FLOP/s over the GEMM peak of all its ranks' cores (each rank
    has one simulated node's cores, whose peak the bench measured). Pure."""
    return round(tokens_per_s * flops_per_token / (peak_tflops_per_rank * 1e12 * ranks), 3)


def gemm_peak(cores: list[int], dtype: str, size: int) -> float:
    """TFLOP/s of one large square matmul on `cores`, in `dtype`: the ceiling MFU is measured against."""
    code = (f"import os, time, torch; os.sched_setaffinity(0, {cores}); torch.set_num_threads({len(cores)});"
            f"a = torch.randn({size}, {size}).to(torch.{dtype}); b = torch.randn({size}, {size}).to(torch.{dtype});"
            "[a @ b for _ in range(3)]; t = time.perf_counter(); n = 10;"
            "[a @ b for _ in range(n)]; dt = time.perf_counter() - t;"
            f"print(2 * {size}**3 * n / dt / 1e12)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def model_flops_per_token(model_dir: Path, tokens_per_sample: float) -> float:
    """Training FLOPs per real token: 6 x non-embedding parameters (forward 2, backward 4)
    plus attention's two sequence-length matmuls (12 x layers x hidden x sequence)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification
    config = AutoConfig.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_config(config)
    embedding = sum(p.numel() for n, p in model.named_parameters() if "embeddings" in n)
    dense = sum(p.numel() for p in model.parameters()) - embedding
    layers = getattr(config, "n_layers", getattr(config, "num_hidden_layers", 6))
    hidden = getattr(config, "dim", getattr(config, "hidden_size", 768))
    return 6 * dense + 12 * layers * hidden * tokens_per_sample


def markdown(r: dict) -> str:
    lines = [f"Measured {r['date']} on {r['cpu']} ({r['physical_cores']} physical cores), "
             f"{r['cores_per_rank']} cores per simulated node, mpirun: {r['mpi']}. {r['simulated_nodes']}. "
             f"Each run: {r['data']}; each configuration {r['repeats']} times, programs alternating: "
             "medians, [min, max].", "",
             f"2021 recipe (seed: fp32, pad to 128), 1 rank: {r['seed_samples_per_s']:.1f} rows/s; ftc at 1 rank: "
             f"{r['speedup_vs_seed']:.2f}x the seed recipe.", "",
             "| ranks | ftc rows/s | ftc tokens/s | peer rows/s | peer launch | ftc / peer | ftc efficiency | peer efficiency |",
             "|---|---|---|---|---|---|---|---|"]
    def spread(values: list[float]) -> str:
        return f"[{values[0]:.1f}, {values[1]:.1f}]"
    for row in r["scaling"]:
        peer = (f"{row['peer_rows_per_s']:.1f} {spread(row['peer_rows_per_s_range'])} | {row['peer_launch']} | "
                f"{row['speedup_vs_peer']:.2f}x" if row.get("peer_rows_per_s") else " | | ")
        lines.append(f"| {row['ranks']} | {row['ftc_rows_per_s']:.1f} {spread(row['ftc_rows_per_s_range'])} | "
                     f"{row['ftc_tokens_per_s']:.0f} | {peer} | {row['efficiency'] or 0:.2f} | "
                     f"{row.get('peer_efficiency') or 0:.2f} |")
    t = r["timeline"]
    lines += ["", f"Where each rank's step goes at {t['ranks']} ranks (mean seconds per step, ftc, all-reduce "
              f"{t['allreduce']}, balance {t['balance']}, the median run):", "",
              "| rank | compute (fwd+bwd) | waiting for the slowest | all-reduce | optimizer | step |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {p['rank']} | {p['compute_s']:.3f} | {p['wait_s']:.3f} | {p['comm_s']:.3f} | {p['optimizer_s']:.3f} | "
              f"{p['step_s']:.3f} |" for p in t["per_rank"]]
    if r["levers"]:
        lines += ["", f"Levers at {r['levers'][0]['ranks']} ranks, each alone against ftc's defaults, alternating:", "",
                  "| setting | rows/s | runs | vs defaults |", "|---|---|---|---|"]
        lines += [f"| {x['setting']} | {x['rows_per_s']:.1f} | {', '.join(f'{v:.1f}' for v in x['runs'])} | "
                  f"{x['vs_default']:.2f}x |" for x in r["levers"]]
    if r["allreduce_idle_s"]:
        lines += ["", "The gradient's all-reduce alone, cores idle: " + ", ".join(
            f"{s:.3f} s at {k} ranks" for k, s in r["allreduce_idle_s"].items()) + "."]
    lines += ["", f"GEMM peak of {r['cores_per_rank']} cores: {r['gemm_peak_tflops']:.2f} TFLOP/s ({r['precision']}); "
              f"ftc at {r.get('mfu_ranks', 1)} rank(s): MFU {r['mfu'] * 100:.0f}% of their cores' peak "
              f"({r['model_flops_per_token'] / 1e6:.0f} MFLOP per real token, "
              f"{r['tokens_per_sample']:.0f} real tokens per row); seed recipe: MFU {r['seed_mfu'] * 100:.0f}% of the "
              f"fp32 peak ({r['seed_gemm_peak_tflops']:.2f} TFLOP/s), counting real tokens only."]
    return "\n".join(lines) + "\n"


def plot(r: dict, path: Path) -> None:
    plt = pyplot()
    ranks = [row["ranks"] for row in r["scaling"]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))

    def with_range(axis, key, style, label, color=None):
        medians = [row[key] for row in r["scaling"]]
        spread = [[m - row[key + "_range"][0] for m, row in zip(medians, r["scaling"])],
                  [row[key + "_range"][1] - m for m, row in zip(medians, r["scaling"])]]
        axis.errorbar(ranks, medians, yerr=spread, fmt=style, capsize=3, label=label, color=color)
    with_range(left, "ftc_rows_per_s", "o-", "ftc defaults")
    left.plot(ranks, [r["scaling"][0]["ftc_rows_per_s"] * k for k in ranks], "--", color="grey", label="ftc ideal")
    left.scatter([1], [r["seed_samples_per_s"]], color="red", zorder=3, label="seed recipe")
    if r.get("peer_rows_per_s"):
        with_range(left, "peer_rows_per_s", "s-", "Hugging Face Trainer (peer, best launch)", "tab:orange")
        right.plot(ranks, [row.get("peer_efficiency") or 0 for row in r["scaling"]], "s-", color="tab:orange",
                   label="Hugging Face Trainer (peer)")
    left.set_xlabel("simulated nodes (ranks)")
    left.set_ylabel("rows/s over a whole pass (median)")
    left.set_xticks(ranks)
    left.legend()
    right.plot(ranks, [row["efficiency"] or 0 for row in r["scaling"]], "o-", label="ftc defaults")
    right.axhline(0.75, color="red", linestyle=":", label="2021 recipe at 4 nodes (0.75)")
    right.set_ylim(0, 1.05)
    right.set_xticks(ranks)
    right.set_xlabel("simulated nodes (ranks)")
    right.set_ylabel("scaling efficiency")
    right.legend()
    fig.suptitle(f"DistilBERT on MRPC, {r['cpu'][:50]}, {r['cores_per_rank']} cores per node")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
