"""Decide the rank layout and render the mpirun launch script. Pure functions, no I/O.

The same renderer serves `ftc finetune`, the bootstrap's verification and `ftc bench`
(simulated nodes): one launch path, whatever runs through it.
"""

from dataclasses import dataclass, field

from .templates import render

# Variables an Open MPI launch must forward with -x (Intel MPI and MPICH forward the environment).
EXPORTED = ("OMP_NUM_THREADS", "KMP_AFFINITY", "KMP_BLOCKTIME", "OMP_PROC_BIND", "OMP_PLACES", "FTC_SELF_PIN",
            "MASTER_ADDR", "MASTER_PORT", "FI_PROVIDER", "FTC_WORLD_SIZE", "PYTHONUNBUFFERED", "PYTHONPATH", "PATH")


@dataclass
class RankPlan:
    ppn: int  # ranks per node
    threads: int  # compute threads per rank
    ccl_affinity: str = ""  # intel stack: the core of each local rank's oneCCL worker


def plan_ranks(facts: list[dict], stack: str = "stock", ppn: int | None = None) -> RankPlan:
    """One rank per socket by default; threads from the smallest node's physical cores.

    On the intel stack one core per rank is given to the oneCCL worker and kept out of
    the compute threads.
    """
    smallest = min(facts, key=lambda f: f["physical_cores"])
    ranks = ppn or max(1, min(f["sockets"] for f in facts))
    per_rank = smallest["physical_cores"] // ranks
    if per_rank < 1:
        raise ValueError(f"{ranks} ranks per node but node {smallest.get('hostname', '?')} has only "
                         f"{smallest['physical_cores']} physical cores")
    if stack != "intel":
        return RankPlan(ranks, per_rank)
    if per_rank < 2:
        raise ValueError(f"the intel stack keeps one core per rank for oneCCL; {per_rank} core(s) per rank is too few")
    cores = smallest["core_cpus"]
    workers = [cores[(r + 1) * per_rank - 1] for r in range(ranks)]
    return RankPlan(ranks, per_rank - 1, ",".join(map(str, workers)))


@dataclass
class LaunchSpec:
    description: str
    job_dir: str
    hostfile: str
    nodes: int
    plan: RankPlan
    python: str
    module: str  # a node program, run as `python -m module` (runner.node.train)
    pythonpath: str  # the directory holding the shipped `runner` package
    args: list[str] = field(default_factory=list)
    mpi: str = "impi"  # impi | mpich | openmpi
    mpirun: str = "mpirun"
    master_addr: str = "127.0.0.1"
    gloo_iface: str = ""
    stack: str = "stock"
    allocator: str = ""
    env_file: str = ""
    ssh_config: str = ""
    as_root: bool = False


def render_launch(spec: LaunchSpec) -> str:
    if spec.mpi not in ("impi", "mpich", "openmpi"):
        raise ValueError(f"mpirun flavour {spec.mpi!r} is not supported; allowed: impi, mpich, openmpi")
    exported = list(EXPORTED) + (["LD_PRELOAD"] if spec.allocator else []) + \
        (["GLOO_SOCKET_IFNAME"] if spec.gloo_iface else []) + \
        (["CCL_WORKER_COUNT", "CCL_WORKER_AFFINITY", "CCL_ATL_TRANSPORT"] if spec.stack == "intel" else [])
    return render("launch.sh.j2", description=spec.description, job_dir=spec.job_dir, hostfile=spec.hostfile,
                  nodes=spec.nodes, ppn=spec.plan.ppn, threads=spec.plan.threads,
                  ccl_affinity=spec.plan.ccl_affinity, python=spec.python, module=spec.module, pythonpath=spec.pythonpath,
                  args=spec.args,
                  mpi=spec.mpi, mpirun=spec.mpirun, master_addr=spec.master_addr, gloo_iface=spec.gloo_iface,
                  stack=spec.stack, allocator=spec.allocator, env_file=spec.env_file, ssh_config=spec.ssh_config,
                  as_root=spec.as_root, exported=exported)


def pick_allocator(facts: dict) -> str:
    """tcmalloc, else jemalloc, when the node has one: fewer page faults for the many short tensors."""
    for name in ("libtcmalloc.so.4", "libtcmalloc_minimal.so.4", "libjemalloc.so.2"):
        for path in facts.get("allocators", []):
            if path.endswith(name):
                return path
    return ""
