"""`ftc plan`: how long a fine-tuning job takes on N nodes of an instance type, and what it
costs, before anything is launched. Pure functions; the numbers come in as arguments.

The model: each node trains its share of every global batch at a per-node rate (a bench result,
scaled to the instance's cores and CPU class), waits for the slowest node, then the nodes average
their gradients with a ring all-reduce. Two terms, each from its own measurement (`ftc bench`):
- the raw collective: the ring moves 2(N-1)/N of the gradient bytes through every node's link,
  plus one latency per hop, at the instance's bandwidth, but no faster than its TCP flows may go
  inside a cluster placement group (10 Gbit/s each);
- its exposure in training: how much longer the all-reduce took inside training than with idle
  cores, and the wait for the slowest rank as a share of compute.
The levers (`Levers`) change the first term (flows), what of it is exposed (overlap with backward),
or how often it is paid (gradient accumulation, which changes the recipe).
"""

import math
from dataclasses import dataclass, replace

from runner.node.recipes import POWERSGD_RANK
from runner.node.units import duration

from .providers.records import default_world

# Training examples per GLUE task (the canonical train splits).
GLUE_TRAIN_SIZES = {"cola": 8551, "sst2": 67349, "mrpc": 3668, "stsb": 5749, "qqp": 363846,
                    "mnli": 392702, "qnli": 104743, "rte": 2490}
# distilbert-base-uncased with a 2-label head (transformers' DistilBertConfig); tests recount it.
DISTILBERT_PARAMS = 66_955_010
# distilbert-base-uncased's weight matrices (rows, columns) that PowerSGD factors: position embeddings, each
# of 6 layers' attention (4) and feed-forward (2), the pre-classifier; tests recount them. The word embeddings
# cross as the rows some rank used (UsedRowsSync), at most EMBEDDING_ROWS_USED of them.
DISTILBERT_WORD_EMBEDDINGS = (30522, 768)
DISTILBERT_MATRICES = ((512, 768), *(((768, 768),) * 4 + ((3072, 768), (768, 3072))) * 6, (768, 768))
# The share of the vocabulary a global batch uses: MRPC's global batches of 64, 128 and 256 rows used 3.3%,
# 5.7% and 9.1% of bert-base-uncased's rows (20 random batches each).
EMBEDDING_ROWS_USED = 0.1
BACKWARD_SHARE = 2 / 3  # of a step's FLOPs: forward 2, backward 4 per parameter and token
# The default world's network (of the built-ins, AWS's cluster placement group): one hop, and the cap
# on one TCP flow. The plan passes its own provider's (World.hop_latency_s, flow_gbps) where it differs.
DEFAULT_HOP_LATENCY_S = default_world().hop_latency_s
DEFAULT_FLOW_GBPS = default_world().flow_gbps


def gradient_bytes(bf16: bool, params: int = DISTILBERT_PARAMS) -> float:
    """The bytes one all-reduce moves: bf16 gradients where training is bf16, fp32 elsewhere."""
    return params * (2 if bf16 else 4)


def ring_allreduce_seconds(nbytes: float, nodes: int, gbps: float, latency_s: float = DEFAULT_HOP_LATENCY_S) -> float:
    """One ring all-reduce of `nbytes` across `nodes`, each with `gbps` of bandwidth."""
    if nodes <= 1:
        return 0.0
    return 2 * (nodes - 1) / nodes * nbytes / (gbps * 1e9 / 8) + 2 * (nodes - 1) * latency_s


def low_rank_bytes(rank: int, params: int = DISTILBERT_PARAMS) -> tuple[float, float, float]:
    """What PowerSGD at `rank` moves a step (runner/node/ddp.LowRankSync): the P factors and the Q factors
    (fp32, one all-reduce each) of every matrix they make smaller, and what crosses whole in bf16 (the
    other weights, and the word embeddings' used rows). From distilbert's shapes, scaled by `params`."""
    chosen = [(n, m) for n, m in DISTILBERT_MATRICES if (n + m) * rank < n * m]
    scale, words = params / DISTILBERT_PARAMS, math.prod(DISTILBERT_WORD_EMBEDDINGS)
    whole = DISTILBERT_PARAMS - sum(n * m for n, m in chosen) - words + EMBEDDING_ROWS_USED * words
    return (scale * 4 * rank * sum(n for n, _ in chosen), scale * 4 * rank * sum(m for _, m in chosen),
            scale * 2 * whole)


