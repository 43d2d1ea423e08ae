"""What crosses the provider interface, as plain dataclasses: a node's live status, what each provider
can do and needs (Traits), what it owns (World: its catalog, regions, name forms, its own settings, the
reader of its spot notices, checkpoint store, network), what each one records in the state (its
resources); and the registry of providers.

Callers outside provision/providers/ ask `traits(provider)` and `world(provider)`, never compare provider
names. Imports nothing of ftc but its errors and the spot reader's record (a node program's, which the
job hands to the nodes), so the state (provision/state.py) can hold these records.
The built-in providers are registered by the package (providers/__init__.py); another is named in
FTC_PROVIDERS (module:attribute of a Provider, comma-separated) and loaded on the registry's first use.
"""

import os
import re
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any, Callable, Iterator, Mapping

from runner.node.spot import SpotReader

from ..errors import UsageError, option

Record = Callable[[], None]  # the orchestrator's, passed to the verbs: save the state as it now is


@dataclass
class NodeStatus:
    id: str
    state: str  # running | pending | dead | terminated | missing | unknown (the provider could not be asked)
    detail: str = ""


# ---- what each provider records in the state (ClusterState.resources) -------------------------

@dataclass
class AwsPreflight:
    """What `up` resolved before creating anything (aws.preflight)."""
    ami: str
    root_device: str  # the AMI's root device: the encrypted gp3 volume is mapped there
    ssh_cidr: str  # the one CIDR the security group lets SSH in from
    vpc: str  # the region's default VPC
    subnets: dict[str, str]  # zone -> its default subnet, in the order the zones are tried


@dataclass
class AwsResources:
    """Every id the AWS provider created, each recorded before the next call to EC2."""
    preflight: AwsPreflight | None = None  # set by confirm; launch resolves it when confirm did not run
    key_pair: str = ""
    security_group: str = ""
    placement_group: str = ""
    client_tokens: dict[str, str] = field(default_factory=dict)  # zone -> RunInstances token: a retry finds the same
    instances: list[str] = field(default_factory=list)
    zone: str = ""  # where the instances run
    ena_express: bool = False  # the instances were launched with ENA Express on their network interfaces


@dataclass
class HostCheck:
    """One of your servers as confirm found it (ssh provider): what launch makes its node from."""
    label: str  # user@host[:port] as you gave it: the node's id
    user: str
    address: str  # as you gave it: what ftc connects to
    port: int
    host_key: str  # "<type> <base64>", the key you trusted
    ip: str  # the address the login reached: what the nodes use among themselves
    home: str  # the account's $HOME there


@dataclass
class SshResources:
    hosts: list[HostCheck] = field(default_factory=list)  # node 0 first
    claim: str = ""  # the token in each host's directory: destroy removes only a directory holding it


@dataclass
class SlurmResources(SshResources):
    """The allocation's nodes are checked and claimed as your servers are (hosts, claim), once Slurm names them."""
    job_id: str = ""  # the allocation's Slurm job, recorded as soon as sbatch answers
    reach: str = ""  # how the controller and the nodes reach the nodes' sshd: "ssh" (their port 22), or "srun"
    # (a private sshd per node inside the allocation, through `srun --overlap`), as `up` found the site


@dataclass
class LocalResources:
    """Nothing beyond the nodes: each node's sshd pid, port and files are in its NodeInfo."""


Resources = AwsResources | SlurmResources | SshResources | LocalResources


# ---- what each provider can do and needs -------------------------------------------------------

