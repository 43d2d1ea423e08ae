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

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from .distenv import pin_self, read_env
from .protocol import (
    LOGS_DIR,
    PREEMPTED_NOTE,
    REQUIREMENTS_ENV,
    SCRIPT_WORKDIR,
    SPOT_NOTICE_ENV,
    SYNCED_ENV,
    RankExit,
    rank_log_path,
    rank_synced_path,
    requirements_layer,
    write_rank_exit,
)
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
           **own_account(), "FTC_OUTPUT_DIR": str(workdir / output), "FTC_PREEMPTED_FILE": str(note),
           SYNCED_ENV: str(job_dir / rank_synced_path(dist.rank))}
    # ftc's own package stays out of the script's import path: its runner/ must not hide the user's
    env["PYTHONPATH"] = os.pathsep.join(p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                        if p and Path(p).resolve() != Path(__file__).resolve().parents[2])
    (job_dir / LOGS_DIR).mkdir(exist_ok=True)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)  # what the script starts in a session of its own is adopted here, not by init
    # stdin: nothing (a rank's inherited one is mpirun's socket, where a read would wait for ever); a
    # process group of its own, so that what it leaves running is found and stopped; killed with this
    # process if mpirun kills this one outright
    child = subprocess.Popen([script_python(job_dir), str(Path(__file__).with_name("script_main.py")), script, *args],
                             cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True,
                             preexec_fn=lambda: _prctl(PR_SET_PDEATHSIG, signal.SIGKILL))
    def stop(signum, _frame) -> None:
        """mpirun stopping the job (`ftc cancel`) stops the script: the signal to its process group, then,
        after STOP_GRACE_S, SIGKILL to whatever of it is left, before a SIGKILL can end this process."""
        _signal_group(child.pid, signum)
        # a daemon: a script that ends sooner has its leftovers stopped by main, which then exits at once
        timer = threading.Timer(STOP_GRACE_S, _stop_leftovers, args=(child.pid,))
        timer.daemon = True
        timer.start()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    watcher = _watch_spot(child, note)
    reader = threading.Thread(target=_tee, args=(child.stdout, job_dir / rank_log_path(dist.rank)), daemon=True)
    reader.start()
    code = child.wait()
    _stop_leftovers(child.pid)  # their ends of the output pipe close with them
    reader.join(timeout=LEFTOVER_OUTPUT_S)
    if watcher:
        watcher.stop()
    code = 128 - code if code < 0 else code  # killed by signal N: the shell's 128 + N
    write_rank_exit(job_dir, RankExit(dist.rank, socket.gethostname(), code, time.time(),
                                      (job_dir / rank_synced_path(dist.rank)).exists()))
    return code


def own_account() -> dict[str, str]:
    """HOME, USER and LOGNAME of the account this rank runs as, on its own node: mpirun hands every rank
    the head node's, and a node's home may differ (your servers), or be ftc's folder (local nodes)."""
    import pwd
    account = pwd.getpwuid(os.getuid())
    return {"HOME": account.pw_dir, "USER": account.pw_name, "LOGNAME": account.pw_name}


def script_python(job_dir: Path) -> str:
    """The Python the script runs on: its requirements' layer over the stack when it has one (the job's
    directory is <node dir>/jobs/<id>), else the stack's own."""
    layer = os.environ.get(REQUIREMENTS_ENV, "")
    return str(requirements_layer(job_dir.parent.parent, layer) / "bin" / "python") if layer else sys.executable


PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36  # prctl(2)
LEFTOVER_OUTPUT_S = 60  # a hang guard: the pipe closes once every process that held it is stopped
STOP_GRACE_S = 5  # between the signal that stops a job and SIGKILL to what the script left running


def _prctl(option: int, value: int) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def _tee(stream, log_path: Path) -> None:
    """The script's output, line by line, to mpirun (output.log on the head node) and to the rank's log."""
    with open(log_path, "ab") as log:
        for line in iter(stream.readline, b""):
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()
            log.write(line)
            log.flush()


def _signal_group(group: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signum)


def _stop_leftovers(group: int) -> None:
    """What the script left running when it ended: its process group, and what it started in a session
    of its own (adopted by this process, a subreaper): stopped, so nothing of a job outlives it."""
    _signal_group(group, signal.SIGKILL)
    for _ in range(100):
        adopted = [(pid, state) for pid, state in _children() if pid != group]  # the script itself: main's to reap
        if not adopted:
            return
        for pid, state in adopted:
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                if state != "Z":
                    os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)


def _children() -> list[tuple[int, str]]:
    """This process's child processes, with their state letter (Z: ended, not yet reaped)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == os.getpid():
            found.append((int(stat.parent.name), fields[0]))
    return found


def _watch_spot(child: subprocess.Popen, note: Path) -> Watcher | None:
    """On a spot cluster (SPOT_NOTICE_ENV), a thread that, once a notice comes, writes the note
    the script can read and sends the script SIGTERM: two minutes to save what it needs."""
    watch = os.environ.get(SPOT_NOTICE_ENV, "")
    if not watch:
        return None

    class Notify(Watcher):
        def run(self) -> None:
            super().run()
            if self.notice is not None:
                note.write_text("FTC_PREEMPTED=1\n")
                _signal_group(child.pid, signal.SIGTERM)
    watcher = Notify(watch)
    watcher.start()
    return watcher


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
