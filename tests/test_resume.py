"""Preemption and resume: SIGTERM, SIGKILL (also mid-save), --resume-from, a new world size; and
faults: a diverged run, a damaged checkpoint, a second process, a changed config, retention.

Every interrupted run is compared with one uninterrupted run of the same config: the same loss at
every step and bit-identical final weights (one process), or the same training instances at
every step (one process resumed with two).
"""

import json
import shutil
import signal
import os
import socket
import sys
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from olmo_core.train.callbacks import Callback
from olmo_core.train.checkpoint import Checkpointer

from olmo_patches.train.batch_trace import read_batch_trace
from olmo_patches.launch.layout import load_and_resolve
from olmo_patches.report.plan import checkpoint_disk, plan
from olmo_patches.launch.run_folder import METRICS_FILE, read_metrics
from olmo_patches.train.checkpoints import load_model_state, prune_incomplete
from olmo_patches.launch.run_folder import Lock, RunFolderError
from olmo_patches.train.callbacks.nonfinite import NonFiniteError
from olmo_patches.train import train

from . import _signal_at_step
from .conftest import REPO, ranks, run, run_in_process, run_script, tiny_overrides

# end to end: runs trained, processes or ranks started (make test-fast leaves them out)
pytestmark = pytest.mark.slow

BASELINE = REPO / "configs" / "demo" / "baseline.yaml"
RUN = [
    "train.max_steps=6",
    "run.save_interval=2",
    "run.ephemeral_save_interval=null",
    "run.trace_batches=true",
]


def _spec(folder, *extra):
    return load_and_resolve(BASELINE, tiny_overrides(folder, *RUN, *extra))


def _losses(run_dir):
    return {
        step: m["train/CE loss"]
        for step, m in read_metrics(run_dir).items()
        if "train/CE loss" in m
    }


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
        import olmo_patches.train.run as training

        training.build_experiment = original
    saved = sorted(step for step, _ in Checkpointer.find_checkpoints(tmp_path))
    stopped = max(_losses(tmp_path))
    assert (
        3 <= stopped < 6 and saved[-1] == stopped
    )  # the stop step was checkpointed on the way out
    train(_spec(tmp_path))
    assert _losses(tmp_path) == _losses(straight)
    _assert_same_weights(straight / "step6", tmp_path / "step6")


def test_sigkill_mid_save_never_resumes_from_the_cut_checkpoint(tmp_path, straight):
    r = run_script(
        "tests/_signal_at_step.py", "SIGKILL", "5", str(BASELINE), *tiny_overrides(tmp_path, *RUN)
    )
    assert r.returncode == -signal.SIGKILL, r.stderr[-3000:]
    # Make step4 look cut off mid-write, as a SIGKILL during its save leaves it: the model's files
    # and the final metadata are missing; a stale temporary folder is left beside it.
    (tmp_path / "step4" / ".metadata.json").unlink(missing_ok=True)
    for f in (tmp_path / "step4" / "model_and_optim").glob("*"):
        f.unlink()
    (tmp_path / "step6-tmp" / "train").mkdir(parents=True)
    assert Checkpointer.latest_checkpoint(tmp_path).endswith("step2")
    train(_spec(tmp_path))  # prunes step4 and step6-tmp, resumes from step2, saves step4 again
    assert (
        Checkpointer.dir_is_checkpoint(tmp_path / "step4") and not (tmp_path / "step6-tmp").exists()
    )
    assert _losses(tmp_path) == _losses(straight)
    # The steps logged after step 2 before the kill were dropped at the resume and redone: one
    # record each.
    reference = _losses(straight)
    records = _all_loss_records(tmp_path)
    assert [step for step, _ in records] == [1, 2, 3, 4, 5, 6] and all(
        loss == reference[step] for step, loss in records
    )
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
    with pytest.raises(RunFolderError, match="--resume-from .*missing: no such folder"):
        train(_spec(tmp_path / "other"), resume_from=str(tmp_path / "missing"))
    assert not (tmp_path / "other").exists()  # refused before anything was written


