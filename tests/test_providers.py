"""The provider interface: every registered provider has the verbs (providers.Verbs) with their
signatures, and a World that holds together with its Traits; the registry, its refusals and what the CLI
reads of it. The provider defined only under tests/ has its own test: test_fourth_provider.py."""

import inspect
import json
from dataclasses import replace
from importlib import import_module
from pathlib import Path

import pytest
from conftest import ftc
from fourth_provider import TINYCLOUD
from helpers import one_error, state_path

from provision.errors import UsageError
from provision.providers import OPTIONAL, REQUIRED, OptionalVerbs, Provider, Verbs, providers_with, records
from provision.providers.records import registered
from provision.spec import ClusterSpec, every_parser
from provision.state import ClusterState
from runner.cli import unwatched_spot
from runner.jobspec import spot_watch
from runner.node.protocol import SPOT_NOTICE_ENV
from runner.node.spot import IMDS_V2, SpotReader
from runner.runs import cost

TESTS = Path(__file__).resolve().parent
WITH_TINYCLOUD = {"FTC_PROVIDERS": "fourth_provider:TINYCLOUD", "PYTHONPATH": str(TESTS)}
PROVIDERS = [*registered().values(), TINYCLOUD]
LOCAL_IMPOSTOR = Provider("local", "fourth_provider", TINYCLOUD.traits, TINYCLOUD.world)  # tinycloud, under local's name


def parameters(function) -> list[str]:
    return [name for name in inspect.signature(function).parameters if name != "self"]


@pytest.mark.parametrize("provider", PROVIDERS, ids=[p.name for p in PROVIDERS])
def test_every_provider_has_the_verbs_with_their_signatures(provider: Provider):
    verbs = import_module(provider.module)
    assert isinstance(verbs, Verbs), f"{provider.module} lacks one of {REQUIRED}"
    for verb in REQUIRED:
        assert parameters(getattr(verbs, verb))[:len(parameters(getattr(Verbs, verb)))] == parameters(getattr(Verbs, verb))
    for verb in [v for v in OPTIONAL if hasattr(verbs, v)]:
        assert parameters(getattr(verbs, verb)) == parameters(getattr(OptionalVerbs, verb)), verb


@pytest.mark.parametrize("provider", PROVIDERS, ids=[p.name for p in PROVIDERS])
def test_every_providers_world_holds_together_with_its_traits(provider: Provider):
    world, traits = provider.world, provider.traits
    assert traits.instance_types == bool(world.instance_types)
    assert hasattr(import_module(provider.module), "store_checkpoint") == bool(world.checkpoint_store)
    if world.instance_types:  # what a spec of it is checked against and defaults to (spec.py)
        assert world.title and world.default_instance_type in world.instance_types
        assert world.default_region in world.regions and world.zone_form
        assert world.zone_form.matches(world.zone_form.allowed.removeprefix("e.g. "))
        assert world.flow_gbps > 0 and world.hop_latency_s > 0
    if traits.billed:
        assert all(kind.usd_per_hour > 0 for kind in world.instance_types.values())
    if world.spot_reader:  # what the job hands its nodes reads back as the reader, and the reader is there
        assert SpotReader.parse(world.spot_reader.watch) == world.spot_reader
        assert callable(world.spot_reader.reader())
    kinds = (world.instance_types or records.default_world().instance_types).values()
    for key, setting in world.settings.items():  # a setting's default, on each type, is a value its parser takes
        assert all(setting.parse(key, setting.default_on(kind)) == setting.default_on(kind) for kind in kinds)
        assert setting.help


def test_the_aws_world_keeps_ftcs_defaults_and_checkpoint_store():
    aws = registered()["aws"].world
    assert (aws.default_instance_type, aws.default_region, aws.flow_gbps) == ("c6i.16xlarge", "us-east-1", 10.0)
    assert aws.checkpoint_store.matches("s3://ftc-checkpoints/runs") and not aws.checkpoint_store.matches("http://x")


