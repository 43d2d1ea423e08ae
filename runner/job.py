"""A job's life, written once for every kind of job: start it, follow it, finish it, cancel it, show
its logs, fetch its results. A kind is a record (runner/finetune_job.py: ftc's own trainer;
runner/script_job.py: your script) that says what its ranks run and are given, what goes to the nodes
first, what run.json records of it and how its end is told; `ftc finetune` (`finetune` here) and `ftc
launch` (runner/cli.py) only build one and hand it to `run_job`.

The job runs detached on the head node (setsid + nohup), so it outlives the controller: the command
that started it follows its output (Ctrl-C there stops the job, as it stops torchrun), `ftc logs -f`
reattaches (Ctrl-C there only detaches), `ftc cancel` stops it, `ftc fetch` copies the results. Each
of these commands logs in to each node once and hands that connection from phase to phase (NodeConnections).
"""

import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from rich.markup import escape

from provision import procs
from provision import state as st
from provision.bootstrap import load_facts
from provision.errors import EXIT_INTERRUPTED, ClusterBusy, FtcError, UsageError
from provision.launch import RankLaunch, cluster_launch, render_launch
from provision.ssh import (
    NodeConnections,
    NodeSilent,
    connect,
    follow_silence_s,
    handed_or_own,
    interruptible,
    put_text,
    run,
    stream,
)
from provision.ui import answer, console
from provision.values import label, writable_dir

from . import runs
from .finetune_job import FinetuneJob
from .jobspec import JobSpec, spot_watch
from .node.facts import NodeFacts
from .node.protocol import (
    CHECKPOINT_FILE,
    CHECKPOINTS_DIR,
    EXIT_CODE_FILE,
    EXIT_PREEMPTED,
    JOB_PREEMPTED,
    JOB_RUNNING,
    LAUNCH_SCRIPT,
    LOGS_DIR,
    OUTPUT_LOG,
    PREEMPTED_FILE,
    SPOT_NOTICE_ENV,
    line_mark,
    parse_checkpoint,
)
from .report import for_terminal, protocol_line
from .script_job import ScriptJob
from .transfer import copy_checkpoint

FOREGROUND = "Ctrl-C stops it, as under torchrun (`--detach` starts one that runs on)"  # said as a job starts


class JobKind(Protocol):
    """What the life in this module asks of one kind of job (FinetuneJob, ScriptJob)."""
    kind: str  # as the cluster's state records it (JobInfo.kind)
    verb: str  # the ftc command that starts it, named by the cluster's lock while it starts
    program: str  # the module every rank runs
    stop_grace_s: int  # at a cancel, between the stop and SIGKILL
    ppn: int  # ranks per node; 0: the node facts' default
    flows: int  # gloo connections per peer; 0: the launch's default
    continues: bool  # it continues a run that its results directory holds
    checkpoint: Path | None  # a checkpoint on the controller that the job starts from

    def title(self) -> str: ...  # the launch script's description
    def said(self) -> str: ...  # what the line that says the job started adds of it
    def place(self, state: st.ClusterState, connections: NodeConnections, render_only: bool) -> st.JobInfo: ...
    def arguments(self, state: st.ClusterState, record: st.JobInfo) -> list[str]: ...
    def environment(self, state: st.ClusterState, record: st.JobInfo) -> dict[str, str]: ...
    def refuse(self, state: st.ClusterState, launch: RankLaunch, render_only: bool) -> None: ...
    def settings(self, launch: RankLaunch) -> dict: ...  # what run.json records of the job's own settings
    def prepare(self, state: st.ClusterState, record: st.JobInfo, connections: NodeConnections,
                facts: list[NodeFacts]) -> None: ...
    # Once it has started, a job is read back from the state: these are the kind's, not the record's.
    @staticmethod
    def stop_leftovers(state: st.ClusterState, job: st.JobInfo, connections: NodeConnections) -> None: ...
    @staticmethod
    def bring_home(state: st.ClusterState, job: st.JobInfo, connections: NodeConnections) -> Path: ...
    @staticmethod
    def outcome(state: st.ClusterState, job: st.JobInfo, results: Path, code: int) -> int: ...


KINDS: dict[str, type[JobKind]] = {FinetuneJob.kind: FinetuneJob, ScriptJob.kind: ScriptJob}


