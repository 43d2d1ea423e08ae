"""`ftc bench long-jobs NxC,...`: the rate once a compile has paid back, and what the compile costs at the
start. On each node shape (nodes x cores per node), two whole passes a run of ftc's default launch
compiled (its default shapes), the same on a fresh node that holds only the kernels that run brought
home, the peer compiled with static shapes (Trainer's torch_compile), ftc compiled with its other
shapes, the peer's fastest launch, ftc uncompiled, ftc compiled and uncompiled at the peer's fastest
launch, and ftc's default launch compiled and uncompiled at the peer's global batch (`--launches` picks
some of them: a 16-core round outlasts a 10-minute call); a long job's rate (the later pass), the start
cost (the first pass beyond it), the compile's start costs side by side, and MRPC's and QQP's training
time from them. ftc's kernels are kept in the bench node's cache, the peer's in a folder of the bench's
per launch, both starting empty in a new OUT. Into OUT/bench.json's `long_jobs`, rewritten after every
run, so a bench cut short keeps the runs it finished; a later call into the same OUT with the same
setting adds its rounds to them.
"""

import argparse
import contextlib
import os
import shutil
from dataclasses import dataclass, replace

from provision.errors import FtcError, UsageError
from provision.estimate import GLUE_TRAIN_SIZES
from provision.launch import default_ppn
from provision.values import name_list

from ..kernels import kept
from ..node import facts as node_facts
from ..node.protocol import HOME_KERNELS_DIR, KERNELS_ARCHIVE, OUTPUT_LOG, SHIPPED_KERNELS_DIR
from ..node.recipes import AUTO_SHAPES, RECIPES, SHAPES
from .common import (
    REPORT,
    Bench,
    add_out,
    add_workload,
    check_workload,
    physical_cores,
    progress,
    read_section,
    started,
    summary,
    today,
    write_section,
)

NAME = "long-jobs"
HELP = ("a long job's rate on node shapes, ftc compiled and not against the peer's fastest launch and its compile; "
        "the compile's start cost cold, from home, with other shapes and the peer's")
# Passes in every run: the first carries what a job pays once (kernel set-up, a compile);
# the second is the rate a long job (QQP's thousands of steps) trains at from then on.
LONG_JOB_PASSES = 2


# Jobs whose training time this mode works out from its measured parts: 3 epochs of MRPC's and QQP's
# training rows.
JOB_ROWS = {f"{task}, 3 epochs": 3 * GLUE_TRAIN_SIZES[task] for task in ("mrpc", "qqp")}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("shapes", metavar="NxC,...", help="node shapes: nodes x cores per node, e.g. 1x16,2x8")
    add_out(p)
    add_workload(p, rows="default 2048; quick: 128", repeats="default 3; quick: 2")
    p.add_argument("--launches", default="all",
                   help="all (default), or a comma list of: " + "; ".join(f"{k} ({v})" for k, v in LAUNCH_KINDS.items()))


def checked(args: argparse.Namespace) -> None:
    args.shapes = node_shape_list(args.shapes, len(physical_cores()))
    args.launches = tuple(name_list(tuple(LAUNCH_KINDS), "launch", "all")("launches", args.launches))
    check_workload(args)


def node_shape_list(raw: str, physical: int) -> list[tuple[int, int]]:
    """`1x16,2x8` as [(1, 16), (2, 8)]: nodes x cores per node, each shape within this host's cores."""
    shapes = []
    for item in raw.split(","):
        nodes, _, cores = item.strip().partition("x")
        if not (nodes.isascii() and nodes.isdecimal() and cores.isascii() and cores.isdecimal()
                and int(nodes) >= 1 and int(cores) >= 2):
            raise UsageError(f"SHAPES={item.strip()!r} is not NODESxCORES, nodes of 2 cores or more; "
                             "allowed: e.g. 1x16,2x8")
        if int(nodes) * int(cores) > physical:
            raise UsageError(f"SHAPES={item.strip()!r} needs {int(nodes) * int(cores)} physical cores; "
                             f"this host has {physical}")
        shapes.append((int(nodes), int(cores)))
    return shapes


