"""Spot interruption notices, from the instance metadata service (IMDSv2).

EC2 announces a spot reclaim two minutes ahead at /latest/meta-data/spot/instance-action
(404 until then). One thread per node (local rank 0) polls it; the training loop asks every
step whether any node has seen one, checkpoints where it stands and exits with
protocol.EXIT_PREEMPTED, and `ftc run` recreates the cluster and resumes. The endpoint comes from
the controller (the provider's World.spot_notice_endpoint, in the job's arguments or environment).
Standard library only: this runs on the nodes.
"""

import ipaddress
import json
import os
import threading
import urllib.error
import urllib.parse
import urllib.request

POLL_SECONDS = 5.0


def interruption_notice(endpoint: str, timeout: float = 2.0) -> dict | None:
    """The pending instance-action ({"action": "terminate", "time": ...}) or None.
    IMDSv2: a session token first (the nodes require it), then the read."""
    if not endpoint.startswith("http://"):
        raise ValueError(f"the metadata endpoint must be an http:// URL, not {endpoint!r}")
    # S310: the scheme is checked above; the metadata service speaks plain http.
    token_request = urllib.request.Request(f"{endpoint}/latest/api/token", method="PUT",  # noqa: S310
                                           headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"})
    with urllib.request.urlopen(token_request, timeout=timeout) as response:  # noqa: S310
        token = response.read().decode()
    request = urllib.request.Request(f"{endpoint}/latest/meta-data/spot/instance-action",  # noqa: S310
                                     headers={"X-aws-ec2-metadata-token": token})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            return json.loads(response.read().decode() or "{}")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def node_endpoint(endpoint: str) -> str:
    """The metadata service this node asks: the standard AWS_EC2_METADATA_SERVICE_ENDPOINT (as the
    AWS SDKs honour it) in place of a cloud's own, which is at a link-local address (as EC2's is);
    any other endpoint (a simulated one, FTC_IMDS_ENDPOINT's) as given."""
    try:
        cloud_own = ipaddress.ip_address(urllib.parse.urlsplit(endpoint).hostname or "").is_link_local
    except ValueError:  # a host name: not a link-local address
        cloud_own = False
    return (os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT") or endpoint) if cloud_own else endpoint


class Watcher(threading.Thread):
    """Polls for a notice in the background; `notice` holds the first one seen.
    A metadata service that does not answer is retried, never fatal: training goes on."""

    def __init__(self, endpoint: str, interval: float = POLL_SECONDS):
        super().__init__(name="spot-watch", daemon=True)
        self.endpoint, self.interval = node_endpoint(endpoint).rstrip("/"), interval
        self.notice: dict | None = None
        self._stop = threading.Event()

    def run(self) -> None:
        while not self._stop.is_set() and self.notice is None:
            try:
                self.notice = interruption_notice(self.endpoint)
            except (OSError, ValueError):
                pass  # not answering, or no notice yet that parses: asked again at the next poll
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
