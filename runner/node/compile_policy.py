"""Whether a rank torch.compiles its training step, with which shapes, and the kernels it keeps.

What compiles is each of the model's repeated blocks (a transformer's layers), not the whole model: the
blocks share one forward, so dynamo traces and inductor compiles one block for all of them, and what lies
between (the embeddings, the head, the loss) runs eager. Side by side on a 16-core Xeon with AMX
(docs/probes/regional_compile.txt) a cold compile started in 0.46x the whole model's time and its steps ran
1.11x as fast.

The decision (`--compile auto|on|off`) weighs what this node measured of these kernels before (its
cache's note), else the job's planned steps against what a compile costs with the kernel cache as it
is: cold, warm from this node's own earlier jobs, or warm from kernels an earlier cluster compiled and
ftc shipped here from FTC_HOME (an earlier node's kernel cache, keyed by what makes it valid).

The shapes (`--shapes`): dynamic (one graph for every sequence length), or length buckets: a few
static widths, each compiled once, every batch padded to the smallest that holds its longest row.
"""

import hashlib
import json
import math
import os
import sys
import tarfile
from dataclasses import dataclass, replace
from pathlib import Path

# Whether the launcher chose where compiled kernels are cached; torch itself sets a default under /tmp
# once it looks, so this is read before anything compiles.
INDUCTOR_CACHE_GIVEN = "TORCHINDUCTOR_CACHE_DIR" in os.environ

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from .compiling import (  # noqa: E402
    ASIDE_DIR,
    ASIDE_LOG,
    TRACED_FLOATS,
    TRACED_SIZES,
    Aside,
    aside_inputs,
    aside_outcome,
    aside_stopped,
    compile_in_place,
    reaped,
    repeated_blocks,
    runs_aside,
    start_aside,
)
from .facts import cpu_info  # noqa: E402
from .inductor_files import (  # noqa: E402
    ISA_CHECKS_FILE,
    headers_archives,
    headers_marked_whole,
    headers_readied,
)
from .protocol import (  # noqa: E402
    HOME_KERNELS_DIR,
    KERNEL_CACHE_DIR,
    KERNELS_ARCHIVE,
    SHIPPED_KERNELS_DIR,
    kernels_words,
    merged_note,
    read_json,
    write_whole,
)
from .recipes import AUTO_SHAPES, COMPILE_ASIDE_MIN_STEPS, COMPILE_MIN_STEPS, unmeasured_compile  # noqa: E402
from .stepstats import StepStats  # noqa: E402

# A second compile of the same model and shapes, from the node's kept kernel cache, as a share of
# the first's time (docs/compile_cache.json): 0.375 on 4 AMX cores under torch 2.11, where compiled
# steps ran 21% faster; 0.07 under the pinned torch 2.13 on 2 cores, where they ran no faster. The
# larger keeps --compile auto from compiling short jobs on the strength of a gain not seen there.
WARM_COMPILE_SHARE = 0.375
# The note in a node's kernel cache, per kernels compiled there: how long each compile took, and the
# rates jobs measured there, eager and compiled (what --compile auto weighs).
COMPILED_FILE = "ftc-compiled.json"
# A rate from fewer steady steps is not noted: a smoke test's few steps would decide for real jobs.
RATE_MIN_STEPS = 20
# Length buckets: widths in steps of this many tokens, up to --max-length (MRPC at 128: 4 graphs).
BUCKET_STEP = 32
# What a kept cache's key holds besides the digest of the model's architecture: a cache made under
# other values is not this job's (another torch, CPU, thread count, precision, shapes or way of tracing).
KEY_FIELDS = ("torch", "isa", "architecture", "threads", "precision", "shapes", "batch_size", "floats", "folder",
              "compiled", "sizes")
