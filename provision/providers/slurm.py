"""The slurm provider: the nodes of a Slurm allocation, `PROVIDER=slurm PARTITION=p NODES=n`.

    confirm    before anything is queued: Slurm answers (this machine's sbatch, or LOGIN's over
               ssh), the partition exists, has NODES nodes and allows MAX_HOURS. Any problem: one
               line, exit 2, nothing submitted.
    launch     sbatch an exclusive allocation of NODES nodes named ftc-<cluster>, held by a batch
               script that sleeps until its time limit; its job id is recorded before anything else.
               While it waits: its state and Slurm's reason, on a progress line. Once it runs: how
               its nodes are reached is found and said (below), then they are checked and claimed
               as your own servers are (providers/own_servers.py), in a directory per node,
               $HOME/.ftc-node/<cluster>.<node> (a site's nodes share one home), and another
               ftc cluster's directory there is no obstacle (the nodes are this allocation's alone).
    wait       nothing more: launch returns with every node logged in to
    terminate  on each node: what ftc put there removed, as on your servers; then scancel, and
               wait until the queue no longer holds the allocation. A job of this cluster's name
               that was queued but never recorded (ftc stopped inside sbatch) is cancelled too.
    query      the allocation's state; each node's directory while it runs

How the nodes are reached: over ssh at their addresses (Slurm's NodeAddr, port 22) where every node
answers and logs you in; else through srun. Then the batch script, on a signal from ftc, starts one
`srun --overlap --whole` step across the allocation that runs a private sshd on each node, as you,
listening on 127.0.0.1 only (its host key made there, read back through srun and pinned), and every
ssh to a node, the controller's and the nodes' own (mpirun's), is relayed into it by a short
`srun --overlap` step (relay()). The sshd's step is the batch script's child, so what its sessions
start (a detached job, the ranks) lives as long as the allocation, in it, as Slurm's process
tracking expects, and ends with it. Everything above the nodes (bootstrap, jobs, fetch, teardown) is
then the same ssh as on your own servers.

The decisions (the sbatch command line, what Slurm's answers mean, the refusals, which way the nodes
are reached) are pure functions; Slurm is called at the edges below, through `slurm()`.
"""

import getpass
import math
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, replace

from runner.node.slurm_notice import NOTICE_FILE

from .. import state as st
from ..errors import FtcError, UsageError, command, option
from ..spec import ClusterSpec
from ..ssh import fingerprint, key_problem
from ..ui import console
from ..values import from_env, number, parse_host
from . import own_servers as own
from .records import NodeStatus, Record, SlurmResources

SSH_PORT = 22  # where a site's compute nodes answer ssh
LIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "SIGNALING",
        "STAGE_OUT", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "STOPPED")  # a job that still holds or awaits nodes
# Reasons a pending job gives that waiting does not change: held (by you, an admin, or after its launch
# failed on a node), or asking for what this site does not have
IN_VAIN = ("JobHeldAdmin", "JobHeldUser", "launch_failed_requeued_held", "BadConstraints", "InvalidAccount",
           "InvalidQOS")
FORGOTTEN = "Invalid job id"  # what scontrol says of a job it no longer knows
POLL_VARIABLE = "FTC_SLURM_POLL_S"  # how often the queue is asked while an allocation waits or ends
GONE_WITHIN_S = 120  # scancel to the queue no longer listing it (the nodes' epilog runs meanwhile)
NOTICE_S = 120  # the notice before the time limit, as EC2 gives before a spot reclaim
SSH, SRUN = "ssh", "srun"  # SlurmResources.reach: how the nodes' sshd is reached
SSHD_WITHIN_S = 60  # the signal to the batch script until every node's private sshd answers
# The private sshd's port on a node's loopback: one per allocation (its job id's), below the ephemeral range
SSHD_PORT_BASE, SSHD_PORT_SPAN = 10000, 20000

