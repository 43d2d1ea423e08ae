"""A job's files, brought home to the controller: each checkpoint as its epoch ends (and to S3 when
asked), and the results once the job is over (results.json, the model, output.log, every node's
rank logs).
"""

import errno
import hashlib
import os
import shlex
import shutil
import stat
import tarfile
import tempfile
import threading
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Protocol

from provision import providers
from provision import state as st
from provision.errors import FtcError
from provision.launch import node_path
from provision.providers import traits
from provision.ssh import NodeConnections, follow_silence_s, interruptible, run
from provision.ui import console

from .jobspec import JobSpec
from .node import glue
from .node.protocol import CHECKPOINT_FILE, DATA_DIR, LOGS_DIR

# Room kept free beyond the results themselves: run.json's rewrite, the report and its plot.
SPACE_MARGIN = 2**20


def connection_lost() -> tuple[type[Exception], ...]:
    """What a dropped ssh connection raises mid-copy: paramiko's "Server connection dropped" is an
    SSHException, not an OSError. (A function: paramiko is imported only once a copy has begun, see
    provision/ssh.py.)"""
    import paramiko
    return OSError, EOFError, paramiko.SSHException


def data_files_on_nodes(job: JobSpec, provider: str, remote_dir: str) -> tuple[JobSpec, dict[str, str]]:
    """Where the nodes read a custom job's data files, and what must be copied there (node path ->
    controller path). Local nodes are this machine: they read the controller's own files. Any other
    node gets a copy in the job's directory, named by role: both files may have the same name. The
    paths are the head's; each node's copy lies in its own job directory (provision.launch.node_path)."""
    if not job.train_file or traits(provider).shares_this_machine:
        return job, {}
    copies = {f"{remote_dir}/{DATA_DIR}/{role}{Path(local).suffix}": local
              for role, local in (("train", job.train_file), ("validation", job.validation_file))}
    train, validation = copies
    return replace(job, train_file=train, validation_file=validation), copies


def send_data_files(state: st.ClusterState, copies: dict[str, str], connections: NodeConnections) -> None:
    """Copy each file to every node, into its own job directory (the copy is whole before the job starts)."""
    for node in state.nodes if copies else []:
        on_node = {node_path(state, node, remote): local for remote, local in copies.items()}
        conn = connections.to(state, node)
        run(conn, node, "send data", "mkdir -p " + " ".join(sorted({shlex.quote(str(Path(r).parent)) for r in on_node})))
        for remote, local in on_node.items():
            interruptible(conn.client.get_transport(), conn.put, local, remote)


def folders_on_nodes(job: JobSpec, provider: str, head_workdir: str) -> tuple[JobSpec, dict[str, tuple[Path, list[Path]]]]:
    """Where nodes that are not this machine read a local model directory and a local GLUE directory
    (its task's folder only): a copy in the cluster's cache, `<workdir>/cache/<kind>-<content hash>`,
    sent once per content, in each node's own workdir (these are the head's paths: node_path). Node
    path -> (local folder, its files).
    Local nodes read them where they are."""
    if traits(provider).shares_this_machine:
        return job, {}
    copies: dict[str, tuple[Path, list[Path]]] = {}
    if Path(job.model).is_dir():
        files = sorted(p for p in Path(job.model).rglob("*") if p.is_file())
        node = f"{head_workdir}/cache/model-{content_digest(Path(job.model), files)}"
        copies[node] = (Path(job.model), files)
        job = replace(job, model=node)
    if job.data_dir:
        files = [glue.split_file(job.data_dir, job.task, split) for split in ("train", "dev")]
        node = f"{head_workdir}/cache/glue-{content_digest(Path(job.data_dir), files)}"
        copies[node] = (Path(job.data_dir), files)
        job = replace(job, data_dir=node)
    return job, copies


