"""The cluster side's pure decisions, without a server: where `down` looks for a lost cluster, how
local nodes share the cores, which hosts are one server, what a host string means, what an FTC_HOME
or a JSON value may hold, how sshd's process title is read, and what a host's cleanup does."""

import json
import os
import subprocess

import pytest

from provision import state as st
from provision.cluster import search_places, still_runs
from provision.providers.local import START_MARK, shown, split_cores, sshd_config_of, this_start
from provision.providers.own_servers import Host, cleanup_script, same_servers
from provision.spec import ClusterSpec
from provision.state import home_problem
from provision.values import conforms, control_character, kind_name, parse_host, value_kind

# ---- where `down` looks for a cluster whose state is lost ---------------------------------------


def test_search_places_without_a_record_or_credentials_is_this_machine_in_the_default_region():
    assert search_places(None, None, {}, []) == (["local"], ClusterSpec.region)


def test_search_places_adds_aws_in_the_recorded_region_when_the_broken_state_records_it():
    assert search_places(None, None, {"provider": "aws", "region": "eu-west-1"}, []) == (["local", "aws"], "eu-west-1")


def test_search_places_adds_every_askable_provider_and_the_recorded_one_with_the_region_told():
    places = search_places(None, "us-west-2", {"provider": "ssh", "region": "bogus"}, ["aws"])
    assert places == (["local", "aws", "ssh"], "us-west-2")


def test_search_places_ignores_a_recorded_provider_or_region_ftc_does_not_know():
    assert search_places(None, None, {"provider": "gcp", "region": "mars-1"}, []) == (["local"], ClusterSpec.region)


def test_search_places_looks_only_where_it_is_told():
    assert search_places("aws", None, {"provider": "ssh"}, []) == (["aws"], ClusterSpec.region)


def test_still_runs_says_how_to_go_on_and_that_aws_nodes_bill():
    assert still_runs(ClusterSpec(name="s", nodes=1)) == (
        "cluster s still runs (1 local node(s)), not bootstrapped: `ftc bootstrap --name s` continues, "
        "`ftc down --name s` removes it")
    assert "(2 aws node(s), billed while they run)" in still_runs(ClusterSpec(name="s", nodes=2, provider="aws"))


# ---- local nodes: cores, sshd's process title, its log -----------------------------------------

def test_split_cores_gives_each_node_a_disjoint_contiguous_share_larger_ones_first():
    assert split_cores([3, 1, 2, 0, 5, 4, 7, 6], 3) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert split_cores([0, 1, 2, 3], 4) == [[0], [1], [2], [3]]


def test_split_cores_shares_round_robin_when_nodes_outnumber_cores():
    assert split_cores([0, 1], 5) == [[0], [1], [0], [1], [0]]


def test_shown_escapes_a_path_as_sshds_title_does():
    assert shown(b"/h\xc3\xb4me\\x/a b\n") == b"/h\\303\\264me\\\\x/a b\\n"


def test_sshd_config_of_reads_the_argv_and_the_listening_title_and_nothing_else():
    assert sshd_config_of(b"/usr/sbin/sshd\0-D\0-e\0-f\0/x/sshd_config\0") == b"/x/sshd_config"
    title = b"sshd: /usr/sbin/sshd -D -e -f /x/sshd_config [listener] 0 of 10-100 startups"
    assert sshd_config_of(title) == b"/x/sshd_config"
    assert sshd_config_of(b"/usr/sbin/sshd\0-D\0-e\0-f\0/x/sshd_config\0extra\0") is None
    assert sshd_config_of(b"/usr/bin/python3\0-D\0-e\0-f\0/x/sshd_config\0") is None


def test_this_start_keeps_only_what_sshd_said_since_its_last_start():
    log = b"old\n" + START_MARK + b" 1\nfirst\n" + START_MARK + b" 2\nsaid this\nand that\n"
    assert this_start(log) == ["said this", "and that"]


# ---- your own servers --------------------------------------------------------------------------

def test_parse_host_splits_user_address_and_port_with_yours_and_22_as_defaults():
    assert parse_host("alice@gpu1:2222") == ("alice", "gpu1", 2222)
    assert parse_host(" 10.0.0.5 ") == ("", "10.0.0.5", 22)
    assert parse_host("bob@[fd00::1]:22") == ("bob", "fd00::1", 22)


