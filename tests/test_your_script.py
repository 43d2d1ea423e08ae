"""Your own training script on the cluster (`ftc launch`): real sshd nodes, Intel MPI's mpirun, gloo
ranks and real training. What every rank sees, the outcome a failing rank gives, cancel, the
requirements step, and the bad input refused before anything starts."""

import base64
import hashlib
import io
import json
import os
import subprocess
import uuid
import zipfile
from pathlib import Path

import pytest
from conftest import FTC, REPO, ftc, processes_under
from helpers import gloo_script, last_job, make, one_error, state_of, up_local, wait_for

from runner import script_job
from runner.node.protocol import RankExit, first_failure
from runner.node.script_rank import torchrun_env

EXAMPLE = REPO / "examples" / "hf_trainer_glue.py"


# ---- the decisions, pure ------------------------------------------------------------------------------

def test_each_rank_gets_torchruns_variables_with_its_node_as_group():
    env = torchrun_env(rank=5, world=8, local_rank=1, local_world=4)
    assert env["RANK"] == "5" and env["WORLD_SIZE"] == "8" and env["LOCAL_RANK"] == "1"
    assert env["LOCAL_WORLD_SIZE"] == "4" and env["GROUP_RANK"] == "1"


def test_the_first_rank_to_fail_is_the_one_named_not_those_mpirun_stopped_after_it():
    exits = [RankExit(0, "a", 143, 12.0), RankExit(1, "b", 3, 10.0), RankExit(2, "b", 0, 9.0)]
    assert first_failure(exits).rank == 1
    assert first_failure([RankExit(0, "a", 0, 1.0)]) is None


