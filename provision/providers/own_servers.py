"""The ssh provider: servers you already have, `PROVIDER=ssh HOSTS=user@host[:port],...`.

ftc creates no machine here; the provider contract still holds (providers/__init__.py):

    confirm    before anything exists: read each host's key and show its fingerprint; you
               trust them (a question on a terminal, or YES=1, said on stderr); then log in
               and check each host (Linux x86-64, a Python >= 3.11 to use or build a venv
               from, free disk, no other ftc cluster). Any problem: one line per problem,
               exit 2, nothing changed anywhere.
    launch     claim one directory per cluster on each host, $HOME/.ftc-node/<cluster>/,
               holding a token only this cluster's state knows
    wait       nothing to wait for: the servers run, and the claim logged in to each
    terminate  on each host: stop the processes ftc can prove are its own, take out the one
               authorized_keys line it added, remove the directory; the servers stay
    query      each host: is ftc's directory there

Everything ftc puts on a host (venv, keys, hostfile, facts, jobs, caches) lies in that
directory. The one change outside it: the cluster-internal public key appended to the
account's ~/.ssh/authorized_keys (and the file or ~/.ssh created only when missing), so the
nodes reach each other for mpirun; what was created or added is noted there and removed
exactly. The decisions (hosts, fingerprints, the checks' verdicts, the scripts) are pure
functions; ssh happens at the edges below.
"""

import getpass
import ipaddress
import secrets
import shlex
import socket
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import paramiko

from .. import procs
from .. import state as st
from ..errors import FtcError, UsageError, command, option, switch_on
from ..spec import ClusterSpec
from ..ssh import StepFailed, connect, fetch_host_key, fingerprint, key_problem, run
from ..templates import render
from ..ui import console
from ..values import host_label, parse_host
from .records import HostCheck, NodeStatus, Record, SshResources

ROOT = ".ftc-node"  # under $HOME; not ~/.ftc, which is the controller's own state when a host is this machine
MADE_BY_FTC = ".made-by-ftc"  # in ROOT, when ftc created ROOT: a ROOT that was there before up stays after down
MIN_PYTHON = "3.11"
STACK_MODULES = ("torch", "transformers", "tokenizers")  # what STACK_PYTHON must import
FREE_GB_WITH_STACK_PYTHON = 2  # jobs, logs, checkpoints
FREE_GB_TO_INSTALL = 10  # plus the stack's venv (CPU torch and friends: about 5 GB)
CHECK_ATTEMPTS = 1  # the servers exist: no boot to wait for
# What host_cleanup.sh.j2 echoes when it is done (rendered into it: the script and its reader share these).
CLEANED = "CLEANED"  # the cluster's directory is gone (or was never there)
NOT_OURS = "NOT_OURS"  # the directory holds another claim than this cluster's: left as it is


# ---- pure: what the hosts are, and what their answers mean ----------------------------------

@dataclass(frozen=True)
class Host:
    user: str
    address: str  # as you gave it: a name or an address
    port: int

    @property
    def label(self) -> str:
        return host_label(self.user, self.address, self.port)


def hosts_of(spec: ClusterSpec, local_user: str) -> list[Host]:
    """HOSTS, in order (node 0 first); a host without user@ is logged in to as you, as ssh does."""
    parsed = [parse_host(text) for text in spec.hosts]
    return [Host(user or local_user, address, port) for user, address, port in parsed]


def workdir_of(home: str, cluster: str, node: str = "") -> str:
    """The cluster's directory on a host; `node` names it per node (`<cluster>.<node>`: a cluster name has
    no dot), for nodes that may share one home (a Slurm cluster's, over NFS)."""
    return f"{home.rstrip('/')}/{ROOT}/{cluster}{'.' + node if node else ''}"


def probe_script(label: str, stack_python: str) -> str:
    return render("host_probe.sh.j2", label=label, root=ROOT, stack_python=stack_python, min_python=MIN_PYTHON,
                  modules=STACK_MODULES)


