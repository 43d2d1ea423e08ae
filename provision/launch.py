"""Decide the rank layout and render the mpirun launch script. Pure functions, no I/O.

The one launch builder: `ftc finetune`, the bootstrap's verification (Fabric and Ansible) and
`ftc bench` (simulated nodes) all go through `cluster_launch`/`render_launch`.
"""

from dataclasses import dataclass, field, replace

from runner.node.facts import ALLOCATORS, NodeFacts
from runner.node.protocol import EXIT_CODE_FILE, LOGS_DIR

from . import state as st
from .estimate import flows_to_fill
from .providers import traits, world
from .templates import render

MPI_FLAVOURS = ("impi", "mpich", "openmpi")

# Variables an Open MPI launch must forward with -x (Intel MPI and MPICH forward the environment).
EXPORTED = ("OMP_NUM_THREADS", "KMP_AFFINITY", "KMP_BLOCKTIME", "OMP_PROC_BIND", "OMP_PLACES", "FTC_SELF_PIN",
            "MASTER_ADDR", "MASTER_PORT", "FI_PROVIDER", "FTC_WORLD_SIZE", "PYTHONUNBUFFERED", "PYTHONPATH", "PATH")


@dataclass
class RankPlan:
    ppn: int  # ranks per node
    threads: int  # compute threads per rank
    ccl_affinity: str = ""  # intel stack: the core of each local rank's oneCCL worker


def default_ppn(sockets: int) -> int:
    """Ranks per node when the job names none: one per socket, measured the fastest at the recipe's
    global batch (docs/probes/batch_split.json: on 16 AMX cores, 1 rank of 32 rows 1.12x 2 ranks of 16
    and 1.22x 4 of 8). More ranks train faster only with a larger global batch (4 x 32 rows: 1.29x),
    which changes the recipe: so only when asked (--ppn)."""
    return max(1, sockets)


def plan_ranks(facts: list[NodeFacts], stack: str = "stock", ppn: int | None = None) -> RankPlan:
    """default_ppn ranks per node unless `ppn` is given; threads from the smallest node's physical cores.

    On the intel stack one core per rank is given to the oneCCL worker and kept out of
    the compute threads.
    """
    smallest = min(facts, key=lambda f: f.physical_cores)
    ranks = ppn or default_ppn(min(f.sockets for f in facts))
    per_rank = smallest.physical_cores // ranks
    if per_rank < 1:
        raise ValueError(f"{ranks} ranks per node but node {smallest.hostname} has only "
                         f"{smallest.physical_cores} physical cores")
    if stack != "intel":
        return RankPlan(ranks, per_rank)
    if per_rank < 2:
        raise ValueError(f"the intel stack keeps one core per rank for oneCCL; {per_rank} core(s) per rank is too few")
    cores = smallest.core_cpus
    workers = [cores[(r + 1) * per_rank - 1] for r in range(ranks)]
    return RankPlan(ranks, per_rank - 1, ",".join(map(str, workers)))


@dataclass
class NodePlace:
    """What one node's ranks run, and where, in that node's own paths."""
    host: str  # the node's name in the hostfile, as mpirun reaches it
    job_dir: str  # the ranks' working directory
    pythonpath: str  # the directory holding the node's copy of the shipped `runner` package
    command: list[str]  # its Python, the node program and its arguments (or `program`)


@dataclass
class RankLaunch:
    description: str
    job_dir: str
    hostfile: str
    nodes: int
    plan: RankPlan
    python: str
    module: str  # a node program, run as `python -m module` (runner.node.train); "" with `program`
    pythonpath: str  # the directory holding the shipped `runner` package
    args: list[str] = field(default_factory=list)
    mpi: str = "impi"  # impi | mpich | openmpi
    mpirun: str = "mpirun"
    master_addr: str = "127.0.0.1"
    gloo_iface: str = ""
    stack: str = "stock"
    allocator: str = ""
    env_file: str = ""
    as_root: bool = False
    program: list[str] = field(default_factory=list)  # instead of the node program: this command (`hostname`)
    env: dict[str, str] = field(default_factory=dict)  # more variables for every rank (`ftc launch --env`, FTC_RUN_ID)
    places: list[NodePlace] = field(default_factory=list)  # per node, in hostfile order; [] or all alike: one command


def own_places(launch: RankLaunch) -> list[NodePlace]:
    """The per-node places when the nodes' paths differ (accounts with different homes); [] when every
    node runs the one command in the head's paths. Pure."""
    alike = {(p.job_dir, p.pythonpath, *p.command) for p in launch.places}
    return launch.places if len(alike) > 1 else []


