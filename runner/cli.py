"""`ftc`: the one command. The Makefile's targets are thin wrappers over its subcommands.

Exit codes: 0 ok, 1 the work failed, 2 bad input (nothing created or changed),
3 the cluster is busy with another ftc command, 130 interrupted.
"""

import argparse
import errno
import json
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Mapping

from rich.markup import escape

from provision import state as st
from provision.errors import FtcError, OneLineParser, UsageError, command
from provision.providers import World, default_world, names
from provision.providers.records import registered
from provision.spec import (
    MAX_NODES,
    PARSERS,
    ClusterSpec,
    env_overrides,
    every_parser,
    load_config,
    parsers_for,
    resolve_spec,
    world_help,
)
from provision.ui import answer, console
from provision.values import boolean, label, number, whole, whole_list, writable_dir
from runner import plan
from runner.jobflags import JOB_FLAG_ALIASES, JOB_FLAGS
from runner.node.recipes import COMPILE_MIN_STEPS, GRAD_COMPRESS, POWERSGD_RANK
from runner.node.units import duration
from runner.plan import SETUP_MINUTES

DEFAULT_WORLD = default_world()  # where INSTANCE_TYPE and REGION default from (of the built-ins: AWS)
SPEC_HELP = {
    "name": "cluster name (default 'ftc')",
    "provider": "where the nodes run: {providers} (default {default})",  # the registry's, when the parser is built
    "nodes": "number of nodes, 1..64 (default 2)",
    "root_volume_gb": "AWS root volume size in GB (default 100)",
    "ena_express": "AWS: 1 or 0, ENA Express (SRD) on the nodes' network interfaces (default: 1 where the type has it)",
    "ssh_cidr": "AWS: who may ssh to the nodes (default: your address /32)",
    "allow_open_ssh": "1: allow --ssh-cidr 0.0.0.0/0",
    "max_hours": "AWS: the nodes power off after this many hours; slurm: the allocation's time limit (default 4)",
    "stack": "software on the nodes: stock (default), intel, or ipex (intel without oneCCL: PyPI only)",
    "hosts": "ssh: your servers as a comma list of [user@]host[:port], node 0 first",
    "ssh_key": "ssh, slurm: the private key that logs in to the nodes (default: your agent and ~/.ssh keys)",
    "stack_python": "ssh, slurm: a Python on every node that already has the stack (default: ftc installs one)",
    "partition": "slurm: the partition to ask for an allocation of NODES nodes",
    "account": "slurm: the account the allocation is charged to (default: the site's)",
    "qos": "slurm: the quality of service of the allocation (default: the site's)",
    "constraint": "slurm: node features the allocation needs, as sbatch --constraint takes them",
    "login": "slurm: user@host[:port] of a login node whose sbatch ftc runs (default: this machine's)",
}


# A switch: bare (`--yes`) is on; with a value (`--yes 0`, YES=0 from make) the one boolean parser reads it.
SWITCH = {"nargs": "?", "const": "1", "metavar": "1|0"}


def _spec_flags(p: argparse.ArgumentParser) -> None:
    """A flag for every setting a spec may be given, the registered providers' own included; the help of
    those a provider decides is the registry's (world_help)."""
    registry = {"providers": ", ".join(names()), "default": ClusterSpec.provider}
    helps = {**SPEC_HELP, **world_help()}
    for key, parse in every_parser().items():
        kind = SWITCH if parse is boolean else {"metavar": key.upper()}
        p.add_argument(f"--{key.replace('_', '-')}", dest=key, default=None, **kind,
                       help=helps.get(key, f"the cluster's {key} setting (README: Variables)").format(**registry))
    p.add_argument("--config", default=None, help="TOML file with cluster settings ([cluster] table)")


def _name_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name", default=None,
                   help="cluster name (default: $FTC_NAME, else the only cluster there is, else 'ftc')")


