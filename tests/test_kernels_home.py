"""FTC_HOME/kernels, without a cluster: what a job's results bring home (kernels with their key and
note, or a note alone) and how a later job's note joins the one kept for the same kernels."""

import json
import os

from runner.kernels import bring_home, home_kernels, kept
from runner.node.protocol import HOME_KERNELS_DIR, merged_note

KEY = {"torch": "2.13.0+cpu", "architecture": "abc", "threads": 2}
TWO = "2 ranks on 2 node(s), gradient bf16"
ONE = "1 ranks on 1 node(s), gradient bf16"


def left_by_job(results, digest: str, note, kernels: bool, key: dict = KEY, job: str | None = None) -> None:
    """What rank 0 leaves in a job's kernels folder; `job`: the cluster and its job directory, as the node
    names it (None: as an older node program, without it)."""
    folder = results / HOME_KERNELS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    if kernels:
        (folder / f"{digest}.tgz").write_bytes(b"kernels of " + digest.encode())
    (folder / f"{digest}.json").write_text(json.dumps({"key": key, "note": note, "cluster": "c"}
                                                      | ({"job": job} if job else {})))


def kept_note(digest: str) -> dict:
    return json.loads((home_kernels() / f"{digest}.json").read_text())["note"]


def test_a_later_jobs_figures_go_over_the_kept_ones_figure_by_figure():
    kept_before = {"cold_s": 90.0, "rates": {TWO: {"compiled_tokens_per_s": 5000.0}, ONE: {"x": 1}}}
    assert merged_note(kept_before, {"warm_s": 9.0, "rates": {TWO: {"eager_tokens_per_s": 3000.0}}}) == {
        "cold_s": 90.0, "warm_s": 9.0,
        "rates": {TWO: {"compiled_tokens_per_s": 5000.0, "eager_tokens_per_s": 3000.0}, ONE: {"x": 1}}}
    assert merged_note({"cold_s": 90.0}, {"cold_s": 80.0}) == {"cold_s": 80.0}  # the newer measurement
    assert merged_note({}, {}) == {}
    # what is not a note, or not a layout's figures, counts as none
    assert merged_note("x", {"rates": {TWO: 5, ONE: {"y": 2}}}) == {"rates": {ONE: {"y": 2}}}
    assert merged_note({"cold_s": 1.0, "rates": []}, None) == {"cold_s": 1.0}


def test_notes_without_kernels_join_the_kept_kernels_note_and_are_dropped_where_none_are_kept(ftc_home, tmp_path):
    first = tmp_path / "c1" / "job1"
    left_by_job(first, "k", {"cold_s": 90.0, "rates": {TWO: {"compiled_tokens_per_s": 5000.0}}}, kernels=True)
    bring_home(first)
    assert kept(home_kernels()) == ["k"] and not (first / HOME_KERNELS_DIR).exists()  # moved, not copied

    # a later cluster's eager job and its job warm from home: notes alone, each joining the kept one
    eager, warm = tmp_path / "c2" / "job2", tmp_path / "c3" / "job3"
    left_by_job(eager, "k", {"rates": {TWO: {"eager_tokens_per_s": 3000.0}}}, kernels=False)
    left_by_job(warm, "k", {"warm_s": 9.0}, kernels=False)
    # and notes on kernels home does not keep: nothing to weigh them with
    left_by_job(warm, "gone", {"warm_s": 1.0}, kernels=False)
    (warm / HOME_KERNELS_DIR / "broken.json").write_text("{not json")
    bring_home(eager)
    bring_home(warm)
    assert kept_note("k") == {"cold_s": 90.0, "warm_s": 9.0,
                              "rates": {TWO: {"compiled_tokens_per_s": 5000.0, "eager_tokens_per_s": 3000.0}}}
    assert (home_kernels() / "k.tgz").read_bytes() == b"kernels of k"
    assert sorted(p.name for p in home_kernels().iterdir()) == ["k.json", "k.tgz"]
    assert not (warm / HOME_KERNELS_DIR).exists()

    # kernels compiled again (another cluster compiled cold): the new artifacts, the note still joined
    again = tmp_path / "c4" / "job4"
    left_by_job(again, "k", {"cold_s": 85.0}, kernels=True)
    bring_home(again)
    assert kept_note("k")["cold_s"] == 85.0 and kept_note("k")["warm_s"] == 9.0

    # the warm job fetched again (`ftc fetch`: its node still holds its kernels folder) adds nothing twice,
    # and a note whose key is not the kept kernels' never replaces theirs
    left_by_job(warm, "k", {"warm_s": 9.0, "cold_s": 1.0}, kernels=False)
    bring_home(warm)
    other = tmp_path / "c5" / "job5"
    left_by_job(other, "k", {"warm_s": 2.0}, kernels=False, key=KEY | {"torch": "0.0.1"})
    bring_home(other)
    assert kept_note("k")["cold_s"] == 85.0 and kept_note("k")["warm_s"] == 9.0
    assert json.loads((home_kernels() / "k.json").read_text())["key"] == KEY


