"""PROVIDER=slurm against a real Slurm (tests/slurm_sandbox.py: slurm-wlm 22.05 and munge, two slurmd nodes
each in its own network and UTS namespace with its own sshd): no scheduler is mocked. The pure decisions
(the sbatch line, Slurm's answers read, the refusals) run in the fast lane."""

import hashlib
import os
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import FTC, ftc
from helpers import assert_refused, held_job, make, only_line, read_until, wait_for

from provision.errors import FtcError, UsageError
from provision.providers.slurm import (
    Partition,
    allocation_of,
    ended_line,
    minutes,
    notice_s,
    partition_of,
    reach_line,
    refusals,
    relay_argv,
    sbatch_argv,
    sshd_ready_argv,
    waiting_line,
)
from provision.spec import resolve_spec
from runner.node.slurm_notice import notice
from runner.plan import node_hour_price

# ---- pure ---------------------------------------------------------------------------------------


def test_the_allocation_is_one_exclusive_sbatch_named_after_the_cluster_with_the_time_limit_rounded_up():
    spec = resolve_spec({"provider": "slurm", "name": "big", "partition": "cpu", "nodes": "4", "max_hours": "1.01",
                         "account": "lab", "qos": "normal", "constraint": "spr&ib"}, {})
    assert sbatch_argv(spec)[:-1] == ["sbatch", "--parsable", "--exclusive", "--nodes=4", "--job-name=ftc-big",
                                      "--time=61", "--partition=cpu", "--output=/dev/null", "--account=lab",
                                      "--qos=normal", "--constraint=spr&ib", "--signal=B:TERM@120", "--wrap"]
    # the batch script sleeps; it starts the nodes' private sshd only when ftc signals it (ssh did not reach them),
    # and writes a notice on Slurm's SIGTERM
    assert sbatch_argv(spec)[-1].startswith("trap 'srun --overlap --whole --mem=0 --ntasks-per-node=1 --quiet sh -c ")
    assert sbatch_argv(spec)[-1].endswith("' TERM; while :; do sleep 3600 & wait $!; done")
    plain = resolve_spec({"provider": "slurm", "partition": "cpu"}, {})
    assert "--account" not in " ".join(sbatch_argv(plain)) and "--time=240" in sbatch_argv(plain)
    # the notice before the time limit: EC2's two minutes, or a quarter of a shorter allocation
    assert [notice_s(m) for m in (240, 8, 1)] == [120, 120, 15]


def test_slurms_answers_are_read_into_records():
    assert [minutes(t) for t in ("1:00:00", "2-00:00:00", "30", "05:30", "UNLIMITED", "1-02:03:00")] == \
        [60, 2880, 30, 6, None, 1563]
    part = partition_of("PartitionName=debug AllowGroups=ALL Default=YES MaxTime=08:00:00 State=UP TotalCPUs=4 "
                        "TotalNodes=2 Nodes=ftcn[1-2]")
    assert part == Partition("debug", 2, 480, "UP")
    pending = allocation_of("7", "JobId=7 JobName=ftc-a JobState=PENDING Reason=PartitionDown Dependency=(null) "
                                 "NodeList=(null) BatchHost=(null)")
    assert (pending.state, pending.reason, pending.nodes, pending.live) == ("PENDING", "PartitionDown", "", True)
    assert "allocation 7: PENDING (PartitionDown), waiting 3 s" in waiting_line(pending, 3.2)
    over = allocation_of("7", "JobId=7 JobState=TIMEOUT Reason=TimeLimit NodeList=ftcn[1-2]")
    assert not over.live and ended_line(over) == "Slurm allocation 7 is TIMEOUT (TimeLimit)"


def test_a_partition_too_small_or_too_short_is_refused_one_line_each():
    spec = resolve_spec({"provider": "slurm", "partition": "debug", "nodes": "3", "max_hours": "9"}, {})
    lines = refusals(spec, Partition("debug", 2, 480, "UP"))
    assert lines == ["--nodes=3 is more than --partition='debug' has (2); allowed: 1..2",
                     "--max-hours=9 is more than --partition='debug' allows (480 min); allowed: up to 8"]
    assert refusals(spec, Partition("debug", 4, None, "DOWN")) == []  # a DOWN partition queues: the job waits


