"""SSH to the nodes, in one place: connect with the pinned host key and bounded retries, run a
command, stream its output, put files, and the `ftc ssh` argv. Nothing here reads ~/.ssh, except
for your own servers (PROVIDER=ssh): there you log in as yourself, with SSH_KEY or else your ssh
agent and ~/.ssh keys; the other providers use the cluster's own access key.

Host keys are pinned: the controller trusts a node's key once (recorded in the state at first
contact, or by the local provider that generated it) and refuses any other after.
"""

import base64
import contextlib
import hashlib
import io
import logging
import os
import shlex
import socket
import tarfile
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from . import state as st
from .errors import FtcError, command
from .providers import relay, traits
from .values import from_env, whole

# paramiko, fabric and invoke take a third of a second to import, and most ftc commands import this
# module without connecting (a refusal, a status with no job running): only the functions that
# connect import them.
if TYPE_CHECKING:
    import paramiko
    from fabric import Connection

# About a minute: a fresh EC2 node's sshd comes up well inside that. FTC_CONNECT_ATTEMPTS overrides it.
# paramiko logs each failed handshake with a traceback of its own; ftc says what failed in one line.
logging.getLogger("paramiko").setLevel(logging.CRITICAL)
CONNECT_ATTEMPTS = 30


KEEPALIVE_S = 15  # every connection sends a keepalive this often, so that idle NATs and firewalls keep it
# A follower that hears nothing, not even the node's heartbeat, for this long says the node stopped
# answering and exits (a frozen sshd or a cut network would otherwise hang it silently, forever).
FOLLOW_SILENCE_S = 60
HEARTBEAT = "\x1eftc-alive"  # the line a followed node prints every few seconds; never shown


class NodeSilent(FtcError):
    """A followed node sent nothing, not even its heartbeat, within the silence limit."""


def connect_attempts() -> int:
    return from_env(os.environ, "FTC_CONNECT_ATTEMPTS", whole(1, 1000), CONNECT_ATTEMPTS)


def follow_silence_s() -> int:
    return from_env(os.environ, "FTC_FOLLOW_SILENCE_S", whole(3, 86400), FOLLOW_SILENCE_S)


class StepFailed(FtcError):
    """A step on a node failed; the message names the node and the step (exit code 1)."""

    def __init__(self, node: str, step: str, reason: str):
        super().__init__(f"node {node}: step '{step}' failed: {reason}")
        self.node, self.step = node, step


def host_key_entry(node: st.NodeInfo) -> str:
    return node.public_ip if node.ssh_port == 22 else f"[{node.public_ip}]:{node.ssh_port}"


def write_controller_known_hosts(state: st.ClusterState) -> Path:
    path = st.known_hosts_path(state.name)
    lines = [f"{host_key_entry(n)} {n.host_key}" for n in state.nodes if n.host_key]
    path.write_text("\n".join(lines) + "\n")
    return path


def fetch_host_key(node: st.NodeInfo, timeout: float = 10) -> str:
    """First contact: read the key the node presents (trusted once, then pinned)."""
    import paramiko
    transport = paramiko.Transport((node.public_ip, node.ssh_port))
    try:
        transport.start_client(timeout=timeout)
        key = transport.get_remote_server_key()
        return f"{key.get_name()} {key.get_base64()}"
    finally:
        transport.close()


def login_key(state: st.ClusterState) -> str:
    """The private key ftc logs in with: the cluster's access key, or on your own servers SSH_KEY
    ('' there: your ssh agent and ~/.ssh keys, as your own ssh would)."""
    if traits(state.provider).user_login:
        return state.cluster_spec.ssh_key
    return str(st.access_key_path(state.name))


def _auth(state: st.ClusterState) -> dict:
    key = login_key(state)
    if key:
        return {"key_filename": key, "look_for_keys": False, "allow_agent": False}
    return {"look_for_keys": True, "allow_agent": True}


def key_problem(path: str) -> str:
    """Why the private key at `path` cannot log in ('' when it can): read as paramiko's client reads
    SSH_KEY, each key type in turn, with no passphrase."""
    import paramiko
    why = ""
    for kind in (paramiko.RSAKey, paramiko.ECDSAKey, paramiko.Ed25519Key):
        try:
            kind.from_private_key_file(path)
            return ""
        except paramiko.PasswordRequiredException:
            return "is encrypted, and ftc reads it with no passphrase"
        except OSError as exc:
            return f"cannot be read ({exc.strerror})"
        except (paramiko.SSHException, ValueError) as exc:
            why = str(exc).split(". ")[0] or type(exc).__name__
    return f"is not a private key ssh can use ({why})"


