"""GLUE tasks: where their text and labels are, how to read them, and how to score them.

Two sources with one result (lists of (text_a, text_b, label)):
- a local directory in GLUE's own layout, `<dir>/<TASK>/train.tsv` and `dev.tsv`, read with
  quoting disabled (MRPC sentences hold bare `"`), the task folder matched case-insensitively;
- the Hugging Face hub, with `datasets`, when no directory is given.
Metrics are plain Python, so they are checked against hand-computed values.
"""

import csv
import io
import math
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Task:
    text_a: str  # column in the TSV header (or the index for header-less CoLA)
    text_b: str | None
    label: str
    labels: tuple[str, ...] | None  # label strings in order; None for regression (STS-B)
    metrics: tuple[str, ...]
    dev_file: str = "dev.tsv"
    header: bool = True
    hub_columns: tuple[str, str | None] = ("sentence", None)
    hub_dev: str = "validation"

    @property
    def num_labels(self) -> int:
        return len(self.labels) if self.labels else 1


TASKS: dict[str, Task] = {
    "mrpc": Task("#1 String", "#2 String", "Quality", ("0", "1"), ("accuracy", "f1"),
                 hub_columns=("sentence1", "sentence2")),
    "qqp": Task("question1", "question2", "is_duplicate", ("0", "1"), ("accuracy", "f1"),
                hub_columns=("question1", "question2")),
    "sst2": Task("sentence", None, "label", ("0", "1"), ("accuracy",)),
    "qnli": Task("question", "sentence", "label", ("entailment", "not_entailment"), ("accuracy",),
                 hub_columns=("question", "sentence")),
    "rte": Task("sentence1", "sentence2", "label", ("entailment", "not_entailment"), ("accuracy",),
                hub_columns=("sentence1", "sentence2")),
    "cola": Task("3", None, "1", ("0", "1"), ("matthews_correlation",), header=False),
    "stsb": Task("sentence1", "sentence2", "score", None, ("pearson", "spearmanr"),
                 hub_columns=("sentence1", "sentence2")),
    "mnli": Task("sentence1", "sentence2", "gold_label", ("entailment", "neutral", "contradiction"),
                 ("accuracy",), dev_file="dev_matched.tsv", hub_columns=("premise", "hypothesis"),
                 hub_dev="validation_matched"),
}
# GLUE's own folder names on disk
FOLDERS = {"mrpc": "MRPC", "qqp": "QQP", "sst2": "SST-2", "qnli": "QNLI", "rte": "RTE", "cola": "CoLA",
           "stsb": "STS-B", "mnli": "MNLI"}
ALIASES = {"sst-2": "sst2", "sts-b": "stsb"}

Example = tuple[str, str | None, float]


def task_name(name: str) -> str:
    key = ALIASES.get(name.lower(), name.lower())
    if key not in TASKS:
        raise ValueError(f"TASK={name!r} is not a GLUE task ftc knows; allowed: {', '.join(TASKS)}")
    return key


def task_dir(data_dir: str | Path, name: str) -> Path:
    """`<dir>/MRPC` or `<dir>/mrpc`: GLUE's names, or the lower-case ones."""
    root = Path(data_dir)
    for candidate in (FOLDERS[name], name, FOLDERS[name].lower()):
        if (root / candidate).is_dir():
            return root / candidate
    return root / name


def split_file(data_dir: str | Path, name: str, split: str) -> Path:
    return task_dir(data_dir, name) / ("train.tsv" if split == "train" else TASKS[name].dev_file)


def read_tsv(path: Path, name: str) -> tuple[list[Example], int]:
    """Rows of a GLUE TSV file; returns (examples, rows skipped for a wrong field count).

    The one reader of task files, on the nodes and in the controller's check before launch: a
    file with nothing to train on raises ValueError with one line naming it and what is wrong
    (not UTF-8 text, empty, a header and no rows, no row of the header's width, a label the task
    does not have), rather than training zero steps."""
    task = TASKS[name]
    rows = _rows(path)
    if task.header:
        if not rows:
            raise ValueError(f"{path}: empty; a GLUE {name.upper()} file starts with its header line")
        header, rows = rows[0], rows[1:]
        index = {column: i for i, column in enumerate(header)}
        missing = [c for c in (task.text_a, task.text_b, task.label) if c and c not in index]
        if missing:
            raise ValueError(f"{path}: no column {missing[0]!r} in the header; is this GLUE's {name.upper()} file?")
        a, b, y = index[task.text_a], index[task.text_b] if task.text_b else None, index[task.label]
        # STS-B and MNLI carry extra columns; the label is the last one there.
        width = len(header)
    else:
        a, b, y, width = int(task.text_a), None, int(task.label), 4
    if not rows:
        raise ValueError(f"{path}: no rows after the header" if task.header else f"{path}: empty")
    examples, skipped = [], 0
    for line, row in enumerate(rows, start=2 if task.header else 1):
        if len(row) != width:
            skipped += 1
            continue
        try:
            examples.append((row[a], row[b] if b is not None else None, label_value(task, row[y])))
        except ValueError as exc:
            raise ValueError(f"{path}: line {line}: {exc}") from None
    if not examples:
        raise ValueError(f"{path}: none of its {skipped} rows has the {width} tab-separated fields "
                         f"GLUE's {name.upper()} rows have")
    return examples, skipped


