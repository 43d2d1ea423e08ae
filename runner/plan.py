"""`ftc plan`'s inputs and table, shared with the bench: the figures it takes from a bench.json,
one node's rate on an instance type, the levers it models and the model it sizes the job by."""

import argparse
import json
from dataclasses import replace
from pathlib import Path

from rich.markup import escape

from provision.errors import UsageError
from provision.ui import answer
from provision.values import boolean, label, number, one_of, whole
from runner.node.recipes import POWERSGD_RANK, unmeasured_compile, wire_compress
from runner.node.units import duration

DEFAULT_BENCH = Path(__file__).resolve().parent.parent / "docs" / "bench.json"

RATE = number(0.1, 1e9, lo_included=True)
NODE_COUNTS = "1,2,4,8"  # the cluster sizes a plan weighs unless given (and `ftc up` with NODES=auto)
# A cluster's setup, billed on every node before training: the EC2 emulator's launch and bootstrap of 4
# nodes (27 s, the image shipping the stack), the stack's install with uv (28 s with an empty cache:
# docs/install.json) and a minute for EC2 to boot a node, which no machine here can measure.
SETUP_MINUTES = 2.0  # samples/s of one node; below 0.1 a plan runs for years


def bench_figures(path: str) -> dict:
    """The figures `ftc plan` takes from a bench.json, each through the shared parsers: a file that
    lacks one or holds a bad one is refused in one line naming the file and the field."""
    try:
        bench = json.loads(Path(path).read_text())
        raw = {"exposure": bench["planner"]["exposure"], "wait_share": bench["planner"]["wait_share"],
               **{key: bench[key] for key in ("ftc_samples_per_s", "cores_per_rank", "precision", "cpu")}}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{label('bench')}={path!r} is not a full bench.json with planner figures "
                         f"({type(exc).__name__}: {exc}); run `ftc bench --out DIR` on a multi-core host") from None
    parsers = {"exposure": number(0, 100, lo_included=True), "wait_share": number(0, 10, lo_included=True),
               "ftc_samples_per_s": RATE, "cores_per_rank": whole(1, 1024), "precision": one_of(("bf16", "fp32")),
               "cpu": lambda _key, value: str(value)}  # only shown
    try:
        return {key: parse(key.upper(), raw[key]) for key, parse in parsers.items()}  # a field, named as it is
    except UsageError as exc:
        raise UsageError(f"{label('bench')}={path!r}: {exc}; run `ftc bench --out DIR` for a sound one") from None


def plan_levers(args: argparse.Namespace, kind, world, compress: str, steps: int):
    """The levers `ftc plan` models on instance type `kind` of `world`: its flags where given, else what
    ftc's jobs do there (estimate.default_levers; compiled where the job plans COMPILE_MIN_STEPS steps or
    more on a rank of the node's cores, as --compile auto decides without a measurement); `compress` is
    plan_compress's. The all-reduce is after backward unless --allreduce names another: where it does not,
    the plan also weighs the communication core, as the controller does (exchange_for)."""
    from provision.estimate import Levers, default_levers
    from runner.jobspec import PARSERS as JOB_PARSERS
    express = kind.ena_express if args.ena_express is None else boolean("ena_express", args.ena_express)
    if express and not kind.ena_express:
        raise UsageError(f"{label('ena_express')}=1, but this instance type has no ENA Express; allowed: 0, or a type "
                         "that has it (`ftc plan --json` lists each type's)")
    default = default_levers(kind.network_gbps, express, world.flow_gbps, world.express_flow_gbps)
    flows = default.flows if args.flows is None else whole(1, 64)("flows", args.flows)
    mode = "after-backward" if args.allreduce is None else JOB_PARSERS["allreduce"]("allreduce", args.allreduce)
    if mode == "auto":
        mode = "after-backward"
    if compress == "powersgd" and mode in ("overlap", "comm-core"):
        raise UsageError(f"{label('grad_compress')}=powersgd runs after backward, but {label('allreduce')} is {mode}; "
                         "set it to after-backward or auto")
    accumulate = default.accumulate if args.accumulate is None else whole(1, 1024)("accumulate", args.accumulate)
    compiled = one_of(("auto", "on", "off"))("compile", args.compile) if args.compile else "auto"
    return Levers(flows, mode in ("overlap", "comm-core"), accumulate, POWERSGD_RANK if compress == "powersgd" else 0,
                  comm_core=mode == "comm-core", express=express,
                  compiled=compiled == "on" or (compiled == "auto" and unmeasured_compile(steps, kind.physical_cores)[0]))


