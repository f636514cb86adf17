"""Preemption and resume: SIGTERM, SIGKILL (also mid-save), --resume-from, a new world size.

Every interrupted run is compared with one uninterrupted run of the same config: the same loss at
every step and bit-identical final weights (one process), or the same training instances at
every step (one process resumed with two).
"""

import json
import shutil
import signal

import pytest
import torch
from olmo_core.train.checkpoint import Checkpointer

from olmo_patches.train.batch_trace import read_batch_trace
from olmo_patches.config import load_spec
from olmo_patches.train.metrics import METRICS_FILE, read_metrics
from olmo_patches.train.resume import load_model_state, prune_incomplete
from olmo_patches.train import train

from . import _signal_at_step
from .conftest import REPO, run_script, tiny_overrides

BASELINE = REPO / "configs" / "demo" / "baseline.yaml"
RUN = ["train.max_steps=6", "run.save_interval=2", "run.ephemeral_save_interval=null", "run.trace_batches=true"]


def _spec(folder, *extra):
    return load_spec(BASELINE, tiny_overrides(folder, *RUN, *extra))


def _losses(run_dir):
    return {step: m["train/CE loss"] for step, m in read_metrics(run_dir).items() if "train/CE loss" in m}


def _all_loss_records(run_dir):
    """Every (step, loss) line of the metrics file, duplicates included."""
    out = []
    for line in (run_dir / METRICS_FILE).read_text().splitlines():
        record = json.loads(line)
        if "train/CE loss" in record:
            out.append((record["step"], record["train/CE loss"]))
    return out


def _assert_same_weights(a_dir, b_dir):
    a, b = load_model_state(a_dir), load_model_state(b_dir)
    assert a.keys() == b.keys() and len(a) > 0
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.fixture(scope="module")
def straight(tmp_path_factory, demo_corpus):
    """The uninterrupted reference run (one process, 6 steps, checkpoints every 2)."""
    folder = tmp_path_factory.mktemp("straight")
    train(_spec(folder))
    assert sorted(_losses(folder)) == [1, 2, 3, 4, 5, 6]
    return folder


def test_sigterm_saves_a_checkpoint_and_resume_is_bit_identical(tmp_path, straight):
    original = _signal_at_step.with_signal("SIGTERM", 3)
    try:
        train(_spec(tmp_path))  # returns normally: OLMo-core's handler cancels the run
    finally:
        import olmo_patches.train.experiment as training

        training.build_experiment = original
    saved = sorted(step for step, _ in Checkpointer.find_checkpoints(tmp_path))
    stopped = max(_losses(tmp_path))
    assert 3 <= stopped < 6 and saved[-1] == stopped  # the stop step was checkpointed on the way out
    train(_spec(tmp_path))
    assert _losses(tmp_path) == _losses(straight)
    _assert_same_weights(straight / "step6", tmp_path / "step6")


def test_sigkill_mid_save_never_resumes_from_the_cut_checkpoint(tmp_path, straight):
    r = run_script("tests/_signal_at_step.py", "SIGKILL", "5", str(BASELINE), *tiny_overrides(tmp_path, *RUN))
    assert r.returncode == -signal.SIGKILL, r.stderr[-3000:]
    # Make step4 look cut off mid-write, as a SIGKILL during its save leaves it: the model's files
    # and the final metadata are missing; a stale temporary folder is left beside it.
    (tmp_path / "step4" / ".metadata.json").unlink(missing_ok=True)
    for f in (tmp_path / "step4" / "model_and_optim").glob("*"):
        f.unlink()
    (tmp_path / "step6-tmp" / "train").mkdir(parents=True)
    assert Checkpointer.latest_checkpoint(tmp_path).endswith("step2")
    train(_spec(tmp_path))  # prunes step4 and step6-tmp, resumes from step2, saves step4 again
    assert Checkpointer.dir_is_checkpoint(tmp_path / "step4") and not (tmp_path / "step6-tmp").exists()
    assert _losses(tmp_path) == _losses(straight)
    # Steps logged before the kill and again after the resume agree exactly.
    reference = _losses(straight)
    records = _all_loss_records(tmp_path)
    assert len(records) > 6 and all(loss == reference[step] for step, loss in records)
    _assert_same_weights(straight / "step6", tmp_path / "step6")


def test_resume_from_another_checkpoint_and_newer_ones_move_aside(tmp_path, straight):
    train(_spec(tmp_path), resume_from=str(straight / "step2"))  # another run's checkpoint
    assert sorted(_losses(tmp_path)) == [3, 4, 5, 6]
    _assert_same_weights(straight / "step6", tmp_path / "step6")
    # Roll back this run to its own step4: step6 moves aside (kept), steps 5-6 are retrained.
    train(_spec(tmp_path), resume_from=str(tmp_path / "step4"))
    aside = list(tmp_path.glob("superseded-*/step6"))
    assert len(aside) == 1 and Checkpointer.dir_is_checkpoint(aside[0])
    _assert_same_weights(straight / "step6", tmp_path / "step6")
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        train(_spec(tmp_path / "other"), resume_from=str(tmp_path / "missing"))


def test_one_process_resumed_with_two_sees_the_same_instances(tmp_path, straight):
    train(_spec(tmp_path, "run.stop_at_step=3"))
    assert Checkpointer.latest_checkpoint(tmp_path).endswith("step3")
    r = run_script("train.py", str(BASELINE), *tiny_overrides(tmp_path, *RUN), torchrun=2)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted((tmp_path / "batches").glob("rank*.jsonl")) == [tmp_path / "batches" / f"rank{i}.jsonl" for i in (0, 1)]
    got, want = read_batch_trace(tmp_path), read_batch_trace(straight)
    assert sorted(want) == [1, 2, 3, 4, 5, 6] and len(want[1]) == 4  # 4 instances a step
    assert got == want  # same instance indices and the same tokens, step by step
    for step, loss in _losses(straight).items():  # and the same losses, up to the all-reduce's rounding
        assert _losses(tmp_path)[step] == pytest.approx(loss, rel=1e-4), step


def test_prune_incomplete_keeps_complete_checkpoints(tmp_path, straight):
    shutil.copytree(straight / "step2", tmp_path / "step2")
    shutil.copytree(straight / "step4", tmp_path / "step4")
    (tmp_path / "step4" / ".metadata.json").unlink()
    (tmp_path / "step8-tmp").mkdir()
    (tmp_path / "notes").mkdir()
    removed = prune_incomplete(tmp_path)
    assert sorted(p.name for p in removed) == ["step4", "step8-tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "step2"]
