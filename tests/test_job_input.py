"""A job's files, checked on the controller before anything launches: the results directory, the
GLUE data, the model directory. Each bad one is refused with one line naming the file and what is
wrong, exit code 2, nothing created."""

import io
import json
import struct
from pathlib import Path

import pytest
from conftest import ftc, sshd_pids
from helpers import assert_refused, last_line, one_error, tiny_job, toy_csv

MRPC_HEADER = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
MRPC_ROW = "1\t1\t2\tA cat sat.\tA cat was sitting.\n"


def test_unwritable_results_is_refused_before_any_node_starts(ftc_home, minilm, glue_dir):
    proc = ftc("run", "--name", "res", "--nodes", "1", "--task", "mrpc", "--model", minilm,
               "--data-dir", str(glue_dir), "--results", "/proc/x", "--max-train-samples", "8")
    assert_refused(proc, "--results='/proc/x' is not writable", ftc_home)
    assert sshd_pids(ftc_home) == [] and not Path("/proc/x").exists()


def test_results_that_is_a_file_is_refused(ftc_home, tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("a file, not a directory")
    proc = ftc("finetune", "--name", "nowhere", "--results", str(taken / "run1"))
    assert_refused(proc, f"{taken} is not a directory", ftc_home)
    assert taken.read_text() == "a file, not a directory"


def glue_with(root: Path, train: bytes, dev: bytes = (MRPC_HEADER + MRPC_ROW).encode()) -> Path:
    (root / "MRPC").mkdir(parents=True)
    (root / "MRPC" / "train.tsv").write_bytes(train)
    (root / "MRPC" / "dev.tsv").write_bytes(dev)
    return root


@pytest.mark.parametrize("train,dev,named", [
    (b"", None, "train.tsv: empty"),
    (MRPC_HEADER.encode(), None, "train.tsv: no rows after the header"),
    ((MRPC_HEADER + "1\tonly three\tfields\n" * 2).encode(), None, "train.tsv: none of its 2 rows has the 5"),
    ((MRPC_HEADER + MRPC_ROW + MRPC_ROW.replace("1", "7", 1)).encode(), None,
     "train.tsv: line 3: label '7' is not one of the task's (0, 1)"),
    ((MRPC_HEADER + MRPC_ROW).encode("utf-16"), None, "train.tsv: not UTF-8 text"),
    ((MRPC_HEADER + MRPC_ROW).encode(), MRPC_HEADER.encode(), "dev.tsv: no rows after the header"),
], ids=["empty", "header only", "wrong field count", "label outside the task's", "not utf-8", "dev header only"])
def test_bad_data_file_is_refused_with_its_name(ftc_home, tmp_path, train, dev, named):
    data = glue_with(tmp_path / "glue", train, *([dev] if dev is not None else []))
    proc = ftc("finetune", "--name", "nowhere", "--data-dir", str(data))
    assert_refused(proc, f"{data / 'MRPC'}/{named}", ftc_home)


def test_skipped_rows_are_counted_and_reported(ftc_home, tmp_path):
    data = glue_with(tmp_path / "glue", (MRPC_HEADER + MRPC_ROW * 3 + "1\ttoo few\n").encode())
    proc = ftc("finetune", "--name", "nowhere", "--data-dir", str(data))
    note, refusal = proc.stderr.strip().splitlines()
    assert note == f"{data / 'MRPC' / 'train.tsv'}: 1 of 4 rows skipped (wrong number of fields)"
    assert proc.returncode == 2 and "--name='nowhere'" in refusal  # the data passed; the cluster is what is missing


@pytest.fixture
def model_copy(tmp_path, minilm) -> Path:
    """The packaged model, each file linked, so a test can break one of them."""
    copy = tmp_path / "model"
    copy.mkdir()
    for file in Path(minilm).iterdir():
        (copy / file.name).symlink_to(file)
    return copy


def truncated_safetensors() -> bytes:
    header = json.dumps({"weight": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    return struct.pack("<Q", len(header)) + header + b"\0" * 4  # 4 of the 8 bytes the table promises


def replace(model: Path, name: str, data: bytes | None) -> None:
    (model / name).unlink(missing_ok=True)
    if data is not None:
        (model / name).write_bytes(data)


@pytest.mark.parametrize("changes,named", [
    ({"config.json": b"{not json"}, "config.json is not JSON"),
    ({"model.safetensors": b""}, "model.safetensors is not a safetensors file (0 bytes"),
    ({"model.safetensors": b"garbage " * 64}, "model.safetensors is not a safetensors file"),
    ({"model.safetensors": truncated_safetensors()}, "model.safetensors is truncated or damaged"),
    ({"model.safetensors": None, "pytorch_model.bin": b"garbage " * 64},
     "pytorch_model.bin is not a PyTorch checkpoint"),
    ({"tokenizer.json": None, "vocab.txt": None}, "has no tokenizer files"),
], ids=["config not json", "0-byte weights", "garbage weights", "truncated weights", "garbage bin", "no tokenizer"])
def test_model_directory_that_cannot_load_is_refused(ftc_home, model_copy, changes, named):
    for name, data in changes.items():
        replace(model_copy, name, data)
    proc = ftc("finetune", "--name", "nowhere", "--model", str(model_copy))
    assert_refused(proc, named, ftc_home)
    assert f"--model='{model_copy}'" in proc.stderr


def test_packaged_model_and_real_mrpc_pass_the_checks(ftc_home, minilm, glue_dir):
    proc = ftc("finetune", "--name", "nowhere", "--model", minilm, "--data-dir", str(glue_dir))
    assert_refused(proc, "--name='nowhere'", ftc_home)  # refused for the missing cluster only


@pytest.mark.parametrize("change, named", [
    ({"vocab_size": 1000}, "config.json's vocab_size 1000 does not fit the weights' input embedding "
                           "embeddings.word_embeddings.weight of 30522 rows"),
    ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]},
     "config.json says model_type 'gpt2', whose input embedding is *wte.weight, but the weights hold "
     "embeddings.word_embeddings.weight"),
    ({"hidden_size": 768}, "config.json's hidden size 768 does not fit the weights' input embedding "
                           "embeddings.word_embeddings.weight of width 384"),
], ids=["vocab size", "another architecture", "hidden size"])
def test_a_config_that_does_not_fit_the_weights_is_refused_before_launch(ftc_home, model_copy, change, named):
    config = json.loads((model_copy / "config.json").read_text())
    replace(model_copy, "config.json", json.dumps({**config, **change}).encode())
    proc = ftc("finetune", "--name", "nowhere", "--model", str(model_copy))
    assert_refused(proc, named, ftc_home)
    assert f"--model='{model_copy}'" in proc.stderr


