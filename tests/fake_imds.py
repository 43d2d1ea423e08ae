"""A stand-in for EC2's instance metadata service (IMDSv2), for the spot-interruption path:
tokens by PUT, the token required on reads, and spot/instance-action answering 404 until
the test arms a notice. It serves the notice once, like the one instance AWS reclaims:
the nodes of the recreated cluster see none.

IMDSv2Handler is the protocol itself, shared with the EC2 emulator's per-instance metadata
service (tests/ec2_emulator.py); each says only what it answers for which path."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN = "fake-imds-token"
SPOT_ACTION = "/latest/meta-data/spot/instance-action"


class IMDSv2Handler(BaseHTTPRequestHandler):
    """IMDSv2: a session token by PUT /latest/api/token (which must ask for a TTL), then that
    token on every GET (401 without it). A subclass sets `token` and says in `metadata` what
    a path reads; None is a 404."""

    token = TOKEN

    def metadata(self, path: str) -> str | None:
        return None

    def refused(self) -> None:
        """A GET without the session token (answered 401)."""

    def do_PUT(self):
        if self.path != "/latest/api/token" or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            return self._answer(400, "")
        self._answer(200, self.token)

    def do_GET(self):
        if self.headers.get("X-aws-ec2-metadata-token") != self.token:
            self.refused()
            return self._answer(401, "")
        body = self.metadata(self.path)
        if body is None:
            return self._answer(404, "")
        self._answer(200, body)

    def _answer(self, code: int, body: str):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


def serve(address: str, port: int, handler: type[IMDSv2Handler]) -> ThreadingHTTPServer:
    """The metadata service at address:port (0: any free port), answering on a daemon thread."""
    server = ThreadingHTTPServer((address, port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class FakeIMDS:
    def __init__(self):
        self.armed = False
        self.served = 0
        self.unauthorized = 0
        self.refused_requests: list[str] = []  # who asked without the token: the assertion's message
        imds = self

        class Handler(IMDSv2Handler):
            def metadata(self, path: str) -> str | None:
                if path != SPOT_ACTION or not imds.armed:
                    return None
                imds.armed = False
                imds.served += 1
                return json.dumps({"action": "terminate", "time": "2026-11-30T12:00:00Z"})

            def refused(self) -> None:
                imds.unauthorized += 1
                imds.refused_requests.append(f"{self.client_address} {self.path} {self.headers.get('User-Agent')}")

        self.server = serve("127.0.0.1", 0, Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