def test_which_way_the_nodes_are_reached_is_said_in_one_line_with_why():
    assert reach_line("7", ["", ""]) == "nodes reached over ssh: every allocated node answers it and logs you in"
    assert reach_line("7", ["", "ftcn2 (10.0.0.2) does not answer ssh on port 22 from here"]) == \
        "nodes reached through srun --jobid 7 --overlap, not ssh: ftcn2 (10.0.0.2) does not answer ssh on port 22 from here"
    assert reach_line("7", ["a", "b", "c"]).endswith(": a (and 2 more)")
    # each node's private sshd listens on the allocation's port on its loopback; ssh reaches it by srun's stdio
    relay = relay_argv("30007", "ftcn2")
    assert relay[:8] == ["srun", "--jobid=30007", "--overlap", "--nodelist=ftcn2", "--nodes=1", "--ntasks=1",
                         "--unbuffered", "--quiet"] and relay[8:10] == ["python3", "-c"] and relay[-1] == "20007"
    assert "cat /tmp/ftc-sshd-30007.ftcn2/host_key.pub && " in sshd_ready_argv("30007", "ftcn2")[-1]


@pytest.mark.parametrize("flags, named", [
    ({"provider": "slurm"}, "--provider='slurm' needs --partition"),
    ({"provider": "slurm", "partition": "-x"}, "--partition='-x' is not a Slurm name"),
    ({"provider": "slurm", "partition": "p", "hosts": "h"}, "--hosts is for your own servers"),
    ({"provider": "slurm", "partition": "p", "login": "a b"}, "--login='a b' is not a login node"),
    ({"provider": "local", "partition": "p"}, "--partition is for a Slurm cluster"),
    ({"provider": "slurm", "partition": "p", "constraint": "a;b"}, "--constraint='a;b' is not a Slurm constraint"),
])
def test_slurm_settings_are_checked_before_anything_is_asked(flags, named):
    with pytest.raises(UsageError, match=named.replace("(", r"\(")):
        resolve_spec(flags, {})


def test_plan_on_slurm_is_time_only_or_costs_the_node_hour_price_given(ftc_home):
    schedulers, named = ["slurm"], "FTC_PROVIDER"
    assert node_hour_price(None, "slurm", 2.72, schedulers, named) == (1.0, False)
    assert node_hour_price("0.4", "slurm", 2.72, schedulers, named) == (0.4, True)
    assert node_hour_price(None, "aws", 2.72, schedulers, named) == (2.72, True)  # a catalog's instance type: its price
    time_only = ftc("plan", "--nodes", "1,2", env={"FTC_PROVIDER": "slurm"})
    assert time_only.returncode == 0, time_only.stderr
    table = time_only.stdout.split("per-node rate")[0]
    assert "time only: no price, cost in node-hours" in " ".join(table.split()) and "node-hours" in table, table
    assert "$" not in table, table
    priced = ftc("plan", "--nodes", "1,2", "--node-hour-price", "0.4", env={"FTC_PROVIDER": "slurm"})
    assert priced.returncode == 0 and "$0.4/h" in priced.stdout and "│ $0." in priced.stdout, priced.stdout
    assert_refused(ftc("plan", "--node-hour-price", "1"), "--node-hour-price is for the nodes a scheduler lends, which no "
                   "catalog prices; this plan's price is the catalog's; allowed: leave it out, or FTC_PROVIDER=slurm",
                   ftc_home)
    # each refusal names the provider as that command takes it, and doing as it says plans at that price
    through_make = make("plan", "NODES=1,2", "NODE_HOUR_PRICE=0.4", home=ftc_home)
    assert through_make.returncode == 2 and "allowed: leave it out, or PROVIDER=slurm" in through_make.stderr
    as_told = make("plan", "NODES=1,2", "NODE_HOUR_PRICE=0.4", "PROVIDER=slurm", home=ftc_home)
    assert as_told.returncode == 0 and "$0.4/h" in as_told.stdout, as_told.stdout + as_told.stderr
    assert_refused(ftc("plan", "--node-hour-price", "0", env={"FTC_PROVIDER": "slurm"}),
                   "--node-hour-price='0' is out of range", ftc_home)


def test_no_sbatch_and_no_login_is_refused_in_one_line(ftc_home, tmp_path):
    proc = ftc("up", "--name", "nos", "--provider", "slurm", "--partition", "debug", "--yes", "1",
               env={"PATH": str(tmp_path)})
    assert_refused(proc, "no sbatch on this machine's PATH and no --login", ftc_home)


# ---- against the real Slurm ------------------------------------------------------------------------

