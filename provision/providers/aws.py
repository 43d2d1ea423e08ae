"""The AWS provider (boto3): a key pair, a security group and a cluster placement group,
then all N instances in one RunInstances call.

Every resource carries the tags `ftc:cluster=<name>` and `ftc:owner=<owner>`; `terminate`
finds what to delete by those tags as well as by the ids in the state, so it works
after `rm -rf ~/.ftc`. The number of API calls does not grow with N (waiter polls
aside): one call creates, describes or deletes all instances at once.
boto3 honours AWS_ENDPOINT_URL, which is how the tests point it at a moto server.
"""

import getpass
import os
import sys
import time
import urllib.request
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path

import boto3
from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from .. import state as st
from ..errors import FtcError, UsageError, option, switch_on
from ..templates import render
from ..ui import console
from ..values import from_env, number
from . import aws_catalog
from .aws_world import DEFAULT_AMI_PARAMETER, DEFAULT_SSH_USER
from .records import AwsPreflight, AwsResources, Catalog, InstanceType, NodeStatus, Record

TAG_CLUSTER = "ftc:cluster"
TAG_OWNER = "ftc:owner"
LIVE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]
API_CALLS: Counter = Counter()  # operation name -> calls made by this process (the scale test reads it)
POLL_SECONDS = 5.0  # between EC2 polls; FTC_AWS_POLL_SECONDS overrides it
WAIT_MINUTES = 15.0  # for instances to start, or to terminate; FTC_AWS_WAIT_MINUTES overrides it


def poll_seconds() -> float:
    return from_env(os.environ, "FTC_AWS_POLL_SECONDS", number(0, 60), POLL_SECONDS)


def wait_minutes() -> float:
    return from_env(os.environ, "FTC_AWS_WAIT_MINUTES", number(0, 24 * 60), WAIT_MINUTES)


def _count(event_name: str, **_) -> None:
    API_CALLS[event_name.rsplit(".", 1)[-1]] += 1


def client(service: str, region: str, quick: bool = False):
    # Retried calls ride out RequestLimitExceeded and kin; AWS_MAX_ATTEMPTS, the SDKs' own
    # variable, still sets how many attempts when the user gives it. A quick client (the catalog's,
    # which has a fallback) gives up within seconds rather than keep `up` or a plan waiting.
    retries = {"mode": "standard"} if os.environ.get("AWS_MAX_ATTEMPTS") else {"mode": "standard", "max_attempts": 8}
    config = BotoConfig(retries={"mode": "standard", "max_attempts": 2}, connect_timeout=5, read_timeout=20) \
        if quick else BotoConfig(retries=retries)
    made = boto3.session.Session(region_name=region).client(service, config=config)
    made.meta.events.register(f"before-call.{made.meta.service_model.endpoint_prefix}", _count)
    return made


def has_credentials() -> bool:
    """Whether boto3's chain finds credentials; a broken AWS configuration (a profile that does not
    exist) counts as configured: AWS was meant to be used, and asking it will say what is wrong."""
    try:
        return boto3.session.Session().get_credentials() is not None
    except BotoCoreError:
        return True


def tags(state: st.ClusterState, resource: str) -> list[dict]:
    spec = state.cluster_spec
    return [{"ResourceType": resource, "Tags": [
        {"Key": TAG_CLUSTER, "Value": state.name}, {"Key": TAG_OWNER, "Value": spec.owner or getpass.getuser()},
        {"Key": "Name", "Value": f"ftc-{state.name}"}]}]


def tag_filter(name: str) -> list[dict]:
    return [{"Name": f"tag:{TAG_CLUSTER}", "Values": [name]}]


def resources(state: st.ClusterState) -> AwsResources:
    """The state's record of what this provider created."""
    if not isinstance(state.resources, AwsResources):
        raise TypeError(f"cluster {state.name}: {type(state.resources).__name__} is not an AWS cluster's record")
    return state.resources


def _explain(exc: Exception, doing: str) -> FtcError:
    if isinstance(exc, NoCredentialsError):
        return UsageError("no AWS credentials found; run `aws configure` or set AWS_PROFILE / AWS_ACCESS_KEY_ID")
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        return FtcError(f"{doing}: {error.get('Code')}: {error.get('Message')}")
    return FtcError(f"{doing}: {exc}")


