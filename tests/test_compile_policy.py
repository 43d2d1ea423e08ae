"""The compile policy's pure decisions, without a node: whether a rank compiles, what makes kept kernels
valid, which shipped cache a job takes (and the one line for one it cannot), and the length buckets."""

import json
import math
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch
from helpers import on_two_gloo_ranks

from runner.node.compile_policy import (
    BUCKET_STEP,
    COMPILED_FILE,
    RATE_MIN_STEPS,
    WARM_COMPILE_SHARE,
    WHOLE_MODEL,
    agreed_probe_steps,
    architecture,
    bucket_width,
    bucket_widths,
    compile_choice,
    compile_key,
    compile_min_steps,
    compile_seconds,
    compiled_before,
    compiled_here,
    eager_probe_steps,
    kernel_cache,
    key_difference,
    key_digest,
    measured_figures,
    measured_where,
    pick_shipped,
    remember_compile,
    repeated_blocks,
    shapes_of,
    shipped_entries,
    unpack_shipped,
)
from runner.node.compiling import aside_inputs, runs_aside
from runner.node.inductor_files import (
    HEADERS_DIR,
    ISA_CHECKS_FILE,
    WHOLE_MARK,
    check_isa_without_importing_torch,
    headers_archives,
    headers_marked_whole,
    headers_not_whole,
    headers_readied,
    headers_taken,
    isa_checks_kept_in,
)
from runner.node.protocol import kernels_words
from runner.node.recipes import COMPILE_ASIDE_MIN_STEPS, COMPILE_MIN_STEPS, COMPILE_MIN_THREADS, unmeasured_compile
from runner.node.stepstats import PHASES, StepStats

CONFIG = {"model_type": "distilbert", "dim": 768, "n_layers": 6, "id2label": {"0": "a", "1": "b"},
          "_name_or_path": "/here/distilbert", "transformers_version": "5.0"}


# ---- whether a rank compiles ------------------------------------------------------------------------

def test_compile_choice_auto_compiles_from_the_step_count_that_pays_back():
    assert compile_choice("auto", COMPILE_MIN_STEPS, 16) == (
        True, f"on (planned {COMPILE_MIN_STEPS} steps >= {COMPILE_MIN_STEPS} with a cold kernel cache: "
              "the compile pays back)")
    assert compile_choice("auto", COMPILE_MIN_STEPS - 1, 16) == (
        False, f"off (planned {COMPILE_MIN_STEPS - 1} steps < {COMPILE_MIN_STEPS} with a cold kernel cache: "
               "the compile would not pay back)")


def test_compile_choice_auto_leaves_ranks_of_few_threads_eager_unless_measured():
    assert compile_choice("auto", 9 * COMPILE_MIN_STEPS, COMPILE_MIN_THREADS - 1) == (
        False, f"off (a rank of {COMPILE_MIN_THREADS - 1} threads: compiled steps ran no faster than eager below "
               f"{COMPILE_MIN_THREADS} threads a rank)")
    assert compile_choice("auto", 9 * COMPILE_MIN_STEPS, 1, "warm")[1].startswith("off (a rank of 1 thread: ")
    assert compile_choice("auto", COMPILE_MIN_STEPS, COMPILE_MIN_THREADS)[0]
    assert compile_choice("on", 5, 1)[0]
    # what the node measured at that launch decides, whatever the threads
    one_thread = "16 ranks on 1 node(s), gradient bf16"
    noted = {"cold_s": 90.0, "rates": {one_thread: {"eager_tokens_per_s": 500.0, "compiled_tokens_per_s": 900.0}}}
    assert compile_choice("auto", 4000, 1, "cold", measured_figures(noted, "cold", one_thread, 1e6))[0]
    assert unmeasured_compile(COMPILE_MIN_STEPS, COMPILE_MIN_THREADS)[0]
    assert not unmeasured_compile(COMPILE_MIN_STEPS, COMPILE_MIN_THREADS - 1)[0]
    assert not unmeasured_compile(COMPILE_MIN_STEPS - 1, 64)[0]


def test_compile_choice_auto_counts_a_warm_kernel_cache_as_cheap():
    warm_min = compile_min_steps("warm")
    assert warm_min == math.ceil(COMPILE_MIN_STEPS * WARM_COMPILE_SHARE) < COMPILE_MIN_STEPS
    assert compile_choice("auto", warm_min, 16, "warm")[0]
    assert not compile_choice("auto", warm_min - 1, 16, "warm")[0]
    assert not compile_choice("auto", warm_min, 16, "cold")[0]


