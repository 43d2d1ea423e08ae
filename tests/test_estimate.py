"""`ftc plan`'s model and the bench's FLOP count, against hand-computed cases."""

import json
from pathlib import Path

import pytest
from conftest import REPO, ftc
from helpers import one_error

from provision import estimate
from runner import plan
from runner.bench import common, scaling
from runner.node.recipes import wire_compress


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
                         grad_bytes=1e9, network_gbps=8.0, exposure=1.0, wait_share=0.0, usd_per_node_hour=3.6, setup_s=100,
                         latency_s=0.0)
    one, two = rows
    assert one.samples_per_s == pytest.approx(32) and one.train_s == pytest.approx(20) and one.efficiency == 1
    assert two.samples_per_s == pytest.approx(32) and two.efficiency == pytest.approx(0.5)
    assert two.wall_s == pytest.approx(120) and two.usd == pytest.approx(2 * 3.6 * 120 / 3600)


def test_distilbert_size_and_flops_per_token_by_hand(tmp_path):
    model = common.make_distilbert(tmp_path / "distilbert", tmp_path)
    per_layer = 4 * (768 * 768 + 768) + (768 * 3072 + 3072) + (3072 * 768 + 768) + 2 * 2 * 768
    dense = 6 * per_layer + (768 * 768 + 768) + (768 * 2 + 2)  # layers, pre-classifier, classifier
    embeddings = 30522 * 768 + 512 * 768 + 2 * 768
    assert dense + embeddings == estimate.DISTILBERT_PARAMS
    assert scaling.model_flops_per_token(model, 54) == 6 * dense + 12 * 6 * 768 * 54


def test_mrpc_train_size_is_the_file_s(glue_dir):
    rows = (glue_dir / "mrpc" / "train.tsv").read_text().strip().splitlines()
    assert len(rows) - 1 == estimate.GLUE_TRAIN_SIZES["mrpc"]


def small_bench(directory: Path) -> Path:
    """A bench.json of 30 samples/s on 4 bf16 cores, exposure 1.5 and a 5% wait: figures easy to check by hand."""
    path = directory / "bench.json"
    path.write_text(json.dumps({"ftc_samples_per_s": 30.0, "cores_per_rank": 4, "cpu": "test cpu", "precision": "bf16",
                                "planner": {"exposure": 1.5, "wait_share": 0.05}}))
    return path


def test_plan_command_prints_each_cluster_size(ftc_home, tmp_path):
    path = small_bench(tmp_path)
    proc = ftc("plan", "--task", "qqp", "--nodes", "1,2,4", "--instance-type", "c7i.16xlarge", "--bench", str(path))
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("│") and ln.strip("│ ").split(" ")[0] in ("1", "2", "4")]
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
    assert f"--bench='{path}'" in error and named in error


def test_plan_refuses_a_rate_too_small_to_plan_with(ftc_home):
    proc = ftc("plan", "--samples-per-s", "1e-300")
    assert proc.returncode == 2 and "--samples-per-s='1e-300' is out of range" in one_error(proc)



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


def test_overlap_hides_what_was_measured_to_hide_and_costs_its_measured_share(monkeypatch):
    overlap, after = estimate.Levers(flows=1, overlap=True, accumulate=1), estimate.DEFAULT_LEVERS
    # as measured (docs/bench.json network): overlapped, OVERLAP_HIDES of backward moves the gradient
    hidden = estimate.OVERLAP_HIDES * estimate.BACKWARD_SHARE
    assert estimate.step_seconds(32, 32.0, 1.0, 1.2, 0.0, overlap) == pytest.approx(1 + 1.2 * (1 - hidden))
    assert estimate.step_seconds(32, 32.0, 1.0, 1.2, 0.0, after) == pytest.approx(1 + 1.2)
    # the plan charges an overlapped step OVERLAP_COST of its compute where after backward it charges the wait
    base = dict(train_samples=32, epochs=1, node_samples_per_s=32.0, batch_per_node=32, grad_bytes=0.0,
                network_gbps=25.0, exposure=1.2, wait_share=0.05, usd_per_node_hour=1.0, setup_s=0.0)
    assert estimate.plan([2], levers=overlap, **base)[0].train_s == pytest.approx((1 + estimate.OVERLAP_COST) / 2)
    assert estimate.plan([2], levers=after, **base)[0].train_s == pytest.approx((1.05 + 2.4 * estimate.DEFAULT_HOP_LATENCY_S) / 2)
    assert estimate.plan([1], levers=overlap, **base)[0].train_s == pytest.approx(1.0)  # one node waits for no one
    # were all of backward free for it: compute 1 s, backward 2/3 s, so a 1 s all-reduce leaves 1/3 s exposed
    monkeypatch.setattr(estimate, "OVERLAP_HIDES", 1.0)
    assert estimate.step_seconds(32, 32.0, 1.0, 1.2, 0.0, overlap) == pytest.approx(1 + 1.2 / 3)
    assert estimate.step_seconds(32, 32.0, 0.5, 1.2, 0.0, overlap) == pytest.approx(1.0)  # hidden entirely


