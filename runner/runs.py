"""The history of runs: every job ftc started, listed across clusters and after they are gone.

A job's results directory is `$FTC_HOME/runs/<cluster>/<job id>/` unless RESULTS names another.
At launch ftc writes its own record there, `run.json` (where and how the job ran); the training
program adds `results.json` when it ends. `ftc runs` finds runs by scanning `$FTC_HOME/runs/*/*/`
plus `$FTC_HOME/runs/elsewhere`, the list of results directories given as RESULTS, so a run stays
listed whichever directory the command ran from and after its cluster is destroyed.
"""

import contextlib
import fcntl
import hashlib
import json
import os
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from provision import state as st
from provision.errors import FtcError, UsageError, command
from provision.providers import TRAITS, traits
from provision.spec import NAME_RE
from provision.values import conforms, kind_name, label, local_path

from .node.protocol import EXIT_CODE_FILE, RESULTS_FILE, TrainResults, kernels_words
from .node.recipes import RECIPES

RECORD = "run.json"
ELSEWHERE = "elsewhere"  # one absolute results directory per line, for RESULTS outside runs_root()
# What `ftc runs` reads from each file of a run, and the type ftc writes it as (None only where ftc
# writes null; the training program's as its TrainResults declares): a file holding anything else
# makes the run show as corrupt, not crash the listing.
FIELD_KINDS = {
    RECORD: {"id": str, "cluster": str, "provider": str, "instance_type": str, "task": str, "model": str,
             "precision": str, "status": str, "results_dir": str, "nodes": int, "ranks_per_node": int,
             "epochs": int | None, "started_at": float, "ended_at": float | None, "kind": str, "command": str,
             "exit_code": int | None, "output_bytes": int | None},
    RESULTS_FILE: TrainResults.kinds(("task", "model", "precision", "finished_at", "nodes", "ranks_per_node", "epochs",
                                      "samples_per_second", "epoch_metrics")),
}


def runs_root() -> Path:
    return st.ftc_home() / "runs"


def default_results_dir(cluster: str, job_id: str) -> str:
    return str(runs_root() / cluster / job_id)


def refuse_reuse(key: str, given: str | Path, run_dir: str | Path | None = None) -> None:
    """A results directory that already holds a run is refused before launch: the new run would
    replace the earlier one's files and keep its start time. (A resumed run continues in its own.)
    `run_dir`: the directory under the value the user gave (`given`) that the run would use."""
    record = Path(local_path(key, str(run_dir or given))) / RECORD
    if record.exists():
        raise UsageError(f"{label(key)}={str(given)!r} already holds a run ({record}); give another "
                         f"{label(key)}, or remove that directory first")


# What makes a resumed job the same job as the one whose checkpoint it continues: its data, its
# model, and everything that shapes its steps and its schedule.
SAME_JOB = ("task", "model", "data_dir", "train_file", "validation_file", "recipe", "batch_size", "epochs", "lr",
            "max_train_samples", "precision", "dropout", "world_size", "text_columns", "label_column", "train_sha256",
            "validation_sha256", "grad_compress", "seed")
# Recorded only since the data's content and columns (and the gradient's compression) were: a run.json
# without them is not told apart by them. (The seed is not among them: before SEED every job ran 42.)
RECORDED_LATER = ("text_columns", "label_column", "train_sha256", "validation_sha256", "grad_compress")
LEFT_TO_RECIPE = ("batch_size", "epochs", "lr", "precision", "seed")  # unset (None, or precision auto): the recipe's


def as_run(settings: dict) -> dict:
    """A job's settings as it runs them: what was left to the recipe is the recipe's value (a batch
    never given is 32), no training-row limit is 0, and the world is nodes x ranks (None until the
    cluster's ranks are planned)."""
    recipe = RECIPES.get(settings.get("recipe") or "ftc", RECIPES["ftc"])
    run = {**settings, "max_train_samples": settings.get("max_train_samples") or 0}
    for key in LEFT_TO_RECIPE:
        if run.get(key) in (None, "auto"):
            run[key] = recipe[key]
    nodes, ranks = settings.get("nodes"), settings.get("ranks_per_node")
    run["world_size"] = nodes * ranks if nodes and ranks else None
    return run


