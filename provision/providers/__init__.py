"""The provider interface, declared once: each verb below is the only full description of what a
provider does, and routes to the provider the state names. `aws` (EC2, boto3), `local` (sshd nodes on
this machine), `ssh` (servers you already have) and `slurm` (the nodes of a Slurm allocation, then
treated as your servers) implement them as plain functions with these signatures (Verbs,
OptionalVerbs); what they can do and need beside the verbs is their Traits, what they own (catalog,
regions, prices, spot notices, checkpoint store) their World (records.py).

The registry (records.py) holds every provider by name: the four built-ins, registered here, and any
FTC_PROVIDERS names (module:attribute of a Provider), so a provider can live outside this package.

Only the orchestrator (provision/cluster.py) calls launch, wait and terminate; it owns rollback and
every save of the state: a verb that creates something calls `record()`, which saves the state, before
its next call to the cloud or the hosts, so an interruption never loses an id.
"""

from importlib import import_module
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .aws_world import AWS
from .records import (
    TRAITS,
    Catalog,
    LocalResources,
    NodeStatus,
    Provider,
    Record,
    SshResources,
    Traits,
    World,
    default_provider,
    default_world,
    names,
    register,
    spec_world,
    store_for,
    traits,
    world,
)
from .records import provider as registered_provider
from .slurm_world import SLURM

if TYPE_CHECKING:
    from ..spec import ClusterSpec
    from ..state import ClusterState, NodeInfo

__all__ = ["TRAITS", "Catalog", "NodeStatus", "catalog", "Provider", "Record", "Traits", "World", "default_provider",
           "default_world", "get", "names", "providers_with", "register", "spec_world", "supports", "traits",
           "world"]


@runtime_checkable
class Verbs(Protocol):
    """The verbs every provider's module has (their descriptions: the routers below)."""

    def launch(self, state: "ClusterState", record: Record) -> None: ...

    def wait(self, state: "ClusterState", record: Record) -> None: ...

    def terminate(self, state: "ClusterState", record: Record) -> None: ...

    def query(self, state: "ClusterState") -> list[NodeStatus]: ...


class OptionalVerbs(Protocol):
    """The verbs a provider may have, each with this signature where it has it (supports() says which)."""

    def confirm(self, state: "ClusterState", yes: bool) -> None: ...

    def check_settings(self) -> None: ...

    def has_credentials(self) -> bool: ...

    def dry_run(self, spec: "ClusterSpec") -> None: ...

    def extend(self, state: "ClusterState", hours: float) -> None: ...

    def store_checkpoint(self, checkpoint: Path, uri: str, job_id: str) -> None: ...

    def catalog(self, region: str, refresh: bool) -> Catalog: ...

    def relay(self, state: "ClusterState", node: "NodeInfo", from_node: bool) -> str: ...


def _verbs_of(protocol: type) -> tuple[str, ...]:
    """The verbs a Protocol above declares, in their order: the Protocol is the one list of them."""
    return tuple(name for name, member in vars(protocol).items() if callable(member) and not name.startswith("_"))


REQUIRED = _verbs_of(Verbs)
OPTIONAL = _verbs_of(OptionalVerbs)

for _built_in in (
    Provider("local", f"{__name__}.local",
             Traits(resources=LocalResources, instance_types=False, billed=False, shares_this_machine=True,
                    own_hosts=False, user_login=False, user_stack_python=False, found_by_tag=False)),
    AWS,
    Provider("ssh", f"{__name__}.own_servers",
             Traits(resources=SshResources, instance_types=False, billed=False, shares_this_machine=False,
                    own_hosts=True, user_login=True, user_stack_python=True, found_by_tag=False),
             World(cost_note="your servers: no cost")),
    SLURM,
):
    register(_built_in)


def get(provider: str) -> ModuleType:
    """The provider's module of verbs; an unknown name is refused in one line (exit 2), never a default."""
    return import_module(registered_provider(provider).module)


def supports(provider: str, verb: str) -> bool:
    """Whether `provider` implements the optional `verb`."""
    if verb not in REQUIRED + OPTIONAL:
        raise ValueError(f"{verb!r} is not a verb of the provider interface")
    return hasattr(get(provider), verb)


def providers_with(verb: str) -> list[str]:
    """Every registered provider that implements the optional `verb`, in the registry's order: what a
    refusal of the verb names as allowed."""
    return [name for name in names() if supports(name, verb)]


# ---- the verbs every provider has ------------------------------------------------------------

