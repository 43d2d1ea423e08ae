"""The node facts the runner sizes ranks by, read from this machine."""

import os
from importlib import metadata

from runner.node import facts


def test_versions_from_dist_info_names_match_importlib_metadata():
    expected = {}
    for name in facts.LIBRARIES:
        try:
            expected[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    assert "torch" in expected and "impi-rt" in expected
    assert facts.versions() == expected


def test_topology_counts_this_process_cores():
    allowed = sorted(os.sched_getaffinity(0))
    topology = facts.cpu_topology(allowed)
    assert 1 <= topology["physical_cores"] <= len(allowed)
    assert set(topology["core_cpus"]) <= set(allowed)
