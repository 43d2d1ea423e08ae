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
import logging
import os
import random
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from . import datafiles, glue, spot
from .distenv import DistEnv, leave_process_group, pin_self, read_env
from .facts import versions
from .protocol import (
    CHECKPOINT_FILE,
    DONE,
    EXIT_PREEMPTED,
    HELD_FILE,
    LOGS_DIR,
    MODEL_DIR,
    PREEMPTED_FILE,
    RELEASE_FILE,
    RESULTS_FILE,
    SPOT_NOTICE_ENV,
    DevMetrics,
    Preempted,
    Progress,
    TrainResults,
    dev_line,
    progress_line,
    rank_log_path,
    strict_json,
)
from .recipes import (
    ALLREDUCE,
    COMPILE_ASIDE_MIN_THREADS,
    COMPILE_MIN_STEPS,
    COMPILE_MIN_THREADS,
    GRAD_COMPRESS,
    POWERSGD_RANK,
    RECIPES,
    SHAPES,
)
from .units import duration

# ---- who am I, and which cores: before torch loads, since its OpenMP pool binds its
# threads to the cores the process has when it starts (OMP_PROC_BIND/OMP_PLACES) ----
ENV = read_env()
CORES = pin_self(ENV) if os.environ.get("FTC_SELF_PIN") == "1" else sorted(os.sched_getaffinity(0))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from . import rank_setup  # noqa: E402
from .board import open_board, to_board  # noqa: E402
from .checkpoints import EPOCH_START, resume, save_all  # noqa: E402
from .compile_policy import (  # noqa: E402
    Compiled,
    aside_ended,
    bucket_width,
    compile_seconds,
    compiled_from_now,
    graphs_compiled,
    keep_for_home,
    maybe_compile,
    remember_compile,
)
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
from .rank_setup import Setup  # noqa: E402
from .stepstats import StepStats, finite, timed  # noqa: E402
from .task_data import Data, load_data  # noqa: E402

# ---- settings: defaults, then the recipe, then explicit flags -------------------------------
# The dropout probabilities of the architectures ftc is tested with (BERT/MiniLM, DistilBERT,
# RoBERTa, DeBERTa-v2; ModernBERT's embedding and MLP dropout):
# --dropout sets every one. At 0, attention runs PyTorch's fused SDPA kernel; with attention
# dropout it falls back to the unfused path.
DROPOUT_KEYS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout", "dropout",
                "attention_dropout", "seq_classif_dropout", "pooler_dropout", "embedding_dropout", "mlp_dropout")



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
                   help=f"torch.compile each of the model's layers (auto: when the job plans {COMPILE_MIN_STEPS} steps or "
                        f"more and a rank has {COMPILE_MIN_THREADS} threads or more, unless this node measured otherwise)")
    p.add_argument("--compile-aside-from", type=int, default=COMPILE_ASIDE_MIN_THREADS, metavar="THREADS",
                   help="on ranks of this many threads or more a cold compile runs beside the training, whose steps "
                        "run eager until it is done, or to the end where it is not (0: never)")
    p.add_argument("--shapes", choices=SHAPES, default="auto",
                   help="a compiled step's shapes: dynamic (one graph for every length) or length buckets (a few static "
                        "widths, each compiled once); auto: dynamic")
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
    p.add_argument("--stack", default=os.environ.get("FTC_STACK", "stock"))
    p.add_argument("--log-every", type=int, default=10)
    measuring(p.add_argument_group("the bench's and the tests' own"))
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


def measuring(group) -> None:
    """The flags that serve only the bench (profiling, whole passes of random weights) and the tests."""
    group.add_argument("--hold-at-step", type=int, default=0, metavar="N",
                       help=f"tests: before step N, write <output-dir>/{HELD_FILE} and wait for <output-dir>/{RELEASE_FILE}")
    group.add_argument("--random-init", action="store_true", help="the model's architecture, fresh weights")
    group.add_argument("--max-steps", type=int, default=0, help="stop after this many steps")
    group.add_argument("--warmup-steps-untimed", type=int, default=3, help="steps left out of the steady rate")
    group.add_argument("--no-grad-sync", action="store_true",
                       help="profiling: skip the gradient all-reduce, so ranks drift apart; what is left of the step "
                            "time is compute and contention, not communication")
    group.add_argument("--no-eval", action="store_true", help="no dev evaluation")
    group.add_argument("--no-save", action="store_true", help="neither checkpoints nor the model")


