"""A stand-in for EC2's instance metadata service (IMDSv2), for the spot-interruption path:
tokens by PUT, the token required on reads, and spot/instance-action answering 404 until
the test arms a notice. It serves the notice once, like the one instance AWS reclaims:
the nodes of the recreated cluster see none."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN = "fake-imds-token"


class FakeIMDS:
    def __init__(self):
        self.armed = False
        self.served = 0
        self.unauthorized = 0
        imds = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self):
                if self.path != "/latest/api/token" or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self._answer(400, "")
                self._answer(200, TOKEN)

            def do_GET(self):
                if self.headers.get("X-aws-ec2-metadata-token") != TOKEN:
                    imds.unauthorized += 1
                    return self._answer(401, "")
                if self.path != "/latest/meta-data/spot/instance-action" or not imds.armed:
                    return self._answer(404, "")
                imds.armed = False
                imds.served += 1
                self._answer(200, json.dumps({"action": "terminate", "time": "2026-11-30T12:00:00Z"}))

            def _answer(self, code: int, body: str):
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