def fingerprint(host_key: str) -> str:
    """'<type> <base64>' -> 'SHA256:...', as `ssh-keygen -lf` prints it."""
    digest = hashlib.sha256(base64.b64decode(host_key.split()[1])).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _mismatch(state: st.ClusterState, node: st.NodeInfo, key: "paramiko.PKey") -> str:
    presented = f"the node presents {key.get_name()} {key.get_base64()[:16]}..., not the key pinned at first contact"
    if traits(state.provider).own_hosts:  # node.id is the host as you gave it
        now = fingerprint(f"{key.get_name()} {key.get_base64()}")
        return (f"host key mismatch: {node.id} presents {key.get_name()} {now}, not the key pinned at first contact "
                f"({fingerprint(node.host_key)}); "
                "someone may be in the middle, or the server was reinstalled: check its key with its admin. ftc "
                f"never logs in to it again under this cluster: `{command('down', name=state.name)}` says what to "
                f"remove there by hand, then `{command('up')}` pins the new key after you confirm it")
    return (f"host key mismatch: {presented}; someone may be in the middle, or the node was replaced: "
            f"`{command('down', name=state.name)}` and start anew")


def connect(state: st.ClusterState, node: st.NodeInfo, attempts: int | None = None,
            next_step: str | None = None, within_s: float | None = None) -> "Connection":
    """An open Fabric connection that accepts only the pinned host key; bounded retries
    (FTC_CONNECT_ATTEMPTS unless `attempts` says). `next_step`: what the failure tells the user to
    do, in place of looking at `ftc status` ('' for nothing: the caller says it). `within_s`: give up
    after that long, all attempts together; a bootstrapped cluster's nodes exist and answer at once,
    so connecting to one gives up within the silence limit (a frozen sshd accepts the connection and
    then says nothing), where a fresh node gets its attempts to boot."""
    import paramiko
    from fabric import Config, Connection
    attempts = connect_attempts() if attempts is None else attempts
    if within_s is None and state.phase == "bootstrapped":
        within_s = follow_silence_s()
    deadline = time.monotonic() + within_s if within_s else float("inf")
    last, tried = "", 0
    for attempt in range(attempts):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        tried += 1
        try:
            if not node.host_key and traits(state.provider).own_hosts:  # your servers: pinned only after you confirmed
                raise StepFailed(node.name, "connect", f"no pinned host key for {host_key_entry(node)}")
            if not node.host_key:
                node.host_key = fetch_host_key(node, min(10, left))
            # paramiko waits 15 s for a banner and 30 s for the login on top of the connect timeout
            conn = Connection(host=node.public_ip, port=node.ssh_port, user=node.ssh_user, connect_timeout=min(10, left),
                              gateway=relay(state, node) or None,
                              config=Config(overrides={"load_ssh_configs": False}),
                              connect_kwargs={**_auth(state), "banner_timeout": min(15, left), "auth_timeout": min(30, left)})
            # Fabric auto-adds unknown keys by default; a cluster node must present its pinned key.
            conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
            key_type, key_b64 = node.host_key.split()[:2]
            conn.client.get_host_keys().add(host_key_entry(node), key_type,
                                            paramiko.PKey.from_type_string(key_type, base64.b64decode(key_b64)))
            conn.open()
            conn.client.get_transport().set_keepalive(KEEPALIVE_S)
            return conn
        except paramiko.BadHostKeyException as exc:
            raise StepFailed(node.name, "connect", _mismatch(state, node, exc.key)) from None
        except paramiko.AuthenticationException as exc:
            if traits(state.provider).own_hosts:  # a server that exists refuses the key: waiting will not change that
                raise StepFailed(node.name, "connect", f"{node.ssh_user}@{host_key_entry(node)} refused the login "
                                 f"({exc}); check SSH_KEY, or that your ssh agent holds a key it accepts") from None
            last = str(exc)
        except paramiko.SSHException as exc:
            if "not found in known_hosts" in str(exc):
                raise StepFailed(node.name, "connect", f"host key not pinned ({exc})") from None
            last = _reason(exc)
        except (OSError, EOFError) as exc:
            last = str(exc) or type(exc).__name__
        time.sleep(max(0.0, min(2.0, 0.2 * (attempt + 1), deadline - time.monotonic())))
    # Before `up` records the cluster (your servers' checks) there is no status to look at yet.
    look = f"`ftc status --name {state.name}`" if st.exists(state.name) else "check the address, the port and sshd there"
    advice = f"; is the node up? {look}" if next_step is None else f"; {next_step}" if next_step else ""
    if tried < attempts:
        raise StepFailed(node.name, "connect", f"the node does not answer: no SSH within {within_s:g} s "
                         f"({tried} attempts; {last}){advice}")
    raise StepFailed(node.name, "connect", f"no SSH after {attempts} attempts ({last}){advice}")


