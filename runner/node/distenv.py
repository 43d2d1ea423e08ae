"""Rank, world size and local rank from whichever launcher started this process.

The one place that reads the launcher's environment (Intel MPI / MPICH, Open MPI,
torchrun). FTC_WORLD_SIZE, set by ftc's launch script, is how many ranks were
launched: a rank whose launcher variables are missing would otherwise believe it
is alone (world size 1) and train by itself without any error.
"""

import contextlib
import os
import random
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

LAUNCHERS = (
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),  # Intel MPI, MPICH
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),  # torchrun
)


@dataclass
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    expected_world_size: int  # what the launch script launched; 0 when run by hand

    @property
    def master(self) -> bool:
        return self.rank == 0


class WorldSizeMismatch(RuntimeError):
    pass


def read_env(env=os.environ) -> DistEnv:
    expected = int(env.get("FTC_WORLD_SIZE", "0"))
    for rank_key, size_key, local_key, local_size_key in LAUNCHERS:
        if rank_key in env and size_key in env:
            dist = DistEnv(int(env[rank_key]), int(env[size_key]), int(env.get(local_key, 0)),
                           int(env.get(local_size_key, 1)), expected)
            break
    else:
        dist = DistEnv(0, 1, 0, 1, expected)
    check_world_size(dist.world_size, expected, "the launcher's environment")
    return dist


def check_world_size(actual: int, expected: int, where: str) -> None:
    if expected and actual != expected:
        raise WorldSizeMismatch(
            f"world size {actual} from {where}, but {expected} ranks were launched: this rank would train "
            "alone. Check that mpirun is the one the stack installed (PMI_RANK/PMI_SIZE or OMPI_COMM_WORLD_*)")


def physical_cpus(allowed: list[int]) -> list[int]:
    """The first hardware thread of each physical core within `allowed` (HT siblings dropped)."""
    from .facts import cpu_topology
    return cpu_topology(allowed)["core_cpus"]


def pin_self(env: DistEnv) -> list[int]:
    """Take this rank's share of the node's cores (launchers that do not pin, e.g. Open MPI with
    --bind-to none): the node's physical cores split into local_world_size contiguous chunks."""
    cores = physical_cpus(sorted(os.sched_getaffinity(0)))
    per_rank = max(1, len(cores) // env.local_world_size)
    share = cores[env.local_rank * per_rank:(env.local_rank + 1) * per_rank] or cores[-per_rank:]
    os.sched_setaffinity(0, share)
    return share


@contextlib.contextmanager
def threads_started_on(cores: list[int]):
    """Threads started inside (gloo's, by init_process_group) may run on any of `cores`.

    With OMP_PROC_BIND set (ftc's launch script sets it), `import torch` binds the main thread to
    one core, and every thread it starts later inherits that one core: gloo's I/O and worker
    threads would all share it with compute thread 0. The main thread's own binding is restored
    on the way out."""
    bound = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, bound)


def leave_process_group() -> None:
    """Every rank at the same point, then out of the default process group; the process exits next.

    On torch < 2.8 the group is left to the process's exit instead of destroyed: there the gloo
    group's destructor joins its worker threads while holding the GIL, and a worker that is still
    dropping a finished collective's tensor waits for the GIL, so both wait for ever (here: 1 of 8
    runs of 2 ranks on one core, all_gather_object then destroy_process_group; 0 of 8 without it). PyTorch
    releases the GIL in that destructor from 2.8 on (pytorch/pytorch#154976)."""
    import torch
    import torch.distributed as dist
    dist.barrier()
    if torch.torch_version.TorchVersion(torch.__version__) >= (2, 8):
        dist.destroy_process_group()


def listen_port(host: str = "") -> int:
    """A port for a listener that starts a moment later (torch's rendezvous store, a node's sshd):
    free to bind on `host` ("" = every address), and below the kernel's ephemeral range, from
    which bind(0) and every outgoing connection draw theirs, so no other process is handed it
    meanwhile. Random, so two processes choosing this way rarely meet (a local node's sshd that
    does gets "address in use", and ftc chooses again)."""
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low = int(ephemeral.read_text().split()[0]) if ephemeral.exists() else 32768
    # a kernel whose ephemeral range starts that low leaves no room below it: then any free port
    candidates = range(10000, low) if low > 11000 else range(1024, 65536)
    for port in random.sample(candidates, min(200, len(candidates))):
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port to listen on {host or 'every address'} among 200 tried")


if __name__ == "__main__" and sys.argv[1:] == ["listen-port"]:  # the launch script's MASTER_PORT
    print(listen_port())
