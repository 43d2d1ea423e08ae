"""`ftc plan`'s model and the bench's FLOP count, against hand-computed cases."""

import json
from pathlib import Path

import pytest
from conftest import REPO, ftc
from helpers import one_error

from provision import estimate
from runner import bench


def test_ring_allreduce_by_hand():
    # 4 nodes, 1 GB, 8 Gbit/s = 1 GB/s: each node moves 2 x 3/4 GB -> 1.5 s, plus 6 hops of 50 us
    assert estimate.ring_allreduce_seconds(1e9, 4, 8.0, 50e-6) == pytest.approx(1.5 + 6 * 50e-6)
    assert estimate.ring_allreduce_seconds(1e9, 2, 8.0, 0.0) == pytest.approx(1.0)
    assert estimate.ring_allreduce_seconds(1e9, 1, 8.0) == 0.0


def test_one_flow_caps_the_ring_at_ten_gbit_inside_a_placement_group():
    assert estimate.flow_limited_gbps(25.0) == 10.0  # c6i/c7i.16xlarge
    assert estimate.flow_limited_gbps(12.5, flows=2) == 12.5
    assert estimate.flow_limited_gbps(8.0) == 8.0


def test_step_adds_the_wait_and_the_exposed_allreduce_to_compute():
    # compute 1 s (32 samples at 32/s), 10% waiting for the slowest, a 0.5 s all-reduce exposed 1.2x
    assert estimate.step_seconds(32, 32.0, 0.5, 1.2, 0.1) == pytest.approx(1.1 + 0.6)


def test_plan_rows_by_hand():
    # 2 nodes at 32 samples/s, batch 32: compute 1 s; all-reduce 1e9 B over 8 Gbit/s = 1 s, none hidden
    rows = estimate.plan([1, 2], train_samples=640, epochs=1, node_samples_per_s=32.0, batch_per_node=32,
                         grad_bytes=1e9, gbps=8.0, exposure=1.0, wait_share=0.0, usd_per_node_hour=3.6, setup_s=100,
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
              "planner": {"exposure": 1.5, "wait_share": 0.05}}
    path = Path(tmp_path / "bench.json")
    path.write_text(json.dumps(report))
    proc = ftc("plan", "--task", "qqp", "--nodes", "1,2,4", "--instance-type", "c7i.16xlarge", "--bench", str(path))
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip("│ ").split(" ")[0] in ("1", "2", "4")]
    assert len(lines) == 3, proc.stdout
    # c7i.16xlarge: 32 cores -> 8 x 30 samples/s per node, as the footer says
    assert "per-node rate 240.0 samples/s" in proc.stdout.replace("\n", " ")


def bench_with(tmp_path: Path, change) -> Path:
    bench = json.loads((REPO / "docs" / "bench.json").read_text())
    change(bench)
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    return path


@pytest.mark.parametrize("change, named", [
    (lambda b: b.pop("ftc_samples_per_s"), "(KeyError: 'ftc_samples_per_s')"),
    (lambda b: b["planner"].update(exposure="most"), "EXPOSURE='most' is not a number"),
    (lambda b: b.update(cores_per_rank=0), "CORES_PER_RANK=0 is out of range"),
    (lambda b: b.update(ftc_samples_per_s=-120), "FTC_SAMPLES_PER_S=-120 is out of range"),
    (lambda b: b.update(precision=["bf16"]), "PRECISION=['bf16'] is not known"),
], ids=["rate missing", "share not a number", "no cores", "negative rate", "precision a list"])
def test_plan_refuses_a_bench_file_with_a_bad_figure_naming_the_file_and_the_field(ftc_home, tmp_path, change, named):
    path = bench_with(tmp_path, change)
    proc = ftc("plan", "--bench", str(path))
    assert proc.returncode == 2
    error = one_error(proc)
    assert f"BENCH='{path}'" in error and named in error


def test_plan_refuses_a_rate_too_small_to_plan_with(ftc_home):
    proc = ftc("plan", "--samples-per-s", "1e-300")
    assert proc.returncode == 2 and "SAMPLES_PER_S='1e-300' is out of range" in one_error(proc)



def test_cpu_class_is_bf16_where_native_else_the_widest_fp32_vectors():
    assert estimate.cpu_class(["avx2", "avx512f", "amx_bf16"]) == "bf16"
    assert estimate.cpu_class(["avx2", "avx512f", "avx512_bf16"]) == "bf16"
    assert estimate.cpu_class(["avx2", "avx512f"]) == "avx512"
    assert estimate.cpu_class(["avx2"]) == "avx2"


def test_local_training_time_grows_with_rows_and_weights_and_shrinks_with_cores():
    minilm = estimate.MINILM_PARAMS
    one = estimate.local_train_seconds(7336, minilm, 2, "avx2")
    assert one == pytest.approx(7336 / (2 * estimate.LOCAL_RATE_PER_CORE["avx2"]))  # the demo on 2 AVX2 cores
    assert estimate.local_train_seconds(2 * 7336, minilm, 2, "avx2") == pytest.approx(2 * one)
    assert estimate.local_train_seconds(7336, 2 * minilm, 2, "avx2") == pytest.approx(2 * one)
    assert estimate.local_train_seconds(7336, minilm, 4, "avx2") == pytest.approx(one / 2)
