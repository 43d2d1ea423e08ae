"""Bootstrap over Fabric: every node gets the stack, the cluster key, known_hosts, an ssh
config, the hostfile and its facts, all nodes at once; then mpirun and a gloo all_reduce
across the cluster prove it works.

Each step leaves a marker on the node named by a hash of what the step wrote, so a
second bootstrap skips what is done and takes seconds, and an interrupted one resumes.
Host keys are pinned: the controller trusts a node's key once (recorded in the state at
first contact, or by the local provider that generated it) and refuses any other after.
"""

import base64
import hashlib
import io
import json
import os
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import paramiko
from fabric import Config, Connection
from invoke.exceptions import UnexpectedExit

from runner.node.facts import machine_cpu_seconds

from . import state as st
from .errors import FtcError, UsageError
from .keys import keygen
from .launch import LaunchSpec, pick_allocator, plan_ranks, render_launch
from .stacks import INTEL_INDEX, STACKS, TORCH_CPU_INDEX, missing_from_this_python
from .templates import render
from .ui import NodeBoard, console

REPO = Path(__file__).resolve().parent.parent
# About a minute: a fresh EC2 node's sshd comes up well inside that.
CONNECT_ATTEMPTS = int(os.environ.get("FTC_CONNECT_ATTEMPTS", "30"))


class StepFailed(Exception):
    def __init__(self, node: str, step: str, reason: str):
        super().__init__(f"node {node}: step '{step}' failed: {reason}")
        self.node, self.step = node, step


def digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


# ---- pure: what each node should hold ---------------------------------------------------

def stack_venv(state: st.ClusterState, node: st.NodeInfo) -> tuple[str, bool]:
    """Where the stack lives, and whether the local provider reuses the controller's Python."""
    reuse = state.provider == "local" and not missing_from_this_python(state.cluster_spec.stack) \
        and _reuse_allowed()
    return (sys.prefix, True) if reuse else (f"{node.workdir}/venv", False)


def _reuse_allowed() -> bool:
    return os.environ.get("FTC_LOCAL_REUSE_STACK", "1") != "0"


def render_install(state: st.ClusterState, node: st.NodeInfo) -> str:
    stack = state.cluster_spec.stack
    venv, reuse = stack_venv(state, node)
    on_aws = state.provider == "aws"
    return render("install.sh.j2", stack=stack, venv=venv, pins=STACKS[stack], reuse_only=reuse,
                  torch_index=TORCH_CPU_INDEX if on_aws else "",
                  extra_index=INTEL_INDEX if stack == "intel" else "")


def node_files(state: st.ClusterState, node: st.NodeInfo) -> dict[str, str]:
    """Relative path under the node's workdir -> content."""
    venv, _ = stack_venv(state, node)
    files = {
        "ssh_config": render("ssh_config.j2", me=node, nodes=state.nodes, cluster=state.name),
        "known_hosts": render("known_hosts.j2", nodes=state.nodes),
        "hostfile": render("hostfile.j2", nodes=state.nodes),
        "env.sh": render("env.sh.j2", me=node, cluster=state.name, venv=venv),
    }
    return {**files, **node_package()}


def node_package() -> dict[str, str]:
    """The node programs, whole: runner/node/ and the empty package above it, under ftc/."""
    paths = [REPO / "runner" / "__init__.py", *sorted((REPO / "runner" / "node").glob("*.py"))]
    return {f"ftc/{p.relative_to(REPO)}": p.read_text() for p in paths}


# ---- connections ----------------------------------------------------------------------------

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


# ---- the per-node steps ---------------------------------------------------------------------

