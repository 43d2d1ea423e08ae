"""`ftc plan`: how long a fine-tuning job takes on N nodes of an instance type, and what it
costs, before anything is launched. Pure functions; the numbers come in as arguments.

The model: each node trains its share of every global batch at a measured per-node rate
(a bench result), then the nodes average their gradients with a ring all-reduce over the
instance's network. The ring moves 2(N-1)/N of the gradient bytes through every node's
link, plus one latency per hop; DDP starts it bucket by bucket during the backward pass,
so part of it hides behind the backward pass (about 2/3 of a step's compute). How much
hides is measured, not assumed: `ftc bench` fits it on simulated nodes, where gloo's threads
compete with the compute threads for the same cores (0.23 there); real nodes, whose NIC
moves the bytes, can only hide more, so the plan errs on the slow side.
"""

from dataclasses import dataclass

# Training examples per GLUE task (the canonical train splits).
GLUE_TRAIN_SIZES = {"cola": 8551, "sst2": 67349, "mrpc": 3668, "stsb": 5749, "qqp": 363846,
                    "mnli": 392702, "qnli": 104743, "rte": 2490}
# distilbert-base-uncased with a 2-label head (transformers' DistilBertConfig); tests recount it.
DISTILBERT_PARAMS = 66_955_010
BACKWARD_SHARE = 2 / 3  # of a step's FLOPs: forward 2, backward 4 per parameter and token
EC2_LATENCY_S = 50e-6  # one hop inside a cluster placement group


def gradient_bytes(bf16: bool, params: int = DISTILBERT_PARAMS) -> float:
    """The bytes one all-reduce moves: bf16 gradients where training is bf16, fp32 elsewhere."""
    return params * (2 if bf16 else 4)


def ring_allreduce_seconds(nbytes: float, nodes: int, gbps: float, latency_s: float = EC2_LATENCY_S) -> float:
    """One ring all-reduce of `nbytes` across `nodes`, each with `gbps` of bandwidth."""
    if nodes <= 1:
        return 0.0
    return 2 * (nodes - 1) / nodes * nbytes / (gbps * 1e9 / 8) + 2 * (nodes - 1) * latency_s


def step_seconds(batch_per_node: int, node_samples_per_s: float, allreduce_s: float, hidden_share: float) -> float:
    """A step's compute, plus the all-reduce less the share of it the backward pass hides
    (never more than the backward pass itself)."""
    compute = batch_per_node / node_samples_per_s
    hidden = min(hidden_share * allreduce_s, BACKWARD_SHARE * compute)
    return compute + allreduce_s - hidden


def hidden_share_from(step_s: float, batch_per_node: int, node_samples_per_s: float, allreduce_s: float) -> float:
    """The share of the all-reduce a measured step hid behind compute: the model run backwards."""
    exposed = step_s - batch_per_node / node_samples_per_s
    return min(1.0, max(0.0, 1 - exposed / allreduce_s)) if allreduce_s > 0 else 1.0


def bandwidth_from(allreduce_s: float, nbytes: float, nodes: int, latency_s: float = 0.0) -> float:
    """The bandwidth (Gbit/s) a measured all-reduce time implies: the model run backwards."""
    moved = 2 * (nodes - 1) / nodes * nbytes
    return moved * 8 / 1e9 / max(1e-9, allreduce_s - 2 * (nodes - 1) * latency_s)


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
         grad_bytes: float, gbps: float, hidden_share: float, usd_per_node_hour: float, setup_s: float,
         latency_s: float = EC2_LATENCY_S) -> list[PlanRow]:
    """Predicted rate, time and cost per cluster size. Wall time adds the cluster's setup
    (launch and bootstrap), which is billed too."""
    rows = []
    for nodes in nodes_list:
        allreduce = ring_allreduce_seconds(grad_bytes, nodes, gbps, latency_s)
        rate = nodes * batch_per_node / step_seconds(batch_per_node, node_samples_per_s, allreduce, hidden_share)
        train = epochs * train_samples / rate
        wall = train + setup_s
        rows.append(PlanRow(nodes, rate, rate / (nodes * node_samples_per_s), allreduce, train, wall,
                            nodes * usd_per_node_hour * wall / 3600))
    return rows
