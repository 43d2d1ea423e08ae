"""What the second hostile trial broke on the cluster side, each as the user met it: `down` in another
FTC_HOME, a copied cluster directory, state files that do not load, nodes that cannot be reached, an
interrupted bootstrap, AWS out of reach, bad config files, paths and tuning variables, one server
under two spellings, and a key that cannot log in."""

import getpass
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FTC, assert_nothing_left, ftc, sshd_pids
from helpers import wait_for
from test_hosts import Server
from test_spec import assert_refused

from provision import procs

NO_SUCH_USER_HOME = "~no-such-user-of-ftc"
AWS_UP = ["--provider", "aws", "--ssh-cidr", "203.0.113.7/32", "--yes", "1", "--no-bootstrap"]


def state_path(home: Path, name: str) -> Path:
    return home / "clusters" / name / "state.json"


def state_of(home: Path, name: str) -> dict:
    return json.loads(state_path(home, name).read_text())


def up_local(name: str, home: Path | None = None, nodes: int = 1) -> None:
    env = {"FTC_HOME": str(home)} if home else None
    proc = ftc("up", "--name", name, "--nodes", str(nodes), "--no-bootstrap", env=env)
    assert proc.returncode == 0, proc.stderr


def last_line(proc: subprocess.CompletedProcess) -> str:
    """The line a command ends on (its error), with no traceback before it."""
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr.strip().splitlines()[-1]


def only_line(proc: subprocess.CompletedProcess) -> str:
    """The one line a failure prints on stderr."""
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.fixture(autouse=True)
def nothing_left_running(tmp_path):
    """A failing test still stops the nodes it started (every test's homes lie under its tmp_path)."""
    yield
    procs.stop(sshd_pids(tmp_path))


def remove_aws_credentials(monkeypatch, tmp_path) -> None:
    """boto3 finds no credentials anywhere: no variables, no files, no instance metadata."""
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


# ---- item 1: only what is proven to be this FTC_HOME's --------------------------------------------

@pytest.mark.parametrize("relative", [False, True])
def test_down_in_another_ftc_home_leaves_a_same_named_cluster_whose_path_ends_alike(ftc_home, tmp_path, relative):
    """The other home's path is a tail of this one's: `.../k` against `.../nest/.../k` absolute, or
    `deep/k` from another directory against `.../deep/k`."""
    if relative:
        ours, other, cwd = tmp_path / "deep" / "k", "deep/k", tmp_path / "elsewhere"
    else:
        ours, other, cwd = tmp_path / "nest" / tmp_path.relative_to("/") / "k", str(tmp_path / "k"), tmp_path
    cwd.mkdir(exist_ok=True)
    up_local("v", ours)
    (pid,) = sshd_pids(ours)
    try:
        down = ftc("down", "--name", "v", env={"FTC_HOME": other}, cwd=cwd)
        assert down.returncode == 0, down.stderr
        assert sshd_pids(ours) == [pid] and state_path(ours, "v").exists()
    finally:
        assert ftc("down", "--name", "v", env={"FTC_HOME": str(ours)}).returncode == 0
    assert not procs.alive(pid)


def test_down_stops_the_nodes_of_an_ftc_home_with_a_backslash_and_letters_beyond_ascii(ftc_home, tmp_path):
    home = tmp_path / "hôme\\x"  # sshd shows both escaped in its process title
    up_local("esc", home, nodes=2)
    pids = [node["pid"] for node in state_of(home, "esc")["nodes"]]
    assert all(procs.alive(pid) for pid in pids)
    down = ftc("down", "--name", "esc", env={"FTC_HOME": str(home)})
    assert down.returncode == 0, down.stderr
    assert not any(procs.alive(pid) for pid in pids)


# ---- item 3: a copied cluster directory is not the cluster ---------------------------------------

def test_down_of_a_copied_cluster_directory_leaves_the_original(ftc_home):
    import shutil
    up_local("real")
    (pid,) = sshd_pids(ftc_home)
    shutil.copytree(ftc_home / "clusters" / "real", ftc_home / "clusters" / "backup")
    status = ftc("status", "--name", "backup")
    assert status.returncode == 1 and "records cluster 'real', not 'backup'" in only_line(status)
    down = ftc("down", "--name", "backup")
    assert down.returncode == 0, down.stderr
    assert not (ftc_home / "clusters" / "backup").exists()
    assert "nothing left running" not in down.stderr  # it cannot know: the nodes are another name's
    assert "its state records cluster 'real', whose nodes may still run: `ftc down --name real` removes them" \
        in down.stderr, down.stderr
    assert sshd_pids(ftc_home) == [pid] and state_path(ftc_home, "real").exists()
    assert ftc("down", "--name", "real").returncode == 0
    assert sshd_pids(ftc_home) == []


