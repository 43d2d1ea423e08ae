"""Fine-tune a transformer on a GLUE task with DistributedDataParallel on CPU nodes.

One process per rank, started by mpirun (ftc renders the launch script from
templates/launch.sh.j2; `ftc finetune --render-only` prints it). By hand, from the
directory that holds the `runner` package:

    # one process
    python -m runner.node.train --task mrpc --data-dir ../shared/data/glue --model distilbert-base-uncased
    # two nodes x one rank, Intel MPI (MASTER_ADDR/MASTER_PORT: rank 0's node and a free port)
    MASTER_ADDR=10.0.0.5 MASTER_PORT=29500 FTC_WORLD_SIZE=2 \
        mpirun -f hostfile -n 2 -ppn 1 python -m runner.node.train --task qqp
    # your own data (CSV, TSV or JSON lines; runner/node/datafiles.py), any sequence-classification model
    python -m runner.node.train --task custom --train-file train.csv --validation-file dev.csv \
        --text-columns review --label-column stars --model roberta-base

Rank 0 writes TensorBoard event files into <output-dir>/tensorboard: the loss, learning rate and
throughput of every logged step, and each dev metric at the step it was measured.

Two recipes: `ftc` (default: bf16 autocast where the CPU has native bf16, fp32 master weights,
dynamic padding with length-grouped batches, fused AdamW, bf16-compressed gradient all-reduce,
torch.compile for long jobs) and `seed`, the 2021 recipe's settings (fp32, every sequence padded
to 128, batch 32 per rank, lr 2e-5, 3 epochs), so both can be compared on the same cluster.
"""

import argparse
import contextlib
import json
import logging
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from . import datafiles, glue, spot
from .distenv import DistEnv, check_world_size, leave_process_group, pin_self, read_env, threads_started_on
from .facts import cpu_info, native_bf16, versions
from .protocol import (
    CHECKPOINT_FILE,
    DONE,
    EXIT_PREEMPTED,
    HELD_FILE,
    KERNEL_CACHE_DIR,
    LOG_CLOCK,
    LOG_MARK_ENV,
    LOGS_DIR,
    MODEL_DIR,
    PREEMPTED_FILE,
    RELEASE_FILE,
    RESULTS_FILE,
    SPOT_NOTICE_ENV,
    TENSORBOARD_DIR,
    CheckpointSaved,
    DevMetrics,
    Preempted,
    Progress,
    TrainResults,
    checkpoint_line,
    dev_line,
    log_format,
    progress_line,
    rank_log_path,
    strict_json,
)
from .recipes import ALLREDUCE, COMPILE_MIN_STEPS, GRAD_COMPRESS, POWERSGD_RANK, RECIPES, allreduce_mode, wire_compress
from .units import duration

# ---- who am I, and which cores: before torch loads, since its OpenMP pool binds its
# threads to the cores the process has when it starts (OMP_PROC_BIND/OMP_PLACES) ----
ENV = read_env()
CORES = pin_self(ENV) if os.environ.get("FTC_SELF_PIN") == "1" else sorted(os.sched_getaffinity(0))
# Whether the launcher chose where compiled kernels are cached; torch itself sets a default
# under /tmp once it looks, so this is read before torch loads.
INDUCTOR_CACHE_GIVEN = "TORCHINDUCTOR_CACHE_DIR" in os.environ

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from .ddp import (  # noqa: E402
    GradSync,
    LowRankSync,
    RankBalance,
    UsedRowsSync,
    bf16_allreduce_hook,
    broadcast_weights,
    collate,
    deal,
    even_counts,
    global_batches,
)

# ---- settings: defaults, then the recipe, then explicit flags -------------------------------
# A second compile of the same model and shapes, from the node's kept kernel cache, as a share of
# the first's time (docs/compile_cache.json): 0.375 on 4 AMX cores under torch 2.11, where compiled
# steps ran 21% faster; 0.18 under the pinned torch 2.13 on 2 cores, where they ran no faster. The
# larger keeps --compile auto from compiling short jobs on the strength of a gain not seen there.
WARM_COMPILE_SHARE = 0.375
# The note in a node's kernel cache, per kernels compiled there: how long each compile took, and the
# rates jobs measured there, eager and compiled (what --compile auto weighs).
COMPILED_FILE = "ftc-compiled.json"
# A rate from fewer steady steps is not noted: a smoke test's few steps would decide for real jobs.
RATE_MIN_STEPS = 20

# The dropout probabilities of the architectures ftc is tested with (BERT/MiniLM, DistilBERT,
# RoBERTa, DeBERTa-v2; ModernBERT's embedding and MLP dropout):
# --dropout sets every one. At 0, attention runs PyTorch's fused SDPA kernel; with attention
# dropout it falls back to the unfused path.
DROPOUT_KEYS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout", "dropout",
                "attention_dropout", "seq_classif_dropout", "pooler_dropout", "embedding_dropout", "mlp_dropout")

