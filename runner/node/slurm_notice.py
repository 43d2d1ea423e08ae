"""A Slurm allocation's notice that it is about to end, read on a node as a spot node's reclaim notice is.

Slurm sends the allocation's batch script SIGTERM before it preempts the job (its GraceTime), when an admin
cancels it, and, asked by ftc's sbatch --signal, a margin before its time limit. The batch script
(provision/providers/slurm.py's batch_script) then writes NOTICE_FILE into its node's ftc directory (node
0's), in the shape of EC2's instance-action, {"action": "terminate", "time": "<UTC>", "source": "slurm"},
and holds the allocation until Slurm ends it: the time the job has to checkpoint. The notice goes with
that directory when the cluster is taken down. Standard library only: this runs on the nodes.
"""

import json
import os
from pathlib import Path

NOTICE_FILE = "slurm_notice.json"  # in the node's ftc directory (FTC_NODE_DIR), written whole by a rename


def notice(node_dir: str = "") -> dict | None:
    """The pending notice in `node_dir` (default: this node's, FTC_NODE_DIR), {"action": "terminate", ...},
    or None: none yet, or this node is not the one that hears it (node 0 is; a job asks whether any node
    has seen one)."""
    try:
        return json.loads((Path(node_dir or os.environ["FTC_NODE_DIR"]) / NOTICE_FILE).read_text())
    except FileNotFoundError:
        return None
