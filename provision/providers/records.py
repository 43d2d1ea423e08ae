"""What crosses the provider interface, as plain dataclasses: a node's live status, what each provider
can do and needs (Traits), and what each one records in the state (its resources).

Callers outside provision/providers/ ask `traits(provider)`, never compare provider names. Imports
nothing of ftc but its errors, so the state (provision/state.py) can hold these records.
"""

from dataclasses import dataclass, field
from typing import Callable

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
class LocalResources:
    """Nothing beyond the nodes: each node's sshd pid, port and files are in its NodeInfo."""


Resources = AwsResources | SshResources | LocalResources


# ---- what each provider can do and needs -------------------------------------------------------

@dataclass(frozen=True)
class Traits:
    resources: type  # the record of what it creates, in ClusterState.resources
    instance_types: bool  # INSTANCE_TYPE picks the nodes from ftc's catalog: cores known before launch
    billed: bool  # the nodes cost money while they run, at the catalog's hourly price
    shares_this_machine: bool  # every node is this machine (its cores split): its Python, pip and files
    own_hosts: bool  # your servers, which exist before up and stay after down: ftc keeps to one directory
    # per host, installs no system package, pins host keys only after you confirmed them, and a refused
    # login is final (no boot to wait for)
    user_login: bool  # ftc logs in as you do (SSH_KEY, else your agent and ~/.ssh), with no key of the cluster's
    user_stack_python: bool  # STACK_PYTHON may name a Python there that already has the stack
    found_by_tag: bool  # terminate finds what a cluster created by its tags, with no state: `down` searches
    # there whenever this machine can ask it (has_credentials)


TRAITS = {
    "local": Traits(resources=LocalResources, instance_types=False, billed=False, shares_this_machine=True,
                    own_hosts=False, user_login=False, user_stack_python=False, found_by_tag=False),
    "aws": Traits(resources=AwsResources, instance_types=True, billed=True, shares_this_machine=False,
                  own_hosts=False, user_login=False, user_stack_python=False, found_by_tag=True),
    "ssh": Traits(resources=SshResources, instance_types=False, billed=False, shares_this_machine=False,
                  own_hosts=True, user_login=True, user_stack_python=True, found_by_tag=False),
}


def traits(provider: str) -> Traits:
    """What `provider` can do and needs; an unknown name is refused in one line."""
    if provider not in TRAITS:
        raise UsageError(f"{option('provider')}={provider!r} is not known; allowed: {', '.join(TRAITS)}")
    return TRAITS[provider]
