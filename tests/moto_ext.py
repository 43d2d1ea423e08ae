"""What moto 5.2 lacks for ftc's tests, added to its EC2 backend: placement groups
(CreatePlacementGroup / DescribePlacementGroups / DeletePlacementGroup raise
NotImplementedError there), instances launched into one, ENA Express on network interfaces
(moto 5.2.5 takes RunInstances' and ModifyNetworkInterfaceAttribute's EnaSrdSpecification and
drops it: here it is kept per interface and answered, as EC2 does, in each interface's
Attachment of DescribeInstances and DescribeNetworkInterfaces), an instance's security groups
given on its network interface (EC2 reports them as the instance's too), and fault injection.

Faults come from the JSON file named by $FTC_MOTO_FAULTS, re-read on every call, so a
test changes them while the server runs:
    {"no_capacity": ["us-east-1a"],   RunInstances there fails with InsufficientInstanceCapacity
     "fail_at_call": 5,               the 5th EC2 call after the file was written fails (InjectedFault)
     "slow": {"RunInstances": 2},     that action answers after 2 seconds
     "hold": {"DescribeInstanceStatus": "/tmp/x"}}  that action, the first time, creates /tmp/x.reached
                                      and answers only once /tmp/x exists: a test acts at exactly that
                                      point (no race against the clock), then releases it
"""

import json
import os
import time

from moto.core.responses import ActionResult
from moto.ec2.exceptions import EC2ClientError
from moto.ec2.models.elastic_network_interfaces import Attachment
from moto.ec2.responses import EC2Response

_calls = {"count": 0, "faults_mtime": 0.0}


def _faults() -> dict:
    path = os.environ.get("FTC_MOTO_FAULTS", "")
    if not path or not os.path.exists(path):
        return {}
    mtime = os.path.getmtime(path)
    if mtime != _calls["faults_mtime"]:
        _calls.update(count=0, faults_mtime=mtime)
    return json.loads(open(path).read() or "{}")


def _groups(backend) -> dict:
    if not hasattr(backend, "ftc_placement_groups"):
        backend.ftc_placement_groups = {}
    return backend.ftc_placement_groups