# ---- the catalog: EC2's own facts and prices ------------------------------------------------------

PRICING_REGION = "us-east-1"  # the Price List API's endpoint; it prices every region


def reachable() -> bool:
    """Whether EC2 can be asked from here: credentials, or an endpoint named (a moto server, the emulator)."""
    return bool(os.environ.get("AWS_ENDPOINT_URL")) or has_credentials()


def catalog(region: str, refresh: bool) -> Catalog:
    """Region `region`'s catalog. With `refresh` and EC2 reachable, a cache older than today is fetched
    anew (DescribeInstanceTypes; prices from the Price List API when it answers, else the snapshot's)
    and saved; otherwise, or when EC2 does not answer, the cache, else the bundled snapshot."""
    found = aws_catalog.cached(region)
    if refresh and reachable() and aws_catalog.stale(found, date.today()):
        try:
            found = fetch_catalog(region)
            aws_catalog.save(found)
        except (ClientError, BotoCoreError) as exc:
            console.print(f"[yellow]the EC2 catalog of {escape(region)} could not be read "
                          f"({escape(str(_explain(exc, 'DescribeInstanceTypes')))}); planning from "
                          f"{'the cache' if found else 'the snapshot bundled with ftc'}[/]")
        except OSError as exc:  # read, but not cached: the plan still uses it
            console.print(f"[yellow]the catalog could not be cached ({escape(str(exc))})[/]")
    return found.catalog() if found else aws_catalog.snapshot()


def fetch_catalog(region: str) -> aws_catalog.CatalogFile:
    """ftc's families as EC2 describes them in `region`, priced by the Price List API or the snapshot."""
    ec2 = client("ec2", region, quick=True)
    pages = ec2.get_paginator("describe_instance_types").paginate(
        Filters=[{"Name": "instance-type", "Values": [f"{family}.*" for family in aws_catalog.FAMILIES]}])
    entries = sorted((aws_catalog.trimmed(e) for page in pages for e in page["InstanceTypes"]
                      if aws_catalog.planned(e["InstanceType"], e["VCpuInfo"]["DefaultVCpus"])),
                     key=lambda e: e["InstanceType"])
    today = date.today().isoformat()
    prices = list_prices(region, [e["InstanceType"] for e in entries])
    fallback = aws_catalog.snapshot_file()
    return aws_catalog.CatalogFile(
        region=region, entries=entries, facts_source=f"EC2 DescribeInstanceTypes in {region}", facts_date=today,
        prices=prices or fallback.prices, prices_date=today if prices else fallback.prices_date,
        prices_source="AWS Price List API" if prices else f"the snapshot bundled with ftc: {fallback.prices_source}")


def list_prices(region: str, names: list[str]) -> dict[str, float]:
    """Each type's on-demand Linux price in `region` from the Price List API; {} when it does not answer
    for all of them (one source for the whole catalog, so a plan can name it)."""
    pricing = client("pricing", PRICING_REGION, quick=True)

    def price(name: str) -> float | None:
        reply = pricing.get_products(ServiceCode="AmazonEC2", MaxResults=10, Filters=[
            {"Type": "TERM_MATCH", "Field": field, "Value": value} for field, value in (
                ("instanceType", name), ("regionCode", region), ("operatingSystem", "Linux"),
                ("tenancy", "Shared"), ("preInstalledSw", "NA"), ("capacitystatus", "Used"),
                ("marketoption", "OnDemand"), ("licenseModel", "No License required"))])
        return aws_catalog.on_demand_usd(reply["PriceList"])

    try:
        if not names or price(names[0]) is None:  # one call first: where it fails, it fails once
            return {}
        with ThreadPoolExecutor(max_workers=8) as pool:
            found = dict(zip(names, pool.map(price, names)))
    except (ClientError, BotoCoreError):
        return {}
    return found if all(found.values()) else {}


def instance_kind(spec) -> tuple[InstanceType, Catalog]:
    """The spec's instance type in its region's catalog (refreshed, as `up` plans it), and the catalog;
    a type EC2 does not offer there is refused in one line."""
    offered = catalog(spec.region, refresh=True)
    kind = offered.instance_types.get(spec.instance_type)
    if kind is None:
        raise UsageError(f"{option('instance_type')}={spec.instance_type!r} is not offered in {spec.region} "
                         f"({offered.facts_source}); allowed: {', '.join(sorted(offered.instance_types))}")
    return kind, offered


