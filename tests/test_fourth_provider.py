"""The fourth provider (fourth_provider.py, with its node program tinycloud_node.py): defined only under
tests/ and registered through FTC_PROVIDERS, it is checked against its own catalog and its own setting,
and runs up, a finetune that a spot notice of its own protocol stops (a checkpoint in its own store, then
a recreated cluster that resumes) and down, with no file of ftc naming it."""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import FTC, REPO, ftc, sshd_pids
from fourth_provider import IMAGE_FILE
from helpers import assert_refused, held_job, one_error, state_path
from tinycloud_node import NOTICE, TAKEN, read_notice

from provision.providers.records import registered
from provision.spec import ClusterSpec
from provision.state import ClusterState
from runner.node.spot import SpotReader, Watcher

TESTS = Path(__file__).resolve().parent
WITH_TINYCLOUD = {"FTC_PROVIDERS": "fourth_provider:TINYCLOUD", "PYTHONPATH": str(TESTS)}
OWN_FILES = ("tests/fourth_provider.py", "tests/tinycloud_node.py")


def test_no_file_of_ftc_names_the_fourth_provider():
    """Product code, templates, the playbook, the Makefile and the examples name neither the provider,
    its modules nor its store: whatever it needs of ftc, it gets through the registry."""
    named = subprocess.run(["git", "grep", "-l", "-i", "-E", r"tinycloud|fourth_provider|tiny://", "--",
                            "provision", "runner", "templates", "ansible", "examples", "Makefile", "pyproject.toml"],
                           cwd=REPO, capture_output=True, text=True)
    assert named.returncode == 1 and named.stdout == "", named.stdout  # 1: git grep found nothing
    assert all((REPO / path).is_file() for path in OWN_FILES)


def test_a_provider_named_in_ftc_providers_is_checked_against_its_own_catalog(ftc_home):
    proc = ftc("up", "--name", "tc", "--provider", "tinycloud", "--instance-type", "c6i.16xlarge", env=WITH_TINYCLOUD)
    assert proc.returncode == 2
    assert one_error(proc) == "error: --instance-type='c6i.16xlarge' is not known; allowed: tiny.one, tiny.two"
    zones = ftc("up", "--name", "tc", "--provider", "tinycloud", "--zones", "us-east-1a", env=WITH_TINYCLOUD)
    assert one_error(zones) == ("error: --zones='us-east-1a': 'us-east-1a' is not a tinycloud zone name "
                                "(e.g. tiny-north-1a)")
    unknown = ftc("up", "--name", "tc", "--provider", "tinycloud")  # not named: not known
    assert one_error(unknown) == f"error: --provider='tinycloud' is not known; allowed: {', '.join(registered())}"


