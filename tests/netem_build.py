"""Builds runner/bench/netem.py's network for 2 nodes of 3 flows in a process of its own, measures TCP over
1, 2 and 3 flows, removes it, and prints one JSON object: {"missing": why} where this machine cannot
build it, else the namespaces it saw while up and left after, and the three rates.

Its own process because pyroute2 forks helper children (netns.create, NetNS): in a pytest-xdist
worker, whose threads talk to the controller, a forked copy can disturb that channel and crash the
worker. `ftc bench network` runs it in its own single-purpose process the same way."""

import json
import os

from runner.bench import netem
from runner.bench.netem import Layout, LinkRates


def namespaces() -> list[str]:
    return os.listdir("/var/run/netns") if os.path.isdir("/var/run/netns") else []


def main() -> None:
    lacking = netem.missing()
    if lacking:
        print(json.dumps({"missing": lacking}))
        return
    layout = Layout(os.getpid(), 2, 3, LinkRates(flow_gbit=0.1, node_gbit=0.25, scale=0.01))
    with netem.Network(layout):
        up = sorted(set(layout.namespaces()) & set(namespaces()))
        rates = {str(n): netem.tcp_gbit(layout, n, 12.5) for n in (1, 2, 3)}  # about a second at the cap each
    left = [ns for ns in namespaces() if ns.startswith(layout.tag + "-")]
    print(json.dumps({"expected": layout.namespaces(), "up": up, "left": left, "gbit": rates}))


if __name__ == "__main__":
    main()
