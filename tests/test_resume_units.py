"""Fast, in-process unit tests of train/checkpoints.py and train/callbacks/checkpointer.py, one
function at a time (the mutation-testing set of the latter: `bash tests/mutation.sh resume`). The
checkpoint layout is OLMo-core 3.0.0's, written here from its definition
(Checkpointer.dir_is_checkpoint): stepN/ with train/rank0.pt (the trainer state, holding
global_step), model_and_optim/.metadata (DCP) and .metadata.json (written last). The end-to-end
behaviour (real saves, resumes, signals) is tested in test_resume.py and test_rerun.py."""

import json
import logging
import re
import zlib
from types import SimpleNamespace

import pytest
import torch

from olmo_patches.launch.layout import load_and_resolve
from olmo_patches.train import train
from olmo_patches.train.callbacks.checkpointer import ResumeCheckpointerCallback
from olmo_patches.train.checkpoints import (
    ManifestWriter,
    checkpoints_in,
    holds_checkpoints,
    load_explicit,
    prune_incomplete,
    select_resume_checkpoint,
    write_manifest,
)

from .conftest import REPO, tiny_overrides

BASELINE = REPO / "configs" / "demo" / "baseline.yaml"


def _checkpoint(folder, step, *, complete=True):
    """A checkpoint folder as OLMo-core lays it out; without .metadata.json when not complete."""
    d = folder / f"step{step}"
    (d / "train").mkdir(parents=True)
    (d / "model_and_optim").mkdir()
    torch.save({"global_step": step}, d / "train" / "rank0.pt")
    (d / "model_and_optim" / ".metadata").write_bytes(b"")
    if complete:
        (d / ".metadata.json").write_text("{}")
    return d


# --- prune_incomplete -----------------------------------------------------------------------------


def test_prune_incomplete_removes_only_cut_off_saves(tmp_path, caplog):
    (tmp_path / "a-notes").mkdir()  # sorts first: the scan goes on past a folder it skips
    _checkpoint(tmp_path, 2)
    _checkpoint(tmp_path, 4, complete=False)
    tmp = _checkpoint(tmp_path, 6)  # a temporary folder, even with its marker, is cut off
    tmp.rename(tmp_path / "step6-tmp")
    (tmp_path / "step8").write_text("a file, not a checkpoint folder")
    (tmp_path / "step").mkdir()  # no step number
    (tmp_path / "STEP10").mkdir()  # not OLMo-core's name
    with caplog.at_level(logging.WARNING, logger="olmo_patches.train.checkpoints"):
        removed = prune_incomplete(tmp_path)
    assert removed == [tmp_path / "step4", tmp_path / "step6-tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "STEP10",
        "a-notes",
        "step",
        "step2",
        "step8",
    ]
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        f"Removing incomplete checkpoint folder '{p}' (a save was cut off)" for p in removed
    ]


def test_prune_incomplete_of_a_missing_or_clean_folder_removes_nothing(tmp_path):
    assert prune_incomplete(tmp_path / "missing") == []
    _checkpoint(tmp_path, 0)
    assert (
        prune_incomplete(str(tmp_path)) == [] and (tmp_path / "step0" / ".metadata.json").is_file()
    )


# --- the checkpoint a run resumes from ------------------------------------------------------------


def test_checkpoints_in_lists_marked_step_folders_newest_first(tmp_path):
    for step in (2, 10, 4):
        _checkpoint(tmp_path, step)
    _checkpoint(tmp_path, 6, complete=False)  # no marker: a cut-off save
    (_checkpoint(tmp_path, 8)).rename(tmp_path / "step8-tmp")  # OLMo-core's temporary name
    (tmp_path / "step12").write_text("")  # a file
    assert checkpoints_in(tmp_path) == [(s, str(tmp_path / f"step{s}")) for s in (10, 4, 2)]
    assert checkpoints_in(tmp_path / "missing") == []


def test_a_run_folder_holds_checkpoints_when_one_is_complete_or_set_aside(tmp_path):
    assert not holds_checkpoints(tmp_path / "missing") and not holds_checkpoints(tmp_path)
    _checkpoint(tmp_path, 2, complete=False)
    (tmp_path / "notes").mkdir()
    assert not holds_checkpoints(tmp_path)
    (tmp_path / "rejected" / "step4").mkdir(parents=True)  # set aside by a resume
    assert holds_checkpoints(tmp_path)
    other = tmp_path / "other"
    _checkpoint(other, 6)
    assert holds_checkpoints(other) and holds_checkpoints(other / "step6")


def _crc(data: bytes) -> str:
    return f"{zlib.crc32(data):08x}"  # zlib's CRC-32, as the manifest records it


