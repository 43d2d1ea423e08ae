"""A fine-tuning job's processes on the cluster: start it, follow it, finish it, cancel it.

The job runs detached on the head node (setsid + nohup), so it outlives the controller:
`ftc finetune` follows its output (Ctrl-C there stops the job, as it stops torchrun), `ftc logs -f`
reattaches (Ctrl-C there only detaches), `ftc cancel` stops it, `ftc fetch` copies the results.
"""

import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from rich.markup import escape

from provision import procs
from provision import state as st
from provision.bootstrap import load_facts
from provision.errors import ClusterBusy, FtcError, UsageError
from provision.launch import LaunchSpec, cluster_launch, render_launch
from provision.ssh import NodeSilent, connect, follow_silence_s, interruptible, put_text, run, stream
from provision.ui import answer, console
from provision.values import label, writable_dir

from . import runs
from .jobspec import JobSpec, metadata_endpoint, refuse_unreachable_inputs, train_args
from .node import glue
from .node.protocol import (
    CHECKPOINT_FILE,
    CHECKPOINTS_DIR,
    EXIT_CODE_FILE,
    EXIT_PREEMPTED,
    JOB_PREEMPTED,
    JOB_RUNNING,
    LAUNCH_SCRIPT,
    LOG_MARK_ENV,
    LOGS_DIR,
    OUTPUT_LOG,
    PREEMPTED_FILE,
    SCRIPT_OUTPUT_HOME,
    SCRIPT_WORKDIR,
    RankExit,
    first_failure,
    line_mark,
    parse_checkpoint,
    rank_log_path,
    ranks_alone,
    read_rank_exits,
)
from .node.script_rank import STOP_GRACE_S
from .plan import exchange_for, planned_steps
from .report import for_terminal, print_results, protocol_line, show_failure
from .script_job import output_bytes, remove_on_nodes, stop_run_processes
from .transfer import (
    content_digest,
    copy_checkpoint,
    data_files_on_nodes,
    fetch,
    folders_on_nodes,
    home_checkpoint,
    send_data_files,
    send_folders,
)

TAIL_LINES = 15  # of a failed script rank's log, shown when the job ends
FOREGROUND = "Ctrl-C stops it, as under torchrun (`--detach` starts one that runs on)"  # said as a job starts