def finetune(name: str, job: JobSpec, render_only: bool = False, resume: bool = False, detach: bool = False,
             resume_from: Path | None = None, one_shot: bool = False, connections: NodeConnections | None = None) -> int:
    """`resume`: continue the cluster's last job in place. `resume_from`: a checkpoint kept on the
    controller (a cluster that is gone): a new job on this cluster starts from it. `one_shot`: the
    caller tears the cluster down at once on Ctrl-C (`ftc run`), so Ctrl-C is raised to it rather than
    stopping the job here first; it hands its `connections` too."""
    return run_job(name, FinetuneJob(job, resume, resume_from), render_only, detach, one_shot, connections)


def run_job(name: str, kind: JobKind, render_only: bool, detach: bool, one_shot: bool = False,
            connections: NodeConnections | None = None) -> int:
    """A job of any kind, from the checks to its end: the nodes answer, the launch is planned and
    checked (or only printed), the nodes are prepared and the job starts under the cluster's lock, and
    it is recorded; then followed unless detached. `connections`: the command's, where an earlier phase
    of it opened them (`ftc run`'s bootstrap); else a set of its own."""
    state = st.load(name)
    facts = load_facts(state)
    with handed_or_own(connections) as connections:
        if not render_only:
            refuse_dead_nodes(state, connections)
        follow_silence_s()  # a bad FTC_FOLLOW_SILENCE_S is refused before the job starts, not when it is followed
        record = kind.place(state, connections, render_only)
        rank_launch = planned_launch(state, facts, kind, record)
        kind.refuse(state, rank_launch, render_only)
        if render_only:
            print(render_launch(rank_launch), end="")
            return 0
        settings = {**kind.settings(rank_launch), "nodes": rank_launch.nodes, "ranks_per_node": rank_launch.plan.ppn,
                    "threads_per_rank": rank_launch.plan.threads}
        if kind.continues:
            runs.refuse_other_job(record.results_dir, name, settings)
        writable_dir("results", record.results_dir)
        with runs.results_claimed(record.results_dir, check_unused=not kind.continues):
            state = start(state, rank_launch, record, kind, connections,
                          lambda locked: kind.prepare(locked, record, connections, facts))
            record = state.jobs[-1]
            runs.record_start(state, record, settings)
        console.print(f"job {record.id} started on {state.head.name} (pid {record.pid}){kind.said()}; "
                      f"{rank_launch.nodes} node(s) x {rank_launch.plan.ppn} rank(s) x {rank_launch.plan.threads} thread(s); "
                      + ("it runs on without this command" if detach else FOREGROUND), markup=False, soft_wrap=True)
        if detach:
            console.print(f"follow it with `ftc logs --name {name} -f`; stop it with `ftc cancel --name {name}`",
                          markup=False)
            return 0
        return follow(state, connections, one_shot=one_shot, started_here=True)


def planned_launch(state: st.ClusterState, facts: list[NodeFacts], kind: JobKind, record: st.JobInfo) -> RankLaunch:
    """The launch of the job's ranks (provision/launch.py, the one launch builder), with the kind's
    program, arguments and environment, and on a spot cluster where its ranks read interruption notices."""
    watch = spot_watch(state.provider, state.cluster_spec.spot)
    env = {**kind.environment(state, record), **({SPOT_NOTICE_ENV: watch} if watch else {})}
    try:
        return cluster_launch(state, facts, kind.title(), record.remote_dir, kind.program,
                              kind.arguments(state, record), ppn=kind.ppn or None, env=env, flows=kind.flows or None)
    except ValueError as exc:
        raise UsageError(f"{label('ppn')}={kind.ppn}: {exc}") from None


def refuse_dead_nodes(state: st.ClusterState, connections: NodeConnections) -> None:
    """One connect attempt per node before a job launches: a node that does not answer is one line
    now, not a launch followed by minutes of retries. The connections serve the rest of the command. A
    connection handed from the command's bootstrap (`ftc run`) is the answer: its verification has just
    reached every node."""
    advice = f"`ftc down --name {state.name}`, then `ftc up` makes the cluster anew"
    for node in state.nodes:
        connections.to(state, node, attempts=1, next_step=advice)


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