def exchange_seconds(grad_bytes: float, nodes: int, gbps: float, latency_s: float, low_rank: int,
                     node_samples_per_s: float, params: int = DISTILBERT_PARAMS) -> float:
    """The gradient exchange of a step: one ring all-reduce of `grad_bytes`; with PowerSGD (`low_rank`
    above 0) three smaller ones (low_rank_bytes), each paying its latency, and the factors' arithmetic on
    each node, which takes as long as training LOW_RANK_ROWS rows there (scaled by `params`)."""
    if not low_rank:
        return ring_allreduce_seconds(grad_bytes, nodes, gbps, latency_s)
    if nodes <= 1:
        return 0.0
    network = sum(ring_allreduce_seconds(part, nodes, gbps, latency_s) for part in low_rank_bytes(low_rank, params))
    return network + LOW_RANK_ROWS * params / DISTILBERT_PARAMS / node_samples_per_s


def flow_limited_gbps(instance_gbps: float, flows: int = 1, flow_gbps: float = DEFAULT_FLOW_GBPS) -> float:
    """The bandwidth a ring all-reduce gets: the instance's, but at most `flows` TCP flows' worth."""
    return min(instance_gbps, flows * flow_gbps)


@dataclass(frozen=True)
class Levers:
    """How the nodes exchange gradients: what `ftc plan` models (its --flows, --allreduce, --accumulate)."""
    flows: int  # TCP flows per ring peer: each is capped at DEFAULT_FLOW_GBPS, the ring gets min(instance, flows x cap)
    overlap: bool  # DDP's buckets reduced during backward: only what outlasts backward is exposed; else after it
    accumulate: int  # micro-batches per all-reduce; above 1 the recipe changes (global batch, lr), so only on request
    low_rank: int = 0  # PowerSGD's rank (--grad-compress powersgd); 0: the whole gradient crosses. An approximate
    # average changes the numerics, so only on request
    comm_core: bool = False  # overlapped, gloo's threads on a core kept from compute: a node computes on all
    # but one of its cores
    express: bool = False  # ENA Express on both ends: each flow capped at the world's express_flow_gbps
    compiled: bool = False  # torch.compile: steps `Compile.speedup` faster after `Compile.seconds` on every node


# The model's levers when given none: one connection to each ring neighbour, the all-reduce after
# backward, nothing accumulated. ftc's jobs open more flows where the instance's link holds them:
# default_levers.
DEFAULT_LEVERS = Levers(flows=1, overlap=False, accumulate=1)


def flow_cap(levers: Levers, flow_gbps: float, express_flow_gbps: float) -> float:
    """One TCP flow's cap: the world's, or with ENA Express (where the world has it) its express cap."""
    return express_flow_gbps if levers.express and express_flow_gbps else flow_gbps


def flows_to_fill(network_gbps: float, flow_gbps: float = DEFAULT_FLOW_GBPS) -> int:
    """The fewest TCP flows whose caps together reach the instance's bandwidth (3 for 25 Gbit/s)."""
    return max(1, math.ceil(network_gbps / flow_gbps - 1e-9))


def default_levers(network_gbps: float, express: bool = False, flow_gbps: float = DEFAULT_FLOW_GBPS,
                   express_flow_gbps: float = 0.0) -> Levers:
    """What ftc's jobs do on an instance of `network_gbps` (ENA Express on where `express`): gloo given as
    many flows per peer as fill its link (provision/launch.default_flows; on the emulated c7i network 3
    flows trained at 0.78 efficiency on 2 nodes, one flow at 0.51: docs/bench.json network), the
    all-reduce after backward (the communication core where the plan finds it faster: faster_rows),
    nothing accumulated."""
    chosen = replace(DEFAULT_LEVERS, express=express)
    return replace(chosen, flows=flows_to_fill(network_gbps, flow_cap(chosen, flow_gbps, express_flow_gbps)))


