"""`ftc plan`'s inputs and table, shared with the bench: the figures it takes from a bench.json,
one node's rate on an instance type, the levers it models and the model it sizes the job by."""

import argparse
import json
from pathlib import Path

from rich.markup import escape

from provision.errors import UsageError
from provision.ui import answer
from provision.values import label, number, one_of, whole
from runner.node.recipes import POWERSGD_RANK, wire_compress
from runner.node.units import duration

DEFAULT_BENCH = Path(__file__).resolve().parent.parent / "docs" / "bench.json"

RATE = number(0.1, 1e9, lo_included=True)  # samples/s of one node; below 0.1 a plan runs for years


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


def plan_levers(args: argparse.Namespace, network_gbps: float, compress: str):
    """The levers `ftc plan` models: its flags where given, else what ftc's jobs do on such an
    instance (estimate.default_levers); `compress` is plan_compress's."""
    from provision.estimate import Levers, default_levers
    from runner.jobspec import PARSERS as JOB_PARSERS
    default = default_levers(network_gbps)
    flows = default.flows if args.flows is None else whole(1, 64)("flows", args.flows)
    overlap = default.overlap if args.allreduce is None \
        else JOB_PARSERS["allreduce"]("allreduce", args.allreduce) == "overlap"
    accumulate = default.accumulate if args.accumulate is None else whole(1, 1024)("accumulate", args.accumulate)
    return Levers(flows, overlap, accumulate, POWERSGD_RANK if compress == "powersgd" else 0)


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


def print_plan(title: str, rows: list) -> None:
    from rich.table import Table
    table = Table(title=escape(title), title_justify="left")
    for column in ("nodes", "samples/s", "efficiency", "all-reduce", "training", "wall (with setup)", "cost"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(str(row.nodes), f"{row.samples_per_s:.0f}", f"{row.efficiency:.2f}",
                      f"{row.allreduce_s * 1000:.0f} ms", duration(row.train_s), duration(row.wall_s),
                      f"${row.usd:.2f}")
    answer.print(table)


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