def queue(sandbox) -> list[str]:
    """Every job the sandbox's Slurm still holds or awaits, as squeue lists them."""
    out = subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True, check=True,
                         env={**os.environ, **sandbox.env()}).stdout
    return out.splitlines()


def homes(sandbox) -> list[tuple]:
    """Every path under the nodes' $HOME (one, shared, as over NFS), with its mode, inode and content hash:
    what 'as it was' means."""
    home = sandbox.home
    return [(str(p.relative_to(home)), oct(p.lstat().st_mode), p.lstat().st_ino if p.is_file() else 0,
             hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "") for p in sorted(home.rglob("*"))]


def processes_under(directory: Path) -> list[int]:
    """Processes whose environment names a node directory of ftc's under `directory` (a job's ranks, mpirun)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and f"FTC_NODE_DIR={directory}".encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


RANK_SCRIPT = """\
import os, socket
out = os.environ["FTC_OUTPUT_DIR"]
os.makedirs(out, exist_ok=True)
keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")
with open(os.path.join(out, f"rank{os.environ['RANK']}.txt"), "w") as f:
    f.write(socket.gethostname() + " " + " ".join(f"{k}={os.environ.get(k, '')}" for k in keys))
"""


@pytest.mark.slow
def test_make_cluster_finetune_launch_destroy_on_slurm_leaves_the_queue_empty_and_the_nodes_as_they_were(
        slurm, ftc_home, tmp_path):
    before = homes(slurm)
    up = make("cluster", "NAME=sl", "PROVIDER=slurm", "PARTITION=debug", "NODES=2", "MAX_HOURS=1", home=ftc_home)
    assert up.returncode == 0, up.stderr
    assert "asking for 2 exclusive node(s) for 60 min" in up.stderr and "runs on ftcn[1-2]" in up.stderr
    assert "nodes reached over ssh" in up.stderr
    assert [line.split()[1:] for line in queue(slurm)] == [["ftc-sl", "RUNNING"]]
    status = ftc("status", "--name", "sl")
    assert status.returncode == 0 and status.stdout.count("│ Slurm allocation") == 2, status.stdout + status.stderr
    assert ", a Slurm allocation" in status.stdout, status.stdout  # the title: the Slurm World's note

    job = make("finetune", "NAME=sl", "TASK=mrpc", "MODEL=auto", "DATA_DIR=auto", "MAX_TRAIN_SAMPLES=32",
               "MAX_EVAL_SAMPLES=32", "EPOCHS=1", home=ftc_home)
    assert job.returncode == 0, job.stdout + job.stderr
    assert "2 (2 node(s) x 1)" in job.stdout + job.stderr

    script = tmp_path / "work" / "ranks.py"
    script.parent.mkdir()
    script.write_text(RANK_SCRIPT)
    launch = make("launch", "NAME=sl", f"SCRIPT={script}", home=ftc_home)
    assert launch.returncode == 0, launch.stdout + launch.stderr
    outputs = sorted((ftc_home / "runs" / "sl").glob("script-*/output/rank0.txt"))
    assert len(outputs) == 1
    seen = outputs[0].read_text()
    assert seen.startswith("ftcn1 ") and "RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=" in seen and "OMP_NUM_THREADS=" \
        in seen, seen

    down = make("destroy", "NAME=sl", home=ftc_home)
    assert down.returncode == 0, down.stderr
    assert queue(slurm) == []
    assert homes(slurm) == before
    assert processes_under(slurm.root) == []


def until_line(proc: subprocess.Popen, wanted: str) -> list[str]:
    """ftc's stderr up to a line that holds `wanted` (the pending allocation is held there by its partition)."""
    return read_until(proc, proc.stderr, lambda line: wanted in line, repr(wanted))


def rest_of(proc: subprocess.Popen) -> str:
    """The rest of ftc's stderr, to its end (within seconds: a stderr still open after read_until's limit fails)."""
    return "".join(read_until(proc, proc.stderr, None, "the end of ftc's stderr"))


