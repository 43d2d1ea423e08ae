"""The AWS path end to end through the EC2 emulator (tests/ec2_emulator.py): real boto3 and
`ftc` against its endpoint (AWS_ENDPOINT_URL), instances that are real sshd nodes, a real
2-node training job. Nothing in provision/ knows it talks to an emulator."""

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import FTC, REPO, assert_nothing_left, ftc, point_aws_at, sshd_pids
from helpers import assert_script_runs_across_nodes, start_emulator

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the EC2 emulator's nodes need root (namespaces, port 22)")

MINUTE_S = 0.5  # a `shutdown +N` minute on the emulator's nodes
NOTICE_S = 120  # spot notice to reclaim, as on EC2: the run checkpoints within it, however loaded the machine


@pytest.fixture(scope="session")
def emulator(tmp_path_factory):
    """The emulator as a user runs it, for the session; on SIGTERM it must leave no node behind."""
    disks = tmp_path_factory.mktemp("emulator")
    proc, url, _ = start_emulator(disks, FTC_EMULATOR_MINUTE_S=str(MINUTE_S), FTC_EMULATOR_NOTICE_S=str(NOTICE_S))
    yield {"url": url, "disks": disks}
    proc.terminate()
    proc.wait(60)
    assert sshd_pids(disks) == []


@pytest.fixture
def ec2(emulator, ftc_home, monkeypatch):
    """boto3 and `ftc` subprocesses pointed at the emulator, as a user would."""
    point_aws_at(emulator["url"], monkeypatch, poll_seconds=0.1)
    import boto3
    return boto3.client("ec2", region_name="us-east-1")


def nodes(emulator) -> list[dict]:
    with urllib.request.urlopen(f"{emulator['url']}/_emulator/nodes") as reply:  # noqa: S310 - the test's own endpoint
        return json.loads(reply.read())


def instances_of(ec2, name: str) -> list[dict]:
    tag = [{"Name": "tag:ftc:cluster", "Values": [name]}]
    return [i for r in ec2.describe_instances(Filters=tag)["Reservations"] for i in r["Instances"]]


def job_flags(model: str, glue_dir: Path) -> list[str]:
    return ["--task", "mrpc", "--model", model, "--data-dir", str(glue_dir),
            "--max-eval-samples", "64", "--max-train-samples", "32",
            "--epochs", "1"]


# The watchdog's lifetime far beyond any test's (168 emulated hours: 84 minutes at MINUTE_S), so that no
# node powers off under a test however loaded the machine; the watchdog's own test gives its own.
AWS = ["--provider", "aws", "--nodes", "2", "--ssh-cidr", "203.0.113.7/32", "--yes", "1", "--max-hours", "168"]


@pytest.mark.slow
def test_make_run_provider_aws_through_the_emulator_trains_and_leaves_nothing(ec2, emulator, ftc_home, minilm,
                                                                              glue_dir):
    made = subprocess.run(["make", "-s", "-C", str(REPO), "run", "PROVIDER=aws", "NODES=2", "NAME=emu", "TASK=mrpc",
                           f"MODEL={minilm}", f"DATA_DIR={glue_dir}", "MAX_TRAIN_SAMPLES=32", "EPOCHS=1", "YES=1",
                           "SSH_CIDR=203.0.113.7/32", "MAX_HOURS=168"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "FTC_HOME": str(ftc_home)})
    assert made.returncode == 0, made.stderr[-3000:]
    assert "verified: mpirun hostname on 2 node(s)" in made.stdout and "dev accuracy" in made.stdout
    assert "Gbit/s, ENA Express)" in made.stderr  # the plan `up` printed: on, c6i.16xlarge has it
    (run_dir,) = (ftc_home / "runs" / "emu").iterdir()
    result = json.loads((run_dir / "results.json").read_text())
    assert result["world_size"] == 2 and result["nodes"] == 2 and 0 <= result["eval_accuracy"] <= 1
    # the same shape as a local run's (tests/test_train.py RESULT_FIELDS, and the run's files)
    from helpers import RESULT_FIELDS
    assert RESULT_FIELDS <= set(result)
    assert {"results.json", "run.json", "output.log", "launch.sh", "model", "logs"} <= {p.name for p in run_dir.iterdir()}
    assert_nothing_left(ec2, "emu")
    assert {i["State"]["Name"] for i in instances_of(ec2, "emu")} == {"terminated"}
    assert nodes(emulator) == [] and sshd_pids(emulator["disks"]) == []