class NodeConnections:
    """One open connection per node for a whole command, handed from phase to phase: each is opened
    at its first use (with that use's `connect` options) and kept, so a job's checks, start, follow
    and fetch log in to a node once; one that dropped (cut by Ctrl-C mid-copy) is opened anew. All
    close together, at the command's end."""

    def __init__(self) -> None:
        self.open: dict[tuple[str, str], "Connection"] = {}

    def to(self, state: st.ClusterState, node: st.NodeInfo, **options) -> "Connection":
        key = (state.name, node.name)
        conn = self.open.get(key)
        if conn is None or not conn.is_connected:
            conn = self.open[key] = connect(state, node, **options)
        return conn

    def close(self) -> None:
        for conn in self.open.values():
            conn.close()
        self.open.clear()

    def __enter__(self) -> "NodeConnections":
        return self

    def __exit__(self, *_exc) -> None:
        self.close()


def handed_or_own(connections: NodeConnections | None) -> contextlib.AbstractContextManager[NodeConnections]:
    """A phase's connections: those its command handed it, left open for the command's next phase (`ftc run`
    hands its bootstrap's to its job), or a set of its own, closed at its end."""
    return contextlib.nullcontext(connections) if connections is not None else NodeConnections()


# Printed before every command's own output: whatever a server's shell start-up files print first
# (an `echo` in ~/.bashrc, a banner) comes before it and is dropped, so no marker or JSON ftc reads
# back is mistaken for it.
OUTPUT_BEGINS = "\x1eftc-output-begins"


def after_start_up(output: str) -> str:
    """What a command printed after OUTPUT_BEGINS (all of it, if the marker is missing)."""
    head, marker, rest = output.partition(OUTPUT_BEGINS + "\n")
    return rest if marker else head


def _reason(exc: Exception) -> str:
    """A connection failure in words: a server whose sshd accepts but never speaks is hung. paramiko
    says so as a banner error, or, where its wait for the handshake (the connect timeout) ends
    first, as "No existing session" from the login it then tries."""
    if "Error reading SSH protocol banner" in str(exc):
        return "it accepted the connection but sent no SSH banner: its sshd hangs or is overloaded"
    if str(exc) == "No existing session":
        return "it accepted the connection but the SSH handshake did not finish in time: its sshd hangs or is overloaded"
    return str(exc)


def run(conn: "Connection", node: st.NodeInfo, step: str, command: str) -> str:
    from invoke.exceptions import UnexpectedExit
    try:
        out = conn.run(f"printf '%s\\n' {shlex.quote(OUTPUT_BEGINS)}; {command}", hide=True, in_stream=False).stdout
        return after_start_up(out)
    except UnexpectedExit as exc:
        tail = (exc.result.stderr or after_start_up(exc.result.stdout)).strip().splitlines()[-3:]
        raise StepFailed(node.name, step, " | ".join(tail) or f"exit code {exc.result.exited}") from None


def tar_bundle(files: dict[str, tuple[str, int]]) -> bytes:
    """An uncompressed tar of {relative path: (text, mode)}, to unpack on the node."""
    buffer = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, (text, mode) in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, now
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def put_text(conn: "Connection", text: str, remote: str, mode: int = 0o644) -> None:
    """A small file on the node, through `cat` on a command channel rather than SFTP: SFTP's stream
    breaks on a server whose shell start-up files print a line (sshd starts its subsystem through
    that shell), and some servers offer no SFTP at all. Written beside, then moved into place."""
    partial = shlex.quote(f"{remote}.ftc-partial")
    channel = conn.client.get_transport().open_session()
    try:
        channel.exec_command(f"cat > {partial} && chmod {mode:o} {partial} && mv -f {partial} {shlex.quote(remote)}")
        channel.sendall(text.encode())
        channel.shutdown_write()
        status = channel.recv_exit_status()
        error = channel.makefile_stderr("rb").read().decode(errors="replace").strip()
    finally:
        channel.close()
    if status != 0:
        raise FtcError(f"{conn.host}:{conn.port}: writing {remote} failed: {error.splitlines()[-1] if error else status}")


# How long a copy cut by Ctrl-C gets to fail in its thread (it does at once: its socket is gone) and
# remove what it left half-written, before ftc exits without it.
CUT_COPY_WAIT_S = 10
Copied = TypeVar("Copied")