@dataclass(frozen=True)
class LongJobLaunch:
    """One launch run on a node shape."""
    kind: str  # one of LAUNCH_KINDS: what `--launches` picks it by
    label: str  # how bench.json names it: program, nodes x ranks per node x cores per rank, and how
    program: str  # ftc | peer
    ranks_per_node: int
    compiled: bool  # ftc: --compile on, kernels kept in the node's cache; the peer: Trainer's torch_compile
    pinned: bool  # each rank on its own share of the node's cores (ftc's ranks always are)
    args: tuple[str, ...]  # the program's own flags for this launch
    from_home: bool = False  # ftc: on a fresh node holding only the kernels earlier runs left for home


# The launches of a shape, in the order they run (the start costs first: a call cut short keeps them),
# by the names `--launches` picks them by.
LAUNCH_KINDS = {
    "compiled": "ftc's default launch compiled, with its default shapes",
    "from-home": "the same on a fresh node holding only the kernels earlier runs brought home",
    "peer-compiled": "the peer compiled with static shapes at one rank per node",
    "other-shapes": "ftc compiled with the shapes it does not pick by default",
    "peer-fastest": "the peer's fastest launch, eager",
    "eager": "ftc's default launch uncompiled",
    "peer-at-ftc-launch": "the peer eager at ftc's default launch and its rows a step, the recipe's",
    "compiled-at-peer-launch": "ftc compiled at the peer's fastest launch",
    "eager-at-peer-launch": "ftc uncompiled at the peer's fastest launch",
    "compiled-at-peer-batch": "ftc's default launch compiled, each step the rows the peer's fastest launch trains",
    "eager-at-peer-batch": "the same uncompiled",
}
# The peer's fastest launch on a node: measured on one 16-core node (eager, unpinned) against 4 ranks of 4
# cores, which had beaten 1 and 2; on several nodes, pinned, it is the same rule unmeasured.
PEER_FASTEST = "a rank a core"
# How a launch at the peer's global batch names its rows a rank in its label.
AT_PEER_BATCH = "batch "
# The shapes a compiled ftc launch runs with that `--shapes auto` does not pick.
OTHER_SHAPES = next(shapes for shapes in SHAPES if shapes not in ("auto", AUTO_SHAPES))


def long_job_launches(nodes: int, cores: int, kinds: tuple[str, ...] = tuple(LAUNCH_KINDS)) -> list[LongJobLaunch]:
    """Of `kinds` (LAUNCH_KINDS), in its order: ftc's default launch (the ranks per node `ftc finetune`
    picks) compiled with its default shapes; the same on a fresh node that holds only the kernels that
    run brought home (a new cluster's first job); the peer compiled with static shapes at one rank per
    node, where a compile gains most (a rank's threads are the most); ftc compiled with its other shapes;
    the peer's fastest launch (PEER_FASTEST, unpinned on one node: faster than 4 ranks of 4 cores on 16,
    docs/probes/ranks_per_core.json, which beat 1 and 2, docs/probes/node_shapes.json); ftc uncompiled;
    the peer uncompiled at ftc's launch, pinned, so at the recipe's rows a step;
    ftc compiled and uncompiled at the peer's fastest launch; and ftc's default launch compiled and
    uncompiled at that launch's global batch (its ranks' rows a step together, as a user sets it with
    BATCH_SIZE): rates compared at one global batch. Pure."""
    ppn = default_ppn(1)
    peer_ppn = cores  # PEER_FASTEST; every shape has 2 cores or more a node, so it is never ftc's own launch
    peer_rows = RECIPES["seed"]["batch_size"] * peer_ppn // ppn  # the peer trains the seed recipe's batch a rank
    at_peer_batch, peer_batch = f"{AT_PEER_BATCH}{peer_rows}", ("--batch-size", str(peer_rows))

    def named(kind: str, program: str, per_node: int, compiled: bool, pinned: bool, variant: str = "",
              extra: tuple[str, ...] = (), from_home: bool = False) -> LongJobLaunch:
        """A launch, its label and its program's flags; `variant` and `extra`: a launch's own way, named."""
        if program == "ftc":  # compiled in the rank's process: a compile aside would not end within a pass
            how, own = "", ("--compile", "on", "--compile-aside-from", "0") if compiled else ("--compile", "off")
        else:
            how, own = " pinned" if pinned else " unpinned", ("--torch-compile",) if compiled else ()
        how += (" compiled" if compiled else "") + (f" {variant}" if variant else "")
        how += ", kernels from home" if from_home else ""
        return LongJobLaunch(kind, f"{program} {nodes}x{per_node}x{cores // per_node}{how}", program, per_node,
                             compiled, pinned, own + extra, from_home)
    default_shapes = ("--shapes", AUTO_SHAPES)
    every = [named("compiled", "ftc", ppn, True, True, extra=default_shapes),
             named("from-home", "ftc", ppn, True, True, extra=default_shapes, from_home=True),
             named("peer-compiled", "peer", 1, True, True, "static", ("--static-shapes",)),
             named("other-shapes", "ftc", ppn, True, True, OTHER_SHAPES, ("--shapes", OTHER_SHAPES)),
             named("peer-fastest", "peer", peer_ppn, False, nodes > 1),
             named("eager", "ftc", ppn, False, True),
             named("peer-at-ftc-launch", "peer", ppn, False, True),
             named("compiled-at-peer-launch", "ftc", peer_ppn, True, True, extra=default_shapes),
             named("eager-at-peer-launch", "ftc", peer_ppn, False, True),
             named("compiled-at-peer-batch", "ftc", ppn, True, True, at_peer_batch, default_shapes + peer_batch),
             named("eager-at-peer-batch", "ftc", ppn, False, True, at_peer_batch, peer_batch)]
    return [launch for launch in every if launch.kind in kinds]


