"""Cluster spec: precedence of the sources, and bad input refused before anything exists."""

import pytest
from conftest import assert_nothing_left, ftc

from provision.errors import UsageError
from provision.spec import ClusterSpec, resolve_spec

BAD_UP = [
    (["--nodes", "0"], "NODES='0'"),
    (["--nodes", "-1"], "NODES='-1'"),
    (["--nodes", "abc"], "NODES='abc'"),
    (["--nodes", "100000"], "NODES='100000'"),
    (["--name", "Bad_Name!"], "NAME='Bad_Name!'"),
    (["--name=-lead"], "NAME='-lead'"),
    (["--instance-type", "c6i.huge"], "INSTANCE_TYPE='c6i.huge'"),
    (["--instance-type", "p5.48xlarge"], "INSTANCE_TYPE='p5.48xlarge'"),
    (["--region", "mars-north-1"], "REGION='mars-north-1'"),
    (["--ssh-cidr", "0.0.0.0/0"], "SSH_CIDR='0.0.0.0/0'"),
    (["--ssh-cidr", "::/0"], "SSH_CIDR='::/0'"),
    (["--ssh-cidr", "300.1.2.3/32"], "SSH_CIDR='300.1.2.3/32'"),
    (["--spot", "maybe"], "SPOT='maybe'"),
    (["--max-hours", "0"], "MAX_HOURS='0'"),
    (["--root-volume-gb", "2"], "ROOT_VOLUME_GB='2'"),
    (["--stack", "cuda"], "STACK='cuda'"),
    (["--provider", "gcp"], "PROVIDER='gcp'"),
    (["--zones", "us-west-2a"], "ZONES='us-west-2a'"),
    (["--ami", "ami-xyz"], "AMI='ami-xyz'"),
    (["--config", "/does/not/exist.toml"], "CONFIG='/does/not/exist.toml'"),
]


@pytest.mark.parametrize("flags,named", BAD_UP, ids=[" ".join(f) for f, _ in BAD_UP])
def test_bad_input_is_refused_with_one_line_and_nothing_created(aws, ftc_home, flags, named):
    proc = ftc("up", "--name", "bad", "--provider", "aws", "--yes", "1", "--ssh-cidr", "203.0.113.7/32", *flags)
    assert_refused(proc, named, ftc_home)
    assert_nothing_left(aws.ec2(), "bad")


def assert_refused(proc, named: str, home) -> None:
    """Exit code 2, one line that names the bad value, and no cluster left on disk."""
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0], lines
    assert not (home / "clusters").exists() or not any((home / "clusters").iterdir())


def test_bad_make_variable_reaches_ftc_as_the_same_refusal(ftc_home, tmp_path):
    import subprocess

    from conftest import REPO
    proc = subprocess.run(["make", "-s", "-C", str(REPO), "cluster", "NODES=abc", "NAME=bad"],
                          capture_output=True, text=True, env={**__import__("os").environ, "FTC_HOME": str(ftc_home)})
    assert proc.returncode != 0
    assert "NODES='abc' is not a whole number; allowed: 1..64" in proc.stderr