# Each node's private sshd, run by the batch script's `srun` step (sh, as you): a host key made there, your
# ~/.ssh/authorized_keys (as your own sshd reads it), 127.0.0.1 only, its files in a directory of the job's
# own that goes when the step ends (scancel's SIGTERM, or the time limit's).
SSHD = """\
d=%(dir)s
mkdir -m 700 "$d" || exit 1
trap 'rm -rf "$d"' EXIT
trap 'kill $pid 2>/dev/null; exit 143' TERM
ssh-keygen -q -t ed25519 -N '' -C "ftc-$SLURM_JOB_ID" -f "$d/host_key" || exit 1
"$(command -v sshd || echo /usr/sbin/sshd)" -D -e -f /dev/null -h "$d/host_key" \\
  -o ListenAddress=127.0.0.1:$((%(base)d + SLURM_JOB_ID %% %(span)d)) -o "AuthorizedKeysFile=$HOME/.ssh/authorized_keys" \\
  -o UsePAM=no -o StrictModes=no -o PasswordAuthentication=no -o KbdInteractiveAuthentication=no -o PidFile=none \\
  -o MaxStartups=200 -o MaxSessions=200 -o "Subsystem=sftp internal-sftp" \\
  -o "SetEnv=HOME=$HOME${SLURM_CONF:+ SLURM_CONF=$SLURM_CONF}" 2>"$d/log" &
pid=$!
wait $pid
"""
# The relay: its standard input and output to the node's private sshd (one line: ssh_config's ProxyCommand)
RELAY = ('import os,socket,sys,threading as t;s=socket.create_connection(("127.0.0.1",int(sys.argv[1])));'
         't.Thread(target=lambda:[*map(s.sendall,iter(lambda:os.read(0,65536),b"")),s.shutdown(1)],daemon=True).start();'
         '[*map(lambda b:os.write(1,b),iter(lambda:s.recv(65536),b""))]')


# ---- pure: what to ask Slurm, and what its answers mean --------------------------------------

@dataclass(frozen=True)
class Partition:
    name: str
    nodes: int  # TotalNodes
    max_minutes: int | None  # MaxTime; None: UNLIMITED
    state: str  # UP, DOWN, DRAIN, INACTIVE


@dataclass(frozen=True)
class Allocation:
    job_id: str
    state: str  # JobState: PENDING, RUNNING, TIMEOUT, ...
    reason: str  # Slurm's Reason: Priority, Resources, PartitionDown, TimeLimit, None
    nodes: str  # NodeList as Slurm writes it (ftcn[1-2]); "" while pending

    @property
    def live(self) -> bool:
        return self.state in LIVE


def job_name(cluster: str) -> str:
    return f"ftc-{cluster}"


def minutes_of(hours: float) -> int:
    return max(1, math.ceil(hours * 60 - 1e-9))


def batch_script(cluster: str) -> str:
    """What holds the allocation: a shell on node 0 that sleeps until Slurm ends it. On SIGUSR1 (sent by ftc
    only where ssh cannot reach the nodes) it starts every node's private sshd in one step of its own; on
    SIGTERM (Slurm's before a preemption or an admin's cancel, or sbatch --signal's before the time limit)
    it writes the notice a job reads as a spot node's (runner/node/slurm_notice.py) into its node's ftc
    directory, where there is one, and holds on: the time Slurm gives before it kills. Pure."""
    sshd = SSHD % {"dir": sshd_dir("$SLURM_JOB_ID", "$SLURMD_NODENAME"), "base": SSHD_PORT_BASE, "span": SSHD_PORT_SPAN}
    start = f"srun --overlap --whole --mem=0 --ntasks-per-node=1 --quiet sh -c {shlex.quote(sshd)} >/dev/null 2>&1 &"
    node_dir = own.workdir_of("$HOME", cluster, "$SLURMD_NODENAME")
    path = f"{node_dir}/{NOTICE_FILE}"
    notice = (f'[ -d "{node_dir}" ] && printf \'{{"action": "terminate", "time": "%s", "source": "slurm"}}\\n\' '
              f'"$(date -u +%Y-%m-%dT%H:%M:%SZ)" > "{path}.part" && mv -f "{path}.part" "{path}"')
    return f"trap {shlex.quote(start)} USR1; trap {shlex.quote(notice)} TERM; while :; do sleep 3600 & wait $!; done"


def sbatch_argv(spec: ClusterSpec) -> list[str]:
    """The allocation as one sbatch: exclusive nodes, held by the batch script until its time limit."""
    argv = ["sbatch", "--parsable", "--exclusive", f"--nodes={spec.nodes}", f"--job-name={job_name(spec.name)}",
            f"--time={minutes_of(spec.max_hours)}", f"--partition={spec.settings['partition']}", "--output=/dev/null"]
    argv += [f"--{key}={spec.settings[key]}" for key in ("account", "qos", "constraint") if spec.settings[key]]
    return argv + [f"--signal=B:TERM@{notice_s(minutes_of(spec.max_hours))}", "--wrap", batch_script(spec.name)]