def refuse_other_job(results_dir: str | Path, cluster: str, settings: dict) -> None:
    """Before a resume launches: the run in `results_dir` must be this cluster's, unfinished, and
    the same job (SAME_JOB as recorded in its run.json); anything else is refused naming what
    differs, so no finished run is written into and no other run is taken over."""
    record, problem = read_run_file(Path(results_dir), RECORD)
    if problem or not record:
        return  # a checkpoint kept without ftc's record (copied by hand): nothing recorded to differ from
    where = f"{label('results')}={str(results_dir)!r} holds run {record.get('id', '?')}"
    if record.get("cluster") != cluster:
        raise UsageError(f"{where} of cluster {record.get('cluster')!r}, not {cluster!r}; --resume continues only "
                         "this cluster's own run: start a new job without --resume")
    if record.get("status") == "incomplete":  # the job ended; only its fetch did not
        raise UsageError(f"{where}, which ended but whose results are not all home; `ftc fetch --name {cluster}` "
                         "copies the rest (a run that ended is never written into)")
    if record.get("status") == "finished":
        raise UsageError(f"{where}, which finished; a finished run is never written into: start a new job "
                         "without --resume")
    recorded, now = as_run(record), as_run(settings)
    known = [key for key in SAME_JOB if (key != "world_size" or (recorded[key] and now[key])) and
             (key not in RECORDED_LATER or key in record)]
    differs = [f"{key} {recorded.get(key)!r} -> {now.get(key)!r}" for key in known if recorded.get(key) != now.get(key)]
    if differs:
        raise UsageError(f"{where}, another job than this one ({'; '.join(differs)}); --resume continues the "
                         "same job only: start a new job without --resume, or resume with its settings")


@contextlib.contextmanager
def results_claimed(results_dir: str | Path, check_unused: bool) -> Iterator[None]:
    """Hold RESULTS for one job from the check that it holds no run until that job's run.json is
    written: two jobs started at once with the same RESULTS (on two clusters) would both pass the
    check and write into one directory. A lock file per directory under FTC_HOME, flocked; the second
    is refused while the first holds it."""
    locks = st.ftc_home() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(os.fsencode(Path(results_dir).absolute())).hexdigest()[:24]
    with open(locks / f"results-{key}", "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(f"{label('results')}={str(results_dir)!r} is being claimed by another job starting now; "
                             f"give another {label('results')}, or start this job once that one has started") from None
        try:
            if check_unused:
                refuse_reuse("results", results_dir)
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def utc_stamp() -> str:
    """Now, for names that sort by time: 20261130T120000Z."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def record_start(state: st.ClusterState, job: st.JobInfo, settings: dict) -> None:
    """Write run.json at launch (a resumed job keeps its first start) and index a RESULTS elsewhere."""
    results = Path(job.results_dir).absolute()
    results.mkdir(parents=True, exist_ok=True)
    earlier, _ = read_run_file(results, RECORD)
    spec = state.cluster_spec
    record = {"id": job.id, "cluster": state.name, "provider": state.provider,
              "instance_type": spec.instance_type if traits(state.provider).instance_types else "",
              "started_at": earlier.get("started_at") or time.time(), "ended_at": None, "status": "running",
              "results_dir": str(results), "remote_dir": job.remote_dir, **settings}
    _write_json(results / RECORD, record)
    root = runs_root().absolute()
    if results.parent.parent != root:
        root.mkdir(parents=True, exist_ok=True)
        with open(root / ELSEWHERE, "ab") as fh:  # a path as the OS has it, whatever its bytes
            fh.write(os.fsencode(results) + b"\n")


def record_end(results_dir: str | Path, status: str, **outcome) -> None:
    """The job's outcome, as the controller saw it (finished, failed, cancelled, preempted); a script's
    `outcome` adds its exit code and the size of its output."""
    record, _ = read_run_file(Path(results_dir), RECORD)
    if record:
        record.update({"status": status, "ended_at": time.time(), **outcome})
        _write_json(Path(results_dir) / RECORD, record)


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    try:
        tmp.write_text(json.dumps(data, indent=2, allow_nan=False))
    except BaseException:  # a full disk: the old record stays whole, no half-written copy beside it
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def run_dirs() -> list[Path]:
    """Every results directory that holds ftc's record of a run, each once."""
    root = runs_root()
    found = list(root.glob(f"*/*/{RECORD}")) if root.exists() else []
    try:
        listed = (root / ELSEWHERE).read_bytes().splitlines()
    except OSError:
        listed = []
    found += [Path(os.fsdecode(line)) / RECORD for line in listed if line.strip()]
    unique = {str(p.parent.absolute()): p.parent for p in found if p.is_file()}
    return list(unique.values())


