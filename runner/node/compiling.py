"""How a rank compiles its model in place, and a cold compile run beside the training.

`compile_in_place` is the one way ftc compiles: each repeated block (or the whole model), with the dynamo
settings and inductor's files kept in the node's kernel cache. A rank calls it before its first step.

A cold compile costs a rank of 16 threads most of a minute on a Xeon, and MRPC's whole job is about a minute
and a half: compiled in the rank's process it does not pay back. Run aside, it does not stop the training:
the node's first rank starts this module as a program on its own last core, which compiles the same blocks
with the same settings on a few of the job's own rows into the same kernel cache, while the rank trains eager
on its other cores. Once the program says the kernels are in the cache, the ranks run compiled: their own
compile then finds every graph in torch's caches, a warm start of a few seconds.

    python -m runner.node.compiling FOLDER      # FOLDER: the spec, inputs and config a rank wrote (start_aside)
"""

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .protocol import read_json, write_whole

# How dynamo traces the floats a model reads, and input sizes (compile_in_place): graphs traced another way miss
# torch's caches.
TRACED_FLOATS = "constant"
TRACED_SIZES = "a symbol each"
# Where in the job's directory a compile aside keeps its folder, one a node.
ASIDE_DIR = "compile-aside"
# What the compile aside's folder holds: what the rank asked, the rows to compile on, and what came of it.
ASIDE_SPEC, ASIDE_INPUTS, ASIDE_OUTCOME, ASIDE_LOG = "spec.json", "inputs.pt", "outcome.json", "compile.log"
# Rows a batch in the compile aside: dynamic shapes make the batch a symbol, so few rows make the same kernels.
ASIDE_ROWS = 4
# Seconds the program aside may take to end once it has written its outcome, or been asked to stop.
ASIDE_EXIT_S = 30
# The program aside holds a second copy of the model: where memory runs out, the kernel kills it, not a rank.
OOM_SCORE_FIRST = "1000"


def repeated_blocks(module) -> list:
    """The members of each outermost ModuleList whose members are all of one class (a transformer's
    layers): what ftc compiles. [] where the model has none."""
    import torch
    if (isinstance(module, torch.nn.ModuleList) and len(module) > 1 and len({type(m) for m in module}) == 1
            and not isinstance(module[0], torch.nn.ModuleList | torch.nn.ModuleDict)):  # a container is never called
        return list(module)
    return [block for child in module.children() for block in repeated_blocks(child)]


def compile_in_place(model, blocks: list, shapes: str, cache_dir: Path, widths: int) -> None:
    """Compile `blocks` (or, where there are none, the whole model) in place, the kernels kept in `cache_dir`
    with inductor's ISA answers and precompiled headers. `widths`: how many static widths length buckets
    have (shapes == "buckets")."""
    import torch
    import torch.fx.experimental._config

    from .inductor_files import check_isa_without_importing_torch, headers_kept_in, isa_checks_kept_in
    if shapes == "buckets":
        # one static graph per width: no automatic switch to a dynamic graph at the second width
        torch._dynamo.config.automatic_dynamic_shapes = False
        # the blocks share one forward: blocks unlike in structure are graphs of their own at each width
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit,
                                                   (2 * widths + 2) * max(1, len(blocks)))
    # A float the model reads (a dropout's p) would be traced as a symbol, found constant at the end, and
    # dynamo would trace it a second time: taken as a constant from the start, a cold
    # compile is about a quarter shorter and a warm one a quarter of what it was (docs/bench-log.md).
    torch._dynamo.config.specialize_float = TRACED_FLOATS == "constant"
    # Input sizes that happen to be equal (32 rows 32 tokens wide) would share one symbol ("duck sizing"): a graph
    # that holds only while they are equal, traced again at the next step and unlike the graph the program aside made.
    torch.fx.experimental._config.use_duck_shape = TRACED_SIZES != "a symbol each"
    check_isa_without_importing_torch()
    isa_checks_kept_in(cache_dir)
    headers_kept_in(cache_dir)
    for part in blocks or [model]:
        part.compile(dynamic=shapes == "dynamic")


# ---- a cold compile aside: the rank's side ---------------------------------------------------------------

@dataclass
class Aside:
    """A compile running beside a rank's training: where it reports, and what the rank gives back at the switch."""
    folder: Path  # its spec, inputs, log and outcome: one a node
    threads: int  # the rank's own, given back once every node's program is done
    process: subprocess.Popen | None = None  # the node's first rank's
    settled: bool = False  # every node's program is done: the steps run compiled, or eager where one failed


def runs_aside(threads: int, min_threads: int, allreduce: str, shapes: str, blocks: bool) -> bool:
    """Whether a cold compile runs beside the training: a rank of `min_threads` or more (0: never; the core it
    takes is 1/threads of the rank's eager rate while it runs), repeated blocks to compile in dynamic shapes (the rows
    it compiles on are not padded to buckets), and no DDP around the model (DDP makes dynamo split each graph
    at its buckets, graphs the program aside would not make). Pure."""
    return 0 < min_threads <= threads and blocks and shapes == "dynamic" and allreduce in ("after-backward", "none")


