"""An EC2 endpoint on this machine whose instances are real nodes: `python ec2_emulator.py PORT`
(`make ec2-emulator PORT=5000`), then `AWS_ENDPOINT_URL=http://127.0.0.1:5000 ftc ... --provider aws`.
PORT 0 takes a free port; the ready line names the URL.

moto's server speaks the EC2 API (with ftc's placement groups and ENA Express settings, kept per
network interface and answered by DescribeInstances and DescribeNetworkInterfaces: tests/moto_ext.py);
each instance RunInstances launches is, besides moto's record, a node of this machine:
  - its own loopback address 127.0.1.x, which DescribeInstances reports as its private and
    public IP, and an sshd on port 22 there that lets the AMI's user (ec2-user) in with the
    key pair's key;
  - its own mount and UTS namespace (so root is needed): /home is the instance's own disk,
    /etc/passwd maps ec2-user to the running user, /usr/local/sbin holds the AMI's `sudo`
    and `shutdown`, the hostname is ip-127-0-1-x and /etc/hosts resolves every node's, as
    the VPC's DNS does;
  - the AMI ships ftc's stack where ftc's install.sh looks for it (~/ftc/venv is this
    emulator's own Python environment), so the bootstrap finds it "already installed";
  - its user-data runs at boot; `shutdown -h +N` there (the watchdog, `ftc extend`) powers
    it off after N minutes, which stops or terminates it as InstanceInitiatedShutdownBehavior says;
  - an instance metadata service (IMDSv2) at 127.0.1.x:80, which the node's own /etc/hosts
    names instance-data.ec2.internal (as EC2's DNS does 169.254.169.254), and which its
    processes are pointed at by the standard AWS_EC2_METADATA_SERVICE_ENDPOINT;
  - terminated (TerminateInstances, the watchdog, a spot reclaim): every process in its
    namespace is stopped, its files removed.
Ctrl-C, SIGTERM or SIGHUP (its terminal closed) stops every node; nodes an emulator could not stop
(it was killed) are stopped by the next one that starts on this machine. Environment:
  FTC_EMULATOR_MINUTE_S   seconds a `shutdown +N` minute lasts (default 60; tests make it short)
  FTC_EMULATOR_NOTICE_S   seconds from a spot notice to the reclaim (default 120)
  FTC_EMULATOR_DIR        where the nodes' disks live (default: a fresh temporary directory)
Control, besides the EC2 API:
  POST /_emulator/spot-reclaim/<instance-id>   arm a spot interruption notice for that instance
  GET  /_emulator/nodes                         the live nodes as JSON
"""

import base64
import fcntl
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import moto_ext  # noqa: E402
import paramiko  # noqa: E402
from fake_imds import SPOT_ACTION, IMDSv2Handler, serve  # noqa: E402
from moto.ec2.models.instances import Instance  # noqa: E402
from moto.ec2.responses import EC2Response  # noqa: E402
from moto.moto_server.threaded_moto_server import MotoRequestHandler  # noqa: E402
from moto.server import DomainDispatcherApplication, create_backend_app  # noqa: E402
from werkzeug.serving import make_server  # noqa: E402