def parse_probe(output: str) -> dict[str, list[str]]:
    """The probe's key=value lines; a key may repeat (one `cluster=` per cluster found)."""
    found: dict[str, list[str]] = {}
    for line in output.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def _version(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split("."))
    except ValueError:
        return ()


def verdicts(label: str, probe: dict[str, list[str]], stack_python: str, one_cluster: bool = True) -> list[str]:
    """Every problem that keeps ftc off this host, one line each; [] when it may go ahead. `one_cluster`:
    another ftc cluster's directory there is one (a server is one cluster's; a node a scheduler lends
    exclusively is not, whatever its shared home holds)."""
    one = {key: values[-1] for key, values in probe.items()}
    problems = []
    system = f"{one.get('os', '?')} {one.get('arch', '?')}"
    if (one.get("os"), one.get("arch")) != ("Linux", "x86_64"):
        problems.append(f"host {label}: {system}, not Linux x86-64; ftc's stacks are built for x86-64 Linux")
    problems += _python_verdicts(label, one, stack_python)
    need_gb = FREE_GB_WITH_STACK_PYTHON if stack_python else FREE_GB_TO_INSTALL
    free_gb = int(one.get("free_kb") or 0) / 2**20
    if free_gb < need_gb:
        install = "" if stack_python else f" to install the stack (or give {option('stack_python')})"
        problems.append(f"host {label}: {free_gb:.1f} GB free in {one.get('home', '$HOME')}, ftc needs {need_gb} GB"
                        f"{install}")
    for cluster in probe.get("cluster", []) if one_cluster else []:
        where = workdir_of(one.get("home", "~"), cluster)
        problems.append(f"host {label}: ftc cluster {cluster!r} is already there ({where}); one ftc cluster per "
                        f"server: `{command('down', name=cluster)}` from the controller that made it, or, if that is gone, "
                        f"remove {where} and the authorized_keys line ending 'ftc-{cluster}-internal' by hand")
    return problems


def _python_verdicts(label: str, one: dict[str, str], stack_python: str) -> list[str]:
    version = _version(one.get("python_version", ""))
    if stack_python:
        if not one.get("python") or not version:
            return [f"host {label}: {option('stack_python')}={stack_python!r} does not run there; give the path of a Python "
                    f"that has the stack on every host, or leave {option('stack_python')} out and ftc installs one"]
        problems = []
        if version < _version(MIN_PYTHON):
            problems.append(f"host {label}: {option('stack_python')}={stack_python!r} is Python {one['python_version']}; "
                            f"ftc needs >= {MIN_PYTHON}")
        if one.get("missing"):
            problems.append(f"host {label}: {option('stack_python')}={stack_python!r} lacks {one['missing'].replace(',', ', ')}; "
                            f"install them there, or leave {option('stack_python')} out and ftc installs its own stack")
        if one.get("mpirun") != "yes":
            problems.append(f"host {label}: no mpirun beside {option('stack_python')}={stack_python!r} or on PATH; "
                            "install impi-rt into that Python (`pip install impi-rt`)")
        return problems
    if not one.get("python"):
        found = one.get("python3_version") or "none"
        return [f"host {label}: no Python >= {MIN_PYTHON} with venv and ensurepip (python3: {found}); ftc installs "
                f"no system package: install one there (e.g. python3.11-venv), or give {option('stack_python')}"]
    return []


def cleanup_script(state: st.ClusterState, node: st.NodeInfo) -> str:
    """The host's side of destroy: stop this cluster's processes, undo its authorized_keys line,
    remove its directory; nothing at all when the directory holds another claim than ours."""
    stop_jobs = [procs.stop_group_command(pid, job.pid_start) for job in state.jobs if job.state == "running"
                 for pid in job.pids_by_node.get(node.name, [])]
    return render("host_cleanup.sh.j2", cluster=state.name, label=node.id, workdir=node.workdir, root=ROOT,
                  made_by_ftc=MADE_BY_FTC, cleaned=CLEANED, not_ours=NOT_OURS,
                  authorized_keys=node.authorized_keys, stop_jobs=stop_jobs, claim=resources(state).claim,
                  node_dirs=sorted({n.workdir for n in state.nodes}))