def test_a_resume_sets_newer_bad_checkpoints_aside_and_takes_the_newest_good_one(tmp_path, caplog):
    good = _checkpoint(tmp_path, 2)
    cut, flipped = _checkpoint(tmp_path, 4), _checkpoint(tmp_path, 6)
    for d in (good, cut, flipped):
        write_manifest(d)
    state = cut / "train" / "rank0.pt"
    size = state.stat().st_size
    state.write_bytes(b"x")  # cut short after the save
    data = flipped / "train" / "rank0.pt"
    before = data.read_bytes()
    after = before[:-1] + bytes([before[-1] ^ 1])  # one bit flipped: the same size
    data.write_bytes(after)
    for name in ("step6", "step6.1"):  # set aside by earlier resumes
        (tmp_path / "rejected" / name).mkdir(parents=True)
    with caplog.at_level(logging.WARNING, logger="olmo_patches.train.checkpoints"):
        assert select_resume_checkpoint(tmp_path) == str(good)
    assert sorted(p.name for p in (tmp_path / "rejected").iterdir()) == [
        "step4",
        "step6",
        "step6.1",
        "step6.2",
    ]
    assert sorted(p.name for p in tmp_path.glob("step*")) == ["step2"]
    assert [r.getMessage() for r in caplog.records] == [
        f"Resuming from step 2 ({good}): {data} is corrupted (CRC-32 {_crc(after)}, "
        f"{_crc(before)} when saved); {state} has 1 bytes, {size} when saved (moved to "
        f"{tmp_path / 'rejected'})"
    ]


def test_a_resume_with_no_good_checkpoint_starts_from_scratch(tmp_path, caplog):
    bad, worse = _checkpoint(tmp_path, 2), _checkpoint(tmp_path, 4)
    # no manifest: OLMo-core's required files are looked for
    (bad / "model_and_optim" / ".metadata").unlink()
    (worse / "train" / "rank0.pt").unlink()
    with caplog.at_level(logging.WARNING, logger="olmo_patches.train.checkpoints"):
        assert select_resume_checkpoint(tmp_path) is None
    gone = [worse / "train" / "rank0.pt", bad / "model_and_optim" / ".metadata"]
    assert [r.getMessage() for r in caplog.records] == [
        f"No good checkpoint: {gone[0]} missing; {gone[1]} missing (moved to "
        f"{tmp_path / 'rejected'}); starting from scratch"
    ]
    assert sorted(p.name for p in (tmp_path / "rejected").iterdir()) == ["step2", "step4"]
    assert select_resume_checkpoint(tmp_path) is None and not caplog.records[1:]


# --- load_explicit --------------------------------------------------------------------------------


class _Trainer:
    """The two things load_explicit uses of OLMo-core's Trainer: its save folder and load_checkpoint
    (recorded here; the real load is exercised by test_resume.py's --resume-from tests)."""

    def __init__(self, save_folder):
        self.save_folder = str(save_folder)
        self.loaded = []

    def load_checkpoint(self, path, **kwargs):
        self.loaded.append((path, kwargs))


FULL_STATE = {"load_trainer_state": True, "load_optim_state": True}


def test_load_explicit_moves_newer_checkpoints_aside(tmp_path, caplog):
    save = tmp_path / "run"
    for step in (2, 4, 6, 8):
        _checkpoint(save, step)
    trainer = _Trainer(save)
    with caplog.at_level(logging.WARNING, logger="olmo_patches.train.checkpoints"):
        path = load_explicit(trainer, save / "step4")
    assert path == str(save / "step4") and trainer.loaded == [(str(save / "step4"), FULL_STATE)]
    (aside,) = save.glob("superseded-*")
    assert re.fullmatch(r"superseded-\d{8}-\d{6}", aside.name), aside.name
    assert sorted(p.name for p in aside.iterdir()) == ["step6", "step8"]  # kept, whole
    assert (aside / "step8" / ".metadata.json").is_file()
    assert sorted(p.name for p in save.iterdir()) == sorted([aside.name, "step2", "step4"])
    assert sorted(r.getMessage() for r in caplog.records) == [
        f"Moving '{save / f'step{s}'}' (newer than the resume point, step 4) to '{aside}'"
        for s in (6, 8)
    ]


def test_load_explicit_from_another_run_keeps_the_same_step(tmp_path):
    """Resuming from another run's step 4: the save folder's own step 4 is not newer and stays."""
    other, save = tmp_path / "other", tmp_path / "run"
    _checkpoint(other, 4)
    _checkpoint(save, 4)
    _checkpoint(save, 5)
    trainer = _Trainer(save)
    assert load_explicit(trainer, str(other / "step4")) == str(other / "step4")
    assert trainer.loaded == [(str(other / "step4"), FULL_STATE)]
    (aside,) = save.glob("superseded-*")
    assert [p.name for p in aside.iterdir()] == ["step5"]
    assert (save / "step4" / ".metadata.json").is_file()