def test_its_own_setting_is_a_flag_a_variable_and_a_config_key_refused_in_one_line_and_only_its_own(ftc_home):
    bad = ftc("up", "--name", "tc", "--provider", "tinycloud", "--tiny-image", "ubuntu", env=WITH_TINYCLOUD)
    assert_refused(bad, "--tiny-image='ubuntu' is not a tinycloud image id; allowed: img- followed by 4 digits, "
                        "or empty", ftc_home)
    from_env = ftc("up", "--name", "tc", "--provider", "tinycloud", env={**WITH_TINYCLOUD, "FTC_TINY_IMAGE": "img-1"})
    assert_refused(from_env, "--tiny-image='img-1' is not a tinycloud image id", ftc_home)
    (ftc_home.parent / "ftc.toml").write_text('[cluster]\ntiny_image = "nope"\n')  # ./ftc.toml: the test's own folder
    from_config = ftc("up", "--name", "tc", "--provider", "tinycloud", env=WITH_TINYCLOUD)
    assert_refused(from_config, "--tiny-image='nope' is not a tinycloud image id", ftc_home)
    (ftc_home.parent / "ftc.toml").unlink()
    aws_own = ftc("up", "--name", "tc", "--provider", "tinycloud", "--ami", "ami-12345678", env=WITH_TINYCLOUD)
    assert_refused(aws_own, "--ami is for --provider=aws, not --provider='tinycloud'; add --provider=aws or leave "
                            "--ami out", ftc_home)
    aws_cidr = ftc("up", "--name", "tc", "--provider", "tinycloud", env={**WITH_TINYCLOUD, "FTC_SSH_CIDR": "10.0.0.0/8"})
    assert_refused(aws_cidr, "--ssh-cidr is for --provider=aws, not --provider='tinycloud'; add --provider=aws or "
                             "leave --ssh-cidr out", ftc_home)  # AWS's own since it left the spec's fields
    not_its = ftc("up", "--name", "tc", "--tiny-image", "img-0042", env=WITH_TINYCLOUD)  # local's spec: AWS's world
    assert_refused(not_its, "--tiny-image is for --provider=tinycloud, not --provider='local'", ftc_home)
    helped = " ".join(ftc("up", "--help", env={**WITH_TINYCLOUD, "COLUMNS": "1000"}).stdout.split())  # unwrapped
    assert "--tiny-image TINY_IMAGE TinyCloud: the image its nodes boot (default img-0001)" in helped
    assert "(AWS: e.g. us-east-1a; TinyCloud: e.g. tiny-north-1a; default: every zone of the region)" in helped
    assert "region (AWS: default us-east-1; TinyCloud: default tiny-north-1;" in helped
    assert "reclaim notices (the providers that have them: AWS, TinyCloud;" in helped
    # the worlds that bound MAX_HOURS say how; the settings for a trait name the providers that have it
    assert "the cluster's most hours (AWS: the nodes power off after it; Slurm: the allocation's time limit;" in helped
    assert "--ssh-key SSH_KEY ssh, slurm: the private key" in helped and "--hosts HOSTS ssh: your servers" in helped
    job_help = " ".join(ftc("finetune", "--help", env={**WITH_TINYCLOUD, "COLUMNS": "1000"}).stdout.split())
    assert "a checkpoint store's URI (AWS: s3://bucket/prefix; TinyCloud: tiny://bucket/prefix)" in job_help
    assert "--tiny-image" not in ftc("up", "--help").stdout  # not registered: no such flag


def test_its_checkpoint_store_is_the_one_a_tiny_uri_names_and_others_are_refused_naming_every_store(ftc_home):
    bad = ftc("finetune", "--name", "none", "--checkpoint-uri", "gs://bucket/x", env=WITH_TINYCLOUD)
    assert bad.returncode == 2
    assert one_error(bad) == ("error: --checkpoint-uri='gs://bucket/x' is not an S3 URI or a tinycloud store URI; "
                              "allowed: s3://bucket/prefix, tiny://bucket/prefix")


def test_its_reader_hears_a_notice_once_through_the_nodes_watcher(tmp_path):
    """The node's own watch thread, given what a job gives it (SpotReader.watch), reads TinyCloud's notice
    with TinyCloud's reader; the notice is taken once, as a reclaim takes one node."""
    reader = SpotReader("tinycloud_node:read_notice", f"file://{tmp_path}")
    (tmp_path / NOTICE).write_text("2026-12-05T00:00:00Z")
    first = Watcher(reader.watch, interval=0.01)
    first.start()
    first.join(timeout=60)
    assert first.notice == {"action": "preempt", "time": "2026-12-05T00:00:00Z"} and (tmp_path / TAKEN).exists()
    assert read_notice(reader.endpoint) is None  # taken: the next node, or the recreated cluster, sees none
    with pytest.raises(ValueError, match="is not a spot reader; allowed: module:function@endpoint"):
        Watcher(f"file://{tmp_path}")  # an endpoint alone names no reader


def tinycloud_state(name: str) -> str:
    """The state `up` of a tinycloud cluster with no nodes left would save (its resources are local's)."""
    spec = {**ClusterSpec(name=name).to_dict(), "provider": "tinycloud", "instance_type": "tiny.one",
            "region": "tiny-north-1"}
    return json.dumps({**json.loads(ClusterState(name=name, provider="local", spec=spec).to_json()),
                       "provider": "tinycloud"})