# Where an epoch stands: batches done, their summed loss and count. At an epoch's start, none.
EPOCH_START = {"batch": 0, "loss": 0.0, "steps": 0}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", required=True, help="a GLUE task, or custom (--train-file, --validation-file)")
    p.add_argument("--model", default="distilbert-base-uncased", help="hub id or local directory")
    p.add_argument("--data-dir", default=None, help="GLUE TSV directory; default: the hub")
    p.add_argument("--train-file", default=None, help="custom: CSV, TSV or JSON lines (runner/node/datafiles.py)")
    p.add_argument("--validation-file", default=None, help="custom: the dev rows, in the same layout")
    p.add_argument("--text-columns", default="", help="custom: one or two, comma-separated (default sentence1,sentence2 "
                   "when the file has both, else text)")
    p.add_argument("--label-column", default="", help="custom: default label")
    p.add_argument("--output-dir", default=".")
    p.add_argument("--recipe", choices=RECIPES, default="ftc")
    p.add_argument("--precision", choices=("auto", "bf16", "fp32"), default=None)
    p.add_argument("--backend", choices=("auto", "gloo", "ccl"), default="auto")
    p.add_argument("--ipex", action="store_true", help="intel stack: ipex.optimize the model and optimizer")
    p.add_argument("--compile", choices=("auto", "on", "off"), default=None,
                   help=f"torch.compile the model (auto: when the job plans {COMPILE_MIN_STEPS} steps or more)")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None, help="per rank")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--max-train-samples", type=int, default=0)
    p.add_argument("--max-eval-samples", type=int, default=0)
    p.add_argument("--grad-compress", choices=GRAD_COMPRESS, default=None,
                   help="what the gradient all-reduce sends: auto (bf16 when training in bf16), none (fp32), bf16, "
                        "or powersgd (low-rank factors with error feedback: an approximate average, after backward)")
    p.add_argument("--powersgd-rank", type=int, default=POWERSGD_RANK, help="with --grad-compress powersgd: the factors' rank")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="gradient all-reduce bucket size")
    p.add_argument("--allreduce", choices=ALLREDUCE, default=None,
                   help="average the gradient after backward, cores idle; overlapped with it in DDP's buckets; or "
                        "overlapped, gloo's threads on a core kept from compute (comm-core); auto (ftc): what the "
                        "controller chose for the nodes' network, else after-backward")
    p.add_argument("--gloo-threads", choices=("rank-cores", "inherit"), default=None,
                   help="gloo's threads may run on any of the rank's cores (ftc), or inherit the main thread's one core")
    # Even by default: a split that follows measured speed depends on timing, so a run (and its
    # resume) would no longer repeat exactly; the bench measured no gain from it on equal nodes.
    p.add_argument("--balance", choices=("even", "speed"), default=None,
                   help="split each global batch among ranks evenly (default), or by their measured speed "
                        "(nodes of unequal speed)")
    p.add_argument("--embedding-sync", choices=("rows", "dense"), default=None,
                   help="all-reduce only the word-embedding rows some rank's batch used (ftc), or all of them")
    p.add_argument("--dropout", type=float, default=None,
                   help="every dropout probability of the model (default: its config's); 0 lets attention use fused SDPA")
    p.add_argument("--seed", type=int, default=None,
                   help="the new head's weights, the data's order, dropout and PowerSGD's start (default: the recipe's)")
    p.add_argument("--resume", action="store_true", help=f"continue from <output-dir>/{CHECKPOINT_FILE}")
    p.add_argument("--spot-watch", default=os.environ.get(SPOT_NOTICE_ENV, ""), metavar="READER@ENDPOINT",
                   help="spot nodes: ask the provider's reader (module:function) at its metadata service for an "
                        "interruption notice; on one, "
                        f"checkpoint where the job stands and exit {EXIT_PREEMPTED} (default: {SPOT_NOTICE_ENV}, "
                        "as the controller's launch sets it on a spot cluster)")
    p.add_argument("--hold-at-step", type=int, default=0, metavar="N",
                   help=f"tests: before step N, write <output-dir>/{HELD_FILE} and wait for <output-dir>/{RELEASE_FILE}")
    p.add_argument("--random-init", action="store_true", help="the model's architecture, fresh weights (bench)")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (bench)")
    p.add_argument("--warmup-steps-untimed", type=int, default=3, help="steps left out of the steady rate")
    p.add_argument("--no-grad-sync", action="store_true",
                   help="profiling only (bench): skip the gradient all-reduce, so ranks drift apart; "
                        "what is left of the step time is compute and contention, not communication")
    p.add_argument("--no-eval", action="store_true")
    p.add_argument("--no-save", action="store_true")
    p.add_argument("--stack", default=os.environ.get("FTC_STACK", "stock"))
    p.add_argument("--log-every", type=int, default=10)
    args = p.parse_args(argv)
    for key, value in RECIPES[args.recipe].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.grad_compress == "powersgd" and args.allreduce in ("overlap", "comm-core"):
        p.error("--grad-compress powersgd runs after backward: leave out --allreduce overlap")
    if args.task == datafiles.CUSTOM:
        if not (args.train_file and args.validation_file):
            p.error("--task custom needs --train-file and --validation-file")
    else:
        args.task = glue.task_name(args.task)
    return args


@dataclass
class Setup:
    """What this process decided at start: threads, transport, precision."""
    threads: int  # compute threads
    backend: str  # gloo | ccl | none (one rank)
    native_bf16: bool
    precision: str  # bf16 (autocast, fp32 master weights) | fp32
    grad_compress: str  # what the gradient all-reduce sends: bf16 | none (fp32) | powersgd (low-rank factors)
    allreduce: str  # after-backward | overlap | comm-core (allreduce_mode) | none (one rank)
    gloo_threads: str  # where gloo's threads run: rank-cores | inherit | kept-core | none (one rank)
    gloo_thread_cores: list[int]  # the cores gloo's threads may run on, read back from them
    exchange: "dist.ProcessGroup | None" = None  # overlapped: DDP's group, a thread per flow (exchange_group)


# Where a rank's step goes: collate, forward and backward (with DDP's overlapped all-reduce in
# --allreduce overlap); waiting for the slowest rank to finish its backward; the gradient
# all-reduce; the optimizer and schedule; and the whole step.
PHASES = ("compute_s", "wait_s", "comm_s", "optimizer_s", "step_s")


@dataclass
class Sync:
    """How this rank's gradient becomes the average of every rank's: what forward runs on (the
    model, or DDP around it), and which of ftc's parts take part (None: not used)."""
    module: torch.nn.Module  # what forward and backward run on
    grads: GradSync | LowRankSync | None  # after backward: everything but the used-rows embeddings (factored by PowerSGD)
    rows: UsedRowsSync | None  # the word embeddings' used rows
    balance: RankBalance | None  # the split of each global batch among ranks, and the wait for the slowest
    overlapped: bool  # DDP all-reduces during backward


@dataclass
class StepStats:
    """The steps this process ran: what the log and results.json report of speed and loss."""
    warmup_steps: int  # the first steps of this process (kernel setup, compile), left out of the steady rate
    steps_run: int = 0
    samples: int = 0  # all ranks together
    tokens: int = 0  # real (unpadded) tokens, all ranks together
    seconds: float = 0.0
    steady_samples: int = 0
    steady_tokens: int = 0
    steady_seconds: float = 0.0
    first_loss: float | None = None
    last_loss: float | None = None
    epoch_loss: float = 0.0  # summed over the epoch's steps, also those before a mid-epoch stop
    epoch_steps: int = 0
    epoch_rows: int = 0  # all ranks', in the steps this process ran of the epoch
    epoch_tokens: int = 0  # real tokens of those rows
    phases: dict = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))  # this rank's steady seconds in each


    def timeline(self) -> dict[str, float]:
        """This rank's mean seconds per steady step in each phase."""
        steady = max(1, self.steps_run - self.warmup_steps)
        return {key: round(value / steady, 4) for key, value in self.phases.items()}

    def record(self, phases: dict[str, float], samples: int, tokens: int, loss: float) -> None:
        seconds = phases["step_s"]
        self.steps_run += 1
        self.epoch_rows += samples
        self.epoch_tokens += tokens
        self.samples += samples
        self.tokens += tokens
        self.seconds += seconds
        if self.steps_run > self.warmup_steps:
            self.steady_samples += samples
            self.steady_tokens += tokens
            self.steady_seconds += seconds
            for key in PHASES:
                self.phases[key] += phases[key]
        self.first_loss = loss if self.first_loss is None else self.first_loss
        self.last_loss = loss
        self.epoch_loss += loss
        self.epoch_steps += 1

    def start_epoch(self, position: dict) -> None:
        self.epoch_loss, self.epoch_steps = position["loss"], position["steps"]
        self.epoch_rows = self.epoch_tokens = 0

    def position(self, batch: int) -> dict:
        return {"batch": batch, "loss": self.epoch_loss, "steps": self.epoch_steps}

    def rates(self) -> dict[str, float]:
        def per_second(n: float, seconds: float) -> float:
            return round(n / seconds, 3) if seconds else 0.0
        return {"samples_per_second": per_second(self.samples, self.seconds),
                "steady_samples_per_second": per_second(self.steady_samples, self.steady_seconds),
                "steady_tokens_per_second": per_second(self.steady_tokens, self.steady_seconds)}