def exchange_for(provider: str, instance_type: str, nodes: int, express: bool, steps: int = 0) -> str:
    """ALLREDUCE auto on a cluster of `nodes` x `instance_type`: comm-core where the plan's model finds it
    faster than the all-reduce after backward on that network (a large exchange against a step's
    compute: compiled steps where the job plans `steps` of COMPILE_MIN_STEPS or more, as --compile auto),
    else after-backward; '' where the provider has no catalog to weigh (the job then runs after
    backward). A bench.json without planner figures leaves it '' too."""
    from provision import estimate
    from provision.providers import world
    own = world(provider)
    kind = own.instance_types.get(instance_type)
    if kind is None or nodes < 2:
        return ""
    if kind.physical_cores < 2:  # no core to keep beside compute
        return "after-backward"
    try:
        bench = bench_figures(str(DEFAULT_BENCH))
    except UsageError:
        return ""
    cls = estimate.xeon_class(kind.native_bf16)
    rate, _ = plan_rate(None, bench, kind, cls, estimate.DISTILBERT_PARAMS)
    after = replace(estimate.default_levers(kind.network_gbps, express and kind.ena_express, own.flow_gbps,
                                            own.express_flow_gbps),
                    compiled=unmeasured_compile(steps, kind.physical_cores)[0])
    compiled = compile_figures(str(DEFAULT_BENCH)) or estimate.NO_COMPILE
    rows = [estimate.plan([nodes], 1, 1, rate, 32, estimate.gradient_bytes(bf16=cls == "bf16"), kind.network_gbps,
                          bench["exposure"], bench["wait_share"], 0.0, 0.0, levers, own.hop_latency_s, own.flow_gbps,
                          cores=kind.physical_cores, express_flow_gbps=own.express_flow_gbps, compiled=compiled)[0]
            for levers in (after, estimate.with_comm_core(after))]
    return "comm-core" if estimate.faster_rows([rows[0]], [rows[1]])[0] is rows[1] else "after-backward"


def plan_compress(args: argparse.Namespace) -> str:
    """What `ftc plan --grad-compress` says crosses the network, as a job's GRAD_COMPRESS does (default auto)."""
    from runner.jobspec import PARSERS as JOB_PARSERS
    return "auto" if args.grad_compress is None else JOB_PARSERS["grad_compress"]("grad_compress", args.grad_compress)


def wire_bf16(compress: str, cls: str) -> bool:
    """Whether the gradient crosses in bf16, as a job on that CPU class decides (recipes.wire_compress);
    PowerSGD's factors are counted apart (estimate.low_rank_bytes)."""
    return wire_compress(compress, cls == "bf16", 2) == "bf16"  # any node count that exchanges


def plan_rate(given: str | None, bench: dict, kind, cls: str, params: int) -> tuple[float, str]:
    """One node's training rate and where it comes from: given, or the bench's per-core rate carried
    to the instance's CPU class, cores and model size."""
    from provision import estimate
    if given:
        return RATE("samples_per_s", given), "given"
    bench_cls = estimate.xeon_class(bench["precision"] == "bf16")
    per_core = estimate.class_rate(bench["ftc_samples_per_s"] / bench["cores_per_rank"], bench_cls, cls)
    rate = per_core * kind.physical_cores * estimate.DISTILBERT_PARAMS / params  # a step's work grows with the weights
    source = (f"{estimate.CLASS_NAMES[cls]} on {kind.cpu}: the bench's {estimate.CLASS_NAMES[bench_cls]} rate on "
              f"{bench['cpu']}, {bench['ftc_samples_per_s']:.1f} samples/s on {bench['cores_per_rank']} cores")
    if cls != bench_cls:
        source += (f", x {per_core * bench['cores_per_rank'] / bench['ftc_samples_per_s']:.2f} as measured per core "
                   f"on each class ({estimate.LOCAL_RATE_PER_CORE[cls]:g} against "
                   f"{estimate.LOCAL_RATE_PER_CORE[bench_cls]:g} rows/s: estimate.LOCAL_RATE_PER_CORE)")
    return rate, source + f", to {kind.physical_cores} cores and {params / 1e6:.1f}M parameters"


