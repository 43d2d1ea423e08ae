"""The AWS provider against a moto server speaking the EC2 API to real boto3.

Every property of a cluster is asserted from EC2's own answers, not from ftc's state."""

import base64
import json
import os
import signal
import stat
import subprocess
import time

import pytest
from conftest import FTC, assert_nothing_left, cluster_resources, ftc
from helpers import AWS_UP, assert_refused

from provision.providers import aws as aws_provider
from runner.cli import main

pytestmark = pytest.mark.slow

UP = ["up", "--provider", "aws", "--ssh-cidr", "203.0.113.7/32", "--yes", "1", "--no-bootstrap"]


def up(name: str, nodes: int, *extra: str) -> int:
    return main([*UP, "--name", name, "--nodes", str(nodes), *extra])


@pytest.mark.parametrize("nodes", [1, 4, 64])
def test_up_creates_every_resource_as_specified_and_down_removes_it(aws, ftc_home, nodes):
    ec2 = aws.ec2()
    assert up("c1", nodes, "--root-volume-gb", "120", "--max-hours", "3") == 0
    found = cluster_resources(ec2, "c1")
    instances = found["instances"]
    assert len(instances) == nodes
    assert {i["InstanceType"] for i in instances} == {"c6i.16xlarge"}
    assert {i["State"]["Name"] for i in instances} == {"running"}
    assert {i["Placement"]["GroupName"] for i in instances} == {"ftc-c1"}
    assert len({i["Placement"]["AvailabilityZone"] for i in instances}) == 1
    assert {i["MetadataOptions"]["HttpTokens"] for i in instances} == {"required"}
    assert {i["KeyName"] for i in instances} == {"ftc-c1"}
    group_id = found["security_groups"][0]["GroupId"]
    assert {g["GroupId"] for i in instances for g in i["SecurityGroups"]} == {group_id}
    # one interface each, in the group, gone with the instance, ENA Express (SRD, TCP and UDP) on: c6i.16xlarge has it
    interfaces = [n for i in instances for n in i["NetworkInterfaces"]]
    assert len(interfaces) == nodes and {g["GroupId"] for n in interfaces for g in n["Groups"]} == {group_id}
    assert {n["Attachment"]["DeleteOnTermination"] for n in interfaces} == {True}
    assert all(n["Attachment"]["EnaSrdSpecification"] == {"EnaSrdEnabled": True, "EnaSrdUdpSpecification": {
        "EnaSrdUdpEnabled": True}} for n in interfaces)
    for instance in instances:
        tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
        assert tags["ftc:cluster"] == "c1" and tags["ftc:owner"]
    first = instances[0]["InstanceId"]
    behaviour = ec2.describe_instance_attribute(InstanceId=first, Attribute="instanceInitiatedShutdownBehavior")
    assert behaviour["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
    user_data = ec2.describe_instance_attribute(InstanceId=first, Attribute="userData")["UserData"]["Value"]
    assert "shutdown -h +180" in base64.b64decode(user_data).decode()
    volumes = ec2.describe_volumes(Filters=[{"Name": "attachment.instance-id", "Values": [first]}])["Volumes"]
    root = [v for v in volumes if v["Size"] == 120]
    assert root and root[0]["Encrypted"] and root[0]["VolumeType"] == "gp3"

    (group,) = found["security_groups"]
    rules = group["IpPermissions"]
    ssh = [r for r in rules if r.get("FromPort") == 22]
    assert [r["CidrIp"] for r in ssh[0]["IpRanges"]] == ["203.0.113.7/32"]
    inside = [r for r in rules if r["IpProtocol"] == "-1"]
    assert [p["GroupId"] for p in inside[0]["UserIdGroupPairs"]] == [group_id]
    assert all(r["IpRanges"] == [] for r in rules if r.get("FromPort") != 22)
    (placement,) = found["placement_groups"]
    assert placement["Strategy"] == "cluster"
    assert [k["KeyName"] for k in found["key_pairs"]] == ["ftc-c1"]

    state = json.loads((ftc_home / "clusters" / "c1" / "state.json").read_text())
    assert state["phase"] == "running" and len(state["nodes"]) == nodes
    assert state["resources"]["ena_express"] is True and state["spec"]["settings"]["ena_express"] is True
    assert sorted(state["resources"]["instances"]) == sorted(i["InstanceId"] for i in instances)
    key = ftc_home / "clusters" / "c1" / "keys" / "access"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and "PRIVATE KEY" in key.read_text()

    assert main(["down", "--name", "c1"]) == 0
    assert_nothing_left(ec2, "c1")
    assert not (ftc_home / "clusters" / "c1").exists()
    left = ec2.describe_network_interfaces(Filters=[{"Name": "network-interface-id", "Values": [
        n["NetworkInterfaceId"] for n in interfaces]}])["NetworkInterfaces"]
    assert left == []


@pytest.mark.parametrize("flags,on", [(["--ena-express", "0"], False), (["--instance-type", "c7i.8xlarge"], False),
                                      (["--instance-type", "c8in.16xlarge"], True)])
def test_ena_express_is_off_when_turned_off_or_the_type_has_none_and_status_says_which(aws, ftc_home, flags, on):
    proc = ftc(*UP, "--name", "ena", "--nodes", "2", *flags)
    assert proc.returncode == 0, proc.stderr
    assert ("ENA Express)" in proc.stderr.split("plan: ", 1)[1].splitlines()[0]) == on
    assert "catalog: instance types: EC2 DescribeInstanceTypes in us-east-1 (" in proc.stderr  # read, not bundled
    instances = cluster_resources(aws.ec2(), "ena")["instances"]
    assert [aws_provider.ena_express_on(i) for i in instances] == [on, on]
    assert json.loads((ftc_home / "clusters" / "ena" / "state.json").read_text())["resources"]["ena_express"] is on
    status = ftc("status", "--name", "ena")
    assert status.returncode == 0 and status.stdout.count("ENA Express") == (2 if on else 0), status.stdout
    assert ftc("down", "--name", "ena").returncode == 0
    assert_nothing_left(aws.ec2(), "ena")


def test_capacity_error_in_first_zone_moves_to_the_next(aws, ftc_home):
    aws.faults(no_capacity=["us-east-1a"])
    proc = ftc(*UP, "--name", "cap", "--nodes", "2", "--zones", "us-east-1a,us-east-1b")
    assert proc.returncode == 0, proc.stderr
    assert "zone us-east-1a: InsufficientInstanceCapacity" in proc.stderr
    zones = {i["Placement"]["AvailabilityZone"] for i in cluster_resources(aws.ec2(), "cap")["instances"]}
    assert zones == {"us-east-1b"}
    assert ftc("down", "--name", "cap").returncode == 0
    assert_nothing_left(aws.ec2(), "cap")


def test_a_zone_without_a_default_subnet_is_named_as_the_option_was_typed(aws, ftc_home):
    proc = ftc(*UP, "--name", "nozone", "--nodes", "1", "--zones", "us-east-1z")
    assert_refused(proc, "--zones: 'us-east-1z' has no default subnet in us-east-1; allowed: us-east-1a", ftc_home)
    assert_nothing_left(aws.ec2(), "nozone")


def test_no_capacity_anywhere_rolls_back(aws, ftc_home):
    aws.faults(no_capacity=["us-east-1a", "us-east-1b"])
    proc = ftc(*UP, "--name", "nocap", "--nodes", "2", "--zones", "us-east-1a,us-east-1b")
    assert proc.returncode == 1
    assert "no capacity for 2 x c6i.16xlarge in us-east-1a, us-east-1b" in proc.stderr
    assert_nothing_left(aws.ec2(), "nocap")


# EC2 calls of `up`, in order: DescribeInstanceTypes (the catalog: its failure falls back to the
# snapshot, tests/test_catalog.py), DescribeImages, DescribeVpcs, DescribeSubnets, CreateKeyPair,
# CreateSecurityGroup, AuthorizeSecurityGroupIngress, CreatePlacementGroup, RunInstances,
# DescribeInstanceStatus, DescribeInstances.
@pytest.mark.parametrize("call", range(2, 12))
def test_failure_at_any_ec2_call_of_up_leaves_nothing(aws, ftc_home, call):
    aws.faults(fail_at_call=call)
    proc = ftc(*UP, "--name", "inj", "--nodes", "3")
    assert proc.returncode == 1, proc.stderr
    assert "injected failure" in proc.stderr
    assert_nothing_left(aws.ec2(), "inj")
    assert not (ftc_home / "clusters" / "inj").exists()


def test_ctrl_c_mid_up_rolls_back_everything(aws, ftc_home):
    # Held where `up` waits for the instances it launched: every resource exists by then.
    release = ftc_home.parent / "release-describe"
    aws.faults(hold={"DescribeInstanceStatus": str(release)})
    proc = subprocess.Popen([*FTC, *UP, "--name", "intr", "--nodes", "4"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    ec2 = aws.ec2()
    reached = release.with_name(release.name + ".reached")
    while not reached.exists():
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    assert len(cluster_resources(ec2, "intr")["instances"]) == 4
    proc.send_signal(signal.SIGINT)
    release.touch()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "up interrupted; rolling back" in err and "intr rolled back: nothing left running" in err, err
    assert_nothing_left(ec2, "intr")


def test_down_twice_is_fine(aws, ftc_home):
    assert up("twice", 2) == 0
    assert main(["down", "--name", "twice"]) == 0
    proc = ftc("down", "--name", "twice", "--provider", "aws")
    assert proc.returncode == 0, proc.stderr
    assert_nothing_left(aws.ec2(), "twice")


def test_down_without_state_finds_resources_by_tag(aws, ftc_home):
    import shutil
    assert up("lost", 3) == 0
    shutil.rmtree(ftc_home)
    proc = ftc("down", "--name", "lost")
    assert proc.returncode == 0, proc.stderr
    assert "no local state" in proc.stderr
    assert_nothing_left(aws.ec2(), "lost")


def test_down_with_corrupt_state(aws, ftc_home):
    assert up("corrupt", 2) == 0
    path = ftc_home / "clusters" / "corrupt" / "state.json"
    path.write_text(path.read_text()[:40])
    proc = ftc("down", "--name", "corrupt", "--provider", "aws")
    assert proc.returncode == 0, proc.stderr
    assert_nothing_left(aws.ec2(), "corrupt")


def test_api_calls_do_not_grow_with_nodes(aws, ftc_home):
    counts = {}
    for nodes in (1, 64):
        aws_provider.API_CALLS.clear()
        assert up(f"scale{nodes}", nodes) == 0
        assert main(["down", "--name", f"scale{nodes}"]) == 0
        counts[nodes] = dict(aws_provider.API_CALLS)
    # the catalog, read once a day: only the first `up` asked (moto has no Price List API: one try)
    assert counts[1].pop("DescribeInstanceTypes") == 1 and counts[1].pop("GetProducts") == 1, counts
    assert counts[1] == counts[64], counts
    assert counts[64]["RunInstances"] == 1 and counts[64]["TerminateInstances"] == 1


def test_status_json_gives_what_scripts_need(aws, ftc_home):
    assert up("js", 2) == 0
    proc = ftc("status", "--name", "js", "--json")
    data = json.loads(proc.stdout)
    assert data["provider"] == "aws" and data["phase"] == "running"
    for node in data["nodes"]:
        assert node["id"].startswith("i-") and node["public_ip"] and node["private_ip"]
        assert node["ssh_user"] == "ec2-user" and node["ssh_port"] == 22 and node["live"] == "running"
    human = ftc("status", "--name", "js")
    assert "so far" in human.stdout and "running" in human.stdout
    aws.ec2().terminate_instances(InstanceIds=[data["nodes"][1]["id"]])
    differs = ftc("status", "--name", "js")
    assert "js-1 is terminated" in differs.stderr
    assert main(["down", "--name", "js"]) == 0


def test_up_without_terminal_or_yes_refuses(aws, ftc_home):
    proc = ftc("up", "--provider", "aws", "--name", "noyes", "--ssh-cidr", "203.0.113.7/32", "--no-bootstrap",
               stdin=subprocess.DEVNULL)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == ("error: --yes is not given and there is no terminal to confirm on; "
                                                    "add --yes to spend money")  # the form the user typed
    assert "cost: about $" in proc.stderr
    assert_nothing_left(aws.ec2(), "noyes")
    assert not (ftc_home / "clusters" / "noyes").exists()


def test_dry_run_creates_nothing(aws, ftc_home):
    proc = ftc("up", "--provider", "aws", "--name", "dry", "--ssh-cidr", "203.0.113.7/32", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "nothing was created" in proc.stderr and "plan: 2 x c6i.16xlarge" in proc.stderr
    assert_nothing_left(aws.ec2(), "dry")


def test_make_targets_work_against_moto(aws, ftc_home):
    from conftest import REPO
    env = {**os.environ, "FTC_HOME": str(ftc_home)}
    made = subprocess.run(["make", "-s", "-C", str(REPO), "cluster", "NODES=4", "PROVIDER=aws", "YES=1", "BOOTSTRAP=0",
                           "NAME=mk", "SSH_CIDR=203.0.113.7/32"], capture_output=True, text=True, env=env)
    assert made.returncode == 0, made.stderr
    assert len(cluster_resources(aws.ec2(), "mk")["instances"]) == 4
    gone = subprocess.run(["make", "-s", "-C", str(REPO), "destroy", "NAME=mk"], capture_output=True, text=True, env=env)
    assert gone.returncode == 0, gone.stderr
    assert_nothing_left(aws.ec2(), "mk")


@pytest.mark.parametrize("variable", ["FTC_AWS_POLL_SECONDS", "FTC_AWS_WAIT_MINUTES"])
def test_a_bad_aws_tuning_variable_is_refused_before_anything_is_created(aws, ftc_home, variable):
    proc = ftc("up", "--name", "poll", "--nodes", "1", *AWS_UP, env={variable: "x"})
    assert_refused(proc, f"{variable}='x' is not a number", ftc_home)
    assert_nothing_left(aws.ec2(), "poll")