def summary(results: Path) -> dict:
    """One run as `ftc runs` shows it: ftc's record, what the training program reported, and derived
    status, wall time and cost. A run whose files `ftc runs` cannot use has status "corrupt" and
    `problem` says why."""
    (record, bad_record), (done, bad_done) = read_run_file(results, RECORD), read_run_file(results, RESULTS_FILE)
    problem = bad_record or bad_done
    if problem:
        record, done = {}, {}  # the other file alone could mislead: a corrupt run shows only where it is
    # "incomplete": a fetch that did not bring every file home, whatever the cluster says of the job
    status = "corrupt" if problem else "incomplete" if record.get("status") == "incomplete" else live_status(record)
    started = record.get("started_at") or 0.0
    ended = _finished_at(done) or record.get("ended_at") or \
        ((ended_unfetched(record) or time.time()) if status == "running" else None)
    wall = round(ended - started, 1) if ended and started else None
    nodes = done.get("nodes") or record.get("nodes")
    return {"id": record.get("id", results.name), "cluster": record.get("cluster", results.parent.name),
            "provider": record.get("provider", ""), "instance_type": record.get("instance_type", ""),
            "task": done.get("task") or record.get("task", ""), "model": done.get("model") or record.get("model", ""),
            "nodes": nodes, "ranks_per_node": done.get("ranks_per_node") or record.get("ranks_per_node"),
            "precision": done.get("precision") or record.get("precision", ""),
            "epochs": done.get("epochs") or record.get("epochs"),
            "metrics": {k: v for k, v in done.items() if k.startswith("eval_")},
            "samples_per_second": done.get("samples_per_second"), "wall_seconds": wall,
            "cost_usd": None if problem else cost(record.get("provider", ""), record.get("instance_type", ""),
                                                  nodes, wall),
            "status": "finished" if done and status in ("lost", "unknown") else status, "problem": problem,
            "started_at": started, "results_dir": str(results), "kind": record.get("kind", "finetune"),
            "command": record.get("command"), "exit_code": record.get("exit_code"),
            "output_bytes": record.get("output_bytes"), "compile": record.get("compile"),
            "kernels": kernels_words(done["compile_cache"], done.get("compile_cache_from") or "this node")
            if done.get("compile_cache") else None}


def read_run_file(results: Path, name: str) -> tuple[dict, str]:
    """One of a run's JSON files, and what in it `ftc runs` cannot use ('' if nothing); {} when there
    is no such file or something in it is unusable."""
    path = results / name
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return {}, ""
    except (OSError, ValueError) as exc:
        return {}, f"{name} cannot be read ({exc})"
    if not isinstance(data, dict):
        return {}, f"{name} is not a JSON object"
    problem = wrong_kinds(name, data)
    return ({} if problem else data), problem