def finetune(name: str, job: JobSpec, render_only: bool = False, resume: bool = False, detach: bool = False,
             resume_from: Path | None = None, one_shot: bool = False) -> int:
    """`resume`: continue the cluster's last job in place. `resume_from`: a checkpoint kept on the
    controller (a cluster that is gone): a new job on this cluster starts from it. `one_shot`: the
    caller tears the cluster down afterwards, so Ctrl-C stops rather than detaches."""
    state = st.load(name)
    facts = load_facts(state)
    if not render_only:
        refuse_dead_nodes(state)
    follow_silence_s()  # a bad FTC_FOLLOW_SILENCE_S is refused before the job starts, not when it is followed
    if resume and not resume_from:
        if not state.jobs:
            raise UsageError(f"--resume: cluster {name!r} has run no job yet; start one without --resume")
        job_id, remote_dir = state.jobs[-1].id, state.jobs[-1].remote_dir
        if not render_only:
            refuse_resume_without_checkpoint(state, job_id, remote_dir)
    else:
        job_id = f"{job.task}-{runs.utc_stamp()}"
        remote_dir = f"{state.head.workdir}/jobs/{job_id}"
    results_dir = job.results or (str(resume_from.parent.parent) if resume_from else
                                  state.jobs[-1].results_dir if resume else runs.default_results_dir(name, job_id))
    on_nodes, data_copies = data_files_on_nodes(job, state.provider, remote_dir)  # run.json keeps your own paths
    on_nodes, folder_copies = folders_on_nodes(on_nodes, state.provider, state.head.workdir)
    if not on_nodes.allreduce:  # auto: the faster exchange on this cluster's network, where ftc can weigh it
        spec_now = state.cluster_spec
        on_nodes = replace(on_nodes, allreduce=exchange_for(state.provider, spec_now.instance_type, len(state.nodes),
                                                            spec_now.ena_express, planned_steps(job, len(state.nodes))))
    try:
        what = Path(job.train_file).name if job.train_file else f"GLUE {job.task.upper()}"
        spec = cluster_launch(state, facts, f"fine-tune {job.model} on {what}", remote_dir,
                              "runner.node.train",
                              train_args(on_nodes, remote_dir, state.cluster_spec.stack, resume or resume_from is not None,
                                         metadata_endpoint(state.provider) if state.cluster_spec.spot else ""),
                              ppn=job.ppn or None, env={LOG_MARK_ENV: line_mark(job_id)}, flows=job.flows or None)
    except ValueError as exc:
        raise UsageError(f"{label('ppn')}={job.ppn}: {exc}") from None
    if on_nodes.allreduce == "comm-core" and spec.plan.threads < 2 and spec.nodes * spec.plan.ppn > 1:
        raise UsageError(f"{label('allreduce')}=comm-core keeps one of a rank's cores for gloo's threads, but each rank "
                         f"here has {spec.plan.threads} core; allowed: fewer {label('ppn')}, or {label('allreduce')}="
                         "after-backward or overlap")
    if render_only:
        print(render_launch(spec), end="")
        return 0
    refuse_unreachable_inputs(job, state.provider)
    settings = {**job_settings(job), "nodes": spec.nodes, "ranks_per_node": spec.plan.ppn,
                "threads_per_rank": spec.plan.threads, "flows": len(spec.gloo_iface.split(","))}
    if resume or resume_from:
        runs.refuse_other_job(results_dir, name, settings)
    writable_dir("results", results_dir)
    with runs.results_claimed(results_dir, check_unused=not (resume or resume_from)):
        state = start(state, spec, st.JobInfo(id=job_id, task=job.task, remote_dir=remote_dir, results_dir=results_dir,
                                              checkpoint_s3=job.checkpoint_s3), resume_from,
                      lambda locked: (send_folders(locked, folder_copies), send_data_files(locked, data_copies)))
        record = state.jobs[-1]
        runs.record_start(state, record, settings)
    console.print(f"job {job_id} started on {state.head.name} (pid {record.pid}); "
                  f"{spec.nodes} node(s) x {spec.plan.ppn} rank(s) x {spec.plan.threads} thread(s); "
                  + ("it runs on without this command" if detach else FOREGROUND), markup=False, soft_wrap=True)
    if detach:
        console.print(f"follow it with `ftc logs --name {name} -f`; stop it with `ftc cancel --name {name}`")
        return 0
    return follow(state, one_shot=one_shot, started_here=True)


def refuse_dead_nodes(state: st.ClusterState) -> None:
    """One connect attempt per node before a job launches: a node that does not answer is one line
    now, not a launch followed by minutes of retries."""
    advice = f"`ftc down --name {state.name}`, then `ftc up` makes the cluster anew"
    for node in state.nodes:
        with connect(state, node, attempts=1, next_step=advice):
            pass


def refuse_resume_without_checkpoint(state: st.ClusterState, job_id: str, remote_dir: str) -> None:
    """A job stopped before its first checkpoint has nothing to resume from: said now, not after the
    ranks have started and loaded the model."""
    with connect(state, state.head) as conn:
        held = run(conn, state.head, "resume", f"test -e {shlex.quote(remote_dir)}/{CHECKPOINT_FILE} && echo held || true")
    if not held.strip():
        raise UsageError(f"--resume: job {job_id} saved no checkpoint (it stopped before its first epoch ended); "
                         "start it anew without --resume")


def job_settings(job: JobSpec) -> dict:
    """What run.json records of a job's own settings (the cluster adds nodes, ranks and threads)."""
    return {"task": job.task, "model": job.model, "data_dir": job.data_dir, "train_file": job.train_file or None,
            "validation_file": job.validation_file or None, "precision": job.precision,
            "recipe": job.recipe, "epochs": job.epochs or None, "batch_size": job.batch_size or None,
            "lr": job.lr or None, "max_train_samples": job.max_train_samples or None, "dropout": job.dropout,
            "grad_compress": job.grad_compress or None, "seed": job.seed, "max_eval_samples": job.max_eval_samples or None,
            "text_columns": job.text_columns or None,
            "label_column": job.label_column or None, **data_digests(job)}


