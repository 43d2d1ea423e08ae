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