def test_one_process_resumed_with_two_sees_the_same_instances(tmp_path, straight):
    train(_spec(tmp_path, "run.stop_at_step=3"))
    assert Checkpointer.latest_checkpoint(tmp_path).endswith("step3")
    r = ranks(2, "train.py", str(BASELINE), *tiny_overrides(tmp_path, *RUN))
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted((tmp_path / "batches").glob("rank*.jsonl")) == [
        tmp_path / "batches" / f"rank{i}.jsonl" for i in (0, 1)
    ]
    got, want = read_batch_trace(tmp_path), read_batch_trace(straight)
    assert sorted(want) == [1, 2, 3, 4, 5, 6] and len(want[1]) == 4  # 4 instances a step
    assert got == want  # same instance indices and the same tokens, step by step
    for step, loss in _losses(
        straight
    ).items():  # and the same losses, up to the all-reduce's rounding
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


# --- faults: divergence, a damaged checkpoint, a second process, a changed config -----------------


def _train_with(folder, callback, *extra, **kw):
    original = _signal_at_step.with_callback(callback)
    try:
        return train(_spec(folder, *extra), **kw)
    finally:
        import olmo_patches.train.run as training

        training.build_experiment = original


def _finite(step_dir):
    return all(bool(torch.isfinite(v).all()) for v in load_model_state(step_dir).values())


def _steps(folder):
    return sorted(step for step, _ in Checkpointer.find_checkpoints(folder))


def test_nonfinite_loss_stops_the_run_keeps_the_last_finite_checkpoint_and_resumes(
    tmp_path, straight
):
    with pytest.raises(
        NonFiniteError,
        match=rf"step 5: non-finite CE loss=nan.*last good checkpoint: {tmp_path}/step4",
    ):
        _train_with(tmp_path, _signal_at_step.SignalAtStep("NAN", 5))
    assert _steps(tmp_path) == [0, 2, 4]  # step 5 was never saved, nothing was deleted
    assert all(_finite(tmp_path / f"step{s}") for s in (0, 2, 4))
    _assert_same_weights(straight / "step4", tmp_path / "step4")
    train(_spec(tmp_path))  # the restart resumes from step 4 and finishes as the straight run
    assert _losses(tmp_path) == _losses(straight)
    _assert_same_weights(straight / "step6", tmp_path / "step6")


@dataclass
class _PoisonAfterStep(Callback):
    """Makes a weight NaN after step ``at`` and before its save (an older version then saved it)."""

    priority: ClassVar[int] = 5
    at: int = 4

    def post_train_batch(self):
        if self.step == self.at:
            with torch.no_grad():
                next(self.trainer.train_module.model.parameters()).view(-1)[0] = float("nan")


def test_a_nonfinite_checkpoint_is_never_written(tmp_path):
    with pytest.raises(
        NonFiniteError, match=rf"step 4: non-finite weights.*last good checkpoint: {tmp_path}/step2"
    ):
        _train_with(tmp_path, _PoisonAfterStep(at=4))
    assert _steps(tmp_path) == [0, 2]


def test_restart_after_an_older_version_saved_nonfinite_weights(
    tmp_path, straight, monkeypatch, caplog
):
    import olmo_patches.train.callbacks.checkpointer as resume

    with monkeypatch.context() as m:  # an older version: no check before a save, no manifest
        m.setattr(resume, "check_before_save", lambda trainer: None)
        m.setattr(resume.ManifestWriter, "start", lambda path: None)
        _train_with(tmp_path, _PoisonAfterStep(at=4), "run.stop_at_step=4")
    assert _steps(tmp_path) == [0, 2, 4] and not _finite(tmp_path / "step4")
    with caplog.at_level("WARNING"):
        train(_spec(tmp_path))
    assert any(
        "Resuming from step 2" in r.getMessage() and "non-finite" in r.getMessage()
        for r in caplog.records
    )
    assert not _finite(tmp_path / "rejected" / "step4")  # moved aside, not deleted
    assert _losses(tmp_path) == _losses(straight)
    _assert_same_weights(straight / "step6", tmp_path / "step6")