def data_digests(job: JobSpec) -> dict[str, str | None]:
    """The content of the rows the job trains and evaluates on (your files, or a local GLUE task's),
    each file's: a resume on changed data is another job. None for GLUE from the hub."""
    if job.train_file:
        files = [Path(job.train_file), Path(job.validation_file)]
    elif job.data_dir:
        files = [glue.split_file(job.data_dir, job.task, split) for split in ("train", "dev")]
    else:
        return {"train_sha256": None, "validation_sha256": None}
    return {f"{role}_sha256": content_digest(Path("/"), [f.absolute()]) for role, f in zip(("train", "validation"), files)}


def refuse_if_busy(state: st.ClusterState, ended: int | None = None) -> None:
    """One job at a time on a cluster: a running one is named, with how to follow or stop it. `ended`:
    the exit code of the job recorded running, when it has in fact ended (its results not home yet)."""
    running = [j for j in state.jobs if j.state == "running"]
    if running and ended is not None:
        raise ClusterBusy(f"cluster {state.name!r}: job {running[-1].id} ended (exit code {ended}) but its results are "
                         f"not home yet; `ftc fetch --name {state.name}` collects them, then start the next job")
    if running:
        raise ClusterBusy(f"cluster {state.name!r} is already running job {running[-1].id}; `ftc logs --name "
                         f"{state.name} -f` follows it, `ftc cancel --name {state.name}` stops it")


def start(loaded: st.ClusterState, spec: LaunchSpec, record: st.JobInfo, resume_from: Path | None,
          prepare: Callable[[st.ClusterState], None]) -> st.ClusterState:
    """`prepare` the nodes (data files, a script's workdir), put the launch script (and a checkpoint to
    resume from) on the head node and start it detached, under the cluster's lock and only if no other
    job runs; record it in the state. The state is read anew under the lock (another command may have
    started a job since `loaded` was read); the state so read, with the job last in it, is returned."""
    with st.locked(loaded.name, "launch" if record.kind == "script" else "finetune"):
        state = st.load(loaded.name)
        refuse_if_busy(state, ended_job_code(state))
        prepare(state)
        remote_dir, in_dir = record.remote_dir, shlex.quote(record.remote_dir)
        with connect(state, state.head) as conn:
            run(conn, state.head, "launch", f"mkdir -p {in_dir}/{LOGS_DIR} {in_dir}/{CHECKPOINTS_DIR}")
            put_text(conn, render_launch(spec), f"{remote_dir}/{LAUNCH_SCRIPT}", 0o755)
            if resume_from:
                interruptible(conn.client.get_transport(), conn.put, str(resume_from), f"{remote_dir}/{CHECKPOINT_FILE}")
            # The pid and its start time: only that process is ever signalled (a pid may be reused).
            # No start time: the script had already ended, and nothing of it is left to signal.
            pid, *started = run(conn, state.head, "launch",
                                f"cd {in_dir} && rm -f {EXIT_CODE_FILE} && (setsid nohup bash {LAUNCH_SCRIPT} "
                                f">> {OUTPUT_LOG} 2>&1 < /dev/null & pid=$!; echo $pid $({procs.START_OF.format(pid='$pid')}))"
                                ).split()
            record.pid, record.pid_start = int(pid), int(started[0]) if started else 0
        record.started_at, record.pids_by_node = time.time(), {state.head.name: [record.pid]}
        state.jobs = [j for j in state.jobs if j.id != record.id] + [record]
        st.save(state)
    return state


