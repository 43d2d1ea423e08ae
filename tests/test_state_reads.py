"""A command loads the cluster's state once and hands it down: one `ftc finetune` or `ftc launch`
reads state.json at most 3 times (the load, the read under the lock at the start, the read under
the lock at the end), counted by the kernel, whatever code path opens the file."""

import ctypes
import os
import struct
from pathlib import Path

import pytest
from conftest import ftc
from helpers import gloo_script, last_job, tiny_job

IN_CLOSE_NOWRITE, IN_OPEN, IN_Q_OVERFLOW = 0x10, 0x20, 0x4000
EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then len bytes of name


class Opens:
    """Every open of a file in `directory`, by any process, as inotify reports it. A read of state.json
    opens it; a save does not (it writes a temporary file and renames it over). The closes are watched
    too: inotify merges an event into the one before it when the two are the same, so two reads one
    after the other would show as one open without the close between them."""

    def __init__(self, directory: Path):
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self.fd >= 0, os.strerror(ctypes.get_errno())
        watch = libc.inotify_add_watch(self.fd, os.fsencode(directory), IN_OPEN | IN_CLOSE_NOWRITE)
        assert watch >= 0, os.strerror(ctypes.get_errno())

    def of(self, name: str) -> int:
        """How many times `name` was opened since the last call (the kernel queued each open as it happened)."""
        data = b""
        while True:
            try:
                data += os.read(self.fd, 65536)
            except BlockingIOError:
                break
        count, at = 0, 0
        while at < len(data):
            _, mask, _, size = EVENT.unpack_from(data, at)
            assert not mask & IN_Q_OVERFLOW, "inotify's queue overflowed: opens were lost"
            opened = data[at + EVENT.size:at + EVENT.size + size].rstrip(b"\0").decode() if mask & IN_OPEN else ""
            count += opened == name
            at += EVENT.size + size
        return count

    def close(self) -> None:
        os.close(self.fd)


@pytest.mark.slow
def test_finetune_and_launch_read_the_cluster_state_at_most_three_times(ftc_home, cluster, minilm, glue_dir, tmp_path):
    opens = Opens(ftc_home / "clusters" / cluster)
    try:
        tuned = ftc("finetune", "--name", cluster, *tiny_job(minilm, glue_dir))
        finetune_reads = opens.of("state.json")
        assert tuned.returncode == 0, tuned.stderr[-3000:]
        assert last_job(ftc_home, cluster)["state"] == "finished"
        assert finetune_reads <= 3

        opens.of("state.json")  # this test's own read, just above
        launched = ftc("launch", "--name", cluster, "--", str(gloo_script(tmp_path / "script-work")))
        launch_reads = opens.of("state.json")
        assert launched.returncode == 0, launched.stderr[-3000:]
        assert last_job(ftc_home, cluster)["state"] == "finished"
        assert launch_reads <= 3
    finally:
        opens.close()