def test_compile_choice_auto_compiles_a_cold_cache_from_fewer_steps_where_the_compile_runs_beside_the_training():
    assert compile_min_steps("cold", aside=True) == COMPILE_ASIDE_MIN_STEPS < compile_min_steps("warm")
    assert compile_choice("auto", COMPILE_ASIDE_MIN_STEPS, 16, "cold", aside=True) == (
        True, f"on (planned {COMPILE_ASIDE_MIN_STEPS} steps >= {COMPILE_ASIDE_MIN_STEPS} with a cold kernel cache, "
              "compiled beside the training: the compile pays back)")
    assert not compile_choice("auto", COMPILE_ASIDE_MIN_STEPS - 1, 16, "cold", aside=True)[0]
    assert not compile_choice("auto", COMPILE_ASIDE_MIN_STEPS, 16, "cold")[0]  # in the rank's own process


def test_compile_choice_auto_compiles_where_this_nodes_measured_saving_exceeds_its_measured_cost():
    two = "2 ranks on 2 node(s), gradient bf16"
    noted = {"cold_s": 170.0, "warm_s": 50.0,
             "rates": {two: {"eager_tokens_per_s": 4000.0, "compiled_tokens_per_s": 6400.0},
                       "1 ranks on 1 node(s), gradient bf16": {"eager_tokens_per_s": 9000.0}}}
    # a rank's steps save 1/4000 - 1/6400 s a token: 50 s over 533,334 tokens, 170 s over 1,813,334
    assert compile_choice("auto", 400, 16, "warm", measured_figures(noted, "warm", two, 600_000.0)) == (
        True, "on (measured on this node: a warm compile 50 s; a rank's steps 4000 real tokens/s eager, 6400 "
              "compiled: the 400 planned steps save 56 s)")
    assert not compile_choice("auto", 400, 16, "warm", measured_figures(noted, "warm", two, 500_000.0))[0]
    # planned steps alone would say on
    assert not compile_choice("auto", 3000, 16, "cold", measured_figures(noted, "cold", two, 1_800_000.0))[0]
    assert compile_choice("auto", 3000, 16, "cold", measured_figures(noted, "cold", two, 1_900_000.0))[0]
    # a figure this node has not measured, for these kernels or this layout: by planned steps
    assert measured_figures({**noted, "cold_s": None}, "cold", two, 9e9) is None
    assert measured_figures(noted, "warm", "1 ranks on 1 node(s), gradient bf16", 9e9) is None  # no compiled rate at 1 rank
    assert measured_figures(noted, "warm", "4 ranks on 2 node(s), gradient bf16", 9e9) is None
    assert compile_choice("auto", 400, 16, "cold", None) == compile_choice("auto", 400, 16, "cold")
    # kernels shipped from the cluster that compiled them cold: their warm compile is its share of the cold one
    shipped = {k: v for k, v in noted.items() if k != "warm_s"}
    from_cold = measured_figures(shipped, "warm", two, 600_000.0, "an earlier cluster")
    assert from_cold.compile_s == 170.0 * WARM_COMPILE_SHARE and from_cold.from_cold
    assert compile_choice("auto", 400, 16, "warm", from_cold)[1].startswith(
        f"off (measured on an earlier cluster: a warm compile {170.0 * WARM_COMPILE_SHARE:.0f} s, "
        f"{WARM_COMPILE_SHARE:.1%} of the cold one; ")
    assert compile_choice("auto", 400, 16, "warm", measured_figures(shipped, "warm", two, 2_000_000.0))[0]
    assert measured_figures(shipped, "cold", two, 9e9).compile_s == 170.0  # a cold compile is never estimated
    assert not compile_choice("off", 9000, 16, "warm", measured_figures(noted, "warm", two, 9e9))[0]
    # a note's figures that are not numbers (a note is a file from elsewhere) count as not measured
    for bad in ("90", None, True, [1], float("nan"), -1.0):
        assert measured_figures({**noted, "cold_s": bad, "warm_s": bad}, "warm", two, 9e9) is None
        assert measured_figures({**noted, "rates": {two: {"eager_tokens_per_s": bad, "compiled_tokens_per_s": 2.0}}},
                             "cold", two, 9e9) is None


def test_a_note_of_rates_alone_is_not_kernels_compiled_here_and_the_log_says_whose_figures_it_weighs():
    # an eager job noted its rate: the node's cache holds no kernels of its own, so shipped ones are taken
    assert not compiled_here({"rates": {"1 ranks on 1 node(s), gradient none": {"eager_tokens_per_s": 1.0}}})
    assert compiled_here({"cold_s": 9.0}) and compiled_here({"warm_s": 1.0, "rates": {}})
    assert measured_where({"cold_s": 9.0}, {}) == "this node"
    assert measured_where({}, {"cold_s": 9.0}) == "an earlier cluster"
    assert measured_where({"rates": {}}, {"cold_s": 9.0}) == "an earlier cluster and this node"


