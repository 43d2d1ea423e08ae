"""A real Slurm on this machine, for PROVIDER=slurm's tests and for a user to try (`make slurm-sandbox`).

Debian's slurm-wlm (slurmctld, slurmd) and munge, run as root from one directory: munged on its own
socket, slurmctld on this machine, and N slurmd nodes, each in a network and UTS namespace of its
own (`ip netns`, hostname ftcn<i>), with its own address on a bridge made here and its own sshd
(port 22 in the namespace, its own host key and $HOME), so Slurm and ftc see separate machines.
Every Slurm command finds this cluster by SLURM_CONF; nothing outside the directory, the
namespaces and the bridge is touched, and stop() removes all three.

Two partitions: `debug` (every node) and `held` (every node, state DOWN: a job queued there waits,
"PartitionDown", until the test acts). Names carry this process's pid (ftcsl<pid>...), so a later
start removes what a killed sandbox left (its pid gone) and never a live one's.

    python tests/slurm_sandbox.py 2      # prints export lines, then `ready`; Ctrl-C removes it all
"""

import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from runner.node.distenv import listen_port

PREFIX = "ftcsl"
PARTITION = "debug"
HELD_PARTITION = "held"
MAX_MINUTES = 480  # the partitions' time limit: above ftc's default MAX_HOURS (4), so a longer one is refused
SFTP = next((p for p in ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server") if Path(p).exists()),
            "internal-sftp")


# What a site does when an allocation ends (pam_slurm_adopt, or slurm.epilog.clean): nothing started on the
# node outlives it, ssh sessions included. Here: every process in the node's network namespace but its
# slurmd (and the steps it runs), its sshd listener and this script ends.
EPILOG = """#!/bin/sh
export PATH=/usr/sbin:/usr/bin:/sbin:/bin  # slurmd gives an epilog no PATH
me=$(readlink /proc/$$/ns/net)
keep=" $$ $(cat {root}/$SLURMD_NODENAME/sshd.pid 2>/dev/null) "
for dir in /proc/[0-9]*; do
  pid=${{dir#/proc/}}
  [ "$(readlink "$dir/ns/net" 2>/dev/null)" = "$me" ] || continue
  case "$keep" in *" $pid "*) continue;; esac
  case "$(cat "$dir/comm" 2>/dev/null)" in slurmd|slurmstepd|epilog.sh) continue;; esac
  [ "$(cut -d' ' -f4 "$dir/stat" 2>/dev/null)" = "$$" ] && continue
  kill -9 "$pid" 2>/dev/null
done
exit 0
"""


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=check)  # noqa: S603 - fixed argv


def missing_tools() -> list[str]:
    """What this machine lacks to run the sandbox ([] when nothing)."""
    tools = ("slurmctld", "slurmd", "munged", "sbatch", "ip", "unshare", "nsenter")
    lacking = [t for t in tools if not shutil.which(t) and not Path(f"/usr/sbin/{t}").exists()]
    return lacking + ([] if os.geteuid() == 0 else ["root"])


def subnet_for(pid: int, taken: str) -> str:
    """10.123.<k>.0/24 for a k that no interface here uses (`taken`: `ip -br addr`'s text). Pure."""
    for k in [pid % 200 + 20, *range(20, 220)]:
        if f" 10.123.{k}." not in f" {taken}":
            return f"10.123.{k}"
    raise RuntimeError("no free 10.123.k.0/24 subnet for the sandbox")


def remove_stale() -> None:
    """Namespaces and bridges a killed sandbox left: its pid no longer runs."""
    names = _sh("ip", "netns", "list", check=False).stdout.split()
    links = re.findall(rf"^\d+: ({PREFIX}\d+[a-z]b)[:@]", _sh("ip", "-o", "link", "show", check=False).stdout, re.M)
    for left in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):  # a killed sandbox's sockets' directory
        found = re.fullmatch(rf"{PREFIX}(\d+)[a-z]", left.name)
        if found and not Path(f"/proc/{found[1]}").exists():
            shutil.rmtree(left, ignore_errors=True)
    for name in [n for n in names if n.startswith(PREFIX)] + links:
        pid = int(re.match(rf"{PREFIX}(\d+)", name)[1])
        if not Path(f"/proc/{pid}").exists():
            if name in links:
                _sh("ip", "link", "del", name, check=False)
            else:
                _kill_netns(name)