def _job_flags(p: argparse.ArgumentParser, resume_help: str = "", detach: bool = False) -> None:
    """The job's settings; --resume (with its help) and --detach only where the command honours them. The
    checkpoint stores named are the registry's."""
    stores = "; ".join(f"{p.world.title or p.name}: {p.world.checkpoint_store.allowed}"
                       for p in registered().values() if p.world.checkpoint_store)
    for flag, help_text in JOB_FLAGS.items():
        p.add_argument(f"--{flag.replace('_', '-')}", dest=flag, default=None, metavar=flag.upper(),
                       help=help_text.format(stores=stores))
    for alias, flag in JOB_FLAG_ALIASES.items():
        p.add_argument(f"--{alias.replace('_', '-')}", dest=alias, default=None, metavar=flag.upper(),
                       help=f"the former name of --{flag.replace('_', '-')}")
    if resume_help:  # takes a value too (RESUME=0 from Make): every value is parsed, none dropped
        p.add_argument("--resume", nargs="?", const="1", default=None, metavar="1|0", help=resume_help)
    if detach:
        p.add_argument("--detach", default=None, **SWITCH, help="start the job and return; follow later with `ftc logs`")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="ftc", description="Distributed fine-tuning on Intel Xeon CPU clusters.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    p = sub.add_parser("up", help="create a cluster (and bootstrap it)")
    _spec_flags(p)
    p.add_argument("--task", default=None, help="with --instance-type/--nodes auto: the job the plan sizes the cluster for")
    p.add_argument("--epochs", default=None, help="with auto: the job's epochs (default 3)")
    p.add_argument("--deadline", default=None, help="with auto: the cheapest cluster that trains within this (20m)")
    p.add_argument("--budget", default=None, help="with auto: the fastest cluster within this many dollars")
    p.add_argument("--yes", default=None, **SWITCH, help="skip the confirmation (YES=1)")
    p.add_argument("--bootstrap", default=None, **SWITCH, help="1 (default) or 0: stop once nodes are running")
    p.add_argument("--no-bootstrap", dest="bootstrap", action="store_const", const="0", help="same as --bootstrap 0")
    p.add_argument("--dry-run", action="store_true",
                   help="where the provider has a dry run: check credentials, permissions, quota; create nothing")

    p = sub.add_parser("down", help="delete a cluster and everything it created")
    _name_flag(p)
    p.add_argument("--provider", default=None, help=f"with no local state: where to look ({', '.join(names())})")
    p.add_argument("--region", default=None, help=f"with no local state: the {DEFAULT_WORLD.title} region to search")

    p = sub.add_parser("status", help="what exists, reconciled with the provider")
    _name_flag(p)
    p.add_argument("--json", action="store_true",
                   help="print the state as JSON for scripts (without --name: a list of every cluster)")

    p = sub.add_parser("bootstrap", help="install the stack, keys, hostfile and facts on every node")
    _name_flag(p)
    p.add_argument("--with", dest="bootstrapper", default="fabric", help="fabric (default) or ansible")

    p = sub.add_parser("ssh", help="a shell on a node, or run a command there")
    _name_flag(p)
    p.add_argument("--node", default="0", help="node index (default 0)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ...")

    p = sub.add_parser("finetune", help="fine-tune on every node of the cluster")
    _name_flag(p)
    _job_flags(p, resume_help="continue the cluster's last job from its last checkpoint", detach=True)
    p.add_argument("--render-only", action="store_true", help="print the launch script and stop")

    _launch_parser(sub)

    p = sub.add_parser("run", help="up, bootstrap, finetune, fetch, down: one shot")
    _spec_flags(p)
    _job_flags(p, resume_help="continue from the last checkpoint this controller holds of the task (or in RESULTS)")
    p.add_argument("--yes", default=None, **SWITCH, help="skip the confirmation (YES=1)")
    p.add_argument("--keep", default=None, **SWITCH, help="keep the cluster afterwards (KEEP=1)")

    p = sub.add_parser("sweep", help="the same job on clusters of each size: the 2021 recipe's table, ours beside it")
    _spec_flags(p)
    _job_flags(p)
    p.add_argument("--yes", default=None, **SWITCH, help="skip the confirmation (YES=1)")
    p.add_argument("--keep", default=None, **SWITCH, help="keep the last cluster afterwards (KEEP=1)")
    p.add_argument("--out", default=None,
                   help="where the table and plot go (default $FTC_HOME/runs/<cluster>/sweep-<task>-<UTC time>)")

    for verb, text in (("logs", "show (and with -f follow) the output of the last job"),
                       ("cancel", "stop the running job on every node"),
                       ("fetch", "copy the last job's results to the controller")):
        p = sub.add_parser(verb, help=text)
        _name_flag(p)
        if verb == "logs":
            p.add_argument("-f", "--follow", action="store_true", help="follow a running job until it ends")

    p = sub.add_parser("extend", help="push the nodes' max-lifetime watchdog back")
    _name_flag(p)
    p.add_argument("--hours", default="2", help="hours from now (default 2)")

    p = sub.add_parser("inventory", help="write an Ansible inventory for the cluster")
    _name_flag(p)
    p.add_argument("--out", default=None, help="file to write (default: the cluster's state dir)")

    _plan_parser(sub)
    _runs_parser(sub)
    for name, action in sub.choices.items():  # `ftc up --help` says what `up` does, as `ftc --help` lists it
        action.description = action.description or next(c.help for c in sub._choices_actions if c.dest == name)

    p = sub.add_parser("bench", help="ftc measured beside what users run instead, one mode at a time", add_help=False)
    p.add_argument("bench_args", nargs=argparse.REMAINDER, help="a mode and its options: `ftc bench --help`")
    return parser


