"""The AWS catalog: EC2's own DescribeInstanceTypes (real boto3 against moto's catalog), its cache per
region, the bundled snapshot that plans with no network, the Price List API's answer read, and ENA
Express: asked for where the type has none, refused before anything exists."""

import json
from datetime import date, timedelta

import pytest
from conftest import assert_nothing_left, ftc
from helpers import AWS_UP, assert_refused

from provision.providers import aws as aws_provider
from provision.providers import aws_catalog, catalog
from provision.spec import resolve_spec

OFFLINE = {"AWS_ENDPOINT_URL": None, "AWS_PROFILE": None, "AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None,
           "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent",
           "AWS_EC2_METADATA_DISABLED": "true"}


def offline(monkeypatch) -> None:
    for key, value in OFFLINE.items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)


def test_the_snapshot_plans_every_family_16xlarge_and_up_and_keeps_the_sizes_users_name(ftc_home, monkeypatch):
    offline(monkeypatch)
    found = catalog("aws", "us-east-1", refresh=True)  # nothing to ask: the snapshot, no network
    kinds = found.instance_types
    for family in aws_catalog.FAMILIES:
        assert f"{family}.16xlarge" in kinds and f"{family}.24xlarge" in kinds, family
    for name in ("c6i.large", "c6i.xlarge", "m6i.2xlarge", "r7i.8xlarge", "c7i.12xlarge"):  # sizes named today
        assert name in kinds
    assert "c6in.large" not in kinds and not any("metal" in name for name in kinds)
    assert "moto 5.2.5" in found.facts_source and "Karpenter" in found.prices_source
    assert found.prices_date == "2026-07-20" and found.source.startswith("instance types: EC2 DescribeInstanceTypes")
    assert not (ftc_home / "catalog").exists()


@pytest.mark.parametrize("name,usd,gbps,ena,cpu,bf16", [
    ("c6i.16xlarge", 2.72, 25.0, True, "Ice Lake", False),
    ("c7i.16xlarge", 2.856, 25.0, True, "Sapphire Rapids", True),
    ("c8i.16xlarge", 2.99872, 30.0, True, "Granite Rapids (Xeon 6)", True),
    ("c6in.16xlarge", 3.6288, 100.0, True, "Ice Lake", False),
    ("c8in.16xlarge", 4.35456, 100.0, True, "Granite Rapids (Xeon 6)", True),
    ("c6i.large", 0.085, 0.781, False, "Ice Lake", False),
])
def test_snapshot_figures_are_ec2s_and_the_july_2026_prices(name, usd, gbps, ena, cpu, bf16):
    kind = aws_catalog.snapshot().instance_types[name]
    assert (kind.usd_per_hour, kind.network_gbps, kind.ena_express, kind.cpu, kind.native_bf16) == \
        (usd, gbps, ena, cpu, bf16)
    assert kind.physical_cores == kind.vcpus // 2 and kind.clock_ghz > 3


def test_a_type_is_read_from_ec2s_own_description():
    entry = {"InstanceType": "m8in.24xlarge", "VCpuInfo": {"DefaultVCpus": 96}, "MemoryInfo": {"SizeInMiB": 393216},
             "NetworkInfo": {"EnaSrdSupported": True, "EfaSupported": False, "NetworkPerformance": "150 Gigabit",
                             "NetworkCards": [{"BaselineBandwidthInGbps": 150.0}]},
             "ProcessorInfo": {"SustainedClockSpeedInGhz": 3.9}}
    kind = aws_catalog.instance_type(entry, 8.0)
    assert (kind.vcpus, kind.memory_gib, kind.network_gbps, kind.ena_express, kind.efa, kind.clock_ghz) == \
        (96, 384, 150.0, True, False, 3.9)
    assert aws_catalog.bandwidth_gbps({"NetworkPerformance": "Up to 12.5 Gigabit"}) == 12.5
    assert not aws_catalog.planned("c6in.8xlarge", 32) and aws_catalog.planned("c6in.16xlarge", 64)
    assert aws_catalog.planned("c6i.large", 2) and not aws_catalog.planned("c6i.metal", 128)
    assert not aws_catalog.planned("c7a.16xlarge", 64)


def test_the_price_list_apis_on_demand_price_is_read():
    product = {"product": {"attributes": {"instanceType": "c8in.16xlarge"}}, "terms": {"OnDemand": {"X.JRTCKXETXF": {
        "priceDimensions": {"X.JRTCKXETXF.6YS6EN2CT7": {"unit": "Hrs", "pricePerUnit": {"USD": "4.3545600000"}}}}}}}
    reserved = {"terms": {"OnDemand": {"Y": {"priceDimensions": {"Z": {"unit": "Hrs", "pricePerUnit": {"USD": "0"}}}}}}}
    assert aws_catalog.on_demand_usd([json.dumps(reserved), json.dumps(product)]) == 4.35456
    assert aws_catalog.on_demand_usd([json.dumps(reserved)]) is None


