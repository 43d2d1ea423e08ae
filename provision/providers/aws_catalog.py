"""EC2's catalog as ftc plans from it, without boto3: which families and sizes, each family's CPU
generation, an InstanceType made from one DescribeInstanceTypes entry, and where a region's catalog
comes from (the cache under FTC_HOME that aws.catalog refreshes, else the snapshot bundled here).

One file format for the bundled snapshot (aws_catalog.json, made by tests/make_aws_catalog.py) and
each region's cache ($FTC_HOME/catalog/aws-<region>.json): the DescribeInstanceTypes entries, trimmed
to the fields read here, with their source and date, and the on-demand prices with theirs.
"""

import json
import os
import re
from dataclasses import dataclass
from datetime import date
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from .records import Catalog, CpuGeneration, InstanceType

ICE_LAKE = CpuGeneration("Ice Lake", native_bf16=False)
SAPPHIRE_RAPIDS = CpuGeneration("Sapphire Rapids", native_bf16=True)
GRANITE_RAPIDS = CpuGeneration("Granite Rapids (Xeon 6)", native_bf16=True)  # AMX, as Sapphire Rapids

# A family's generation is EC2's own naming: the digit is the generation, "i" Intel, "n" network-optimized.
GENERATIONS: dict[str, CpuGeneration] = {"6i": ICE_LAKE, "6in": ICE_LAKE, "7i": SAPPHIRE_RAPIDS,
                                         "8i": GRANITE_RAPIDS, "8in": GRANITE_RAPIDS}
FAMILIES = tuple(f"{kind}{gen}" for kind in "cmr" for gen in GENERATIONS)  # c6i .. r8in: 15 families
# Every size of the families ftc's catalog had before it read EC2's own, so that a type a user or a test
# names keeps working; of the others, 16xlarge (64 vCPUs) and up: the sizes a multi-node job is planned on.
ALL_SIZES = ("c6i", "m6i", "r6i", "c7i", "m7i", "r7i")
PLANNED_VCPUS = 64

SNAPSHOT = Path(__file__).with_name("aws_catalog.json")
FIELDS = {  # what ftc reads of a DescribeInstanceTypes entry: the snapshot and the cache keep only these
    "InstanceType": None, "VCpuInfo": {"DefaultVCpus": None, "DefaultCores": None},
    "MemoryInfo": {"SizeInMiB": None},
    "NetworkInfo": {"NetworkPerformance": None, "EnaSrdSupported": None, "EfaSupported": None,
                    "NetworkCards": {"BaselineBandwidthInGbps": None, "PeakBandwidthInGbps": None}},
    "ProcessorInfo": {"SustainedClockSpeedInGhz": None},
}


def family(name: str) -> str:
    return name.partition(".")[0]


def planned(name: str, vcpus: int) -> bool:
    """Whether instance type `name` of `vcpus` belongs in ftc's catalog. Pure."""
    size = name.partition(".")[2]
    if family(name) not in FAMILIES or (not size.endswith("xlarge") and size != "large"):
        return False  # bare-metal sizes: the same chips as the largest size, slower to start
    return family(name) in ALL_SIZES or vcpus >= PLANNED_VCPUS


def trimmed(entry: Mapping[str, Any], fields: Mapping[str, Any] = FIELDS) -> dict[str, Any]:
    """A DescribeInstanceTypes entry cut down to FIELDS (a list keeps its items' fields). Pure."""
    kept: dict[str, Any] = {}
    for key, inner in fields.items():
        if key not in entry:
            continue
        value = entry[key]
        if inner is None:
            kept[key] = value
        elif isinstance(value, list):
            kept[key] = [trimmed(item, inner) for item in value]
        else:
            kept[key] = trimmed(value, inner)
    return kept


def bandwidth_gbps(network: Mapping[str, Any]) -> float:
    """The instance's sustained bandwidth: its first network card's baseline, else the figure in
    NetworkPerformance ("25 Gigabit", "Up to 12.5 Gigabit": a burst figure, all there is). Pure."""
    cards = network.get("NetworkCards") or [{}]
    if cards[0].get("BaselineBandwidthInGbps"):
        return float(cards[0]["BaselineBandwidthInGbps"])
    found = re.search(r"([\d.]+)\s*Gigabit", network.get("NetworkPerformance", ""))
    return float(found.group(1)) if found else 0.0


