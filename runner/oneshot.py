"""`ftc run`: up, bootstrap, finetune, fetch, down in one command. A job stopped by a spot
interruption is resumed from its checkpoint on a recreated cluster, up to MAX_RECLAIMS times;
the cluster is released (torn down unless KEEP=1) on success, failure and Ctrl-C alike, and after
Ctrl-C the run says what it tore down.
"""

import os
from pathlib import Path

from rich.markup import escape

from provision import cluster
from provision import state as st
from provision.bootstrap import bootstrap
from provision.errors import UsageError
from provision.estimate import DISTILBERT_PARAMS, GLUE_TRAIN_SIZES, cpu_class, local_train_seconds
from provision.providers import traits
from provision.spec import ClusterSpec
from provision.ssh import NodeConnections
from provision.ui import console

from . import runs
from .finetune_job import job_settings
from .job import finetune
from .jobspec import RECIPE_EPOCHS, JobSpec, check_ppn_fits, refuse_unreachable_inputs
from .model_files import parameter_count
from .node.facts import cpu_info
from .node.protocol import EXIT_PREEMPTED
from .node.units import duration
from .transfer import home_checkpoint, results_dir_of

MAX_RECLAIMS = 3  # spot interruptions one `ftc run` rides out before it gives up


def run_one_shot(spec: ClusterSpec, job: JobSpec, yes: bool, keep: bool, resume: bool = False) -> int:
    check_ppn_fits(spec, job)
    refuse_unreachable_inputs(job, spec.provider)
    checkpoint = latest_checkpoint(spec.name, job) if resume else None
    if checkpoint:  # before anything launches; finetune checks the world size once the ranks are planned
        runs.refuse_other_job(results_dir_of(checkpoint), spec.name, job_settings(job))
    expected = expected_here(spec, job)
    if expected:
        console.print(expected, markup=False, soft_wrap=True)
    cluster.up(spec, bootstrap=False, yes=yes)  # refused when NAME is taken: then nothing here is ours to release
    code, interrupted = 1, ""
    try:
        with NodeConnections() as connections:  # the bootstrap's logins serve the job: each node's, once
            bootstrap(spec.name, connections)  # inside: a failed or interrupted bootstrap releases the nodes too
            code = finetune(spec.name, job, resume_from=checkpoint, one_shot=True, connections=connections)
            for reclaim in range(1, MAX_RECLAIMS + 1):
                if code != EXIT_PREEMPTED:
                    break
                checkpoint = home_checkpoint(st.load(spec.name).jobs[-1].results_dir)
                console.print(f"[yellow]spot interruption ({reclaim}/{MAX_RECLAIMS}): recreating cluster "
                              f"{escape(spec.name)} and resuming from {escape(str(checkpoint))}[/]")
                connections.close()  # to nodes that are going: the recreated ones are logged in to anew, once
                cluster.recreate(spec, yes=True, connections=connections)  # the same spec the user already accepted
                code = finetune(spec.name, job, resume_from=checkpoint, one_shot=True, connections=connections)
    except KeyboardInterrupt:
        interrupted = what_is_released(spec.name, keep)
        raise
    finally:
        cluster.release(spec.name, keep)
        if interrupted:
            console.print(f"[yellow]{escape(interrupted)}[/]", highlight=False)
    return code


def expected_here(spec: ClusterSpec, job: JobSpec) -> str:
    """Before a run on this machine's own cores starts: how long its training should take, from the
    rate measured for this CPU class (provision/estimate.py). Empty where that is not known: other
    machines (`ftc plan` estimates those), or a custom data file's rows not counted yet."""
    rows = job.max_train_samples or GLUE_TRAIN_SIZES.get(job.task, 0)
    if not traits(spec.provider).shares_this_machine or not rows:
        return ""
    rows = min(rows, GLUE_TRAIN_SIZES.get(job.task, rows))
    params = parameter_count(Path(job.model)) if Path(job.model).is_dir() else None
    cores, cls = len(os.sched_getaffinity(0)), cpu_class(cpu_info()[1])
    epochs = job.epochs or RECIPE_EPOCHS
    seconds = local_train_seconds(rows * epochs, params or DISTILBERT_PARAMS, cores, cls)
    precision = "bf16" if cls == "bf16" else f"fp32: {cls}, no native bf16"
    return (f"expect about {duration(seconds)} of training here ({rows} rows x {epochs} epoch(s) on {cores} "
            f"core(s), {precision}), after under a minute of set-up")


def what_is_released(name: str, keep: bool) -> str:
    """After Ctrl-C, in words: the cluster and the job that release() is about to stop, or keep."""
    try:
        state = st.load(name)
    except (UsageError, st.CorruptState):
        return ""
    running = [j for j in state.jobs if j.state == "running"]
    nodes = f"{len(state.nodes)} {state.provider} node(s)"
    if keep:
        return (f"interrupted: cluster {name} ({nodes}) stays (KEEP=1)" +
                (f"; job {running[-1].id} runs on: `ftc logs --name {name} -f` follows it, "
                 f"`ftc cancel --name {name}` stops it" if running else ""))
    if running:
        runs.record_end(running[-1].results_dir, "interrupted")
        return (f"interrupted: stopped job {running[-1].id} and tore down cluster {name} ({nodes}); "
                f"its checkpoints copied so far are in {running[-1].results_dir}")
    return f"interrupted: tore down cluster {name} ({nodes}); no job was running"


def finished(results_dir: Path) -> bool:
    """The run there finished: nothing of it to resume."""
    record, _ = runs.read_run_file(results_dir, runs.RECORD)
    return record.get("status") == "finished"


def latest_checkpoint(name: str, job: JobSpec) -> Path:
    """The newest checkpoint the controller holds for this cluster name and task (or in RESULTS)."""
    root = Path(job.results) if job.results else runs.runs_root() / name
    pattern = home_checkpoint("" if job.results else f"{job.task}-*")  # one job's results, or each of the task's
    found = sorted((p for p in root.glob(str(pattern)) if not finished(results_dir_of(p))), key=lambda p: p.stat().st_mtime)
    if not found:
        raise UsageError(f"--resume: no checkpoint of {job.task} under {root}; run without --resume")
    console.print(f"resuming from {found[-1]}", markup=False)
    return found[-1]
