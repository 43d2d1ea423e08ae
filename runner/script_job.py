"""Your own training script on the cluster (`ftc launch`) as one kind of job: checked, its workdir
copied to every node, its requirements installed once, then run on every rank as ftc's own jobs run
(runner/job.py lives its life: start, follow, finish, cancel).

Every rank runs `python SCRIPT ARGS` from its node's copy of the workdir, through
runner/node/script_rank.py: torchrun's environment, its own cores, the launch's threads, allocator and
gloo interface (provision/launch.py, the one launch builder), FTC_OUTPUT_DIR and FTC_RUN_ID.
"""

import hashlib
import os
import re
import secrets
import shlex
import time
from dataclasses import dataclass, field, fields
from pathlib import Path, PurePosixPath
from typing import ClassVar

from rich.markup import escape

from provision import procs
from provision import state as st
from provision.errors import FtcError, UsageError, via_make
from provision.launch import RankLaunch, node_path, node_python
from provision.providers import traits
from provision.ssh import NodeConnections, interruptible, run
from provision.stacks import STACKS
from provision.ui import console
from provision.values import label, local_path, refuse_control_character, refuse_not_utf8, whole

from . import runs, script_data
from .node.facts import NodeFacts
from .node.protocol import (
    LOGS_DIR,
    OUTPUT_LOG,
    REQUIREMENTS_DONE,
    REQUIREMENTS_ENV,
    REQUIREMENTS_FAILED,
    REQUIREMENTS_FILE,
    REQUIREMENTS_LOG,
    REQUIREMENTS_SKIPPED,
    SCRIPT_OUTPUT_HOME,
    SCRIPT_WORKDIR,
    RankExit,
    first_failure,
    rank_log_path,
    ranks_alone,
    read_rank_exits,
    requirements_layer,
)
from .node.script_rank import STOP_GRACE_S
from .report import for_terminal
from .transfer import fetch, nodes_with_own_files, send_tree

ALWAYS_LEFT_OUT = (".git", ".venv", "__pycache__")  # never copied, .gitignore or not
MAX_WORKDIR_MB = 200  # the default limit on what is copied to every node
MAX_REQUIREMENTS_BYTES = 2**20  # a requirements file is lines of names; more is not one
TAIL_LINES = 15  # of a failed rank's log, shown when the job ends
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# What every process of a job carries, so that it is found and stopped when the job ends: the job's
# directory on the head node, one job's on any machine (FTC_RUN_ID, a time to the second, may be another
# cluster's too on a machine that several clusters share).
RUN_TAG = "FTC_RUN_TAG"
# Set by ftc for every rank: --env may not replace them (the launch and the wrapper would disagree).
RESERVED_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
                "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "FTC_OUTPUT_DIR", "FTC_RUN_ID", RUN_TAG, "FTC_PREEMPTED_FILE",
                "FTC_WORLD_SIZE", "FTC_SELF_PIN", REQUIREMENTS_ENV, "FTC_NODE_DIR", "HOME", "USER", "LOGNAME",
                "PYTHONPATH", "LD_PRELOAD", "GLOO_SOCKET_IFNAME",
                "PYTHONHOME", "PYTHONSTARTUP", "BASH_ENV",  # would change the Python or shell ftc's launch runs in
                "PATH", "LD_LIBRARY_PATH")  # the stack's mpirun and Python are found through these
RESERVED_PREFIXES = ("I_MPI_", "OMPI_", "PMI_", "HYDRA_")  # mpirun's own settings: the launch's pinning and ranks


# ScriptJob's fields run.json does not keep as they are: the script and its arguments (kept as the command), the
# ranks (kept apart, as every job's), what the ranks are given (variables may hold secrets), the copy and its limit.
RECORDED_APART = ("script", "args", "ppn", "env", "copy", "max_workdir_mb")


