"""`ftc`: the one command. The Makefile's targets are thin wrappers over its subcommands.

Exit codes: 0 ok, 1 the work failed, 2 bad input (nothing created or changed),
3 the cluster is busy with another ftc command, 75 a job stopped for a spot interruption after a
checkpoint (resumable), 130 interrupted.
"""

import argparse
import errno
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Mapping

from rich.markup import escape

from provision import state as st
from provision.errors import EXIT_INTERRUPTED, FtcError, UsageError, command
from provision.spec import (
    MAX_NODES,
    PARSERS,
    ClusterSpec,
    every_parser,
    load_config,
    parsers_for,
    resolve_spec,
)
from provision.ui import answer, console
from provision.values import boolean, label, number, whole_list, writable_dir
from runner.cli_parser import TORCHRUN_OPTIONS, build_parser
from runner.plan_command import cmd_plan, plan_the_cluster


def _cluster_name(args: argparse.Namespace) -> str:
    """--name, else $FTC_NAME, else the only cluster there is (said on stderr), else 'ftc'."""
    given = args.name or os.environ.get("FTC_NAME")
    if not given:
        names = st.all_names()
        if len(names) == 1:
            console.print(f"cluster {names[0]} (the only one)", markup=False)
            return names[0]
    return PARSERS["name"]("name", given or "ftc")


def _switch(args: argparse.Namespace, key: str, from_env: bool = False) -> bool:
    """A 1/0 flag through the one boolean parser: its value, else $FTC_<KEY> where that is read, else off."""
    raw = getattr(args, key)
    if raw is None:
        raw = os.environ.get(f"FTC_{key.upper()}", "0") if from_env else "0"
    return boolean(key, raw)


def _spec_from(args: argparse.Namespace) -> ClusterSpec:
    """The cluster spec of up, run and sweep; SPOT=1 where nothing watches spot notices gets a note."""
    flags = {key: getattr(args, key) for key in every_parser()}
    spec = resolve_spec(flags, os.environ, load_config(args.config, os.environ))
    note = unwatched_spot(spec, os.environ)
    if note:
        console.print(note, style="yellow", markup=False, soft_wrap=True)
    return spec


def unwatched_spot(spec: ClusterSpec, env: Mapping[str, str]) -> str:
    """The note for SPOT=1 where its jobs would watch no notice (jobspec.spot_watch: the provider's World
    has no spot-notice reader); '' otherwise. Pure, given `env`."""
    from runner.jobspec import spot_watch
    watched = spot_watch(spec.provider, spec.spot, env)  # a bad reader given is refused here, before anything starts
    if not spec.spot or watched:
        return ""
    return (f"note: {label('spot')}=1 on {label('provider')}={spec.provider}: no spot notices are watched there "
            "(its provider has no spot-notice reader); jobs run as on any other node")


