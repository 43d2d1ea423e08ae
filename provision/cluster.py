"""The orchestrator: up (launch, wait, bootstrap), down and status, with rollback; and the
lifecycle that `ftc run` and `ftc sweep` share: ensure a cluster of a size, recreate it (after
a spot reclaim, or at another size), release it at the end.

`up` owns the teardown on failure: any exception, Ctrl-C or SIGTERM between the
first resource and a running cluster terminates whatever was created, and a
second Ctrl-C during that cleanup is ignored until it finishes.
"""

import errno
import shutil
import signal
import time
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Iterator

from rich.markup import escape

from . import providers
from . import state as st
from .errors import UsageError, command
from .providers import names, spec_world, traits, world
from .spec import ClusterSpec
from .ui import console
from .values import label

if TYPE_CHECKING:
    from .ssh import NodeConnections


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
    """`ftc up`: create the nodes, then bootstrap them. An interrupted bootstrap leaves the cluster
    running (its nodes are fine; only the stack is unfinished), and says how to go on or remove it."""
    if not bootstrap:
        _create(spec, yes)
        return st.load(spec.name)
    try:
        return _bootstrapped(spec, yes)
    except KeyboardInterrupt:
        if st.exists(spec.name):  # else `_create` rolled back, and said so
            console.print(f"[yellow]{escape(still_runs(spec))}[/]", soft_wrap=True)
        raise


def still_runs(spec: ClusterSpec) -> str:
    """What an interrupted bootstrap leaves, and the two ways on. Pure."""
    billed = ", billed while they run" if traits(spec.provider).billed else ""
    return (f"cluster {spec.name} still runs ({spec.nodes} {spec.provider} node(s){billed}), not bootstrapped: "
            f"`{command('bootstrap', name=spec.name)}` continues, `{command('down', name=spec.name)}` removes it")


def _create(spec: ClusterSpec, yes: bool = False) -> None:
    """Launch the nodes and wait for them; any failure or interruption rolls back everything created."""
    if st.exists(spec.name):
        existing = st.load(spec.name)
        raise UsageError(st.half_made(existing) or f"{label('name')}={spec.name!r} already exists "
                         f"({existing.provider}, {existing.phase}); use it, or remove it first with "
                         f"`{command('down', name=spec.name)}`")
    _check_settings(spec.provider)
    state = st.ClusterState(name=spec.name, provider=spec.provider, spec=spec.to_dict())
    with st.locked(spec.name, "up", create=True):
        try:
            providers.confirm(state, yes=yes)
        except BaseException:
            shutil.rmtree(st.cluster_dir(spec.name), ignore_errors=True)  # refused: leave nothing behind
            raise
        st.save(state)
        try:
            console.print(f"launching {spec.nodes} {spec.provider} node(s) for cluster [bold]{escape(spec.name)}[/]")
            record = partial(st.save, state)  # the provider calls it after each id it makes, before going on
            providers.launch(state, record)
            providers.wait(state, record)
            state.phase = "running"
            st.save(state)
        except BaseException as exc:
            why = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"failed ({type(exc).__name__}: {exc})"
            console.print(f"[red]up {escape(why)}; rolling back everything it created[/]")
            with shielded():
                _terminate(state)
                shutil.rmtree(st.cluster_dir(state.name), ignore_errors=True)
            console.print(f"cluster [bold]{escape(spec.name)}[/] rolled back: nothing left running")
            raise


def _check_settings(provider: str) -> None:
    """FTC_HOME and every FTC_* tuning variable that creating and bootstrapping will read, checked
    before anything exists: a bad one is one line (exit 2), never a failure once nodes run."""
    from . import bootstrap
    st.check_home()
    bootstrap.check_settings()
    providers.check_settings(provider)


def _terminate(state: st.ClusterState) -> None:
    """Mark the state first (a job's follower sees the cluster go), then delete what it names. On a
    full disk the mark is skipped: removing the nodes (billed, on AWS) must not wait on a write."""
    state.phase = "terminating"
    try:
        st.save(state)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        console.print(f"[yellow]no space left to mark {escape(state.name)} as terminating; removing its nodes anyway[/]")
    providers.terminate(state, partial(_record_what_is_left, state))


def _record_what_is_left(state: st.ClusterState) -> None:
    """After a terminate that could not remove everything: the state names what a later `down` can
    still remove; with no node of it left, the cluster is forgotten."""
    if state.nodes:
        st.save(state)
    else:
        shutil.rmtree(st.cluster_dir(state.name), ignore_errors=True)


def down(name: str, provider_name: str | None = None, region: str | None = None) -> None:
    """Works from good state, corrupt state, or none: then by tags (AWS) and by the sshd configs under
    the cluster's dir (local). The directory goes once every provider is done: when one could not be
    asked (AWS unreachable), its error says so and the directory stays, so `ftc down` again retries.
    A state whose provider is not registered here is refused, and nothing changes (st.UnregisteredProvider)."""
    with st.locked(name, "down", create=True):
        states, unsearched = _states_to_remove(name, provider_name, region)
        for state in states:  # a bad tuning variable is refused before anything is removed
            _check_settings(state.provider)
        with shielded():
            for state in states:
                _terminate(state)
            shutil.rmtree(st.cluster_dir(name), ignore_errors=True)
    console.print(escape(unsearched) or f"cluster [bold]{escape(name)}[/] is gone: nothing left running", soft_wrap=True)


