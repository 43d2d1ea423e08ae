"""Bootstrap over Fabric: every node gets the stack, the cluster key, known_hosts, an ssh
config, the hostfile and its facts, all nodes at once; then mpirun and a gloo all_reduce
across the cluster prove it works.

Each step leaves a marker on the node named by a hash of what the step wrote, so a
second bootstrap skips what is done and takes seconds, and an interrupted one resumes.
Host keys are pinned: the controller trusts a node's key once (recorded in the state at
first contact, or by the local provider that generated it) and refuses any other after.
"""

import ast
import functools
import hashlib
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from runner.node.facts import NodeFacts, machine_cpu_seconds
from runner.node.protocol import (
    BOOTSTRAP_FACTS,
    BOOTSTRAP_SKIP,
    BOOTSTRAP_STEP,
    LOGIN_REFUSED,
    AllreduceReport,
    bootstrap_step_line,
    parse_allreduce,
    parse_bootstrap_line,
)

from . import state as st
from .errors import FtcError, UsageError, command
from .keys import keygen
from .launch import cluster_launch, render_launch
from .providers import relay, traits, world
from .ssh import (
    NodeConnections,
    StepFailed,
    connect_attempts,
    fetch_host_key,
    handed_or_own,
    put_text,
    run,
    tar_bundle,
    write_controller_known_hosts,
)
from .stacks import INTEL_INDEX, STACKS, TORCH_CPU_INDEX, UV_VERSION, missing_from_this_python
from .templates import render
from .ui import NodeBoard, answer
from .values import boolean, from_env, label

if TYPE_CHECKING:
    from fabric import Connection

REPO = Path(__file__).resolve().parent.parent
FILE_MODES = {"ssh_config": 0o600, "bin/ssh": 0o755}  # the rest of a node's files: 0644


def digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


# ---- pure: what each node should hold ---------------------------------------------------

def stack_venv(state: st.ClusterState, node: st.NodeInfo) -> tuple[str, bool]:
    """Where the stack lives, and whether the local provider reuses the controller's Python (or,
    on your own servers, STACK_PYTHON is yours: its environment is the one two levels up)."""
    given = given_python(state)
    if given:
        return str(PurePosixPath(given).parent.parent), True
    reuse = traits(state.provider).shares_this_machine and not missing_from_this_python(state.cluster_spec.stack) \
        and reuse_allowed()
    return (sys.prefix, True) if reuse else (f"{node.workdir}/venv", False)


def given_python(state: st.ClusterState) -> str:
    """STACK_PYTHON on your own servers: a Python that has the stack, used as it is."""
    return state.cluster_spec.stack_python if traits(state.provider).user_stack_python else ""


def reuse_allowed() -> bool:
    """FTC_LOCAL_REUSE_STACK=0 makes local nodes install the stack into a fresh venv (tests)."""
    return from_env(os.environ, "FTC_LOCAL_REUSE_STACK", boolean, True)


def render_install(state: st.ClusterState, node: st.NodeInfo) -> str:
    stack = state.cluster_spec.stack
    venv, reuse = stack_venv(state, node)
    downloads = not traits(state.provider).shares_this_machine  # torch's CPU wheels; this machine's pip as it is
    own = {"given_python": given_python(state), "min_minor": 11, "no_system_packages": True} \
        if traits(state.provider).own_hosts else {}
    return render("install.sh.j2", stack=stack, venv=venv, pins=STACKS[stack], reuse_only=reuse,
                  torch_index=TORCH_CPU_INDEX if downloads else "", uv_version=UV_VERSION,
                  pip_env=install_pip_env(state, reuse), extra_index=INTEL_INDEX if stack == "intel" else "", **own)


def install_pip_env(state: st.ClusterState, reuse: bool) -> dict[str, str]:
    """This machine's pip settings for a local node that installs: the node has a home of its own
    (sshd_config.j2), where pip finds no ~/.config/pip, and without them pip and uv take PyPI's torch
    (the CUDA build, GBs) where this machine's pip is pointed at the CPU build."""
    return this_machines_pip_settings() if traits(state.provider).shares_this_machine and not reuse else {}