@dataclass
class ScriptJob:
    """What `ftc launch` was given, checked on the controller."""
    workdir: Path  # absolute; copied to every node
    script: str  # POSIX path inside the workdir
    args: list[str] = field(default_factory=list)  # passed to the script as given, never through a shell
    output: str = "output"  # rank 0's output folder, relative to the workdir: fetched home
    ppn: int = 0  # ranks per node; 0: the node facts' default, as for ftc's own jobs
    requirements: Path | None = None  # installed on every node into a venv layered on the stack, once per content
    data: list[Path] = field(default_factory=list)  # outside the workdir: copied into its copy, each under its name
    env: dict[str, str] = field(default_factory=dict)  # more variables for every rank
    max_workdir_mb: int = MAX_WORKDIR_MB
    copy: dict[str, Path] = field(default_factory=dict, init=False)  # the workdir's copy (path there -> file), once placed

    kind: ClassVar[str] = "script"
    verb: ClassVar[str] = "launch"  # the ftc command that starts it
    program: ClassVar[str] = "runner.node.script_rank"
    # at a cancel, the ranks get the time to stop what the script started (STOP_GRACE_S) before SIGKILL
    stop_grace_s: ClassVar[int] = STOP_GRACE_S + 5
    flows: ClassVar[int] = 0  # the launch's default
    continues: ClassVar[bool] = False  # a script's run is never resumed by ftc
    checkpoint: ClassVar[Path | None] = None

    @property
    def command(self) -> str:
        """The command as a user would type it (shown by `ftc runs`)."""
        return shlex.join(["python", self.script, *self.args])

    def title(self) -> str:
        return f"{self.command} (your script, from {self.workdir})"

    def said(self) -> str:
        return f": {self.command}"

    def place(self, state: st.ClusterState, connections: NodeConnections, render_only: bool) -> st.JobInfo:
        """The workdir's files to copy, checked; the job's id and directories."""
        self.copy = copy_of(self)
        if self.script not in self.copy:
            raise UsageError(f"{label('script')}={self.script!r} is left out of the copy by the .gitignore of "
                             f"{label('workdir')}={str(self.workdir)!r}; un-ignore it")
        refuse_oversized(self.workdir, self.copy, self.max_workdir_mb)
        for line in script_data.unseen_paths(self.args, self.copy, self.workdir, Path.cwd(),
                                             traits(state.provider).shares_this_machine):
            console.print(f"warning: {line}", style="yellow", markup=False, soft_wrap=True)
        job_id = f"script-{runs.utc_stamp()}"
        return st.JobInfo(id=job_id, task="script", remote_dir=f"{state.head.workdir}/jobs/{job_id}",
                          results_dir=runs.default_results_dir(state.name, job_id), kind="script", output=self.output,
                          tag=f"{job_id}-{secrets.token_hex(6)}")

    def arguments(self, state: st.ClusterState, record: st.JobInfo) -> list[str]:
        return [self.output, self.script, *self.args]

    def environment(self, state: st.ClusterState, record: st.JobInfo) -> dict[str, str]:
        env = {**passed_on(dict(os.environ), state.provider), **self.env, "FTC_RUN_ID": record.id,
               RUN_TAG: record.tag}
        return {**env, REQUIREMENTS_ENV: digest_of(self.requirements)} if self.requirements else env

    def refuse(self, state: st.ClusterState, launch: RankLaunch, render_only: bool) -> None:
        """Nothing more: every setting was checked by validate, the workdir by place."""

    def settings(self, launch: RankLaunch) -> dict:
        """What run.json records of the job: each field but those RECORDED_APART, paths as text, and the command;
        its exit code and output's size once it ends."""
        recorded = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in RECORDED_APART}
        as_text = {key: [str(v) for v in value] if isinstance(value, list) else str(value) if isinstance(value, Path)
                   else value for key, value in recorded.items()}
        return {**as_text, "kind": self.kind, "task": "script", "model": "", "command": self.command, "exit_code": None,
                "output_bytes": None}

    def prepare(self, state: st.ClusterState, record: st.JobInfo, connections: NodeConnections,
                facts: list[NodeFacts]) -> None:
        """Under the cluster's lock, before the start: the workdir on every node, the requirements
        installed. Cut short, nothing of it runs on and no copy of the workdir is left."""
        try:
            send_workdir(state, self.copy, record.remote_dir, self.requirements, connections)
            if self.requirements:
                install_requirements(state, facts, self.requirements, record, connections)
        except BaseException:
            stop_run_processes(state, record.tag, connections)
            remove_on_nodes(state, record.remote_dir, connections)
            raise

    # ---- once it has started: for a job read back from the cluster's state ----------------------------

    @staticmethod
    def stop_leftovers(state: st.ClusterState, job: st.JobInfo, connections: NodeConnections) -> None:
        """What the script left running in a session of its own (a daemon) ends with the job."""
        stop_run_processes(state, job.tag, connections)

    @staticmethod
    def head_file_home(job: st.JobInfo, relative: str) -> str | None:
        """Where a file of the job's directory on the head lands under its results directory: rank 0's
        output folder as output/, the files beside the workdir's copy (output.log) where they are; the
        rest of the copy stays (None). Pure."""
        output = f"{SCRIPT_WORKDIR}/{job.output}/"
        if relative.startswith(output):
            return f"{SCRIPT_OUTPUT_HOME}/{relative[len(output):]}"
        return relative if "/" not in relative else None

    @staticmethod
    def worth_walking(job: st.JobInfo, relative_dir: str) -> bool:
        """The workdir's copy is walked only down to its output folder. Pure."""
        output = f"{SCRIPT_WORKDIR}/{job.output}"
        return output.startswith(relative_dir + "/") or (relative_dir + "/").startswith(output + "/")

    @staticmethod
    def bring_home(state: st.ClusterState, job: st.JobInfo, connections: NodeConnections) -> Path:
        """Rank 0's output folder and every rank's log home; then the workdir's copies go."""
        stop_run_processes(state, job.tag, connections)
        results = fetch(state, job, connections, ScriptJob)
        remove_on_nodes(state, f"{job.remote_dir}/{SCRIPT_WORKDIR}", connections)
        return results

    @staticmethod
    def outcome(state: st.ClusterState, job: st.JobInfo, results: Path, code: int) -> int:
        """Recorded with the exit code of the rank that failed first and the output's size; told as
        script_outcome tells it, with a warning for ranks that each ran the whole job alone."""
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


