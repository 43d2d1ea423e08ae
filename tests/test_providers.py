"""The provider interface: every registered provider has the verbs (providers.Verbs) with their
signatures, and a World that holds together with its Traits; a provider defined only under tests/
(fourth_provider.py) is found through FTC_PROVIDERS and runs up, finetune and down through the CLI."""

import inspect
import json
from importlib import import_module
from pathlib import Path

import pytest
from conftest import ftc, sshd_pids
from fourth_provider import TINYCLOUD
from helpers import last_job, one_error, state_of, state_path, tiny_job

from provision.providers import OPTIONAL, REQUIRED, OptionalVerbs, Provider, Verbs
from provision.providers.records import registered

TESTS = Path(__file__).resolve().parent
WITH_TINYCLOUD = {"FTC_PROVIDERS": "fourth_provider:TINYCLOUD", "PYTHONPATH": str(TESTS)}
PROVIDERS = [*registered().values(), TINYCLOUD]


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
        assert world.default_region in world.regions and world.zone_form and world.image_form
        assert world.zone_form.matches(world.zone_form.allowed.removeprefix("e.g. "))
        assert world.flow_gbps > 0 and world.hop_latency_s > 0
    if traits.billed:
        assert all(kind.usd_per_hour > 0 for kind in world.instance_types.values())


def test_the_aws_world_keeps_ftcs_defaults_and_checkpoint_store():
    aws = registered()["aws"].world
    assert (aws.default_instance_type, aws.default_region, aws.flow_gbps) == ("c6i.16xlarge", "us-east-1", 10.0)
    assert aws.checkpoint_store.matches("s3://ftc-checkpoints/runs") and not aws.checkpoint_store.matches("http://x")


def test_a_provider_named_in_ftc_providers_is_checked_against_its_own_catalog(ftc_home):
    proc = ftc("up", "--name", "tc", "--provider", "tinycloud", "--instance-type", "c6i.16xlarge", env=WITH_TINYCLOUD)
    assert proc.returncode == 2
    assert one_error(proc) == "error: --instance-type='c6i.16xlarge' is not known; allowed: tiny.one, tiny.two"
    zones = ftc("up", "--name", "tc", "--provider", "tinycloud", "--zones", "us-east-1a", env=WITH_TINYCLOUD)
    assert one_error(zones) == ("error: --zones='us-east-1a': 'us-east-1a' is not a tinycloud zone name "
                                "(e.g. tiny-north-1a)")
    unknown = ftc("up", "--name", "tc", "--provider", "tinycloud")  # not named: not known
    assert one_error(unknown) == "error: --provider='tinycloud' is not known; allowed: local, aws, ssh"


def test_a_bad_ftc_providers_entry_is_refused_in_one_line(ftc_home):
    proc = ftc("up", "--name", "tc", env={"FTC_PROVIDERS": "fourth_provider:NOPE", "PYTHONPATH": str(TESTS)})
    assert proc.returncode == 2
    assert one_error(proc).startswith("error: FTC_PROVIDERS='fourth_provider:NOPE': 'fourth_provider:NOPE' is "
                                      "not a provider")


@pytest.mark.slow
def test_a_provider_defined_only_in_tests_runs_up_finetune_and_down(ftc_home, minilm, glue_dir):
    up = ftc("up", "--name", "tiny", "--provider", "tinycloud", "--nodes", "2", "--yes", "1", env=WITH_TINYCLOUD)
    assert up.returncode == 0, up.stderr[-3000:]
    state = state_of(ftc_home, "tiny")
    assert (state["provider"], state["spec"]["instance_type"], state["spec"]["region"]) == \
        ("tinycloud", "tiny.one", "tiny-north-1")
    status = ftc("status", "--name", "tiny", env=WITH_TINYCLOUD)
    assert "tiny: tinycloud, bootstrapped" in status.stdout and "2 billed, about $" in status.stdout, status.stdout
    job = ftc("finetune", "--name", "tiny", *tiny_job(minilm, glue_dir), env=WITH_TINYCLOUD)
    assert job.returncode == 0, job.stderr[-3000:]
    results = json.loads((Path(last_job(ftc_home, "tiny")["results_dir"]) / "results.json").read_text())
    assert results["nodes"] == 2
    down = ftc("down", "--name", "tiny", env=WITH_TINYCLOUD)
    assert down.returncode == 0, down.stderr[-3000:]
    assert not state_path(ftc_home, "tiny").exists() and sshd_pids(ftc_home) == []