def notice_s(minutes: int) -> int:
    """How long before its time limit the allocation's notice comes: EC2's two minutes, or a quarter of a
    shorter allocation. Pure."""
    return min(NOTICE_S, minutes * 60 // 4)


def sshd_port(job_id: str) -> int:
    """The port of the allocation's private sshd on each node's loopback (as SSHD computes it). Pure."""
    return SSHD_PORT_BASE + int(job_id) % SSHD_PORT_SPAN


def sshd_dir(job_id: str, node: str) -> str:
    return f"/tmp/ftc-sshd-{job_id}.{node}"  # noqa: S108 - on the node: SSHD makes it with mkdir -m 700, which fails on one there


def step_argv(job_id: str, node: str, argv: list[str]) -> list[str]:
    """`argv` on one node of the allocation, beside whatever else runs there. Pure."""
    return ["srun", f"--jobid={job_id}", "--overlap", f"--nodelist={node}", "--nodes=1", "--ntasks=1", "--unbuffered",
            "--quiet", *argv]


def relay_argv(job_id: str, node: str) -> list[str]:
    """The relay to `node`'s private sshd. Pure."""
    return step_argv(job_id, node, ["python3", "-c", RELAY, str(sshd_port(job_id))])


def sshd_ready_argv(job_id: str, node: str) -> list[str]:
    """Prints the node's private sshd's host key once that sshd takes connections; fails until then. Pure."""
    listening = f"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {sshd_port(job_id)})).close()'"
    return step_argv(job_id, node, ["sh", "-c", f"cat {sshd_dir(job_id, node)}/host_key.pub && {listening}"])


def reach_line(job_id: str, unreached: list[str]) -> str:
    """Which way the nodes are reached, and why, in one line (`unreached`: why each node ssh did not
    reach, '' where it did). Pure."""
    missed = [why for why in unreached if why]
    if not missed:
        return "nodes reached over ssh: every allocated node answers it and logs you in"
    more = f" (and {len(missed) - 1} more)" if len(missed) > 1 else ""
    return f"nodes reached through srun --jobid {job_id} --overlap, not ssh: {missed[0]}{more}"


def fields_of(line: str) -> dict[str, str]:
    """`scontrol show ... -o`'s Key=Value words (a value runs to the next space). Pure."""
    return dict(word.split("=", 1) for word in line.split() if "=" in word)


def minutes(limit: str) -> int | None:
    """A Slurm time ([days-]hours:minutes:seconds, minutes, UNLIMITED) in whole minutes; None: no limit. Pure."""
    if limit.upper() in ("UNLIMITED", "INFINITE", "NONE", ""):
        return None
    days, _, rest = limit.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if len(parts) == 1:
        return int(days or 0) * 1440 + parts[0]
    hours, mins, secs = ([0] * (3 - len(parts)) + parts) if len(parts) < 3 else parts
    return int(days or 0) * 1440 + hours * 60 + mins + (1 if secs else 0)


def partition_of(line: str) -> Partition:
    found = fields_of(line)
    return Partition(found.get("PartitionName", ""), int(found.get("TotalNodes", "0")),
                     minutes(found.get("MaxTime", "UNLIMITED")), found.get("State", "UP"))


def allocation_of(job_id: str, line: str) -> Allocation:
    found = fields_of(line)
    nodes = found.get("NodeList", "")
    return Allocation(job_id, found.get("JobState", "UNKNOWN"), found.get("Reason", "None"),
                      "" if nodes == "(null)" else nodes)


def refusals(spec: ClusterSpec, partition: Partition) -> list[str]:
    """Every reason the partition cannot give this allocation, one line each; [] when it can."""
    problems = []
    if spec.nodes > partition.nodes:
        problems.append(f"{option('nodes')}={spec.nodes} is more than {option('partition')}={partition.name!r} has "
                        f"({partition.nodes}); allowed: 1..{partition.nodes}")
    if partition.max_minutes is not None and minutes_of(spec.max_hours) > partition.max_minutes:
        problems.append(f"{option('max_hours')}={spec.max_hours:g} is more than {option('partition')}="
                        f"{partition.name!r} allows ({partition.max_minutes} min); allowed: up to "
                        f"{partition.max_minutes / 60:g}")
    if partition.state == "INACTIVE":
        problems.append(f"{option('partition')}={partition.name!r} is INACTIVE: it takes no jobs; ask its admin, or "
                        "give another (`sinfo -s` lists them)")
    return problems


def waiting_line(allocation: Allocation, waited_s: float) -> str:
    """What a pending allocation shows: its state, Slurm's reason, how long so far. Pure."""
    return (f"allocation {allocation.job_id}: {allocation.state} ({allocation.reason}), waiting {waited_s:.0f} s; "
            "Ctrl-C cancels it")


def ended_line(allocation: Allocation) -> str:
    """An allocation that is over, by name and with Slurm's reason. Pure."""
    return f"Slurm allocation {allocation.job_id} is {allocation.state} ({allocation.reason})"


def resources(state: st.ClusterState) -> SlurmResources:
    if not isinstance(state.resources, SlurmResources):
        raise TypeError(f"cluster {state.name}: {type(state.resources).__name__} is not a Slurm cluster's record")
    return state.resources


def poll_s() -> float:
    return from_env(os.environ, POLL_VARIABLE, number(0, 60), 1.0)


# ---- the edge: Slurm's commands, here or on LOGIN ----------------------------------------------

def login_of(spec: ClusterSpec) -> str:
    """LOGIN: user@host:port of the login node whose Slurm commands ftc runs; '' for this machine's."""
    return spec.settings["login"]


def where(spec: ClusterSpec, argv: list[str]) -> list[str]:
    """`argv` as it runs: here, or through ssh on LOGIN (your key: SSH_KEY, else your agent and ~/.ssh).
    LOGIN's host key: the one your known_hosts has, else the one it showed ftc first (pinned in
    $FTC_HOME/login_known_hosts, and any other refused from then on)."""
    if not login_of(spec):
        return argv
    user, host, port = parse_host(login_of(spec))
    key = ["-i", spec.ssh_key, "-o", "IdentitiesOnly=yes"] if spec.ssh_key else []
    target = f"{user}@{host}" if user else host
    known = f"-oUserKnownHostsFile={st.ftc_home() / 'login_known_hosts'} ~/.ssh/known_hosts"
    return ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "StrictHostKeyChecking=accept-new",
            known, "-p", str(port), *key, target, "--", shlex.join(argv)]


