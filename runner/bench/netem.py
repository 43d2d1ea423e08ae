"""A network that behaves like AWS's inside a cluster placement group, for `ftc bench network`.

AWS caps one TCP flow at 10 Gbit/s and a node at its instance's rate (25 Gbit/s for a
c7i.16xlarge). The per-flow cap is built from interfaces and `tbf` alone, which every kernel here
has (`fq`, whose `flow_max_rate` would cap each flow, and `netem` are not always built): each simulated node lives
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

Pure functions decide (rates, names, addresses, every step); `Network` makes the steps through
netlink (pyroute2), and a rank enters its node with setns(2), so neither needs iproute2's `ip` or
`tc` (the AMX host has neither).
"""

import os
import re
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


@dataclass(frozen=True)
class Step:
    """One change to one namespace's network, made through netlink (pyroute2): `kind` is one of
    bridge (create `dev`, up), up (`dev`), forward (IPv4 forwarding on), veth (`dev` here, its peer
    `peer` in namespace `peer_ns`), attach (`dev` to bridge `peer`, up), address (`cidr` on `dev`),
    shape (a token bucket at `gbit` on `dev`'s egress), route (to `cidr` via `via`, by `dev` if named)."""
    kind: str
    ns: str
    dev: str = ""
    peer: str = ""
    peer_ns: str = ""
    cidr: str = ""
    via: str = ""
    gbit: float = 0.0


