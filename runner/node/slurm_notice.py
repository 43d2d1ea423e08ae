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
NODE_DIR = "node-dir"  # the endpoint that means this node's own ftc directory, wherever it is on the node


def notice(endpoint: str = NODE_DIR, timeout: float = 0.0) -> dict | None:
    """The pending notice in the directory `endpoint` names (NODE_DIR: this node's, FTC_NODE_DIR),
    {"action": "terminate", ...}, or None: none yet, or this node is not the one that hears it (node 0 is;
    a job asks whether any node has seen one). A file read: `timeout` (a reader's argument) is not needed."""
    node_dir = os.environ["FTC_NODE_DIR"] if endpoint == NODE_DIR else endpoint
    try:
        return json.loads((Path(node_dir) / NOTICE_FILE).read_text())
    except FileNotFoundError:
        return None


READER = f"{__name__}:{notice.__name__}"  # SpotReader.read of Slurm's notice (provision/providers' Slurm World)