def _states_to_remove(name: str, provider_name: str | None, region: str | None) -> tuple[list[st.ClusterState], str]:
    """The state, or, when it is missing or does not load, one per place to search; and, when nothing
    says where the cluster ran and AWS is not searched for want of credentials, the closing line that
    says so ('' otherwise). A state whose provider is not registered here is refused: only that
    provider can find the nodes, and removing the state would leave them running with nothing naming them."""
    try:
        return [st.load(name)], ""
    except st.UnregisteredProvider:
        raise
    except (UsageError, st.CorruptState) as exc:
        reason = "no local state" if isinstance(exc, UsageError) else str(exc)
    recorded = st.recorded_place(name)
    st.clear_unloadable(name)
    askable = [p for p in names() if provider_name is None and traits(p).found_by_tag and providers.has_credentials(p)]
    places, region = search_places(provider_name, region, recorded, askable)
    where = ", ".join(places) + (f" ({region})" if any(world(p).regions for p in places) else "")
    console.print(f"[yellow]{escape(reason)} for {escape(repr(name))}; looking for its resources in {escape(where)}[/]",
                  soft_wrap=True)
    states = [st.ClusterState(name=name, provider=p, spec=ClusterSpec(name=name, provider=p, region=region).to_dict())
              for p in places]
    if recorded.get("name", name) != name:  # a copied or renamed directory: the nodes are another name's
        other = recorded["name"]
        return states, (f"cluster {name}: nothing under this name is left running; its state records cluster "
                        f"{other!r}, whose nodes may still run: `{command('down', name=other)}` removes them")
    said_where = provider_name or recorded.get("provider") in names()  # told, or the broken state still says
    by_tag = [p for p in names() if traits(p).found_by_tag and p not in places]  # where it may run, not searched
    unsearched = "" if said_where or not by_tag else (
        f"cluster {name}: nothing of it is left running on this machine; {world(by_tag[0]).title} was not searched "
        f"(no credentials): if it ran there, `{command('down', name=name, provider=by_tag[0], region=region)}` "
        "with credentials removes what is tagged with it")
    return states, unsearched


def search_places(provider_flag: str | None, region_flag: str | None, recorded: dict[str, str],
                  askable: list[str]) -> tuple[list[str], str]:
    """Where `down` looks for a cluster whose state is missing or does not load, and in which AWS region:
    the provider it is told; else this machine's local nodes, the provider the broken state records,
    and those that find a cluster by its tags and can be asked (`askable`: AWS with credentials). The
    region: told, else the recorded one, else the default. Pure."""
    recorded_provider = recorded.get("provider") if recorded.get("provider") in names() else None
    owner = spec_world(provider_flag or recorded_provider or ClusterSpec.provider)  # whose regions these are
    region = region_flag or (recorded.get("region") if recorded.get("region") in owner.regions else owner.default_region)
    if provider_flag:
        return [provider_flag], region
    places = [p for p in names() if traits(p).shares_this_machine or p == recorded_provider or p in askable]
    return places, region


def ensure(spec: ClusterSpec, yes: bool = False) -> st.ClusterState:
    """A bootstrapped cluster of spec.nodes nodes under spec.name: reused when it has that size and is
    bootstrapped, else made anew."""
    if not st.exists(spec.name):
        return _bootstrapped(spec, yes)
    current = st.load(spec.name)
    if len(current.nodes) == spec.nodes and current.phase == "bootstrapped":
        console.print(f"reusing cluster {spec.name} ({spec.nodes} node(s))", markup=False)
        return current
    if len(current.nodes) == spec.nodes:
        console.print(f"{spec.name} is {current.phase}, not bootstrapped; recreating it", markup=False)
    else:
        console.print(f"{spec.name} has {len(current.nodes)} node(s); recreating it with {spec.nodes}", markup=False)
    return recreate(spec, yes)


def recreate(spec: ClusterSpec, yes: bool = False, connections: "NodeConnections | None" = None) -> st.ClusterState:
    """Tear down whatever is under spec.name (shielded: a Ctrl-C cannot stop it half-way), then
    bring up and bootstrap spec; the bootstrap's logins kept in `connections` where given (`ftc run`'s)."""
    with shielded():
        down(spec.name)
    return _bootstrapped(spec, yes, connections)


def _bootstrapped(spec: ClusterSpec, yes: bool, connections: "NodeConnections | None" = None) -> st.ClusterState:
    """Up and bootstrapped, for `ftc run` and `ftc sweep`: they release the cluster whatever stops
    them, so an interrupted bootstrap here has nothing to say of its own."""
    from .bootstrap import bootstrap as run_bootstrap
    _create(spec, yes)
    run_bootstrap(spec.name, connections)
    return st.load(spec.name)


def release(name: str, keep: bool) -> None:
    """The end of a one-shot run or a sweep, success or not: the cluster stays when asked to,
    else it is torn down, shielded. A cluster that is not there (its `up` rolled back, or was
    refused) is left alone, so a refusal stays one line."""
    if not st.exists(name):
        return
    if keep:
        console.print(f"{label('keep')}: cluster {name} stays; `{command('down', name=name)}` when done", markup=False)
        return
    with shielded():
        down(name)


def status(name: str) -> tuple[st.ClusterState, list[providers.NodeStatus]]:
    state = st.load(name)
    return state, providers.query(state)


def hours_up(state: st.ClusterState) -> float:
    return (time.time() - state.created_at) / 3600