def content_digest(root: Path, files: list[Path]) -> str:
    """A folder's files, by relative path and content: the cache key of its copy on the nodes."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(2**20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def send_folders(state: st.ClusterState, copies: dict[str, tuple[Path, list[Path]]],
                 connections: NodeConnections) -> None:
    """Each folder to every node that does not hold it whole yet (a marker written last says so),
    after a check of the node's free space: unpacked beside, then moved into place."""
    for node in state.nodes if copies else []:
        conn = connections.to(state, node)
        for head_path, (root, files) in copies.items():
            remote = node_path(state, node, head_path)
            quoted = shlex.quote(remote)
            if run(conn, node, "send folder", f"test -e {quoted}/{FOLDER_COMPLETE} && echo HELD || true").strip():
                continue
            size = sum(p.stat().st_size for p in files)
            parent = shlex.quote(str(PurePosixPath(remote).parent))
            free = int(run(conn, node, "send folder", f"mkdir -p {parent} && df -Pk {parent} | tail -n 1")
                       .split()[3]) * 1024
            if size + SPACE_MARGIN > free:
                raise FtcError(f"{root} needs {_mb(size + SPACE_MARGIN)} on {node.name}, which has {_mb(free)} free "
                               "there; free some space on the node (or use a bigger root volume) and run again")
            console.print(f"copying {root} ({_mb(size)}) to {node.name}", markup=False, soft_wrap=True)
            send_tree(conn, node, {path.relative_to(root).as_posix(): path for path in files}, remote)
            run(conn, node, "send folder", f"touch {quoted}/{FOLDER_COMPLETE}")


FOLDER_COMPLETE = ".ftc-complete"  # in a folder copied to a node: the copy is whole


def send_tree(conn, node: st.NodeInfo, files: dict[str, Path], remote: str) -> None:
    """`files` (path in the folder -> local file) into the node's folder `remote`: one tar through
    SFTP, unpacked beside and moved into place, so a copy cut short leaves no folder that looks whole."""
    quoted, partial = shlex.quote(remote), shlex.quote(f"{remote}.partial")
    with tempfile.TemporaryDirectory(prefix="ftc-send-") as scratch:
        tarball = Path(scratch) / "folder.tar"
        with tarfile.open(tarball, "w", dereference=True) as tar:  # a link to a file goes as the file
            for name, path in files.items():
                tar.add(path, arcname=name, recursive=False)
        run(conn, node, "send folder", f"rm -rf {partial} && mkdir -p {partial}")
        interruptible(conn.client.get_transport(), conn.put, str(tarball), f"{remote}.tar")
    run(conn, node, "send folder", f"tar -xf {quoted}.tar -C {partial} && rm -f {quoted}.tar && "
                                   f"rm -rf {quoted} && mv {partial} {quoted}")


def home_checkpoint(results_dir: str | Path) -> Path:
    """Where the controller keeps a job's last checkpoint: what `ftc run --resume` starts from."""
    return Path(results_dir) / CHECKPOINT_FILE


def results_dir_of(checkpoint: Path) -> Path:
    """The results directory whose checkpoint this is (home_checkpoint's inverse). Pure."""
    return checkpoint.parents[len(PurePosixPath(CHECKPOINT_FILE).parts) - 1]