def aside_inputs(train: dict, pad_id: int, regression: bool, batch_size: int) -> list[dict]:
    """A few batches of the job's own rows for the compile aside: its middling, shortest and longest rows (the
    widths training meets), and the middling ones unpadded (a batch without padding may take another path
    through the model's attention). ASIDE_ROWS a batch, or the job's batch where it is smaller: dynamo makes a
    graph of its own for a batch of one row."""
    import torch

    from .ddp import collate
    order = sorted(range(len(train["lengths"])), key=train["lengths"].__getitem__)
    rows = min(ASIDE_ROWS, batch_size, len(order))
    middle = max(0, min(len(order) // 2, len(order) - rows))
    batches = []
    for indices in (order[middle:middle + rows], order[:rows], order[-rows:]):
        labels = torch.tensor([train["labels"][j] for j in indices], dtype=torch.float32 if regression else torch.long)
        batches.append({**collate(train, indices, pad_id, 0), "labels": labels})
    return batches + [dict(batches[0], attention_mask=torch.ones_like(batches[0]["attention_mask"]))]


def start_aside(folder: Path, model, inputs: list[dict], spec: dict) -> subprocess.Popen:
    """The compile aside, started on the rank's last core (`spec`: threads, precision, shapes, widths, cache_dir,
    core): this module as a program, its output in the folder's log."""
    import torch
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ASIDE_OUTCOME).unlink(missing_ok=True)
    model.config.save_pretrained(folder)
    torch.save(inputs, folder / ASIDE_INPUTS)
    write_whole(folder / ASIDE_SPEC, spec | {"rank_pid": os.getpid()})
    env = dict(os.environ, OMP_NUM_THREADS=str(spec["threads"]), TORCHINDUCTOR_CACHE_DIR=str(spec["cache_dir"]))
    with open(folder / ASIDE_LOG, "w") as log:  # a session of its own: stopped with the compilers it started
        return subprocess.Popen([sys.executable, "-m", "runner.node.compiling", str(folder)], env=env,
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def aside_outcome(aside: Aside) -> dict | None:
    """What the compile aside reported, None while it runs. The node's first rank speaks for a program that
    ended without a word, so the node's other ranks read it too."""
    outcome = read_json(aside.folder / ASIDE_OUTCOME)
    if not outcome and aside.process is not None and (code := aside.process.poll()) is not None:
        # read again: it may have written its outcome between the first read and its exit
        outcome = read_json(aside.folder / ASIDE_OUTCOME) or {"ok": False, "error": f"it exited with {code}, "
                                                                                    f"see {aside.folder / ASIDE_LOG}"}
        write_whole(aside.folder / ASIDE_OUTCOME, outcome)
    return outcome or None


def aside_stopped(aside: Aside) -> bool:
    """At the job's end: the compile aside stopped where it still runs, with the compilers it started. Whether it
    had finished well."""
    if aside.process is not None:
        if aside.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(aside.process.pid, signal.SIGTERM)
        reaped(aside.process)
    return bool(read_json(aside.folder / ASIDE_OUTCOME).get("ok"))


def reaped(process: subprocess.Popen) -> None:
    """The program aside waited for, as it ends; killed with its session where it does not (a hang on its way
    out would hold the rank, and every other rank at its next collective)."""
    try:
        process.wait(timeout=ASIDE_EXIT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


# ---- a cold compile aside: the program ----------------------------------------------------------------------

def main(folder: Path) -> int:
    spec, started = read_json(folder / ASIDE_SPEC), time.perf_counter()
    # before torch starts OpenMP, which binds its threads within the affinity it finds (OMP_PROC_BIND)
    os.sched_setaffinity(0, {spec["core"]})
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: end with the rank that started it
    if os.getppid() != spec["rank_pid"]:  # the rank ended before the signal was asked for
        return 1
    with contextlib.suppress(OSError):
        Path("/proc/self/oom_score_adj").write_text(OOM_SCORE_FIRST)
    try:
        import torch
        from transformers import AutoConfig, AutoModelForSequenceClassification

        torch.set_num_threads(spec["threads"])  # inductor writes the rank's thread count into its kernels
        model = AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(folder), dtype=torch.float32)
        model.train()
        compile_in_place(model, repeated_blocks(model), spec["shapes"], Path(spec["cache_dir"]), spec["widths"])
        for batch in torch.load(folder / ASIDE_INPUTS):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=spec["precision"] == "bf16"):
                loss = model(**batch).loss
            loss.backward()
            model.zero_grad(set_to_none=True)
        outcome = {"ok": True, "seconds": round(time.perf_counter() - started, 1)}
    except Exception as exc:  # noqa: BLE001 - whatever failed, the rank compiles in its own process instead
        outcome = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    write_whole(folder / ASIDE_OUTCOME, outcome)
    (folder / ASIDE_INPUTS).unlink(missing_ok=True)
    return 0 if outcome["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