def test_recipe_options_reach_the_training_program_and_a_bad_one_is_refused(ftc_home):
    from runner.jobspec import train_args, validate_job
    job = validate_job({"task": "mrpc", "dropout": "0", "allreduce": "overlap", "seed": "0"})
    args = train_args(job, "/w/jobs/j", "stock", resume=False)
    assert args[args.index("--dropout") + 1] == "0.0" and args[args.index("--allreduce") + 1] == "overlap"
    assert args[args.index("--seed") + 1] == "0"  # seed 0 is a seed, not "unset"
    default = train_args(validate_job({"task": "mrpc"}), "/w/jobs/j", "stock", resume=False)
    assert "--dropout" not in default and "--allreduce" not in default and "--seed" not in default  # the recipe's
    proc = ftc("finetune", "--name", "nowhere", "--allreduce", "sideways")
    assert_refused(proc, "--allreduce='sideways' is not known; allowed: auto, after-backward, overlap, comm-core", ftc_home)
    proc = ftc("finetune", "--name", "nowhere", "--dropout", "1")
    assert_refused(proc, "--dropout='1' is out of range", ftc_home)
    proc = ftc("finetune", "--name", "nowhere", "--seed", "-1")
    assert_refused(proc, "--seed='-1' is out of range", ftc_home)


def test_results_with_a_control_character_is_refused(ftc_home, tmp_path):
    for command in (["finetune", "--name", "nowhere", "--results"], ["sweep", "--name", "nowhere", "--out"]):
        proc = ftc(*command, str(tmp_path / "a\nb"))
        assert_refused(proc, "holds a control character", ftc_home)
    assert not (tmp_path / "a\nb").exists()


def test_results_that_hold_another_run_are_refused_before_anything_launches(ftc_home, tmp_path, minilm, glue_dir):
    earlier = {"id": "mrpc-20260101T000000Z", "cluster": "old", "provider": "local", "started_at": 1.0}
    taken, swept = tmp_path / "taken", tmp_path / "swept"
    for directory in (taken, swept / "1-node"):
        directory.mkdir(parents=True)
        (directory / "run.json").write_text(json.dumps(earlier))

    run = ftc("run", "--name", "fresh", "--nodes", "1", "--results", str(taken), *tiny_job(minilm, glue_dir))
    assert_refused(run, f"--results='{taken}' already holds a run", ftc_home)
    sweep = ftc("sweep", "--name", "fresh", "--nodes", "1", "--out", str(swept), *tiny_job(minilm, glue_dir))
    assert_refused(sweep, f"--out='{swept}' already holds a run ({swept / '1-node' / 'run.json'})", ftc_home)
    # continuing that run is another matter: it resumes in its own directory (here: from no checkpoint)
    resumed = ftc("run", "--name", "fresh", "--nodes", "1", "--results", str(taken), "--resume",
                  *tiny_job(minilm, glue_dir))
    assert_refused(resumed, "--resume: no checkpoint of mrpc", ftc_home)
    assert sshd_pids(ftc_home) == []
    for directory in (taken, swept / "1-node"):
        assert json.loads((directory / "run.json").read_text()) == earlier