def launch(state: "ClusterState", record: Record) -> None:
    """Create every resource and every node (state.nodes); record() after each id, before going on.
    On any failure the orchestrator terminates: what was recorded, and what terminate finds."""
    get(state.provider).launch(state, record)


def wait(state: "ClusterState", record: Record) -> None:
    """Return once every node accepts SSH (AWS: passed both status checks); record() whatever it
    changes in the nodes (addresses, a restarted sshd's port)."""
    get(state.provider).wait(state, record)


def terminate(state: "ClusterState", record: Record) -> None:
    """Delete everything the cluster owns; idempotent; works from tags (AWS) or sshd configs (local)
    even when `state` lists nothing; ssh: stops what ftc started on each host and removes what it put
    there. What cannot be removed now raises FtcError saying what remains; ssh first narrows
    state.nodes to the hosts a later `down` can finish and calls record() (no node left: the state
    is forgotten)."""
    get(state.provider).terminate(state, record)


def query(state: "ClusterState") -> list[NodeStatus]:
    """What really exists, per node of the state, in its order; then one per resource the state records
    that is no node yet (AWS: instances launched by an `up` killed before they joined); a provider
    that cannot be asked says 'unknown'."""
    return get(state.provider).query(state)


# ---- the optional verbs: supports(provider, verb) says which a provider has ---------------------

def confirm(state: "ClusterState", yes: bool) -> None:
    """Before anything exists: check, show, ask (aws: the plan and its price; ssh: every host's key
    and checks), filling state.resources with what launch needs; refuses with UsageError. Nothing to
    confirm where the provider has none."""
    if supports(state.provider, "confirm"):
        get(state.provider).confirm(state, yes)


def check_settings(provider: str) -> None:
    """Every FTC_* tuning variable the provider reads, parsed before anything is created: a bad one
    is one line now (UsageError), not a traceback once nodes exist."""
    if supports(provider, "check_settings"):
        get(provider).check_settings()


def has_credentials(provider: str) -> bool:
    """Whether this machine can ask the provider without a state (AWS: boto3 finds credentials), so
    that `down` searches it by tag (Traits.found_by_tag)."""
    return supports(provider, "has_credentials") and get(provider).has_credentials()


def dry_run(spec: "ClusterSpec") -> None:
    """`ftc up --dry-run` (aws): the plan, the permissions and the quota, creating nothing; FtcError
    naming what is missing. The CLI refuses it first where supports() says no."""
    get(spec.provider).dry_run(spec)


def extend(state: "ClusterState", hours: float) -> None:
    """`ftc extend` (aws): push every node's lifetime watchdog back to `hours` from now. The CLI
    refuses it first where supports() says no."""
    get(state.provider).extend(state, hours)


def store_checkpoint(checkpoint: Path, uri: str, job_id: str) -> None:
    """Copy a job's checkpoint file to the store `uri` names, whatever the cluster's provider (aws:
    s3://bucket/prefix, to <prefix>/<job_id>/last.pt), with the controller's credentials."""
    import_module(store_for("checkpoint_uri", uri).module).store_checkpoint(checkpoint, uri, job_id)


def relay(state: "ClusterState", node: "NodeInfo", from_node: bool = False) -> str:
    """A command whose standard input and output reach `node`'s sshd where its address cannot be reached
    (slurm: through `srun --overlap` into the allocation, at a site that refuses ssh to its nodes), as
    ssh's ProxyCommand runs it: from the controller, or (`from_node`) from another node of the cluster.
    '' where the node is reached at its address, as on every provider without this verb."""
    return get(state.provider).relay(state, node, from_node) if supports(state.provider, "relay") else ""


def catalog(provider: str, region: str, refresh: bool = False) -> Catalog:
    """The instance types a spec of `provider` is planned from in `region`, each with its price, and
    where they came from (Catalog.source, with dates). The provider whose catalog it is (a provider
    without one plans in the default world's: aws's) reads it: aws with `refresh` asks EC2 and the Price
    List API when it can (once a day per region, cached under FTC_HOME), else its cache, else the
    snapshot bundled with ftc. A provider without this verb: its World's own table."""
    owner = provider if world(provider).instance_types else default_provider()
    if supports(owner, "catalog"):
        return get(owner).catalog(region, refresh)
    own = world(owner)
    return Catalog(region=region, instance_types=own.instance_types, facts_source=f"{own.title or owner}'s own table",
                   facts_date="built in", prices_source=f"{own.title or owner}'s own table", prices_date="built in")