SSH_USER = "ec2-user"  # the AMI's user, as for Amazon Linux
# Shared by every emulator on this machine: the lock under which nodes choose addresses, and one
# record per live node (its owner, its namespace), by which a new emulator stops what a killed one left
# (FTC_EMULATOR_REGISTRY: a registry of a few emulators' own, that no other emulator cleans up).
LOCK = Path(tempfile.gettempdir()) / "ftc-ec2-emulator.lock"
REGISTRY = Path(os.environ.get("FTC_EMULATOR_REGISTRY") or Path(tempfile.gettempdir()) / "ftc-ec2-emulator-nodes")
MINUTE_S = float(os.environ.get("FTC_EMULATOR_MINUTE_S", "60"))
NOTICE_S = float(os.environ.get("FTC_EMULATOR_NOTICE_S", "120"))
SFTP = next((p for p in ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server") if Path(p).exists()),
            "internal-sftp")

# The AMI's own commands. `shutdown` records when to power off (or cancels); the emulator acts on it.
SHUTDOWN = """#!/bin/bash
when=+0
for arg in "$@"; do
  case "$arg" in
    -c) rm -f "{dir}/poweroff"; exit 0 ;;
    now) when=+0 ;;
    +[0-9]*) when=$arg ;;
  esac
done
echo "$(date +%s) ${{when#+}}" > "{dir}/poweroff"
echo "Shutdown scheduled in ${{when#+}} minute(s)"
"""
SUDO = '#!/bin/bash\n# the AMI user is root here already\n[ "$1" = -n ] && shift\nexec "$@"\n'

SSHD_CONFIG = """ListenAddress {address}:22
HostKey {dir}/ssh_host_ed25519_key
PidFile {dir}/sshd.pid
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
UsePAM no
PermitRootLogin prohibit-password
AllowUsers {user}
StrictModes no
SetEnv AWS_EC2_METADATA_SERVICE_ENDPOINT=http://instance-data.ec2.internal
X11Forwarding no
PrintMotd no
MaxStartups 200
MaxSessions 200
LogLevel ERROR
Subsystem sftp {sftp}
"""

# In the node's own namespaces: its disk as /home, its passwd, its commands, its hostname; user-data; sshd.
BOOT = """set -e
mount --bind "$D/disk" /home
mount --bind "$D/passwd" /etc/passwd
mount --bind "$D/hosts" /etc/hosts
mount --bind "$D/sbin" /usr/local/sbin
hostname "$HOSTNAME_"
bash "$D/user-data" > "$D/user-data.log" 2>&1 || true
exec "$SSHD" -D -e -f "$D/sshd_config"
"""


class Node:
    """One instance as a process tree: sshd in its own namespaces, and an IMDS."""

    def __init__(self, instance: Instance, address: str, root: Path, public_key: str, user_data: str):
        self.id, self.address, self.spot = instance.id, address, instance.lifecycle == "spot"
        self.dir = root / instance.id
        self.notice: dict | None = None
        self.notices_served = 0
        self.ena_express = False
        self.reclaim_at: float | None = None
        shutil.rmtree(self.dir, ignore_errors=True)  # what a failed try at another address left
        self._prepare(public_key, user_data)
        env = {**os.environ, "D": str(self.dir), "SSHD": shutil.which("sshd") or "/usr/sbin/sshd",
               "HOSTNAME_": "ip-" + address.replace(".", "-"), "PATH": "/usr/local/sbin:" + os.environ["PATH"]}
        log = open(self.dir / "sshd.log", "ab")
        self.proc = subprocess.Popen(["unshare", "--mount", "--uts", "--propagation", "private", "bash", "-c", BOOT],  # noqa: S603, S607
                                     env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.disk = file_identity(self.dir / "disk")  # its /home: with the namespace, what names its processes
        try:
            self.namespace = self._wait_for_namespace()
            check_own_sshd(self.address, 22, self.dir / "ssh_host_ed25519_key.pub")
            self.imds = self._serve_imds()
        except (OSError, RuntimeError, paramiko.SSHException):
            stop_namespace(getattr(self, "namespace", ""), self.disk)
            self.proc.kill()
            self.proc.wait(5)
            raise
        REGISTRY.mkdir(exist_ok=True)
        (REGISTRY / self.id).write_text(json.dumps({"owner": OWNER, "namespace": self.namespace, "disk": self.disk,
                                                    "dir": str(self.dir), "address": self.address}))


    def _prepare(self, public_key: str, user_data: str) -> None:
        home = self.dir / "disk" / SSH_USER
        (home / ".ssh").mkdir(parents=True, mode=0o700)
        (home / ".ssh" / "authorized_keys").write_text(public_key.strip() + "\n")
        (home / "ftc").mkdir()
        (home / "ftc" / "venv").symlink_to(sys.prefix)  # the AMI's Python with ftc's stack
        passwd = Path("/etc/passwd").read_text()
        (self.dir / "passwd").write_text(passwd.rstrip("\n") + f"\n{SSH_USER}:x:{os.getuid()}:{os.getgid()}::"
                                         f"/home/{SSH_USER}:/bin/bash\n")
        sbin = self.dir / "sbin"
        sbin.mkdir()
        for name, text in (("shutdown", SHUTDOWN.format(dir=self.dir)), ("sudo", SUDO)):
            (sbin / name).write_text(text)
            (sbin / name).chmod(0o755)
        (self.dir / "user-data").write_text(user_data)
        # The VPC's DNS: every node's ip-a-b-c-d name resolves (mpirun reaches nodes by hostname), and
        # instance-data.ec2.internal is the node's own metadata service, a name that means the same on
        # every node (as on EC2), so an environment mpirun copies from node to node still fits.
        (self.dir / "hosts").write_text(Path("/etc/hosts").read_text().rstrip("\n") + "\n" + "".join(
            f"127.0.1.{i} ip-127-0-1-{i}\n" for i in range(2, 255))
            + f"{self.address} instance-data.ec2.internal instance-data\n")
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", self.id,  # noqa: S603, S607
                        "-f", str(self.dir / "ssh_host_ed25519_key")], check=True)
        (self.dir / "sshd_config").write_text(SSHD_CONFIG.format(address=self.address, dir=self.dir, user=SSH_USER,
                                                                 sftp=SFTP))

    def _wait_for_namespace(self) -> str:
        """The mount namespace the node's processes live in, once its sshd listens (boot done)."""
        mine = os.readlink("/proc/self/ns/mnt")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                namespace = os.readlink(f"/proc/{self.proc.pid}/ns/mnt")
                # sshd writes its pid file once it listens (an sshd that cannot bind exits instead)
                if namespace != mine and (self.dir / "sshd.pid").read_text().strip() == str(self.proc.pid):
                    return namespace
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.id}: boot failed: {(self.dir / 'sshd.log').read_text()[-500:]}")
            time.sleep(0.02)
        raise RuntimeError(f"{self.id}: sshd did not start")

    def _serve_imds(self) -> ThreadingHTTPServer:
        node = self

        class Handler(IMDSv2Handler):
            token = f"token-{node.id}"

            def metadata(self, path: str) -> str | None:
                if path == "/latest/meta-data/instance-id":
                    return node.id
                if path == SPOT_ACTION and node.notice:
                    node.notices_served += 1
                    return json.dumps(node.notice)
                return None

        return serve(self.address, 80, Handler)

    def arm_reclaim(self) -> dict:
        self.reclaim_at = time.time() + NOTICE_S
        self.notice = {"action": "terminate",
                       "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.reclaim_at))}
        return self.notice

    def poweroff_due(self) -> bool:
        try:
            since, minutes = (self.dir / "poweroff").read_text().split()
        except (OSError, ValueError):
            return False
        return time.time() >= float(since) + float(minutes) * MINUTE_S

    def pids(self) -> list[int]:
        """Every process in the node's namespace: sshd, the sessions, whatever they started."""
        return namespace_pids(self.namespace, self.disk)

    def stop(self) -> None:
        self.imds.shutdown()
        self.imds.server_close()
        stop_namespace(self.namespace, self.disk)
        self.proc.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)
        (REGISTRY / self.id).unlink(missing_ok=True)