def test_a_data_dir_that_is_a_file_is_called_a_file(ftc_home, tmp_path):
    afile = tmp_path / "train.tsv"
    afile.write_text("not a directory")
    proc = ftc("finetune", "--name", "nowhere", "--data-dir", str(afile))
    assert_refused(proc, f"--data-dir='{afile}' is not a directory", ftc_home)


@pytest.mark.parametrize("flag", ["--model", "--data-dir", "--results"])
def test_a_job_path_under_a_home_of_no_such_user_is_refused_by_name(ftc_home, minilm, glue_dir, flag):
    args = dict(zip(tiny_job(minilm, glue_dir)[::2], tiny_job(minilm, glue_dir)[1::2]))
    args[flag] = "~no-such-user-of-ftc/x"
    proc = ftc("run", "--name", "tilde", *[part for pair in args.items() for part in pair])
    line = one_error(proc)
    assert proc.returncode == 2 and "'~no-such-user-of-ftc' names no home directory" in line, line
    assert not (ftc_home / "clusters" / "tilde").exists() and sshd_pids(ftc_home) == []



@pytest.mark.parametrize("command", [["run", "--nodes", "1"], ["sweep", "--nodes", "1,2"]])
def test_a_hub_model_this_machine_cannot_load_is_refused_before_any_node_starts(ftc_home, glue_dir, command, tmp_path):
    """Offline (HF_HUB_OFFLINE=1, as transformers reads it), a hub id not in the local cache: local
    nodes could not load it, so nothing is made."""
    flags = ["--out", str(tmp_path / "sweep")] if command[0] == "sweep" else []
    proc = ftc(*command, "--name", "nohub", *flags, "--task", "mrpc", "--model", "some-org/not-cached-anywhere",
               "--data-dir", str(glue_dir), "--yes", "1", env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: --model='some-org/not-cached-anywhere' is not in this machine's Hugging Face cache and the hub is out of "
        "reach; give --model=/path/to/a/model/directory, or --model=auto for the packaged MiniLM")
    assert not (ftc_home / "clusters").exists() or not any((ftc_home / "clusters").iterdir())