# ---- checks: pure but for reading the files named ------------------------------------------------------

def validate(script: str, args: list[str], workdir: str | None = None, output: str | None = None,
             ppn: str | None = None, requirements: str | None = None, env: list[str] | None = None,
             max_workdir_mb: str | None = None, data: list[str] | None = None) -> ScriptJob:
    """Every setting of `ftc launch` checked before anything starts; one UsageError naming the value."""
    if not script:
        raise UsageError(f"{label('script')} is missing; give your training script"
                         + ("" if via_make() else ": `ftc launch -- train.py [ARGS...]`"))
    for key, value in (("script", script), ("workdir", workdir or ""), ("output", output or ""),
                       ("requirements", requirements or ""), *(("arg", a) for a in args)):
        refuse_not_utf8(key, value)
        refuse_control_character(key, value)
    for key, value in (("script", script), ("workdir", workdir or ""), ("requirements", requirements or "")):
        if value != value.strip():  # read as given: ' lead.py' is not lead.py
            raise UsageError(f"{label(key)}={value!r} begins or ends with a space; give the path without it")
    script_path = Path(local_path("script", script))
    root = Path(local_path("workdir", workdir)) if workdir else script_path.parent
    if workdir and not Path(script).is_absolute() and (root / script).is_file():
        script_path = root / script  # a path inside the workdir, as the nodes will run it
    if not root.is_dir():
        raise UsageError(f"{label('workdir')}={workdir!r} is not a directory; give the folder your script runs from")
    if not script_path.is_file():
        raise UsageError(f"{label('script')}={script!r} is not a file ({script_path}); give your training script's path")
    try:
        inside = script_path.resolve().relative_to(root.resolve())
    except ValueError:
        raise UsageError(f"{label('script')}={script!r} is outside {label('workdir')}={str(root)!r}: only the workdir "
                         f"is copied to the nodes; give a script inside it, or a {label('workdir')} that holds it") from None
    job = ScriptJob(workdir=root, script=inside.as_posix(), args=list(args),
                    output=_relative_inside("output", output or "output"),
                    ppn=whole(1, 512)("ppn", ppn) if ppn is not None else 0,
                    env=_env_pairs(env or []),
                    max_workdir_mb=whole(1, 100_000)("max_workdir_mb", max_workdir_mb) if max_workdir_mb is not None
                    else MAX_WORKDIR_MB)
    refuse_output_on_a_file(root, job.output, output or "output")
    job.data = script_data.checked(data or [], root, job.output, private_folders())
    if requirements:
        path = Path(local_path("requirements", requirements))
        if path.is_dir():
            raise UsageError(f"{label('requirements')}={requirements!r} is a directory; give a requirements file")
        if path.exists() and not path.is_file():  # a device or a FIFO: read without end, or never
            raise UsageError(f"{label('requirements')}={requirements!r} is not a regular file; give a requirements file")
        if path.is_file() and path.stat().st_size > MAX_REQUIREMENTS_BYTES:
            raise UsageError(f"{label('requirements')}={requirements!r} is over {MAX_REQUIREMENTS_BYTES // 2**20} MB; "
                             "give a requirements file")
        try:
            path.read_bytes()
        except OSError as exc:
            raise UsageError(f"{label('requirements')}={requirements!r} cannot be read ({exc.strerror or exc}); give a "
                             "requirements file pip can read") from None
        job.requirements = path
    return job