def test_status_and_down_refuse_a_cluster_whose_provider_is_not_registered_and_change_nothing(ftc_home):
    path = state_path(ftc_home, "tc")
    path.parent.mkdir(parents=True)
    saved = tinycloud_state("tc")
    path.write_text(saved)
    refusal = ("error: cluster 'tc': its provider 'tinycloud' is not registered here: set FTC_PROVIDERS as it was "
               "at `ftc up` (module:attribute)")
    for verb in ("status", "down"):
        proc = ftc(verb, "--name", "tc")
        assert (proc.returncode, one_error(proc)) == (2, refusal), verb
    every = ftc("status")
    assert (every.returncode, one_error(every)) == (1, refusal)  # `down` cleans up nothing here: not offered
    assert path.read_text() == saved
    assert ftc("status", "--name", "tc", env=WITH_TINYCLOUD).returncode == 0  # registered again: it loads


@pytest.mark.slow
def test_it_runs_up_a_finetune_stopped_by_its_own_spot_notice_and_resumed_and_down(ftc_home, tiny_bert, glue_dir,
                                                                                   tmp_path):
    cloud = tmp_path / "tinycloud"
    (cloud / "metadata").mkdir(parents=True)
    env = {**WITH_TINYCLOUD, "TINYCLOUD_ROOT": str(cloud)}
    job = ["--task", "mrpc", "--model", tiny_bert, "--data-dir", str(glue_dir), "--max-eval-samples", "64",
           "--max-train-samples", "256", "--epochs", "2"]  # 4 steps an epoch
    run = subprocess.Popen([*FTC, "run", "--name", "tiny", "--provider", "tinycloud", "--nodes", "2", "--spot", "1",
                            "--tiny-image", "img-0042", "--checkpoint-uri", "tiny://ckpt/runs", "--keep", "1", *job],
                           env={**os.environ, **env, "FTC_HOLD_AT_STEP": "2"},
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    job_dir = held_job(ftc_home, "tiny", run)  # training is under way: TinyCloud announces the reclaim now
    (cloud / "metadata" / NOTICE).write_text("2026-12-05T00:00:00Z")
    while not (cloud / "metadata" / TAKEN).exists():  # a node's watcher has read it, by TinyCloud's own reader
        assert run.poll() is None, run.communicate()
        time.sleep(0.1)
    (job_dir / "release").touch()
    out, err = run.communicate(timeout=900)
    assert run.returncode == 0, err[-3000:]
    assert "(spot interruption notice)" in out and "spot interruption (1/3): recreating cluster tiny" in err
    (results,) = (ftc_home / "runs" / "tiny").glob("*/results.json")
    result = json.loads(results.read_text())
    assert result["resumed_from_batch"] >= 1 and result["steps"] == 8 and result["nodes"] == 2
    home_checkpoint = results.parent / "checkpoints" / "last.pt"
    stored = sorted((cloud / "store" / "ckpt" / "runs").glob("*/last.pt"))  # the stopped job's, the resumed one's
    assert len(stored) == 2 and stored[-1].read_bytes() == home_checkpoint.read_bytes()
    nodes = json.loads(state_path(ftc_home, "tiny").read_text())["nodes"]
    assert [(Path(node["workdir"]) / IMAGE_FILE).read_text() for node in nodes] == ["img-0042", "img-0042"]
    assert (Path(nodes[0]["workdir"]) / "ftc" / "tinycloud_node.py").is_file()  # its reader, shipped with ftc's
    status = ftc("status", "--name", "tiny", env=env)
    assert "tiny: tinycloud, bootstrapped" in status.stdout and "2 billed, about $" in status.stdout, status.stdout
    unregistered = ftc("down", "--name", "tiny")  # only tinycloud can find its nodes: refused, nothing removed
    assert unregistered.returncode == 2 and "its provider 'tinycloud' is not registered here" in unregistered.stderr
    assert len(sshd_pids(ftc_home)) == 2 and state_path(ftc_home, "tiny").exists()
    down = ftc("down", "--name", "tiny", env=env)
    assert down.returncode == 0, down.stderr[-3000:]
    assert not state_path(ftc_home, "tiny").exists() and sshd_pids(ftc_home) == []