@pytest.mark.slow
def test_up_ssh_by_name_finetune_status_and_down_one_by_one(ec2, emulator, ftc_home, tiny_bert, glue_dir, tmp_path):
    up = ftc("up", "--name", "steps", *AWS)
    assert up.returncode == 0, up.stderr[-3000:]
    described = instances_of(ec2, "steps")
    # ENA Express on every node's interface, as EC2 answers it, and as the emulator recorded it per node
    from provision.providers.aws import ena_express_on
    assert [ena_express_on(i) for i in described] == [True, True]
    interfaces = ec2.describe_network_interfaces(Filters=[{"Name": "attachment.instance-id", "Values": [
        i["InstanceId"] for i in described]}])["NetworkInterfaces"]
    assert [n["Attachment"]["EnaSrdSpecification"]["EnaSrdEnabled"] for n in interfaces] == [True, True]
    assert [n["ena_express"] for n in nodes(emulator)] == [True, True]
    addresses = sorted(i["PrivateIpAddress"] for i in described)
    assert all(a.startswith("127.0.1.") for a in addresses)
    assert sorted(i["PublicIpAddress"] for i in described) == addresses
    state = json.loads((ftc_home / "clusters" / "steps" / "state.json").read_text())
    assert {n["ssh_user"] for n in state["nodes"]} == {"ec2-user"}

    # node 0 reaches node 1 by name over the cluster's own key, as mpirun does
    hop = ftc("ssh", "--name", "steps", "--", "ssh", "steps-1", "hostname")
    assert hop.returncode == 0, hop.stderr
    node1 = next(n for n in state["nodes"] if n["name"] == "steps-1")
    assert hop.stdout.strip() == "ip-" + node1["private_ip"].replace(".", "-")

    job = ftc("finetune", "--name", "steps", *job_flags(tiny_bert, glue_dir), timeout=600)
    assert job.returncode == 0, job.stderr[-3000:]
    assert "dev accuracy" in job.stdout
    assert_script_runs_across_nodes(ftc_home, "steps", tmp_path)

    # terminated behind ftc's back: status says so, and the node is really gone
    ec2.terminate_instances(InstanceIds=[node1["id"]])
    status = ftc("status", "--name", "steps")
    assert "steps-1 is terminated" in status.stderr and "ENA Express" in status.stdout  # node 0's detail
    assert [n["address"] for n in nodes(emulator)] == [state["nodes"][0]["private_ip"]]

    down = ftc("down", "--name", "steps")
    assert down.returncode == 0, down.stderr
    assert_nothing_left(ec2, "steps")
    assert nodes(emulator) == [] and sshd_pids(emulator["disks"]) == []


@pytest.mark.slow
def test_watchdog_terminates_a_cluster_whose_controller_is_gone(ec2, emulator, ftc_home):
    import shutil
    # the user-data armed the watchdog at boot: `shutdown -h +240` (4 h, 240 emulator minutes, 2 min), far
    # enough off that no node powers off while `up` still waits for them, however loaded the machine
    up = ftc("up", "--name", "orphan", *AWS, "--no-bootstrap", "--max-hours", "4")
    assert up.returncode == 0, up.stderr[-3000:]
    ids = [i["InstanceId"] for i in instances_of(ec2, "orphan")]
    assert [(emulator["disks"] / i / "poweroff").read_text().split()[1] for i in ids] == ["240", "240"]
    # `ftc extend` brings it forward: 0.05 h, `shutdown -h +3`, 3 emulator minutes (1.5 s)
    extend = ftc("extend", "--name", "orphan", "--hours", "0.05")
    assert extend.returncode == 0, extend.stderr[-3000:]
    shutil.rmtree(ftc_home)  # the controller, and everything it knew, is gone
    deadline = time.monotonic() + 120
    while {i["State"]["Name"] for i in instances_of(ec2, "orphan")} != {"terminated"}:
        assert time.monotonic() < deadline, instances_of(ec2, "orphan")
        time.sleep(0.2)
    assert nodes(emulator) == [] and sshd_pids(emulator["disks"]) == []
    # what is not an instance stays until `ftc down` finds it by its tags
    down = ftc("down", "--name", "orphan", "--provider", "aws")
    assert down.returncode == 0, down.stderr
    assert_nothing_left(ec2, "orphan")


