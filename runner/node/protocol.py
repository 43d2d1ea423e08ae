"""What crosses ssh between a node and the controller, declared once: the lines the node programs
print that the controller reads, the files they leave for it, and the exit code of a preempted job.
The node programs write with the functions here, the controller parses with them; both import this
module (standard library only: it ships to every node with the rest of runner/node/).

A training log line reaches the controller as `[rank] MARK HH:MM:SS message` in output.log: mpirun
puts the rank before it (report.split_rank takes it off), the training program's logger the job's
mark and the clock (log_format; split_logged takes them off), and the message is what a `*_line`
function here wrote. output.log also holds what anything else on a rank printed (a library's
warning, a traceback quoting your data, your own script's output in `ftc launch`): only a line that
carries the job's mark (line_mark) is the protocol's, so no such text is ever read as progress,
metrics or a checkpoint. Each `parse_*` function returns None for a message that is not its kind.
"""

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

# ---- the job's directory: its files, and the exit code of a preempted job ----------------------------

# Each is a path relative to the job's directory on a node (jobs/<id> in the node's directory); what
# comes home keeps it under the run's results directory. The launch script is rendered with them
# (provision/launch.py's render_launch), so no template spells one.
LAUNCH_SCRIPT = "launch.sh"  # the mpirun script the controller renders and starts detached (head node)
OUTPUT_LOG = "output.log"  # launch.sh's stdout and stderr: what mpirun collected from every rank (head node)
EXIT_CODE_FILE = "exit_code"  # launch.sh's exit code, written when mpirun returns (head node)
LOGS_DIR = "logs"  # every node's: each rank's own log (rank_log_path) and a script rank's exit (rank_exit_path)
DATA_DIR = "data"  # your data files (TASK=custom), copied to every node
CHECKPOINTS_DIR = "checkpoints"  # rank 0's checkpoints
CHECKPOINT_FILE = f"{CHECKPOINTS_DIR}/last.pt"  # the last checkpoint, what a resume starts from
RESULTS_FILE = "results.json"  # rank 0's TrainResults (the bench's peer writes its own)
PREEMPTED_FILE = "preempted.json"  # Preempted, when the job stopped for a spot notice
MODEL_DIR = "model"  # rank 0's fine-tuned model and tokenizer (not with --no-save)
TENSORBOARD_DIR = "tensorboard"  # rank 0's TensorBoard event files
KERNEL_CACHE_DIR = "inductor-cache"  # compiled kernels, in a run by hand (a node keeps them in its own cache/)
# A compiled job's kernels: its node's kernel cache (inductor's FX-graph and AOT-autograd caches with the
# compiled C++ kernels beside them) as <key digest>.tgz, its key and note in <key digest>.json; left in the
# job's directory by rank 0, they come home with the results into FTC_HOME/kernels (a job with no kernels
# to add, eager or warm from home, leaves its note alone: home adds it to the kept kernels' note) ...
HOME_KERNELS_DIR = "kernels"
KERNELS_ARCHIVE = ".tgz"
# ... and ftc ships them into this folder of each node's directory (FTC_NODE_DIR) before a job there
SHIPPED_KERNELS_DIR = "cache/shipped-kernels"


def merged_note(kept, measured) -> dict:
    """A kernel cache's note (what nodes measured of these kernels: `cold_s`, `warm_s`, and per layout
    `rates`) with a later job's figures over it, figure by figure: a job measures some, never all. What
    is not a note, or not a layout's figures, counts as none. Pure."""
    notes = [note if isinstance(note, dict) else {} for note in (kept, measured)]
    rates: dict[str, dict] = {}
    for note in notes:
        layouts = note.get("rates") if isinstance(note.get("rates"), dict) else {}
        for layout, figures in layouts.items():
            if isinstance(figures, dict):
                rates[layout] = {**rates.get(layout, {}), **figures}
    figures = {k: v for note in notes for k, v in note.items() if k != "rates"}
    return {**figures, **({"rates": rates} if rates else {})}