def token_bucket(gbit: float) -> dict:
    """tbf's settings at `gbit`: a burst of 2 ms at the rate (at least 128 KB, so that a veth's 64 KB
    GSO packets pass whole), a queue of 50 ms beyond it; bytes, and the rate in bytes/s."""
    rate = int(gbit * 1e9 / 8)
    burst = max(128 * 1024, rate // 500)
    return {"rate": rate, "burst": burst, "limit": burst + rate // 20}


def setup_steps(layout: Layout) -> list[Step]:
    """Every step that builds `layout`, in order, after its namespaces exist."""
    sw, rates = layout.switch_ns, layout.rates
    steps = [Step("bridge", sw, "br0")] + [Step("up", ns, "lo") for ns in layout.namespaces()]
    for i in range(layout.nodes):
        node, router, port = layout.node_ns(i), layout.router_ns(i), f"p{i}"
        steps += [Step("forward", router), Step("veth", router, "uplink", peer=port, peer_ns=sw),
                  Step("attach", sw, port, peer="br0"), Step("address", router, "uplink", cidr=f"{SWITCH_NET}.{i + 1}/24"),
                  Step("up", router, "uplink"),
                  Step("shape", router, "uplink", gbit=rates.node_gbit), Step("shape", sw, port, gbit=rates.node_gbit)]
        for j in range(layout.flows):
            near, far = f"10.{200 + j}.{i}.1", layout.address(i, j)
            steps += [Step("veth", router, f"d{j}", peer=f"f{j}", peer_ns=node),
                      Step("address", router, f"d{j}", cidr=f"{near}/24"), Step("address", node, f"f{j}", cidr=f"{far}/24"),
                      Step("up", router, f"d{j}"), Step("up", node, f"f{j}"),
                      # flow j of every node is reached through this node's interface j
                      Step("route", node, f"f{j}", cidr=f"10.{200 + j}.0.0/16", via=near),
                      Step("shape", node, f"f{j}", gbit=rates.flow_gbit), Step("shape", router, f"d{j}", gbit=rates.flow_gbit)]
            steps += [Step("route", router, cidr=f"10.{200 + j}.{m}.0/24", via=f"{SWITCH_NET}.{m + 1}")
                      for m in range(layout.nodes) if m != i]
    return steps


def stale_namespaces(names: list[str], alive) -> list[str]:
    """Namespaces this module made for a process that is gone (`alive(pid)` false)."""
    pattern = re.compile(rf"^{re.escape(PREFIX)}(\d+)-")
    return [name for name in names if (m := pattern.match(name)) and not alive(int(m.group(1)))]


# Runs argv[2:] inside the network namespace named argv[1] (setns(2) on its file under /var/run/netns, as
# `ip netns exec` does, without needing iproute2): CLONE_NEWNET is 0x40000000.
_ENTER = ("import ctypes, os, sys; fd = os.open('/var/run/netns/' + sys.argv[1], os.O_RDONLY); "
          "libc = ctypes.CDLL(None, use_errno=True); "
          "libc.setns(fd, 0x40000000) == 0 or sys.exit('setns ' + sys.argv[1] + ': ' + os.strerror(ctypes.get_errno())); "
          "os.execvp(sys.argv[2], sys.argv[2:])")


def enter(ns: str, command: list[str]) -> list[str]:
    """`command` run inside namespace `ns`."""
    return [sys.executable, "-c", _ENTER, ns, *command]


def in_node(layout: Layout, command: list[str]) -> list[str]:
    """`command` run by an mpirun rank inside its own node's namespace: rank r on node r (one rank
    a node), the rank read from whichever launcher started it (runner/node/distenv.py's variables)."""
    pick = 'exec "$1" -c "$2" "$0-n${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-$RANK}}" "${@:3}"'
    return ["bash", "-c", pick, layout.tag, sys.executable, _ENTER, *command]


def missing() -> str:
    """What this machine lacks to build the network ('' when nothing): root, pyroute2, namespaces."""
    if os.geteuid() != 0:
        return "not root (network namespaces and tc need root)"
    try:
        from pyroute2 import netns
    except ImportError:
        return "no pyroute2 (netlink from Python): `make setup` installs it, or pip install pyroute2"
    probe = f"{PREFIX}{os.getpid()}-probe"
    try:
        netns.create(probe)
    except OSError as exc:
        return f"no network namespaces here (creating one said: {exc})"
    netns.remove(probe)
    return ""


def apply(steps: list[Step]) -> None:
    """Make `steps` through netlink, one socket per namespace."""
    from pyroute2 import NetNS
    sockets: dict[str, NetNS] = {}
    try:
        for step in steps:
            if step.ns not in sockets:
                sockets[step.ns] = NetNS(step.ns)
            try:
                _make(sockets[step.ns], step)
            except Exception as exc:
                raise RuntimeError(f"{step}: {exc}") from exc
    finally:
        for sock in sockets.values():
            sock.close()


def _make(ns, step: Step) -> None:
    """One step on `ns`, a pyroute2 socket inside its namespace."""
    def index(dev: str) -> int:
        return ns.link_lookup(ifname=dev)[0]
    if step.kind == "bridge":
        ns.link("add", ifname=step.dev, kind="bridge")
        ns.link("set", index=index(step.dev), state="up")
    elif step.kind == "up":
        ns.link("set", index=index(step.dev), state="up")
    elif step.kind == "forward":
        subprocess.run(enter(step.ns, [sys.executable, "-c", "open('/proc/sys/net/ipv4/ip_forward', 'w').write('1')"]),
                       check=True, capture_output=True)
    elif step.kind == "veth":
        ns.link("add", ifname=step.dev, kind="veth", peer={"ifname": step.peer, "net_ns_fd": step.peer_ns})
    elif step.kind == "attach":
        ns.link("set", index=index(step.dev), master=index(step.peer), state="up")
    elif step.kind == "address":
        address, prefix = step.cidr.split("/")
        ns.addr("add", index=index(step.dev), address=address, prefixlen=int(prefix))
    elif step.kind == "shape":
        ns.tc("replace", "tbf", index(step.dev), 0x10000, **token_bucket(step.gbit))
    elif step.kind == "route":
        ns.route("add", dst=step.cidr, gateway=step.via, **({"oif": index(step.dev)} if step.dev else {}))
    else:
        raise ValueError(f"unknown step kind {step.kind!r}")


def _pid_alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def remove_stale() -> list[str]:
    """Delete the namespaces (and with them their links) a killed earlier run left."""
    from pyroute2 import netns
    stale = stale_namespaces(netns.listnetns(), _pid_alive)
    for name in stale:
        netns.remove(name)
    return stale


class Network:
    """`with Network(layout):` the namespaces, links and shaping of `layout`, removed on the way
    out however it is left (deleting a namespace deletes its veths, and their peers with them)."""

    def __init__(self, layout: Layout):
        self.layout = layout

    def __enter__(self) -> Layout:
        from pyroute2 import netns
        remove_stale()
        try:
            for ns in self.layout.namespaces():
                netns.create(ns)
            apply(setup_steps(self.layout))
        except BaseException:
            self.remove()
            raise
        return self.layout

    def __exit__(self, *exc) -> None:
        self.remove()

    def remove(self) -> None:
        from pyroute2 import netns
        present = set(netns.listnetns())
        for ns in self.layout.namespaces():
            if ns in present:
                netns.remove(ns)


def tcp_gbit(layout: Layout, flows: int, megabytes: float, sender: int = 0, receiver: int = 1) -> float:
    """Gbit/s that `flows` TCP connections together carry from node `sender` to node `receiver`,
    one connection on each of the first `flows` interfaces, `megabytes` each: measured at the
    receiver from its first byte to its last. The sender starts once the receiver says it listens."""
    addresses = [layout.address(receiver, j) for j in range(flows)]
    receive = subprocess.Popen(enter(layout.node_ns(receiver), [sys.executable, "-c", _RECEIVE, *addresses]),
                               stdout=subprocess.PIPE, text=True)
    try:
        if receive.stdout.readline().strip() != "listening":
            raise RuntimeError(f"the receiver in {layout.node_ns(receiver)} did not start")
        subprocess.run(enter(layout.node_ns(sender), [sys.executable, "-c", _SEND, str(int(megabytes * 1e6)), *addresses]),
                       check=True)
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