def test_the_workdir_copy_leaves_out_git_venv_caches_and_what_gitignore_ignores(tmp_path):
    for name in ("train.py", "data/a.tsv", "data/big.bin", "sub/keep.txt", "sub/skip.log", ".git/HEAD",
                 ".venv/bin/python", "pkg/__pycache__/m.pyc", "output/old.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    (tmp_path / ".gitignore").write_text("*.bin\noutput/\n")
    (tmp_path / "sub" / ".gitignore").write_text("*.log\n")
    copied = sorted(p.relative_to(tmp_path).as_posix() for p in script_job.workdir_files(tmp_path))
    assert copied == [".gitignore", "data/a.tsv", "sub/.gitignore", "sub/keep.txt", "train.py"]


def test_the_workdir_copy_never_takes_ftc_home_or_your_ssh_and_aws_folders(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))  # the workdir is your home
    monkeypatch.setenv("FTC_HOME", str(tmp_path / "state"))
    for name in ("train.py", "state/clusters/c/access_key", ".ssh/id_ed25519", ".aws/credentials", "data/a.tsv"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    copied = sorted(p.relative_to(tmp_path).as_posix() for p in script_job.workdir_files(tmp_path))
    assert copied == ["data/a.tsv", "train.py"]
    said = capsys.readouterr().err
    assert "left out of the copy: state (FTC_HOME: every cluster's private keys)" in said
    assert "left out of the copy: .ssh (your ssh keys)" in said and ".aws (your AWS credentials)" in said


def test_the_workdir_copy_follows_gitignore_as_git_does_across_levels_and_odd_lines(tmp_path):
    for name in ("train.py", "a.txt", "sub/keep.txt", "sub/x.txt", "sub/deep/keep.txt", "foo\\", "z"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    # lines git takes: a lone "!", an empty range, a trailing backslash; the last matching rule wins, across levels
    (tmp_path / ".gitignore").write_text("!\n[z-a]\nfoo\\\n*.txt\n")
    (tmp_path / "sub" / ".gitignore").write_text("!keep.txt\n")
    copied = sorted(p.relative_to(tmp_path).as_posix() for p in script_job.workdir_files(tmp_path))
    assert {"sub/keep.txt", "sub/deep/keep.txt", "train.py"} <= set(copied) and "a.txt" not in copied
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)  # what git itself would keep
    kept = subprocess.run(["git", "-c", "core.excludesFile=/dev/null", "ls-files", "-o", "--exclude-standard", "-z"],
                          cwd=tmp_path, capture_output=True, check=True).stdout.decode().split("\0")
    assert copied == sorted(k for k in kept if k)


def test_a_workdir_over_the_limit_names_its_largest_entries(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "huge.bin").write_bytes(b"\0" * (3 * 2**20))
    (tmp_path / "train.py").write_text("print(1)\n")
    with pytest.raises(script_job.UsageError, match=r"3\.0 MB to copy to every node, over the 2 MB limit "
                                                    r"\(largest: data/ 3\.0 MB, train\.py 0\.0 MB\)"):
        script_job.refuse_oversized(tmp_path, script_job.copy_of(script_job.ScriptJob(tmp_path, "train.py")), 2)


def test_links_in_the_workdir_copy_files_not_folders_and_a_name_not_utf8_is_refused(tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "rows.csv").write_text("a,b\n")
    (tmp_path / "same.csv").symlink_to(tmp_path / "data" / "rows.csv")  # a link to a file: copied as the file
    (tmp_path / "loop").symlink_to(".")  # links to folders: followed, these copy without end
    (tmp_path / "root").symlink_to("/")
    copied = sorted(p.relative_to(tmp_path).as_posix() for p in script_job.workdir_files(tmp_path))
    assert copied == ["data/rows.csv", "same.csv", "train.py"]
    (tmp_path / os.fsdecode(b"bad\xff.txt")).write_text("x")
    with pytest.raises(script_job.UsageError, match=r"the name b'.*bad\\xff\.txt' is not UTF-8"):
        script_job.workdir_files(tmp_path)


def test_data_outside_the_workdir_travels_in_its_copy_under_its_own_name(tmp_path):
    workdir, shared = tmp_path / "work", tmp_path / "shared"
    for name in ("work/train.py", "shared/mrpc/train.tsv", "shared/mrpc/dev.tsv", "shared/mrpc/notes.log",
                 "shared/mrpc/.gitignore", "shared/model/config.json", "shared/vocab.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    (shared / "mrpc" / ".gitignore").write_text("*.log\n")  # a data folder's files are chosen as the workdir's
    job = script_job.validate(str(workdir / "train.py"), [], data=[f"{shared / 'mrpc'},{shared / 'model'}",
                                                                   str(shared / "vocab.txt")])
    copy = script_job.copy_of(job)
    assert {name: path.relative_to(tmp_path).as_posix() for name, path in copy.items()} == {
        "train.py": "work/train.py", "mrpc/.gitignore": "shared/mrpc/.gitignore",
        "mrpc/train.tsv": "shared/mrpc/train.tsv", "mrpc/dev.tsv": "shared/mrpc/dev.tsv",
        "model/config.json": "shared/model/config.json", "vocab.txt": "shared/vocab.txt"}
    (shared / "mrpc" / "big.bin").write_bytes(b"\0" * 2**21)  # counted with the workdir's files
    with pytest.raises(script_job.UsageError, match=r"over the 1 MB limit \(largest: mrpc/ 2\.0 MB"):
        script_job.refuse_oversized(workdir, script_job.copy_of(job), 1)


def test_arguments_naming_files_the_ranks_will_not_find_are_warned_of(tmp_path, monkeypatch):
    from runner import script_data
    for name in ("work/train.py", "work/data/a.tsv", "elsewhere/b.tsv", "shared/mrpc/train.tsv"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    workdir, shared = tmp_path / "work", tmp_path / "shared"
    copy = script_job.copy_of(script_job.validate(str(workdir / "train.py"), [], data=[str(shared / "mrpc")]))
    args = ["--a", "data/a.tsv", "--b=mrpc/train.tsv", "work/data/a.tsv", "--c", str(tmp_path / "elsewhere" / "b.tsv"),
            f"--d={shared}/mrpc/train.tsv", str(workdir / "data" / "a.tsv"), "--lr", "2e-5", "output/",
            "a prompt, not a path " * 20, "/" + "x" * 300]  # no file can have these names
    # from the workdir, on local nodes: every relative path is in the copy, absolute ones are read in place
    assert script_data.unseen_paths(args, copy, workdir, workdir, shared=True) == []
    # from the folder above: 'work/data/a.tsv' names nothing in the copy (its 'data/a.tsv' does)
    (said,) = script_data.unseen_paths(args, copy, workdir, tmp_path, shared=True)
    assert said.startswith(f"argument 'work/data/a.tsv' names {tmp_path}/work/data/a.tsv from your current folder, "
                           f"but each rank runs from its copy of the workdir ({workdir})")
    # on nodes that are not this machine, absolute paths outside the workdir too, with what to do
    assert script_data.unseen_paths(args, copy, workdir, workdir, shared=False) == [
        f"argument '{tmp_path}/elsewhere/b.tsv' is a path on this machine, which the nodes do not see (unless they "
        f"mount it too); send it with --data={tmp_path}/elsewhere/b.tsv and name it 'b.tsv'",
        f"argument '{shared}/mrpc/train.tsv' is a path on this machine, which the nodes do not see (unless they mount "
        "it too); it is sent as 'mrpc/train.tsv': name it so"]


def test_data_that_cannot_travel_is_refused_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("FTC_HOME", str(tmp_path / "state"))
    for name in ("work/train.py", "work/mrpc/x.tsv", "a/mrpc/train.tsv", "b/mrpc/train.tsv", "c/output/x",
                 "state/clusters/c/key"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    os.mkfifo(tmp_path / "fifo")
    script = str(tmp_path / "work" / "train.py")
    cases = [
        (str(tmp_path / "none"), "--data='{t}/none' is not a file or folder ({t}/none); give one your script reads"),
        (str(tmp_path / "fifo"), "--data='{t}/fifo' is not a regular file or folder"),
        (f"{tmp_path / 'a'},", "--data='{t}/a,' has an empty entry"),
        (str(tmp_path), "--data='{t}' holds the workdir ({t}/work); give the data's own folder"),
        (str(tmp_path / "work" / "mrpc"), "lies inside the workdir, whose copy holds it already"),
        (str(tmp_path / "a" / "mrpc"), "--data='{t}/a/mrpc' would be copied as 'mrpc', the name of {t}/work/mrpc"),
        (str(tmp_path / "c" / "output"), "would be copied as 'output', the name of --output='output' in the"),
        (str(tmp_path / "state"), "is never copied to the nodes (FTC_HOME: every cluster's private keys)"),
    ]
    for given, said in cases:
        with pytest.raises(script_job.UsageError) as refused:
            script_job.validate(script, [], data=[given])
        assert said.format(t=tmp_path) in str(refused.value), str(refused.value)
    (tmp_path / "work" / "mrpc" / "x.tsv").unlink()
    (tmp_path / "work" / "mrpc").rmdir()
    with pytest.raises(script_job.UsageError, match="would be copied as 'mrpc', the name of .*/a/mrpc"):
        script_job.validate(script, [], data=[str(tmp_path / "a" / "mrpc"), str(tmp_path / "b" / "mrpc")])


@pytest.mark.parametrize(("given", "said"), [
    (["--nproc-per-node", "2"], "--nproc-per-node is torchrun's option, not ftc launch's: ranks per node are --ppn N"),
    (["--nproc_per_node=2"], "--nproc-per-node is torchrun's option"),
    (["--nnodes", "2"], "the job runs on every node of the cluster (`ftc up --nodes N` sets how many)"),
    (["--standalone"], "--standalone is torchrun's option, not ftc launch's: ftc sets MASTER_ADDR and MASTER_PORT"),
])
def test_torchruns_own_options_are_refused_saying_what_ftc_does_instead(ftc_home, tmp_path, given, said):
    proc = ftc("launch", "--name", "no-such", *given, "--", str(gloo_script(tmp_path)), "--nnodes", "3")
    assert proc.returncode == 2 and said in one_error(proc), proc.stderr
    assert not ftc_home.exists()


@pytest.mark.parametrize("raw", ["../out", "/tmp/out", ".", "a/../../b"])
def test_an_output_folder_outside_the_workdir_is_refused(raw):
    with pytest.raises(script_job.UsageError, match="is not a folder inside the workdir"):
        script_job._relative_inside("OUTPUT", raw)


@pytest.mark.parametrize("pair", ["PYTHONHOME=/x", "PYTHONSTARTUP=/x", "BASH_ENV=/x", "GLOO_SOCKET_IFNAME=lo",
                                  "I_MPI_PIN=0", "OMPI_MCA_btl=tcp", "HOME=/x", "USER=x"])
def test_an_env_that_would_change_ftcs_own_launch_or_the_nodes_account_is_refused(pair):
    from provision.errors import UsageError
    with pytest.raises(UsageError, match=f"ftc sets {pair.split('=')[0]} for every rank"):
        script_job._env_pairs([pair])


def test_your_shells_hugging_face_variables_reach_ranks_on_this_machine_only():
    shell = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "HOME": "/home/me", "HFX": "no"}
    assert script_job.passed_on(shell, "local") == {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    assert script_job.passed_on(shell, "ssh") == {}


# ---- bad input: one line, exit code 2, nothing started ----------------------------------------------------

@pytest.mark.slow
def test_bad_launches_are_refused_in_one_line_before_anything_starts(ftc_home, tmp_path):
    workdir = tmp_path / "work"
    script = gloo_script(workdir)
    (tmp_path / "outside.py").write_text("print(1)\n")
    (workdir / "big.bin").write_bytes(b"\0" * (2 * 2**20))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    up_local("nb", nodes=1)  # up, not bootstrapped
    before = state_of(ftc_home, "nb")
    cases = [
        (["--name", "nb", "--", str(workdir / "missing.py")], "script="),  # an operand: no flag
        (["--name", "nb", "--workdir", str(workdir), "--", str(tmp_path / "outside.py")], "is outside --workdir="),
        (["--name", "nb", "--", str(script), "--requirements", "x"], None),  # after the script: its own argument
        (["--name", "nb", "--requirements", str(tmp_path / "no-such.txt"), "--", str(script)], "--requirements="),
        (["--name", "nb", "--requirements", str(workdir), "--", str(script)], "is a directory"),
        (["--name", "nb", "--requirements", "/dev/zero", "--", str(script)], "'/dev/zero' is not a regular file"),
        (["--name", "nb", "--requirements", str(fifo), "--", str(script)], "is not a regular file"),
        (["--name", "nb", "--requirements", str(workdir / "big.bin"), "--", str(script)], "is over 1 MB"),
        (["--name", "nb", "--output", "../elsewhere", "--", str(script)], "--output='../elsewhere' is not a folder"),
        (["--name", "nb", "--output", "gloo_job.py", "--", str(script)], "--output='gloo_job.py': gloo_job.py is a file"),
        (["--name", "nb", "--output", "big.bin/out", "--", str(script)], "--output='big.bin/out': big.bin is a file"),
        (["--name", "nb", "--env", "RANK=3", "--", str(script)], "ftc sets RANK"),
        (["--name", "nb", "--data", str(tmp_path / "no-data"), "--", str(script)], "is not a file or folder"),
        (["--name", "nb", "--data", str(workdir / "big.bin"), "--", str(script)], "lies inside the workdir"),
        (["--name", "nb", "--env", "not a pair", "--", str(script)], "--env='not a pair'"),
        (["--name", "nb", "--ppn", "0", "--", str(script)], "--ppn="),
        (["--name", "nb", "--", str(workdir / "a\nb.py")], "control character"),
        (["--name", "nb", "--", f" {script}"], "begins or ends with a space"),
        (["--name", "nb", "--env", "PATH=/x", "--", str(script)], "ftc sets PATH"),
        (["--name", "nb", "--", str(script), os.fsdecode(b"caf\xe9")], "argument=b'caf\\xe9' is not UTF-8"),
        (["--name", "nb", "--workdir", os.fsdecode(os.fsencode(workdir) + b"\xff"), "--", str(script)], "is not UTF-8"),
        (["--name", "nb", "--max-workdir-mb", "", "--", str(script)], "--max-workdir-mb=''"),
        (["--name", "nb", "--script", str(script), "--args", "--x 'unclosed"], "close its quotes"),
        (["--name", "nb", "--script", str(script), "--args", "x \\"], "its last backslash escapes nothing: drop it, "
                                                                     "or write \\\\ for a backslash"),
        (["--name", "no-such-cluster", "--", str(script)], "--name='no-such-cluster'"),
        (["--name", "nb", "--", str(script)], "is not bootstrapped"),
    ]
    for args, named in cases:
        proc = ftc("launch", *args)
        if named is None:  # `--requirements x` after the script went to the script: the cluster is what stops it
            assert proc.returncode == 2 and "is not bootstrapped" in one_error(proc)
            continue
        assert proc.returncode == 2, (args, proc.stderr)
        assert named in one_error(proc), (args, proc.stderr)
    assert state_of(ftc_home, "nb") == before
    assert not (ftc_home / "runs").exists()
    assert not list((Path(before["nodes"][0]["workdir"])).glob("jobs/*"))
    assert ftc("down", "--name", "nb").returncode == 0


# ---- real runs on two local nodes --------------------------------------------------------------------------

@pytest.mark.slow
def test_the_example_trainer_script_trains_on_two_nodes_and_its_output_comes_home(ftc_home, cluster, minilm,
                                                                                    glue_dir, tmp_path):
    proc = ftc("launch", "--name", cluster, "--workdir", str(REPO / "examples"), "--", str(EXAMPLE),
               "--model", minilm, "--train-file", str(glue_dir / "mrpc" / "train.tsv"),
               "--validation-file", str(glue_dir / "mrpc" / "dev.tsv"), "--max-train-samples", "32",
               "--max-eval-samples", "16", "--epochs", "1", "--batch-size", "8")
    assert proc.returncode == 0, proc.stderr[-3000:]
    job = last_job(ftc_home, cluster)
    assert job["kind"] == "script" and job["state"] == "finished"
    output = Path(job["results_dir"]) / "output"
    result = json.loads((output / "result.json").read_text())
    assert result["world_size"] == 2 and 0 <= result["eval_accuracy"] <= 1
    assert (output / "model.safetensors").exists() or list(output.glob("*.safetensors"))
    ranks = [json.loads((output / "ranks" / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [(r["rank"], r["local_rank"], r["group_rank"]) for r in ranks] == [(0, 0, 0), (1, 0, 1)]
    assert not set(ranks[0]["cpus"]) & set(ranks[1]["cpus"])  # each rank on its own cores
    assert {int(r["omp_num_threads"]) for r in ranks} == {len(ranks[0]["cpus"])}

    listed = json.loads(ftc("runs", "--json").stdout)
    run = next(r for r in listed if r["id"] == job["id"])
    assert run["kind"] == "script" and run["exit_code"] == 0 and run["output_bytes"] > 0
    assert run["command"].startswith("python hf_trainer_glue.py --model")
    assert (run["nodes"], run["ranks_per_node"]) == (2, 1) and run["wall_seconds"] > 0
    shown = ftc("runs", "show", job["id"])
    assert shown.returncode == 0, shown.stderr
    assert "python hf_trainer_glue.py" in shown.stdout and "rank 0's log" in shown.stdout


# On PYTHONPATH under plain torchrun: rank 0 is held inside save_model until rank 1 is either waiting to
# leave the process group with it (its barrier) or has exited (the abort the example must not have).
HOLD_SAVE = """
import atexit, os, pathlib, time
signal_file = pathlib.Path(os.environ["FTC_TEST_RANK1"])
def say(text):  # whole or not at all: rank 0 never reads a file rank 1 has made but not yet written
    partial = signal_file.with_name(signal_file.name + ".partial")
    partial.write_text(text)
    os.replace(partial, signal_file)
if os.environ.get("RANK") == "1":
    import torch.distributed
    barrier = torch.distributed.barrier
    def at_barrier(*args, **kwargs):
        say("barrier")
        return barrier(*args, **kwargs)
    torch.distributed.barrier = at_barrier
    atexit.register(lambda: signal_file.exists() or say(f"exit {os.getpid()}"))
elif os.environ.get("RANK") == "0":
    import transformers
    save = transformers.Trainer.save_model
    def held_save(self, *args, **kwargs):
        while not signal_file.exists():
            time.sleep(0.1)
        said = signal_file.read_text().split()
        while said[0] == "exit" and pathlib.Path(f"/proc/{said[1]}/cmdline").exists():  # until rank 1 has gone
            time.sleep(0.1)
        return save(self, *args, **kwargs)
    transformers.Trainer.save_model = held_save
"""


@pytest.mark.slow
def test_the_example_leaves_its_process_group_together_under_plain_torchrun(minilm, glue_dir, tmp_path):
    import sys
    (tmp_path / "hold" / "sitecustomize.py").parent.mkdir()
    (tmp_path / "hold" / "sitecustomize.py").write_text(HOLD_SAVE)
    torchrun = Path(sys.executable).with_name("torchrun")
    proc = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", str(EXAMPLE), "--model", minilm,
                           "--train-file", str(glue_dir / "mrpc" / "train.tsv"), "--validation-file",
                           str(glue_dir / "mrpc" / "dev.tsv"), "--max-train-samples", "16", "--max-eval-samples", "16",
                           "--epochs", "1", "--batch-size", "8", "--output-dir", str(tmp_path / "output")],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(tmp_path / "hold"), "OMP_NUM_THREADS": "1",
                               "FTC_TEST_RANK1": str(tmp_path / "rank1"), "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert (tmp_path / "rank1").read_text() == "barrier"  # rank 1 waited for rank 0 to finish writing the model
    assert "terminate called" not in proc.stderr
    assert json.loads((tmp_path / "output" / "result.json").read_text())["world_size"] == 2


# A plain PyTorch DDP script with its own loop, written from the docs alone: a hashed bag-of-words
# paraphrase classifier on MRPC; rank 0 writes dev accuracy and a digest of the final weights.
DDP_LOOP = """
import argparse, csv, gc, hashlib, json, os, re
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
p = argparse.ArgumentParser()
p.add_argument("--train", required=True)
p.add_argument("--dev", required=True)
p.add_argument("--rows", type=int, default=256)
p.add_argument("--out", default=os.environ.get("FTC_OUTPUT_DIR", "out"))
args = p.parse_args()
dist.init_process_group("gloo")
torch.manual_seed(0)
def load(path):
    with open(path, encoding="utf-8-sig", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\\t", quoting=csv.QUOTE_NONE))[:args.rows]
    ids = torch.zeros(len(rows), 2, 32, dtype=torch.long)
    for i, row in enumerate(rows):
        for j, side in enumerate(("#1 String", "#2 String")):
            words = [int(hashlib.md5(w.encode()).hexdigest(), 16) % 4095 + 1 for w in re.findall("[a-z0-9]+", row[side].lower())]
            ids[i, j, :len(words[:32])] = torch.tensor(words[:32], dtype=torch.long)
    return TensorDataset(ids, torch.tensor([int(r["Quality"]) for r in rows]))
class Pair(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.EmbeddingBag(4096, 32, mode="mean", padding_idx=0)
        self.head = torch.nn.Linear(128, 2)
    def forward(self, ids):
        a, b = self.embed(ids[:, 0]), self.embed(ids[:, 1])
        return self.head(torch.cat([a, b, (a - b).abs(), a * b], dim=1))
train, dev = load(args.train), load(args.dev)
sampler = DistributedSampler(train, shuffle=True, seed=0)
model = DDP(Pair())
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
for epoch in range(2):
    sampler.set_epoch(epoch)
    for ids, labels in DataLoader(train, batch_size=16, sampler=sampler):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(ids), labels).backward()
        opt.step()
mine = torch.arange(dist.get_rank(), len(dev), dist.get_world_size())
with torch.no_grad():
    right = torch.tensor([float((model(dev.tensors[0][mine]).argmax(1) == dev.tensors[1][mine]).sum())])
dist.all_reduce(right)
if dist.get_rank() == 0:
    os.makedirs(args.out, exist_ok=True)
    weights = b"".join(t.detach().numpy().tobytes() for t in model.module.parameters())
    result = {"world": dist.get_world_size(), "dev_accuracy": right.item() / len(dev),
              "weights": hashlib.sha256(weights).hexdigest()}
    open(os.path.join(args.out, "metrics.json"), "w").write(json.dumps(result))
del model, opt  # DDP freed by the interpreter's exit aborts a rank under plain torchrun (docs/your-script.md)
gc.collect()
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_plain_ddp_loop_gives_plain_torchruns_result_to_the_bit(ftc_home, cluster, glue_dir, tmp_path):
    """Nothing of ftc in the script; its data sent with --data on one side, read in place by torchrun on
    the other. Same ranks, same shards, same cores and threads: the same weights, bit for bit."""
    import sys
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "ddp_loop.py").write_text(DDP_LOOP)
    under_ftc = ftc("launch", "--name", cluster, "--data", str(glue_dir / "mrpc"), "--",
                    str(tmp_path / "work" / "ddp_loop.py"), "--train", "mrpc/train.tsv", "--dev", "mrpc/dev.tsv")
    assert under_ftc.returncode == 0, under_ftc.stderr[-3000:]
    assert "warning" not in under_ftc.stderr  # its arguments name the copy's files: nothing to warn of
    torchrun = Path(sys.executable).with_name("torchrun")
    cores = sorted(os.sched_getaffinity(0))[:2]
    by_hand = subprocess.run(["taskset", "-c", ",".join(map(str, cores)), str(torchrun), "--standalone",
                              "--nproc-per-node", "2", str(tmp_path / "work" / "ddp_loop.py"), "--train",
                              str(glue_dir / "mrpc" / "train.tsv"), "--dev", str(glue_dir / "mrpc" / "dev.tsv"),
                              "--out", str(tmp_path / "torchrun")], capture_output=True, text=True, timeout=600,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert by_hand.returncode == 0, by_hand.stderr[-3000:]
    ours = json.loads((Path(last_job(ftc_home, cluster)["results_dir"]) / "output" / "metrics.json").read_text())
    theirs = json.loads((tmp_path / "torchrun" / "metrics.json").read_text())
    assert ours["world"] == theirs["world"] == 2 and ours == theirs

    # written where torchrun's user would find it (`--out results`), not into the output folder that comes home
    elsewhere = ftc("launch", "--name", cluster, "--data", str(glue_dir / "mrpc"), "--", str(tmp_path / "work" /
                    "ddp_loop.py"), "--train", "mrpc/train.tsv", "--dev", "mrpc/dev.tsv", "--rows", "32", "--out", "results")
    assert elsewhere.returncode == 0, elsewhere.stderr[-3000:]
    assert "rank 0 wrote nothing into its output folder ($FTC_OUTPUT_DIR), the one folder of the workdir's copy that " \
        "comes home: have your script write there, or name the folder it writes with --output" in elsewhere.stderr
    assert not (Path(last_job(ftc_home, cluster)["results_dir"]) / "output").exists()


@pytest.mark.slow
def test_what_each_rank_sees_a_failing_rank_and_shell_characters_in_names(ftc_home, cluster, tmp_path):
    # A workdir and a script whose names would run commands if any shell read them unquoted.
    # (a relative canary: whichever folder a shell would run it in lies under tmp_path, FTC_HOME included)
    run_me = "$(touch pwned)"
    workdir = tmp_path / f"w {run_me} `touch pwned`; 'q\""
    script = gloo_script(workdir, name=f"s;{run_me}.py")
    ok = ftc("launch", "--name", cluster, "--env", f"MY_SETTING=x {run_me}", "--", str(script),
             f"a {run_me}", "`touch pwned`", "c;d", "'e\"")
    assert ok.returncode == 0, ok.stderr[-3000:]
    job = last_job(ftc_home, cluster)
    seen = [json.loads((Path(job["results_dir"]) / "output" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [s["RANK"] for s in seen] == ["0", "1"] and {s["WORLD_SIZE"] for s in seen} == {"2"}
    assert {s["sum"] for s in seen} == {3.0} and {s["GROUP_RANK"] for s in seen} == {"0", "1"}
    assert seen[0]["words"] == [f"a {run_me}", "`touch pwned`", "c;d", "'e\""]
    assert seen[0]["MY_SETTING"] == f"x {run_me}" and seen[0]["FTC_RUN_ID"] == job["id"]
    assert seen[0]["MASTER_PORT"] and seen[0]["MASTER_ADDR"]
    assert seen[0]["cwd"] == str(Path(job["remote_dir"]) / "workdir") == seen[0]["path0"]
    assert not set(seen[0]["cpus"]) & set(seen[1]["cpus"])
    assert not list(tmp_path.rglob("pwned"))
    # it ended without leaving the process group: ftc's wrapper left it, and every rank exited 0
    exits = [json.loads((Path(job["results_dir"]) / "logs" / f"rank{r}.exit.json").read_text()) for r in (0, 1)]
    assert [e["code"] for e in exits] == [0, 0]

    failed = ftc("launch", "--name", cluster, "--", str(script), "--fail-rank", "1", "--code", "3")
    assert failed.returncode == 3, failed.stderr[-3000:]
    assert f"rank 1 on node {cluster}-1 failed first (exit code 3)" in failed.stderr
    assert "rank 1 gives up with 3" in failed.stderr  # the last lines of its log
    job = last_job(ftc_home, cluster)
    assert job["state"] == "failed"
    listed = json.loads(ftc("runs", "--json").stdout)
    assert next(r for r in listed if r["id"] == job["id"])["exit_code"] == 3
    shown = ftc("runs", "show", job["id"])  # the log of the rank that failed, not rank 0's
    assert "rank 1's log (it failed first, exit code 3)" in shown.stdout and "rank 1 gives up with 3" in shown.stdout


def test_with_a_workdir_a_relative_script_is_looked_up_in_it(tmp_path, monkeypatch):
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "probe.py").write_text("print(1)\n")
    monkeypatch.chdir(tmp_path)  # no probe.py here: only the workdir has it
    job = script_job.validate("probe.py", [], workdir=str(tmp_path / "w"))
    assert (job.workdir, job.script) == (tmp_path / "w", "probe.py")


ACCOUNT = """
import json, os
keys = ("HOME", "USER", "LOGNAME", "HF_HUB_OFFLINE", "TRANSFORMERS_VERBOSITY", "MINE")
seen = {k: os.environ.get(k) for k in keys}
seen["output made"] = os.path.exists(os.environ["FTC_OUTPUT_DIR"])  # not by ftc: run_glue.py refuses one that is there
print("rank", os.environ["RANK"], "sees", json.dumps(seen), flush=True)
"""


@pytest.mark.slow
def test_each_rank_gets_its_accounts_home_and_your_shells_hugging_face_settings(ftc_home, cluster, tmp_path):
    import pwd
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "account.py").write_text(ACCOUNT)
    proc = ftc("launch", "--name", cluster, "--env", "MINE=x", "--", str(tmp_path / "work" / "account.py"),
               env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    account = pwd.getpwuid(os.getuid())
    seen = [json.loads(line.split(" sees ", 1)[1]) for line in proc.stdout.splitlines() if " sees " in line]
    assert len(seen) == 2
    for env in seen:  # as under torchrun on this machine
        assert env == {"HOME": account.pw_dir, "USER": account.pw_name, "LOGNAME": account.pw_name,
                       "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "MINE": "x", "output made": False}


TRAINER_ON_CPU = """
import os, sys, torch
from transformers import Trainer, TrainingArguments
class Line(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Linear(2, 1)
    def forward(self, x, labels):
        return {"loss": ((self.w(x).squeeze(-1) - labels) ** 2).mean()}
rows = [{"x": torch.ones(2) * i, "labels": torch.tensor(float(i))} for i in range(16)]
args = TrainingArguments(output_dir=os.environ["FTC_OUTPUT_DIR"], per_device_train_batch_size=4, report_to="none",
                         save_strategy="no", use_cpu=sys.argv[1] == "1")
Trainer(model=Line(), args=args, train_dataset=rows).train()
"""


@pytest.mark.slow
def test_a_trainer_script_whose_ranks_each_train_alone_is_named(ftc_home, cluster, tmp_path):
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "trainer.py").write_text(TRAINER_ON_CPU)
    alone = ftc("launch", "--name", cluster, "--", str(tmp_path / "work" / "trainer.py"), "0")
    assert alone.returncode == 0, alone.stderr[-3000:]  # as under torchrun: it ran, each rank on all the rows
    assert "warning: none of the 2 ranks exchanged anything with the others" in alone.stderr
    assert "use_cpu=True" in alone.stderr
    together = ftc("launch", "--name", cluster, "--", str(tmp_path / "work" / "trainer.py"), "1")
    assert together.returncode == 0, together.stderr[-3000:]
    assert "exchanged anything" not in together.stderr
    # ranks that failed before they could exchange anything (a missing data file): the failure is the news
    crashed = ftc("launch", "--name", cluster, "--", str(tmp_path / "work" / "trainer.py"))
    assert crashed.returncode == 1 and "failed first (exit code 1)" in crashed.stderr, crashed.stderr[-3000:]
    assert "exchanged anything" not in crashed.stderr


@pytest.mark.slow
def test_cancel_of_a_detached_script_leaves_no_process(ftc_home, cluster, tmp_path):
    script = gloo_script(tmp_path / "work")
    started = ftc("launch", "--name", cluster, "--detach", "--", str(script), "--hold")
    assert started.returncode == 0, started.stderr
    job = last_job(ftc_home, cluster)
    held = Path(job["remote_dir"]) / "workdir" / "held"
    wait_for(held.exists, "the script to reach its hold point", timeout=300)
    assert len(processes_under(Path(job["remote_dir"]))) >= 3  # launch script, mpirun, ranks
    follower = subprocess.Popen([*FTC, "logs", "--name", cluster, "-f"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    # another cluster's job on this machine, started in the same second, whose nodes name the same job
    # directory (two EC2 emulator clusters): the same run id, a tag of its own
    assert job["tag"].startswith(job["id"]) and job["tag"] != job["remote_dir"]
    neighbour = subprocess.Popen(["sleep", "600"], env={**os.environ, "FTC_RUN_ID": job["id"],
                                                        "FTC_RUN_TAG": f"{job['id']}-0"})
    cancel = ftc("cancel", "--name", cluster)
    assert cancel.returncode == 0, cancel.stderr
    spared = neighbour.poll() is None
    neighbour.kill()
    neighbour.wait()
    assert spared, "cancel stopped another cluster's process with the same run id"
    assert last_job(ftc_home, cluster)["state"] == "cancelled"
    # what it wrote comes home with the cancel, its logs included
    assert "holding" in (Path(job["results_dir"]) / "logs" / "rank0.log").read_text()
    shown = ftc("runs", "show", job["id"])
    assert "no log of rank 0 home" not in shown.stdout + shown.stderr
    _, said = follower.communicate(timeout=120)  # a follower elsewhere is told the job was cancelled
    assert follower.returncode == 0 and "cancelled" in said and "busy" not in said, said
    # the launch script, mpirun and every rank (their command lines or folders are the job's) are gone
    wait_for(lambda: not processes_under(Path(job["remote_dir"])), "the script's processes to end", timeout=60)

    # A script that ignores SIGTERM and has started processes of its own (in its group, in a session of
    # its own): cancel leaves none of them.
    tag = str(7000 + os.getpid() % 2000)
    (tmp_path / "work" / "stubborn.py").write_text(STUBBORN.replace("{tag}", tag))
    started = ftc("launch", "--name", cluster, "--detach", "--", str(tmp_path / "work" / "stubborn.py"))
    assert started.returncode == 0, started.stderr
    job = last_job(ftc_home, cluster)
    wait_for((Path(job["remote_dir"]) / "workdir" / "held").exists, "the stubborn script to start", timeout=300)
    wait_for(lambda: len(_sleeping(tag)) == 4, "both ranks' processes to start")
    assert ftc("cancel", "--name", cluster).returncode == 0
    wait_for(lambda: not _sleeping(tag) and not processes_under(Path(job["remote_dir"])),
             "everything the stubborn script started to end", timeout=120)


@pytest.mark.slow
def test_ctrl_c_on_a_foreground_launch_stops_the_job_as_under_torchrun(ftc_home, cluster, tmp_path):
    import signal
    script = gloo_script(tmp_path / "work")
    proc = subprocess.Popen([*FTC, "launch", "--name", cluster, "--", str(script), "--hold"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    wait_for(lambda: (state_of(ftc_home, cluster)["jobs"] and
                      (Path(last_job(ftc_home, cluster)["remote_dir"]) / "workdir" / "held").exists())
             or proc.poll() is not None, "the script to reach its hold point", timeout=300)
    job = last_job(ftc_home, cluster)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "Ctrl-C stops it, as under torchrun (`--detach` starts one that runs on)" in err  # said as it started
    assert f"interrupted: stopping job {job['id']}" in err and "Traceback" not in err
    assert last_job(ftc_home, cluster)["state"] == "cancelled"
    assert "holding" in (Path(job["results_dir"]) / "logs" / "rank0.log").read_text()  # its files came home
    wait_for(lambda: not processes_under(Path(job["remote_dir"])), "the job's processes to end", timeout=60)


STUBBORN = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen(["sleep", "{tag}"], start_new_session=True)  # a session of its own
subprocess.Popen([sys.executable, "-c", "import os, signal, time; os.setpgid(0, 0); "
                  "signal.signal(signal.SIGTERM, signal.SIG_IGN); os.execvp('sleep', ['sleep', '{tag}'])"])
open("held", "w").close()
while True:
    time.sleep(0.2)
"""


def _sleeping(tag: str) -> list[Path]:
    return [p for p in Path("/proc").glob("[0-9]*/cmdline") if _reads(p) == f"sleep\0{tag}\0"]


def _wheel(folder: Path, name: str, value: str) -> Path:
    """A pure-Python wheel made by hand (no build backend, no index): module `name` with VALUE."""
    dist = f"{name}-1.0"
    files = {f"{name}/__init__.py": f"VALUE = {value!r}\n",
             f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
             f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: ftc-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
                     f"{len(text.encode())}\n" for path, text in files.items()) + f"{dist}.dist-info/RECORD,,\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        for path, text in {**files, f"{dist}.dist-info/RECORD": record}.items():
            wheel.writestr(path, text)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{dist}-py3-none-any.whl"
    path.write_bytes(buffer.getvalue())
    return path


@pytest.mark.slow
def test_requirements_go_into_a_layer_of_the_clusters_own_once_never_into_the_stack(ftc_home, cluster, tmp_path):
    import sys
    package = f"ftc_probe_{uuid.uuid4().hex[:8]}"  # its own name and file hash: no earlier run's layer applies
    workdir = tmp_path / "work"
    wheel = _wheel(workdir / "wheels", package, "installed")
    (workdir / "use.py").write_text(f"import sys, {package}\nprint('probe says', {package}.VALUE, flush=True)\n")
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(f"--no-index\n./wheels/{wheel.name}\n")
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()[:16]
    first = ftc("launch", "--name", cluster, "--requirements", str(requirements), "--", str(workdir / "use.py"))
    assert first.returncode == 0, first.stderr[-3000:]
    assert f"requirements requirements.txt ({digest}) on {cluster}-0: installing" in first.stderr
    assert f"on {cluster}-0: installed in" in first.stderr
    assert first.stdout.count("probe says installed") == 2
    # the stack (here ftc's own venv, which local nodes reuse) is as it was: the package is only in the layer
    assert subprocess.run([sys.executable, "-c", f"import {package}"], capture_output=True).returncode != 0
    layer = ftc_home / "clusters" / cluster / "nodes" / "0" / "requirements" / digest
    assert (layer / "bin" / "python").exists()
    second = ftc("launch", "--name", cluster, "--requirements", str(requirements), "--", str(workdir / "use.py"))
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"requirements requirements.txt on {cluster}-0: already installed (skipped)" in second.stderr
    assert "installed in" not in second.stderr

    bad = tmp_path / "bad.txt"
    bad.write_text(f"--no-index\n{package}-missing-dependency==9.9\n")
    refused = ftc("launch", "--name", cluster, "--requirements", str(bad), "--", str(workdir / "use.py"))
    assert refused.returncode == 1
    line = refused.stderr.strip().splitlines()[-1]
    assert f"failed on {cluster}-0" in line and f"{package}-missing-dependency==9.9" in line, line
    log = Path(line.split("pip's whole output: ")[1].split(" on ")[0])
    assert f"{package}-missing-dependency" in log.read_text()  # the log it names is there to read
    assert last_job(ftc_home, cluster)["id"] != "" and len(state_of(ftc_home, cluster)["jobs"]) == 2

    # a package the stack pins keeps the stack's version: a requirement to move it is refused, naming it
    moves_torch = tmp_path / "torch.txt"
    moves_torch.write_text("--no-index\ntorch==2.14.1\n")
    refused = ftc("launch", "--name", cluster, "--requirements", str(moves_torch), "--", str(workdir / "use.py"))
    assert refused.returncode == 1
    line = refused.stderr.strip().splitlines()[-1]
    assert "torch is the stack's own (torch==2.13.0)" in line, line
    assert ftc("down", "--name", cluster).returncode == 0
    assert not layer.exists()


BUILD_BACKEND = """
import os, time
def get_requires_for_build_wheel(config_settings=None):
    return []
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    with open({reached!r}, "w") as f:
        f.write(str(os.getpid()))
    while True:
        time.sleep(1)
"""


@pytest.mark.slow
def test_one_ctrl_c_during_the_requirements_install_stops_it_and_its_build_on_the_node(ftc_home, cluster, tmp_path):
    import signal
    workdir = tmp_path / "work"
    package = workdir / "slowpkg"
    package.mkdir(parents=True)
    reached = tmp_path / "build-reached"
    (package / "backend.py").write_text(BUILD_BACKEND.replace("{reached!r}", repr(str(reached))))
    (package / "pyproject.toml").write_text('[build-system]\nrequires = []\nbuild-backend = "backend"\n'
                                            'backend-path = ["."]\n[project]\nname = "slowpkg"\nversion = "1.0"\n')
    (workdir / "use.py").write_text("print('never reached')\n")
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(f"--no-index\n./slowpkg\n# {uuid.uuid4().hex}\n")
    proc = subprocess.Popen([*FTC, "launch", "--name", cluster, "--requirements", str(requirements), "--",
                             str(workdir / "use.py")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: reached.exists() and reached.read_text() or proc.poll() is not None,
             "the build to be held in build_wheel", timeout=300)
    build = int(reached.read_text())
    proc.send_signal(signal.SIGINT)  # once: no second Ctrl-C is needed
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    wait_for(lambda: not Path(f"/proc/{build}").exists(), "the node's build to be stopped", timeout=60)
    assert state_of(ftc_home, cluster)["jobs"] == []
    assert list((ftc_home / "clusters" / cluster / "nodes" / "0" / "jobs").glob("script-*")) == []


DAEMONIZES = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open(f"daemon-{os.environ['RANK']}", "w").close()
        os.execvp("sleep", ["sleep", "{tag}"])
    os._exit(0)
while not all(os.path.exists(f"daemon-{rank}") for rank in range(int(os.environ["WORLD_SIZE"]))):
    time.sleep(0.1)  # local nodes share one copy of the workdir: every rank's daemon runs
os.kill(os.getppid(), 9)  # the rank's launcher (script_rank), which would have stopped the daemon
time.sleep(60)
"""


@pytest.mark.slow
def test_a_daemon_the_script_leaves_ends_with_the_job_and_with_down(ftc_home, cluster, tmp_path):
    tag = str(8000 + os.getpid() % 1000)
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "daemon.py").write_text(DAEMONIZES.replace("{tag}", tag))
    proc = ftc("launch", "--name", cluster, "--", str(workdir / "daemon.py"))
    assert proc.returncode != 0  # its launchers were killed
    assert _sleeping(tag) == [], "the script's daemons outlived the job"

    started = ftc("launch", "--name", cluster, "--detach", "--", str(workdir / "daemon.py"))
    assert started.returncode == 0, started.stderr
    job = last_job(ftc_home, cluster)
    wait_for(lambda: (Path(job["remote_dir"]) / "exit_code").exists(), "the detached job to end", timeout=300)
    assert len(_sleeping(tag)) == 2  # one per rank, left by a job nobody fetched
    # its wall time is the job's, from its start to its end, not to whenever `ftc runs` is asked
    listed = next(r for r in json.loads(ftc("runs", "--json").stdout) if r["id"] == job["id"])
    record = json.loads((Path(job["results_dir"]) / "run.json").read_text())
    ended = (Path(job["remote_dir"]) / "exit_code").stat().st_mtime
    assert listed["wall_seconds"] == round(ended - record["started_at"], 1)
    assert ftc("down", "--name", cluster).returncode == 0
    wait_for(lambda: not _sleeping(tag), "`down` to stop the daemons", timeout=60)


@pytest.mark.slow
def test_a_ppn_above_the_nodes_cores_is_refused_before_anything_starts(ftc_home, cluster, tmp_path):
    script = gloo_script(tmp_path / "work")
    proc = ftc("launch", "--name", cluster, "--ppn", "512", "--", str(script))
    assert_refused_on_cluster(proc, "--ppn=512: 512 ranks per node but node", ftc_home, cluster)
    big = tmp_path / "work" / "big.bin"
    big.write_bytes(b"\0" * (2 * 2**20))
    proc = ftc("launch", "--name", cluster, "--max-workdir-mb", "1", "--", str(script))
    assert_refused_on_cluster(proc, "over the 1 MB limit (largest: big.bin 2.0 MB", ftc_home, cluster)


def assert_refused_on_cluster(proc, named: str, home: Path, cluster: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert named in one_error(proc)
    assert state_of(home, cluster)["jobs"] == [] and not (home / "runs").exists()



@pytest.mark.slow
def test_a_spot_notice_gives_the_script_sigterm_and_the_preempted_note(tmp_path):
    """One rank's wrapper, started as mpirun starts it (cwd: the job's directory), on a node whose
    metadata service announces a reclaim: the script is told by SIGTERM and reads FTC_PREEMPTED=1."""
    import os
    import sys

    from fake_imds import FakeIMDS

    from runner.node.protocol import SPOT_NOTICE_ENV
    from runner.node.spot import IMDS_V2, SpotReader
    job_dir = tmp_path / "job"
    (job_dir / "workdir").mkdir(parents=True)
    (job_dir / "workdir" / "spot.py").write_text(
        "import os, signal, time\nfrom pathlib import Path\n"
        "out = Path(os.environ['FTC_OUTPUT_DIR'])\n"
        "out.mkdir(parents=True, exist_ok=True)\n"
        "def stop(signum, frame):\n"
        "    (out / 'told.txt').write_text(Path(os.environ['FTC_PREEMPTED_FILE']).read_text())\n"
        "    raise SystemExit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "(out / 'waiting').touch()\n"
        "while True:\n    time.sleep(0.2)\n")
    imds = FakeIMDS()
    try:
        env = {**os.environ, "PYTHONPATH": str(REPO), SPOT_NOTICE_ENV: SpotReader(IMDS_V2, imds.url).watch}
        rank = subprocess.Popen([sys.executable, "-m", "runner.node.script_rank", "output", "spot.py"], cwd=job_dir,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            wait_for((job_dir / "workdir" / "output" / "waiting").exists, "the script to start waiting")
            imds.armed = True
            assert rank.wait(timeout=120) == 0, rank.stdout.read()
        finally:
            rank.kill()
            rank.wait()
    finally:
        imds.close()
    assert (job_dir / "workdir" / "output" / "told.txt").read_text() == "FTC_PREEMPTED=1\n"
    assert json.loads((job_dir / "logs" / "rank0.exit.json").read_text())["code"] == 0


LEAVES_THINGS = """
import os, subprocess, sys
out = os.environ["FTC_OUTPUT_DIR"]
os.makedirs(out, exist_ok=True)
print("stdin gave", repr(sys.stdin.read()), flush=True)  # every rank: nothing, not a wait for ever
subprocess.Popen(["sleep", "{tag}"])  # holds the output pipe
subprocess.Popen(["sleep", "{tag}"], stdout=subprocess.DEVNULL, start_new_session=True)  # a session of its own
if os.environ["RANK"] == "0":  # local nodes share one output folder
    os.symlink("/etc", os.path.join(out, "etc-link"))  # links in the output folder: not followed home
    os.symlink("/no/such/file", os.path.join(out, "dangling"))
    os.makedirs(os.path.join(out, "odd"), exist_ok=True)
    open(os.path.join(os.fsencode(out), b"odd/bad\\xff.txt"), "w").write("x")  # a name not UTF-8
    open(os.path.join(out, "ok.txt"), "w").write("home")
print("done", flush=True)
"""


@pytest.mark.slow
def test_a_script_that_leaves_processes_links_and_odd_names_behind_still_ends_and_comes_home(ftc_home, cluster,
                                                                                             tmp_path):
    tag = str(6000 + os.getpid() % 3000)  # this test's own `sleep` duration, to find what it left
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "leaves.py").write_text(LEAVES_THINGS.replace("{tag}", tag))
    proc = ftc("launch", "--name", cluster, "--", str(tmp_path / "work" / "leaves.py"), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("stdin gave ''") == 2
    job = last_job(ftc_home, cluster)
    output = Path(job["results_dir"]) / "output"
    assert (output / "ok.txt").read_text() == "home"
    assert not (output / "etc-link").exists() and not (output / "dangling").exists()
    for link in ("etc-link", "dangling"):  # each said, once
        assert proc.stderr.count(f"/output/{link} on {cluster}-0 (a symbolic link: ftc brings files home") == 1, \
            proc.stderr[-3000:]
    assert "(a name in it is not UTF-8)" in proc.stderr
    assert _sleeping(tag) == [], "processes the script started outlived the job"
    assert not (Path(job["remote_dir"]) / "workdir").exists()  # the workdir's copy goes once the job is home


def _reads(path: Path) -> str:
    try:
        return path.read_bytes().decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.slow
def test_make_launch_makes_its_cluster_and_runs_the_example_reading_shared_glue_by_default(ftc_home, minilm, glue_dir):
    # with no SCRIPT, ARGS or DATA: the example on ../shared's MRPC and the packaged MiniLM, both sent as DATA
    dry = make("-n", "launch", home=ftc_home)
    assert dry.returncode == 0, dry.stderr
    assert "--script='examples/hf_trainer_glue.py'" in dry.stdout
    assert f"--data='{glue_dir}/mrpc,{minilm}'" in dry.stdout
    assert "--args='--model model --train-file mrpc/train.tsv --validation-file mrpc/dev.tsv" in dry.stdout
    assert "--data=" not in make("-n", "launch", "SCRIPT=train.py", home=ftc_home).stdout  # your own script: yours
    args = "--model model --train-file mrpc/train.tsv --validation-file mrpc/dev.tsv --max-train-samples 16 " \
        "--max-eval-samples 16 --batch-size 8"
    try:
        real = make("launch", "NAME=mk", f"ARGS={args}", home=ftc_home)
        assert real.returncode == 0, real.stderr[-3000:]
        assert "no cluster mk: making one of 2 local nodes" in real.stderr
        (result,) = (ftc_home / "runs" / "mk").glob("script-*/output/result.json")
        assert json.loads(result.read_text())["world_size"] == 2
    finally:
        assert ftc("down", "--name", "mk").returncode == 0
