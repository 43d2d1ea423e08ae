"""A fine-tuning job of ftc's own trainer (`ftc finetune`, `ftc run`, `ftc sweep`) as one kind of job:
what its ranks run and are given, what goes to the nodes before it starts, what run.json records of
it and how its end is told. runner/job.py lives its life: start, follow, finish, cancel.
"""

import dataclasses
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar

from rich.markup import escape

from provision import state as st
from provision.errors import UsageError
from provision.launch import RankLaunch
from provision.ssh import NodeConnections, run
from provision.ui import console
from provision.values import label

from . import kernels, runs
from .jobspec import JobSpec, refuse_unreachable_inputs, train_args
from .node import glue
from .node.facts import NodeFacts
from .node.protocol import CHECKPOINT_FILE, CHECKPOINTS_DIR, DATA_DIR, EXIT_PREEMPTED, LOG_MARK_ENV, line_mark
from .plan import exchange_for, planned_steps
from .report import print_results, show_failure
from .transfer import (
    content_digest,
    data_files_on_nodes,
    fetch,
    folders_on_nodes,
    home_checkpoint,
    results_dir_of,
    send_data_files,
    send_folders,
)

# JobSpec's settings that run.json keeps elsewhere (the launch's ranks and flows, its own directory),
# or that do not shape the job's numbers (the exchange's timing, where checkpoints are also copied).
RECORDED_APART = ("ppn", "flows", "results", "allreduce", "checkpoint_uri")
SAID_WHEN_EMPTY = ("data_dir",)  # '' says where: the hub; every other setting left empty is recorded as null


def job_settings(job: JobSpec) -> dict:
    """What run.json records of a job's own settings (the cluster adds nodes, ranks and threads): each
    JobSpec field but those RECORDED_APART, a number or name left unset (0, '') as null, and the
    content of its data."""
    recorded = {}
    for spec_field in dataclasses.fields(JobSpec):
        if spec_field.name in RECORDED_APART:
            continue
        value = getattr(job, spec_field.name)
        keep = spec_field.default is None or spec_field.name in SAID_WHEN_EMPTY  # None is unset; 0 is a value
        recorded[spec_field.name] = value if keep else value or None
    return {**recorded, **data_digests(job)}


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


def refuse_resume_without_checkpoint(state: st.ClusterState, job_id: str, remote_dir: str,
                                     connections: NodeConnections) -> None:
    """A job stopped before its first checkpoint has nothing to resume from: said now, not after the
    ranks have started and loaded the model."""
    conn = connections.to(state, state.head)
    held = run(conn, state.head, "resume", f"test -e {shlex.quote(remote_dir)}/{CHECKPOINT_FILE} && echo held || true")
    if not held.strip():
        raise UsageError(f"--resume: job {job_id} saved no checkpoint (it stopped before its first epoch ended); "
                         "start it anew without --resume")


