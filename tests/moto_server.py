"""A moto server with ftc's EC2 additions (tests/moto_ext.py): `python moto_server.py PORT`
(0: a free one, which it binds itself); prints `ready PORT` once it listens."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import moto_ext  # noqa: E402
from moto.server import ThreadedMotoServer  # noqa: E402

if __name__ == "__main__":
    moto_ext.install()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=int(sys.argv[1]), verbose=False)
    server.start()
    print(f"ready {server.get_host_and_port()[1]}", flush=True)
    server._thread.join()
