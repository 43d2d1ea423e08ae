"""PROVIDER=ssh: ftc on servers a team already has. Plain OpenSSH servers started here stand in for
them (not through ftc's local provider): each on its own 127.0.0.x address and port, with its own
host key and its own home ($HOME set by sshd, authorized_keys in it) holding a few files of "yours".
"""

import getpass
import hashlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
from conftest import REPO, ftc
from helpers import assert_bootstrapped, assert_refused, assert_script_runs_across_nodes, make, toy_csv, wait_for

from provision.errors import UsageError
from provision.providers.own_servers import Host, fingerprint, hosts_of, parse_probe, verdicts
from provision.spec import resolve_spec
from runner.node.distenv import listen_port

SFTP = next((p for p in ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server") if Path(p).exists()),
            "internal-sftp")


class Server:
    """A plain sshd: a machine of yours, as far as ftc can tell."""

    def __init__(self, root: Path, address: str, user_key: Path, newline_at_end: bool = True, sftp: str = SFTP,
                 hidden: tuple[Path, ...] = (), env: dict[str, str] | None = None):
        self.root, self.address, self.home, self.sftp = root, address, root / "home", sftp
        self.hidden = hidden  # what this server does not see: an empty read-only folder, or empty file, in its place
        self.env = env or {}  # more variables sshd sets for every session, as an admin's SetEnv would
        (self.home / ".ssh").mkdir(parents=True)
        (self.home / "notes.txt").write_text("a file of yours\n")
        line = (user_key.with_suffix(".pub").read_text().strip() + "\n") if newline_at_end else \
            "# no newline at the end\n" + user_key.with_suffix(".pub").read_text().strip()
        (self.home / ".ssh" / "authorized_keys").write_text(line)
        (self.home / ".ssh" / "authorized_keys").chmod(0o644)
        self.port = listen_port(address)  # outside the ephemeral range: no connection made meanwhile takes it
        self.proc: subprocess.Popen | None = None
        self._host_key()

    @property
    def spec(self) -> str:
        return f"{getpass.getuser()}@{self.address}:{self.port}"

    def _host_key(self) -> None:
        key = self.root / "host_key"
        key.unlink(missing_ok=True)
        key.with_suffix(".pub").unlink(missing_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        self.public_key = " ".join(key.with_suffix(".pub").read_text().split()[:2])

    def start(self) -> "Server":
        config = self.root / "sshd_config"
        config.write_text("\n".join([
            f"ListenAddress {self.address}:{self.port}", f"HostKey {self.root / 'host_key'}",
            f"PidFile {self.root / 'sshd.pid'}", f"AuthorizedKeysFile {self.home}/.ssh/authorized_keys",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "PubkeyAuthentication yes", "UsePAM no",
            "PermitRootLogin prohibit-password", "SetEnv " + " ".join(f"{k}={v}" for k, v in {"HOME": self.home,
                                                                                             **self.env}.items()),
            "StrictModes no", "X11Forwarding no",
            "PrintMotd no", "PrintLastLog no", "MaxStartups 100", "MaxSessions 100", "LogLevel ERROR",
            f"Subsystem sftp {self.sftp}" if self.sftp else "", ""]))
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        sshd = ["/usr/sbin/sshd", "-D", "-e", "-f", str(config)]
        if self.hidden:  # a mount namespace of its own: sshd and all it starts see empty, read-only folders there
            sshd = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                    'for p in "$@"; do if [ -d "$p" ]; then mount -t tmpfs -o ro,size=4k ftc-test-hidden "$p"; '
                    'else mount --bind /dev/null "$p"; fi || exit 1; done; '
                    f"exec {shlex.join(sshd)}", "sh", *map(str, self.hidden)]
        self.proc = subprocess.Popen(sshd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=open(self.root / "sshd.log", "ab"))
        self._wait_for_key(self.public_key)
        return self

    def _wait_for_key(self, expected: str, timeout: float = 30) -> None:
        """Until this server answers with `expected` as its host key (no sleep-and-hope)."""
        from provision.ssh import fetch_host_key
        from provision.state import NodeInfo
        node = NodeInfo(index=0, name="probe", id="probe", public_ip=self.address, private_ip=self.address,
                        ssh_user="x", ssh_port=self.port)
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, (self.root / "sshd.log").read_text()
            try:
                if fetch_host_key(node, timeout=2) == expected:
                    return
            except Exception:  # noqa: BLE001, S110 - not listening yet
                pass
            assert time.monotonic() < deadline, f"sshd at {self.address}:{self.port} did not come up"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def new_host_key(self) -> None:
        """The server was reinstalled, or someone sits in the middle: another host key, same address."""
        self.stop()
        self._host_key()
        self.start()

    def listing(self) -> list[tuple]:
        """Every path under the home, with its type, mode and content hash: what 'as it was' means."""
        rows = []
        for path in sorted(self.home.rglob("*")):
            info = path.lstat()
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
            rows.append((str(path.relative_to(self.home)), oct(info.st_mode), info.st_ino if path.is_file() else 0,
                         digest))
        return rows


@pytest.fixture
def user_key(tmp_path) -> Path:
    key = tmp_path / "user_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


@pytest.fixture
def servers(tmp_path, user_key):
    made = [Server(tmp_path / f"server{i}", f"127.0.0.{101 + i}", user_key, newline_at_end=i == 0).start()
            for i in range(2)]
    yield made
    for server in made:
        server.stop()


def ssh_flags(servers, user_key, *, stack_python: bool = True) -> list[str]:
    flags = ["--provider", "ssh", "--hosts", ",".join(s.spec for s in servers), "--ssh-key", str(user_key)]
    return flags + (["--stack-python", sys.executable] if stack_python else [])


def processes_carrying(directories: list[str]) -> list[int]:
    wanted = {f"FTC_NODE_DIR={d}".encode() for d in directories}
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and wanted & set((entry / "environ").read_bytes().split(b"\0")):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


# ---- pure ---------------------------------------------------------------------------------------

def test_hosts_parse_into_user_address_port_and_bad_ones_are_refused():
    spec = resolve_spec({"provider": "ssh", "hosts": "alice@gpu1.example.com:2222, 10.0.0.5,bob@[fd00::1]"}, {})
    assert spec.nodes == 3
    assert hosts_of(spec, "me") == [Host("alice", "gpu1.example.com", 2222), Host("me", "10.0.0.5", 22),
                                    Host("bob", "fd00::1", 22)]
    config = resolve_spec({}, {}, {"provider": "ssh", "hosts": ["a@h1", "a@h2:23"]})
    assert config.hosts == ["a@h1:22", "a@h2:23"]
    two_accounts = resolve_spec({"provider": "ssh", "hosts": "alice@h1,bob@h1"}, {})  # one server, two nodes
    assert two_accounts.hosts == ["alice@h1:22", "bob@h1:22"]
    for flags, named in [({"hosts": "-oProxyCommand=sh", "provider": "ssh"}, "--hosts='-oProxyCommand=sh'"),
                         ({"hosts": "h:70000", "provider": "ssh"}, "--hosts='h:70000'"),
                         ({"hosts": "h,h:22", "provider": "ssh"}, f"names {getpass.getuser()}@h:22 twice"),
                         ({"hosts": f"h,{getpass.getuser()}@h", "provider": "ssh"}, "twice; give each account"),
                         ({"provider": "ssh"}, "--provider='ssh' needs --hosts"),
                         ({"hosts": "h"}, "--hosts is for your own servers"),
                         ({"hosts": "h", "provider": "ssh", "nodes": "2"}, "--nodes=2 but --hosts names 1"),
                         ({"hosts": "h", "provider": "ssh", "stack_python": "python3"}, "--stack-python='python3'")]:
        with pytest.raises(UsageError, match=named.replace("(", r"\(").replace("[", r"\[")):
            resolve_spec(flags, {})


def test_verdicts_name_every_problem_of_a_host_one_line_each():
    probe = parse_probe("home=/home/a\nos=Darwin\narch=arm64\nfree_kb=1024\ncluster=old\npython=\n"
                        "python3_version=3.9\n")
    lines = verdicts("a@h:22", probe, "")
    assert len(lines) == 4 and all(line.startswith("host a@h:22: ") for line in lines)
    assert "Darwin arm64, not Linux x86-64" in lines[0] and "no Python >= 3.11" in lines[1] and "3.9" in lines[1]
    assert "GB free" in lines[2] and "ftc cluster 'old' is already there (/home/a/.ftc-node/old)" in lines[3]
    team = parse_probe("home=/h\nos=Linux\narch=x86_64\nfree_kb=99999999\npython=/opt/py/bin/python\n"
                       "python_version=3.12\nmissing=torch\n")
    lacking, no_mpirun = verdicts("h:22", team, "/opt/py/bin/python")
    assert "--stack-python='/opt/py/bin/python' lacks torch" in lacking and "no mpirun beside" in no_mpirun
    good = parse_probe("home=/h\nos=Linux\narch=x86_64\nfree_kb=99999999\npython=/p\npython_version=3.11\nmissing=\n"
                       "mpirun=yes\n")
    assert verdicts("h:22", good, "/p") == []


def two_homes(provider: str, homes: tuple[str, str], pythons: tuple[str, str]):
    """A 2-node cluster's state and facts, each node's directory and stack's Python as given."""
    from provision import state as st
    from provision.spec import ClusterSpec
    from runner.node.facts import NodeFacts
    nodes = [st.NodeInfo(index=i, name=f"c-{i}", id=f"n{i}", public_ip=f"10.0.0.{i + 1}", private_ip=f"10.0.0.{i + 1}",
                         ssh_user=user, ssh_port=22, workdir=f"{home}/.ftc-node/c")
             for i, (user, home) in enumerate(zip(("alice", "bob"), homes))]
    facts = [NodeFacts(hostname=f"h{i}", cpu_model="x", flags=[], native_bf16=False, allowed_cpus=[0, 1], physical_cores=2,
                       core_cpus=[0, 1], sockets=1, cores_by_socket={}, numa_nodes=1, memory_gb=1.0, python="3.11",
                       python_executable=python, versions={}, mpi="impi", private_ip=f"10.0.0.{i + 1}", interface="eth0",
                       allocators=[]) for i, python in enumerate(pythons)]
    return st.ClusterState(name="c", provider=provider, spec=ClusterSpec(name="c").to_dict(), nodes=nodes), facts


@pytest.mark.parametrize("mpi", ["impi", "mpich", "openmpi"])
def test_a_launch_across_accounts_with_their_own_homes_runs_each_node_in_its_own_paths(mpi):
    from dataclasses import replace

    from provision.launch import cluster_launch, render_launch
    state, facts = two_homes("ssh", ("/home/alice", "/srv/bob"), ("/home/alice/.ftc-node/c/venv/bin/python",
                                                                  "/srv/bob/.ftc-node/c/venv/bin/python"))
    facts = [replace(f, mpi=mpi) for f in facts]
    head, other = "/home/alice/.ftc-node/c", "/srv/bob/.ftc-node/c"
    spec = cluster_launch(state, facts, "job", f"{head}/jobs/j1", "runner.node.train",
                          ["--model", f"{head}/cache/model-ab", "--output-dir", f"{head}/jobs/j1", "--data-dir", "/x"])
    script = render_launch(spec)
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    mpirun = script[script.index("\nmpirun "):script.index("status=$?")]
    first, second = mpirun.split(" : \\\n")
    host = "--host" if mpi == "openmpi" else "-host"
    assert f"{host} c-0 -wdir {head}/jobs/j1 " in first and f"env PYTHONPATH={head}/ftc {head}/venv/bin/python -m " \
        f"runner.node.train --model {head}/cache/model-ab --output-dir {head}/jobs/j1 --data-dir /x" in first
    assert f"{host} c-1 -wdir {other}/jobs/j1 " in second and f"env PYTHONPATH={other}/ftc {other}/venv/bin/python -m " \
        f"runner.node.train --model {other}/cache/model-ab --output-dir {other}/jobs/j1 --data-dir /x" in second
    assert head not in second  # the head's paths never reach the other node
    assert f"-f {head}/hostfile" in mpirun or f"--hostfile {head}/hostfile" in mpirun  # read by mpirun, on the head

    # One account's home on every server (EC2), or nodes on this machine: one command, the head's paths.
    for provider, homes in (("aws", ("/home/ubuntu", "/home/ubuntu")), ("local", ("/tmp/n0", "/tmp/n1"))):
        state, facts = two_homes(provider, homes, ("/p/bin/python", "/p/bin/python"))
        one = render_launch(cluster_launch(state, facts, "job", f"{homes[0]}/.ftc-node/c/jobs/j1", "runner.node.train",
                                           []))
        assert " : " not in one and "-wdir" not in one and "/tmp/n1" not in one


def test_bin_ssh_gives_a_node_whose_stack_lies_in_another_home_its_own_stack_paths(tmp_path):
    """What a node's bin/ssh hands ssh: in Intel MPI's command for a node whose stack lies in another home
    (each server's own venv), the words in this node's stack directory name that node's; for a node whose
    stack lies where this one's does, or a host outside the cluster, the words as given. The directories
    carry a newline, quotes and commands: they stay data."""
    from dataclasses import replace

    from provision.bootstrap import node_files
    canary = tmp_path / "canary"
    bad = f"a b\n/usr/bin/touch {canary}\n$(/usr/bin/touch {canary}) `/usr/bin/touch {canary}`; 'q\" #"
    state, _ = two_homes("ssh", (f"/home/{bad}", f"/srv/{bad}"), ("", ""))
    state.nodes.append(replace(state.nodes[0], index=2, name="c-2", id="n2"))  # another account in the head's home
    mine, theirs = (f"{node.workdir}/venv" for node in state.nodes[:2])
    wrapper = tmp_path / "ssh"  # bin/ssh as rendered, but printing the words it would give ssh
    wrapper.write_text(node_files(state, state.nodes[0])["bin/ssh"].replace("exec /usr/bin/ssh ", "exec printf '%s\\0' "))

    def given_to_ssh(*words: str) -> list[str]:
        printed = subprocess.run(["sh", str(wrapper), *words], capture_output=True, text=True, check=True).stdout
        return printed.split("\0")[2:-1]  # after -F and the config

    hydra = ["-q", "-x", "c-1", f"{mine}/bin//hydra_bstrap_proxy", "--base-path", f"{mine}/bin/", "--upstream-host",
             "c-0", f"{mine}2/bin/x", f"{mine}/bin//hydra_pmi_proxy"]
    assert given_to_ssh(*hydra) == ["-q", "-x", "c-1", f"{theirs}/bin//hydra_bstrap_proxy", "--base-path",
                                    f"{theirs}/bin/", "--upstream-host", "c-0", f"{mine}2/bin/x",
                                    f"{theirs}/bin//hydra_pmi_proxy"]
    for host in ("c-0", "c-2", "elsewhere"):
        assert given_to_ssh("-q", "-x", host, *hydra[3:]) == ["-q", "-x", host, *hydra[3:]]
    assert not canary.exists()

    state.spec["stack_python"] = "/opt/py/bin/python"  # STACK_PYTHON: one path everywhere, the words as given
    assert "MINE=" not in node_files(state, state.nodes[0])["bin/ssh"]


def test_fingerprint_is_the_one_ssh_keygen_prints(user_key):
    shown = subprocess.run(["ssh-keygen", "-lf", str(user_key.with_suffix(".pub"))], capture_output=True, text=True,
                           check=True).stdout.split()[1]
    assert fingerprint(user_key.with_suffix(".pub").read_text()) == shown


# ---- on the servers ---------------------------------------------------------------------------

@pytest.mark.slow
def test_up_bootstrap_finetune_on_two_hosts_then_down_leaves_each_as_it_was(ftc_home, servers, user_key, tiny_bert,
                                                                            glue_dir, tmp_path):
    before = [s.listing() for s in servers]
    up = ftc("up", "--name", "own", *ssh_flags(servers, user_key), "--yes", "1")
    assert up.returncode == 0, up.stderr
    assert "--yes: trusting these host keys" in up.stderr
    for server in servers:
        assert f"host {server.spec}: ssh-ed25519 key {fingerprint(server.public_key)}" in up.stderr
    state = json.loads((ftc_home / "clusters" / "own" / "state.json").read_text())
    workdirs = [n["workdir"] for n in state["nodes"]]
    assert workdirs == [str(s.home / ".ftc-node" / "own") for s in servers]
    assert_bootstrapped(ftc_home, "own", 2)
    internal = (ftc_home / "clusters" / "own" / "keys" / "internal.pub").read_text().strip()
    for server in servers:
        assert internal in (server.home / ".ssh" / "authorized_keys").read_text().splitlines()
        outside = {row[0] for row in server.listing()} - {row[0] for row in before[servers.index(server)]}
        assert all(path.startswith(".ftc-node") for path in outside), outside  # all else stays in the one dir

    other = ftc("up", "--name", "other", *ssh_flags(servers[:1], user_key), "--yes", "1")
    assert other.returncode == 2 and "ftc cluster 'own' is already there" in other.stderr.splitlines()[-1]
    status = ftc("status", "--name", "own")
    assert "yours: no cost" in status.stdout + status.stderr
    assert "your servers: no cost" in status.stdout, status.stdout  # the title: the ssh provider World's note

    # Your own CSV: each node trains on its copy in the job's directory, not on the controller's file.
    train, dev = toy_csv(tmp_path / "mine.csv", 32), toy_csv(tmp_path / "mine-dev.csv", 12, offset=3)
    job = ftc("finetune", "--name", "own", "--train-file", str(train), "--validation-file", str(dev),
              "--text-columns", "review", "--label-column", "stars", "--model", tiny_bert, "--epochs", "1")
    assert job.returncode == 0, job.stderr[-3000:]
    done = json.loads((ftc_home / "clusters" / "own" / "state.json").read_text())["jobs"][-1]
    assert done["state"] == "finished", job.stderr[-3000:]
    results = json.loads((Path(done["results_dir"]) / "results.json").read_text())
    assert results["world_size"] == 2 and results["nodes"] == 2 and results["labels"] == ["neg", "pos"]
    remote = Path(done["remote_dir"])
    assert (remote / "data" / "train.csv").read_bytes() == train.read_bytes()
    assert (remote / "data" / "validation.csv").read_bytes() == dev.read_bytes()
    assert not (Path(done["results_dir"]) / "data").exists()  # the data files sent out are not fetched back
    launch = (remote / "launch.sh").read_text()
    assert str(remote / "data" / "train.csv") in launch and str(train) not in launch
    # the model directory too: each server reads a copy in the cluster's cache, not the path here
    assert f"--model {workdirs[0]}/cache/model-" in launch and f"--model {tiny_bert}" not in launch
    assert f"copying {tiny_bert} " in job.stderr

    # Your own script: each host runs it from its own copy of the workdir; rank 0's output and every
    # rank's log come home.
    assert_script_runs_across_nodes(ftc_home, "own", tmp_path)

    # A job still training on both hosts when the cluster goes (held before its step 2, so it cannot
    # finish first): destroy stops it everywhere.
    busy = ftc("finetune", "--name", "own", "--detach", "--task", "mrpc", "--model", tiny_bert, "--data-dir",
               str(glue_dir), "--max-eval-samples", "64", "--max-train-samples", "256", "--epochs", "1",
               env={"FTC_HOLD_AT_STEP": "2"})
    assert busy.returncode == 0, busy.stderr
    output = Path(json.loads((ftc_home / "clusters" / "own" / "state.json").read_text())["jobs"][-1]["remote_dir"])
    launch = (output / "launch.sh").read_text()
    assert f"--data-dir {workdirs[0]}/cache/glue-" in launch  # GLUE's task folder: copied too
    assert f"copying {glue_dir.resolve()} " in busy.stderr and f"copying {tiny_bert} " not in busy.stderr  # the model: once
    wait_for(lambda: "step" in read(output / "output.log"), "the detached job to train")
    assert len(processes_carrying(workdirs)) >= 2  # launch script, mpirun, ranks

    down = ftc("down", "--name", "own")
    assert down.returncode == 0, down.stderr
    assert [s.listing() for s in servers] == before  # names, modes, inodes, contents: as they were
    # what outlived SIGTERM got SIGKILL last, and the cleanup does not wait for that to land
    wait_for(lambda: processes_carrying(workdirs) == [], "the job's processes to end")
    assert not (ftc_home / "clusters" / "own").exists()
    assert all(s.proc.poll() is None for s in servers)  # the servers stay


@pytest.mark.slow
def test_servers_that_see_only_their_own_home_finetune_and_launch_from_their_own_copies(ftc_home, tmp_path, user_key,
                                                                                       tiny_bert, minilm, glue_dir):
    """Two accounts whose homes differ and see nothing of each other's or of the controller's files (as
    two users on two servers): each server's sshd runs in a mount namespace of its own, where the other's
    home, the controller's FTC_HOME, data, scripts (the examples too) and models (the packaged MiniLM
    too) are empty read-only folders, and where the stack's Python (the test's own) no longer finds
    ftc's package by its editable install. Each node runs from its own directory: the job's, the copies
    of the model, the data and the workdir, and its own copy of ftc's node programs, never the head's
    paths. `make launch`'s example Trainer script, with the MRPC rows and the model it sends by default,
    runs there as it does on local nodes."""
    controller = tmp_path / "controller"  # the data and the script: files only the controller has
    controller.mkdir()
    ftc_home.mkdir()
    editable = list(Path(sysconfig.get_paths()["purelib"]).glob("__editable__*ftc*.pth"))
    servers = [Server(tmp_path / f"server{i}", f"127.0.0.{104 + i}", user_key) for i in range(2)]
    for server in servers:
        server.hidden = (*[other.root for other in servers if other is not server], ftc_home, controller, Path(tiny_bert),
                         *editable, glue_dir, REPO / "examples", Path(minilm))
        server.start()
    try:
        before = [s.listing() for s in servers]
        up = ftc("up", "--name", "homes", *ssh_flags(servers, user_key), "--yes", "1")
        assert up.returncode == 0, up.stderr[-3000:]
        hidden = ftc("ssh", "--name", "homes", "--node", "1", "--", "test", "!", "-e", f"{glue_dir}/mrpc/train.tsv",
                     "-a", "!", "-e", f"{minilm}/config.json", "-a", "!", "-e", str(REPO / "examples" / "README.md"))
        assert hidden.returncode == 0, hidden.stderr  # a server sees no MRPC, MiniLM or example of the controller's
        train, dev = toy_csv(controller / "mine.csv", 32), toy_csv(controller / "mine-dev.csv", 12, offset=3)
        job = ftc("finetune", "--name", "homes", "--train-file", str(train), "--validation-file", str(dev),
                  "--text-columns", "review", "--label-column", "stars", "--model", tiny_bert, "--epochs", "1")
        assert job.returncode == 0, job.stderr[-3000:]
        done = json.loads((ftc_home / "clusters" / "homes" / "state.json").read_text())["jobs"][-1]
        assert done["state"] == "finished", job.stderr[-3000:]
        results = json.loads((Path(done["results_dir"]) / "results.json").read_text())
        assert results["world_size"] == 2 and results["nodes"] == 2
        job_id = done["id"]
        for server in servers:  # each node's copies lie in its own home
            mine = server.home / ".ftc-node" / "homes"
            assert (mine / "jobs" / job_id / "data" / "train.csv").read_bytes() == train.read_bytes()
            assert len(list((mine / "cache").glob("model-*/config.json"))) == 1
        assert (servers[1].home / ".ftc-node" / "homes" / "jobs" / job_id / "logs").is_dir()

        assert_script_runs_across_nodes(ftc_home, "homes", controller)

        # the example's own DATA (its MRPC rows and model) and arguments that name them; fewer rows than its 512
        example = make("launch", "NAME=homes", "ARGS=--model model --train-file mrpc/train.tsv --validation-file "
                       "mrpc/dev.tsv --max-train-samples 64 --max-eval-samples 32", home=ftc_home, timeout=900)
        assert example.returncode == 0 and "warning" not in example.stderr, example.stderr[-3000:]
        done = json.loads((ftc_home / "clusters" / "homes" / "state.json").read_text())["jobs"][-1]
        result = json.loads((Path(done["results_dir"]) / "output" / "result.json").read_text())
        assert result["world_size"] == 2 and result["train_samples"] == 64 and 0 <= result["eval_accuracy"] <= 1

        assert ftc("down", "--name", "homes").returncode == 0
        assert [s.listing() for s in servers] == before
    finally:
        for server in servers:
            server.stop()


def this_machines_uv_cache() -> Path:
    """Where uv keeps its cache here (`make setup` filled it): uv's own order of UV_CACHE_DIR, XDG_CACHE_HOME, ~."""
    if os.environ.get("UV_CACHE_DIR"):
        return Path(os.environ["UV_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "uv"


def configure_pip_as_this_machine(home: Path, constraints: Path) -> None:
    """The server's pip (~/.config/pip/pip.conf) set as this machine's is: a server's $HOME is not this
    machine's, where its pip settings lie, and without them torch would come from PyPI (the CUDA build).
    Constrained to the versions this test's Python has, whose wheels uv's cache holds."""
    from importlib import metadata

    from provision.bootstrap import this_machines_pip_settings
    constraints.write_text("".join(sorted({f"{d.metadata['Name']}=={d.version}\n" for d in metadata.distributions()
                                           if d.metadata["Name"] and not d.read_text("direct_url.json")})))
    settings = this_machines_pip_settings()
    settings["PIP_CONSTRAINT"] = f"{settings.get('PIP_CONSTRAINT', '')} {constraints}".strip()
    lines = [f"{name[len('PIP_'):].lower().replace('_', '-')} = {value}" for name, value in settings.items()]
    (home / ".config" / "pip").mkdir(parents=True)
    (home / ".config" / "pip" / "pip.conf").write_text("\n".join(["[global]", *lines, ""]))


@pytest.mark.slow
def test_servers_with_their_own_homes_install_their_own_stacks_and_mpirun_starts_each_from_its_own(
        ftc_home, tmp_path, user_key, tiny_bert):
    """Without STACK_PYTHON each server installs the stack into a venv in its own home, so the venvs'
    paths differ, and each server sees nothing of the other's home (a mount namespace each, as in the
    test above). Intel MPI's mpirun starts its helpers (hydra_bstrap_proxy) on each node by the path
    of its own stack on the head: `ftc up`'s verification, and a job, run only if each node starts
    them from its own venv. The servers install with uv from this machine's uv cache and pip
    settings, offline (UV_OFFLINE: PyTorch's CPU index is out of reach here; the cache holds every pin).
    1 to 2 minutes on 2 busy cores."""
    controller = tmp_path / "controller"  # the data and the script: files only the controller has
    controller.mkdir()
    ftc_home.mkdir()
    uv = {"UV_CACHE_DIR": str(this_machines_uv_cache()), "UV_OFFLINE": "1"}
    servers = [Server(tmp_path / f"server{i}", f"127.0.0.{106 + i}", user_key, env=uv) for i in range(2)]
    for server in servers:
        server.hidden = (*[other.root for other in servers if other is not server], ftc_home, controller,
                         Path(tiny_bert))
        configure_pip_as_this_machine(server.home, tmp_path / "installed.txt")
        server.start()
    try:
        before = [s.listing() for s in servers]
        up = ftc("up", "--name", "venvs", *ssh_flags(servers, user_key, stack_python=False), "--yes", "1",
                 timeout=1200)
        assert up.returncode == 0, up.stderr[-3000:]
        assert "verified: mpirun hostname on 2 node(s)" in up.stdout + up.stderr
        for server in servers:  # each its own stack, in its own home
            workdir = server.home / ".ftc-node" / "venvs"
            facts = json.loads((workdir / "facts.json").read_text())
            assert facts["python_executable"] == f"{workdir}/venv/bin/python"
            assert (workdir / "venv" / "bin" / "hydra_bstrap_proxy").is_file()

        train, dev = toy_csv(controller / "mine.csv", 32), toy_csv(controller / "mine-dev.csv", 12, offset=3)
        job = ftc("finetune", "--name", "venvs", "--train-file", str(train), "--validation-file", str(dev),
                  "--text-columns", "review", "--label-column", "stars", "--model", tiny_bert, "--epochs", "1")
        assert job.returncode == 0, job.stderr[-3000:]
        done = json.loads((ftc_home / "clusters" / "venvs" / "state.json").read_text())["jobs"][-1]
        assert done["state"] == "finished", job.stderr[-3000:]
        assert json.loads((Path(done["results_dir"]) / "results.json").read_text())["world_size"] == 2

        assert_script_runs_across_nodes(ftc_home, "venvs", controller)

        down = ftc("down", "--name", "venvs")
        assert down.returncode == 0, down.stderr[-3000:]
        assert [s.listing() for s in servers] == before
    finally:
        for server in servers:
            server.stop()


@pytest.mark.slow
def test_unreachable_host_is_refused_before_anything_is_installed(ftc_home, servers, user_key, tmp_path):
    before = servers[0].listing()
    with socket.socket() as sock:  # an address and port where nothing listens
        sock.bind(("127.0.0.103", 0))
        dead = f"{getpass.getuser()}@127.0.0.103:{sock.getsockname()[1]}"
    flags = ["--provider", "ssh", "--hosts", f"{servers[0].spec},{dead}", "--ssh-key", str(user_key),
             "--stack-python", sys.executable]
    proc = ftc("up", "--name", "gone", *flags, "--yes", "1")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: host {dead}: unreachable"), lines
    assert servers[0].listing() == before
    assert not (ftc_home / "clusters" / "gone").exists()

    # Reachable, but nobody confirmed the host keys: no terminal and no YES refuses, changing nothing.
    unconfirmed = ftc("up", "--name", "ask", *ssh_flags(servers, user_key), stdin=subprocess.DEVNULL)
    assert unconfirmed.returncode == 2
    assert "not confirmed and there is no terminal to ask on; check the fingerprints, then add --yes to trust them" \
        in unconfirmed.stderr.strip().splitlines()[-1]
    assert servers[0].listing() == before and not (ftc_home / "clusters" / "ask").exists()


@pytest.mark.slow
def test_host_key_changed_after_pinning_is_refused_naming_the_host(ftc_home, servers, user_key):
    up = ftc("up", "--name", "pin", *ssh_flags(servers, user_key), "--yes", "1", "--no-bootstrap")
    assert up.returncode == 0, up.stderr
    changed = servers[1]
    changed.new_host_key()
    proc = ftc("bootstrap", "--name", "pin")
    assert proc.returncode == 1
    line = proc.stderr.strip().splitlines()[-1]
    assert f"host key mismatch: {changed.spec} presents ssh-ed25519" in line, line
    assert "ftc down --name pin" in line and "pins the new key after you confirm it" in line

    down = ftc("down", "--name", "pin")  # ftc never logs in to it again: it names what is left there
    assert down.returncode == 1
    assert f"host {changed.spec}: not cleaned (host key mismatch" in down.stderr
    assert f"left there: {changed.home}/.ftc-node/pin" in down.stderr
    assert (changed.home / ".ftc-node" / "pin").is_dir()
    assert not (servers[0].home / ".ftc-node").exists()  # the other host is cleaned
    assert not (ftc_home / "clusters" / "pin").exists()
    assert os.path.exists(changed.root / "host_key")


@pytest.mark.slow
def test_a_server_whose_shell_prints_a_banner_is_bootstrapped_and_verified(ftc_home, servers, user_key):
    """Many servers print a line from ~/.bashrc (bash reads it for commands run by sshd): no marker,
    JSON or hostname ftc reads back is mistaken for it. Their SFTP is sshd's own (internal-sftp), which
    runs no shell: an sftp-server started through that shell is garbled (the next test)."""
    for server in servers:
        server.stop()
        server.sftp = "internal-sftp"
        server.start()
        (server.home / ".bashrc").write_text('echo "Welcome to $(hostname), a server of yours"\n')
    proof = subprocess.run(["ssh", "-i", str(user_key), "-p", str(servers[0].port), "-o", "StrictHostKeyChecking=no",
                            "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", servers[0].spec.split(":")[0],
                            "true"], capture_output=True, text=True, timeout=60)
    assert "Welcome to" in proof.stdout  # the shell of a command run over ssh does print it
    up = ftc("up", "--name", "greet", *ssh_flags(servers, user_key), "--yes", "1")
    assert up.returncode == 0, up.stderr[-3000:]
    assert "Traceback" not in up.stderr and "verified: mpirun hostname on 2 node(s)" in up.stdout + up.stderr
    again = ftc("bootstrap", "--name", "greet")  # the markers read back: nothing redone, nothing misread
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr[-3000:]
    assert ftc("down", "--name", "greet").returncode == 0


@pytest.mark.slow
def test_down_keeps_a_ftc_node_directory_that_was_there_before_up(ftc_home, servers, user_key):
    (servers[0].home / ".ftc-node").mkdir()  # yours, empty, before ftc came
    before = [s.listing() for s in servers]
    up = ftc("up", "--name", "was", *ssh_flags(servers, user_key), "--no-bootstrap", "--yes", "1")
    assert up.returncode == 0, up.stderr[-3000:]
    assert ftc("down", "--name", "was").returncode == 0
    assert (servers[0].home / ".ftc-node").is_dir() and not (servers[1].home / ".ftc-node").exists()
    assert [s.listing() for s in servers] == before  # each server as it was: the one it made goes, yours stays


@pytest.mark.slow
def test_a_bootstrap_names_a_server_whose_sshd_is_frozen_as_hung(ftc_home, servers, user_key):
    up = ftc("up", "--name", "frozen", *ssh_flags(servers, user_key), "--no-bootstrap", "--yes", "1")
    assert up.returncode == 0, up.stderr[-3000:]
    os.kill(servers[1].proc.pid, signal.SIGSTOP)  # the kernel still accepts its connections; sshd says nothing
    try:
        boot = ftc("bootstrap", "--name", "frozen", env={"FTC_CONNECT_ATTEMPTS": "1"})
    finally:
        os.kill(servers[1].proc.pid, signal.SIGCONT)
    assert boot.returncode == 1 and "Traceback" not in boot.stderr, boot.stderr[-3000:]
    assert "its sshd hangs or is overloaded" in boot.stderr and "No existing session" not in boot.stderr, boot.stderr
    assert ftc("bootstrap", "--name", "frozen").returncode == 0  # thawed, it answers and the bootstrap ends
    assert ftc("down", "--name", "frozen").returncode == 0


@pytest.mark.slow
def test_down_with_a_server_that_does_not_answer_keeps_it_recorded_and_a_later_down_finishes(ftc_home, servers,
                                                                                               user_key):
    before = [s.listing() for s in servers]
    up = ftc("up", "--name", "away", *ssh_flags(servers, user_key), "--no-bootstrap", "--yes", "1")
    assert up.returncode == 0, up.stderr[-3000:]
    servers[1].stop()  # down, or unreachable: its sshd does not answer
    down = ftc("down", "--name", "away")
    assert down.returncode == 1 and "Traceback" not in down.stderr, down.stderr
    errors = [line for line in down.stderr.splitlines() if line.startswith("error: ")]
    assert errors[0].startswith(f"error: host {servers[1].spec}: not cleaned (") and "No existing session" not in errors[0]
    assert errors[-1].startswith("error: cluster away stays recorded with 1 server(s) to clean: `ftc down --name "
                                 "away` again once they answer finishes it (a server gone for good: remove what is left")
    assert servers[0].listing() == before[0]  # the one that answered is cleaned
    status = ftc("status", "--name", "away")  # the record names what is left
    assert status.returncode in (0, 1) and servers[1].spec.split("@")[1].split(":")[0] in status.stdout + status.stderr
    servers[1].start()
    again = ftc("down", "--name", "away")
    assert again.returncode == 0, again.stderr
    assert [s.listing() for s in servers] == before and not (ftc_home / "clusters" / "away").exists()


@pytest.fixture
def server(tmp_path):
    key = tmp_path / "user_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    made = Server(tmp_path / "server", "127.0.0.111", key).start()
    yield made
    made.stop()


@pytest.mark.slow
@pytest.mark.parametrize("spelling", ["127.000.000.111", "127.111", "[::ffff:127.0.0.111]"])
def test_one_server_under_two_spellings_is_refused_before_anything_changes(ftc_home, server, spelling):
    before = server.listing()
    hosts = f"{server.spec},{getpass.getuser()}@{spelling}:{server.port}"
    proc = ftc("up", "--name", "twice", "--provider", "ssh", "--hosts", hosts, "--ssh-key", str(server.root.parent /
               "user_key"), "--stack-python", sys.executable, "--yes", "1")
    assert_refused(proc, f"HOSTS names one server twice: {server.spec} and", ftc_home)
    assert f"are both {getpass.getuser()}@127.0.0.111:{server.port}" in proc.stderr
    assert server.listing() == before


@pytest.mark.slow
def test_an_ssh_key_that_cannot_log_in_is_refused_by_name_before_any_server_is_asked(ftc_home, server, tmp_path):
    not_a_key = tmp_path / "not_a_key"
    not_a_key.write_text("not a key\n")
    before = server.listing()
    proc = ftc("up", "--name", "kk", "--provider", "ssh", "--hosts", server.spec, "--ssh-key", str(not_a_key),
               "--stack-python", sys.executable, "--yes", "1")
    assert_refused(proc, f"--ssh-key='{not_a_key}' is not a private key ssh can use", ftc_home)
    assert "ftc status" not in proc.stderr and server.listing() == before



@pytest.mark.slow
def test_status_of_a_server_that_does_not_answer_says_to_run_down_not_status(ftc_home, servers, user_key):
    up = ftc("up", "--name", "mute", *ssh_flags(servers, user_key), "--no-bootstrap", "--yes", "1")
    assert up.returncode == 0, up.stderr[-3000:]
    servers[1].stop()
    status = ftc("status", "--name", "mute")
    assert "dead" in status.stdout and "no SSH after 1 attempts" in status.stdout, status.stdout
    assert "ftc status" not in status.stdout + status.stderr
    assert "mute-1 is dead" in status.stderr and "`ftc down --name mute` removes the cluster" in status.stderr
    servers[1].start()
    assert ftc("down", "--name", "mute").returncode == 0


@pytest.mark.slow
def test_sftp_garbled_by_a_shell_banner_is_refused_by_name_before_anything_is_installed(ftc_home, server):
    (server.home / ".bashrc").write_text('echo "Welcome, a server of yours"\n')
    before = server.listing()
    proc = ftc("up", "--name", "garbled", "--provider", "ssh", "--hosts", server.spec, "--ssh-key",
               str(server.root.parent / "user_key"), "--stack-python", sys.executable, "--yes", "1")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"host {server.spec}: its SFTP (which ftc copies results with) is garbled by what the shell's start-up " \
           "files print" in proc.stderr and "Traceback" not in proc.stderr
    assert server.listing() == before and not (ftc_home / "clusters" / "garbled").exists()


@pytest.mark.slow
def test_a_server_without_sftp_is_refused_by_name_before_anything_is_installed(ftc_home, tmp_path, user_key):
    bare = Server(tmp_path / "bare", "127.0.0.112", user_key, sftp="").start()
    try:
        before = bare.listing()
        proc = ftc("up", "--name", "nosftp", *ssh_flags([bare], user_key), "--yes", "1")
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert f"host {bare.spec}: its sshd offers no SFTP subsystem, which ftc copies results with; add " \
               "`Subsystem sftp internal-sftp` to its sshd_config and reload sshd" in proc.stderr
        assert "Traceback" not in proc.stderr and "Channel closed" not in proc.stderr
        assert bare.listing() == before and not (ftc_home / "clusters" / "nosftp").exists()
    finally:
        bare.stop()


@pytest.mark.slow
def test_a_connection_lost_while_sftp_opens_is_named_as_that_not_as_a_missing_subsystem(ftc_home, tmp_path, user_key):
    # the subsystem exists, but starting it kills the sshd process that serves this connection (its own
    # ancestor, so no other server's session): the connection drops, as a network that fails would
    drop = tmp_path / "drop_connection"
    drop.write_text('#!/bin/sh\np=$$\nwhile [ "$p" -gt 1 ]; do\n'
                    '  case "$(ps -o args= -p "$p")" in "sshd: "*@*) kill -9 "$p"; exit;; esac\n'
                    '  p=$(ps -o ppid= -p "$p" | tr -d " ")\ndone\n')
    drop.chmod(0o755)
    dying = Server(tmp_path / "dying", "127.0.0.113", user_key, sftp=str(drop)).start()
    try:
        proc = ftc("up", "--name", "dying", *ssh_flags([dying], user_key), "--yes", "1")
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert f"host {dying.spec}: the connection closed as ftc opened SFTP" in proc.stderr, proc.stderr[-2000:]
        assert "no SFTP subsystem" not in proc.stderr and "Traceback" not in proc.stderr
        assert not (ftc_home / "clusters" / "dying").exists()
    finally:
        dying.stop()