def bootstrap_node(state: st.ClusterState, node: st.NodeInfo, board: NodeBoard, timings: dict) -> dict:
    """Connect, then one session that runs the node's steps (templates/bootstrap_node.sh.j2)
    with the file bundle on its stdin; its STEP lines drive the board and the timings."""
    clock = time.monotonic()
    step = "connect"

    def reached(next_step: str, detail: str = "") -> None:
        nonlocal clock, step
        now = time.monotonic()
        timings.setdefault(node.name, {})[step] = round(now - clock, 3)
        clock, step = now, next_step
        board.update(node.name, next_step, detail)

    board.update(node.name, "connect")
    conn = connect(state, node)
    reached("keys+files")
    internal_key = st.internal_key_path(state.name)
    public_key = internal_key.with_suffix(".pub").read_text().strip()
    install = render_install(state, node)
    files = node_files(state, node)
    bundle = {"install.sh": (install, 0o755), ".ssh/id_cluster": (internal_key.read_text(), 0o600),
              ".ssh/id_cluster.pub": (public_key + "\n", 0o644),
              **{name: (text, 0o600 if name == "ssh_config" else 0o644) for name, text in files.items()}}
    wd = node.workdir
    facts_command = f". {wd}/env.sh && python -m runner.node.facts {node.private_ip}"
    script = render("bootstrap_node.sh.j2", node=node.name, workdir=wd, authorized_keys=node.authorized_keys,
                    public_key=public_key, facts_command=facts_command,
                    files_marker=f"files-{digest(*(text for text, _ in bundle.values()))}",
                    install_marker=f"install-{digest(install)}",
                    facts_marker=f"facts-{digest(files['ftc/runner/node/facts.py'], files['env.sh'], facts_command)}")
    channel = conn.client.get_transport().open_session()
    try:
        channel.exec_command(script)
        channel.sendall(tar_bundle(bundle))
        channel.shutdown_write()
        lines = channel.makefile("r")
        for line in lines:
            name = line.split()[1] if line.startswith("STEP ") else step
            if name != step:
                reached(name, f"stack {state.cluster_spec.stack}" if name == "install" else "")
            elif line.strip() == "SKIP":
                board.update(node.name, step, "already done")
            elif line.strip() == "FACTS":
                break
        output = lines.read()
        error = channel.makefile_stderr("r").read().strip()
        if channel.recv_exit_status() != 0:
            raise StepFailed(node.name, step, error.splitlines()[-1] if error else "failed")
    finally:
        channel.close()
        conn.close()
    facts = json.loads(output)
    reached("ready", f"{facts['physical_cores']} cores, {facts['mpi']}, torch {facts['versions'].get('torch', '-')}")
    return facts


def verify(state: st.ClusterState, facts: list[dict]) -> dict:
    """From node 0: mpirun runs hostname once per node; a gloo all_reduce across all nodes sums right."""
    head, n = state.head, len(state.nodes)
    conn = connect(state, head)
    try:
        wd = head.workdir
        marker = f"{wd}/.ftc/done/verify-{digest(json.dumps(facts, sort_keys=True), *node_files(state, head).values())}"
        previous = run(conn, head, "verify", f"cat {marker} 2>/dev/null || true").strip()
        if previous:
            return json.loads(previous)
        hostnames = run(conn, head, "verify mpirun",
                        f". {wd}/env.sh && mpirun -f {wd}/hostfile -n {n} -ppn 1 hostname").split()
        if len(hostnames) != n:
            raise StepFailed(head.name, "verify mpirun", f"expected {n} hostname lines, got {len(hostnames)}")
        script = render_launch(launch_spec(state, facts, "bootstrap verification: gloo all_reduce",
                                           f"{wd}/jobs/verify", "runner.node.allreduce_check", [], ppn=1))
        put_text(conn, script, f"{wd}/jobs/verify.sh", 0o755)
        out = run(conn, head, "verify all_reduce", f"bash {wd}/jobs/verify.sh")
        line = next((ln for ln in out.splitlines() if "ALLREDUCE " in ln), "")
        if not line:
            raise StepFailed(head.name, "verify all_reduce", f"no result line in: {out.strip()[-200:]}")
        result, _ = json.JSONDecoder().raw_decode(line.split("ALLREDUCE ", 1)[1])
        total = n * (n + 1) / 2
        if result["world_size"] != n or result["sum"] != [total, total, 0.0, total, 2 * total]:
            raise StepFailed(head.name, "verify all_reduce", f"wrong result {result}")
        checked = {"hostnames": hostnames, "allreduce": result}
        put_text(conn, json.dumps(checked), marker)
        return checked
    finally:
        conn.close()


def launch_spec(state: st.ClusterState, facts: list[dict], description: str, job_dir: str, module: str,
                args: list[str], ppn: int | None = None) -> LaunchSpec:
    """The launch of a program across this cluster, from its state and node facts (used by finetune too)."""
    head = facts[0]
    stack = state.cluster_spec.stack
    return LaunchSpec(
        description=description, job_dir=job_dir, hostfile=f"{state.head.workdir}/hostfile", nodes=len(state.nodes),
        plan=plan_ranks(facts, stack, ppn), python=head["python_executable"], module=module,
        pythonpath=f"{state.head.workdir}/ftc", args=args,
        mpi=head["mpi"] if head["mpi"] in ("impi", "mpich", "openmpi") else "impi",
        master_addr=state.head.private_ip, gloo_iface=head.get("interface", ""), stack=stack,
        allocator=pick_allocator(head), env_file=f"{state.head.workdir}/env.sh",
        ssh_config=f"{state.head.workdir}/ssh_config", as_root=state.head.ssh_user == "root")


def load_facts(name: str) -> list[dict]:
    directory = st.cluster_dir(name) / "facts"
    state = st.load(name)
    paths = [directory / f"{node.index}.json" for node in state.nodes]
    if state.phase != "bootstrapped" or not all(p.exists() for p in paths):
        raise UsageError(f"NAME={name!r} is not bootstrapped (phase {state.phase}); "
                         f"run `ftc bootstrap --name {name}` first")
    return [json.loads(p.read_text()) for p in paths]