def test_accumulation_pays_one_allreduce_per_k_micro_batches():
    # 4 micro-batches of 1 s each, 10% waiting, then one 0.5 s all-reduce exposed 1.2x
    levers = estimate.Levers(flows=1, overlap=False, accumulate=4)
    assert estimate.step_seconds(32, 32.0, 0.5, 1.2, 0.1, levers) == pytest.approx(4.4 + 0.6)
    rows = estimate.plan([2], train_samples=640, epochs=1, node_samples_per_s=32.0, batch_per_node=32,
                         grad_bytes=1e9, network_gbps=8.0, exposure=1.0, wait_share=0.0, usd_per_node_hour=3.6,
                         setup_s=0, levers=levers, latency_s=0.0)
    assert rows[0].samples_per_s == pytest.approx(2 * 32 * 4 / 5)  # 4 s of compute and a 1 s all-reduce


def test_flows_lift_the_ring_to_the_instance_bandwidth():
    # c7i.16xlarge, 25 Gbit/s: one flow gets 10, three get all 25
    def four_nodes(flows: int) -> float:
        return estimate.plan([4], 363846, 1, 316.0, 32, 1e9, 25.0, 1.0, 0.0, 2.856, 0,
                             estimate.Levers(flows, False, 1), latency_s=0.0)[0].allreduce_s
    assert four_nodes(1) == pytest.approx(1.5 * 1e9 / (10e9 / 8))
    assert four_nodes(3) == pytest.approx(1.5 * 1e9 / (25e9 / 8))


def test_default_levers_are_what_ftc_jobs_do():
    from runner.node.recipes import RECIPES, allreduce_mode
    assert estimate.default_levers(25.0) == estimate.Levers(flows=3, overlap=False, accumulate=1)
    assert [estimate.flows_to_fill(gbps) for gbps in (10.0, 12.5, 25.0, 50.0)] == [1, 2, 3, 5]
    assert RECIPES["ftc"]["allreduce"] == "auto"
    # with ENA Express one flow fills 25 Gbit/s, four fill 100
    assert estimate.default_levers(25.0, True, 10.0, 25.0) == estimate.Levers(flows=1, overlap=False, accumulate=1,
                                                                             express=True)
    assert estimate.default_levers(100.0, True, 10.0, 25.0).flows == 4
    # auto reaches a rank only where the controller could not weigh the network: after backward
    assert allreduce_mode("auto") == "after-backward" and allreduce_mode("comm-core") == "comm-core"


def test_the_controller_keeps_a_communication_core_where_the_exchange_outweighs_its_cost():
    from runner.plan import exchange_for
    # c7i's 25 Gbit/s on 4 nodes: the exchange is 64% of a step, hidden behind backward; c8in's 100: 16%, not worth it
    assert exchange_for("aws", "c7i.16xlarge", 4, express=True) == "comm-core"
    assert exchange_for("aws", "c8in.16xlarge", 4, express=True) == "after-backward"
    assert exchange_for("aws", "c7i.16xlarge", 1, express=True) == ""  # one node exchanges nothing
    assert exchange_for("local", "c7i.16xlarge", 4, express=False) == ""  # no catalog: the job runs after backward


def test_a_communication_core_costs_its_share_of_the_node_and_hides_the_exchange_behind_backward():
    base = dict(train_samples=3200, epochs=1, node_samples_per_s=320.0, batch_per_node=32, grad_bytes=134e6,
                network_gbps=25.0, exposure=1.0, wait_share=0.0, usd_per_node_hour=1.0, setup_s=0.0, cores=32)
    after = estimate.plan([1, 4], levers=estimate.Levers(3, False, 1), **base)
    kept = estimate.plan([1, 4], levers=estimate.with_comm_core(estimate.Levers(3, False, 1)), **base)
    assert kept[0].samples_per_s == after[0].samples_per_s == 320.0  # one node exchanges nothing: no core kept
    # 4 nodes: the 64 ms exchange after a 100 ms step, or mostly hidden behind its backward on 31 of 32 cores
    assert after[1].samples_per_s == pytest.approx(4 * 32 / (0.1 + after[1].allreduce_s))
    micro = 32 / (320.0 * 31 / 32)
    hidden = estimate.OVERLAP_HIDES * estimate.BACKWARD_SHARE * micro
    step = micro * (1 + estimate.OVERLAP_COST) + max(0.0, kept[1].allreduce_s - hidden)
    assert kept[1].samples_per_s == pytest.approx(4 * 32 / step)
    assert kept[1].samples_per_s > after[1].samples_per_s