# torchrun's own options, and what takes their place under `ftc launch`
TORCHRUN_OPTIONS = {
    "nproc-per-node": "ranks per node are --ppn N",
    "nnodes": "the job runs on every node of the cluster (`ftc up --nodes N` sets how many)",
    "node-rank": "ftc starts every node's ranks itself",
    **dict.fromkeys(("standalone", "master-addr", "master-port", "rdzv-endpoint", "rdzv-backend", "rdzv-id"),
                    "ftc sets MASTER_ADDR and MASTER_PORT itself"),
}


def _launch_parser(sub) -> None:
    p = sub.add_parser("launch", help="run your own training script on every rank: ftc launch -- train.py [ARGS...]")
    _name_flag(p)
    p.add_argument("--workdir", default=None, help="the folder copied to every node (default: the script's own)")
    p.add_argument("--ppn", default=None, help="ranks per node (default: one per socket, as for ftc's jobs)")
    p.add_argument("--output", default=None,
                   help="rank 0's output folder inside the workdir, fetched home (default output); FTC_OUTPUT_DIR")
    p.add_argument("--requirements", default=None,
                   help="a requirements file pip-installed on every node into a venv layered on the stack")
    p.add_argument("--data", action="append", default=[], metavar="PATH",
                   help="a file or folder outside the workdir, copied into its copy under its own name "
                        "(repeatable, or a comma list)")
    p.add_argument("--env", action="append", default=[], metavar="K=V", help="a variable for every rank (repeatable)")
    p.add_argument("--max-workdir-mb", default=None, help="refuse a bigger workdir, in MB (default 200)")
    p.add_argument("--detach", nargs="?", const="1", default=None, metavar="1|0",
                   help="start the job and return; follow later with `ftc logs`")
    p.add_argument("--render-only", action="store_true", help="print the launch script and stop")
    for name in TORCHRUN_OPTIONS:  # given out of habit: refused in cmd_launch, saying what ftc does instead
        p.add_argument(f"--{name}", f"--{name.replace('-', '_')}", dest=f"torchrun_{name.replace('-', '_')}",
                       nargs="?", const="", default=None, help=argparse.SUPPRESS)
    p.add_argument("--script", default=None, help=argparse.SUPPRESS)  # make launch SCRIPT=...
    p.add_argument("--args", default=None, help=argparse.SUPPRESS)  # make launch ARGS='...', split as a shell would
    p.add_argument("command_line", nargs=argparse.REMAINDER, metavar="-- SCRIPT [ARGS...]",
                   help="your script, a path inside the workdir, and its arguments")


