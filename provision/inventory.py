"""The Ansible path: an inventory from the cluster state, and `ftc bootstrap --with ansible`.

The inventory carries values, not steps: the playbook renders the same templates
(templates/*.j2) with them, so Fabric and Ansible write the same files.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from runner.node.facts import NodeFacts

from . import state as st
from .bootstrap import (
    ensure_internal_key,
    facts_paths,
    install_pip_env,
    mark_bootstrapped,
    node_sources,
    pin_host_keys,
    stack_venv,
)
from .errors import FtcError, UsageError
from .providers import traits
from .stacks import INTEL_INDEX, STACKS, TORCH_CPU_INDEX, UV_VERSION
from .ui import console
from .values import label, local_path

PLAYBOOK = Path(__file__).resolve().parent.parent / "ansible" / "site.yml"


def node_vars(node: st.NodeInfo) -> dict:
    """What the templates call `me` / the items of `nodes`."""
    return {"name": node.name, "private_ip": node.private_ip, "ssh_port": node.ssh_port, "ssh_user": node.ssh_user,
            "workdir": node.workdir, "host_key": node.host_key}


def inventory(state: st.ClusterState) -> dict:
    """Pure: the inventory as data."""
    stack = state.cluster_spec.stack
    internal = st.internal_key_path(state.name)
    hosts = {}
    for node in state.nodes:
        venv, reuse = stack_venv(state, node)
        hosts[node.name] = {
            "ansible_host": node.public_ip, "ansible_port": node.ssh_port, "ansible_user": node.ssh_user,
            "ftc_index": node.index, "ftc_workdir": node.workdir, "ftc_private_ip": node.private_ip,
            "ftc_authorized_keys": node.authorized_keys, "ftc_me": node_vars(node), "ftc_venv": venv,
            "ftc_reuse_only": reuse, "ftc_pip_env": install_pip_env(state, reuse)}
    return {"all": {"children": {"ftc_nodes": {"hosts": hosts, "vars": {
        "ansible_ssh_private_key_file": str(st.access_key_path(state.name)),
        # Local nodes are this machine: its Python runs the modules; AWS nodes have the system's.
        "ansible_python_interpreter": sys.executable if traits(state.provider).shares_this_machine else "/usr/bin/python3",
        "ansible_ssh_common_args": f"-F /dev/null -o UserKnownHostsFile={st.known_hosts_path(state.name)} "
                                   "-o StrictHostKeyChecking=yes -o IdentitiesOnly=yes",
        "ftc_cluster": state.name, "ftc_stack": stack, "ftc_pins": STACKS[stack],
        "ftc_node_files": [{"src": str(source), "dest": dest} for dest, source in node_sources(state.provider).items()],
        "ftc_torch_index": "" if traits(state.provider).shares_this_machine else TORCH_CPU_INDEX,  # as bootstrap's
        "ftc_uv_version": UV_VERSION,
        "ftc_extra_index": INTEL_INDEX if stack == "intel" else "",
        "ftc_internal_key": str(internal),
        "ftc_internal_pub": internal.with_suffix(".pub").read_text().strip() if internal.exists() else "",
        "ftc_nodes": [node_vars(n) for n in state.nodes],
        "ftc_facts_dir": str(st.cluster_dir(state.name) / "facts"),
        "ftc_controller_python": sys.executable}}}}}


def write_inventory(state: st.ClusterState, out: str | None = None) -> Path:
    path = Path(local_path("out", out)) if out else st.cluster_dir(state.name) / "ansible" / "inventory.yml"
    text = "# Written by `ftc inventory` from the cluster state.\n" + yaml.safe_dump(inventory(state), sort_keys=False)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o600)
    except OSError as exc:
        raise UsageError(f"{label('out')}={out!r} cannot be written ({exc.strerror}); give a path in a writable directory") \
            from None
    return path


def run_playbook(name: str) -> int:
    """`ftc bootstrap --with ansible`: pin host keys, write the inventory, run site.yml."""
    playbook_bin = shutil.which("ansible-playbook") or str(Path(sys.executable).parent / "ansible-playbook")
    if not Path(playbook_bin).exists():
        raise FtcError("ansible-playbook not found; `make setup` installs ansible-core")
    with st.locked(name, "bootstrap --with ansible"):
        state = st.load(name)
        ensure_internal_key(name)
        pin_host_keys(state)
        path = write_inventory(state)
        (st.cluster_dir(name) / "facts").mkdir(exist_ok=True)
        started = time.monotonic()
        env = {**os.environ, "ANSIBLE_CONFIG": str(PLAYBOOK.parent / "ansible.cfg"),
               "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
        proc = subprocess.run([playbook_bin, "-i", str(path), str(PLAYBOOK)], env=env,  # noqa: S603
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        print(proc.stdout, end="")
        if proc.returncode != 0:
            raise FtcError(f"ansible-playbook failed (exit {proc.returncode}); the failed task is shown above; "
                           f"fix it and run `ftc bootstrap --name {name} --with ansible` again")
        mark_bootstrapped(state, [NodeFacts.from_dict(json.loads(p.read_text())) for p in facts_paths(state)])
    console.print(f"cluster {name} bootstrapped with Ansible in {time.monotonic() - started:.1f}s", markup=False)
    return 0
