"""The cluster spec: what the user asked for, validated before anything exists.

One precedence, documented in the README: command-line flags (which the Makefile
fills from its variables) > environment variables `FTC_<FIELD>` > the config file
(`--config`, `$FTC_CONFIG`, or `./ftc.toml`) > defaults. Every value from every
source goes through the same parser, so a bad `NODES=abc` and a bad
`nodes = "abc"` in the config file get the same one-line refusal.
"""

import getpass
import os
import re
import tomllib
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any, Callable, Mapping

from .errors import UsageError
from .providers.records import (
    NameForm,
    Setting,
    World,
    default_world,
    names,
    registered,
    spec_world,
    spec_worlds,
    traits,
    world,
)
from .stacks import STACKS
from .values import boolean, host_label, label, local_path, number, one_of, parse_host, whole

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
    spot: bool = False
    max_hours: float = 4.0  # the node's watchdog powers it off (and so terminates it) after this
    stack: str = "stock"
    owner: str = ""  # the owner label (World.label_form; aws: the ftc:owner tag); empty: the local user name
    hosts: list[str] = field(default_factory=list)  # ssh: "[user@]host:port" of your own servers, node 0 first
    ssh_key: str = ""  # ssh: the private key that logs in to them; empty: your ssh agent and ~/.ssh keys
    stack_python: str = ""  # ssh: a Python on every host that has the stack already; empty: ftc installs one
    # the provider's own (World.settings of its spec_worlds: aws's AMI, SSH_CIDR...; slurm's PARTITION...),
    # every one, by key; by default the default world's defaults
    settings: dict[str, Any] = field(default_factory=lambda: setting_defaults(
        ClusterSpec.provider, default_world().default_instance_type))

    @property
    def express(self) -> bool:
        """Whether the nodes' faster per-flow transport is on (World.express_flow_gbps): the setting its
        worlds name for it (AWS's ENA_EXPRESS), off where they name none."""
        return any(self.settings.get(w.express_setting) for w in spec_worlds(self.provider) if w.express_setting)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ClusterSpec":
        known = {f.name for f in fields(cls)}
        spec = cls(**{k: v for k, v in data.items() if k in known})
        # A state recorded before its provider owned these settings has them at the top level (root_volume_gb,
        # partition...): read from there into settings, where the spec keeps them now.
        recorded = data.get("settings", {})
        moved = {k: data[k] for k in spec_settings(spec.provider) if k in data and k not in recorded}
        spec.settings = {**spec.settings, **moved}
        return spec


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


REMOTE_PYTHON = NameForm(r"/[\w./+-]+", "an absolute path on the hosts (e.g. /opt/conda/bin/python)",
                         "letters, digits and _./+-")


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
    "spot": boolean,
    # the watchdog's lifetime: a quarter hour at least, so that no node powers off before its bootstrap ends
    "max_hours": number(0.25, 168, lo_included=True),
    "stack": one_of(STACKS),
    "hosts": _hosts,
    "ssh_key": local_path,
    "stack_python": REMOTE_PYTHON.parse,
}


def spec_settings(provider: str) -> dict[str, Setting]:
    """The providers' own settings a spec of provider `provider` takes, by key: its spec_worlds'."""
    return {key: setting for taken in spec_worlds(provider) for key, setting in taken.settings.items()}


def setting_defaults(provider: str, instance_type: str) -> dict[str, Any]:
    """What each setting a spec of `provider` takes is when not given, on instance type `instance_type`."""
    kind = spec_world(provider).instance_types[instance_type]
    return {key: setting.default_on(kind) for key, setting in spec_settings(provider).items()}


def parsers_for(provider: str) -> dict[str, Callable[[str, Any], Any]]:
    """PARSERS, with the settings provider `provider`'s world decides checked against it (spec_world),
    and the providers' own settings its spec takes (spec_settings)."""
    own = {key: setting.parse for key, setting in spec_settings(provider).items()}
    return {**PARSERS, **world_parsers(spec_world(provider)), **own}


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
    _refuse_others_settings(merged, provider)
    parsers = parsers_for(provider)
    checked = spec_world(provider)
    values = {key: parsers[key](key, raw) for key, raw in merged.items() if key in parsers}
    values.setdefault("instance_type", checked.default_instance_type)
    values.setdefault("region", checked.default_region)
    values["settings"] = {key: values.pop(key, default)
                          for key, default in setting_defaults(provider, values["instance_type"]).items()}
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


def _refuse_others_settings(merged: Mapping[str, Any], provider: str) -> None:
    """Another provider's own setting, given to a spec of `provider`, is refused in one line naming whose it is."""
    taken = spec_settings(provider)
    for key, (owner, _) in own_settings().items():
        if key in merged and key not in taken:
            called = world(owner).cluster_called
            whose = f"{called} ({label('provider')}={owner})" if called else f"{label('provider')}={owner}"
            raise UsageError(f"{label(key)} is for {whose}, not {label('provider')}={provider!r}; "
                             f"add {label('provider')}={owner} or leave {label(key)} out")


def check_spec(spec: ClusterSpec) -> None:
    """Rules that involve more than one field: its provider's worlds' own (World.check), then the spec's."""
    for ruled in spec_worlds(spec.provider):
        if ruled.check:
            ruled.check(spec)
    own_hosts, scheduler = traits(spec.provider).own_hosts, traits(spec.provider).scheduler
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