@functools.cache
def this_machines_pip_settings() -> dict[str, str]:
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                            env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}).stdout
    return pip_variables(listed)


def pip_variables(listed: str) -> dict[str, str]:
    """`pip config list` as the PIP_* variables that give an install the same settings. Pure. Only what an
    install reads ([global], then [install], then PIP_* itself), less the cache: a node keeps its own."""
    rank = {"global": 1, "install": 2, ":env:": 3}
    chosen: dict[str, tuple[int, str]] = {}
    for line in listed.splitlines():
        name, _, value = line.partition("=")
        section, _, key = name.partition(".")
        if section in rank and re.fullmatch(r"[a-z0-9-]+", key) and key != "cache-dir" \
                and rank[section] > chosen.get(key, (0, ""))[0]:
            chosen[key] = (rank[section], ast.literal_eval(value))
    return {f"PIP_{key.upper().replace('-', '_')}": value for key, (_, value) in sorted(chosen.items())}


def node_files(state: st.ClusterState, node: st.NodeInfo) -> dict[str, str]:
    """Relative path under the node's workdir -> content."""
    venv, _ = stack_venv(state, node)
    files = {
        "ssh_config": render("ssh_config.j2", me=node, nodes=state.nodes, cluster=state.name,
                             relays={n.name: relay(state, n, from_node=True) for n in state.nodes}),
        "known_hosts": render("known_hosts.j2", nodes=state.nodes),
        "hostfile": render("hostfile.j2", nodes=state.nodes),
        "env.sh": render("env.sh.j2", me=node, cluster=state.name, venv=venv, own_host=traits(state.provider).own_hosts),
        "bin/ssh": render("ssh.sh.j2", me=node, cluster=state.name, venv=venv, stacks=stacks_elsewhere(state, node)),
    }
    return {**files, **node_package(state.provider)}


def stacks_elsewhere(state: st.ClusterState, me: st.NodeInfo) -> dict[str, str]:
    """For `me`'s bin/ssh: every node's name -> its stack's directory where that is not `me`'s, else "".
    {} where every node's stack lies where `me`'s does (one path on every host: STACK_PYTHON, or one
    home on every server) or the nodes share this machine (they run the head's files). Pure."""
    if traits(state.provider).shares_this_machine:
        return {}
    mine = stack_venv(state, me)[0]
    theirs = {node.name: stack_venv(state, node)[0] for node in state.nodes}
    if set(theirs.values()) == {mine}:
        return {}
    return {name: "" if venv == mine else venv for name, venv in theirs.items()}


def node_sources(provider: str) -> dict[str, Path]:
    """The node programs, whole, by where each goes under the node's directory: runner/node/ and the
    empty package above it, under ftc/; and the module of the provider's spot reader where it is not one
    of them (a provider outside ftc: its own file, with the packages above it)."""
    paths = [REPO / "runner" / "__init__.py", *sorted((REPO / "runner" / "node").glob("*.py"))]
    shipped = {f"ftc/{p.relative_to(REPO)}": p for p in paths}
    reader = world(provider).spot_reader
    if reader and not reader.read.startswith("runner.node."):
        shipped.update(module_files(reader.read.partition(":")[0], f"{provider}'s spot reader {reader.read!r}"))
    return shipped


def module_files(module: str, whose: str) -> dict[str, Path]:
    """The files of `module` and of each package above it, as this Python finds them, by where each goes
    under the node's directory; one not found is refused in one line naming `whose` it is."""
    parts, files = module.split("."), {}
    for depth in range(1, len(parts) + 1):
        found = importlib.util.find_spec(".".join(parts[:depth]))
        if found is None or not found.origin:
            raise FtcError(f"{whose}: module {'.'.join(parts[:depth])!r} is not found here, so it cannot be shipped "
                           "to the nodes; allowed: a module this Python imports (PYTHONPATH)")
        origin = Path(found.origin)
        files[f"ftc/{'/'.join(parts[:depth])}{'/__init__.py' if origin.name == '__init__.py' else '.py'}"] = origin
    return files


