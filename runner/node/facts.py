"""Print this node's facts as JSON: what the runner sizes ranks, threads and precision by.

Runs on a node with the stack's Python: `python facts.py [PRIVATE_IP]`.
Cores are counted within this process's CPU affinity, which on the local provider is
the node's share of the machine.
"""

import json
import os
import platform
import re
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

LIBRARIES = ("torch", "transformers", "tokenizers", "datasets", "impi-rt", "numpy",
             "intel-extension-for-pytorch", "oneccl-bind-pt", "accelerate")
ALLOCATORS = ("libtcmalloc.so.4", "libtcmalloc_minimal.so.4", "libjemalloc.so.2")
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile")


def native_bf16(flags) -> bool:
    """The one rule: bf16 is native (fast) with AMX or AVX-512 BF16; elsewhere it is emulated."""
    return "amx_bf16" in flags or "avx512_bf16" in flags


@dataclass
class NodeFacts:
    """What one node is, as this program prints it (JSON) and the controller reads it back."""
    hostname: str
    cpu_model: str
    flags: list[str]  # the CPU flags of FLAGS this CPU has
    native_bf16: bool  # native_bf16(flags)
    allowed_cpus: list[int]  # the CPUs this process may run on (a local node's share)
    physical_cores: int  # within allowed_cpus, hyper-threads counted once
    core_cpus: list[int]  # the first hardware thread of each physical core
    sockets: int
    cores_by_socket: dict[str, list[int]]
    numa_nodes: int
    memory_gb: float
    python: str  # version
    python_executable: str  # the stack's interpreter: what launch scripts run
    versions: dict[str, str]  # LIBRARIES found, by name
    mpi: str  # impi | openmpi | mpich | unknown | none
    private_ip: str
    interface: str  # the network interface holding private_ip: what gloo binds to
    allocators: list[str] = field(default_factory=list)  # tcmalloc/jemalloc libraries present

    @classmethod
    def from_dict(cls, data: dict) -> "NodeFacts":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        """The one file format of facts, on the node and on the controller."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, allow_nan=False) + "\n"


def cpu_topology(allowed: list[int]) -> dict:
    """Physical cores (first hardware thread of each core) and sockets within `allowed`.

    Hardware threads of one core are the ones that list each other as siblings."""
    cores: dict[tuple[int, str], list[int]] = {}
    for cpu in allowed:
        base = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            key = (int((base / "physical_package_id").read_text()), (base / "thread_siblings_list").read_text().strip())
        except (OSError, ValueError):
            key = (0, str(cpu))
        cores.setdefault(key, []).append(cpu)
    physical = sorted(min(threads) for threads in cores.values())
    sockets = sorted({socket_id for socket_id, _ in cores})
    by_socket = {str(s): sorted(min(t) for (sid, _), t in cores.items() if sid == s) for s in sockets}
    numa = sorted(p.name for p in Path("/sys/devices/system/node").glob("node[0-9]*"))
    return {"allowed_cpus": allowed, "physical_cores": len(physical), "core_cpus": physical,
            "sockets": len(sockets), "cores_by_socket": by_socket, "numa_nodes": max(1, len(numa))}


def cpu_info() -> tuple[str, list[str]]:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    flags = re.search(r"^flags\s*:\s*(.+)$", text, re.M)
    have = set(flags.group(1).split()) if flags else set()
    return (model.group(1).strip() if model else platform.processor()), [f for f in FLAGS if f in have]


def memory_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 2**20, 1)
    return 0.0


def versions() -> dict[str, str]:
    """Versions of LIBRARIES, from the names of the installed dist-info folders.

    Every bootstrap runs this on every node; importing importlib.metadata alone costs more
    CPU than the rest of this program, which counts when many local nodes share few cores."""
    wanted = {_normal(name): name for name in LIBRARIES}
    found: dict[str, str] = {}
    for entry in sys.path:
        for info in Path(entry or ".").glob("*.dist-info") if Path(entry or ".").is_dir() else ():
            name, _, version = info.name[:-len(".dist-info")].partition("-")
            if _normal(name) in wanted:
                found.setdefault(wanted[_normal(name)], version)
    return found


def _normal(name: str) -> str:
    """Distribution names compare case-blind with '-', '_' and '.' alike (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def mpi_flavour() -> str:
    try:
        out = subprocess.run(["mpirun", "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "none"
    if "Intel(R) MPI" in out:
        return "impi"
    if "Open MPI" in out or "OpenRTE" in out:
        return "openmpi"
    if "HYDRA" in out or "MPICH" in out:
        return "mpich"
    return "unknown"


def interface_of(address: str) -> str:
    """The network interface holding `address`: what gloo must bind to."""
    try:
        out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    for line in out.splitlines():
        parts = line.split()
        if len(parts) > 3 and parts[3].split("/")[0] == address:
            return parts[1]
    if address.startswith("127."):
        return "lo"
    return ""


def allocators() -> list[str]:
    roots = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")
    return [str(Path(r) / a) for a in ALLOCATORS for r in roots if (Path(r) / a).exists()]


def machine_cpu_seconds() -> float:
    """CPU time this whole machine has spent busy (all processes, all cores), from /proc/stat:
    what tells a step that waits from one that competes for the cores."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(f) for f in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def gather(private_ip: str) -> NodeFacts:
    model, flags = cpu_info()
    return NodeFacts(hostname=socket.gethostname(), cpu_model=model, flags=flags, native_bf16=native_bf16(flags),
                     **cpu_topology(sorted(os.sched_getaffinity(0))), memory_gb=memory_gb(),
                     python=platform.python_version(), python_executable=sys.executable, versions=versions(),
                     mpi=mpi_flavour(), private_ip=private_ip,
                     interface=interface_of(private_ip) if private_ip else "", allocators=allocators())


def main() -> None:
    print(gather(sys.argv[1] if len(sys.argv) > 1 else "").to_json(), end="")


if __name__ == "__main__":
    main()