def _kill_netns(name: str) -> None:
    for _ in range(50):
        pids = _sh("ip", "netns", "pids", name, check=False).stdout.split()
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    _sh("ip", "netns", "del", name, check=False)


class Sandbox:
    made = 0  # sandboxes this process started

    def __init__(self, root: Path, nodes: int = 2, ssh: bool = True, login: bool = False):
        self.root, self.count = root, nodes
        self.ssh = ssh  # False: the nodes run no sshd, as at a site that refuses ssh to allocated nodes
        self.login = login  # with ssh=False: the first node runs sshd all the same, as a login node does
        # the pid, then a letter per sandbox of this process (a test may start one beside the session's);
        # an interface's name has at most 15 characters: ftcsl, 7 digits, the letter, v9
        Sandbox.made += 1
        self.tag = f"{PREFIX}{os.getpid()}{'abcdefghijklmnopqrstuvwxyz'[Sandbox.made % 26]}"
        self.bridge = f"{self.tag}b"
        # job ids of its own: the sandboxes that run at once share this machine's /tmp, where a job's files on a
        # node are named by its job id (as a site's job ids are its own)
        self.first_job_id = ((os.getpid() % 2000) * 26 + Sandbox.made % 26) * 1000 + 1
        self.net = ""
        self.procs: list[subprocess.Popen] = []
        self.namespaces: list[str] = []
        self.key = root / "user_key"  # what logs in to every node's sshd
        self.conf = root / "slurm.conf"
        self.home = root / "home"  # every node's $HOME: one, as a site's home over NFS is
        # the sockets' directory (slurmstepd's and munged's): a short path, as a unix socket's has at most 107 bytes
        self.sockets = Path(tempfile.gettempdir()) / self.tag

    @property
    def node_names(self) -> list[str]:
        return [f"ftcn{i + 1}" for i in range(self.count)]

    def address(self, index: int) -> str:
        return f"{self.net}.{11 + index}"

    def env(self) -> dict[str, str]:
        """What a Slurm command (and ftc) needs to reach this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def exports(self) -> dict[str, str]:
        """What PROVIDER=slurm needs, as the export lines print it: ftc's settings read FTC_<NAME>."""
        return {**self.env(), "FTC_PARTITION": PARTITION, "FTC_SSH_KEY": str(self.key),
                "FTC_STACK_PYTHON": sys.executable}

    # ---- start ------------------------------------------------------------------------------

    def start(self) -> "Sandbox":
        remove_stale()
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o700)  # munged refuses a socket directory others may write
        try:
            with open("/run/lock/ftc-slurm-sandbox.lock", "w") as lock:  # two sandboxes never choose one subnet
                fcntl.flock(lock, fcntl.LOCK_EX)
                self.net = subnet_for(os.getpid(), _sh("ip", "-br", "addr").stdout)
                self._network()
            self._munge()
            self._config()
            self._start([shutil.which("slurmctld") or "/usr/sbin/slurmctld", "-D", "-f", str(self.conf)], "slurmctld")
            _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key))
            for index in range(self.count):
                self._node(index)
            self._wait_idle()
        except BaseException:
            self.stop()
            raise
        return self

    def _network(self) -> None:
        _sh("ip", "link", "add", self.bridge, "type", "bridge")
        _sh("ip", "addr", "add", f"{self.net}.1/24", "dev", self.bridge)
        _sh("ip", "link", "set", self.bridge, "up")
        for index in range(self.count):
            ns, outer = f"{self.tag}n{index + 1}", f"{self.tag}v{index + 1}"
            _sh("ip", "netns", "add", ns)
            self.namespaces.append(ns)
            _sh("ip", "link", "add", outer, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _sh("ip", "link", "set", outer, "master", self.bridge, "up")
            for argv in (["addr", "add", f"{self.address(index)}/24", "dev", "eth0"], ["link", "set", "eth0", "up"],
                         ["link", "set", "lo", "up"]):
                _sh("ip", "-n", ns, *argv)

    def _start(self, argv: list[str], log: str) -> subprocess.Popen:
        with open(self.root / f"{log}.log", "ab") as out:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,  # noqa: S603
                                    start_new_session=True)
        self.procs.append(proc)
        return proc

    def _munge(self) -> None:
        key = self.root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.sockets.mkdir(mode=0o700)
        self._start(["munged", "-F", "-f", f"--key-file={key}", f"--socket={self.sockets / 'munge.sock'}",
                     f"--pid-file={self.root / 'munged.pid'}", f"--log-file={self.root / 'munged.log'}",
                     f"--seed-file={self.root / 'munged.seed'}"], "munged-out")
        _until(lambda: (self.sockets / "munge.sock").exists(), "munged's socket", self.root / "munged.log")

    def _config(self) -> None:
        # slurmctld's port: free now, in this namespace (slurmd's are in their own), and below the ephemeral
        # range, so no outgoing connection of the other worker's is handed it before slurmctld binds it
        ctl_port = listen_port()
        host = socket.gethostname().split(".")[0]
        # every node is this machine's hardware, as `slurmd -C` reports it (CPUs, sockets, cores, memory)
        found = _sh(shutil.which("slurmd") or "/usr/sbin/slurmd", "-C").stdout.splitlines()[0]
        hardware = " ".join(word for word in found.split() if not word.startswith(("NodeName=", "RealMemory=")))
        nodes = "\n".join(f"NodeName={name} NodeAddr={self.address(i)} {hardware} State=UNKNOWN"
                          for i, name in enumerate(self.node_names))
        self.conf.write_text(f"""\
ClusterName={self.tag}
SlurmctldHost={host}({self.net}.1)
SlurmctldPort={ctl_port}
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.sockets / 'munge.sock'}
StateSaveLocation={self.root / 'ctl'}
SlurmdSpoolDir={self.sockets}/%n
SlurmctldPidFile={self.root / 'slurmctld.pid'}
SlurmdPidFile={self.root}/%n/slurmd.pid
SlurmctldLogFile={self.root / 'slurmctld.log'}
SlurmdLogFile={self.root}/%n/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/linear
MpiDefault=none
ReturnToService=2
Epilog={self.root / 'epilog.sh'}
SlurmdTimeout=30
# 5 s from a cancel's SIGTERM to its SIGKILL (the default 30): the tests that cancel wait it out
KillWait=5
MinJobAge=600
FirstJobId={self.first_job_id}
{nodes}
PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime={MAX_MINUTES} State=UP
PartitionName={HELD_PARTITION} Nodes=ALL MaxTime={MAX_MINUTES} State=DOWN
""")
        (self.root / "ctl").mkdir(exist_ok=True)
        epilog = self.root / "epilog.sh"
        epilog.write_text(EPILOG.format(root=self.root))
        epilog.chmod(0o755)
        (self.root / "hosts").write_text("127.0.0.1 localhost\n" + "".join(
            f"{self.address(i)} {name}\n" for i, name in enumerate(self.node_names)))

    def _node(self, index: int) -> None:
        name, ns = self.node_names[index], self.namespaces[index]
        home = self.home
        (self.sockets / name).mkdir(parents=True, exist_ok=True)
        (self.root / name).mkdir(parents=True, exist_ok=True)
        (home / ".ssh").mkdir(parents=True, exist_ok=True)
        shutil.copy(self.key.with_suffix(".pub"), home / ".ssh" / "authorized_keys")
        (home / "notes.txt").write_text("a file of yours\n")
        host_key = self.root / name / "host_key"
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key))
        config = self.root / name / "sshd_config"
        config.write_text("\n".join([
            "ListenAddress 0.0.0.0:22", f"HostKey {host_key}", f"PidFile {self.root / name / 'sshd.pid'}",
            f"AuthorizedKeysFile {home}/.ssh/authorized_keys", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", "PubkeyAuthentication yes", "UsePAM no",
            "PermitRootLogin prohibit-password", f"SetEnv HOME={home} SLURM_CONF={self.conf}", "StrictModes no",
            "X11Forwarding no", "PrintMotd no", "PrintLastLog no", "MaxStartups 100", "MaxSessions 100",
            "LogLevel ERROR", f"Subsystem sftp {SFTP}", ""]))
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        # its own hostname (UTS) and /etc/hosts (a mount namespace: every node resolves every node's name, as a
        # site's DNS does; Intel MPI's proxies connect back by name), then slurmd in the background and sshd in
        # the foreground: one process tree
        slurmd = f"{shutil.which('slurmd') or '/usr/sbin/slurmd'} -D -N {name} -f {self.conf}"
        inner = (f"mount --bind {self.root / 'hosts'} /etc/hosts && hostname {name} && "
                 + (f"{{ {slurmd} & }} && exec /usr/sbin/sshd -D -e -f {config}" if self.ssh or (self.login and index == 0)
                    else f"exec {slurmd}"))
        # nsenter, not `ip netns exec`: that remounts /sys, hiding the cgroup tree slurmd starts from
        self._start(["nsenter", f"--net=/run/netns/{ns}", "unshare", "--uts", "--mount", "--propagation", "private",
                     "--", "sh", "-c", inner], f"{name}-out")

    def _wait_idle(self) -> None:
        def idle() -> bool:
            out = subprocess.run(["sinfo", "-h", "-N", "-p", PARTITION, "-o", "%N %t"], capture_output=True,  # noqa: S607
                                 text=True, env={**os.environ, **self.env()}).stdout
            states = dict(line.split() for line in out.splitlines() if line.strip())
            return sorted(states) == self.node_names and set(states.values()) == {"idle"}
        _until(idle, f"{self.count} idle slurmd nodes", self.root / "slurmctld.log", timeout=90)

    # ---- stop --------------------------------------------------------------------------------

    def stop(self) -> None:
        """Every process, namespace and file of the sandbox, gone: its jobs first, as a site ends them (each
        step's SIGTERM, so what a job keeps in the nodes' /tmp goes with it), then the daemons."""
        if self.procs and self.conf.exists():
            env = {**os.environ, **self.env()}
            subprocess.run(["scancel", "--user", str(os.getuid())], capture_output=True, env=env)  # noqa: S603, S607
            try:
                _until(lambda: not subprocess.run(["squeue", "-h"], capture_output=True, text=True,  # noqa: S603, S607
                                                  env=env).stdout.strip(), "empty queue", self.root / "slurmctld.log")
            except RuntimeError:
                pass  # a node that does not answer: its processes end with its namespace below
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        for ns in self.namespaces:
            _kill_netns(ns)  # what the jobs and ssh sessions started there
        _sh("ip", "link", "del", self.bridge, check=False)
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.sockets, ignore_errors=True)