def test_a_bad_ftc_providers_entry_is_refused_in_one_line(ftc_home, tmp_path):
    proc = ftc("up", "--name", "tc", env={"FTC_PROVIDERS": "fourth_provider:NOPE", "PYTHONPATH": str(TESTS)})
    assert proc.returncode == 2
    assert one_error(proc).startswith("error: FTC_PROVIDERS='fourth_provider:NOPE': 'fourth_provider:NOPE' is "
                                      "not a provider")
    # a module that fails as it loads (a World field it names that is not there) is one line too, not a traceback
    (tmp_path / "stale_provider.py").write_text("from provision.providers import World\nWORLD = World(image_form=None)\n")
    stale = ftc("up", "--name", "tc", env={"FTC_PROVIDERS": "stale_provider:P", "PYTHONPATH": str(tmp_path)})
    assert stale.returncode == 2 and "Traceback" not in stale.stderr
    assert one_error(stale).startswith("error: FTC_PROVIDERS='stale_provider:P': 'stale_provider:P' is not a provider "
                                       "(World.__init__() got an unexpected keyword argument 'image_form')")


def test_a_provider_in_ftc_providers_whose_name_another_has_is_refused_and_the_same_one_twice_is_not(monkeypatch):
    monkeypatch.setattr(records, "_REGISTERED", dict(records._REGISTERED))  # this process's registry stays as it is
    monkeypatch.setattr(records, "_env_loaded", False)
    monkeypatch.setenv("FTC_PROVIDERS", "fourth_provider:TINYCLOUD, fourth_provider:TINYCLOUD")
    assert records.registered()["tinycloud"] is TINYCLOUD
    monkeypatch.setattr(records, "_env_loaded", False)
    monkeypatch.setenv("FTC_PROVIDERS", f"{__name__}:LOCAL_IMPOSTOR")
    with pytest.raises(UsageError, match=r"^FTC_PROVIDERS='.*:LOCAL_IMPOSTOR': .* is a provider named 'local', a name "
                                         r"another provider has; allowed: a provider of a name of its own") as refused:
        records.registered()
    assert refused.value.exit_code == 2 and "\n" not in str(refused.value)


@pytest.mark.parametrize("key, whose", [("tiny_image", "provider 'tinycloud'"), ("nodes", "the spec")])
def test_a_providers_setting_of_a_name_another_setting_has_is_refused_in_one_line(monkeypatch, key, whose):
    monkeypatch.setattr(records, "_REGISTERED", dict(records._REGISTERED))  # this process's registry stays as it is
    records.register(TINYCLOUD)
    twin = replace(TINYCLOUD, name="twin", world=replace(TINYCLOUD.world, settings={key: TINYCLOUD.world.settings["tiny_image"]}))
    records.register(twin)
    with pytest.raises(UsageError, match=rf"^provider 'twin' has a setting '{key}', which is already a setting of "
                                         rf"{whose}; allowed: a setting of a name of its own$"):
        every_parser()


def test_plan_resolves_only_the_provider_and_its_instance_type(ftc_home):
    ssh = ftc("plan", "--instance-type", "c7i.16xlarge", "--json", env={"FTC_PROVIDER": "ssh"})  # no FTC_HOSTS
    assert ssh.returncode == 0, ssh.stderr
    assert json.loads(ssh.stdout)["rows"]
    tiny = ftc("plan", "--nodes", "2", "--json", env={**WITH_TINYCLOUD, "FTC_PROVIDER": "tinycloud",
                                                      "FTC_INSTANCE_TYPE": "tiny.two"})
    assert tiny.returncode == 0, tiny.stderr  # tiny.two: 2 nodes x $0.5/h for the 5 minutes of setup at least
    assert json.loads(tiny.stdout)["rows"][0]["cost_usd"] >= round(2 * 0.5 * 5 / 60, 2)
    wrong = ftc("plan", "--instance-type", "c7i.16xlarge", env={**WITH_TINYCLOUD, "FTC_PROVIDER": "tinycloud"})
    assert one_error(wrong) == "error: --instance-type='c7i.16xlarge' is not known; allowed: tiny.one, tiny.two"