def render_launch(launch: RankLaunch) -> str:
    if launch.mpi not in MPI_FLAVOURS:
        raise ValueError(f"mpirun flavour {launch.mpi!r} is not supported; allowed: {', '.join(MPI_FLAVOURS)}")
    exported = list(EXPORTED) + (["LD_PRELOAD"] if launch.allocator else []) + \
        (["GLOO_SOCKET_IFNAME"] if launch.gloo_iface else []) + \
        (["CCL_WORKER_COUNT", "CCL_WORKER_AFFINITY", "CCL_ATL_TRANSPORT"] if launch.stack == "intel" else []) + \
        list(launch.env)
    command = launch.program or [launch.python, "-m", launch.module, *launch.args]
    return render("launch.sh.j2", description=launch.description, job_dir=launch.job_dir, hostfile=launch.hostfile,
                  nodes=launch.nodes, ppn=launch.plan.ppn, threads=launch.plan.threads,
                  ccl_affinity=launch.plan.ccl_affinity, python=launch.python, module=launch.module, pythonpath=launch.pythonpath,
                  args=launch.args,
                  mpi=launch.mpi, mpirun=launch.mpirun, master_addr=launch.master_addr, gloo_iface=launch.gloo_iface,
                  stack=launch.stack, allocator=launch.allocator, env_file=launch.env_file,
                  as_root=launch.as_root, exported=exported, command=command, env=launch.env, places=own_places(launch),
                  logs_dir=LOGS_DIR, exit_code_file=EXIT_CODE_FILE)


def pick_allocator(facts: NodeFacts) -> str:
    """tcmalloc, else jemalloc, when the node has one: fewer page faults for the many short tensors."""
    for name in ALLOCATORS:  # in order of preference
        for path in facts.allocators:
            if path.endswith(name):
                return path
    return ""


def node_path(state: st.ClusterState, node: st.NodeInfo, path: str) -> str:
    """Where `path`, a path in the head node's directory, lies on `node`: at the same place in the
    node's own directory. Every node lays its directory out alike (jobs/<id>, cache/, ftc/), but each
    account has its own home (your servers: alice@srv1 and bob@srv2), so the head's absolute path
    may not exist on another node. Nodes that share this machine use the head's own files; a path
    outside the head's directory (a local cluster's data on this machine) stays as it is. Pure."""
    head = state.head.workdir
    if traits(state.provider).shares_this_machine or not (path == head or path.startswith(f"{head}/")):
        return path
    return node.workdir + path[len(head):]


def node_python(state: st.ClusterState, facts: list[NodeFacts], node: st.NodeInfo) -> str:
    """The stack's Python a node's ranks run: its own, as its facts found it, except on nodes that share
    this machine, which all run the head's files. Pure."""
    return facts[0 if traits(state.provider).shares_this_machine else node.index].python_executable


def default_flows(state: st.ClusterState) -> int:
    """gloo's TCP connections to each peer when the job names none: on catalog instances as many as
    fill the instance's link, since the cloud caps each flow (estimate.flows_to_fill: 3 at 25 Gbit/s,
    1 with ENA Express, whose flows go to 25 each); elsewhere one. Pure."""
    if not traits(state.provider).instance_types:
        return 1
    own = world(state.provider)
    cap = own.express_flow_gbps if state.cluster_spec.express and own.express_flow_gbps else own.flow_gbps
    return flows_to_fill(own.instance_types[state.cluster_spec.instance_type].network_gbps, cap)


def gloo_devices(interface: str, flows: int) -> str:
    """GLOO_SOCKET_IFNAME for `flows` connections per peer: gloo opens one per device named, and the
    collectives in flight at once (ftc's gradient buckets) go out on different ones. Pure."""
    return ",".join([interface] * flows)


def cluster_launch(state: st.ClusterState, facts: list[NodeFacts], description: str, job_dir: str, module: str,
                   args: list[str], ppn: int | None = None, program: list[str] | None = None,
                   env: dict[str, str] | None = None, flows: int | None = None) -> RankLaunch:
    """The launch of a node program across this cluster, from its state and node facts. `job_dir` and
    the paths in `args` are the head's; each node's ranks get them in its own directory (node_path)."""
    head, wd = facts[0], state.head.workdir
    stack = state.cluster_spec.stack
    named = [replace(f, hostname=node.name) for f, node in zip(facts, state.nodes)]  # a refusal names ftc's node
    places = [NodePlace(host=node.name, job_dir=node_path(state, node, job_dir),
                        pythonpath=node_path(state, node, f"{wd}/ftc"),
                        command=program or [node_python(state, facts, node), "-m", module,
                                            *(node_path(state, node, arg) for arg in args)])
              for node in state.nodes]
    return RankLaunch(
        description=description, job_dir=job_dir, hostfile=f"{wd}/hostfile", nodes=len(state.nodes),
        plan=plan_ranks(named, stack, ppn), python=head.python_executable, module=module, pythonpath=f"{wd}/ftc",
        args=args, mpi=head.mpi if head.mpi in MPI_FLAVOURS else "impi", master_addr=state.head.private_ip,
        gloo_iface=gloo_devices(head.interface, flows or default_flows(state)), stack=stack,
        allocator=pick_allocator(head), env_file=f"{wd}/env.sh",
        as_root=state.head.ssh_user == "root", program=program or [], env=env or {}, places=places)