def follow(state: st.ClusterState, from_start: bool = True, one_shot: bool = False, started_here: bool = False) -> int:
    """Print the output of the state's last job until it ends; then fetch. Ctrl-C in the command that
    started the job (`started_here`) stops it, as Ctrl-C stops torchrun, and exits 130; in a follower
    (`ftc logs -f`) it detaches, the job runs on; in a one-shot run it stops the run. A cluster destroyed
    meanwhile ends the follower with that said."""
    name, job = state.name, state.jobs[-1]
    conn = connect(state, state.head, within_s=follow_silence_s(),
                   next_step=f"job {job.id} may still be running. Reattach when it answers: `ftc logs --name {name} -f`; "
                             f"`ftc status --name {name}` says what is up")
    colour, mark = sys.stdout.isatty(), line_mark(job.id)
    interrupted = False

    def on_line(line: str) -> None:
        print(for_terminal(line, colour), flush=True)
        logged = protocol_line(line, mark)
        if logged and parse_checkpoint(logged.message):
            copy_checkpoint(conn, job)
    try:
        stream(conn, f"tail -n {'+1' if from_start else '20'} -F --pid={job.pid} "
               f"{shlex.quote(job.remote_dir)}/{OUTPUT_LOG} 2>/dev/null", on_line, silence_s=follow_silence_s())
    except NodeSilent as exc:
        raise FtcError(f"{state.head.name} stopped answering ({exc}); job {job.id} may still be running. Reattach "
                       f"when it answers: `ftc logs --name {name} -f`; `ftc status --name {name}` says what is up"
                       ) from None
    except KeyboardInterrupt:
        if one_shot:
            raise
        if not started_here:
            console.print(f"\ndetached: job {job.id} keeps running on {state.head.name}. "
                          f"Reattach: `ftc logs --name {name} -f`; stop it: `ftc cancel --name {name}`")
            return 0
        interrupted = True
    finally:
        conn.close()
    if interrupted:
        return stop_on_interrupt(state, job)
    gone = FtcError(f"cluster {name} was destroyed while job {job.id} ran; what reached the controller "
                    f"is in {job.results_dir}")
    try:
        return finish(state, gone)
    except (ClusterBusy, UsageError):
        if destroyed(name):  # `ftc down` holds the lock, or took the state away
            raise gone from None
        if cancelled(name, job.id):  # `ftc cancel` stopped it, and brings its files home itself
            console.print(f"job {job.id} was cancelled (`ftc cancel`); what it wrote comes home with the cancel: "
                          f"`ftc runs show {job.id}`", markup=False, soft_wrap=True)
            return 0
        raise


def stop_on_interrupt(state: st.ClusterState, job: st.JobInfo) -> int:
    """Ctrl-C in the command that started the job: the job is stopped as `ftc cancel` stops it (what it
    wrote so far comes home), and the command exits 130, as torchrun does."""
    console.print(f"\ninterrupted: stopping job {job.id} (Ctrl-C stops a job started in the foreground, as under "
                  "torchrun; `--detach` starts one that runs on)", markup=False, soft_wrap=True)
    cancel(state.name)
    return 130


def cancelled(name: str, job_id: str) -> bool:
    """The job was cancelled, or `ftc cancel` is at work on the cluster now."""
    if "`ftc cancel`" in st.lock_holder(name):
        return True
    try:
        return any(j.id == job_id and j.state == "cancelled" for j in st.load(name).jobs)
    except (UsageError, st.CorruptState):
        return False


def destroyed(name: str) -> bool:
    """The cluster is gone, or `ftc down` is taking it apart (it marks the state first)."""
    try:
        return not st.exists(name) or st.load(name).phase == "terminating"
    except (UsageError, st.CorruptState):
        return False


def ended_job_code(state: st.ClusterState) -> int | None:
    """The exit code of the job recorded running, if it has in fact ended (nobody fetched it yet)."""
    running = [j for j in state.jobs if j.state == "running"]
    if not running:
        return None
    with connect(state, state.head) as conn:
        return job_exit_code(conn, state, running[-1])


def job_exit_code(conn, state: st.ClusterState, job: st.JobInfo) -> int | None:
    """The launch script's exit code; None while it runs; -1 if it died without writing one;
    EXIT_PREEMPTED when the job stopped itself for a spot interruption (mpirun's own code
    for that varies by MPI, so the program's PREEMPTED_FILE decides)."""
    in_dir = shlex.quote(job.remote_dir)
    out = run(conn, state.head, "status", f"cat {in_dir}/{EXIT_CODE_FILE} 2>/dev/null; "
              f"test -e {in_dir}/{PREEMPTED_FILE} && echo {JOB_PREEMPTED}; "
              f'[ "$({procs.START_OF.format(pid=job.pid)} 2>/dev/null)" = "{job.pid_start}" ] && echo {JOB_RUNNING} || true'
              ).split()
    if JOB_RUNNING in out:
        return None
    if JOB_PREEMPTED in out:
        return EXIT_PREEMPTED
    return int(out[0]) if out and out[0].lstrip("-").isdigit() else -1