def _plan_parser(sub) -> None:
    p = sub.add_parser("plan", help="predicted time and cost of a job per cluster size, before launching")
    p.add_argument("--task", default="mrpc", help="GLUE task (its training set size)")
    p.add_argument("--model", default=None,
                   help="a local model directory: its size, from its safetensors header, scales the rate and the "
                        "all-reduce (default: distilbert-base-uncased's)")
    p.add_argument("--nodes", default=plan.NODE_COUNTS, help=f"comma list of cluster sizes (default {plan.NODE_COUNTS})")
    p.add_argument("--instance-type", default=None, help=f"default: the cluster spec's ({DEFAULT_WORLD.default_instance_type}); "
                                                         "auto: every planned type of the catalog, and a pick")
    p.add_argument("--epochs", default="3", help="epochs (default 3)")
    p.add_argument("--bench", default=str(plan.DEFAULT_BENCH), help="a bench.json (`ftc bench scaling --out DIR`)")
    p.add_argument("--samples-per-s", default=None,
                   help="measured per-node rate on this instance type (default: the bench's, scaled by cores)")
    p.add_argument("--node-hour-price", default=None,
                   help="PROVIDER=slurm, whose nodes no catalog prices: what one node-hour costs you, in dollars "
                        "(without it the plan shows node-hours: time only)")
    p.add_argument("--setup-minutes", default=str(SETUP_MINUTES),
                   help=f"launch + bootstrap, billed too (default {SETUP_MINUTES:g}: docs/performance.md)")
    p.add_argument("--batch-size", default=None, help="rows per node per step (default: the ftc recipe's, 32)")
    p.add_argument("--flows", default=None, help=f"TCP flows per ring peer, {DEFAULT_WORLD.flow_gbps:g} Gbit/s each "
                                                 "in a placement group (default as ftc's jobs: as many as fill the instance's "
                                                 "link, 3 at 25 Gbit/s)")
    p.add_argument("--allreduce", default=None, metavar="after-backward|overlap",
                   help="when the gradients are reduced (default after-backward, as ftc's jobs; overlap is "
                        "modeled from its measurement: docs/performance.md)")
    p.add_argument("--accumulate", default=None,
                   help="micro-batches per all-reduce: changes the recipe (global batch, lr scaled); default 1")
    p.add_argument("--grad-compress", default=None, metavar="|".join(GRAD_COMPRESS),
                   help="what crosses the network, as a job's GRAD_COMPRESS (default auto: the gradient, in bf16 where "
                        f"training is; none: fp32; powersgd: rank-{POWERSGD_RANK} factors, an approximate average)")
    p.add_argument("--deadline", default=None, help="pick the cheapest cluster that trains within this, setup included "
                                                    "(20m, 1h30m); the instance type is then chosen (auto)")
    p.add_argument("--budget", default=None, help="pick the fastest cluster that costs at most this many dollars, "
                                                  "setup included; with --deadline, both must hold")
    p.add_argument("--ena-express", default=None, metavar="1|0",
                   help="each TCP flow at ENA Express's cap (default: on where the instance type has it, as ftc's clusters)")
    p.add_argument("--compile", default=None, metavar="auto|on|off",
                   help=f"torch.compile on every node (default auto: from {COMPILE_MIN_STEPS} steps a job, as ftc's jobs)")
    p.add_argument("--json", action="store_true", help='print {"rows": [...], "recommendation": "..."} only')


def _runs_parser(sub) -> None:
    p = sub.add_parser("runs", help="every run ftc has results of, newest first; show one, compare several")
    p.add_argument("--json", action="store_true", help="print the runs as a JSON list for scripts")
    verbs = p.add_subparsers(dest="runs_command", parser_class=OneLineParser)
    q = verbs.add_parser("show", help="one run: summary, and report.md + report.png in its results directory")
    q.add_argument("run", metavar="ID", help="a run id from `ftc runs` (or cluster/id)")
    q = verbs.add_parser("compare", help="runs side by side: a table and one plot")
    q.add_argument("run", metavar="ID", nargs="+", help="two or more run ids from `ftc runs`")
    q.add_argument("--out", default=None, help="the plot's path (default $FTC_HOME/runs/compare/<ids>.png)")


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
    """The note for SPOT=1 on a provider whose World has no spot-notice reader (and no
    FTC_IMDS_ENDPOINT names a simulated one): its jobs watch no notices; '' otherwise. Pure, given `env`."""
    from provision.providers import world
    if not spec.spot or env.get("FTC_IMDS_ENDPOINT") or world(spec.provider).spot_reader:
        return ""
    return (f"note: {label('spot')}=1 on {label('provider')}={spec.provider}: no spot notices are watched there "
            "(its provider has no spot-notice reader); jobs run as on any other node")