def refuse_output_on_a_file(root: Path, output: str, raw: str) -> None:
    """The output folder, or a folder on its way, may not be a file of the workdir: every rank would fail
    making it."""
    path = root
    for part in output.split("/"):
        path = path / part
        if path.exists() and not path.is_dir():
            raise UsageError(f"{label('output')}={raw!r}: {path.relative_to(root)} is a file of the workdir; give a "
                             "folder name that is free, or a folder")


def _relative_inside(key: str, raw: str) -> str:
    """A folder inside the workdir, as a normalised POSIX path ('a/b'); '..', absolute paths and the
    workdir itself are refused. Pure."""
    path = PurePosixPath(raw)
    parts = [p for p in path.parts if p != "."]
    if path.is_absolute() or ".." in parts or not parts:
        raise UsageError(f"{label(key)}={raw!r} is not a folder inside the workdir; allowed: a relative path such as "
                         "'output' (no '..', not absolute, not the workdir itself)")
    return "/".join(parts)


def _env_pairs(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not ENV_NAME.match(key):
            raise UsageError(f"{label('env')}={pair!r} is not KEY=VALUE with KEY a variable name; allowed: e.g. "
                             "HF_HOME=/data")
        if key in RESERVED_ENV or key.startswith(RESERVED_PREFIXES):
            raise UsageError(f"{label('env')}={pair!r}: ftc sets {key} for every rank; allowed: any other variable")
        refuse_not_utf8("env", pair)
        refuse_control_character("env", pair)
        env[key] = value
    return env


PASSED_ON = ("HF_", "TRANSFORMERS_")  # your shell's variables of these prefixes reach every rank on local nodes


def passed_on(environ: dict[str, str], provider: str) -> dict[str, str]:
    """Your shell's Hugging Face variables (HF_HUB_OFFLINE, HF_HOME, ...), which torchrun's ranks would
    inherit: for nodes on this machine, where torchrun would run; another machine has its own (`--env`
    sets them there). Pure."""
    if not traits(provider).shares_this_machine:
        return {}
    return {k: v for k, v in environ.items() if k.startswith(PASSED_ON) and ENV_NAME.match(k)}


# ---- the workdir: what is copied -----------------------------------------------------------------------

def workdir_files(root: Path) -> list[Path]:
    """The files under `root` that go to the nodes: all but ALWAYS_LEFT_OUT, private_folders() and what its
    .gitignore files ignore, as git reads them (git itself decides: negations across levels, every pattern
    git takes). A link to a file is copied as the file; a link to a folder is left out (said on stderr):
    followed, a link to `.` or `/` would copy without end. A name that is not UTF-8, or a path that cannot
    be read, is refused naming it."""
    found: list[Path] = []
    private = private_folders()
    level, with_rules = [root], False
    while level:
        entries = [entry for folder in level for entry in _listing(folder)]
        with_rules = with_rules or any(entry.name == ".gitignore" for entry in entries)
        ignored = _ignored_by_git(root, entries) if with_rules else set()
        level = []
        for entry in entries:
            if entry in ignored:
                continue
            try:
                is_dir, is_file = entry.is_dir(), entry.is_file()
            except OSError as exc:
                raise UsageError(f"{label('workdir')}: {entry} cannot be read ({exc.strerror}); make it readable, or "
                                 "list it in .gitignore") from None
            why = private.get(entry.resolve()) if is_dir else None
            if why or (is_dir and entry.is_symlink()):
                console.print(f"left out of the copy: {entry.relative_to(root)} ({why or 'a link to a folder'})",
                              markup=False, soft_wrap=True)
            elif is_dir:
                level.append(entry)
            elif is_file:
                found.append(entry)
    return sorted(found)


def _listing(folder: Path) -> list[Path]:
    """A folder's entries to consider, ALWAYS_LEFT_OUT aside; refused naming it when it cannot be read or
    an entry's name is not UTF-8."""
    try:
        entries = sorted(folder.iterdir())
    except OSError as exc:
        raise UsageError(f"{label('workdir')}: {folder} cannot be read ({exc.strerror}); make it readable, or list it in "
                         ".gitignore") from None
    for entry in entries:
        try:
            entry.name.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError(f"{label('workdir')}: the name {os.fsencode(entry)!r} is not UTF-8, which the nodes' copy and "
                             "the fetch need; rename it, or list it in .gitignore") from None
    return [entry for entry in entries if entry.name not in ALWAYS_LEFT_OUT]


def _ignored_by_git(root: Path, entries: list[Path]) -> set[Path]:
    """Which of `entries` the .gitignore files under `root` ignore, as `git check-ignore` says, against an
    empty repository of its own (the workdir need not be one; your global excludes do not apply)."""
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory(prefix="ftc-gitignore-") as repo:
        try:
            subprocess.run(["git", "init", "-q", repo], check=True, capture_output=True)
            answer = subprocess.run(["git", f"--git-dir={repo}/.git", f"--work-tree={root}", "-c",
                                     "core.excludesFile=/dev/null", "check-ignore", "--no-index", "--stdin", "-z"],
                                    input=b"".join(os.fsencode(e.relative_to(root)) + b"\0" for e in entries),
                                    capture_output=True, cwd=root)
        except (OSError, subprocess.CalledProcessError) as exc:
            raise FtcError(f"git could not be run ({exc}): ftc reads the workdir's .gitignore files with git; "
                           "install git") from None
    if answer.returncode not in (0, 1):
        raise UsageError(f"{label('workdir')}: git cannot read its .gitignore files "
                         f"({(answer.stderr.decode(errors='replace').strip().splitlines() or ['no message'])[-1]}); fix them")
    return {root / os.fsdecode(path) for path in answer.stdout.split(b"\0") if path}


def private_folders() -> dict[Path, str]:
    """Folders never copied to the nodes, wherever they lie in a workdir: FTC_HOME (every cluster's
    private keys) and your own ssh and AWS credentials."""
    home = Path.home()
    return {st.ftc_home().resolve(): "FTC_HOME: every cluster's private keys",
            (home / ".ssh").resolve(): "your ssh keys", (home / ".aws").resolve(): "your AWS credentials"}


def copy_of(job: ScriptJob) -> dict[str, Path]:
    """What the nodes' copy of the workdir holds, by its path there: the workdir's files, and each --data
    under its own name (a folder's files chosen as the workdir's are)."""
    copy = {path.relative_to(job.workdir).as_posix(): path for path in workdir_files(job.workdir)}
    for data in job.data:
        copy |= ({f"{data.name}/{path.relative_to(data).as_posix()}": path for path in workdir_files(data)}
                 if data.is_dir() else {data.name: data})
    return copy


def refuse_oversized(root: Path, copy: dict[str, Path], limit_mb: int) -> None:
    """A copy over the limit, refused naming its largest entries."""
    sizes: dict[str, int] = {}
    for name, path in copy.items():
        top = name.split("/")[0] + ("/" if "/" in name else "")
        sizes[top] = sizes.get(top, 0) + path.stat().st_size
    total = sum(sizes.values())
    if total > limit_mb * 2**20:
        largest = ", ".join(f"{name} {size / 2**20:.1f} MB" for name, size in
                            sorted(sizes.items(), key=lambda kv: -kv[1])[:3])
        raise UsageError(f"{label('workdir')}={str(root)!r} holds {total / 2**20:.1f} MB to copy to every node, over "
                         f"the {limit_mb} MB limit (largest: {largest}); list what the nodes do not need in its "
                         f".gitignore, or raise {label('max_workdir_mb')}")


# ---- on the nodes --------------------------------------------------------------------------------------

def send_workdir(state: st.ClusterState, copy: dict[str, Path], remote_dir: str, requirements: Path | None,
                 connections: NodeConnections) -> None:
    """The workdir's copy into <job>/workdir on every node, in its own job directory (local nodes share
    this machine: the head's copy serves them all), and the requirements file beside it."""
    for node in nodes_with_own_files(state):
        job_dir = node_path(state, node, remote_dir)
        conn = connections.to(state, node)
        run(conn, node, "send workdir", f"mkdir -p {shlex.quote(job_dir)}/{LOGS_DIR}")
        send_tree(conn, node, copy, f"{job_dir}/{SCRIPT_WORKDIR}")
        if requirements:
            conn.put(str(requirements), f"{job_dir}/{REQUIREMENTS_FILE}")


def remove_on_nodes(state: st.ClusterState, path: str, connections: NodeConnections) -> None:
    """Best effort: a folder of the job (the head's path) removed from every node that answers, each its own."""
    for node in nodes_with_own_files(state):
        try:
            run(connections.to(state, node, attempts=1), node, "clean up", f"rm -rf {shlex.quote(node_path(state, node, path))}")
        except Exception:  # noqa: BLE001, S110 - a node that does not answer keeps it until `ftc down`
            pass


# pip's lines that say what failed, quoted whole; ERROR: and the like taken off
PIP_FAILED = re.compile(r"^(?:ERROR: )?(.*(?:No matching distribution found for|satisfies the requirement|"
                        r"Invalid requirement:|Failed to build|does not exist\.|Could not install packages due to|"
                        r"Cannot install).*)$")
STACK_PINNED = re.compile(r"The user requested \(constraint\) ([A-Za-z0-9_.-]+)")
LAYER_DONE = ".ftc-installed"  # in a requirements layer: its install finished


def digest_of(requirements: Path) -> str:
    return hashlib.sha256(requirements.read_bytes()).hexdigest()[:16]


def layer_command(python: str, node_dir: str, digest: str, job_dir: str, pins: dict[str, str],
                  run_tag: str) -> str:
    """Shell, run on a node: the requirements' own venv (a layer whose Python reads the stack's
    site-packages after its own), made and pip-installed unless done before; the stack's pins are
    constraints, so no requirement moves them. Its processes carry the node's directory and the run's
    tag, so `down` and an interrupted launch find them. Echoes SKIPPED, DONE, or FAILED and the log's
    last lines. Pure."""
    layer = str(requirements_layer(PurePosixPath(node_dir), digest))
    log = f"{layer}.{REQUIREMENTS_LOG}"
    q = shlex.quote
    stack_sites = ("import site; print('import site; ' + '; '.join(f'site.addsitedir({p!r})' "
                   "for p in site.getsitepackages()))")
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    constraints = " ".join(q(f"{name}=={version}") for name, version in pins.items())
    return (f"export FTC_NODE_DIR={q(node_dir)} {RUN_TAG}={q(run_tag)}; L={q(layer)}; PY={q(python)}; "
            f'if [ -e "$L/{LAYER_DONE}" ]; then echo {REQUIREMENTS_SKIPPED}; exit 0; fi; '
            f'rm -rf "$L" && mkdir -p "$L" && cd {q(job_dir)}/{SCRIPT_WORKDIR} || exit 1; '
            f'{{ "$PY" -m venv --without-pip "$L" '
            f'&& "$PY" -c {q(stack_sites)} > "$("$L/bin/python" -c {q(purelib)})/_ftc_stack.pth" '
            f'&& printf "%s\\n" {constraints} > "$L/constraints.txt" '
            f'&& "$PY" -m pip --python "$L/bin/python" install --disable-pip-version-check --no-input '
            f'-c "$L/constraints.txt" -r ../{REQUIREMENTS_FILE}; }} > {q(log)} 2>&1; code=$?; '
            f'if [ $code = 0 ]; then touch "$L/{LAYER_DONE}"; echo {REQUIREMENTS_DONE}; '
            f'else rm -rf "$L"; echo {REQUIREMENTS_FAILED}; tail -n 40 {q(log)}; fi')


def pip_failure(lines: list[str], pins: dict[str, str]) -> str:
    """What a failed install's output says went wrong, in one line. Pure."""
    for line in lines:
        pinned = STACK_PINNED.search(line)
        if pinned:
            name = pinned.group(1)
            version = next((v for k, v in pins.items() if k.replace("_", "-").lower() == name.lower()), "")
            return (f"{name} is the stack's own ({name}=={version}), which a script's requirements keep: drop it "
                    "from the file, or ask for that version")
    quoted = next((m.group(1).strip() for line in lines for m in [PIP_FAILED.search(line.strip())] if m), "")
    return quoted or next((line for line in reversed(lines) if line.strip()), "no output")


def install_requirements(state: st.ClusterState, facts: list[NodeFacts], requirements: Path, record: st.JobInfo,
                         connections: NodeConnections) -> None:
    """Your requirements into a venv of the cluster's own on every node (one on nodes that share this
    machine), layered on the stack: the stack's Python is never changed, and `down` removes the layer.
    Skipped where this file's content was installed before. pip runs in the node's copy of the workdir,
    so a relative path in the file names a file of your workdir. Ctrl-C stops it at once. A failure names
    the node and the package, and where pip's whole output is."""
    digest = digest_of(requirements)
    pins = STACKS[state.cluster_spec.stack]
    for node in nodes_with_own_files(state):
        job_dir = node_path(state, node, record.remote_dir)
        clock = time.monotonic()
        console.print(f"requirements {requirements.name} ({digest}) on {node.name}: installing", markup=False)
        command = layer_command(node_python(state, facts, node), node.workdir, digest, job_dir, pins, record.tag)
        conn = connections.to(state, node)
        out = interruptible(conn.client.get_transport(), run, conn, node, "requirements", command)
        lines = out.splitlines()
        if lines[:1] == [REQUIREMENTS_SKIPPED]:
            console.print(f"requirements {requirements.name} on {node.name}: already installed (skipped)", markup=False)
            continue
        if lines[:1] != [REQUIREMENTS_DONE]:
            log = f"{requirements_layer(PurePosixPath(node.workdir), digest)}.{REQUIREMENTS_LOG}"
            raise FtcError(f"requirements {requirements} failed on {node.name}: {pip_failure(lines[1:], pins)}; fix the "
                           f"file and launch again (pip's whole output: {log} on {node.name})")
        console.print(f"requirements {requirements.name} on {node.name}: installed in {time.monotonic() - clock:.1f}s",
                      markup=False)


def stop_run_processes(state: st.ClusterState, run_tag: str, connections: NodeConnections) -> None:
    """Best effort: whatever still runs of a job on its nodes (an install, a daemon its script left
    behind), found by the run's tag in its environment, stopped."""
    for node in nodes_with_own_files(state):
        try:
            run(connections.to(state, node, attempts=1), node, "stop", procs.stop_carrying_command([f"{RUN_TAG}={run_tag}"]))
        except Exception:  # noqa: BLE001, S110 - a node that does not answer: `ftc down` finds them by directory
            pass


# ---- its end -------------------------------------------------------------------------------------------

def output_bytes(results: Path) -> int:
    folder = results / SCRIPT_OUTPUT_HOME
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


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