def same_servers(hosts: list[Host], addresses: list[str]) -> str:
    """The first two hosts that are one account on one server under two spellings (127.0.0.2,
    127.000.000.002 and 127.2 are one address), as a refusal; '' when every host is its own. Two
    accounts on one server are two nodes (each its own directory), as before. `addresses` are the
    hosts' resolved addresses ('' where unresolved: left to the reachability check). Pure."""
    seen: dict[tuple[str, str, int], Host] = {}
    for host, address in zip(hosts, addresses):
        if not address:
            continue
        first = seen.setdefault((host.user, address, host.port), host)
        if first is not host:
            return (f"HOSTS names one server twice: {first.label} and {host.label} are both "
                    f"{host.user}@{address}:{host.port}; give each server once")
    return ""


def resources(state: st.ClusterState) -> SshResources:
    """The state's record of your servers as confirm checked them, and the claim."""
    if not isinstance(state.resources, SshResources):
        raise TypeError(f"cluster {state.name}: {type(state.resources).__name__} is not an ssh cluster's record")
    return state.resources


def _sh(script: str) -> str:
    """A script for any login shell: POSIX sh runs it."""
    return f"/bin/sh -c {shlex.quote(script)}"


def refusal(problems: list[str]) -> UsageError:
    """One line per problem: the CLI prints the first after 'error: ', so each starts alike."""
    return UsageError("\nerror: ".join(problems))


# ---- the edges: ssh to each host --------------------------------------------------------------

def _probe_node(host: Host, index: int, host_key: str = "") -> st.NodeInfo:
    return st.NodeInfo(index=index, name=host.label, id=host.label, public_ip=host.address, private_ip=host.address,
                       ssh_user=host.user, ssh_port=host.port, host_key=host_key)


def each(items: list, work) -> list:
    """work(item) for every item at once (a thread each); results in order."""
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(items)))) as pool:
        return list(pool.map(work, items))


def _resolve(host: Host) -> str:
    """The address ssh would connect to for this host ('' when the name does not resolve)."""
    try:
        address = socket.getaddrinfo(host.address, host.port, type=socket.SOCK_STREAM)[0][4][0]
    except (OSError, UnicodeError):
        return ""
    mapped = ipaddress.ip_address(address.split("%")[0])
    # [::ffff:a.b.c.d] is a.b.c.d reached over IPv6's mapped form: one server, whichever way it is written
    return str(mapped.ipv4_mapped) if mapped.version == 6 and mapped.ipv4_mapped else address


def read_key(host: Host) -> tuple[str, str]:
    """(host key, '') or ('', why it could not be read)."""
    try:
        return fetch_host_key(_probe_node(host, 0)), ""
    except Exception as exc:  # noqa: BLE001 - any failure to reach it is the one-line verdict
        return "", f"host {host.label}: unreachable ({exc or type(exc).__name__}); check the address and port, " \
                   "and that sshd runs there"


def _trust(hosts: list[Host], keys: list[str], yes: bool) -> None:
    """Trust on first use, but not blindly: you see each fingerprint and say yes, or YES=1 does."""
    for host, key in zip(hosts, keys):
        console.print(f"host {host.label}: {key.split()[0]} key {fingerprint(key)}", markup=False)
    if yes:
        console.print(f"{switch_on('yes')}: trusting these host keys without asking; ftc pins them and refuses any other later "
                      "(compare with `ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub` on each server)", markup=False)
        return
    if not sys.stdin.isatty():
        raise UsageError("the host keys above are not confirmed and there is no terminal to ask on; check the "
                         f"fingerprints, then add {switch_on('yes')} to trust them; nothing changed")
    for host, key in zip(hosts, keys):
        if input(f"trust {host.label} ({fingerprint(key)})? [y/N] ").strip().lower() not in ("y", "yes"):
            raise UsageError(f"host {host.label}: its key was not trusted; nothing changed")


