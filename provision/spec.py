"""The cluster spec: what the user asked for, validated before anything exists.

One precedence, documented in the README: command-line flags (which the Makefile
fills from its variables) > environment variables `FTC_<FIELD>` > the config file
(`--config`, `$FTC_CONFIG`, or `./ftc.toml`) > defaults. Every value from every
source goes through the same parser, so a bad `NODES=abc` and a bad
`nodes = "abc"` in the config file get the same one-line refusal.
"""

import getpass
import ipaddress
import os
import re
import tomllib
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any, Callable, Mapping

from .errors import UsageError
from .providers.records import NameForm, Setting, World, default_world, names, registered, spec_world, traits
from .stacks import STACKS
from .values import boolean, label, local_path, number, one_of, whole

MAX_NODES = 64
NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,30}[a-z0-9]$|^[a-z]$")


@dataclass
class ClusterSpec:
    name: str = "ftc"
    provider: str = "local"
    nodes: int = 2
    instance_type: str = default_world().default_instance_type  # a provider with a catalog: its own default
    region: str = default_world().default_region
    zones: list[str] = field(default_factory=list)  # empty: every zone of the region, in order
    root_volume_gb: int = 100
    spot: bool = False
    # ENA Express (SRD) on the nodes' network interfaces: a faster cap on one flow. Unless given, on
    # wherever the instance type has it (resolve_spec); this default is the default type's.
    ena_express: bool = default_world().instance_types[default_world().default_instance_type].ena_express
    ssh_cidr: str = ""  # empty: the caller's public address /32
    allow_open_ssh: bool = False  # the explicit opt-in that 0.0.0.0/0 needs
    max_hours: float = 4.0  # the node's watchdog powers it off (and so terminates it) after this
    stack: str = "stock"
    owner: str = ""  # the owner label (World.label_form; aws: the ftc:owner tag); empty: the local user name
    hosts: list[str] = field(default_factory=list)  # ssh: "[user@]host:port" of your own servers, node 0 first
    ssh_key: str = ""  # ssh: the private key that logs in to them; empty: your ssh agent and ~/.ssh keys
    stack_python: str = ""  # ssh: a Python on every host that has the stack already; empty: ftc installs one
    partition: str = ""  # slurm: the partition the allocation is asked of
    account: str = ""  # slurm: --account; empty: the site's default
    qos: str = ""  # slurm: --qos; empty: the site's default
    constraint: str = ""  # slurm: --constraint (node features, e.g. "sapphirerapids&ib")
    login: str = ""  # slurm: user@host[:port] whose sbatch, squeue and scancel ftc runs over ssh; empty: this machine's
    # the provider's own (World.settings), every one, by key; by default the default world's defaults
    settings: dict[str, Any] = field(default_factory=lambda: {k: s.default for k, s in default_world().settings.items()})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ClusterSpec":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


# ---- parsers of the spec's own kinds; the shared ones are in values.py ----

def _name(key: str, raw: Any) -> str:
    value = str(raw).strip()
    if not NAME_RE.match(value):
        raise UsageError(f"{label(key)}={raw!r} is not a valid cluster name; allowed: 1-32 characters, "
                         "lower-case letters, digits and '-', starting with a letter, not ending with '-'")
    return value


def _provider(key: str, raw: Any) -> str:
    return one_of(names())(key, raw)


def _zones(form: NameForm, key: str, raw: Any) -> list[str]:
    items = raw if isinstance(raw, list) else [z for z in str(raw).replace(" ", "").split(",") if z]
    if not items and str(raw).strip():  # ',' is no zone, not every zone (leave the setting out for that)
        raise UsageError(f"{label(key)}={raw!r} names no zone; give a comma list of zones, or leave it out for every "
                         "zone of the region")
    for zone in items:
        if not form.matches(str(zone)):
            raise UsageError(f"{label(key)}={raw!r}: {zone!r} is not {form.what} ({form.allowed})")
    return [str(z) for z in items]


def _cidr(key: str, raw: Any) -> str:
    value = str(raw).strip()
    if not value:
        return ""
    try:
        return str(ipaddress.ip_network(value, strict=False))
    except ValueError:
        raise UsageError(f"{label(key)}={raw!r} is not a CIDR block; allowed: e.g. 203.0.113.7/32") from None


# user@host:port, [user@][v6]:port; a host never starts with '-' (ssh would read it as an option).
HOST_RE = re.compile(r"^(?:(?P<user>[A-Za-z0-9_][A-Za-z0-9_.-]{0,31})@)?"
                     r"(?P<host>[A-Za-z0-9][A-Za-z0-9.-]{0,252}|\[[0-9A-Fa-f:.]+\])(?::(?P<port>\d{1,5}))?$")


