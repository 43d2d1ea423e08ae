"""`ftc bench MODE`: each mode really runs every configuration, ftc's and the peer's (Hugging Face
Trainer through torchrun), reports what it promises, and refuses bad input in one line."""

import json
import os

import pytest
from conftest import ftc
from helpers import one_error

from provision import procs
from provision.estimate import Compile


@pytest.mark.slow
def test_quick_bench_reports_whole_passes_of_ftc_and_the_peer_with_ranges_and_a_timeline(ftc_home, tmp_path):
    from runner.bench.scaling import mfu as bench_mfu
    out = tmp_path / "bench"
    out.mkdir()
    # another mode's section, and an earlier scaling report's figure
    (out / "bench.json").write_text(json.dumps({"long_jobs": {"runs": []}, "speedup_vs_seed": 99.0, "levers": ["old"]}))
    # one round (the median and range of repeats are summary()'s, tested on its own); a hang guard sized for a
    # loaded 2-core machine: six runs of 128 rows (the seed; ftc and the peer at 1 and 2 ranks, the peer two ways at 2)
    proc = ftc("bench", "scaling", "--quick", "--repeats", "1", "--out", str(out), timeout=3600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "bench.json").read_text())
    assert report["method"] == "whole-pass" and report["rows_per_pass"] == 128 and report["repeats"] == 1
    assert report["complete"] is True and report["levers"] == [] and report["long_jobs"] == {"runs": []}
    for key in ("seed_samples_per_s", "ftc_samples_per_s", "speedup_vs_seed", "scaling", "gemm_peak_tflops", "mfu",
                "precision", "backend", "peer_samples_per_s", "speedup_vs_peer", "compile", "timeline", "planner"):
        assert key in report, key
    assert report["speedup_vs_seed"] == round(report["ftc_samples_per_s"] / report["seed_samples_per_s"], 3)
    assert [row["ranks"] for row in report["scaling"]] == [1, 2]
    for row in report["scaling"]:
        for program in ("ftc", "peer"):
            low, high = row[f"{program}_rows_per_s_range"]
            assert 0 < low <= row[f"{program}_rows_per_s"] <= high
        assert row["speedup_vs_peer"] == round(row["ftc_rows_per_s"] / row["peer_rows_per_s"], 3)
        assert len(row["ftc_rows_per_s_runs"]) == 1 and len(row["peer_pinned_rows_per_s_runs"]) == 1
    one, two = report["scaling"]
    assert one["peer_launch"] == "pinned" and "peer_unpinned_rows_per_s_runs" not in one  # one rank: one launch
    assert two["peer_launch"] in ("pinned", "unpinned") and len(two["peer_unpinned_rows_per_s_runs"]) == 1
    # the peer's figure is its better launch's
    launches = {kind: two[f"peer_{kind}_rows_per_s_runs"][0] for kind in ("pinned", "unpinned")}
    assert two["peer_launch"] == max(launches, key=launches.__getitem__)
    assert two["peer_rows_per_s"] == pytest.approx(max(launches.values()), abs=1e-3)
    assert one["efficiency"] == 1.0 and two["efficiency"] == round(two["ftc_rows_per_s"] / (2 * one["ftc_rows_per_s"]), 3)
    timeline = report["timeline"]
    assert timeline["ranks"] == 2 and [p["rank"] for p in timeline["per_rank"]] == [0, 1]
    for phases in timeline["per_rank"]:
        parts = phases["compute_s"] + phases["wait_s"] + phases["comm_s"] + phases["optimizer_s"]
        assert phases["comm_s"] > 0 and parts == pytest.approx(phases["step_s"], rel=0.05)
    runs = report["runs"]
    assert runs["seed-1"]["padding"] == "max_length" and runs["ftc-1-r0"]["padding"] == "longest"
    assert runs["ftc-2-r0"]["world_size"] == 2 and report["backend"] == "gloo"
    assert runs["ftc-2-r0"]["allreduce"] == "after-backward" and runs["ftc-2-r0"]["balance"] == "even"
    peer = runs["peer-2-unpinned-r0"]
    assert peer["trainer"] == "transformers.Trainer" and peer["world_size"] == 2 and peer["pinned"] is False
    assert runs["peer-2-pinned-r0"]["pinned"] is True
    assert peer["precision"] == report["precision"] and peer["batch_size_per_rank"] == 32
    assert report["compile"].startswith("off")  # a few steps: the compile would not pay back
    # MFU is the run's FLOP/s over the GEMM peak measured in the same call: on a shared 2-core machine that peak
    # is measured beside other work, so no fixed bound holds; the figure must follow from the report's own
    peak, first = report["gemm_peak_tflops"], report["scaling"][0]
    assert peak > 0 and report["mfu"] > 0
    bounds = [bench_mfu(first["ftc_tokens_per_s"], report["model_flops_per_token"], p, report["mfu_ranks"])
              for p in (peak + 0.0005, max(peak - 0.0005, 1e-6))]  # the peak is reported to 3 decimals
    assert bounds[0] - 0.001 <= report["mfu"] <= bounds[1] + 0.001
    markdown = (out / "scaling.md").read_text()
    assert "simulated" in markdown and "waiting for the slowest" in markdown
    assert (out / "scaling.png").read_bytes()[:4] == b"\x89PNG"