def _until(condition, what: str, log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            said = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"the Slurm sandbox: no {what} after {timeout:.0f} s; {log}:\n{said}")
        time.sleep(0.2)


def main(argv: list[str]) -> int:
    nodes = int(argv[1]) if len(argv) > 1 else 2
    lacking = missing_tools()
    if lacking:
        print(f"error: the Slurm sandbox needs {', '.join(lacking)}; run `make setup` as root "
              "(it installs slurm-wlm and munge)", file=sys.stderr)
        return 2
    if not 1 <= nodes <= 9:
        print(f"error: NODES={nodes} is not allowed; allowed: 1..9", file=sys.stderr)
        return 2
    sandbox = Sandbox(Path(tempfile.mkdtemp(prefix="ftc-slurm-")), nodes)
    # Ctrl-C stops it even when started from a script that left SIGINT ignored (a background job's is)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(f"starting a Slurm of {nodes} node(s) in {sandbox.root}", file=sys.stderr, flush=True)
    try:
        sandbox.start()
        for key, value in sandbox.exports().items():
            print(f"export {key}={value}")
        print("ready", flush=True)
        print("Ctrl-C stops it and removes every node", file=sys.stderr, flush=True)
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C (or make's TERM) must not cut the cleanup short
            signal.signal(signum, signal.SIG_IGN)
        print("stopping the Slurm sandbox", file=sys.stderr, flush=True)
        sandbox.stop()
        print("the Slurm sandbox is gone", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
