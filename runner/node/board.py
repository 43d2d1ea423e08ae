"""Rank 0's TensorBoard event files: the loss, learning rate and throughput of logged steps, and each
dev metric at the step it was measured, in <output-dir>/tensorboard (they come home with the results).
"""

import math
from pathlib import Path

from .protocol import TENSORBOARD_DIR


def open_board(out_dir: Path, env):
    """Rank 0's TensorBoard writer into <output-dir>/tensorboard (fetched with the results), None elsewhere."""
    if not env.master:
        return None
    from torch.utils.tensorboard import SummaryWriter
    return SummaryWriter(str(out_dir / TENSORBOARD_DIR))


def to_board(board, step: int, values: dict[str, float | None]) -> None:
    """Scalars at `step`, flushed at once: a job that stops early (a spot notice, a crash) keeps them."""
    if board is None:
        return
    for tag, value in values.items():
        if value is not None and math.isfinite(value):
            board.add_scalar(tag, value, step)
    board.flush()