def cmd_up(args: argparse.Namespace) -> int:
    from provision import cluster
    plan_the_cluster(args)
    spec = _spec_from(args)
    bootstrap = boolean("bootstrap", args.bootstrap if args.bootstrap is not None else "1")
    yes = _switch(args, "yes", from_env=True)
    if args.dry_run:
        from provision import providers
        if not providers.supports(spec.provider, "dry_run"):
            raise UsageError(f"--dry-run is not available for {label('provider')}={spec.provider!r}; allowed: "
                             f"{label('provider')}={' or '.join(providers.providers_with('dry_run'))}")
        providers.dry_run(spec)
        return 0
    state = cluster.up(spec, bootstrap=bootstrap, yes=yes)
    if not bootstrap:  # a job needs the stack first
        console.print(f"cluster [bold]{state.name}[/] is {state.phase}: {len(state.nodes)} node(s), not bootstrapped; "
                      f"next: `{command('bootstrap', name=state.name)}`")
        return 0
    from runner.jobspec import hub_reachable
    offline = {} if hub_reachable() else {"model": "auto", "data_dir": "auto"}  # the packaged MiniLM, ../shared's GLUE
    console.print(f"cluster [bold]{state.name}[/] is {state.phase}: {len(state.nodes)} node(s); "
                  f"next: `{command('finetune', name=state.name, **offline)}` or "
                  f"`{command('ssh', name=state.name)}`")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from provision import cluster
    provider = PARSERS["provider"]("provider", args.provider) if args.provider else None
    region = (parsers_for(provider) if provider else PARSERS)["region"]("region", args.region) if args.region else None
    cluster.down(_cluster_name(args), provider, region)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """One cluster (--name), or every cluster: tables, or JSON with --json, on stdout."""
    from provision import cluster
    if args.name is None and not os.environ.get("FTC_NAME"):
        names = st.all_names()
        if not names and not args.json:
            console.print(f"no clusters; start one with `{command('up')}`")
        failed, found = 0, []
        for name in names:
            try:
                found.append(cluster.status(name))
                if not args.json:
                    _print_status(*found[-1])
            except Exception as exc:  # noqa: BLE001 - one bad cluster must not hide the others: one line each
                failed += 1
                why = exc if isinstance(exc, (FtcError, st.CorruptState)) else \
                    f"cluster {name}: {type(exc).__name__}: {exc}"
                cleans = "" if isinstance(exc, st.UnregisteredProvider) else \
                    f"; `ftc down --name {name}` still cleans up"  # `down` refuses it too
                print(f"error: {why}{cleans}", file=sys.stderr)
        if args.json:
            print(json.dumps([_status_json(*pair) for pair in found], indent=2, allow_nan=False))
        return 1 if failed else 0
    state, nodes = cluster.status(_cluster_name(args))
    if args.json:
        print(json.dumps(_status_json(state, nodes), indent=2, allow_nan=False))
        return 0
    _print_status(state, nodes)
    return 0


def _status_json(state: st.ClusterState, nodes) -> dict:
    data = json.loads(state.to_json())
    for node, live in zip(data["nodes"], nodes):
        node["live"] = live.state
    data["launched_not_joined"] = [{"id": live.id, "live": live.state} for live in nodes[len(state.nodes):]]
    return data


def _print_status(state: st.ClusterState, nodes) -> None:
    from rich.table import Table

    from provision.cluster import hours_up
    from provision.providers import traits, world
    spec = state.cluster_spec
    hours = hours_up(state)
    cost = ""
    if traits(state.provider).billed:
        price = world(state.provider).usd_per_node_hour(spec.instance_type)  # state on disk may name any type
        billing = [live for live in nodes if live.state in ("running", "unknown")]  # unknown: it may run
        cost = f", {len(billing)} billed, about ${hours * len(billing) * price:.2f} so far" if price is not None else \
            f", cost unknown ({spec.instance_type!r} is not in ftc's catalog)"
    elif world(state.provider).cost_note:
        cost = f", {world(state.provider).cost_note}"
    table = Table(title=escape(f"{state.name}: {state.provider}, {state.phase}, up {hours * 60:.0f} min{cost}"),
                  title_justify="left")
    for column in ("node", "id", "address", "ssh", "state", "detail"):
        table.add_column(column)
    for node, live in zip(state.nodes, nodes):
        table.add_row(*map(escape, (node.name, node.id, f"{node.public_ip} / {node.private_ip}",
                                    f"{node.ssh_user}@{node.public_ip}:{node.ssh_port}", live.state, live.detail)))
    for live in nodes[len(state.nodes):]:  # launched, never joined: the `up` that made it stopped
        table.add_row(*map(escape, ("(not joined)", live.id, "-", "-", live.state, live.detail)))
    answer.print(table)
    unfinished = st.half_made(state)
    if unfinished:
        console.print(unfinished, style="yellow", markup=False, soft_wrap=True)
    differs = [f"{n.name} is {live.state}" for n, live in zip(state.nodes, nodes) if live.state != "running"]
    if differs and state.phase in ("running", "bootstrapped"):
        console.print(f"[yellow]state says {state.phase}, but {'; '.join(differs)}[/]: "
                      f"`ftc down --name {state.name}` removes the cluster; `ftc up` then makes it anew")
    from runner.job import describe_jobs
    describe_jobs(state, nodes)


