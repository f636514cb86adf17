"""A run folder's record (config.yaml) binds the folder only once a checkpoint stands beside it: a
start that fails while building writes none, a record left without a checkpoint is replaced by the
next start without argument, and a checkpointed run of another config is still refused."""

import logging

import pytest

from olmo_patches.config import spec_to_yaml
from olmo_patches.launch.layout import load_and_resolve
from olmo_patches.launch.run_folder import RunFolderError
from olmo_patches.train import run as run_module
from olmo_patches.train import train

from .conftest import REPO, Records, tiny_overrides

BASELINE = REPO / "configs" / "demo" / "baseline.yaml"
RUN = ["train.max_steps=2", "run.save_interval=2", "run.ephemeral_save_interval=null"]


def _files(folder):
    return {
        str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()
    }


@pytest.mark.slow
def test_a_failed_start_leaves_no_record_and_the_rerun_takes_the_folder(
    tmp_path, demo_corpus, monkeypatch
):
    spec = load_and_resolve(BASELINE, tiny_overrides(tmp_path, *RUN))

    def unreachable(
        *args, **kwargs
    ):  # as OLMo-core's OLMoNetworkError from a data URL nothing listens on
        raise ConnectionError("data URL unreachable")

    with monkeypatch.context() as m:
        m.setattr(run_module, "build_experiment", unreachable)
        with pytest.raises(ConnectionError):
            train(spec)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert "config.yaml" not in left and not any(n.startswith("step") for n in left), left

    # A record without a checkpoint (left by an earlier version's failed start, or a run that ended
    # before its first save), of another config: the corrected start replaces it, with one line.
    other = load_and_resolve(BASELINE, tiny_overrides(tmp_path, *RUN, "train.lr=0.001"))
    (tmp_path / "config.yaml").write_text(spec_to_yaml(other))
    (tmp_path / "config.1.yaml").write_text(spec_to_yaml(other))
    records, progress = Records(), logging.getLogger("olmo_patches.train.callbacks.console")
    progress.addHandler(records)
    try:
        train(load_and_resolve(BASELINE, tiny_overrides(tmp_path, *RUN)))
    finally:
        progress.removeHandler(records)
    assert (tmp_path / "step2").is_dir()
    assert (tmp_path / "config.yaml").read_text() == spec_to_yaml(spec) and not (
        tmp_path / "config.1.yaml"
    ).exists()
    replaced = [m for m in records.messages if "holds no checkpoint" in m]
    assert len(replaced) == 1 and "train.lr" in replaced[0], records.messages

    # Checkpointed now: another config is refused as before, nothing written.
    before = {k: v for k, v in _files(tmp_path).items() if k not in ("train.log", ".lock.guard")}
    with pytest.raises(
        RunFolderError, match=r"holds a run with another config \(changed: train.lr"
    ):
        train(load_and_resolve(BASELINE, tiny_overrides(tmp_path, *RUN, "train.lr=0.001")))
    after = {k: v for k, v in _files(tmp_path).items() if k not in ("train.log", ".lock.guard")}
    assert after == before


@pytest.mark.parametrize("aside", ["rejected", "superseded-20260101-000000"])
def test_a_record_beside_checkpoints_set_aside_is_kept(tmp_path, aside):
    """Checkpoints moved aside (checkpoints.py's rejected/ and superseded-TIME/) still need the
    record that says what wrote them: another config is refused, as beside a complete checkpoint."""
    from olmo_patches.launch.run_folder import check_config
    from olmo_patches.train.checkpoints import holds_checkpoints

    spec = load_and_resolve(BASELINE, tiny_overrides(tmp_path, *RUN))
    other = load_and_resolve(BASELINE, tiny_overrides(tmp_path, *RUN, "train.lr=0.001"))
    (tmp_path / "config.yaml").write_text(spec_to_yaml(spec))
    assert not holds_checkpoints(tmp_path)
    assert check_config(
        other, checkpointed=holds_checkpoints(tmp_path)
    )  # no checkpoint: replaced later
    (tmp_path / aside / "step2").mkdir(parents=True)
    with pytest.raises(RunFolderError, match="another config"):
        check_config(other, checkpointed=holds_checkpoints(tmp_path))