# ---- before anything is created --------------------------------------------------------------

def caller_cidr() -> str:
    """Your address as EC2 sees it: asked of AWS's what-is-my-IP service, except for an EC2 on this machine
    (an emulator or moto at a loopback AWS_ENDPOINT_URL), where it is the loopback and nothing leaves it."""
    if loopback_endpoint(os.environ):
        return "127.0.0.1/32"
    try:
        with urllib.request.urlopen("https://checkip.amazonaws.com", timeout=5) as reply:  # noqa: S310 - fixed https URL
            return f"{reply.read().decode().strip()}/32"
    except OSError:
        raise UsageError(f"{option('ssh_cidr')} is not set and your public address could not be found (no network?); "
                         f"give {option('ssh_cidr')}=<your address>/32") from None


def loopback_endpoint(env) -> bool:
    """The EC2 endpoint ftc talks to is on this machine (AWS_ENDPOINT_URL_EC2, else AWS_ENDPOINT_URL). Pure."""
    import ipaddress
    import urllib.parse
    host = urllib.parse.urlparse(env.get("AWS_ENDPOINT_URL_EC2") or env.get("AWS_ENDPOINT_URL") or "").hostname or ""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def preflight(state: st.ClusterState) -> AwsPreflight:
    """Resolve what `up` needs without creating anything: AMI, SSH CIDR, zones, subnets."""
    spec = state.cluster_spec
    cidr = spec.settings["ssh_cidr"] or caller_cidr()
    try:
        ec2 = client("ec2", spec.region)
        ami = (spec.settings["ami"]
               or client("ssm", spec.region).get_parameter(Name=DEFAULT_AMI_PARAMETER)["Parameter"]["Value"])
        image = ec2.describe_images(ImageIds=[ami])["Images"]
        if not image:
            raise UsageError(f"AMI={ami!r} does not exist in {spec.region}")
        vpcs = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"]
        if not vpcs:
            raise FtcError(f"{spec.region} has no default VPC; create one with `aws ec2 create-default-vpc`")
        subnets = ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpcs[0]["VpcId"]]},
                                                {"Name": "default-for-az", "Values": ["true"]}])["Subnets"]
    except (ClientError, BotoCoreError) as exc:
        raise _explain(exc, "checking the account") from None
    by_zone = {s["AvailabilityZone"]: s["SubnetId"] for s in subnets}
    zones = spec.zones or sorted(by_zone)
    unknown = [z for z in zones if z not in by_zone]
    if unknown:
        raise UsageError(f"{option('zones')}: {unknown[0]!r} has no default subnet in {spec.region}; allowed: "
                         f"{', '.join(sorted(by_zone))}")
    return AwsPreflight(ami=ami, root_device=image[0].get("RootDeviceName", "/dev/xvda"), ssh_cidr=cidr,
                        vpc=vpcs[0]["VpcId"], subnets={z: by_zone[z] for z in zones})


def plan_text(state: st.ClusterState, facts: AwsPreflight, kind: InstanceType, offered: Catalog) -> str:
    spec = state.cluster_spec
    hourly = kind.usd_per_hour * spec.nodes
    return (f"plan: {spec.nodes} x {spec.instance_type} ({kind.cpu}, {kind.vcpus} vCPU, {kind.memory_gib} GiB, "
            f"{kind.network_gbps:g} Gbit/s{', ENA Express' if spec.settings['ena_express'] else ''}) "
            f"{'spot ' if spec.spot else ''}in {spec.region} ({', '.join(facts.subnets)}), placement group "
            f"'cluster', AMI {facts.ami}, {spec.settings['root_volume_gb']} GB encrypted gp3, SSH from {facts.ssh_cidr}, "
            f"powered off after {spec.max_hours:g} h.\n"
            f"cost: about ${hourly:.2f}/hour for the cluster (on-demand list price"
            f"{'; spot is usually less' if spec.spot else ''}), ${hourly * spec.max_hours:.2f} if it runs to its max lifetime\n"
            f"catalog: {offered.source}")


