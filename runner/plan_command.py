"""`ftc plan`: a job's predicted time and cost per cluster size, or the cluster a deadline or budget picks
(runner/plan.py's inputs, provision/estimate.py's model); also the pick `ftc up --instance-type auto` builds.
"""

import argparse
import json
import os
from dataclasses import replace

from provision.errors import UsageError, via_make
from provision.providers import World
from provision.spec import (
    MAX_NODES,
    PARSERS,
    ClusterSpec,
    env_overrides,
    load_config,
    parsers_for,
)
from provision.ui import answer, console
from provision.values import label, number, whole, whole_list
from runner import plan
from runner.node.units import duration
from runner.plan import SETUP_MINUTES


def cmd_plan(args: argparse.Namespace) -> int:
    """The estimator: a measured per-node rate carried to the instance's cores and CPU class, the
    bench's all-reduce exposure and wait for the slowest rank, the instance's network (flow-limited)
    and price, the task's size, the levers (provision/estimate.py); then its decision in one sentence.
    With INSTANCE_TYPE auto (the default with --deadline or --budget), every planned type of the
    catalog, node count and lever is weighed, and the plan picks the cluster."""
    from provision import estimate
    job, given = _plan_job(args)
    if _plan_searches(args):
        return _plan_search(args, job, given)
    kind_name, world = _planned_instance_type(args.instance_type)
    kind = world.instance_types[kind_name]
    from provision.providers import names, traits
    price, priced = plan.node_hour_price(args.node_hour_price, _planned_provider(), kind.usd_per_hour,
                                         [name for name in names() if traits(name).scheduler],
                                         "PROVIDER" if via_make() else "FTC_PROVIDER")
    cls = estimate.xeon_class(kind.native_bf16)
    steps = job.epochs * job.train_samples // (max(given["nodes"]) * job.batch_per_node)
    levers = plan.plan_levers(args, kind, world, given["compress"], steps)
    rate, source = plan.plan_rate(args.samples_per_s, given["bench"], kind, cls, job.params)

    def plan_with(chosen: estimate.Levers) -> list[estimate.PlanRow]:
        rows = estimate.plan(given["nodes"], job.train_samples, job.epochs, rate, job.batch_per_node, job.grad_bytes,
                             kind.network_gbps, job.exposure, job.wait_share, price, job.setup_s, chosen,
                             world.hop_latency_s, world.flow_gbps, job.params, kind.physical_cores,
                             world.express_flow_gbps, job.compiled)
        return [replace(row, instance_type=kind_name) for row in rows]

    rows = plan_with(levers)
    if args.allreduce is None and not levers.low_rank:  # as the controller chooses for a job (plan.exchange_for)
        rows = estimate.faster_rows(rows, plan_with(estimate.with_comm_core(levers)))
        levers = rows[-1].levers
    cap = estimate.flow_cap(levers, world.flow_gbps, world.express_flow_gbps)
    alternatives = [(alt, plan_with(alt)) for alt in estimate.alternative_levers(levers, kind.network_gbps, cap)]
    recommendation = estimate.recommend(rows, levers, estimate.Assumed(rate, cls, job.batch_per_node, kind.network_gbps,
                                                                       given["lr"], cap), alternatives)
    if args.json:
        print(json.dumps({"rows": [plan.row_record(row) for row in rows], "recommendation": recommendation}))
        return 0
    cost = f"${price:g}/h" if priced else "time only: no price, cost in node-hours"
    plan.print_plan(f"{given['task']} x {job.epochs} epochs, {given['model']}, {kind_name} ({kind.cpu}, "
                    f"{kind.network_gbps:g} Gbit/s, {cost})", rows, priced)
    answer.print(f"per-node rate {rate:.1f} samples/s ({source}); the all-reduce at most "
                 f"{cap:g} Gbit/s per TCP flow (a placement group's cap{', ENA Express' if levers.express else ''}) and "
                 f"{kind.network_gbps:g} per instance"
                 + (f", overlapped: only what outlasts backward ({estimate.BACKWARD_SHARE:.0%} of compute) is exposed"
                    if levers.overlap else "") +
                 f", {job.exposure:.2f}x its idle time as measured in training, and a wait for the slowest "
                 f"node of {job.wait_share * 100:.0f}% of compute (both from the bench). "
                 f"Pass --samples-per-s with a rate measured on one {kind_name} for a real figure.", markup=False)
    answer.print(recommendation, markup=False)
    return 0


