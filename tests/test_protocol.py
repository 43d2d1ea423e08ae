"""What crosses ssh between a node and the controller (runner/node/protocol.py): every line a
writer makes parses back into the same record, and the lines and files of the real training
program and verification parse."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import GLUE, REPO

from runner.node import protocol as p
from runner.node.distenv import listen_port


def test_progress_line_parses_back_into_the_same_record():
    record = p.Progress(epoch=2, epochs=3, step=41, total_steps=60, loss=0.6931, samples_per_second=25.5, eta="1m02s")
    assert p.parse_progress(p.progress_line(record)) == record


def test_progress_line_of_a_diverged_loss_parses():
    found = p.parse_progress(p.progress_line(p.Progress(1, 1, 3, 9, float("nan"), 12.0, "0m05s")))
    assert found.loss != found.loss and found.step == 3  # NaN is what the line said


def test_dev_line_parses_back_including_a_metric_that_is_not_a_number():
    record = p.DevMetrics(epoch=1, metrics={"eval_accuracy": 0.6838, "eval_f1": 0.8122, "eval_pearson": None})
    assert p.dev_line(record) == "epoch 1 dev eval_accuracy 0.6838 eval_f1 0.8122 eval_pearson none"
    assert p.parse_dev(p.dev_line(record)) == record


@pytest.mark.parametrize("record", [p.CheckpointSaved(2, "/w/jobs/mrpc-1/checkpoints/last.pt"),
                                    p.CheckpointSaved(0, "/w/jobs/my job/checkpoints/last.pt", batch=5)])
def test_checkpoint_line_parses_back_as_the_follower_reads_it(record):
    from runner.report import protocol_line
    mark = p.line_mark("mrpc-1")
    as_followed = f"[1,0]<stdout>:{mark} 10:00:04 {p.checkpoint_line(record)}\r"  # Open MPI's tag, the mark, the clock
    assert p.parse_checkpoint(protocol_line(as_followed, mark).message) == record


def test_lines_of_other_kinds_are_none_of_these():
    for text in ("epoch 1/1 step 2/2 loss 0.5 1.2.3 samples/s", "epoch 1 dev eval_acc x.y", "checkpoint saved",
                 "STEP", "SKIPPED", ""):
        assert (p.parse_progress(text), p.parse_dev(text), p.parse_checkpoint(text), p.parse_bootstrap_line(text)) \
            == (None, None, None, None)


def test_mark_and_clock_are_split_off_and_a_log_ends_with_done():
    mark = p.line_mark("mrpc-1")
    assert p.split_logged(f"{mark} 23:59:58 epoch 1 dev eval_f1 0.8") == p.Logged(mark, 86398, "epoch 1 dev eval_f1 0.8")
    assert p.split_logged("23:59:58 epoch 1 dev eval_f1 0.8") is None  # no mark: not the logger's line
    assert p.split_logged("Traceback (most recent call last):") is None
    assert p.ended(f"{mark} 10:00:00 results: {{}}\n{mark} 10:00:01 {p.DONE}\n")
    assert not p.ended(f"{mark} 10:00:00 epoch 1/1 step 1/2 loss 0.5 3.0 samples/s eta 0m01s\n") and not p.ended("")
    assert not p.ended(f"{mark} 10:00:00 results: {{}}\n10:00:01 {p.DONE}\n")  # a done without the mark


def test_only_rank_0s_lines_with_the_jobs_mark_are_read_as_progress_metrics_or_a_checkpoint():
    from runner.report import progress, protocol_line
    mark = p.line_mark("custom-1")
    assert mark != p.line_mark("custom-2") and p.LOGGED.match(f"{mark} 10:00:00 x")
    forged_rate = p.progress_line(p.Progress(1, 1, 1, 1, 0.1, 999.0, "0s"))
    forged_dev = p.dev_line(p.DevMetrics(1, {"eval_accuracy": 0.9999}))
    saved = p.checkpoint_line(p.CheckpointSaved(1, "/w/jobs/custom-1/checkpoints/last.pt"))
    output = "\n".join([
        f"[0] {mark} 10:00:00 {p.progress_line(p.Progress(1, 1, 1, 2, 0.7, 20.0, '0m01s'))}",
        f"[0] 10:00:01 {forged_rate}",  # the format without the mark: what a print or an appended line makes
        f"10:00:01 {forged_dev}",  # a traceback's line quoting a header cell: no rank prefix either
        f"[0] {p.line_mark('custom-2')} 10:00:02 {forged_rate}",  # another job's line, copied in
        f"[1] {mark} 10:00:03 {forged_rate}",  # another rank's
        f"[0] say {mark} 10:00:04 {forged_dev}",  # the mark, but not where the logger puts it
        f"[0] {mark} 10:00:05 {p.dev_line(p.DevMetrics(1, {'eval_accuracy': 0.5}))}",
    ])
    steps, dev = progress(output, mark)
    assert [s["samples_per_second"] for s in steps] == [20.0] and dev == [{"epoch": 1, "eval_accuracy": 0.5}]
    assert p.parse_checkpoint(protocol_line(f"[0] {mark} 10:00:06 {saved}", mark).message)
    assert protocol_line(f"[0] 10:00:06 {saved}", mark) is None
    assert protocol_line(f"[0] 10:00:06 say {mark} 10:00:06 {saved}", mark) is None


def test_allreduce_line_parses_back_after_mpiruns_rank_tag():
    record = p.AllreduceReport(2, [3.0, 3.0, 0.0, 3.0, 6.0], [p.RankSeen(0, "a", [0, 1], True),
                                                            p.RankSeen(1, "b", [2, 3], True)], 0.0123)
    output = f"banner\n[0] {p.allreduce_line(record)}\n[1] exiting\n"
    assert p.parse_allreduce(output) == record
    assert p.parse_allreduce("no such line\n") is None


def test_bootstrap_marker_lines_parse_back():
    assert p.parse_bootstrap_line(p.bootstrap_step_line("keys+files") + "\n") == p.BootstrapMark(p.BOOTSTRAP_STEP,
                                                                                                 "keys+files")
    assert p.parse_bootstrap_line(p.BOOTSTRAP_SKIP + "\n") == p.BootstrapMark(p.BOOTSTRAP_SKIP)
    assert p.parse_bootstrap_line(p.BOOTSTRAP_FACTS) == p.BootstrapMark(p.BOOTSTRAP_FACTS)


def test_preempted_record_is_strict_json_and_parses_back():
    record = p.Preempted({"action": "terminate", "time": "2026-01-01T00:02:00Z"}, epoch=1, batch=4, step=12)
    assert p.Preempted.from_json(record.to_json()) == record
    assert json.loads(record.to_json()) == {"notice": record.notice, "epoch": 1, "batch": 4, "step": 12}


def test_results_refuse_non_finite_numbers():
    with pytest.raises(ValueError):
        p.strict_json({"final_loss": float("nan")})


REAL_RUN = "mrpc-real"  # the job id the real run's mark is made from


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> tuple[Path, str]:
    """One short real run of the training program, one process: its directory and stdout."""
    from runner.model_files import packaged_model
    out = tmp_path_factory.mktemp("run")
    proc = subprocess.run([sys.executable, "-m", "runner.node.train", "--task", "mrpc", "--model", packaged_model(),
                           "--data-dir", str(GLUE), "--output-dir", str(out), "--max-train-samples", "16",
                           "--max-eval-samples", "16", "--batch-size", "8", "--epochs", "1", "--log-every", "1"],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, p.LOG_MARK_ENV: p.line_mark(REAL_RUN)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return out, proc.stdout


@pytest.mark.slow
def test_the_training_programs_lines_parse(real_run):
    out, stdout = real_run
    logged = [p.split_logged(line) for line in stdout.splitlines()]
    assert all(x and x.mark == p.line_mark(REAL_RUN) for x in logged), stdout  # every line: the job's mark, the clock
    messages = [x.message for x in logged]
    progress = [found for m in messages if (found := p.parse_progress(m))]
    assert [(x.epoch, x.epochs, x.step, x.total_steps) for x in progress] == [(1, 1, 1, 2), (1, 1, 2, 2)]
    assert all(x.samples_per_second > 0 and x.eta for x in progress)
    (dev,) = [found for m in messages if (found := p.parse_dev(m))]
    assert dev.epoch == 1 and set(dev.metrics) == {"eval_accuracy", "eval_f1"}
    (saved,) = [found for m in messages if (found := p.parse_checkpoint(m))]
    assert saved == p.CheckpointSaved(1, str(out / p.CHECKPOINT_FILE)) and (out / p.CHECKPOINT_FILE).exists()
    assert p.ended((out / "logs" / "rank0.log").read_text())
    from runner.report import progress
    steps, dev_rows = progress(stdout, p.line_mark(REAL_RUN))  # as `ftc runs show` reads output.log
    assert len(steps) == 2 and [d["epoch"] for d in dev_rows] == [1]
    assert progress(stdout, p.line_mark("another-job")) == ([], [])


@pytest.mark.slow
def test_the_training_programs_results_file_reads_back_whole(real_run):
    out, _ = real_run
    text = (out / p.RESULTS_FILE).read_text()
    results = p.TrainResults.read(out)
    assert results.to_json() == text  # every key the file holds is a field (or a dev metric), in its order
    assert results.world_size == 1 and results.steps == 2 and set(results.metrics) == {"eval_accuracy", "eval_f1"}
    assert results.epoch_metrics[-1]["eval_f1"] == results.metrics["eval_f1"]


def test_the_verifications_line_parses(tmp_path):
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(listen_port())}
    proc = subprocess.run([sys.executable, "-m", "runner.node.allreduce_check", "--time-mb", "1"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = p.parse_allreduce(proc.stdout)
    assert (report.world_size, report.sum, [r.rank for r in report.ranks]) == (1, [1.0, 1.0, 0.0, 1.0, 2.0], [0])
    assert report.ranks[0].ok and report.allreduce_seconds > 0


@pytest.mark.slow
def test_the_results_table_shows_a_diverged_runs_null_losses_as_not_a_number(real_run):
    from dataclasses import replace

    from runner.report import results_rows
    out, _ = real_run
    diverged = replace(p.TrainResults.read(out), first_loss=None, final_loss=None)
    assert dict(results_rows(diverged))["loss"] == "n/a -> n/a"