def print_plan(title: str, rows: list, priced: bool = True) -> None:
    """The plan's table; `priced`: its cost is money, else node-hours (rows costed at 1 a node-hour)."""
    from rich.table import Table
    table = Table(title=escape(title), title_justify="left")
    for column in ("nodes", "samples/s", "efficiency", "all-reduce", "training", "wall (with setup)",
                   "cost" if priced else "node-hours"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(str(row.nodes), f"{row.samples_per_s:.0f}", f"{row.efficiency:.2f}",
                      f"{row.allreduce_s * 1000:.0f} ms", duration(row.train_s), duration(row.wall_s),
                      f"${row.usd:.2f}" if priced else f"{row.usd:.2f}")
    answer.print(table)


def node_hour_price(given: str | None, provider: str, catalog_usd: float, schedulers: list[str],
                    provider_setting: str) -> tuple[float, bool]:
    """What a plan costs a node-hour at, and whether that is money: the catalog's price of the instance type
    planned; on the nodes a scheduler lends (a provider of `schedulers`: a Slurm site's, which no catalog
    prices) the price you give (NODE_HOUR_PRICE, what your site charges), else 1 a node-hour, the plan then
    in node-hours: time only. The picks among cluster sizes weigh cost by ratio, so they are the same either
    way. `provider_setting`: how the user names the provider planned for (`ftc plan` has no flag for it:
    FTC_PROVIDER, or make's PROVIDER). Pure."""
    scheduled = provider in schedulers
    if given is None:
        return (1.0, False) if scheduled else (catalog_usd, True)
    if not scheduled:
        allowed = "".join(f", or {provider_setting}={name}" for name in schedulers)
        raise UsageError(f"{label('node_hour_price')} is for the nodes a scheduler lends, which no catalog prices; "
                         f"this plan's price is the catalog's; allowed: leave it out{allowed}")
    return number(0, 1e6)("node_hour_price", given), True


def plan_model(raw: str | None) -> tuple[str, int]:
    """The model `ftc plan` sizes the job by, and its parameters: a local directory's from its
    safetensors header (checked as a job's model is); anything else is taken for distilbert-base-uncased."""
    from provision.estimate import DISTILBERT_PARAMS
    from runner.jobspec import resolve_model
    from runner.model_files import parameter_count
    if not raw:
        return "distilbert-base-uncased", DISTILBERT_PARAMS
    model = resolve_model(raw)
    if not Path(model).is_dir():
        raise UsageError(f"{label('model')}={raw!r}: ftc plan sizes a model from a local directory (its safetensors "
                         f"header); give one, or leave {label('model')} out for distilbert-base-uncased's size")
    params = parameter_count(Path(model))
    if not params:
        raise UsageError(f"{label('model')}={raw!r} has no safetensors weights, whose header gives its size; save it with "
                         "save_pretrained (safetensors is the default)")
    return raw, params


def deadline_seconds(key: str, raw: str) -> float:
    """A deadline as `20m`, `1h30m`, `90s` or plain minutes (`20`): seconds, from 1 minute to 168 hours;
    minutes and seconds after a larger unit stay under 60."""
    import re
    text = str(raw).strip()
    match = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text, re.ASCII) if text else None
    if text.isascii() and text.isdecimal():
        seconds = 60 * int(text)
    elif match and any(match.groups()):
        hours, minutes, secs = (int(part or 0) for part in match.groups())
        carried = (match.group(1) and minutes >= 60) or ((match.group(1) or match.group(2)) and secs >= 60)
        seconds = -1 if carried else 3600 * hours + 60 * minutes + secs
    else:
        seconds = -1
    if not 60 <= seconds <= 7 * 86400:
        raise UsageError(f"{label(key)}={raw!r} is not a deadline; allowed: 1m to 168h, as 20m, 1h30m, 90s or "
                         "minutes (20)")
    return float(seconds)


BUDGET = number(0, 1e6)  # dollars


def compile_figures(path: str):
    """What compiling does to a long job, from a bench.json's long jobs (`ftc bench long-jobs`): ftc's
    default launch compiled over the same launch eager, and the cold compile's start cost; None where
    the bench has no such pair (the plan then offers no compile). ftc's fastest launch may be another
    (more ranks a node, eager), which a job takes only when asked (--ppn)."""
    from provision.estimate import Compile
    try:
        shape = json.loads(Path(path).read_text())["long_jobs"]["shapes"][0]
        launches, default = shape["launches"], shape["compile"]["ftc_launch"]
        compiled = launches[default]
        eager = launches[default.removesuffix(" compiled")]
        return Compile(round(compiled["later_rows_per_s"] / eager["later_rows_per_s"], 3),
                       float(compiled["start_cost_s"]["cold"]))
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None


# The size a search weighs: 16xlarge, one socket of 32 cores, the seed recipe's node. A node's rate is
# carried from the bench linearly in cores, and one rank measured far below linear from 8 to 16 cores
# (41 and 57 rows/s, docs/probes/node_shapes.json): the larger the node, the more that flatters it. A larger
# size is planned when named (--instance-type).
SEARCHED_SIZE = "16xlarge"


