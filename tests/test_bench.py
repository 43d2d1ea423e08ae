"""`ftc bench --quick`: the benchmark really runs every configuration, ftc's and the peer's
(Hugging Face Trainer through torchrun), and reports what it promises."""

import json

import pytest
from conftest import ftc


def test_quick_bench_reports_ratios_scaling_mfu_and_the_peer(ftc_home, tmp_path):
    out = tmp_path / "bench"
    proc = ftc("bench", "--quick", "--out", str(out), timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "bench.json").read_text())
    for key in ("seed_samples_per_s", "ftc_samples_per_s", "speedup_vs_seed", "scaling", "gemm_peak_tflops", "mfu",
                "precision", "backend", "peer_samples_per_s", "speedup_vs_peer", "compile"):
        assert key in report, key
    assert report["speedup_vs_seed"] == round(report["ftc_samples_per_s"] / report["seed_samples_per_s"], 3)
    assert report["speedup_vs_peer"] == round(report["ftc_samples_per_s"] / report["peer_samples_per_s"], 3)
    assert [row["ranks"] for row in report["scaling"]] == [1, 2]
    assert report["scaling"][0]["efficiency"] == 1.0 and report["scaling"][1]["efficiency"] > 0
    for row in report["scaling"]:
        assert row["peer_samples_per_s"] > 0
        assert row["speedup_vs_peer"] == round(row["samples_per_s"] / row["peer_samples_per_s"], 3)
    assert report["runs"]["seed-1"]["padding"] == "max_length" and report["runs"]["ftc-1"]["padding"] == "longest"
    assert report["runs"]["ftc-2"]["world_size"] == 2 and report["backend"] == "gloo"
    peer = report["runs"]["peer-2"]
    assert peer["trainer"] == "transformers.Trainer" and peer["world_size"] == 2
    assert peer["precision"] == report["precision"] and peer["batch_size_per_rank"] == 32
    assert report["compile"].startswith("off")  # a few steps: the compile would not pay back
    assert 0 < report["mfu"] < 1.5 and report["gemm_peak_tflops"] > 0
    markdown = (out / "bench.md").read_text()
    assert "simulated" in markdown and "Hugging Face Trainer" in markdown
    assert (out / "bench.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("flag, value, message", [
    ("--ranks", "1,0", "RANKS='0' is out of range; allowed: 1..256"),
    ("--steps", "many", "STEPS='many' is not a whole number; allowed: 1..100000"),
    ("--cores-per-rank", "0", "CORES_PER_RANK='0' is out of range; allowed: 1..1024"),
])
def test_bench_refuses_a_bad_number_in_one_line(ftc_home, tmp_path, flag, value, message):
    proc = ftc("bench", "--quick", "--out", str(tmp_path / "bench"), flag, value)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: {message}"
    assert not (tmp_path / "bench").exists()