def with_comm_core(levers: Levers) -> Levers:
    return replace(levers, overlap=True, comm_core=True, low_rank=0)


def faster_rows(after: list["PlanRow"], kept: list["PlanRow"]) -> list["PlanRow"]:
    """Per node count, the faster of the all-reduce after backward and the communication core: what
    ftc's controller chooses for a job's ALLREDUCE auto (runner/plan.exchange_for). Pure."""
    return [min(a, k, key=lambda row: row.wall_s) for a, k in zip(after, kept)]
SUGGESTED_ACCUMULATE = 4  # the accumulation the plan offers when the all-reduce outweighs compute

# The arithmetic PowerSGD's factors (runner/node/recipes.POWERSGD_RANK) cost a node a step (error
# feedback, two thin products, the approximation written in place), in rows of training on the same
# node: 46.8 ms on 4 AMX cores that train 36.4 rows/s, 39.8 ms beside 41.2 (two device calls,
# docs/bench.json network). It scales with the node, as the plan's compute does.
LOW_RANK_ROWS = 1.7

# The overlapped exchange (DDP's buckets during backward: --allreduce overlap and comm-core), as 4 emulated
# nodes of 3 cores measured it against the same nodes exchanging nothing (docs/bench.json network): at
# c8in's 100 Gbit/s, where the exchange is a small part of the step, the step took OVERLAP_COST more than
# compute alone (each bucket waits for the slowest rank, in place of the after-backward wait_share); at
# c7i's 25 Gbit/s it took no more than that, so backward hid the whole exchange: at least OVERLAP_HIDES
# of backward's time moves the gradient. Overlap pays where the exchange is a large part of the step.
OVERLAP_COST = 0.34
OVERLAP_HIDES = 0.75


def step_seconds(batch_per_node: int, node_samples_per_s: float, allreduce_s: float, exposure: float,
                 wait_share: float, levers: Levers = DEFAULT_LEVERS) -> float:
    """A step of `levers.accumulate` micro-batches: their compute, the wait for the slowest node, then
    the all-reduce as exposed in training (exposed_allreduce)."""
    micro = batch_per_node / node_samples_per_s
    return levers.accumulate * micro * (1 + wait_share) + exposure * exposed_allreduce(allreduce_s, micro, levers)


def exposed_allreduce(allreduce_s: float, micro_s: float, levers: Levers) -> float:
    """What of the all-reduce a step waits for: all of it after backward; overlapped, what outlasts
    the share of the last backward it hides (OVERLAP_HIDES)."""
    hidden = OVERLAP_HIDES * BACKWARD_SHARE * micro_s if levers.overlap else 0.0
    return max(0.0, allreduce_s - hidden)


@dataclass(frozen=True)
class PlanRow:
    nodes: int
    samples_per_s: float
    efficiency: float  # against as many lone nodes, each on all its cores, eager
    allreduce_s: float
    train_s: float
    wall_s: float  # training, the setup and the compile
    usd: float
    levers: Levers = DEFAULT_LEVERS
    instance_type: str = ""


@dataclass(frozen=True)
class Compile:
    """What torch.compile does to a long job on a node: its steps this many times faster, after
    this many seconds of compiling on every node (billed, before training)."""
    speedup: float
    seconds: float


NO_COMPILE = Compile(1.0, 0.0)


