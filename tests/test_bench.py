"""`ftc bench --quick`: the benchmark really runs every configuration and reports what it promises."""

import json

from conftest import ftc


def test_quick_bench_reports_ratios_scaling_and_mfu(ftc_home, tmp_path):
    out = tmp_path / "bench"
    proc = ftc("bench", "--quick", "--out", str(out), timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "bench.json").read_text())
    for key in ("seed_samples_per_s", "ftc_samples_per_s", "speedup_vs_seed", "scaling", "gemm_peak_tflops", "mfu",
                "precision", "backend"):
        assert key in report, key
    assert report["speedup_vs_seed"] == round(report["ftc_samples_per_s"] / report["seed_samples_per_s"], 3)
    assert [row["ranks"] for row in report["scaling"]] == [1, 2]
    assert report["scaling"][0]["efficiency"] == 1.0 and report["scaling"][1]["efficiency"] > 0
    assert report["runs"]["seed-1"]["padding"] == "max_length" and report["runs"]["ftc-1"]["padding"] == "longest"
    assert report["runs"]["ftc-2"]["world_size"] == 2 and report["backend"] == "gloo"
    assert 0 < report["mfu"] < 1.5 and report["gemm_peak_tflops"] > 0
    assert "simulated" in (out / "bench.md").read_text()
    assert (out / "bench.png").read_bytes()[:4] == b"\x89PNG"
