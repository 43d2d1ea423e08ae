"""`ftc`'s argument parser: every command, its flags and their help (the spec's and the jobs' parsers
name what each takes). runner/cli.py runs the commands; tests/settings_doc.py writes docs/settings.md from it.
"""

import argparse

from provision.errors import OneLineParser
from provision.providers import default_world, names
from provision.providers.records import registered
from provision.spec import (
    ClusterSpec,
    every_parser,
    world_help,
)
from provision.values import boolean
from runner import plan
from runner.jobflags import JOB_FLAG_ALIASES, JOB_FLAGS
from runner.node.recipes import COMPILE_MIN_STEPS, COMPILE_MIN_THREADS, GRAD_COMPRESS, POWERSGD_RANK
from runner.plan import SETUP_MINUTES

DEFAULT_WORLD = default_world()  # where INSTANCE_TYPE and REGION default from (of the built-ins: AWS)
SPEC_HELP = {
    "name": "cluster name (default 'ftc')",
    "provider": "where the nodes run: {providers} (default {default})",  # the registry's, when the parser is built
    "nodes": "number of nodes, 1..64 (default 2)",
    "max_hours": "the cluster's most hours ({max_hours}; default 4)",
    "stack": "software on the nodes: stock (default), intel, or ipex (intel without oneCCL: PyPI only)",
    "hosts": "{own_hosts}: your servers as a comma list of [user@]host[:port], node 0 first",
    "ssh_key": "{user_login}: the private key that logs in to the nodes (default: your agent and ~/.ssh keys)",
    "stack_python": "{user_stack_python}: a Python on every node that already has the stack (default: ftc installs one)",
}


def registry_words() -> dict[str, str]:
    """The registry's words that SPEC_HELP's lines are filled in with: the providers, the default one,
    those that have each trait a setting is for, and what MAX_HOURS bounds in each world that says."""
    providers = registered()

    def having(trait) -> str:
        return ", ".join(name for name, provider in providers.items() if trait(provider.traits))
    return {"providers": ", ".join(names()), "default": ClusterSpec.provider,
            "own_hosts": having(lambda t: t.own_hosts and not t.scheduler), "user_login": having(lambda t: t.user_login),
            "user_stack_python": having(lambda t: t.user_stack_python),
            "max_hours": "; ".join(f"{p.world.title or name}: {p.world.max_hours_means}" for name, p in providers.items()
                                   if p.world.max_hours_means)}


# A switch: bare (`--yes`) is on; with a value (`--yes 0`, YES=0 from make) the one boolean parser reads it.
SWITCH = {"nargs": "?", "const": "1", "metavar": "1|0"}


def _spec_flags(p: argparse.ArgumentParser) -> None:
    """A flag for every setting a spec may be given, the registered providers' own included; the help of
    those a provider decides is the registry's (world_help)."""
    registry = registry_words()
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
                   help=f"torch.compile on every node (default auto: from {COMPILE_MIN_STEPS} steps a job on ranks of "
                        f"{COMPILE_MIN_THREADS} threads or more, as ftc's jobs)")
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