@pytest.mark.parametrize("text", ["-oProxyCommand=x", "a@b:0", "a@b:70000", "a b", "@host", ""])
def test_parse_host_refuses_an_option_a_port_out_of_range_and_malformed_text(text):
    with pytest.raises(ValueError, match="is not user@host\\[:port\\]"):
        parse_host(text)


def test_same_servers_refuses_one_account_on_one_server_under_two_spellings():
    hosts = [Host("me", "127.0.0.2", 22), Host("me", "127.2", 22)]
    assert same_servers(hosts, ["127.0.0.2", "127.0.0.2"]) == (
        "HOSTS names one server twice: me@127.0.0.2:22 and me@127.2:22 are both me@127.0.0.2:22; give each server once")


def test_same_servers_allows_two_accounts_or_two_ports_and_leaves_unresolved_hosts_alone():
    assert same_servers([Host("me", "a", 22), Host("you", "b", 22)], ["127.0.0.2", "127.0.0.2"]) == ""
    assert same_servers([Host("me", "a", 22), Host("me", "b", 2222)], ["127.0.0.2", "127.0.0.2"]) == ""
    assert same_servers([Host("me", "a", 22), Host("me", "b", 22)], ["", ""]) == ""


def ssh_cluster(tmp_path, claim: str) -> tuple[st.ClusterState, st.NodeInfo]:
    """A cluster on one server of yours whose directory lies under tmp_path/home, holding `claim`."""
    workdir = tmp_path / "home" / ".ftc-node" / "c"
    (workdir / ".ftc").mkdir(parents=True)
    (workdir / ".ftc" / "claim").write_text(claim)
    node = st.NodeInfo(index=0, name="c-0", id="me@127.0.0.2:22", public_ip="127.0.0.2", private_ip="127.0.0.2",
                       ssh_user="me", workdir=str(workdir), authorized_keys=str(tmp_path / "home" / "ak"))
    state = st.ClusterState(name="c", provider="ssh", spec=ClusterSpec(name="c").to_dict(), nodes=[node])
    state.resources.claim = "the-claim"
    state.jobs = [st.JobInfo(id="j1", task="mrpc", remote_dir="/r", results_dir="/y", pid=41, pid_start=7,
                             pids_by_node={"c-0": [41], "c-1": [42]}),
                  st.JobInfo(id="j0", task="mrpc", remote_dir="/r", results_dir="/y", pid=40, pid_start=6,
                             state="finished", pids_by_node={"c-0": [40]})]
    return state, node


def run_sh(script: str) -> str:
    return subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, check=True,
                          env={"PATH": os.environ["PATH"]}).stdout.split()[-1]


def test_cleanup_script_stops_only_this_nodes_running_jobs(tmp_path):
    state, node = ssh_cluster(tmp_path, "the-claim")
    script = cleanup_script(state, node)
    assert "kill -TERM -- -41" in script
    assert "-- -42" not in script and "-- -40" not in script  # another node's job; a finished one


def test_cleanup_script_removes_a_directory_holding_the_claim(tmp_path):
    state, node = ssh_cluster(tmp_path, "the-claim")
    state.jobs = []
    assert run_sh(cleanup_script(state, node)) == "CLEANED"
    assert not (tmp_path / "home" / ".ftc-node" / "c").exists()


def test_cleanup_script_leaves_a_directory_holding_another_claim(tmp_path):
    state, node = ssh_cluster(tmp_path, "someone-elses")
    state.jobs = []
    assert run_sh(cleanup_script(state, node)) == "NOT_OURS"
    assert (tmp_path / "home" / ".ftc-node" / "c" / ".ftc" / "claim").read_text() == "someone-elses"


# ---- what FTC_HOME and the JSON ftc reads back may hold -----------------------------------------

@pytest.mark.parametrize("home, problem", [("/a/b", ""), ('/a"b', "a double quote"), ("/a%b", "a '%'"),
                                           ("/a${b}", "'${'"), ("/a\tb", "a control character ('\\t')"),
                                           ("/a$b c", "")])
def test_home_problem_names_what_ssh_configurations_cannot_carry(home, problem):
    assert home_problem(home) == problem


def test_control_character_finds_the_first_one_and_delete():
    assert (control_character("a\nb\tc"), control_character("a\x7f"), control_character("plain")) == ("\n", "\x7f", "")