def main(argv=None) -> int:
    args, env, started_at = parse_args(argv), ENV, datetime.now(timezone.utc)
    out_dir = Path(args.output_dir)
    (out_dir / LOGS_DIR).mkdir(parents=True, exist_ok=True)
    log = rank_setup.setup_logging(out_dir / rank_log_path(env.rank), env.master)

    # ---- setup: threads, process group, precision -----------------------------------------------
    setup = rank_setup.start(args, env, log, CORES)
    random.seed(args.seed)
    torch.manual_seed(args.seed)

    # ---- data -----------------------------------------------------------------------------------
    stage_seconds: dict[str, float] = {}
    with timed(stage_seconds, "tokenize"):
        data = load_data(args, env)
    train = data.train
    total_steps = min(args.max_steps or sys.maxsize, args.epochs * len(global_batches(  # --max-steps caps, never adds
        len(train["labels"]), train["lengths"], args.batch_size, env.world_size, args.group_by_length, args.seed)))

    # ---- model and optimizer --------------------------------------------------------------------
    model, optimizer, scheduler = build_model(args, data.task, setup.precision, total_steps)
    stats = StepStats(args.warmup_steps_untimed)
    training = Training(args, env, setup, log, out_dir, data, total_steps, model, optimizer, scheduler, stats, started_at,
              stage_seconds=stage_seconds)
    if args.resume:
        resume(training)
    training.compiled = compiled = maybe_compile(training)  # after resume: it weighs the steps left

    # ---- DDP ------------------------------------------------------------------------------------
    training.sync = make_sync(model, args, env, setup)
    training.watcher = watch_spot(args.spot_watch) if args.spot_watch and env.local_rank == 0 else None

    # ---- the loop -------------------------------------------------------------------------------
    training.board = open_board(out_dir, env)
    stage_seconds["to_first_step"] = round((datetime.now(timezone.utc) - started_at).total_seconds(), 3)
    for epoch in range(training.start_epoch, args.epochs):
        batches = global_batches(len(train["labels"]), train["lengths"], args.batch_size, env.world_size,
                                 args.group_by_length, args.seed + epoch)
        skip = training.resumed_at["batch"] if epoch == training.start_epoch else 0  # done before a mid-epoch stop
        stats.start_epoch(training.resumed_at if skip else EPOCH_START)
        epoch_start = time.perf_counter()
        training.sync.module.train()
        for i, global_batch in enumerate(batches[skip:], start=skip):
            if training.step + 1 == args.hold_at_step:
                hold(training)
            loss, phases = train_step(training, rank_batch(training, global_batch))
            training.step += 1
            stats.record(phases, len(global_batch), sum(train["lengths"][j] for j in global_batch), loss)
            if env.master and (i % args.log_every == 0 or i == len(batches) - 1):
                log_progress(training, epoch)
            if args.spot_watch and interruption_seen(training.watcher, env.world_size):
                return stop_for_spot(training, epoch, i + 1)
            if args.max_steps and training.step >= args.max_steps:
                break
        epoch_seconds = time.perf_counter() - epoch_start
        log.info(f"epoch {epoch + 1} trained in {epoch_seconds:.1f}s")
        with timed(stage_seconds, "evaluate"):
            metrics = {} if args.no_eval else evaluate(training)
        training.history.append({"epoch": epoch + 1, "train_loss": finite(round(stats.epoch_loss / max(1, stats.epoch_steps), 6)),
                            "pass_seconds": round(epoch_seconds, 3), "pass_rows": stats.epoch_rows,
                            "pass_tokens": stats.epoch_tokens, **metrics})
        if env.master and metrics:
            log.info(dev_line(DevMetrics(epoch + 1, metrics)))
        if not args.no_save:
            with timed(stage_seconds, "checkpoint"):
                save_all(training, epoch + 1, EPOCH_START)
        if args.max_steps and training.step >= args.max_steps:
            break

    # ---- results ----------------------------------------------------------------------------------
    compiled = training.compiled = aside_ended(training)
    note = remember_compile(compiled, stats, env)
    if env.master:
        keep_for_home(compiled, note, out_dir)
    timeline = every_rank(stats.timeline(), env.world_size)
    if env.master:
        write_results(training, results_of(training, compiled, timeline))
    leave_group(env)
    log.info(DONE)
    return 0


# ---- records: what a rank decides, measures and shares -------------------------------------------

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
class Training:
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
    compiled: Compiled | None = None  # whether the step is compiled, and its shapes: decided after a resume
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
    eager: bool = False  # run with compiling set aside (torch.compiler's force_eager stance)


# ---- model and optimizer ----------------------------------------------------------------------------