def wrong_kinds(name: str, data: dict) -> str:
    """The first field of a run's file that holds the wrong kind of value, in words; '' when none. Pure."""
    kinds = {**FIELD_KINDS[name], **{k: float | None for k in data if k.startswith("eval_")}}  # None: diverged
    for key, kind in kinds.items():
        measured = key == "epoch_metrics" or key.startswith("eval_")  # may be NaN: a diverged run
        if key in data and not conforms(data[key], kind, finite=not measured):
            return f"{name}: {key} is {json.dumps(data[key])[:40]}, not {kind_name(kind)}"
    return ""


def live_status(record: dict) -> str:
    """The cluster's word for the job while the cluster holds it; else the record's. A job the record
    still calls running whose cluster no longer holds it was lost with its cluster."""
    status = record.get("status", "unknown")
    name = record.get("cluster", "")
    try:  # only a cluster name is looked up: a record may hold any text
        jobs = st.load(name).jobs if NAME_RE.match(name) and st.exists(name) else []
    except (UsageError, st.CorruptState, OSError):
        jobs = []
    job = next((j for j in jobs if j.id == record.get("id") and
                str(Path(j.results_dir).absolute()) == record.get("results_dir")), None)
    if job:
        return job.state
    return "lost" if status == "running" else status


def ended_unfetched(record: dict) -> float | None:
    """When a job the cluster still calls running in fact ended (its launch script's exit code written,
    nobody has fetched it yet), where its files lie on this machine (local nodes); None elsewhere or
    while it runs: a wall time stops growing when the job does."""
    try:
        state = st.load(record["cluster"]) if NAME_RE.match(record.get("cluster", "")) else None
    except (KeyError, UsageError, st.CorruptState, OSError):
        return None
    job = next((j for j in state.jobs if j.id == record.get("id")), None) if state else None
    if job is None or not traits(state.provider).shares_this_machine:
        return None
    try:
        return (Path(job.remote_dir) / EXIT_CODE_FILE).stat().st_mtime
    except OSError:
        return None


def _finished_at(done: dict) -> float | None:
    try:
        return datetime.fromisoformat(done["finished_at"]).timestamp()
    except (KeyError, TypeError, ValueError):
        return None


def cost(provider: str, instance_type: str, nodes, wall_seconds) -> float | None:
    """The nodes' price over the job's wall time (the cluster's own setup and idle time not counted);
    a registered provider that bills nothing (local, ssh) costs 0; None (unknown) where it cannot be
    priced: a provider not registered here (a record on disk may name anything), a type not in its
    catalog, no node count or wall time."""
    if provider not in TRAITS:
        return None
    if not TRAITS[provider].billed:
        return 0.0
    from provision.providers import world
    price = world(provider).usd_per_node_hour(instance_type)
    if price is None or not nodes or wall_seconds is None:
        return None
    return round(price * nodes * wall_seconds / 3600, 2)


def all_runs() -> list[dict]:
    """Every run ftc has a record of, newest first."""
    return sorted((summary(d) for d in run_dirs()), key=lambda r: r["started_at"], reverse=True)


def find(ref: str) -> dict:
    """A run by its id, or `cluster/id` where the same id ran on several clusters."""
    runs = all_runs()
    matches = [r for r in runs if ref in (r["id"], f"{r['cluster']}/{r['id']}")]
    if len(matches) == 1 and matches[0]["problem"]:
        raise FtcError(f"{label('run')}={ref!r} is corrupt ({matches[0]['problem']}); its files are in "
                       f"{matches[0]['results_dir']}: fix or remove them")
    if len(matches) == 1:
        return matches[0]
    if matches:
        named = ", ".join(f"{r['cluster']}/{r['id']}" for r in matches)
        raise UsageError(f"{label('run')}={ref!r} ran on several clusters; allowed: one of {named}")
    known = ", ".join(r["id"] for r in runs[:3]) + (", ..." if len(runs) > 3 else "")
    raise UsageError(f"{label('run')}={ref!r} is not a run ftc knows; allowed: an id from `{command('runs')}`"
                     + (f" ({known})" if runs else " (none yet)"))