def plan_the_cluster(args: argparse.Namespace) -> None:
    """INSTANCE_TYPE auto and NODES auto on `up`: the cluster `ftc plan --deadline/--budget` picks for the
    job (--task), in their place; the pick is said before anything is asked or made."""
    if "auto" not in (args.instance_type, args.nodes):
        return
    if args.task is None:
        raise UsageError(f"{label('instance_type')}/{label('nodes')}=auto size the cluster for a job: give "
                         f"{label('task')} (e.g. qqp), and {label('deadline')} or {label('budget')} if you have one")
    provider = PARSERS["provider"]("provider", args.provider or os.environ.get("FTC_PROVIDER") or ClusterSpec.provider)
    from provision.providers import traits
    if not traits(provider).instance_types:
        raise UsageError(f"{label('instance_type')}=auto picks from a cloud's catalog; {label('provider')}={provider!r} "
                         "has none: name the nodes instead")
    only = None if args.instance_type in (None, "auto") else parsers_for(provider)["instance_type"](
        "instance_type", args.instance_type)
    nodes = plan.NODE_COUNTS if args.nodes in (None, "auto") else args.nodes
    asked = argparse.Namespace(task=args.task, nodes=nodes, epochs=args.epochs or "3", setup_minutes=str(SETUP_MINUTES),
                               batch_size=None, bench=str(plan.DEFAULT_BENCH), model=None, grad_compress=None,
                               deadline=args.deadline, budget=args.budget, ena_express=args.ena_express,
                               allreduce=None, compile=None)
    job, given = _plan_job(asked)
    _, chosen, found, _ = _searched(job, given, plan.fixed_levers(asked, "auto"), only)
    if not chosen.meets:
        raise UsageError(f"{label('instance_type')}/{label('nodes')}=auto: {chosen.why} Give a later "
                         f"{label('deadline')} or a larger {label('budget')}, or name the nodes")
    args.instance_type, args.nodes = chosen.row.instance_type, str(chosen.row.nodes)
    console.print(f"plan for {given['task']} x {job.epochs} epochs: {chosen.why} ({found.source})", markup=False,
                  soft_wrap=True)


def _plan_searches(args: argparse.Namespace) -> bool:
    """Whether `ftc plan` picks the instance type: INSTANCE_TYPE auto, or a deadline or budget with none given."""
    settings = {**load_config(None, os.environ), **env_overrides(os.environ)}
    named = args.instance_type or settings.get("instance_type")
    return named == "auto" or args.deadline is not None or args.budget is not None


def _plan_job(args: argparse.Namespace) -> tuple:
    """The job `ftc plan` sizes (estimate.Job) and what it was given besides, each input checked."""
    from provision import estimate
    from runner.jobspec import PARSERS as JOB_PARSERS
    from runner.node import glue
    from runner.node.recipes import RECIPES
    try:
        task = glue.task_name(args.task)
    except ValueError:
        raise UsageError(f"{label('task')}={args.task!r} is not a GLUE task ftc knows; allowed: "
                         f"{', '.join(glue.TASKS)}") from None
    nodes = sorted(whole_list(1, MAX_NODES, distinct=True)("nodes", args.nodes))
    epochs = whole(1, 1000)("epochs", args.epochs)
    setup_s = 60 * number(0, 1440, lo_included=True)("setup_minutes", args.setup_minutes)
    recipe = RECIPES["ftc"]
    batch = recipe["batch_size"] if args.batch_size is None else JOB_PARSERS["batch_size"]("batch_size", args.batch_size)
    bench = plan.bench_figures(args.bench)
    model, params = plan.plan_model(args.model)
    compress = plan.plan_compress(args)
    deadline = None if args.deadline is None else plan.deadline_seconds("deadline", args.deadline)
    budget = None if args.budget is None else plan.BUDGET("budget", args.budget)
    native = bench["precision"] == "bf16"  # the wire as the bench's nodes send it; each type's own below
    job = estimate.Job(estimate.GLUE_TRAIN_SIZES[task], epochs, batch,
                       estimate.gradient_bytes(bf16=plan.wire_bf16(compress, estimate.xeon_class(native)), params=params),
                       bench["exposure"], bench["wait_share"], setup_s,
                       plan.compile_figures(args.bench) or estimate.NO_COMPILE, params)
    return job, {"task": task, "nodes": nodes, "bench": bench, "model": model, "compress": compress, "lr": recipe["lr"],
                 "deadline": deadline, "budget": budget}