def parse_host(text: str) -> tuple[str, str, int]:
    """'[user@]host[:port]' -> (user, host, port); user '' means yours. Raises ValueError. Pure."""
    match = HOST_RE.match(text.strip())
    if not match or not 1 <= int(match["port"] or 22) <= 65535:
        raise ValueError(f"{text!r} is not user@host[:port]")
    return match["user"] or "", match["host"].strip("[]"), int(match["port"] or 22)


def host_label(user: str, host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"{user + '@' if user else ''}{shown}:{port}"


def _hosts(key: str, raw: Any) -> list[str]:
    items = raw if isinstance(raw, list) else [h.strip() for h in str(raw).split(",") if h.strip()]
    seen: list[str] = []
    for item in items:
        try:
            user, host, port = parse_host(str(item))
        except ValueError:
            comma = " (hosts are separated by commas, not spaces)" if len(str(item).split()) > 1 else ""
            raise UsageError(f"{label(key)}={raw!r}: {str(item)!r} is not a host{comma}; allowed: a comma list of "
                             "user@host[:port] (user and port optional: yours and 22)") from None
        # two accounts on one server are two nodes (each its own directory); one account twice is not
        me = getpass.getuser()
        if any(((u or me), h, p) == ((user or me), host, port) for u, h, p in map(parse_host, seen)):
            raise UsageError(f"{label(key)}={raw!r} names {host_label(user or me, host, port)} twice; "
                             "give each account on a server once")
        seen.append(host_label(user, host, port))
    return seen


def _remote_python(key: str, raw: Any) -> str:
    value = str(raw).strip()
    if value and not re.match(r"^/[\w./+-]+$", value):
        raise UsageError(f"{label(key)}={raw!r} is not an absolute path on the hosts (e.g. /opt/conda/bin/python); "
                         "allowed: letters, digits and _./+-")
    return value


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


def world_parsers(world: World) -> dict[str, Callable[[str, Any], Any]]:
    """The parsers of the spec's settings whose values a provider's world decides: its instance types,
    regions, zones and owner label (a world without labels: the default world's form)."""
    return {"instance_type": one_of(sorted(world.instance_types)), "region": one_of(world.regions),
            "zones": partial(_zones, world.zone_form), "owner": (world.label_form or default_world().label_form).parse}


# The spec's own settings' parsers; those a world decides check against the default world (parsers_for: a
# provider's own). A provider's own settings (World.settings) are added where its spec is read.
PARSERS: dict[str, Callable[[str, Any], Any]] = {
    "name": _name,
    "provider": _provider,
    "nodes": whole(1, MAX_NODES),
    **world_parsers(default_world()),
    "root_volume_gb": whole(8, 16384),
    "spot": boolean,
    "ena_express": boolean,
    "ssh_cidr": _cidr,
    "allow_open_ssh": boolean,
    # the watchdog's lifetime: a quarter hour at least, so that no node powers off before its bootstrap ends
    "max_hours": number(0.25, 168, lo_included=True),
    "stack": one_of(STACKS),
    "hosts": _hosts,
    "ssh_key": local_path,
    "stack_python": _remote_python,
    "partition": _slurm_name,
    "account": _slurm_name,
    "qos": _slurm_name,
    "constraint": _constraint,
    "login": _login,
}


def parsers_for(provider: str) -> dict[str, Callable[[str, Any], Any]]:
    """PARSERS, with the settings provider `provider`'s world decides checked against it (spec_world),
    and that world's own settings."""
    world = spec_world(provider)
    return {**PARSERS, **world_parsers(world), **{key: setting.parse for key, setting in world.settings.items()}}


def own_settings() -> dict[str, tuple[str, Setting]]:
    """Every registered provider's own settings by key, each with the name of the provider that owns it. A
    key that is a setting of the spec's, or another provider's, is refused in one line: one key, one meaning."""
    found: dict[str, tuple[str, Setting]] = {}
    for name, provider in registered().items():
        for key, setting in provider.world.settings.items():
            if key in PARSERS or key in found:
                whose = "the spec" if key in PARSERS else f"provider {found[key][0]!r}"
                raise UsageError(f"provider {name!r} has a setting {key!r}, which is already a setting of {whose}; "
                                 "allowed: a setting of a name of its own")
            found[key] = (name, setting)
    return found


def every_parser() -> dict[str, Callable[[str, Any], Any]]:
    """Every setting a spec may be given, whatever its provider: the spec's own, then each registered
    provider's (the flags, FTC_<KEY> variables and config keys there are)."""
    return {**PARSERS, **{key: setting.parse for key, (_, setting) in own_settings().items()}}


def spot_only(world) -> bool:
    """Whether a provider's nodes hear reclaim notices only as spot nodes (AWS), not on every cluster (Slurm)."""
    return bool(world.spot_reader) and not world.notice_without_spot


def world_help() -> dict[str, str]:
    """The help of the settings a provider's world decides, and of every provider's own settings, in the
    registry's words: each world with a catalog says its default and its form."""
    worlds = [p.world for p in registered().values() if p.world.instance_types]
    fallback = f"a provider without a catalog: {default_world().title}'s"

    def each(say: Callable[[World], str]) -> str:
        return "; ".join(f"{w.title}: {say(w)}" for w in worlds)
    return {
        "instance_type": f"instance type ({each(lambda w: f'default {w.default_instance_type}')}; {fallback})",
        "region": f"region ({each(lambda w: f'default {w.default_region}')}; {fallback})",
        "zones": f"zones to try in order, comma list ({each(lambda w: w.zone_form.allowed)}; default: every zone of "
                 "the region)",
        "spot": f"1: spot nodes, whose jobs watch for reclaim notices (the providers that have them: "
                f"{', '.join(p.world.title or n for n, p in registered().items() if spot_only(p.world))}; "
                f"{', '.join(p.world.title or n for n, p in registered().items() if p.world.notice_without_spot)}: "
                "every job watches)",
        "owner": f"who owns what the cluster creates, as a label "
                 f"({'; '.join(f'{w.title}: {w.label_form.what}' for w in worlds if w.label_form)}; default: your "
                 "user name)",
        **{key: setting.help for key, (_, setting) in own_settings().items()},
    }


def env_overrides(env: Mapping[str, str]) -> dict[str, str]:
    return {k: env[f"FTC_{k.upper()}"] for k in every_parser() if f"FTC_{k.upper()}" in env}


def load_config(path: str | None, env: Mapping[str, str]) -> dict[str, Any]:
    """Read the TOML config file, if one is named or ./ftc.toml exists: its [cluster] table, or, without
    one, its top level. Anything else in it is refused by name: a setting ftc would ignore is a mistake."""
    named = path or env.get("FTC_CONFIG")
    candidate = Path(named) if named else Path("ftc.toml")
    shown = f"{label('config')}={str(candidate)!r}"
    if not candidate.exists():
        if named:
            raise UsageError(f"{label('config')}={named!r} does not exist; give the path of a TOML file")
        return {}
    try:
        data = tomllib.loads(candidate.read_text())
    except OSError as exc:
        raise UsageError(f"{shown} cannot be read ({exc.strerror}); give the path of a TOML file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{shown} is not valid TOML ({exc}); fix the file or pass another") from None
    outside = sorted(set(data) - {"cluster"}) if "cluster" in data else []
    if outside:
        raise UsageError(f"{shown} has {outside[0]!r} outside its [cluster] table; ftc reads only [cluster]: "
                         "move the setting into it, or remove it")
    section = data.get("cluster", data)
    if not isinstance(section, dict):
        raise UsageError(f"{shown}: 'cluster' must be a table ([cluster] with keys), not {type(section).__name__}")
    unknown = sorted(set(section) - set(every_parser()))
    if unknown:
        raise UsageError(f"{shown} has unknown key {unknown[0]!r}; allowed: {', '.join(every_parser())}")
    return section


def resolve_spec(flags: Mapping[str, Any], env: Mapping[str, str] | None = None,
                 config: Mapping[str, Any] | None = None) -> ClusterSpec:
    """Merge flags > env > config > defaults and validate every value. Pure."""
    env = os.environ if env is None else env
    merged: dict[str, Any] = {}
    for source in (config or {}, env_overrides(env), {k: v for k, v in flags.items() if v is not None}):
        merged.update(source)
    provider = PARSERS["provider"]("provider", merged.get("provider", ClusterSpec.provider))
    parsers = parsers_for(provider)
    world = spec_world(provider)
    for key, (owner, _) in own_settings().items():
        if key in merged and key not in world.settings:
            raise UsageError(f"{label(key)} is for {label('provider')}={owner}, not {label('provider')}={provider!r}; "
                             f"add {label('provider')}={owner} or leave {label(key)} out")
    values = {key: parsers[key](key, raw) for key, raw in merged.items() if key in parsers}
    values["settings"] = {key: values.pop(key, setting.default) for key, setting in world.settings.items()}
    values.setdefault("instance_type", world.default_instance_type)
    values.setdefault("region", world.default_region)
    values.setdefault("ena_express", world.instance_types[values["instance_type"]].ena_express)
    if traits(provider).own_hosts and not traits(provider).scheduler:  # your servers are the nodes: NODES follows HOSTS
        hosts = values.get("hosts", [])
        if "nodes" in values and values["nodes"] != len(hosts):
            raise UsageError(f"{label('nodes')}={values['nodes']} but {label('hosts')} names {len(hosts)} server(s); "
                             f"with {label('provider')}={provider} leave {label('nodes')} out: every host in "
                             f"{label('hosts')} is a node")
        values["nodes"] = max(1, len(hosts))
    spec = ClusterSpec(**values)
    check_spec(spec)
    return spec


def too_open(network: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bool:
    """SSH open to more than a /16 of IPv4 (65,536 addresses: a site's or VPN's range at most) or a /48 of
    IPv6 (one site's allocation) needs ALLOW_OPEN_SSH: 0.0.0.0/1 is half the internet. Pure."""
    return network.prefixlen < (16 if network.version == 4 else 48)


def check_spec(spec: ClusterSpec) -> None:
    """Rules that involve more than one field."""
    if spec.ssh_cidr and too_open(ipaddress.ip_network(spec.ssh_cidr)) and not spec.allow_open_ssh:
        whole = ipaddress.ip_network(spec.ssh_cidr).prefixlen == 0
        raise UsageError(f"{label('ssh_cidr')}={spec.ssh_cidr!r} opens SSH to "
                         f"{'the whole internet' if whole else 'more than a /16 of addresses'}; give your own "
                         f"address (e.g. 203.0.113.7/32) or set {label('allow_open_ssh')}=1 to really mean it")
    kinds = spec_world(spec.provider).instance_types
    if spec.ena_express and not kinds[spec.instance_type].ena_express:
        family = spec.instance_type.partition(".")[0]
        offered = sorted((n for n, k in kinds.items() if k.ena_express and n.startswith(f"{family}.")),
                         key=lambda n: kinds[n].vcpus) or sorted(n for n, k in kinds.items() if k.ena_express)
        raise UsageError(f"{label('ena_express')}=1, but {label('instance_type')}={spec.instance_type!r} has no ENA "
                         f"Express; allowed: {label('ena_express')}=0, or a type that has it ({', '.join(offered)})")
    own_hosts, scheduler = traits(spec.provider).own_hosts, traits(spec.provider).scheduler
    _check_scheduler(spec, scheduler)
    if scheduler and spec.hosts:
        raise UsageError(f"{label('hosts')} is for your own servers, not {label('provider')}={spec.provider!r}: the "
                         f"scheduler names the nodes; leave {label('hosts')} out and give {label('nodes')}")
    own_hosts = own_hosts and not scheduler
    if own_hosts and not spec.hosts:
        raise UsageError(f"{label('provider')}={spec.provider!r} needs {label('hosts')}: your servers as a comma list "
                         "of user@host[:port]")
    if own_hosts and len(spec.hosts) > MAX_NODES:
        raise UsageError(f"{label('hosts')} names {len(spec.hosts)} servers; allowed: 1..{MAX_NODES}")
    for key in ("hosts", "ssh_key", "stack_python"):
        if getattr(spec, key) and not own_hosts and not scheduler:
            provider, theirs = label("provider"), next(p for p in names() if traits(p).own_hosts)
            raise UsageError(f"{label(key)} is for your own servers ({provider}={theirs}), not "
                             f"{provider}={spec.provider!r}; add {provider}={theirs} or leave {label(key)} out")
    for zone in spec.zones:
        if not zone.startswith(spec.region):
            raise UsageError(f"{label('zones')}={','.join(spec.zones)!r}: {zone!r} is not in "
                             f"{label('region')}={spec.region!r}")


SCHEDULER_KEYS = ("partition", "account", "qos", "constraint", "login")


def _check_scheduler(spec: ClusterSpec, scheduler: bool) -> None:
    """A scheduler's settings: PARTITION needed there, and none of them anywhere else."""
    if not scheduler:
        for key in SCHEDULER_KEYS:
            if getattr(spec, key):
                theirs = next(p for p in names() if traits(p).scheduler)
                raise UsageError(f"{label(key)} is for a Slurm cluster ({label('provider')}={theirs}), not "
                                 f"{label('provider')}={spec.provider!r}; add {label('provider')}={theirs} or leave "
                                 f"{label(key)} out")
        return
    if not spec.partition:
        raise UsageError(f"{label('provider')}={spec.provider!r} needs {label('partition')}: the Slurm partition to "
                         "ask for nodes (`sinfo -s` lists them)")