@dataclass
class Data:
    """The task and its rows, tokenized (unpadded: collate pads each batch)."""
    tokenizer: object
    task: glue.Task
    train: dict  # encode's
    dev: dict
    pad_id: int  # the tokenizer's padding token


@dataclass
class Run:
    """What the loop and its helpers share: the settings and this rank, the data, the model with its
    optimizer and schedule, where the job's files go, and how far training has come (what a
    checkpoint keeps, and where a resumed run started)."""
    args: argparse.Namespace
    env: DistEnv
    setup: Setup
    log: logging.Logger
    out_dir: Path  # the job's directory (--output-dir)
    data: Data
    total_steps: int  # planned, all epochs
    model: torch.nn.Module  # the model itself (never DDP around it): what is saved
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    stats: StepStats
    started_at: datetime  # this process's start, UTC
    sync: Sync | None = None  # how the ranks average gradients: made once the model is compiled and resumed
    watcher: spot.Watcher | None = None  # this node's spot watch (its first rank's, with --spot-watch)
    board: object = None  # rank 0's TensorBoard writer
    step: int = 0  # steps done, all epochs
    history: list[dict] = field(default_factory=list)  # per finished epoch: train loss, the pass, dev metrics
    start_epoch: int = 0  # this process's first epoch, from 0 (a resumed run's)
    resumed_at: dict = field(default_factory=lambda: dict(EPOCH_START))  # where in start_epoch it resumed
    stage_seconds: dict[str, float] = field(default_factory=dict)  # results.json's (TrainResults.stage_seconds)

    @property
    def checkpoint(self) -> Path:
        return self.out_dir / CHECKPOINT_FILE


@dataclass
class RankRows:
    """This rank's rows of a global batch, ready for a step."""
    inputs: dict  # collated and padded
    labels: torch.Tensor
    share: float  # of the global batch: this rank's mean loss is weighted by it
    collate_s: float  # dealing and collating them (counted in the step's compute)


def main(argv=None) -> int:
    args, env, started_at = parse_args(argv), ENV, datetime.now(timezone.utc)
    out_dir = Path(args.output_dir)
    (out_dir / LOGS_DIR).mkdir(parents=True, exist_ok=True)
    log = setup_logging(out_dir / rank_log_path(env.rank), env.master)

    # ---- setup: threads, process group, precision -----------------------------------------------
    setup = start(args, env, log)
    random.seed(args.seed)
    torch.manual_seed(args.seed)

    # ---- data -----------------------------------------------------------------------------------
    stage_seconds: dict[str, float] = {}
    with timed(stage_seconds, "tokenize"):
        data = load_data(args, env)
    train = data.train
    total_steps = args.max_steps or args.epochs * len(global_batches(
        len(train["labels"]), train["lengths"], args.batch_size, env.world_size, args.group_by_length, args.seed))

    # ---- model and optimizer --------------------------------------------------------------------
    model, optimizer, scheduler = build_model(args, data.task, setup.precision, total_steps)
    stats = StepStats(args.warmup_steps_untimed)
    run = Run(args, env, setup, log, out_dir, data, total_steps, model, optimizer, scheduler, stats, started_at,
              stage_seconds=stage_seconds)
    if args.resume:
        resume(run)
    compiled = maybe_compile(run)  # after resume: it weighs the steps left

    # ---- DDP ------------------------------------------------------------------------------------
    run.sync = make_sync(model, args, env, setup)
    run.watcher = watch_spot(args.spot_watch) if args.spot_watch and env.local_rank == 0 else None

    # ---- the loop -------------------------------------------------------------------------------
    run.board = open_board(out_dir, env)
    stage_seconds["to_first_step"] = round((datetime.now(timezone.utc) - started_at).total_seconds(), 3)
    for epoch in range(run.start_epoch, args.epochs):
        batches = global_batches(len(train["labels"]), train["lengths"], args.batch_size, env.world_size,
                                 args.group_by_length, args.seed + epoch)
        skip = run.resumed_at["batch"] if epoch == run.start_epoch else 0  # done before a mid-epoch stop
        stats.start_epoch(run.resumed_at if skip else EPOCH_START)
        epoch_start = time.perf_counter()
        run.sync.module.train()
        for i, global_batch in enumerate(batches[skip:], start=skip):
            if run.step + 1 == args.hold_at_step:
                hold(run)
            loss, phases = train_step(run, rank_batch(run, global_batch))
            run.step += 1
            stats.record(phases, len(global_batch), sum(train["lengths"][j] for j in global_batch), loss)
            if env.master and (i % args.log_every == 0 or i == len(batches) - 1):
                log_progress(run, epoch)
            if args.spot_watch and interruption_seen(run.watcher, env.world_size):
                return stop_for_spot(run, epoch, i + 1)
            if args.max_steps and run.step >= args.max_steps:
                break
        epoch_seconds = time.perf_counter() - epoch_start
        log.info(f"epoch {epoch + 1} trained in {epoch_seconds:.1f}s")
        with timed(stage_seconds, "evaluate"):
            metrics = {} if args.no_eval else evaluate(run)
        run.history.append({"epoch": epoch + 1, "train_loss": finite(round(stats.epoch_loss / max(1, stats.epoch_steps), 6)),
                            "pass_seconds": round(epoch_seconds, 3), "pass_rows": stats.epoch_rows,
                            "pass_tokens": stats.epoch_tokens, **metrics})
        if env.master and metrics:
            log.info(dev_line(DevMetrics(epoch + 1, metrics)))
        if not args.no_save:
            with timed(stage_seconds, "checkpoint"):
                save_all(run, epoch + 1, EPOCH_START)
        if args.max_steps and run.step >= args.max_steps:
            break

    # ---- results ----------------------------------------------------------------------------------
    remember_compile(compiled, stats, env)
    timeline = every_rank(stats.timeline(), env.world_size)
    if env.master:
        write_results(run, results_of(run, compiled, timeline))
    leave_group(env)
    log.info(DONE)
    return 0


