"""What the AWS provider owns, without boto3: Intel Xeon instance types, their size and price, the
regions, the forms of a zone, an AMI id, a tag value and an S3 URI, its own setting (AMI), the reader of
a spot node's notice (IMDSv2), and the network of a cluster placement group. Shared code reads these
through the registry (records.py).

The catalog here is the snapshot bundled with ftc (aws_catalog.py: EC2's DescribeInstanceTypes facts,
us-east-1 on-demand list prices), so a spec is checked and a plan made with no network and no
credentials; `providers.catalog("aws", region, refresh=True)` reads the region's own from EC2 and the
Price List API (aws.catalog), and says which source it used. Other regions' prices differ by a few
percent, which is why a plan says "about".
"""

from runner.node.spot import IMDS_V2, SpotReader

from .aws_catalog import snapshot
from .records import AwsResources, NameForm, Provider, Setting, Traits, World

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
        image_form=AMI_FORM,
        label_form=NameForm(r"[\w.@+=:/ -]{0,128}", "an ftc:owner tag value",
                            "up to 128 letters, digits, spaces and _.:/=+-@"),
        settings={"ami": Setting(AMI_FORM.parse, "", "AWS image id (default: Amazon Linux 2023 from its public "
                                                     "SSM parameter)")},
        spot_reader=SpotReader(IMDS_V2, "http://169.254.169.254"),  # EC2's instance metadata service
        checkpoint_store=NameForm(r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/\S*)?", "an S3 URI", "s3://bucket/prefix"),
        flow_gbps=10.0,  # AWS's limit on one TCP flow inside a cluster placement group
        express_flow_gbps=25.0,  # that limit with ENA Express (SRD) on both ends
        hop_latency_s=50e-6,  # one hop inside a cluster placement group
    ),
)
