"""Batching of the training program: every rank in step, every example used, each global batch
split among ranks by their speed (pure functions of runner/node/ddp.py)."""

import random

import pytest

from runner.node import ddp


def test_grouped_batches_keep_ranks_in_step_and_cover_every_example():
    rng = random.Random(0)
    lengths = [rng.randint(8, 128) for _ in range(1000)]
    world = 4
    batches = ddp.global_batches(1000, lengths, 8, world, True, seed=3)
    per_rank = [[ddp.deal(b, ddp.even_counts(len(b), world))[r] for b in batches] for r in range(world)]
    seen = sorted(i for batches in per_rank for batch in batches for i in batch)
    assert set(seen) == set(range(1000)) and len(seen) == 1000
    spread = [max(max(lengths[i] for i in per_rank[r][s]) for r in range(world))
              - min(max(lengths[i] for i in per_rank[r][s]) for r in range(world)) for s in range(len(batches))]
    assert sum(spread) / len(spread) < 2  # the longest sequence of each rank's batch: nearly equal


def test_ungrouped_batches_dealt_evenly_split_like_distributed_sampler():
    batches = ddp.global_batches(10, [1] * 10, 2, 3, False, seed=1)
    order = [i for b in batches for i in b]
    assert len(order) == 12 and set(order) == set(range(10))  # padded to a multiple of the world size
    for rank in range(3):
        mine = [i for b in batches for i in ddp.deal(b, ddp.even_counts(len(b), 3))[rank]]
        assert mine == order[rank::3]  # DistributedSampler's rows for this rank, in its order


@pytest.mark.parametrize("size, rates, counts", [
    (128, [1.0, 1.0, 1.0, 1.0], [32, 32, 32, 32]),
    (128, [31.6, 29.3, 25.5, 28.3], [35, 33, 28, 32]),  # four simulated nodes' core sets, measured alone
    (4, [1.0, 100.0, 1.0, 1.0], [1, 1, 1, 1]),  # never an empty batch
    (10, [3.0, 1.0], [7, 3]),
])
def test_balanced_counts_follow_the_rates_and_add_up(size, rates, counts):
    assert ddp.balanced_counts(size, rates) == counts


def test_deal_gives_each_rank_its_count_and_the_same_span_of_lengths():
    batch = list(range(100))  # a global batch sorted longest first: row i is the i-th longest
    hands = ddp.deal(batch, [40, 30, 20, 10])
    assert [len(h) for h in hands] == [40, 30, 20, 10]
    assert sorted(i for h in hands for i in h) == batch
    assert all(h[0] < 4 for h in hands)  # every rank holds one of the longest rows: one width for all
    assert ddp.deal(list(range(8)), [2, 2, 2, 2]) == [[0, 4], [1, 5], [2, 6], [3, 7]]  # even: round robin