def run(args: argparse.Namespace) -> int:
    """Each shape's launches (long_job_launches), alternating, `repeats` rounds on the same cores and
    rows, LONG_JOB_PASSES passes each; merged into OUT/bench.json as `long_jobs` after every run."""
    out, mpi = started(args.out)
    bench, shapes = Bench.of(args, out, mpi, rows=(128, 2048), repeats=(2, 3)), args.shapes
    progress(f"long jobs on {node_facts.cpu_info()[0]}: {', '.join(f'{n} x {c} cores' for n, c in shapes)}; "
             f"{LONG_JOB_PASSES} passes of {bench.rows} rows a run, {bench.repeats} rounds alternating")
    # The bench's node: ftc's ranks keep compiled kernels in its cache, as on a cluster's node; the peer's
    # go where torch keeps them by default, here a folder of the bench's that starts empty too.
    os.environ["FTC_NODE_DIR"] = str(out / "node")
    os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)  # torch may have set it in this process: ranks would inherit it
    setting = {"cpu": node_facts.cpu_info()[0], "model": bench.model.name, "rows_per_pass": bench.rows,
               "passes": LONG_JOB_PASSES, "allocator": bench.allocator or "glibc", "peer_fastest_launch": PEER_FASTEST}
    previous = same_setting(read_section(out, "long_jobs"), setting)
    earlier = previous["runs"] if previous else []
    commands = (previous["commands"] if previous else []) + [args.command_line]
    first_round = 1 + max((run["round"] for run in earlier), default=0)
    runs: list[dict] = []
    section = long_jobs_section(setting, earlier, commands)
    for round_ in range(first_round, first_round + bench.repeats):
        for nodes, cores in shapes:
            for launch in long_job_launches(nodes, cores, args.launches):
                if any(run["launch"] == launch.label and "failed" in run for run in earlier + runs):
                    continue  # it failed in an earlier round: it would fail again
                runs.append(long_job_one(bench, launch, nodes, cores, round_))
                progress(run_line(runs[-1]))
                section = long_jobs_section(setting, earlier + runs, commands)
                write_section(out, "long_jobs", section)
    for e in (e for e in section["shapes"] if "jobs" in e):
        print(f"{e['nodes']} x {e['cores_per_node']} cores, a long job's rate: {e['ftc_launch']} "  # labels name their program
              f"{e['ftc_later_rows_per_s']:.1f} rows/s, {e['peer_launch']} {e['peer_later_rows_per_s']:.1f}: "
              f"{e['long_job_speedup_vs_peer']:.2f}x; "
              + "; ".join(f"{job}: {j['speedup']:.2f}x" for job, j in e["jobs"].items())
              + "".join(f"; at the recipe's rows a step, {job}: {j['speedup']:.2f}x"
                        + (f" ({j['speedup_from_home']:.2f}x from home)" if "speedup_from_home" in j else "")
                        for job, j in e.get("jobs_at_recipe_batch", {}).items()))
    print(f"wrote {out / REPORT} (long_jobs)")
    return 0


