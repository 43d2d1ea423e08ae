"""A rank's start: its threads, the process group (gloo's threads placed on the rank's cores), the
precision this CPU trains in, and the rank's log. Imported once the rank is pinned (runner/node/train.py).
"""

import contextlib
import logging
import os
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from .distenv import check_world_size, threads_started_on
from .facts import cpu_info, native_bf16
from .protocol import LOG_CLOCK, LOG_MARK_ENV, log_format
from .recipes import allreduce_mode, wire_compress


@dataclass
class Setup:
    """What this process decided at start: threads, transport, precision."""
    threads: int  # compute threads
    backend: str  # gloo | ccl | none (one rank)
    native_bf16: bool
    precision: str  # bf16 (autocast, fp32 master weights) | fp32
    grad_compress: str  # what the gradient all-reduce sends: bf16 | none (fp32) | powersgd (low-rank factors)
    allreduce: str  # after-backward | overlap | comm-core (allreduce_mode) | none (one rank)
    gloo_threads: str  # where gloo's threads run: rank-cores | inherit | kept-core | none (one rank)
    gloo_thread_cores: list[int]  # the cores gloo's threads may run on, read back from them
    exchange: "dist.ProcessGroup | None" = None  # overlapped: DDP's group, a thread per flow (exchange_group)
    cores: list[int] = field(default_factory=list)  # the cores this rank is pinned to


def start(args, env, log, cores: list[int]) -> Setup:
    """Threads, the process group (several ranks), and the precision this CPU should train in, for a
    rank on `cores`."""
    allreduce = allreduce_mode(args.allreduce) if env.world_size > 1 else "none"
    if allreduce == "comm-core" and len(cores) < 2:
        raise SystemExit(f"--allreduce comm-core keeps one of a rank's cores for gloo's threads: this rank has "
                         f"one core ({cores[0]}); give each rank 2 cores or more, or --allreduce overlap")
    # comm-core: compute on all but the rank's last core (OMP_PROC_BIND=close binds n-1 threads to the
    # first n-1 places), gloo's threads on the last, so the exchange runs beside backward, not inside it
    kept = 1 if allreduce == "comm-core" else 0
    threads = max(1, int(os.environ.get("OMP_NUM_THREADS") or len(cores)) - kept)
    torch.set_num_threads(threads)
    backend = args.backend
    if backend in ("auto", "ccl"):
        try:
            import oneccl_bindings_for_pytorch  # noqa: F401  (registers the "ccl" backend)
            backend = "ccl"
        except ImportError as exc:
            if args.backend == "ccl":
                raise SystemExit("--backend ccl asked for, but oneccl_bindings_for_pytorch does not import; "
                                 "use the intel stack or --backend gloo") from exc
            backend = "gloo"
    gloo_threads, gloo_cores, exchange = "none", [], None
    if env.world_size > 1:
        # gloo's threads on all of this rank's cores, on the one core the main thread is bound to
        # (--gloo-threads inherit), or on the core kept from compute (comm-core)
        gloo_threads = "kept-core" if kept else args.gloo_threads
        wanted = {"kept-core": cores[-1:], "rank-cores": cores}.get(gloo_threads) or sorted(os.sched_getaffinity(0))
        with threads_started_on(wanted), threads_born() as born:
            dist.init_process_group(backend, init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                                    rank=env.rank, world_size=env.world_size, timeout=timedelta(minutes=10))
            if allreduce in ("overlap", "comm-core") and backend == "gloo":
                exchange = exchange_group(env)
        gloo_cores = sorted(set().union(*born.values())) if born else wanted
        check_world_size(dist.get_world_size(), env.world_size, "the process group")
    check_world_size(env.world_size, env.expected_world_size, "the launcher")

    native = native_bf16(cpu_info()[1])
    precision = args.precision if args.precision != "auto" else ("bf16" if native else "fp32")
    if precision == "bf16" and not native:
        log.warning("bf16 asked for on a CPU without native bf16 (no amx_bf16/avx512_bf16): it is emulated and slower")
    grad_compress = wire_compress(args.grad_compress, precision == "bf16", env.world_size)
    setup = Setup(threads, backend if env.world_size > 1 else "none", native, precision, grad_compress,
                  allreduce, gloo_threads, gloo_cores, exchange, list(cores))
    log.info(f"rank {env.rank}/{env.world_size} (local {env.local_rank}/{env.local_world_size}) cores {cores} "
             f"threads {threads} backend {setup.backend} precision {precision} grad_compress {grad_compress} "
             f"allreduce {allreduce} gloo threads on {gloo_cores} recipe {args.recipe} seed {args.seed}")
    return setup


@contextlib.contextmanager
def threads_born():
    """The threads this process starts inside, each with the cores it may run on (gloo's, read back)."""
    before = set(os.listdir("/proc/self/task"))
    born: dict[int, set[int]] = {}
    yield born
    for tid in sorted(set(os.listdir("/proc/self/task")) - before):
        try:
            born[int(tid)] = os.sched_getaffinity(int(tid))
        except OSError:  # ended meanwhile
            pass


def exchange_group(env) -> "dist.ProcessGroup":
    """DDP's process group for an overlapped exchange: gloo with one device per GLOO_SOCKET_IFNAME entry
    (each a TCP flow to every peer) and a worker thread per device, so that as many buckets are in flight
    as there are flows; the default group keeps torch's two threads, which would leave flows idle."""
    devices = [name for name in os.environ.get("GLOO_SOCKET_IFNAME", "").split(",") if name]
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timedelta(minutes=10)
    options._devices = ([dist.ProcessGroupGloo.create_device(interface=name) for name in devices]
                        or [dist.ProcessGroupGloo.create_default_device()])
    options._threads = max(2, len(options._devices))
    store = dist.PrefixStore("ftc-exchange/", dist.distributed_c10d._get_default_store())
    backend = dist.ProcessGroupGloo(store, env.rank, env.world_size, options)
    group = dist.ProcessGroup(store, env.rank, env.world_size)
    group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)
    return group


def setup_logging(path: Path, master: bool) -> logging.Logger:
    log = logging.getLogger("ftc")
    log.setLevel(logging.INFO)
    # every line carries the job's mark (protocol.line_mark): the controller reads only such lines
    formatter = logging.Formatter(log_format(os.environ.get(LOG_MARK_ENV, "")), LOG_CLOCK)
    handler = logging.FileHandler(path)
    handler.setFormatter(formatter)
    log.addHandler(handler)
    if master:
        console = logging.StreamHandler(sys.stdout)
        console.setFormatter(formatter)
        log.addHandler(console)
    return log