def test_down_of_a_renamed_cluster_directory_names_the_cluster_that_still_runs(ftc_home):
    up_local("real")
    (ftc_home / "clusters" / "real").rename(ftc_home / "clusters" / "new")
    down = ftc("down", "--name", "new")
    assert down.returncode == 0 and "`ftc down --name real` removes them" in down.stderr, down.stderr
    assert len(sshd_pids(ftc_home)) == 1  # told, not guessed: the nodes run from the old name's paths
    assert ftc("down", "--name", "real").returncode == 0  # by the sshd configs under clusters/real
    assert sshd_pids(ftc_home) == []


# ---- item 4: a node that cannot be reached, a step that fails: one line -------------------------

def test_an_unreachable_node_or_a_failed_remote_step_is_one_line_naming_node_and_step(ftc_home):
    up_local("a")
    path = state_path(ftc_home, "a")
    state = json.loads(path.read_text())
    node = state["nodes"][0]
    state["jobs"] = [{"id": "mrpc-1", "task": "mrpc", "remote_dir": f"{node['workdir']}/jobs/never", "results_dir": "/r",
                      "state": "finished"}]
    path.write_text(json.dumps(state))
    logs = ftc("logs", "--name", "a")  # its output.log is not there
    assert logs.returncode == 1 and "node a-0: step 'logs' failed" in only_line(logs)
    os.kill(node["pid"], signal.SIGKILL)
    wait_for(lambda: not procs.alive(node["pid"]), "the killed sshd to be gone")
    logs = ftc("logs", "--name", "a", env={"FTC_CONNECT_ATTEMPTS": "2"})
    line = only_line(logs)
    assert logs.returncode == 1 and "node a-0: step 'connect' failed: no SSH after 2 attempts" in line, line
    assert "`ftc status --name a`" in line
    assert ftc("down", "--name", "a").returncode == 0


# ---- item 5: whatever state.json holds, status says so in one line and down removes the nodes -----

def set_created_at(state: dict) -> None:
    state["created_at"] = "yesterday"


def set_ssh_port(state: dict) -> None:
    state["nodes"][0]["ssh_port"] = "22"


def set_spec_nodes(state: dict) -> None:
    state["spec"]["nodes"] = "1"


def set_job_pid(state: dict) -> None:
    state["jobs"] = [{"id": "j", "task": "mrpc", "remote_dir": "/x", "results_dir": "/y", "pid": True}]


@pytest.mark.parametrize("spoil", [set_created_at, set_ssh_port, set_spec_nodes, set_job_pid, "directory"])
def test_a_state_of_wrong_types_or_a_directory_is_reported_in_one_line_and_down_removes_the_nodes(ftc_home, spoil):
    up_local("good")
    up_local("bad")
    bad_pid = state_of(ftc_home, "bad")["nodes"][0]["pid"]
    path = state_path(ftc_home, "bad")
    if spoil == "directory":
        path.unlink()
        path.mkdir()
        what = "cannot be read (Is a directory)"
    else:
        state = json.loads(path.read_text())
        spoil(state)
        path.write_text(json.dumps(state))
        what = "is not valid cluster state"
    one = ftc("status", "--name", "bad")
    assert one.returncode == 1 and what in only_line(one)
    every = ftc("status")
    assert every.returncode == 1 and "Traceback" not in every.stderr, every.stderr
    assert "good" in every.stdout and f"bad/state.json {what}" in every.stderr
    down = ftc("down", "--name", "bad")
    assert down.returncode == 0, down.stderr
    assert not procs.alive(bad_pid) and not (ftc_home / "clusters" / "bad").exists()
    assert len(sshd_pids(ftc_home)) == 1
    assert ftc("down", "--name", "good").returncode == 0


# ---- item 6: an interrupted bootstrap says the cluster still runs, and how to go on -------------

def test_up_interrupted_during_its_bootstrap_says_the_cluster_runs_and_how_to_go_on_or_remove_it(ftc_home, tmp_path):
    release = tmp_path / "release-bootstrap"  # the bootstrap holds there until the test has acted
    proc = subprocess.Popen([*FTC, "up", "--name", "s", "--nodes", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "FTC_HOLD_BOOTSTRAP": str(release)})
    wait_for(lambda: Path(f"{release}.reached").exists() or proc.poll() is not None, "the bootstrap to be held")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert "cluster s still runs (1 local node(s)), not bootstrapped: `ftc bootstrap --name s` continues, " \
           "`make destroy NAME=s` removes it" in err, err
    assert state_of(ftc_home, "s")["phase"] == "running" and len(sshd_pids(ftc_home)) == 1
    assert ftc("down", "--name", "s").returncode == 0
    assert sshd_pids(ftc_home) == []


