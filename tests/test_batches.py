"""Batching of the training program: every rank in step, every example used."""

import random

from runner.node import ddp


def test_grouped_batches_keep_ranks_in_step_and_cover_every_example():
    rng = random.Random(0)
    lengths = [rng.randint(8, 128) for _ in range(1000)]
    world = 4
    per_rank = [ddp.make_batches(1000, lengths, 8, r, world, True, seed=3) for r in range(world)]
    assert len({len(b) for b in per_rank}) == 1  # the same number of steps on every rank
    seen = sorted(i for batches in per_rank for batch in batches for i in batch)
    assert set(seen) == set(range(1000)) and len(seen) == 1000
    spread = [max(max(lengths[i] for i in per_rank[r][s]) for r in range(world))
              - min(max(lengths[i] for i in per_rank[r][s]) for r in range(world)) for s in range(len(per_rank[0]))]
    assert sum(spread) / len(spread) < 5  # the longest sequence of each rank's batch: nearly equal


def test_ungrouped_batches_split_like_distributed_sampler():
    per_rank = [ddp.make_batches(10, [1] * 10, 2, r, 3, False, seed=1) for r in range(3)]
    assert [sum(len(b) for b in batches) for batches in per_rank] == [4, 4, 4]  # padded to 12
    assert set(i for batches in per_rank for b in batches for i in b) == set(range(10))