def plan(nodes_list: list[int], train_samples: int, epochs: int, node_samples_per_s: float, batch_per_node: int,
         grad_bytes: float, network_gbps: float, exposure: float, wait_share: float, usd_per_node_hour: float,
         setup_s: float, levers: Levers = DEFAULT_LEVERS, latency_s: float = DEFAULT_HOP_LATENCY_S,
         flow_gbps: float = DEFAULT_FLOW_GBPS, params: int = DISTILBERT_PARAMS, cores: int = 0,
         express_flow_gbps: float = 0.0, compiled: Compile = NO_COMPILE) -> list[PlanRow]:
    """Predicted rate, time and cost per cluster size, on instances of `network_gbps` and `cores` each,
    whose TCP flows are capped at `flow_gbps` (`express_flow_gbps` with ENA Express). Wall time adds the
    cluster's setup (launch and bootstrap) and the compile, both billed too. A communication core is
    charged at its share of the node's `cores` wherever nodes exchange."""
    gbps = flow_limited_gbps(network_gbps, levers.flows, flow_cap(levers, flow_gbps, express_flow_gbps))
    speedup, compile_s = (compiled.speedup, compiled.seconds) if levers.compiled else (1.0, 0.0)
    rows = []
    for nodes in nodes_list:
        kept = 1 / cores if levers.comm_core and cores > 1 and nodes > 1 else 0.0  # one core: comm-core is refused
        node_rate = node_samples_per_s * speedup * (1 - kept)
        allreduce = exchange_seconds(grad_bytes, nodes, gbps, latency_s, levers.low_rank, node_rate, params)
        # the wait for the slowest node: after backward, the bench's share; overlapped, OVERLAP_COST
        waits = (OVERLAP_COST if levers.overlap else wait_share) if nodes > 1 else 0.0
        step = step_seconds(batch_per_node, node_rate, allreduce, exposure, waits, levers)
        rate = nodes * batch_per_node * levers.accumulate / step
        train = epochs * train_samples / rate
        wall = train + setup_s + compile_s
        alone = replace(levers, overlap=False, comm_core=False) if nodes == 1 else levers  # nothing to exchange
        rows.append(PlanRow(nodes, rate, rate / (nodes * node_samples_per_s * speedup), allreduce, train, wall,
                            nodes * usd_per_node_hour * wall / 3600, alone))
    return rows


# Training rate per core on this machine's local nodes, for a model of MINILM_PARAMS with the demo's
# settings (MRPC, a global batch of 64, no dropout), by CPU class: measured in
# docs/probes/demo_settings.txt (AMX host: 51 samples/s on 2 cores in bf16, 41 in fp32) and by
# `make demo` on a 2-core AMD EPYC with AVX2 only: 28.3 samples/s on its 2 nodes (README, Quickstart).
MINILM_PARAMS = 22_713_728  # the packaged MiniLM-L6 (its safetensors header)
LOCAL_RATE_PER_CORE = {"bf16": 25.0, "avx512": 20.0, "avx2": 14.0}


def cpu_class(flags: list[str]) -> str:
    """bf16 where the CPU has it natively (AMX or AVX-512 BF16), else the widest fp32 vectors it has."""
    if "amx_bf16" in flags or "avx512_bf16" in flags:
        return "bf16"
    return "avx512" if "avx512f" in flags else "avx2"


def local_train_seconds(samples_seen: int, params: int, cores: int, cls: str) -> float:
    """How long local nodes sharing `cores` of this machine take to train on `samples_seen` rows: a
    step's work grows with the weights, the rate with the cores."""
    return samples_seen / (LOCAL_RATE_PER_CORE[cls] * cores * MINILM_PARAMS / params)


CLASS_NAMES = {"bf16": "native bf16", "avx512": "AVX-512 fp32", "avx2": "AVX2 fp32"}


def xeon_class(native_bf16: bool) -> str:
    """The CPU class of a Xeon ftc plans for (the catalog's, a bench host's): every one from Ice Lake
    on has AVX-512, so where bf16 is not native it trains in fp32 on AVX-512."""
    return "bf16" if native_bf16 else "avx512"


def class_rate(measured_per_core: float, measured_class: str, cls: str) -> float:
    """A per-core training rate measured on one CPU class, carried to another by the ratio of their
    measured rates on the same work (LOCAL_RATE_PER_CORE); the ratio is taken to hold for any model."""
    return measured_per_core * LOCAL_RATE_PER_CORE[cls] / LOCAL_RATE_PER_CORE[measured_class]


# More nodes pay when they finish sooner for at most this many times the cost: at least two thirds
# of what the extra nodes bill buys time (the seed's 4 nodes: 3x sooner for about 1.3x).
PAYS_COST_RATIO = 1.5


@dataclass(frozen=True)
class Assumed:
    """What a plan took as given besides its levers, named in its recommendation."""
    node_samples_per_s: float
    cpu_class: str  # a key of LOCAL_RATE_PER_CORE
    batch_per_node: int  # rows per node per micro-batch
    network_gbps: float  # the instance's
    lr: float  # the recipe's; scaled with accumulation
    flow_gbps: float = DEFAULT_FLOW_GBPS  # one flow's cap, as the levers' ENA Express makes it (flow_cap)


