"""ftc's row-wise all-reduce of the word embeddings' gradient equals DDP's dense one:
two real gloo ranks, each with its own batch of token ids."""

import pytest
import torch
import torch.distributed as dist
from helpers import on_two_gloo_ranks

from runner.node import ddp

pytestmark = pytest.mark.slow


def _rank(rank: int, rendezvous: str, compress: bool, out: dict) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(1000, 16, padding_idx=0)
    ids = torch.tensor([[5, 9, 9, 0], [17, 5, 0, 0]]) if rank == 0 else torch.tensor([[700, 5, 3, 999]])
    embedding(ids).pow(2).sum().mul(rank + 1).backward()
    dense = embedding.weight.grad.clone()
    dense = (dense.to(torch.bfloat16) if compress else dense).div_(2)
    dist.all_reduce(dense)
    sync = ddp.UsedRowsSync(embedding.weight, compress)  # its two stages at once, after backward
    sync.agree(ids)
    sync.finish()
    out[rank] = (embedding.weight.grad.clone(), dense.to(torch.float32))
    dist.destroy_process_group()


@pytest.mark.parametrize("compress", [False, True], ids=["fp32", "bf16"])
def test_used_rows_allreduce_equals_the_dense_one(compress, tmp_path):
    results = on_two_gloo_ranks(_rank, tmp_path / "rendezvous", compress)
    for rank in (0, 1):
        rows, dense = results[rank]
        assert torch.equal(rows, dense), rank
    assert torch.equal(results[0][0], results[1][0])  # every rank holds the same average
    used = results[0][0].abs().sum(1).nonzero().squeeze(1).tolist()
    assert used == [3, 5, 9, 17, 700, 999]  # padding (row 0) has no gradient; rows no rank used stay zero
