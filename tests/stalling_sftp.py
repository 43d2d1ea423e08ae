"""A test server's SFTP subsystem: the real sftp-server behind a relay that can stall a copy mid-stream,
as a slow network does, so a test acts (Ctrl-C) while a copy is in flight, at a known point.

    stalling_sftp.py SFTP_SERVER CONTROL_DIR

Each session reads CONTROL_DIR/stall.json when it starts: {"path": P, "direction": "upload" or
"download", "after": N}. Once the client opens a file whose name holds P, the relay passes N more
bytes in that direction (N is picked to end inside a packet) and then none: it writes
CONTROL_DIR/stalled and holds until the session is gone (the client cut it), then ends, with the
sftp-server behind it. A held download goes on as a slow network's would if the client asks to close
a file meanwhile: the client then reads the rest of the packet it was reading. Without stall.json, or
for other files, it relays everything.
"""

import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

SSH_FXP_OPEN, SSH_FXP_CLOSE = 3, 4


def read_exactly(fd: int, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            return data
        data += chunk
    return data


def write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


class Relay:
    def __init__(self, server: subprocess.Popen, control: Path):
        self.server, self.control = server, control
        settings = control / "stall.json"
        self.stall = json.loads(settings.read_text()) if settings.exists() else None
        self.passed = None  # bytes passed in the stalled direction since the file was opened
        self.closing = threading.Event()  # the client asked to close a file while the download was held

    def seen(self, body: bytes) -> None:
        """A client packet: the OPEN of the file to stall arms the stall."""
        if self.stall and self.passed is None and body[:1] == bytes([SSH_FXP_OPEN]):
            length = int.from_bytes(body[5:9], "big")
            if self.stall["path"].encode() in body[9:9 + length]:
                self.passed = 0
        if self.passed is not None and body[:1] == bytes([SSH_FXP_CLOSE]):
            self.closing.set()

    def passing(self, direction: str, data: bytes, out: int) -> None:
        """Write `data` to `out`; at the stall point, the part before it, then hold."""
        if self.stall and self.passed is not None and self.stall["direction"] == direction:
            room = self.stall["after"] - self.passed
            self.passed += len(data)
            if len(data) >= room:
                write_all(out, data[:room])
                self.held()
                self.stall, data = None, data[room:]
        write_all(out, data)

    def held(self) -> None:
        """Pass nothing more until the client closes a file (a download only), or end once the session is
        gone: sshd exited (this relay was handed to init) or closed its end of our output."""
        (self.control / "stalled").write_text(str(os.getpid()))
        watch = select.poll()
        watch.register(1, 0)  # no events asked: only an error or hangup (sshd closed its end) is reported
        parent = os.getppid()
        while os.getppid() == parent and not watch.poll(100):
            if self.closing.is_set():
                return
        self.server.kill()
        os._exit(0)

    def upload(self) -> None:
        """Client to server, packet by packet (to see each OPEN and CLOSE)."""
        while True:
            header = read_exactly(0, 4)
            body = read_exactly(0, int.from_bytes(header, "big")) if len(header) == 4 else b""
            if not body:
                self.server.stdin.close()
                return
            self.seen(body)
            self.passing("upload", header + body, self.server.stdin.fileno())

    def download(self) -> None:
        """Server to client, as it comes."""
        while data := os.read(self.server.stdout.fileno(), 65536):
            self.passing("download", data, 1)


def main() -> int:
    server = subprocess.Popen([sys.argv[1]], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    relay = Relay(server, Path(sys.argv[2]))
    threading.Thread(target=relay.upload, daemon=True).start()
    relay.download()
    while server.poll() is None:
        time.sleep(0.05)
    return server.returncode


if __name__ == "__main__":
    sys.exit(main())
