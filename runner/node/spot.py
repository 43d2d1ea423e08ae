"""Spot interruption notices: a node hears that its capacity is being reclaimed, and the job stops in time.

A provider's World names its SpotReader: a function of a node program (standard library only) that asks
the cloud's metadata service once, and where that service is. EC2's is IMDSv2 (`imds_v2` below), which
announces a reclaim two minutes ahead at /latest/meta-data/spot/instance-action (404 until then); another
cloud's reader lives in its provider's own module, shipped with the node programs. One thread per node
(local rank 0) polls it; the training loop asks every step whether any node has seen one, checkpoints
where it stands and exits with protocol.EXIT_PREEMPTED, and `ftc run` recreates the cluster and resumes.
The controller hands the reader to the job as one value (SpotReader.watch), the node reads it back
(SpotReader.parse). Standard library only: this runs on the nodes.
"""

import ipaddress
import json
import os
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from importlib import import_module
from typing import Callable

POLL_SECONDS = 5.0
NoticeReader = Callable[[str, float], dict | None]  # (endpoint, timeout) -> the pending notice, or None


@dataclass(frozen=True)
class SpotReader:
    """How a spot node of one provider hears its reclaim notice."""
    read: str  # "module:function", a NoticeReader importable on the nodes (runner.node.spot:imds_v2)
    endpoint: str  # where it asks: EC2's metadata service, http://169.254.169.254

    @property
    def watch(self) -> str:
        """The one value the job passes to its nodes: read@endpoint (a module path holds no '@')."""
        return f"{self.read}@{self.endpoint}"

    @staticmethod
    def parse(watch: str) -> "SpotReader":
        """The reader a job was given (`watch`); ValueError for anything but read@endpoint."""
        read, at, endpoint = watch.partition("@")
        module, colon, function = read.partition(":")
        if not (at and colon and module and function and endpoint):
            raise ValueError(f"{watch!r} is not a spot reader; allowed: module:function@endpoint")
        return SpotReader(read, endpoint)

    def reader(self) -> NoticeReader:
        """The function itself, imported here: a reader that is not there fails the job at its start."""
        module, _, function = self.read.partition(":")
        return getattr(import_module(module), function)


def imds_v2(endpoint: str, timeout: float = 2.0) -> dict | None:
    """EC2's pending instance-action ({"action": "terminate", "time": ...}) or None.
    IMDSv2: a session token first (the nodes require it), then the read."""
    endpoint = node_endpoint(endpoint).rstrip("/")
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


IMDS_V2 = f"{__name__}:{imds_v2.__name__}"  # SpotReader.read of EC2's metadata service


def node_endpoint(endpoint: str) -> str:
    """The metadata service this node asks: the standard AWS_EC2_METADATA_SERVICE_ENDPOINT (as the
    AWS SDKs honour it) in place of a cloud's own, which is at a link-local address (as EC2's is);
    any other endpoint (a simulated one, as the tests give) as given."""
    try:
        cloud_own = ipaddress.ip_address(urllib.parse.urlsplit(endpoint).hostname or "").is_link_local
    except ValueError:  # a host name: not a link-local address
        cloud_own = False
    return (os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT") or endpoint) if cloud_own else endpoint


class Watcher(threading.Thread):
    """Polls the reader a job was given (`watch`: SpotReader.watch) in the background; `notice` holds the
    first notice seen. A metadata service that does not answer is retried, never fatal: training goes on."""

    def __init__(self, watch: str, interval: float = POLL_SECONDS):
        super().__init__(name="spot-watch", daemon=True)
        given = SpotReader.parse(watch)
        self.read, self.endpoint, self.interval = given.reader(), given.endpoint, interval
        self.notice: dict | None = None
        self._stop_asked = threading.Event()  # not `_stop`: Thread's own method of that name ends a join()

    def poll(self) -> None:
        """One read; a notice found is kept in `notice`."""
        try:
            self.notice = self.notice or self.read(self.endpoint, 2.0)
        except (OSError, ValueError, KeyError):
            pass  # not answering, or no notice yet that parses: asked again at the next poll

    def start(self) -> None:
        """The first read here, before the thread: a notice given before the job started is seen before its
        first step, so the job stops after that step rather than whenever the thread first runs."""
        self.poll()
        super().start()

    def run(self) -> None:
        while not self._stop_asked.is_set() and self.notice is None:
            self.poll()
            self._stop_asked.wait(self.interval)

    def stop(self) -> None:
        self._stop_asked.set()