def interruptible(transport: "paramiko.Transport", copy: Callable[..., Copied], *args) -> Copied:
    """`copy(*args)` (SFTP work over `transport`) run in a thread of its own; its result, or its exception.

    Ctrl-C must never land inside paramiko: a KeyboardInterrupt there can cut a packet in half, and
    the polite close of the file that follows (paramiko's own, on the way out) then waits forever for
    an answer to a request the server never got whole, or reads the half packet's rest as garbage
    ("Garbage packet received"). So Ctrl-C lands here, in a wait, instead: the connection is cut at its
    socket (no SFTP close is attempted), the copy fails at once in its thread, the connection is closed,
    and KeyboardInterrupt is raised to the caller, which says what an interrupt means at its step."""
    outcome: dict = {}
    done = threading.Event()  # waited on rather than joined: a join cut by Ctrl-C marks a running thread ended

    def body() -> None:
        try:
            outcome["result"] = copy(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread, raised there
            outcome["error"] = exc
        finally:
            done.set()
    worker, before = threading.Thread(target=body, name="ftc-copy", daemon=True), set(threading.enumerate())
    try:
        worker.start()
        done.wait()
    except KeyboardInterrupt:
        _quiet_when_cut(set(threading.enumerate()) - before)
        with suppress(OSError):  # already closed: nothing left to cut
            transport.sock.shutdown(socket.SHUT_RDWR)  # wakes every thread that waits on it, the copy's too
        if worker.ident is not None:  # not when Ctrl-C came before it started
            done.wait(CUT_COPY_WAIT_S)
        transport.close()  # its channels marked closed: the caller's close of the connection sends nothing more
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def _quiet_when_cut(threads: set[threading.Thread]) -> None:
    """The copy's threads (paramiko's read-ahead sends its requests from one of its own) fail once their
    connection is cut under them: their tracebacks say nothing but that, which Ctrl-C asked for."""
    shown = threading.excepthook

    def hook(args) -> None:
        if args.thread not in threads:
            shown(args)
    threading.excepthook = hook


def stream(conn: "Connection", command: str, on_line, silence_s: int = 0) -> None:
    """Run `command` on the node and hand each output line to `on_line` as it comes.

    A raw paramiko channel, so Ctrl-C raises here at once instead of being forwarded. With
    `silence_s`, the node also prints a heartbeat every silence_s/6 seconds, and NodeSilent is
    raised once nothing at all has come for silence_s: the node (or the network to it) froze."""
    command = f"printf '%s\\n' {shlex.quote(OUTPUT_BEGINS)}; {command}"
    if silence_s:
        beat = max(1, silence_s // 6)
        command = (f"(while sleep {beat}; do printf '%s\\n' {shlex.quote(HEARTBEAT)} || exit; done) & beat=$!; "
                   f"{command}; rc=$?; kill $beat 2>/dev/null; exit $rc")
    channel = conn.client.get_transport().open_session()
    try:  # closed however the stream ends (Ctrl-C too): the connection serves the command's next phase
        channel.set_combine_stderr(True)
        channel.exec_command(command)
        buffer, heard, begun = b"", time.monotonic(), False
        while True:
            if channel.recv_ready():
                buffer += channel.recv(65536)
                heard = time.monotonic()
                *lines, buffer = buffer.split(b"\n")
                for line in map(lambda raw: raw.decode(errors="replace"), lines):
                    if begun and line != HEARTBEAT:
                        on_line(line)
                    begun = begun or line.endswith(OUTPUT_BEGINS)  # a start-up file's last words may precede it
            elif channel.exit_status_ready():
                break
            elif silence_s and time.monotonic() - heard > silence_s:
                raise NodeSilent(f"nothing from {conn.host}:{conn.port} for {silence_s} s")
            else:
                time.sleep(0.1)
        if buffer and begun:
            on_line(buffer.decode(errors="replace"))
    finally:
        channel.close()


def ssh_command(state: st.ClusterState, node: st.NodeInfo, cmd: list[str]) -> list[str]:
    """The ssh argv for `ftc ssh`: the login key (the cluster's access key; on your own servers SSH_KEY,
    or your agent and default keys), the pinned host keys, no ssh config file."""
    known = write_controller_known_hosts(state)
    key = login_key(state)
    identity = ["-i", key, "-o", "IdentitiesOnly=yes"] if key else []
    base = ["ssh", *identity, "-p", str(node.ssh_port),
            "-o", f'UserKnownHostsFile="{known}"', "-o", "StrictHostKeyChecking=yes",
            "-o", "LogLevel=ERROR", "-F", "/dev/null",
            *(["-o", f"ProxyCommand={proxy}"] if (proxy := relay(state, node)) else []), f"{node.ssh_user}@{node.public_ip}"]
    wd = shlex.quote(node.workdir)
    # env.sh exists once the node is bootstrapped; before that, a plain shell in the workdir.
    if cmd:
        return base + [f"cd {wd} && {{ [ ! -f env.sh ] || . ./env.sh; }} && {' '.join(cmd)}"]
    return base[:1] + ["-t"] + base[1:] + [f"cd {wd} && if [ -f env.sh ]; then exec bash --rcfile env.sh -i; "
                                             "else exec bash -i; fi"]
