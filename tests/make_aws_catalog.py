"""Write the AWS catalog snapshot ftc bundles (provision/providers/aws_catalog.json): `make aws-catalog`.

    python tests/make_aws_catalog.py [--prices zz_generated.pricing_aws.go]

Instance facts: DescribeInstanceTypes, asked with boto3 of a moto server (moto's own data,
moto/ec2/resources/instance_types.json.gz), filtered to ftc's families (aws_catalog.FAMILIES) and
trimmed to the fields ftc reads. Prices: us-east-1 on-demand from Karpenter's generated table
(aws/karpenter-provider-aws, pkg/providers/pricing/zz_generated.pricing_aws.go), read from the file
given; without one, the snapshot's present prices are kept. Every planned type must have a price.
"""

import argparse
import re
import sys
from datetime import date
from importlib.metadata import version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from provision.providers import aws_catalog  # noqa: E402

KARPENTER = "Karpenter's table (aws/karpenter-provider-aws pkg/providers/pricing/zz_generated.pricing_aws.go)"


def described() -> list[dict]:
    """DescribeInstanceTypes of ftc's families, from a moto server on a free port."""
    import boto3
    from moto.server import ThreadedMotoServer
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        ec2 = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="snapshot",
                           aws_secret_access_key="snapshot",  # noqa: S106 - moto takes any
                           endpoint_url=f"http://127.0.0.1:{server.get_host_and_port()[1]}")
        pages = ec2.get_paginator("describe_instance_types").paginate(
            Filters=[{"Name": "instance-type", "Values": [f"{f}.*" for f in aws_catalog.FAMILIES]}])
        entries = [entry for page in pages for entry in page["InstanceTypes"]]
    finally:
        server.stop()
    return sorted((aws_catalog.trimmed(e) for e in entries
                   if aws_catalog.planned(e["InstanceType"], e["VCpuInfo"]["DefaultVCpus"])),
                  key=lambda e: e["InstanceType"])


def karpenter_prices(text: str, names: set[str]) -> tuple[dict[str, float], str]:
    """The prices of `names` in Karpenter's table, and the table's generation time."""
    generated = re.search(r"generated at (\S+) for us-east-1", text)
    table = text.split('"us-east-1": {', 1)[1].split("\n\t},", 1)[0]
    prices = {name: float(usd) for name, usd in re.findall(r'"([\w.-]+)": ([\d.]+)', table) if name in names}
    return prices, generated.group(1) if generated else "at an unknown time"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prices", type=Path, help="Karpenter's zz_generated.pricing_aws.go")
    args = parser.parse_args(argv)
    entries = described()
    names = {e["InstanceType"] for e in entries}
    old = aws_catalog.snapshot_file() if aws_catalog.SNAPSHOT.exists() else None
    if args.prices:
        prices, generated = karpenter_prices(args.prices.read_text(), names)
        source, priced = KARPENTER, generated[:10]
    elif old:
        prices, source, priced = {n: p for n, p in old.prices.items() if n in names}, old.prices_source, old.prices_date
    else:
        parser.error("no snapshot yet: give --prices")
    unpriced = sorted(names - set(prices))
    if unpriced:
        print(f"no price for {', '.join(unpriced)}", file=sys.stderr)
        return 1
    snapshot = aws_catalog.CatalogFile(
        region="us-east-1", entries=entries, prices=dict(sorted(prices.items())),
        facts_source=f"EC2 DescribeInstanceTypes as moto {version('moto')} answers it, in the snapshot bundled with ftc",
        facts_date=old.facts_date if old and old.entries == entries else date.today().isoformat(),
        prices_source=source, prices_date=priced)
    aws_catalog.SNAPSHOT.write_text(snapshot.to_json())
    print(f"{aws_catalog.SNAPSHOT}: {len(entries)} instance types", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