def test_ena_express_raises_each_flows_cap_and_a_compile_is_billed_before_training():
    base = dict(train_samples=1_000_000, epochs=1, node_samples_per_s=300.0, batch_per_node=32, grad_bytes=134e6,
                network_gbps=100.0, exposure=1.0, wait_share=0.0, usd_per_node_hour=4.0, setup_s=300.0,
                flow_gbps=10.0, express_flow_gbps=25.0, compiled=estimate.Compile(1.5, 120.0))
    plain, express = (estimate.plan([4], levers=estimate.Levers(4, False, 1, express=on), **base)[0] for on in (False, True))
    assert plain.allreduce_s == pytest.approx(1.5 * 134e6 / (40e9 / 8) + 6 * estimate.DEFAULT_HOP_LATENCY_S)
    assert express.allreduce_s == pytest.approx(1.5 * 134e6 / (100e9 / 8) + 6 * estimate.DEFAULT_HOP_LATENCY_S)
    eager, compiled = (estimate.plan([1], levers=estimate.Levers(1, False, 1, compiled=on), **base)[0] for on in (False, True))
    assert compiled.samples_per_s == pytest.approx(1.5 * eager.samples_per_s)
    assert compiled.wall_s == pytest.approx(compiled.train_s + 300.0 + 120.0)
    assert eager.wall_s == pytest.approx(eager.train_s + 300.0)


def test_class_rates_come_from_the_catalog_and_the_measured_ratio():
    from provision.catalog import INSTANCE_TYPES
    assert estimate.xeon_class(INSTANCE_TYPES["c7i.16xlarge"].native_bf16) == "bf16"
    assert estimate.xeon_class(INSTANCE_TYPES["c6i.16xlarge"].native_bf16) == "avx512"
    assert estimate.class_rate(10.0, "bf16", "avx512") == pytest.approx(8.0)  # 20 / 25 rows/s per core
    assert estimate.class_rate(10.0, "bf16", "avx2") == pytest.approx(5.6)  # 14 / 25
    assert estimate.class_rate(10.0, "avx512", "avx512") == 10.0


def test_alternatives_fill_the_link_and_offer_accumulation_and_overlap_only_where_it_hides(monkeypatch):
    default = estimate.DEFAULT_LEVERS
    rank = estimate.POWERSGD_RANK
    core = estimate.with_comm_core
    assert estimate.alternative_levers(default, 25.0) == [core(estimate.Levers(3, False, 1)), estimate.Levers(1, False, 4),
                                                          estimate.Levers(3, False, 1, rank)]
    assert estimate.alternative_levers(core(estimate.Levers(3, False, 1)), 25.0) == [
        core(estimate.Levers(3, False, 4)), estimate.Levers(3, False, 1, rank)]
    assert estimate.alternative_levers(estimate.Levers(3, False, 2, rank), 25.0) == []
    # with ENA Express one flow fills 25 Gbit/s: no more flows to offer, the communication core still
    assert estimate.alternative_levers(default, 25.0, 25.0)[0] == core(default)
    assert estimate.lever_flags(estimate.Levers(3, True, 4), default) == "--flows 3 --allreduce overlap --accumulate 4"
    assert estimate.lever_flags(core(default), default) == "--allreduce comm-core"
    assert estimate.lever_flags(estimate.Levers(3, False, 1, rank), default) == "--flows 3 --grad-compress powersgd"
    # what to add to the plan in hand: on a link the defaults fill with 3 flows, not --flows 3 again
    assert estimate.lever_flags(estimate.Levers(3, False, 4), estimate.Levers(3, False, 1)) == "--accumulate 4"


