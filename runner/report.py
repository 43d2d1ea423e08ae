"""A finished job as the user reads it: its results as a table, or why it failed (the tails of
the failing ranks' logs). Reads only the files fetched to the controller.
"""

import json
from pathlib import Path

from provision.ui import console


def show_failure(results: Path, code: int) -> None:
    logs = sorted((results / "logs").glob("rank*.log"), key=lambda p: int(p.stem[4:]))
    failing = [p for p in logs if not p.read_text().rstrip().endswith("done")] or logs
    console.print(f"[red]job failed (exit code {code})[/]; results so far in {results}")
    for log in failing[:2]:
        tail = log.read_text().rstrip().splitlines()[-15:]
        console.print(f"[bold]--- tail of {log.name} ---[/]")
        console.print("\n".join(tail), markup=False)
    if not logs and (results / "output.log").exists():
        console.print("\n".join((results / "output.log").read_text().splitlines()[-15:]), markup=False)


def print_results(results: Path) -> None:
    from rich.table import Table
    data = json.loads((results / "results.json").read_text())
    table = Table(title=f"{data['task'].upper()}: {data['model']}", title_justify="left")
    table.add_column("")
    table.add_column("")
    rows = [("world size", f"{data['world_size']} ({data['nodes']} node(s) x {data['ranks_per_node']})"),
            ("recipe / precision / backend", f"{data['recipe']} / {data['precision']} / {data['backend']}"),
            ("train", f"{data['train_samples']} samples x {data['epochs']} epochs in {data['train_seconds']:.0f}s"),
            ("samples/s", f"{data['samples_per_second']:.1f}"),
            ("loss", f"{data['first_loss']:.4f} -> {data['final_loss']:.4f}")]
    rows += [(k, f"{v:.4f}") for k, v in data.items() if k.startswith("eval_")]
    for row in rows:
        table.add_row(*row)
    console.print(table)
    console.print(f"results: {results}/results.json, model: {results}/model")