def test_compile_seconds_is_what_the_untimed_steps_took_beyond_steady_ones():
    stats = StepStats(warmup_steps=3)
    for seconds in (40.0, 5.0, 2.0, 1.0, 1.0, 1.0):
        stats.record({key: 0.0 for key in PHASES} | {"step_s": seconds}, 1, 1, 0.5)
    assert compile_seconds(stats) == 47.0 - 3 * 1.0


def test_a_compiled_jobs_first_steps_run_eager_only_where_no_note_holds_the_eager_rate():
    two = "2 ranks on 2 node(s), gradient bf16"
    probe = 3 + RATE_MIN_STEPS
    assert eager_probe_steps({}, two, 2 * probe, 3) == probe
    assert eager_probe_steps({"cold_s": 9.0, "rates": {two: {"compiled_tokens_per_s": 9.0}}}, two, 900, 3) == probe
    assert eager_probe_steps({"rates": {two: {"eager_tokens_per_s": 9.0}}}, two, 900, 3) == 0  # noted
    assert eager_probe_steps({"rates": {two: {"eager_tokens_per_s": "x"}}}, two, 900, 3) == probe  # not a figure
    assert eager_probe_steps({"rates": {"1 ranks on 1 node(s), gradient none": {"eager_tokens_per_s": 9.0}}},
                             two, 900, 3) == probe  # another layout's rate is not this one's
    assert eager_probe_steps({}, two, 2 * probe - 1, 3) == 0  # too few steps left to measure both


def _probe_agreement(rank: int, rendezvous: str, mine: list[int], out: dict) -> None:
    from types import SimpleNamespace

    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    out[rank] = agreed_probe_steps(mine[rank], 3, SimpleNamespace(world_size=2))
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("mine, agreed", [([0, 3 + RATE_MIN_STEPS], 3 + RATE_MIN_STEPS), ([0, 0], 0)],
                         ids=["one-node-lacks-the-rate", "every-node-has-it"])
def test_every_rank_probes_where_any_nodes_note_lacks_the_eager_rate(mine, agreed, tmp_path):
    assert on_two_gloo_ranks(_probe_agreement, tmp_path / "rendezvous", mine) == {0: agreed, 1: agreed}


def test_a_probed_jobs_eager_and_compiled_steps_are_measured_apart_and_both_rates_noted(tmp_path):
    from types import SimpleNamespace

    from runner.node.compile_policy import Compiled
    stats = StepStats(warmup_steps=1, eager_steps=1 + RATE_MIN_STEPS)
    assert stats.probing
    step_seconds = [9.0] + [2.0] * RATE_MIN_STEPS + [30.0] + [1.0] * RATE_MIN_STEPS  # eager, then compiled
    for seconds in step_seconds:
        stats.record({key: 0.0 for key in PHASES} | {"step_s": seconds}, 1, 100, 0.5)
    assert not stats.probing
    assert (stats.eager_seconds, stats.eager_steady_seconds, stats.eager_steady_tokens) == (
        9.0 + 2.0 * RATE_MIN_STEPS, 2.0 * RATE_MIN_STEPS, 100 * RATE_MIN_STEPS)
    assert (stats.steady_steps, stats.steady_seconds, stats.untimed_steps) == (RATE_MIN_STEPS, 1.0 * RATE_MIN_STEPS, 1)
    assert compile_seconds(stats) == 30.0 - 1.0
    layout = "1 ranks on 1 node(s), gradient none"
    compiled = Compiled("on", "cold", "", "dynamic", tmp_path, "d1", {}, layout)
    note = remember_compile(compiled, stats, SimpleNamespace(local_rank=0, world_size=1))
    assert note == {"cold_s": 29.0, "rates": {layout: {"eager_tokens_per_s": 50.0, "compiled_tokens_per_s": 100.0}}}


def test_compile_choice_on_or_off_is_obeyed_whatever_the_steps():
    assert compile_choice("on", 5, 16) == (True, "on (--compile on, planned 5 steps)")
    assert compile_choice("off", 5000, 16) == (False, "off (--compile off, planned 5000 steps)")


# ---- what makes kept kernels valid ------------------------------------------------------------------

def key(**changed) -> dict:
    settings = dict(config=CONFIG, isa=["avx512f", "amx_bf16"], threads=16, precision="bf16", shapes="buckets",
                    batch_size=32, max_length=128) | changed
    return compile_key(**settings)