def check_host(state: st.ClusterState, host: Host, key: str, one_cluster: bool = True
               ) -> tuple[HostCheck | None, list[str]]:
    spec = state.cluster_spec
    node = _probe_node(host, 0, key)
    try:
        with connect(state, node, attempts=CHECK_ATTEMPTS) as conn:
            probe = parse_probe(run(conn, node, "check", _sh(probe_script(host.label, spec.stack_python))))
            address = conn.client.get_transport().getpeername()[0]
            no_sftp = _sftp_missing(conn, host.label)
    except StepFailed as exc:
        return None, [f"host {host.label}: {str(exc).split('failed: ', 1)[-1]}"]
    one = {k: v[-1] for k, v in probe.items()}
    found = HostCheck(label=host.label, user=host.user, address=host.address, port=host.port, host_key=key,
                      ip=address, home=one.get("home", ""))
    return found, verdicts(host.label, probe, spec.stack_python, one_cluster) + no_sftp


def _sftp_missing(conn, label: str) -> list[str]:
    """Results and checkpoints come home over SFTP: a server whose sshd offers no SFTP subsystem is
    refused now, by name, rather than failing the first copy with paramiko's "Channel closed"."""
    try:
        conn.sftp()
    except paramiko.SFTPError:  # the subsystem runs through the login shell, and that printed first
        return [f"host {label}: its SFTP (which ftc copies results with) is garbled by what the shell's start-up "
                "files print (an echo in ~/.bashrc?); print only in interactive shells (`[[ $- == *i* ]] || return` "
                "before it), or use `Subsystem sftp internal-sftp` in its sshd_config"]
    except (EOFError, OSError, paramiko.SSHException) as exc:
        transport = conn.client.get_transport()
        if transport is None or not transport.is_active():  # the connection itself went, not the subsystem
            return [f"host {label}: the connection closed as ftc opened SFTP, which it copies results with "
                    f"({exc or type(exc).__name__}); check that the server and its sshd stay up, and try again"]
        return [f"host {label}: its sshd offers no SFTP subsystem, which ftc copies results with; add "
                "`Subsystem sftp internal-sftp` to its sshd_config and reload sshd"]
    return []


def confirm(state: st.ClusterState, yes: bool) -> None:
    """Every check before anything exists: keys read, trusted, hosts checked; refuse on any problem."""
    spec = state.cluster_spec
    problem = key_problem(spec.ssh_key) if spec.ssh_key else ""
    if problem:
        raise UsageError(f"{option('ssh_key')}={spec.ssh_key!r} {problem}; give an unencrypted private key that logs "
                         f"in to your servers, or leave {option('ssh_key')} out to use your ssh agent and ~/.ssh keys")
    hosts = hosts_of(spec, getpass.getuser())
    twice = same_servers(hosts, each(hosts, _resolve))
    if twice:
        raise UsageError(twice)
    read = each(hosts, read_key)
    problems = [why for _, why in read if why]
    if problems:
        raise refusal(problems)
    keys = [key for key, _ in read]
    _trust(hosts, keys, yes)
    checked = each(list(zip(hosts, keys)), lambda pair: check_host(state, *pair))
    problems = [line for _, lines in checked for line in lines]
    if problems:
        raise refusal(problems)
    resources(state).hosts = [found for found, _ in checked if found]
    resources(state).claim = secrets.token_hex(16)
    console.print(f"checked {len(hosts)} host(s): Linux x86-64, Python, disk, no other ftc cluster")


