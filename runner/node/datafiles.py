"""Your own data (TASK=custom): a training and a validation file in CSV, TSV or JSON lines, read as
Hugging Face's run_glue.py reads them, one row at a time, so a big file is never held twice.

- The format follows the extension: `.csv` (commas) and `.tsv` (tabs), both with a header line and
  double-quote quoting as pandas writes and reads it; `.json` and `.jsonl`, one JSON object per line.
- The text columns are one or two (default `sentence1` and `sentence2` when the training file has
  both, else `text`); the label column defaults to `label`.
- run_glue.py's rule for the task's kind: a float label means regression (labels that are all
  numbers, one of them written with a fraction or an exponent: `3.5`, `1.0`); anything else is
  classification, its classes the training file's distinct labels, sorted (by value when all are
  whole numbers, else as text).
- The same reader runs on the controller (`check`, before launch, naming every problem by file,
  line and column) and on the nodes (`read`), so a file the check passed is read the same there.
"""

import csv
import json
import math
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .glue import Example, Task

FORMATS = {".csv": ",", ".tsv": "\t", ".json": "json", ".jsonl": "json"}
DEFAULT_PAIR = ("sentence1", "sentence2")
DEFAULT_SINGLE = "text"
DEFAULT_LABEL = "label"
CUSTOM = "custom"  # the task name of your own files
MAX_PROBLEMS = 20  # per file: the first ones say what is wrong; hundreds more would hide them
MAX_SHOWN = 10  # classes named in a message; a file with thousands would make one line of megabytes
# How a message names the column options: ftc's flags here; the controller passes the form the user runs
# ftc in (`--text-columns`, or TEXT_COLUMNS through make).
OPTIONS = {"text_columns": "--text-columns", "label_column": "--label-column"}
WHOLE = re.compile(r"^[+-]?\d+$")


class Huge:
    """A JSON whole number too large for a float (or for Python's int parsing, past 4300 digits): kept
    as its digits, so the row's label check names it instead of a traceback from json.loads."""

    def __init__(self, digits: str):
        self.digits = digits


class Duplicate(Exception):
    """A JSON object naming one key twice: json.loads would keep the last silently."""


def unique_keys(pairs: list) -> dict:
    row = dict(pairs)
    if len(row) < len(pairs):
        seen = set()
        raise Duplicate(next(name for name, _ in pairs if name in seen or seen.add(name)))
    return row


def whole(text: str) -> int | Huge:
    """A whole number written in digits as an int, Huge when no float holds it (the labels become floats)."""
    digits = text.lstrip("+-").lstrip("0") or "0"
    if len(digits) > 309:  # past float's range, and int() itself refuses past 4300 digits
        return Huge(text)
    value = -int(digits) if text.startswith("-") else int(digits)
    try:
        float(value)
    except OverflowError:
        return Huge(text)
    return value


MAX_LABEL_SHOWN = 40  # characters of one label in a message: a label may be a whole paragraph


def short(label: str) -> str:
    """One label for a message: as it is, or its first MAX_LABEL_SHOWN characters and how many it has."""
    return label if len(label) <= MAX_LABEL_SHOWN else f"{label[:MAX_LABEL_SHOWN]}... ({len(label)} characters)"


def shown(classes: tuple[str, ...]) -> str:
    """A class list for a message: every class, or the first MAX_SHOWN and how many there are; each
    label shortened (short)."""
    if len(classes) <= MAX_SHOWN:
        return ", ".join(map(short, classes))
    return f"{', '.join(map(short, classes[:MAX_SHOWN]))}, ... ({len(classes)} classes)"


class DataProblems(ValueError):
    """Every problem found in the files, one line each: `<file>: line N, column 'c': what`."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Layout:
    """Which columns hold what: found from the training file's header and the flags."""
    text: tuple[str, ...]  # one or two text columns, in the order the tokenizer gets them
    label: str