def check_own_sshd(address: str, port: int, host_key_pub: Path) -> None:
    """The sshd reached at address:port is the node's own: it presents the host key made for it
    (another process's sshd there, another emulator's node, presents its own)."""
    ours = host_key_pub.read_text().split()[1]
    transport = paramiko.Transport(socket.create_connection((address, port), timeout=10))
    try:
        transport.start_client(timeout=10)
        presented = transport.get_remote_server_key().get_base64()
    finally:
        transport.close()
    if presented != ours:
        raise RuntimeError(f"{address}:{port} answers with another host key than this node's: another process's "
                           "sshd is reached there")


def file_identity(path: Path) -> str:
    """device:inode of a file, as the process that sees it at `path` finds it."""
    found = os.stat(path)
    return f"{found.st_dev}:{found.st_ino}"


def _identity_if_there(path: Path) -> str:
    """file_identity, or '' where nothing is at `path` (then no process is taken for the node's)."""
    try:
        return file_identity(path)
    except OSError:
        return ""


def namespace_pids(namespace: str, disk: str) -> list[int]:
    """Every process of a node: a node's sshd, its sessions, whatever they started. Each is in the node's
    mount namespace and sees the node's disk (`disk`, its file identity) as /home. The namespace's number
    alone is not enough: once a namespace's last process is gone, the kernel hands its number to the next
    namespace made (another node's, a Slurm node's), so a node whose processes all ended would name those."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "ns" / "mnt") == namespace and file_identity(entry / "root" / "home") == disk:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def stop_namespace(namespace: str, disk: str) -> None:
    if not namespace:
        return
    for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
        for pid in namespace_pids(namespace, disk):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while namespace_pids(namespace, disk) and time.monotonic() < deadline:
            time.sleep(0.05)


def process_start(pid: int) -> str:
    """The process's start time (clock ticks since boot), '' when there is no such process: with
    the pid, it names one process (a pid may be reused)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