def copy_checkpoint(conn, job: st.JobInfo) -> Path | None:
    """The head node's last checkpoint (while the job runs), to home_checkpoint on the controller
    (atomically), and to CHECKPOINT_URI's store when given (again for one already home: a follower that
    reattaches reads the lines of earlier checkpoints again, which retries an upload that failed). None
    when there is none yet, when the controller's disk has no room for it (measured first: no copy
    starts that would fill it), or when the copy failed mid-way: that is said in one line, and the job
    goes on (the next checkpoint, or the fetch at the job's end, brings it)."""
    target = home_checkpoint(job.results_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    later = "the next checkpoint, or the fetch when the job ends, brings it"

    def bring_home() -> bool:
        sftp = conn.sftp()
        sftp.get_channel().settimeout(follow_silence_s())  # a node that freezes mid-copy does not hang the follower
        try:
            info = sftp.stat(f"{job.remote_dir}/{CHECKPOINT_FILE}")
        except FileNotFoundError:
            return False  # no epoch has ended yet
        if not _is_home(target, info):  # else copied when its epoch ended
            short = _no_room(info.st_size, target.parent)
            if short:
                console.print(f"the checkpoint of job {job.id} {short}: not copied, the job goes on; free some space: "
                              f"{later}", style="yellow", markup=False, soft_wrap=True)
                return False
            _copy_whole(sftp, f"{job.remote_dir}/{CHECKPOINT_FILE}", target, info)
        return True
    try:
        if not interruptible(conn.client.get_transport(), bring_home):  # Ctrl-C: the follower detaches
            return None
    except connection_lost() as exc:
        console.print(f"copying the checkpoint of job {job.id} home failed ({_why(exc)}); {later}",
                      style="yellow", markup=False, soft_wrap=True)
        return None
    if job.checkpoint_uri:
        providers.store_checkpoint(target, job.checkpoint_uri, job.id)  # the store's provider (aws: S3) copies it
    return target


def _no_room(size: int, directory: Path) -> str:
    """Why `size` bytes (and SPACE_MARGIN) do not fit in `directory`, in words; '' when they do."""
    needed, free = size + SPACE_MARGIN, shutil.disk_usage(directory).free
    return f"needs {_mb(needed)} in {directory}, which has {_mb(free)} free" if needed > free else ""


def _why(exc: Exception) -> str:
    return "no space left" if getattr(exc, "errno", None) == errno.ENOSPC else f"{type(exc).__name__}: {exc}"


def _is_home(target: Path, info) -> bool:
    """The node's file is already at `target`: a finished copy carries the node's size and mtime."""
    try:
        here = target.stat()
    except FileNotFoundError:
        return False
    return (here.st_size, int(here.st_mtime)) == (info.st_size, info.st_mtime)


def _copy_whole(sftp, remote: str, target: Path, info) -> None:
    """`remote` to `target` through `<target>.partial`: a copy cut short (a full disk, a lost
    connection, an interrupt) leaves nothing behind that looks complete."""
    partial = target.with_name(target.name + ".partial")
    before = set(threading.enumerate())
    try:
        sftp.get(remote, str(partial))
        os.utime(partial, (info.st_atime, info.st_mtime))
    except BaseException:
        partial.unlink(missing_ok=True)
        _let_prefetch_end(before)
        raise
    partial.replace(target)


def _let_prefetch_end(before: set[threading.Thread]) -> None:
    """paramiko's get() sends its read requests from a thread of its own; a copy that failed (a full
    disk) may leave it still sending, and closing the connection under it prints its traceback. It
    ends by itself once its requests are sent: wait for that (a bounded wait, for a dead connection)."""
    for thread in set(threading.enumerate()) - before:
        if "_prefetch_thread" in thread.name:
            thread.join(follow_silence_s())


def nodes_with_own_files(state: st.ClusterState) -> list[st.NodeInfo]:
    """The nodes whose job directories are their own: every node, or the head alone where the nodes
    share this machine (its copy serves them all)."""
    return [state.head] if traits(state.provider).shares_this_machine else state.nodes


class WhatComesHome(Protocol):
    """A kind of job's rule (its record's) for which of the head's files come home, and where."""

    @staticmethod
    def head_file_home(job: st.JobInfo, relative: str) -> str | None: ...

    @staticmethod
    def worth_walking(job: st.JobInfo, relative_dir: str) -> bool: ...


def comes_home_as(kind: WhatComesHome, job: st.JobInfo, relative: str, on_head: bool) -> str | None:
    """Where a file of the job's directory lands under its results directory (None: it stays on the
    node): every node's rank logs, and the head's files by the kind's rule. Pure."""
    if relative.startswith(f"{LOGS_DIR}/"):
        return relative
    return kind.head_file_home(job, relative) if on_head else None


def worth_walking(kind: WhatComesHome, job: st.JobInfo, relative_dir: str) -> bool:
    """Whether a folder of the job's directory may hold a file that comes home (comes_home_as). Pure."""
    return relative_dir == LOGS_DIR or kind.worth_walking(job, relative_dir)


def fetch(state: st.ClusterState, job: st.JobInfo, connections: NodeConnections, kind: WhatComesHome) -> Path:
    """Copy what comes home of the job that is not home yet: every node's rank logs, and the head's
    files by its kind's rule (`kind.head_file_home`; for a fine-tuning job results.json, the model,
    output.log and the last checkpoint, to CHECKPOINT_URI's store too, when given). All that is
    missing is measured, by the sizes the nodes report, against the free space first: too little is
    refused before anything is copied. Each file arrives whole or not at all (_copy_whole), so a fetch
    cut short is finished by `ftc fetch`, which copies only what is missing."""
    target = Path(job.results_dir)
    target.mkdir(parents=True, exist_ok=True)
    again = f"`ftc fetch --name {state.name}` copies what is missing"
    missing = []
    for node in nodes_with_own_files(state):
        sftp = connections.to(state, node).sftp()
        job_dir = node_path(state, node, job.remote_dir)  # each node's own
        for remote, info in _walk(sftp, job_dir, lambda d, job_dir=job_dir: worth_walking(kind, job, d[len(job_dir) + 1:])):
            relative = remote[len(job_dir) + 1:]
            home = comes_home_as(kind, job, relative, node is state.head)
            if stat.S_ISLNK(info.st_mode):
                if home or worth_walking(kind, job, relative):
                    console.print(f"not fetched: {remote} on {node.name} (a symbolic link: ftc brings files home, "
                                  "not links; write the file itself there)", style="yellow", markup=False, soft_wrap=True)
            elif home and not _is_home(target / home, info):
                missing.append((node, sftp, remote, target / home, info))
    short = _no_room(sum(info.st_size for *_, info in missing), target)
    if short:
        raise FtcError(f"the results of job {job.id} {short.replace('needs', 'need', 1)}: nothing copied, "
                       f"the run is marked incomplete; free some space, then {again}")
    for node, sftp, remote, local, info in missing:
        local.parent.mkdir(parents=True, exist_ok=True)
        try:
            interruptible(sftp.get_channel().get_transport(), _copy_whole, sftp, remote, local, info)
        except FileNotFoundError:  # removed on the node since it was listed: nothing of it to bring
            console.print(f"not fetched: {remote} on {node.name} (gone since it was listed)", style="yellow",
                          markup=False, soft_wrap=True)
        except connection_lost() as exc:
            raise FtcError(f"copying {remote} from {node.name} to {local} failed ({_why(exc)}); the run is marked "
                           f"incomplete and no file is left half-copied: {again}") from None
    if job.checkpoint_uri and home_checkpoint(target).exists():
        providers.store_checkpoint(home_checkpoint(target), job.checkpoint_uri, job.id)
    return target


def _mb(size: int) -> str:
    return f"{size / 2**20:.1f} MB"


def _walk(sftp, directory: str, worth=lambda _directory: True):
    """Every regular file and symbolic link under `directory` on the node, with its attributes (size,
    mtime, mode), in the folders `worth` accepts. Links are not followed (one to `/` would bring the
    node home); a folder holding a name that is not UTF-8 is left out, said on stderr."""
    try:
        entries = sftp.listdir_attr(directory)
    except UnicodeDecodeError:
        console.print(f"not fetched: {directory} (a name in it is not UTF-8)", style="yellow", markup=False,
                      soft_wrap=True)
        return
    except OSError:
        return
    for entry in entries:
        path = f"{directory}/{entry.filename}"
        if stat.S_ISDIR(entry.st_mode):
            if worth(path):
                yield from _walk(sftp, path, worth)
        elif stat.S_ISREG(entry.st_mode) or stat.S_ISLNK(entry.st_mode):
            yield path, entry
