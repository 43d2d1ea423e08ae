"""`ftc plan`'s model and the bench's FLOP count, against hand-computed cases."""

import json
from pathlib import Path

import pytest
from conftest import ftc

from provision import estimate
from runner import bench


def test_ring_allreduce_by_hand():
    # 4 nodes, 1 GB, 8 Gbit/s = 1 GB/s: each node moves 2 x 3/4 GB -> 1.5 s, plus 6 hops of 50 us
    assert estimate.ring_allreduce_seconds(1e9, 4, 8.0, 50e-6) == pytest.approx(1.5 + 6 * 50e-6)
    assert estimate.ring_allreduce_seconds(1e9, 2, 8.0, 0.0) == pytest.approx(1.0)
    assert estimate.ring_allreduce_seconds(1e9, 1, 8.0) == 0.0
    assert estimate.bandwidth_from(1.5, 1e9, 4) == pytest.approx(8.0)


def test_step_hides_part_of_the_allreduce_never_more_than_backward():
    # compute 1 s (32 samples at 32/s); all-reduce 0.5 s of which a quarter hides -> 1.375 s
    assert estimate.step_seconds(32, 32.0, 0.5, 0.25) == pytest.approx(1.375)
    # all of 0.9 s would hide, but backward is only 2/3 s long
    assert estimate.step_seconds(32, 32.0, 0.9, 1.0) == pytest.approx(1 + 0.9 - 2 / 3)
    assert estimate.hidden_share_from(1.375, 32, 32.0, 0.5) == pytest.approx(0.25)


def test_plan_rows_by_hand():
    # 2 nodes at 32 samples/s, batch 32: compute 1 s; all-reduce 1e9 B over 8 Gbit/s = 1 s, none hidden
    rows = estimate.plan([1, 2], train_samples=640, epochs=1, node_samples_per_s=32.0, batch_per_node=32,
                         grad_bytes=1e9, gbps=8.0, hidden_share=0.0, usd_per_node_hour=3.6, setup_s=100,
                         latency_s=0.0)
    one, two = rows
    assert one.samples_per_s == pytest.approx(32) and one.train_s == pytest.approx(20) and one.efficiency == 1
    assert two.samples_per_s == pytest.approx(32) and two.efficiency == pytest.approx(0.5)
    assert two.wall_s == pytest.approx(120) and two.usd == pytest.approx(2 * 3.6 * 120 / 3600)


def test_distilbert_size_and_flops_per_token_by_hand(tmp_path):
    model = bench.make_distilbert(tmp_path / "distilbert", tmp_path)
    per_layer = 4 * (768 * 768 + 768) + (768 * 3072 + 3072) + (3072 * 768 + 768) + 2 * 2 * 768
    dense = 6 * per_layer + (768 * 768 + 768) + (768 * 2 + 2)  # layers, pre-classifier, classifier
    embeddings = 30522 * 768 + 512 * 768 + 2 * 768
    assert dense + embeddings == estimate.DISTILBERT_PARAMS
    assert bench.model_flops_per_token(model, 54) == 6 * dense + 12 * 6 * 768 * 54


def test_mrpc_train_size_is_the_file_s(glue_dir):
    rows = (glue_dir / "mrpc" / "train.tsv").read_text().strip().splitlines()
    assert len(rows) - 1 == estimate.GLUE_TRAIN_SIZES["mrpc"]


def test_plan_command_prints_each_cluster_size(ftc_home, tmp_path):
    report = {"ftc_samples_per_s": 30.0, "cores_per_rank": 4, "cpu": "test cpu", "precision": "bf16",
              "planner_check": {"allreduce_hidden_share": 0.25}}
    path = Path(tmp_path / "bench.json")
    path.write_text(json.dumps(report))
    proc = ftc("plan", "--task", "qqp", "--nodes", "1,2,4", "--instance-type", "c7i.16xlarge", "--bench", str(path))
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip("│ ").split(" ")[0] in ("1", "2", "4")]
    assert len(lines) == 3, proc.stdout
    # c7i.16xlarge: 32 cores -> 8 x 30 samples/s per node, as the footer says
    assert "per-node rate 240.0 samples/s" in proc.stdout.replace("\n", " ")
