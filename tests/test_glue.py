"""GLUE reading and metrics, checked against hand-computed values and the real MRPC/QQP files."""

import pytest

from runner.node import glue


def test_accuracy_and_f1_by_hand():
    pred = [1, 0, 1, 1, 0, 1]
    gold = [1, 0, 0, 1, 1, 1]
    assert glue.accuracy(pred, gold) == pytest.approx(4 / 6)
    # tp=3, fp=1, fn=1 -> 2*3 / (6 + 1 + 1)
    assert glue.f1(pred, gold) == pytest.approx(6 / 8)


def test_majority_share_is_what_answering_the_commonest_label_scores(glue_dir):
    assert glue.majority_share([1.0, 0.0, 1.0, 1.0]) == 0.75 == glue.accuracy([1.0] * 4, [1.0, 0.0, 1.0, 1.0])
    assert glue.majority_share([2.0, 0.0, 1.0]) == pytest.approx(1 / 3)
    dev = [label for *_, label in glue.load_split("mrpc", "dev", str(glue_dir))]
    assert round(glue.majority_share(dev), 3) == 0.684  # 279 paraphrases of 408 pairs


def test_matthews_by_hand():
    pred = [1, 1, 0, 0, 1, 0, 1, 0]
    gold = [1, 0, 0, 0, 1, 1, 1, 0]
    # tp=3 tn=3 fp=1 fn=1 -> (9 - 1) / sqrt(4*4*4*4)
    assert glue.matthews(pred, gold) == pytest.approx(8 / 16)
    assert glue.matthews([1, 1], [1, 1]) == 0.0  # undefined: scored 0, as sklearn does


def test_pearson_and_spearman_with_ties_by_hand():
    x = [1.0, 2.0, 3.0, 4.0]
    y = [2.0, 4.0, 6.0, 8.5]
    assert glue.pearson(x, x) == pytest.approx(1.0)
    assert glue.pearson(x, [-v for v in x]) == pytest.approx(-1.0)
    assert glue.spearman(x, y) == pytest.approx(1.0)
    assert glue.ranks([10, 20, 20, 30]) == [1.0, 2.5, 2.5, 4.0]
    # x ranks 1,2,3,4 ; y=[1,1,2,3] ranks 1.5,1.5,3,4 -> pearson of ranks
    assert glue.spearman(x, [1, 1, 2, 3]) == pytest.approx(0.9486833, rel=1e-6)


def test_compute_metrics_names_by_task():
    assert set(glue.compute_metrics("mrpc", [1, 0], [1, 1])) == {"eval_accuracy", "eval_f1"}
    assert set(glue.compute_metrics("cola", [1, 0], [1, 0])) == {"eval_matthews_correlation"}
    assert set(glue.compute_metrics("stsb", [1.0, 2.0], [1.0, 2.5])) == {"eval_pearson", "eval_spearmanr"}
    assert set(glue.compute_metrics("mnli", [1, 0], [1, 0])) == {"eval_accuracy"}


def test_every_glue_task_is_known_and_others_are_refused():
    assert set(glue.TASKS) == {"mrpc", "qqp", "sst2", "qnli", "rte", "cola", "stsb", "mnli"}
    assert glue.task_name("SST-2") == "sst2"
    with pytest.raises(ValueError, match="allowed: mrpc"):
        glue.task_name("squad")


def test_real_mrpc_files_read_with_quoting_disabled(glue_dir):
    train, skipped = glue.read_tsv(glue.split_file(glue_dir, "mrpc", "train"), "mrpc")
    dev, _ = glue.read_tsv(glue.split_file(glue_dir, "mrpc", "dev"), "mrpc")
    assert (len(train), len(dev), skipped) == (3668, 408, 0)
    assert sum(y for _, _, y in train) == 2474 and sum(y for _, _, y in dev) == 279
    assert any('"' in a for a, _, _ in train)  # bare quotes survive


def test_real_qqp_sample(glue_dir):
    train, _ = glue.read_tsv(glue.split_file(glue_dir, "qqp", "train"), "qqp")
    assert len(train) == 19497 and sum(y for _, _, y in train) == 7254


def test_small_tasks_in_glue_layout(tmp_path):
    (tmp_path / "CoLA").mkdir()
    (tmp_path / "CoLA" / "train.tsv").write_text("gj04\t1\t\tThe sailors rode the breeze clear of the rocks.\n"
                                                 "gj04\t0\t*\tThe more we study verbs.\n")
    rows, _ = glue.read_tsv(glue.split_file(tmp_path, "cola", "train"), "cola")
    assert rows == [("The sailors rode the breeze clear of the rocks.", None, 1.0), ("The more we study verbs.", None, 0.0)]
    (tmp_path / "STS-B").mkdir()
    (tmp_path / "STS-B" / "dev.tsv").write_text(
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
        "0\tmain\tx\t2012\t1\tnone\tnone\tA man.\tA person.\t3.800\n")
    rows, _ = glue.read_tsv(glue.split_file(tmp_path, "stsb", "dev"), "stsb")
    assert rows == [("A man.", "A person.", 3.8)]


@pytest.mark.parametrize("text,problem", [
    ("", "empty"),
    ("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n", "no rows after the header"),
    ("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\tshort\n", "none of its 1 rows has the 5"),
    ("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\nyes\t1\t2\tA.\tB.\n", "line 2: label 'yes' is not one of the task's"),
])
def test_reader_refuses_a_file_with_nothing_to_train_on(tmp_path, text, problem):
    """The nodes' reader and the controller's check before launch are this one function."""
    (tmp_path / "MRPC").mkdir()
    (tmp_path / "MRPC" / "train.tsv").write_text(text)
    with pytest.raises(ValueError, match=f"train.tsv: {problem}"):
        glue.read_tsv(glue.split_file(tmp_path, "mrpc", "train"), "mrpc")


def test_reader_counts_rows_of_the_wrong_width(tmp_path):
    (tmp_path / "MRPC").mkdir()
    (tmp_path / "MRPC" / "train.tsv").write_text("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
                                                 "1\t1\t2\tA.\tB.\n\n0\tshort\n")
    rows, skipped = glue.read_tsv(glue.split_file(tmp_path, "mrpc", "train"), "mrpc")
    assert rows == [("A.", "B.", 1.0)] and skipped == 2


@pytest.mark.parametrize("score", ["inf", "-inf", "1e309", "nan"])
def test_a_regression_label_that_is_not_finite_is_refused_naming_the_line(tmp_path, score):
    (tmp_path / "STS-B").mkdir()
    (tmp_path / "STS-B" / "train.tsv").write_text(
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
        "0\tg\tf\t2012\t1\ts\ts\tA.\tB.\t3.2\n"
        f"1\tg\tf\t2012\t2\ts\ts\tC.\tD.\t{score}\n")
    with pytest.raises(ValueError, match=f"train.tsv: line 3: label '{score}' is not a finite number"):
        glue.read_tsv(glue.split_file(tmp_path, "stsb", "train"), "stsb")
