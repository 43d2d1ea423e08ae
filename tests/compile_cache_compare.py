"""What a node's kept kernel cache saves: the same compiled training job twice on the same cores,
the first with an empty cache (cold), the second reading what the first wrote (warm), then the
same job uncompiled (what the compile buys a step). Run by hand; the trainer's own compile_seconds,
from results.json, and where each compile's seconds went (dynamo's own timers, PHASES). Each
machine and torch version is one entry of docs/compile_cache.json's runs.

    python tests/compile_cache_compare.py --data-dir GLUE --tokenizer DIR --cores 0-3 --out docs/compile_cache.json
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from runner.bench.common import make_distilbert  # noqa: E402
from runner.node.facts import cpu_info  # noqa: E402

# Dynamo's timers that say where a compile's seconds go: tracing the model's bytecode, tracing the
# joint forward-backward graph (not run when AOT autograd's cache hits), generating and compiling C++,
# and loading the compiled graph's module with its kernels (on a cache hit, most of a warm start).
PHASES = ("bytecode_tracing", "aot_trace_joint_graph", "GraphLowering.codegen", "compile_file",
          "AOTAutogradCache.inductor_load", "PyCodeCache.load_by_key_path")
# The training program, which at its end leaves the seconds of each of dynamo's timers in OUT/phases.json.
# With COMPARE_PROFILE=PATH it runs under cProfile and writes there the 40 functions of most cumulative time,
# then of most own time: what a warm start spends outside dynamo's timers.
TIMED_TRAIN = """
import atexit, cProfile, io, json, os, pstats, sys
profile = cProfile.Profile() if os.environ.get("COMPARE_PROFILE") else None
def leave_phases():
    from torch._dynamo.utils import compile_times, counters
    names, seconds = compile_times(repr="csv", aggregate=True)
    with open(sys.argv[sys.argv.index("--output-dir") + 1] + "/phases.json", "w") as f:
        json.dump({"seconds": dict(zip(names, map(float, seconds))), "aot_autograd": dict(counters["aot_autograd"])}, f)
    if profile:
        profile.disable()
        text = io.StringIO()
        for order in ("cumulative", "tottime"):
            pstats.Stats(profile, stream=text).sort_stats(order).print_stats(40)
        open(os.environ["COMPARE_PROFILE"], "w").write(text.getvalue())
atexit.register(leave_phases)
from runner.node.train import main
if profile:
    profile.enable()
sys.exit(main(sys.argv[1:]))
"""


def one_job(work: Path, node_dir: Path, name: str, args, compile_mode: str = "on", profile: Path | None = None) -> dict:
    """One job of `args.steps` steps, compiled or not; its results.json, with `phases`: PHASES' seconds,
    every other timer of a second or more (`other`), and AOT autograd's cache counters."""
    out = work / name
    env = {**os.environ, "FTC_NODE_DIR": str(node_dir), "OMP_NUM_THREADS": str(len(args.cpus))}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    if profile:
        env["COMPARE_PROFILE"] = str(profile)
    subprocess.run(["taskset", "-c", args.cores, sys.executable, "-c", TIMED_TRAIN, "--task", "mrpc",
                    "--data-dir", args.data_dir, "--model", str(args.model), "--random-init", "--compile", compile_mode,
                    "--max-steps", str(args.steps), "--no-eval", "--no-save", "--output-dir", str(out)],
                   env=env, check=True, cwd=Path(__file__).resolve().parent.parent)
    phases = json.loads((out / "phases.json").read_text())
    return {**json.loads((out / "results.json").read_text()),
            "phases": {"seconds": {name: round(phases["seconds"].get(name, 0.0), 1) for name in PHASES},
                       "other": {name: round(s, 1) for name, s in phases["seconds"].items()
                                 if name not in PHASES and s >= 1.0},
                       "aot_autograd": phases["aot_autograd"]}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", required=True)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--cores", default="0-3")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--out", default="docs/compile_cache.json")
    p.add_argument("--profile-warm", type=Path, help="also run the warm job again under cProfile; its top functions go here")
    args = p.parse_args()
    first, _, last = args.cores.partition("-")
    args.cpus = list(range(int(first), int(last or first) + 1))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        args.model = make_distilbert(work / "model", Path(args.tokenizer), args.layers)
        cold = one_job(work, work / "node", "cold", args)
        warm = one_job(work, work / "node", "warm", args)
        eager = one_job(work, work / "node", "eager", args, "off")
        if args.profile_warm:
            one_job(work, work / "node", "warm-profiled", args, profile=args.profile_warm.resolve())
    assert (cold["compile_cache"], warm["compile_cache"]) == ("cold", "warm"), (cold["compile_cache"], warm["compile_cache"])
    compiled_rate = (cold["steady_samples_per_second"] + warm["steady_samples_per_second"]) / 2
    report = {"date": date.today().isoformat(), "cpu": cpu_info()[0], "cores": len(args.cpus),
              "torch": cold["versions"]["torch"], "model": f"distilbert, {args.layers} layers", "steps": args.steps,
              "precision": cold["precision"], "cold_compile_s": cold["compile_seconds"],
              "warm_compile_s": warm["compile_seconds"],
              "warm_share": round(warm["compile_seconds"] / cold["compile_seconds"], 3),
              "steady_samples_per_s": [cold["steady_samples_per_second"], warm["steady_samples_per_second"]],
              "eager_samples_per_s": eager["steady_samples_per_second"],
              "compiled_speedup": round(compiled_rate / eager["steady_samples_per_second"], 3),
              "cold_phases": cold["phases"], "warm_phases": warm["phases"],
              "step_timeline": {"compiled": warm["timeline"][0], "eager": eager["timeline"][0]}}
    out = Path(args.out)
    kept = json.loads(out.read_text()).get("runs", []) if out.exists() else []
    same = (report["cpu"], report["cores"], report["torch"])
    runs = [run for run in kept if (run.get("cpu"), run.get("cores"), run.get("torch")) != same] + [report]
    out.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