def test_kernels_are_kept_for_one_architecture_cpu_thread_count_precision_and_shapes():
    # inductor writes the rank's threads into its CPU kernels (`omp parallel num_threads(N)`), so the
    # 4-thread ranks of a node that kept a 16-thread rank's kernels compile again, and count it so
    assert key_digest(key()) == key_digest(key())
    for changed in (dict(threads=4), dict(precision="fp32"), dict(isa=["avx2"]), dict(shapes="dynamic"),
                    dict(batch_size=16), dict(compiled=WHOLE_MODEL), dict(config=CONFIG | {"n_layers": 12}),
                    dict(config=CONFIG | {"id2label": {"0": "a", "1": "b", "2": "c"}})):
        assert key_digest(key(**changed)) != key_digest(key()), changed
    # kernels brought home before floats were traced as constants: their graphs miss torch's caches
    before = {field: value for field, value in key().items() if field != "floats"}
    assert key_difference(key(), before) == "floats None here 'constant'"
    # a node cache packed when one folder held every thread count's kernels: not taken, one line
    shared = {field: value for field, value in key().items() if field != "folder"}
    assert key_digest(shared) != key_digest(key())
    assert key_difference(key(), shared) == "folder None here 'per thread count'"
    # kernels of a whole model compiled, from before ftc compiled each repeated block
    whole = {field: value for field, value in key().items() if field != "compiled"}
    assert key_difference(key(), whole) == "compiled None here 'repeated blocks'"
    # a copy of the model under another name, or saved by another transformers, is the same architecture
    assert architecture(CONFIG | {"_name_or_path": "elsewhere", "transformers_version": "5.9"}) == architecture(CONFIG)


def test_what_compiles_is_each_block_of_the_outermost_list_of_one_class():
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mixed = torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.ReLU()])  # not one class
            self.heads = torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)])  # inside a block

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embeddings = torch.nn.Embedding(4, 2)
            self.encoder = torch.nn.Sequential(torch.nn.ModuleList([Block() for _ in range(3)]))
            self.head = torch.nn.ModuleList([torch.nn.Linear(2, 2)])  # one member: nothing repeats

    model = Model()
    assert repeated_blocks(model) == list(model.encoder[0])
    assert repeated_blocks(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())) == []  # compiled whole
    # a list of lists is no block: what a forward calls lies inside them
    stages = torch.nn.ModuleList([torch.nn.ModuleList([Block(), Block()]) for _ in range(2)])
    assert repeated_blocks(stages) == [*stages[0], *stages[1]]


def test_a_nodes_kernels_are_kept_apart_per_rank_thread_count(tmp_path, monkeypatch):
    # torch before 2.13 leaves the thread count out of its FX-graph cache's key: in one folder a
    # 4-thread rank would load the 16-thread kernels a rank of a whole node compiled there
    monkeypatch.setenv("FTC_NODE_DIR", str(tmp_path / "node"))
    whole_node, quarter = kernel_cache(tmp_path / "job", "stock", 16), kernel_cache(tmp_path / "job", "stock", 4)
    assert whole_node != quarter
    assert whole_node.parent == quarter.parent == tmp_path / "node" / "cache"
    assert kernel_cache(tmp_path / "other-job", "stock", 16) == whole_node  # the node's, not the job's
    monkeypatch.delenv("FTC_NODE_DIR")
    assert kernel_cache(tmp_path / "job", "stock", 16).parent == tmp_path / "job"  # a run by hand keeps its own


def ship(folder, name: str, meta, artifacts: bool = True) -> None:
    (folder / f"{name}.json").write_text(meta if isinstance(meta, str) else json.dumps(meta))
    if artifacts:
        (folder / f"{name}.tgz").write_bytes(b"a node's cache")


def test_a_shipped_cache_of_this_key_is_taken_with_its_note(tmp_path):
    ship(tmp_path, "mine", {"key": key(), "note": {"cold_s": 90.0}})
    ship(tmp_path, "other-model", {"key": key(config=CONFIG | {"n_layers": 2}, threads=4)})  # passed over silently
    assert pick_shipped(key(), shipped_entries(tmp_path)) == (tmp_path / "mine.tgz", {"cold_s": 90.0}, [])
    ship(tmp_path, "stale", {"key": key() | {"torch": "2.11.0"}})  # said, also beside the one taken
    taken, _, lines = pick_shipped(key(), shipped_entries(tmp_path))
    assert taken == tmp_path / "mine.tgz" and len(lines) == 1 and lines[0].startswith("kernels: the shipped cache stale ")
    assert shipped_entries(tmp_path / "none") == [] and shipped_entries(None) == []


def test_a_stale_foreign_or_broken_shipped_cache_is_one_line_each_and_never_taken(tmp_path):
    ship(tmp_path, "stale", {"key": key() | {"torch": "2.11.0"}})
    ship(tmp_path, "foreign", {"key": key(isa=["avx2"], threads=4)})
    ship(tmp_path, "broken", "{not json")
    ship(tmp_path, "bare", {"key": key()}, artifacts=False)
    here = key()
    assert pick_shipped(here, shipped_entries(tmp_path)) == (None, {}, [
        "kernels: the shipped cache bare lacks its artifacts; ignored, compiling without it",
        "kernels: the shipped cache broken cannot be read; ignored, compiling without it",
        "kernels: the shipped cache foreign was compiled for another setting (isa 'avx2' here 'avx512f,amx_bf16', "
        "threads 4 here 16); ignored, compiling without it",
        f"kernels: the shipped cache stale was compiled for another setting (torch '2.11.0' here {here['torch']!r}); "
        "ignored, compiling without it"])