def test_load_explicit_from_a_folder_takes_its_newest_complete_checkpoint(tmp_path):
    other = tmp_path / "other"
    _checkpoint(other, 3)
    _checkpoint(other, 7)
    _checkpoint(other, 9, complete=False)
    trainer = _Trainer(
        tmp_path / "new-run"
    )  # a save folder that does not exist yet: nothing to move
    assert load_explicit(trainer, other) == str(other / "step7")
    assert trainer.loaded == [(str(other / "step7"), FULL_STATE)]
    assert not (tmp_path / "new-run").exists()


def test_load_explicit_without_a_checkpoint_fails_and_loads_nothing(tmp_path):
    _checkpoint(tmp_path / "other", 2, complete=False)
    trainer = _Trainer(tmp_path / "run")
    for missing in (tmp_path / "other", tmp_path / "other" / "step2", tmp_path / "nowhere"):
        with pytest.raises(FileNotFoundError) as e:
            load_explicit(trainer, missing)
        assert str(e.value) == f"--resume-from {missing}: no complete checkpoint there"
    assert trainer.loaded == []


# --- ResumeCheckpointerCallback: its methods called directly --------------------------------------


def test_post_checkpoint_loaded_records_the_step_and_path():
    cb = ResumeCheckpointerCallback(save_interval=2)
    cb.trainer = SimpleNamespace(global_step=7)
    cb.post_checkpoint_loaded("/runs/a/step7")
    assert (cb._latest_checkpoint_step, cb._latest_checkpoint_path) == (7, "/runs/a/step7")


def test_post_checkpoint_saved_writes_a_manifest_for_a_local_checkpoint_only(tmp_path):
    d = _checkpoint(tmp_path, 3)
    cb = ResumeCheckpointerCallback(save_interval=2)
    cb.post_checkpoint_saved(str(d))
    # once every callback has written into the checkpoint: in a background thread
    cb._record_saved()
    ManifestWriter.wait_all()
    manifest = json.loads((d / "manifest.json").read_text())
    entry = {
        name: {
            "bytes": (d / name).stat().st_size,
            "crc32": f"{zlib.crc32((d / name).read_bytes()):08x}",
        }
        for name in (".metadata.json", "model_and_optim/.metadata", "train/rank0.pt")
    }
    assert manifest == {"files": entry, "finite": True}
    cb.post_checkpoint_saved(
        "gs://bucket/run/step3"
    )  # remote: no manifest (writing one locally would fail)
    assert cb._saved == []


@pytest.mark.parametrize("keep,removed", [(1, ["a", "b", "c"]), (2, ["a", "b"]), (3, ["a"])])
def test_ephemeral_checkpoints_are_held_back(keep, removed):
    """OLMo-core hands over an ephemeral checkpoint for removal when the next is saved; the newest
    keep - 1 of those are held back (OLMo-core's own removal list: _checkpoints_to_remove)."""
    cb = ResumeCheckpointerCallback(
        save_interval=10, ephemeral_save_interval=1, ephemeral_keep=keep
    )
    for path in ("a", "b", "c"):
        cb._schedule_for_removal(path)
    assert cb._checkpoints_to_remove == removed


# --- the callback inside one tiny in-process run --------------------------------------------------


@pytest.mark.slow
def test_checkpoints_kept_and_flagged_in_a_run(tmp_path, demo_corpus):
    """5 steps, permanent every 2, ephemeral every step, the newest 2 ephemeral ones kept: OLMo-core
    saves step 0 at the start; 1 and 3 are ephemeral, handed over for removal when 3 and 5 are
    saved."""
    train(
        load_and_resolve(
            BASELINE,
            tiny_overrides(
                tmp_path,
                "train.max_steps=5",
                "run.save_interval=2",
                "run.ephemeral_save_interval=1",
                "run.ephemeral_keep=2",
            ),
        )
    )
    steps = sorted(
        int(p.name[4:]) for p in tmp_path.glob("step*") if (p / ".metadata.json").is_file()
    )
    assert steps == [0, 2, 3, 4, 5]
    for (
        step
    ) in steps:  # OLMo-core's metadata records which saves are ephemeral; each has its manifest
        meta = json.loads((tmp_path / f"step{step}" / ".metadata.json").read_text())
        assert meta["ephemeral"] is (step in (3, 5)), (step, meta)
        files = json.loads((tmp_path / f"step{step}" / "manifest.json").read_text())["files"]
        assert (
            files["train/rank0.pt"]["bytes"]
            == (tmp_path / f"step{step}" / "train" / "rank0.pt").stat().st_size
        )