def lever_flags(levers: Levers, base: Levers) -> str:
    """The `ftc plan` flags to add to a plan of `base` to model `levers` (those that differ)."""
    flags = []
    if levers.flows != base.flows:
        flags.append(f"--flows {levers.flows}")
    if (levers.overlap, levers.comm_core) != (base.overlap, base.comm_core):
        mode = "comm-core" if levers.comm_core else "overlap" if levers.overlap else "after-backward"
        flags.append(f"--allreduce {mode}")
    if levers.accumulate != base.accumulate:
        flags.append(f"--accumulate {levers.accumulate}")
    if levers.low_rank != base.low_rank:
        flags.append("--grad-compress powersgd" if levers.low_rank else "--grad-compress auto")
    return " ".join(flags)


def describe_levers(levers: Levers, network_gbps: float, flow_gbps: float = DEFAULT_FLOW_GBPS) -> str:
    flows = "one TCP flow" if levers.flows == 1 else f"{levers.flows} TCP flows"
    when = "overlapped with backward" if levers.overlap else "after backward"
    every = "no accumulation" if levers.accumulate == 1 else f"one all-reduce per {levers.accumulate} micro-batches"
    what = (f"PowerSGD's rank-{levers.low_rank} factors (an approximate average) all-reduced" if levers.low_rank
            else "the all-reduce")
    express = ", ENA Express" if levers.express else ""
    when = "overlapped with backward, gloo's threads on a kept core" if levers.comm_core else when
    return (f"{flows} per peer ({flow_limited_gbps(network_gbps, levers.flows, flow_gbps):g} Gbit/s{express}), "
            f"{what} {when}, {every}")


def alternative_levers(levers: Levers, network_gbps: float, flow_gbps: float = DEFAULT_FLOW_GBPS) -> list[Levers]:
    """What to try when more nodes do not pay: enough flows to fill the instance's link, with the
    communication core; accumulation (which changes the recipe) where there is none; PowerSGD (which
    changes the numerics)."""
    flows = max(levers.flows, flows_to_fill(network_gbps, flow_gbps))
    options = []
    if (flows, levers.comm_core) != (levers.flows, True) and not levers.low_rank:
        options.append(with_comm_core(replace(levers, flows=flows)))
    if levers.accumulate == 1:
        options.append(replace(levers, accumulate=SUGGESTED_ACCUMULATE))
    if not levers.low_rank:
        options.append(replace(levers, flows=flows, overlap=False, comm_core=False, low_rank=POWERSGD_RANK))
    return options


def recommend(rows: list[PlanRow], levers: Levers, assumed: Assumed,
              alternatives: list[tuple[Levers, list[PlanRow]]]) -> str:
    """The plan's decision, in words: the fastest and the cheapest node counts, the fastest's speed-up
    and cost against the cheapest's; where more nodes do not pay, why, and the `alternatives` (levers
    and their plans) with what they give; then what the plan assumed. Pure."""
    fastest, cheapest = _fastest(rows), _cheapest(rows)
    larger = [row for row in rows if row.nodes > cheapest.nodes]
    paying = [row for row in larger if row.wall_s < cheapest.wall_s and row.usd <= PAYS_COST_RATIO * cheapest.usd]
    if len(rows) == 1:
        verdict = f"{_count(rows[0].nodes)} only: give several counts (--nodes 1,2,4) to compare"
    elif fastest in paying or not larger:
        verdict = _headline(rows)
    elif paying:
        best = _fastest(paying)
        verdict = (f"{_headline(rows)}; {_count(best.nodes)} {_verb(best.nodes, 'finish')} "
                   f"{cheapest.wall_s / best.wall_s:.1f}x sooner for {best.usd / cheapest.usd:.1f}x the cost, "
                   f"the most that pays (at most {PAYS_COST_RATIO:g}x the cost)")
    else:
        verdict = f"{_headline(rows)}: more nodes do not pay: {_why_not(larger, levers, assumed, alternatives)}"
    return (f"{verdict}. Assumed: {assumed.node_samples_per_s:.0f} samples/s per node "
            f"({CLASS_NAMES[assumed.cpu_class]}), {assumed.batch_per_node} rows per node per micro-batch, "
            f"{describe_levers(levers, assumed.network_gbps, assumed.flow_gbps)}{_recipe_note(levers, rows, assumed)}.")


