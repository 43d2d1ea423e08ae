"""A job as the user reads it: its output on the terminal (colour codes only on a terminal; the
training program keeps transformers' load report in each rank's log), its results as a table,
why it failed (the failing rank's exception, read
from output.log: the rank logs never hold a traceback), and a run's report (markdown and a plot) and
comparison. Reads only files on the controller.

output.log is what mpirun collected from every rank: Intel MPI and MPICH prefix each line with
`[rank] `, Open MPI with `[job,rank]<stdout>:`. What follows is the training program's log line,
as runner/node/protocol.py writes and parses it: rank 0's progress while it trains and its dev
metrics after each evaluation, each marked as the job's (protocol.line_mark); a line without the
job's mark is anything else a rank printed, and is never read as progress or metrics. Whatever a
rank printed reaches the user's terminal without escape sequences (a window title, a cleared
screen) or other control characters; colours only on a terminal.
"""

import json
import re
from pathlib import Path

from rich.markup import escape

from provision.ui import answer, console
from runner.node.protocol import (
    LOGGED,
    MODEL_DIR,
    OUTPUT_LOG,
    RESULTS_FILE,
    SCRIPT_OUTPUT_HOME,
    Logged,
    TrainResults,
    ended,
    first_failure,
    kernels_words,
    line_mark,
    parse_dev,
    parse_progress,
    rank_log_path,
    rank_logs,
    read_rank_exits,
    split_logged,
)
from runner.node.units import duration

from .runs import RECORD, read_run_file, runs_root

RANK_PREFIX = re.compile(r"^\[(?:\d+,)?(\d+)\](?:<std(?:out|err)>:)?\s?")
# What a terminal acts on rather than shows: the string sequences (OSC: a window title, a link; DCS,
# SOS, PM, APC), ended by BEL or ST or by nothing; CSI (colours, cursor moves, clearing the screen);
# the other escape sequences; and any other control character (C0 but tab, DEL, C1).
TERMINAL_CODE = re.compile(r"\x1b[]PX^_][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b\[[0-?]*[ -/]*[@-~]|\x1b[ -/]*[0-~]"
                           r"|[\x00-\x08\x0a-\x1f\x7f-\x9f]")
COLOUR = re.compile(r"\x1b\[[0-9;:]*m")  # SGR: the one code kept, and only on a terminal
TRACEBACK_LINES = 8  # of the failing rank's traceback, shown on failure


def split_rank(line: str) -> tuple[int | None, str]:
    """The rank mpirun prefixed the line with (None: the launch script's or mpirun's own), and the text."""
    found = RANK_PREFIX.match(line)
    if not found:
        return None, line
    # Intel MPI prefixes every chunk a rank writes, not every line: a line written in pieces (an
    # unbuffered Python traceback, on a busy machine) carries the same prefix again inside it.
    again = re.escape(found.group(0).rstrip()) + " ?"
    return int(found.group(1)), re.sub(again, "", line[found.end():])


# ---- the job's output on the terminal ------------------------------------------------------------

def printable(text: str, colour: bool = False) -> str:
    """A rank's text as the user's terminal gets it: its characters, colours only when `colour`, no other
    terminal code (rich passes the escape character through, so its printers get this too). Pure."""
    return TERMINAL_CODE.sub(lambda code: code.group() if colour and COLOUR.fullmatch(code.group()) else "", text)


def for_terminal(line: str, colour: bool) -> str:
    """A line of the job's output as it reaches the user: the protocol's mark left out (it is for the
    controller's readers), then printable."""
    prefix = RANK_PREFIX.match(line)
    at = prefix.end() if prefix else 0
    logged = LOGGED.match(line, at)
    return printable(line[:at] + line[logged.end(1) + 1 if logged else at:], colour)


def protocol_line(line: str, mark: str) -> Logged | None:
    """A line of output.log that rank 0's logger wrote for the job whose mark this is; None for any
    other line (another rank's, a library's, a traceback's, your data or your script's). Pure."""
    rank, text = split_rank(line)
    logged = split_logged(text) if rank in (None, 0) else None
    return logged if logged and logged.mark == mark else None


