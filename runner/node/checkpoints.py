"""A job's checkpoints: every rank's random state, the model, optimizer and schedule, and where in
its epoch the job stood; saved by rank 0, and resumed from by every rank. `training`: train.Training.
"""

import os
import random

import torch
import torch.distributed as dist

from .protocol import CheckpointSaved, checkpoint_line

# Where an epoch stands: batches done, their summed loss and count. At an epoch's start, none.
EPOCH_START = {"batch": 0, "loss": 0.0, "steps": 0}


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def save_all(training, epochs_done: int, position: dict, batch: int | None = None) -> None:
    """Every rank's RNG (dropout masks differ by rank): a resumed run then matches an
    uninterrupted one. `position`: how far into the next epoch (a mid-epoch stop, after `batch`)."""
    rng = [None] * training.env.world_size
    if training.env.world_size > 1:
        dist.all_gather_object(rng, rng_state())
    else:
        rng = [rng_state()]
    if training.env.master:
        save_checkpoint(training, epochs_done, rng, position)
        training.log.info(checkpoint_line(CheckpointSaved(epochs_done, str(training.checkpoint), batch)))


def save_checkpoint(training, epochs_done: int, rng: list, position: dict) -> None:
    path = training.checkpoint
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"model": training.model.state_dict(), "optimizer": training.optimizer.state_dict(),
                "scheduler": training.scheduler.state_dict(), "epoch": epochs_done, "step": training.step,
                "history": training.history, "rng": rng, "position": position}, tmp)
    os.replace(tmp, path)  # a crash mid-save leaves the previous checkpoint whole


def resume(training) -> None:
    """Rank 0 reads the checkpoint (only its node has it) and sends it to the other ranks; the run
    goes on from where it was saved."""
    path, env = training.checkpoint, training.env
    box = [torch.load(path, weights_only=False) if env.master and path.exists() else None]
    if env.world_size > 1:
        dist.broadcast_object_list(box, src=0)
    checkpoint = box[0]
    if checkpoint is None:
        raise SystemExit(f"--resume: no checkpoint at {path}; start without --resume")
    training.model.load_state_dict(checkpoint["model"])
    training.optimizer.load_state_dict(checkpoint["optimizer"])
    training.scheduler.load_state_dict(checkpoint["scheduler"])
    rng = checkpoint.get("rng") or []
    if len(rng) == env.world_size:  # the same layout as the run that saved it: continue its random streams
        torch.set_rng_state(rng[env.rank]["torch"])
        random.setstate(rng[env.rank]["python"])
    position = checkpoint.get("position") or EPOCH_START  # checkpoints from before mid-epoch stops
    training.log.info(f"resumed from {path}: epoch {checkpoint['epoch']}, batch {position['batch']}, step {checkpoint['step']}")
    training.start_epoch, training.step, training.history, training.resumed_at = (checkpoint["epoch"], checkpoint["step"],
                                                               checkpoint["history"], position)