def _searched(job, given: dict, fixed, only: str | None = None) -> tuple:
    """Every planned instance type of the catalog (or `only` that one) x node count x lever (less those
    `fixed`): the rows, the pick, the catalog and its offers."""
    from provision import estimate
    from provision.providers import catalog, default_provider, default_world
    world = default_world()
    found = catalog(default_provider(), world.default_region)
    offers = plan.offers(found, given["bench"], job.params, given["compress"], only)
    rows = estimate.search(offers, given["nodes"], job, world.hop_latency_s, world.flow_gbps, world.express_flow_gbps,
                           fixed)
    return rows, estimate.pick(rows, given["deadline"], given["budget"]), found, offers


def _plan_search(args: argparse.Namespace, job, given: dict) -> int:
    """Every planned instance type of the catalog x node count x lever, and the pick."""
    if args.samples_per_s is not None:
        raise UsageError(f"{label('samples_per_s')} is one instance type's rate; give {label('instance_type')} with it, "
                         "or leave it out to carry the bench's rate to every type")
    only = args.instance_type if args.instance_type not in (None, "auto") else None
    if only:
        _planned_instance_type(only)  # a type of the catalog, checked as a spec's
    rows, chosen, found, offers = _searched(job, given, plan.fixed_levers(args, given["compress"]), only)
    rates = (f"each type's rate carried from the bench's ({given['bench']['ftc_samples_per_s']:.1f} samples/s on "
             f"{given['bench']['cores_per_rank']} cores of {given['bench']['cpu']}) by CPU class and cores: an "
             "extrapolation, not a measurement on that type")
    setup = (f"setup {duration(job.setup_s)} a cluster (--setup-minutes), compile "
             f"{duration(job.compiled.seconds)} on every node where compiled ({job.compiled.speedup:g}x faster steps"
             " after it: the bench's long jobs)")
    if args.json:
        print(json.dumps({"rows": [plan.row_record(row) for row in rows],
                          "pick": plan.row_record(chosen.row) | {"meets": chosen.meets},
                          "recommendation": chosen.why, "catalog": found.source, "rates": rates, "assumed": setup}))
        return 0
    plan.print_search(f"{given['task']} x {job.epochs} epochs, {given['model']}: the best of {len(rows)} plans "
                      f"({len(offers)} instance types x {len(given['nodes'])} node counts x levers)", rows, chosen.row)
    answer.print(f"{found.source}; {rates}; {setup}.", markup=False)
    answer.print(chosen.why, markup=False)
    return 0


def _planned_instance_type(given: str | None) -> tuple[str, World]:
    """The instance type `ftc plan` models, and the world (catalog, network) it is planned in: the
    provider's, or the default one. Only PROVIDER and INSTANCE_TYPE are resolved (flag > env > config),
    so a setting that plan does not use (HOSTS of the ssh provider) is not asked for."""
    from provision.providers import spec_world
    settings = {**load_config(None, os.environ), **env_overrides(os.environ)}
    provider = _planned_provider()
    world = spec_world(provider)
    raw = given or settings.get("instance_type") or world.default_instance_type
    return parsers_for(provider)["instance_type"]("instance_type", raw), world


def _planned_provider() -> str:
    """The provider `ftc plan` plans for (its PROVIDER: env > config > the default)."""
    settings = {**load_config(None, os.environ), **env_overrides(os.environ)}
    return PARSERS["provider"]("provider", settings.get("provider", ClusterSpec.provider))