def test_headers_are_sought_in_the_shipped_caches_of_this_torch_and_cpu_whatever_their_model(tmp_path):
    ship(tmp_path, "older", {"key": key(config=CONFIG | {"n_layers": 2})})
    ship(tmp_path, "newer", {"key": key(threads=4, precision="fp32")})
    ship(tmp_path, "other-torch", {"key": key() | {"torch": "2.11.0"}})
    ship(tmp_path, "other-cpu", {"key": key(isa=["avx2"])})
    ship(tmp_path, "before-headers", {"key": {f: v for f, v in key().items() if f != "compiled"}})  # none in it
    ship(tmp_path, "bare", {"key": key()}, artifacts=False)
    ship(tmp_path, "broken", "{not json")
    for age, name in enumerate(("newer", "older", "other-torch", "other-cpu", "before-headers")):  # seconds before now
        os.utime(tmp_path / f"{name}.tgz", (1_000_000 - age, 1_000_000 - age))
    assert headers_archives(key(), shipped_entries(tmp_path)) == [tmp_path / "newer.tgz", tmp_path / "older.tgz"]
    assert headers_archives(key(isa=["avx512f"]), shipped_entries(tmp_path)) == []


def made_cache(folder: Path, files: dict[str, str], archive: Path) -> Path:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    with tarfile.open(archive, "w:gz") as tar:
        for entry in sorted(folder.iterdir()):
            tar.add(entry, arcname=entry.name)
    return archive


def whole_header(name: str, text: str = "a precompiled header") -> dict[str, str]:
    """A header (x.h and x.h.gch) and its mark: as a job that compiled with it and ended leaves them."""
    return {f"{HEADERS_DIR}/{name}.h": "#include <x>", f"{HEADERS_DIR}/{name}.h.gch": text,
            f"{HEADERS_DIR}/{name}.h.gch{WHOLE_MARK}": json.dumps({"bytes": len(text)})}


def test_a_header_is_whole_only_where_its_mark_says_so_at_its_size():
    marks = {f"a.h.gch{WHOLE_MARK}": {"bytes": 10}, f"b.h.gch{WHOLE_MARK}": {"bytes": 99},
             f"gone.h.gch{WHOLE_MARK}": {"bytes": 5}, f"c.h.gch{WHOLE_MARK}": {}}  # c: a mark that was not JSON
    assert headers_not_whole({"a.h.gch": 10, "b.h.gch": 12, "c.h.gch": 7}, marks) == ["b.h.gch", "c.h.gch"]
    assert headers_not_whole({}, marks) == []


def test_only_the_whole_headers_of_another_keys_cache_are_unpacked_from_the_first_that_holds_them(tmp_path):
    headers = whole_header("c0ffee")
    cut_short = {f"{HEADERS_DIR}/d00d.h": "#include <x>", f"{HEADERS_DIR}/d00d.h.gch": "a prefix"}  # no mark
    with_headers = made_cache(tmp_path / "a", headers | cut_short | {f"{HEADERS_DIR}/locks/c0ffee.lock": "",
                              "fxgraph/xy/abc": "k", ISA_CHECKS_FILE: "{}"}, tmp_path / "with.tgz")
    without = made_cache(tmp_path / "b", {"fxgraph/xy/abc": "k"}, tmp_path / "without.tgz")
    only_cut_short = made_cache(tmp_path / "c", cut_short, tmp_path / "cut-short.tgz")
    broken = tmp_path / "broken.tgz"
    broken.write_bytes(b"not an archive")
    node = tmp_path / "node"
    assert headers_taken([without, only_cut_short, broken, with_headers], node) == (
        "kernels: inductor's precompiled headers taken from the shipped cache with")
    assert sorted(str(p.relative_to(node)) for p in node.rglob("*")) == [HEADERS_DIR, *sorted(headers)]  # no partial
    tried = headers_taken([without, only_cut_short, broken], tmp_path / "elsewhere")
    assert tried.startswith("kernels: no shipped cache gave inductor's precompiled headers (without: it holds none; "
                            "cut-short: it holds none known whole; broken: ReadError") and tried.endswith(
                            "); inductor builds its own")
    assert headers_taken([], node) == ""