@pytest.mark.slow
def test_spot_reclaim_mid_run_is_noticed_checkpointed_and_resumed_by_run(ec2, emulator, ftc_home, tiny_bert, glue_dir):
    flags = ["--task", "mrpc", "--model", tiny_bert, "--data-dir", str(glue_dir),
            "--max-eval-samples", "64", "--max-train-samples", "128",
             "--epochs", "1", "--batch-size", "16"]  # 2 ranks x 16: 4 steps
    steady = ftc("run", "--name", "steady", *AWS, *flags, timeout=600)
    assert steady.returncode == 0, steady.stderr[-3000:]
    (expected,) = (ftc_home / "runs" / "steady").glob("*/results.json")
    expected = json.loads(expected.read_text())
    spot_run = subprocess.Popen([*FTC, "run", "--name", "spot", *AWS, "--spot", "1", *flags],
                                env={**os.environ, "FTC_HOLD_AT_STEP": "2"},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    held = until(lambda: held_on_nodes(emulator), spot_run, "the job's hold at step 2", timeout=900)
    # node 1, not the head: its own metadata service, read by the watcher on that node
    reclaimed_id = json.loads((ftc_home / "clusters" / "spot" / "state.json").read_text())["nodes"][1]["id"]
    request = urllib.request.Request(f"{emulator['url']}/_emulator/spot-reclaim/{reclaimed_id}", method="POST")
    with urllib.request.urlopen(request) as reply:  # noqa: S310 - the test's own endpoint
        assert json.loads(reply.read())["action"] == "terminate"
    until(lambda: any(n["notices_served"] for n in nodes(emulator) if n["id"] == reclaimed_id),  # its watcher read it
          spot_run, "the reclaimed node's watcher reading the notice", timeout=300)
    release_on_every_node(emulator, held)
    out, err = spot_run.communicate(timeout=600)
    assert spot_run.returncode == 0, err[-3000:]
    assert "(spot interruption notice)" in out
    assert "spot interruption (1/3): recreating cluster spot" in err
    reclaimed = [i for i in instances_of(ec2, "spot") if i["InstanceId"] == reclaimed_id]
    assert reclaimed[0]["State"]["Name"] == "terminated"
    (results,) = (ftc_home / "runs" / "spot").glob("*/results.json")
    result = json.loads(results.read_text())
    assert result["resumed_from_batch"] >= 1 and result["world_size"] == 2
    assert result["steps"] == expected["steps"]
    for key in ("eval_accuracy", "eval_f1"):
        assert result[key] == pytest.approx(expected[key], abs=1e-6), (result[key], expected[key])
    assert result["epoch_metrics"][-1]["train_loss"] == pytest.approx(expected["epoch_metrics"][-1]["train_loss"],
                                                                      rel=1e-3)
    assert_nothing_left(ec2, "spot")
    assert nodes(emulator) == [] and sshd_pids(emulator["disks"]) == []


def until(found, proc: subprocess.Popen, what: str, timeout: float):
    """found()'s first true answer, polled while `proc` runs; past a generous deadline, `proc` is
    stopped and the test fails (a held job would otherwise wait for ever)."""
    deadline = time.monotonic() + timeout
    while not (result := found()):
        assert proc.poll() is None, proc.communicate()
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no {what} after {timeout:g} s: {proc.communicate()}")
        time.sleep(0.1)
    return result


def held_on_nodes(emulator) -> Path | None:
    """Where the job holds before its FTC_HOLD_AT_STEP step: its `held` marker on the head
    node's disk, relative to that disk (each node has its own file system here); None before."""
    held = [p for p in emulator["disks"].glob("i-*/disk/ec2-user/ftc/jobs/**/held")]
    if not held:
        return None
    disk = next(p for p in held[0].parents if p.name == "disk")
    return held[0].relative_to(disk)


def release_on_every_node(emulator, held: Path) -> None:
    for disk in emulator["disks"].glob("i-*/disk"):
        release = disk / held.parent / "release"
        release.parent.mkdir(parents=True, exist_ok=True)
        release.touch()


@pytest.mark.slow
def test_emulator_stopped_with_sigterm_stops_every_node(ftc_home, tmp_path, monkeypatch):
    disks = tmp_path / "disks"
    proc, url, _ = start_emulator(disks)
    env = {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1", "FTC_AWS_POLL_SECONDS": "0.1"}
    up = ftc("up", "--name", "left", *AWS, "--no-bootstrap", env=env)
    assert up.returncode == 0, up.stderr[-3000:]
    assert len(sshd_pids(disks)) == 2
    proc.terminate()
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert out.count("stopped (emulator exiting)") == 2
    assert sshd_pids(disks) == [] and list(disks.iterdir()) == []


def test_node_reads_the_metadata_service_named_by_the_standard_variable(monkeypatch):
    from provision.providers import world
    from runner.node import spot
    ec2s = world("aws").spot_reader.endpoint
    monkeypatch.delenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", raising=False)
    assert spot.node_endpoint(ec2s) == "http://169.254.169.254"
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.1.9:80")
    assert spot.node_endpoint(ec2s) == "http://127.0.1.9:80"
    assert spot.node_endpoint("http://127.0.0.1:4242") == "http://127.0.0.1:4242"  # a simulated one, as given


@pytest.mark.slow
def test_make_cluster_with_instance_type_and_nodes_auto_builds_the_plans_pick_with_ena_express(ec2, emulator,
                                                                                               ftc_home):
    plan = subprocess.run([*FTC, "plan", "--task", "qqp", "--deadline", "20m", "--json"], capture_output=True,
                          text=True, check=True)
    pick = json.loads(plan.stdout)["pick"]
    made = subprocess.run(["make", "-s", "cluster", "NAME=picked", "PROVIDER=aws", "TASK=qqp", "INSTANCE_TYPE=auto",
                           "NODES=auto", "DEADLINE=20m", "YES=1", "SSH_CIDR=203.0.113.7/32", "MAX_HOURS=168"],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert made.returncode == 0, made.stderr[-3000:]
    said = made.stdout + made.stderr
    assert f"Pick {pick['nodes']} x {pick['instance_type']}" in said  # the pick, said before it is built
    described = instances_of(ec2, "picked")
    assert sorted({i["InstanceType"] for i in described}) == [pick["instance_type"]] and len(described) == pick["nodes"]
    from provision.providers.aws import ena_express_on
    assert [ena_express_on(i) for i in described] == [True] * pick["nodes"] and pick["levers"]["ena_express"]
    down = ftc("down", "--name", "picked")
    assert down.returncode == 0, down.stderr
    assert_nothing_left(ec2, "picked")