# ---- what output.log tells ----------------------------------------------------------------------------

def _seconds(t: int, clock: dict) -> float:
    """Seconds since the first timed line, from a line's clock (seconds since midnight). The log's
    clock has no date: a time earlier than the line before it is on the next day."""
    if not clock:
        clock.update(first=t, last=t, days=0)
    clock["days"] += t < clock["last"]
    clock["last"] = t
    return float(t + 86400 * clock["days"] - clock["first"])


def progress(output: str, mark: str) -> tuple[list[dict], list[dict]]:
    """Rank 0's progress lines (seconds since the first, fractional epoch, loss, samples/s) and its
    dev evaluations per epoch, as logged for the job whose mark this is."""
    steps, dev, clock = [], {}, {}
    for line in output.splitlines():
        logged = protocol_line(line, mark)
        if logged is None:
            continue
        if found := parse_progress(logged.message):
            steps.append({"seconds": _seconds(logged.seconds, clock),
                          "epoch": found.step / max(1, found.total_steps) * found.epochs,
                          "loss": found.loss, "samples_per_second": found.samples_per_second})
        elif found := parse_dev(logged.message):
            _seconds(logged.seconds, clock)
            dev[found.epoch] = found.metrics
    return steps, [{"epoch": e, **m} for e, m in sorted(dev.items())]


def tracebacks(output: str) -> dict[int, list[str]]:
    """Per rank, the last traceback it printed: from `Traceback (most recent call last):` through its
    frames to the exception line (what the rank printed after that, warnings of its libraries, is left out)."""
    by_rank: dict[int, list[str]] = {}
    for line in output.splitlines():
        rank, text = split_rank(line)
        if rank is not None:
            by_rank.setdefault(rank, []).append(printable(text.rstrip()))
    found = {}
    for rank, lines in sorted(by_rank.items()):
        starts = [i for i, text in enumerate(lines) if text.startswith("Traceback (most recent call last)")]
        if not starts:
            continue
        block = lines[starts[-1]:]
        end = next((i for i, text in enumerate(block) if i and split_logged(text)), len(block))
        block = [text for text in block[:end] if text]
        frames = [i for i, text in enumerate(block) if text.startswith(" ")]
        last = frames[-1] + 1 if frames else len(block) - 1  # the exception line; its message may go on
        while last + 1 < len(block) and block[last + 1].startswith("\t"):  # in tab-indented lines
            last += 1
        found[rank] = block[:last + 1]
    return found


def exception_line(traceback: list[str]) -> str:
    """`Type: message`, the first line after the traceback's frames."""
    return next((text for text in traceback[1:] if not text.startswith((" ", "\t"))), traceback[-1])


# ---- a finished job -----------------------------------------------------------------------------------

# mpirun's verdict on the first rank that went wrong: Intel MPI / MPICH (hydra), and Open MPI.
FIRST_BAD = re.compile(r"RANK (\d+) PID \d+ RUNNING AT|process rank (\d+) with PID \d+ on node \S+ exited on signal")


def first_bad_rank(output: str) -> int | None:
    for rank, text in map(split_rank, output.splitlines()):
        found = FIRST_BAD.search(text) if rank is None else None
        if found:
            return int(found.group(1) or found.group(2))
    return None


def show_failure(results: Path, code: int) -> None:
    """Why the job failed: the failing rank's exception (the last lines of its traceback) and the file
    with its full log; a rank killed without one (a signal, a lost node): its log's tail and mpirun's
    verdict, other ranks' exceptions named as what followed."""
    console.print(f"[red]job failed (exit code {code})[/]; results so far in {escape(str(results))}", soft_wrap=True)
    output_log = results / OUTPUT_LOG
    output = output_log.read_text(errors="replace") if output_log.exists() else ""
    raised, first = tracebacks(output), first_bad_rank(output)
    if not raised or (first is not None and first not in raised):  # killed, or lost with its node
        _show_tails(results, output, first)
        for rank, lines in raised.items():
            console.print(f"(then rank {rank} raised {exception_line(lines)}: {output_log})", markup=False,
                          soft_wrap=True)
        return
    ranks = sorted(raised, key=lambda r: r != first)  # mpirun's first bad rank first
    for rank in ranks[:2]:
        console.print(f"[bold]--- rank {rank} raised {escape(exception_line(raised[rank]))} ---[/]", soft_wrap=True)
        console.print("\n".join(raised[rank][-TRACEBACK_LINES:]), markup=False, soft_wrap=True)
    if len(ranks) > 2:
        console.print(f"(ranks {', '.join(map(str, ranks[2:]))} raised too)")
    console.print(f"rank {ranks[0]}'s full log: {output_log} (its lines start with [{ranks[0]}]); "
                  f"its progress: {results / rank_log_path(ranks[0])}", markup=False, soft_wrap=True)