@pytest.mark.parametrize("command", [["run", "--nodes", "1"], ["sweep", "--nodes", "1,2"]])
def test_glue_without_a_data_dir_offline_is_refused_before_any_node_starts(ftc_home, minilm, command, tmp_path):
    """A forgotten DATA_DIR offline: the ranks would spend their retries on the hub, after the cluster was made."""
    flags = ["--out", str(tmp_path / "sweep")] if command[0] == "sweep" else []
    proc = ftc(*command, "--name", "nodata", *flags, "--task", "mrpc", "--model", minilm, "--yes", "1",
               env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "error: --task='mrpc' without --data-dir reads GLUE from the hub, which is out of reach; give --data-dir=" \
        in one_error(proc)
    assert not (ftc_home / "clusters").exists() or not any((ftc_home / "clusters").iterdir())
    assert sshd_pids(ftc_home) == []


@pytest.mark.parametrize("flag", ["--train-file", "--validation-file", "--model", "--data-dir", "--text-columns",
                                  "--label-column"])
def test_a_control_character_in_any_path_or_name_is_refused_before_any_node_starts(ftc_home, tmp_path, flag):
    """A newline in a file or model name would end a line of the launch script (a hostile trial ran a
    command on the head node); it is refused, whatever the value names."""
    bad = f"{tmp_path}/x\ntouch pwned\n.csv"
    proc = ftc("run", "--name", "cc", "--nodes", "1", "--task", "custom", "--train-file", str(tmp_path / "t.csv"),
               flag, bad)
    assert_refused(proc, "holds a control character", ftc_home)
    assert sshd_pids(ftc_home) == [] and not list(tmp_path.rglob("pwned"))


def tiny_model(folder: Path, head: int | None) -> Path:
    """A BERT directory that passes every file check: config, tokenizer, and a safetensors file whose
    header holds the input embedding and, when `head`, a trained classification head of that many outputs."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 4, "hidden_size": 2}))
    (folder / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n")
    tensors = {"bert.embeddings.word_embeddings.weight": [4, 2], **({"classifier.weight": [head, 2]} if head else {})}
    table, offset = {}, 0
    for name, shape in tensors.items():
        size = 4 * shape[0] * shape[1]
        table[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    header = json.dumps(table).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * offset)
    return folder


def test_a_trained_head_of_another_size_than_the_datas_classes_is_refused_before_launch(ftc_home, tmp_path, glue_dir):
    """MRPC has 2 classes: a head of 3 outputs would fail from_pretrained on every rank after launch."""
    three = tiny_model(tmp_path / "three", head=3)
    proc = ftc("run", "--name", "hd", "--nodes", "1", "--task", "mrpc", "--model", str(three), "--data-dir", str(glue_dir))
    assert_refused(proc, f"--model={str(three)!r} holds a classification head of 3 outputs, but the data has 2 classes "
                         "(0, 1); give the base model", ftc_home)
    train = toy_csv(tmp_path / "t.csv", 9)
    proc = ftc("run", "--name", "hd", "--nodes", "1", "--task", "custom", "--train-file", str(train),
               "--validation-file", str(train), "--text-columns", "review", "--label-column", "stars",
               "--model", str(three))
    assert proc.returncode == 2 and "but the data has 2 classes (neg, pos)" in one_error(proc)  # no note before it
    assert sshd_pids(ftc_home) == []
    from provision.errors import UsageError
    from runner.jobspec import refuse_other_head
    for model in (tiny_model(tmp_path / "two", head=2), tiny_model(tmp_path / "base", head=None)):
        refuse_other_head(str(model), str(model), ("0", "1"))  # a head that fits, or none: a new one is made
    bias_only = tiny_model(tmp_path / "bias", head=None)  # a head known by its bias alone
    header = json.dumps({"bert.embeddings.word_embeddings.weight": {"dtype": "F32", "shape": [4, 2],
                                                                    "data_offsets": [0, 32]},
                         "classifier.bias": {"dtype": "F32", "shape": [3], "data_offsets": [32, 44]}}).encode()
    (bias_only / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 44)
    with pytest.raises(UsageError, match="holds a classification head of 3 outputs"):
        refuse_other_head(str(bias_only), "bias", ("0", "1"))


@pytest.mark.slow
def test_results_claimed_by_a_job_starting_now_is_refused(ftc_home, tmp_path, minilm, glue_dir):
    """Two jobs started at once with one RESULTS (on two clusters) both passed the check for an earlier
    run; now the first holds RESULTS from that check until its run.json is written. The test holds it."""
    from runner import runs
    results = tmp_path / "shared-results"
    assert ftc("up", "--name", "rc", "--nodes", "1").returncode == 0
    try:
        with runs.results_claimed(results, check_unused=True):
            proc = ftc("finetune", "--name", "rc", *tiny_job(minilm, glue_dir), "--results", str(results))
        assert proc.returncode == 2 and f"--results={str(results)!r} is being claimed by another job starting now" \
            in one_error(proc)
        assert json.loads((ftc_home / "clusters" / "rc" / "state.json").read_text())["jobs"] == []
    finally:
        assert ftc("down", "--name", "rc").returncode == 0


def test_a_relative_path_made_absolute_in_a_folder_with_a_newline_is_refused(ftc_home, tmp_path):
    odd = tmp_path / "x\nd"
    odd.mkdir()
    train = toy_csv(odd / "t.csv", 9)
    proc = ftc("run", "--name", "nl", "--nodes", "1", "--task", "custom", "--train-file", train.name,
               "--validation-file", train.name, "--text-columns", "review", "--label-column", "stars", cwd=odd)
    assert proc.returncode == 2 and "holds a control character" in last_line(proc), proc.stderr
    assert sshd_pids(ftc_home) == []


def test_columns_are_recorded_as_read_so_naming_the_defaults_is_the_same_job(tmp_path, minilm):
    from runner.finetune_job import job_settings
    from runner.jobspec import validate_job
    train = tmp_path / "t.csv"
    train.write_text("text,label\nit was great,pos\nit was awful,neg\n")
    given = {"train_file": str(train), "validation_file": str(train), "model": minilm}
    assert job_settings(validate_job(given)) == job_settings(validate_job({**given, "text_columns": "text",
                                                                           "label_column": "label"}))


@pytest.mark.parametrize("value, online", [("1", False), ("true", False), ("0", True), ("false", True), ("no", True)])
def test_hf_hub_offline_is_read_as_transformers_reads_it(monkeypatch, value, online):
    from runner import jobspec
    monkeypatch.setenv("HF_HUB_OFFLINE", value)
    monkeypatch.setattr(jobspec.socket, "create_connection", lambda *a, **k: io.BytesIO())  # "the hub answers"
    jobspec.hub_reachable.cache_clear()
    try:
        assert jobspec.hub_reachable() is online
    finally:
        jobspec.hub_reachable.cache_clear()


def test_a_refusal_after_offline_and_data_notes_is_the_only_line(ftc_home, tmp_path, minilm):
    """The notes a job's checks make (the packaged model offline, the data's columns and classes, a small
    file's recipe) are printed once every check has passed: a refusal comes alone."""
    train = toy_csv(tmp_path / "t.csv", 9)
    offline = {"HF_HUB_OFFLINE": "1"}
    proc = ftc("finetune", "--name", "nowhere", "--model", "auto", "--train-file", str(train),
               "--validation-file", str(train), "--text-columns", "review,stars", "--label-column", "stars", env=offline)
    assert proc.returncode == 2 and "both a text column (--text-columns) and the label column" in one_error(proc)
    proc = ftc("finetune", "--name", "nowhere", "--model", "auto", "--train-file", str(train),
               "--validation-file", str(train), "--text-columns", "review", "--label-column", "stars",
               "--results", "/proc/x", env=offline)
    assert proc.returncode == 2 and "--results='/proc/x' is not writable" in one_error(proc)
    proc = ftc("finetune", "--name", "nowhere", "--model", "auto", "--train-file", str(train),
               "--validation-file", str(train), "--text-columns", "review", "--label-column", "stars", env=offline)
    notes = proc.stderr.strip().splitlines()[:-1]  # every check passed: the notes, then no such cluster
    assert notes[0].startswith("offline: using the packaged MiniLM-L6 model at ") and len(notes) == 3, notes


def test_a_batch_other_than_the_recipes_says_the_global_batch_changes_and_how_to_scale_lr(ftc_home):
    from runner.jobspec import checked_job
    from runner.node.recipes import batch_line
    named = {"batch_size": "--batch-size", "lr": "--lr"}
    assert batch_line("ftc", 64, False, named) == (
        "recipe: --batch-size=64 is 2x the ftc recipe's 32 rows per rank, so the global batch is 2x too, at lr "
        "2e-05; to scale lr with it, set --lr=4e-05")
    assert batch_line("ftc", 64, True, named) == batch_line("ftc", 32, False, named) == ""  # lr given; the recipe's
    assert batch_line("ftc", 16, False, named, lr=2e-4).endswith("at lr 0.0002; to scale lr with it, set --lr=0.0001")
    notes: list[str] = []
    checked_job({"task": "mrpc", "batch_size": "16"}, False, notes)
    assert notes == ["recipe: --batch-size=16 is 0.5x the ftc recipe's 32 rows per rank, so the global batch is 0.5x "
                     "too, at lr 2e-05; to scale lr with it, set --lr=1e-05"]
    notes.clear()
    checked_job({"task": "mrpc", "batch_size": "64", "lr": "1e-4"}, False, notes)
    assert notes == []


def test_powersgd_reaches_the_training_program_with_a_note_and_is_refused_beside_overlap(ftc_home):
    from runner.jobspec import POWERSGD_NOTE, checked_job, train_args
    notes: list[str] = []
    job = checked_job({"task": "mrpc", "grad_compress": "powersgd"}, False, notes)
    args = train_args(job, "/w/jobs/j", "stock", resume=False)
    assert args[args.index("--grad-compress") + 1] == "powersgd" and notes == [POWERSGD_NOTE]
    assert "--grad-compress" not in train_args(checked_job({"task": "mrpc"}, False, []), "/w/jobs/j", "stock", False)
    proc = ftc("finetune", "--name", "nowhere", "--grad-compress", "powersgd", "--allreduce", "overlap")
    assert_refused(proc, "--grad-compress=powersgd runs after backward, but --allreduce is overlap", ftc_home)
    assert "recipe's default" not in proc.stderr  # the user set overlap: no recipe is blamed
    proc = ftc("finetune", "--name", "nowhere", "--grad-compress", "powersgd", "--recipe", "seed")
    assert_refused(proc, "--allreduce is overlap (the seed recipe's default)", ftc_home)
    proc = ftc("finetune", "--name", "nowhere", "--grad-compress", "zip")
    assert_refused(proc, "--grad-compress='zip' is not known; allowed: auto, none, bf16, powersgd", ftc_home)