def _recipe_note(levers: Levers, rows: list[PlanRow], assumed: Assumed) -> str:
    """What accumulation does to the recipe at the fastest node count: the global batch grows, and lr
    is scaled with it (linearly); and that PowerSGD averages approximately. '' without either: the
    recipe is never changed silently."""
    k, batch, nodes = levers.accumulate, assumed.batch_per_node, _fastest(rows).nodes
    numerics = "; it changes the numerics: each step applies an approximate average" if levers.low_rank else ""
    if k == 1:
        return numerics
    return (f"; it changes the recipe: a global batch of {nodes * batch * k} ({_count(nodes)} x {batch} rows x "
            f"{k} micro-batches) and lr scaled {k}x to {assumed.lr * k:g}{numerics}")


def _why_not(larger: list[PlanRow], levers: Levers, assumed: Assumed,
             alternatives: list[tuple[Levers, list[PlanRow]]]) -> str:
    """Why more nodes do not pay: the setup, where training scales; else the largest count's all-reduce
    against a step's compute, and the alternatives (levers and their plans) with what they give."""
    row = max(larger, key=lambda r: r.nodes)
    if row.efficiency >= 1 / PAYS_COST_RATIO:
        return (f"the setup ({(row.wall_s - row.train_s) / 60:.0f} min, billed on every node) outweighs the "
                f"training it saves")
    micro = assumed.batch_per_node / assumed.node_samples_per_s
    compute = levers.accumulate * micro
    exposed = exposed_allreduce(row.allreduce_s, micro, levers)
    flows = "one flow" if levers.flows == 1 else f"{levers.flows} flows"
    what = (f"the all-reduce on {row.nodes} nodes ({row.allreduce_s * 1000:.0f} ms at "
            f"{flow_limited_gbps(assumed.network_gbps, levers.flows, assumed.flow_gbps):g} Gbit/s, {flows}"
            + (f"; {exposed * 1000:.0f} ms of it outlasts backward)" if levers.overlap else ")"))
    relation = "takes longer than" if exposed >= compute else f"takes {exposed / compute:.0%} of"
    tries = [f"{lever_flags(alt, levers)} ({_headline(alt_rows)}{_recipe_note(alt, alt_rows, assumed)})"
             for alt, alt_rows in alternatives]
    return f"{what} {relation} a step's compute ({compute * 1000:.0f} ms)" + (f"; try {', or '.join(tries)}" if tries else "")


def _fastest(rows: list[PlanRow]) -> PlanRow:
    return min(rows, key=lambda row: (row.wall_s, row.nodes))


def _cheapest(rows: list[PlanRow]) -> PlanRow:
    return min(rows, key=lambda row: (row.usd, row.nodes))


def _headline(rows: list[PlanRow]) -> str:
    """"4 nodes finish 3.2x sooner for 1.3x the cost of 1", or the one count that is both fastest and cheapest."""
    fastest, cheapest = _fastest(rows), _cheapest(rows)
    if fastest is cheapest:
        return f"{_count(fastest.nodes)} {_verb(fastest.nodes, 'finish')} soonest and {_verb(fastest.nodes, 'cost')} least"
    return (f"{_count(fastest.nodes)} {_verb(fastest.nodes, 'finish')} {cheapest.wall_s / fastest.wall_s:.1f}x sooner "
            f"for {fastest.usd / cheapest.usd:.1f}x the cost of {cheapest.nodes}")


def _count(nodes: int) -> str:
    return f"{nodes} node" if nodes == 1 else f"{nodes} nodes"


def _verb(nodes: int, verb: str) -> str:
    """The verb agreeing with a node count: "1 node finishes", "4 nodes finish"."""
    if nodes != 1:
        return verb
    return verb + ("es" if verb.endswith("sh") else "s")


# ---- the plan that picks the cluster ---------------------------------------------------------------