# ---- setup ------------------------------------------------------------------------------------------

def start(args, env, log) -> Setup:
    """Threads, the process group (several ranks), and the precision this CPU should train in."""
    allreduce = allreduce_mode(args.allreduce) if env.world_size > 1 else "none"
    if allreduce == "comm-core" and len(CORES) < 2:
        raise SystemExit(f"--allreduce comm-core keeps one of a rank's cores for gloo's threads: this rank has "
                         f"one core ({CORES[0]}); give each rank 2 cores or more, or --allreduce overlap")
    # comm-core: compute on all but the rank's last core (OMP_PROC_BIND=close binds n-1 threads to the
    # first n-1 places), gloo's threads on the last, so the exchange runs beside backward, not inside it
    kept = 1 if allreduce == "comm-core" else 0
    threads = max(1, int(os.environ.get("OMP_NUM_THREADS") or len(CORES)) - kept)
    torch.set_num_threads(threads)
    backend = args.backend
    if backend in ("auto", "ccl"):
        try:
            import oneccl_bindings_for_pytorch  # noqa: F401  (registers the "ccl" backend)
            backend = "ccl"
        except ImportError as exc:
            if args.backend == "ccl":
                raise SystemExit("--backend ccl asked for, but oneccl_bindings_for_pytorch does not import; "
                                 "use the intel stack or --backend gloo") from exc
            backend = "gloo"
    gloo_threads, gloo_cores, exchange = "none", [], None
    if env.world_size > 1:
        # gloo's threads on all of this rank's cores, on the one core the main thread is bound to
        # (--gloo-threads inherit), or on the core kept from compute (comm-core)
        gloo_threads = "kept-core" if kept else args.gloo_threads
        wanted = {"kept-core": CORES[-1:], "rank-cores": CORES}.get(gloo_threads) or sorted(os.sched_getaffinity(0))
        with threads_started_on(wanted), threads_born() as born:
            dist.init_process_group(backend, init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                                    rank=env.rank, world_size=env.world_size, timeout=timedelta(minutes=10))
            if allreduce in ("overlap", "comm-core") and backend == "gloo":
                exchange = exchange_group(env)
        gloo_cores = sorted(set().union(*born.values())) if born else wanted
        check_world_size(dist.get_world_size(), env.world_size, "the process group")
    check_world_size(env.world_size, env.expected_world_size, "the launcher")

    native = native_bf16(cpu_info()[1])
    precision = args.precision if args.precision != "auto" else ("bf16" if native else "fp32")
    if precision == "bf16" and not native:
        log.warning("bf16 asked for on a CPU without native bf16 (no amx_bf16/avx512_bf16): it is emulated and slower")
    grad_compress = wire_compress(args.grad_compress, precision == "bf16", env.world_size)
    setup = Setup(threads, backend if env.world_size > 1 else "none", native, precision, grad_compress,
                  allreduce, gloo_threads, gloo_cores, exchange)
    log.info(f"rank {env.rank}/{env.world_size} (local {env.local_rank}/{env.local_world_size}) cores {CORES} "
             f"threads {threads} backend {setup.backend} precision {precision} grad_compress {grad_compress} "
             f"allreduce {allreduce} gloo threads on {gloo_cores} recipe {args.recipe} seed {args.seed}")
    return setup


@contextlib.contextmanager
def threads_born():
    """The threads this process starts inside, each with the cores it may run on (gloo's, read back)."""
    before = set(os.listdir("/proc/self/task"))
    born: dict[int, set[int]] = {}
    yield born
    for tid in sorted(set(os.listdir("/proc/self/task")) - before):
        try:
            born[int(tid)] = os.sched_getaffinity(int(tid))
        except OSError:  # ended meanwhile
            pass


def exchange_group(env) -> "dist.ProcessGroup":
    """DDP's process group for an overlapped exchange: gloo with one device per GLOO_SOCKET_IFNAME entry
    (each a TCP flow to every peer) and a worker thread per device, so that as many buckets are in flight
    as there are flows; the default group keeps torch's two threads, which would leave flows idle."""
    devices = [name for name in os.environ.get("GLOO_SOCKET_IFNAME", "").split(",") if name]
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timedelta(minutes=10)
    options._devices = ([dist.ProcessGroupGloo.create_device(interface=name) for name in devices]
                        or [dist.ProcessGroupGloo.create_default_device()])
    options._threads = max(2, len(options._devices))
    store = dist.PrefixStore("ftc-exchange/", dist.distributed_c10d._get_default_store())
    backend = dist.ProcessGroupGloo(store, env.rank, env.world_size, options)
    group = dist.ProcessGroup(store, env.rank, env.world_size)
    group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)
    return group


# ---- data -------------------------------------------------------------------------------------------

def load_data(args, env) -> Data:
    """The tokenizer, the task (a GLUE one, or the one the custom files make), and the train and
    dev rows tokenized."""
    import transformers
    transformers.utils.logging.disable_progress_bar()
    # transformers' own messages (the weights' load report) go to this rank's log file only,
    # not to the terminal of whoever follows the job.
    transformers.utils.logging.disable_default_handler()
    for handler in logging.getLogger("ftc").handlers:
        if isinstance(handler, logging.FileHandler):
            transformers.utils.logging.add_handler(handler)
    if args.task == datafiles.CUSTOM:  # the classes found in the training file, as the controller's check found them
        task, train_rows, dev_rows = datafiles.load(Path(args.train_file), Path(args.validation_file),
                                                    args.text_columns, args.label_column)
    else:
        task = glue.TASKS[args.task]
        train_rows = glue.load_split(args.task, "train", args.data_dir)
        dev_rows = [] if args.no_eval else glue.load_split(args.task, "dev", args.data_dir)
    if args.max_train_samples:
        train_rows = train_rows[:args.max_train_samples]
    if args.max_eval_samples:
        dev_rows = dev_rows[:args.max_eval_samples]
    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
    return Data(tokenizer, task, encode(tokenizer, train_rows, args.max_length),
                encode(tokenizer, dev_rows, args.max_length), tokenizer.pad_token_id or 0)