def cmd_bootstrap(args: argparse.Namespace) -> int:
    name = _cluster_name(args)
    if args.bootstrapper not in ("fabric", "ansible"):
        raise UsageError(f"{label('with')}={args.bootstrapper!r} is not known; allowed: fabric, ansible")
    from provision.providers import traits
    state = st.load(name)
    if args.bootstrapper == "ansible" and traits(state.provider).user_login:
        raise UsageError(f"{label('with')}='ansible' is not available for your own servers (provider ssh): its "
                         f"inventory logs in with a cluster key they do not have; use {label('with')}=fabric "
                         "(the default)")
    if args.bootstrapper == "ansible":
        from provision.inventory import run_playbook
        return run_playbook(name)
    from provision.bootstrap import bootstrap
    bootstrap(name)
    return 0


def cmd_ssh(args: argparse.Namespace) -> int:
    from provision.ssh import ssh_command
    state = st.load(_cluster_name(args))
    try:
        index = int(args.node)
    except ValueError:
        raise UsageError(f"{label('node')}={args.node!r} is not a node index; allowed: 0..{len(state.nodes) - 1}") \
            from None
    if not 0 <= index < len(state.nodes):
        raise UsageError(f"{label('node')}={args.node!r} is not a node of {state.name}; "
                         f"allowed: 0..{len(state.nodes) - 1}")
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    argv = ssh_command(state, state.nodes[index], cmd)
    sys.stdout.flush()
    os.execvp(argv[0], argv)  # noqa: S606 - hands the terminal to ssh
    return 0


def cmd_finetune(args: argparse.Namespace) -> int:
    from runner import job, jobspec
    resume = _switch(args, "resume")
    return job.finetune(_cluster_name(args), jobspec.job_from_args(args, resume), render_only=args.render_only,
                        resume=resume, detach=_switch(args, "detach"))


def cmd_launch(args: argparse.Namespace) -> int:
    import shlex

    from runner import job, script_job
    habit = next((name for name in TORCHRUN_OPTIONS if getattr(args, f"torchrun_{name.replace('-', '_')}") is not None),
                 None)
    if habit:
        raise UsageError(f"--{habit} is torchrun's option, not ftc launch's: {TORCHRUN_OPTIONS[habit]}; "
                         "`ftc launch --name X [--ppn N] -- train.py ARGS`")
    words = args.command_line[1:] if args.command_line[:1] == ["--"] else args.command_line
    if args.script is not None:  # from make: SCRIPT and ARGS
        try:
            words = [args.script, *shlex.split(args.args or "")]
        except ValueError as exc:
            fix = ("its last backslash escapes nothing: drop it, or write \\\\ for a backslash"
                   if "escaped" in str(exc) else "close its quotes")
            raise UsageError(f"{label('args')}={args.args!r} cannot be split into words ({exc}); {fix}") from None
    if words[:1] and words[0].startswith("-"):
        if args.script is not None:
            raise UsageError(f"{label('script')}={words[0]!r} looks like an option; give your script's path")
        raise UsageError(f"the script {words[0]!r} looks like an option; put ftc's options before `--` and the "
                         "script after it: `ftc launch --name X -- train.py --epochs 1`")
    script = script_job.validate(words[0] if words else "", words[1:], workdir=args.workdir, output=args.output,
                                 ppn=args.ppn, requirements=args.requirements, env=args.env,
                                 max_workdir_mb=args.max_workdir_mb, data=args.data)
    return job.run_job(_cluster_name(args), script, args.render_only, _switch(args, "detach"))