def run_line(run: dict) -> str:
    if "failed" in run:
        return f"    failed: {run['failed']}"
    return (f"    later passes {later_rate(run):.1f} rows/s, start cost {start_cost(run):.1f} s"
            + (f" (kernel cache {run['cache']})" if run["cache"] != "none" else ""))


def long_job_one(bench: Bench, launch: LongJobLaunch, nodes: int, cores: int, round_: int) -> dict:
    """One run of `launch` on its shape: what it measured (long_job_run) or, when the peer's program
    fails, its error line: the peer is another project's program, and its failing on this job is a finding."""
    at = replace(bench, cores_per_rank=cores // launch.ranks_per_node)
    name, ranks = f"long-{launch.label.replace(',', '').replace(' ', '-')}-r{round_}", nodes * launch.ranks_per_node
    record = {"shape": f"{nodes}x{cores}", "launch": launch.label, "round": round_}
    if launch.program == "ftc":
        with fresh_node_from_home(bench, round_) if launch.from_home else contextlib.nullcontext():
            results = at.ftc(name, ranks, extra=list(launch.args), passes=LONG_JOB_PASSES)
        return {**record, **long_job_run(results, results["compile_cache"])}
    # a folder per launch: inductor writes a rank's threads into its CPU kernels, as on ftc's side
    kernels = bench.out / "peer-kernels" / launch.label.replace(" ", "-")
    cache = ("warm" if kernels.is_dir() and any(kernels.iterdir()) else "cold") if launch.compiled else "none"
    try:
        results = at.peer(name, ranks, launch.pinned, LONG_JOB_PASSES, list(launch.args),
                          {"TORCHINDUCTOR_CACHE_DIR": str(kernels)} if launch.compiled else None)
    except FtcError:  # run_peer's tail; the line that names the error is in the whole log
        return {**record, "cache": cache, "failed": failure_line((bench.out / "runs" / name / OUTPUT_LOG).read_text())}
    return {**record, **long_job_run(results, cache)}


@contextlib.contextmanager
def fresh_node_from_home(bench: Bench, round_: int):
    """The bench's node, for one run, a new one (an empty kernel cache) holding the kernels every earlier
    compiled run of this call left for home, shipped where ftc ships them to a new cluster's nodes."""
    node, node_before = bench.out / f"node-from-home-r{round_}", os.environ["FTC_NODE_DIR"]
    shutil.rmtree(node, ignore_errors=True)
    shipped = node / SHIPPED_KERNELS_DIR
    shipped.mkdir(parents=True)
    for kernels in (bench.out / "runs").glob(f"*/{HOME_KERNELS_DIR}"):
        for key in kept(kernels):  # kernels, not a later job's note on them alone
            for made in (kernels / f"{key}{KERNELS_ARCHIVE}", kernels / f"{key}.json"):
                shutil.copy(made, shipped / made.name)
    os.environ["FTC_NODE_DIR"] = str(node)
    try:
        yield
    finally:
        os.environ["FTC_NODE_DIR"] = node_before


def long_job_run(results: dict, cache: str) -> dict:
    """What one run measured: its passes ([rows, seconds] each, as the program timed them) and the
    kernel cache it found (cold, warm, warm from home: shipped from an earlier run, or none when not
    compiled). Pure."""
    home = results.get("compile_cache_from") == "an earlier cluster"
    return {"cache": "warm from home" if home else cache,
            "passes": [[e["pass_rows"], e["pass_seconds"]] for e in results["epoch_metrics"]]}


def failure_line(output: str) -> str:
    """The line of a failed program's output that names its error: a rank's last, without its prefix
    (torchrun's own ChildFailedError only says a rank failed), else the last naming one. Pure."""
    naming = [line for line in output.splitlines() if "Error" in line]
    ranks = [line.split("]: ", 1)[1].strip() for line in naming if line.startswith("[rank") and "]: " in line]
    return (ranks or [line.strip() for line in naming] or output.strip().splitlines()[-1:] or ["no output"])[-1]


def later_rate(run: dict) -> float:
    """Rows per second over the passes after the first: a long job's rate. Pure."""
    later = run["passes"][1:]
    return sum(rows for rows, _ in later) / sum(seconds for _, seconds in later)


def start_cost(run: dict) -> float:
    """What the first pass took beyond a later pass of its rows: kernel set-up, and the compile. Pure."""
    rows, seconds = run["passes"][0]
    return max(0.0, seconds - rows / later_rate(run))


def job_seconds(launch: dict, rows: float) -> float:
    """`rows` trained by a launch of long_job_entry's: its start cost (warm where measured so) and the rows at
    its later rate. Pure."""
    costs = launch["start_cost_s"]
    start = next(costs[cache] for cache in ("warm", "warm from home", "none", "cold") if cache in costs)
    return start + rows / launch["later_rows_per_s"]


def long_job_entry(nodes: int, cores: int, runs: list[dict]) -> dict:
    """One shape's row of bench.json's long_jobs, from its runs (every round, every call): each
    launch's later-pass rate (median, [min, max]) and start cost by kernel cache; each side's fastest
    launch for a long job and their ratio; each of JOB_ROWS' training time worked out from those parts
    (the start cost with the cache warm where it was measured so: a second job on the node); ftc's
    rates at the peer's global batch over the peer's (another recipe, so no side's best); and the
    launches that failed, with their error. Pure."""
    launches: dict[str, dict] = {}
    failed = {run["launch"]: run["failed"] for run in runs if "failed" in run}
    runs = [run for run in runs if "failed" not in run]
    for label in dict.fromkeys(run["launch"] for run in runs):
        mine = [run for run in runs if run["launch"] == label]
        rates = [later_rate(run) for run in mine]
        rate, spread = summary(rates)
        costs = {cache: summary([start_cost(run) for run in mine if run["cache"] == cache])[0]
                 for cache in dict.fromkeys(run["cache"] for run in mine)}
        launches[label] = {"later_rows_per_s": rate, "later_rows_per_s_range": spread, "start_cost_s": costs,
                           "runs": [round(r, 3) for r in rates]}

    # a run from home measures a start: its kernels, and so its rate, are the run's that compiled them; one
    # at the peer's global batch changes the recipe's rows a rank (recipes.batch_line): beside, not a side's best
    at_peer_batch = [label for label in launches if AT_PEER_BATCH in label]
    sides = {program: [label for label in launches if label.startswith(program + " ") and not label.endswith(" home")
                       and label not in at_peer_batch] for program in ("ftc", "peer")}
    if not (sides["ftc"] and sides["peer"]):
        return {"nodes": nodes, "cores_per_node": cores, "launches": launches, "failed": failed}  # a side not run yet
    ftc, peer = (max(sides[program], key=lambda label: launches[label]["later_rows_per_s"]) for program in ("ftc", "peer"))
    def jobs_of(candidates: dict[str, list[str]]) -> dict:
        """Each of JOB_ROWS' training time at each side's fastest launch for it of `candidates`."""
        jobs = {}
        for job, rows in JOB_ROWS.items():
            mine, theirs = (min(candidates[program], key=lambda label: job_seconds(launches[label], rows))
                            for program in ("ftc", "peer"))
            ftc_s, peer_s = (round(job_seconds(launches[label], rows), 1) for label in (mine, theirs))  # the ratio shown
            jobs[job] = {"rows": rows, "ftc_launch": mine, "ftc_s": ftc_s, "peer_launch": theirs, "peer_s": peer_s,
                         "speedup": round(peer_s / ftc_s, 3)}
        return jobs

    jobs = jobs_of(sides)
    # At the recipe's rows a step (ftc's default ranks a node, 32 rows each): a larger global batch can leave a
    # short job untrained (docs/probes/peer_accuracy_by_global_batch.json), so its time is not a time to a model.
    # A new cluster's job may start from kernels an earlier one brought home: its start and rate beside.
    at_ppn = {launch.label for launch in long_job_launches(nodes, cores) if launch.ranks_per_node == default_ppn(1)}
    at_recipe = {program: [label for label in labels if label in at_ppn] for program, labels in sides.items()}
    recipe_jobs = jobs_of(at_recipe) if at_recipe["ftc"] and at_recipe["peer"] else {}
    home = next((label for label in launches if "warm from home" in launches[label]["start_cost_s"]), None)
    for job in recipe_jobs.values() if home else ():
        job["ftc_from_home_s"] = round(launches[home]["start_cost_s"]["warm from home"]
                                       + job["rows"] / launches[home]["later_rows_per_s"], 1)
        job["speedup_from_home"] = round(job["peer_s"] / job["ftc_from_home_s"], 3)
    return {"nodes": nodes, "cores_per_node": cores, "ftc_launch": ftc,
            "ftc_later_rows_per_s": launches[ftc]["later_rows_per_s"], "peer_launch": peer,
            "peer_later_rows_per_s": launches[peer]["later_rows_per_s"],
            "long_job_speedup_vs_peer": round(launches[ftc]["later_rows_per_s"] / launches[peer]["later_rows_per_s"], 3),
            "jobs": jobs, "jobs_at_recipe_batch": recipe_jobs,
            "compile": compile_starts(launches, long_job_launches(nodes, cores, ("compiled",))[0].label),
            "at_peer_batch": {label: round(launches[label]["later_rows_per_s"] / launches[peer]["later_rows_per_s"], 3)
                              for label in at_peer_batch},
            "launches": launches, "failed": failed}


def compile_starts(launches: dict, default: str) -> dict:
    """What a compile costs ftc and the peer at the start, cold, side by side: ftc's `default` launch
    compiled with its default shapes against its other ones (OTHER_SHAPES) and against the peer's static
    ones, and a new cluster's first job that starts from the kernels an earlier one brought home, as a
    share of the cold start. Pure."""
    def cold(label: str) -> float | None:
        return launches.get(label, {}).get("start_cost_s", {}).get("cold")
    figures = {"ftc_launch": default, "ftc_shapes": AUTO_SHAPES, "ftc_cold_start_s": cold(default)}
    home = launches.get(f"{default}, kernels from home", {}).get("start_cost_s", {}).get("warm from home")
    other, peer = f"{default} {OTHER_SHAPES}", next((label for label in launches if label.endswith(" compiled static")), "")
    figures |= {"from_home_start_s": home, "other_shapes": OTHER_SHAPES, "other_shapes_cold_start_s": cold(other),
                "peer_launch": peer, "peer_cold_start_s": cold(peer)}
    if figures["ftc_cold_start_s"]:
        base = figures["ftc_cold_start_s"]
        figures["from_home_share"] = round(home / base, 3) if home is not None else None
        figures["other_shapes_start_vs_default"] = round(cold(other) / base, 3) if cold(other) else None
        figures["start_vs_peer_compiled"] = round(base / cold(peer), 3) if cold(peer) else None
        if other in launches and default in launches:
            figures["default_rate_vs_other_shapes"] = round(launches[default]["later_rows_per_s"]
                                                            / launches[other]["later_rows_per_s"], 3)
    return figures


def long_jobs_section(setting: dict, runs: list[dict], commands: list[str]) -> dict:
    """bench.json's long_jobs from every run so far of one `setting` (cpu, model, rows_per_pass, passes,
    allocator), each shape in the order first run. Pure."""
    shapes = list(dict.fromkeys(tuple(map(int, run["shape"].split("x"))) for run in runs))
    return {**setting, "date": today(), "commands": commands,
            "method": f"{setting['passes']} whole passes of MRPC's first {setting['rows_per_pass']} rows a run, "
                      f"{setting['model']} (distilbert's architecture, random weights), bf16, the launches alternating "
                      "in each round; each program times its own passes; a long job's rate is the later passes', the "
                      "start cost what the first took beyond them; the jobs' times are those parts added up "
                      "(training only: start-up and data loading are not in them)",
            "kernel_caches": "ftc: the bench node's own (FTC_NODE_DIR/cache), the peer: TORCHINDUCTOR_CACHE_DIR per "
                             "rank's threads, both under OUT: a new OUT's first round compiles cold, later rounds and "
                             "calls warm (each run's `cache`)",
            "shapes": [long_job_entry(n, c, [run for run in runs if run["shape"] == f"{n}x{c}"]) for n, c in shapes],
            "runs": runs}


def same_setting(previous: dict | None, setting: dict) -> dict | None:
    """`previous` (an earlier call's section in the same OUT) when it measured the same
    setting, so that its runs and this call's land in one report; else None. Pure."""
    return previous if previous and all(previous.get(key) == value for key, value in setting.items()) else None
