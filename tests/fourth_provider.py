"""A fourth provider, defined only here and in its node program (tinycloud_node.py): "tinycloud", this
machine's sshd nodes presented as another cloud, with a catalog of its own (two instance types), its own
price, region and name forms, its own setting (TINY_IMAGE, the image its nodes boot), spot notices of its
own protocol, and a checkpoint store of its own (tiny://bucket/prefix). Its nodes are the local
provider's, so its verbs start from local's; what else ftc asks of it comes from the World below.

    FTC_PROVIDERS=fourth_provider:TINYCLOUD PYTHONPATH=tests ftc up --provider tinycloud

registers it (provision/providers/records.py): nothing of ftc names it. The cloud itself (its metadata
folder, where a reclaim is announced, and its store) lives under TINYCLOUD_ROOT.
"""

import os
import shutil
import tempfile
from pathlib import Path

from provision.providers import Provider, Traits, World, local
from provision.providers.local import query, terminate, wait  # noqa: F401 (its verbs)
from provision.providers.records import CpuGeneration, InstanceType, LocalResources, NameForm, Setting
from runner.node.spot import SpotReader

ROOT = Path(os.environ.get("TINYCLOUD_ROOT") or Path(tempfile.gettempdir()) / "tinycloud")
METADATA = ROOT / "metadata"  # where TinyCloud announces a reclaim (tinycloud_node.py)
STORE = ROOT / "store"  # tiny://bucket/prefix is STORE/bucket/prefix
STORE_FORM = NameForm(r"tiny://[a-z0-9-]+(/\S*)?", "a tinycloud store URI", "tiny://bucket/prefix")
IMAGE_FORM = NameForm(r"img-\d{4}", "a tinycloud image id", "img- followed by 4 digits")
DEFAULT_IMAGE = "img-0001"
IMAGE_FILE = "image"  # in each node's directory: the image it booted
TINY_CPU = CpuGeneration("Ice Lake", native_bf16=False)


def launch(state, record) -> None:
    """local's nodes, each booted from the image TINY_IMAGE names (written where the node can read it)."""
    local.launch(state, record)
    for node in state.nodes:
        (Path(node.workdir) / IMAGE_FILE).write_text(state.cluster_spec.settings.get("tiny_image") or DEFAULT_IMAGE)


def store_checkpoint(checkpoint: Path, uri: str, job_id: str) -> None:
    """The checkpoint to <prefix>/<job_id>/last.pt in TinyCloud's store, whole or not at all."""
    target = STORE / uri.removeprefix("tiny://") / job_id / "last.pt"
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".part")
    shutil.copyfile(checkpoint, partial)
    partial.replace(target)


TINYCLOUD = Provider(
    name="tinycloud",
    module=__name__,
    traits=Traits(resources=LocalResources, instance_types=True, billed=True, shares_this_machine=True,
                  own_hosts=False, user_login=False, user_stack_python=False, found_by_tag=False),
    world=World(
        title="TinyCloud",
        instance_types={"tiny.one": InstanceType(vcpus=2, memory_gib=1, usd_per_hour=0.25, generation=TINY_CPU,
                                                 network_gbps=1.0),
                        "tiny.two": InstanceType(vcpus=4, memory_gib=2, usd_per_hour=0.5, generation=TINY_CPU,
                                                 network_gbps=2.0)},
        default_instance_type="tiny.one",
        regions=("tiny-north-1", "tiny-south-1"),
        default_region="tiny-north-1",
        zone_form=NameForm(r"tiny-[a-z]+-\d[a-z]", "a tinycloud zone name", "e.g. tiny-north-1a"),
        settings={"tiny_image": Setting(IMAGE_FORM.parse, "", f"TinyCloud: the image its nodes boot (default "
                                                              f"{DEFAULT_IMAGE})")},
        spot_reader=SpotReader("tinycloud_node:read_notice", f"file://{METADATA}"),
        checkpoint_store=STORE_FORM,
        flow_gbps=1.0,
        hop_latency_s=1e-4,
    ),
)