def start(loaded: st.ClusterState, rank_launch: RankLaunch, record: st.JobInfo, kind: JobKind,
          connections: NodeConnections, prepare: Callable[[st.ClusterState], None]) -> st.ClusterState:
    """`prepare` the nodes (data files, a script's workdir), put the launch script (and a checkpoint to
    resume from) on the head node and start it detached, under the cluster's lock and only if no other
    job runs; record it in the state. The state is read anew under the lock (another command may have
    started a job since `loaded` was read); the state so read, with the job last in it, is returned."""
    with st.locked(loaded.name, kind.verb):
        state = st.load(loaded.name)
        refuse_if_busy(state, ended_job_code(state, connections))
        prepare(state)
        remote_dir, in_dir = record.remote_dir, shlex.quote(record.remote_dir)
        conn = connections.to(state, state.head)
        run(conn, state.head, "launch", f"mkdir -p {in_dir}/{LOGS_DIR} {in_dir}/{CHECKPOINTS_DIR}")
        put_text(conn, render_launch(rank_launch), f"{remote_dir}/{LAUNCH_SCRIPT}", 0o755)
        if kind.checkpoint:
            interruptible(conn.client.get_transport(), conn.put, str(kind.checkpoint), f"{remote_dir}/{CHECKPOINT_FILE}")
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


def follow(state: st.ClusterState, connections: NodeConnections, from_start: bool = True, one_shot: bool = False,
           started_here: bool = False) -> int:
    """Print the output of the state's last job until it ends; then fetch. Ctrl-C in the command that
    started the job (`started_here`) stops it, as Ctrl-C stops torchrun, and exits 130; in a follower
    (`ftc logs -f`) it detaches, the job runs on; in a one-shot run it stops the run. A cluster destroyed
    meanwhile ends the follower with that said."""
    name, job = state.name, state.jobs[-1]
    conn = connections.to(state, state.head, within_s=follow_silence_s(),
                          next_step=f"job {job.id} may still be running. Reattach when it answers: `ftc logs --name "
                                    f"{name} -f`; `ftc status --name {name}` says what is up")
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
    if interrupted:  # out of the handler: a second Ctrl-C while the job stops is not told as raised inside it
        return stop_on_interrupt(state, job, connections)
    gone = FtcError(f"cluster {name} was destroyed while job {job.id} ran; what reached the controller "
                    f"is in {job.results_dir}")
    try:
        return finish(state, connections, gone)
    except (ClusterBusy, UsageError):
        if destroyed(name):  # `ftc down` holds the lock, or took the state away
            raise gone from None
        if cancelled(name, job.id):  # `ftc cancel` stopped it, and brings its files home itself
            console.print(f"job {job.id} was cancelled (`ftc cancel`); what it wrote comes home with the cancel: "
                          f"`ftc runs show {job.id}`", markup=False, soft_wrap=True)
            return 0
        raise


def stop_on_interrupt(state: st.ClusterState, job: st.JobInfo, connections: NodeConnections) -> int:
    """Ctrl-C in the command that started the job: the job is stopped as `ftc cancel` stops it (what it
    wrote so far comes home), and the command exits 130, as torchrun does."""
    console.print(f"\ninterrupted: stopping job {job.id} (Ctrl-C stops a job started in the foreground, as under "
                  "torchrun; `--detach` starts one that runs on)", markup=False, soft_wrap=True)
    stop(state.name, connections)
    return EXIT_INTERRUPTED


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


def ended_job_code(state: st.ClusterState, connections: NodeConnections) -> int | None:
    """The exit code of the job recorded running, if it has in fact ended (nobody fetched it yet)."""
    running = [j for j in state.jobs if j.state == "running"]
    if not running:
        return None
    return job_exit_code(connections.to(state, state.head), state, running[-1])