def test_invalid_toml_config_is_refused(ftc_home, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("nodes = [unclosed")
    proc = ftc("up", "--config", str(bad))
    assert proc.returncode == 2 and "is not valid TOML" in proc.stderr


def test_unknown_config_key_is_refused(ftc_home, tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("[cluster]\nnodez = 3\n")
    proc = ftc("up", "--config", str(config))
    assert proc.returncode == 2 and "unknown key 'nodez'" in proc.stderr


def test_precedence_is_flags_then_env_then_config_then_defaults():
    config = {"nodes": 3, "region": "eu-west-1", "stack": "intel"}
    env = {"FTC_NODES": "5", "FTC_REGION": "us-west-2"}
    spec = resolve_spec({"nodes": "7"}, env, config)
    assert (spec.nodes, spec.region, spec.stack, spec.instance_type) == (7, "us-west-2", "intel", "c6i.16xlarge")
    assert resolve_spec({}, env, config).nodes == 5
    assert resolve_spec({}, {}, config).nodes == 3
    assert resolve_spec({}, {}, {}) == ClusterSpec()


def test_open_ssh_needs_explicit_opt_in():
    with pytest.raises(UsageError, match="ALLOW_OPEN_SSH=1"):
        resolve_spec({"ssh_cidr": "0.0.0.0/0"}, {}, {})
    assert resolve_spec({"ssh_cidr": "0.0.0.0/0", "allow_open_ssh": "1"}, {}, {}).ssh_cidr == "0.0.0.0/0"


def test_zone_outside_region_is_refused():
    with pytest.raises(UsageError, match="not in REGION"):
        resolve_spec({"zones": "eu-west-1a", "region": "us-east-1"}, {}, {})


EVERY_COMMAND = [
    (["down", "--name", "Bad!"], "NAME='Bad!'"),
    (["down", "--name", "x", "--provider", "gcp"], "PROVIDER='gcp'"),
    (["down", "--name", "x", "--region", "moon-1"], "REGION='moon-1'"),
    (["status", "--name", "Bad!"], "NAME='Bad!'"),
    (["status", "--name", "nosuch"], "NAME='nosuch'"),
    (["bootstrap", "--name", "nosuch"], "NAME='nosuch'"),
    (["bootstrap", "--name", "nosuch", "--with", "chef"], "BOOTSTRAPPER='chef'"),
    (["ssh", "--name", "nosuch"], "NAME='nosuch'"),
    (["logs", "--name", "nosuch"], "NAME='nosuch'"),
    (["cancel", "--name", "nosuch"], "NAME='nosuch'"),
    (["fetch", "--name", "nosuch"], "NAME='nosuch'"),
    (["extend", "--name", "nosuch", "--hours", "-1"], "HOURS='-1'"),
    (["extend", "--name", "nosuch", "--hours", "2"], "NAME='nosuch'"),
    (["inventory", "--name", "nosuch"], "NAME='nosuch'"),
    (["finetune", "--name", "nosuch", "--ppn", "zero"], "PPN='zero'"),
    (["finetune", "--name", "nosuch", "--lr", "2"], "LR='2'"),
    (["finetune", "--name", "nosuch", "--max-train-samples", "-5"], "MAX_TRAIN_SAMPLES='-5'"),
    (["finetune", "--name", "nosuch", "--model", "/no/such/model"], "MODEL='/no/such/model'"),
    (["run", "--nodes", "0"], "NODES='0'"),
    (["run", "--nodes", "2", "--task", "squad"], "TASK='squad'"),
    (["run", "--keep", "perhaps"], "KEEP='perhaps'"),
    (["up", "--bootstrap", "sometimes"], "BOOTSTRAP='sometimes'"),
    (["up", "--yes", "sure"], "YES='sure'"),
    (["bench", "--ranks", "1,x"], "'x' is not a whole number"),
    (["bench", "--repeats", "0"], "REPEATS='0' is out of range; allowed: 1.."),
    (["plan", "--task", "squad"], "TASK='squad'"),
    (["plan", "--nodes", "1,65"], "NODES='65'"),
    (["plan", "--instance-type", "p5.48xlarge"], "INSTANCE_TYPE='p5.48xlarge'"),
    (["plan", "--epochs", "three"], "EPOCHS='three'"),
    (["plan", "--samples-per-s", "-3"], "SAMPLES_PER_S='-3'"),
    (["plan", "--bench", "/no/such/bench.json"], "BENCH='/no/such/bench.json'"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
]


@pytest.mark.parametrize("argv,named", EVERY_COMMAND, ids=[" ".join(a) for a, _ in EVERY_COMMAND])
def test_every_command_refuses_bad_input_with_one_line_and_changes_nothing(ftc_home, argv, named):
    assert_refused(ftc(*argv), named, ftc_home)