def build_model(args, task: glue.Task, precision: str, total_steps: int) -> tuple:
    """The model in fp32, whatever dtype its checkpoint was saved in: autocast computes in bf16,
    but AdamW must update fp32 master weights (bf16 weights would lose small updates). transformers
    5 would otherwise load a bf16 checkpoint as bf16 parameters. The task's class names become the
    config's id2label, so the saved model says what each output means. Its problem type is set here, as
    the model's first forward would set it: where the whole model compiles, its guards would otherwise
    fail at the second step and dynamo trace it again."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, get_linear_schedule_with_warmup
    names = dict(enumerate(task.labels)) if task.labels else {0: "score"}
    config = AutoConfig.from_pretrained(args.model, num_labels=task.num_labels, id2label=names,
                                        label2id={name: i for i, name in names.items()},
                                        problem_type="single_label_classification" if task.labels else "regression")
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

def train_step(training: Training, rows: RankRows) -> tuple[float, dict[str, float]]:
    """Forward and backward; wait for every rank; average the gradient; optimizer step. Returns
    the loss and the seconds of each phase (PHASES)."""
    sync, optimizer, collate_s = training.sync, training.optimizer, rows.collate_s
    syncing = sync.balance is not None  # none in one process, or with --no-grad-sync (profiling)
    t0 = time.perf_counter()
    if sync.rows and syncing:
        sync.rows.agree(rows.inputs["input_ids"])  # its small all-reduce runs beside forward
    no_sync = sync.overlapped and not syncing
    with sync.module.no_sync() if no_sync else contextlib.nullcontext():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=training.setup.precision == "bf16"), \
                torch.compiler.set_stance("force_eager" if rows.eager else "default"):
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
    training.scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    value = loss.item()
    t4 = time.perf_counter()
    return value, {"compute_s": collate_s + t1 - t0, "wait_s": t2 - t1, "comm_s": t3 - t2, "optimizer_s": t4 - t3,
                   "step_s": collate_s + t4 - t0}


def rank_batch(training: Training, global_batch: list[int]) -> RankRows:
    """This rank's rows of a global batch, padded, their labels, and the share of the global batch
    they are: each rank's mean loss is weighted by it, so that the averaged gradient is the global
    batch's mean however the rows were split."""
    t0, env, train, balance, args = time.perf_counter(), training.env, training.data.train, training.sync.balance, training.args
    if training.compiled.aside and training.stats.probing:
        compiled_from_now(training)  # the compile beside the training may be done: eager steps end there
    counts = balance.counts(len(global_batch)) if balance else even_counts(len(global_batch), env.world_size)
    indices = deal(global_batch, counts)[env.rank]
    bucketed = training.compiled.shapes == "buckets" and not training.stats.probing  # probe steps pad as eager jobs do
    width = (args.max_length if args.pad_to == "max_length" else
             bucket_width(max(train["lengths"][i] for i in indices), args.max_length) if bucketed else 0)
    batch = collate(train, indices, training.data.pad_id, width)
    labels = torch.tensor([train["labels"][j] for j in indices],
                          dtype=torch.float32 if training.data.task.labels is None else torch.long)
    # an epoch's last, partial batch in its own shape would be compiled for that one step: eager instead;
    # so are a compiled job's probe steps
    eager = training.stats.probing or (bucketed and len(indices) != args.batch_size)
    return RankRows(batch, labels, len(indices) * env.world_size / len(global_batch), time.perf_counter() - t0, eager)


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


def log_progress(training: Training, epoch: int) -> None:
    stats, step, total_steps = training.stats, training.step, training.total_steps
    rate = stats.samples / stats.seconds
    left = (total_steps - step) * training.args.batch_size * training.env.world_size / rate
    training.log.info(progress_line(Progress(epoch + 1, training.args.epochs, step, total_steps, stats.last_loss, rate,
                                        duration(left))))
    to_board(training.board, step, {"train/loss": stats.last_loss, "train/learning_rate": training.scheduler.get_last_lr()[0],
                               "train/samples_per_second": rate})


@torch.no_grad()
def evaluate(training: Training) -> dict[str, float]:
    """Each rank scores every world_size-th dev example; rank 0 gathers and computes the metrics
    (and writes them to TensorBoard at `step`). Eager (the compiler's force_eager stance): eval mode's
    graphs, one a dev width under length buckets, would cost more compiling than a few hundred dev rows take."""
    model, dev, args, env = training.model, training.data.dev, training.args, training.env
    model.eval()
    mine = list(range(env.rank, len(dev["labels"]), env.world_size))
    mine.sort(key=dev["lengths"].__getitem__)
    predictions = []
    for start in range(0, len(mine), args.batch_size * 2):
        indices = mine[start:start + args.batch_size * 2]
        batch = collate(dev, indices, training.data.pad_id, args.max_length if args.pad_to == "max_length" else 0)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=training.setup.precision == "bf16"), \
                torch.compiler.set_stance("force_eager"):
            logits = model(**batch).logits.float()
        values = logits[:, 0] if logits.shape[1] == 1 else logits.argmax(-1).float()
        predictions += list(zip(indices, values.tolist()))
    model.train()
    predictions = [p for part in every_rank(predictions, env.world_size) for p in part]
    predictions.sort()
    pred = [p for _, p in predictions]
    gold = [dev["labels"][i] for i, _ in predictions]
    metrics = glue.score(training.data.task, pred, gold)
    to_board(training.board, training.step, {key.replace("eval_", "eval/", 1): value for key, value in metrics.items()})
    return metrics


