"""What DistributedDataParallel needs from ftc: the batches every rank draws in step, their
padding, and the gradient all-reduce's refinements (bf16 on the wire, only the word embeddings'
used rows, and PowerSGD's low-rank factors on request).
"""

import random
import time

import torch
import torch.distributed as dist


def global_batches(n: int, lengths: list[int], batch_size: int, world: int, group: bool,
                   seed: int) -> list[list[int]]:
    """One epoch's global batches (batch_size x world rows each), from one shuffled order that
    every rank draws alike; `deal` then gives each rank its rows of each.

    The order is padded to a multiple of the world size, as DistributedSampler pads it, so
    every rank gets at least one row of every global batch. Length-grouped (ftc): mega-batches
    of 50 global batches are sorted by length and cut into global batches, whose order is
    shuffled; each global batch stays sorted, longest first, so that `deal` can give every rank
    the same mix of lengths. Ungrouped (the seed recipe), dealt evenly, each rank gets exactly
    DistributedSampler's rows (order[rank::world]) in its batches.
    """
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=generator).tolist()
    pad = (-len(order)) % world
    order += (order * (pad // max(1, len(order)) + 1))[:pad]  # cyclically: fewer rows than ranks too
    step = batch_size * world
    if not group:
        return [order[i:i + step] for i in range(0, len(order), step)]
    batches = []
    for start in range(0, len(order), step * 50):
        chunk = sorted(order[start:start + step * 50], key=lengths.__getitem__, reverse=True)
        batches += [chunk[i:i + step] for i in range(0, len(chunk), step)]
    random.Random(seed).shuffle(batches)
    return batches


def even_counts(size: int, world: int) -> list[int]:
    """`size` rows split as evenly as whole rows allow (the first ranks take the remainder)."""
    return [size // world + (r < size % world) for r in range(world)]


def balanced_counts(size: int, rates: list[float]) -> list[int]:
    """`size` rows split in proportion to each rank's rate (rows per second), at least one each,
    by largest remainder, so the counts add up to `size`. Pure: every rank computes the same
    split from the same all-gathered rates, so no rank has to be told its share."""
    world = len(rates)
    spare = size - world  # one row each first: no rank may run an empty batch
    total = sum(rates)
    ideal = [spare * r / total for r in rates]
    counts = [1 + int(x) for x in ideal]
    by_remainder = sorted(range(world), key=lambda r: (-(ideal[r] - int(ideal[r])), r))
    for r in by_remainder[:size - sum(counts)]:
        counts[r] += 1
    return counts


def deal(batch: list[int], counts: list[int]) -> list[list[int]]:
    """Rank r's rows of a length-sorted global batch: `counts[r]` of them, dealt like cards so that
    every rank's rows span the same range of lengths: each rank is dealt one of the `world`
    longest rows first (so all pad to about the same width, and none waits at the all-reduce for
    another's longer rows), then each row goes to the rank furthest behind its share. With even
    counts this is round robin: rank r takes batch[r::world]."""
    size, world = len(batch), len(counts)
    hands: list[list[int]] = [[row] for row in batch[:world]]
    for j, row in enumerate(batch[world:], start=world):
        behind = [(counts[r] * (j + 1) / size - len(hands[r]), -r) for r in range(world) if len(hands[r]) < counts[r]]
        hands[-max(behind)[1]].append(row)
    return hands


def collate(data: dict, indices: list[int], pad_id: int, pad_to: int) -> dict[str, torch.Tensor]:
    """Pad to the longest in the batch, rounded up to a multiple of 8 (fewer kernel shapes),
    or to `pad_to` (the seed recipe)."""
    longest = max(data["lengths"][i] for i in indices)
    width = pad_to or (longest + 7) // 8 * 8
    ids = torch.full((len(indices), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(indices), width), dtype=torch.long)
    extra = {k: torch.zeros((len(indices), width), dtype=torch.long) for k in data["extra"]}
    for row, i in enumerate(indices):
        n = data["lengths"][i]
        ids[row, :n] = torch.tensor(data["input_ids"][i])
        mask[row, :n] = 1
        for key, values in data["extra"].items():
            extra[key][row, :n] = torch.tensor(values[i])
    return {"input_ids": ids, "attention_mask": mask, **extra}


class RankBalance:
    """Keeps ranks even: after each backward, every rank all-gathers how fast it computed (rows per
    second, smoothed), and the next global batch is split in those proportions (balanced_counts).

    Simulated nodes' core sets measured 31.6, 29.3, 25.5 and 28.3 samples/s alone (`ftc bench`), and a
    synchronous step runs at the slowest rank's pace; real nodes differ too (noisy neighbours,
    thermal limits). Every rank still averages the same global batch's gradient (train.py scales
    each rank's loss by its share), so the update is the one an even split would make. The
    all-gather is also where a rank waits for the slowest: its duration is the timeline's wait.
    `even` keeps the split even and only measures."""

    SMOOTHING = 0.3  # weight of the newest step in each rank's rate

    def __init__(self, world: int, adapt: bool):
        self.world, self.adapt = world, adapt
        self.rates: list[float] | None = None

    def counts(self, size: int) -> list[int]:
        if not self.adapt or self.rates is None:
            return even_counts(size, self.world)
        return balanced_counts(size, self.rates)

    def exchange(self, rows: int, seconds: float) -> float:
        """Share this step's rate and learn the others'; returns the seconds spent waiting."""
        started = time.perf_counter()
        mine = torch.tensor([rows / max(seconds, 1e-6)], dtype=torch.float64)
        every = [torch.zeros_like(mine) for _ in range(self.world)]
        dist.all_gather(every, mine)
        waited = time.perf_counter() - started
        latest = [float(t) for t in every]
        self.rates = latest if self.rates is None else [
            (1 - self.SMOOTHING) * old + self.SMOOTHING * new for old, new in zip(self.rates, latest)]
        return waited


class GradSync:
    """Average the gradient across ranks after backward, all buckets in flight at once.

    DDP starts each bucket's all-reduce during backward, so gloo's threads run on the cores the
    compute threads are using: the bench measured a 66M-element gloo all-reduce at 0.17 s with idle
    cores and 1.7 s beside compute. Here backward finishes first; then each bucket is copied into
    its own buffer (bf16 when compressing: half the bytes) and started as soon as it is filled,
    so the copies of later buckets overlap the transfer of earlier ones."""

    def __init__(self, params: list[torch.Tensor], compress: bool, bucket_mb: float):
        self.params, self.world = params, dist.get_world_size()
        dtype = torch.bfloat16 if compress else torch.float32
        limit = max(1, int(bucket_mb * 1e6 / dtype.itemsize))
        self.buckets: list[list[torch.Tensor]] = [[]]
        for p in params:
            if self.buckets[-1] and sum(q.numel() for q in self.buckets[-1]) + p.numel() > limit:
                self.buckets.append([])
            self.buckets[-1].append(p)
        self.buckets = [b for b in self.buckets if b]  # none at all: nothing to send
        self.buffers = [torch.empty(sum(p.numel() for p in b), dtype=dtype) for b in self.buckets]

    def start(self) -> list:
        """Fill every bucket's buffer and start its all-reduce; `finish` waits for them."""
        pending = []
        for bucket, buffer in zip(self.buckets, self.buffers):
            offset = 0
            for p in bucket:
                part = buffer[offset:offset + p.numel()]
                part.copy_(p.grad.reshape(-1)) if p.grad is not None else part.zero_()
                offset += p.numel()
            buffer.div_(self.world)  # divided first, so a bf16 sum cannot overflow
            pending.append(dist.all_reduce(buffer, async_op=True))
        return pending

    def finish(self, pending: list) -> None:
        for bucket, buffer, work in zip(self.buckets, self.buffers, pending):
            work.wait()
            offset = 0
            for p in bucket:
                part = buffer[offset:offset + p.numel()].view_as(p)
                if p.grad is None:
                    p.grad = part.to(p.dtype)
                else:
                    p.grad.copy_(part)
                offset += p.numel()

    def average(self) -> None:
        self.finish(self.start())


class LowRankSync:
    """PowerSGD (Vogels, Karimireddy and Jaggi, 2019): each weight matrix's gradient crosses the
    network as two thin factors instead of itself, with error feedback.

    For a gradient M (n x m) and a rank r: P = M Q is all-reduced (n x r), orthogonalized, then
    Q = M^T P is all-reduced (m x r), and P Q^T stands for the average. What it missed (M - P Q^T)
    is added to the next step's gradient, so no part of the gradient is lost, only delayed. Q starts
    random (the same seed on every rank) and is reused from step to step (warm start), so one power
    iteration a step suffices. distilbert's matrices at rank 4 send under 1% of their elements.

    It changes the numerics (an approximate average), so it is an option, never a default. Vectors
    and matrices too small to gain cross whole in bf16 (GradSync), beside the factors' arithmetic.
    The errors and Q are not in checkpoints: a resumed job starts them afresh and drops what was held
    back. PyTorch's powerSGD_hook is DDP's and aborts under gloo when DDP has several buckets; this
    one runs after backward, as GradSync does."""

    def __init__(self, params: list[torch.Tensor], rank: int, seed: int, bucket_mb: float):
        self.world = dist.get_world_size()
        self.matrices = [p for p in params if p.ndim == 2 and (p.shape[0] + p.shape[1]) * rank < p.numel()]
        chosen = {id(p) for p in self.matrices}
        self.whole = GradSync([p for p in params if id(p) not in chosen], True, bucket_mb)
        generator = torch.Generator().manual_seed(seed)
        self.qs = [torch.randn(p.shape[1], rank, generator=generator) for p in self.matrices]
        self.errors = [torch.zeros(p.shape, dtype=torch.float32) for p in self.matrices]

    def _all_average(self, factors: list[torch.Tensor]) -> list[torch.Tensor]:
        """One all-reduce of every factor, packed flat; the averages, in their shapes."""
        flat = torch.cat([f.reshape(-1) for f in factors])
        dist.all_reduce(flat)
        flat.div_(self.world)
        return [part.view_as(f) for part, f in zip(flat.split([f.numel() for f in factors]), factors)]

    def average(self) -> None:
        pending = self.whole.start()
        if not self.matrices:  # a model too small for any factor to gain
            self.whole.finish(pending)
            return
        grads = []
        for p, error in zip(self.matrices, self.errors):
            if p.grad is not None:
                error.add_(p.grad)
            grads.append(error)  # the gradient plus what earlier steps missed
        ps = [torch.linalg.qr(p, mode="reduced").Q
              for p in self._all_average([m @ q for m, q in zip(grads, self.qs)])]
        self.qs = self._all_average([m.T @ p for m, p in zip(grads, ps)])
        for param, m, p, q in zip(self.matrices, grads, ps, self.qs):
            if param.grad is None:
                param.grad = torch.empty_like(m)
            torch.mm(p, q.T, out=param.grad)  # written in place: a step allocates nothing the matrices' size
            m.sub_(param.grad)  # the error: what this step's average missed
        self.whole.finish(pending)


def broadcast_weights(module: torch.nn.Module) -> None:
    """Rank 0's weights and buffers to every rank, so that all start identical (what DDP's
    constructor does)."""
    for tensor in [*module.parameters(), *module.buffers()]:
        dist.broadcast(tensor.data, 0)


def bf16_allreduce_hook(process_group, bucket):
    """Average each gradient bucket in bf16: half the bytes of fp32 on the wire.

    PyTorch's own bf16_compress_hook needs NCCL; this one runs on gloo. The sum is
    divided first, so it cannot overflow bf16's range."""
    group = process_group or dist.group.WORLD
    compressed = bucket.buffer().to(torch.bfloat16).div_(dist.get_world_size(group))
    future = dist.all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(done):
        buffer = bucket.buffer()
        buffer.copy_(done.value()[0])
        return buffer
    return future.then(decompress)


class UsedRowsSync:
    """Average an embedding's gradient across ranks, moving only the rows some rank used.

    Rows no rank used are zero on every rank, so the result equals the dense average. Two
    stages: `agree` (before forward) starts the small all-reduce of a per-row flag that unites
    every rank's rows, so it runs beside forward; `finish` (after backward) all-reduces the rows
    and writes the average back. Starting the rows from a gradient hook during backward instead
    measured 4% slower at 4 ranks (alternating runs, docs/performance.md).
    """

    def __init__(self, weight: torch.Tensor, compress: bool):
        self.weight, self.compress = weight, compress
        self._flags = None

    def agree(self, input_ids: torch.Tensor) -> None:
        used = torch.zeros(self.weight.shape[0], dtype=torch.int32)
        used[input_ids.unique()] = 1
        self._flags = (used, dist.all_reduce(used, async_op=True))

    def finish(self) -> None:
        used, work = self._flags
        self._flags = None
        work.wait()
        rows = used.nonzero().squeeze(1)
        part = self.weight.grad.index_select(0, rows)
        # divided first, as the bucket hook does, so a bf16 sum cannot overflow
        part = (part.to(torch.bfloat16) if self.compress else part).div_(dist.get_world_size())
        dist.all_reduce(part)
        self.weight.grad.index_copy_(0, rows, part.to(self.weight.grad.dtype))
