"""Preemption and resume on top of OLMo-core's checkpointer.

What OLMo-core already does (olmo_core/train/trainer.py, checkpoint.py, callbacks/checkpointer.py):
- ``fit()`` loads the latest checkpoint in the save folder (``LoadStrategy.if_available``), with
  trainer, data loader and optimizer state; the data loader's state is counted in global tokens,
  so a different number of processes continues the same global batch order.
- SIGTERM/SIGINT cancel the run; the loop stops at the next cancel check and ``post_train`` saves
  a checkpoint for the current step before ``fit()`` returns.
- A checkpoint is complete only when ``stepN/.metadata.json`` exists: it is written last, by an
  atomic rename, after the model/optimizer files (DCP ``.metadata``) and the trainer state. A
  folder cut off mid-write (SIGKILL during a save) therefore never counts as the latest.

What this module adds:
- :func:`prune_incomplete`: removes the leftovers of a cut-off save (``stepN`` without its
  metadata, ``stepN-tmp``) before a run starts, so that saving ``stepN`` again neither fails
  (``save_overwrite=False``) nor needs ``save_overwrite=True`` (which clears a folder before
  rewriting it, and could destroy the very checkpoint a finished run was resumed from).
- :class:`ResumeCheckpointerCallback`: knows the step it resumed from, so a run resumed at its
  last step does not save that step again; checks the weights are finite before every save and
  records each checkpoint's files and CRCs (safety.py, in a background thread); keeps every
  permanent checkpoint (OLMo-core keeps the last 3 by default) and the last ``ephemeral_keep``
  ephemeral ones (OLMo-core: 1).
- :func:`record_save_rate` / :func:`measured_save_rate`: the last save's bytes and seconds, in
  ``SAVE/save_rate.json`` (rank 0; the seconds from the save's start to OLMo-core's "saved", an
  async save's finalization included), from which the dry run sizes SLURM's signal lead.
- :func:`load_explicit`: ``--resume-from PATH`` (a checkpoint, or a folder of them); checkpoints
  in the save folder newer than PATH are moved aside (never deleted) so that they neither shadow
  nor collide with the resumed run's own saves.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from olmo_core.aliases import PathOrStr
from olmo_core.distributed.utils import barrier, broadcast_object, get_rank
from olmo_core.train.callbacks import CheckpointerCallback
from olmo_core.io import is_url
from olmo_core.train.checkpoint import Checkpointer

from ..config import ExperimentSpec
from .checkpoints import checkpoint_step, latest_complete
from .contract import check_checkpoint_fits
from .life import CHECKPOINT_BYTES_PER_PARAM, disk_full_error, full_error
from ..launch.run_folder import RunFolderError
from .safety import ManifestWriter, check_before_save

log = logging.getLogger(__name__)

__all__ = [
    "prune_incomplete",
    "ResumeCheckpointerCallback",
    "check_resume_from",
    "check_own_checkpoint",
    "load_explicit",
    "SAVE_RATE",
    "measured_save_rate",
]

_STEP_DIR = re.compile(r"^step(\d+)(-tmp)?$")


def prune_incomplete(save_folder: PathOrStr) -> List[Path]:
    """Remove cut-off checkpoint folders in a local save folder (call on rank 0 only: a local save
    folder is shared by all nodes). Returns what was removed."""
    removed: List[Path] = []
    folder = Path(save_folder)
    if folder.is_dir():
        for path in sorted(folder.iterdir()):
            m = _STEP_DIR.match(path.name)
            if m is None or not path.is_dir():
                continue
            # cut off: a temporary folder, or no completion marker (written last). A folder with its
            # marker but a file gone is a damaged checkpoint: safety.select_resume_checkpoint moves
            # it aside.
            if m.group(2) or not (path / Checkpointer.METADATA_FNAME).is_file():
                log.warning(f"Removing incomplete checkpoint folder '{path}' (a save was cut off)")
                shutil.rmtree(path)
                removed.append(path)
    return removed


SAVE_RATE = "save_rate.json"  # {"step", "bytes", "seconds"} of the run's last save


def record_save_rate(
    save_folder: PathOrStr, checkpoint: PathOrStr, step: int, seconds: float
) -> None:
    """Record a save just done: its checkpoint's bytes (a local folder) and the seconds it took."""
    size = sum(p.stat().st_size for p in Path(checkpoint).rglob("*") if p.is_file())
    tmp = Path(save_folder) / f"{SAVE_RATE}.tmp"
    tmp.write_text(json.dumps({"step": step, "bytes": size, "seconds": round(seconds, 3)}))
    tmp.replace(Path(save_folder) / SAVE_RATE)


def measured_save_rate(save_folder: PathOrStr) -> Optional[dict]:
    """The record of the run's last save (:func:`record_save_rate`), or None (none yet, a URL,
    unreadable)."""
    if is_url(save_folder):
        return None
    try:
        record = json.loads((Path(save_folder) / SAVE_RATE).read_text())
        return record if record["bytes"] > 0 and record["seconds"] > 0 else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass
