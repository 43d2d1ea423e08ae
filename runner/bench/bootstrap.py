"""`ftc bench bootstrap`: the bootstrap of 1 and of 8 local nodes, side by side, on fresh clusters in
a private FTC_HOME; into OUT/bootstrap.json."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ..node import facts as node_facts
from .common import REPO, add_out, check_numbers, progress, today

NAME = "bootstrap"
HELP = "bootstrap time of 1 and 8 local nodes (the steps that wait, verification apart)"
RESULT_NAME = "bootstrap.json"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_out(p, RESULT_NAME)
    p.add_argument("--repeats", default=None, help="fresh clusters of each size, sizes alternating (default 3)")


def checked(args: argparse.Namespace) -> None:
    check_numbers(args)


def run(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    return measure(out, args.command_line, repeats=args.repeats or 3)


def measure(out: Path, command_line: str, sizes: tuple[int, ...] = (1, 8), repeats: int = 3) -> int:
    """Bootstrap of 1 and of 8 local nodes, side by side: the parallel steps (connect, install
    check, keys and files, facts) and, apart, the verification (Python start-ups that compete
    for cores on a small machine); then a second bootstrap (markers: nothing redone). Each
    size `repeats` times on fresh clusters, alternating sizes; the medians are reported, since
    one node's bootstrap takes a fraction of a second and one sample of it is noisy."""
    ftc = [sys.executable, "-m", "runner.cli"]
    samples: dict[int, list[dict]] = {n: [] for n in sizes}
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "FTC_HOME": home, "PYTHONPATH": str(REPO)}
        for repeat in range(repeats):
            for n in sizes:
                name = f"bench{n}-{repeat}"
                progress(f"  round {repeat + 1} of {repeats}: {n} local node(s)")
                subprocess.run([*ftc, "up", "--name", name, "--nodes", str(n), "--no-bootstrap"], env=env,
                               check=True, capture_output=True)
                try:
                    subprocess.run([*ftc, "bootstrap", "--name", name], env=env, check=True, capture_output=True)
                    first = json.loads((Path(home) / "clusters" / name / "bootstrap.json").read_text())
                    subprocess.run([*ftc, "bootstrap", "--name", name], env=env, check=True, capture_output=True)
                    again = json.loads((Path(home) / "clusters" / name / "bootstrap.json").read_text())
                finally:
                    subprocess.run([*ftc, "down", "--name", name], env=env, capture_output=True)
                samples[n].append({"parallel_steps_s": first["parallel_steps_s"], "verify_s": first["verify_s"],
                                   "second_run_s": round(again["parallel_steps_s"] + again["verify_s"], 3),
                                   "parallel_steps_machine_cpu_s": first["parallel_steps_machine_cpu_s"]})
    rows = [{"nodes": n, **{key: statistics.median(s[key] for s in samples[n]) for key in samples[n][0]},
             "samples": samples[n]} for n in sizes]
    cores = len(os.sched_getaffinity(0))
    # The CPU each extra node costs (ssh handshakes at both ends, the facts program's Python),
    # spread over this machine's cores: below this, no amount of overlapping waits helps.
    per_node = (rows[-1]["parallel_steps_machine_cpu_s"] - rows[0]["parallel_steps_machine_cpu_s"]) \
        / (rows[-1]["nodes"] - rows[0]["nodes"])
    report = {"date": today(), "cpu": node_facts.cpu_info()[0], "command": command_line,
              "cores": cores, "rows": rows,
              "ratio_parallel_steps": round(rows[-1]["parallel_steps_s"] / rows[0]["parallel_steps_s"], 2),
              "ratio_second_run": round(rows[-1]["second_run_s"] / rows[0]["second_run_s"], 2),
              "cpu_s_per_extra_node": round(per_node, 3),
              "cpu_floor_parallel_steps_s": round(rows[-1]["nodes"] * per_node / cores, 3)}
    (out / RESULT_NAME).write_text(json.dumps(report, indent=2, allow_nan=False))
    print(json.dumps(report, indent=2, allow_nan=False))
    return 0

