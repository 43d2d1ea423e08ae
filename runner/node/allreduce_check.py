"""Bootstrap's verification: a gloo all_reduce of two tensors across every rank.

Rank r contributes [r+1, r+1] and [0, r+1, 2(r+1)]; rank 0 prints one line (protocol.AllreduceReport)
with what every rank saw, and every rank exits non-zero if a sum is wrong.

`--time-mb M` (the bench): then also the seconds one all_reduce of M MB of bf16 takes,
the gradient of a model in ftc's all-reduce precision, which the planner's network model
is checked against. `--chunks K`: that gradient as K all_reduces in flight at once, as ftc's
gradient buckets go (each on the next of gloo's devices: several flows with several interfaces).
"""

import argparse
import os
import socket
import sys
import time
from datetime import timedelta

from .distenv import check_world_size, leave_process_group, pin_self, read_env, threads_started_on
from .protocol import AllreduceReport, RankSeen, allreduce_line

# As the training program places itself, before torch binds the main thread (see train.py)
CORES = pin_self(read_env()) if os.environ.get("FTC_SELF_PIN") == "1" else sorted(os.sched_getaffinity(0))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--time-mb", type=float, default=0.0)
    parser.add_argument("--chunks", type=int, default=1)
    args = parser.parse_args()
    env = read_env()
    with threads_started_on(CORES):  # gloo's threads as the training program starts them
        dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                                rank=env.rank, world_size=env.world_size, timeout=timedelta(seconds=60))
    check_world_size(dist.get_world_size(), env.expected_world_size, "the process group")
    a = torch.full((2,), float(env.rank + 1))
    b = torch.arange(3, dtype=torch.float32) * (env.rank + 1)
    dist.all_reduce(a)
    dist.all_reduce(b)
    n = env.world_size
    total = n * (n + 1) / 2
    ok = torch.equal(a, torch.full((2,), total)) and torch.equal(b, torch.arange(3) * total)
    seen = [None] * n
    dist.all_gather_object(seen, RankSeen(env.rank, socket.gethostname(), sorted(os.sched_getaffinity(0)), ok))
    report = AllreduceReport(n, a.tolist() + b.tolist(), seen)
    if args.time_mb:
        gradient = torch.ones(int(args.time_mb * 1e6 / 2), dtype=torch.bfloat16)
        chunks = gradient.chunk(args.chunks)
        seconds = []
        for _ in range(7):
            dist.barrier()
            started = time.perf_counter()
            for work in [dist.all_reduce(chunk, async_op=True) for chunk in chunks]:
                work.wait()
            seconds.append(time.perf_counter() - started)
        report.allreduce_seconds = sorted(seconds[2:])[len(seconds[2:]) // 2]  # median after warm-up
    if env.master:
        print(allreduce_line(report))
    leave_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
