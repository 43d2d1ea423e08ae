"""The peer ftc is measured against: Hugging Face Trainer with its best flags for this job.

bf16 autocast where the CPU has native bf16 (fp32 elsewhere: ftc's rule), length-grouped
sampling, padding to a multiple of 8, batch 32 per rank, no evaluation or saving during
training, the data loader in the main process. The same rows, model directory, learning rate
and schedule (linear, 6% warm-up) as ftc. Several ranks through torchrun:

    OMP_NUM_THREADS=4 taskset -c 0-15 torchrun --nproc-per-node 4 -m runner.node.hf_trainer \
        --model DIR --data-dir GLUE --output-dir OUT --max-steps 25

It writes OUT/results.json with the same rate keys as ftc's training program, timed over the
same steps: the first `--warmup-steps-untimed` left out, then wall time from one step's end to
the next (data loading included, as in ftc's steps); and each whole pass over the rows, timed
wall to wall (`epoch_metrics`: pass_seconds, pass_rows, pass_tokens), as ftc times its own.

FTC_PEER_PIN=1 pins each rank to its own equal share of the cores it was started on, before
torch starts its threads (what `python -m torch.backends.xeon.run_cpu` does per instance);
without it every rank's threads may run on any of those cores.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

from . import glue
from .distenv import pin_self, read_env
from .facts import cpu_info, native_bf16, versions
from .protocol import RESULTS_FILE, strict_json
from .recipes import RECIPES

if os.environ.get("FTC_PEER_PIN") == "1":  # before torch loads: its threads inherit the cores
    pin_self(read_env())

import torch  # noqa: E402

# --static-shapes: every batch padded to a multiple of this many tokens (4 widths up to 128)
STATIC_MULTIPLE = 32


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="mrpc")
    p.add_argument("--model", required=True, help="local model directory (config, vocabulary, maybe weights)")
    p.add_argument("--data-dir", required=True)
    p.add_argument("--output-dir", required=True)
    p.add_argument("--random-init", action="store_true", help="the model's architecture, fresh weights (bench)")
    p.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto")
    p.add_argument("--batch-size", type=int, default=RECIPES["seed"]["batch_size"], help="per rank")
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--max-train-samples", type=int, default=0)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--warmup-steps-untimed", type=int, default=3)
    p.add_argument("--eval", action="store_true", help="score MRPC dev after training (accuracy runs)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--torch-compile", action="store_true",
                   help="Trainer's own torch.compile (inductor); its kernels cached where TORCHINDUCTOR_CACHE_DIR says")
    p.add_argument("--static-shapes", action="store_true",
                   help=f"with --torch-compile: a few static shapes, each compiled once (batches padded to a multiple "
                        f"of {STATIC_MULTIPLE}, automatic dynamic shapes off, the last partial batch dropped)")
    return p.parse_args(argv)


class Rows(torch.utils.data.Dataset):
    """Tokenized rows as dicts, unpadded: the collator pads each batch."""

    def __init__(self, encoded: dict, labels: list):
        self.encoded, self.labels = encoded, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {**{k: v[i] for k, v in self.encoded.items()}, "labels": self.labels[i]}


class CountingCollator:
    """DataCollatorWithPadding that also notes each batch's real tokens, in the order batches
    are made (the data loader may make one ahead of the step that uses it)."""

    def __init__(self, collator):
        self.collator, self.tokens = collator, []

    def __call__(self, features: list[dict]) -> dict:
        batch = self.collator(features)
        self.tokens.append(int(batch["attention_mask"].sum()))
        return batch


def step_timer(warmup: int):
    """A TrainerCallback that notes the wall-clock time at the end of every step, and when each
    epoch (a whole pass over the rows) begins and ends."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.ends: list[float] = []
            self.passes: list[list[float]] = []  # [start, end] of each epoch

        def on_epoch_begin(self, args, state, control, **kwargs):
            self.passes.append([time.perf_counter()])

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter())

        def on_epoch_end(self, args, state, control, **kwargs):
            self.passes[-1].append(time.perf_counter())

        def steady(self) -> tuple[int, float]:
            """Steps after the warm-up, and their seconds."""
            timed = self.ends[warmup - 1:] if warmup else self.ends
            return (len(timed) - 1, timed[-1] - timed[0]) if len(timed) > 1 else (0, 0.0)
    return StepTimer()


