"""The launch script: rank plans and rendering, for 1/2/4 nodes, both stacks, each mpirun flavour."""

import subprocess

import pytest

from provision.launch import RankLaunch, default_ppn, pick_allocator, plan_ranks, render_launch
from runner.node.facts import NodeFacts


def facts(sockets=2, cores_per_socket=32, allocators=()):
    cores = list(range(sockets * cores_per_socket))
    return NodeFacts(hostname="n", cpu_model="x", flags=[], native_bf16=False, allowed_cpus=cores,
                     physical_cores=len(cores), core_cpus=cores, sockets=sockets, cores_by_socket={}, numa_nodes=1,
                     memory_gb=1.0, python="3.11", python_executable="python3", versions={}, mpi="impi",
                     private_ip="10.0.0.1", interface="eth0", allocators=list(allocators))


def test_one_rank_per_socket_by_default():
    plan = plan_ranks([facts(2, 32)] * 4)
    assert (plan.ppn, plan.threads, plan.ccl_affinity) == (2, 32, "")
    assert [default_ppn(sockets) for sockets in (1, 2)] == [1, 2]


def test_intel_stack_keeps_one_core_per_rank_for_oneccl():
    plan = plan_ranks([facts(2, 32)], stack="intel", ppn=2)
    assert (plan.ppn, plan.threads, plan.ccl_affinity) == (2, 31, "31,63")


def test_threads_follow_the_smallest_node_and_explicit_ppn():
    plan = plan_ranks([facts(1, 16), facts(1, 8)], ppn=4)
    assert (plan.ppn, plan.threads) == (4, 2)


def test_too_many_ranks_for_the_cores_is_refused():
    with pytest.raises(ValueError, match="only 2 physical cores"):
        plan_ranks([facts(1, 2)], ppn=4)


def test_allocator_prefers_tcmalloc():
    assert pick_allocator(facts(allocators=["/usr/lib/libjemalloc.so.2", "/usr/lib/libtcmalloc.so.4"])) \
        == "/usr/lib/libtcmalloc.so.4"
    assert pick_allocator(facts()) == ""


def spec(nodes: int, stack: str, mpi: str, module: str = "runner.node.train", **extra) -> RankLaunch:
    return RankLaunch(description="test", job_dir="/w/jobs/j1", hostfile="/w/hostfile", nodes=nodes,
                      plan=plan_ranks([facts(2, 32)] * nodes, stack, 1 if extra.get("program") else 2),
                      python="/w/venv/bin/python", module=module, pythonpath="/w/ftc",
                      args=["--task", "mrpc", "--model", "a b"], mpi=mpi,
                      master_addr="10.0.0.5", gloo_iface="ens5", stack=stack, env_file="/w/env.sh", **extra)


@pytest.mark.parametrize("nodes", [1, 2, 4])
@pytest.mark.parametrize("stack", ["stock", "intel"])
@pytest.mark.parametrize("mpi", ["impi", "mpich", "openmpi"])
def test_rendered_script_for_every_layout(nodes, stack, mpi):
    script = render_launch(spec(nodes, stack, mpi, allocator="/usr/lib/libtcmalloc.so.4"))
    ranks = nodes * 2
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert f"export FTC_WORLD_SIZE={ranks}\n" in script
    assert "export MASTER_ADDR=10.0.0.5\n" in script and "export GLOO_SOCKET_IFNAME=ens5\n" in script
    assert "export FI_PROVIDER=tcp\n" in script and "export KMP_BLOCKTIME=1\n" in script
    assert "export LD_PRELOAD=/usr/lib/libtcmalloc.so.4" in script
    assert "'a b'" in script  # arguments are shell-quoted
    threads = 31 if stack == "intel" else 32
    assert f"export OMP_NUM_THREADS={threads}\n" in script
    if stack == "intel":
        assert "export CCL_WORKER_COUNT=1\n" in script and "export CCL_WORKER_AFFINITY=31,63\n" in script
    else:
        assert "CCL_" not in script
    if mpi == "openmpi":
        assert f"--hostfile /w/hostfile -np {ranks} --map-by ppr:2:node --bind-to none" in script
        assert "-x OMP_NUM_THREADS" in script and "-x LD_PRELOAD" in script
        assert "export FTC_SELF_PIN=1\n" in script and "I_MPI_PIN_DOMAIN" not in script
    else:
        assert f"mpirun -f /w/hostfile -n {ranks} -ppn 2 -prepend-rank" in script
    if mpi == "impi":
        assert "export I_MPI_PIN_DOMAIN=auto:compact\n" in script and "export FTC_SELF_PIN=0\n" in script
    # Every launcher reaches the nodes by name through ~/.ssh/config (tests/helpers.py proves it
    # on real nodes), so no ssh option travels through mpirun's own argument splitting.
    assert "-F " not in script