def slurm(spec: ClusterSpec, argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    """One Slurm command, where(): here, or on LOGIN."""
    if login_of(spec):
        st.ftc_home().mkdir(parents=True, exist_ok=True)
    argv = where(spec, argv)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)  # noqa: S603 - argv
    except FileNotFoundError:
        raise FtcError(f"{argv[0]} is not on this machine's PATH; run ftc where Slurm's commands are, or give "
                       f"{option('login')}=user@login-node") from None
    if check and done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        raise FtcError(f"`{' '.join(argv[:2])}` failed: {said[-1] if said else f'exit {done.returncode}'}")
    return done


def check_settings() -> None:
    from_env(os.environ, POLL_VARIABLE, number(0, 60), 1.0)


def _reachable(spec: ClusterSpec) -> None:
    """Slurm answers: this machine has sbatch, or LOGIN logs in and has it there."""
    if not login_of(spec):
        if not shutil.which("sbatch"):
            raise UsageError(f"no sbatch on this machine's PATH and no {option('login')}; run ftc where Slurm's "
                             f"commands are, or give {option('login')}=user@login-node")
        return
    problem = key_problem(spec.ssh_key) if spec.ssh_key else ""
    if problem:
        raise UsageError(f"{option('ssh_key')}={spec.ssh_key!r} {problem}; give an unencrypted private key")
    done = slurm(spec, ["sh", "-c", "command -v sbatch"], check=False)
    if done.returncode == 255:
        said = (done.stderr.strip().splitlines() or ["no answer"])[-1]
        raise UsageError(f"{option('login')}={login_of(spec)!r} refused ftc's login ({said}); check {option('ssh_key')} "
                         f"or your ssh agent, and that `ssh {login_of(spec).rsplit(':', 1)[0]}` works")
    if done.returncode != 0:
        raise UsageError(f"{option('login')}={login_of(spec)!r} has no sbatch on its PATH; give a Slurm login node")