def records(path: Path) -> Iterator[tuple[int, dict | list | None, str]]:
    """(line, row, problem) for each row: the row as a dict (None where the line is not a row,
    with the problem in words: `column 'c': what` when it is one column's). CSV/TSV rows map the
    header's names to their fields; the header itself comes first, as the list of its names."""
    kind = FORMATS.get(path.suffix.lower())
    with open(path, encoding="utf-8-sig", newline="") as fh:
        if kind == "json":
            for line, text in enumerate(fh, start=1):
                if not text.strip():
                    continue
                try:
                    row = json.loads(text, parse_int=whole, object_pairs_hook=unique_keys)
                except json.JSONDecodeError as exc:
                    yield line, None, f"not JSON ({exc.msg} at character {exc.colno})"
                    continue
                except RecursionError:
                    yield line, None, "not JSON this reader takes (nested too deeply)"
                    continue
                except Duplicate as exc:
                    yield line, None, f"column {exc.args[0]!r}: named twice in the object; give each key once"
                    continue
                yield (line, row, "") if isinstance(row, dict) else (line, None, "not a JSON object")
            return
        csv.field_size_limit(sys.maxsize)
        reader = csv.reader(fh, delimiter=kind)
        header = next(reader, None)
        if header is None:
            return
        twice = next((name for name in header if header.count(name) > 1), None)
        if twice is not None:  # pandas would rename the second, csv's dict keeps it: refused, not guessed
            yield 1, None, (f"column {twice!r}: named {header.count(twice)} times in the header; "
                            "give each column its own name")
            return
        yield 1, header, "header"
        for fields in reader:
            if not fields:
                continue  # a blank line, as pandas skips it
            if len(fields) != len(header):
                yield reader.line_num, None, f"{len(fields)} field(s), the header has {len(header)}"
                continue
            yield reader.line_num, dict(zip(header, fields)), ""


def label_key(raw) -> int | float | str:
    """A label as a value: whole numbers as int, other numbers as float, the rest as text.
    Raises ValueError for a missing or non-finite one."""
    if isinstance(raw, Huge):
        raise ValueError(too_large(raw.digits))
    if raw is None or raw == "" or isinstance(raw, (list, dict)):
        raise ValueError("no label" if raw in (None, "") else "a label must be a string or a number")
    if isinstance(raw, bool):
        return str(raw).lower()
    if isinstance(raw, str):
        text = raw.strip()
        if WHOLE.match(text):
            value = whole(text)
            if isinstance(value, Huge):
                raise ValueError(too_large(text))
            return value
        try:
            value = float(text)
        except ValueError:
            return raw
    else:
        value = raw
    if not math.isfinite(value):
        raise ValueError(f"label {raw!r} is not a finite number")
    return int(value) if isinstance(value, int) else float(value)


def too_large(digits: str) -> str:
    start = digits if len(digits) <= 20 else f"{digits[:12]}...{digits[-4:]}"
    count = len(digits.lstrip("+-"))
    return (f"label {start} ({count} digits) is too large a number; "
            "allowed: numbers within a float's range (±1.8e308), or words")


def classes_of(keys: set) -> tuple[str, ...] | None:
    """run_glue.py's rule: None (regression) when the labels are numbers and one is a float, else
    the class names in sorted order."""
    if all(isinstance(k, (int, float)) for k in keys) and any(isinstance(k, float) for k in keys):
        return None
    if all(isinstance(k, int) for k in keys):
        return tuple(str(k) for k in sorted(keys))
    return tuple(sorted(str(k) for k in keys))


def layout_of(text_columns: str, label_column: str, names: list[str]) -> Layout:
    """The columns to use: the flags', else the defaults (the pair when the file has both)."""
    if text_columns:
        text = tuple(c.strip() for c in text_columns.split(","))
    else:
        text = DEFAULT_PAIR if all(c in names for c in DEFAULT_PAIR) else (DEFAULT_SINGLE,)
    return Layout(text, label_column or DEFAULT_LABEL)


def column_hint(column: str, layout: Layout, options: dict[str, str]) -> str:
    """What to do about a column the file lacks: name its columns with the option that chose it."""
    return f"name the file's columns with {options['text_columns' if column in layout.text else 'label_column']}"


def quoted(names) -> str:
    """A file's column names for a message, each quoted (a header cell or a JSON key may hold any text:
    a newline, a line of ftc's own log) and shortened."""
    return ", ".join(repr(short(name)) for name in names) or "none"


def missing_column(path: Path, line: int, names: list[str], layout: Layout, options: dict[str, str]) -> str:
    """The problem line for the first of the layout's columns the file lacks, '' when it has them all."""
    missing = [c for c in (*layout.text, layout.label) if c not in names]
    if not missing:
        return ""
    return (f"{path}: line {line}: no column {missing[0]!r} (columns: {quoted(names)}); "
            f"{column_hint(missing[0], layout, options)}")