def _show_tails(results: Path, output: str, first: int | None) -> None:
    """No exception of the failing rank's own: the tails of the ranks' logs (the first bad rank's, else
    those that did not finish) and mpirun's verdict."""
    logs = rank_logs(results)
    failing = [p for p in logs if first is not None and p == results / rank_log_path(first)] or \
        [p for p in logs if not ended(p.read_text())] or logs
    for log in failing[:2]:
        console.print(f"[bold]--- tail of {escape(log.name)} ---[/]")
        tail = log.read_text(errors="replace").rstrip().splitlines()[-15:]
        console.print("\n".join(for_terminal(line, colour=False) for line in tail), markup=False, soft_wrap=True)
    verdict = [printable(text) for rank, text in map(split_rank, output.splitlines()) if rank is None and text.strip()]
    if verdict:
        console.print("\n".join(verdict[-8:]), markup=False, soft_wrap=True)
    console.print(f"full log of every rank: {results / OUTPUT_LOG}", markup=False, soft_wrap=True)


def results_rows(r: TrainResults) -> list[tuple[str, str]]:
    rows = [("task", r.task.upper()), ("model", r.model),
            ("world size", f"{r.world_size} ({r.nodes} node(s) x {r.ranks_per_node})"),
            ("recipe / precision / backend / seed", f"{r.recipe} / {r.precision} / {r.backend} / {r.seed}"),
            ("train", f"{r.train_samples} samples x {r.epochs} epochs in {r.train_seconds:.0f}s"),
            ("samples/s", f"{r.samples_per_second:.1f}"),
            ("loss", f"{four_places(r.first_loss)} -> {four_places(r.final_loss)}"),
            ("kernels", kernels_words(r.compile_cache, r.compile_cache_from or "this node"))]
    return rows + [(f"dev {k[5:]}", four_places(v)) for k, v in r.metrics.items()]


def four_places(value: float | None) -> str:
    """A loss or metric as the table shows it; a diverged run's (recorded null: not a number) as n/a."""
    return "n/a" if value is None else f"{value:.4f}"


def key_value_table(title: str, rows: list[tuple[str, str]]):
    """Two columns without headers: a value (a long model path) folds in its own column. The title and
    the cells are shown as they are (a path's `[x]` is no markup)."""
    from rich.table import Table
    table = Table(title=escape(title), title_justify="left", show_header=False)
    table.add_column(no_wrap=True, style="bold")
    table.add_column(overflow="fold")
    for row in rows:
        table.add_row(*map(escape, row))
    return table


def print_results(results: Path) -> None:
    done = TrainResults.read(results)
    answer.print(key_value_table(f"{done.task.upper()} results", results_rows(done)))
    answer.print(f"results: {results}/{RESULTS_FILE}, model: {results}/{MODEL_DIR}", markup=False, soft_wrap=True)


# ---- runs: listed, shown, compared --------------------------------------------------------------------

def model_label(model: str) -> str:
    """A hub id as it is; a local directory by its last meaningful name."""
    if not model.startswith("/"):
        return model
    path = Path(model)
    return path.parent.name if path.name in ("model", "snapshot", "") else path.name


METRIC_ABBREVIATIONS = {"accuracy": "acc", "pearson": "p", "spearman": "s", "matthews": "mcc"}


def dev_label(metrics: dict) -> str:
    return "/".join(f"{v * 100:.1f}" for v in metrics.values()) or "-"