def test_a_note_leaves_the_order_kernels_are_evicted_in_and_a_malformed_one_counts_as_none(ftc_home, tmp_path):
    for index in range(3):
        job = tmp_path / "c" / f"job{index}"
        left_by_job(job, f"k{index}", {"cold_s": 1.0}, kernels=True)
        bring_home(job)
        os.utime(home_kernels() / f"k{index}.json", (1000 + index, 1000 + index))  # k2 newest
    eager = tmp_path / "c" / "eager"
    left_by_job(eager, "k0", {"rates": {ONE: {"eager_tokens_per_s": 1.0}}}, kernels=False)
    bring_home(eager)
    assert kept(home_kernels()) == ["k2", "k1", "k0"] and "rates" in kept_note("k0")
    # figures that are not figures, at home or in a job's note: counted as none, nothing left in the results
    bad = tmp_path / "c" / "bad"
    left_by_job(bad, "k1", {"rates": {ONE: 5}}, kernels=False)
    (home_kernels() / "k2.json").write_text(json.dumps({"key": KEY, "note": {"rates": []}}))
    left_by_job(bad, "k2", {"warm_s": 3.0}, kernels=False)
    bring_home(bad)
    assert kept_note("k1") == {"cold_s": 1.0} and kept_note("k2") == {"warm_s": 3.0}
    assert not (bad / HOME_KERNELS_DIR).exists()


def test_jobs_are_told_apart_by_cluster_and_job_directory_not_by_where_their_results_landed(ftc_home, tmp_path):
    first = tmp_path / "a" / "sweep" / "1-node"
    left_by_job(first, "k", {"cold_s": 90.0}, kernels=True, job="a:/n/jobs/mrpc-1")
    bring_home(first)
    # another project's sweep: results under the same two names, another job
    again = tmp_path / "b" / "sweep" / "1-node"
    left_by_job(again, "k", {"warm_s": 9.0}, kernels=False, job="b:/n/jobs/mrpc-2")
    bring_home(again)
    assert kept_note("k") == {"cold_s": 90.0, "warm_s": 9.0}
    # the same job fetched into another folder: still once
    elsewhere = tmp_path / "c"
    left_by_job(elsewhere, "k", {"warm_s": 1.0}, kernels=False, job="b:/n/jobs/mrpc-2")
    bring_home(elsewhere)
    assert kept_note("k") == {"cold_s": 90.0, "warm_s": 9.0}
    # a key file too deep to read is a line, and the rest still comes home
    deep = tmp_path / "d"
    left_by_job(deep, "k", {"warm_s": 5.0}, kernels=False, job="d:/n/jobs/mrpc-3")
    (deep / HOME_KERNELS_DIR / "deep.json").write_text("[" * 200_000)
    bring_home(deep)
    assert kept_note("k")["warm_s"] == 5.0 and not (deep / HOME_KERNELS_DIR).exists()
