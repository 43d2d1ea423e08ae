"""Fine-tune a transformer on a GLUE task with DistributedDataParallel on CPU nodes.

One process per rank, started by mpirun (ftc renders the launch script from
templates/launch.sh.j2; `ftc finetune --render-only` prints it). By hand:

    # one process
    python train.py --task mrpc --data-dir ../shared/data/glue --model distilbert-base-uncased
    # two nodes x one rank, Intel MPI (MASTER_ADDR/MASTER_PORT: rank 0's node and a free port)
    MASTER_ADDR=10.0.0.5 MASTER_PORT=29500 FTC_WORLD_SIZE=2 \
        mpirun -f hostfile -n 2 -ppn 1 python train.py --task qqp

Two recipes: `ftc` (default: bf16 autocast where the CPU has native bf16, dynamic
padding with length-grouped batches, fused AdamW, bf16-compressed gradient all-reduce)
and `seed`, the 2021 recipe's settings (fp32, every sequence padded to 128, batch 32
per rank, lr 2e-5, 3 epochs), so both can be compared on the same cluster.
"""

import argparse
import contextlib
import json
import logging
import os
import random
import sys
import time
from datetime import datetime, timedelta, timezone
from importlib import metadata
from pathlib import Path

from . import glue, spot
from .distenv import check_world_size, pin_self, read_env
from .facts import cpu_info

# ---- who am I, and which cores: before torch loads, since its OpenMP pool binds its
# threads to the cores the process has when it starts (OMP_PROC_BIND/OMP_PLACES) ----
ENV = read_env()
CORES = pin_self(ENV) if os.environ.get("FTC_SELF_PIN") == "1" else sorted(os.sched_getaffinity(0))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

# ---- settings: defaults, then the recipe, then explicit flags -------------------------------
RECIPES = {
    "ftc": dict(precision="auto", pad_to="longest", group_by_length=True, batch_size=32, lr=2e-5, epochs=3,
                grad_compress="auto", embedding_sync="rows"),
    "seed": dict(precision="fp32", pad_to="max_length", group_by_length=False, batch_size=32, lr=2e-5, epochs=3,
                 grad_compress="none", embedding_sync="dense"),
}