class ResumeCheckpointerCallback(CheckpointerCallback):
    """OLMo-core's checkpointer, which does not re-save the step it resumed from, never saves
    non-finite weights, records what each checkpoint holds and never deletes a permanent one."""

    max_checkpoints: Optional[int] = None  # permanent checkpoints (save_interval) are all kept
    ephemeral_keep: int = 1  # ephemeral checkpoints kept (OLMo-core keeps the newest one)
    _held: List[str] = field(default_factory=list)  # ephemeral ones OLMo-core let go, kept a while
    _saved: List[str] = field(default_factory=list)  # saved, their manifest not yet started
    # each save's start (time.monotonic), oldest first
    _save_started: List[float] = field(default_factory=list)

    def post_checkpoint_loaded(self, path: PathOrStr):
        self._latest_checkpoint_step = self.trainer.global_step
        self._latest_checkpoint_path = str(path)

    def _save_checkpoint(self, save_async: Optional[bool] = None, ephemeral: bool = False) -> str:
        check_before_save(self.trainer)
        ManifestWriter.wait_all()  # the previous checkpoint's, before OLMo-core may remove it
        self._save_started.append(time.monotonic())
        try:
            path = super()._save_checkpoint(save_async=save_async, ephemeral=ephemeral)
        # out of space (in DCP's CheckpointException, a BaseException): one line, the partial folder
        # gone, the good ones kept
        except BaseException as e:
            if (cause := full_error(e)) is None or is_url(self.trainer.save_folder):
                raise
            folder = Path(self.trainer.save_folder)
            if get_rank() == 0:
                prune_incomplete(folder)
            raise disk_full_error(
                folder, f"step{self.step}", checkpoint_bytes_of(self.trainer), cause
            ) from None
        self._record_saved()
        return path

    def post_checkpoint_saved(self, path: PathOrStr):
        started = self._save_started.pop(0) if self._save_started else None
        if get_rank() == 0 and not is_url(path):
            self._saved.append(str(path))
            if started is not None and not is_url(self.trainer.save_folder):
                try:
                    record_save_rate(
                        self.trainer.save_folder,
                        path,
                        self.trainer.global_step,
                        time.monotonic() - started,
                    )
                except OSError as e:  # a record, never a reason to stop the run
                    log.warning(f"save rate not recorded: {e}")

    def _record_saved(self):
        # Once every callback's post_checkpoint_saved has run (OLMo-core's config saver writes into
        # the checkpoint there): sizes and CRCs, off the training thread.
        while self._saved:
            ManifestWriter.start(self._saved.pop(0))

    def post_train_batch(self):
        super().post_train_batch()
        self._record_saved()  # an async save finalized during the step

    def post_train(self):
        super().post_train()
        self._record_saved()
        ManifestWriter.wait_all()
        self._remove_old_checkpoints()  # the last ephemeral one let go (OLMo-core leaves it behind)

    def _schedule_for_removal(self, path: str):
        # OLMo-core removes an ephemeral checkpoint when the next one is saved; hold the newest
        # ephemeral_keep - 1 of those back.
        self._held.append(path)
        while len(self._held) > self.ephemeral_keep - 1:
            super()._schedule_for_removal(self._held.pop(0))


def checkpoint_bytes_of(trainer) -> int:
    """This run's checkpoint size: the newest complete one on disk, else as
    :func:`life.checkpoint_bytes` counts it."""
    latest = latest_complete(trainer.save_folder)
    if latest is not None:
        return sum(f.stat().st_size for f in Path(latest).rglob("*") if f.is_file())
    return CHECKPOINT_BYTES_PER_PARAM * sum(
        p.numel() for p in trainer.train_module.model.parameters()
    )


def check_resume_from(resume_from: PathOrStr, spec: ExperimentSpec) -> None:
    """:class:`RunFolderError` (one line) unless ``--resume-from`` names a checkpoint or a folder
    with a complete one whose weights fit ``spec``'s model (their shapes, from its metadata); local
    paths only (a URL is checked when it is loaded). Before anything is written."""
    if is_url(resume_from):
        return
    path = Path(resume_from)
    if not path.is_dir():
        raise RunFolderError(
            f"--resume-from {path}: "
            f"{'a file, not a checkpoint folder' if path.exists() else 'no such folder'}"
        )
    if (latest := latest_complete(path)) is None:
        raise RunFolderError(
            f"--resume-from {path}: no complete checkpoint there (a stepN folder with "
            f"{Checkpointer.METADATA_FNAME})"
        )
    check_checkpoint_fits(latest, spec, f"--resume-from {latest}", RunFolderError)


def check_own_checkpoint(spec: ExperimentSpec) -> None:
    """:class:`RunFolderError` (one line) when the newest complete checkpoint in the save folder,
    which a start without ``--resume-from`` resumes from, does not fit ``spec``'s model; one whose
    metadata cannot be read is left to the start's own check (safety.py sets it aside)."""
    if is_url(spec.save_folder) or (latest := latest_complete(spec.save_folder)) is None:
        return
    where = f"{spec.save_folder}: its newest checkpoint {Path(latest).name}"
    check_checkpoint_fits(latest, spec, where, RunFolderError, unreadable_ok=True)


def load_explicit(trainer, resume_from: PathOrStr) -> str:
    """Load ``resume_from`` (a checkpoint or a folder of checkpoints) into ``trainer`` before
    ``fit()``; save-folder checkpoints newer than it move to ``SAVE/superseded-<time>/``."""
    path: Optional[str] = None
    if get_rank() == 0:
        path = latest_complete(resume_from)
    path = broadcast_object(path)
    if path is None:
        raise FileNotFoundError(f"--resume-from {resume_from}: no complete checkpoint there")
    save_folder = Path(trainer.save_folder)
    if get_rank() == 0 and save_folder.is_dir():
        step = checkpoint_step(path)
        aside = save_folder / f"superseded-{time.strftime('%Y%m%d-%H%M%S')}"
        for other_step, other in Checkpointer.find_checkpoints(save_folder):
            if other_step > step and Path(other).resolve() != Path(path).resolve():
                aside.mkdir(exist_ok=True)
                log.warning(
                    f"Moving '{other}' (newer than the resume point, step {step}) to '{aside}'"
                )
                Path(other).rename(aside / Path(other).name)
    barrier()
    trainer.load_checkpoint(path, load_trainer_state=True, load_optim_state=True)
    return path
