"""SSH to the nodes, in one place: connect with the pinned host key and bounded retries, run a
command, stream its output, put files, and the `ftc ssh` argv. Nothing here reads ~/.ssh.

Host keys are pinned: the controller trusts a node's key once (recorded in the state at first
contact, or by the local provider that generated it) and refuses any other after.
"""

import base64
import io
import os
import shlex
import tarfile
import time
from pathlib import Path

import paramiko
from fabric import Config, Connection
from invoke.exceptions import UnexpectedExit

from . import state as st

# About a minute: a fresh EC2 node's sshd comes up well inside that.
CONNECT_ATTEMPTS = int(os.environ.get("FTC_CONNECT_ATTEMPTS", "30"))


class StepFailed(Exception):
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
    transport = paramiko.Transport((node.public_ip, node.ssh_port))
    try:
        transport.start_client(timeout=timeout)
        key = transport.get_remote_server_key()
        return f"{key.get_name()} {key.get_base64()}"
    finally:
        transport.close()


def connect(state: st.ClusterState, node: st.NodeInfo, attempts: int = CONNECT_ATTEMPTS) -> Connection:
    """An open Fabric connection that accepts only the pinned host key; bounded retries."""
    last = ""
    for attempt in range(attempts):
        try:
            if not node.host_key:
                node.host_key = fetch_host_key(node)
            conn = Connection(host=node.public_ip, port=node.ssh_port, user=node.ssh_user, connect_timeout=10,
                              config=Config(overrides={"load_ssh_configs": False}),
                              connect_kwargs={"key_filename": str(st.access_key_path(state.name)),
                                              "look_for_keys": False, "allow_agent": False})
            # Fabric auto-adds unknown keys by default; a cluster node must present its pinned key.
            conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
            key_type, key_b64 = node.host_key.split()[:2]
            conn.client.get_host_keys().add(host_key_entry(node), key_type,
                                            paramiko.PKey.from_type_string(key_type, base64.b64decode(key_b64)))
            conn.open()
            return conn
        except paramiko.BadHostKeyException as exc:
            raise StepFailed(node.name, "connect", f"host key mismatch: the node presents {exc.key.get_name()} "
                             f"{exc.key.get_base64()[:16]}..., not the key pinned at first contact; "
                             "someone may be in the middle, or the node was replaced: "
                             f"`make destroy NAME={state.name}` and start anew") from None
        except paramiko.SSHException as exc:
            if "not found in known_hosts" in str(exc):
                raise StepFailed(node.name, "connect", f"host key not pinned ({exc})") from None
            last = str(exc)
        except (OSError, EOFError) as exc:
            last = str(exc) or type(exc).__name__
        time.sleep(min(2.0, 0.2 * (attempt + 1)))
    raise StepFailed(node.name, "connect", f"no SSH after {attempts} attempts ({last}); "
                     f"is the node up? `ftc status --name {state.name}`")


def run(conn: Connection, node: st.NodeInfo, step: str, command: str) -> str:
    try:
        return conn.run(command, hide=True, in_stream=False).stdout
    except UnexpectedExit as exc:
        tail = (exc.result.stderr or exc.result.stdout).strip().splitlines()[-3:]
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


def put_text(conn: Connection, text: str, remote: str, mode: int = 0o644) -> None:
    conn.put(io.BytesIO(text.encode()), remote)
    conn.sftp().chmod(remote, mode)


def stream(conn: Connection, command: str, on_line) -> None:
    """Run `command` on the node and hand each output line to `on_line` as it comes.

    A raw paramiko channel, so Ctrl-C raises here at once instead of being forwarded."""
    channel = conn.client.get_transport().open_session()
    channel.set_combine_stderr(True)
    channel.exec_command(command)
    buffer = b""
    while True:
        if channel.recv_ready():
            buffer += channel.recv(65536)
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                on_line(line.decode(errors="replace"))
        elif channel.exit_status_ready():
            break
        else:
            time.sleep(0.1)
    if buffer:
        on_line(buffer.decode(errors="replace"))
    channel.close()


def ssh_command(state: st.ClusterState, node: st.NodeInfo, cmd: list[str]) -> list[str]:
    """The ssh argv for `ftc ssh`: the cluster's access key, its pinned host keys, nothing of ~/.ssh."""
    known = write_controller_known_hosts(state)
    base = ["ssh", "-i", str(st.access_key_path(state.name)), "-p", str(node.ssh_port),
            "-o", "IdentitiesOnly=yes", "-o", f'UserKnownHostsFile="{known}"', "-o", "StrictHostKeyChecking=yes",
            "-o", "LogLevel=ERROR", "-F", "/dev/null", f"{node.ssh_user}@{node.public_ip}"]
    wd = shlex.quote(node.workdir)
    # env.sh exists once the node is bootstrapped; before that, a plain shell in the workdir.
    if cmd:
        return base + [f"cd {wd} && {{ [ ! -f env.sh ] || . ./env.sh; }} && {' '.join(cmd)}"]
    return base[:1] + ["-t"] + base[1:] + [f"cd {wd} && if [ -f env.sh ]; then exec bash --rcfile env.sh -i; "
                                             "else exec bash -i; fi"]
