"""A Slurm allocation's notice that it is about to end, read on a node as a spot node's reclaim notice is.

Slurm sends the allocation's batch script SIGTERM before it preempts the job (its GraceTime), when an admin
cancels it, and, asked by ftc's sbatch --signal, a margin before its time limit. The batch script
(provision/providers/slurm.py's batch_script) then writes notice_path(job id) on its node, node 0, in the
shape of EC2's instance-action, {"action": "terminate", "time": "<UTC>", "source": "slurm"}, and holds the
allocation until Slurm ends it: the time the job has to checkpoint. Standard library only: this runs on
the nodes.
"""

import json
from pathlib import Path


def notice_path(job_id: str) -> str:
    """Where node 0's batch script writes the notice of allocation `job_id` (the node's own /tmp)."""
    return f"/tmp/ftc-notice-{job_id}.json"  # noqa: S108 - on the node, written whole by a rename


def notice(job_id: str) -> dict | None:
    """The pending notice of allocation `job_id` ({"action": "terminate", ...}), or None: none yet, or this
    node is not the one that hears it (node 0 is; a job asks whether any node has seen one)."""
    try:
        return json.loads(Path(notice_path(job_id)).read_text())
    except FileNotFoundError:
        return None
