"""What the AWS provider owns, without boto3: Intel Xeon instance types, their size and price, the
regions, the forms of a zone, an AMI id and an S3 URI, the metadata service a spot node asks, and the
network of a cluster placement group. Shared code reads these through the registry (records.py).

Prices are on-demand Linux USD per hour in us-east-1 (2026 list prices); other regions differ by a
few percent, which is why the plan says "about".
"""

from .records import AwsResources, CpuGeneration, InstanceType, NameForm, Provider, Traits, World

ICE_LAKE = CpuGeneration("Ice Lake", native_bf16=False)
SAPPHIRE_RAPIDS = CpuGeneration("Sapphire Rapids", native_bf16=True)


def _family(prefix: str, cpu: CpuGeneration, mem_per_vcpu: int, usd_per_vcpu: float) -> dict[str, InstanceType]:
    sizes = {"large": 2, "xlarge": 4, "2xlarge": 8, "4xlarge": 16, "8xlarge": 32,
             "12xlarge": 48, "16xlarge": 64, "24xlarge": 96, "32xlarge": 128}
    # EC2's published network bandwidth of the 6i/7i families, by vCPUs.
    gbps = {2: 12.5, 4: 12.5, 8: 12.5, 16: 12.5, 32: 12.5, 48: 18.75, 64: 25.0, 96: 37.5, 128: 50.0}
    return {f"{prefix}.{size}": InstanceType(v, v * mem_per_vcpu, round(v * usd_per_vcpu, 4), cpu, gbps[v], ena_express=v >= 48)
            for size, v in sizes.items()}


INSTANCE_TYPES: dict[str, InstanceType] = {
    **_family("c6i", ICE_LAKE, 2, 0.0425),
    **_family("m6i", ICE_LAKE, 4, 0.048),
    **_family("r6i", ICE_LAKE, 8, 0.063),
    **_family("c7i", SAPPHIRE_RAPIDS, 2, 0.044625),
    **_family("m7i", SAPPHIRE_RAPIDS, 4, 0.0504),
    **_family("r7i", SAPPHIRE_RAPIDS, 8, 0.0665),
}

REGIONS = (
    "us-east-1", "us-east-2", "us-west-1", "us-west-2", "ca-central-1",
    "eu-west-1", "eu-west-2", "eu-west-3", "eu-central-1", "eu-north-1",
    "ap-south-1", "ap-northeast-1", "ap-northeast-2", "ap-southeast-1", "ap-southeast-2",
    "sa-east-1",
)

# Amazon Linux 2023, resolved at launch time so the image is always current.
DEFAULT_AMI_PARAMETER = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
DEFAULT_SSH_USER = "ec2-user"

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
        image_form=NameForm(r"ami-[0-9a-f]{8,17}", "an AMI id", "ami- followed by 8-17 hex digits"),
        spot_notice_endpoint="http://169.254.169.254",  # EC2's instance metadata service
        checkpoint_store=NameForm(r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/\S*)?", "an S3 URI", "s3://bucket/prefix"),
        flow_gbps=10.0,  # AWS's limit on one TCP flow inside a cluster placement group
        express_flow_gbps=25.0,  # that limit with ENA Express (SRD) on both ends
        hop_latency_s=50e-6,  # one hop inside a cluster placement group
    ),
)