# ---- item 7: AWS out of reach: say what may remain, keep what a retry needs ----------------------

def test_down_when_aws_cannot_be_asked_says_what_may_remain_and_a_retry_removes_it(aws, ftc_home, monkeypatch,
                                                                                   tmp_path):
    assert ftc("up", "--name", "far", "--nodes", "2", *AWS_UP).returncode == 0
    far_away = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1"}  # nothing listens; no retries
    unreachable = ftc("down", "--name", "far", env=far_away)
    line = only_line(unreachable)
    assert unreachable.returncode == 1 and line.startswith("error: AWS could not be reached ("), line
    assert "us-east-1 (tagged ftc:cluster=far) may remain; run `ftc down --name far` again" in line
    assert state_of(ftc_home, "far")["provider"] == "aws"
    status = ftc("status", "--name", "far", env=far_away)
    assert status.returncode == 0 and "Traceback" not in status.stderr, status.stderr
    assert status.stdout.count("unknown") == 2 and "AWS could not be asked" in status.stdout

    remove_aws_credentials(monkeypatch, tmp_path)
    no_credentials = ftc("down", "--name", "far")
    assert no_credentials.returncode == 1 and "AWS could not be reached (no credentials" in only_line(no_credentials)
    assert state_of(ftc_home, "far")["provider"] == "aws"

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    retry = ftc("down", "--name", "far")
    assert retry.returncode == 0 and "nothing left running" in retry.stderr, retry.stderr
    assert_nothing_left(aws.ec2(), "far")
    assert not (ftc_home / "clusters" / "far").exists()


def test_down_of_a_name_without_state_or_credentials_does_not_claim_aws_is_clean(ftc_home, monkeypatch, tmp_path):
    remove_aws_credentials(monkeypatch, tmp_path)
    proc = ftc("down", "--name", "never")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "nothing left running" not in proc.stderr
    assert "AWS was not searched (no credentials): if it ran there, `ftc down --name never --provider aws " \
           "--region us-east-1` with credentials removes" in proc.stderr
    assert not (ftc_home / "clusters" / "never").exists()

    told = ftc("down", "--name", "never", "--provider", "aws")
    assert told.returncode == 1 and "error: AWS could not be reached (no credentials" in last_line(told)
    assert state_of(ftc_home, "never")["provider"] == "aws"  # so `ftc down --name never` retries there


# ---- items 11, 22: config files ftc cannot read or would partly ignore ---------------------------

def test_a_config_that_is_a_directory_is_refused(ftc_home, tmp_path):
    (tmp_path / "cfgdir").mkdir()
    assert_refused(ftc("up", "--name", "cfg", "--config", str(tmp_path / "cfgdir")), "CONFIG=", ftc_home)
    (tmp_path / "ftc.toml").mkdir()  # ./ftc.toml, read without being named
    proc = ftc("up", "--name", "cfg")
    assert_refused(proc, "CONFIG='ftc.toml' cannot be read (Is a directory)", ftc_home)


@pytest.mark.parametrize("text,named", [("nodes = 2\n[cluster]\nnodes = 1\n", "'nodes' outside its [cluster] table"),
                                        ("[cluster]\nnodes = 1\n[job]\nepochs = 1\n", "'job' outside its [cluster]")])
def test_config_settings_outside_the_cluster_table_are_refused_by_name(ftc_home, tmp_path, text, named):
    config = tmp_path / "c.toml"
    config.write_text(text)
    assert_refused(ftc("up", "--name", "cfg", "--config", str(config)), named, ftc_home)


# ---- item 13: ~user of no such user ---------------------------------------------------------------

def test_a_home_of_no_such_user_in_a_path_is_refused_by_name(ftc_home, tmp_path):
    key = ftc("up", "--name", "tilde", "--provider", "ssh", "--hosts", "127.0.0.1:1",
              "--ssh-key", f"{NO_SUCH_USER_HOME}/key")
    assert_refused(key, f"SSH_KEY='{NO_SUCH_USER_HOME}/key': '{NO_SUCH_USER_HOME}' names no home directory", ftc_home)
    up_local("inv")
    try:
        out = ftc("inventory", "--name", "inv", "--out", f"{NO_SUCH_USER_HOME}/inv.yml")
        assert out.returncode == 2 and f"OUT='{NO_SUCH_USER_HOME}/inv.yml'" in only_line(out)
        assert not (tmp_path / NO_SUCH_USER_HOME).exists()
    finally:
        assert ftc("down", "--name", "inv").returncode == 0


# ---- items 16, 25: your own servers ----------------------------------------------------------------

@pytest.fixture
def server(tmp_path):
    key = tmp_path / "user_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    made = Server(tmp_path / "server", "127.0.0.111", key).start()
    yield made
    made.stop()