def hold(training: Training) -> None:
    """Tests act on a job at a known point (detach, cancel, lose a node, arm a spot notice)
    instead of racing the clock: before the next step, rank 0 writes HELD_FILE and every rank
    waits until RELEASE_FILE exists in the job's directory (local nodes share one file system)."""
    if training.env.master:
        (training.out_dir / HELD_FILE).write_text(str(training.step + 1))
    while not (training.out_dir / RELEASE_FILE).exists():
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


def stop_for_spot(training: Training, epoch: int, batch: int) -> int:
    """Every rank stops after `batch` of `epoch` (the all-reduce made them agree): checkpoint there, exit."""
    save_all(training, epoch, training.stats.position(batch), batch)
    if training.env.master:
        notice = training.watcher.notice if training.watcher else None
        (training.out_dir / PREEMPTED_FILE).write_text(Preempted(notice, epoch, batch, training.step).to_json())
    leave_group(training.env)
    training.log.info(f"stopped for a spot interruption at epoch {epoch + 1} batch {batch}; resumable")
    return EXIT_PREEMPTED


# ---- results ----------------------------------------------------------------------------------------

def results_of(training: Training, compiled: Compiled, timeline: list[dict]) -> TrainResults:
    """`timeline`: every rank's StepStats.timeline, in rank order."""
    args, env, setup, stats = training.args, training.env, training.setup, training.stats
    history, train = training.history, training.data.train
    several = env.world_size > 1
    return TrainResults(
        task=args.task, model=args.model, recipe=args.recipe, stack=args.stack,
        backend=setup.backend, precision=setup.precision, native_bf16=setup.native_bf16,
        grad_compress=setup.grad_compress, grad_sync=not args.no_grad_sync,
        embedding_sync=args.embedding_sync if several else "none", compile=compiled.note,
        compile_cache=compiled.cache, compile_cache_from=compiled.source, compile_shapes=compiled.shapes,
        compile_graphs=graphs_compiled() if compiled.cache != "none" else {},
        compile_seconds=round(compile_seconds(stats), 1) if compiled.cache != "none" else None,
        allreduce=setup.allreduce, balance=args.balance if several else "none",
        gloo_threads=setup.gloo_threads, gloo_thread_cores=setup.gloo_thread_cores,
        nodes=env.world_size // max(1, env.local_world_size), ranks_per_node=env.local_world_size,
        threads_per_rank=setup.threads, world_size=env.world_size, epochs=args.epochs,
        batch_size_per_rank=args.batch_size, lr=args.lr, max_length=args.max_length, seed=args.seed,
        padding="buckets" if compiled.shapes == "buckets" else args.pad_to, dropout=args.dropout,
        train_samples=len(train["labels"]),
        train_tokens=sum(train["lengths"]), train_samples_seen=stats.samples,
        train_tokens_seen=stats.tokens, train_seconds=round(stats.seconds, 3), **stats.rates(),
        first_loss=finite(stats.first_loss), final_loss=finite(stats.last_loss), steps=training.step,
        resumed_from_epoch=training.start_epoch if args.resume else None,
        resumed_from_batch=training.resumed_at["batch"] if args.resume else None,
        epoch_metrics=history, metrics={k: v for k, v in (history[-1] if history else {}).items() if k.startswith("eval_")},
        timeline=[{"rank": r, **phases} for r, phases in enumerate(timeline)],
        versions={"python": sys.version.split()[0], **versions()}, started_at=training.started_at.isoformat(),
        finished_at=datetime.now(timezone.utc).isoformat(),
        labels=list(training.data.task.labels) if training.data.task.labels else None,
        stage_seconds=training.stage_seconds)


def write_results(training: Training, results: TrainResults) -> None:
    if not training.args.no_save:
        with timed(results.stage_seconds, "save_model"):
            training.model.save_pretrained(training.out_dir / MODEL_DIR)
            training.data.tokenizer.save_pretrained(training.out_dir / MODEL_DIR)
    (training.out_dir / RESULTS_FILE).write_text(results.to_json())
    training.log.info("results: " + strict_json(results.metrics, indent=None))


if __name__ == "__main__":
    sys.exit(main())