OWNER = f"{os.getpid()}:{process_start(os.getpid())}"  # this emulator, as its nodes' records name it


def stop_left_nodes() -> None:
    """The nodes of emulators that are gone (killed, so unable to stop them): stopped, their files
    removed. Called under LOCK, before this emulator starts any node of its own."""
    for record in sorted(REGISTRY.glob("i-*")) if REGISTRY.exists() else []:
        try:
            node = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        pid, _, started = node["owner"].partition(":")
        if process_start(int(pid)) == started:
            continue  # its emulator still runs, and will stop it
        # a record written before records held the disk's identity: the disk's own, if it is still there
        disk = node.get("disk") or _identity_if_there(Path(node["dir"]) / "disk")
        stop_namespace(node["namespace"], disk)
        shutil.rmtree(node["dir"], ignore_errors=True)
        record.unlink(missing_ok=True)
        print(f"{record.name}: stopped, at {node['address']} (left by an emulator that is gone, pid {pid})", flush=True)


def free_address(taken: set[str]) -> str:
    """The first 127.0.1.x whose ports 22 and 80 nobody holds (several emulators may share a machine)."""
    for i in range(2, 255):
        address = f"127.0.1.{i}"
        if address in taken:
            continue
        try:
            for port in (22, 80):
                with socket.socket() as probe:
                    probe.bind((address, port))
        except OSError:
            continue
        return address
    raise RuntimeError("no free address in 127.0.1.2-254")