def confirm(state: st.ClusterState, yes: bool) -> None:
    """Before anything is queued: Slurm answers, and the partition can give this allocation."""
    spec = state.cluster_spec
    if spec.ssh_key and not login_of(spec):
        problem = key_problem(spec.ssh_key)
        if problem:
            raise UsageError(f"{option('ssh_key')}={spec.ssh_key!r} {problem}; give an unencrypted private key that "
                             "logs in to the nodes, or leave it out to use your ssh agent and ~/.ssh keys")
    _reachable(spec)
    found = slurm(spec, ["scontrol", "show", "partition", "-o", spec.settings["partition"]], check=False)
    if found.returncode != 0 or not found.stdout.strip():
        known = slurm(spec, ["sinfo", "-h", "-o", "%R"], check=False).stdout.split()
        raise UsageError(f"{option('partition')}={spec.settings['partition']!r} is not a partition of this Slurm; allowed: "
                         f"{', '.join(sorted(set(known))) or '(sinfo lists none)'}")
    partition = partition_of(found.stdout.strip().splitlines()[0])
    problems = refusals(spec, partition)
    if problems:
        raise own.refusal(problems)
    resources(state).claim = secrets.token_hex(16)
    where = f"through {login_of(spec)}" if login_of(spec) else "on this machine"
    console.print(f"Slurm ({where}): partition {partition.name} ({partition.state}, {partition.nodes} node(s)), "
                  f"asking for {spec.nodes} exclusive node(s) for {minutes_of(spec.max_hours)} min", markup=False)


def launch(state: st.ClusterState, record: Record) -> None:
    spec = state.cluster_spec
    job_id = slurm(spec, sbatch_argv(spec)).stdout.strip().split(";")[0]
    found = resources(state)
    found.job_id = job_id
    record()
    console.print(f"queued Slurm allocation {job_id} ({job_name(state.name)})", markup=False)
    running = _until_running(state)
    names = slurm(spec, ["scontrol", "show", "hostnames", running.nodes]).stdout.split()
    addresses = _addresses(spec, names)
    user = (parse_host(login_of(spec))[0] if login_of(spec) else "") or getpass.getuser()
    checked, unreached = _over_ssh(state, names, [own.Host(user, addresses[name], SSH_PORT) for name in names])
    console.print(reach_line(job_id, unreached), markup=False, soft_wrap=True)
    if any(unreached):
        found.reach = SRUN
        record()
        checked = _through_srun(state, names, user)
    else:
        found.reach = SSH
    # each node goes by Slurm's name for it (ftc status, messages); the nodes reach each other at its address
    found.hosts = [replace(host, label=name, ip=addresses[name]) for name, host in zip(names, checked)]
    own.launch(state, record, per_node=True)  # the nodes' homes may be one (NFS): a directory per node


def _until_running(state: st.ClusterState) -> "Allocation":
    """Poll the allocation until it runs, showing its state and reason on change (a tty: one line,
    redrawn); one that ends first is a failure naming Slurm's reason."""
    spec, job_id = state.cluster_spec, resources(state).job_id
    started, shown = time.monotonic(), ""
    tty = sys.stderr.isatty()
    while True:
        now = _allocation(spec, job_id)
        if now.state == "RUNNING":
            if tty and shown:
                print(file=sys.stderr)
            console.print(f"allocation {job_id} runs on {now.nodes}", markup=False)
            return now
        if not now.live:
            raise FtcError(f"{ended_line(now)} before it ran; `{command('up', name=state.name)}` asks again")
        if now.reason in IN_VAIN:
            raise FtcError(f"Slurm allocation {job_id} is {now.state} ({now.reason}): it does not start by waiting, "
                           f"so ftc cancels it; `scontrol show job {job_id}` and the site's admin say why")
        line = waiting_line(now, time.monotonic() - started)
        if tty:
            print(f"\r{line}\033[K", end="", file=sys.stderr, flush=True)
        elif (now.state, now.reason) != shown:
            console.print(line, markup=False)
        shown = (now.state, now.reason) if not tty else line
        time.sleep(poll_s())