# What compiles (repeated_blocks): a model without repeated blocks compiles whole.
BLOCKS, WHOLE_MODEL = "repeated blocks", "whole model"
# What a packed node cache holds: one thread count's kernels (kernel_cache). A cache packed when a node kept
# every thread count in one folder may hold another count's kernels under this key's graphs: not taken.
CACHE_FOLDER = "per thread count"
# The config entries that name a model rather than shape it: two copies of one architecture share kernels.
NAMING_KEYS = ("_name_or_path", "name_or_path", "transformers_version", "id2label", "label2id", "torch_dtype", "dtype",
               "architectures")


def shapes_of(asked: str, uneven_split: bool) -> str:
    """The shapes a compiled step runs with: as asked, auto as AUTO_SHAPES; dynamic where ranks split
    each global batch by their speed (`uneven_split`: every step's batch a size of its own). Pure."""
    return "dynamic" if uneven_split else AUTO_SHAPES if asked == "auto" else asked


def bucket_width(longest: int, max_length: int) -> int:
    """The static width a batch whose longest row is `longest` tokens is padded to. Pure."""
    return min(max_length, -(-longest // BUCKET_STEP) * BUCKET_STEP)


def bucket_widths(max_length: int) -> list[int]:
    """Every width bucket_width can give: the graphs a bucketed job compiles at most. Pure."""
    return sorted({bucket_width(n, max_length) for n in range(1, max_length + 1)})


# ---- the key: what makes kept kernels valid ----------------------------------------------------------

def architecture(config: dict) -> str:
    """The model's architecture as a digest of its config, names left out, the output count kept. Pure."""
    shape = {k: v for k, v in config.items() if k not in NAMING_KEYS}
    shape["num_labels"] = len(config.get("id2label") or {})
    return hashlib.sha256(json.dumps(shape, sort_keys=True, default=str).encode()).hexdigest()[:16]


def compile_key(config: dict, isa: list[str], threads: int, precision: str, shapes: str, batch_size: int,
                max_length: int, compiled: str = BLOCKS) -> dict:
    """What the kernels depend on: torch, the CPU's vector ISA, the architecture, the rank's threads
    (inductor writes them into its CPU kernels: a 16-thread rank's kernels are not a 4-thread rank's),
    precision, the shapes a step sees, how floats are traced and what compiles (`compiled`: BLOCKS or
    WHOLE_MODEL). Pure but for torch's version."""
    return {"torch": torch.__version__, "isa": ",".join(isa), "architecture": architecture(config),
            "threads": threads, "precision": precision,
            "shapes": f"buckets of {BUCKET_STEP} to {max_length}" if shapes == "buckets" else "dynamic",
            "batch_size": batch_size, "floats": TRACED_FLOATS, "folder": CACHE_FOLDER, "compiled": compiled,
            "sizes": TRACED_SIZES}


def key_digest(key: dict) -> str:
    return hashlib.sha256(json.dumps([key.get(f) for f in KEY_FIELDS], default=str).encode()).hexdigest()[:20]


def key_difference(mine: dict, theirs: dict) -> str:
    """The fields where a shipped cache's key differs from this job's, in words: 'torch 2.11 here 2.13'. Pure."""
    return ", ".join(f"{field} {theirs.get(field)!r} here {mine.get(field)!r}" for field in KEY_FIELDS
                     if theirs.get(field) != mine.get(field))


# ---- the decision ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Measured:
    """What this node measured of these kernels (its cache's note), against this job's planned work."""
    compile_s: float  # a compile with a cache like this one (cold or warm)
    eager_tokens_per_s: float  # a rank's steady real tokens per second, eager
    compiled_tokens_per_s: float  # the same, compiled
    planned_rank_tokens: float  # real tokens one rank trains on in this job: steps x its batch x the mean row
    from_cold: bool = False  # compile_s is WARM_COMPILE_SHARE of the cold compile measured, no warm one was
    where: str = "this node"  # or an earlier cluster: the note came home with the kernels and was shipped here

    @property
    def saving_s(self) -> float:
        return self.planned_rank_tokens / self.eager_tokens_per_s - self.planned_rank_tokens / self.compiled_tokens_per_s


def measured_figures(noted: dict, cache: str, layout: str, planned_rank_tokens: float,
                     where: str = "this node") -> Measured | None:
    """A note on these kernels (this node's, or the one shipped with them: what earlier clusters
    measured, `where`) as Measured (the rates of jobs of this `layout`: a rank's rate holds its share of
    the exchange), or None where it lacks a figure. A warm compile that was never measured (kernels
    shipped from the cluster that compiled them cold) costs its share of the cold one. Pure."""
    rates = noted.get("rates", {}).get(layout, {})
    compile_s, from_cold = seconds_or_rate(noted.get(f"{cache}_s")), False
    if compile_s is None and cache == "warm" and (cold_s := seconds_or_rate(noted.get("cold_s"))) is not None:
        compile_s, from_cold = cold_s * WARM_COMPILE_SHARE, True
    eager, compiled = (seconds_or_rate(rates.get(name)) for name in ("eager_tokens_per_s", "compiled_tokens_per_s"))
    if compile_s is None or not (eager and compiled and planned_rank_tokens):
        return None
    return Measured(compile_s, eager, compiled, planned_rank_tokens, from_cold, where)


def seconds_or_rate(figure) -> float | None:
    """A note's figure as a number, or None where it is not one (a note comes from files ftc did not
    write alone: it is weighed, never trusted to be well formed). Pure."""
    if isinstance(figure, bool) or not isinstance(figure, int | float) or not math.isfinite(figure) or figure < 0:
        return None
    return float(figure)


def compile_choice(mode: str, total_steps: int, threads: int, cache: str = "cold",
                   measured: Measured | None = None, aside: bool = False) -> tuple[bool, str]:
    """Whether to torch.compile, and why, in words for the log and results.json. Where this node, or an
    earlier cluster whose note came with the kernels, has measured it (`measured`), the compile runs when
    the time it saves over this rank's planned tokens exceeds its measured cost. Else never for a rank of
    fewer than COMPILE_MIN_THREADS `threads`, and otherwise by planned steps: with the kernel cache warm
    (an earlier job compiled the same model and shapes, here or on an earlier cluster), the compile
    costs WARM_COMPILE_SHARE of a cold one, and pays back after as many fewer steps; a cold one run `aside`
    the training costs a core for its time, and pays back from COMPILE_ASIDE_MIN_STEPS."""
    if mode != "auto":
        return mode == "on", f"{mode} (--compile {mode}, planned {total_steps} steps)"
    if measured:
        pays = measured.saving_s > measured.compile_s
        cost = (f"a warm compile {measured.compile_s:.0f} s, {WARM_COMPILE_SHARE:.1%} of the cold one"
                if measured.from_cold else f"a {cache} compile {measured.compile_s:.0f} s")
        return pays, (f"{'on' if pays else 'off'} (measured on {measured.where}: {cost}; "
                      f"a rank's steps {measured.eager_tokens_per_s:.0f} real tokens/s eager, "
                      f"{measured.compiled_tokens_per_s:.0f} compiled: the {total_steps} planned steps save "
                      f"{measured.saving_s:.0f} s)")
    return unmeasured_compile(total_steps, threads, compile_min_steps(cache, aside), cache, aside)


def eager_probe_steps(noted: dict, layout: str, steps_left: int, warmup: int) -> int:
    """How many of a compiled job's first steps run eager, measuring a rank's eager rate for the note
    beside the compiled one: where no note holds it for this `layout`, so that --compile auto can weigh
    both where the kernels go next (a short job on a new cluster, its kernels from home). None where the
    steps left would not measure the compiled rate after them too. Pure."""
    rates = noted.get("rates", {}).get(layout, {})
    if steps_left < 2 * probe_length(warmup) or seconds_or_rate(rates.get("eager_tokens_per_s")):
        return 0
    return probe_length(warmup)


def probe_length(warmup: int) -> int:
    """The eager steps that measure a rank's eager rate: their warm-up, then enough to time."""
    return warmup + RATE_MIN_STEPS


def agreed_probe_steps(mine: int, warmup: int, env) -> int:
    """The eager steps every rank runs, where this rank would run `mine`: all probe where one does (its node's
    note lacks the rate), since a rank that did not would wait at each step on the eager ones, and at its
    steady ones on their compile, and note a compiled rate far too low. A collective, as every_node."""
    return 0 if every_node(mine == 0, env) else probe_length(warmup)


def compile_min_steps(cache: str, aside: bool = False) -> int:
    if cache != "cold":
        return math.ceil(COMPILE_MIN_STEPS * WARM_COMPILE_SHARE)
    return COMPILE_ASIDE_MIN_STEPS if aside else COMPILE_MIN_STEPS


def every_node(flag: bool, env) -> bool:
    """Whether `flag` holds on every rank: each node decides from its own cache and notes, and the
    ranks must decide alike. A collective: every rank calls it, or the others wait for ever."""
    agreed = torch.tensor([int(flag)])
    if env.world_size > 1:
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
    return bool(agreed.item())


# ---- the node's kernel cache, and kernels shipped from home -------------------------------------------

def kernel_cache(out_dir: Path, stack: str, threads: int) -> Path:
    """Where compiled kernels are kept: per node, stack and a rank's threads, outside the job directory,
    so the next job of the same model and shapes on this node reuses them (unless the launcher chose a
    place, which is used as it is). Per thread count because inductor's C++ kernels fix it in their
    OpenMP pragmas, and torch before 2.13 leaves it out of its FX-graph cache's key: 4 ranks of 4 threads
    would load a 16-thread rank's kernels, 64 threads on 16 cores (measured: 0.73x their own eager rate).
    Pure but for the environment."""
    if INDUCTOR_CACHE_GIVEN:
        return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    node_dir = os.environ.get("FTC_NODE_DIR")
    return Path(node_dir) / "cache" / f"inductor-{stack}-{threads}-threads" if node_dir else out_dir / KERNEL_CACHE_DIR


def compiled_before(cache_dir: Path) -> dict:
    """The cache's note (COMPILED_FILE), by key_digest: {} where there is none or it is not one, and only
    the entries that are notes."""
    return {digest: note for digest, note in read_json(cache_dir / COMPILED_FILE).items() if isinstance(note, dict)}


def shipped_kernels() -> Path | None:
    """Where ftc puts the kernels it brought home from earlier clusters, on this node; None in a run by hand."""
    node_dir = os.environ.get("FTC_NODE_DIR")
    return Path(node_dir) / SHIPPED_KERNELS_DIR if node_dir else None


def shipped_entries(folder: Path | None) -> list[tuple[Path, dict | None]]:
    """Each shipped cache's artifacts and its key file read (None: unreadable), by name."""
    if folder is None or not folder.is_dir():
        return []
    entries = []
    for meta in sorted(folder.glob("*.json")):
        try:
            read = json.loads(meta.read_text())
            entries.append((meta.with_suffix(KERNELS_ARCHIVE), read if isinstance(read, dict) else None))
        except (OSError, ValueError):
            entries.append((meta.with_suffix(KERNELS_ARCHIVE), None))
    return entries


def pick_shipped(key: dict, entries: list[tuple[Path, dict | None]]) -> tuple[Path | None, dict, list[str]]:
    """The shipped cache made for this key (its artifacts and its note), and one line for each
    shipped cache of this architecture that is not this job's (stale or foreign) or cannot be read.
    Caches of other models are another job's, passed over without a word. Pure but for the file test."""
    lines, digest, taken = [], key_digest(key), (None, {})
    for artifacts, meta in entries:
        if meta is None or not isinstance(meta.get("key"), dict):
            lines.append(f"kernels: the shipped cache {artifacts.stem} cannot be read; ignored, compiling without it")
        elif key_digest(meta["key"]) == digest and taken[0] is None:
            if artifacts.is_file():
                taken = artifacts, meta.get("note") if isinstance(meta.get("note"), dict) else {}
            else:
                lines.append(f"kernels: the shipped cache {artifacts.stem} lacks its artifacts; ignored, compiling "
                             "without it")
        elif meta["key"].get("architecture") == key["architecture"] and key_digest(meta["key"]) != digest:
            lines.append(f"kernels: the shipped cache {artifacts.stem} was compiled for another setting "
                         f"({key_difference(key, meta['key'])}); ignored, compiling without it")
    return *taken, lines


def unpack_shipped(archive: Path, cache_dir: Path) -> str:
    """A shipped node cache into this node's kernel cache; '' when unpacked, else why not. The ISA checks'
    answers join those this node kept."""
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        kept_here = read_json(cache_dir / ISA_CHECKS_FILE)
        with tarfile.open(archive) as tar:
            tar.extractall(cache_dir, filter="data")  # names inside the cache only, no links out of it
        if kept_here:
            write_whole(cache_dir / ISA_CHECKS_FILE, read_json(cache_dir / ISA_CHECKS_FILE) | kept_here)
        return ""
    except (OSError, EOFError, tarfile.TarError) as exc:
        return f"{type(exc).__name__}: {str(exc)[:200]}"


@dataclass(frozen=True)
class Compiled:
    """What maybe_compile decided, for the log, results.json and the cache's note."""
    note: str  # whether torch.compile ran, and why, in words
    cache: str  # warm | cold: the kernel cache when the compile began; none: not compiled
    source: str  # where warm kernels came from: this node | an earlier cluster; "" when cold or not compiled
    shapes: str  # dynamic | buckets: what a compiled step runs with; "" when not compiled
    cache_dir: Path
    digest: str  # key_digest
    key: dict  # compile_key
    layout: str  # ranks and how the gradient crosses: what else a rank's rate depends on
    aside: Aside | None = None  # a cold compile running beside the training, until its kernels are in the cache


def cache_state(own: bool, shipped: Path | None, env) -> tuple[str, str]:
    """warm when every node holds kernels for this key, compiled in its own cache (`own`) or shipped from
    home, else cold: the ranks must agree, or one would wait at its first step on another's compile.
    With the source of the warm kernels: this node's own earlier jobs, or an earlier cluster."""
    if not every_node(own or shipped is not None, env):
        return "cold", ""
    return "warm", "this node" if own else "an earlier cluster"


def compiled_here(noted: dict) -> bool:
    """Whether this node's note says it compiled these kernels into its own cache; a note of rates alone
    is an eager job's, and kernels shipped from home are still to be taken. Pure."""
    return bool({"cold_s", "warm_s"} & noted.keys())


def measured_where(noted: dict, shipped_note: dict) -> str:
    """Whose figures --compile auto weighs: this node's note, the one shipped with kernels from home
    (earlier clusters'), or both. Pure."""
    if not shipped_note:
        return "this node"
    return "an earlier cluster and this node" if noted else "an earlier cluster"


def maybe_compile(training) -> Compiled:
    """Decide, and compile in place (the state dict, checkpoints and the saved model keep their names).
    `training`: train.Training, after a resume (it weighs the steps left)."""
    args, env, setup = training.args, training.env, training.setup
    threads = torch.get_num_threads()  # the rank's: its kernels' folder and their key say the same count
    cache_dir = kernel_cache(training.out_dir, args.stack, threads).resolve()  # torch's folders are absolute
    shapes = shapes_of(args.shapes, env.world_size > 1 and args.balance == "speed")
    blocks = repeated_blocks(training.model)
    key = compile_key(training.model.config.to_dict(), cpu_info()[1], threads, setup.precision, shapes,
                      args.batch_size, args.max_length, BLOCKS if blocks else WHOLE_MODEL)
    nodes = env.world_size // max(1, env.local_world_size)
    digest = key_digest(key)
    layout = f"{env.world_size} ranks on {nodes} node(s), gradient {setup.grad_compress}"
    noted = compiled_before(cache_dir).get(digest, {})
    own = compiled_here(noted)
    shipped, shipped_note = None, {}
    entries = shipped_entries(shipped_kernels()) if args.compile != "off" else []
    if args.compile != "off":
        shipped, shipped_note, lines = pick_shipped(key, entries)
        # kernels of its own: the note from home still adds what earlier clusters measured
        shipped, lines = (None, []) if own else (shipped, lines)
        for line in lines:
            training.log.warning(line)
        # one rank a node unpacks; cache_state's collective then holds every rank until it has
        if shipped is not None and env.local_rank == 0 and (failed := unpack_shipped(shipped, cache_dir)):
            training.log.warning(f"kernels: the shipped cache {shipped.stem} did not unpack ({failed}); ignored, "
                            "compiling without it")
            shipped = None
    cache, source = cache_state(own, shipped, env) if args.compile != "off" else ("cold", "")
    steps_left, lengths = training.total_steps - training.step, training.data.train["lengths"]
    planned_rank_tokens = steps_left * args.batch_size * sum(lengths) / max(1, len(lengths))
    known = merged_note(shipped_note, noted)
    # every node compiles aside or none does: its ranks' steps wait for every node's program (compiled_from_now)
    aside = args.compile != "off" and every_node(cache == "cold" and runs_aside(
        threads, args.compile_aside_from, training.setup.allreduce, shapes, bool(blocks)), env)
    compiled, note = compile_choice(args.compile, steps_left, threads, cache,
                                    measured_figures(known, cache, layout, planned_rank_tokens,
                                                     measured_where(noted, shipped_note)), aside)
    # every rank takes part in every_node (a collective), whatever it decided itself
    if args.compile == "auto" and not every_node(compiled, env) and compiled:
        compiled, note = False, f"off (not every node's own figures say the compile pays back; here: {note})"
    training.log.info(f"compile: {note}")
    if not compiled:
        return Compiled(note, "none", "", "", cache_dir, digest, key, layout)
    cache_dir.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    training.log.info(f"kernels: {kernels_words(cache, source)}")
    # the collectives below (agreed_probe_steps', or the switch's) hold the node's other ranks until these are in place
    if env.local_rank == 0:
        for line in headers_readied(cache_dir, cache == "cold", headers_archives(key, entries)):
            training.log.info(line)
    if blocks:
        training.log.info(f"compile: each of {len(blocks)} {type(blocks[0]).__name__} blocks; the rest runs eager")
    compile_in_place(training.model, blocks, shapes, cache_dir, len(bucket_widths(args.max_length)))
    if aside:
        return Compiled(note, cache, source, shapes, cache_dir, digest, key, layout,
                        aside_started(training, threads, shapes, cache_dir))
    training.stats.eager_steps = agreed_probe_steps(
        eager_probe_steps(known, layout, steps_left, args.warmup_steps_untimed), args.warmup_steps_untimed, env)
    if training.stats.eager_steps:
        training.log.info(f"compile: the first {training.stats.eager_steps} steps run eager, to note a rank's eager "
                          "rate beside the compiled one")
    return Compiled(note, cache, source, shapes, cache_dir, digest, key, layout)


def aside_started(training, threads: int, shapes: str, cache_dir: Path) -> Aside:
    """A cold compile started beside the training (runner/node/compiling.py) by the node's first rank, on its
    last core, which that rank leaves to it until the kernels are in the cache; until then every rank's steps
    run eager (compiled_from_now ends them)."""
    env, setup = training.env, training.setup
    aside = Aside(training.out_dir / ASIDE_DIR / f"node-{env.rank // max(1, env.local_world_size)}", threads)
    training.stats.eager_steps = training.total_steps
    if env.local_rank == 0:
        core = setup.cores[-1]
        inputs = aside_inputs(training.data.train, training.data.pad_id, training.data.task.labels is None,
                              training.args.batch_size)
        aside.process = start_aside(aside.folder, training.model, inputs, {
            "threads": threads, "precision": setup.precision, "shapes": shapes, "core": core,
            "widths": len(bucket_widths(training.args.max_length)), "cache_dir": str(cache_dir)})
        torch.set_num_threads(max(1, threads - 1))
        training.log.info(f"compile: cold: the kernels compile beside the training on core {core} (its log: "
                          f"{aside.folder / ASIDE_LOG}); until they are in the cache the steps run eager, on the "
                          "rank's other cores")
    return aside


def compiled_from_now(training) -> None:
    """Between steps while a compile runs aside: once every node's program is done (the ranks agree, so they
    switch at one step and none waits on another's eager steps), the steps run compiled on all the rank's
    threads, their compile finding the kernels in the cache. Where a node's program failed, the steps run eager
    to the end: its cache may hold a header cut short, which a compile would take."""
    aside, stats, env = training.compiled.aside, training.stats, training.env
    if aside.settled:
        return
    outcome = aside_outcome(aside)
    if not every_node(outcome is not None, env):
        return
    aside.settled = True
    if aside.process is not None:
        reaped(aside.process)  # it has written its outcome: the program is ending
    torch.set_num_threads(aside.threads)
    if every_node(bool(outcome.get("ok")), env):
        stats.eager_steps = stats.steps_run
        training.log.info(f"compile: the kernels compiled beside the training in {outcome.get('seconds')} s; "
                          f"steps run compiled from step {stats.steps_run + 1}")
    else:
        why = outcome.get("error") or "on another node"
        training.log.warning(f"compile: the compile beside the training failed ({why}); the steps run eager to the end")


def aside_ended(training) -> Compiled:
    """At the job's end: the compile aside stopped where it still runs. A job none of whose steps ran compiled
    is an eager one; where the program finished well its kernels stay in the node's cache, its headers marked
    whole for the next job, and where it did not (stopped, failed) they may hold a header cut short."""
    compiled, stats = training.compiled, training.stats
    if compiled.aside is None:
        return compiled
    finished = aside_stopped(compiled.aside)
    if stats.ran_compiled:
        return compiled
    if finished and training.env.local_rank == 0:
        mark_headers_whole(compiled.cache_dir)
    training.log.info("compile: the job's steps ran eager to its end; " + (
        "the kernels compiled beside it stay in the node's cache" if finished else
        f"the compile beside it {'failed' if compiled.aside.settled else 'was stopped'}"))
    return replace(compiled, note=f"{compiled.note}; its steps ran eager to the end", cache="none", shapes="")


# ---- after the job: what it measured, and its kernels for home ------------------------------------

def compile_seconds(stats: StepStats) -> float:
    """The compile's cost, measured: what the untimed compiled steps took beyond steady steps."""
    steady = stats.steady_seconds / max(1, stats.steady_steps)
    return max(0.0, stats.seconds - stats.eager_seconds - stats.steady_seconds - stats.untimed_steps * steady)


def remember_compile(compiled: Compiled, stats, env) -> dict:
    """Each node's first rank notes in its cache, for these kernels, what this job measured: the
    compile's seconds (cold or warm) and a rank's steady real tokens per second, compiled or eager
    (both where its first steps ran eager: eager_probe_steps), for `--compile auto` to weigh the next job
    by (written whole, then renamed: a reader never sees half a note). Returns the note for these kernels."""
    # A run by hand keeps its kernels in its own folder, no node's: an eager one has nothing to note there.
    kept_by_node = INDUCTOR_CACHE_GIVEN or bool(os.environ.get("FTC_NODE_DIR"))
    if env.local_rank != 0 or (compiled.cache == "none" and not kept_by_node):
        return {}
    measured: dict = {}
    if compiled.cache != "none" and stats.ran_compiled:
        # after a compile aside the rank's own compile took every graph from the cache: a warm one
        measured["warm_s" if compiled.aside else f"{compiled.cache}_s"] = round(compile_seconds(stats), 1)
    rates = {}
    if stats.steady_steps >= RATE_MIN_STEPS and stats.steady_seconds > 0:
        which = "eager_tokens_per_s" if compiled.cache == "none" else "compiled_tokens_per_s"
        rates[which] = round(stats.steady_tokens / env.world_size / stats.steady_seconds, 1)
    # steps run beside a compile aside ran a core short, beside a second process: not a rank's eager rate
    if compiled.aside is None and stats.eager_steady_steps >= RATE_MIN_STEPS and stats.eager_steady_seconds > 0:
        rates["eager_tokens_per_s"] = round(stats.eager_steady_tokens / env.world_size / stats.eager_steady_seconds, 1)
    if rates:
        measured["rates"] = {compiled.layout: rates}
    if compiled.cache != "none":
        mark_headers_whole(compiled.cache_dir)
    notes = compiled_before(compiled.cache_dir)
    mine = notes[compiled.digest] = merged_note(notes.get(compiled.digest), measured)
    if not mine:
        return {}
    written_whole(compiled.cache_dir / COMPILED_FILE, notes, "the kernel cache's note was not written; the next job "
                                                             "counts it cold")
    return mine


def mark_headers_whole(cache_dir: Path) -> None:
    """After a compile that ended: its precompiled headers marked whole, for the next job here to take."""
    try:
        headers_marked_whole(cache_dir)
    except OSError as exc:  # a full disk or a read-only cache: the next job builds its headers again
        print(f"compile: inductor's precompiled headers were not marked whole ({exc})", file=sys.stderr)


def graphs_compiled() -> dict[str, int]:
    """How this process's compiled graphs were made: taken whole from a cache (AOT autograd's, which holds
    inductor's kernels) or compiled (a miss, or a graph the cache passes by); and how often dynamo threw
    a trace away to start it again (a restart of its analysis: the compiled part traced once more)."""
    from torch._dynamo.utils import compilation_time_metrics, counters
    aot = counters["aot_autograd"]
    retraced = sum(len(times) for name, times in compilation_time_metrics.items()
                   if name.startswith("compile_attempt_") and name != "compile_attempt_0")
    return {"cached": aot["autograd_cache_hit"], "compiled": aot["autograd_cache_miss"] + aot["autograd_cache_bypass"],
            "retraced": retraced}


def keep_for_home(compiled: Compiled, note: dict, out_dir: Path) -> None:
    """Rank 0 leaves in the job's HOME_KERNELS_DIR, to come home with the results, what the next
    cluster's `--compile auto` weighs: this node's note for these kernels (what this job measured) with
    their key; and where the job compiled cold or from its node's own cache, that cache (inductor's
    FX-graph and AOT-autograd caches, the C++ kernels they load, which torch's portable cache artifacts
    leave out to be built again, and inductor's precompiled headers), which ftc ships to the next cluster's
    nodes. Kernels from home are there already, and an eager job has none: their notes come alone."""
    if not note:
        return
    folder = out_dir / HOME_KERNELS_DIR
    if compiled.cache != "none" and compiled.source != "an earlier cluster":
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tarfile.open(folder / f"{compiled.digest}{KERNELS_ARCHIVE}", "w:gz", compresslevel=1) as tar:
                for entry in sorted(compiled.cache_dir.iterdir()):
                    # the node's own note, and any file half written (write_whole's, renamed when whole)
                    if not entry.name.startswith((COMPILED_FILE, ISA_CHECKS_FILE + ".")):
                        tar.add(entry, arcname=entry.name, filter=without_locks)
        except OSError as exc:
            print(f"kernels: not kept for the next cluster ({exc})", file=sys.stderr)
            return
    cluster = os.environ.get("FTC_CLUSTER", "")
    written_whole(folder / f"{compiled.digest}.json", {"key": compiled.key, "note": note, "cluster": cluster,
                                                        "job": f"{cluster}:{out_dir.resolve()}"},
                  "kernels: their key was not written; the next cluster compiles cold")


def without_locks(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """A kernel cache's files for the archive, the lock files inductor leaves beside them left out."""
    return None if Path(member.name).name == "locks" or "/locks/" in member.name else member


def written_whole(path: Path, data: dict, failure: str) -> None:
    try:
        write_whole(path, data)
    except OSError as exc:  # a full disk or a read-only cache: this job's results stand
        print(f"compile: {failure} ({exc})", file=sys.stderr)
