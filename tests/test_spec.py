"""Cluster spec: precedence of the sources, and bad input refused before anything exists."""

import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, assert_nothing_left, ftc, sshd_pids
from helpers import NO_SUCH_USER_HOME, assert_refused, make, one_error, only_line, up_local

from provision.errors import UsageError
from provision.spec import ClusterSpec, resolve_spec

BAD_UP = [
    (["--nodes", "0"], "--nodes='0'"),
    (["--nodes", "-1"], "--nodes='-1'"),
    (["--nodes", "abc"], "--nodes='abc'"),
    (["--nodes", "100000"], "--nodes='100000'"),
    (["--name", "Bad_Name!"], "--name='Bad_Name!'"),
    (["--name=-lead"], "--name='-lead'"),
    (["--instance-type", "c6i.huge"], "--instance-type='c6i.huge'"),
    (["--instance-type", "p5.48xlarge"], "--instance-type='p5.48xlarge'"),
    (["--region", "mars-north-1"], "--region='mars-north-1'"),
    (["--ssh-cidr", "0.0.0.0/0"], "--ssh-cidr='0.0.0.0/0'"),
    (["--ssh-cidr", "::/0"], "--ssh-cidr='::/0'"),
    (["--ssh-cidr", "300.1.2.3/32"], "--ssh-cidr='300.1.2.3/32'"),
    (["--spot", "maybe"], "--spot='maybe'"),
    (["--max-hours", "0"], "--max-hours='0'"),
    (["--max-hours", "0.0001"], "--max-hours='0.0001' is out of range; allowed: from 0.25 up to 168"),
    (["--root-volume-gb", "2"], "--root-volume-gb='2'"),
    (["--stack", "cuda"], "--stack='cuda'"),
    (["--provider", "gcp"], "--provider='gcp'"),
    (["--zones", "us-west-2a"], "--zones='us-west-2a'"),
    (["--ami", "ami-xyz"], "--ami='ami-xyz'"),
    (["--config", "/does/not/exist.toml"], "--config='/does/not/exist.toml'"),
]


@pytest.mark.slow
@pytest.mark.parametrize("flags,named", BAD_UP, ids=[" ".join(f) for f, _ in BAD_UP])
def test_bad_input_is_refused_with_one_line_and_nothing_created(aws, ftc_home, flags, named):
    proc = ftc("up", "--name", "bad", "--provider", "aws", "--yes", "1", "--ssh-cidr", "203.0.113.7/32", *flags)
    assert_refused(proc, named, ftc_home)
    assert_nothing_left(aws.ec2(), "bad")


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


def test_a_providers_own_setting_goes_by_the_one_precedence_into_the_specs_settings_for_its_verbs():
    config, env = {"ami": "ami-0000000a"}, {"FTC_AMI": "ami-0000000b"}
    assert resolve_spec({"provider": "aws"}, env, config).settings["ami"] == "ami-0000000b"
    assert resolve_spec({"provider": "aws", "ami": "ami-0000000c"}, env, config).settings["ami"] == "ami-0000000c"
    assert resolve_spec({"provider": "aws"}, {}, config).settings["ami"] == "ami-0000000a"
    assert resolve_spec({"provider": "aws"}, {}, {}).settings["ami"] == ""  # empty: the SSM parameter's, at launch
    with pytest.raises(UsageError, match=r"^--ami='ami-xyz' is not an AMI id; allowed: ami- followed by 8-17 hex "
                                         r"digits, or empty$"):
        resolve_spec({"provider": "aws"}, {}, {"ami": "ami-xyz"})


AWS_OWN = ("ami", "root_volume_gb", "ena_express", "ssh_cidr", "allow_open_ssh")
SLURM_OWN = ("partition", "account", "qos", "constraint", "login")