def encode(tokenizer, rows, max_length: int) -> dict:
    if not rows:
        return {"input_ids": [], "lengths": [], "labels": [], "extra": {}}
    a = [r[0] for r in rows]
    b = [r[1] for r in rows] if rows[0][1] is not None else None
    enc = tokenizer(a, b, truncation=True, max_length=max_length)
    extra = {k: v for k, v in enc.items() if k not in ("input_ids", "attention_mask")}
    return {"input_ids": enc["input_ids"], "lengths": [len(x) for x in enc["input_ids"]],
            "labels": [r[2] for r in rows], "extra": extra}


# ---- model and optimizer ----------------------------------------------------------------------------

def build_model(args, task: glue.Task, precision: str, total_steps: int) -> tuple:
    """The model in fp32, whatever dtype its checkpoint was saved in: autocast computes in bf16,
    but AdamW must update fp32 master weights (bf16 weights would lose small updates). transformers
    5 would otherwise load a bf16 checkpoint as bf16 parameters. The task's class names become the
    config's id2label, so the saved model says what each output means."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, get_linear_schedule_with_warmup
    names = dict(enumerate(task.labels)) if task.labels else {0: "score"}
    config = AutoConfig.from_pretrained(args.model, num_labels=task.num_labels, id2label=names,
                                        label2id={name: i for i, name in names.items()})
    if args.dropout is not None:
        for key in DROPOUT_KEYS:
            if hasattr(config, key):
                setattr(config, key, args.dropout)
    if args.random_init:
        model = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    else:
        model = AutoModelForSequenceClassification.from_pretrained(args.model, config=config, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, fused=args.recipe == "ftc")
    scheduler = get_linear_schedule_with_warmup(optimizer, int(0.06 * total_steps), total_steps)
    if args.ipex:
        import intel_extension_for_pytorch as ipex
        model.train()  # from_pretrained returns the model in eval mode, which ipex.optimize takes for inference
        model, optimizer = ipex.optimize(model, optimizer=optimizer,
                                         dtype=torch.bfloat16 if precision == "bf16" else torch.float32)
    return model, optimizer, scheduler


@dataclass(frozen=True)
class Measured:
    """What this node measured of these kernels (its cache's note), against this job's planned work."""
    compile_s: float  # a compile with a cache like this one (cold or warm)
    eager_tokens_per_s: float  # a rank's steady real tokens per second, eager
    compiled_tokens_per_s: float  # the same, compiled
    planned_rank_tokens: float  # real tokens one rank trains on in this job: steps x its batch x the mean row

    @property
    def saving_s(self) -> float:
        return self.planned_rank_tokens / self.eager_tokens_per_s - self.planned_rank_tokens / self.compiled_tokens_per_s


def measured_here(noted: dict, cache: str, layout: str, planned_rank_tokens: float) -> Measured | None:
    """The node's note for these kernels as Measured (the rates of jobs of this `layout`: a rank's rate
    holds its share of the exchange), or None where it lacks a figure. Pure."""
    rates = noted.get("rates", {}).get(layout, {})
    figures = [noted.get(f"{cache}_s"), rates.get("eager_tokens_per_s"), rates.get("compiled_tokens_per_s")]
    if figures[0] is None or not (figures[1] and figures[2] and planned_rank_tokens):
        return None
    return Measured(*figures, planned_rank_tokens)


def compile_choice(mode: str, total_steps: int, cache: str = "cold", measured: Measured | None = None) -> tuple[bool, str]:
    """Whether to torch.compile, and why, in words for the log and results.json. Where this node has
    measured it for these kernels (`measured`), the compile runs when the time it saves over this
    rank's planned tokens exceeds its measured cost. Else by planned steps: with the node's kernel
    cache warm (an earlier job compiled the same model and shapes there), the compile costs
    WARM_COMPILE_SHARE of a cold one, and pays back after as many fewer steps."""
    if mode != "auto":
        return mode == "on", f"{mode} (--compile {mode}, planned {total_steps} steps)"
    if measured:
        pays = measured.saving_s > measured.compile_s
        return pays, (f"{'on' if pays else 'off'} (measured on this node: a {cache} compile {measured.compile_s:.0f} s; "
                      f"a rank's steps {measured.eager_tokens_per_s:.0f} real tokens/s eager, "
                      f"{measured.compiled_tokens_per_s:.0f} compiled: the {total_steps} planned steps save "
                      f"{measured.saving_s:.0f} s)")
    min_steps = compile_min_steps(cache)
    if total_steps >= min_steps:
        return True, f"on (planned {total_steps} steps >= {min_steps} with a {cache} kernel cache: the compile pays back)"
    return False, (f"off (planned {total_steps} steps < {min_steps} with a {cache} kernel cache: "
                   "the compile would not pay back)")


def compile_min_steps(cache: str) -> int:
    return COMPILE_MIN_STEPS if cache == "cold" else math.ceil(COMPILE_MIN_STEPS * WARM_COMPILE_SHARE)


def kernel_cache(out_dir: Path, stack: str) -> Path:
    """Where compiled kernels are kept: per node and stack, outside the job directory, so the next
    job of the same model and shapes on this node reuses them (unless the launcher chose a place)."""
    if INDUCTOR_CACHE_GIVEN:
        return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    node_dir = os.environ.get("FTC_NODE_DIR")
    return Path(node_dir) / "cache" / f"inductor-{stack}" if node_dir else out_dir / KERNEL_CACHE_DIR


def compile_signature(args, precision: str, threads: int) -> str:
    """What the kept kernels depend on: the model, the shapes a step sees, precision, torch, and the
    rank's threads (inductor writes them into its CPU kernels: a 16-thread rank's kernels are not a
    4-thread rank's, so a node that compiled for one layout is cold for another)."""
    return "|".join(map(str, (args.model, args.batch_size, args.max_length, args.pad_to, precision,
                              args.dropout, torch.__version__, threads)))


def compiled_before(cache_dir: Path) -> dict:
    """The cache's note (COMPILED_FILE), by compile_signature."""
    try:
        return json.loads((cache_dir / COMPILED_FILE).read_text())
    except (OSError, ValueError):
        return {}


def cache_state(noted: dict, env) -> str:
    """warm when every node's cache holds kernels compiled for these kernels' signature (`noted`: its
    note there), else cold: the ranks must agree, or one would wait at its first step on another's compile."""
    return "warm" if every_node(bool({"cold_s", "warm_s"} & noted.keys()), env) else "cold"