def cmd_up(args: argparse.Namespace) -> int:
    from provision import cluster
    _plan_the_cluster(args)
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
    elif traits(state.provider).scheduler:
        cost = ", a Slurm allocation"
    elif traits(state.provider).own_hosts:
        cost = ", your servers: no cost"
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
    return job.launch(_cluster_name(args), script, detach=_switch(args, "detach"), render_only=args.render_only)


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


def cmd_plan(args: argparse.Namespace) -> int:
    """The estimator: a measured per-node rate carried to the instance's cores and CPU class, the
    bench's all-reduce exposure and wait for the slowest rank, the instance's network (flow-limited)
    and price, the task's size, the levers (provision/estimate.py); then its decision in one sentence.
    With INSTANCE_TYPE auto (the default with --deadline or --budget), every planned type of the
    catalog, node count and lever is weighed, and the plan picks the cluster."""
    from provision import estimate
    job, given = _plan_job(args)
    if _plan_searches(args):
        return _plan_search(args, job, given)
    kind_name, world = _planned_instance_type(args.instance_type)
    kind = world.instance_types[kind_name]
    from provision.providers import traits
    price, priced = plan.node_hour_price(args.node_hour_price, traits(_planned_provider()).scheduler, kind.usd_per_hour)
    cls = estimate.xeon_class(kind.native_bf16)
    steps = job.epochs * job.train_samples // (max(given["nodes"]) * job.batch_per_node)
    levers = plan.plan_levers(args, kind, world, given["compress"], steps)
    rate, source = plan.plan_rate(args.samples_per_s, given["bench"], kind, cls, job.params)

    def plan_with(chosen: estimate.Levers) -> list[estimate.PlanRow]:
        rows = estimate.plan(given["nodes"], job.train_samples, job.epochs, rate, job.batch_per_node, job.grad_bytes,
                             kind.network_gbps, job.exposure, job.wait_share, price, job.setup_s, chosen,
                             world.hop_latency_s, world.flow_gbps, job.params, kind.physical_cores,
                             world.express_flow_gbps, job.compiled)
        return [replace(row, instance_type=kind_name) for row in rows]

    rows = plan_with(levers)
    if args.allreduce is None and not levers.low_rank:  # as the controller chooses for a job (plan.exchange_for)
        rows = estimate.faster_rows(rows, plan_with(estimate.with_comm_core(levers)))
        levers = rows[-1].levers
    cap = estimate.flow_cap(levers, world.flow_gbps, world.express_flow_gbps)
    alternatives = [(alt, plan_with(alt)) for alt in estimate.alternative_levers(levers, kind.network_gbps, cap)]
    recommendation = estimate.recommend(rows, levers, estimate.Assumed(rate, cls, job.batch_per_node, kind.network_gbps,
                                                                       given["lr"], cap), alternatives)
    if args.json:
        print(json.dumps({"rows": [plan.row_record(row) for row in rows], "recommendation": recommendation}))
        return 0
    cost = f"${price:g}/h" if priced else "time only: no price, cost in node-hours"
    plan.print_plan(f"{given['task']} x {job.epochs} epochs, {given['model']}, {kind_name} ({kind.cpu}, "
                    f"{kind.network_gbps:g} Gbit/s, {cost})", rows, priced)
    answer.print(f"per-node rate {rate:.1f} samples/s ({source}); the all-reduce at most "
                 f"{cap:g} Gbit/s per TCP flow (a placement group's cap{', ENA Express' if levers.express else ''}) and "
                 f"{kind.network_gbps:g} per instance"
                 + (f", overlapped: only what outlasts backward ({estimate.BACKWARD_SHARE:.0%} of compute) is exposed"
                    if levers.overlap else "") +
                 f", {job.exposure:.2f}x its idle time as measured in training, and a wait for the slowest "
                 f"node of {job.wait_share * 100:.0f}% of compute (both from the bench). "
                 f"Pass --samples-per-s with a rate measured on one {kind_name} for a real figure.", markup=False)
    answer.print(recommendation, markup=False)
    return 0


