"""The orchestrator: up (launch, wait, bootstrap), down and status, with rollback; and the
lifecycle that `ftc run` and `ftc sweep` share: ensure a cluster of a size, recreate it (after
a spot reclaim, or at another size), release it at the end.

`up` owns the teardown on failure: any exception, Ctrl-C or SIGTERM between the
first resource and a running cluster terminates whatever was created, and a
second Ctrl-C during that cleanup is ignored until it finishes.
"""

import shutil
import signal
import time
from contextlib import contextmanager
from typing import Iterator

from . import providers
from . import state as st
from .errors import UsageError
from .spec import ClusterSpec
from .ui import console


@contextmanager
def shielded() -> Iterator[None]:
    """Let cleanup finish: Ctrl-C and SIGTERM are noted, not obeyed, until the block ends."""
    def note(signum, frame):
        console.print("[yellow]cleanup in progress; it finishes before ftc exits[/]")
    old_int = signal.signal(signal.SIGINT, note)
    old_term = signal.signal(signal.SIGTERM, note)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)


def up(spec: ClusterSpec, bootstrap: bool = True, yes: bool = False) -> st.ClusterState:
    if st.exists(spec.name):
        existing = st.load(spec.name)
        raise UsageError(f"NAME={spec.name!r} already exists ({existing.provider}, {existing.phase}); "
                         f"use it, or remove it first with `make destroy NAME={spec.name}`")
    provider = providers.get(spec.provider)
    state = st.ClusterState(name=spec.name, provider=spec.provider, spec=spec.to_dict())
    with st.locked(spec.name, "up", create=True):
        try:
            if hasattr(provider, "confirm"):
                provider.confirm(state, yes=yes)
        except BaseException:
            shutil.rmtree(st.cluster_dir(spec.name), ignore_errors=True)  # refused: leave nothing behind
            raise
        st.save(state)
        try:
            console.print(f"launching {spec.nodes} {spec.provider} node(s) for cluster [bold]{spec.name}[/]")
            provider.launch(state)
            provider.wait(state)
            state.phase = "running"
            st.save(state)
        except BaseException as exc:
            why = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"failed ({type(exc).__name__}: {exc})"
            console.print(f"[red]up {why}; rolling back everything it created[/]")
            with shielded():
                _teardown(state, provider)
            console.print(f"cluster [bold]{spec.name}[/] rolled back: nothing left running")
            raise
    if bootstrap:
        from .bootstrap import bootstrap as run_bootstrap
        run_bootstrap(spec.name)
    return st.load(spec.name)


def _teardown(state: st.ClusterState, provider) -> None:
    state.phase = "terminating"
    st.save(state)
    provider.terminate(state)
    shutil.rmtree(st.cluster_dir(state.name), ignore_errors=True)


def down(name: str, provider_name: str | None = None, region: str | None = None) -> None:
    """Works from good state, corrupt state, or none: then by tags (AWS, when credentials
    are configured) and by the sshd configs under the cluster's dir (local)."""
    with st.locked(name, "down", create=True):
        try:
            states = [st.load(name)]
        except (UsageError, st.CorruptState) as exc:
            candidates = [provider_name] if provider_name else ["local"] + (["aws"] if _aws_credentials() else [])
            where = ", ".join(candidates) + (f" ({region or ClusterSpec.region})" if "aws" in candidates else "")
            reason = "no local state" if isinstance(exc, UsageError) else str(exc)
            console.print(f"[yellow]{reason} for {name!r}; looking for its resources in {where}[/]")
            states = [st.ClusterState(name=name, provider=p, spec=ClusterSpec(
                name=name, provider=p, region=region or ClusterSpec.region).to_dict()) for p in candidates]
        with shielded():
            for state in states:
                _teardown(state, providers.get(state.provider))
    console.print(f"cluster [bold]{name}[/] is gone: nothing left running")


def ensure(spec: ClusterSpec, yes: bool = False) -> st.ClusterState:
    """A bootstrapped cluster of spec.nodes nodes under spec.name: reused when it has that size and is
    bootstrapped, else made anew."""
    if not st.exists(spec.name):
        return up(spec, bootstrap=True, yes=yes)
    current = st.load(spec.name)
    if len(current.nodes) == spec.nodes and current.phase == "bootstrapped":
        console.print(f"reusing cluster {spec.name} ({spec.nodes} node(s))")
        return current
    if len(current.nodes) == spec.nodes:
        console.print(f"{spec.name} is {current.phase}, not bootstrapped; recreating it")
    else:
        console.print(f"{spec.name} has {len(current.nodes)} node(s); recreating it with {spec.nodes}")
    return recreate(spec, yes)


def recreate(spec: ClusterSpec, yes: bool = False) -> st.ClusterState:
    """Tear down whatever is under spec.name (shielded: a Ctrl-C cannot stop it half-way), then
    bring up and bootstrap spec."""
    with shielded():
        down(spec.name)
    return up(spec, bootstrap=True, yes=yes)


def release(name: str, keep: bool) -> None:
    """The end of a one-shot run or a sweep, success or not: the cluster stays when asked to,
    else it is torn down, shielded. A cluster that is not there (its `up` rolled back, or was
    refused) is left alone, so a refusal stays one line."""
    if not st.exists(name):
        return
    if keep:
        console.print(f"KEEP=1: cluster {name} stays; `make destroy NAME={name}` when done")
        return
    with shielded():
        down(name)


def _aws_credentials() -> bool:
    import boto3
    return boto3.session.Session().get_credentials() is not None


def status(name: str) -> tuple[st.ClusterState, list[providers.NodeStatus]]:
    state = st.load(name)
    return state, providers.get(state.provider).query(state)


def hours_up(state: st.ClusterState) -> float:
    return (time.time() - state.created_at) / 3600
