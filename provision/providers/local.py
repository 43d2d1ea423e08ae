"""The local provider: N real OpenSSH servers on this machine, one per node.

Node i listens on 127.0.0.(2+i) at a free port, has its own host key and its own
directory under the cluster's state dir, and is pinned to a disjoint share of this
machine's CPUs (sched_setaffinity before exec, so every process started through
that sshd inherits the share). Nothing here touches the user's own ~/.ssh.
"""

import getpass
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

from runner.node.distenv import listen_port

from .. import procs
from .. import state as st
from ..errors import FtcError, option
from ..keys import keygen
from ..templates import render
from ..ui import console
from .records import NodeStatus, Record

FIRST_ADDRESS = 2  # 127.0.0.2: leave 127.0.0.1 to whatever already listens there
START_MARK = b"ftc: starting sshd on"  # a line ftc writes to sshd.log before each start


def split_cores(cores: list[int], n: int) -> list[list[int]]:
    """Disjoint, contiguous, equal-as-possible shares; when n > cores, nodes share round-robin."""
    cores = sorted(cores)
    if n > len(cores):
        return [[cores[i % len(cores)]] for i in range(n)]
    base, extra = divmod(len(cores), n)
    shares, start = [], 0
    for i in range(n):
        size = base + (1 if i < extra else 0)
        shares.append(cores[start:start + size])
        start += size
    return shares


def node_address(index: int) -> str:
    return f"127.0.0.{FIRST_ADDRESS + index}"


def _sshd() -> str:
    path = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)
    if not path:
        raise FtcError("sshd not found: the local provider runs real OpenSSH servers; "
                       "install it with `make setup` (or `apt-get install openssh-server`)")
    return path


def _sftp_server() -> str:
    for candidate in ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server", "/usr/lib/ssh/sftp-server"):
        if Path(candidate).exists():
            return candidate
    return "internal-sftp"


def ensure_access_key(name: str) -> str:
    """The controller's key for this cluster; returns the public key line."""
    key = st.access_key_path(name)
    if not key.exists():
        keygen(key, f"ftc-{name}-access")
    return key.with_suffix(".pub").read_text().strip()


def launch(state: st.ClusterState, record: Record) -> None:
    spec = state.cluster_spec
    sshd = _sshd()
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # Debian's sshd wants its privsep dir
    cores = sorted(os.sched_getaffinity(0))
    if spec.nodes > len(cores):
        console.print(f"[yellow]warning:[/] {option('nodes')}={spec.nodes} is more than this machine's {len(cores)} cores: "
                      "nodes will share cores, so timings are not those of separate machines")
    shares = split_cores(cores, spec.nodes)
    access_pub = ensure_access_key(state.name)
    for index in range(spec.nodes):
        node_dir = st.cluster_dir(state.name) / "nodes" / str(index)
        node_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        host_key = node_dir / "ssh_host_ed25519_key"
        if not host_key.exists():
            keygen(host_key, f"{state.name}-{index}")
        authorized = node_dir / "authorized_keys"
        authorized.write_text(access_pub + "\n")
        authorized.chmod(0o600)
        address = node_address(index)
        node = st.NodeInfo(
            index=index, name=f"{state.name}-{index}", id=f"local-{index}", public_ip=address, private_ip=address,
            ssh_user=getpass.getuser(), ssh_port=0, cores=shares[index], workdir=str(node_dir),
            authorized_keys=str(authorized), pid=0,
            host_key=" ".join(host_key.with_suffix(".pub").read_text().split()[:2]))
        start_sshd(node, sshd)
        state.nodes.append(node)
        record()


def start_sshd(node: st.NodeInfo, sshd: str) -> None:
    """The node's sshd, on a new port, pinned to the node's cores; records its port and pid."""
    node_dir = Path(node.workdir)
    node.ssh_port = listen_port(node.public_ip)
    config = node_dir / "sshd_config"
    config.write_text(render(
        "sshd_config.j2", node_name=node.name, address=node.public_ip, port=node.ssh_port,
        host_key=node_dir / "ssh_host_ed25519_key", pid_file=node_dir / "sshd.pid",
        authorized_keys=node.authorized_keys, user=node.ssh_user, home=node_dir, sftp_server=_sftp_server()))
    with open(node_dir / "sshd.log", "ab") as log:
        log.write(START_MARK + b" port %d\n" % node.ssh_port)
        log.flush()
        proc = subprocess.Popen(  # noqa: S603 - fixed argv, no shell
            [sshd, "-D", "-e", "-f", str(config)], stdout=log, stderr=log, stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=lambda: os.sched_setaffinity(0, node.cores))
    node.pid = proc.pid


# How sshd shows itself once listening: its command line, escaped as vis(3) escapes it, in its title.
SSHD_TITLE = re.compile(rb"sshd: .*?sshd -D -e -f (.*) \[listener\] \d+ of \d+-\d+ startups", re.S)
# strnvis(VIS_CSTYLE|VIS_NL|VIS_TAB|VIS_OCTAL), as sshd escapes its title, for the bytes a path may hold
VIS_ESCAPES = {ord(c): b"\\" + e for c, e in (("\\", b"\\"), ("\n", b"n"), ("\r", b"r"), ("\b", b"b"), ("\a", b"a"),
                                              ("\v", b"v"), ("\t", b"t"), ("\f", b"f"))}


def shown(path: bytes) -> bytes:
    """A path as sshd's title shows it: printable ASCII and space as they are, a backslash doubled, C
    escapes for control characters that have one, any other byte as \\ooo. The escaping can be read
    back, so two paths are equal exactly when their shown forms are. Pure."""
    return b"".join(VIS_ESCAPES.get(byte) or (bytes([byte]) if 32 <= byte < 127 else b"\\%03o" % byte)
                    for byte in path)


