"""What the slurm provider owns: its own settings (PARTITION, ACCOUNT, QOS, CONSTRAINT, LOGIN), the rule
that a Slurm cluster needs a PARTITION, and the reader of an allocation's notice. Its verbs are in
slurm.py; shared code reads these through the registry (records.py).
"""

from typing import TYPE_CHECKING, Any

from runner.node import slurm_notice
from runner.node.spot import SpotReader

from ..errors import UsageError
from ..values import host_label, label, parse_host
from .records import NameForm, Provider, Setting, SlurmResources, Traits, World

if TYPE_CHECKING:
    from ..spec import ClusterSpec


SLURM_NAME = NameForm(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,63}", "a Slurm name",
                      "up to 64 letters, digits and _.+- (not starting with . + or -)")
CONSTRAINT = NameForm(r"[A-Za-z0-9_][A-Za-z0-9_.&|,:*()\[\]-]{0,199}", "a Slurm constraint",
                      "node features joined by & | , (letters, digits and _.:*()[]-), as sbatch --constraint takes them")


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
    "partition": Setting(SLURM_NAME.parse, "", "slurm: the partition to ask for an allocation of NODES nodes"),
    "account": Setting(SLURM_NAME.parse, "", "slurm: the account the allocation is charged to (default: the site's)"),
    "qos": Setting(SLURM_NAME.parse, "", "slurm: the quality of service of the allocation (default: the site's)"),
    # node features, e.g. "sapphirerapids&ib"
    "constraint": Setting(CONSTRAINT.parse, "", "slurm: node features the allocation needs, as sbatch --constraint "
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
        cost_note="a Slurm allocation",
        max_hours_means="the allocation's time limit",
    ),
)
