"""Ranks per node on one node: ftc's training program uncompiled at 1, 2 and 4 ranks, each at the
recipe's global batch (32 rows split among them) and at 32 rows a rank (a larger global batch, another
recipe), the layouts alternating in each round; two whole passes a run, a run's rate the later pass's.
Run by hand on a whole node (the bench's distilbert, random weights); rates compare within one call.

    python tests/batch_split_compare.py --out OUT --cores 16 --repeats 2 --rows 512 --data-dir GLUE --tokenizer DIR
"""

import argparse
import json
import sys
from dataclasses import replace
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from runner.bench.common import Bench, add_out, add_workload, check_workload, started  # noqa: E402
from runner.bench.long_jobs import later_rate, long_job_run  # noqa: E402
from runner.node.facts import cpu_info  # noqa: E402

# (ranks, rows a rank): the recipe's global batch of 32 split, then 32 rows a rank
LAYOUTS = ((1, 32), (2, 16), (4, 8), (2, 32), (4, 32))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_out(p, "batch_split.json")
    add_workload(p, rows="default 512", repeats="rounds, default 2")
    p.add_argument("--cores", type=int, default=16)
    args = p.parse_args()
    check_workload(args)
    out, mpi = started(args.out)
    bench = Bench.of(args, out, mpi, rows=(128, 512), repeats=(2, 2))
    rates: dict[str, list[float]] = {}
    for round_ in range(bench.repeats):
        for ranks, batch in (layout for layout in LAYOUTS if args.cores // layout[0] >= 1):
            at = replace(bench, cores_per_rank=args.cores // ranks)
            results = at.ftc(f"r{ranks}-b{batch}-{round_}", ranks, extra=["--compile", "off", "--batch-size", str(batch)],
                             passes=2)
            label = f"{ranks} x {args.cores // ranks} cores, {batch} rows a rank (global {ranks * batch})"
            rates.setdefault(label, []).append(round(later_rate(long_job_run(results, "none")), 1))
    report = {"date": date.today().isoformat(), "cpu": cpu_info()[0], "cores": args.cores, "model": bench.model.name,
              "rows_per_pass": bench.rows, "command": " ".join(sys.argv), "later_pass_rows_per_s": rates}
    (out / "batch_split.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