@pytest.mark.slow
def test_ctrl_c_while_the_allocation_waits_shows_slurms_reason_then_cancels_it(slurm, ftc_home):
    # the held partition is DOWN: Slurm queues the allocation and keeps it pending, "PartitionDown", until we act
    proc = subprocess.Popen([*FTC, "up", "--name", "wait", "--provider", "slurm", "--partition", "held", "--nodes",
                             "2", "--max-hours", "1"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env=os.environ.copy())
    try:
        seen = until_line(proc, "PENDING (PartitionDown)")
        assert any("queued Slurm allocation" in line for line in seen), seen
        assert [line.split()[1:] for line in queue(slurm)] == [["ftc-wait", "PENDING"]]
        proc.send_signal(signal.SIGINT)
        rest = rest_of(proc)
        assert proc.wait(120) == 130, rest
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "cancelled" in rest and "rolled back" in rest, rest
    assert queue(slurm) == []
    assert not (ftc_home / "clusters" / "wait").exists()


@pytest.mark.slow
def test_bad_slurm_input_is_refused_in_one_line_with_nothing_queued(slurm, ftc_home, tmp_path):
    flags = ["up", "--name", "bad", "--provider", "slurm", "--yes", "1"]
    assert_refused(ftc(*flags, "--partition", "nosuch"), "--partition='nosuch' is not a partition of this Slurm; "
                   "allowed: debug, held", ftc_home)
    assert_refused(ftc(*flags, "--nodes", "3"), "--nodes=3 is more than --partition='debug' has (2)", ftc_home)
    assert_refused(ftc(*flags, "--max-hours", "9"), "--max-hours=9 is more than --partition='debug' allows", ftc_home)
    no_partition = ftc(*flags, env={"FTC_PARTITION": ""})
    assert_refused(no_partition, "--provider='slurm' needs --partition", ftc_home)
    # LOGIN: Slurm driven through a login node (here node 1, whose sshd sets SLURM_CONF), then one that refuses
    login = f"root@{slurm.address(0)}"
    assert_refused(ftc(*flags, "--partition", "nosuch", "--login", login), "is not a partition of this Slurm", ftc_home)
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    refused = ftc(*flags, "--login", login, "--ssh-key", str(other))
    assert_refused(refused, f"--login='{login}:22' refused ftc's login", ftc_home)
    assert "Permission denied" in only_line(refused)
    assert queue(slurm) == []


@pytest.mark.slow
def test_an_allocation_cancelled_under_the_cluster_is_named_with_slurms_reason_and_down_still_cleans(slurm, ftc_home):
    before = homes(slurm)
    up = ftc("up", "--name", "gone", "--provider", "slurm", "--max-hours", "1", "--no-bootstrap", "--yes", "1")
    assert up.returncode == 0, up.stderr
    job_id = next(line.split()[0] for line in queue(slurm))
    subprocess.run(["scancel", job_id], check=True, env={**os.environ, **slurm.env()})
    wait_for(lambda: queue(slurm) == [], "the allocation to leave the queue", timeout=120)
    status = ftc("status", "--name", "gone")
    assert f"Slurm allocation {job_id} is CANCELLED" in status.stdout, status.stdout + status.stderr
    down = ftc("down", "--name", "gone")
    assert down.returncode == 0, down.stderr
    assert homes(slurm) == before and queue(slurm) == []


@pytest.mark.slow
def test_only_slurm_saying_it_does_not_know_a_job_reads_as_the_jobs_end(slurm, monkeypatch):
    import provision.providers.slurm as provider
    spec = resolve_spec({"provider": "slurm", "partition": "debug"}, {})
    assert provider._allocation(spec, "99999999").state == "GONE"  # an id this Slurm never gave, or forgot
    # a Slurm that does not answer (here: a configuration it cannot parse, so no controller to ask) is not a
    # job's end. Not a missing file: scontrol then looks for a configless controller in DNS for a minute.
    unreadable = slurm.root / "unreadable.conf"
    unreadable.write_text("this is not slurm.conf\n")
    monkeypatch.setenv("SLURM_CONF", str(unreadable))
    monkeypatch.setattr(provider, "GONE_WITHIN_S", 0)
    with pytest.raises(FtcError, match=r"Slurm did not say how allocation 7 stands for 0 s \(.+\); "
                                        r"`scontrol show job -o 7` asks it again"):
        provider._allocation(spec, "7")


@pytest.mark.slow
def test_an_allocation_that_ends_under_a_job_is_named_with_slurms_reason(slurm, ftc_home, tiny_bert, glue_dir):
    before = homes(slurm)
    up = ftc("up", "--name", "end", "--provider", "slurm", "--max-hours", "1", "--yes", "1")
    assert up.returncode == 0, up.stderr
    job_id = next(line.split()[0] for line in queue(slurm))
    proc = subprocess.Popen([*FTC, "finetune", "--name", "end", "--task", "mrpc", "--model", tiny_bert, "--data-dir",
                             str(glue_dir), "--max-train-samples", "64", "--max-eval-samples", "16", "--epochs", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "FTC_HOLD_AT_STEP": "1"})
    try:
        held_job(ftc_home, "end", proc)  # the job is held at its first step: the allocation ends under it
        subprocess.run(["scancel", job_id], check=True, env={**os.environ, **slurm.env()})
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, out + err
    assert f"Slurm allocation {job_id} is CANCELLED" in err, out + err
    down = ftc("down", "--name", "end")
    assert down.returncode == 0, down.stderr
    assert homes(slurm) == before and queue(slurm) == [] and processes_under(slurm.root) == []


@pytest.mark.slow
def test_nodes_that_refuse_ssh_are_reached_through_srun_for_bootstrap_jobs_and_down(ftc_home, tmp_path, monkeypatch,
                                                                                      tiny_bert, glue_dir):
    from slurm_sandbox import Sandbox
    # a site without ssh to its nodes but its login node (here the first node, whose sshd sets SLURM_CONF)
    closed = Sandbox(tmp_path / "closed", nodes=2, ssh=False, login=True).start()
    try:
        for key, value in closed.exports().items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("HOME", str(closed.home))  # your home as the nodes see it: their sshd reads your keys there
        before = homes(closed)
        up = make("cluster", "NAME=shut", "PROVIDER=slurm", "NODES=2", "MAX_HOURS=1", home=ftc_home)
        assert up.returncode == 0, up.stdout + up.stderr
        job_id = next(line.split()[0] for line in queue(closed))
        assert f"nodes reached through srun --jobid {job_id} --overlap, not ssh: ftcn2 ({closed.address(1)}) does not " \
            "answer ssh on port 22 from here\n" in up.stderr, up.stderr
        assert "verified: mpirun hostname on 2 node(s)" in up.stdout + up.stderr
        steps = subprocess.run(["squeue", "-h", "-s", "-o", "%j %N"], capture_output=True, text=True, check=True,
                               env={**os.environ, **closed.env()}).stdout.splitlines()
        assert "sh ftcn[1-2]" in steps, steps  # the private sshd's step, one task on each node

        script = tmp_path / "work" / "ranks.py"
        script.parent.mkdir()
        script.write_text(RANK_SCRIPT)
        launch = make("launch", "NAME=shut", f"SCRIPT={script}", home=ftc_home)
        assert launch.returncode == 0, launch.stdout + launch.stderr
        seen = next((ftc_home / "runs" / "shut").glob("script-*/output/rank0.txt")).read_text()
        assert seen.startswith("ftcn1 ") and "RANK=0 WORLD_SIZE=2 LOCAL_RANK=0" in seen, seen
        job = ftc("finetune", "--name", "shut", "--task", "mrpc", "--model", tiny_bert, "--data-dir", str(glue_dir),
                  "--max-train-samples", "32", "--max-eval-samples", "16", "--epochs", "1", timeout=400)
        assert job.returncode == 0 and "2 (2 node(s) x 1)" in job.stdout + job.stderr, job.stdout + job.stderr
        there = ftc("ssh", "--name", "shut", "--", "hostname")
        assert there.returncode == 0 and there.stdout.split()[-1] == "ftcn1", there.stdout + there.stderr

        down = make("destroy", "NAME=shut", home=ftc_home)
        assert down.returncode == 0, down.stderr
        assert queue(closed) == [] and homes(closed) == before and processes_under(closed.root) == []
        assert not list(Path("/tmp").glob(f"ftc-sshd-{job_id}.*"))  # each node's private sshd took its files along

        # Slurm driven through LOGIN: the relays start there too
        login = f"root@{closed.address(0)}"
        via = ftc("up", "--name", "via", "--provider", "slurm", "--nodes", "2", "--max-hours", "1", "--login", login,
                  "--no-bootstrap", "--yes", "1")
        assert via.returncode == 0, via.stderr
        assert f"Slurm (through {login}:22)" in via.stderr and "nodes reached through srun" in via.stderr, via.stderr
        there = ftc("ssh", "--name", "via", "--node", "1", "--", "hostname")
        assert there.returncode == 0 and there.stdout.split()[-1] == "ftcn2", there.stdout + there.stderr
        assert ftc("down", "--name", "via").returncode == 0
        assert queue(closed) == [] and homes(closed) == before and processes_under(closed.root) == []
    finally:
        closed.stop()


@pytest.mark.slow
def test_slurms_sigterm_to_the_allocation_is_a_notice_node_0_reads_and_down_removes_it(slurm, ftc_home, monkeypatch):
    monkeypatch.setenv("HOME", str(slurm.home))  # your home as the nodes see it: the batch script's too
    before = homes(slurm)
    up = ftc("up", "--name", "term", "--provider", "slurm", "--max-hours", "1", "--no-bootstrap", "--yes", "1")
    assert up.returncode == 0, up.stderr
    job_id = next(line.split()[0] for line in queue(slurm))
    node_0 = str(slurm.home / ".ftc-node" / "term.ftcn1")
    assert notice(node_0) is None
    # what Slurm sends the batch script before it preempts the job (and, by sbatch --signal, before its time limit)
    subprocess.run(["scancel", "--batch", "--signal=TERM", job_id], check=True, env={**os.environ, **slurm.env()})
    wait_for(lambda: notice(node_0) is not None, "the batch script's notice on node 0", timeout=60)
    found = notice(node_0)
    assert (found["action"], found["source"]) == ("terminate", "slurm") and found["time"].endswith("Z"), found
    assert [line.split()[1:] for line in queue(slurm)] == [["ftc-term", "RUNNING"]]  # held until Slurm ends it
    down = ftc("down", "--name", "term")
    assert down.returncode == 0, down.stderr
    assert queue(slurm) == [] and homes(slurm) == before  # the notice went with node 0's directory


@pytest.mark.slow
def test_slurms_sigterm_stops_a_job_at_a_checkpoint_and_run_resumes_it_on_a_new_allocation(slurm, ftc_home, tiny_bert,
                                                                                           glue_dir, monkeypatch):
    """Not a spot cluster: Slurm's notice reaches every job. Slurm sends the batch script SIGTERM (as before
    a preemption); a job started then reads the notice before its first step, stops after it at a
    checkpoint (exit 75), and `ftc run --resume` trains on from there on a new allocation."""
    import json
    monkeypatch.setenv("HOME", str(slurm.home))  # your home as the nodes see it: the batch script's too
    before = homes(slurm)
    up = ftc("up", "--name", "pre", "--provider", "slurm", "--max-hours", "1", "--yes", "1")
    assert up.returncode == 0, up.stderr
    first_allocation = next(line.split()[0] for line in queue(slurm))
    subprocess.run(["scancel", "--batch", "--signal=TERM", first_allocation], check=True,
                   env={**os.environ, **slurm.env()})
    wait_for(lambda: notice(str(slurm.home / ".ftc-node" / "pre.ftcn1")) is not None, "the notice on node 0", timeout=60)
    flags = ["--task", "mrpc", "--model", tiny_bert, "--data-dir", str(glue_dir), "--max-train-samples", "128",
             "--max-eval-samples", "16", "--epochs", "2"]  # 2 steps an epoch on 2 nodes
    stopped = ftc("finetune", "--name", "pre", *flags, timeout=900)
    assert stopped.returncode == 75, stopped.stderr[-3000:]
    down = ftc("down", "--name", "pre")
    assert down.returncode == 0, down.stderr
    resumed = ftc("run", "--name", "pre", "--provider", "slurm", "--max-hours", "1", "--yes", "1", "--resume", "1",
                  *flags, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stderr, resumed.stderr[-3000:]
    results = sorted((ftc_home / "runs" / "pre").glob("*/results.json"))
    assert results and json.loads(results[-1].read_text())["resumed_from_batch"] >= 1, results
    assert queue(slurm) == [] and homes(slurm) == before and processes_under(slurm.root) == []


@pytest.mark.slow
def test_an_allocation_held_while_it_waits_is_cancelled_naming_slurms_reason(slurm, ftc_home):
    proc = subprocess.Popen([*FTC, "up", "--name", "hold", "--provider", "slurm", "--partition", "held", "--nodes",
                             "1", "--max-hours", "1"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env=os.environ.copy())
    try:
        until_line(proc, "PENDING (PartitionDown)")
        job_id = queue(slurm)[0].split()[0]
        subprocess.run(["scontrol", "uhold", job_id], check=True, env={**os.environ, **slurm.env()})
        rest = rest_of(proc)
        assert proc.wait(120) == 1, rest
    finally:
        if proc.poll() is None:
            proc.kill()
    assert f"Slurm allocation {job_id} is PENDING (JobHeldUser): it does not start by waiting" in rest, rest
    assert queue(slurm) == [] and not (ftc_home / "clusters" / "hold").exists()