def test_repeated_runs_are_summed_up_as_their_median_and_range():
    from runner.bench.common import summary
    assert summary([3.0, 1.0, 2.0]) == (2.0, [1.0, 3.0])
    assert summary([1.0, 2.0]) == (1.5, [1.0, 2.0])
    assert summary([2.0004]) == (2.0, [2.0, 2.0])


@pytest.mark.parametrize("flag, value, message", [
    ("--ranks", "1,0", "--ranks='0' is out of range; allowed: 1..256"),
    ("--repeats", "many", "--repeats='many' is not a whole number; allowed: 1..100"),
    ("--rows", "8", "--rows='8' is out of range; allowed: 32..1000000"),
    ("--levers", "turbo", "--levers='turbo' is not a lever; allowed: overlap, balance-speed, dense-embedding, fp32-wire, "
                          "gloo-inherit, dropout-0, no-grad-sync"),
    ("--cores-per-rank", "0", "--cores-per-rank='0' is out of range; allowed: 1..1024"),
])
def test_bench_refuses_a_bad_number_in_one_line(ftc_home, tmp_path, flag, value, message):
    proc = ftc("bench", "scaling", "--quick", "--out", str(tmp_path / "bench"), flag, value)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: {message}"
    assert not (tmp_path / "bench").exists()


@pytest.mark.slow
def test_bootstrap_bench_times_one_and_eight_local_nodes_and_leaves_nothing_running(ftc_home, tmp_path):
    out = tmp_path / "bench"
    proc = ftc("bench", "bootstrap", "--repeats", "1", "--out", str(out), timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "bootstrap.json").read_text())
    assert [row["nodes"] for row in report["rows"]] == [1, 8]
    for row in report["rows"]:
        assert len(row["samples"]) == 1 and row["parallel_steps_s"] > 0 and row["second_run_s"] > 0
    assert report["ratio_parallel_steps"] == round(report["rows"][1]["parallel_steps_s"]
                                                   / report["rows"][0]["parallel_steps_s"], 2)
    running = [procs.cmdline(pid) for pid in procs.pids()]
    assert not [cmd for cmd in running if b"sshd" in cmd and b"/clusters/bench" in cmd]  # every node is down


@pytest.mark.parametrize("flags, named", [
    (["scaling", "--out", "{tmp}/afile"], "--out='{tmp}/afile' is not writable"),
    (["scaling", "--data-dir", "{tmp}/no-glue"], "--data-dir='{tmp}/no-glue' has no mrpc/train.tsv"),
    (["scaling", "--ranks", "1,256", "--cores-per-rank", "1024"], "--ranks=1,256 with --cores-per-rank=1024"),
    (["scaling", "--tokenizer", "{tmp}/no-vocab"], "--tokenizer='{tmp}/no-vocab' holds no vocab.txt or tokenizer.json"),
    (["scaling", "--quick=maybe"], "--quick='maybe' is not a boolean"),
    (["launch", "--rows", "8"], "--rows='8' is out of range; allowed: 32..1000000"),
    (["bootstrap", "--repeats", "0"], "--repeats='0' is out of range; allowed: 1..100"),
    (["long-jobs", "1x\u00b2"], "SHAPES='1x\u00b2' is not NODESxCORES, nodes of 2 cores or more; allowed: e.g. 1x16,2x8"),
    (["long-jobs", "1x1"], "SHAPES='1x1' is not NODESxCORES, nodes of 2 cores or more"),
    (["long-jobs", "1x100000"], "SHAPES='1x100000' needs 100000 physical cores; this host has "),
    (["long-jobs", "1x2", "--launches", "compiled,warm"], "--launches='warm' is not a launch; allowed: all, or a comma "
                                                          "list of compiled, from-home, peer-compiled, other-shapes, "),
    ([], "the following arguments are required: MODE"),
    (["--long-jobs", "1x2"], "'--long-jobs' is not a mode: the mode comes first, `ftc bench MODE [OPTIONS]`; allowed: "
                             "scaling, accuracy, launch, network, long-jobs, end-to-end, bootstrap"),
    (["nodes-shapes"], "argument MODE: invalid choice: 'nodes-shapes' (choose from 'scaling', 'accuracy', 'launch', "
                       "'network', 'long-jobs', 'end-to-end', 'bootstrap')"),
], ids=["out a file", "no data", "too many ranks", "no vocabulary", "quick not a boolean", "too few rows",
        "no repeats", "a superscript digit", "a node of one core", "more cores", "not a launch", "no mode", "a flag for a mode",
        "not a mode"])
