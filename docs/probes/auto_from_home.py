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
import contextlib
import json
import os
import time
from dataclasses import replace
from pathlib import Path

from provision.estimate import GLUE_TRAIN_SIZES
from runner.bench.common import Bench, started
from runner.bench.long_jobs import fresh_node_from_home, job_seconds, long_job_launches
from runner.node.facts import cpu_info

p = argparse.ArgumentParser()
p.add_argument("--out")
p.add_argument("--data-dir")
p.add_argument("--tokenizer")
p.add_argument("--rows", type=int, default=GLUE_TRAIN_SIZES["mrpc"], help="MRPC rows an epoch (default all)")
p.add_argument("--quick", action="store_true", help="the bench's quick model (as its long-jobs run had)")
p.add_argument("--peer-whole", action="store_true", help="also run the peer's program over the same job whole")
p.add_argument("--compile", default="auto", choices=("auto", "on"), help="the job's --compile (on: what auto would "
               "give were its threshold lower)")
p.add_argument("--first-job", action="store_true", help="an empty node instead (no kernels, no note): a new user's "
               "first job, no long-jobs run needed before")
a = p.parse_args()
a.tokenizer, a.data_dir = Path(a.tokenizer).resolve(), Path(a.data_dir).resolve()
a.repeats, rows, a.rows = 1, a.rows, 0
out, mpi = started(a.out)
os.environ["FTC_NODE_DIR"] = str(out / ("node-first-job" if a.first_job else "node"))  # a first job's: empty
os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
bench = Bench.of(a, out, mpi, rows=(128, 2048), repeats=(1, 1))
bench = replace(bench, cores_per_rank=len(bench.physical))  # ftc's launch: one rank on the node's cores
epochs = 3
# where the job runs: on the bench's empty node (a new user's first job), or on a fresh one from home
if a.first_job:
    run_name, report_name, node, where = (f"mrpc-{a.compile}-first-job", f"{a.compile}_first_job.json",
                                          contextlib.nullcontext(), "an empty node (a first job)")
else:
    run_name, report_name, node, where = (f"mrpc-{a.compile}-from-home", f"{a.compile}_from_home.json",
                                          fresh_node_from_home(bench, 99),
                                          "a fresh node holding the kernels from home")
started_at = time.perf_counter()
with node:
    results = bench.ftc(run_name, 1, extra=["--compile", a.compile], rows=rows, passes=epochs)
wall_s = time.perf_counter() - started_at
training_s = round(sum(e["pass_seconds"] for e in results["epoch_metrics"]), 1)
eager, peer = (launch.label for launch in long_job_launches(1, len(bench.physical), ("eager", "peer-at-ftc-launch")))
report = {"cpu": cpu_info()[0], "job": f"mrpc, {epochs} epochs, {epochs * rows} rows, 32 a step",
          "ftc": {"launch": f"{eager}, --compile {a.compile}, {where}",
                  "compile": results["compile"], "compile_cache": results["compile_cache"],
                  "compile_cache_from": results.get("compile_cache_from"), "training_s": training_s,
                  "wall_s": round(wall_s, 1), "pass_seconds": [e["pass_seconds"] for e in results["epoch_metrics"]]}}
(out / report_name).write_text(json.dumps(report, indent=1) + "\n")  # kept should the peer's run be cut
print(json.dumps(report["ftc"]), flush=True)
if a.peer_whole:  # the same job in the peer's program, run whole on the same cores
    whole = replace(bench, rows=rows).peer("mrpc-peer-whole", 1, True, passes=epochs)
    report["peer_whole"] = {"launch": peer, "training_s": round(sum(e["pass_seconds"] for e in whole["epoch_metrics"]), 1)}
    report["speedup_vs_peer_whole"] = round(report["peer_whole"]["training_s"] / training_s, 3)
parts = json.loads((out / "bench.json").read_text()).get("long_jobs", {}) if (out / "bench.json").exists() else {}
shape = next(iter(parts.get("shapes", [])), {})
for side, label in (("peer", peer), ("ftc_eager", eager)):  # from the long-jobs run's parts, where it ran them
    if label in shape.get("launches", {}):
        launch = shape["launches"][label]
        job_s = round(job_seconds(launch, epochs * rows), 1)
        report[side] = {"launch": label, "job_s": job_s}
        report[f"speedup_vs_{side}"] = round(job_s / training_s, 3)
(out / report_name).write_text(json.dumps(report, indent=1) + "\n")
print(json.dumps(report, indent=1))
