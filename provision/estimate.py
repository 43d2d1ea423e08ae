"""`ftc plan`: how long a fine-tuning job takes on N nodes of an instance type, and what it
costs, before anything is launched. Pure functions; the numbers come in as arguments.

The model: each node trains its share of every global batch at a measured per-node rate
(a bench result), waits for the slowest node, then the nodes average their gradients with a
ring all-reduce after backward (ftc's default: nothing of it hides behind compute). Two terms,
each from its own measurement (`ftc bench`, issue 19):
- the raw collective: the ring moves 2(N-1)/N of the gradient bytes through every node's link,
  plus one latency per hop, at the instance's bandwidth, but no faster than one TCP flow may go
  inside a cluster placement group (10 Gbit/s): gloo's ring uses one connection to each neighbour;
- its exposure in training: how much longer the all-reduce took inside training than with idle
  cores, and the wait for the slowest rank as a share of compute.
"""

from dataclasses import dataclass

# Training examples per GLUE task (the canonical train splits).
GLUE_TRAIN_SIZES = {"cola": 8551, "sst2": 67349, "mrpc": 3668, "stsb": 5749, "qqp": 363846,
                    "mnli": 392702, "qnli": 104743, "rte": 2490}
# distilbert-base-uncased with a 2-label head (transformers' DistilBertConfig); tests recount it.
DISTILBERT_PARAMS = 66_955_010
BACKWARD_SHARE = 2 / 3  # of a step's FLOPs: forward 2, backward 4 per parameter and token
EC2_LATENCY_S = 50e-6  # one hop inside a cluster placement group
EC2_FLOW_GBPS = 10.0  # AWS's limit on one TCP flow inside a cluster placement group


def gradient_bytes(bf16: bool, params: int = DISTILBERT_PARAMS) -> float:
    """The bytes one all-reduce moves: bf16 gradients where training is bf16, fp32 elsewhere."""
    return params * (2 if bf16 else 4)


def ring_allreduce_seconds(nbytes: float, nodes: int, gbps: float, latency_s: float = EC2_LATENCY_S) -> float:
    """One ring all-reduce of `nbytes` across `nodes`, each with `gbps` of bandwidth."""
    if nodes <= 1:
        return 0.0
    return 2 * (nodes - 1) / nodes * nbytes / (gbps * 1e9 / 8) + 2 * (nodes - 1) * latency_s


def flow_limited_gbps(instance_gbps: float, flows: int = 1, flow_gbps: float = EC2_FLOW_GBPS) -> float:
    """The bandwidth a ring all-reduce gets: the instance's, but at most `flows` TCP flows' worth."""
    return min(instance_gbps, flows * flow_gbps)


def step_seconds(batch_per_node: int, node_samples_per_s: float, allreduce_s: float, exposure: float,
                 wait_share: float) -> float:
    """A step: compute, the wait for the slowest node, then the all-reduce as exposed in training."""
    compute = batch_per_node / node_samples_per_s
    return compute * (1 + wait_share) + exposure * allreduce_s


@dataclass(frozen=True)
class PlanRow:
    nodes: int
    samples_per_s: float
    efficiency: float
    allreduce_s: float
    train_s: float
    wall_s: float
    usd: float


def plan(nodes_list: list[int], train_samples: int, epochs: int, node_samples_per_s: float, batch_per_node: int,
         grad_bytes: float, gbps: float, exposure: float, wait_share: float, usd_per_node_hour: float, setup_s: float,
         latency_s: float = EC2_LATENCY_S) -> list[PlanRow]:
    """Predicted rate, time and cost per cluster size. Wall time adds the cluster's setup
    (launch and bootstrap), which is billed too."""
    rows = []
    for nodes in nodes_list:
        allreduce = ring_allreduce_seconds(grad_bytes, nodes, gbps, latency_s)
        waits = wait_share if nodes > 1 else 0.0
        rate = nodes * batch_per_node / step_seconds(batch_per_node, node_samples_per_s, allreduce, exposure, waits)
        train = epochs * train_samples / rate
        wall = train + setup_s
        rows.append(PlanRow(nodes, rate, rate / (nodes * node_samples_per_s), allreduce, train, wall,
                            nodes * usd_per_node_hour * wall / 3600))
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