# Where an epoch stands: batches done, their summed loss and count. At an epoch's start, none.
EPOCH_START = {"batch": 0, "loss": 0.0, "steps": 0}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", required=True)
    p.add_argument("--model", default="distilbert-base-uncased", help="hub id or local directory")
    p.add_argument("--data-dir", default=None, help="GLUE TSV directory; default: the hub")
    p.add_argument("--output-dir", default=".")
    p.add_argument("--recipe", choices=RECIPES, default="ftc")
    p.add_argument("--precision", choices=("auto", "bf16", "fp32"), default=None)
    p.add_argument("--backend", choices=("auto", "gloo", "ccl"), default="auto")
    p.add_argument("--ipex", action="store_true", help="intel stack: ipex.optimize the model and optimizer")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None, help="per rank")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--max-train-samples", type=int, default=0)
    p.add_argument("--max-eval-samples", type=int, default=0)
    p.add_argument("--grad-compress", choices=("auto", "none", "bf16"), default=None)
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP gradient bucket size")
    p.add_argument("--embedding-sync", choices=("rows", "dense"), default=None,
                   help="all-reduce only the word-embedding rows some rank's batch used (ftc), or all of them")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--resume", action="store_true", help="continue from <output-dir>/checkpoints/last.pt")
    p.add_argument("--spot-watch", default="", metavar="URL",
                   help="spot nodes: watch this metadata service for an interruption notice; on one, "
                        f"checkpoint where the job stands and exit {spot.EXIT_PREEMPTED}")
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
    args.task = glue.task_name(args.task)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    started_at = datetime.now(timezone.utc)

    # ---- distributed setup: threads, backend, process group --------------------------------------
    env, cores = ENV, CORES
    threads = int(os.environ.get("OMP_NUM_THREADS") or len(cores))
    torch.set_num_threads(threads)
    out_dir = Path(args.output_dir)
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    log = setup_logging(out_dir / "logs" / f"rank{env.rank}.log", env.master)

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
    if env.world_size > 1:
        dist.init_process_group(backend, init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                                rank=env.rank, world_size=env.world_size, timeout=timedelta(minutes=10))
        check_world_size(dist.get_world_size(), env.world_size, "the process group")
    check_world_size(env.world_size, env.expected_world_size, "the launcher")

    _, flags = cpu_info()
    native_bf16 = "amx_bf16" in flags or "avx512_bf16" in flags
    precision = args.precision if args.precision != "auto" else ("bf16" if native_bf16 else "fp32")
    if precision == "bf16" and not native_bf16:
        log.warning("bf16 asked for on a CPU without native bf16 (no amx_bf16/avx512_bf16): it is emulated and slower")
    grad_compress = args.grad_compress
    if grad_compress == "auto":
        grad_compress = "bf16" if precision == "bf16" and env.world_size > 1 else "none"
    log.info(f"rank {env.rank}/{env.world_size} (local {env.local_rank}/{env.local_world_size}) cores {cores} "
             f"threads {threads} backend {backend if env.world_size > 1 else 'none'} precision {precision} "
             f"grad_compress {grad_compress} recipe {args.recipe}")
    random.seed(args.seed)
    torch.manual_seed(args.seed)

    # ---- data -----------------------------------------------------------------------------------
    import transformers
    from transformers import (
        AutoConfig,
        AutoModelForSequenceClassification,
        AutoTokenizer,
        get_linear_schedule_with_warmup,
    )
    transformers.utils.logging.disable_progress_bar()
    if not env.master:
        transformers.utils.logging.set_verbosity_error()  # one load report, from rank 0
    task = glue.TASKS[args.task]
    train_rows = glue.load_split(args.task, "train", args.data_dir)
    dev_rows = [] if args.no_eval else glue.load_split(args.task, "dev", args.data_dir)
    if args.max_train_samples:
        train_rows = train_rows[:args.max_train_samples]
    if args.max_eval_samples:
        dev_rows = dev_rows[:args.max_eval_samples]
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    train = encode(tokenizer, train_rows, args.max_length)
    dev = encode(tokenizer, dev_rows, args.max_length)

    # ---- model and optimizer --------------------------------------------------------------------
    if args.random_init:
        config = AutoConfig.from_pretrained(args.model, num_labels=task.num_labels)
        model = AutoModelForSequenceClassification.from_config(config)
    else:
        model = AutoModelForSequenceClassification.from_pretrained(args.model, num_labels=task.num_labels)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01,
                                  fused=args.recipe == "ftc")
    steps_per_epoch = len(make_batches(len(train["labels"]), train["lengths"], args.batch_size, env.rank,
                                       env.world_size, args.group_by_length, args.seed))
    total_steps = args.max_steps or steps_per_epoch * args.epochs
    scheduler = get_linear_schedule_with_warmup(optimizer, int(0.06 * total_steps), total_steps)
    if args.ipex:
        import intel_extension_for_pytorch as ipex
        model, optimizer = ipex.optimize(model, optimizer=optimizer,
                                         dtype=torch.bfloat16 if precision == "bf16" else torch.float32)

    start_epoch, history, step, position = 0, [], 0, EPOCH_START
    checkpoint_path = out_dir / "checkpoints" / "last.pt"
    if args.resume:
        start_epoch, step, history, position = resume(checkpoint_path, model, optimizer, scheduler, env, log)

    ddp, embedding = model, None
    if env.world_size > 1:
        if args.embedding_sync == "rows":
            # The word embeddings hold a third of distilbert's weights, but a global batch uses
            # about one row in six: their gradient is zero elsewhere. DDP would all-reduce all of
            # it as the last bucket, after backward, where nothing hides it; ftc moves the used rows.
            embedding = model.get_input_embeddings().weight
            DDP._set_params_and_buffers_to_ignore_for_model(
                model, [next(n for n, p in model.named_parameters() if p is embedding)])
            dist.broadcast(embedding.data, 0)  # DDP broadcasts every other weight
        # DDP broadcasts rank 0's weights at construction: every rank starts identical.
        ddp = DDP(model, bucket_cap_mb=args.bucket_mb, gradient_as_bucket_view=True)
        if grad_compress == "bf16":
            ddp.register_comm_hook(None, bf16_allreduce_hook)

    def checkpoint(epochs_done: int, position: dict, why: str) -> None:
        """Every rank's RNG (dropout masks differ by rank): a resumed run then matches an
        uninterrupted one. `position`: how far into the next epoch (a mid-epoch stop)."""
        rng = [None] * env.world_size
        if env.world_size > 1:
            dist.all_gather_object(rng, rng_state())
        else:
            rng = [rng_state()]
        if env.master:
            save_checkpoint(checkpoint_path, model, optimizer, scheduler, epochs_done, step, history, rng, position)
            log.info(f"checkpoint saved: epoch {epochs_done}{why} -> {checkpoint_path}")

    watcher = spot.Watcher(args.spot_watch) if args.spot_watch and env.local_rank == 0 else None
    if watcher:
        watcher.start()

    # ---- the loop -------------------------------------------------------------------------------
    pad_id = tokenizer.pad_token_id or 0
    label_dtype = torch.float32 if task.labels is None else torch.long
    samples_seen = tokens_seen = 0
    train_seconds = steady_seconds = 0.0
    steady_samples = steady_tokens = 0
    first_loss = last_loss = None
    steps_run = 0  # in this process: the first few include one-off kernel setup, left out of the steady rate
    for epoch in range(start_epoch, args.epochs):
        batches = make_batches(len(train["labels"]), train["lengths"], args.batch_size, env.rank, env.world_size,
                               args.group_by_length, args.seed + epoch)
        ddp.train()
        epoch_start = time.perf_counter()
        skip = position["batch"] if epoch == start_epoch else 0  # done before a mid-epoch stop
        epoch_loss, epoch_steps = (position["loss"], position["steps"]) if skip else (0.0, 0)
        for i, indices in enumerate(batches[skip:], start=skip):
            t0 = time.perf_counter()
            batch = collate(train, indices, pad_id, args.max_length if args.pad_to == "max_length" else 0)
            labels = torch.tensor([train["labels"][j] for j in indices], dtype=label_dtype)
            with ddp.no_sync() if args.no_grad_sync and ddp is not model else contextlib.nullcontext():
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                    loss = ddp(**batch, labels=labels).loss
                loss.backward()
            if embedding is not None and not args.no_grad_sync:
                allreduce_used_rows(embedding, batch["input_ids"], grad_compress == "bf16")
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            elapsed = time.perf_counter() - t0
            step += 1
            steps_run += 1
            n_samples = len(indices) * env.world_size
            n_tokens = int(batch["attention_mask"].sum()) * env.world_size
            samples_seen += n_samples
            tokens_seen += n_tokens
            train_seconds += elapsed
            if steps_run > args.warmup_steps_untimed:
                steady_seconds += elapsed
                steady_samples += n_samples
                steady_tokens += n_tokens
            last_loss = loss.item()
            epoch_loss += last_loss
            epoch_steps += 1
            first_loss = last_loss if first_loss is None else first_loss
            if env.master and (i % args.log_every == 0 or i == len(batches) - 1):
                rate = samples_seen / train_seconds
                left = (total_steps - step) * args.batch_size * env.world_size / rate
                log.info(f"epoch {epoch + 1}/{args.epochs} step {step}/{total_steps} loss {last_loss:.4f} "
                         f"{rate:.1f} samples/s eta {fmt_duration(left)}")
            if args.spot_watch and interruption_seen(watcher, env.world_size):
                # Every rank stops after the same step: the all-reduce above made them agree.
                checkpoint(epoch, {"batch": i + 1, "loss": epoch_loss, "steps": epoch_steps},
                           f" batch {i + 1} (spot interruption notice)")
                if env.master:
                    (out_dir / "preempted.json").write_text(json.dumps(
                        {"notice": watcher.notice if watcher else None, "epoch": epoch, "batch": i + 1, "step": step}))
                if env.world_size > 1:
                    dist.barrier()
                    dist.destroy_process_group()
                log.info(f"stopped for a spot interruption at epoch {epoch + 1} batch {i + 1}; resumable")
                return spot.EXIT_PREEMPTED
            if args.max_steps and step >= args.max_steps:
                break
        log.info(f"epoch {epoch + 1} trained in {time.perf_counter() - epoch_start:.1f}s")

        metrics = {} if args.no_eval else evaluate(ddp, dev, args, env, pad_id, precision)
        history.append({"epoch": epoch + 1, "train_loss": round(epoch_loss / max(1, epoch_steps), 6), **metrics})
        if env.master and metrics:
            log.info(f"epoch {epoch + 1} dev " + " ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
        if not args.no_save:
            checkpoint(epoch + 1, EPOCH_START, "")
        if args.max_steps and step >= args.max_steps:
            break

    # ---- results ----------------------------------------------------------------------------------
    if env.master:
        results = {
            "task": args.task, "model": args.model, "recipe": args.recipe, "stack": args.stack,
            "backend": backend if env.world_size > 1 else "none", "precision": precision,
            "native_bf16": native_bf16, "grad_compress": grad_compress, "grad_sync": not args.no_grad_sync,
            "embedding_sync": args.embedding_sync if env.world_size > 1 else "none",
            "nodes": env.world_size // max(1, env.local_world_size), "ranks_per_node": env.local_world_size,
            "threads_per_rank": threads, "world_size": env.world_size, "epochs": args.epochs,
            "batch_size_per_rank": args.batch_size, "lr": args.lr, "max_length": args.max_length,
            "padding": args.pad_to, "train_samples": len(train["labels"]), "train_samples_seen": samples_seen,
            "train_tokens_seen": tokens_seen, "train_seconds": round(train_seconds, 3),
            "samples_per_second": round(samples_seen / train_seconds, 3) if train_seconds else 0.0,
            "steady_samples_per_second": round(steady_samples / steady_seconds, 3) if steady_seconds else 0.0,
            "steady_tokens_per_second": round(steady_tokens / steady_seconds, 3) if steady_seconds else 0.0,
            "first_loss": first_loss, "final_loss": last_loss, "steps": step,
            "resumed_from_epoch": start_epoch if args.resume else None,
            "resumed_from_batch": position["batch"] if args.resume else None,
            "epoch_metrics": history, **(history[-1] if history else {}),
            "versions": versions(), "started_at": started_at.isoformat(),
            "finished_at": datetime.now(timezone.utc).isoformat(),
        }
        results.pop("epoch", None)
        results.pop("train_loss", None)
        if not args.no_save:
            model.save_pretrained(out_dir / "model")
            tokenizer.save_pretrained(out_dir / "model")
        (out_dir / "results.json").write_text(json.dumps(results, indent=2))
        log.info("results: " + json.dumps({k: v for k, v in results.items() if k.startswith("eval_")}))
    if env.world_size > 1:
        dist.barrier()
        dist.destroy_process_group()
    log.info("done")
    return 0


# ---- helpers --------------------------------------------------------------------------------------

def encode(tokenizer, rows, max_length: int) -> dict:
    if not rows:
        return {"input_ids": [], "lengths": [], "labels": [], "extra": {}}
    a = [r[0] for r in rows]
    b = [r[1] for r in rows] if rows[0][1] is not None else None
    enc = tokenizer(a, b, truncation=True, max_length=max_length)
    extra = {k: v for k, v in enc.items() if k not in ("input_ids", "attention_mask")}
    return {"input_ids": enc["input_ids"], "lengths": [len(x) for x in enc["input_ids"]],
            "labels": [r[2] for r in rows], "extra": extra}


def make_batches(n: int, lengths: list[int], batch_size: int, rank: int, world: int, group: bool,
                 seed: int) -> list[list[int]]:
    """This rank's batches for one epoch, from one shuffled order that every rank draws alike.

    The order is padded to a multiple of the world size and split the way DistributedSampler
    splits it, so every rank gets the same number of batches. Length-grouped (ftc): mega-batches
    of 50 global batches are sorted by length and cut into global batches of batch_size x world,
    whose order is shuffled; rank r takes the r-th slice of each. So at every step all ranks
    hold batches of about the same length, and none waits at the all-reduce for another's longer one.
    """
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=generator).tolist()
    order += order[:(-len(order)) % world]
    if not group:
        mine = order[rank::world]
        return [mine[i:i + batch_size] for i in range(0, len(mine), batch_size)]
    step = batch_size * world
    global_batches = []
    for start in range(0, len(order), step * 50):
        chunk = sorted(order[start:start + step * 50], key=lengths.__getitem__, reverse=True)
        global_batches += [chunk[i:i + step] for i in range(0, len(chunk), step)]
    random.Random(seed).shuffle(global_batches)
    per_rank = [len(b) // world for b in global_batches]
    return [b[rank * k:(rank + 1) * k] for b, k in zip(global_batches, per_rank)]


def collate(data: dict, indices: list[int], pad_id: int, pad_to: int) -> dict[str, torch.Tensor]:
    """Pad to the longest in the batch, rounded up to a multiple of 8 (fewer kernel shapes),
    or to `pad_to` (the seed recipe)."""
    longest = max(data["lengths"][i] for i in indices)
    width = pad_to or (longest + 7) // 8 * 8
    ids = torch.full((len(indices), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(indices), width), dtype=torch.long)
    extra = {k: torch.zeros((len(indices), width), dtype=torch.long) for k in data["extra"]}
    for row, i in enumerate(indices):
        n = data["lengths"][i]
        ids[row, :n] = torch.tensor(data["input_ids"][i])
        mask[row, :n] = 1
        for key, values in data["extra"].items():
            extra[key][row, :n] = torch.tensor(values[i])
    return {"input_ids": ids, "attention_mask": mask, **extra}


@torch.no_grad()
def evaluate(ddp, dev: dict, args, env, pad_id: int, precision: str) -> dict[str, float]:
    """Each rank scores every world_size-th dev example; rank 0 gathers and computes the metrics."""
    model = ddp.module if isinstance(ddp, DDP) else ddp
    model.eval()
    mine = list(range(env.rank, len(dev["labels"]), env.world_size))
    mine.sort(key=dev["lengths"].__getitem__)
    predictions = []
    for start in range(0, len(mine), args.batch_size * 2):
        indices = mine[start:start + args.batch_size * 2]
        batch = collate(dev, indices, pad_id, args.max_length if args.pad_to == "max_length" else 0)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = model(**batch).logits.float()
        values = logits[:, 0] if logits.shape[1] == 1 else logits.argmax(-1).float()
        predictions += list(zip(indices, values.tolist()))
    model.train()
    if env.world_size > 1:
        gathered = [None] * env.world_size
        dist.all_gather_object(gathered, predictions)
        predictions = [p for part in gathered for p in part]
    predictions.sort()
    pred = [p for _, p in predictions]
    gold = [dev["labels"][i] for i, _ in predictions]
    return glue.compute_metrics(args.task, pred, gold)


def bf16_allreduce_hook(process_group, bucket):
    """Average each gradient bucket in bf16: half the bytes of fp32 on the wire.

    PyTorch's own bf16_compress_hook needs NCCL; this one runs on gloo. The sum is
    divided first, so it cannot overflow bf16's range."""
    group = process_group or dist.group.WORLD
    compressed = bucket.buffer().to(torch.bfloat16).div_(dist.get_world_size(group))
    future = dist.all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(done):
        buffer = bucket.buffer()
        buffer.copy_(done.value()[0])
        return buffer
    return future.then(decompress)


def allreduce_used_rows(weight: torch.Tensor, input_ids: torch.Tensor, compress: bool) -> None:
    """Average an embedding's gradient across ranks, moving only the rows some rank used.

    Rows no rank used are zero on every rank, so the result equals the dense average. The
    union of used rows is agreed first with a small all-reduce of a per-row flag."""
    world = dist.get_world_size()
    used = torch.zeros(weight.shape[0], dtype=torch.int32)
    used[input_ids.unique()] = 1
    dist.all_reduce(used)
    rows = used.nonzero().squeeze(1)
    part = weight.grad.index_select(0, rows)
    part = (part.to(torch.bfloat16) if compress else part).div_(world)  # divided first, as the bucket hook does
    dist.all_reduce(part)
    weight.grad.index_copy_(0, rows, part.to(weight.grad.dtype))


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def interruption_seen(watcher, world: int) -> bool:
    """Has any node's watcher seen a notice? One tiny all-reduce per step, so all ranks agree."""
    seen = torch.tensor([1 if watcher and watcher.notice else 0])
    if world > 1:
        dist.all_reduce(seen)
    return bool(seen.item())


def save_checkpoint(path: Path, model, optimizer, scheduler, epoch: int, step: int, history: list, rng: list,
                    position: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "epoch": epoch, "step": step, "history": history, "rng": rng, "position": position}, tmp)
    os.replace(tmp, path)  # a crash mid-save leaves the previous checkpoint whole


