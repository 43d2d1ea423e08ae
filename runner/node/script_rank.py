"""One rank of your own script (`ftc launch`): what mpirun starts on every rank in place of ftc's trainer.

It gives the script torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
GROUP_RANK; MASTER_ADDR and MASTER_PORT come from the launch script), its own share of the node's
cores, FTC_OUTPUT_DIR and FTC_RUN_ID; runs it in a child process (script_main.py) from the node's copy
of the workdir; copies the child's output both to mpirun (output.log on the head node) and to
logs/rank<r>.log; and records how it ended (protocol.RankExit), so the controller names the first rank
that failed even when mpirun reports another. A child is a process of its own so that a script that
crashes the interpreter still has its exit recorded. Spot: on an interruption notice the script gets
SIGTERM, and FTC_PREEMPTED_FILE holds `FTC_PREEMPTED=1`.

    python -m runner.node.script_rank OUTPUT SCRIPT [ARGS...]   (cwd: the job's directory)
"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from .distenv import pin_self, read_env
from .protocol import PREEMPTED_NOTE, SCRIPT_WORKDIR, RankExit, write_rank_exit
from .spot import Watcher


def torchrun_env(rank: int, world: int, local_rank: int, local_world: int) -> dict[str, str]:
    """The variables torchrun gives each worker (MASTER_ADDR/PORT aside): ranks are placed node by
    node (mpirun's ppr:N:node, -ppn N), so the node's index is the rank's group. Pure."""
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(local_world), "GROUP_RANK": str(rank // max(1, local_world)),
            "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world)}


def main(argv: list[str]) -> int:
    output, script, *args = argv
    job_dir = Path.cwd()
    dist = read_env()
    if os.environ.get("FTC_SELF_PIN") == "1":  # this mpirun does not pin: take this rank's share of the cores
        pin_self(dist)
    workdir = job_dir / SCRIPT_WORKDIR
    note = job_dir / PREEMPTED_NOTE
    env = {**os.environ, **torchrun_env(dist.rank, dist.world_size, dist.local_rank, dist.local_world_size),
           "FTC_OUTPUT_DIR": str(workdir / output), "FTC_PREEMPTED_FILE": str(note)}
    # ftc's own package stays out of the script's import path: its runner/ must not hide the user's
    env["PYTHONPATH"] = os.pathsep.join(p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                        if p and Path(p).resolve() != Path(__file__).resolve().parents[2])
    (workdir / output).mkdir(parents=True, exist_ok=True)
    (job_dir / "logs").mkdir(exist_ok=True)
    child = subprocess.Popen([sys.executable, str(Path(__file__).with_name("script_main.py")), script, *args],
                             cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # mpirun stopping the job stops the script
        signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
    watcher = _watch_spot(child, note)
    with open(job_dir / "logs" / f"rank{dist.rank}.log", "ab") as log:
        for line in iter(child.stdout.readline, b""):
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()
            log.write(line)
            log.flush()
    code = child.wait()
    if watcher:
        watcher.stop()
    code = 128 - code if code < 0 else code  # killed by signal N: the shell's 128 + N
    write_rank_exit(job_dir, RankExit(dist.rank, socket.gethostname(), code, time.time()))
    return code


def _watch_spot(child: subprocess.Popen, note: Path) -> Watcher | None:
    """On a spot cluster (FTC_METADATA_ENDPOINT), a thread that, once a notice comes, writes the note
    the script can read and sends the script SIGTERM: two minutes to save what it needs."""
    endpoint = os.environ.get("FTC_METADATA_ENDPOINT", "")
    if not endpoint:
        return None

    class Notify(Watcher):
        def run(self) -> None:
            super().run()
            if self.notice is not None:
                note.write_text("FTC_PREEMPTED=1\n")
                child.send_signal(signal.SIGTERM)
    watcher = Notify(endpoint)
    watcher.start()
    return watcher


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