@dataclass(frozen=True)
class Offer:
    """One instance type as the plan weighs it: its node's eager rate on the job, and what it costs and has."""
    instance_type: str
    node_samples_per_s: float  # eager, all cores: measured on this type (given) or carried from the bench
    cores: int  # physical
    network_gbps: float
    usd_per_hour: float
    ena_express: bool  # the type offers it: ftc's clusters turn it on
    grad_bytes: float = 0.0  # what its nodes send a step (bf16 where training is bf16); 0: the job's


@dataclass(frozen=True)
class Job:
    """The job the plan sizes, and the figures it takes as given (the bench's, the setup's)."""
    train_samples: int
    epochs: int
    batch_per_node: int
    grad_bytes: float
    exposure: float
    wait_share: float
    setup_s: float
    compiled: Compile
    params: int = DISTILBERT_PARAMS


@dataclass(frozen=True)
class Fixed:
    """Levers the user fixed for a search (None: the search weighs both)."""
    express: bool | None = None
    comm_core: bool | None = None
    compiled: bool | None = None


def _both_or(fixed: bool | None) -> tuple[bool, ...]:
    return (True, False) if fixed is None else (fixed,)


def lever_choices(offer: Offer, express_flow_gbps: float, flow_gbps: float = DEFAULT_FLOW_GBPS,
                  fixed: Fixed = Fixed()) -> list[Levers]:
    """The exact-gradient levers worth weighing on `offer`: ENA Express on (where offered) or off, the
    communication core or the all-reduce after backward, eager or compiled, each as `fixed` allows; each
    with as many flows as fill the link. Accumulation and PowerSGD change the recipe or the numerics:
    never chosen for you."""
    choices = []
    offered = offer.ena_express and bool(express_flow_gbps)
    for express in [e for e in _both_or(fixed.express) if offered or not e]:
        cap = express_flow_gbps if express else flow_gbps
        flows = flows_to_fill(offer.network_gbps, cap)
        for comm_core in [c for c in _both_or(fixed.comm_core) if offer.cores > 1 or not c]:  # a core to keep
            for compiled in _both_or(fixed.compiled):
                choices.append(Levers(flows, comm_core, 1, comm_core=comm_core, express=express, compiled=compiled))
    return choices


def search(offers: list[Offer], nodes_list: list[int], job: Job, latency_s: float = DEFAULT_HOP_LATENCY_S,
           flow_gbps: float = DEFAULT_FLOW_GBPS, express_flow_gbps: float = 0.0, fixed: Fixed = Fixed()) -> list[PlanRow]:
    """Every offer x node count x lever choice, planned; fastest first. Pure."""
    rows = []
    for offer in offers:
        for levers in lever_choices(offer, express_flow_gbps, flow_gbps, fixed):
            planned = plan(nodes_list, job.train_samples, job.epochs, offer.node_samples_per_s, job.batch_per_node,
                           offer.grad_bytes or job.grad_bytes, offer.network_gbps, job.exposure, job.wait_share,
                           offer.usd_per_hour, job.setup_s, levers, latency_s, flow_gbps, job.params, offer.cores,
                           express_flow_gbps, job.compiled)
            rows += [replace(row, instance_type=offer.instance_type) for row in planned]
    unique = {(row.instance_type, row.nodes, row.levers): row for row in rows}  # one node: the exchange levers alike
    return sorted(unique.values(), key=lambda row: (row.wall_s, row.usd))


@dataclass(frozen=True)
class Pick:
    row: PlanRow | None  # None: nothing to build (no rows)
    meets: bool  # within the deadline and the budget given
    why: str  # one sentence: the pick and why


