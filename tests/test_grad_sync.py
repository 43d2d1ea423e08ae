"""ftc's after-backward all-reduce with a speed-balanced split gives every rank the gradient of
the whole global batch's mean loss, as one process computing it alone would: two real gloo
ranks holding 5 and 3 rows of an 8-row batch."""

import pytest
import torch
import torch.distributed as dist
from helpers import on_two_gloo_ranks

from runner.node import ddp

pytestmark = pytest.mark.slow


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))


def data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(8, 6, generator=generator), torch.randint(0, 2, (8,), generator=generator)


def _rank(rank: int, rendezvous: str, compress: bool, out: dict) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    net = model()
    if rank == 1:  # a different start: broadcast_weights must make the ranks identical
        with torch.no_grad():
            for p in net.parameters():
                p.add_(1.0)
    ddp.broadcast_weights(net)
    x, y = data()
    counts = ddp.balanced_counts(8, [5.0, 3.0])
    mine = ddp.deal(list(range(8)), counts)[rank]
    share = len(mine) * 2 / 8  # as train.py weights each rank's mean loss
    (torch.nn.functional.cross_entropy(net(x[mine]), y[mine]) * share).backward()
    sync = ddp.GradSync(list(net.parameters()), compress, bucket_mb=0.00005)  # several buckets
    assert len(sync.buckets) > 1
    balance = ddp.RankBalance(2, adapt=True)
    waited = balance.exchange(len(mine), 0.5 if rank == 0 else 1.0)
    sync.average()
    out[rank] = ([p.grad.clone() for p in net.parameters()], counts, balance.counts(8), waited)
    dist.destroy_process_group()


@pytest.mark.parametrize("compress", [False, True], ids=["fp32", "bf16"])
def test_balanced_split_averages_to_the_whole_batch_gradient(compress, tmp_path):
    results = on_two_gloo_ranks(_rank, tmp_path / "rendezvous", compress)
    net = model()
    x, y = data()
    torch.nn.functional.cross_entropy(net(x), y).backward()
    whole = [p.grad for p in net.parameters()]
    tolerance = 2e-2 if compress else 1e-6  # bf16 keeps 8 bits of mantissa on the wire
    for rank in (0, 1):
        grads, counts, next_counts, waited = results[rank]
        assert counts == [5, 3]
        for got, want in zip(grads, whole):
            assert torch.allclose(got, want, atol=tolerance, rtol=tolerance), (rank, got, want)
        # rank 0 did 5 rows in 0.5 s, rank 1 3 rows in 1 s: the next split follows (10 : 3 rows/s)
        assert next_counts == [6, 2] and waited >= 0
    assert all(torch.equal(a, b) for a, b in zip(results[0][0], results[1][0]))  # every rank holds the same


# ---- PowerSGD: low-rank factors with error feedback ------------------------------------------------

def _grads(rank: int, step: int, low: bool) -> list[torch.Tensor]:
    """This rank's gradients at a step: a 12 x 10 matrix (of rank 2 when `low`, else full) and a
    vector, different on each rank and step."""
    generator = torch.Generator().manual_seed(100 * step + rank)
    matrix = (torch.randn(12, 2, generator=generator) @ torch.randn(2, 10, generator=generator) if low
              else torch.randn(12, 10, generator=generator))
    return [matrix, torch.randn(7, generator=generator)]


def _low_rank_rank(rank: int, rendezvous: str, low: bool, steps: int, out: dict) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    params = [torch.nn.Parameter(torch.zeros(12, 10)), torch.nn.Parameter(torch.zeros(7))]
    sync = ddp.LowRankSync(params, rank=4, seed=0, bucket_mb=25.0)
    assert [p is params[0] for p in sync.matrices] == [True]  # the vector crosses whole
    applied = [torch.zeros(12, 10), torch.zeros(7)]
    for step in range(steps):
        for p, g in zip(params, _grads(rank, step, low)):
            p.grad = g.clone()
        sync.average()
        for total, p in zip(applied, params):
            total += p.grad
    out[rank] = (applied, sync.errors[0].clone())
    dist.destroy_process_group()


def _mean_sum(steps: int, low: bool) -> list[torch.Tensor]:
    """The sum over steps of the two ranks' averaged gradients: what exact averaging applies."""
    per_step = [[(a + b) / 2 for a, b in zip(_grads(0, s, low), _grads(1, s, low))] for s in range(steps)]
    return [sum(step[i] for step in per_step) for i in (0, 1)]


def test_powersgd_is_exact_on_a_low_rank_average(tmp_path):
    """Each rank's matrix is of rank 2, so their average is of rank at most 4: one power iteration
    at rank 4 recovers it exactly, and nothing is left for error feedback."""
    results = on_two_gloo_ranks(_low_rank_rank, tmp_path / "rendezvous", True, 1)
    want = _mean_sum(1, True)
    for rank in (0, 1):
        applied = results[rank][0]
        assert torch.allclose(applied[0], want[0], atol=1e-4), (applied[0] - want[0]).abs().max()
        assert torch.allclose(applied[1], want[1], atol=2e-2)  # bf16 on the wire
    # each rank's error is its own gradient less the average; together they hold nothing back
    assert ((results[0][1] + results[1][1]) / 2).abs().max() < 1e-4


def test_powersgd_loses_nothing_with_error_feedback(tmp_path):
    """Full-rank gradients are approximated, not averaged, at each step; but what every step applied
    plus what the ranks still hold back (their errors, averaged) is exactly the sum of the averages."""
    results = on_two_gloo_ranks(_low_rank_rank, tmp_path / "rendezvous", False, 3)
    want = _mean_sum(3, False)
    applied = results[0][0][0]
    assert torch.equal(applied, results[1][0][0])  # every rank applies the same update
    assert not torch.allclose(applied, want[0], atol=1e-2)  # an approximation, step by step
    held_back = (results[0][1] + results[1][1]) / 2
    assert torch.allclose(applied + held_back, want[0], atol=1e-4), (applied + held_back - want[0]).abs().max()