def node_package(provider: str) -> dict[str, str]:
    """The node programs (node_sources) by where each goes, with its text."""
    return {dest: source.read_text() for dest, source in node_sources(provider).items()}


# ---- the per-node steps ---------------------------------------------------------------------

def bootstrap_node(state: st.ClusterState, node: st.NodeInfo, board: NodeBoard, timings: dict,
                   connections: NodeConnections) -> NodeFacts:
    """Connect (kept in `connections`, for the verification after), then one session that runs the
    node's steps (templates/bootstrap_node.sh.j2) with the file bundle on its stdin; its STEP lines
    drive the board and the timings."""
    clock = time.monotonic()
    step = "connect"

    def reached(next_step: str, detail: str = "") -> None:
        nonlocal clock, step
        now = time.monotonic()
        timings.setdefault(node.name, {})[step] = round(now - clock, 3)
        clock, step = now, next_step
        board.update(node.name, next_step, detail)

    board.update(node.name, "connect")
    conn = connections.to(state, node)
    reached("keys+files")
    internal_key = st.internal_key_path(state.name)
    public_key = internal_key.with_suffix(".pub").read_text().strip()
    install = render_install(state, node)
    files = node_files(state, node)
    bundle = {"install.sh": (install, 0o755), ".ssh/id_cluster": (internal_key.read_text(), 0o600),
              ".ssh/id_cluster.pub": (public_key + "\n", 0o644),
              **{name: (text, FILE_MODES.get(name, 0o644)) for name, text in files.items()}}
    wd = node.workdir
    python = shlex.quote(given_python(state) or "python")
    facts_command = f"cd {shlex.quote(wd)} && . ./env.sh && {python} -m runner.node.facts {shlex.quote(node.private_ip)}"
    script = render("bootstrap_node.sh.j2", node=node.name, workdir=wd, authorized_keys=node.authorized_keys,
                    own_host=traits(state.provider).own_hosts, step_line=bootstrap_step_line, skip_line=BOOTSTRAP_SKIP,
                    facts_line=BOOTSTRAP_FACTS,
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
            mark = parse_bootstrap_line(line)
            if mark is None:
                continue
            if mark.kind == BOOTSTRAP_STEP and mark.step != step:
                reached(mark.step, f"stack {state.cluster_spec.stack}" if mark.step == "install" else "")
            elif mark.kind == BOOTSTRAP_SKIP:
                board.update(node.name, step, "already done")
            elif mark.kind == BOOTSTRAP_FACTS:
                break
        output = lines.read()
        error = channel.makefile_stderr("r").read().decode(errors="replace").strip()  # paramiko's read gives bytes
        if channel.recv_exit_status() != 0:
            raise StepFailed(node.name, step, error.splitlines()[-1] if error else "failed")
    finally:
        channel.close()
    facts = NodeFacts.from_dict(json.loads(output))
    reached("ready", f"{facts.physical_cores} cores, {facts.mpi}, torch {facts.versions.get('torch', '-')}")
    return facts


def verification_script(state: st.ClusterState, facts: list[NodeFacts]) -> str:
    """A gloo all_reduce over every node, one rank each, launched like any job."""
    wd = state.head.workdir
    return render_launch(cluster_launch(state, facts, "bootstrap verification: gloo all_reduce", f"{wd}/jobs/verify",
                                        "runner.node.allreduce_check", [], ppn=1))


def hostname_script(state: st.ClusterState, facts: list[NodeFacts]) -> str:
    """mpirun runs `hostname` once per node, launched like any job: the node's own mpirun flavour
    (Intel MPI, MPICH or Open MPI) with the flags the launch builder gives it."""
    wd = state.head.workdir
    return render_launch(cluster_launch(state, facts, "bootstrap verification: mpirun hostname", f"{wd}/jobs/verify",
                                        "", [], ppn=1, program=["hostname"]))


def hostname_lines(output: str) -> list[str]:
    """The hostnames in mpirun's output, without the rank tag each flavour puts before a line
    (`[0] ` from Intel MPI and MPICH, `[1,0]<stdout>:` from Open MPI)."""
    return [re.sub(r"^\[[0-9,]+\](<stdout>:)?\s*", "", line).strip() for line in output.splitlines() if line.strip()]


def allreduce_result(output: str, nodes: int) -> AllreduceReport:
    """The verification's result line, checked: every rank saw the right sums."""
    result = parse_allreduce(output)
    if result is None:
        raise ValueError(f"no result line in: {output.strip()[-200:]}")
    total = nodes * (nodes + 1) / 2
    if result.world_size != nodes or result.sum != [total, total, 0.0, total, 2 * total]:
        raise ValueError(f"wrong result {result}")
    return result


def verify(state: st.ClusterState, facts: list[NodeFacts], conn: "Connection",
           progress=lambda step, detail="": None) -> dict:
    """From node 0, over `conn` (the head's): mpirun runs hostname once per node; a gloo all_reduce
    across all nodes sums right. `progress(step, detail)` hears each step (the board's verification row)."""
    head, n = state.head, len(state.nodes)
    wd = head.workdir
    checked_what = digest(json.dumps([f.to_dict() for f in facts], sort_keys=True), *node_files(state, head).values())
    marker = f"{wd}/.ftc/done/verify-{checked_what}"
    in_wd = f"cd {shlex.quote(wd)} && "
    previous = run(conn, head, "verify", f"{in_wd}cat .ftc/done/verify-{checked_what} 2>/dev/null || true").strip()
    if previous:
        progress("ok", "already done")
        return json.loads(previous)
    progress("logins", f"cluster key to {n} node(s)")
    check_logins(conn, state)
    progress("mpirun", f"hostname on {n} node(s)")
    put_text(conn, hostname_script(state, facts), f"{wd}/jobs/verify-hostname.sh", 0o755)
    # a line that is no node's hostname (a banner a node's shell prints at each ssh hop) is not counted
    known = {f.hostname for f in facts}
    printed = hostname_lines(run(conn, head, "verify mpirun", f"{in_wd}bash jobs/verify-hostname.sh"))
    hostnames = [line for line in printed if line in known]
    if len(hostnames) != n:
        raise StepFailed(head.name, "verify mpirun", f"expected {n} hostname lines, got {len(hostnames)} "
                         f"(of {len(printed)} printed)")
    put_text(conn, verification_script(state, facts), f"{wd}/jobs/verify.sh", 0o755)
    progress("all_reduce", f"gloo over {n} rank(s)")
    try:
        result = allreduce_result(run(conn, head, "verify all_reduce", f"{in_wd}bash jobs/verify.sh"), n)
    except ValueError as exc:
        raise StepFailed(head.name, "verify all_reduce", str(exc)) from None
    checked = {"hostnames": hostnames, "allreduce": asdict(result)}
    put_text(conn, json.dumps(checked, allow_nan=False), marker)
    progress("ok", f"{n} hostname(s), all_reduce sums right")
    return checked


def check_logins(conn, state: st.ClusterState) -> None:
    """Node 0 logs in to every node by name with the cluster key (bin/ssh, as mpirun reaches them),
    so that a refusal is named here, with its likely cause, rather than met as mpirun's generic failure."""
    head, wd = state.head, shlex.quote(state.head.workdir)
    out = run(conn, head, "verify logins", f"for n in {' '.join(shlex.quote(n.name) for n in state.nodes)}; do "
              f'why=$({wd}/bin/ssh "$n" true 2>&1 < /dev/null) || echo "{LOGIN_REFUSED} $n $(echo "$why" | tail -n 1)"; done')
    for line in out.splitlines():
        if not line.startswith(f"{LOGIN_REFUSED} "):
            continue  # a banner a node's shell printed
        name, _, reason = line[len(LOGIN_REFUSED) + 1:].partition(" ")
        node = next(n for n in state.nodes if n.name == name)
        if "Permission denied" in reason:
            raise StepFailed(head.name, "verify logins", f"{node.name} ({node.ssh_user}@{node.private_ip}) refused the "
                             f"cluster key ({reason.strip()}): its sshd likely reads keys from elsewhere than "
                             f"{node.authorized_keys or '~/.ssh/authorized_keys'} (managed keys: AuthorizedKeysFile or "
                             f"AuthorizedKeysCommand in its sshd_config); add the key ending 'ftc-{state.name}-internal' "
                             f"there, then `ftc bootstrap --name {state.name}`")
        raise StepFailed(head.name, "verify logins", f"cannot log in to {node.name} with the cluster key "
                         f"({reason.strip() or 'no reason given'}); `ftc bootstrap --name {state.name}` tries again")


def facts_paths(state: st.ClusterState) -> list[Path]:
    return [st.cluster_dir(state.name) / "facts" / f"{node.index}.json" for node in state.nodes]


def load_facts(state: st.ClusterState) -> list[NodeFacts]:
    """Every node's facts as its bootstrap recorded them; refused unless `state` is of a bootstrapped
    cluster whose nodes hold the node programs this ftc would ship (else a job would run older code)."""
    paths = facts_paths(state)
    if st.half_made(state):
        raise UsageError(st.half_made(state))
    if state.phase != "bootstrapped" or not all(p.exists() for p in paths):
        raise UsageError(f"{label('name')}={state.name!r} is not bootstrapped (phase {state.phase}); "
                         f"run `{command('bootstrap', name=state.name)}` first")
    shipped = node_programs_path(state.name)
    if not shipped.exists() or shipped.read_text() != node_programs_digest(state.provider):
        raise UsageError(f"{label('name')}={state.name!r}: its nodes hold ftc's node programs as they were at its "
                         f"bootstrap, and this ftc's differ (it was updated since); "
                         f"`{command('bootstrap', name=state.name)}` ships them in seconds, skipping finished steps")
    return [NodeFacts.from_dict(json.loads(p.read_text())) for p in paths]


def node_programs_path(name: str) -> Path:
    """Where the controller records which node programs a cluster's bootstrap shipped."""
    return st.cluster_dir(name) / "node_programs"


def node_programs_digest(provider: str) -> str:
    """Which node programs (node_package) this ftc ships to a cluster of `provider`: any edit changes it."""
    return digest(*(f"{path}\n{text}" for path, text in sorted(node_package(provider).items())))


# ---- bookkeeping shared by the Fabric and the Ansible bootstrap -----------------------------

def ensure_internal_key(name: str) -> Path:
    """The key the nodes use among themselves (mpirun's ssh); made once per cluster."""
    internal = st.internal_key_path(name)
    if not internal.exists():
        keygen(internal, f"ftc-{name}-internal")
    return internal


def pin_host_keys(state: st.ClusterState) -> None:
    """First contact: each node's host key is recorded, and from then on the only one accepted."""
    for node in state.nodes:
        if not node.host_key:
            node.host_key = fetch_host_key(node)
    st.save(state)
    write_controller_known_hosts(state)


def mark_bootstrapped(state: st.ClusterState, facts: list[NodeFacts]) -> None:
    """The controller's copy of every node's facts, and the phase that lets jobs launch."""
    for path, node_facts in zip(facts_paths(state), facts):
        path.parent.mkdir(exist_ok=True)
        path.write_text(node_facts.to_json())
    state.phase = "bootstrapped"
    state.bootstrapped_at = time.time()
    state.stack_python = facts[0].python_executable
    node_programs_path(state.name).write_text(node_programs_digest(state.provider))
    st.save(state)


# ---- the command ----------------------------------------------------------------------------

def check_settings() -> None:
    """The FTC_* tuning variables a bootstrap reads, parsed before it changes anything."""
    connect_attempts()
    reuse_allowed()


def hold_for_tests() -> None:
    """FTC_HOLD_BOOTSTRAP=PATH (tests): with the bootstrap under way (its lock taken, the cluster key
    made), write PATH.reached and wait until PATH exists, so a test acts at this point, not at a guess."""
    release = os.environ.get("FTC_HOLD_BOOTSTRAP")
    if not release:
        return
    Path(release + ".reached").touch()
    while not Path(release).exists():
        time.sleep(0.05)


def bootstrap(name: str, connections: NodeConnections | None = None) -> dict:
    """Every node's steps at once, then the verification from the head. `connections`: the command's, kept
    open for its next phase (`ftc run`'s job); else a set of its own."""
    check_settings()
    with st.locked(name, "bootstrap"):
        state = st.load(name)
        if st.half_made(state, holding_lock=True):
            raise FtcError(f"only a running cluster can be bootstrapped: {st.half_made(state, holding_lock=True)}")
        ensure_internal_key(name)
        hold_for_tests()
        started, busy = time.monotonic(), machine_cpu_seconds()
        timings: dict[str, dict[str, float]] = {}
        with (NodeBoard(f"bootstrap {name}", [n.name for n in state.nodes] + ["verification"]) as board,
              handed_or_own(connections) as connections):
            with ThreadPoolExecutor(max_workers=len(state.nodes)) as pool:
                futures = {node.name: pool.submit(bootstrap_node, state, node, board, timings, connections)
                           for node in state.nodes}
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
                board.update("verification", "skipped", "a node failed")
                more = f" (and {len(failures) - 1} more node(s))" if len(failures) > 1 else ""
                raise FtcError(f"{failures[0]}{more}; fix it, then `ftc bootstrap --name {name}` resumes "
                               "where it stopped")
            facts = [results[n.name] for n in state.nodes]
            waited, busy = time.monotonic() - started, machine_cpu_seconds() - busy
            verify_started = time.monotonic()
            try:
                checked = verify(state, facts, connections.to(state, state.head),
                                 lambda step, detail="": board.update("verification", step, detail))
            except StepFailed as exc:
                board.update("verification", f"FAILED: {exc.step}", str(exc).split(": ", 2)[-1][:120])
                raise FtcError(f"{exc}; see the node with `ftc ssh --name {name}`, "
                               f"then `ftc bootstrap --name {name}`") from None
        timing = {"nodes": timings, "parallel_steps_s": round(waited, 3), "parallel_steps_machine_cpu_s": round(busy, 2),
                  "verify_s": round(time.monotonic() - verify_started, 3)}
        (st.cluster_dir(name) / "bootstrap.json").write_text(json.dumps(timing, indent=2, allow_nan=False))
        mark_bootstrapped(state, facts)
    print_summary(state, facts, checked, timing)
    return timing


def print_summary(state: st.ClusterState, facts: list[NodeFacts], checked: dict, timing: dict) -> None:
    from rich.markup import escape
    from rich.table import Table
    table = Table(title=f"{escape(state.name)}: bootstrapped in {timing['parallel_steps_s']:.1f}s + "
                        f"verify {timing['verify_s']:.1f}s", title_justify="left")
    for column in ("node", "address", "cores", "cpu", "bf16", "mem GB", "python", "torch", "mpi"):
        table.add_column(column)
    for node, f in zip(state.nodes, facts):
        cells = (node.name, node.private_ip, str(f.physical_cores), f.cpu_model[:40],
                 "native" if f.native_bf16 else "emulated", str(f.memory_gb), f.python,
                 f.versions.get("torch", "-"), f.mpi)
        table.add_row(*map(escape, cells))  # what a node reported, as it is: no [x] taken for markup
    answer.print(table)  # the bootstrap's answer: on stdout, like every table
    world = checked["allreduce"]["world_size"]
    answer.print(f"verified: mpirun hostname on {len(checked['hostnames'])} node(s); gloo all_reduce over "
                  f"{world} rank(s) = {checked['allreduce']['sum']}")


def main(argv: list[str]) -> int:
    """`python -m provision.bootstrap verification-script|hostname-script NAME`: the Ansible role's
    verification, rendered by the same launch builder from the facts the playbook fetched."""
    scripts = {"verification-script": verification_script, "hostname-script": hostname_script}
    if argv[:1] not in [[name] for name in scripts] or len(argv) != 2:
        print(f"usage: python -m provision.bootstrap {'|'.join(scripts)} NAME", file=sys.stderr)
        return 2
    state = st.load(argv[1])
    facts = [NodeFacts.from_dict(json.loads(p.read_text())) for p in facts_paths(state)]
    print(scripts[argv[0]](state, facts), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