@dataclass
class FinetuneJob:
    """`resume`: continue the cluster's last job in place. `resume_from`: a checkpoint kept on the
    controller (of a cluster that is gone): a new job on this cluster starts from it."""
    job: JobSpec
    resume: bool = False
    resume_from: Path | None = None
    on_nodes: JobSpec = field(init=False)  # the job as the nodes read it: its files' and folders' paths there
    data_copies: dict[str, str] = field(init=False, default_factory=dict)
    folder_copies: dict[str, tuple[Path, list[Path]]] = field(init=False, default_factory=dict)

    kind: ClassVar[str] = "finetune"
    verb: ClassVar[str] = "finetune"  # the ftc command that starts it
    program: ClassVar[str] = "runner.node.train"
    stop_grace_s: ClassVar[int] = 2  # between SIGTERM to the job's processes and SIGKILL, at a cancel

    @property
    def continues(self) -> bool:
        """The job continues a run whose results directory holds it."""
        return self.resume or self.resume_from is not None

    @property
    def checkpoint(self) -> Path | None:
        return self.resume_from

    @property
    def ppn(self) -> int:
        return self.job.ppn

    @property
    def flows(self) -> int:
        return self.job.flows

    def title(self) -> str:
        what = Path(self.job.train_file).name if self.job.train_file else f"GLUE {self.job.task.upper()}"
        return f"fine-tune {self.job.model} on {what}"

    def said(self) -> str:
        return ""

    def place(self, state: st.ClusterState, connections: NodeConnections, render_only: bool) -> st.JobInfo:
        """The job's id and directories (the last job's own, resumed in place), and where the nodes read
        its inputs."""
        job = self.job
        if self.resume and not self.resume_from:
            if not state.jobs:
                raise UsageError(f"--resume: cluster {state.name!r} has run no job yet; start one without --resume")
            job_id, remote_dir = state.jobs[-1].id, state.jobs[-1].remote_dir
            if not render_only:
                refuse_resume_without_checkpoint(state, job_id, remote_dir, connections)
        else:
            job_id = f"{job.task}-{runs.utc_stamp()}"
            remote_dir = f"{state.head.workdir}/jobs/{job_id}"
        results_dir = job.results or (str(results_dir_of(self.resume_from)) if self.resume_from else
                                      state.jobs[-1].results_dir if self.resume else
                                      runs.default_results_dir(state.name, job_id))
        on_nodes, self.data_copies = data_files_on_nodes(job, state.provider, remote_dir)  # run.json keeps your own
        on_nodes, self.folder_copies = folders_on_nodes(on_nodes, state.provider, state.head.workdir)
        if not on_nodes.allreduce:  # auto: the faster exchange on this cluster's network, where ftc can weigh it
            spec_now = state.cluster_spec
            on_nodes = replace(on_nodes, allreduce=exchange_for(state.provider, spec_now.instance_type,
                                                                len(state.nodes), spec_now.express,
                                                                planned_steps(job, len(state.nodes))))
        self.on_nodes = on_nodes
        return st.JobInfo(id=job_id, task=job.task, remote_dir=remote_dir, results_dir=results_dir,
                          checkpoint_uri=job.checkpoint_uri)

    def arguments(self, state: st.ClusterState, record: st.JobInfo) -> list[str]:
        return train_args(self.on_nodes, record.remote_dir, state.cluster_spec.stack, self.continues)

    def environment(self, state: st.ClusterState, record: st.JobInfo) -> dict[str, str]:
        return {LOG_MARK_ENV: line_mark(record.id)}

    def refuse(self, state: st.ClusterState, launch: RankLaunch, render_only: bool) -> None:
        """What the planned launch cannot run; and, before a real start, inputs the nodes cannot reach."""
        if self.on_nodes.allreduce == "comm-core" and launch.plan.threads < 2 and launch.nodes * launch.plan.ppn > 1:
            raise UsageError(f"{label('allreduce')}=comm-core keeps one of a rank's cores for gloo's threads, but each "
                             f"rank here has {launch.plan.threads} core; allowed: fewer {label('ppn')}, or "
                             f"{label('allreduce')}=after-backward or overlap")
        if not render_only:
            refuse_unreachable_inputs(self.job, state.provider)

    def settings(self, launch: RankLaunch) -> dict:
        return {**job_settings(self.job), "flows": len(launch.gloo_iface.split(","))}

    def prepare(self, state: st.ClusterState, record: st.JobInfo, connections: NodeConnections,
                facts: list[NodeFacts]) -> None:
        """Under the cluster's lock, before the start: the model and data folders, your data files, and the
        kernels earlier clusters compiled, on every node that does not hold them."""
        send_folders(state, self.folder_copies, connections)
        send_data_files(state, self.data_copies, connections)
        kernels.ship(state, connections)

    # ---- once it has started: for a job read back from the cluster's state ----------------------------

    @staticmethod
    def stop_leftovers(state: st.ClusterState, job: st.JobInfo, connections: NodeConnections) -> None:
        """Nothing: the trainer's processes all belong to the launch's process group, which the stop ends."""

    @staticmethod
    def head_file_home(job: st.JobInfo, relative: str) -> str | None:
        """Where a file of the job's directory on the head lands under its results directory: where it
        is, but for the data files sent to the nodes (you have them) and checkpoints older than the
        last (None: they stay). Pure."""
        if relative.startswith(f"{DATA_DIR}/"):
            return None
        return None if relative.startswith(f"{CHECKPOINTS_DIR}/") and relative != CHECKPOINT_FILE else relative

    @staticmethod
    def worth_walking(job: st.JobInfo, relative_dir: str) -> bool:
        """Every folder of the job's directory may hold a file that comes home. Pure."""
        return True

    @staticmethod
    def bring_home(state: st.ClusterState, job: st.JobInfo, connections: NodeConnections) -> Path:
        """The job's files, and its compiled kernels moved on into FTC_HOME for the next cluster."""
        results = fetch(state, job, connections, FinetuneJob)
        kernels.bring_home(results)
        return results

    @staticmethod
    def outcome(state: st.ClusterState, job: st.JobInfo, results: Path, code: int) -> int:
        """The end of a job that was not cancelled, recorded and told: a spot stop and how to resume it,
        a failure and its logs, or the results."""
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