def test_a_cache_of_an_earlier_day_is_stale_and_todays_is_not():
    today = date(2026, 12, 4)
    made = aws_catalog.snapshot_file()
    assert aws_catalog.stale(None, today)
    fresh = aws_catalog.CatalogFile(**{**made.__dict__, "facts_date": today.isoformat()})
    assert not aws_catalog.stale(fresh, today)
    assert aws_catalog.stale(fresh, today + timedelta(days=1))


def test_ena_express_defaults_to_the_types_own_and_is_refused_where_it_has_none(ftc_home):
    assert resolve_spec({"provider": "aws"}, {}).settings["ena_express"]  # c6i.16xlarge has it
    assert not resolve_spec({"provider": "aws", "ena_express": "0"}, {}).settings["ena_express"]
    assert not resolve_spec({"provider": "aws", "instance_type": "c7i.8xlarge"}, {}).settings["ena_express"]
    proc = ftc("up", "--name", "noena", *AWS_UP, "--instance-type", "c6i.large", "--ena-express", "1")
    assert_refused(proc, "--ena-express=1, but --instance-type='c6i.large' has no ENA Express; allowed: "
                         "--ena-express=0, or a type that has it (c6i.8xlarge,", ftc_home)


@pytest.mark.slow
def test_ec2s_catalog_is_read_with_boto3_cached_for_the_day_and_equals_the_snapshot(aws, ftc_home):
    aws_provider.API_CALLS.clear()
    found = catalog("aws", "eu-west-1", refresh=True)
    assert found.facts_source == "EC2 DescribeInstanceTypes in eu-west-1"
    assert found.facts_date == date.today().isoformat() and found.region == "eu-west-1"
    # moto has no Price List API: the prices are the snapshot's, and the catalog says so
    assert found.prices_source.startswith("the snapshot bundled with ftc: Karpenter's table")
    assert dict(found.instance_types) == dict(aws_catalog.snapshot().instance_types)  # the snapshot is moto's answer
    cache = ftc_home / "catalog" / "aws-eu-west-1.json"
    assert json.loads(cache.read_text())["facts"]["date"] == date.today().isoformat()
    assert aws_provider.API_CALLS["DescribeInstanceTypes"] == 1
    again = catalog("aws", "eu-west-1", refresh=True)  # cached today: EC2 is not asked again
    assert aws_provider.API_CALLS["DescribeInstanceTypes"] == 1 and again == found
    yesterday = (date.today() - timedelta(days=1)).isoformat()
    cache.write_text(cache.read_text().replace(f'"date": "{found.facts_date}"', f'"date": "{yesterday}"'))
    assert catalog("aws", "eu-west-1").facts_date == yesterday  # without refresh: the cache as it is
    assert catalog("aws", "eu-west-1", refresh=True).facts_date == date.today().isoformat()
    assert aws_provider.API_CALLS["DescribeInstanceTypes"] == 2


@pytest.mark.slow
def test_ec2_out_of_reach_plans_from_the_snapshot_and_up_goes_on(aws, ftc_home):
    aws.faults(fail_at_call=1)  # DescribeInstanceTypes, the first EC2 call of `up`
    proc = ftc("up", "--name", "nocat", *AWS_UP, "--nodes", "1")
    assert proc.returncode == 0, proc.stderr
    assert "the EC2 catalog of us-east-1 could not be read" in proc.stderr and "planning from the snapshot" in proc.stderr
    assert "catalog: instance types: EC2 DescribeInstanceTypes as moto 5.2.5 answers it" in proc.stderr
    assert not (ftc_home / "catalog" / "aws-us-east-1.json").exists()
    assert ftc("down", "--name", "nocat").returncode == 0
    assert_nothing_left(aws.ec2(), "nocat")


@pytest.mark.slow
def test_a_type_the_regions_catalog_lacks_is_refused_before_anything_is_created(aws, ftc_home):
    today = aws_catalog.snapshot_file()
    lacking = aws_catalog.CatalogFile(**{**today.__dict__, "region": "eu-west-1", "facts_date": date.today().isoformat(),
                                         "facts_source": "EC2 DescribeInstanceTypes in eu-west-1",
                                         "entries": [e for e in today.entries if e["InstanceType"] != "c8in.16xlarge"]})
    aws_catalog.save(lacking)  # today's: `up` plans from it without asking EC2 again
    proc = ftc("up", "--name", "lack", *AWS_UP, "--region", "eu-west-1", "--instance-type", "c8in.16xlarge")
    assert_refused(proc, "--instance-type='c8in.16xlarge' is not offered in eu-west-1 (EC2 DescribeInstanceTypes in "
                         "eu-west-1); allowed: c6i.12xlarge,", ftc_home)
    assert_nothing_left(aws.ec2(), "lack")
