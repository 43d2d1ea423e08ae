"""A network that behaves like AWS's inside a cluster placement group, for `ftc bench --network`.

AWS caps one TCP flow at 10 Gbit/s and a node at its instance's rate (25 Gbit/s for a
c7i.16xlarge). This kernel has `tbf` and `htb` but neither `fq` (whose `flow_max_rate` would cap
each flow) nor `netem`, so the per-flow cap is built from interfaces: each simulated node lives
in its own network namespace with `flows` veths, each shaped at the flow cap, into its own
router namespace, whose one uplink to a bridge (in a switch namespace) is shaped at the node's
aggregate, both ways. A TCP connection leaves by one interface, so it gets at most the flow
cap; connections over several of the node's interfaces together get at most the aggregate.
Gloo opens one connection per peer per device, and takes a device per name in
GLOO_SOCKET_IFNAME: naming the node's interfaces f0,f1,... stands for naming eth0 several
times on AWS (several flows per peer).

Addresses (all inside the namespaces made here, nothing on the host's own network):
node i's interface fj is 10.(200+j).i.2/24, its router's end 10.(200+j).i.1; routers sit on
10.199.0.0/24 (router i at .i+1). Every namespace is named `ftcnet-<pid>-...` after the process
that made it, so a later run removes what a killed one left (its pid gone), and never a live one's.

Pure functions decide (rates, names, addresses, every `ip`/`tc` command line); `Network` runs them.
"""

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

from provision import estimate

PREFIX = "ftcnet-"
MAX_NODES = 200  # the node index is an address octet
MAX_FLOWS = 50  # a flow's index is the second octet above 200
SWITCH_NET = "10.199.0"


@dataclass(frozen=True)
class LinkRates:
    flow_gbit: float  # one TCP flow's cap
    node_gbit: float  # a node's aggregate, each way
    scale: float  # simulated over real: the real network's rates times this


def scaled_rates(real_flow_gbit: float, real_node_gbit: float, sim_rows_per_s: float, sim_grad_bytes: float,
                 real_rows_per_s: float, real_grad_bytes: float) -> LinkRates:
    """The link rates that give a simulated node the real node's ratio of compute to communication:
    a step's compute takes rows / rate, its all-reduce bytes / bandwidth, so the bandwidth scales
    with the rate times the gradient's bytes (a slower node, or a bigger gradient on its wire,
    needs proportionally more bandwidth for the same share of the step)."""
    for name, value in (("sim_rows_per_s", sim_rows_per_s), ("sim_grad_bytes", sim_grad_bytes),
                        ("real_rows_per_s", real_rows_per_s), ("real_grad_bytes", real_grad_bytes)):
        if not value > 0:
            raise ValueError(f"{name} must be positive, not {value!r}")
    scale = sim_rows_per_s * sim_grad_bytes / (real_rows_per_s * real_grad_bytes)
    return LinkRates(real_flow_gbit * scale, real_node_gbit * scale, scale)


def flows_to_fill(rates: LinkRates) -> int:
    """The fewest flows whose caps together reach the node's aggregate (3 for 10 and 25 Gbit/s)."""
    return estimate.flows_to_fill(rates.node_gbit, rates.flow_gbit)


@dataclass(frozen=True)
class Layout:
    """One network: `nodes` simulated nodes of `flows` interfaces each, at `rates`; `owner` is the
    pid that made it (it names the namespaces)."""
    owner: int
    nodes: int
    flows: int
    rates: LinkRates

    def __post_init__(self):
        if not 1 <= self.nodes <= MAX_NODES or not 1 <= self.flows <= MAX_FLOWS:
            raise ValueError(f"{self.nodes} nodes x {self.flows} flows: allowed 1..{MAX_NODES} x 1..{MAX_FLOWS}")

    @property
    def tag(self) -> str:
        return f"{PREFIX}{self.owner}"

    def node_ns(self, node: int) -> str:
        return f"{self.tag}-n{node}"

    def router_ns(self, node: int) -> str:
        return f"{self.tag}-r{node}"

    @property
    def switch_ns(self) -> str:
        return f"{self.tag}-sw"

    def namespaces(self) -> list[str]:
        return [self.switch_ns, *(ns for i in range(self.nodes) for ns in (self.router_ns(i), self.node_ns(i)))]

    def interfaces(self, flows: int | None = None) -> list[str]:
        """A node's first `flows` interfaces (all of them by default): what GLOO_SOCKET_IFNAME names."""
        return [f"f{j}" for j in range(self.flows if flows is None else flows)]

    def address(self, node: int, flow: int = 0) -> str:
        return f"10.{200 + flow}.{node}.2"

    @property
    def master_addr(self) -> str:
        return self.address(0, 0)