def _copy_run(straight, folder, steps):
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(straight / "config.yaml", folder / "config.yaml")
    for s in steps:
        shutil.copytree(straight / f"step{s}", folder / f"step{s}")


def test_damaged_checkpoints_fall_back_to_the_newest_good_one(tmp_path, straight, caplog):
    _copy_run(straight, tmp_path, [0, 2, 4])
    cut = sorted((tmp_path / "step4" / "model_and_optim").glob("*.distcp"))[0]
    cut.write_bytes(cut.read_bytes()[:100])  # the newest: a truncated file
    (tmp_path / "step2" / "train" / "rank0.pt").unlink()  # the one before: a deleted file
    with caplog.at_level("WARNING"):
        train(_spec(tmp_path))
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelname == "WARNING" and "Resuming" in r.getMessage()
    ]
    assert len(warnings) == 1 and warnings[0].startswith("Resuming from step 0")
    assert cut.name in warnings[0] and "step2/train/rank0.pt missing" in warnings[0], warnings[0]
    assert sorted(p.name for p in (tmp_path / "rejected").iterdir()) == [
        "step2",
        "step4",
    ]  # kept aside
    assert _losses(tmp_path) == _losses(straight)
    _assert_same_weights(straight / "step6", tmp_path / "step6")


def test_a_corrupted_checkpoint_of_the_right_size_is_rejected(tmp_path, straight, caplog):
    _copy_run(straight, tmp_path, [0, 2, 4])
    shard = max(
        (tmp_path / "step4" / "model_and_optim").glob("*.distcp"), key=lambda p: p.stat().st_size
    )
    data = bytearray(shard.read_bytes())
    data[len(data) // 3 : len(data) // 3 + 1024] = os.urandom(
        1024
    )  # random bytes inside, size kept
    shard.write_bytes(bytes(data))
    with caplog.at_level("WARNING"):
        train(_spec(tmp_path))
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelname == "WARNING" and "Resuming" in r.getMessage()
    ]
    assert (
        len(warnings) == 1
        and warnings[0].startswith("Resuming from step 2")
        and "corrupted" in warnings[0]
    ), warnings
    assert [p.name for p in (tmp_path / "rejected").iterdir()] == ["step4"]
    assert _losses(tmp_path) == {
        s: v for s, v in _losses(straight).items() if s > 2
    }  # steps 3-6 redone
    _assert_same_weights(straight / "step6", tmp_path / "step6")
    manifest = json.loads((tmp_path / "step6" / "manifest.json").read_text())["files"]
    assert all(len(e["crc32"]) == 8 for e in manifest.values()) and "train/rank0.pt" in manifest
    checked = run_in_process("verify_checkpoints.py", tmp_path)  # on demand: all good now
    assert checked.returncode == 0 and checked.stdout.splitlines() == [
        f"{tmp_path}/step{s}: ok" for s in (6, 4, 2, 0)
    ]
    checked = run_in_process("verify_checkpoints.py", tmp_path / "rejected" / "step4")
    assert (
        checked.returncode == 1
        and checked.stdout.strip().endswith("when saved)")
        and shard.name in checked.stdout
    )


def test_permanent_checkpoints_are_kept_and_ephemeral_ones_replaced(tmp_path, demo_corpus):
    spec = _spec(
        tmp_path, "train.max_steps=8", "run.ephemeral_save_interval=1", "run.ephemeral_keep=2"
    )
    train(spec)
    # permanent every 2 (OLMo-core alone would keep the last 3), ephemeral every step: the newest 2
    # kept
    assert _steps(tmp_path) == [0, 2, 4, 5, 6, 7, 8]
    # the dry run's estimate of their disk, against the bytes OLMo-core wrote
    n, estimate = checkpoint_disk(spec, plan(spec))
    written = sum(f.stat().st_size for f in tmp_path.glob("step*/**/*") if f.is_file())
    # (weights and AdamW's moments; each checkpoint also holds under 1 MiB of trainer state and
    # metadata)
    assert n == 7 and 0 <= written - estimate < n * 2**20
    manifest = json.loads((tmp_path / "step8" / "manifest.json").read_text())
    assert (
        manifest["files"]["train/rank0.pt"]["bytes"]
        == (tmp_path / "step8" / "train" / "rank0.pt").stat().st_size
    )


