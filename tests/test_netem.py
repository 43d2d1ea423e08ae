"""runner/bench/netem.py: the emulated AWS network of `ftc bench network`: its pure parts (rates, names,
addresses, steps), and one real build of it for 2 nodes whose TCP flows keep their caps."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runner.bench import netem
from runner.bench.netem import Layout, LinkRates


def test_the_links_scale_with_the_simulated_nodes_compute_and_gradient_against_the_real_ones():
    # a c7i.16xlarge by the plan: 316 rows/s, a 134 MB bf16 gradient; a 4-core simulated node: 39.5 rows/s, the same
    rates = netem.scaled_rates(10, 25, 39.5, 134e6, 316, 134e6)
    assert rates.scale == pytest.approx(0.125)
    assert (rates.flow_gbit, rates.node_gbit) == (pytest.approx(1.25), pytest.approx(3.125))
    # twice the bytes on the simulated wire (fp32) needs twice the bandwidth for the same share of a step
    assert netem.scaled_rates(10, 25, 39.5, 268e6, 316, 134e6).scale == pytest.approx(0.25)
    # the step's compute against its transfer is the real node's
    sim_step, real_step = 32 / 39.5, 32 / 316
    sim_transfer, real_transfer = 134e6 * 8 / (rates.flow_gbit * 1e9), 134e6 * 8 / 10e9
    assert sim_step / sim_transfer == pytest.approx(real_step / real_transfer)


def test_a_rate_that_is_not_positive_is_refused():
    with pytest.raises(ValueError, match="sim_rows_per_s must be positive"):
        netem.scaled_rates(10, 25, 0, 1e6, 316, 134e6)


@pytest.mark.parametrize("flow, node, flows", [(10, 25, 3), (10, 12.5, 2), (10, 10, 1), (10, 50, 5), (10, 5, 1)])
def test_enough_flows_to_fill_a_node_and_no_more(flow, node, flows):
    assert netem.flows_to_fill(LinkRates(flow, node, 1.0)) == flows


def test_every_namespace_carries_the_owners_pid_and_every_address_stays_in_10_slash_8():
    layout = Layout(4242, 2, 3, LinkRates(0.2, 0.5, 0.02))
    assert layout.namespaces() == ["ftcnet-4242-sw", "ftcnet-4242-r0", "ftcnet-4242-n0", "ftcnet-4242-r1",
                                   "ftcnet-4242-n1"]
    assert layout.interfaces() == ["f0", "f1", "f2"] and layout.interfaces(1) == ["f0"]
    assert layout.address(1, 2) == "10.202.1.2" and layout.master_addr == "10.200.0.2"
    steps = netem.setup_steps(layout)
    # every step acts inside one of the layout's namespaces, none on the host's own network
    assert {step.ns for step in steps} | {step.peer_ns for step in steps if step.peer_ns} <= set(layout.namespaces())
    addresses = [step.cidr for step in steps if step.kind in ("address", "route")]
    assert addresses and all(a.startswith("10.") for a in addresses)


def test_each_flow_is_shaped_at_the_flow_cap_and_each_uplink_at_the_nodes_rate_both_ways():
    layout = Layout(7, 2, 2, LinkRates(0.2, 0.5, 0.02))
    shaped = {(step.ns, step.dev): step.gbit for step in netem.setup_steps(layout) if step.kind == "shape"}
    for i in range(2):
        for j in range(2):
            assert shaped[(layout.node_ns(i), f"f{j}")] == shaped[(layout.router_ns(i), f"d{j}")] == 0.2
        assert shaped[(layout.router_ns(i), "uplink")] == shaped[(layout.switch_ns, f"p{i}")] == 0.5
    assert len(shaped) == 2 * (2 * 2 + 2)


def test_a_token_bucket_passes_a_whole_gso_packet_and_queues_50_ms():
    low = netem.token_bucket(0.1)  # 12.5 MB/s
    assert low == {"rate": 12_500_000, "burst": 128 * 1024, "limit": 128 * 1024 + 12_500_000 // 20}
    assert netem.token_bucket(10)["burst"] == 1_250_000_000 // 500  # 2 ms of 1.25 GB/s


def test_only_namespaces_of_a_gone_process_are_stale():
    names = ["ftcnet-100-n0", "ftcnet-100-sw", "ftcnet-200-n0", "ftcnet-x-n0", "other-100-n0", "ftcnet-300-probe"]
    assert netem.stale_namespaces(names, alive=lambda pid: pid == 200) == ["ftcnet-100-n0", "ftcnet-100-sw",
                                                                           "ftcnet-300-probe"]


def test_a_rank_enters_its_own_nodes_namespace_by_its_launchers_rank():
    layout = Layout(55, 2, 1, LinkRates(1, 1, 1))
    command = netem.in_node(layout, ["python", "-c", "pass"])
    # the entering program replaced by one that prints what it was given
    shown = [*command[:5], "import sys; print(*sys.argv[1:])", *command[6:]]
    printed = subprocess.run(shown, env={**os.environ, "PMI_RANK": "1"}, capture_output=True, text=True).stdout
    assert printed.split() == ["ftcnet-55-n1", "python", "-c", "pass"]
    enter = {k: v for k, v in os.environ.items() if k != "PMI_RANK"} | {"OMPI_COMM_WORLD_RANK": "0"}
    printed = subprocess.run(shown, env=enter, capture_output=True, text=True).stdout
    assert printed.split()[0] == "ftcnet-55-n0"


def test_a_layout_out_of_the_address_plan_is_refused():
    with pytest.raises(ValueError, match="allowed 1..200 x 1..50"):
        Layout(1, 201, 1, LinkRates(1, 1, 1))


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="builds network namespaces and tc qdiscs: needs root")
def test_one_flow_keeps_its_cap_several_share_the_nodes_rate_and_nothing_is_left():
    # built and measured in a process of its own (tests/netem_build.py says why)
    proc = subprocess.run([sys.executable, str(Path(__file__).parent / "netem_build.py")], capture_output=True,
                          text=True, timeout=300, cwd=Path(__file__).parent.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    built = json.loads(proc.stdout)
    if "missing" in built:
        pytest.skip(f"builds network namespaces and tc qdiscs: {built['missing']}")
    assert sorted(built["up"]) == sorted(built["expected"]) and built["left"] == []
    one, two, three = (built["gbit"][n] for n in ("1", "2", "3"))
    assert 0.03 < one <= 1.3 * 0.1  # one flow: at most its cap
    assert two >= 1.4 * one  # a second interface is a second flow
    assert three <= 1.3 * 0.25  # together, at most the node's rate
