"""The provider interface, declared once. `aws`, `local` and `ssh` (provision/hosts.py: servers
you already have) implement it with these signatures.

    launch(state)     create every resource; record each id in `state` and save it
                      *before* moving on, so an interruption never loses one
    wait(state)       return once every node accepts SSH (AWS: passed status checks)
    terminate(state)  delete everything the cluster owns; idempotent; works from tags
                      (AWS) or pids (local) even when `state` lists nothing; ssh: stops
                      what ftc started on each host and removes what it put there
    query(state)      what really exists, per node: a list of NodeStatus
    confirm(state, yes)  optional, before anything exists: check, show, ask (aws: the price;
                      ssh: every host's checks and host key); refuses with UsageError

Only the orchestrator (provision/cluster.py) calls these; it owns rollback.
"""

from dataclasses import dataclass
from types import ModuleType


@dataclass
class NodeStatus:
    id: str
    state: str  # running | pending | dead | terminated | missing | unknown (the provider could not be asked)
    detail: str = ""


def get(provider: str) -> ModuleType:
    if provider == "aws":
        from . import aws
        return aws
    if provider == "ssh":
        from . import hosts
        return hosts
    from . import local
    return local