def test_a_second_process_on_a_folder_is_refused_and_a_stale_lock_taken_over(tmp_path, straight):
    _copy_run(straight, tmp_path, [0, 2, 4, 6])  # a finished run: a rerun loads step 6 and stops
    holder = Lock(tmp_path)
    holder.acquire()  # this (live) process holds the folder
    r = run_script("train.py", str(BASELINE), *tiny_overrides(tmp_path, *RUN), timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        f"error: {tmp_path} is in use by pid {os.getpid()} on {socket.gethostname()} since "
        f"{holder.me['since']}; "
        f"wait for it, or remove {tmp_path / '.lock'} if that process is gone"
    )
    holder.release()
    dead_pid = int(
        run([sys.executable, "-c", "import os; print(os.getpid())"]).stdout
    )  # exited by now
    (tmp_path / ".lock").write_text(
        json.dumps({"host": socket.gethostname(), "pid": dead_pid, "since": "then"})
    )
    train(_spec(tmp_path))  # the dead process's lock is taken over
    assert not (tmp_path / ".lock").exists()


def test_a_changed_config_is_refused_and_an_allowed_change_accepted(tmp_path, straight):
    _copy_run(straight, tmp_path, [0, 2, 4, 6])
    recorded = (tmp_path / "config.yaml").read_bytes()
    before = sorted(p.name for p in tmp_path.iterdir())
    r = run_script(
        "train.py",
        str(BASELINE),
        *tiny_overrides(tmp_path, *RUN, "model.d_model=64", "train.lr=1e-3"),
        timeout=120,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    line = r.stderr.strip().splitlines()[-1]
    assert (
        "(changed: model.d_model: 32 -> 64; train.lr: 0.003 -> 0.001)" in line
        and "run.name" in line
    ), line
    assert (tmp_path / "config.yaml").read_bytes() == recorded and sorted(
        p.name for p in tmp_path.iterdir()
    ) == before
    shutil.rmtree(
        tmp_path / "step6"
    )  # resume at step 4 with changes that do not change what is trained
    train(
        _spec(
            tmp_path,
            "run.log_interval=2",
            "train.micro_batch_size=1",
            "run.save_interval=3",
            "eval.max_batches=1",
        )
    )
    assert _steps(tmp_path) == [0, 2, 4, 6] and (tmp_path / "config.yaml").read_bytes() == recorded


def test_resume_from_records_a_deliberate_change(tmp_path, straight):
    _copy_run(straight, tmp_path, [0, 2, 4, 6])
    train(
        _spec(tmp_path, "train.max_steps=7", "train.lr=1e-4"), resume_from=str(tmp_path / "step6")
    )
    assert "lr: 0.0001" in (tmp_path / "config.1.yaml").read_text() and _steps(tmp_path)[-1] == 7
    train(
        _spec(tmp_path, "train.max_steps=7", "train.lr=1e-4")
    )  # reruns compare with the newest record


def test_skip_step_adamw_is_olmo_cores(tmp_path, demo_corpus):
    from olmo_core.optim import SkipStepAdamWConfig

    from olmo_patches.train import build_experiment, resolve_data

    spec = _spec(tmp_path, "train.optimizer=skip_step_adamw")
    optim = build_experiment(spec, resolve_data(spec)).train_module.optim
    assert type(optim) is SkipStepAdamWConfig and (
        optim.rolling_interval_length,
        optim.sigma_factor,
    ) == (128, 6)
