"""The probe behind docs/probes/auto_from_home.json: what `--compile auto` decides, and how long it takes, for
MRPC's 3 epochs on a new cluster's node that holds only the kernels an earlier cluster brought home. Run from
the repository root after `ftc bench long-jobs 1x16 --launches compiled,...` into the same OUT (its compiled
run left the kernels and their note; the lent host had no network: libraries and data came in .carry/):

    PYTHONPATH=$PWD python docs/probes/auto_from_home.py --out OUT --data-dir .carry/glue --tokenizer .carry/tok

ftc's training program runs the whole job through the bench's own Bench.ftc (its launch, cores and random
DistilBERT), on a fresh node from home (long_jobs.fresh_node_from_home), `--compile auto`. The peer's time for
the same rows comes from its launch at ftc's ranks and rows a step in OUT/bench.json's long_jobs (the same
call): its start and rows at its later-pass rate, as the long-jobs bench works out every job's time."""
import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path

from provision.estimate import GLUE_TRAIN_SIZES
from runner.bench.common import Bench, started
from runner.bench.long_jobs import fresh_node_from_home, long_job_launches

p = argparse.ArgumentParser()
p.add_argument("--out")
p.add_argument("--data-dir")
p.add_argument("--tokenizer")
p.add_argument("--rows", type=int, default=GLUE_TRAIN_SIZES["mrpc"], help="MRPC rows an epoch (default all)")
p.add_argument("--quick", action="store_true", help="the bench's quick model (as its long-jobs run had)")
a = p.parse_args()
a.tokenizer, a.data_dir = Path(a.tokenizer).resolve(), Path(a.data_dir).resolve()
a.repeats, rows, a.rows = 1, a.rows, 0
out, mpi = started(a.out)
os.environ["FTC_NODE_DIR"] = str(out / "node")
os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
bench = Bench.of(a, out, mpi, rows=(128, 2048), repeats=(1, 1))
bench = replace(bench, cores_per_rank=len(bench.physical))  # ftc's launch: one rank on the node's cores
epochs = 3
started_at = time.perf_counter()
with fresh_node_from_home(bench, 99):
    results = bench.ftc("mrpc-auto-from-home", 1, extra=["--compile", "auto"], rows=rows, passes=epochs)
wall_s = time.perf_counter() - started_at
long_jobs = json.loads((out / "bench.json").read_text())["long_jobs"]
(shape,) = long_jobs["shapes"]
eager, peer = (launch.label for launch in long_job_launches(1, len(bench.physical), ("eager", "peer-at-ftc-launch")))


def job_s(label: str) -> float:
    launch = shape["launches"][label]
    return round(next(iter(launch["start_cost_s"].values())) + epochs * rows / launch["later_rows_per_s"], 1)


training_s = round(sum(e["pass_seconds"] for e in results["epoch_metrics"]), 1)
report = {"cpu": long_jobs["cpu"], "job": f"mrpc, {epochs} epochs, {epochs * rows} rows, 32 a step",
          "ftc": {"launch": f"{eager}, --compile auto, a fresh node holding the kernels from home",
                  "compile": results["compile"], "compile_cache": results["compile_cache"],
                  "compile_cache_from": results.get("compile_cache_from"), "training_s": training_s,
                  "wall_s": round(wall_s, 1), "pass_seconds": [e["pass_seconds"] for e in results["epoch_metrics"]]},
          "peer": {"launch": peer, "job_s": job_s(peer)}, "ftc_eager": {"launch": eager, "job_s": job_s(eager)}}
report["speedup_vs_peer"] = round(report["peer"]["job_s"] / training_s, 3)
report["speedup_vs_ftc_eager"] = round(report["ftc_eager"]["job_s"] / training_s, 3)
(out / "auto_from_home.json").write_text(json.dumps(report, indent=1) + "\n")
print(json.dumps(report, indent=1))