def cmd_run(args: argparse.Namespace) -> int:
    from runner import jobspec, oneshot
    spec = _spec_from(args)
    yes, keep, resume = _switch(args, "yes", from_env=True), _switch(args, "keep"), _switch(args, "resume")
    return oneshot.run_one_shot(spec, jobspec.job_from_args(args, resume), yes=yes, keep=keep, resume=resume)


def cmd_sweep(args: argparse.Namespace) -> int:
    from runner import jobspec, sweep
    node_counts = whole_list(1, MAX_NODES, distinct=True)("nodes", args.nodes or "1,2,4")
    spec = _spec_from(argparse.Namespace(**{**vars(args), "nodes": str(node_counts[0])}))
    yes, keep = _switch(args, "yes", from_env=True), _switch(args, "keep")
    job_spec = jobspec.job_from_args(args)
    if job_spec.results:
        raise UsageError("RESULTS is per job; a sweep writes each size's results under --out")
    from runner.runs import runs_root, utc_stamp
    default_out = runs_root() / spec.name / f"sweep-{job_spec.task}-{utc_stamp()}"  # a new one each time
    out = Path(writable_dir("out", args.out or str(default_out)))
    return sweep.sweep(spec, job_spec, node_counts, out, keep=keep, yes=yes)


def cmd_runs(args: argparse.Namespace) -> int:
    """The history: a table (or --json) of every run; `show ID` writes its report; `compare ID ID ...`."""
    from runner import report, runs
    if args.runs_command == "show":
        run = runs.find(args.run)
        md, png = report.show(run)
        answer.print(f"report: {md}\nplot: {png}", markup=False, soft_wrap=True)
        return 0
    if args.runs_command == "compare":
        if args.out is not None and not args.out.strip():
            raise UsageError(f"{label('out')}='' is empty; give a file name ending in .png, or leave {label('out')} out")
        if len(args.run) < 2:
            raise UsageError(f"run {args.run[0]!r} alone: compare needs two or more runs; allowed: ids from `ftc runs`")
        found = [runs.find(ref) for ref in args.run]
        chosen = list({run["results_dir"]: run for run in found}.values())  # a run named twice is one run
        if len(chosen) < 2:
            raise UsageError(f"runs {' '.join(args.run)!r} name one run; compare needs two or more different runs; "
                             "allowed: ids from `ftc runs`")
        out = Path(args.out) if args.out else \
            runs.runs_root() / "compare" / ("_vs_".join(r["id"] for r in chosen)[:200] + ".png")
        if out.suffix.lower() != ".png" or out.is_dir():
            what = "is a directory" if out.is_dir() else "is not a .png path"
            raise UsageError(f"{label('out')}={str(out)!r} {what}; give a file name ending in .png")
        writable_dir("out", str(out.parent))
        report.compare(chosen, out)
        answer.print(f"plot: {out}", markup=False, soft_wrap=True)
        return 0
    found = runs.all_runs()
    for run in found:
        if run["problem"]:
            console.print(f"{run['results_dir']}: corrupt run ({run['problem']}); fix or remove its files",
                          markup=False, soft_wrap=True)
    if args.json:
        print(json.dumps(found, indent=2, allow_nan=False))
    elif found:
        answer.print(report.runs_table(found, f"{len(found)} run(s), newest first; `ftc runs show ID` for one",
                                       answer.width))
        # every run writes event files into its results directory's tensorboard/
        console.print(f"every run's curves side by side: `tensorboard --logdir {runs.runs_root()}`", markup=False,
                      soft_wrap=True)
    else:
        console.print(f"no runs under {runs.runs_root()} yet; `make demo` makes one", markup=False)
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from runner import job
    return job.logs(_cluster_name(args), args.follow)


def cmd_cancel(args: argparse.Namespace) -> int:
    from runner import job
    return job.cancel(_cluster_name(args))


def cmd_fetch(args: argparse.Namespace) -> int:
    from runner import job
    return job.fetch_last(_cluster_name(args))


