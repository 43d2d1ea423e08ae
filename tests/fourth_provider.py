"""A fourth provider, defined only here: "tinycloud", this machine's sshd nodes presented as another
cloud, with a catalog of its own (two instance types), its own price, region and name forms. Its verbs
are the local provider's; everything else ftc asks of it comes from the World below.

    FTC_PROVIDERS=fourth_provider:TINYCLOUD PYTHONPATH=tests ftc up --provider tinycloud

registers it (provision/providers/records.py): nothing of ftc names it.
"""

from provision.providers import Provider, Traits, World
from provision.providers.local import launch, query, terminate, wait  # noqa: F401 (its verbs)
from provision.providers.records import CpuGeneration, InstanceType, LocalResources, NameForm

TINY_CPU = CpuGeneration("Ice Lake", native_bf16=False)

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
        image_form=NameForm(r"img-\d{4}", "a tinycloud image id", "img- followed by 4 digits"),
        flow_gbps=1.0,
        hop_latency_s=1e-4,
    ),
)
