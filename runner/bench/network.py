"""`ftc bench network INSTANCE`: ftc's simulated nodes, each in its own network namespace, linked as
INSTANCE's nodes are on AWS (a per-flow cap and a per-node rate, scaled by a simulated node's rate
against the plan's; runner/bench/netem.py). One node alone first (its rate sets the links' scale), then at
each node count above 1 the raw all-reduce of the gradient on one flow and on several (against the
plan's ring model), and whole training passes with each lever, `repeats` rounds alternating. Into
OUT/bench.json's `network`, rewritten after each node count; needs root.
"""

import argparse
import functools
import os
import statistics
from dataclasses import dataclass
from pathlib import Path

from provision.errors import UsageError, option
from provision.providers import default_world
from provision.values import boolean, name_list

from ..node import facts as node_facts
from ..node.recipes import POWERSGD_RANK, wire_compress
from . import netem
from .common import (
    Bench,
    add_grad_compress,
    add_layout,
    add_out,
    add_workload,
    allreduce_seconds,
    check_layout,
    check_workload,
    physical_cores,
    progress,
    read_section,
    started,
    summary,
    today,
    whole_pass,
    write_section,
)

NAME = "network"
HELP = "training and the raw all-reduce on an emulated AWS network of INSTANCE's nodes (root)"


@dataclass(frozen=True)
class NetworkLever:
    """One way the simulated nodes exchange gradients, measured at each node count."""
    setting: str  # what it is, in the report
    many_flows: bool  # gloo on as many flows per peer as fill the node's rate (one device per interface); else one
    overlap: bool = False  # DDP's buckets reduced during backward; else ftc's all-reduce after it
    batch_factor: int = 1  # rows per node a step, times the bench's: above 1 a recipe change (the global batch grows)
    sync: bool = True  # False: no gradient exchange at all, the ceiling the shared host leaves the nodes
    grad_compress: str = ""  # what crosses the network, where not the ftc recipe's bf16 gradient (powersgd)
    comm_core: bool = False  # overlapped, gloo's threads on a core kept beside the node's compute cores

    def args(self, batch_per_node: int) -> list[str]:
        allreduce = "comm-core" if self.comm_core else "overlap" if self.overlap else "after-backward"
        return ["--allreduce", allreduce,
                *(["--grad-compress", self.grad_compress] if self.grad_compress else []),
                *(["--batch-size", str(batch_per_node * self.batch_factor)] if self.batch_factor != 1 else []),
                *([] if self.sync else ["--no-grad-sync"])]