def test_bench_refuses_bad_input_in_one_line_before_making_anything(ftc_home, tmp_path, flags, named):
    (tmp_path / "afile").write_text("a file")
    (tmp_path / "no-vocab").mkdir()
    flags = [f.format(tmp=tmp_path) for f in flags]
    proc = ftc("bench", *flags, *([] if "--out" in flags else ["--out", str(tmp_path / "bench")] if flags else []))
    assert proc.returncode == 2 and named.format(tmp=tmp_path) in one_error(proc)
    assert not (tmp_path / "bench").exists()


def test_quick_0_is_the_full_bench_and_every_mode_and_flag_has_help(ftc_home, tmp_path):
    # the full bench's rank counts (1,2,4), refused here only because no host has 4 x 1024 cores
    proc = ftc("bench", "scaling", "--quick=0", "--cores-per-rank", "1024", "--out", str(tmp_path / "bench"))
    assert proc.returncode == 2 and "--ranks=1,2,4 with --cores-per-rank=1024" in one_error(proc)
    import argparse

    from runner.bench import MODES, build_parser
    (modes,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert list(modes.choices) == [mode.NAME for mode in MODES] and all(mode.HELP for mode in MODES)
    assert {name: [a.dest for a in parser._actions if not a.help] for name, parser in modes.choices.items()} == {
        mode.NAME: [] for mode in MODES}



@pytest.mark.slow
def test_launch_bench_runs_the_example_under_ftcs_launch_and_plain_torchrun_on_the_same_cores(ftc_home, tmp_path):
    out = tmp_path / "bench"
    proc = ftc("bench", "launch", "--quick", "--repeats", "1", "--out", str(out), timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    launch = json.loads((out / "bench.json").read_text())["launch"]
    assert (launch["ranks"], launch["rows_per_pass"], launch["repeats"], launch["rounds_done"]) == (2, 64, 1, 1)
    assert launch["launch_speedup"] == round(launch["ftc_rows_per_s"] / launch["torchrun_rows_per_s"], 3)
    ftc_out = out / "runs" / "launch-ftc-2-r0" / "workdir" / "output"
    torchrun_out = out / "runs" / "launch-torchrun-2-r0" / "output"
    for folder in (ftc_out, torchrun_out):  # the same script, rows and world on both sides
        result = json.loads((folder / "result.json").read_text())
        assert result["world_size"] == 2 and result["train_samples"] == 64
    ranks = [json.loads((ftc_out / "ranks" / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert not set(ranks[0]["cpus"]) & set(ranks[1]["cpus"])  # ftc's launch: each rank on its own core
    by_hand = [json.loads((torchrun_out / "ranks" / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert by_hand[0]["cpus"] == by_hand[1]["cpus"] == sorted(ranks[0]["cpus"] + ranks[1]["cpus"])  # unpinned


@pytest.mark.parametrize("flags, named", [
    (["c9x"], "INSTANCE='c9x' is not an instance type; allowed: c6i, c6in, c7i, c8i, c8in, m6i, m6in, "
              "m7i, m8i, m8in, r6i, r6in, r7i, r8i, r8in (their 16xlarge) or a type such as c7i.8xlarge"),
    (["c7i", "--ranks", "1"], "--ranks=1: `ftc bench network` needs a node count above 1 in --ranks (2 or more)"),
    (["c7i", "--levers", "flows,overlap"], "--levers='overlap' is not a network lever; allowed: one-flow, flows, "
                                           "flows-overlap, flows-comm-core, flows-batch-2x, flows-powersgd, ceiling"),
], ids=["not an instance type", "no node count above 1", "not a network lever"])
def test_network_bench_refuses_bad_input_in_one_line_before_making_anything(ftc_home, tmp_path, flags, named):
    proc = ftc("bench", "network", *flags, "--quick", "--out", str(tmp_path / "bench"))
    assert proc.returncode == 2 and one_error(proc) == f"error: {named}"
    assert not (tmp_path / "bench").exists()


def test_network_bench_on_a_machine_without_pyroute2_says_what_is_missing(ftc_home, tmp_path):
    # a pyroute2 that cannot be imported, ahead of the installed one
    (tmp_path / "hide" / "pyroute2").mkdir(parents=True)
    (tmp_path / "hide" / "pyroute2" / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    proc = ftc("bench", "network", "c7i", "--quick", "--out", str(tmp_path / "bench"),
               env={"PYTHONPATH": str(tmp_path / "hide")})
    assert proc.returncode == 2
    lacking = "not root" if os.geteuid() else "no pyroute2 (netlink from Python): `make setup` installs it"
    assert one_error(proc).startswith(f"error: `ftc bench network` needs root, pyroute2 and network namespaces: {lacking}")
    assert not (tmp_path / "bench").exists()


def test_network_runs_merge_into_one_report_per_network_and_machine():
    from runner.bench.network import network_merged

    def report(nodes: list[int], machine: str = "16-core host", scale: float = 0.1, instance: str = "c7i.16xlarge",
               express: bool = True, lever: str = "flows") -> dict:
        return {"instance": instance, "ena_express": express, "machine": machine, "command": f"--ranks {nodes}",
                "entries": [{"instance_type": instance, "nodes": n, "lever": lever, "scale": scale,
                             "levers": {"ena_express": express}} for n in nodes],
                "link_check": {str(n): {"one_flow_gbit": scale} for n in nodes}}

    def seen(section: dict) -> list[tuple]:
        return [(e["instance_type"], e["nodes"], e["lever"], e["scale"]) for e in section["entries"]]
    first = network_merged(None, report([4], scale=0.12))
    second = network_merged(first, report([2], scale=0.11))
    assert seen(second) == [("c7i.16xlarge", 2, "flows", 0.11), ("c7i.16xlarge", 4, "flows", 0.12)]
    assert len(second["networks"]) == 1 and set(second["networks"][0]["link_check"]) == {"2", "4"}
    assert second["networks"][0]["commands"] == ["--ranks [4]", "--ranks [2]"]
    again = network_merged(second, report([4], scale=0.13))  # a lever measured again replaces its entry
    assert seen(again) == [("c7i.16xlarge", 2, "flows", 0.11), ("c7i.16xlarge", 4, "flows", 0.13)]
    ceiling = network_merged(again, report([4], scale=0.14, lever="ceiling"))  # another lever joins them
    assert [(e["nodes"], e["lever"]) for e in ceiling["entries"]] == [(2, "flows"), (4, "flows"), (4, "ceiling")]
    other = network_merged(ceiling, report([4], instance="c8in.16xlarge", scale=0.1))  # another network beside it
    assert [m["instance"] for m in other["networks"]] == ["c7i.16xlarge", "c8in.16xlarge"] and len(other["entries"]) == 4
    plain = network_merged(other, report([4], express=False))  # another per-flow cap: a network of its own
    assert len(plain["networks"]) == 3 and len(plain["entries"]) == 5
    assert [e["network"] for e in plain["entries"]] == [0, 0, 0, 1, 2]
    smaller = network_merged(plain, report([4], machine="16-core host, 3 per simulated node"))  # the same host
    assert len(smaller["networks"]) == 4 and len(smaller["entries"]) == 6
    elsewhere = network_merged(plain, report([4], machine="2-core host"))
    assert [e["nodes"] for e in elsewhere["entries"]] == [4] and elsewhere["networks"][0]["commands"] == ["--ranks [4]"]


def test_a_network_run_rewritten_after_each_node_count_names_its_command_once():
    from runner.bench.network import network_merged
    earlier = network_merged(None, {"instance": "c7i.16xlarge", "ena_express": True, "machine": "host", "command": "call 1",
                                    "link_check": {}, "entries": [{"nodes": 2, "lever": "flows"}]})
    report = {"instance": "c7i.16xlarge", "ena_express": True, "machine": "host", "command": "call 2", "link_check": {},
              "entries": [{"nodes": 2, "lever": "flows"}]}
    after_two = network_merged(earlier, report)
    report["entries"].append({"nodes": 4, "lever": "flows"})  # the next node count, merged into what OUT held before
    after_four = network_merged(earlier, report)
    assert after_two["networks"][0]["commands"] == after_four["networks"][0]["commands"] == ["call 1", "call 2"]
    assert [e["nodes"] for e in after_four["entries"]] == [2, 4]


def test_long_jobs_run_ftcs_compiles_from_cold_and_from_home_against_the_peer_compiled_and_its_fastest():
    from runner.bench.long_jobs import OTHER_SHAPES, long_job_launches
    from runner.node.recipes import AUTO_SHAPES
    assert {AUTO_SHAPES, OTHER_SHAPES} == {"dynamic", "buckets"}
    assert [launch.label for launch in long_job_launches(1, 16)] == [
        "ftc 1x1x16 compiled", "ftc 1x1x16 compiled, kernels from home", "peer 1x1x16 pinned compiled static",
        f"ftc 1x1x16 compiled {OTHER_SHAPES}", "peer 1x16x1 unpinned", "ftc 1x1x16", "peer 1x1x16 pinned",
        "ftc 1x16x1 compiled", "ftc 1x16x1",
        "ftc 1x1x16 compiled batch 512", "ftc 1x1x16 batch 512"]
    assert [launch.label for launch in long_job_launches(2, 8)] == [  # ranks of two nodes never share cores
        "ftc 2x1x8 compiled", "ftc 2x1x8 compiled, kernels from home", "peer 2x1x8 pinned compiled static",
        f"ftc 2x1x8 compiled {OTHER_SHAPES}", "peer 2x8x1 pinned", "ftc 2x1x8", "peer 2x1x8 pinned",
        "ftc 2x8x1 compiled", "ftc 2x8x1",
        "ftc 2x1x8 compiled batch 256", "ftc 2x1x8 batch 256"]
    # at the peer's global batch: its rank a core at the seed recipe's 32 rows each, in ftc's one rank a node
    at_peer_batch = {launch.label: launch.args for launch in long_job_launches(1, 16)}
    in_process = ("--compile", "on", "--compile-aside-from", "0")  # a compile aside would not end within a pass
    assert at_peer_batch["ftc 1x1x16 compiled batch 512"] == (*in_process, "--shapes", AUTO_SHAPES, "--batch-size", "512")
    assert at_peer_batch["ftc 1x1x16 batch 512"] == ("--compile", "off", "--batch-size", "512")
    assert [launch.label for launch in long_job_launches(1, 2)] == [  # the smallest node: still two ranks of one core
        "ftc 1x1x2 compiled", "ftc 1x1x2 compiled, kernels from home", "peer 1x1x2 pinned compiled static",
        f"ftc 1x1x2 compiled {OTHER_SHAPES}", "peer 1x2x1 unpinned", "ftc 1x1x2", "peer 1x1x2 pinned",
        "ftc 1x2x1 compiled", "ftc 1x2x1",
        "ftc 1x1x2 compiled batch 64", "ftc 1x1x2 batch 64"]
    own = {launch.label: (launch.args, launch.from_home) for launch in long_job_launches(1, 2)}
    assert own["ftc 1x1x2 compiled"] == ((*in_process, "--shapes", AUTO_SHAPES), False)
    assert own["ftc 1x1x2 compiled, kernels from home"] == ((*in_process, "--shapes", AUTO_SHAPES), True)
    assert own[f"ftc 1x1x2 compiled {OTHER_SHAPES}"] == ((*in_process, "--shapes", OTHER_SHAPES), False)
    assert own["peer 1x1x2 pinned compiled static"] == (("--torch-compile", "--static-shapes"), False)
    assert own["ftc 1x1x2"] == (("--compile", "off"), False) and own["peer 1x2x1 unpinned"] == ((), False)
    assert own["peer 1x1x2 pinned"] == ((), False)  # the peer eager at ftc's launch: the recipe's rows a step
    # --launches picks some, in the bench's own order
    assert [launch.label for launch in long_job_launches(1, 16, ("peer-fastest", "compiled"))] == [
        "ftc 1x1x16 compiled", "peer 1x16x1 unpinned"]


def long_run(launch: str, round_: int, cache: str, first_s: float, later_s: float, rows: int = 100) -> dict:
    return {"shape": "1x16", "launch": launch, "round": round_, "cache": cache,
            "passes": [[rows, first_s], [rows, later_s]]}


def test_a_long_jobs_entry_rates_the_later_pass_and_adds_the_warm_start_cost_for_each_job():
    from runner.bench.long_jobs import JOB_ROWS, long_job_entry, start_cost
    runs = [long_run("ftc 1x1x16", 1, "none", 2.0, 1.0), long_run("ftc 1x1x16 compiled", 1, "cold", 100.8, 0.8),
            long_run("peer 1x4x4 unpinned", 1, "none", 1.5, 1.25),
            long_run("ftc 1x1x16", 2, "none", 2.0, 1.25), long_run("ftc 1x1x16 compiled", 2, "warm", 40.8, 0.8),
            long_run("peer 1x4x4 unpinned", 2, "none", 1.5, 1.25)]
    assert start_cost(runs[1]) == 100.0 and start_cost(runs[4]) == 40.0  # beyond a later pass of its rows
    entry = long_job_entry(1, 16, runs)
    compiled = entry["launches"]["ftc 1x1x16 compiled"]
    assert compiled["later_rows_per_s"] == 125.0 and compiled["start_cost_s"] == {"cold": 100.0, "warm": 40.0}
    assert entry["launches"]["ftc 1x1x16"]["later_rows_per_s_range"] == [80.0, 100.0]
    assert (entry["ftc_launch"], entry["peer_launch"]) == ("ftc 1x1x16 compiled", "peer 1x4x4 unpinned")
    assert entry["long_job_speedup_vs_peer"] == round(125 / 80, 3)
    mrpc, qqp = entry["jobs"]["mrpc, 3 epochs"], entry["jobs"]["qqp, 3 epochs"]
    # MRPC: the warm compile's 40 s is more than it saves there, so ftc's fastest for it is uncompiled
    assert mrpc["ftc_launch"] == "ftc 1x1x16" and mrpc["ftc_s"] == round(0.875 + JOB_ROWS["mrpc, 3 epochs"] / 90, 1)
    assert qqp["ftc_launch"] == "ftc 1x1x16 compiled" and qqp["ftc_s"] == round(40 + JOB_ROWS["qqp, 3 epochs"] / 125, 1)
    assert qqp["peer_s"] == round(0.25 + JOB_ROWS["qqp, 3 epochs"] / 80, 1)
    assert qqp["speedup"] == round(qqp["peer_s"] / qqp["ftc_s"], 3) and 1.5 < qqp["speedup"] < 1.6


def test_jobs_at_the_recipes_rows_a_step_compare_the_launches_of_ftcs_ranks_a_node_and_from_home_beside():
    from runner.bench.long_jobs import JOB_ROWS, long_job_entry
    runs = [long_run("ftc 1x1x16", 1, "none", 2.0, 1.0), long_run("ftc 1x1x16 compiled", 1, "cold", 100.8, 0.8),
            long_run("ftc 1x1x16 compiled, kernels from home", 1, "warm from home", 20.5, 0.5),
            long_run("peer 1x16x1 unpinned", 1, "none", 1.5, 0.5), long_run("peer 1x1x16 pinned", 1, "none", 1.5, 1.25),
            long_run("ftc 1x16x1", 1, "none", 0.4, 0.4)]
    entry = long_job_entry(1, 16, runs)
    # the fastest launches of either side are a rank a core, 16 x 32 rows a step
    assert entry["jobs"]["mrpc, 3 epochs"]["peer_launch"] == "peer 1x16x1 unpinned"
    assert entry["jobs"]["mrpc, 3 epochs"]["ftc_launch"] == "ftc 1x16x1"
    mrpc = entry["jobs_at_recipe_batch"]["mrpc, 3 epochs"]
    rows = JOB_ROWS["mrpc, 3 epochs"]
    assert (mrpc["ftc_launch"], mrpc["peer_launch"]) == ("ftc 1x1x16", "peer 1x1x16 pinned")
    assert (mrpc["ftc_s"], mrpc["peer_s"]) == (round(1.0 + rows / 100, 1), round(0.25 + rows / 80, 1))
    # a new cluster's first job from kernels an earlier one compiled: its start from home and its rate
    assert mrpc["ftc_from_home_s"] == round(20.0 + rows / 200, 1)
    assert mrpc["speedup_from_home"] == round(mrpc["peer_s"] / mrpc["ftc_from_home_s"], 3)
    # without a peer at ftc's launch there is nothing at the recipe's rows a step to compare
    assert long_job_entry(1, 16, [run for run in runs if run["launch"] != "peer 1x1x16 pinned"])["jobs_at_recipe_batch"] == {}


def test_ftc_at_the_peers_global_batch_is_rated_beside_never_as_ftcs_best_and_the_plan_keeps_its_own_batch(tmp_path):
    from runner.bench.long_jobs import long_job_entry
    from runner.plan import compile_figures
    # at 128 rows a step ftc compiled is the fastest launch, but it trains another recipe (a quarter of the steps)
    runs = [long_run("ftc 1x1x16", 1, "none", 2.0, 1.0), long_run("ftc 1x1x16 compiled", 1, "cold", 100.8, 0.8),
            long_run("peer 1x4x4 unpinned", 1, "none", 1.5, 1.25),
            long_run("ftc 1x1x16 compiled batch 128", 1, "warm", 40.5, 0.5),
            long_run("ftc 1x1x16 batch 128", 1, "none", 2.0, 2.0)]
    entry = long_job_entry(1, 16, runs)
    assert entry["ftc_launch"] == "ftc 1x1x16 compiled" and entry["long_job_speedup_vs_peer"] == round(125 / 80, 3)
    assert {job["ftc_launch"] for job in entry["jobs"].values()} <= {"ftc 1x1x16", "ftc 1x1x16 compiled"}
    assert entry["at_peer_batch"] == {"ftc 1x1x16 compiled batch 128": round(200 / 80, 3),
                                      "ftc 1x1x16 batch 128": round(50 / 80, 3)}
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"long_jobs": {"shapes": [entry]}}))
    assert compile_figures(str(bench)) == Compile(1.25, 100.0)  # compiled over eager, both at 32 rows a step
    # ftc at the peer's launch (a rank a core) the fastest, eager or compiled: the plan keeps ftc's default launch
    for fastest in ("ftc 1x16x1", "ftc 1x16x1 compiled"):
        entry = long_job_entry(1, 16, runs + [long_run(fastest, 1, "cold", 300.4, 0.4)])
        assert entry["ftc_launch"] == fastest and entry["compile"]["ftc_launch"] == "ftc 1x1x16 compiled"
        bench.write_text(json.dumps({"long_jobs": {"shapes": [entry]}}))
        assert compile_figures(str(bench)) == Compile(1.25, 100.0), fastest


def test_a_long_jobs_entry_sets_ftcs_cold_start_beside_its_start_from_home_its_other_shapes_and_the_peers():
    from runner.bench.long_jobs import OTHER_SHAPES, long_job_entry
    from runner.node.recipes import AUTO_SHAPES
    runs = [long_run("ftc 1x1x16 compiled", 1, "cold", 40.8, 0.8),
            long_run("ftc 1x1x16 compiled, kernels from home", 1, "warm from home", 8.6, 0.6),
            long_run("peer 1x1x16 pinned compiled static", 1, "cold", 21.0, 1.0),
            long_run(f"ftc 1x1x16 compiled {OTHER_SHAPES}", 1, "cold", 101.0, 1.0),
            long_run("peer 1x4x4 unpinned", 1, "none", 1.5, 1.25), long_run("ftc 1x1x16", 1, "none", 2.0, 1.0)]
    entry = long_job_entry(1, 16, runs)
    assert entry["compile"] == {
        "ftc_launch": "ftc 1x1x16 compiled", "ftc_shapes": AUTO_SHAPES, "ftc_cold_start_s": 40.0,
        "from_home_start_s": 8.0, "other_shapes": OTHER_SHAPES, "other_shapes_cold_start_s": 100.0,
        "peer_launch": "peer 1x1x16 pinned compiled static", "peer_cold_start_s": 20.0,
        "from_home_share": 0.2, "other_shapes_start_vs_default": 2.5, "start_vs_peer_compiled": 2.0,
        "default_rate_vs_other_shapes": 1.25}
    # a run from home measured a start; a long job's rate is the runs' that compiled the kernels
    assert entry["ftc_launch"] == "ftc 1x1x16 compiled" and entry["ftc_later_rows_per_s"] == 125.0


def test_long_jobs_runs_of_another_call_land_in_one_report_only_for_the_same_setting():
    from runner.bench.long_jobs import long_jobs_section, same_setting
    setting = {"cpu": "cpu A", "model": "distilbert-6-layers-random", "rows_per_pass": 100, "passes": 2,
               "allocator": "glibc", "peer_fastest_launch": "a rank a core"}
    first = long_jobs_section(setting, [long_run("ftc 1x1x16", 1, "none", 2.0, 1.0),
                                        long_run("peer 1x4x4 unpinned", 1, "none", 2.0, 1.0)], ["call 1"])
    assert same_setting(first, setting) is first and same_setting(None, setting) is None
    for key, other in (("cpu", "cpu B"), ("model", "distilbert-2-layers-random"), ("rows_per_pass", 128),
                       ("allocator", "tcmalloc")):
        assert same_setting(first, {**setting, key: other}) is None, key
    # a section of before the peer's launch rule was named (its peer ran 4 x 4) stays apart
    assert same_setting({k: v for k, v in first.items() if k != "peer_fastest_launch"}, setting) is None
    both = long_jobs_section(setting, first["runs"] + [long_run("ftc 1x1x16", 2, "none", 2.0, 0.5)], ["call 1", "call 2"])
    assert both["shapes"][0]["launches"]["ftc 1x1x16"]["runs"] == [100.0, 200.0] and both["commands"] == ["call 1", "call 2"]


@pytest.mark.slow
def test_long_jobs_bench_compiles_cold_and_from_home_beside_the_peer_compiled_with_static_shapes(ftc_home, tmp_path):
    from runner.node.recipes import AUTO_SHAPES
    out = tmp_path / "bench"
    # the launches whose runs depend on each other; every launch's flags are test_long_jobs_run_ftcs_compiles_...'s
    proc = ftc("bench", "long-jobs", "1x2", "--quick", "--rows", "64", "--repeats", "1", "--out", str(out),
               "--launches", "peer-compiled,from-home,compiled", timeout=3600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    section = json.loads((out / "bench.json").read_text())["long_jobs"]
    caches = {run["launch"]: run.get("cache") for run in section["runs"]}
    entry = section["shapes"][0]
    # the peer's static shapes compile where its dynamic ones failed in inductor ("expected [s16] to have been
    # codegen-ed"); ftc's second node starts from the kernels the first brought home
    assert entry["failed"] == {}
    # in the bench's own order, whatever order --launches named them in
    assert list(caches.items()) == [("ftc 1x1x2 compiled", "cold"), ("ftc 1x1x2 compiled, kernels from home", "warm from home"),
                                    ("peer 1x1x2 pinned compiled static", "cold")]
    assert all(run["passes"][0][0] == run["passes"][1][0] > 0 for run in section["runs"])
    from_home = json.loads((out / "runs" / "long-ftc-1x1x2-compiled-kernels-from-home-r1" / "results.json").read_text())
    assert (from_home["compile_cache"], from_home["compile_cache_from"], from_home["compile_shapes"]) == (
        "warm", "an earlier cluster", AUTO_SHAPES)
    assert entry["compile"]["from_home_share"] > 0 and entry["compile"]["start_vs_peer_compiled"] > 0
    assert set(entry["jobs"]) == {"mrpc, 3 epochs", "qqp, 3 epochs"} and entry["long_job_speedup_vs_peer"] > 0
    # the peer compiled runs ftc's one rank a node: both at the recipe's rows a step, ftc also from home
    at_recipe = entry["jobs_at_recipe_batch"]["mrpc, 3 epochs"]
    assert (at_recipe["ftc_launch"], at_recipe["peer_launch"]) == ("ftc 1x1x2 compiled", "peer 1x1x2 pinned compiled static")
    assert at_recipe["ftc_from_home_s"] > 0 and at_recipe["speedup_from_home"] > 0
    # the bench's node noted its cold compile, the fresh node its warm one (and no rate: 3 steady steps a
    # run are too few)
    (note_file,) = (out / "node").glob("cache/inductor-*/ftc-compiled.json")
    assert [set(noted) for noted in json.loads(note_file.read_text()).values()] == [{"cold_s"}]
    (from_home_note,) = (out / "node-from-home-r1").glob("cache/inductor-*/ftc-compiled.json")
    assert [set(noted) for noted in json.loads(from_home_note.read_text()).values()] == [{"warm_s"}]


def test_a_failed_peer_launch_is_kept_with_the_line_naming_its_error_and_left_out_of_the_rates():
    from runner.bench.long_jobs import failure_line, long_job_entry
    log = ("[rank0]: Traceback (most recent call last):\n[rank0]:   File \"x.py\", line 1\n"
           "[rank0]: torch._inductor.exc.InductorError: AssertionError: For 768*s16, expected [s16]\n"
           "ChildFailedError:\n  traceback : To enable traceback see")
    assert failure_line(log) == "torch._inductor.exc.InductorError: AssertionError: For 768*s16, expected [s16]"
    assert failure_line("ChildFailedError: rank 0\nmore") == "ChildFailedError: rank 0"
    assert failure_line("killed\n") == "killed" and failure_line("") == "no output"
    runs = [long_run("ftc 1x1x16", 1, "none", 2.0, 1.0), long_run("peer 1x4x4 unpinned", 1, "none", 1.5, 1.25),
            {"shape": "1x16", "launch": "peer 1x1x16 pinned compiled", "round": 1, "cache": "cold",
             "failed": "InductorError: AssertionError"}]
    entry = long_job_entry(1, 16, runs)
    assert entry["failed"] == {"peer 1x1x16 pinned compiled": "InductorError: AssertionError"}
    assert set(entry["launches"]) == {"ftc 1x1x16", "peer 1x4x4 unpinned"} and entry["peer_launch"] == "peer 1x4x4 unpinned"


def test_accuracy_bench_refuses_a_bad_model_and_too_few_cores_in_one_line(ftc_home, tmp_path):
    proc = ftc("bench", "accuracy", "--model", str(tmp_path / "no-such-model"), "--out", str(tmp_path / "b"))
    assert proc.returncode == 2 and one_error(proc).startswith(f"error: --model='{tmp_path / 'no-such-model'}' is not a "
                                                               "directory")
    one_core = ftc("bench", "accuracy", "--out", str(tmp_path / "b"),
                   preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}))
    assert one_core.returncode == 2
    assert one_error(one_core) == ("error: `ftc bench accuracy` runs 3 programs side by side, a core each at least; this "
                                   "host has 1 physical core(s): run it on a host with 3 or more")
    assert not (tmp_path / "b").exists()


@pytest.mark.slow
def test_a_bench_cut_short_by_ctrl_c_keeps_the_rank_counts_it_finished_and_exits_130(ftc_home, tmp_path):
    import signal
    import subprocess

    from conftest import FTC
    from helpers import wait_for
    out = tmp_path / "bench"
    proc = subprocess.Popen([*FTC, "bench", "scaling", "--quick", "--no-peer", "--repeats", "1", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # written once the seed recipe and the first rank count ran
    wait_for(lambda: (out / "bench.json").exists() or proc.poll() is not None, "the first rank count", timeout=1200)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("interrupted after"), err[-3000:]
    report = json.loads((out / "bench.json").read_text())
    assert report["complete"] is False and [row["ranks"] for row in report["scaling"]] == [1]
    assert report["scaling"][0]["efficiency"] == 1.0 and set(report["runs"]) == {"seed-1", "ftc-1-r0"}


def test_network_bench_refuses_ena_express_on_a_type_without_it(ftc_home, tmp_path):
    proc = ftc("bench", "network", "c7i.8xlarge", "--quick", "--ena-express", "1", "--out", str(tmp_path / "bench"))
    assert proc.returncode == 2 and one_error(proc).startswith("error: --ena-express=1, but c7i.8xlarge has no ENA Express")
    assert not (tmp_path / "bench").exists()