def test_a_run_is_priced_only_where_its_provider_is_registered():
    assert cost("tinycloud", "tiny.one", 2, 3600) is None  # not registered in this process: unknown, not free
    assert cost("local", "", 2, 3600) == 0.0 and cost("ssh", "", 2, 3600) == 0.0
    assert cost("aws", "c6i.large", 2, 3600) == round(2 * registered()["aws"].world.usd_per_node_hour("c6i.large"), 2)


def test_help_and_refusals_name_the_providers_the_registry_holds(ftc_home):
    helped = ftc("up", "--help", env=WITH_TINYCLOUD).stdout
    assert f"{', '.join([*registered(), 'tinycloud'])} (default local)" in " ".join(helped.split())
    down_help = " ".join(ftc("down", "--help", env=WITH_TINYCLOUD).stdout.split())
    assert f"where to look ({', '.join([*registered(), 'tinycloud'])})" in down_help
    dry = ftc("up", "--name", "d", "--dry-run")
    assert (dry.returncode, one_error(dry)) == (
        2, f"error: --dry-run is not available for --provider='local'; allowed: "
           f"--provider={' or '.join(providers_with('dry_run'))}")


def test_extend_names_the_providers_whose_nodes_have_a_lifetime_watchdog(ftc_home):
    path = state_path(ftc_home, "x")
    path.parent.mkdir(parents=True)
    path.write_text(ClusterState(name="x", provider="local", spec=ClusterSpec(name="x").to_dict()).to_json())
    proc = ftc("extend", "--name", "x")
    assert (proc.returncode, one_error(proc)) == (
        2, f"error: --name='x' is a local cluster, whose nodes have no lifetime watchdog; allowed: a cluster of "
           f"{', '.join(providers_with('extend'))}")


def test_spot_is_noted_where_its_provider_watches_no_spot_notices():
    noted = unwatched_spot(ClusterSpec(name="s", spot=True), {})
    assert noted == ("note: --spot=1 on --provider=local: no spot notices are watched there (its provider has no "
                     "spot-notice reader); jobs run as on any other node")
    assert unwatched_spot(ClusterSpec(name="s", spot=True, provider="ssh", hosts=["h"]), {}).startswith("note: ")
    simulated = SpotReader(IMDS_V2, "http://127.0.0.1:1").watch
    assert unwatched_spot(ClusterSpec(name="s", spot=True), {SPOT_NOTICE_ENV: simulated}) == ""
    assert spot_watch("local", True, {SPOT_NOTICE_ENV: simulated}) == simulated
    assert spot_watch("local", False, {SPOT_NOTICE_ENV: simulated}) == ""  # a cluster not spot watches nothing
    with pytest.raises(UsageError, match=r"^FTC_SPOT_WATCH: 'http://x' is not a spot reader; allowed: "
                                         r"module:function@endpoint$"):
        spot_watch("local", True, {SPOT_NOTICE_ENV: "http://x"})
    with pytest.raises(UsageError, match="^FTC_SPOT_WATCH: "):  # Slurm's jobs watch without spot: refused at the spec
        unwatched_spot(ClusterSpec(name="s", provider="slurm"), {SPOT_NOTICE_ENV: "http://x"})
    assert unwatched_spot(ClusterSpec(name="s", spot=True, provider="aws"), {}) == ""
    assert unwatched_spot(ClusterSpec(name="s"), {}) == ""


def test_up_with_spot_on_local_says_so_on_stderr(ftc_home):
    proc = ftc("up", "--name", "d", "--spot", "1", "--dry-run")  # refused after the spec: creates nothing
    assert "note: --spot=1 on --provider=local: no spot notices are watched there" in proc.stderr, proc.stderr


def test_the_verb_lists_are_the_protocols_functions():
    def declared(protocol) -> set[str]:
        return {name for name, _ in inspect.getmembers(protocol, inspect.isfunction) if not name.startswith("_")}
    assert set(REQUIRED) == declared(Verbs) and set(OPTIONAL) == declared(OptionalVerbs)
    assert REQUIRED[0] == "launch" and OPTIONAL[0] == "confirm"  # in the order declared