# --- NonFiniteGuardCallback: no host sync per step ------------------------------------------------

# OLMo-core 3.0.0's _fit_epoch reduces metrics (a host sync) after the first step, every
# metrics_collect_interval steps and at the end: with 5 and 12 steps, after steps 1, 5, 10 and 12.
COLLECTED = {1, 5, 10, 12}


def _guarded(tmp_path, monkeypatch, values):
    """Run the guard over 12 steps of (loss, grad norm) ``values(step)``; the steps it read the host
    on."""
    from olmo_patches.train.callbacks.nonfinite import NonFiniteGuardCallback

    loader = SimpleNamespace(total_batches=100, batches_processed=0)
    trainer = SimpleNamespace(
        _metrics={},
        global_step=0,
        metrics_collect_interval=5,
        max_steps=12,
        hard_stop=None,
        is_canceled=False,
        data_loader=loader,
        save_folder=str(tmp_path),
    )
    guard = NonFiniteGuardCallback()
    guard.trainer = trainer
    trainer.callbacks = {"nonfinite_guard": guard}
    reads = []
    for name in ("cpu", "item", "tolist", "__bool__"):  # every way a value reaches the host
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(
            torch.Tensor,
            name,
            lambda t, *a, _o=original, **k: (reads.append(trainer.global_step), _o(t, *a, **k))[1],
        )
    for step in range(1, 13):
        trainer.global_step = loader.batches_processed = step
        loss, norm = values(step)
        trainer._metrics[step] = {
            "train/CE loss": torch.tensor(loss),
            "optim/total grad norm": torch.tensor(norm),
        }
        guard.post_train_batch()
        yield step, guard, set(reads)


def test_the_guard_reads_the_host_only_where_the_trainer_collects(tmp_path, monkeypatch):
    *_, (_, _, reads) = _guarded(tmp_path, monkeypatch, lambda step: (2.0, 1.0))
    assert reads == COLLECTED


def test_the_guard_names_the_first_nonfinite_step_before_a_save_or_the_next_collection(
    tmp_path, monkeypatch
):
    from olmo_patches.train.callbacks.nonfinite import NonFiniteError, check_before_save

    def values(step):
        return (float("nan") if step == 7 else 2.0, float("inf") if step >= 8 else 1.0)

    seen = []
    with pytest.raises(
        NonFiniteError, match=r"^step 7: non-finite CE loss=nan; last good checkpoint: none"
    ):
        for step, guard, _ in _guarded(tmp_path, monkeypatch, values):
            seen.append(step)
            if step == 8:  # a save after step 8: the guard's unread steps first
                guard.trainer.train_module = SimpleNamespace(model=torch.nn.Linear(1, 1))
                check_before_save(guard.trainer)
    assert seen[-1] == 8
    steps = _guarded(tmp_path, monkeypatch, values)
    with pytest.raises(
        NonFiniteError, match=r"^step 7: non-finite CE loss=nan"
    ):  # no save: at step 10
        for step, _, _ in steps:
            assert step < 10


def test_a_run_folder_of_an_earlier_layout_is_refused_in_one_line(tmp_path):
    """A record without a key this code has (model.moe.load_balance, added with its default) or
    with one it has not (another kind's knob): the start refuses the folder, saying why, instead of
    resuming under another objective; a --resume-from start is deliberate and goes on."""
    from omegaconf import OmegaConf

    from olmo_patches.config import load_spec, spec_to_yaml
    from olmo_patches.launch.run_folder import RunFolderError, check_config

    spec = load_spec(
        REPO / "configs" / "paper2" / "3B-MoE" / "x.yaml", [f"run.save_folder={tmp_path}"]
    )
    record = OmegaConf.create(spec_to_yaml(spec))
    del record.model.moe["load_balance"]
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(record))
    with pytest.raises(RunFolderError) as e:
        check_config(spec)
    assert str(e.value) == (
        f"{tmp_path / 'config.yaml'}: recorded by an earlier layout of this project "
        "(model.moe.load_balance: not recorded), which this code does not resume (CHANGELOG.md); "
        "start a new run with another run.name or run.save_folder"
    )
    check_config(spec, deliberate=True)  # --resume-from: no refusal
    record = OmegaConf.create(spec_to_yaml(spec))
    record.model.foreign = 1
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(record))
    with pytest.raises(RunFolderError, match=r"\(model.foreign: not a key now\)"):
        check_config(spec)
    (tmp_path / "config.yaml").write_text(spec_to_yaml(spec))
    assert check_config(spec) == []  # this layout's record