def test_powersgd_bytes_are_distilberts_factors_and_what_crosses_whole(tmp_path):
    """The matrices PowerSGD factors are distilbert's (counted from the model itself), and at rank 4
    the three all-reduces move about 1% of the bf16 gradient's bytes."""
    from transformers import AutoConfig, AutoModelForSequenceClassification
    model = AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(
        common.make_distilbert(tmp_path / "distilbert", tmp_path)))
    rank = estimate.POWERSGD_RANK
    words = model.get_input_embeddings().weight
    assert tuple(words.shape) == estimate.DISTILBERT_WORD_EMBEDDINGS
    shapes = sorted(tuple(p.shape) for p in model.parameters()
                    if p is not words and p.ndim == 2 and sum(p.shape) * rank < p.numel())
    assert shapes == sorted(estimate.DISTILBERT_MATRICES)
    p, q, whole = estimate.low_rank_bytes(rank)
    assert p == 4 * rank * sum(n for n, _ in shapes) and q == 4 * rank * sum(m for _, m in shapes)
    rest = sum(t.numel() for t in model.parameters() if t is not words and tuple(t.shape) not in shapes)
    assert whole == pytest.approx(2 * (rest + estimate.EMBEDDING_ROWS_USED * words.numel()))
    assert 0.03 < (p + q + whole) / estimate.gradient_bytes(bf16=True) < 0.05  # the used rows are most of it
    assert estimate.low_rank_bytes(rank, estimate.DISTILBERT_PARAMS // 2)[0] == pytest.approx(p / 2)


def test_powersgd_exchange_is_three_rings_and_arithmetic_that_scales_with_the_node():
    parts = estimate.low_rank_bytes(4)
    rings = sum(estimate.ring_allreduce_seconds(b, 4, 10.0, 1e-4) for b in parts)
    arithmetic = estimate.LOW_RANK_ROWS / 100.0  # as long as training that many rows at 100 rows/s
    assert estimate.exchange_seconds(1e8, 4, 10.0, 1e-4, 4, 100.0) == pytest.approx(rings + arithmetic)
    assert estimate.exchange_seconds(1e8, 4, 10.0, 1e-4, 4, 200.0) == pytest.approx(rings + arithmetic / 2)
    assert estimate.exchange_seconds(1e8, 4, 10.0, 1e-4, 0, 100.0) == estimate.ring_allreduce_seconds(1e8, 4, 10.0, 1e-4)
    assert estimate.exchange_seconds(1e8, 1, 10.0, 1e-4, 4, 100.0) == 0.0


C7I = estimate.Assumed(node_samples_per_s=316.0, cpu_class="bf16", batch_per_node=32, network_gbps=25.0, lr=2e-5)


def row(nodes: int, train_s: float, allreduce_s: float = 0.0, efficiency: float = 1.0) -> estimate.PlanRow:
    """A plan row with 5 min of setup at $3 per node-hour."""
    wall = train_s + 300
    return estimate.PlanRow(nodes, 0.0, efficiency, allreduce_s, train_s, wall, nodes * 3.0 * wall / 3600)


def test_recommendation_names_the_fastest_and_the_cheapest_where_more_nodes_pay():
    rows = [row(1, 3600), row(4, 3600 / 4 / 0.95, efficiency=0.95)]
    text = estimate.recommend(rows, estimate.DEFAULT_LEVERS, C7I, [])
    # 3900 s against 1247 s wall, $3.25 against $4.16
    assert text.startswith("4 nodes finish 3.1x sooner for 1.3x the cost of 1. Assumed: 316 samples/s per node "
                           "(native bf16), 32 rows per node per micro-batch, one TCP flow per peer (10 Gbit/s), "
                           "the all-reduce after backward, no accumulation."), text


def test_recommendation_says_why_more_nodes_do_not_pay_and_what_to_try():
    rows = [row(1, 3453), row(2, 4144, 0.107, 0.42), row(4, 2649, 0.161, 0.33)]
    alternatives = [(estimate.Levers(3, False, 1), [row(1, 3453), row(4, 1500, 0.065, 0.58)]),
                    (estimate.Levers(1, False, 4), [row(1, 3453), row(4, 1353, 0.161, 0.64)])]
    text = estimate.recommend(rows, estimate.DEFAULT_LEVERS, C7I, alternatives)
    assert text.startswith("4 nodes finish 1.3x sooner for 3.1x the cost of 1: more nodes do not pay: the all-reduce "
                           "on 4 nodes (161 ms at 10 Gbit/s, one flow) takes longer than a step's compute (101 ms); "
                           "try --flows 3 (4 nodes finish 2.1x sooner for 1.9x the cost of 1), "
                           "or --accumulate 4 (4 nodes finish 2.3x sooner for 1.8x the cost of 1; it changes the "
                           "recipe: a global batch of 512 (4 nodes x 32 rows x 4 micro-batches) and lr scaled 4x to "
                           "8e-05). Assumed:"), text


def test_recommendation_blames_the_setup_when_training_scales_but_the_job_is_short():
    rows = [row(1, 35), row(4, 35 / 4 / 0.94, efficiency=0.94)]
    text = estimate.recommend(rows, estimate.DEFAULT_LEVERS, C7I, [(estimate.Levers(3, True, 1), rows)])
    assert text.startswith("4 nodes finish 1.1x sooner for 3.7x the cost of 1: more nodes do not pay: the setup "
                           "(5 min, billed on every node) outweighs the training it saves. Assumed:"), text


def test_recommendation_names_the_most_nodes_that_pay_when_the_fastest_does_not():
    rows = [row(1, 3600), row(4, 3600 / 4 / 0.95, efficiency=0.95), row(16, 3600 / 16 / 0.5, efficiency=0.5)]
    text = estimate.recommend(rows, estimate.DEFAULT_LEVERS, C7I, [])
    assert text.startswith("16 nodes finish 5.2x sooner for 3.1x the cost of 1; 4 nodes finish 3.1x sooner for "
                           "1.3x the cost, the most that pays (at most 1.5x the cost). Assumed:"), text


def test_recommendation_when_one_node_is_fastest_and_cheapest():
    rows = [row(1, 3600), row(2, 3700, 0.2, 0.49)]
    text = estimate.recommend(rows, estimate.DEFAULT_LEVERS, C7I, [])
    assert text.startswith("1 node finishes soonest and costs least: more nodes do not pay: the all-reduce on 2 "
                           "nodes (200 ms at 10 Gbit/s, one flow) takes longer than a step's compute (101 ms). "
                           "Assumed:"), text


def test_recommendation_never_changes_the_recipe_silently():
    rows = [row(1, 3600), row(4, 3600 / 4 / 0.9, efficiency=0.9)]
    text = estimate.recommend(rows, estimate.Levers(1, False, 2), C7I, [])
    assert text.endswith("one all-reduce per 2 micro-batches; it changes the recipe: a global batch of 256 (4 nodes "
                         "x 32 rows x 2 micro-batches) and lr scaled 2x to 4e-05."), text
    text = estimate.recommend(rows, estimate.Levers(3, False, 1, estimate.POWERSGD_RANK), C7I, [])
    assert text.endswith("PowerSGD's rank-4 factors (an approximate average) all-reduced after backward, no "
                         "accumulation; it changes the numerics: each step applies an approximate average."), text


def plan_json(*flags: str, bench: Path | None = None) -> dict:
    proc = ftc("plan", "--task", "qqp", "--nodes", "1,2,4", "--instance-type", "c7i.16xlarge", "--json",
               *(["--bench", str(bench)] if bench else []), *flags)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # nothing else on stdout


def test_plan_json_prints_the_rows_and_the_recommendation_only(ftc_home):
    plan = plan_json()
    assert [r["nodes"] for r in plan["rows"]] == [1, 2, 4]
    assert all(set(r) == {"instance_type", "nodes", "levers", "samples_per_s", "efficiency", "allreduce_ms",
                          "training_s", "wall_s", "cost_usd"} for r in plan["rows"])
    assert {r["instance_type"] for r in plan["rows"]} == {"c7i.16xlarge"}
    assert plan["rows"][2]["levers"]["ena_express"] is True and plan["rows"][2]["levers"]["flows"] == 1
    assert plan["rows"][0]["levers"]["compile"] is True  # QQP's 3 epochs: thousands of steps, as --compile auto
    assert plan["recommendation"].startswith(f"4 nodes finish {plan['rows'][0]['wall_s'] / plan['rows'][2]['wall_s']:.1f}x")


def test_plan_models_the_levers_it_is_given(ftc_home):
    default, plain = plan_json(), plan_json("--ena-express", "0")
    one_flow = plan_json("--ena-express", "0", "--flows", "1")
    assert one_flow["rows"][2]["allreduce_ms"] > plain["rows"][2]["allreduce_ms"]  # one flow's 10 Gbit/s, not 25
    assert plain["rows"][2]["levers"]["flows"] == 3 and plain["rows"][2]["allreduce_ms"] == default["rows"][2]["allreduce_ms"]
    after, core = plan_json("--allreduce", "after-backward"), plan_json("--allreduce", "comm-core")
    # by default each node count gets the faster exchange, as the controller chooses a job's
    assert [r["wall_s"] for r in default["rows"]] == [min(a["wall_s"], c["wall_s"]) for a, c in zip(after["rows"], core["rows"])]
    assert core["rows"][2]["levers"]["comm_core"] and core["rows"][0]["samples_per_s"] == after["rows"][0]["samples_per_s"]
    accumulated = plan_json("--accumulate", "4")
    assert accumulated["rows"][2]["efficiency"] > default["rows"][2]["efficiency"]
    assert "a global batch of 512" in accumulated["recommendation"] and "lr scaled 4x" in accumulated["recommendation"]
    bigger = plan_json("--batch-size", "128")
    assert bigger["rows"][2]["efficiency"] > default["rows"][2]["efficiency"]  # 4x the compute per all-reduce
    assert "128 rows per node per micro-batch" in bigger["recommendation"]
    compressed = plan_json("--grad-compress", "powersgd")
    assert compressed["rows"][2]["allreduce_ms"] < default["rows"][2]["allreduce_ms"] / 4  # factors, not the gradient
    assert compressed["rows"][2]["efficiency"] > default["rows"][2]["efficiency"]
    assert "approximate average" in compressed["recommendation"]
    assert "--grad-compress powersgd" in default["recommendation"]  # offered where more nodes do not pay
    fp32 = plan_json("--grad-compress", "none")
    assert fp32["rows"][2]["allreduce_ms"] > 1.9 * default["rows"][2]["allreduce_ms"]  # twice the bytes, c7i trains bf16
    assert plan_json("--grad-compress", "bf16") == plan_json("--grad-compress", "auto") == default


def test_plan_uses_the_instance_class_rate_not_the_bench_host_s(ftc_home, tmp_path):
    path = small_bench(tmp_path)
    proc = ftc("plan", "--task", "qqp", "--nodes", "1", "--instance-type", "c6i.16xlarge", "--bench", str(path))
    assert proc.returncode == 0, proc.stderr
    # Ice Lake has no native bf16: 32 cores x 30/4 samples/s x 20/25 (AVX-512 fp32 against bf16, per core)
    text = proc.stdout.replace("\n", " ")
    assert "per-node rate 192.0 samples/s (AVX-512 fp32 on Ice Lake" in text, text


@pytest.mark.parametrize("flag, value, named", [
    ("--flows", "0", "--flows='0' is out of range; allowed: 1..64"),
    ("--batch-size", "x", "--batch-size='x' is not a whole number; allowed: 1..4096"),
    ("--accumulate", "0", "--accumulate='0' is out of range; allowed: 1..1024"),
    ("--allreduce", "during", "--allreduce='during' is not known; allowed: auto, after-backward, overlap, comm-core"),
    ("--grad-compress", "zip", "--grad-compress='zip' is not known; allowed: auto, none, bf16, powersgd"),
])
def test_plan_refuses_a_bad_lever_in_one_line(ftc_home, flag, value, named):
    proc = ftc("plan", flag, value)
    assert proc.returncode == 2 and proc.stdout == ""
    assert named in one_error(proc)


def test_auto_sends_bf16_only_where_training_is_bf16_and_a_peer_receives_it():
    assert wire_compress("auto", True, 2) == "bf16"
    assert wire_compress("auto", True, 1) == wire_compress("auto", False, 4) == "none"
    assert [wire_compress(asked, False, 4) for asked in ("none", "bf16", "powersgd")] == ["none", "bf16", "powersgd"]
    assert plan.wire_bf16("auto", "bf16") and plan.wire_bf16("bf16", "fp32")
    assert not plan.wire_bf16("auto", "fp32") and not plan.wire_bf16("powersgd", "bf16")


def offer(name: str, rate: float, gbps: float, usd: float, express: bool = True) -> estimate.Offer:
    return estimate.Offer(name, rate, 32, gbps, usd, express)


SEARCH_JOB = estimate.Job(train_samples=360_000, epochs=3, batch_per_node=32, grad_bytes=134e6, exposure=1.2,
                          wait_share=0.07, setup_s=120.0, compiled=estimate.Compile(1.6, 170.0))


def test_the_search_weighs_every_type_node_count_and_lever_and_the_pick_meets_what_was_asked():
    offers = [offer("slow.net", 316.0, 25.0, 2.9), offer("fast.net", 316.0, 100.0, 4.4),
              offer("old.net", 250.0, 25.0, 2.7, False)]
    rows = estimate.search(offers, [1, 2, 4, 8], SEARCH_JOB, flow_gbps=10.0, express_flow_gbps=25.0)
    # ENA Express x communication core x compile where the type has ENA Express, else 4 choices: 8 + 8 + 4 per count
    # above one node; a lone node exchanges nothing, so only ENA Express x compile tell its rows apart
    assert len(rows) == 3 * (8 + 8 + 4) + (4 + 4 + 2)
    assert not any(r.levers.comm_core for r in rows if r.nodes == 1)
    assert not any(r.levers.express for r in rows if r.instance_type == "old.net")
    assert all(r.levers.flows == 4 for r in rows if r.instance_type == "fast.net" and r.levers.express)
    by_wall = [r.wall_s for r in rows]
    assert by_wall == sorted(by_wall)
    deadline = estimate.pick(rows, 40 * 60, None)
    assert deadline.meets and deadline.row.wall_s <= 40 * 60
    assert deadline.row.usd == min(r.usd for r in rows if r.wall_s <= 40 * 60)  # the cheapest in time
    assert deadline.why.startswith(f"Pick {deadline.row.nodes} x {deadline.row.instance_type} (")
    budget = estimate.pick(rows, None, 5.0)
    assert budget.meets and budget.row.wall_s == min(r.wall_s for r in rows if r.usd <= 5.0)  # the fastest in budget
    both = estimate.pick(rows, 60, 0.5)  # a minute and fifty cents: nothing meets both
    assert not both.meets and both.why.startswith("Nothing planned meets the 1m00s deadline and $0.5; nearest: ")


def test_a_pick_without_a_deadline_or_budget_is_the_fastest_that_pays():
    rows = estimate.search([offer("a.net", 316.0, 100.0, 4.4)], [1, 2, 4, 8], SEARCH_JOB, flow_gbps=10.0,
                           express_flow_gbps=25.0)
    cheapest = min(rows, key=lambda r: r.usd)
    chosen = estimate.pick(rows, None, None)
    assert chosen.row.usd <= estimate.PAYS_COST_RATIO * cheapest.usd
    assert chosen.row.wall_s == min(r.wall_s for r in rows if r.usd <= estimate.PAYS_COST_RATIO * cheapest.usd)


def test_plan_with_a_deadline_picks_from_the_catalog_and_says_its_sources(ftc_home):
    proc = ftc("plan", "--task", "qqp", "--deadline", "20m", "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    keys = {"instance_type", "nodes", "levers", "training_s", "wall_s", "cost_usd", "efficiency"}
    assert all(keys <= set(r) for r in plan["rows"]) and len({r["instance_type"] for r in plan["rows"]}) == 15
    assert {"flows", "ena_express", "comm_core", "compile"} <= set(plan["rows"][0]["levers"])
    assert all(r["instance_type"].endswith(".16xlarge") for r in plan["rows"])
    assert plan["pick"]["instance_type"] in plan["recommendation"] and plan["pick"]["meets"] in (True, False)
    assert "snapshot bundled with ftc" in plan["catalog"] and "extrapolation" in plan["rates"]
    meeting = [r for r in plan["rows"] if r["wall_s"] <= 1200]
    if plan["pick"]["meets"]:
        assert plan["pick"]["cost_usd"] == min(r["cost_usd"] for r in meeting)


@pytest.mark.parametrize("flags, named", [
    (["--deadline", "soon"], "--deadline='soon' is not a deadline; allowed: 1m to 168h, as 20m, 1h30m, 90s or minutes (20)"),
    (["--deadline", "1h61m"], "--deadline='1h61m' is not a deadline"),
    (["--deadline", "20s"], "--deadline='20s' is not a deadline"),
    (["--budget", "-4"], "--budget='-4'"),
    (["--deadline", "20m", "--samples-per-s", "300"], "--samples-per-s is one instance type's rate"),
    (["--instance-type", "c7i.16xlarge", "--ena-express", "maybe"], "--ena-express='maybe'"),
    (["--deadline", "20m", "--allreduce", "comm-core", "--grad-compress", "powersgd"],
     "--grad-compress=powersgd runs after backward, but --allreduce is comm-core"),
    (["--nodes", "1,2,4", "--instance-type", "c7i.16xlarge", "--allreduce", "comm-core", "--grad-compress", "powersgd"],
     "--grad-compress=powersgd runs after backward, but --allreduce is comm-core"),
], ids=["words", "minutes past the hour", "under a minute", "negative budget", "one type's rate in a search",
        "not a switch", "powersgd overlapped in a search", "powersgd overlapped on one type"])
def test_plan_refuses_a_bad_deadline_or_budget_in_one_line(ftc_home, flags, named):
    proc = ftc("plan", "--task", "qqp", *flags)
    assert proc.returncode == 2 and one_error(proc).startswith(f"error: {named}"), proc.stderr


@pytest.mark.parametrize("flags, says", [
    (["--deadline", "1m"], "Nothing planned meets the 1m00s deadline; nearest: "),
    (["--budget", "0.01"], "Nothing planned meets $0.01; nearest: "),
    (["--deadline", "1m", "--budget", "0.01"], "Nothing planned meets the 1m00s deadline and $0.01; nearest: "),
], ids=["a deadline alone", "a budget alone", "both"])
def test_a_plan_nothing_meets_names_the_nearest_and_by_how_much(ftc_home, flags, says):
    proc = ftc("plan", "--task", "qqp", *flags, "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["pick"]["meets"] is False and plan["recommendation"].startswith(says)
    assert " over the " in plan["recommendation"]


def test_a_search_keeps_the_levers_it_is_given_and_plans_each_type_with_its_own_gradient(ftc_home):
    def pick(*flags: str) -> dict:
        proc = ftc("plan", "--task", "qqp", "--deadline", "20m", "--json", *flags)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)
    plain, core, named = pick("--ena-express", "0"), pick("--allreduce", "after-backward"), pick(
        "--instance-type", "c7i.16xlarge", "--nodes", "1,2,4")
    assert not any(r["levers"]["ena_express"] for r in plain["rows"]) and not plain["pick"]["levers"]["ena_express"]
    assert not any(r["levers"]["comm_core"] for r in core["rows"])
    assert {r["instance_type"] for r in named["rows"]} == {"c7i.16xlarge"} and named["pick"]["meets"] is False
    # Ice Lake trains in fp32, so its nodes send twice the bytes of a bf16 type on the same network
    rows = {(r["instance_type"], r["nodes"], r["levers"]["comm_core"], r["levers"]["compile"]): r
            for r in plain["rows"] if not r["levers"]["ena_express"]}
    fp32, bf16 = (rows[(kind, 4, False, False)]["allreduce_ms"] for kind in ("c6in.16xlarge", "c8in.16xlarge"))
    assert fp32 > 1.9 * bf16


def test_the_controllers_exchange_is_the_one_the_plan_finds_faster(ftc_home):
    from runner.plan import exchange_for
    proc = ftc("plan", "--task", "qqp", "--deadline", "20m", "--nodes", "2,4,8", "--json")
    rows = json.loads(proc.stdout)["rows"]
    for kind in ("c6in.16xlarge", "c7i.16xlarge", "c8i.16xlarge", "c8in.16xlarge"):
        for nodes in (2, 4, 8):
            both = {r["levers"]["comm_core"]: r["wall_s"] for r in rows if (r["instance_type"], r["nodes"]) == (kind, nodes)
                    and r["levers"]["ena_express"] and r["levers"]["compile"]}
            faster = "comm-core" if both[True] < both[False] else "after-backward"
            assert exchange_for("aws", kind, nodes, express=True, steps=10_000) == faster, (kind, nodes, both)


def test_up_with_auto_refuses_a_cluster_that_meets_neither_deadline_nor_budget_before_anything_is_made(ftc_home):
    proc = ftc("up", "--provider", "aws", "--instance-type", "auto", "--nodes", "auto", "--task", "qqp", "--deadline",
               "1m", "--yes", "1", "--ssh-cidr", "203.0.113.7/32")
    assert proc.returncode == 2 and one_error(proc).startswith(
        "error: --instance-type/--nodes=auto: Nothing planned meets the 1m00s deadline; nearest: "), proc.stderr
    assert not (ftc_home / "clusters").exists() or not any((ftc_home / "clusters").iterdir())
    bad = ftc("up", "--provider", "local", "--nodes", "auto", "--task", "qqp")
    assert bad.returncode == 2 and "picks from a cloud's catalog" in one_error(bad)


def test_a_node_of_one_core_has_no_core_to_keep_for_communication():
    one_core = estimate.Offer("tiny.one", 20.0, 1, 1.0, 0.25, False)
    job = estimate.Job(1000, 1, 32, 1e6, 1.0, 0.0, 0.0, estimate.NO_COMPILE)
    rows = estimate.search([one_core], [1, 2], job)
    assert rows and not any(r.levers.comm_core for r in rows)
    assert all(r.samples_per_s > 0 for r in estimate.plan([2], 1000, 1, 20.0, 32, 1e6, 1.0, 1.0, 0.0, 0.25, 0.0,
                                                           estimate.with_comm_core(estimate.DEFAULT_LEVERS), cores=1))