def test_a_header_no_job_ended_with_is_removed_before_a_compile_and_a_shipped_one_taken_in_its_place(tmp_path):
    node = tmp_path / "node"
    made_cache(node, whole_header("c0ffee") | {f"{HEADERS_DIR}/d00d.h.gch": "a prefix"}, tmp_path / "unused.tgz")
    shipped = made_cache(tmp_path / "shipped", whole_header("d00d", "the whole of it"), tmp_path / "shipped.tgz")
    # kernels of its own: only the cut-short header goes, and nothing is taken
    assert headers_readied(node, False, [shipped]) == [
        "kernels: inductor's precompiled header d00d.h.gch removed: no job that compiled with it ended (a build cut "
        "short?); inductor builds it again"]
    assert sorted(p.name for p in (node / HEADERS_DIR).glob("*.gch")) == ["c0ffee.h.gch"]
    # the whole one left means no shipped ones: every header a job finds it uses
    assert headers_readied(node, True, [shipped]) == []
    # a header grown or shrunk since its mark is not the one marked; cold kernels and no header left: shipped ones
    (node / HEADERS_DIR / "c0ffee.h.gch").write_text("rebuilt, longer")
    taken = headers_readied(node, True, [shipped])[1]
    assert taken == "kernels: inductor's precompiled headers taken from the shipped cache shipped"
    assert (node / HEADERS_DIR / "d00d.h.gch").read_text() == "the whole of it"
    assert not (node / HEADERS_DIR / "c0ffee.h.gch").exists()


