"""The training recipes: ftc's settings and the 2021 seed recipe's, by name. The training program
starts from one, then applies explicit flags; the controller reads them to tell what a job left to
its recipe (a resumed job must be the same job). No torch here: the controller imports it.
"""

RECIPES = {
    "ftc": dict(precision="auto", pad_to="longest", group_by_length=True, batch_size=32, lr=2e-5, epochs=3,
                grad_compress="auto", embedding_sync="rows", compile="auto", allreduce="auto",
                balance="even", gloo_threads="rank-cores", seed=42),
    "seed": dict(precision="fp32", pad_to="max_length", group_by_length=False, batch_size=32, lr=2e-5, epochs=3,
                 grad_compress="none", embedding_sync="dense", compile="off", allreduce="overlap", balance="even",
                 gloo_threads="inherit", seed=42),
}

# --compile auto compiles from this many planned steps on. Measured on 4 AMX cores:
# 116 s to compile distilbert's training step and steps 21% faster (~17% shorter) after it: that
# pays back after ~800 steps of ~0.9 s; twice that leaves a clear gain (MRPC's 3 epochs at
# 1 rank: 345 steps, no; QQP: thousands, yes).
COMPILE_MIN_STEPS = 1600
# ... and only ranks of this many threads or more: compiled steps ran no faster than eager at 1 and 2 threads
# a rank (0.96x-1.01x on 2 cores; 0.91x at 16 ranks x 1 thread on 16 AMX cores), faster at 4 (1.06x-1.21x)
# and 16 (1.7x-1.8x). A node that measured both rates for a job's launch decides by them instead.
COMPILE_MIN_THREADS = 4
# A cold compile runs beside the training (runner/node/compiling.py) on ranks of this many threads or more: the
# core it takes from the rank while it runs costs 1/threads of the rank's eager rate.
COMPILE_ASIDE_MIN_THREADS = 8
# ... and then --compile auto compiles a cold cache from this many planned steps on: the compile aside costs the
# rank a core for its time, not its steps. Measured on 16 AMX cores, MRPC's 3 epochs at 1 rank (345 steps): the
# program aside took 115 s, the steps ran compiled from step 204 and the job took 167 s, against its eager
# passes' 62-67 s each (docs/bench-log.md); below about 1.2x the steps the compile aside takes, it cannot pay back.
COMPILE_ASIDE_MIN_STEPS = 300


# What a compiled step's shapes may be (--shapes).
SHAPES = ("auto", "dynamic", "buckets")
# --shapes auto: what a compiled step runs with. Side by side (docs/performance.md: Length buckets), the
# one dynamic graph compiled in 0.72x the buckets' time and its steps ran 1.30x as fast: every bucket is
# a whole compile of its own, and padding to a multiple of 32 computes more than padding to 8.
AUTO_SHAPES = "dynamic"


def unmeasured_compile(steps: int, threads: int, min_steps: int = COMPILE_MIN_STEPS,
                       cache: str = "cold", aside: bool = False) -> tuple[bool, str]:
    """--compile auto where nothing was measured, and why in words: a job of `min_steps` planned steps or
    more (with a `cache` kernel cache, compiled `aside` the training or not) whose ranks have
    COMPILE_MIN_THREADS threads or more. Pure."""
    if threads < COMPILE_MIN_THREADS:
        return False, (f"off (a rank of {threads} thread{'s' if threads > 1 else ''}: compiled steps ran no faster "
                       f"than eager below {COMPILE_MIN_THREADS} threads a rank)")
    where = f"a {cache} kernel cache" + (", compiled beside the training" if aside else "")
    if steps >= min_steps:
        return True, f"on (planned {steps} steps >= {min_steps} with {where}: the compile pays back)"
    return False, f"off (planned {steps} steps < {min_steps} with {where}: the compile would not pay back)"


# When and where a job's gradient is averaged (ALLREDUCE): after backward in ftc's buckets, the cores idle
# (after-backward); during backward in DDP's buckets, gloo's threads on the compute cores (overlap); or during
# backward with gloo's threads on a core kept from compute (comm-core). auto: the controller's choice where
# it knows the nodes' network (a cloud's instance type: runner/plan.exchange_for), else after-backward.
ALLREDUCE = ("auto", "after-backward", "overlap", "comm-core")


