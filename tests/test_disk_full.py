"""Out of space (errno ENOSPC 28, "No space left on device", or EDQUOT 122, "Disk quota exceeded",
as write(2) reports them) during a save and at the start: one line naming the folder, the bytes the
save needs and what is left; the partial save removed; every good checkpoint kept. The disk is a
fake: OLMo-core's checkpoint writer (olmo_core.distributed.checkpoint.filesystem._write_items, which
writes each .distcp file) raises ENOSPC after writing part of its file, as a full disk does
mid-write."""

import errno
import os
from collections import namedtuple
from pathlib import Path

import pytest

from olmo_core.distributed.checkpoint import filesystem as olmo_fs

from olmo_patches.config import load_spec
from olmo_patches.train.callbacks import checkpointer as life
from olmo_patches.train.checkpoints import latest_complete
from tests.conftest import REPO, run_in_process, tiny_overrides

BASELINE = REPO / "configs" / "demo" / "baseline.yaml"
RUN = ["train.max_steps=4", "run.save_interval=2", "run.ephemeral_save_interval=null"]
Usage = namedtuple("Usage", "total used free")  # shutil.disk_usage's fields


@pytest.mark.slow
def test_a_full_disk_during_a_save_is_one_line_and_keeps_the_good_checkpoint(
    tmp_path, monkeypatch, demo_corpus
):
    code = errno.ENOSPC
    real, free = olmo_fs._write_items, [10**12]

    def full_at_step4(path, storage_key, items, planner):
        if "step4" not in str(path):
            return real(path, storage_key, items, planner)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(b"partial")  # what a full disk leaves behind
        free[0] = 4096
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(olmo_fs, "_write_items", full_at_step4)
    monkeypatch.setattr(
        life.shutil, "disk_usage", lambda p: Usage(10**12, 10**12 - free[0], free[0])
    )
    run = tmp_path / "run"
    result = run_in_process("train.py", str(BASELINE), *tiny_overrides(run, *RUN), cwd=tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 4, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and lines[-1].startswith(
        f"error: {os.strerror(code)} saving step4 to {run}: the save needs about "
    ), lines[-1]
    assert (
        lines[-1].count("\n") == 0
        and "4,096 bytes left" in lines[-1]
        and "partial save was removed" in lines[-1]
    )
    assert sorted(p.name for p in run.iterdir() if p.name.startswith("step")) == ["step0", "step2"]
    assert latest_complete(run).endswith("step2")


def test_a_run_folder_without_room_for_one_checkpoint_is_refused_before_anything_is_written(
    tmp_path, monkeypatch
):
    spec = load_spec(BASELINE, tiny_overrides(tmp_path / "run", *RUN))
    need = life.checkpoint_bytes(spec)
    from olmo_patches.report.counts import count

    assert need == count(spec).total * 12  # fp32 weights and AdamW's two fp32 moments
    monkeypatch.setattr(
        life.shutil, "disk_usage", lambda p: Usage(10**12, 10**12 - need + 1, need - 1)
    )
    result = run_in_process(
        "train.py", str(BASELINE), *tiny_overrides(tmp_path / "run", *RUN), cwd=tmp_path
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]
    assert (
        lines[0].startswith(f"config error: run.save_folder={tmp_path / 'run'}: ")
        and "one checkpoint needs about" in lines[0]
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_out_of_space_is_found_however_the_checkpoint_writer_wraps_it(code):
    """As torch.distributed.checkpoint reports a rank's failure (CheckpointException: rank ->
    (exception, stack)) and as OLMo-core's writer threads pass it on (a new error whose text holds
    the original traceback)."""
    from torch.distributed.checkpoint.api import CheckpointException

    original = OSError(code, os.strerror(code))
    wrapped = CheckpointException("save failed", {0: (original, [])})
    assert life.full_error(wrapped) is original
    as_text = RuntimeError(
        f"Original error:\nTraceback ...\nOSError: [Errno {code}] {os.strerror(code)}"
    )
    assert life.full_error(as_text).errno == code
    assert life.full_error(OSError(errno.EACCES, "Permission denied")) is None
