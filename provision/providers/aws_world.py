"""What the AWS provider owns, without boto3: Intel Xeon instance types, their size and price, the
regions, the forms of a zone, an AMI id, a tag value and an S3 URI, its own settings (AMI, ROOT_VOLUME_GB,
ENA_EXPRESS, SSH_CIDR, ALLOW_OPEN_SSH) and their rules, the reader of a spot node's notice (IMDSv2), and
the network of a cluster placement group. Shared code reads these through the registry (records.py).

The catalog here is the snapshot bundled with ftc (aws_catalog.py: EC2's DescribeInstanceTypes facts,
us-east-1 on-demand list prices), so a spec is checked and a plan made with no network and no
credentials; `providers.catalog("aws", region, refresh=True)` reads the region's own from EC2 and the
Price List API (aws.catalog), and says which source it used. Other regions' prices differ by a few
percent, which is why a plan says "about".
"""

import ipaddress
from typing import TYPE_CHECKING, Any

from runner.node.spot import IMDS_V2, SpotReader

from ..errors import UsageError
from ..values import boolean, label, whole
from .aws_catalog import snapshot
from .records import AwsResources, NameForm, Provider, Setting, Traits, World

if TYPE_CHECKING:
    from ..spec import ClusterSpec

INSTANCE_TYPES = snapshot().instance_types

REGIONS = (
    "us-east-1", "us-east-2", "us-west-1", "us-west-2", "ca-central-1",
    "eu-west-1", "eu-west-2", "eu-west-3", "eu-central-1", "eu-north-1",
    "ap-south-1", "ap-northeast-1", "ap-northeast-2", "ap-southeast-1", "ap-southeast-2",
    "sa-east-1",
)

# Amazon Linux 2023, resolved at launch time so the image is always current.
DEFAULT_AMI_PARAMETER = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
DEFAULT_SSH_USER = "ec2-user"
AMI_FORM = NameForm(r"ami-[0-9a-f]{8,17}", "an AMI id", "ami- followed by 8-17 hex digits")


def _cidr(key: str, raw: Any) -> str:
    value = str(raw).strip()
    if not value:
        return ""
    try:
        return str(ipaddress.ip_network(value, strict=False))
    except ValueError:
        raise UsageError(f"{label(key)}={raw!r} is not a CIDR block; allowed: e.g. 203.0.113.7/32") from None


def too_open(network: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bool:
    """SSH open to more than a /16 of IPv4 (65,536 addresses: a site's or VPN's range at most) or a /48 of
    IPv6 (one site's allocation) needs ALLOW_OPEN_SSH: 0.0.0.0/1 is half the internet. Pure."""
    return network.prefixlen < (16 if network.version == 4 else 48)


def check(spec: "ClusterSpec") -> None:
    """The rules among AWS's settings and the spec's: SSH open past a site needs ALLOW_OPEN_SSH, and ENA
    Express a type that has it (the spec's instance type is of this catalog: AWS's world is the default
    world that a spec of a provider with no catalog is checked against too)."""
    own = spec.settings
    network = ipaddress.ip_network(own["ssh_cidr"]) if own["ssh_cidr"] else None
    if network and too_open(network) and not own["allow_open_ssh"]:
        everyone = network.prefixlen == 0
        raise UsageError(f"{label('ssh_cidr')}={own['ssh_cidr']!r} opens SSH to "
                         f"{'the whole internet' if everyone else 'more than a /16 of addresses'}; give your own "
                         f"address (e.g. 203.0.113.7/32) or set {label('allow_open_ssh')}=1 to really mean it")
    if own["ena_express"] and not INSTANCE_TYPES[spec.instance_type].ena_express:
        family = spec.instance_type.partition(".")[0]
        offered = sorted((n for n, k in INSTANCE_TYPES.items() if k.ena_express and n.startswith(f"{family}.")),
                         key=lambda n: INSTANCE_TYPES[n].vcpus) or sorted(n for n, k in INSTANCE_TYPES.items()
                                                                          if k.ena_express)
        raise UsageError(f"{label('ena_express')}=1, but {label('instance_type')}={spec.instance_type!r} has no ENA "
                         f"Express; allowed: {label('ena_express')}=0, or a type that has it ({', '.join(offered)})")


SETTINGS = {
    "ami": Setting(AMI_FORM.parse, "", "AWS image id (default: Amazon Linux 2023 from its public SSM parameter)"),
    "root_volume_gb": Setting(whole(8, 16384), 100, "AWS root volume size in GB (default 100)"),
    # ENA Express (SRD) on the nodes' network interfaces: a faster cap on one flow (World.express_flow_gbps)
    "ena_express": Setting(boolean, lambda kind: kind.ena_express, "AWS: 1 or 0, ENA Express (SRD) on the nodes' "
                           "network interfaces (default: 1 where the type has it)"),
    "ssh_cidr": Setting(_cidr, "", "AWS: who may ssh to the nodes (default: your address /32)"),  # "": the caller's
    "allow_open_ssh": Setting(boolean, False, "1: allow --ssh-cidr 0.0.0.0/0"),  # the opt-in 0.0.0.0/0 needs
}

AWS = Provider(
    name="aws",
    module="provision.providers.aws",
    traits=Traits(resources=AwsResources, instance_types=True, billed=True, shares_this_machine=False,
                  own_hosts=False, user_login=False, user_stack_python=False, found_by_tag=True),
    world=World(
        title="AWS",
        instance_types=INSTANCE_TYPES,
        default_instance_type="c6i.16xlarge",  # the 2021 recipe's (runner/sweep.py)
        regions=REGIONS,
        default_region="us-east-1",
        zone_form=NameForm(r"[a-z]{2}-[a-z]+-\d[a-z]", "an availability zone name", "e.g. us-east-1a"),
        label_form=NameForm(r"[\w.@+=:/ -]{0,128}", "an ftc:owner tag value",
                            "up to 128 letters, digits, spaces and _.:/=+-@"),
        settings=SETTINGS,
        check=check,
        spot_reader=SpotReader(IMDS_V2, "http://169.254.169.254"),  # EC2's instance metadata service
        checkpoint_store=NameForm(r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/\S*)?", "an S3 URI", "s3://bucket/prefix"),
        flow_gbps=10.0,  # AWS's limit on one TCP flow inside a cluster placement group
        express_flow_gbps=25.0,  # that limit with ENA Express (SRD) on both ends
        hop_latency_s=50e-6,  # one hop inside a cluster placement group
        express_setting="ena_express",
        max_hours_means="the nodes power off after it",  # the watchdog in their user data
    ),
)
