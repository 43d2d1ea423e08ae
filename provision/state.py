"""Cluster state: plain dataclasses, saved as JSON under $FTC_HOME/clusters/<name>/.

The state is written atomically (temp file + rename) before and after every step
that creates or deletes something, so whatever interrupts ftc, the file on disk
names every resource that may exist and `ftc down` can clean it up.
"""

import fcntl
import json
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .errors import ClusterBusy, UsageError
from .spec import ClusterSpec


@dataclass
class NodeInfo:
    index: int
    name: str  # <cluster>-<index>: how nodes reach each other
    id: str  # EC2 instance id, or "local-<index>"
    public_ip: str  # what the controller connects to
    private_ip: str  # what the nodes use among themselves
    ssh_user: str
    ssh_port: int = 22
    cores: list[int] = field(default_factory=list)  # local: the CPUs its sshd is pinned to
    workdir: str = ""  # where ftc keeps the node's files (venv, hostfile, facts, jobs)
    authorized_keys: str = ""  # the file the node's sshd reads keys from
    zone: str = ""
    pid: int = 0  # local: the sshd's pid; 0 on AWS
    host_key: str = ""  # "<type> <base64>", pinned at first contact


@dataclass
class JobInfo:
    id: str
    task: str
    remote_dir: str  # on the head node
    results_dir: str  # on the controller
    pid: int = 0  # of the detached launch script on the head node
    pid_start: int = 0  # its start time (clock ticks since boot): only that process is ever signalled
    state: str = "running"  # running | finished | failed | cancelled
    started_at: float = 0.0
    pids_by_node: dict[str, list[int]] = field(default_factory=dict)
    checkpoint_s3: str = ""  # s3://bucket/prefix that each checkpoint is also copied to


@dataclass
class ClusterState:
    name: str
    provider: str
    spec: dict[str, Any]
    phase: str = "launching"  # launching -> running -> bootstrapped; terminating; `down` starts from any
    resources: dict[str, Any] = field(default_factory=dict)  # every id created, by kind
    nodes: list[NodeInfo] = field(default_factory=list)
    created_at: float = field(default_factory=time.time)
    bootstrapped_at: float = 0.0
    stack_python: str = ""  # the Python of the installed stack, same path on every node
    jobs: list[JobInfo] = field(default_factory=list)

    @property
    def cluster_spec(self) -> ClusterSpec:
        return ClusterSpec.from_dict(self.spec)

    @property
    def head(self) -> NodeInfo:
        return self.nodes[0]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ClusterState":
        """Raises ValueError for anything but the shape `to_json` writes (any JSON may be on disk)."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"a JSON object was expected, not {type(data).__name__}")
        for key, kind in (("name", str), ("provider", str), ("spec", dict), ("resources", dict), ("nodes", list),
                          ("jobs", list)):
            if key in data and not isinstance(data[key], kind):
                raise ValueError(f"{key!r} should be a {kind.__name__}, not {type(data[key]).__name__}")
        for key in ("nodes", "jobs"):
            if not all(isinstance(item, dict) for item in data.get(key, [])):
                raise ValueError(f"every item of {key!r} should be an object")
        data["nodes"] = [NodeInfo(**n) for n in data.get("nodes", [])]
        data["jobs"] = [JobInfo(**j) for j in data.get("jobs", [])]
        return cls(**data)


def ftc_home() -> Path:
    return Path(os.environ.get("FTC_HOME") or Path.home() / ".ftc")


def cluster_dir(name: str) -> Path:
    return ftc_home() / "clusters" / name


def state_path(name: str) -> Path:
    return cluster_dir(name) / "state.json"


def access_key_path(name: str) -> Path:
    """The controller's private key for the nodes (the EC2 key pair on AWS)."""
    return cluster_dir(name) / "keys" / "access"


def internal_key_path(name: str) -> Path:
    """The cluster-internal key, installed on every node for node-to-node ssh."""
    return cluster_dir(name) / "keys" / "internal"


def known_hosts_path(name: str) -> Path:
    return cluster_dir(name) / "known_hosts"


def save(state: ClusterState) -> None:
    """Atomic: a reader sees the old file or the new one, never half of one."""
    path = state_path(state.name)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with open(tmp, "w") as fh:
        fh.write(state.to_json())
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class CorruptState(Exception):
    pass


def load(name: str) -> ClusterState:
    path = state_path(name)
    if not path.exists():
        raise UsageError(f"NAME={name!r}: no cluster of that name under {ftc_home()}; "
                         f"start one with `make cluster NAME={name}` or list them with `ftc status`")
    try:
        return ClusterState.from_json(path.read_text())
    except (ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
        raise CorruptState(f"{path} is not valid cluster state ({exc})") from exc


def exists(name: str) -> bool:
    return state_path(name).exists()


def all_names() -> list[str]:
    root = ftc_home() / "clusters"
    return sorted(p.parent.name for p in root.glob("*/state.json")) if root.exists() else []


@contextmanager
def locked(name: str, command: str, create: bool = False) -> Iterator[None]:
    """Hold the cluster's lock; refuse at once, naming the holder, if another command has it.
    Only `up` and `down` may create the cluster's directory; others need the cluster to exist."""
    directory = cluster_dir(name)
    if not create and not directory.exists():
        load(name)  # raises the one-line "no cluster of that name"
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / "lock"
    fh = open(path, "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        holder = fh.read().strip() or "another ftc command"
        fh.close()
        raise ClusterBusy(f"cluster {name!r} is busy: {holder}; wait for it to finish, "
                          "or stop it (Ctrl-C) and run your command again") from None
    try:
        fh.seek(0)
        fh.truncate()
        fh.write(f"locked by pid {os.getpid()} (`ftc {command}`) since {time.strftime('%H:%M:%S')}")
        fh.flush()
        yield
    finally:
        fh.seek(0)
        fh.truncate()
        fcntl.flock(fh, fcntl.LOCK_UN)
        fh.close()
