"""metrics.jsonl: one record per step. OLMo-core's Trainer calls log_metrics for a step more than
once (at a save step and the last step its own metrics again, an evaluation's after the step's): the
file merges them into that step's one record, later values winning, as a dict update does."""

import json
from types import SimpleNamespace

import pytest

from olmo_patches.launch.run_folder import METRICS_FILE, RunFolderError, read_metrics
from olmo_patches.train.callbacks.metrics_file import MetricsFileCallback

CALLS = [
    (1, {"train/CE loss": 8.0}),
    (2, {"train/CE loss": 7.5}),
    (2, {"train/CE loss": 7.5, "throughput/tps": 10.0}),
    (3, {"train/CE loss": 7.0}),
    (3, {"eval/val/CE loss": 7.2}),
    (3, {"train/CE loss": 7.0, "optim/LR": 1e-3}),
    (4, {"train/CE loss": 6.9}),
]


def test_one_record_per_step_holding_every_metric_logged_for_it(tmp_path):
    callback = MetricsFileCallback()
    callback.trainer = SimpleNamespace(save_folder=str(tmp_path))
    for step, metrics in CALLS:
        callback.log_metrics(step, metrics)
    expected: dict = {}
    for step, metrics in CALLS:
        expected.setdefault(step, {}).update(metrics)
    lines = (tmp_path / METRICS_FILE).read_text().splitlines()
    assert [int(line.split(",")[0].split(":")[1]) for line in lines] == [1, 2, 3, 4]
    assert read_metrics(tmp_path) == expected


def test_one_progress_line_per_logged_step(tmp_path):
    """The console's progress line: once for a step OLMo-core logs twice (a save step, the last
    step)."""
    import logging

    from olmo_patches.train.callbacks.console import ProgressCallback
    from tests.conftest import Records

    callback = ProgressCallback(metrics_log_interval=1)
    callback.trainer = SimpleNamespace(
        training_progress=SimpleNamespace(bps=None, total_steps=4), save_folder=str(tmp_path)
    )
    records = Records()
    logger = logging.getLogger("olmo_patches.train.callbacks.console")
    logger.addHandler(records)
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        for step, metrics in CALLS:
            callback.log_metrics(step, metrics)
    finally:
        logger.removeHandler(records)
        logger.setLevel(old)
    assert len(records.messages) == 4 and [
        m.split()[1].split("/")[0] for m in records.messages
    ] == ["1", "2", "3", "4"], records.messages


def test_a_torn_last_line_is_left_out_and_dropped_on_resume(tmp_path):
    """A run killed as it wrote its last record: read without it, and resumed from step 2 with a
    file of whole lines; a bad line before the last is one error naming the file and the line."""
    path = tmp_path / METRICS_FILE
    path.write_text('{"step": 1, "loss": 8.0}\n{"step": 2, "loss": 7.5}\n{"step": 3, "lo')
    assert read_metrics(tmp_path) == {1: {"loss": 8.0}, 2: {"loss": 7.5}}
    callback = MetricsFileCallback()
    callback.trainer = SimpleNamespace(save_folder=str(tmp_path), global_step=2)
    callback.pre_train()
    callback.log_metrics(3, {"loss": 7.0})
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]
    path.write_text('{"step": 1, "loss": 8.0}\n{"step": 2, "lo\n{"step": 3, "loss": 7.0}\n')
    with pytest.raises(RunFolderError, match=f"^{path} line 2: not JSON"):
        read_metrics(tmp_path)