def cmd_extend(args: argparse.Namespace) -> int:
    from provision import providers
    hours = number(0, 168)("hours", args.hours)  # running nodes: any lifetime from now, as their user decides
    state = st.load(_cluster_name(args))
    if not providers.supports(state.provider, "extend"):
        having = ", ".join(providers.providers_with("extend"))
        raise UsageError(f"{label('name')}={state.name!r} is a {state.provider} cluster, whose nodes have no lifetime "
                         f"watchdog; allowed: a cluster of {having}")
    providers.extend(state, hours)
    return 0


def cmd_inventory(args: argparse.Namespace) -> int:
    from provision.inventory import write_inventory
    path = write_inventory(st.load(_cluster_name(args)), args.out)
    print(path)
    return 0


# The commands that write under FTC_HOME (state, locks, keys, results): an FTC_HOME they cannot write
# is refused before they start, in one line, rather than met half-way through.
WRITE_FTC_HOME = {"up", "down", "bootstrap", "finetune", "launch", "run", "sweep", "cancel", "fetch", "inventory"}
COMMANDS = {"up": cmd_up, "down": cmd_down, "status": cmd_status, "bootstrap": cmd_bootstrap, "ssh": cmd_ssh,
            "finetune": cmd_finetune, "launch": cmd_launch,
            "run": cmd_run, "logs": cmd_logs, "cancel": cmd_cancel, "fetch": cmd_fetch,
            "extend": cmd_extend, "inventory": cmd_inventory, "plan": cmd_plan,
            "sweep": cmd_sweep, "runs": cmd_runs}


def refuse_undecodable_home() -> None:
    """FTC_HOME's path goes into scripts, configs and JSON written as UTF-8: a byte that is not
    UTF-8 would fail half-way through `up` (a node launched, then rolled back)."""
    home = os.environ.get("FTC_HOME", "")
    try:
        os.fsencode(home).decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"FTC_HOME={os.fsencode(home)!r} holds a byte that is not UTF-8; give a path in UTF-8") from None


JOB_COMMANDS = {"finetune", "launch", "run", "fetch"}  # a job may have started: its files wait on the nodes


def disk_full_advice(command: str, where: str) -> str:
    """What a full disk means and what to do next. A job that started keeps its files on the nodes until
    `ftc fetch` (on local nodes on this same disk, under FTC_HOME), and `ftc down` deletes them unfetched:
    running the command again would start another job. Pure."""
    if command in JOB_COMMANDS:
        return (f"no space left on the disk of {where}; free some space, then `ftc fetch` brings a started job's files "
                "home (they wait on the nodes, local nodes' under FTC_HOME on this disk, and `ftc down` deletes them "
                "unfetched); `ftc status` says whether a job ran")
    return (f"no space left on the disk of {where}; free some space and run `ftc {command}` again (`ftc status` says "
            "what is up; `ftc down` works on a full disk)")


def _sigterm_as_interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)  # the same cleanup as Ctrl-C
    started = time.monotonic()
    if argv[:1] == ["bench"]:  # bench has its own options (runner/bench/), also usable without ftc
        from runner import bench
        try:
            return bench.main(argv[1:])
        except KeyboardInterrupt:
            print(f"\ninterrupted after {time.monotonic() - started:.0f}s", file=sys.stderr)
            return EXIT_INTERRUPTED
    try:
        args = build_parser().parse_args(argv)  # its help lists the registry: a bad FTC_PROVIDERS is refused here
        refuse_undecodable_home()
        st.refuse_home_in_node_root()
        if args.command in WRITE_FTC_HOME:
            writable_dir("FTC_HOME", str(st.ftc_home()))
        code = COMMANDS[args.command](args)
    except FtcError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except st.CorruptState as exc:
        print(f"error: {exc}; `ftc down --name NAME` still cleans up", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\ninterrupted after {time.monotonic() - started:.0f}s", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        print(f"error: {disk_full_advice(args.command, exc.filename or str(st.ftc_home()))}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