# ---- the command ----------------------------------------------------------------------------

def bootstrap(name: str) -> dict:
    with st.locked(name, "bootstrap"):
        state = st.load(name)
        if state.phase not in ("running", "bootstrapped"):
            raise FtcError(f"cluster {name!r} is {state.phase}; only a running cluster can be bootstrapped")
        internal = st.internal_key_path(name)
        if not internal.exists():
            keygen(internal, f"ftc-{name}-internal")
        started, busy = time.monotonic(), machine_cpu_seconds()
        timings: dict[str, dict[str, float]] = {}
        with NodeBoard(f"bootstrap {name}", [n.name for n in state.nodes]) as board, \
                ThreadPoolExecutor(max_workers=len(state.nodes)) as pool:
            futures = {node.name: pool.submit(bootstrap_node, state, node, board, timings) for node in state.nodes}
            results, failures = {}, []
            for node_name, future in futures.items():
                try:
                    results[node_name] = future.result()
                except StepFailed as exc:
                    board.update(node_name, f"FAILED: {exc.step}", str(exc).split(": ", 2)[-1][:120])
                    failures.append(exc)
        st.save(state)  # host keys pinned at first contact, even when a node failed
        write_controller_known_hosts(state)
        if failures:
            more = f" (and {len(failures) - 1} more node(s))" if len(failures) > 1 else ""
            raise FtcError(f"{failures[0]}{more}; fix it, then `ftc bootstrap --name {name}` resumes "
                           "where it stopped")
        facts = [results[n.name] for n in state.nodes]
        facts_dir = st.cluster_dir(name) / "facts"
        facts_dir.mkdir(exist_ok=True)
        for node, node_facts in zip(state.nodes, facts):
            (facts_dir / f"{node.index}.json").write_text(json.dumps(node_facts, indent=2))
        waited, busy = time.monotonic() - started, machine_cpu_seconds() - busy
        verify_started = time.monotonic()
        try:
            checked = verify(state, facts)
        except StepFailed as exc:
            raise FtcError(f"{exc}; see the node with `ftc ssh --name {name}`, then `ftc bootstrap --name {name}`") \
                from None
        timing = {"nodes": timings, "parallel_steps_s": round(waited, 3), "parallel_steps_machine_cpu_s": round(busy, 2),
                  "verify_s": round(time.monotonic() - verify_started, 3)}
        (st.cluster_dir(name) / "bootstrap.json").write_text(json.dumps(timing, indent=2))
        state.phase = "bootstrapped"
        state.bootstrapped_at = time.time()
        state.stack_python = facts[0]["python_executable"]
        st.save(state)
    print_summary(state, facts, checked, timing)
    return timing


def print_summary(state: st.ClusterState, facts: list[dict], checked: dict, timing: dict) -> None:
    from rich.table import Table
    table = Table(title=f"{state.name}: bootstrapped in {timing['parallel_steps_s']:.1f}s + "
                        f"verify {timing['verify_s']:.1f}s", title_justify="left")
    for column in ("node", "address", "cores", "cpu", "bf16", "mem GB", "python", "torch", "mpi"):
        table.add_column(column)
    for node, f in zip(state.nodes, facts):
        table.add_row(node.name, node.private_ip, str(f["physical_cores"]), f["cpu_model"][:40],
                      "native" if f["native_bf16"] else "emulated", str(f["memory_gb"]), f["python"],
                      f["versions"].get("torch", "-"), f["mpi"])
    console.print(table)
    world = checked["allreduce"]["world_size"]
    console.print(f"verified: mpirun hostname on {len(checked['hostnames'])} node(s); gloo all_reduce over "
                  f"{world} rank(s) = {checked['allreduce']['sum']}")


def ssh_command(state: st.ClusterState, node: st.NodeInfo, cmd: list[str]) -> list[str]:
    """The ssh argv for `ftc ssh`: the cluster's access key, its pinned host keys, nothing of ~/.ssh."""
    known = write_controller_known_hosts(state)
    base = ["ssh", "-i", str(st.access_key_path(state.name)), "-p", str(node.ssh_port),
            "-o", "IdentitiesOnly=yes", "-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes",
            "-o", "LogLevel=ERROR", "-F", "/dev/null", f"{node.ssh_user}@{node.public_ip}"]
    wd = node.workdir
    if cmd:
        return base + [f"cd {wd} && . ./env.sh && {' '.join(cmd)}"]
    return base[:1] + ["-t"] + base[1:] + [f"cd {wd} && exec bash --rcfile {wd}/env.sh -i"]