def test_unknown_mpirun_flavour_is_refused():
    with pytest.raises(ValueError, match="not supported"):
        render_launch(spec(1, "stock", "lam"))


def test_open_mpi_as_root_adds_its_opt_in():
    assert "--allow-run-as-root" in render_launch(spec(1, "stock", "openmpi", as_root=True))
    assert "--allow-run-as-root" not in render_launch(spec(1, "stock", "openmpi"))


def test_paths_with_spaces_and_shell_characters_stay_data():
    odd = "/tmp/a b/$(touch x)"
    script = render_launch(RankLaunch(
        description="test", job_dir=f"{odd}/jobs/j1", hostfile=f"{odd}/hostfile", nodes=1,
        plan=plan_ranks([facts(1, 4)]), python=f"{odd}/venv/bin/python", module="runner.node.train",
        pythonpath=f"{odd}/ftc", args=[], mpi="impi", env_file=f"{odd}/env.sh", allocator=f"{odd}/libtcmalloc.so.4"))
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    for line in script.splitlines():
        if odd in line and not line.startswith("#"):
            assert f"'{odd}" in line, line  # inside single quotes: neither split nor run


@pytest.mark.parametrize("mpi, line", [
    ("openmpi", "--hostfile /w/hostfile -np 4 --map-by ppr:1:node --bind-to none --tag-output"),
    ("impi", "mpirun -f /w/hostfile -n 4 -ppn 1 -prepend-rank"),
    ("mpich", "mpirun -f /w/hostfile -n 4 -ppn 1 -prepend-rank -launcher ssh"),
])
def test_verification_hostname_check_uses_the_node_s_own_mpirun_flavour(mpi, line):
    script = render_launch(spec(4, "stock", mpi, program=["hostname"], module=""))
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert line in script
    launched = script.split("PYTHONUNBUFFERED=1")[-1]
    assert "  hostname\nstatus=$?" in launched and "-m runner.node" not in launched


def test_hostname_lines_drop_each_flavour_s_rank_tag():
    from provision.bootstrap import hostname_lines
    assert hostname_lines("[0] node-a\n[1] node-b\n") == ["node-a", "node-b"]  # Intel MPI, MPICH
    assert hostname_lines("[1,0]<stdout>:node-a\n[1,1]<stdout>:node-b\n\n") == ["node-a", "node-b"]  # Open MPI


def test_gloo_gets_as_many_flows_as_fill_a_catalog_instances_link_and_one_elsewhere():
    from provision import state as st
    from provision.launch import default_flows, gloo_devices
    from provision.spec import ClusterSpec

    def state(provider: str, instance_type: str = "c6i.16xlarge") -> st.ClusterState:
        spec = ClusterSpec(name="c", provider=provider, instance_type=instance_type)
        return st.ClusterState(name="c", provider=provider, spec=spec.to_dict())
    assert default_flows(state("aws", "c7i.16xlarge")) == 1  # ENA Express (on where the type has it): 25 a flow
    plain = ClusterSpec(name="c", provider="aws", instance_type="c7i.16xlarge",
                        settings={**ClusterSpec().settings, "ena_express": False})
    assert default_flows(st.ClusterState(name="c", provider="aws", spec=plain.to_dict())) == 3  # flows capped at 10
    assert default_flows(state("aws", "c8in.16xlarge")) == 4  # 100 Gbit/s over ENA Express's 25
    assert default_flows(state("local")) == default_flows(state("ssh")) == 1
    assert gloo_devices("ens5", 3) == "ens5,ens5,ens5" and gloo_devices("lo", 1) == "lo"