@dataclass(frozen=True)
class Traits:
    resources: type  # the record of what it creates, in ClusterState.resources
    instance_types: bool  # INSTANCE_TYPE picks the nodes from its World's catalog: cores known before launch
    billed: bool  # the nodes cost money while they run, at the catalog's hourly price
    shares_this_machine: bool  # every node is this machine (its cores split): its Python, pip and files
    own_hosts: bool  # your servers, which exist before up and stay after down: ftc keeps to one directory
    # per host, installs no system package, pins host keys only after you confirmed them, and a refused
    # login is final (no boot to wait for)
    user_login: bool  # ftc logs in as you do (SSH_KEY, else your agent and ~/.ssh), with no key of the cluster's
    user_stack_python: bool  # STACK_PYTHON may name a Python there that already has the stack
    found_by_tag: bool  # terminate finds what a cluster created by its tags, with no state: `down` searches
    # there whenever this machine can ask it (has_credentials)
    scheduler: bool = False  # a scheduler lends the nodes (PARTITION, NODES and MAX_HOURS ask for them), not HOSTS


# ---- what each provider owns ---------------------------------------------------------------------

@dataclass(frozen=True)
class CpuGeneration:
    """An Intel Xeon generation as ftc plans for it: what its cores compute natively."""
    name: str  # "Sapphire Rapids"
    native_bf16: bool  # AMX (or AVX-512 BF16): bf16 training runs natively, else fp32 on AVX-512


@dataclass(frozen=True)
class InstanceType:
    """One instance type of a provider's catalog: its size, price, CPU generation and network."""
    vcpus: int
    memory_gib: int
    usd_per_hour: float  # the price of one node-hour (on-demand, the catalog's region)
    generation: CpuGeneration  # what the runner's precision choice depends on
    network_gbps: float  # per instance, sustained: EC2's baseline (small sizes burst above it, "up to 12.5")
    ena_express: bool = False  # the provider's faster per-flow transport (EC2: ENA Express, SRD) is offered
    efa: bool = False  # an HPC fabric (EC2: Elastic Fabric Adapter) is offered
    clock_ghz: float = 0.0  # sustained all-core clock, where the provider publishes it; 0: unknown

    @property
    def physical_cores(self) -> int:
        return self.vcpus // 2

    @property
    def cpu(self) -> str:
        return self.generation.name

    @property
    def native_bf16(self) -> bool:
        return self.generation.native_bf16


@dataclass(frozen=True)
class Catalog:
    """A provider's instance types in one region as ftc read them, and where their facts and prices came
    from (the cloud's own API, a cache of it, or a snapshot bundled with ftc), each with its date."""
    region: str  # the region the figures are for (a snapshot's own, whichever region was asked for)
    instance_types: Mapping[str, InstanceType]
    facts_source: str  # "EC2 DescribeInstanceTypes in eu-west-1"
    facts_date: str  # YYYY-MM-DD: when they were read
    prices_source: str  # "AWS Price List API", or the snapshot's table, named
    prices_date: str

    @property
    def source(self) -> str:
        """Both sources in one line, as a plan prints it."""
        return (f"instance types: {self.facts_source} ({self.facts_date}); prices: {self.prices_source} "
                f"({self.prices_date}, {self.region} on-demand)")


@dataclass(frozen=True)
class NameForm:
    """How a valid name of one kind looks (a zone, an image, a checkpoint store), and how a refusal says so."""
    pattern: str  # a valid name matches it whole
    what: str  # the kind, as a refusal names it: "an AMI id"
    allowed: str  # what is allowed, in words: "ami- followed by 8-17 hex digits"

    def matches(self, name: str) -> bool:
        return re.fullmatch(self.pattern, name) is not None

    def parse(self, key: str, raw: Any) -> str:
        """Setting `key`'s value, a name of this form or empty (its default); else refused in one line."""
        value = str(raw).strip()
        if value and not self.matches(value):
            raise UsageError(f"{option(key)}={raw!r} is not {self.what}; allowed: {self.allowed}, or empty")
        return value


@dataclass(frozen=True)
class Setting:
    """A setting a provider owns (AWS's AMI, Slurm's PARTITION): a flag, FTC_<KEY> and a config key like any
    of the spec's, whose value the spec keeps in ClusterSpec.settings for the provider's verbs."""
    parse: Callable[[str, Any], Any]  # (key, raw) -> the value, or UsageError in one line (provision/values.py)
    # what the verbs get when it is not given; a function of the spec's InstanceType where the default
    # follows the type (AWS's ENA_EXPRESS: on where the type has it)
    default: Any
    help: str  # the flag's help

    def default_on(self, kind: InstanceType) -> Any:
        """Its default on a spec of instance type `kind`."""
        return self.default(kind) if callable(self.default) else self.default