def shape(ns: str, dev: str, gbit: float) -> list[str]:
    """A token bucket at `gbit` on `dev`'s egress: a burst of 2 ms at the rate (at least 128 KB, so
    that a veth's 64 KB GSO packets pass whole), a queue of 50 ms beyond it."""
    rate = int(gbit * 1e9 / 8)  # bytes/s
    burst = max(128 * 1024, rate // 500)
    return ["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{int(gbit * 1e6)}kbit",
            "burst", str(burst), "limit", str(burst + rate // 20)]


def setup_commands(layout: Layout) -> list[list[str]]:
    """Every command that builds `layout`, in order, after its namespaces exist."""
    sw, rates = layout.switch_ns, layout.rates
    cmds = [["ip", "-n", sw, "link", "add", "br0", "type", "bridge"], ["ip", "-n", sw, "link", "set", "br0", "up"]]
    for ns in layout.namespaces():
        cmds.append(["ip", "-n", ns, "link", "set", "lo", "up"])
    for i in range(layout.nodes):
        node, router, port = layout.node_ns(i), layout.router_ns(i), f"p{i}"
        cmds += [["ip", "netns", "exec", router, "sysctl", "-qw", "net.ipv4.ip_forward=1"],
                 ["ip", "-n", router, "link", "add", "uplink", "type", "veth", "peer", "name", port, "netns", sw],
                 ["ip", "-n", sw, "link", "set", port, "master", "br0", "up"],
                 ["ip", "-n", router, "addr", "add", f"{SWITCH_NET}.{i + 1}/24", "dev", "uplink"],
                 ["ip", "-n", router, "link", "set", "uplink", "up"],
                 shape(router, "uplink", rates.node_gbit), shape(sw, port, rates.node_gbit)]
        for j in range(layout.flows):
            near, far = f"10.{200 + j}.{i}.1", layout.address(i, j)
            cmds += [["ip", "-n", router, "link", "add", f"d{j}", "type", "veth", "peer", "name", f"f{j}", "netns", node],
                     ["ip", "-n", router, "addr", "add", f"{near}/24", "dev", f"d{j}"],
                     ["ip", "-n", node, "addr", "add", f"{far}/24", "dev", f"f{j}"],
                     ["ip", "-n", router, "link", "set", f"d{j}", "up"], ["ip", "-n", node, "link", "set", f"f{j}", "up"],
                     # flow j of every node is reached through this node's interface j
                     ["ip", "-n", node, "route", "add", f"10.{200 + j}.0.0/16", "via", near, "dev", f"f{j}"],
                     shape(node, f"f{j}", rates.flow_gbit), shape(router, f"d{j}", rates.flow_gbit)]
            cmds += [["ip", "-n", router, "route", "add", f"10.{200 + j}.{m}.0/24", "via", f"{SWITCH_NET}.{m + 1}"]
                     for m in range(layout.nodes) if m != i]
    return cmds


def stale_namespaces(names: list[str], alive) -> list[str]:
    """Namespaces this module made for a process that is gone (`alive(pid)` false)."""
    pattern = re.compile(rf"^{re.escape(PREFIX)}(\d+)-")
    return [name for name in names if (m := pattern.match(name)) and not alive(int(m.group(1)))]


def in_node(layout: Layout, command: list[str]) -> list[str]:
    """`command` run by an mpirun rank inside its own node's namespace: rank r on node r (one rank
    a node), the rank read from whichever launcher started it (runner/node/distenv.py's variables)."""
    enter = 'exec ip netns exec "$0-n${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-$RANK}}" "$@"'
    return ["bash", "-c", enter, layout.tag, *command]


def missing() -> str:
    """What this machine lacks to build the network ('' when nothing): root, `ip`, `tc`, namespaces."""
    if os.geteuid() != 0:
        return "not root (network namespaces and tc need root)"
    lacking = [tool for tool in ("ip", "tc") if not shutil.which(tool)]
    if lacking:
        return f"no {' or '.join(lacking)} on PATH (Debian: apt-get install iproute2)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"no network namespaces here (`ip netns add` said: {made.stderr.strip() or made.returncode})"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    return ""


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip() or f'exit {proc.returncode}'}")


def _pid_alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def remove_stale() -> list[str]:
    """Delete the namespaces (and with them their links) a killed earlier run left."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    stale = stale_namespaces([line.split()[0] for line in listed.splitlines() if line.strip()], _pid_alive)
    for name in stale:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)
    return stale


class Network:
    """`with Network(layout):` the namespaces, links and shaping of `layout`, removed on the way
    out however it is left (deleting a namespace deletes its veths, and their peers with them)."""

    def __init__(self, layout: Layout):
        self.layout = layout

    def __enter__(self) -> Layout:
        remove_stale()
        try:
            for ns in self.layout.namespaces():
                _run(["ip", "netns", "add", ns])
            for cmd in setup_commands(self.layout):
                _run(cmd)
        except BaseException:
            self.remove()
            raise
        return self.layout

    def __exit__(self, *exc) -> None:
        self.remove()

    def remove(self) -> None:
        for ns in self.layout.namespaces():
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True)


def tcp_gbit(layout: Layout, flows: int, megabytes: float, sender: int = 0, receiver: int = 1) -> float:
    """Gbit/s that `flows` TCP connections together carry from node `sender` to node `receiver`,
    one connection on each of the first `flows` interfaces, `megabytes` each: measured at the
    receiver from its first byte to its last. The sender starts once the receiver says it listens."""
    addresses = [layout.address(receiver, j) for j in range(flows)]
    receive = subprocess.Popen(["ip", "netns", "exec", layout.node_ns(receiver), sys.executable, "-c", _RECEIVE,
                                *addresses], stdout=subprocess.PIPE, text=True)
    try:
        if receive.stdout.readline().strip() != "listening":
            raise RuntimeError(f"the receiver in {layout.node_ns(receiver)} did not start")
        _run(["ip", "netns", "exec", layout.node_ns(sender), sys.executable, "-c", _SEND, str(int(megabytes * 1e6)),
              *addresses])
        out, _ = receive.communicate(timeout=600)
    finally:
        if receive.poll() is None:
            receive.kill()
            receive.wait()
    return float(out.strip())


# The two ends of tcp_gbit: a listener per address (port 5201), then one connection each.
_RECEIVE = """
import socket, sys, threading, time
listeners = [socket.create_server((a, 5201)) for a in sys.argv[1:]]
print("listening", flush=True)
times, total = [], [0]
def drain(listener):
    conn, _ = listener.accept()
    while data := conn.recv(1 << 20):
        times.append(time.perf_counter())
        total[0] += len(data)
threads = [threading.Thread(target=drain, args=(s,)) for s in listeners]
[t.start() for t in threads]
[t.join() for t in threads]
print(total[0] * 8 / (max(times) - min(times)) / 1e9)
"""
_SEND = """
import socket, sys, threading
size, chunk = int(sys.argv[1]), b"x" * (1 << 20)
def send(address):
    with socket.create_connection((address, 5201)) as conn:
        left = size
        while left > 0:
            conn.sendall(chunk[:left])
            left -= len(chunk)
threads = [threading.Thread(target=send, args=(a,)) for a in sys.argv[2:]]
[t.start() for t in threads]
[t.join() for t in threads]
"""