def allreduce_mode(asked: str) -> str:
    """The all-reduce a rank runs: as asked; auto, which reaches a rank only where the controller could not
    weigh the network, is after-backward, which never costs more than the exchange itself. Pure."""
    return "after-backward" if asked == "auto" else asked


# What a job's gradient all-reduce may send (GRAD_COMPRESS): auto (wire_compress decides), none (fp32),
# bf16, or powersgd (low-rank factors with error feedback: an approximate average, never a default).
GRAD_COMPRESS = ("auto", "none", "bf16", "powersgd")
POWERSGD_RANK = 4  # the factors' rank: 1.40x the default at 4 nodes; 8 and 16 were as far below exact (docs/performance.md)


def wire_compress(grad_compress: str, bf16_training: bool, world_size: int) -> str:
    """What crosses the network: `auto` is the gradient in bf16 where training is in bf16 and some peer
    receives it, fp32 (none) otherwise; any other choice as asked. Pure: the training program and
    `ftc plan` both decide by it."""
    if grad_compress != "auto":
        return grad_compress
    return "bf16" if bf16_training and world_size > 1 else "none"


# Your own data of a few hundred rows: the ftc recipe's lr 2e-5 over its few global batches of 64
# barely moves the weights (160 clearly separable rows: 0.60 dev accuracy, lr 2e-4 without dropout: 1.00).
# Such a file gets more, smaller steps at 10x the rate, without dropout, wherever the user left them unset.
SMALL_DATA_ROWS = 1000  # a training file under this many rows is small
SMALL_DATA = dict(lr=2e-4, epochs=3, batch_size=8, dropout=0.0)


def small_data(rows: int, given: set[str]) -> dict:
    """The settings a training file of `rows` rows gets in place of the ftc recipe's: SMALL_DATA less
    the settings in `given` (set by the user); {} when the file is not small. Pure."""
    if rows >= SMALL_DATA_ROWS:
        return {}
    return {key: value for key, value in SMALL_DATA.items() if key not in given}


def small_data_line(chosen: dict, rows: int, options: dict[str, str]) -> str:
    """The one line that says the small-data settings ran, and why; `options` names each setting as the
    user would set it (`--lr` or `LR`). Pure."""
    words = {"lr": f"lr {chosen.get('lr', 0):.0e}".replace("e-0", "e-"), "epochs": f"{chosen.get('epochs')} epochs",
             "batch_size": f"batch size {chosen.get('batch_size')} per rank", "dropout": "no dropout"}
    settings = ", ".join(words[key] for key in SMALL_DATA if key in chosen)
    named = [options[key] for key in SMALL_DATA if key in chosen]
    override = " or ".join([", ".join(named[:-1]), named[-1]] if len(named) > 1 else named)
    return (f"recipe: small-data ({settings}) because the job trains on {rows} rows (under {SMALL_DATA_ROWS}); "
            f"set {override} to override")


def batch_line(recipe: str, batch_size: int, lr_given: bool, options: dict[str, str], lr: float = 0.0) -> str:
    """The line that says a per-rank batch other than the recipe's changes the recipe, when the user
    left lr to the recipe (`lr`: the one the job will use, 0 for the recipe's own): the global batch
    grows (or shrinks) by the ratio and lr does not follow it silently; '' otherwise. `options` names
    batch_size and lr as the user sets them. Pure."""
    base, lr = RECIPES[recipe]["batch_size"], lr or RECIPES[recipe]["lr"]
    if lr_given or batch_size == base:
        return ""
    ratio = batch_size / base
    return (f"recipe: {options['batch_size']}={batch_size} is {ratio:g}x the {recipe} recipe's {base} rows per rank, "
            f"so the global batch is {ratio:g}x too, at lr {lr:g}; to scale lr with it, "
            f"set {options['lr']}={lr * ratio:g}")
