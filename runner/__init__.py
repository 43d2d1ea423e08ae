"""ftc's job side and its command: the `ftc` CLI (cli.py) on top; jobs (launch, follow, fetch,
one-shot run, sweep, bench) over the cluster side (`provision`). The programs that run on the
nodes are the `runner.node` package, which imports nothing of either."""
