"""What the user sees while ftc works: one console, and a live per-node status board."""

import sys
import threading
import time

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

console = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 120)
# A command's answer (a table, a plan, JSON) goes to stdout; progress and messages to stderr. Piped, the
# answer is as wide as its widest table needs (up to 160), so scripts see rows on one line each; colour
# only on a terminal (rich's own rule, which NO_COLOR and FORCE_COLOR override).
answer = Console(highlight=False, width=None if sys.stdout.isatty() else 160)


class NodeBoard:
    """A live table with one row per node: the step it is on and how long it took.

    Threads update it; on a non-terminal (CI, pipes) rich prints only the final table,
    so logs stay readable.
    """

    def __init__(self, title: str, names: list[str]):
        self.title = title
        self.rows = {n: ["waiting", ""] for n in names}
        self.started = {n: time.monotonic() for n in names}
        self._lock = threading.Lock()
        self._live = Live(self._table(), console=console, refresh_per_second=4, transient=False)

    def _table(self) -> Table:
        table = Table(title=escape(self.title), title_justify="left")
        table.add_column("node")
        table.add_column("step")
        table.add_column("detail", overflow="fold")
        for name, (step, detail) in self.rows.items():  # literal text: a path's [x] is no markup
            table.add_row(escape(name), escape(step), escape(detail))
        return table

    def update(self, name: str, step: str, detail: str = "") -> None:
        with self._lock:
            self.rows[name] = [step, detail]
            self._live.update(self._table())

    def __enter__(self) -> "NodeBoard":
        self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._live.update(self._table())
        self._live.__exit__(*exc)
        console.print()