def resume(path: Path, model, optimizer, scheduler, env, log) -> tuple[int, int, list, dict]:
    """Rank 0 reads the checkpoint (only its node has it) and sends it to the other ranks."""
    box = [torch.load(path, weights_only=False) if env.master and path.exists() else None]
    if env.world_size > 1:
        dist.broadcast_object_list(box, src=0)
    checkpoint = box[0]
    if checkpoint is None:
        raise SystemExit(f"--resume: no checkpoint at {path}; start without --resume")
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    rng = checkpoint.get("rng") or []
    if len(rng) == env.world_size:  # the same layout as the run that saved it: continue its random streams
        torch.set_rng_state(rng[env.rank]["torch"])
        random.setstate(rng[env.rank]["python"])
    position = checkpoint.get("position") or EPOCH_START  # checkpoints from before mid-epoch stops
    log.info(f"resumed from {path}: epoch {checkpoint['epoch']}, batch {position['batch']}, step {checkpoint['step']}")
    return checkpoint["epoch"], checkpoint["step"], checkpoint["history"], position


def setup_logging(path: Path, master: bool) -> logging.Logger:
    log = logging.getLogger("ftc")
    log.setLevel(logging.INFO)
    formatter = logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S")
    handler = logging.FileHandler(path)
    handler.setFormatter(formatter)
    log.addHandler(handler)
    if master:
        console = logging.StreamHandler(sys.stdout)
        console.setFormatter(formatter)
        log.addHandler(console)
    return log


def versions() -> dict[str, str]:
    found = {"python": sys.version.split()[0]}
    for name in ("torch", "transformers", "tokenizers", "datasets", "impi-rt", "intel-extension-for-pytorch",
                 "oneccl-bind-pt"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def fmt_duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


if __name__ == "__main__":
    sys.exit(main())