def _rows(path: Path) -> list[list[str]]:
    """The file's tab-separated fields, quoting disabled; decoded whole, so a bad byte is named."""
    csv.field_size_limit(sys.maxsize)
    try:
        text = Path(path).read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})") from None
    return list(csv.reader(io.StringIO(text, newline=""), delimiter="\t", quoting=csv.QUOTE_NONE))


def label_value(task: Task, raw: str) -> float:
    if task.labels is None:
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"label {raw!r} is not a number") from None
        if not math.isfinite(value):  # inf or 1e309 would train to a NaN Pearson
            raise ValueError(f"label {raw!r} is not a finite number")
        return value
    if raw.strip() not in task.labels:
        raise ValueError(f"label {raw!r} is not one of the task's ({', '.join(task.labels)})")
    return float(task.labels.index(raw.strip()))


def load_split(name: str, split: str, data_dir: str | None) -> list[Example]:
    if data_dir:
        return read_tsv(split_file(data_dir, name, split), name)[0]
    from datasets import load_dataset  # the hub: real clusters with network
    task = TASKS[name]
    dataset = load_dataset("nyu-mll/glue", name, split="train" if split == "train" else task.hub_dev)
    col_a, col_b = task.hub_columns
    return [(row[col_a], row[col_b] if col_b else None, float(row["label"])) for row in dataset]


# ---- metrics --------------------------------------------------------------------------------

def majority_share(gold: list[float]) -> float:
    """The accuracy of answering every example with the commonest label: what a classifier that learned
    nothing of the pairs scores (MRPC's dev set: 0.684). Pure."""
    return max(gold.count(label) for label in set(gold)) / len(gold)


def accuracy(pred: list[float], gold: list[float]) -> float:
    return sum(p == g for p, g in zip(pred, gold)) / len(gold)


def f1(pred: list[float], gold: list[float]) -> float:
    tp = sum(p == 1 and g == 1 for p, g in zip(pred, gold))
    fp = sum(p == 1 and g == 0 for p, g in zip(pred, gold))
    fn = sum(p == 0 and g == 1 for p, g in zip(pred, gold))
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def matthews(pred: list[float], gold: list[float]) -> float:
    tp = sum(p == 1 and g == 1 for p, g in zip(pred, gold))
    tn = sum(p == 0 and g == 0 for p, g in zip(pred, gold))
    fp = sum(p == 1 and g == 0 for p, g in zip(pred, gold))
    fn = sum(p == 0 and g == 1 for p, g in zip(pred, gold))
    denominator = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return (tp * tn - fp * fn) / denominator if denominator else 0.0


def pearson(x: list[float], y: list[float]) -> float:
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sx = math.sqrt(sum((a - mx) ** 2 for a in x))
    sy = math.sqrt(sum((b - my) ** 2 for b in y))
    return cov / (sx * sy) if sx and sy else 0.0


def ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties given their average rank (as Spearman needs)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    result = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            result[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return result


def spearman(x: list[float], y: list[float]) -> float:
    return pearson(ranks(x), ranks(y))


def f1_macro(pred: list[float], gold: list[float]) -> float:
    """The mean of each class's F1, every class that the gold labels or the predictions hold."""
    def f1_of(label: float) -> float:
        tp = sum(p == label and g == label for p, g in zip(pred, gold))
        wrong = sum((p == label) != (g == label) for p, g in zip(pred, gold))
        return 2 * tp / (2 * tp + wrong) if tp else 0.0
    labels = sorted(set(gold) | set(pred))
    return sum(f1_of(label) for label in labels) / len(labels)


METRICS = {"accuracy": accuracy, "f1": f1, "f1_macro": f1_macro, "matthews_correlation": matthews,
           "pearson": pearson, "spearmanr": spearman}


def compute_metrics(name: str, pred: list[float], gold: list[float]) -> dict[str, float | None]:
    return score(TASKS[name], pred, gold)


def score(task: Task, pred: list[float], gold: list[float]) -> dict[str, float | None]:
    """Each of the task's metrics, rounded; None where it is not a number (a regression that
    diverged predicts NaN), since every JSON ftc writes is strict."""
    scores = {f"eval_{metric}": round(METRICS[metric](pred, gold), 6) for metric in task.metrics}
    return {key: value if math.isfinite(value) else None for key, value in scores.items()}