def offers(catalog, bench: dict, params: int, compress: str, only: str | None = None) -> list:
    """Every family's SEARCHED_SIZE in `catalog` (or the one type `only`), as the plan weighs it: the
    bench's rate carried to its CPU class and cores (plan_rate), and the gradient its nodes send (bf16
    where its CPU trains in bf16, as a job decides: wire_bf16)."""
    from provision import estimate
    chosen = []
    for name, kind in sorted(catalog.instance_types.items()):
        if name != only if only else name.partition(".")[2] != SEARCHED_SIZE:
            continue
        cls = estimate.xeon_class(kind.native_bf16)
        rate, _ = plan_rate(None, bench, kind, cls, params)
        chosen.append(estimate.Offer(name, rate, kind.physical_cores, kind.network_gbps, kind.usd_per_hour,
                                     kind.ena_express, estimate.gradient_bytes(wire_bf16(compress, cls), params)))
    return chosen


def fixed_levers(args: argparse.Namespace, compress: str):
    """The levers a search may not choose: --ena-express, --allreduce, --compile where given. The search
    weighs exact gradients only, so PowerSGD is refused there, and with an overlapped all-reduce anywhere."""
    from provision.estimate import Fixed
    from runner.jobspec import PARSERS as JOB_PARSERS
    mode = None if args.allreduce is None else JOB_PARSERS["allreduce"]("allreduce", args.allreduce)
    if compress == "powersgd" and mode in ("overlap", "comm-core"):
        raise UsageError(f"{label('grad_compress')}=powersgd runs after backward, but {label('allreduce')} is {mode}; "
                         "set it to after-backward or auto")
    if mode == "overlap":
        raise UsageError(f"{label('allreduce')}=overlap is not weighed by a search; allowed there: auto, after-backward, "
                         "comm-core (or name --instance-type without --deadline/--budget)")
    compiled = None if args.compile in (None, "auto") else one_of(("auto", "on", "off"))("compile", args.compile) == "on"
    return Fixed(None if args.ena_express is None else boolean("ena_express", args.ena_express),
                 None if mode in (None, "auto") else mode == "comm-core", compiled)


def row_record(row) -> dict:
    """One plan row as `ftc plan --json` prints it."""
    from provision.estimate import levers_record
    return {"instance_type": row.instance_type, "nodes": row.nodes, "levers": levers_record(row.levers),
            "samples_per_s": round(row.samples_per_s, 1), "efficiency": round(row.efficiency, 3),
            "allreduce_ms": round(row.allreduce_s * 1000, 1), "training_s": round(row.train_s, 1),
            "wall_s": round(row.wall_s, 1), "cost_usd": round(row.usd, 2)}


def print_search(title: str, rows: list, chosen) -> None:
    """The search's best rows, one per instance type and node count (its fastest levers), the pick first."""
    from rich.table import Table

    from provision.estimate import lever_words
    best: dict = {}
    for row in sorted(rows, key=lambda r: (r.usd, r.wall_s)):
        best.setdefault((row.instance_type, row.nodes), row)
    shown = [chosen] + [r for r in sorted(best.values(), key=lambda r: (r.wall_s, r.usd)) if r is not chosen][:11]
    table = Table(title=escape(title), title_justify="left")
    for column in ("instance type", "nodes", "levers", "samples/s", "efficiency", "training", "wall (with setup)", "cost"):
        table.add_column(column, justify="left" if column in ("instance type", "levers") else "right")
    for row in shown:
        table.add_row(("* " if row is chosen else "") + row.instance_type, str(row.nodes), lever_words(row.levers, row.nodes),
                      f"{row.samples_per_s:.0f}", f"{row.efficiency:.2f}", duration(row.train_s),
                      duration(row.wall_s), f"${row.usd:.2f}")
    answer.print(table)


def planned_steps(job, nodes: int) -> int:
    """The steps a job plans on `nodes` nodes (one rank each), where its rows are known before it loads
    them (a GLUE task, less its MAX_TRAIN_SAMPLES); 0 where they are not (your own files)."""
    from provision.estimate import GLUE_TRAIN_SIZES
    from runner.node.recipes import RECIPES
    rows = GLUE_TRAIN_SIZES.get(job.task, 0)
    if job.max_train_samples:
        rows = min(rows, job.max_train_samples)
    recipe = RECIPES[job.recipe]
    return (job.epochs or recipe["epochs"]) * rows // (nodes * (job.batch_size or recipe["batch_size"]))
