"""A job's files, brought home to the controller: each checkpoint as its epoch ends (and to S3 when
asked), and the results once the job is over (results.json, the model, output.log, every node's
rank logs).
"""

import os
import stat
from pathlib import Path

import paramiko

from provision import state as st
from provision.ssh import connect, follow_silence_s
from provision.ui import console

# What a dropped ssh connection raises mid-copy: paramiko's "Server connection dropped" is an
# SSHException, not an OSError.
CONNECTION_LOST = (OSError, EOFError, paramiko.SSHException)


def home_checkpoint(results_dir: str | Path) -> Path:
    """Where the controller keeps a job's last checkpoint: what `ftc run --resume` starts from."""
    return Path(results_dir) / "checkpoints" / "last.pt"


def copy_checkpoint(conn, job: st.JobInfo) -> Path | None:
    """The head node's last checkpoint, to home_checkpoint on the controller (atomically), and to
    CHECKPOINT_S3 when given. None when there is none yet, or when the connection failed mid-copy:
    that is said, and the job goes on (the next checkpoint, or the copy at the job's end, brings it)."""
    target = home_checkpoint(job.results_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    try:
        sftp = conn.sftp()
        sftp.get_channel().settimeout(follow_silence_s())  # a node that freezes mid-copy does not hang the follower
        copied = _copy_if_newer(sftp, f"{job.remote_dir}/checkpoints/last.pt", target, partial)
    except CONNECTION_LOST as exc:
        partial.unlink(missing_ok=True)
        console.print(f"copying the checkpoint of job {job.id} home failed ({type(exc).__name__}: {exc}); "
                      "the next checkpoint, or the copy when the job ends, brings it", style="yellow", markup=False)
        return None
    if copied and job.checkpoint_s3:
        _upload(copied, job)
    return copied


def _copy_if_newer(sftp, remote: str, target: Path, partial: Path) -> Path | None:
    try:
        info = sftp.stat(remote)
    except FileNotFoundError:
        return None  # no epoch has ended yet
    if target.exists() and (target.stat().st_size, int(target.stat().st_mtime)) == (info.st_size, info.st_mtime):
        return target  # already home: copied when its epoch ended (the copy carries the node's mtime)
    sftp.get(remote, str(partial))
    os.utime(partial, (info.st_atime, info.st_mtime))
    partial.replace(target)
    return target


def _upload(checkpoint: Path, job: st.JobInfo) -> None:
    import boto3
    bucket, _, prefix = job.checkpoint_s3[len("s3://"):].partition("/")
    key = f"{prefix}/{job.id}/last.pt" if prefix else f"{job.id}/last.pt"
    boto3.session.Session().client("s3").upload_file(str(checkpoint), bucket, key)


def fetch(state: st.ClusterState, job: st.JobInfo) -> Path:
    """Copy results.json, the model, output.log and every node's rank logs (not checkpoints)."""
    target = Path(job.results_dir)
    target.mkdir(parents=True, exist_ok=True)
    for node in state.nodes if state.provider != "local" else [state.head]:
        with connect(state, node) as conn:
            sftp = conn.sftp()
            for remote in _walk(sftp, job.remote_dir):
                relative = remote[len(job.remote_dir) + 1:]
                if relative.startswith("checkpoints/") or (node is not state.head and not relative.startswith("logs/")):
                    continue
                (target / relative).parent.mkdir(parents=True, exist_ok=True)
                sftp.get(remote, str(target / relative))
    return target


def _walk(sftp, directory: str):
    try:
        entries = sftp.listdir_attr(directory)
    except OSError:
        return
    for entry in entries:
        path = f"{directory}/{entry.filename}"
        if stat.S_ISDIR(entry.st_mode):
            yield from _walk(sftp, path)
        else:
            yield path