def launch(state: st.ClusterState, record: Record, per_node: bool = False) -> None:
    """Record every node first (so an interruption loses none), then claim its directory (`per_node`:
    one named after the node, workdir_of)."""
    for index, found in enumerate(resources(state).hosts):
        home = found.home
        state.nodes.append(st.NodeInfo(
            index=index, name=f"{state.name}-{index}", id=found.label, public_ip=found.address,
            private_ip=found.ip, ssh_user=found.user, ssh_port=found.port,
            workdir=workdir_of(home, state.name, found.label if per_node else ""),
            authorized_keys=f"{home.rstrip('/')}/.ssh/authorized_keys",
            host_key=found.host_key))
    record()
    claim = resources(state).claim

    def claim_dir(node: st.NodeInfo) -> None:
        wd = shlex.quote(node.workdir)
        # mkdir without -p: a directory already there is another cluster's, and up stops
        # the root (~/.ftc-node) gets MADE_BY_FTC only when ftc creates it: destroy removes it only then
        root = shlex.quote(str(Path(node.workdir).parent))
        with connect(state, node, attempts=CHECK_ATTEMPTS) as conn:
            run(conn, node, "claim", f"umask 077 && {{ [ -d {root} ] || {{ mkdir -p {root} && : > {root}/{MADE_BY_FTC}; "
                                     f"}}; }} && mkdir {wd} && mkdir {wd}/.ftc && echo {claim} > {wd}/.ftc/claim")
    each(state.nodes, claim_dir)


def wait(state: st.ClusterState, record: Record) -> None:
    """The servers already run, and launch has just logged in to each: nothing to wait for."""


def terminate(state: st.ClusterState, record: Record) -> None:
    """On every host at once: stop, unappend, remove. A host that cannot be cleaned (unreachable,
    hung, or presenting another key) is named with the reason and what is left there, and stays
    recorded, alone, so that `ftc down` again finishes the job once it answers (and a finished
    job's results there can still be fetched meanwhile); the cleaned ones are forgotten."""
    def clean(node: st.NodeInfo) -> str:
        try:
            with connect(state, node, attempts=3) as conn:
                out = run(conn, node, "destroy", _sh(cleanup_script(state, node)))
        except StepFailed as exc:
            left = f"host {node.id}: not cleaned ({str(exc).split('failed: ', 1)[-1]}); left there: {node.workdir} " \
                   f"and the line ending 'ftc-{state.name}-internal' in {node.authorized_keys}"
            # a server that presents another key is never logged in to again: only you can remove what is there
            return (left + ": remove them by hand", False) if "host key mismatch" in str(exc) else (left, True)
        if NOT_OURS in out:  # launch stopped before its claim: the directory there is another's
            console.print(f"host {node.id}: {node.workdir} holds another claim than this cluster's; left as it is",
                          markup=False)
        done = CLEANED in out or NOT_OURS in out
        return ("", False) if done else (f"host {node.id}: cleanup said {out.strip()[-200:]}", False)
    if not state.nodes:
        console.print(f"no servers recorded for {state.name!r}; if it ran on yours, what ftc left there is "
                      f"$HOME/{ROOT}/{state.name} and the authorized_keys line ending 'ftc-{state.name}-internal'",
                      markup=False)
        return
    outcomes = each(state.nodes, clean)  # (what is left there, whether a later down can finish it)
    lines = [line for line, _ in outcomes if line]
    if not lines:
        return
    state.nodes = [node for node, (_, retry) in zip(state.nodes, outcomes) if retry]
    record()  # no node left to retry: the cluster is forgotten
    if not state.nodes:
        raise FtcError("\nerror: ".join(lines))
    raise FtcError("\nerror: ".join(lines) + f"\nerror: cluster {state.name} stays recorded with {len(state.nodes)} "
                   f"server(s) to clean: `ftc down --name {state.name}` again once they answer finishes it (a server "
                   f"gone for good: remove what is left there by hand, then {st.cluster_dir(state.name)})")


def query(state: st.ClusterState) -> list[NodeStatus]:
    def look(node: st.NodeInfo) -> NodeStatus:
        try:
            with connect(state, node, attempts=CHECK_ATTEMPTS, next_step="") as conn:  # status gives the advice
                there = run(conn, node, "status", f"test -d {shlex.quote(node.workdir)} && echo yes || true").strip()
        except StepFailed as exc:
            return NodeStatus(node.id, "dead", str(exc).split("failed: ", 1)[-1][:120])
        if there != "yes":
            return NodeStatus(node.id, "missing", f"{node.workdir} is gone")
        return NodeStatus(node.id, "running", "yours: no cost")
    return each(state.nodes, look) if state.nodes else []