def job_exit_code(conn, state: st.ClusterState, job: st.JobInfo) -> int | None:
    """The launch script's exit code; None while it runs; -1 if it died without writing one;
    EXIT_PREEMPTED when the job stopped itself for a spot interruption (mpirun's own code
    for that varies by MPI, so the program's PREEMPTED_FILE decides)."""
    in_dir = shlex.quote(job.remote_dir)
    # whether it runs first, then its files: a script that writes its code and exits between the two reads
    # is seen running, or ended with its code, never ended without one
    out = run(conn, state.head, "status",
              f'[ "$({procs.START_OF.format(pid=job.pid)} 2>/dev/null)" = "{job.pid_start}" ] && echo {JOB_RUNNING}; '
              f"cat {in_dir}/{EXIT_CODE_FILE} 2>/dev/null; "
              f"test -e {in_dir}/{PREEMPTED_FILE} && echo {JOB_PREEMPTED}; true").split()
    if JOB_RUNNING in out:
        return None
    if JOB_PREEMPTED in out:
        return EXIT_PREEMPTED
    return int(out[0]) if out and out[0].lstrip("-").isdigit() else -1


def finish(loaded: st.ClusterState, connections: NodeConnections, gone: FtcError | None = None,
           command: str = "fetch") -> int:
    """The job has ended: record how, bring its files home (its kind says which), tell the outcome. The
    state is read anew under the lock, which names `command` (a `cancel` may have changed it since
    `loaded` was read). `gone`, when given, is raised for a cluster that `ftc down` is taking apart (it
    marks the state first)."""
    name = loaded.name
    with st.locked(name, command):
        state = st.load(name)
        if gone and state.phase == "terminating":
            raise gone
        job = state.jobs[-1]
        kind = KINDS[job.kind]
        code = job_exit_code(connections.to(state, state.head), state, job)
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
        results = kind.bring_home(state, job, connections)
        if job.state == "cancelled":  # stopped on purpose: no failure to explain
            runs.record_end(results, job.state)
            console.print(f"job {job.id} was cancelled; what it wrote before is home: {results}", markup=False,
                          soft_wrap=True)
            return 0
        return kind.outcome(state, job, results, code)


def nodes_ended_under(state: st.ClusterState) -> list[str]:
    """Where a scheduler lends the nodes, why they went from under a failed job: the scheduler's own words
    for the allocation's end (Slurm: its state and reason, TIMEOUT (TimeLimit)), once each; [] elsewhere,
    and while the allocation still runs."""
    from provision import providers
    if not providers.traits(state.provider).scheduler:
        return []
    return list(dict.fromkeys(live.detail for live in providers.query(state) if live.state != "running"))


def logs(name: str, follow_output: bool = False) -> int:
    state = st.load(name)
    if not state.jobs:
        raise UsageError(f"cluster {name!r} has run no job yet; start one with `make finetune NAME={name}`")
    job = state.jobs[-1]
    with NodeConnections() as connections:
        if follow_output and job.state == "running":
            return follow(state, connections)
        conn = connections.to(state, state.head, within_s=follow_silence_s())
        output = run(conn, state.head, "logs", f"cat {shlex.quote(job.remote_dir)}/{OUTPUT_LOG}")
    colour = sys.stdout.isatty()
    print("".join(f"{for_terminal(line, colour)}\n" for line in output.splitlines()), end="")
    return 0


def cancel(name: str) -> int:
    with NodeConnections() as connections:
        return stop(name, connections)


def stop(name: str, connections: NodeConnections) -> int:
    """The running job stopped on every node, recorded cancelled, and what it wrote brought home."""
    with st.locked(name, "cancel"):
        state = st.load(name)
        running = [j for j in state.jobs if j.state == "running"]
        if not running:
            console.print(f"cluster {name!r} has no running job")
            return 0
        job = running[-1]
        kind = KINDS[job.kind]
        conn = connections.to(state, state.head)
        ended = job_exit_code(conn, state, job)
        if ended is not None:  # nothing to stop, and its results are still to be had
            console.print(f"job {job.id} already ended (exit code {ended}); `ftc fetch --name {name}` collects "
                          "its results", markup=False)
            return 0
        run(conn, state.head, "cancel", procs.stop_group_command(job.pid, job.pid_start, kind.stop_grace_s))
        kind.stop_leftovers(state, job, connections)
        job.state = "cancelled"
        st.save(state)
        runs.record_end(job.results_dir, job.state)
    console.print(f"job {job.id} cancelled")
    # what it wrote before, its logs included, comes home now: `down` would delete it
    return finish(state, connections, command="cancel")


def fetch_last(name: str) -> int:
    state = st.load(name)
    if not state.jobs:
        raise UsageError(f"cluster {name!r} has run no job yet")
    with NodeConnections() as connections:
        return finish(state, connections)


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