def test_a_job_that_ended_marks_each_header_whole_at_its_size(tmp_path):
    folder = tmp_path / HEADERS_DIR
    folder.mkdir()
    (folder / "a.h.gch").write_text("abc")
    (folder / f"a.h.gch{WHOLE_MARK}").write_text(json.dumps({"bytes": 1}))  # an older build's
    (folder / "b.h").write_text("#include <x>")
    headers_marked_whole(tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == ["a.h.gch", f"a.h.gch{WHOLE_MARK}", "b.h"]
    assert json.loads((folder / f"a.h.gch{WHOLE_MARK}").read_text()) == {"bytes": 3}
    assert headers_readied(tmp_path, True, []) == []


def test_kernels_words_say_where_warm_kernels_came_from():
    assert kernels_words("warm", "an earlier cluster") == "warm (from an earlier cluster)"
    assert kernels_words("warm", "this node") == "warm (from this node)"
    assert kernels_words("cold", "") == "cold (compiled on the cluster)"
    assert kernels_words("none", "") == "not compiled"


# ---- length buckets ------------------------------------------------------------------------------------

def test_a_batch_is_padded_to_the_smallest_bucket_that_holds_its_longest_row():
    assert [bucket_width(n, 128) for n in (1, BUCKET_STEP, BUCKET_STEP + 1, 100, 128)] == [32, 32, 64, 128, 128]
    assert bucket_width(70, 80) == 80  # the last bucket ends at --max-length
    assert bucket_widths(128) == [32, 64, 96, 128] and bucket_widths(80) == [32, 64, 80]


def test_shapes_auto_are_dynamic_and_a_speed_split_batch_keeps_dynamic_ones():
    assert shapes_of("auto", uneven_split=False) == "dynamic"
    assert shapes_of("buckets", uneven_split=False) == "buckets"
    assert shapes_of("buckets", uneven_split=True) == "dynamic"


# ---- inductor's check of a vector ISA -----------------------------------------------------------------

OLD_TORCH_ISA_CHECK = 'import torch\nfrom ctypes import cdll\ncdll.LoadLibrary("__lib_path__")\n'


def test_an_isa_check_that_imports_torch_loads_torchs_library_instead_and_a_newer_one_is_left_alone():
    class OldVecISA:  # torch before 2.13: a Python that imports torch loads the test kernel
        _avx_py_load = OLD_TORCH_ISA_CHECK

    class NewVecISA:  # torch 2.13: its own probe loads the kernel without torch
        _avx_py_load = OLD_TORCH_ISA_CHECK

        def _probe_load(self, output_path: str) -> bool:
            return True

    assert check_isa_without_importing_torch(OldVecISA)
    first, _, otherwise = OldVecISA._avx_py_load.partition("except OSError:")
    assert "libtorch_cpu.so" in first and "__lib_path__" in first and "import torch" not in first
    assert "import torch" in otherwise and "__lib_path__" in otherwise  # as torch's own check, where needed
    assert not check_isa_without_importing_torch(NewVecISA) and NewVecISA._avx_py_load == OLD_TORCH_ISA_CHECK
    assert not check_isa_without_importing_torch(OldVecISA)  # once changed, never twice


@pytest.mark.slow  # inductor compiles its test kernel with the C++ compiler
def test_the_isa_check_loads_inductors_kernel_without_torch_and_one_that_wants_more_as_torch_does(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    import torch
    from torch._inductor.codecache import write
    from torch._inductor.cpp_builder import CppBuilder, CppTorchOptions, get_cpp_compiler
    from torch._inductor.cpu_vec_isa import VecISA, _get_isa_dry_compile_fingerprint, pick_vec_isa
    isa = pick_vec_isa()
    assert isa, "this machine's inductor found no vector ISA"
    key, source = write(VecISA._avx_code, "cpp", extra=_get_isa_dry_compile_fingerprint(isa.build_arch_flags()))
    builder = CppBuilder(key, [source], CppTorchOptions(vec_isa=isa, warning_all=False), str(tmp_path / "built"))
    builder.build()

    class OldVecISA:  # torch before 2.13's check, changed as a training rank changes it
        _avx_py_load = OLD_TORCH_ISA_CHECK

    assert check_isa_without_importing_torch(OldVecISA)

    def check(kernel, then: str = "") -> int:
        """The check as inductor runs it (a new Python), then `then`: its exit code."""
        probe = OldVecISA._avx_py_load.replace("__lib_path__", str(kernel)) + then
        return subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=120, cwd=tmp_path).returncode

    # inductor's test kernel, linked as needed, loads beside torch's C++ library alone
    assert check(builder.get_target_file_path(), "import sys\nassert 'torch' not in sys.modules\n") == 0
    # one linked to every torch library named (a toolchain without --as-needed) loads as torch's own check loads it
    (tmp_path / "wants_more.cpp").write_text("extern \"C\" void ftc_kernel() {}\n")
    subprocess.run([get_cpp_compiler(), "-shared", "-fPIC", "-o", str(tmp_path / "wants_more.so"),
                    str(tmp_path / "wants_more.cpp"), f"-L{Path(torch.__file__).parent / 'lib'}", "-Wl,--no-as-needed",
                    "-ltorch_python", "-ltorch", "-ltorch_cpu", "-lc10"], check=True, timeout=300)
    assert check(tmp_path / "wants_more.so", "import sys\nassert 'torch' in sys.modules\n") == 0
    assert check(tmp_path / "no-such-kernel.so") != 0


def test_an_isa_found_good_is_answered_from_the_kernel_cache_and_one_found_bad_is_asked_again(tmp_path):
    asked = []

    class FakeVecISA:  # inductor's VecISA: check_build builds a test kernel and loads it in a new Python
        _arch_flags = "-mavx512f"

        def build_arch_flags(self) -> str:  # what the kernels are built with: the key's flags
            return self._arch_flags + " -mfma"

        def check_build(self, code: str) -> bool:
            asked.append(code)
            return code == "good"

    inductors = FakeVecISA.check_build
    assert isa_checks_kept_in(tmp_path, FakeVecISA)
    assert isa_checks_kept_in(tmp_path, FakeVecISA) and FakeVecISA.check_build.__wrapped__ is inductors  # once
    isa = FakeVecISA()
    assert (isa.check_build("good"), isa.check_build("bad")) == (True, False)
    assert (isa.check_build("good"), isa.check_build("bad")) == (True, False)
    assert asked == ["good", "bad", "bad"]
    FakeVecISA._arch_flags = "-mamx-tile"  # another ISA's flags: another check
    assert isa.check_build("good") and asked[-1] == "good"
    kept = tmp_path / ISA_CHECKS_FILE
    assert list(json.loads(kept.read_text()).values()) == [True, True]
    kept.write_text("{not json")  # unreadable: asked again, and kept again
    assert isa.check_build("good") and len(asked) == 5 and list(json.loads(kept.read_text()).values()) == [True]


def test_a_shipped_caches_isa_answers_join_the_nodes_own(tmp_path):
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    (shipped / ISA_CHECKS_FILE).write_text(json.dumps({"from-home": True}))
    archive = tmp_path / "kernels.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(shipped / ISA_CHECKS_FILE, arcname=ISA_CHECKS_FILE)
    node = tmp_path / "node"
    node.mkdir()
    (node / ISA_CHECKS_FILE).write_text(json.dumps({"here": True}))
    assert unpack_shipped(archive, node) == ""
    assert json.loads((node / ISA_CHECKS_FILE).read_text()) == {"from-home": True, "here": True}


ISA_PICK = """
import json, sys
from pathlib import Path
from torch._inductor import cpu_vec_isa
from runner.node.inductor_files import isa_checks_kept_in
asked, check_build = [], cpu_vec_isa.VecISA.check_build
cpu_vec_isa.VecISA.check_build = lambda isa, code: asked.append(str(isa)) or check_build(isa, code)
assert isa_checks_kept_in(Path(sys.argv[1]))
picked = cpu_vec_isa.pick_vec_isa()
print(json.dumps({"picked": [str(picked), picked.build_arch_flags()], "asked": asked}))
"""


@pytest.mark.slow  # inductor compiles its test kernels with the C++ compiler and loads each in a new Python
def test_a_second_process_picks_the_same_isa_without_inductors_checks(tmp_path):
    def pick() -> dict:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}
        done = subprocess.run([sys.executable, "-c", ISA_PICK, str(tmp_path)], capture_output=True, text=True,
                              env=env, cwd=Path(__file__).resolve().parent.parent, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.splitlines()[-1])
    first, second = pick(), pick()
    assert first["asked"] and first["picked"][0] not in ("", "None")
    assert second["picked"] == first["picked"] and len(second["asked"]) < len(first["asked"]), (first, second)


