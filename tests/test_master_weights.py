"""A checkpoint stored in bf16 still trains with fp32 master weights: transformers 5 would load
it as bf16 parameters, and AdamW on those loses the small updates that autocast relies on."""

import json
import subprocess
import sys

import pytest
import torch
from conftest import REPO
from safetensors import safe_open

pytestmark = pytest.mark.slow


def bf16_checkpoint(target, vocabulary) -> None:
    """A tiny BERT with the packaged bert-base-uncased vocabulary, saved in bf16."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, num_labels=2)
    BertForSequenceClassification(config).to(torch.bfloat16).save_pretrained(target)
    AutoTokenizer.from_pretrained(vocabulary).save_pretrained(target)


def test_bf16_checkpoint_trains_and_saves_fp32_weights(tmp_path, minilm, glue_dir):
    model_dir, out = tmp_path / "bf16-model", tmp_path / "run"
    bf16_checkpoint(model_dir, minilm)
    with safe_open(model_dir / "model.safetensors", "pt") as stored:
        assert {stored.get_tensor(k).dtype for k in stored.keys()} == {torch.bfloat16}
    proc = subprocess.run([sys.executable, "-m", "runner.node.train", "--task", "mrpc", "--model", str(model_dir),
                           "--data-dir", str(glue_dir), "--output-dir", str(out), "--precision", "bf16",
                           "--max-train-samples", "16", "--batch-size", "8", "--epochs", "1", "--no-eval"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    results = json.loads((out / "results.json").read_text())
    assert results["precision"] == "bf16" and results["steps"] == 2
    with safe_open(out / "model" / "model.safetensors", "pt") as trained:
        assert {trained.get_tensor(k).dtype for k in trained.keys()} == {torch.float32}
