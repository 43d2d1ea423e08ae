"""What `ftc status` shows of a cluster, and what every command says of one that is not whole."""

import json
import signal
import subprocess

import pytest
from conftest import FTC, assert_nothing_left, cluster_resources, ftc
from helpers import AWS_UP, wait_for


@pytest.mark.slow
def test_an_up_killed_after_run_instances_shows_its_instances_and_every_command_names_down(aws, ftc_home, minilm,
                                                                                             glue_dir):
    # Held where `up` waits for the instances it launched: RunInstances has answered and its ids are saved.
    release = ftc_home.parent / "release-describe"
    aws.faults(hold={"DescribeInstanceStatus": str(release)})
    proc = subprocess.Popen([*FTC, "up", *AWS_UP, "--name", "cut", "--nodes", "2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    reached = release.with_name(release.name + ".reached")
    wait_for(lambda: reached.exists() or proc.poll() is not None, "up to reach DescribeInstanceStatus")
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    release.touch()  # the server's held call goes on, answering nobody
    aws.faults()
    instances = sorted(i["InstanceId"] for i in cluster_resources(aws.ec2(), "cut")["instances"])
    assert len(instances) == 2

    shown = ftc("status", "--name", "cut")
    assert shown.returncode == 0, shown.stderr
    for instance in instances:
        assert instance in shown.stdout
    # both are billed (the sum itself is $0.00 while they are seconds old: not asserted)
    assert shown.stdout.count("running") >= 2 and "2 billed, about $" in shown.stdout, shown.stdout
    assert "`ftc down --name cut`" in shown.stderr, shown.stderr
    data = json.loads(ftc("status", "--name", "cut", "--json").stdout)
    assert sorted(i["id"] for i in data["launched_not_joined"]) == instances
    assert {i["live"] for i in data["launched_not_joined"]} == {"running"}

    for command in (["up", *AWS_UP, "--name", "cut", "--nodes", "2"], ["bootstrap", "--name", "cut"],
                    ["finetune", "--name", "cut", "--model", minilm, "--data-dir", str(glue_dir)]):
        refused = ftc(*command)
        assert refused.returncode != 0
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and "launching" in lines[0] and "`ftc down --name cut`" in lines[0], (command, lines)

    assert ftc("down", "--name", "cut").returncode == 0
    assert_nothing_left(aws.ec2(), "cut")


@pytest.mark.slow
def test_a_running_job_shows_as_lost_once_every_instance_is_gone(aws, ftc_home):
    from provision import state as st
    assert ftc("up", *AWS_UP, "--name", "gone", "--nodes", "2").returncode == 0
    state = st.load("gone")  # as `ftc finetune` records a job it started
    state.jobs.append(st.JobInfo(id="mrpc-1", task="mrpc", remote_dir=f"{state.head.workdir}/jobs/mrpc-1",
                                 results_dir=str(ftc_home / "runs" / "mrpc-1"), pid=4242))
    st.save(state)
    aws.ec2().terminate_instances(InstanceIds=[node.id for node in state.nodes])
    shown = ftc("status", "--name", "gone")
    assert shown.returncode == 0, shown.stderr
    assert "last job mrpc-1: lost (recorded running, but head node gone-0 is terminated)" in shown.stdout, shown.stdout
    assert "mrpc-1: running" not in shown.stdout
    assert ftc("down", "--name", "gone").returncode == 0
    assert_nothing_left(aws.ec2(), "gone")


@pytest.mark.slow
def test_switches_work_bare_status_names_each_nodes_ssh_host_and_every_command_has_a_description(ftc_home):
    up = ftc("up", "--name", "sw", "--nodes", "1", "--no-bootstrap", "--yes")  # a bare switch is on
    assert up.returncode == 0, up.stderr
    try:
        node = json.loads((ftc_home / "clusters" / "sw" / "state.json").read_text())["nodes"][0]
        status = ftc("status", "--name", "sw")
        assert f"{node['ssh_user']}@{node['public_ip']}:{node['ssh_port']}" in status.stdout, status.stdout
    finally:
        assert ftc("down", "--name", "sw").returncode == 0
    assert "create a cluster (and bootstrap it)" in ftc("up", "--help").stdout
    assert "run your own training script on every rank" in ftc("launch", "--help").stdout
    refused = ftc("up", "--name", "sw", "--spot", "maybe")
    assert refused.returncode == 2 and "--spot='maybe'" in refused.stderr
