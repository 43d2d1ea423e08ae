"""Cluster state: plain dataclasses, saved as JSON under $FTC_HOME/clusters/<name>/.

The state is written atomically (temp file + rename) before and after every step
that creates or deletes something, so whatever interrupts ftc, the file on disk
names every resource that may exist and `ftc down` can clean it up.
"""

import fcntl
import json
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Iterator, get_args, get_origin

from .errors import ClusterBusy, UsageError, command
from .providers.records import TRAITS, Resources, traits
from .spec import ClusterSpec
from .values import conforms, control_character, kind_name, label, value_kind


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
    checkpoint_uri: str = ""  # a checkpoint store's URI (s3://bucket/prefix) that each checkpoint is also copied to
    kind: str = "finetune"  # finetune (ftc's trainer) | script (`ftc launch`: your own program)
    output: str = ""  # script: rank 0's output folder, relative to the workdir (fetched into output/)
    tag: str = ""  # script: FTC_RUN_TAG, which every process of the job carries; random, so unique on any
    #                machine even where nodes of two clusters name the same directory (the EC2 emulator)


class UnregisteredProvider(UsageError):
    """A state whose provider is not registered here. Only that provider can find its nodes, so no
    command acts on the cluster, `down` included (its nodes would be left running, unnamed), until
    FTC_PROVIDERS registers it again."""


@dataclass
class ClusterState:
    name: str
    provider: str
    spec: dict[str, Any]
    phase: str = "launching"  # launching -> running -> bootstrapped; terminating; `down` starts from any
    # every id the provider created, what it checked (providers/records.py): the provider's own record
    resources: Resources | None = None  # None only until __post_init__ gives a new cluster its empty record
    nodes: list[NodeInfo] = field(default_factory=list)
    created_at: float = field(default_factory=time.time)
    bootstrapped_at: float = 0.0
    stack_python: str = ""  # the Python of the installed stack, same path on every node
    jobs: list[JobInfo] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.resources is None:
            self.resources = traits(self.provider).resources()

    @property
    def cluster_spec(self) -> ClusterSpec:
        return ClusterSpec.from_dict(self.spec)

    @property
    def head(self) -> NodeInfo:
        return self.nodes[0]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> "ClusterState":
        """Raises ValueError for anything but the shape `to_json` writes (any JSON may be on disk):
        every field of the state, its nodes, its jobs and its spec of the type declared here; and
        UnregisteredProvider for a provider this process has not registered."""
        data = json.loads(text)
        provider = data.get("provider") if isinstance(data, dict) else None
        if isinstance(provider, str) and provider not in TRAITS:
            raise UnregisteredProvider(f"its provider {provider!r} is not registered here: set FTC_PROVIDERS as it "
                                       f"was at `{command('up')}` (module:attribute)")
        resources = data.pop("resources", {}) if isinstance(data, dict) else {}
        for job in data.get("jobs", []) if isinstance(data, dict) and isinstance(data.get("jobs"), list) else []:
            if isinstance(job, dict) and "checkpoint_s3" in job:  # its name before CHECKPOINT_URI: a kept cluster's
                job["checkpoint_uri"] = job.pop("checkpoint_s3")
        state = _from_dict(cls, data)
        state.resources = _from_dict(traits(state.provider).resources, resources, "resources.")  # the provider's record
        spec_types = {f.name: f.type for f in fields(ClusterSpec)}
        for key, value in state.spec.items():
            if key in spec_types and not conforms(value, spec_types[key]):
                raise ValueError(f"spec.{key} should be {kind_name(spec_types[key])}, not {value_kind(value)}")
        return state