def dev_header(runs: list[dict]) -> str:
    """`dev acc/f1` when every run has the same metrics, else `dev %` (their names are in --json)."""
    names = {tuple(run["metrics"]) for run in runs if run["metrics"]}
    if len(names) != 1:
        return "dev %"
    return "dev " + "/".join(METRIC_ABBREVIATIONS.get(k[5:], k[5:]) for k in names.pop())


def in_default_place(run: dict) -> bool:
    return Path(run["results_dir"]).parent.parent == runs_root().absolute()


def run_row(run: dict) -> list[str]:
    layout = f"{run['nodes']}x{run['ranks_per_node']}" if run["nodes"] else "-"
    rate = f"{run['samples_per_second']:.1f}" if run["samples_per_second"] else "-"
    wall = duration(run["wall_seconds"]) if run["wall_seconds"] is not None else "-"
    cost = "-" if run["cost_usd"] is None else f"${run['cost_usd']:.2f}"
    what = (run["command"] or "") if run["kind"] == "script" else model_label(run["model"])
    status = f"{run['status']} ({run['exit_code']})" if run["kind"] == "script" and run["exit_code"] else run["status"]
    return [run["id"] + ("" if in_default_place(run) else "*"), run["cluster"], run["provider"], run["task"],
            what[:40], layout, run["precision"] or "-", str(run["epochs"] or "-"),
            dev_label(run["metrics"]), rate, wall, cost, status]


SCRIPT_TAIL = 20  # lines of a script's rank 0 log that `ftc runs show` prints
RUN_COLUMNS = ("id", "cluster", "provider", "task", "model", "nodes", "precision", "epochs", "dev",
               "samples/s", "wall", "cost", "status")
SHORT = {"precision": "prec", "epochs": "ep", "samples/s": "smp/s"}  # the list's headers: 13 columns in 120
DROP_ORDER = ("provider", "cost", "precision", "task", "epochs", "samples/s", "cluster", "wall", "model", "nodes")


def summary_rows(run: dict) -> list[tuple[str, str]]:
    """One run's row of the list as key and value, with the full model path and where its results are."""
    names = [dev_header([run]) if column == "dev" else column for column in RUN_COLUMNS[1:]]
    if run["kind"] == "script":
        there = (Path(run["results_dir"]) / SCRIPT_OUTPUT_HOME).is_dir()
        size = "none came home" if not there else "-" if run["output_bytes"] is None else \
            f"{run['output_bytes'] / 2**20:.1f} MB"
        listed = [(name, value) for name, value in zip(names, run_row(run)[1:]) if name != "model"]  # the command, cut
        return listed + [("command", run["command"] or ""), ("exit code", str(run["exit_code"])),
                                                     ("output", f"{run['results_dir']}/output ({size})"),
                                                     ("results", run["results_dir"])]
    kernels = [("compile", run["compile"] or "auto"), ("kernels", run["kernels"])] if run["kernels"] else []
    return list(zip(names, run_row(run)[1:])) + kernels + [("model path", run["model"]), ("results", run["results_dir"])]


def fitting_columns(headers: dict[str, str], rows: list[list[str]], width: int) -> list[str]:
    """The list's columns, the least telling left out until every row fits the width on one line."""
    columns = list(RUN_COLUMNS)

    def needed() -> int:
        at = {c: RUN_COLUMNS.index(c) for c in columns}
        return sum(max([len(headers[c])] + [len(row[at[c]]) for row in rows]) + 2 for c in columns)
    for column in DROP_ORDER:
        if needed() <= width:
            break
        columns.remove(column)
    return columns


def runs_table(runs: list[dict], title: str, width: int):
    from rich import box
    from rich.table import Table
    headers = {c: dev_header(runs) if c == "dev" else SHORT.get(c, c) for c in RUN_COLUMNS}
    if any(run["kind"] == "script" for run in runs):  # a script's row shows its command there
        headers["model"] = "model|command"
    rows = [run_row(run) for run in runs]
    columns = fitting_columns(headers, rows, width)
    left_out = [c for c in RUN_COLUMNS if c not in columns]
    caption = f"results in {runs_root()}/<cluster>/<id>; * elsewhere: `ftc runs show ID` says where" + \
        (f"; too narrow for {', '.join(left_out)}: see `ftc runs --json`" if left_out else "")
    # title, caption, headers and cells as they are: a path, a model or a metric's `[x]` is no markup
    table = Table(title=escape(title), title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  padding=(0, 1, 0, 0), caption=escape(caption), caption_justify="left")  # 2 characters between columns
    for column in columns:
        table.add_column(escape(headers[column]), no_wrap=True)
    for row in rows:
        table.add_row(*(escape(row[RUN_COLUMNS.index(c)]) for c in columns))
    return table


