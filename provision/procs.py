"""Processes on this machine (local nodes) and on a node (shell snippets): found from /proc,
and signalled only when proven to be the one ftc started.

A pid alone proves nothing: a job that ended without `ftc fetch` stays "running" in the state,
and its pid may later belong to another program. What ftc records at launch is the pid and
the process's start time (clock ticks since boot, /proc/<pid>/stat field 22), which no later
process with the same pid shares.
"""

import os
import shlex
import signal
import time
from pathlib import Path

# The shell of a node prints a process's start time: what follows the command name's ")"
# is field 3 on, so field 22 is the 20th there (the name itself may hold spaces).
START_OF = "sed 's/.*) //' /proc/{pid}/stat | cut -d' ' -f20"


def _stat(pid: int) -> list[str]:
    """/proc/<pid>/stat from field 3 (state) on; [] when there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def pids() -> list[int]:
    """Every process on this machine now (any of them may end before it is looked at)."""
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def cmdline(pid: int) -> bytes:
    """A process's command line, its arguments NUL-separated; b"" once it has ended."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def start_ticks(pid: int) -> int:
    """When the process started (clock ticks since boot), 0 when there is none."""
    fields = _stat(pid)
    return int(fields[19]) if len(fields) > 19 else 0


def alive(pid: int) -> bool:
    fields = _stat(pid)
    return bool(fields) and fields[0] != "Z"


def is_same(pid: int, started: int) -> bool:
    """The process ftc recorded (pid and start time) is still this one."""
    return bool(pid and started) and alive(pid) and start_ticks(pid) == started


def descendants(pid: int) -> list[int]:
    """Every live process below pid (sessions, and what they started), from /proc."""
    children: dict[int, list[int]] = {}
    for other in pids():
        fields = _stat(other)
        if len(fields) > 1 and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(other)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def ancestors(pid: int) -> list[int]:
    """pid's parent, its parent, and so on up to (not including) init, from /proc."""
    found: list[int] = []
    while True:
        fields = _stat(pid)
        pid = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0
        if pid <= 1 or pid in found:
            return found
        found.append(pid)


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def stop(pids: list[int], grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL what is left after the grace period."""
    _signal(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    _signal([p for p in pids if alive(p)], signal.SIGKILL)


def stop_group_command(pid: int, started: int, grace_s: int = 2) -> str:
    """Shell, run on the node: stop the process group `pid` leads (a job started under setsid:
    its mpirun and ranks go with it), only if that process started at `started`; SIGKILL after
    `grace_s` seconds for what SIGTERM did not end. A group that ends sooner is not waited for."""
    same = f'[ "$({START_OF.format(pid=pid)} 2>/dev/null)" = "{started}" ]'
    waited = (f"n=0; while kill -0 -- -{pid} 2>/dev/null && [ $n -lt {10 * int(grace_s)} ]; do sleep 0.1; n=$((n+1)); "
              "done")
    return (f"if {same}; then kill -TERM -- -{pid} 2>/dev/null; {waited}; kill -KILL -- -{pid} 2>/dev/null; "
            f"else echo 'pid {pid} is no longer the job: left alone' >&2; fi; true")


def carrying(entries: set[bytes]) -> list[int]:
    """Every process of this machine whose environment holds one of these exact `NAME=value` entries
    (what a job started carries from its launch, however it left its parent), this one left out."""
    found = []
    for pid in pids():
        try:
            environ = set(Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if pid != os.getpid() and environ & entries:
            found.append(pid)
    return found


def working_in(directories: list[Path]) -> list[int]:
    """Every process of this machine whose working directory is one of `directories` or below it, this
    one and its ancestors left out (a shell that ran this command from there is the user's, not a node's)."""
    under = [os.fsencode(directory) for directory in directories]
    mine = {os.getpid(), *ancestors(os.getpid())}
    found = []
    for pid in pids():
        try:
            cwd = os.fsencode(os.readlink(f"/proc/{pid}/cwd"))
        except OSError:
            continue
        if pid not in mine and any(cwd == d or cwd.startswith(d + b"/") for d in under):
            found.append(pid)
    return found


def stop_carrying_command(entries: list[str]) -> str:
    """Shell, run on a node: SIGKILL every process whose environment holds one of these exact
    `NAME=value` entries (the shell running it left out); always succeeds."""
    patterns = " ".join(f"-e {shlex.quote(entry)}" for entry in entries)
    return (f'PIDS=$(grep -lzxF {patterns} /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 | grep -vx "$$"); '
            '[ -z "$PIDS" ] || kill -KILL $PIDS 2>/dev/null; true')