def test_a_providers_own_settings_are_its_worlds_and_no_field_or_parser_of_the_spec():
    from dataclasses import fields

    from provision.providers.records import registered
    from provision.spec import PARSERS, every_parser
    for provider, keys in (("aws", AWS_OWN), ("slurm", SLURM_OWN)):
        assert tuple(registered()[provider].world.settings) == keys
    spec_fields = {f.name for f in fields(ClusterSpec)}
    assert not spec_fields & {*AWS_OWN, *SLURM_OWN} and not set(PARSERS) & {*AWS_OWN, *SLURM_OWN}
    assert {*AWS_OWN, *SLURM_OWN} <= set(every_parser())  # still a flag, an FTC_ variable and a config key each
    slurm = resolve_spec({"provider": "slurm", "partition": "debug", "qos": "high", "root_volume_gb": "8"}, {})
    assert (slurm.settings["partition"], slurm.settings["qos"], slurm.settings["login"]) == ("debug", "high", "")
    assert slurm.settings["root_volume_gb"] == 8  # a provider with no catalog takes the default world's, as before
    assert not set(resolve_spec({}, {}).settings) & set(SLURM_OWN)  # local's spec holds none of Slurm's


@pytest.mark.parametrize("how", ["flag", "env", "config"])
def test_a_slurm_setting_given_to_another_provider_is_refused_in_one_line_naming_whose_it_is(ftc_home, how):
    config = ftc_home.parent / "ftc.toml"  # ./ftc.toml: the test's own folder
    if how == "config":
        config.write_text('[cluster]\nqos = "high"\n')
    argv = ["up", "--name", "q", "--provider", "local"] + (["--qos", "high"] if how == "flag" else [])
    proc = ftc(*argv, env={"FTC_QOS": "high"} if how == "env" else {})
    assert_refused(proc, "--qos is for a Slurm cluster (--provider=slurm), not --provider='local'; add "
                         "--provider=slurm or leave --qos out", ftc_home)
    config.unlink(missing_ok=True)


def test_the_owner_label_takes_the_form_its_providers_world_gives():
    assert resolve_spec({"provider": "aws", "owner": "team a@example.com"}, {}, {}).owner == "team a@example.com"
    with pytest.raises(UsageError, match=r"^--owner='a\$b' is not an ftc:owner tag value; allowed: up to 128 letters, "
                                         r"digits, spaces and _.:/=\+-@, or empty$"):
        resolve_spec({"provider": "aws", "owner": "a$b"}, {}, {})


def test_precedence_is_flags_then_env_then_config_then_defaults():
    config = {"nodes": 3, "region": "eu-west-1", "stack": "intel"}
    env = {"FTC_NODES": "5", "FTC_REGION": "us-west-2"}
    spec = resolve_spec({"nodes": "7"}, env, config)
    assert (spec.nodes, spec.region, spec.stack, spec.instance_type) == (7, "us-west-2", "intel", "c6i.16xlarge")
    assert resolve_spec({}, env, config).nodes == 5
    assert resolve_spec({}, {}, config).nodes == 3
    assert resolve_spec({}, {}, {}) == ClusterSpec()


def test_open_ssh_needs_explicit_opt_in():
    with pytest.raises(UsageError, match="--allow-open-ssh=1"):
        resolve_spec({"ssh_cidr": "0.0.0.0/0"}, {}, {})
    assert resolve_spec({"ssh_cidr": "0.0.0.0/0", "allow_open_ssh": "1"}, {}, {}).settings["ssh_cidr"] == "0.0.0.0/0"


@pytest.mark.parametrize("cidr", ["0.0.0.0/1", "10.0.0.0/8", "2001:db8::/32"])
def test_ssh_open_to_more_than_a_site_needs_explicit_opt_in(cidr):
    with pytest.raises(UsageError, match=f"--ssh-cidr='{cidr}' opens SSH to more than a /16 .*--allow-open-ssh=1"):
        resolve_spec({"ssh_cidr": cidr}, {}, {})
    assert resolve_spec({"ssh_cidr": cidr, "allow_open_ssh": "1"}, {}, {}).settings["ssh_cidr"] == cidr
    assert resolve_spec({"ssh_cidr": "203.0.113.0/24"}, {}, {}).settings["ssh_cidr"] == "203.0.113.0/24"