def check_settings() -> None:
    """Every FTC_AWS_* tuning variable, parsed before anything is created: a bad one is one line
    now, not a traceback once instances exist."""
    poll_seconds()
    wait_minutes()


def confirm(state: st.ClusterState, yes: bool) -> None:
    kind, offered = instance_kind(state.cluster_spec)
    facts = preflight(state)
    state.resources.preflight = facts
    console.print(plan_text(state, facts, kind, offered), markup=False)
    if yes:
        return
    if not sys.stdin.isatty():
        raise UsageError(f"{option('yes')} is not given and there is no terminal to confirm on; add {switch_on('yes')} "
                         "to spend money")
    if input("create it? [y/N] ").strip().lower() not in ("y", "yes"):
        raise UsageError("not confirmed; nothing created")


def dry_run(spec) -> None:
    state = st.ClusterState(name=spec.name, provider="aws", spec=spec.to_dict())
    kind, offered = instance_kind(spec)
    facts = preflight(state)
    console.print(plan_text(state, facts, kind, offered), markup=False)
    ec2 = client("ec2", spec.region)
    checks = {
        "ec2:CreateKeyPair": lambda: ec2.create_key_pair(KeyName=f"ftc-{spec.name}", DryRun=True),
        "ec2:CreateSecurityGroup": lambda: ec2.create_security_group(
            GroupName=f"ftc-{spec.name}", Description="ftc", VpcId=facts.vpc, DryRun=True),
        "ec2:RunInstances": lambda: ec2.run_instances(
            ImageId=facts.ami, InstanceType=spec.instance_type, MinCount=spec.nodes, MaxCount=spec.nodes, DryRun=True),
    }
    missing = []
    for permission, call in checks.items():
        try:
            call()
        except ClientError as exc:
            code = exc.response["Error"]["Code"]
            if code != "DryRunOperation":
                missing.append(f"{permission} ({code})")
    vcpus = kind.vcpus * spec.nodes
    try:
        quota = client("service-quotas", spec.region).get_service_quota(
            ServiceCode="ec2", QuotaCode="L-1216C47A" if not spec.spot else "L-34B43A08")["Quota"]["Value"]
        quota_line = f"vCPU quota {quota:.0f}, this cluster needs {vcpus}"
        if quota < vcpus:
            missing.append(f"vCPU quota: {quota:.0f} < {vcpus}; ask AWS for more in Service Quotas")
    except (ClientError, BotoCoreError) as exc:
        quota_line = f"vCPU quota not readable ({type(exc).__name__}); this cluster needs {vcpus}"
    console.print(quota_line, markup=False)
    if missing:
        raise FtcError("dry run: missing " + "; ".join(missing))
    console.print("dry run: credentials and permissions are fine; nothing was created")


# ---- launch ------------------------------------------------------------------------------------

def launch(state: st.ClusterState, record: Record) -> None:
    spec = state.cluster_spec
    ids = resources(state)
    facts = ids.preflight or preflight(state)
    ec2 = client("ec2", spec.region)
    name = f"ftc-{state.name}"
    try:
        key = ec2.create_key_pair(KeyName=name, KeyType="ed25519", TagSpecifications=tags(state, "key-pair"))
        ids.key_pair = name
        record()
        path = st.access_key_path(state.name)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.touch(mode=0o600)
        path.write_text(key["KeyMaterial"] if key["KeyMaterial"].endswith("\n") else key["KeyMaterial"] + "\n")

        group = ec2.create_security_group(GroupName=name, VpcId=facts.vpc, TagSpecifications=tags(state, "security-group"),
                                          Description=f"ftc cluster {state.name}: all traffic inside, SSH from one CIDR")
        ids.security_group = group["GroupId"]
        record()
        ec2.authorize_security_group_ingress(GroupId=group["GroupId"], IpPermissions=[
            {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group["GroupId"], "Description": "cluster members"}]},
            {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22,
             "IpRanges": [{"CidrIp": facts.ssh_cidr, "Description": "ftc controller"}]}])

        ec2.create_placement_group(GroupName=name, Strategy="cluster", TagSpecifications=tags(state, "placement-group"))
        ids.placement_group = name
        record()
        run_instances(state, ec2, facts, record)
    except (ClientError, BotoCoreError) as exc:
        raise _explain(exc, f"creating cluster {state.name}") from None