# ---- what a job leaves in its node's note -------------------------------------------------------------

def test_a_jobs_figures_join_the_nodes_note_whatever_the_note_held_before(tmp_path):
    from types import SimpleNamespace

    from runner.node.compile_policy import Compiled
    layout = "2 ranks on 2 node(s), gradient bf16"
    compiled = Compiled("on", "warm", "this node", "dynamic", tmp_path, "d1", {}, layout)
    stats = StepStats(warmup_steps=3)
    for seconds in [6.0, 4.0, 10.0] + [10.0 / 37] * 37:
        stats.record({key: 0.0 for key in PHASES} | {"step_s": seconds}, 2, 20_000 // 37, 0.5)
    stats.steady_tokens = 20_000
    note_file, measured = tmp_path / COMPILED_FILE, {"compiled_tokens_per_s": 1000.0}  # 20,000 tokens, 2 ranks, 10 s
    kept = {"d1": {"cold_s": 90.0, "rates": {layout: {"eager_tokens_per_s": 500.0}}}, "d2": {"cold_s": 7.0}}
    for earlier in (None, "not a note", [1], {"d1": "x"}, {"d1": {"rates": []}}, kept):
        note_file.unlink(missing_ok=True)
        if earlier is not None:
            note_file.write_text(json.dumps(earlier))
        mine = remember_compile(compiled, stats, SimpleNamespace(local_rank=0, world_size=2))
        assert compiled_before(tmp_path)["d1"] == mine, earlier
        assert mine["warm_s"] == round(compile_seconds(stats), 1) and mine["rates"][layout]["compiled_tokens_per_s"] == 1000.0
    # a note of these kernels keeps what earlier jobs measured beside this one's, and other keys' notes stay
    assert mine == {"cold_s": 90.0, "warm_s": round(compile_seconds(stats), 1),
                    "rates": {layout: {"eager_tokens_per_s": 500.0, **measured}}}
    assert compiled_before(tmp_path)["d2"] == {"cold_s": 7.0}
    assert not remember_compile(compiled, stats, SimpleNamespace(local_rank=1, world_size=2))  # a node's first rank notes


def test_a_cold_compile_runs_aside_only_on_ranks_of_enough_threads_with_blocks_in_dynamic_shapes_and_no_ddp():
    assert runs_aside(16, 8, "after-backward", "dynamic", True) and runs_aside(8, 8, "none", "dynamic", True)
    assert not runs_aside(7, 8, "none", "dynamic", True)  # the core it takes would cost the rank more
    assert not runs_aside(16, 8, "overlap", "dynamic", True) and not runs_aside(16, 8, "comm-core", "dynamic", True)
    assert not runs_aside(16, 8, "none", "buckets", True)  # its rows are not padded to buckets
    assert not runs_aside(16, 8, "none", "dynamic", False)  # a model compiled whole
    assert not runs_aside(16, 0, "none", "dynamic", True)  # 0: never (the bench's compile in the rank's process)


def test_the_compile_aside_takes_the_jobs_middling_shortest_and_longest_rows_and_the_middling_ones_unpadded():
    lengths = [3, 4, 5, 6, 7, 8, 14, 15, 16, 17, 28, 29]
    train = {"lengths": lengths, "input_ids": [[7] * n for n in lengths], "labels": [i % 2 for i in range(12)],
             "extra": {}}
    batches = aside_inputs(train, 0, False, 32)
    assert [tuple(b["input_ids"].shape) for b in batches] == [(4, 24), (4, 8), (4, 32), (4, 24)]
    assert batches[0]["attention_mask"].sum() == 14 + 15 + 16 + 17 and batches[3]["attention_mask"].all()
    assert batches[0]["labels"].dtype == torch.long and batches[0]["labels"].tolist() == [0, 1, 0, 1]
    one_row = aside_inputs(train, 0, True, 1)  # a batch of one row is a graph of its own: the job's batch
    assert {b["input_ids"].shape[0] for b in one_row} == {1} and one_row[0]["labels"].dtype == torch.float32