NETWORK_LEVERS = {
    "one-flow": NetworkLever("one TCP flow per peer", False),
    "flows": NetworkLever("as many TCP flows per peer as fill the node's rate (ftc's default)", True),
    "flows-overlap": NetworkLever("flows, the all-reduce overlapped with backward in DDP's buckets", True, overlap=True),
    "flows-comm-core": NetworkLever("flows, overlapped in DDP's buckets, a gloo thread per flow on a core kept beside "
                                    "the node's compute cores (ftc's default from 16 cores a rank)", True, overlap=True,
                                    comm_core=True),
    "flows-batch-2x": NetworkLever("flows, twice the rows per node a step: a recipe change (global batch x2, its lr "
                                   "the user's to scale)", True, batch_factor=2),
    "flows-powersgd": NetworkLever(f"flows, the weight matrices as PowerSGD's rank-{POWERSGD_RANK} factors with error "
                                   "feedback (an approximate average: a numerics change)", True, grad_compress="powersgd"),
    "ceiling": NetworkLever("no gradient exchange (--no-grad-sync): the simulated nodes share one host's memory and "
                            "caches, which real nodes do not; efficiency against it is what the network costs", True,
                            sync=False),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("instance", metavar="INSTANCE",
                   help="the instance type whose network is emulated: a family (c7i: its 16xlarge) or a type "
                        "(c7i.8xlarge)")
    add_out(p)
    add_workload(p, rows="default 2048; quick: 256", repeats="default 3; quick: 1")
    add_layout(p)
    p.add_argument("--levers", default=None, metavar="A,B",
                   help=f"the network's levers to measure (default all): {', '.join(NETWORK_LEVERS)}")
    p.add_argument("--ena-express", default=None, metavar="1|0",
                   help="each flow at the ENA Express cap where INSTANCE has it (default 1, as ftc's clusters "
                        "launch), or at the plain cap (0)")
    add_grad_compress(p)


def checked(args: argparse.Namespace) -> None:
    check_workload(args)
    if args.levers is not None:
        args.levers = name_list(NETWORK_LEVERS, "network lever")("levers", args.levers)
    asked_express = args.ena_express is not None and boolean("ena_express", args.ena_express)
    args.ena_express = asked_express or args.ena_express is None
    args.instance = network_instance(args.instance)
    refuse_express_without(args.instance, asked_express)
    lacking = netem.missing()
    if lacking:
        raise UsageError(f"`ftc bench network` needs root, pyroute2 and network namespaces: {lacking}")
    physical = len(physical_cores())
    args.ranks = sorted({1, *(args.ranks or [n for n in ((1, 2) if args.quick else (1, 2, 4)) if n <= physical])})
    if args.ranks == [1]:
        raise UsageError(f"{option('ranks')}=1: `ftc bench network` needs a node count above 1 in {option('ranks')} "
                         "(2 or more)")
    check_layout(args)
    args.levers = network_levers(args.levers, max(args.ranks), args.cores_per_rank, physical)


def network_instance(raw: str) -> str:
    """The instance type whose network is emulated: a type of the catalog, or a family (c7i) for its
    16xlarge, the size the README's cluster uses. Pure."""
    from provision.catalog import INSTANCE_TYPES
    name = raw if "." in raw else f"{raw}.16xlarge"
    if name not in INSTANCE_TYPES:
        families = sorted({key.split(".")[0] for key in INSTANCE_TYPES})
        raise UsageError(f"INSTANCE={raw!r} is not an instance type; allowed: {', '.join(families)} (their 16xlarge) "
                         "or a type such as c7i.8xlarge")
    return name


def refuse_express_without(kind_name: str, asked: bool) -> None:
    """`--ena-express 1` on a type without ENA Express: refused, as `ftc up` and `ftc plan` refuse it."""
    from provision.catalog import INSTANCE_TYPES
    if asked and not INSTANCE_TYPES[kind_name].ena_express:
        raise UsageError(f"{option('ena_express')}=1, but {kind_name} has no ENA Express; allowed: 0, or a type that "
                         "has it (`ftc plan --json` names each type's)")


def network_levers(asked: list[str] | None, nodes: int, cores_per_node: int, physical: int) -> list[str]:
    """The levers measured: as asked, else all; the communication core needs a core beside
    each node's compute cores, refused when asked for where the host lacks them, left out of the default
    (with a line saying so). Pure but for that line."""
    room = nodes * (cores_per_node + 1) <= physical
    if asked and "flows-comm-core" in asked and not room:
        raise UsageError(f"{option('levers')}=flows-comm-core keeps a core beside each node's {cores_per_node}: "
                         f"{nodes} nodes x {cores_per_node + 1} cores > this host's {physical} physical cores; give "
                         f"{option('cores_per_rank')}={max(1, physical // nodes - 1)} or fewer nodes")
    if asked:
        return asked
    if not room:
        progress(f"note: flows-comm-core left out: {nodes} nodes x {cores_per_node + 1} cores exceed this host's "
                 f"{physical}; {option('cores_per_rank')}={max(1, physical // nodes - 1)} leaves room")
    return [name for name in NETWORK_LEVERS if room or name != "flows-comm-core"]


def run(args: argparse.Namespace) -> int:
    """One node alone, the links scaled from its rate, then each node count's network: its link check,
    raw all-reduce and levers; the section rewritten after each count."""
    from provision import estimate
    from provision.catalog import INSTANCE_TYPES
    out, mpi = started(args.out)
    kind_name, counts, kind = args.instance, [n for n in args.ranks if n > 1], INSTANCE_TYPES[args.instance]
    bench = Bench.of(args, out, mpi, rows=(256, 2048), repeats=(1, 3))
    alone = [whole_pass(bench.ftc(f"net-1-r{i}", 1))["rows_per_s"] for i in range(bench.repeats)]
    sim_rate, ftc1 = summary(alone)[0], bench.runs["net-1-r0"]
    asked = args.grad_compress or "auto"
    wire_bf16 = wire_compress(asked, ftc1["precision"] == "bf16", 2) == "bf16"  # as a node among several sends it
    sim_bytes = estimate.gradient_bytes(bf16=wire_bf16, params=parameter_count(bench.model))
    real_rate = plan_node_rate(kind_name)
    real_bytes = estimate.gradient_bytes(bf16=wire_compress(asked, kind.native_bf16, 2) == "bf16")
    express = args.ena_express and kind.ena_express  # as ftc's clusters launch: on wherever the type has it
    flow_cap = default_world().express_flow_gbps if express else default_world().flow_gbps
    rates = netem.scaled_rates(flow_cap, kind.network_gbps, sim_rate, sim_bytes, real_rate, real_bytes)
    flows = netem.flows_to_fill(rates)
    machine = f"{node_facts.cpu_info()[0]}, {len(bench.physical)} physical cores, {bench.cores_per_rank} per simulated node"
    progress(f"network bench on {machine}: {kind_name}'s network ({flow_cap:g} Gbit/s a flow"
             f"{' with ENA Express' if express else ''}, {kind.network_gbps:g} a node) x {rates.scale:.4f} = "
             f"{rates.flow_gbit:.3f} and {rates.node_gbit:.3f} Gbit/s: a simulated node trains {sim_rate:.1f} rows/s "
             f"and moves {sim_bytes / 1e6:.0f} MB a step, one {kind_name} {real_rate:.0f} rows/s (the plan's) and "
             f"{real_bytes / 1e6:.0f} MB; {flows} flows fill a node")
    report = {"instance": kind_name, "ena_express": express, "machine": machine, "date": today(),
              "scale": round(rates.scale, 5), "flow_gbit": round(rates.flow_gbit, 4),
              "node_gbit": round(rates.node_gbit, 4), "flows": flows,
              "real": {"flow_gbit": flow_cap, "node_gbit": kind.network_gbps,
                       "rows_per_s": round(real_rate, 2), "grad_bytes": real_bytes},
              "simulated_node": {"rows_per_s": sim_rate, "rows_per_s_runs": alone, "grad_bytes": sim_bytes,
                                 "precision": ftc1["precision"], "wire": "bf16" if wire_bf16 else "fp32"},
              "rows_per_pass": bench.rows, "repeats": bench.repeats,
              "model": f"distilbert-base-uncased architecture, {2 if args.quick else 6} layers, random weights",
              "network": "each node in its own network namespace: one veth per flow shaped (tbf) at the flow cap, "
                         "into the node's router namespace, whose uplink to a bridge is shaped at the node's rate, "
                         "both ways; gloo given one device per flow (GLOO_SOCKET_IFNAME=f0,f1,...)",
              "predicted": "ftc plan's model (provision/estimate.plan) at the simulated node's rate and batch, its "
                           "gradient bytes and the scaled links, with docs/bench.json's planner figures (exposure, "
                           "wait share)",
              "command": args.command_line, "link_check": {}, "entries": []}
    earlier = read_section(out, "network")  # each write merges into what OUT held before this run
    for nodes in counts:
        with netem.Network(netem.Layout(os.getpid(), nodes, flows, rates)) as layout:
            report["link_check"][str(nodes)] = check = link_check(layout, rates, flows)
            progress(f"  {nodes} nodes: one flow carries {check['one_flow_gbit']:.3f} Gbit/s, {flows} flows "
                     f"{check['flows_gbit']:.3f}")
            report["entries"] += [{"instance_type": kind_name, **entry, "levers": entry_levers(entry, express)}
                                  for entry in network_row(bench, layout, nodes, flows, sim_bytes, sim_rate,
                                                           ftc1["batch_size_per_rank"], args.levers)]
        report_path = write_section(out, "network", network_merged(earlier, report))
    for e in report["entries"]:
        print(entry_line(e))
    print(f"wrote {report_path} (network)")
    return 0


def entry_line(e: dict) -> str:
    return (f"  {e['nodes']} nodes, {e['lever']}: {e['rows_per_s']:.1f} rows/s, efficiency {e['efficiency']:.2f}"
            + (f" ({e['efficiency_vs_ceiling']:.2f} of the ceiling)" if e["efficiency_vs_ceiling"] else "")
            + (f"; plan {e['rows_per_s_predicted']:.1f} rows/s, exchange in training {e['allreduce_in_training_ms']:.0f} ms"
               + (f", raw all-reduce {e['allreduce_ms']:.0f} ms" if "allreduce_ms" in e else "")
               + f" (plan {e['allreduce_predicted_ms']:.0f} ms)" if "rows_per_s_predicted" in e else ""))


# What makes two runs the same emulated network: the instance, its per-flow cap, and the machine
# with its simulated node's cores ("<cpu>, 16 physical cores, 3 per simulated node").
NETWORK_SETTING = ("instance", "ena_express", "machine")


def network_merged(previous: dict | None, report: dict) -> dict:
    """The `network` section after `report` (one emulated network's run) joins `previous` (earlier runs
    into the same OUT): one report per network in `networks` (its links, scale and commands), every
    network's entries in `entries`, each naming its instance_type, its levers and its `network` (an index
    into `networks`). A run of a network measured before keeps that network's entries of other node
    counts and levers, and its link checks; a run on another host's CPU starts the section anew."""
    meta = {key: value for key, value in report.items() if key != "entries"}
    earlier = previous if previous and previous.get("networks") else {"networks": [], "entries": []}
    if earlier["networks"] and earlier["networks"][0]["machine"].split(",")[0] != meta["machine"].split(",")[0]:
        earlier = {"networks": [], "entries": []}
    networks = list(earlier["networks"])
    index = next((i for i, m in enumerate(networks)
                  if [m.get(k, False) for k in NETWORK_SETTING] == [meta.get(k, False) for k in NETWORK_SETTING]),
                 len(networks))
    same = networks[index] if index < len(networks) else None
    meta["link_check"] = {**(same["link_check"] if same else {}), **meta["link_check"]}
    meta["commands"] = [*(same["commands"] if same else []), meta.pop("command")]
    networks[index:index + 1] = [meta]
    measured = {(e["nodes"], e["lever"]) for e in report["entries"]}
    kept = [e for e in earlier["entries"] if e["network"] != index or (e["nodes"], e["lever"]) not in measured]
    fresh = [{**e, "network": index} for e in report["entries"]]
    return {"networks": networks, "entries": sorted(kept + fresh, key=lambda e: (e["network"], e["nodes"]))}


def entry_levers(entry: dict, express: bool) -> dict:
    """What an entry's run did to exchange gradients, as `ftc plan` names its levers."""
    lever = NETWORK_LEVERS[entry["lever"]]
    return {"flows": entry["flows"], "ena_express": express, "allreduce": entry["allreduce"] if lever.sync else "none",
            "comm_core": lever.comm_core, "batch_factor": lever.batch_factor,
            "grad_compress": lever.grad_compress or "auto"}


def network_row(bench: Bench, layout: netem.Layout, nodes: int, flows: int, grad_bytes: float,
                alone_rows_per_s: float, batch_per_node: int, levers: list[str]) -> list[dict]:
    """At `nodes` nodes on `layout`: the raw all-reduce on one flow and on `flows` (the gradient in
    as many pieces in flight), and training passes with each of `levers` (NETWORK_LEVERS), alternating."""
    raw = {n: allreduce_seconds(bench.out, nodes, bench.cores(nodes), bench.cores_per_rank, bench.mpi, grad_bytes / 1e6,
                                layout, n, n) for n in sorted({1, flows})}
    rates: dict[str, list[float]] = {name: [] for name in levers}
    comm: dict[str, list[float]] = {name: [] for name in levers}  # a step's all-reduce, as training saw it
    for repeat in range(bench.repeats):
        for name in levers:
            lever = NETWORK_LEVERS[name]
            run = bench.ftc(f"net-{nodes}-{name}-r{repeat}", nodes, extra=lever.args(batch_per_node), network=layout,
                            flows=flows if lever.many_flows else 1, kept=int(lever.comm_core))
            rates[name].append(whole_pass(run)["rows_per_s"])
            comm[name].append(statistics.mean(p["comm_s"] for p in run["timeline"]))
    ceiling = summary(rates["ceiling"])[0] if "ceiling" in rates else None
    return [network_entry(name, nodes, flows, layout, rates[name], comm[name], raw, grad_bytes, alone_rows_per_s,
                          ceiling, batch_per_node) for name in levers]


def network_entry(name: str, nodes: int, flows: int, layout: netem.Layout, runs: list[float], comm: list[float],
                  raw: dict[int, float], grad_bytes: float, alone: float, ceiling: float | None,
                  batch_per_node: int) -> dict:
    """One lever's entry: measured against one node alone and against the ceiling, and beside the
    plan's prediction, made at the node rate the ceiling leaves each node (else the one alone)."""
    from provision import estimate

    planner, lever = plan_figures(), NETWORK_LEVERS[name]
    n, (median, spread) = flows if lever.many_flows else 1, summary(runs)
    gbps = estimate.flow_limited_gbps(layout.rates.node_gbit, n, layout.rates.flow_gbit)
    node_rate = ceiling / nodes if ceiling else alone
    entry = {"nodes": nodes, "lever": name, "setting": lever.setting, "flows": n,
             "gloo_socket_ifname": ",".join(layout.interfaces(n)),
             "allreduce": "comm-core" if lever.comm_core else "overlap" if lever.overlap else "after-backward",
             "batch_per_node": batch_per_node * lever.batch_factor,
             "rows_per_s": median, "rows_per_s_range": spread, "rows_per_s_runs": runs,
             "efficiency": round(median / (nodes * alone), 3),
             "efficiency_vs_ceiling": round(median / ceiling, 3) if ceiling else None}
    if lever.sync:
        low_rank = POWERSGD_RANK if lever.grad_compress == "powersgd" else 0
        predicted = estimate.plan([nodes], 1, 1, node_rate, batch_per_node * lever.batch_factor, grad_bytes,
                                  layout.rates.node_gbit, planner["exposure"], planner["wait_share"], 0.0, 0.0,
                                  estimate.Levers(n, lever.overlap, 1, low_rank, comm_core=lever.comm_core),
                                  flow_gbps=layout.rates.flow_gbit)[0].samples_per_s
        exchange = estimate.exchange_seconds(grad_bytes, nodes, gbps, estimate.DEFAULT_HOP_LATENCY_S, low_rank, node_rate)
        entry |= {"rows_per_s_predicted": round(predicted, 3), "measured_over_predicted": round(median / predicted, 3),
                  "allreduce_in_training_ms": round(statistics.median(comm) * 1000, 1),
                  "allreduce_predicted_ms": round(exchange * 1000, 1)}
        if not low_rank:  # the raw all-reduce was of the whole gradient
            entry["allreduce_ms"] = round(raw[n] * 1000, 1)
    return entry | {"flow_gbit": round(layout.rates.flow_gbit, 4), "node_gbit": round(layout.rates.node_gbit, 4),
                    "scale": round(layout.rates.scale, 5)}


@functools.cache
def plan_figures() -> dict:
    """The plan's figures from docs/bench.json (runner/plan.py), read once per bench run."""
    from ..plan import DEFAULT_BENCH, bench_figures
    return bench_figures(str(DEFAULT_BENCH))


def link_check(layout: netem.Layout, rates: netem.LinkRates, flows: int) -> dict:
    """What TCP gets between two nodes of `layout` on one flow and on `flows`: about 2 s at the cap each."""
    megabytes = rates.flow_gbit * 1e9 / 8 * 2 / 1e6
    return {"one_flow_gbit": round(netem.tcp_gbit(layout, 1, megabytes), 4),
            "flows_gbit": round(netem.tcp_gbit(layout, flows, megabytes), 4)}


def plan_node_rate(kind_name: str) -> float:
    """One node's training rate on `kind_name`, as `ftc plan` takes it from docs/bench.json (distilbert)."""
    from provision import estimate
    from provision.catalog import INSTANCE_TYPES

    from ..plan import DEFAULT_BENCH, bench_figures, plan_rate
    kind = INSTANCE_TYPES[kind_name]
    return plan_rate(None, bench_figures(str(DEFAULT_BENCH)), kind, estimate.xeon_class(kind.native_bf16),
                      estimate.DISTILBERT_PARAMS)[0]


def parameter_count(model_dir: Path) -> int:
    from transformers import AutoConfig, AutoModelForSequenceClassification
    model = AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(model_dir))
    return sum(p.numel() for p in model.parameters())
