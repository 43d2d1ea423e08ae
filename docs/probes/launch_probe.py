"""The probe behind docs/probes/allocators.json, ranks_per_core.json and long_jobs_at_peer_batch.json's
levers_probe: launches run one after another on all of a host's cores through the bench's own
Bench.ftc / Bench.peer, each line appended to OUT/probe.jsonl as it finishes. Run from the repository
root (the lent host had no network; its libraries and data came in an ignored folder, .carry/):

    PYTHONPATH=$PWD python docs/probes/launch_probe.py --out OUT --data-dir .carry/glue --tokenizer .carry/tok \
        --variants peer4x4,eager4x4,peer16x1,eager16x1,base,base@tc

A variant is a VARIANTS name (ftc: ranks, flags, environment), optionally `@PRELOAD` (an ALLOC name:
tcmalloc, jemalloc, Intel OpenMP from .carry/libs; `glibc`, `g2`, `g3` preload nothing and only make a
run's name unique), or `peerNxC[suffix]`: the peer (Hugging Face Trainer under torchrun) unpinned at N
ranks. Compiled variants of one name share a kernel cache: the first compiles cold, later ones warm."""
import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path

from runner.bench.common import Bench, started
from runner.bench.long_jobs import LONG_JOB_PASSES, later_rate, long_job_run, start_cost

p = argparse.ArgumentParser()
p.add_argument("--out")
p.add_argument("--rows", type=int, default=1024)
p.add_argument("--data-dir")
p.add_argument("--tokenizer")
p.add_argument("--variants")
a = p.parse_args()
a.tokenizer, a.data_dir = Path(a.tokenizer).resolve(), Path(a.data_dir).resolve()
a.quick, a.repeats = bool(os.environ.get("PROBE_QUICK")), 1
out, mpi = started(a.out)
os.environ["FTC_NODE_DIR"] = str(out / "node")
os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
bench = Bench.of(a, out, mpi, rows=(128, 2048), repeats=(1, 1))
N = len(bench.physical)
AUTOTUNE = {"TORCHINDUCTOR_MAX_AUTOTUNE": "1", "TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS": "CPP,ATEN"}
LIBS = Path(".carry/libs").resolve()
TC, JE, IOMP = str(LIBS / "libtcmalloc_minimal.so.4"), str(LIBS / "libjemalloc.so.2"), str(LIBS / "libiomp5.so")
ALLOC = {"glibc": "", "g2": "", "g3": "", "tc": TC, "je": JE, "iomp-tc": f"{IOMP}:{TC}", "iomp": IOMP}
VARIANTS = {
    "base": (1, ["--compile", "on"], {}),
    "b128": (1, ["--compile", "on", "--batch-size", "128"], {}),
    "b64": (1, ["--compile", "on", "--batch-size", "64"], {}),
    "r2x8": (2, ["--compile", "on"], {}),
    "r2x8b64": (2, ["--compile", "on", "--batch-size", "64"], {}),
    "eager4x4": (4, ["--compile", "off"], {}),
    "eager1": (1, ["--compile", "off"], {}),
    "eager8x2": (8, ["--compile", "off"], {}),
    "eager16x1": (16, ["--compile", "off"], {}),
    "eager2x8": (2, ["--compile", "off"], {}),
    "autotune": (1, ["--compile", "on"], AUTOTUNE),
    "autotune-buckets": (1, ["--compile", "on", "--shapes", "buckets"], AUTOTUNE),
    "autotune-b128": (1, ["--compile", "on", "--batch-size", "128"], AUTOTUNE),
}
for v in a.variants.split(","):
    if v.startswith("peer"):  # peer4x4 (or peer8x2, peer4x4b): the peer unpinned at that many ranks
        pr = int(v[4:].split("x")[0])
        at = replace(bench, cores_per_rank=N // pr)
        t0 = time.time()
        r = at.peer(f"probe-{v}", pr, False, LONG_JOB_PASSES, [])
        run = long_job_run(r, "none")
    else:
        base, _, alloc = v.partition("@")  # e.g. base@iomp-tc: the variant with that preload, one kernel cache a variant
        ppr, extra, env = VARIANTS[base]
        os.environ["FTC_NODE_DIR"] = str(out / f"node-{base}")
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        at = replace(bench, cores_per_rank=N // ppr, allocator=ALLOC[alloc or "glibc"])
        t0 = time.time()
        try:
            r = at.ftc(f"probe-{v}", ppr, extra=extra, passes=LONG_JOB_PASSES)
            run = long_job_run(r, r.get("compile_cache", "?"))
        except Exception as e:
            run = {"failed": str(e)[-600:]}
        for k, val in saved.items():
            os.environ.pop(k) if val is None else os.environ.__setitem__(k, val)
    line = {"variant": v, "wall_s": round(time.time() - t0, 1), **run}
    if "passes" in run:
        line |= {"later_rows_per_s": round(later_rate(run), 1), "start_s": round(start_cost(run), 1)}
    print(json.dumps(line), flush=True)
    with open(out / "probe.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")