@dataclass(frozen=True)
class World:
    """What a provider owns beyond its verbs. Empty where it has no such thing: a provider with no catalog
    (local, ssh) has its spec checked against the default world (spec_world)."""
    title: str = ""  # how help and messages name it: "AWS"
    instance_types: Mapping[str, InstanceType] = field(default_factory=dict)  # its catalog, each type's price in it
    default_instance_type: str = ""
    regions: tuple[str, ...] = ()
    default_region: str = ""
    zone_form: NameForm | None = None  # a zone's name; a zone is named after its region (us-east-1a)
    label_form: NameForm | None = None  # a label's value on what a cluster creates (OWNER: AWS's ftc:owner tag)
    settings: Mapping[str, Setting] = field(default_factory=dict)  # its own, by key (aws: ami; slurm: partition)
    # The rules its settings keep among themselves and with the spec's (aws: SSH_CIDR past a site needs
    # ALLOW_OPEN_SSH; slurm: PARTITION is needed), each refused in one line; given the ClusterSpec once it
    # is read (typed Any here: the spec imports this module)
    check: Callable[[Any], None] | None = None
    # How a refusal of its setting given to another provider names its clusters, where that says more than
    # PROVIDER=<name> does: "a Slurm cluster"
    cluster_called: str = ""
    spot_reader: SpotReader | None = None  # how a spot node hears its reclaim notice (aws: IMDSv2); None: not heard
    # Its notice may come to any cluster, not only a spot one: a scheduler preempts or ends any allocation.
    notice_without_spot: bool = False
    checkpoint_store: NameForm | None = None  # the URI of a checkpoint store (S3); its verb: store_checkpoint
    flow_gbps: float = 0.0  # the network's cap on one TCP flow between nodes
    express_flow_gbps: float = 0.0  # that cap where both ends turn on the faster transport (InstanceType.ena_express)
    hop_latency_s: float = 0.0  # one network hop between nodes
    express_setting: str = ""  # its setting that turns the faster per-flow transport on (aws: ena_express)
    cost_note: str = ""  # what `ftc status` says its nodes cost where no catalog prices them: "a Slurm allocation"
    max_hours_means: str = ""  # what MAX_HOURS bounds there, for its help: "the nodes power off after it"

    def usd_per_node_hour(self, instance_type: str) -> float | None:
        """The catalog's price of one node-hour; None for a type it does not have."""
        kind = self.instance_types.get(instance_type)
        return kind.usd_per_hour if kind else None


@dataclass(frozen=True)
class Provider:
    """A provider as the registry holds it."""
    name: str  # PROVIDER=<name>; what the state records
    module: str  # the module whose functions are its verbs (providers/__init__.py), imported on first use
    traits: Traits
    world: World = World()


# ---- the registry ---------------------------------------------------------------------------------

_REGISTERED: dict[str, Provider] = {}
_FROM_ENV = "FTC_PROVIDERS"
_env_loaded = False


def register(provider: Provider) -> None:
    """Add a provider; a name already taken is an error (two providers would answer to it)."""
    if provider.name in _REGISTERED:
        raise ValueError(f"a provider named {provider.name!r} is registered already")
    _REGISTERED[provider.name] = provider


