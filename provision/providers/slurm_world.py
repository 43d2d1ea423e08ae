"""What the slurm provider owns: its own settings (PARTITION, ACCOUNT, QOS, CONSTRAINT, LOGIN), the rule
that a Slurm cluster needs a PARTITION, and the reader of an allocation's notice. Its verbs are in
slurm.py; shared code reads these through the registry (records.py).
"""

import re
from typing import TYPE_CHECKING, Any

from runner.node import slurm_notice
from runner.node.spot import SpotReader

from ..errors import UsageError
from ..values import host_label, label, parse_host
from .records import Provider, Setting, SlurmResources, Traits, World

if TYPE_CHECKING:
    from ..spec import ClusterSpec


def _slurm_name(key: str, raw: Any) -> str:
    value = str(raw).strip()
    if value and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,63}", value):
        raise UsageError(f"{label(key)}={raw!r} is not a Slurm name; allowed: up to 64 letters, digits and _.+- "
                         "(not starting with . + or -)")
    return value


def _constraint(key: str, raw: Any) -> str:
    value = str(raw).strip()
    if value and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.&|,:*()\[\]-]{0,199}", value):
        raise UsageError(f"{label(key)}={raw!r} is not a Slurm constraint; allowed: node features joined by & | , "
                         "(letters, digits and _.:*()[]-), as sbatch --constraint takes them")
    return value


def _login(key: str, raw: Any) -> str:
    value = str(raw).strip()
    if not value:
        return ""
    try:
        user, host, port = parse_host(value)
    except ValueError:
        raise UsageError(f"{label(key)}={raw!r} is not a login node; allowed: user@host[:port] (user and port "
                         "optional: yours and 22)") from None
    return host_label(user, host, port)


def check(spec: "ClusterSpec") -> None:
    """A Slurm cluster needs the partition its allocation is asked of: Slurm has no default ftc could rely on."""
    if not spec.settings["partition"]:
        raise UsageError(f"{label('provider')}={spec.provider!r} needs {label('partition')}: the Slurm partition to "
                         "ask for nodes (`sinfo -s` lists them)")


SETTINGS = {
    "partition": Setting(_slurm_name, "", "slurm: the partition to ask for an allocation of NODES nodes"),
    "account": Setting(_slurm_name, "", "slurm: the account the allocation is charged to (default: the site's)"),
    "qos": Setting(_slurm_name, "", "slurm: the quality of service of the allocation (default: the site's)"),
    # node features, e.g. "sapphirerapids&ib"
    "constraint": Setting(_constraint, "", "slurm: node features the allocation needs, as sbatch --constraint "
                                           "takes them"),
    # whose sbatch, squeue and scancel ftc runs over ssh; "": this machine's
    "login": Setting(_login, "", "slurm: user@host[:port] of a login node whose sbatch ftc runs (default: this "
                                 "machine's)"),
}

SLURM = Provider(
    name="slurm",
    module="provision.providers.slurm",
    traits=Traits(resources=SlurmResources, instance_types=False, billed=False, shares_this_machine=False,
                  own_hosts=True, user_login=True, user_stack_python=True, found_by_tag=False, scheduler=True),
    world=World(
        title="Slurm",
        settings=SETTINGS,
        check=check,
        cluster_called="a Slurm cluster",
        # SIGTERM before a preemption or the time limit, turned into a notice on node 0 by the batch script
        spot_reader=SpotReader(slurm_notice.READER, slurm_notice.NODE_DIR),
        notice_without_spot=True,
    ),
)