def every_node(flag: bool, env) -> bool:
    """Whether `flag` holds on every rank: each node decides from its own cache and notes, and the
    ranks must decide alike. A collective: every rank calls it, or the others wait for ever."""
    agreed = torch.tensor([int(flag)])
    if env.world_size > 1:
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
    return bool(agreed.item())


@dataclass(frozen=True)
class Compiled:
    """What maybe_compile decided, for the log, results.json and the cache's note."""
    note: str  # whether torch.compile ran, and why, in words
    cache: str  # warm | cold: the node's kernel cache when the compile began; none: not compiled
    cache_dir: Path
    signature: str  # compile_signature
    layout: str  # ranks and how the gradient crosses: what else a rank's rate depends on


def maybe_compile(run: Run) -> Compiled:
    args = run.args
    cache_dir = kernel_cache(run.out_dir, args.stack)
    signature = compile_signature(args, run.setup.precision, torch.get_num_threads())
    layout = f"{run.env.world_size} ranks, gradient {run.setup.grad_compress}"
    noted = compiled_before(cache_dir).get(signature, {})
    cache = cache_state(noted, run.env) if args.compile != "off" else "cold"
    steps_left, lengths = run.total_steps - run.step, run.data.train["lengths"]
    planned_rank_tokens = steps_left * args.batch_size * sum(lengths) / max(1, len(lengths))
    compiled, note = compile_choice(args.compile, steps_left, cache,
                                    measured_here(noted, cache, layout, planned_rank_tokens))
    # every rank takes part in every_node (a collective), whatever it decided itself
    if args.compile == "auto" and not every_node(compiled, run.env) and compiled:
        compiled, note = False, f"off (not every node's own figures say the compile pays back; here: {note})"
    run.log.info(f"compile: {note}")
    if not compiled:
        return Compiled(note, "none", cache_dir, signature, layout)
    # In place, so the state dict (checkpoints, the saved model) keeps its names.
    cache_dir.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir.resolve())
    run.model.compile(dynamic=True)
    return Compiled(note, cache, cache_dir, signature, layout)


def compile_seconds(stats: "StepStats") -> float:
    """The compile's cost, measured: what the first (untimed) steps took beyond steady steps."""
    steady = stats.steady_seconds / max(1, stats.steps_run - stats.warmup_steps)
    return max(0.0, stats.seconds - stats.steady_seconds - min(stats.warmup_steps, stats.steps_run) * steady)


def remember_compile(compiled: Compiled, stats: "StepStats", env) -> None:
    """Each node's first rank notes in its cache, for these kernels, what this job measured: the
    compile's seconds (cold or warm) and a rank's steady real tokens per second, compiled or eager,
    for `--compile auto` to weigh the next job by (written whole, then renamed: a reader never sees
    half a note)."""
    # A run by hand keeps its kernels in its own folder, no node's: an eager one has nothing to note there.
    kept_by_node = INDUCTOR_CACHE_GIVEN or bool(os.environ.get("FTC_NODE_DIR"))
    if env.local_rank != 0 or (compiled.cache == "none" and not kept_by_node):
        return
    notes = compiled_before(compiled.cache_dir)
    mine = notes.setdefault(compiled.signature, {})
    if compiled.cache != "none":
        mine[f"{compiled.cache}_s"] = round(compile_seconds(stats), 1)
    if stats.steps_run - stats.warmup_steps >= RATE_MIN_STEPS and stats.steady_seconds > 0:
        rate = stats.steady_tokens / env.world_size / stats.steady_seconds
        rates = mine.setdefault("rates", {}).setdefault(compiled.layout, {})
        rates["eager_tokens_per_s" if compiled.cache == "none" else "compiled_tokens_per_s"] = round(rate, 1)
    if not mine:
        return
    partial = compiled.cache_dir / f"{COMPILED_FILE}.{os.getpid()}"
    try:
        compiled.cache_dir.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps(notes, indent=1))
        partial.replace(compiled.cache_dir / COMPILED_FILE)
    except OSError as exc:  # a full disk or a read-only cache: the next job compiles cold, this one's results stand
        print(f"compile: the kernel cache's note was not written ({exc}); the next job counts it cold", file=sys.stderr)


# ---- DDP --------------------------------------------------------------------------------------------

def make_sync(model, args, env, setup: Setup) -> Sync:
    """How the ranks average their gradients. After backward (ftc): ftc's own buckets and rank
    balance. Overlapped (the seed recipe, and PyTorch's default): DDP. Either way the word
    embeddings' gradient can go as only the rows some rank used."""
    if env.world_size == 1:
        return Sync(model, None, None, None, False)
    embedding = model.get_input_embeddings().weight
    balance = None if args.no_grad_sync else RankBalance(env.world_size, adapt=args.balance == "speed")
    grad_compress = setup.grad_compress
    rows = UsedRowsSync(embedding, grad_compress != "none") if args.embedding_sync == "rows" else None
    if setup.allreduce == "after-backward":
        broadcast_weights(model)  # every rank starts from rank 0's weights
        params = [p for p in model.parameters() if p.requires_grad and not (rows and p is embedding)]
        if grad_compress == "powersgd":  # the used rows stay exact: factoring the whole table costs more arithmetic
            return Sync(model, LowRankSync(params, args.powersgd_rank, args.seed, args.bucket_mb), rows, balance, False)
        return Sync(model, GradSync(params, grad_compress == "bf16", args.bucket_mb), rows, balance, False)
    if rows:
        # The word embeddings hold a third of distilbert's weights, but a global batch uses
        # about one row in six: their gradient is zero elsewhere. DDP would all-reduce all of
        # it as the last bucket; ftc moves only the used rows.
        DDP._set_params_and_buffers_to_ignore_for_model(
            model, [next(n for n, p in model.named_parameters() if p is embedding)])
        dist.broadcast(embedding.data, 0)  # DDP broadcasts every other weight
    # DDP broadcasts rank 0's weights at construction: every rank starts identical.
    ddp = DDP(model, bucket_cap_mb=args.bucket_mb, gradient_as_bucket_view=True, process_group=setup.exchange)
    if grad_compress == "bf16":
        ddp.register_comm_hook(setup.exchange, bf16_allreduce_hook)
    return Sync(ddp, None, rows, balance, True)


# ---- the loop ---------------------------------------------------------------------------------------