class Fleet:
    """The nodes by instance id; addresses 127.0.1.2-254, each reused once its node is gone."""

    def __init__(self, root: Path):
        self.root = root
        self.nodes: dict[str, Node] = {}
        self.lock = threading.RLock()

    def boot(self, backend, instance: Instance) -> None:
        with self.lock:
            key = backend.key_pairs[instance.key_name].material_public if instance.key_name else ""
            key = key.decode() if isinstance(key, bytes) else key
            user_data = base64.b64decode(str(instance.user_data)).decode() if instance.user_data else ""
            tried = {n.address for n in self.nodes.values()}
            with open(LOCK, "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # other emulators on this machine choose addresses too
                for _ in range(5):
                    address = free_address(tried)
                    tried.add(address)
                    try:
                        node = Node(instance, address, self.root, key, user_data)
                    except (OSError, RuntimeError) as exc:
                        print(f"{instance.id}: {address} did not work ({exc}); trying another", flush=True)
                        continue
                    break
                else:
                    raise RuntimeError(f"{instance.id}: no free loopback address")
            nic = instance.nics[0]
            nic.private_ip_address = nic.public_ip = address
            # the setting EC2 answers for its interface; the loopback carries no SRD, so it is only recorded
            node.ena_express = bool((getattr(nic, "ena_srd_specification", None) or {}).get("EnaSrdEnabled"))
            self.nodes[instance.id] = node
            print(f"{instance.id}: running at {address} ({'spot' if node.spot else 'on-demand'}"
                  f"{', ENA Express' if node.ena_express else ''})", flush=True)

    def halt(self, instance_id: str, why: str) -> None:
        with self.lock:
            node = self.nodes.pop(instance_id, None)
        if node:
            node.stop()
            print(f"{instance_id}: stopped ({why})", flush=True)

    def watch(self, backend_of) -> None:
        """The nodes' own power-offs (the watchdog, a spot reclaim) become EC2 state changes."""
        while True:
            for node in list(self.nodes.values()):
                reclaim = node.reclaim_at is not None and time.time() >= node.reclaim_at
                if reclaim or node.poweroff_due():
                    instance = backend_of(node.id)
                    if instance is None:
                        self.halt(node.id, "gone")
                    elif reclaim or instance.instance_initiated_shutdown_behavior == "terminate":
                        instance.terminate()  # the hook below stops the node
                    else:
                        instance.stop()
            time.sleep(0.2)

    def stop_all(self) -> None:
        for instance_id in list(self.nodes):
            self.halt(instance_id, "emulator exiting")


def install(fleet: Fleet) -> None:
    """moto's EC2 with ftc's additions, then the nodes behind the instances."""
    moto_ext.install()
    run_instances = EC2Response.run_instances

    def launching(self):
        before = {i.id for i in self.ec2_backend.all_instances()}
        result = run_instances(self)
        for instance in self.ec2_backend.all_instances():
            if instance.id not in before:
                fleet.boot(self.ec2_backend, instance)
        return result

    EC2Response.run_instances = launching
    terminate, stop = Instance.terminate, Instance.stop

    def terminating(self):
        fleet.halt(self.id, "terminated")
        return terminate(self)

    def stopping(self):
        fleet.halt(self.id, "stopped")
        return stop(self)

    Instance.terminate, Instance.stop = terminating, stopping


def find_instance(instance_id: str):
    from moto.ec2.models import ec2_backends
    for regions in ec2_backends.values():
        for backend in regions.values():
            for instance in backend.all_instances():
                if instance.id == instance_id:
                    return instance
    return None


def control(fleet: Fleet, app):
    """The EC2 API, plus /_emulator/: arm a spot reclaim, list the nodes."""
    def wsgi(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if not path.startswith("/_emulator/"):
            return app(environ, start_response)
        code, body = "404 Not Found", {"error": "unknown path"}
        if path == "/_emulator/nodes":
            code, body = "200 OK", [{"id": n.id, "address": n.address, "spot": n.spot, "pids": n.pids(),
                                     "notices_served": n.notices_served, "ena_express": n.ena_express}
                                    for n in list(fleet.nodes.values())]
        elif path.startswith("/_emulator/spot-reclaim/") and environ["REQUEST_METHOD"] == "POST":
            node = fleet.nodes.get(path.rsplit("/", 1)[1])
            if node is None or not node.spot:
                code, body = "400 Bad Request", {"error": "no running spot instance of that id"}
            else:
                code, body = "200 OK", node.arm_reclaim()
                print(f"{node.id}: spot reclaim armed, terminated at {body['time']}", flush=True)
        data = json.dumps(body).encode()
        start_response(code, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
        return [data]
    return wsgi


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].isdigit():
        print("usage: ec2_emulator.py PORT", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("the EC2 emulator needs root: each instance gets its own mount namespace and port 22", file=sys.stderr)
        return 2
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # Debian's sshd wants its privsep dir
    given = os.environ.get("FTC_EMULATOR_DIR")
    root = Path(given) if given else Path(tempfile.mkdtemp(prefix="ftc-ec2-emulator-"))
    root.mkdir(parents=True, exist_ok=True)
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stop_left_nodes()
    fleet = Fleet(root)
    install(fleet)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per API call
    server = make_server("127.0.0.1", int(argv[0]), control(fleet, DomainDispatcherApplication(create_backend_app)),
                         threaded=True, request_handler=MotoRequestHandler)
    threading.Thread(target=fleet.watch, args=(find_instance,), daemon=True).start()

    def finish(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, finish)
    signal.signal(signal.SIGHUP, finish)  # its terminal closed: the nodes go with it
    signal.signal(signal.SIGINT, finish)  # even when started in the background, where SIGINT comes ignored
    print(f"EC2 emulator ready: AWS_ENDPOINT_URL=http://127.0.0.1:{server.port} (nodes under {root})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        fleet.stop_all()
        if not given:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