def run_instances(state: st.ClusterState, ec2, facts: AwsPreflight, record: Record) -> None:
    """All N in one call; on InsufficientInstanceCapacity the next zone, saying why."""
    spec = state.cluster_spec
    own = spec.settings  # AWS's own (aws_world.SETTINGS)
    ids = resources(state)
    user_data = render("user_data.sh.j2", cluster=state.name, max_minutes=int(spec.max_hours * 60))
    failures = []
    for zone, subnet in facts.subnets.items():
        token = ids.client_tokens.setdefault(zone, f"ftc-{state.name}-{uuid.uuid4().hex[:12]}")
        record()  # the token first: a retry after a crash finds the same instances, not new ones
        request = dict(
            ImageId=facts.ami, InstanceType=spec.instance_type, MinCount=spec.nodes, MaxCount=spec.nodes,
            KeyName=ids.key_pair, NetworkInterfaces=[network_interface(subnet, ids.security_group, own["ena_express"])],
            Placement={"GroupName": ids.placement_group, "AvailabilityZone": zone},
            ClientToken=token, UserData=user_data, InstanceInitiatedShutdownBehavior="terminate",
            MetadataOptions={"HttpTokens": "required", "HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 1},
            BlockDeviceMappings=[{"DeviceName": facts.root_device, "Ebs": {
                "VolumeSize": own["root_volume_gb"], "VolumeType": "gp3", "Encrypted": True, "DeleteOnTermination": True}}],
            TagSpecifications=tags(state, "instance") + tags(state, "volume"))
        if spec.spot:
            request["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": {
                "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}
        try:
            reply = ec2.run_instances(**request)
        except ClientError as exc:
            code = exc.response["Error"]["Code"]
            if code not in ("InsufficientInstanceCapacity", "InsufficientCapacity"):
                raise
            failures.append(zone)
            message = exc.response["Error"].get("Message", "")
            console.print(f"[yellow]zone {escape(zone)}: {escape(code)}: {escape(message)}; trying the next zone[/]")
            continue
        ids.instances = [i["InstanceId"] for i in reply["Instances"]]
        ids.zone = zone
        ids.ena_express = own["ena_express"]
        record()
        return
    raise FtcError(f"no capacity for {spec.nodes} x {spec.instance_type} in {', '.join(failures)}; "
                   "try other ZONES, another REGION or INSTANCE_TYPE, or fewer NODES")


def network_interface(subnet: str, group: str, ena_express: bool) -> dict:
    """Each node's one network interface as RunInstances takes it: the subnet and security group (which
    move here from the request once it names an interface), a public address for SSH from the controller,
    gone with the instance, and ENA Express (SRD, TCP and UDP) where asked: set at launch, no later call."""
    interface = {"DeviceIndex": 0, "SubnetId": subnet, "Groups": [group], "AssociatePublicIpAddress": True,
                 "DeleteOnTermination": True}
    if ena_express:
        interface["EnaSrdSpecification"] = {"EnaSrdEnabled": True, "EnaSrdUdpSpecification": {"EnaSrdUdpEnabled": True}}
    return interface


def ena_express_on(instance: dict) -> bool:
    """Whether DescribeInstances says the instance's primary interface has ENA Express on."""
    primary = [n for n in instance.get("NetworkInterfaces", []) if n.get("Attachment", {}).get("DeviceIndex") == 0]
    return bool(primary and primary[0]["Attachment"].get("EnaSrdSpecification", {}).get("EnaSrdEnabled"))


def wait(state: st.ClusterState, record: Record) -> None:
    """Until every instance runs and passes both status checks; a progress bar meanwhile."""
    try:
        _wait_until_checked(state)
        record()
    except (ClientError, BotoCoreError) as exc:
        raise _explain(exc, f"waiting for the instances of cluster {state.name}") from None


def _wait_until_checked(state: st.ClusterState) -> None:
    spec = state.cluster_spec
    ec2 = client("ec2", spec.region)
    ids = resources(state).instances
    limit = wait_minutes()
    deadline = time.monotonic() + limit * 60
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console) as progress:
        running = progress.add_task("running", total=len(ids))
        checked = progress.add_task("status checks ok", total=len(ids))
        while True:
            statuses = ec2.describe_instance_status(InstanceIds=ids, IncludeAllInstances=True)["InstanceStatuses"]
            by_id = {s["InstanceId"]: s for s in statuses}
            dead = [i for i, s in by_id.items() if s["InstanceState"]["Name"] in ("shutting-down", "terminated")]
            if dead:
                raise FtcError(f"instance {dead[0]} was terminated while starting (spot reclaimed, or a failed boot?)")
            up = [i for i, s in by_id.items() if s["InstanceState"]["Name"] == "running"]
            ok = [i for i in up if by_id[i].get("InstanceStatus", {}).get("Status") == "ok"
                  and by_id[i].get("SystemStatus", {}).get("Status") == "ok"]
            progress.update(running, completed=len(up))
            progress.update(checked, completed=len(ok))
            if len(ok) == len(ids):
                break
            if time.monotonic() > deadline:
                raise FtcError(f"{len(ids) - len(ok)} instance(s) not ready after {limit:g} min; "
                               "see the EC2 console's status checks")
            time.sleep(poll_seconds())
    reservations = ec2.describe_instances(InstanceIds=ids)["Reservations"]
    instances = {i["InstanceId"]: i for r in reservations for i in r["Instances"]}
    state.nodes = []
    for index, instance_id in enumerate(ids):
        instance = instances[instance_id]
        state.nodes.append(st.NodeInfo(
            index=index, name=f"{state.name}-{index}", id=instance_id,
            public_ip=instance.get("PublicIpAddress", instance["PrivateIpAddress"]),
            private_ip=instance["PrivateIpAddress"], ssh_user=DEFAULT_SSH_USER, ssh_port=22,
            workdir=f"/home/{DEFAULT_SSH_USER}/ftc", authorized_keys=f"/home/{DEFAULT_SSH_USER}/.ssh/authorized_keys",
            zone=instance["Placement"]["AvailabilityZone"]))


# ---- terminate and query ---------------------------------------------------------------------

def _live_instances(ec2, state: st.ClusterState) -> list[str]:
    found = set()
    paginator = ec2.get_paginator("describe_instances")
    for page in paginator.paginate(Filters=tag_filter(state.name) + [{"Name": "instance-state-name", "Values": LIVE_STATES}]):
        found |= {i["InstanceId"] for r in page["Reservations"] for i in r["Instances"]}
    return sorted(found)


def terminate(state: st.ClusterState, record: Record) -> None:
    """Instances first (and wait: a security group in use cannot go), then group, placement group, key.
    When AWS cannot be asked or refuses, the one-line error says what may remain and how to retry."""
    spec = state.cluster_spec
    limit, pause = wait_minutes(), poll_seconds()
    remains = (f"what cluster {state.name} created in {spec.region} (tagged {TAG_CLUSTER}={state.name}) may remain; "
               f"run `ftc down --name {state.name}` again")
    try:
        ec2 = client("ec2", spec.region)
        ids = sorted(set(_live_instances(ec2, state)) | set(_still_live(ec2, resources(state).instances)))
        if ids:
            console.print(f"terminating {len(ids)} instance(s)")
            ec2.terminate_instances(InstanceIds=ids)
            deadline = time.monotonic() + limit * 60
            while _still_live(ec2, ids):
                if time.monotonic() > deadline:
                    raise FtcError(f"instances {ids} not terminated after {limit:g} min; {remains}")
                time.sleep(pause)
        _delete_groups_and_key(ec2, state)
    except ClientError as exc:
        raise FtcError(f"{_explain(exc, f'deleting cluster {state.name}')}; {remains}") from None
    except BotoCoreError as exc:  # no credentials, no network, no such profile: AWS was not asked
        why = "no credentials: `aws configure` or AWS_PROFILE sets them" if isinstance(exc, NoCredentialsError) \
            else str(exc)
        raise FtcError(f"AWS could not be reached ({why}); {remains} once it can be") from None


def _delete_groups_and_key(ec2, state: st.ClusterState) -> None:
    """Security groups, placement groups and key pairs, by tag and by the ids in the state."""
    groups = {g["GroupId"] for g in ec2.describe_security_groups(Filters=tag_filter(state.name))["SecurityGroups"]}
    ids = resources(state)
    groups |= {ids.security_group} if ids.security_group else set()
    for group in sorted(groups):
        _delete_with_retry(lambda group=group: ec2.delete_security_group(GroupId=group),
                           ("InvalidGroup.NotFound", "InvalidGroupId.NotFound"))
    placement = {g["GroupName"] for g in ec2.describe_placement_groups(Filters=tag_filter(state.name))["PlacementGroups"]}
    placement |= {ids.placement_group} if ids.placement_group else set()
    for group in sorted(placement):
        _delete_with_retry(lambda group=group: ec2.delete_placement_group(GroupName=group),
                           ("InvalidPlacementGroup.Unknown",))
    keys = {k["KeyName"] for k in ec2.describe_key_pairs(Filters=tag_filter(state.name))["KeyPairs"]}
    keys |= {ids.key_pair} if ids.key_pair else set()
    for key in sorted(keys):
        ec2.delete_key_pair(KeyName=key)


def _still_live(ec2, ids: list[str]) -> list[str]:
    if not ids:
        return []
    try:
        reservations = ec2.describe_instances(InstanceIds=ids)["Reservations"]
    except ClientError as exc:
        if exc.response["Error"]["Code"] == "InvalidInstanceID.NotFound":
            return []
        raise
    return [i["InstanceId"] for r in reservations for i in r["Instances"] if i["State"]["Name"] != "terminated"]


def _delete_with_retry(call, gone_codes: tuple[str, ...], attempts: int = 12) -> None:
    """DependencyViolation lingers for a while after instances terminate: retry that, nothing else."""
    for attempt in range(attempts):
        try:
            call()
            return
        except ClientError as exc:
            code = exc.response["Error"]["Code"]
            if code in gone_codes:
                return
            if code != "DependencyViolation" or attempt == attempts - 1:
                raise
            time.sleep(poll_seconds())


def query(state: st.ClusterState) -> list[NodeStatus]:
    """Per node; then each launched instance that is no node yet (an `up` killed after RunInstances)."""
    ids = [n.id for n in state.nodes]
    ids += [i for i in resources(state).instances if i not in ids]
    seen = {}
    try:
        ec2 = client("ec2", state.cluster_spec.region)
        if ids:
            for page in ec2.get_paginator("describe_instances").paginate(Filters=tag_filter(state.name)):
                for reservation in page["Reservations"]:
                    for instance in reservation["Instances"]:
                        seen[instance["InstanceId"]] = instance
    except (ClientError, BotoCoreError) as exc:  # status goes on, saying so, for this and every other cluster
        return [NodeStatus(i, "unknown", f"AWS could not be asked ({_explain(exc, 'describe_instances')})"[:160])
                for i in ids]
    result = []
    for instance_id in ids:
        instance = seen.get(instance_id)
        if instance is None:
            result.append(NodeStatus(instance_id, "missing", "not found in EC2"))
        else:
            name = instance["State"]["Name"]
            since = instance.get("LaunchTime")
            result.append(NodeStatus(instance_id, "running" if name == "running" else name,
                                     f"{instance['InstanceType']} in {instance['Placement']['AvailabilityZone']}"
                                     + (", ENA Express" if ena_express_on(instance) else "")
                                     + (f", since {since:%H:%M UTC}" if since else "")))
    return result


def extend(state: st.ClusterState, hours: float) -> None:
    """Push every node's power-off back to `hours` from now (the user-data watchdog's shutdown)."""
    from ..ssh import connect, run
    minutes = int(hours * 60)
    for node in state.nodes:
        with connect(state, node, attempts=3) as conn:
            run(conn, node, "extend", f"sudo shutdown -h +{minutes} 'ftc max lifetime (extended)'")
    console.print(f"cluster {state.name}: nodes now power off (and terminate) in {hours:g} h", markup=False)


def store_checkpoint(checkpoint: Path, uri: str, job_id: str) -> None:
    """The checkpoint to s3://bucket/prefix as <prefix>/<job_id>/last.pt, with this machine's credentials."""
    bucket, _, prefix = uri[len("s3://"):].partition("/")
    key = f"{prefix}/{job_id}/last.pt" if prefix else f"{job_id}/last.pt"
    boto3.session.Session().client("s3").upload_file(str(checkpoint), bucket, key)
