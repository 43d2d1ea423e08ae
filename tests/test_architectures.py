"""Any sequence-classification architecture: tiny RoBERTa and DeBERTa-v2 models made here (random
weights, the packaged bert-base-uncased vocabulary) pass the controller's check, size `ftc plan`,
and train for real; the run's TensorBoard events hold the values it logged."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, ftc
from helpers import tiny_model
from test_datafiles import toy_csv

from runner.model_files import check_model_dir, parameter_count


def scalars(board: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(board))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["roberta", "deberta-v2"])
def test_a_tiny_model_of_another_architecture_trains_and_writes_tensorboard_events(tmp_path, minilm, architecture):
    model = tiny_model(tmp_path / architecture, architecture, minilm)
    check_model_dir(model)  # what the controller checks before launch
    assert parameter_count(model) == int((model / "parameters.txt").read_text())  # read from the header alone
    train, dev = toy_csv(tmp_path / "train.csv", 48), toy_csv(tmp_path / "dev.csv", 24, offset=3)
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "runner.node.train", "--task", "custom", "--model", str(model),
                           "--train-file", str(train), "--validation-file", str(dev), "--text-columns", "review",
                           "--label-column", "stars", "--output-dir", str(out), "--max-steps", "3", "--batch-size", "8",
                           "--log-every", "1", "--lr", "1e-3"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    results = json.loads((out / "results.json").read_text())
    assert results["steps"] == 3 and results["labels"] == ["neg", "pos"]
    assert json.loads((out / "model" / "config.json").read_text())["model_type"] == architecture
    logged = scalars(out / "tensorboard")
    assert [step for step, _ in logged["train/loss"]] == [1, 2, 3]
    assert logged["train/loss"][0][1] == pytest.approx(results["first_loss"], rel=1e-5)
    assert logged["train/loss"][-1][1] == pytest.approx(results["final_loss"], rel=1e-5)
    assert logged["eval/accuracy"] == [(3, pytest.approx(results["eval_accuracy"], rel=1e-5))]
    assert logged["eval/f1_macro"] == [(3, pytest.approx(results["eval_f1_macro"], rel=1e-5))]
    # the rate after each step: 3 steps, no warm-up (6% of 3 rounds to 0), linear decay from 1e-3 to 0
    assert [value for _, value in logged["train/learning_rate"]] == pytest.approx([2e-3 / 3, 1e-3 / 3, 0], abs=1e-9)
    assert all(value > 0 for _, value in logged["train/samples_per_second"])


def test_plan_sizes_the_job_by_a_local_model(ftc_home, tmp_path, minilm):
    model = tiny_model(tmp_path / "roberta", "roberta", minilm)
    proc = ftc("plan", "--model", str(model), "--nodes", "1,2")
    assert proc.returncode == 0, proc.stderr
    assert f"{parameter_count(model) / 1e6:.1f}M parameters" in proc.stdout.replace("\n", " ")


@pytest.mark.parametrize("model_type,named", [
    ("", "names no model_type"),
    ("no-such-architecture", "is a 'no-such-architecture' model, which AutoModelForSequenceClassification cannot load"),
])
def test_a_model_no_sequence_classifier_loads_is_refused_before_launch(ftc_home, tmp_path, minilm, model_type, named):
    model = tiny_model(tmp_path / "model", "bert", minilm)
    config = json.loads((model / "config.json").read_text())
    config["model_type"] = model_type
    (model / "config.json").write_text(json.dumps(config))
    proc = ftc("finetune", "--name", "nowhere", "--model", str(model))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and f"--model={str(model)!r}" in lines[0] and named in lines[0], lines
