"""A job's rows: the task (a GLUE one, or the one your files make), its train and dev rows read and
tokenized (unpadded: each batch is padded as it is collated).
"""

import logging
from dataclasses import dataclass
from pathlib import Path

from . import datafiles, glue


@dataclass
class Data:
    """The task and its rows, tokenized (unpadded: collate pads each batch)."""
    tokenizer: object
    task: glue.Task
    train: dict  # encode's
    dev: dict
    pad_id: int  # the tokenizer's padding token


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