def _load_named_in_env() -> None:
    """Register each Provider FTC_PROVIDERS names (module:attribute, comma-separated), once."""
    global _env_loaded
    if _env_loaded:
        return
    _env_loaded = True  # first: the module imported may itself ask the registry
    given = os.environ.get(_FROM_ENV, "")
    for entry in [e.strip() for e in given.split(",") if e.strip()]:
        module, _, attribute = entry.partition(":")
        try:
            found = getattr(import_module(module), attribute) if attribute else None
        except Exception as exc:  # noqa: BLE001 - whatever a user's module raises as it loads is said in one line
            found = exc
        if not isinstance(found, Provider):
            why = f" ({found})" if isinstance(found, Exception) else ""
            raise UsageError(f"{_FROM_ENV}={given!r}: {entry!r} is not a provider{why}; allowed: a comma list of "
                             "module:attribute, each naming a Provider (provision/providers/records.py)")
        taken = _REGISTERED.get(found.name)
        if taken is None:
            register(found)
        elif taken != found:  # an equal one (the same entry twice) is the same provider: nothing to choose
            raise UsageError(f"{_FROM_ENV}={given!r}: {entry!r} is a provider named {found.name!r}, a name another "
                             f"provider has; allowed: a provider of a name of its own (taken: {', '.join(_REGISTERED)})")


def registered() -> dict[str, Provider]:
    """Every provider, by name, in the order registered: the built-ins, then FTC_PROVIDERS'."""
    _load_named_in_env()
    return dict(_REGISTERED)


def names() -> list[str]:
    return list(registered())


def provider(name: str) -> Provider:
    """The registered provider `name`; an unknown name is refused in one line."""
    found = registered().get(name)
    if found is None:
        raise UsageError(f"{option('provider')}={name!r} is not known; allowed: {', '.join(_REGISTERED)}")
    return found


def traits(name: str) -> Traits:
    """What provider `name` can do and needs; an unknown name is refused in one line."""
    return provider(name).traits


def world(name: str) -> World:
    """What provider `name` owns; an unknown name is refused in one line."""
    return provider(name).world


def default_provider() -> str:
    """The first registered provider whose world has a catalog (of the built-ins, aws): the one whose catalog
    `ftc plan` and `ftc bench` pick from. Asks only the built-ins, which are registered before any module
    reads it at import."""
    return next(p.name for p in _REGISTERED.values() if p.world.instance_types)


def default_world() -> World:
    """The default provider's world: the defaults of INSTANCE_TYPE and REGION, and the catalog `ftc plan`
    and `ftc bench` pick from."""
    return _REGISTERED[default_provider()].world


def spec_world(name: str) -> World:
    """The world a spec of provider `name` is checked against: its own when it has a catalog, else the
    default world, so that INSTANCE_TYPE, REGION, ZONES and AMI mean one thing whatever the provider."""
    own = world(name)
    return own if own.instance_types else default_world()


def spec_worlds(name: str) -> tuple[World, ...]:
    """The worlds whose own settings a spec of provider `name` takes, and whose rules (World.check) it is
    held to: the world it is checked against (spec_world), then its own where that is another. So a
    provider with no catalog takes the default world's settings, as it takes its INSTANCE_TYPE and
    REGION, beside its own (slurm: PARTITION)."""
    own, checked = world(name), spec_world(name)
    return (checked,) if own is checked else (checked, own)


def store_for(key: str, uri: str) -> Provider:
    """The provider whose checkpoint store `uri` names (an s3:// URI: aws), whatever the cluster's
    provider; none is refused in one line naming setting `key` (CHECKPOINT_URI)."""
    stores = [p for p in registered().values() if p.world.checkpoint_store]
    for found in stores:
        if found.world.checkpoint_store.matches(uri):
            return found
    raise UsageError(f"{option(key)}={uri!r} is not {' or '.join(p.world.checkpoint_store.what for p in stores)}; "
                     f"allowed: {', '.join(p.world.checkpoint_store.allowed for p in stores)}")


class _TraitsView(Mapping[str, Traits]):
    """Every registered provider's traits by name, read from the registry when asked."""

    def __getitem__(self, name: str) -> Traits:
        return registered()[name].traits

    def __iter__(self) -> Iterator[str]:
        return iter(registered())

    def __len__(self) -> int:
        return len(registered())


TRAITS: Mapping[str, Traits] = _TraitsView()