def _answer(spec: ClusterSpec, argv: list[str], what: str) -> subprocess.CompletedProcess:
    """Slurm's answer to `argv` (asked to `what`). A Slurm that does not answer (slurmctld busy, LOGIN's ssh
    timing out) is asked again, for up to GONE_WITHIN_S: its silence is no answer. Its saying it does not
    know a job is one."""
    deadline = time.monotonic() + GONE_WITHIN_S
    while True:
        done = slurm(spec, argv, check=False)
        if done.returncode == 0 or FORGOTTEN in done.stderr:
            return done
        if time.monotonic() > deadline:
            said = (done.stderr.strip() or f"exit {done.returncode}").splitlines()[-1]
            raise FtcError(f"Slurm did not {what} for {GONE_WITHIN_S} s ({said}); `{shlex.join(argv)}` asks it again")
        time.sleep(poll_s())


def _allocation(spec: ClusterSpec, job_id: str) -> Allocation:
    """The allocation as Slurm tells it: over once Slurm no longer knows the job (past MinJobAge it forgets it)."""
    done = _answer(spec, ["scontrol", "show", "job", "-o", job_id], f"say how allocation {job_id} stands")
    line = done.stdout.strip().splitlines()[:1] if done.returncode == 0 else []
    return allocation_of(job_id, line[0]) if line else Allocation(job_id, "GONE", "no longer known to Slurm", "")


def _settled(spec: ClusterSpec, job_id: str) -> Allocation:
    """The allocation's state; one that is COMPLETING (Slurm ends its steps: KillWait after a cancel or its
    time limit, GraceTime after a preemption, while the batch script holds on for the job's checkpoint) is
    waited for, up to GONE_WITHIN_S, so that it is named by the state it ends in, which says why."""
    deadline = time.monotonic() + GONE_WITHIN_S
    now = _allocation(spec, job_id)
    while now.state == "COMPLETING" and time.monotonic() < deadline:
        time.sleep(poll_s())
        now = _allocation(spec, job_id)
    return now


def _addresses(spec: ClusterSpec, names: list[str]) -> dict[str, str]:
    """Each node's NodeAddr: where Slurm itself reaches it, so where ssh does."""
    out = slurm(spec, ["scontrol", "show", "node", "-o", ",".join(names)]).stdout
    found = {}
    for line in out.splitlines():
        words = fields_of(line)
        if words.get("NodeName"):
            found[words["NodeName"]] = words.get("NodeAddr") or words["NodeName"]
    return {name: found.get(name, name) for name in names}


def _over_ssh(state: st.ClusterState, names: list[str], hosts: list[own.Host]) -> tuple[list, list[str]]:
    """Every node over ssh at its address: (what each check found, why ssh did not reach each node, '' where
    it did). A node that answers and logs you in but fails a check (its Python, its disk) is a refusal."""
    read = own.each(hosts, own.read_key)
    unreached = [f"{name} ({host.address}) does not answer ssh on port {SSH_PORT} from here" if why else ""
                 for name, host, (_, why) in zip(names, hosts, read)]
    if any(unreached):
        return [], unreached
    checked = own.each(list(zip(hosts, [key for key, _ in read])),
                       lambda pair: own.check_host(state, *pair, one_cluster=False))
    unreached = [f"{name} ({host.address}) answers ssh but {lines[0].split(': ', 1)[-1]}" if found is None else ""
                 for name, host, (found, lines) in zip(names, hosts, checked)]
    if any(unreached):
        return [], unreached
    _pinned(names, hosts, [key for key, _ in read])
    return _passed(checked), unreached


def _through_srun(state: st.ClusterState, names: list[str], user: str) -> list:
    """Start every node's private sshd (the batch script's step), read each one's host key through srun,
    then check every node as over ssh."""
    spec, job_id = state.cluster_spec, resources(state).job_id
    slurm(spec, ["scancel", "--signal=USR1", "--batch", job_id])
    deadline, keys = time.monotonic() + SSHD_WITHIN_S, {}
    while len(keys) < len(names):
        for name in [n for n in names if n not in keys]:
            done = slurm(spec, sshd_ready_argv(job_id, name), check=False)
            if done.returncode == 0 and done.stdout.strip():
                keys[name] = " ".join(done.stdout.split()[:2])
        if len(keys) < len(names):
            if time.monotonic() > deadline:
                missing = ", ".join(n for n in names if n not in keys)
                raise FtcError(f"no private sshd answered on {missing} within {SSHD_WITHIN_S} s of asking: reaching "
                               "nodes through srun needs OpenSSH's sshd and ssh-keygen, and python3, on every node: "
                               "the allocation is cancelled")
            time.sleep(poll_s())
    hosts = [own.Host(user, name, SSH_PORT) for name in names]  # reached by name, through relay()
    _pinned(names, hosts, [keys[name] for name in names])
    return _passed(own.each(list(zip(hosts, [keys[name] for name in names])),
                            lambda pair: own.check_host(state, *pair, one_cluster=False)))