def write_whole(path: Path, data: dict) -> None:
    """`data` as `path`'s JSON, written beside it and then renamed: a reader (a node's next job, a
    controller bringing kernels home) never sees half a file. Raises OSError (a full disk, a read-only
    cache) for the caller to say what is lost."""
    partial = path.with_name(f"{path.name}.{os.getpid()}")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        partial.write_text(json.dumps(data, indent=1))
        partial.replace(path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def read_json(path: Path) -> dict:
    """A JSON object written by write_whole; {} where there is none or it is not one."""
    try:
        return json_object(path.read_text())
    except OSError:
        return {}


def json_object(text: str | bytes) -> dict:
    """`text` as a JSON object; {} where it is not one. Pure."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def kernels_words(cache: str, source: str) -> str:
    """How a job's compile started (TrainResults.compile_cache and compile_cache_from), as the job's log,
    its results table and `ftc runs show` say it. Pure."""
    if cache == "none":
        return "not compiled"
    return f"warm (from {source})" if cache == "warm" else "cold (compiled on the cluster)"
HELD_FILE = "held"  # --hold-at-step: rank 0 writes it when every rank stops to wait ...
RELEASE_FILE = "release"  # ... until a test writes this one
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: the training program stopped on purpose, resumable


def rank_log_path(rank: int) -> str:
    """A rank's own log: the training program's log handler writes it (a script rank tees its output)."""
    return f"{LOGS_DIR}/rank{rank}.log"


def rank_logs(job_dir: Path) -> list[Path]:
    """Every rank's log in a job's directory (or its results directory), in rank order."""
    named = {int(found.group(1)): path for path in (Path(job_dir) / LOGS_DIR).glob("rank*.log")
             if (found := re.fullmatch(r"rank(\d+)\.log", path.name))}
    return [named[rank] for rank in sorted(named)]


# The words the controller's check of a job on the head node (job.job_exit_code) echoes for it to read.
JOB_RUNNING = "RUNNING"  # the launch script (its pid, with its start time) still runs
JOB_PREEMPTED = "PREEMPTED"  # PREEMPTED_FILE is there: the job stopped for a spot notice

# ---- which lines are the protocol's ----------------------------------------------------------------------

# A line the controller reads starts with the job's mark: a hash of the job's id, given to the training
# program in its launch environment (LOG_MARK_ENV) and computed again by the controller from the id it
# recorded, so nothing more is stored. Your data and your script's prints were written without it (a
# script job's environment never holds it), so they cannot carry it by accident; whatever else they
# hold, a line without it is only text.
LOG_MARK_ENV = "FTC_LOG_MARK"
# On a spot cluster, how every rank of every kind of job reads interruption notices (spot.SpotReader.watch:
# the provider's reader and where it asks): in its launch environment, the one way the controller says it.
SPOT_NOTICE_ENV = "FTC_SPOT_WATCH"
LOG_CLOCK = "%H:%M:%S"
LOGGED = re.compile(r"(ftc-[0-9a-f]{12}) (\d\d):(\d\d):(\d\d) ")
# A number as Python's float() reads it (and as f"{x:.4f}" writes NaN and infinities): a line with
# anything else in a number's place is not the line it looks like, so reading it cannot fail.
NUMBER = r"[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|inf)"


def line_mark(job_id: str) -> str:
    """The mark at the start of every line the training program's logger writes for this job."""
    return "ftc-" + hashlib.sha256(f"ftc log line of job {job_id}".encode()).hexdigest()[:12]


def log_format(mark: str) -> str:
    """logging's format of the training program's lines: the job's mark (none in a run by hand, which
    no controller reads), the clock, the message."""
    return f"{mark} %(asctime)s %(message)s" if mark else "%(asctime)s %(message)s"


@dataclass
class Logged:
    """A line the training program's logger wrote (mpirun's rank prefix taken off)."""
    mark: str  # the job's line_mark
    seconds: int  # since midnight, by the logger's clock
    message: str  # what a `*_line` function wrote, or another message of the program's


def split_logged(text: str) -> Logged | None:
    """The logger's line, taken apart; None for a line of any other shape."""
    found = LOGGED.match(text)
    if not found:
        return None
    mark, hours, minutes, seconds = found.groups()
    return Logged(mark, int(hours) * 3600 + int(minutes) * 60 + int(seconds), text[found.end():])


def strict_json(data, indent: int | None = 2) -> str:
    """Every JSON a node writes: strict (no NaN or Infinity; non-finite values are null already)."""
    return json.dumps(data, indent=indent, allow_nan=False)


# ---- the training log's lines ------------------------------------------------------------------------

@dataclass
class Progress:
    """Rank 0's progress, every --log-every steps and at each epoch's last."""
    epoch: int  # the epoch under way, from 1
    epochs: int  # planned
    step: int  # steps done, all epochs
    total_steps: int  # planned
    loss: float  # the last step's (4 decimals in the line)
    samples_per_second: float  # all ranks', since this process started (1 decimal in the line)
    eta: str  # the planned steps left at that rate, as units.duration writes it


def progress_line(p: Progress) -> str:
    return (f"epoch {p.epoch}/{p.epochs} step {p.step}/{p.total_steps} loss {p.loss:.4f} "
            f"{p.samples_per_second:.1f} samples/s eta {p.eta}")


PROGRESS = re.compile(rf"epoch (\d+)/(\d+) step (\d+)/(\d+) loss ({NUMBER}) ({NUMBER}) samples/s(?: eta (\S+))?")


def parse_progress(message: str) -> Progress | None:
    found = PROGRESS.match(message)
    if not found:
        return None
    epoch, epochs, step, total, loss, rate, eta = found.groups()
    return Progress(int(epoch), int(epochs), int(step), int(total), float(loss), float(rate), eta or "")


@dataclass
class DevMetrics:
    """Rank 0's dev evaluation after an epoch."""
    epoch: int  # from 1
    metrics: dict[str, float | None]  # eval_<name>: value (4 decimals in the line); None: not a number


def dev_line(d: DevMetrics) -> str:
    return f"epoch {d.epoch} dev " + " ".join(f"{k} {v:.4f}" if v is not None else f"{k} none"
                                              for k, v in d.metrics.items())


DEV = re.compile(rf"epoch (\d+) dev ((?:eval_\w+ (?:{NUMBER}|none) ?)+)$")


def parse_dev(message: str) -> DevMetrics | None:
    found = DEV.match(message.rstrip())
    if not found:
        return None
    pairs = found.group(2).split()
    return DevMetrics(int(found.group(1)), {k: None if v == "none" else float(v) for k, v in zip(pairs[::2], pairs[1::2])})


@dataclass
class CheckpointSaved:
    """Rank 0 saved the job's checkpoint: on this line the follower copies it home."""
    epochs_done: int  # epochs finished before it
    path: str  # on the head node
    batch: int | None = None  # a mid-epoch checkpoint (a spot notice): batches done of the next epoch


def checkpoint_line(c: CheckpointSaved) -> str:
    mid_epoch = f" batch {c.batch} (spot interruption notice)" if c.batch is not None else ""
    return f"checkpoint saved: epoch {c.epochs_done}{mid_epoch} -> {c.path}"


CHECKPOINT = re.compile(r"checkpoint saved: epoch (\d+)(?: batch (\d+) \(spot interruption notice\))? -> (.+)$")


def parse_checkpoint(message: str) -> CheckpointSaved | None:
    found = CHECKPOINT.match(message.rstrip("\r\n"))
    if not found:
        return None
    epochs, batch, path = found.groups()
    return CheckpointSaved(int(epochs), path, int(batch) if batch is not None else None)


DONE = "done"  # every rank's last log line, once it has left the process group


def ended(log_text: str) -> bool:
    """A rank's log (rank_log_path, written only through the program's log handler) ran to its end:
    its last line is DONE."""
    lines = log_text.rstrip().splitlines()
    last = split_logged(lines[-1]) if lines else None
    return last is not None and last.message == DONE


# ---- the bootstrap verification's line (allreduce_check.py) ---------------------------------------

@dataclass
class RankSeen:
    """What one rank of the verification saw."""
    rank: int
    host: str  # its hostname
    cpus: list[int]  # the CPUs it may run on
    ok: bool  # both sums right


@dataclass
class AllreduceReport:
    """Rank 0's `ALLREDUCE {json}` line: the verification's all_reduce, and the bench's timing."""
    world_size: int
    sum: list[float]  # the two summed tensors, concatenated
    ranks: list[RankSeen]  # every rank's, in rank order
    allreduce_seconds: float | None = None  # --time-mb: the median all_reduce of that gradient; None untimed

    @classmethod
    def from_dict(cls, data: dict) -> "AllreduceReport":
        return cls(data["world_size"], data["sum"], [RankSeen(**r) for r in data["ranks"]],
                   data.get("allreduce_seconds"))


ALLREDUCE = "ALLREDUCE "


def allreduce_line(report: AllreduceReport) -> str:
    return ALLREDUCE + strict_json(asdict(report), indent=None)


def parse_allreduce(output: str) -> AllreduceReport | None:
    """The first ALLREDUCE line in a launch's output (mpirun's rank tag before it, anything after
    its JSON)."""
    line = next((ln for ln in output.splitlines() if ALLREDUCE in ln), "")
    if not line:
        return None
    data, _ = json.JSONDecoder().raw_decode(line.split(ALLREDUCE, 1)[1])
    return AllreduceReport.from_dict(data)


# ---- the bootstrap's marker lines (templates/bootstrap_node.sh.j2 echoes them) ---------------------

BOOTSTRAP_STEP = "STEP"  # `STEP <name>`: the node starts that step (keys+files, install, facts)
BOOTSTRAP_SKIP = "SKIP"  # the step's marker was there: nothing of it redone
BOOTSTRAP_FACTS = "FACTS"  # what follows is the node's facts (NodeFacts JSON)
LOGIN_REFUSED = "ftc-login-refused"  # the verification's line for each node the head node could not log in to


def bootstrap_step_line(step: str) -> str:
    return f"{BOOTSTRAP_STEP} {step}"


@dataclass
class BootstrapMark:
    """One marker line of a node's bootstrap."""
    kind: str  # BOOTSTRAP_STEP, BOOTSTRAP_SKIP or BOOTSTRAP_FACTS
    step: str = ""  # BOOTSTRAP_STEP's step


def parse_bootstrap_line(line: str) -> BootstrapMark | None:
    words = line.split()
    if len(words) == 2 and words[0] == BOOTSTRAP_STEP:
        return BootstrapMark(BOOTSTRAP_STEP, words[1])
    if words in ([BOOTSTRAP_SKIP], [BOOTSTRAP_FACTS]):
        return BootstrapMark(words[0])
    return None


# ---- the files a job leaves ------------------------------------------------------------------------

@dataclass
class Preempted:
    """Rank 0 stopped the job for a spot interruption notice, after a checkpoint. The file's being
    there tells the controller the job is resumable (mpirun's own exit code varies by MPI)."""
    notice: dict | None  # the instance-action the metadata service announced
    epoch: int  # the epoch under way, from 0
    batch: int  # batches done of it
    step: int  # steps done, all epochs

    def to_json(self) -> str:
        return strict_json(asdict(self), indent=None)

    @classmethod
    def from_json(cls, text: str) -> "Preempted":
        return cls(**json.loads(text))


@dataclass
class TrainResults:
    """What a finished training run reports: rank 0 writes it as RESULTS_FILE, the controller reads
    it (the results table, `ftc runs`, the sweep, the bench). In the file the dev metrics are top-level
    keys (eval_*), beside these fields."""
    task: str
    model: str  # hub id or directory, as given
    recipe: str  # ftc | seed
    stack: str
    backend: str  # gloo | ccl | none (one rank)
    precision: str  # bf16 | fp32
    native_bf16: bool
    grad_compress: str  # what the gradient all-reduce sent: bf16 | none | powersgd
    grad_sync: bool  # off: --no-grad-sync (profiling)
    embedding_sync: str  # rows | dense | none (one rank)
    compile: str  # whether torch.compile ran, and why, in words
    allreduce: str  # after-backward | overlap | comm-core | none (one rank)
    balance: str  # even | speed | none (one rank)
    gloo_threads: str  # rank-cores | inherit | kept-core | none (one rank)
    gloo_thread_cores: list[int]  # rank 0's: the cores its gloo threads may run on, read back from them
    nodes: int
    ranks_per_node: int
    threads_per_rank: int
    world_size: int
    epochs: int  # planned
    batch_size_per_rank: int
    lr: float
    max_length: int
    padding: str  # longest | max_length | buckets (compiled: bucket widths, compile_policy.bucket_width)
    dropout: float | None  # None: the model config's
    train_samples: int  # rows of the training set
    train_tokens: int  # their real (unpadded) tokens
    train_samples_seen: int  # by the steps this process ran, all ranks
    train_tokens_seen: int
    train_seconds: float  # of those steps
    samples_per_second: float
    steady_samples_per_second: float  # after the untimed warm-up steps
    steady_tokens_per_second: float
    first_loss: float | None  # of this process's first step; None: not finite (diverged)
    final_loss: float | None  # of its last
    steps: int  # done, all epochs, a resumed run's earlier ones included
    resumed_from_epoch: int | None  # None: not resumed
    resumed_from_batch: int | None
    epoch_metrics: list[dict[str, float | None]]  # per epoch: epoch, train_loss, pass_seconds/rows/tokens, eval_*
    metrics: dict[str, float | None]  # the last epoch's dev metrics (eval_*; None: not a number)
    timeline: list[dict[str, float]]  # per rank: rank, and its mean seconds per steady step in each phase
    versions: dict[str, str]  # python and the libraries of facts.LIBRARIES
    started_at: str  # ISO 8601, UTC
    finished_at: str
    labels: list[str] | None = None  # the classes in index order (the model's id2label); None: regression
    compile_cache: str = "none"  # warm | cold: the node's kernel cache when the compile began; none: not compiled
    compile_cache_from: str = ""  # warm kernels' source: this node | an earlier cluster (shipped from FTC_HOME)
    compile_shapes: str = ""  # dynamic | buckets: what the compiled step ran with; "": not compiled
    # cached | compiled: how rank 0's graphs were made; retraced: whole traces dynamo threw away and began again
    compile_graphs: dict[str, int] = field(default_factory=dict)
    compile_seconds: float | None = None  # what the compile cost rank 0's first steps; None: not compiled
    seed: int = 42  # the job's random seed (results from before SEED was a job option all ran 42)
    # rank 0's wall seconds of the job's stages around its steps (train.timed): to_first_step (from started_at,
    # tokenize included), tokenize (read and tokenize the rows), evaluate and checkpoint (every epoch's), save_model
    stage_seconds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The file's layout: the fields in order, the dev metrics as top-level keys after epoch_metrics."""
        data = {}
        for f in fields(self):
            if f.name == "metrics":
                data.update(self.metrics)
            else:
                data[f.name] = getattr(self, f.name)
        return data

    def to_json(self) -> str:
        return strict_json(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict) -> "TrainResults":
        known = {f.name for f in fields(cls)} - {"metrics"}
        metrics = {k: v for k, v in data.items() if k.startswith("eval_")}
        return cls(**{k: v for k, v in data.items() if k in known}, metrics=metrics)

    @classmethod
    def read(cls, job_dir: Path) -> "TrainResults":
        return cls.from_dict(json.loads((Path(job_dir) / RESULTS_FILE).read_text()))

    @classmethod
    def kinds(cls, names: tuple[str, ...]) -> dict[str, type]:
        """The declared types of these fields: what a reader checks a file it did not write against."""
        declared = {f.name: f.type for f in fields(cls)}
        return {name: declared[name] for name in names}


# ---- your own script's ranks (`ftc launch`, script_rank.py) -----------------------------------------

SCRIPT_WORKDIR = "workdir"  # in the job's directory: the node's copy of your workdir, where each rank runs
SCRIPT_OUTPUT_HOME = "output"  # in the results directory: rank 0's output folder, fetched
PREEMPTED_NOTE = "preempted.env"  # in the job's directory: `FTC_PREEMPTED=1` once a spot notice came
REQUIREMENTS_FILE = "requirements.txt"  # in the job's directory: your requirements, beside the workdir's copy
REQUIREMENTS_LOG = "requirements.log"  # beside each layer (<digest>.log): pip's output installing them
# In the node's own directory: a venv per requirements content, layered on the stack (its site-packages
# read after the layer's own), so a script's requirements never change the stack's Python; `down` removes it.
REQUIREMENTS_LAYERS = "requirements"
REQUIREMENTS_ENV = "FTC_REQUIREMENTS"  # the layer's name (its content's digest) for a script's ranks, when it has one
# The words the install of your requirements on a node (script_job.install_requirements) echoes.
REQUIREMENTS_SKIPPED = "SKIP"  # installed before: the stack's venv holds this file's content's marker
REQUIREMENTS_DONE = "DONE"
REQUIREMENTS_FAILED = "FAILED"  # the last lines of REQUIREMENTS_LOG follow


def requirements_layer(node_dir: Path, digest: str) -> Path:
    """The venv of a requirements content on a node (node_dir: the node's own directory)."""
    return Path(node_dir) / REQUIREMENTS_LAYERS / digest


@dataclass
class RankExit:
    """How one rank of a script job ended: rank_exit_path on its node, fetched home with the logs."""
    rank: int
    node: str  # the hostname of the node it ran on
    code: int  # the script's exit code; 128 + N when signal N killed it
    ended_at: float  # time.time() on its node: the earliest failure is the one that ended the job
    synced: bool | None = None  # whether the script exchanged with the other ranks (DDP, FSDP, a collective)


def rank_exit_path(rank: int) -> str:
    return f"{LOGS_DIR}/rank{rank}.exit.json"


SYNCED_ENV = "FTC_SYNCED_FILE"  # a script rank's file, made once its script wraps its model in DDP or FSDP, or
# calls a collective that combines the ranks' data (all_reduce, all_gather, reduce_scatter, all_to_all)


def rank_synced_path(rank: int) -> str:
    return f"{LOGS_DIR}/rank{rank}.synced"


def ranks_alone(exits: list[RankExit], world_size: int) -> bool:
    """Every rank of a job of several ended without exchanging anything with the others: each ran the
    whole job alone (a Trainer script on CPU without use_cpu=True does: it joins a process group, then
    trains without DDP). Pure."""
    return world_size > 1 and len(exits) == world_size and all(e.synced is False for e in exits)


def write_rank_exit(job_dir: Path, exit: RankExit) -> None:
    (job_dir / rank_exit_path(exit.rank)).write_text(strict_json(asdict(exit)))


def first_failure(exits: list[RankExit]) -> RankExit | None:
    """The rank whose failure ended the job: of those that exited non-zero, the first to end (the
    others were stopped by mpirun after it). None when every rank that reported exited 0."""
    failed = [e for e in exits if e.code != 0]
    return min(failed, key=lambda e: (e.ended_at, e.rank)) if failed else None


def read_rank_exits(job_dir: Path) -> list[RankExit]:
    """Every rank's exit record in a fetched job's LOGS_DIR (a record that does not parse is skipped:
    the rank was killed while writing it)."""
    found = []
    for path in sorted((job_dir / LOGS_DIR).glob("rank*.exit.json")):
        try:
            data = json.loads(path.read_text())
            synced = data.get("synced")
            found.append(RankExit(int(data["rank"]), str(data["node"]), int(data["code"]), float(data["ended_at"]),
                                  synced if isinstance(synced, bool) else None))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found