@pytest.mark.parametrize("value, kind, finite, fits", [
    (1, float, True, True), (True, int, True, False), (True, float, True, False), (1.5, int, True, False),
    (float("nan"), float, True, False), (float("nan"), float, False, True), (float("inf"), float | None, True, False),
    (None, float | None, True, True), ([1, 2.5], list[float], True, True), ([1, "x"], list[float], True, False),
    ({"a": 1}, dict[str, int], True, True), ({1: 1}, dict[str, int], True, False), ("x", str, True, True),
    (["x"], str, True, False), ({"any": object()}, dict[str, object], True, True)])
def test_conforms_takes_ints_as_floats_but_never_bools_and_finite_numbers_unless_told(value, kind, finite, fits):
    assert conforms(value, kind, finite) is fits


def test_kind_name_and_value_kind_say_types_in_the_same_words():
    assert kind_name(int | None) == "a whole number or null" and kind_name(list[str]) == "a list"
    assert [value_kind(v) for v in (True, 1, 1.5, None, [], {}, "s")] == [
        "true or false", "a whole number", "a number", "null", "a list", "an object", "a string"]


def test_an_ec2_on_this_machine_is_never_asked_about_through_a_public_service(monkeypatch):
    from provision.providers import aws
    assert aws.loopback_endpoint({"AWS_ENDPOINT_URL": "http://127.0.0.1:5000"})
    assert aws.loopback_endpoint({"AWS_ENDPOINT_URL_EC2": "http://localhost:9"})
    assert not aws.loopback_endpoint({"AWS_ENDPOINT_URL": "https://ec2.us-east-1.amazonaws.com"})
    assert not aws.loopback_endpoint({})
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://[::1]:5000")
    monkeypatch.setattr(aws.urllib.request, "urlopen", None)  # any query would fail the test
    assert aws.caller_cidr() == "127.0.0.1/32"


def test_a_state_saved_when_checkpoint_uri_was_named_checkpoint_s3_still_loads_with_its_store():
    """A cluster kept across the rename: its jobs' store is read under the new name, so `down` and `status` work."""
    saved = st.ClusterState(name="k", provider="local", spec=ClusterSpec(name="k").to_dict(),
                            jobs=[st.JobInfo(id="j", task="mrpc", remote_dir="/r", results_dir="/h",
                                             checkpoint_uri="s3://ftc-checkpoints/runs")])
    data = json.loads(saved.to_json())
    data["jobs"][0]["checkpoint_s3"] = data["jobs"][0].pop("checkpoint_uri")
    assert st.ClusterState.from_json(json.dumps(data)).jobs[0].checkpoint_uri == "s3://ftc-checkpoints/runs"


# A spec as `up` recorded it while ROOT_VOLUME_GB ... LOGIN were fields of the spec's own (top-level keys).
OLD_SPEC = {"name": "k", "nodes": 2, "instance_type": "c7i.8xlarge", "region": "us-east-1", "zones": [], "spot": False,
            "max_hours": 4.0, "stack": "stock", "owner": "", "hosts": [], "ssh_key": "", "stack_python": "",
            "root_volume_gb": 100, "ena_express": True, "ssh_cidr": "", "allow_open_ssh": False, "partition": "",
            "account": "", "qos": "", "constraint": "", "login": ""}


@pytest.mark.parametrize("provider, recorded, own", [
    ("aws", {"root_volume_gb": 250, "ena_express": False, "ssh_cidr": "203.0.113.7/32", "settings": {"ami": "ami-0a1b2c3d"}},
     {"ami": "ami-0a1b2c3d", "root_volume_gb": 250, "ena_express": False, "ssh_cidr": "203.0.113.7/32",
      "allow_open_ssh": False}),
    ("slurm", {"partition": "debug", "account": "lab", "login": "me@login:22"},  # saved before settings existed
     {"partition": "debug", "account": "lab", "qos": "", "constraint": "", "login": "me@login:22"}),
])
def test_a_state_saved_when_a_providers_settings_were_the_specs_fields_still_loads_with_them(provider, recorded, own):
    """A cluster kept across the move of its provider's settings into its World: the old top-level keys are
    read into the spec's settings, so `down`, `status` and a job see what `up` was given."""
    data = json.loads(st.ClusterState(name="k", provider=provider, spec={}).to_json())
    data["spec"] = {**OLD_SPEC, "provider": provider, **recorded}
    spec = st.ClusterState.from_json(json.dumps(data)).cluster_spec
    assert {key: spec.settings[key] for key in own} == own
    assert not any(hasattr(spec, key) for key in own)  # no field of the spec's: the provider's World owns them
    assert spec.to_dict()["settings"] == spec.settings and "partition" not in spec.to_dict()  # saved the new way