def _plan_the_cluster(args: argparse.Namespace) -> None:
    """INSTANCE_TYPE auto and NODES auto on `up`: the cluster `ftc plan --deadline/--budget` picks for the
    job (--task), in their place; the pick is said before anything is asked or made."""
    if "auto" not in (args.instance_type, args.nodes):
        return
    if args.task is None:
        raise UsageError(f"{label('instance_type')}/{label('nodes')}=auto size the cluster for a job: give "
                         f"{label('task')} (e.g. qqp), and {label('deadline')} or {label('budget')} if you have one")
    provider = PARSERS["provider"]("provider", args.provider or os.environ.get("FTC_PROVIDER") or ClusterSpec.provider)
    from provision.providers import traits
    if not traits(provider).instance_types:
        raise UsageError(f"{label('instance_type')}=auto picks from a cloud's catalog; {label('provider')}={provider!r} "
                         "has none: name the nodes instead")
    only = None if args.instance_type in (None, "auto") else parsers_for(provider)["instance_type"](
        "instance_type", args.instance_type)
    nodes = plan.NODE_COUNTS if args.nodes in (None, "auto") else args.nodes
    asked = argparse.Namespace(task=args.task, nodes=nodes, epochs=args.epochs or "3", setup_minutes=str(SETUP_MINUTES),
                               batch_size=None, bench=str(plan.DEFAULT_BENCH), model=None, grad_compress=None,
                               deadline=args.deadline, budget=args.budget, ena_express=args.ena_express,
                               allreduce=None, compile=None)
    job, given = _plan_job(asked)
    _, chosen, found, _ = _searched(job, given, plan.fixed_levers(asked, "auto"), only)
    if not chosen.meets:
        raise UsageError(f"{label('instance_type')}/{label('nodes')}=auto: {chosen.why} Give a later "
                         f"{label('deadline')} or a larger {label('budget')}, or name the nodes")
    args.instance_type, args.nodes = chosen.row.instance_type, str(chosen.row.nodes)
    console.print(f"plan for {given['task']} x {job.epochs} epochs: {chosen.why} ({found.source})", markup=False,
                  soft_wrap=True)


def _plan_searches(args: argparse.Namespace) -> bool:
    """Whether `ftc plan` picks the instance type: INSTANCE_TYPE auto, or a deadline or budget with none given."""
    settings = {**load_config(None, os.environ), **env_overrides(os.environ)}
    named = args.instance_type or settings.get("instance_type")
    return named == "auto" or args.deadline is not None or args.budget is not None


def _plan_job(args: argparse.Namespace) -> tuple:
    """The job `ftc plan` sizes (estimate.Job) and what it was given besides, each input checked."""
    from provision import estimate
    from runner.jobspec import PARSERS as JOB_PARSERS
    from runner.node import glue
    from runner.node.recipes import RECIPES
    try:
        task = glue.task_name(args.task)
    except ValueError:
        raise UsageError(f"{label('task')}={args.task!r} is not a GLUE task ftc knows; allowed: "
                         f"{', '.join(glue.TASKS)}") from None
    nodes = sorted(whole_list(1, MAX_NODES, distinct=True)("nodes", args.nodes))
    epochs = whole(1, 1000)("epochs", args.epochs)
    setup_s = 60 * number(0, 1440, lo_included=True)("setup_minutes", args.setup_minutes)
    recipe = RECIPES["ftc"]
    batch = recipe["batch_size"] if args.batch_size is None else JOB_PARSERS["batch_size"]("batch_size", args.batch_size)
    bench = plan.bench_figures(args.bench)
    model, params = plan.plan_model(args.model)
    compress = plan.plan_compress(args)
    deadline = None if args.deadline is None else plan.deadline_seconds("deadline", args.deadline)
    budget = None if args.budget is None else plan.BUDGET("budget", args.budget)
    native = bench["precision"] == "bf16"  # the wire as the bench's nodes send it; each type's own below
    job = estimate.Job(estimate.GLUE_TRAIN_SIZES[task], epochs, batch,
                       estimate.gradient_bytes(bf16=plan.wire_bf16(compress, estimate.xeon_class(native)), params=params),
                       bench["exposure"], bench["wait_share"], setup_s,
                       plan.compile_figures(args.bench) or estimate.NO_COMPILE, params)
    return job, {"task": task, "nodes": nodes, "bench": bench, "model": model, "compress": compress, "lr": recipe["lr"],
                 "deadline": deadline, "budget": budget}