def train_step(run: Run, rows: RankRows) -> tuple[float, dict[str, float]]:
    """Forward and backward; wait for every rank; average the gradient; optimizer step. Returns
    the loss and the seconds of each phase (PHASES)."""
    sync, optimizer, collate_s = run.sync, run.optimizer, rows.collate_s
    syncing = sync.balance is not None  # none in one process, or with --no-grad-sync (profiling)
    t0 = time.perf_counter()
    if sync.rows and syncing:
        sync.rows.agree(rows.inputs["input_ids"])  # its small all-reduce runs beside forward
    no_sync = sync.overlapped and not syncing
    with sync.module.no_sync() if no_sync else contextlib.nullcontext():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=run.setup.precision == "bf16"):
            loss = sync.module(**rows.inputs, labels=rows.labels).loss
        (loss * rows.share if rows.share != 1 else loss).backward()
    t1 = time.perf_counter()
    if syncing:
        sync.balance.exchange(len(rows.labels), collate_s + t1 - t0)  # waits here for the slowest rank
    t2 = time.perf_counter()
    if syncing:
        if sync.grads:
            sync.grads.average()
        if sync.rows:
            sync.rows.finish()
    t3 = time.perf_counter()
    optimizer.step()
    run.scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    value = loss.item()
    t4 = time.perf_counter()
    return value, {"compute_s": collate_s + t1 - t0, "wait_s": t2 - t1, "comm_s": t3 - t2, "optimizer_s": t4 - t3,
                   "step_s": collate_s + t4 - t0}


def rank_batch(run: Run, global_batch: list[int]) -> RankRows:
    """This rank's rows of a global batch, padded, their labels, and the share of the global batch
    they are: each rank's mean loss is weighted by it, so that the averaged gradient is the global
    batch's mean however the rows were split."""
    t0, env, train, balance = time.perf_counter(), run.env, run.data.train, run.sync.balance
    counts = balance.counts(len(global_batch)) if balance else even_counts(len(global_batch), env.world_size)
    indices = deal(global_batch, counts)[env.rank]
    batch = collate(train, indices, run.data.pad_id, run.args.max_length if run.args.pad_to == "max_length" else 0)
    labels = torch.tensor([train["labels"][j] for j in indices],
                          dtype=torch.float32 if run.data.task.labels is None else torch.long)
    return RankRows(batch, labels, len(indices) * env.world_size / len(global_batch), time.perf_counter() - t0)


def every_rank(value, world: int) -> list:
    """`value` from every rank, in rank order (rank 0 writes them all into results.json)."""
    if world == 1:
        return [value]
    gathered = [None] * world
    dist.all_gather_object(gathered, value)
    return gathered


def leave_group(env) -> None:
    """Every rank at the same point, then out of the process group (see leave_process_group)."""
    if env.world_size > 1:
        leave_process_group()


def log_progress(run: Run, epoch: int) -> None:
    stats, step, total_steps = run.stats, run.step, run.total_steps
    rate = stats.samples / stats.seconds
    left = (total_steps - step) * run.args.batch_size * run.env.world_size / rate
    run.log.info(progress_line(Progress(epoch + 1, run.args.epochs, step, total_steps, stats.last_loss, rate,
                                        duration(left))))
    to_board(run.board, step, {"train/loss": stats.last_loss, "train/learning_rate": run.scheduler.get_last_lr()[0],
                               "train/samples_per_second": rate})


def open_board(out_dir: Path, env):
    """Rank 0's TensorBoard writer into <output-dir>/tensorboard (fetched with the results), None elsewhere."""
    if not env.master:
        return None
    from torch.utils.tensorboard import SummaryWriter
    return SummaryWriter(str(out_dir / TENSORBOARD_DIR))


def to_board(board, step: int, values: dict[str, float | None]) -> None:
    """Scalars at `step`, flushed at once: a job that stops early (a spot notice, a crash) keeps them."""
    if board is None:
        return
    for tag, value in values.items():
        if value is not None and math.isfinite(value):
            board.add_scalar(tag, value, step)
    board.flush()


@torch.no_grad()
def evaluate(run: Run) -> dict[str, float]:
    """Each rank scores every world_size-th dev example; rank 0 gathers and computes the metrics
    (and writes them to TensorBoard at `step`).

    The model's own forward, uncompiled: a second compiled graph (eval mode) would cost more
    than a few hundred dev rows take."""
    model, dev, args, env = run.model, run.data.dev, run.args, run.env
    model.eval()
    mine = list(range(env.rank, len(dev["labels"]), env.world_size))
    mine.sort(key=dev["lengths"].__getitem__)
    predictions = []
    for start in range(0, len(mine), args.batch_size * 2):
        indices = mine[start:start + args.batch_size * 2]
        batch = collate(dev, indices, run.data.pad_id, args.max_length if args.pad_to == "max_length" else 0)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=run.setup.precision == "bf16"):
            logits = model.forward(**batch).logits.float()
        values = logits[:, 0] if logits.shape[1] == 1 else logits.argmax(-1).float()
        predictions += list(zip(indices, values.tolist()))
    model.train()
    predictions = [p for part in every_rank(predictions, env.world_size) for p in part]
    predictions.sort()
    pred = [p for _, p in predictions]
    gold = [dev["labels"][i] for i, _ in predictions]
    metrics = glue.score(run.data.task, pred, gold)
    to_board(run.board, run.step, {key.replace("eval_", "eval/", 1): value for key, value in metrics.items()})
    return metrics


def hold(run: Run) -> None:
    """Tests act on a job at a known point (detach, cancel, lose a node, arm a spot notice)
    instead of racing the clock: before the next step, rank 0 writes HELD_FILE and every rank
    waits until RELEASE_FILE exists in the job's directory (local nodes share one file system)."""
    if run.env.master:
        (run.out_dir / HELD_FILE).write_text(str(run.step + 1))
    while not (run.out_dir / RELEASE_FILE).exists():
        time.sleep(0.1)


def watch_spot(watch: str) -> spot.Watcher:
    watcher = spot.Watcher(watch)
    watcher.start()
    return watcher


def interruption_seen(watcher, world: int) -> bool:
    """Has any node's watcher seen a notice? One tiny all-reduce per step, so all ranks agree."""
    seen = torch.tensor([1 if watcher and watcher.notice else 0])
    if world > 1:
        dist.all_reduce(seen)
    return bool(seen.item())


def stop_for_spot(run: Run, epoch: int, batch: int) -> int:
    """Every rank stops after `batch` of `epoch` (the all-reduce made them agree): checkpoint there, exit."""
    save_all(run, epoch, run.stats.position(batch), batch)
    if run.env.master:
        notice = run.watcher.notice if run.watcher else None
        (run.out_dir / PREEMPTED_FILE).write_text(Preempted(notice, epoch, batch, run.step).to_json())
    leave_group(run.env)
    run.log.info(f"stopped for a spot interruption at epoch {epoch + 1} batch {batch}; resumable")
    return EXIT_PREEMPTED