def _pinned(names: list[str], hosts: list[own.Host], keys: list[str]) -> None:
    """Each node's host key, shown: pinned without a question, as the scheduler named the node."""
    for name, host, key in zip(names, hosts, keys):
        console.print(f"node {name} ({host.address}): {key.split()[0]} key {fingerprint(key)}, pinned", markup=False)


def _passed(checked: list) -> list:
    """What every node's check found; any node's problem fails `up`, every one named."""
    problems = [line for _, lines in checked for line in lines]
    if problems:
        raise FtcError("\nerror: ".join(problems) + "\nerror: the allocation is cancelled")
    return [found for found, _ in checked]


def relay(state: st.ClusterState, node: st.NodeInfo, from_node: bool = False) -> str:
    """Where the nodes are reached through srun: the relay to `node`'s private sshd (its address is Slurm's
    name for it), from the controller (here, or through LOGIN) or from another node; else ''."""
    found = resources(state)
    if found.reach != SRUN:
        return ""
    argv = relay_argv(found.job_id, node.public_ip)
    # on a node its stderr would go into a job's output: Slurm's note that the relay's step ended as ssh closed
    return f"{shlex.join(argv)} 2>/dev/null" if from_node else shlex.join(where(state.cluster_spec, argv))


def wait(state: st.ClusterState, record: Record) -> None:
    """launch returns with every node logged in to and claimed: nothing to wait for."""


def terminate(state: st.ClusterState, record: Record) -> None:
    """What ftc put on the nodes first (while the allocation still lets ssh in), then the allocation."""
    spec = state.cluster_spec
    left = None
    try:
        if state.nodes:
            own.terminate(state, lambda: None)  # the nodes stay recorded until the allocation is gone too
    except FtcError as exc:
        left = exc
    job_ids = ({resources(state).job_id} - {""}) | set(_queued_by_name(spec, state.name))
    for job_id in sorted(job_ids):
        _cancel(spec, job_id)
    if left:
        record()
        raise left
    state.nodes = []


def _queued_by_name(spec: ClusterSpec, cluster: str) -> list[str]:
    """This user's jobs named after the cluster: one sbatch queued and ftc stopped before it was recorded."""
    if not login_of(spec) and not shutil.which("squeue"):  # no Slurm here: nothing of it queued from here either
        return []
    return _answer(spec, ["squeue", "-h", "--me", f"--name={job_name(cluster)}", "-o", "%i"],
                   "list this cluster's allocations").stdout.split()


def _cancel(spec: ClusterSpec, job_id: str) -> None:
    # the batch script first, by SIGKILL: ended by ftc, it writes no notice (scancel's SIGTERM would have it
    # write one and hold the nodes until Slurm's KillWait); then the rest, each step's SIGTERM
    slurm(spec, ["scancel", "--batch", "--signal=KILL", job_id], check=False)
    slurm(spec, ["scancel", job_id], check=False)
    deadline = time.monotonic() + GONE_WITHIN_S
    while _allocation(spec, job_id).live:
        if time.monotonic() > deadline:
            raise FtcError(f"Slurm allocation {job_id} is still in the queue {GONE_WITHIN_S} s after scancel; "
                           f"`squeue -j {job_id}` shows why; `scancel {job_id}` again, or ask the site's admin")
        time.sleep(poll_s())
    console.print(f"Slurm allocation {job_id} cancelled", markup=False)


def query(state: st.ClusterState) -> list[NodeStatus]:
    job_id = resources(state).job_id
    if not job_id:
        return [NodeStatus(node.id, "unknown", "no allocation recorded") for node in state.nodes]
    now = _settled(state.cluster_spec, job_id)
    if now.state != "RUNNING":
        return [NodeStatus(node.id, "dead", ended_line(now)) for node in state.nodes]
    return [NodeStatus(live.id, live.state, f"Slurm allocation {job_id}" if live.state == "running" else live.detail)
            for live in own.query(state)]