def create_placement_group(self) -> ActionResult:
    name = self._get_param("GroupName")
    strategy = self._get_param("Strategy", "cluster")
    tags = self._parse_tag_specification("placement-group").get("placement-group", {})
    self.error_on_dryrun()
    groups = _groups(self.ec2_backend)
    if name in groups:
        raise EC2ClientError("InvalidPlacementGroup.Duplicate", f"The placement group '{name}' already exists.")
    group = {"GroupName": name, "Strategy": strategy, "State": "available",
             "GroupId": f"pg-{abs(hash(name)) % 10**17:017x}",
             "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
    groups[name] = group
    return ActionResult({"PlacementGroup": group})


def describe_placement_groups(self) -> ActionResult:
    names = self._get_param("GroupNames", [])
    filters = self._filters_from_querystring()
    found = []
    for group in _groups(self.ec2_backend).values():
        if names and group["GroupName"] not in names:
            continue
        tags = {t["Key"]: t["Value"] for t in group["Tags"]}
        if all(_matches(group, tags, key, values) for key, values in filters.items()):
            found.append(group)
    if names and len(found) < len(names):
        raise EC2ClientError("InvalidPlacementGroup.Unknown", f"The Placement Group '{names[0]}' is unknown.")
    return ActionResult({"PlacementGroups": found})


def _matches(group: dict, tags: dict, key: str, values: list[str]) -> bool:
    if key.startswith("tag:"):
        return tags.get(key[4:]) in values
    field = {"group-name": "GroupName", "strategy": "Strategy", "state": "State"}.get(key)
    return field is None or group[field] in values


def delete_placement_group(self) -> ActionResult:
    name = self._get_param("GroupName")
    self.error_on_dryrun()
    groups = _groups(self.ec2_backend)
    if name not in groups:
        raise EC2ClientError("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
    members = [i for i in self.ec2_backend.all_instances()
               if i.placement.group_name == name and i.state != "terminated"]
    if members:
        raise EC2ClientError("InvalidPlacementGroup.InUse", f"The placement group '{name}' is in use.")
    del groups[name]
    return ActionResult({})


_original_run_instances = EC2Response.run_instances


def run_instances(self):
    group = self._get_param("Placement.GroupName")
    zone = self._get_param("Placement.AvailabilityZone")
    if group and group not in _groups(self.ec2_backend):
        raise EC2ClientError("InvalidPlacementGroup.Unknown", f"The Placement Group '{group}' is unknown.")
    if zone in _faults().get("no_capacity", []):
        raise EC2ClientError("InsufficientInstanceCapacity",
                             f"We currently do not have sufficient capacity in the Availability Zone you requested ({zone}).")
    result = _original_run_instances(self)
    token = self._get_param("ClientToken")
    interfaces = self._get_param("NetworkInterfaces", [])
    for instance in self.ec2_backend.all_instances():
        if instance.client_token != token:
            continue
        if group:
            instance.placement.group_name = group
        for spec in interfaces:
            nic = instance.nics.get(int(spec.get("DeviceIndex", 0)))
            if nic is not None and spec.get("EnaSrdSpecification"):
                nic.ena_srd_specification = _ena_srd(spec["EnaSrdSpecification"])
        if not instance.security_groups and 0 in instance.nics:
            instance.security_groups = list(instance.nics[0]._group_set)
    return result


def _flag(value) -> bool:
    return str(value).lower() == "true"


def _ena_srd(spec: dict) -> dict:
    """An EnaSrdSpecification as EC2 answers it: both settings, as booleans."""
    udp = spec.get("EnaSrdUdpSpecification") or {}
    return {"EnaSrdEnabled": _flag(spec.get("EnaSrdEnabled")),
            "EnaSrdUdpSpecification": {"EnaSrdUdpEnabled": _flag(udp.get("EnaSrdUdpEnabled"))}}


_original_modify_interface = EC2Response.modify_network_interface_attribute


def modify_network_interface_attribute(self):
    spec = self._get_param("EnaSrdSpecification")
    if spec and not self._get_bool_param("DryRun"):
        self.ec2_backend.get_network_interface(self._get_param("NetworkInterfaceId")).ena_srd_specification = \
            _ena_srd(spec)
    return _original_modify_interface(self)


_original_attachment_init = Attachment.__init__


def attachment_init(self, eni) -> None:
    """An interface's attachment carries its ENA Express setting (moto serializes the attribute)."""
    _original_attachment_init(self, eni)
    self.ena_srd_specification = getattr(eni, "ena_srd_specification", None)


_original_call_action = EC2Response.call_action


def call_action(self):
    faults = _faults()
    fail_at = faults.get("fail_at_call")
    time.sleep(faults.get("slow", {}).get(self._get_action(), 0))
    hold = faults.get("hold", {}).get(self._get_action())
    if hold and not os.path.exists(f"{hold}.reached"):
        open(f"{hold}.reached", "w").close()
        while not os.path.exists(hold):
            time.sleep(0.05)
    _calls["count"] += 1
    if fail_at and _calls["count"] == fail_at:
        # a client error (400): botocore does not retry it, so ftc sees the failure
        return self.serialized(ActionResult(EC2ClientError("InjectedFault", f"injected failure at EC2 call {fail_at}")))
    return _original_call_action(self)


def install() -> None:
    EC2Response.create_placement_group = create_placement_group
    EC2Response.describe_placement_groups = describe_placement_groups
    EC2Response.delete_placement_group = delete_placement_group
    EC2Response.run_instances = run_instances
    EC2Response.modify_network_interface_attribute = modify_network_interface_attribute
    Attachment.__init__ = attachment_init
    EC2Response.call_action = call_action