# ---- checkpoints ------------------------------------------------------------------------------------

def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def save_all(run: Run, epochs_done: int, position: dict, batch: int | None = None) -> None:
    """Every rank's RNG (dropout masks differ by rank): a resumed run then matches an
    uninterrupted one. `position`: how far into the next epoch (a mid-epoch stop, after `batch`)."""
    rng = [None] * run.env.world_size
    if run.env.world_size > 1:
        dist.all_gather_object(rng, rng_state())
    else:
        rng = [rng_state()]
    if run.env.master:
        save_checkpoint(run, epochs_done, rng, position)
        run.log.info(checkpoint_line(CheckpointSaved(epochs_done, str(run.checkpoint), batch)))


def save_checkpoint(run: Run, epochs_done: int, rng: list, position: dict) -> None:
    path = run.checkpoint
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"model": run.model.state_dict(), "optimizer": run.optimizer.state_dict(),
                "scheduler": run.scheduler.state_dict(), "epoch": epochs_done, "step": run.step,
                "history": run.history, "rng": rng, "position": position}, tmp)
    os.replace(tmp, path)  # a crash mid-save leaves the previous checkpoint whole


def resume(run: Run) -> None:
    """Rank 0 reads the checkpoint (only its node has it) and sends it to the other ranks; the run
    goes on from where it was saved."""
    path, env = run.checkpoint, run.env
    box = [torch.load(path, weights_only=False) if env.master and path.exists() else None]
    if env.world_size > 1:
        dist.broadcast_object_list(box, src=0)
    checkpoint = box[0]
    if checkpoint is None:
        raise SystemExit(f"--resume: no checkpoint at {path}; start without --resume")
    run.model.load_state_dict(checkpoint["model"])
    run.optimizer.load_state_dict(checkpoint["optimizer"])
    run.scheduler.load_state_dict(checkpoint["scheduler"])
    rng = checkpoint.get("rng") or []
    if len(rng) == env.world_size:  # the same layout as the run that saved it: continue its random streams
        torch.set_rng_state(rng[env.rank]["torch"])
        random.setstate(rng[env.rank]["python"])
    position = checkpoint.get("position") or EPOCH_START  # checkpoints from before mid-epoch stops
    run.log.info(f"resumed from {path}: epoch {checkpoint['epoch']}, batch {position['batch']}, step {checkpoint['step']}")
    run.start_epoch, run.step, run.history, run.resumed_at = (checkpoint["epoch"], checkpoint["step"],
                                                               checkpoint["history"], position)


# ---- results ----------------------------------------------------------------------------------------

def results_of(run: Run, compiled: Compiled, timeline: list[dict]) -> TrainResults:
    """`timeline`: every rank's StepStats.timeline, in rank order."""
    args, env, setup, stats, history, train = run.args, run.env, run.setup, run.stats, run.history, run.data.train
    several = env.world_size > 1
    return TrainResults(
        task=args.task, model=args.model, recipe=args.recipe, stack=args.stack,
        backend=setup.backend, precision=setup.precision, native_bf16=setup.native_bf16,
        grad_compress=setup.grad_compress, grad_sync=not args.no_grad_sync,
        embedding_sync=args.embedding_sync if several else "none", compile=compiled.note,
        compile_cache=compiled.cache, compile_seconds=round(compile_seconds(stats), 1) if compiled.cache != "none" else None,
        allreduce=setup.allreduce, balance=args.balance if several else "none",
        gloo_threads=setup.gloo_threads, gloo_thread_cores=setup.gloo_thread_cores,
        nodes=env.world_size // max(1, env.local_world_size), ranks_per_node=env.local_world_size,
        threads_per_rank=setup.threads, world_size=env.world_size, epochs=args.epochs,
        batch_size_per_rank=args.batch_size, lr=args.lr, max_length=args.max_length, seed=args.seed,
        padding=args.pad_to, dropout=args.dropout, train_samples=len(train["labels"]),
        train_tokens=sum(train["lengths"]), train_samples_seen=stats.samples,
        train_tokens_seen=stats.tokens, train_seconds=round(stats.seconds, 3), **stats.rates(),
        first_loss=finite(stats.first_loss), final_loss=finite(stats.last_loss), steps=run.step,
        resumed_from_epoch=run.start_epoch if args.resume else None,
        resumed_from_batch=run.resumed_at["batch"] if args.resume else None,
        epoch_metrics=history, metrics={k: v for k, v in (history[-1] if history else {}).items() if k.startswith("eval_")},
        timeline=[{"rank": r, **phases} for r, phases in enumerate(timeline)],
        versions={"python": sys.version.split()[0], **versions()}, started_at=run.started_at.isoformat(),
        finished_at=datetime.now(timezone.utc).isoformat(), labels=list(run.data.task.labels) if run.data.task.labels else None,
        stage_seconds=run.stage_seconds)


@contextlib.contextmanager
def timed(seconds: dict[str, float], stage: str):
    """Adds the block's wall seconds to seconds[stage]: where a job's time goes besides its steps
    (`ftc bench --end-to-end` splits a job's wall time by them)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds[stage] = round(seconds.get(stage, 0.0) + time.perf_counter() - start, 3)


def finite(value: float | None) -> float | None:
    """A loss as results.json holds it: a run that diverged (NaN, inf) says null, since strict
    JSON has no NaN and every JSON ftc writes is strict."""
    return value if value is None or math.isfinite(value) else None


def write_results(run: Run, results: TrainResults) -> None:
    if not run.args.no_save:
        with timed(results.stage_seconds, "save_model"):
            run.model.save_pretrained(run.out_dir / MODEL_DIR)
            run.data.tokenizer.save_pretrained(run.out_dir / MODEL_DIR)
    (run.out_dir / RESULTS_FILE).write_text(results.to_json())
    run.log.info("results: " + strict_json(results.metrics, indent=None))


def setup_logging(path: Path, master: bool) -> logging.Logger:
    log = logging.getLogger("ftc")
    log.setLevel(logging.INFO)
    # every line carries the job's mark (protocol.line_mark): the controller reads only such lines
    formatter = logging.Formatter(log_format(os.environ.get(LOG_MARK_ENV, "")), LOG_CLOCK)
    handler = logging.FileHandler(path)
    handler.setFormatter(formatter)
    log.addHandler(handler)
    if master:
        console = logging.StreamHandler(sys.stdout)
        console.setFormatter(formatter)
        log.addHandler(console)
    return log


if __name__ == "__main__":
    sys.exit(main())