def test_job_settings_follow_the_same_precedence_flag_then_ftc_variable():
    from argparse import Namespace

    from runner.jobspec import job_from_args
    assert job_from_args(Namespace(task="mrpc", epochs=None), env={"FTC_EPOCHS": "1"}).epochs == 1
    assert job_from_args(Namespace(task="mrpc", epochs="2"), env={"FTC_EPOCHS": "1"}).epochs == 2
    assert job_from_args(Namespace(task=None, epochs=None), env={"FTC_TASK": "rte"}).task == "rte"
    with pytest.raises(UsageError, match="abc"):
        job_from_args(Namespace(task="mrpc"), env={"FTC_EPOCHS": "abc"})


def test_zone_outside_region_is_refused():
    with pytest.raises(UsageError, match="not in --region"):
        resolve_spec({"zones": "eu-west-1a", "region": "us-east-1"}, {}, {})


EVERY_COMMAND = [
    (["down", "--name", "Bad!"], "--name='Bad!'"),
    (["down", "--name", "x", "--provider", "gcp"], "--provider='gcp'"),
    (["down", "--name", "x", "--region", "moon-1"], "--region='moon-1'"),
    (["status", "--name", "Bad!"], "--name='Bad!'"),
    (["status", "--name", "nosuch"], "--name='nosuch'"),
    (["bootstrap", "--name", "nosuch"], "--name='nosuch'"),
    (["bootstrap", "--name", "nosuch", "--with", "chef"], "--with='chef'"),
    (["ssh", "--name", "nosuch"], "--name='nosuch'"),
    (["logs", "--name", "nosuch"], "--name='nosuch'"),
    (["cancel", "--name", "nosuch"], "--name='nosuch'"),
    (["fetch", "--name", "nosuch"], "--name='nosuch'"),
    (["extend", "--name", "nosuch", "--hours", "-1"], "--hours='-1'"),
    (["extend", "--name", "nosuch", "--hours", "2"], "--name='nosuch'"),
    (["inventory", "--name", "nosuch"], "--name='nosuch'"),
    (["finetune", "--name", "nosuch", "--ppn", "zero"], "--ppn='zero'"),
    (["finetune", "--name", "nosuch", "--lr", "2"], "--lr='2'"),
    (["finetune", "--name", "nosuch", "--max-train-samples", "-5"], "--max-train-samples='-5'"),
    (["finetune", "--name", "nosuch", "--max-eval-samples", "x"], "--max-eval-samples='x'"),
    (["finetune", "--name", "nosuch", "--model", "/no/such/model"], "--model='/no/such/model'"),
    (["run", "--nodes", "0"], "--nodes='0'"),
    (["run", "--nodes", "2", "--task", "squad"], "--task='squad'"),
    (["run", "--keep", "perhaps"], "--keep='perhaps'"),
    (["up", "--bootstrap", "sometimes"], "--bootstrap='sometimes'"),
    (["up", "--yes", "sure"], "--yes='sure'"),
    (["bench", "scaling", "--ranks", "1,x"], "'x' is not a whole number"),
    (["bench", "scaling", "--repeats", "0"], "--repeats='0' is out of range; allowed: 1.."),
    (["plan", "--task", "squad"], "--task='squad'"),
    (["plan", "--nodes", "1,65"], "--nodes='65'"),
    (["plan", "--instance-type", "p5.48xlarge"], "--instance-type='p5.48xlarge'"),
    (["plan", "--epochs", "three"], "--epochs='three'"),
    (["plan", "--samples-per-s", "-3"], "--samples-per-s='-3'"),
    (["plan", "--bench", "/no/such/bench.json"], "--bench='/no/such/bench.json'"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
]


@pytest.mark.parametrize("argv,named", EVERY_COMMAND, ids=[" ".join(a) for a, _ in EVERY_COMMAND])
def test_every_command_refuses_bad_input_with_one_line_and_changes_nothing(ftc_home, argv, named):
    assert_refused(ftc(*argv), named, ftc_home)


HOSTILE = ['a"; touch {m}; echo "', "x'; touch {m}; echo '", "`touch {m}`", "$$(touch {m})", "$(touch {m})",
           "$(shell touch {m})"]


@pytest.mark.parametrize("variable,target", [("NAME", "cluster"), ("OWNER", "cluster"), ("STACK", "cluster"),
                                             ("LR", "demo"), ("BOOTSTRAPPER", "bootstrap")])
@pytest.mark.parametrize("template", HOSTILE)
def test_make_variables_reach_ftc_as_data_never_as_shell_code(ftc_home, tmp_path, variable, target, template):
    marker = tmp_path / "ran"
    value = template.format(m=marker)
    extra = [] if variable == "NAME" else ["NAME=hostile"]
    proc = make(target, f"{variable}={value}", "NODES=1", *extra, home=ftc_home)
    assert not marker.exists(), f"{variable}={value!r} ran as shell code"
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and f"{variable}=" in errors[0], proc.stderr
    assert not (ftc_home / "clusters").exists() or not any((ftc_home / "clusters").glob("*/state.json"))


@pytest.mark.parametrize("flags", [[], ["-i"]])
@pytest.mark.parametrize("variable,target", [("LABEL_COLUMN", "finetune"), ("NAME", "cluster"), ("ARGS", "launch")])
@pytest.mark.parametrize("given", ["command line", "environment"])
def test_a_newline_in_a_make_variable_is_refused_before_any_recipe_runs(ftc_home, tmp_path, flags, variable, target,
                                                                         given):
    """The rest of the value after a newline would be a recipe line of its own (under `make -i` it ran)."""
    marker = tmp_path / "ran"
    value = f"x\ntouch {marker} #"
    if given == "environment":
        proc = subprocess.run(["make", "-s", "-C", str(REPO), *flags, target], capture_output=True, text=True,
                              timeout=300, env={**os.environ, "FTC_HOME": str(ftc_home), variable: value})
    else:
        proc = make(*flags, target, f"{variable}={value}", home=ftc_home)
    assert proc.returncode == 2 and not marker.exists(), proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.endswith(f"*** error: {variable} holds a newline; give a value without one.  Stop."), line


def test_every_variable_a_recipe_reads_is_checked_from_the_environment_too():
    text = (REPO / "Makefile").read_text()
    read = set(re.findall(r"\$\(call (?:flag|given_or),([A-Z0-9_]+)", text)) | set(re.findall(r"\$\(value ([A-Z0-9_]+)\)", text))
    read -= {"VAR"}  # the placeholder in the comments that explain `flag` and `given_or`
    inputs = set(re.search(r"^INPUTS := (.*?)\n\$", text, re.S | re.M).group(1).replace("\\", " ").split())
    assert read and read <= inputs, read - inputs


def test_config_whose_cluster_is_not_a_table_is_refused(ftc_home, tmp_path):
    config = tmp_path / "ftc.toml"
    config.write_text("cluster = 5\n")
    assert_refused(ftc("up", "--name", "cfg", "--config", str(config)), "'cluster' must be a table", ftc_home)


def test_a_config_that_is_a_directory_is_refused(ftc_home, tmp_path):
    (tmp_path / "cfgdir").mkdir()
    assert_refused(ftc("up", "--name", "cfg", "--config", str(tmp_path / "cfgdir")), "--config=", ftc_home)
    (tmp_path / "ftc.toml").mkdir()  # ./ftc.toml, read without being named
    proc = ftc("up", "--name", "cfg")
    assert_refused(proc, "--config='ftc.toml' cannot be read (Is a directory)", ftc_home)


@pytest.mark.parametrize("text,named", [("nodes = 2\n[cluster]\nnodes = 1\n", "'nodes' outside its [cluster] table"),
                                        ("[cluster]\nnodes = 1\n[job]\nepochs = 1\n", "'job' outside its [cluster]")])
def test_config_settings_outside_the_cluster_table_are_refused_by_name(ftc_home, tmp_path, text, named):
    config = tmp_path / "c.toml"
    config.write_text(text)
    assert_refused(ftc("up", "--name", "cfg", "--config", str(config)), named, ftc_home)


@pytest.mark.parametrize("command", [
    ["launch", "--name", "c", "--", "x" * 256],
    ["launch", "--name", "c", "--workdir", "/tmp/" + "d/" * 2100, "--", "t.py"],
    ["launch", "--name", "c", "--data", "y" * 300, "--", str(REPO / "examples" / "hf_trainer_glue.py")],
    ["finetune", "--name", "c", "--task", "custom", "--train-file", "z" * 300, "--validation-file", "v.csv"],
])
def test_a_path_longer_than_any_file_can_have_is_refused_in_one_line(ftc_home, command):
    proc = ftc(*command)
    assert proc.returncode == 2 and "is longer than a path can be (255 bytes a name, 4096 in all)" in one_error(proc)
    assert not ftc_home.exists()


@pytest.mark.slow
def test_a_home_of_no_such_user_in_a_path_is_refused_by_name(ftc_home, tmp_path):
    key = ftc("up", "--name", "tilde", "--provider", "ssh", "--hosts", "127.0.0.1:1",
              "--ssh-key", f"{NO_SUCH_USER_HOME}/key")
    assert_refused(key, f"--ssh-key='{NO_SUCH_USER_HOME}/key': '{NO_SUCH_USER_HOME}' names no home directory", ftc_home)
    up_local("inv")
    try:
        out = ftc("inventory", "--name", "inv", "--out", f"{NO_SUCH_USER_HOME}/inv.yml")
        assert out.returncode == 2 and f"--out='{NO_SUCH_USER_HOME}/inv.yml'" in only_line(out)
        assert not (tmp_path / NO_SUCH_USER_HOME).exists()
    finally:
        assert ftc("down", "--name", "inv").returncode == 0


@pytest.mark.parametrize("variable,value", [("FTC_CONNECT_ATTEMPTS", "abc"), ("FTC_CONNECT_ATTEMPTS", "0"),
                                            ("FTC_LOCAL_REUSE_STACK", "maybe")])
def test_a_bad_tuning_variable_is_refused_before_anything_launches(ftc_home, variable, value):
    proc = ftc("up", "--name", "ca", "--nodes", "1", env={variable: value})
    assert_refused(proc, f"{variable}={value!r}", ftc_home)
    assert sshd_pids(ftc_home) == []


@pytest.mark.parametrize("odd,what", [('"', "a double quote"), ("%", "a '%'"), ("${", "'${'"),
                                     ("\n", "a control character")])
def test_an_ftc_home_that_ssh_configurations_cannot_carry_is_refused_before_anything_is_made(tmp_path, monkeypatch,
                                                                                            odd, what):
    home = tmp_path / f"home{odd}x"
    monkeypatch.setenv("FTC_HOME", str(home))
    monkeypatch.chdir(tmp_path)
    for key in [k for k in os.environ if k.startswith("FTC_") and k != "FTC_HOME"]:
        monkeypatch.delenv(key)
    proc = ftc("up", "--name", "q", "--nodes", "1")
    assert proc.returncode == 2 and f"holds {what}" in only_line(proc) and "FTC_HOME=" in proc.stderr
    assert not home.exists()


@pytest.mark.parametrize("command", [["up", "--name", "v", "--nodes", "1", "--no-bootstrap"], ["down", "--name", "v"]])
@pytest.mark.parametrize("kind", ["a file", "under /proc"])
def test_an_ftc_home_that_cannot_be_written_is_refused_in_one_line(ftc_home, tmp_path, command, kind):
    home = tmp_path / "afile" if kind == "a file" else Path("/proc/ftc")
    if kind == "a file":
        home.write_text("not a directory")
    proc = ftc(*command, env={"FTC_HOME": str(home)})
    assert proc.returncode == 2
    assert one_error(proc).startswith(f"error: FTC_HOME='{home}' is not writable")
    assert not home.exists() or home.read_text() == "not a directory"


def test_make_passes_every_switch_value_to_ftc_and_quick_0_is_not_quick():
    dry = subprocess.run(["make", "-n", "-s", "bench", "QUICK=0", "run", "RESUME=yes", "KEEP=no"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    dry = " ".join(dry.split())
    assert "bench 'scaling' --quick='0'" in dry and "--keep='no' --resume='yes'" in dry


def test_make_run_honours_resume_yes_and_refuses_a_switch_it_cannot_read(ftc_home, minilm, glue_dir):
    job = [f"MODEL={minilm}", f"DATA_DIR={glue_dir}", "MAX_TRAIN_SAMPLES=16", "EPOCHS=1"]
    resumed = make("run", "NAME=rr", "NODES=1", "RESUME=yes", *job, home=ftc_home)
    assert resumed.returncode != 0 and "--resume: no checkpoint of mrpc" in resumed.stderr  # RESUME=yes is on
    for variable, target in (("RESUME", "run"), ("KEEP", "run"), ("QUICK", "bench")):
        proc = make(target, "NAME=rr", "NODES=1", f"{variable}=maybe", *job, home=ftc_home)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
        assert proc.returncode != 0 and errors == [f"error: {variable}='maybe' is not a boolean; "
                                                   "allowed: 1/0, true/false, yes/no"], proc.stderr
    assert sshd_pids(ftc_home) == [] and not (ftc_home / "clusters").exists()



def test_a_space_separated_host_list_is_echoed_as_given_and_no_host_is_glued_together(ftc_home):
    for hosts, item in [("alice@h1 bob@h2", "'alice@h1 bob@h2'"), ("alice@h1 h1x, bob@h2", "'alice@h1 h1x'")]:
        with pytest.raises(UsageError) as refused:
            resolve_spec({"provider": "ssh", "hosts": hosts}, {})
        assert f"{item} is not a host (hosts are separated by commas, not spaces)" in str(refused.value)
        assert "h1bob" not in str(refused.value) and "h1h1x" not in str(refused.value)
    assert resolve_spec({"provider": "ssh", "hosts": " alice@h1 , bob@h2 "}, {}).hosts == ["alice@h1:22", "bob@h2:22"]
    proc = ftc("up", "--provider", "ssh", "--hosts", "alice@h1 bob@h2", "--name", "spaced")
    assert_refused(proc, "'alice@h1 bob@h2' is not a host (hosts are separated by commas", ftc_home)


def test_make_passes_every_job_option_to_finetune_run_and_sweep_and_the_planned_ones_to_plan():
    from runner.jobflags import JOB_FLAG_ALIASES, JOB_FLAGS
    given = {key: f"v{i}" for i, key in enumerate([*JOB_FLAGS, *JOB_FLAG_ALIASES])}  # former names too
    assignments = [f"{key.upper()}={value}" for key, value in given.items()]
    for target in ("finetune", "run", "sweep"):
        dry = subprocess.run(["make", "-n", "-s", target, *assignments], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout
        missing = [key for key, value in given.items() if f"--{key.replace('_', '-')}='{value}'" not in dry]
        assert missing == [], f"make {target} drops {missing}"
    dry = subprocess.run(["make", "-n", "-s", "plan", *assignments], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    for key in ("task", "model", "epochs", "batch_size", "flows", "allreduce", "grad_compress"):  # what ftc plan models
        assert f"--{key.replace('_', '-')}='{given[key]}'" in dry


def test_make_passes_every_cluster_setting_to_cluster_run_and_sweep():
    from provision.spec import every_parser
    given = {key: f"v{i}" for i, key in enumerate(every_parser())}  # the built-in providers' own settings too
    assignments = [f"{key.upper()}={value}" for key, value in given.items()]
    for target in ("cluster", "run", "sweep"):
        dry = subprocess.run(["make", "-n", "-s", target, *assignments], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout
        missing = [key for key, value in given.items() if f"--{key.replace('_', '-')}='{value}'" not in dry]
        assert missing == [], f"make {target} drops {missing}"


@pytest.mark.parametrize("raw", ["1_6", "١٦", "１６"])
def test_a_whole_number_is_ascii_digits_as_typed_not_what_int_also_reads(raw):
    from provision.values import number, whole, whole_list
    with pytest.raises(UsageError, match="is not a whole number"):
        resolve_spec({"nodes": raw}, {}, {})
    with pytest.raises(UsageError, match="is not a whole number"):
        whole_list(1, 64)("batch_split", f"1,{raw}")
    with pytest.raises(UsageError, match="is not a number"):
        number(0, 100)("max_hours", raw)
    assert whole(1, 64)("nodes", " 16 ") == 16


def test_a_name_list_keeps_the_order_given_each_name_once_and_names_what_is_not_allowed():
    from provision.values import name_list
    levers = name_list(("flows", "ceiling", "powersgd"), "lever")
    assert levers("levers", " ceiling, flows,ceiling ") == ["ceiling", "flows"]
    for raw, named in (("flows,wings", "'wings'"), (",", "''"), ("", "''")):
        with pytest.raises(UsageError) as refused:
            levers("levers", raw)
        assert str(refused.value) == f"--levers={named} is not a lever; allowed: flows, ceiling, powersgd"
    launches = name_list(("a", "b"), "launch", "all")
    assert launches("launches", "all") == ["a", "b"] and launches("launches", "b") == ["b"]
    with pytest.raises(UsageError, match=r"^--launches='c' is not a launch; allowed: all, or a comma list of a, b$"):
        launches("launches", "c")


def test_plan_refuses_an_underscored_node_count_in_one_line(ftc_home):
    proc = ftc("plan", "--nodes", "1_6")
    assert proc.returncode == 2 and one_error(proc) == "error: --nodes='1_6' is not a whole number; allowed: 1..64"


def test_a_plan_size_named_twice_an_empty_compare_out_and_zones_of_commas_are_refused(ftc_home):
    plan = ftc("plan", "--nodes", "1,1")
    assert plan.returncode == 2 and one_error(plan) == "error: --nodes='1,1' names 1 twice; give each once"
    compare = ftc("runs", "compare", "a", "b", "--out", "")
    assert compare.returncode == 2 and "--out='' is empty" in one_error(compare)
    with pytest.raises(UsageError, match="--zones=',' names no zone"):
        resolve_spec({"provider": "aws", "zones": ","}, {}, {})


def test_detach_takes_the_same_forms_in_finetune_and_launch(ftc_home):
    Path("x.py").write_text("print(1)\n")  # in the test's own working directory
    for command in ("finetune", "launch"):
        taken = ftc(command, "--name", "none-here", "--detach", "1", *(["--", "x.py"] if command == "launch" else []))
        assert taken.returncode == 2 and "--detach" not in one_error(taken), taken.stderr  # past the flag, to the cluster
        bad = ftc(command, "--name", "none-here", "--detach", "maybe", *(["--", "x.py"] if command == "launch" else []))
        assert bad.returncode == 2 and one_error(bad).startswith("error: --detach='maybe'"), bad.stderr


def test_a_lifetime_shorter_than_a_bootstrap_is_refused():
    with pytest.raises(UsageError, match=r"--max-hours='0.0001' is out of range; allowed: from 0.25 up to 168"):
        resolve_spec({"max_hours": "0.0001"}, {}, {})
    assert resolve_spec({"max_hours": "0.25"}, {}, {}).max_hours == 0.25