def sshd_config_of(cmdline: bytes) -> bytes | None:
    """The config file of an sshd started as ftc starts them (`sshd -D -e -f CONFIG`), in its shown
    form, from its /proc cmdline: the argv as exec'd (NUL-separated), or the title sshd gives itself
    once listening ("sshd: /usr/sbin/sshd -D -e -f CONFIG [listener] 0 of 200-200 startups"). None for
    any other process. Whole arguments only: one path never matches a longer one. Pure."""
    argv = cmdline.rstrip(b"\0").split(b"\0")
    if len(argv) == 5 and argv[0].endswith(b"sshd") and argv[1:4] == [b"-D", b"-e", b"-f"]:
        return shown(argv[4])
    title = SSHD_TITLE.fullmatch(cmdline.rstrip(b"\0")) if len(argv) == 1 else None
    return title[1] if title else None


def _is_our_sshd(node: st.NodeInfo) -> bool:
    """The pid is ours only if it still runs sshd with exactly this node's config (pids get reused)."""
    config = shown(os.fsencode(Path(node.workdir) / "sshd_config"))
    return bool(node.pid) and sshd_config_of(procs.cmdline(node.pid)) == config


def _port_open(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=1) as sock:
            return sock.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def this_start(log: bytes) -> list[str]:
    """The lines sshd wrote since ftc last started it (sshd.log keeps every start's). Pure."""
    return log.rsplit(START_MARK, 1)[-1].decode(errors="replace").strip().splitlines()[1:]


def wait(state: st.ClusterState, record: Record, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    pending = list(state.nodes)
    restarts = 0
    while pending:
        # up: its own sshd alive and answering (another's at its address and port does not count)
        pending = [n for n in pending if not ((not n.pid or procs.alive(n.pid)) and _port_open(n.public_ip, n.ssh_port))]
        for node in pending:
            if node.pid and not procs.alive(node.pid):
                log = Path(node.workdir) / "sshd.log"
                lines = this_start(log.read_bytes()) if log.exists() else []
                if any("Address already in use" in line for line in lines[-3:]) and restarts < 3:
                    # another process took the port between its choice and sshd's bind: choose again
                    restarts += 1
                    start_sshd(node, _sshd())
                    record()
                    continue
                # up's rollback removes the log with the node: what sshd said goes into the message
                said = " | ".join(lines[-3:]) or "it wrote nothing"
                raise FtcError(f"node {node.name}: sshd exited at start ({said}); fix that, then `ftc up` again")
        if pending and time.monotonic() > deadline:
            raise FtcError(f"node {pending[0].name}: sshd not answering on {pending[0].public_ip}:"
                           f"{pending[0].ssh_port} after {timeout:.0f}s")
        if pending:
            time.sleep(0.1)


def terminate(state: st.ClusterState, record: Record) -> None:
    """Stop exactly what this cluster started: each node's sshd by its recorded pid, the
    sessions below it, and the detached jobs recorded in state; then remove the node files."""
    running_jobs = [job for job in state.jobs if job.state == "running"]
    roots = [p for job in running_jobs for node_pids in job.pids_by_node.values() for p in node_pids
             if procs.is_same(p, job.pid_start)]
    roots += [node.pid for node in state.nodes if node.pid and _is_our_sshd(node)]
    # Also every sshd running a config of ours that the state does not list: the state was
    # lost or corrupt, or an earlier cluster of this name lost its state and ran on.
    roots += _sshds_under(st.cluster_dir(state.name) / "nodes")
    # And whatever a job left running outside these trees (a daemon that left its rank's process tree, an
    # install cut short): it carries its node's directory, which the launch and the install export.
    roots += procs.carrying({b"FTC_NODE_DIR=" + os.fsencode(node.workdir) for node in state.nodes})
    pids = roots + [child for root in roots for child in procs.descendants(root)]
    procs.stop(sorted(set(pids)))
    # A process that started while those were listed (an sshd session that was starting a job's proxy) is
    # in none of them; with every sshd gone nothing new starts, so one more sweep of the nodes' own
    # directories, where every session works, is the last
    procs.stop(procs.working_in([Path(node.workdir) for node in state.nodes]))
    for node in state.nodes:
        shutil.rmtree(node.workdir, ignore_errors=True)
    shutil.rmtree(st.cluster_dir(state.name) / "nodes", ignore_errors=True)


def _sshds_under(directory: Path) -> list[int]:
    """Every sshd running a config <directory>/<index>/sshd_config, wherever its state went."""
    prefix = shown(os.fsencode(directory) + b"/")
    found = []
    for pid in procs.pids():
        config = sshd_config_of(procs.cmdline(pid))
        if config and config.startswith(prefix) and re.fullmatch(rb"\d+/sshd_config", config[len(prefix):]):
            found.append(pid)
    return found


def query(state: st.ClusterState) -> list[NodeStatus]:
    result = []
    for node in state.nodes:
        if not _is_our_sshd(node):
            result.append(NodeStatus(node.id, "dead", f"sshd pid {node.pid} is gone"))
        elif not _port_open(node.public_ip, node.ssh_port):
            result.append(NodeStatus(node.id, "pending", "sshd not answering"))
        else:
            result.append(NodeStatus(node.id, "running", f"cores {_ranges(node.cores)}"))
    return result


def _ranges(cores: list[int]) -> str:
    parts, start = [], None
    for i, core in enumerate(cores):
        if start is None:
            start = core
        if i + 1 == len(cores) or cores[i + 1] != core + 1:
            parts.append(str(start) if start == core else f"{start}-{core}")
            start = None
    return ",".join(parts)