def main(argv=None) -> int:
    args = parse_args(argv)
    from transformers import (
        AutoConfig,
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    native = native_bf16(cpu_info()[1])
    precision = args.precision if args.precision != "auto" else ("bf16" if native else "fp32")
    rows = glue.load_split(args.task, "train", args.data_dir)
    rows = rows[:args.max_train_samples] if args.max_train_samples else rows
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    train = Rows(tokenize(tokenizer, rows, args.max_length), [int(r[2]) for r in rows])
    num_labels = glue.TASKS[args.task].num_labels
    torch.manual_seed(args.seed)
    if args.random_init:
        model = AutoModelForSequenceClassification.from_config(
            AutoConfig.from_pretrained(args.model, num_labels=num_labels), dtype=torch.float32)
    else:  # fp32 master weights, as ftc keeps them, whatever dtype the checkpoint has
        model = AutoModelForSequenceClassification.from_pretrained(args.model, num_labels=num_labels,
                                                                   dtype=torch.float32)
    steps = args.max_steps or -1
    planned = args.max_steps or -(-len(train) // (args.batch_size * world)) * args.epochs
    training = TrainingArguments(
        output_dir=args.output_dir, use_cpu=True, bf16=precision == "bf16", per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.batch_size * 2, learning_rate=args.lr, weight_decay=0.01,
        num_train_epochs=args.epochs, max_steps=steps, warmup_steps=int(0.06 * planned), lr_scheduler_type="linear",
        train_sampling_strategy="group_by_length", dataloader_num_workers=0, ddp_find_unused_parameters=False,
        eval_strategy="no", save_strategy="no", logging_strategy="no", report_to="none", disable_tqdm=True,
        seed=args.seed, torch_compile=args.torch_compile, dataloader_drop_last=args.static_shapes)
    if args.static_shapes:
        # a graph per width, each static: dynamo would otherwise recompile the second width with symbolic
        # shapes, the dynamic graph whose inductor code fails on this model (a size never codegen-ed)
        torch._dynamo.config.automatic_dynamic_shapes = False
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 16)
    collator = CountingCollator(DataCollatorWithPadding(
        tokenizer, pad_to_multiple_of=STATIC_MULTIPLE if args.static_shapes else 8))
    timer = step_timer(args.warmup_steps_untimed)
    trainer = Trainer(model=model, args=training, train_dataset=train, data_collator=collator, callbacks=[timer])
    trainer.train()
    metrics = evaluate(trainer, tokenizer, args) if args.eval else {}
    if rank == 0:
        results = results_of(args, timer, collator, world, precision, native, metrics, train)
        Path(args.output_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.output_dir) / RESULTS_FILE).write_text(strict_json(results))
        print("PEER " + json.dumps({k: v for k, v in results.items() if k != "versions"}, allow_nan=False), flush=True)
    return 0


def tokenize(tokenizer, rows, max_length: int) -> dict:
    b = [r[1] for r in rows] if rows[0][1] is not None else None
    return dict(tokenizer([r[0] for r in rows], b, truncation=True, max_length=max_length))


def evaluate(trainer, tokenizer, args) -> dict[str, float]:
    rows = glue.load_split(args.task, "dev", args.data_dir)
    dev = Rows(tokenize(tokenizer, rows, args.max_length), [int(r[2]) for r in rows])
    # Trainer's eval sampler is length-grouped too (train_sampling_strategy): the predictions come in
    # its order, so they are scored against the labels it returns beside them, not the file's order.
    out = trainer.predict(dev)
    return glue.compute_metrics(args.task, out.predictions.argmax(-1).astype(float).tolist(),
                                out.label_ids.astype(float).tolist())


def results_of(args, timer, collator, world: int, precision: str, native: bool, metrics: dict, train: Rows) -> dict:
    steps, seconds = timer.steady()
    first = max(0, args.warmup_steps_untimed)
    tokens = sum(collator.tokens[first:first + steps]) * world  # this rank's share, as ftc counts it
    samples = steps * args.batch_size * world
    rows, real_tokens = len(train), sum(len(ids) for ids in train.encoded["input_ids"])
    if args.static_shapes:  # the partial batch is dropped: a pass trains whole global batches only
        trained = rows - rows % (args.batch_size * world)
        rows, real_tokens = trained, round(real_tokens * trained / max(1, len(train)))
    passes = [{"epoch": i + 1, "pass_seconds": round(end - begin, 3), "pass_rows": rows, "pass_tokens": real_tokens}
              for i, (begin, end) in enumerate(p for p in timer.passes if len(p) == 2)]
    return {"trainer": "transformers.Trainer", "task": args.task, "model": args.model, "precision": precision,
            "native_bf16": native, "world_size": world, "threads_per_rank": torch.get_num_threads(),
            "batch_size_per_rank": args.batch_size, "lr": args.lr, "epochs": args.epochs, "sampling": "group_by_length",
            "padding": f"longest, multiple of {STATIC_MULTIPLE if args.static_shapes else 8}",
            "static_shapes": args.static_shapes,
            "torch_compile": args.torch_compile, "steps": len(timer.ends), "steady_steps": steps,
            "steady_samples_per_second": round(samples / seconds, 3) if seconds else 0.0,
            "steady_tokens_per_second": round(tokens / seconds, 3) if seconds else 0.0,
            "train_samples": rows, "train_tokens": real_tokens, "epoch_metrics": passes,
            "pinned": os.environ.get("FTC_PEER_PIN") == "1", **metrics,
            "versions": versions()}


if __name__ == "__main__":
    sys.exit(main())