def pick(rows: list[PlanRow], deadline_s: float | None, budget_usd: float | None) -> Pick:
    """The cluster to build. With a deadline: the cheapest row that meets it (and the budget); with only a
    budget: the fastest within it; with neither: the fastest that costs at most PAYS_COST_RATIO x the
    cheapest row. Where nothing meets both, the nearest: the fastest within the budget, else the
    cheapest within the deadline, else the fastest; the sentence says by how much it misses. Pure."""
    if not rows:
        return Pick(None, False, "nothing to plan")
    within = [r for r in rows if (deadline_s is None or r.wall_s <= deadline_s) and (budget_usd is None or r.usd <= budget_usd)]
    asked = _asked(deadline_s, budget_usd)
    if within:
        if deadline_s is not None:
            chosen, rule = min(within, key=lambda r: (r.usd, r.wall_s)), f"the cheapest that meets {asked}"
        elif budget_usd is not None:
            chosen, rule = min(within, key=lambda r: (r.wall_s, r.usd)), f"the fastest within {asked}"
        else:
            cheapest = min(rows, key=lambda r: (r.usd, r.wall_s))
            paying = [r for r in rows if r.usd <= PAYS_COST_RATIO * cheapest.usd]
            chosen = min(paying, key=lambda r: (r.wall_s, r.usd))
            rule = (f"the fastest at most {PAYS_COST_RATIO:g}x the cost of the cheapest "
                    f"({_cluster(cheapest)}, {duration(cheapest.wall_s)}, ${cheapest.usd:.2f})")
        return Pick(chosen, True, f"Pick {_cluster(chosen)}: {_figures(chosen)}: {rule}.")
    budgeted = [r for r in rows if budget_usd is not None and r.usd <= budget_usd]
    timely = [r for r in rows if deadline_s is not None and r.wall_s <= deadline_s]
    if budgeted:  # a deadline too: the fastest within the budget misses it
        chosen = min(budgeted, key=lambda r: (r.wall_s, r.usd))
        miss = f"the fastest within ${budget_usd:g}, {duration(chosen.wall_s - deadline_s)} over the deadline"
    elif timely:  # a budget too: the cheapest within the deadline misses it
        chosen = min(timely, key=lambda r: (r.usd, r.wall_s))
        miss = f"the cheapest within {duration(deadline_s)}, ${chosen.usd - budget_usd:.2f} over the budget"
    elif budget_usd is None:
        chosen = min(rows, key=lambda r: (r.wall_s, r.usd))
        miss = f"the fastest, {duration(chosen.wall_s - deadline_s)} over the deadline"
    else:
        chosen = min(rows, key=lambda r: (r.usd, r.wall_s))
        miss = f"the cheapest, ${chosen.usd - budget_usd:.2f} over the budget" + (
            f" and {duration(chosen.wall_s - deadline_s)} over the deadline" if deadline_s is not None
            and chosen.wall_s > deadline_s else "")
    return Pick(chosen, False, f"Nothing planned meets {asked}; nearest: {_cluster(chosen)}: {_figures(chosen)}: {miss}.")


def lever_words(levers: Levers, nodes: int = 2) -> str:
    """"ENA Express, 4 flows, communication core, compiled": the levers as a pick names them (a lone
    node exchanges nothing: only whether it compiles)."""
    words = [] if nodes == 1 else (["ENA Express"] if levers.express else []) + [
        f"{levers.flows} flow{'s' if levers.flows > 1 else ''}",
        "communication core" if levers.comm_core else "overlapped" if levers.overlap else "after backward"]
    return ", ".join(words + (["compiled"] if levers.compiled else ["eager"]))


def levers_record(levers: Levers) -> dict:
    """The levers as `ftc plan --json` and the bench's entries name them."""
    return {"flows": levers.flows, "ena_express": levers.express, "comm_core": levers.comm_core,
            "allreduce": "comm-core" if levers.comm_core else "overlap" if levers.overlap else "after-backward",
            "compile": levers.compiled, "accumulate": levers.accumulate,
            "grad_compress": "powersgd" if levers.low_rank else "auto"}


def _asked(deadline_s: float | None, budget_usd: float | None) -> str:
    parts = ([f"the {duration(deadline_s)} deadline"] if deadline_s is not None else []) + \
        ([f"${budget_usd:g}"] if budget_usd is not None else [])
    return " and ".join(parts) or "nothing"


def _cluster(row: PlanRow) -> str:
    return f"{row.nodes} x {row.instance_type} ({lever_words(row.levers, row.nodes)})"


def _figures(row: PlanRow) -> str:
    return f"{duration(row.wall_s)} with setup, ${row.usd:.2f}, efficiency {row.efficiency:.2f}"