def finish(loaded: st.ClusterState, gone: FtcError | None = None) -> int:
    """The job has ended: record how, fetch its files, print the outcome. The state is read anew under
    the lock (a `cancel` may have changed it since `loaded` was read). `gone`, when given, is raised
    for a cluster that `ftc down` is taking apart (it marks the state first)."""
    name = loaded.name
    with st.locked(name, "fetch"):
        state = st.load(name)
        if gone and state.phase == "terminating":
            raise gone
        job = state.jobs[-1]
        with connect(state, state.head) as conn:
            code = job_exit_code(conn, state, job)
        # an allocation that ended took the job with it, whatever its processes have yet to notice
        ended = nodes_ended_under(state) if code != 0 else []
        if code is None and not ended:
            raise FtcError(f"job {job.id} is still running; `ftc logs --name {name} -f` follows it")
        code = -1 if code is None else code
        if job.state == "running":
            job.state = {0: "finished", EXIT_PREEMPTED: "preempted"}.get(code, "failed")
            st.save(state)
        for line in ended if job.state == "failed" else []:
            console.print(f"[red]job {job.id}: {escape(line)}[/]", soft_wrap=True)
        runs.record_end(job.results_dir, "incomplete")  # until every file is home: a fetch cut short shows as such
        if job.kind == "script":  # what its script left running in a session of its own ends with it
            stop_run_processes(state, job.id)
        results = fetch(state, job)
        if job.kind == "script":
            remove_on_nodes(state, f"{job.remote_dir}/{SCRIPT_WORKDIR}")  # home now: the copies go
        if job.state == "cancelled":  # stopped on purpose: no failure to explain
            runs.record_end(results, job.state)
            console.print(f"job {job.id} was cancelled; what it wrote before is home: {results}", markup=False,
                          soft_wrap=True)
            return 0
        if job.kind == "script":
            exits = read_rank_exits(results)
            failed = first_failure(exits)
            code = failed.code if failed and code != 0 else code
            ended = {"ended_at": max(e.ended_at for e in exits)} if exits else {}  # not when it was fetched
            runs.record_end(results, job.state, exit_code=code, output_bytes=output_bytes(results), **ended)
            where = state.nodes[failed.rank // ranks_per_node(results)].name if failed else ""
            if not failed and ranks_alone(exits, len(state.nodes) * ranks_per_node(results)):
                console.print(f"[yellow]warning:[/] none of the {len(exits)} ranks exchanged anything with the "
                              "others (no DDP, FSDP or all_reduce): each ran the whole job alone, not as one "
                              "distributed job (a Trainer script on CPU needs `use_cpu=True` in its "
                              "TrainingArguments)", soft_wrap=True)
            return script_outcome(results, code, failed, where)
        runs.record_end(results, job.state)
    if code == EXIT_PREEMPTED:
        console.print(f"[yellow]job {job.id} stopped for a spot interruption, after a checkpoint "
                      f"({escape(str(home_checkpoint(results)))}); `ftc run --resume` continues it on a new cluster[/]")
        return code
    if code != 0:
        show_failure(results, code)
        return 1
    print_results(results)
    console.print(f"its report and plot: `ftc runs show {job.id}`; every run: `ftc runs`", markup=False)
    return 0


def nodes_ended_under(state: st.ClusterState) -> list[str]:
    """Where a scheduler lends the nodes, why they went from under a failed job: the scheduler's own words
    for the allocation's end (Slurm: its state and reason, TIMEOUT (TimeLimit)), once each; [] elsewhere,
    and while the allocation still runs."""
    from provision import providers
    if not providers.traits(state.provider).scheduler:
        return []
    return list(dict.fromkeys(live.detail for live in providers.query(state) if live.state != "running"))


def ranks_per_node(results: Path) -> int:
    record, _ = runs.read_run_file(results, runs.RECORD)
    return record.get("ranks_per_node") or 1


def script_outcome(results: Path, code: int, failed: RankExit | None, node: str) -> int:
    """A script's end: where its output is, or which rank failed first, on which node, with the last
    lines of its log. The exit code is that rank's (1 when mpirun's own failure left no rank's)."""
    if code == 0:
        output = results / SCRIPT_OUTPUT_HOME
        said = (f"rank 0's output: {output}" if output.exists() else "rank 0 wrote nothing into its output folder "
                "($FTC_OUTPUT_DIR), the one folder of the workdir's copy that comes home: have your script write "
                f"there, or name the folder it writes with {label('output')}")
        console.print(f"job finished; {said}; its log: {results / rank_log_path(0)}; every run: `ftc runs`",
                      markup=False, soft_wrap=True)
        return 0
    if failed is None:
        console.print(f"[red]job failed (exit code {code})[/] before any rank reported; mpirun's output: "
                      f"{escape(str(results / OUTPUT_LOG))}", soft_wrap=True)
        return code if 0 < code < 256 else 1
    log = results / rank_log_path(failed.rank)
    tail = log.read_text(errors="replace").splitlines()[-TAIL_LINES:] if log.exists() else []
    console.print(f"[red]rank {failed.rank} on node {escape(node)} failed first (exit code {failed.code})[/]; "
                  f"the last lines of its log ({escape(str(log))}):", soft_wrap=True)
    console.print("\n".join(for_terminal(line, colour=False) for line in tail), markup=False, soft_wrap=True)
    return failed.code if 0 < failed.code < 256 else 1


def logs(name: str, follow_output: bool = False) -> int:
    state = st.load(name)
    if not state.jobs:
        raise UsageError(f"cluster {name!r} has run no job yet; start one with `make finetune NAME={name}`")
    job = state.jobs[-1]
    if follow_output and job.state == "running":
        return follow(state)
    with connect(state, state.head, within_s=follow_silence_s()) as conn:
        output = run(conn, state.head, "logs", f"cat {shlex.quote(job.remote_dir)}/{OUTPUT_LOG}")
    colour = sys.stdout.isatty()
    print("".join(f"{for_terminal(line, colour)}\n" for line in output.splitlines()), end="")
    return 0


def cancel(name: str) -> int:
    with st.locked(name, "cancel"):
        state = st.load(name)
        running = [j for j in state.jobs if j.state == "running"]
        if not running:
            console.print(f"cluster {name!r} has no running job")
            return 0
        job = running[-1]
        with connect(state, state.head) as conn:
            ended = job_exit_code(conn, state, job)
            if ended is not None:  # nothing to stop, and its results are still to be had
                console.print(f"job {job.id} already ended (exit code {ended}); `ftc fetch --name {name}` collects "
                              "its results", markup=False)
                return 0
            # a script's ranks get the time to stop what it started (script_rank.STOP_GRACE_S) before SIGKILL
            grace = 2 if job.kind != "script" else STOP_GRACE_S + 5
            run(conn, state.head, "cancel", procs.stop_group_command(job.pid, job.pid_start, grace))
        if job.kind == "script":
            stop_run_processes(state, job.id)
        job.state = "cancelled"
        st.save(state)
        runs.record_end(job.results_dir, job.state)
    console.print(f"job {job.id} cancelled")
    return finish(state)  # what it wrote before, its logs included, comes home now: `down` would delete it


def fetch_last(name: str) -> int:
    state = st.load(name)
    if not state.jobs:
        raise UsageError(f"cluster {name!r} has run no job yet")
    return finish(state)


def describe_jobs(state: st.ClusterState, live: list) -> None:
    """The last job's line of `ftc status`; `live`: the provider's NodeStatus per node, head first."""
    if not state.jobs:
        return
    job = state.jobs[-1]
    line = f"last job {job.id}: {job.state}"
    head_now = live[0].state if live and state.nodes else "missing"
    if job.state == "running" and head_now not in ("running", "unknown"):  # its mpirun ran there: no one finishes it
        line = (f"last job {job.id}: lost (recorded running, but head node "
                f"{state.head.name if state.nodes else '-'} is {head_now})")
    elif job.state == "running":
        try:
            with connect(state, state.head, attempts=2) as conn:
                last = for_terminal(run(conn, state.head, "status",
                                        f"tail -n 1 {shlex.quote(job.remote_dir)}/{OUTPUT_LOG} 2>/dev/null").strip(), False)
                line += f" | {last}" if last else ""  # nothing written yet: no empty field
                code = job_exit_code(conn, state, job)
                if code is not None:
                    line += f" (ended with exit code {code}; `ftc fetch --name {state.name}` collects it)"
        except Exception as exc:  # noqa: BLE001 - status must print even when a node is gone
            line += f" (head node unreachable: {exc})"
    answer.print(line + f"; results: {job.results_dir}", markup=False, soft_wrap=True)