def _from_dict(cls: type, data: Any, where: str = "") -> Any:
    """A dataclass from JSON-decoded `data`, each field checked against its declared type; `where`
    ('nodes[0].') names a nested one in the message. Pure."""
    if not isinstance(data, dict):
        raise ValueError(f"{where.rstrip('.') or 'the state'} should be an object, not {value_kind(data)}")
    declared = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(declared))
    if unknown:
        raise ValueError(f"{where}{unknown[0]} is not a key of the state")
    missing = [name for name, f in declared.items()
               if name not in data and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise ValueError(f"{where}{missing[0]} is missing")
    values = {}
    for key, value in data.items():
        kind = declared[key].type
        item = get_args(kind)[0] if get_origin(kind) is list else None
        record = next((t for t in (kind, *get_args(kind)) if is_dataclass(t)), None) if item is None else None
        if is_dataclass(item) and isinstance(value, list):
            values[key] = [_from_dict(item, v, f"{where}{key}[{i}].") for i, v in enumerate(value)]
        elif record and isinstance(value, dict):  # a record inside a record (X, or X | None)
            values[key] = _from_dict(record, value, f"{where}{key}.")
        elif not is_dataclass(item) and conforms(value, kind):
            values[key] = value
        else:
            raise ValueError(f"{where}{key} should be {kind_name(kind)}, not {value_kind(value)}")
    return cls(**values)


def ftc_home() -> Path:
    """Absolute (made so lexically, from the working directory): every path ftc records, and every
    sshd command line it later proves a node by, must name one directory wherever ftc runs from."""
    return Path(os.path.abspath(os.environ.get("FTC_HOME") or Path.home() / ".ftc"))


# Where ftc keeps your own servers' clusters on each server ($HOME/.ftc-node/<cluster>/): every
# directory there is a cluster's, so the controller's own state must never lie under one.
NODE_ROOT = ".ftc-node"


def refuse_home_in_node_root() -> None:
    """Before any command: an FTC_HOME under a server's ~/.ftc-node is refused, in one line, rather
    than its directories taken for clusters (and removing them advised)."""
    home = ftc_home()
    inside = next((p for p in (home, *home.parents) if p.name == NODE_ROOT), None)
    if inside:
        raise UsageError(f"FTC_HOME={str(home)!r} lies under {str(inside)!r}, where ftc keeps the clusters of your own "
                         "servers (each directory there is one cluster's); keep the controller's state elsewhere: "
                         "another FTC_HOME (the default is ~/.ftc)")


def home_problem(home: str) -> str:
    """What in FTC_HOME the nodes' sshd and ssh configurations cannot carry, '' when nothing: they
    quote paths in double quotes, one setting a line, and ssh expands % and ${...} in paths. Pure."""
    control = control_character(home)
    if control:
        return f"a control character ({control!r})"
    if '"' in home:
        return "a double quote"
    if "%" in home:
        return "a '%'"
    if "${" in home:
        return "'${'"
    return ""


def check_home() -> None:
    """Before `up` creates anything: refuse an FTC_HOME the cluster's ssh could not work in."""
    home = str(ftc_home())
    what = home_problem(home)
    if what:
        raise UsageError(f"FTC_HOME={home!r} holds {what}, which the nodes' ssh and sshd configurations cannot "
                         "carry; choose a directory without it (the default is ~/.ftc)")


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
    try:
        with open(tmp, "w") as fh:
            fh.write(state.to_json())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk, an interrupt: the old state stays whole, no half-written copy beside it
        tmp.unlink(missing_ok=True)
        raise


class CorruptState(Exception):
    pass


def load(name: str) -> ClusterState:
    path = state_path(name)
    if not path.exists():
        raise UsageError(f"{label('name')}={name!r}: no cluster of that name under {ftc_home()}; "
                         f"start one with `{command('up', name=name)}` or list them with `{command('status')}`")
    try:
        state = ClusterState.from_json(path.read_text())
    except UnregisteredProvider as exc:
        raise UnregisteredProvider(f"cluster {name!r}: {exc}") from None
    except OSError as exc:
        raise CorruptState(f"{path} cannot be read ({exc.strerror})") from exc
    except (ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
        raise CorruptState(f"{path} is not valid cluster state ({exc})") from exc
    if state.name != name:  # a copied or renamed directory: its nodes and resources are another cluster's
        raise CorruptState(f"{path} is not valid cluster state (it records cluster {state.name!r}, not {name!r}: "
                           "a copied or renamed directory?)")
    return state


def recorded_place(name: str) -> dict[str, str]:
    """What a state file that does not load may still tell `down`: the cluster name, provider and region
    it records, each only where it is a string ({} when the file is not a readable JSON object)."""
    try:
        data = json.loads(state_path(name).read_text())
    except (OSError, ValueError):
        return {}
    spec = data.get("spec") if isinstance(data, dict) else None
    found = {"name": data.get("name") if isinstance(data, dict) else None,
             "provider": data.get("provider") if isinstance(data, dict) else None,
             "region": spec.get("region") if isinstance(spec, dict) else None}
    return {key: value for key, value in found.items() if isinstance(value, str)}


def clear_unloadable(name: str) -> None:
    """`down` replaces a state file that does not load with the one it reconstructs; a directory in
    its place, which the atomic rename of `save` cannot replace, goes first."""
    path = state_path(name)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)


def exists(name: str) -> bool:
    return state_path(name).exists()


def all_names() -> list[str]:
    root = ftc_home() / "clusters"
    return sorted(p.parent.name for p in root.glob("*/state.json")) if root.exists() else []


@contextmanager
def locked(name: str, command: str, create: bool = False) -> Iterator[None]:
    """Hold the cluster's lock; refuse at once, naming the holder, if another command has it.
    Only `up` and `down` may create the cluster's directory; others need the cluster to exist.

    The holder's name is written best-effort: on a full disk the lock still holds (flock needs no
    space), so that `down` can tear the nodes down without writing first. A directory made here
    that holds no state when the command ends (an `up` that failed) goes again, while the lock is
    still held; a lock file removed so meanwhile is not the lock any more, and is taken anew."""
    directory = cluster_dir(name)
    if not create and not directory.exists():
        load(name)  # raises the one-line "no cluster of that name"
    made = not directory.exists()
    fh = _take_lock(name, directory)
    try:
        _note_holder(fh, f"locked by pid {os.getpid()} (`ftc {command}`) since {time.strftime('%H:%M:%S')}")
        yield
    finally:
        _note_holder(fh, "")
        if made and _holds_only_the_lock(directory):
            shutil.rmtree(directory, ignore_errors=True)
        fcntl.flock(fh, fcntl.LOCK_UN)
        fh.close()


def _take_lock(name: str, directory: Path):
    """The cluster's lock file, flocked; ClusterBusy naming the holder when another has it."""
    while True:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = directory / "lock"
        fh = open(path, "a+b", buffering=0)  # unbuffered: a write that finds no space fails there, not at close
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().decode(errors="replace").strip() or "another ftc command"
            fh.close()
            raise ClusterBusy(f"cluster {name!r} is busy: {holder}; wait for it to finish, "
                              "or stop it (Ctrl-C) and run your command again") from None
        try:
            if os.fstat(fh.fileno()).st_ino == os.stat(path).st_ino:
                return fh
        except FileNotFoundError:
            pass
        fh.close()  # the file was removed (a failed up tidying its directory) after it was opened: again


def _holds_only_the_lock(directory: Path) -> bool:
    """A cluster directory with nothing in it but its lock (an `up` that failed before saving)."""
    try:
        return [entry.name for entry in directory.iterdir()] == ["lock"]
    except OSError:  # already removed (a rollback), or unreadable: nothing to tidy
        return False


def _note_holder(fh, text: str) -> None:
    """Who holds the lock, for a command that finds it taken; skipped when the disk is full."""
    try:
        fh.seek(0)
        fh.truncate()
        fh.write(text.encode())
    except OSError:
        pass


def lock_holder(name: str) -> str:
    """Who holds the cluster's lock now ('' when nobody does: a killed command releases it, though
    its note stays in the file)."""
    try:
        fh = open(cluster_dir(name) / "lock", "rb")
    except OSError:
        return ""
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return fh.read().decode(errors="replace").strip() or "another ftc command"
        fcntl.flock(fh, fcntl.LOCK_UN)
    return ""


def half_made(state: ClusterState, holding_lock: bool = False) -> str:
    """For a cluster that an `up` or a `down` left part-way (killed, or still at work): what it is
    and the one command that moves on; '' once its nodes run. `up` does not resume a launch (it
    refuses an existing cluster), so what a stopped one recorded is removed by `down`. `holding_lock`:
    the caller has the lock, so no other command is at work."""
    if state.phase in ("running", "bootstrapped"):
        return ""
    holder = "" if holding_lock else lock_holder(state.name)
    if holder:
        return f"cluster {state.name!r} is {state.phase}: {holder}; wait for it to finish"
    stopped = "up" if state.phase == "launching" else "down"
    return (f"cluster {state.name!r} is {state.phase}: its `ftc {stopped}` stopped part-way; "
            f"`ftc down --name {state.name}` removes whatever it created (then `ftc up` starts afresh)")