def epoch_rows(results: Path, job_id: str) -> tuple[list[dict], list[dict]]:
    """Per epoch: train loss and dev metrics (results.json; for a run without one, the dev lines of
    output.log), and the progress lines of output.log: only those the job's own logger wrote."""
    output = results / OUTPUT_LOG
    steps, dev = progress(output.read_text(errors="replace"), line_mark(job_id)) if output.exists() else ([], [])
    done, _ = read_run_file(results, RESULTS_FILE)
    return done.get("epoch_metrics", dev), steps


def epoch_columns(epochs: list[dict]) -> list[str]:
    """The per-epoch columns a report shows: the dev metrics and the training loss (each pass's
    wall time, rows and tokens, `pass_*`, are the bench's, and stay in results.json)."""
    return sorted({k for e in epochs for k in e if k != "epoch" and not k.startswith("pass_")})


def number(value) -> str:
    """A metric in a table: four decimals; blank where an epoch has none (or a diverged loss, null)."""
    return f"{value:.4f}" if isinstance(value, (int, float)) else ""


def markdown(run: dict, epochs: list[dict], png: Path) -> str:
    lines = [f"# Run {run['id']} ({run['cluster']})", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in summary_rows(run)] + [""]
    keys = epoch_columns(epochs)
    if epochs:
        lines += ["| epoch | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
        lines += [f"| {e['epoch']} | " + " | ".join(number(e.get(k)) for k in keys) + " |" for e in epochs]
    else:
        lines.append("No epoch finished.")
    return "\n".join(lines + ["", f"![loss, dev metric and throughput]({png.name})", ""])


def show(run: dict) -> tuple[Path, Path]:
    """The run on the terminal, and report.md and report.png written into its results directory."""
    results = Path(run["results_dir"])
    epochs, steps = epoch_rows(results, run["id"])
    answer.print(key_value_table(f"run {run['id']}", summary_rows(run)))
    if run["kind"] == "script":  # your script's own output: the tail of the first failing rank's log, else rank 0's
        failed = first_failure(read_rank_exits(results))
        rank = failed.rank if failed else 0
        log = results / rank_log_path(rank)
        tail = log.read_text(errors="replace").splitlines()[-SCRIPT_TAIL:] if log.exists() else \
            [f"(no log of rank {rank} home)"]
        which = f"rank {rank}'s log (it failed first, exit code {failed.code})" if failed else "rank 0's log"
        answer.print(f"{which}, last {len(tail)} lines ({log}):\n" + "\n".join(map(printable, tail)), markup=False,
                     soft_wrap=True)
    if epochs:
        keys = epoch_columns(epochs)
        from rich.table import Table
        table = Table(title="per epoch", title_justify="left")
        for column in ("epoch", *keys):
            table.add_column(escape(column), justify="right")  # a metric's name from results.json, as it is
        for e in epochs:
            table.add_row(escape(str(e["epoch"])), *(number(e.get(k)) for k in keys))
        answer.print(table)
    md, png = results / "report.md", results / "report.png"
    plot_run(run, epochs, steps, png)
    md.write_text(markdown(run, epochs, png))
    return md, png


def pyplot():
    """matplotlib's pyplot, drawing to files (no display on a controller or a CI machine)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_run(run: dict, epochs: list[dict], steps: list[dict], path: Path) -> None:
    plt = pyplot()
    fig, (loss, dev, speed) = plt.subplots(1, 3, figsize=(14, 4))
    if steps:
        loss.plot([s["epoch"] for s in steps], [s["loss"] for s in steps], ".", color="lightgrey",
                  label="logged steps")
    trained = [e for e in epochs if isinstance(e.get("train_loss"), (int, float))]
    loss.plot([e["epoch"] for e in trained], [e["train_loss"] for e in trained], "o-", label="epoch mean")
    loss.set(xlabel="epoch", ylabel="training loss", title="training loss")
    loss.legend()
    for key in sorted({k for e in epochs for k in e if k.startswith("eval_")}):
        dev.plot([e["epoch"] for e in epochs if key in e], [e[key] for e in epochs if key in e], "o-", label=key[5:])
    dev.set(xlabel="epoch", ylabel="dev", title="dev metric per epoch")
    if epochs:
        dev.legend()
    speed.plot([s["seconds"] / 60 for s in steps], [s["samples_per_second"] for s in steps], ".-")
    speed.set(xlabel="minutes since the first logged step", ylabel="samples/s (running average, as logged)",
              title="throughput")
    fig.suptitle(f"{run['id']} on {run['cluster']}: {run['task']}, {model_label(run['model'])}, "
                 f"{run['nodes']} x {run['ranks_per_node']} rank(s), {run['status']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# What run.json holds that is not a setting of the job: where and when it ran, and how it ended.
NOT_SETTINGS = {"id", "cluster", "started_at", "ended_at", "status", "results_dir", "remote_dir", "exit_code",
                "output_bytes", "train_sha256", "validation_sha256"}


def differing_settings(records: list[dict]) -> dict[str, list]:
    """The settings (run.json's) whose values are not the same in every run, each run's value in
    order; what a run did not record is None. Pure."""
    keys = sorted({k for r in records for k in r} - NOT_SETTINGS)
    values = {k: [None if r.get(k) == "" else r.get(k) for r in records] for k in keys}  # "" and unset alike
    return {k: v for k, v in values.items() if len({json.dumps(x) for x in v}) > 1}


def compare(runs: list[dict], path: Path) -> None:
    """The runs side by side: the table and the settings that differ on stdout; one plot (dev metric
    and training loss per epoch, throughput over time)."""
    answer.print(runs_table(runs, f"{len(runs)} runs compared", answer.width))
    differ = differing_settings([read_run_file(Path(r["results_dir"]), RECORD)[0] for r in runs])
    if differ:
        from rich.table import Table
        table = Table(title="settings that differ", title_justify="left")
        for column in ("setting", *(escape(r["id"]) for r in runs)):
            table.add_column(column)
        for key, values in differ.items():
            table.add_row(escape(key), *(escape("-" if v is None else str(v)) for v in values))
        answer.print(table)
    plt = pyplot()
    fig, (dev, loss, speed) = plt.subplots(1, 3, figsize=(16, 4))
    shown = []
    for run in runs:
        epochs, steps = epoch_rows(Path(run["results_dir"]), run["id"])
        key = next((k for e in epochs for k in e if k.startswith("eval_")), None)
        label = f"{run['cluster']}/{run['id']}"
        if key:
            points = [(e["epoch"], e[key]) for e in epochs if isinstance(e.get(key), (int, float))]
            dev.plot([x for x, _ in points], [y for _, y in points], "o-", label=f"{label} ({key[5:]})")
            shown += [y for _, y in points]
        trained = [e for e in epochs if isinstance(e.get("train_loss"), (int, float))]
        loss.plot([e["epoch"] for e in trained], [e["train_loss"] for e in trained], "o-", label=label)
        speed.plot([s["seconds"] / 60 for s in steps], [s["samples_per_second"] for s in steps], ".-", label=label)
    if shown and all(0 <= y <= 1 for y in shown):  # the whole scale: noise must not look like a difference
        dev.set_ylim(0, 1)
    loss.set_ylim(bottom=0)
    dev.set(xlabel="epoch", ylabel="dev metric", title="dev metric per epoch")
    loss.set(xlabel="epoch", ylabel="training loss (epoch mean)", title="training loss")
    speed.set(xlabel="minutes since the first logged step", ylabel="samples/s (running average)", title="throughput")
    for axes in (dev, loss, speed):
        if axes.get_legend_handles_labels()[0]:
            axes.legend(fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
