"""TinyCloud's side of a spot node: how it hears its reclaim notice. Standard library only, as every node
program is: ftc ships this file with its own node programs, because TinyCloud's World names it.

TinyCloud announces a reclaim by a file, `preempted` (the reclaim's time in it), in its metadata folder;
a reclaim takes one node, so the first node to read the notice takes it (renames it away) and the nodes
of the recreated cluster see none, as on EC2 the reclaimed instance alone is told.
"""

import os
from pathlib import Path

NOTICE = "preempted"
TAKEN = "preempted.taken"


def read_notice(endpoint: str, timeout: float = 2.0) -> dict | None:
    """The pending notice at `endpoint` (file:///<folder>), taken by this node, or None while there is none."""
    if not endpoint.startswith("file://"):
        raise ValueError(f"TinyCloud's metadata is a file:// folder, not {endpoint!r}")
    folder = Path(endpoint.removeprefix("file://"))
    try:
        os.rename(folder / NOTICE, folder / TAKEN)  # atomic: one node takes it
    except FileNotFoundError:
        return None
    return {"action": "preempt", "time": (folder / TAKEN).read_text().strip()}