@pytest.mark.parametrize("spelling", ["127.000.000.111", "127.111", "[::ffff:127.0.0.111]"])
def test_one_server_under_two_spellings_is_refused_before_anything_changes(ftc_home, server, spelling):
    before = server.listing()
    hosts = f"{server.spec},{getpass.getuser()}@{spelling}:{server.port}"
    proc = ftc("up", "--name", "twice", "--provider", "ssh", "--hosts", hosts, "--ssh-key", str(server.root.parent /
               "user_key"), "--stack-python", sys.executable, "--yes", "1")
    assert_refused(proc, f"HOSTS names one server twice: {server.spec} and", ftc_home)
    assert f"are both {getpass.getuser()}@127.0.0.111:{server.port}" in proc.stderr
    assert server.listing() == before


def test_an_ssh_key_that_cannot_log_in_is_refused_by_name_before_any_server_is_asked(ftc_home, server, tmp_path):
    not_a_key = tmp_path / "not_a_key"
    not_a_key.write_text("not a key\n")
    before = server.listing()
    proc = ftc("up", "--name", "kk", "--provider", "ssh", "--hosts", server.spec, "--ssh-key", str(not_a_key),
               "--stack-python", sys.executable, "--yes", "1")
    assert_refused(proc, f"SSH_KEY='{not_a_key}' is not a private key ssh can use", ftc_home)
    assert "ftc status" not in proc.stderr and server.listing() == before


# ---- item 17: tuning variables are values like any other --------------------------------------------

@pytest.mark.parametrize("variable,value", [("FTC_CONNECT_ATTEMPTS", "abc"), ("FTC_CONNECT_ATTEMPTS", "0"),
                                            ("FTC_LOCAL_REUSE_STACK", "maybe")])
def test_a_bad_tuning_variable_is_refused_before_anything_launches(ftc_home, variable, value):
    proc = ftc("up", "--name", "ca", "--nodes", "1", env={variable: value})
    assert_refused(proc, f"{variable}={value!r}", ftc_home)
    assert sshd_pids(ftc_home) == []


@pytest.mark.parametrize("variable", ["FTC_AWS_POLL_SECONDS", "FTC_AWS_WAIT_MINUTES"])
def test_a_bad_aws_tuning_variable_is_refused_before_anything_is_created(aws, ftc_home, variable):
    proc = ftc("up", "--name", "poll", "--nodes", "1", *AWS_UP, env={variable: "x"})
    assert_refused(proc, f"{variable}='x' is not a number", ftc_home)
    assert_nothing_left(aws.ec2(), "poll")


def test_a_bad_aws_tuning_variable_on_down_is_refused_before_anything_is_removed(aws, ftc_home):
    assert ftc("up", "--name", "keep", "--nodes", "1", *AWS_UP).returncode == 0
    before = state_path(ftc_home, "keep").read_text()
    proc = ftc("down", "--name", "keep", env={"FTC_AWS_WAIT_MINUTES": "x"})
    assert proc.returncode == 2 and "FTC_AWS_WAIT_MINUTES='x' is not a number" in last_line(proc), proc.stderr
    assert state_path(ftc_home, "keep").read_text() == before  # not even marked terminating
    assert ftc("down", "--name", "keep").returncode == 0
    assert_nothing_left(aws.ec2(), "keep")


def test_a_bad_connect_attempts_is_refused_before_a_bootstrap_changes_anything(ftc_home):
    up_local("late")
    proc = ftc("bootstrap", "--name", "late", env={"FTC_CONNECT_ATTEMPTS": "many"})
    assert proc.returncode == 2 and "FTC_CONNECT_ATTEMPTS='many' is not a whole number" in only_line(proc)
    assert not (ftc_home / "clusters" / "late" / "keys" / "internal").exists()
    assert ftc("down", "--name", "late").returncode == 0


# ---- item 18: an FTC_HOME the nodes cannot work in; what sshd said when it would not start --------

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


def test_an_sshd_that_will_not_start_is_reported_with_what_it_said(ftc_home):
    node_dir = ftc_home / "clusters" / "nostart" / "nodes" / "0"  # left over, with a host key sshd cannot load
    node_dir.mkdir(parents=True)
    (node_dir / "ssh_host_ed25519_key").write_text("not a key\n")
    (node_dir / "ssh_host_ed25519_key.pub").write_text("ssh-ed25519 AAAA nostart-0\n")
    proc = ftc("up", "--name", "nostart", "--nodes", "1")
    assert proc.returncode == 1, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: node nostart-0: sshd exited at start (") and "hostkeys" in line, line
    assert "sshd.log" not in line and "rolled back: nothing left running" in proc.stderr
    assert sshd_pids(ftc_home) == [] and not (ftc_home / "clusters" / "nostart").exists()