def instance_type(entry: Mapping[str, Any], usd_per_hour: float) -> InstanceType:
    """One DescribeInstanceTypes entry (trimmed or whole) as ftc's InstanceType, at that price. Pure."""
    network = entry.get("NetworkInfo", {})
    return InstanceType(
        vcpus=int(entry["VCpuInfo"]["DefaultVCpus"]), memory_gib=int(entry["MemoryInfo"]["SizeInMiB"]) // 1024,
        usd_per_hour=float(usd_per_hour), generation=GENERATIONS[family(entry["InstanceType"])[1:]],
        network_gbps=bandwidth_gbps(network), ena_express=bool(network.get("EnaSrdSupported")),
        efa=bool(network.get("EfaSupported")),
        clock_ghz=float(entry.get("ProcessorInfo", {}).get("SustainedClockSpeedInGhz") or 0.0))


def on_demand_usd(price_list: list[str]) -> float | None:
    """The hourly on-demand USD price in a GetProducts answer (its PriceList, JSON strings); None when it
    holds none, or only a zero (a reserved-capacity line). Pure."""
    for item in price_list:
        for term in json.loads(item).get("terms", {}).get("OnDemand", {}).values():
            for dimension in term.get("priceDimensions", {}).values():
                usd = float(dimension.get("pricePerUnit", {}).get("USD", 0) or 0)
                if usd > 0 and dimension.get("unit", "Hrs") == "Hrs":
                    return usd
    return None


@dataclass(frozen=True)
class CatalogFile:
    """A snapshot or cache file as read: its facts and prices, each with its source and date."""
    region: str
    entries: list[dict[str, Any]]  # trimmed DescribeInstanceTypes entries
    facts_source: str
    facts_date: str
    prices: dict[str, float]
    prices_source: str
    prices_date: str

    def to_json(self) -> str:
        return json.dumps({"region": self.region,
                           "facts": {"source": self.facts_source, "date": self.facts_date,
                                     "instance_types": self.entries},
                           "prices": {"source": self.prices_source, "date": self.prices_date,
                                      "usd_per_hour": self.prices}}, indent=1, sort_keys=True) + "\n"

    def catalog(self) -> Catalog:
        """The planned types that have a price, as a Catalog naming both sources."""
        kinds = {entry["InstanceType"]: instance_type(entry, self.prices[entry["InstanceType"]])
                 for entry in self.entries
                 if entry["InstanceType"] in self.prices and planned(entry["InstanceType"],
                                                                     entry["VCpuInfo"]["DefaultVCpus"])}
        return Catalog(region=self.region, instance_types=dict(sorted(kinds.items())),
                       facts_source=self.facts_source, facts_date=self.facts_date,
                       prices_source=self.prices_source, prices_date=self.prices_date)


def read(path: Path) -> CatalogFile:
    """A snapshot or cache file; ValueError (or OSError) when it is not one."""
    data = json.loads(path.read_text())
    facts, prices = data["facts"], data["prices"]
    return CatalogFile(region=str(data["region"]), entries=list(facts["instance_types"]),
                       facts_source=str(facts["source"]), facts_date=str(facts["date"]),
                       prices={str(k): float(v) for k, v in prices["usd_per_hour"].items()},
                       prices_source=str(prices["source"]), prices_date=str(prices["date"]))


@lru_cache(maxsize=1)
def snapshot_file() -> CatalogFile:
    return read(SNAPSHOT)


def snapshot() -> Catalog:
    """The bundled catalog: what ftc plans from with no network and no credentials."""
    return snapshot_file().catalog()


def cache_path(region: str) -> Path:
    from ..state import ftc_home  # the state imports the registry, which imports this module
    return ftc_home() / "catalog" / f"aws-{region}.json"


def cached(region: str) -> CatalogFile | None:
    """Region `region`'s cache; None when there is none, or it cannot be read (the next refresh rewrites it)."""
    try:
        found = read(cache_path(region))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return found if found.region == region else None


def stale(found: CatalogFile | None, today: date) -> bool:
    """Whether a cache is to be refreshed: missing, or fetched before `today`. Pure."""
    return found is None or found.facts_date < today.isoformat()


def save(found: CatalogFile) -> None:
    """Write a region's cache atomically (a reader never sees half of it)."""
    path = cache_path(found.region)
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{path.name}.{os.getpid()}")
    part.write_text(found.to_json())
    os.replace(part, path)