def _searched(job, given: dict, fixed, only: str | None = None) -> tuple:
    """Every planned instance type of the catalog (or `only` that one) x node count x lever (less those
    `fixed`): the rows, the pick, the catalog and its offers."""
    from provision import estimate
    from provision.providers import catalog, default_world
    world = default_world()
    found = catalog("aws", world.default_region)
    offers = plan.offers(found, given["bench"], job.params, given["compress"], only)
    rows = estimate.search(offers, given["nodes"], job, world.hop_latency_s, world.flow_gbps, world.express_flow_gbps,
                           fixed)
    return rows, estimate.pick(rows, given["deadline"], given["budget"]), found, offers


def _plan_search(args: argparse.Namespace, job, given: dict) -> int:
    """Every planned instance type of the catalog x node count x lever, and the pick."""
    if args.samples_per_s is not None:
        raise UsageError(f"{label('samples_per_s')} is one instance type's rate; give {label('instance_type')} with it, "
                         "or leave it out to carry the bench's rate to every type")
    only = args.instance_type if args.instance_type not in (None, "auto") else None
    if only:
        _planned_instance_type(only)  # a type of the catalog, checked as a spec's
    rows, chosen, found, offers = _searched(job, given, plan.fixed_levers(args, given["compress"]), only)
    rates = (f"each type's rate carried from the bench's ({given['bench']['ftc_samples_per_s']:.1f} samples/s on "
             f"{given['bench']['cores_per_rank']} cores of {given['bench']['cpu']}) by CPU class and cores: an "
             "extrapolation, not a measurement on that type")
    setup = (f"setup {duration(job.setup_s)} a cluster (--setup-minutes), compile "
             f"{duration(job.compiled.seconds)} on every node where compiled ({job.compiled.speedup:g}x faster steps"
             " after it: the bench's long jobs)")
    if args.json:
        print(json.dumps({"rows": [plan.row_record(row) for row in rows],
                          "pick": plan.row_record(chosen.row) | {"meets": chosen.meets},
                          "recommendation": chosen.why, "catalog": found.source, "rates": rates, "assumed": setup}))
        return 0
    plan.print_search(f"{given['task']} x {job.epochs} epochs, {given['model']}: the best of {len(rows)} plans "
                      f"({len(offers)} instance types x {len(given['nodes'])} node counts x levers)", rows, chosen.row)
    answer.print(f"{found.source}; {rates}; {setup}.", markup=False)
    answer.print(chosen.why, markup=False)
    return 0


def _planned_instance_type(given: str | None) -> tuple[str, World]:
    """The instance type `ftc plan` models, and the world (catalog, network) it is planned in: the
    provider's, or the default one. Only PROVIDER and INSTANCE_TYPE are resolved (flag > env > config),
    so a setting that plan does not use (HOSTS of the ssh provider) is not asked for."""
    from provision.providers import spec_world
    settings = {**load_config(None, os.environ), **env_overrides(os.environ)}
    provider = _planned_provider()
    world = spec_world(provider)
    raw = given or settings.get("instance_type") or world.default_instance_type
    return parsers_for(provider)["instance_type"]("instance_type", raw), world


def _planned_provider() -> str:
    """The provider `ftc plan` plans for (its PROVIDER: env > config > the default)."""
    settings = {**load_config(None, os.environ), **env_overrides(os.environ)}
    return PARSERS["provider"]("provider", settings.get("provider", ClusterSpec.provider))


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
    if argv[:1] == ["bench"]:  # bench has its own options (runner/bench.py), also usable without ftc
        from runner import bench
        try:
            return bench.main(argv[1:])
        except KeyboardInterrupt:
            print(f"\ninterrupted after {time.monotonic() - started:.0f}s", file=sys.stderr)
            return 130
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
        return 130
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        print(f"error: {disk_full_advice(args.command, exc.filename or str(st.ftc_home()))}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