def scan(path: Path, layout: Layout | None, text_columns: str = "", label_column: str = "",
         options: dict[str, str] = OPTIONS) -> tuple:
    """(layout, label keys, rows, problems) of one file, read once. `layout` None: found from this
    file's header (CSV, TSV) or first object (JSON) and the flags (the training file). A column
    absent from every JSON object is one problem, not one a row."""
    keys, problems, count = set(), [], 0  # problems: (line, what), line 0 for the whole file's
    absent: dict[str, list[tuple[int, str]]] = {}  # a column -> the problem of each object without it
    objects, present = 0, {}  # JSON objects read, and their keys in the order first seen
    try:
        for line, row, problem in records(path):
            if problem == "header" or (row is not None and layout is None):
                layout = layout or layout_of(text_columns, label_column, list(row))
                if layout.label in layout.text:
                    return layout, keys, count, [
                        f"{path}: line {line}, column {layout.label!r}: both a text column "
                        f"({options['text_columns']}) and the label column ({options['label_column']}); "
                        "allowed: text columns other than the label's"]
                missing = missing_column(path, line, list(row), layout, options) if problem == "header" else ""
                if missing:
                    return layout, keys, count, [missing]
                if problem == "header":
                    continue
            if row is None:
                problems.append((line, f"{path}: line {line}{',' if problem.startswith('column ') else ':'} {problem}"))
                continue
            objects += 1
            present.update(dict.fromkeys(row))
            found = row_problem(row, layout)
            if found:
                said = (line, f"{path}: line {line}, column {found[0]!r}: {found[1]}")
                (problems if found[0] in row else absent.setdefault(found[0], [])).append(said)
                continue
            keys.add(label_key(row[layout.label]))
            count += 1
    except UnicodeDecodeError as exc:
        problems.append((sys.maxsize, f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x}); save it as UTF-8"))
    for column, said in absent.items():
        problems += [(0, f"{path}: no row has column {column!r} (columns: {quoted(present)}); "
                         f"{column_hint(column, layout, options)}")] if len(said) == objects else said
    if not count and not problems:
        problems.append((0, f"{path}: no rows" + (" after the header" if layout else "")))
    return layout, keys, count, [what for _, what in sorted(problems, key=lambda problem: problem[0])]


def row_problem(row: dict, layout: Layout) -> tuple[str, str] | None:
    """(column, what is wrong) for the first bad field of a row, None when it is sound."""
    for column in layout.text:
        if not isinstance(row.get(column), str):
            return column, "no text" if row.get(column) is None else "the text is not a string"
    try:
        label_key(row.get(layout.label))
    except ValueError as exc:
        return layout.label, str(exc)
    return None


def check(train: Path, validation: Path, text_columns: str = "", label_column: str = "",
          options: dict[str, str] = OPTIONS) -> Task:
    """Both files read whole, here, before anything launches: the task they make (see examine)."""
    return examine(train, validation, text_columns, label_column, options)[0]


def examine(train: Path, validation: Path, text_columns: str = "", label_column: str = "",
            options: dict[str, str] = OPTIONS) -> tuple[Task, int]:
    """Both files read whole: the task they make and the training file's row count. Raises
    DataProblems with every problem (at most MAX_PROBLEMS a file), each naming file, line, column."""
    layout, keys, rows, problems = scan(train, None, text_columns, label_column, options)
    if problems:
        raise DataProblems(capped(problems))
    classes = classes_of(keys)
    if classes is not None and len(classes) < 2:
        raise DataProblems([f"{train}: column {layout.label!r}: one class only ({classes[0]}); "
                            "classification needs at least 2"])
    _, dev_keys, _, problems = scan(validation, layout, options=options)
    if problems:
        raise DataProblems(capped(problems))
    if classes is None:
        stray = sorted(str(k) for k in dev_keys if not isinstance(k, (int, float)))
        what = "is not a number (the training labels are: regression)"
    else:
        stray = sorted({str(k) for k in dev_keys} - set(classes))
        what = f"is not among the training file's classes ({shown(classes)})"
    if stray:
        raise DataProblems(capped([f"{validation}: column {layout.label!r}: label {short(label)!r} {what}"
                                   for label in stray]))
    return task_of(layout, classes), rows


def capped(problems: list[str]) -> list[str]:
    if len(problems) <= MAX_PROBLEMS:
        return problems
    return problems[:MAX_PROBLEMS] + [f"... and {len(problems) - MAX_PROBLEMS} more problems in the same file"]


def task_of(layout: Layout, classes: tuple[str, ...] | None) -> Task:
    metrics = ("pearson", "spearmanr") if classes is None else ("accuracy", "f1_macro")
    return Task(layout.text[0], layout.text[1] if len(layout.text) > 1 else None, layout.label, classes, metrics)


def read(path: Path, task: Task) -> list[Example]:
    """A checked file's rows as (text_a, text_b, label): the class index, or the number."""
    examples = []
    for _, row, problem in records(path):
        if row is None or problem == "header":
            continue
        key = label_key(row[task.label])
        value = float(key) if task.labels is None else float(task.labels.index(str(key)))
        examples.append((row[task.text_a], row[task.text_b] if task.text_b else None, value))
    return examples


def load(train: Path, validation: Path, text_columns: str = "", label_column: str = "") -> tuple:
    """On a node: (task, training rows, validation rows), the task found as the controller found it."""
    task = check(train, validation, text_columns, label_column)
    return task, read(train, task), read(validation, task)
