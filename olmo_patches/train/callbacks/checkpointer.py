"""OLMo-core's checkpointer, with what it lacks for a run that must never lose good work:

- a run resumed and stopped before its first step does not save the step it loaded again: OLMo-core
  counts its last save from -1 (olmo_core/train/callbacks/checkpointer.py line 119) and saves in
  ``post_train`` past it (line 321), into a folder that exists (FileExistsError, checkpoint.py line
  445);
- no save of non-finite weights (nonfinite.py: OLMo-core has no hook before a save);
- each checkpoint's files and CRC-32s recorded (checkpoints.py's manifest, in a background thread):
  OLMo-core's ``dir_is_checkpoint`` checks that three files exist (checkpoint.py line 339), and a
  cut or corrupted shard then fails the load, or loads wrong values;
- the last ``run.ephemeral_keep`` ephemeral checkpoints kept (OLMo-core: the newest, line 313), and
  every permanent one (set here: ``max_checkpoints=None``; OLMo-core's default keeps 3, line 102);
- a full disk (ENOSPC, or EDQUOT for a quota: errno(3)) in one line naming the folder, the bytes the
  save needed and what is left, the partial save removed and every good checkpoint kept (exit 4),
  and a run folder without one checkpoint's room refused before it starts (:func:`check_room`);
- the last save's bytes and seconds (``SAVE/save_rate.json``), from which the dry run sizes
  SLURM's signal lead.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, List, Optional

from olmo_core.aliases import PathOrStr
from olmo_core.distributed.utils import get_rank
from olmo_core.io import is_url
from olmo_core.train.callbacks import CheckpointerCallback

from ...config import ConfigError, ExperimentSpec
from ...launch.run_folder import read_record, write_record
from ..checkpoints import ManifestWriter, latest_complete, prune_incomplete
from .nonfinite import check_before_save

log = logging.getLogger(__name__)

FULL = (errno.ENOSPC, errno.EDQUOT)  # "No space left on device", "Disk quota exceeded"
CHECKPOINT_BYTES_PER_PARAM = 12  # fp32 weights + AdamW's two fp32 moments (the trainer state: KB)
SAVE_RATE = "save_rate.json"  # {"step", "bytes", "seconds"} of the run's last save


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
            raise disk_full_error(folder, f"step{self.step}", self._bytes(), cause) from None
        self._record_saved()
        return path

    def _bytes(self) -> int:
        """This run's checkpoint size: the newest complete one on disk, else as
        :func:`checkpoint_bytes` counts it."""
        if (latest := latest_complete(self.trainer.save_folder)) is not None:
            return sum(f.stat().st_size for f in Path(latest).rglob("*") if f.is_file())
        model = self.trainer.train_module.model
        return CHECKPOINT_BYTES_PER_PARAM * sum(p.numel() for p in model.parameters())

    def post_checkpoint_saved(self, path: PathOrStr):
        started = self._save_started.pop(0) if self._save_started else None
        if get_rank() != 0 or is_url(path):
            return
        self._saved.append(str(path))
        if started is not None:
            try:
                record_save_rate(self.trainer, path, time.monotonic() - started)
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


# ---- the save rate ------------------------------------------------------------------------------


def record_save_rate(trainer, checkpoint: PathOrStr, seconds: float) -> None:
    """Record a save just done: its checkpoint's bytes (a local folder), the seconds from the save's
    start to OLMo-core's "saved" (an async save's finalization included)."""
    size = sum(p.stat().st_size for p in Path(checkpoint).rglob("*") if p.is_file())
    record = {"step": trainer.global_step, "bytes": size, "seconds": round(seconds, 3)}
    write_record(Path(trainer.save_folder) / SAVE_RATE, record)


def measured_save_rate(save_folder: PathOrStr) -> Optional[dict]:
    """The record of the run's last save (:func:`record_save_rate`), or None (none yet, a URL,
    unreadable)."""
    if is_url(save_folder):
        return None
    try:
        record = read_record(Path(save_folder) / SAVE_RATE) or {}
        return record if record["bytes"] > 0 and record["seconds"] > 0 else None
    except (OSError, KeyError, TypeError):  # a folder there, unreadable, or not a save's record
        return None


# ---- disk space: room for a checkpoint before the start, a full disk during a save -------------


class DiskFullError(OSError):
    """A save that ran out of space: the message is one line (folder, bytes needed, bytes left)."""


def checkpoint_bytes(spec: ExperimentSpec) -> int:
    """One checkpoint's size: every parameter of the model (a meta build) in fp32, with AdamW's
    two moments."""
    model = spec.model_config().build(init_device="meta")
    return sum(p.numel() for p in model.parameters()) * CHECKPOINT_BYTES_PER_PARAM


def free_bytes(folder: Path) -> int:
    """Bytes free to this user on the disk that holds ``folder`` (or its nearest existing
    parent)."""
    for path in (folder, *folder.parents):
        if path.exists():
            return shutil.disk_usage(path).free
    return shutil.disk_usage(".").free


def check_room(spec: ExperimentSpec) -> None:
    """Before the run writes anything: a local run folder whose disk cannot hold one checkpoint is
    refused (ConfigError, one line)."""
    if is_url(spec.save_folder):
        return
    folder = Path(spec.save_folder)
    need, free = checkpoint_bytes(spec), free_bytes(folder)
    if free < need:
        raise ConfigError(
            f"run.save_folder={folder}: {_size(free)} free on its disk, "
            f"one checkpoint needs about {_size(need)}"
        )


def causes(e: BaseException) -> Iterator[BaseException]:
    """``e`` and every exception behind it: causes, contexts, and the per-rank failures that
    torch.distributed.checkpoint's CheckpointException holds (rank -> (exception, traceback))."""
    seen, todo = set(), [e]
    while todo:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        yield x
        todo += [c for c in (x.__cause__, x.__context__) if c is not None]
        for failure in (getattr(x, "failures", None) or {}).values():
            first = failure[0] if isinstance(failure, tuple) and failure else failure
            if isinstance(first, BaseException):
                todo.append(first)
        todo += [a for a in getattr(x, "args", ()) if isinstance(a, BaseException)]


def full_error(e: BaseException) -> Optional[OSError]:
    """The out-of-space OSError behind ``e``, if that is what it is (an exception object, or the
    text of one that OLMo-core's writer threads pass on as "Original error: <traceback>")."""
    chain = list(causes(e))
    if found := next((x for x in chain if isinstance(x, OSError) and x.errno in FULL), None):
        return found
    for code in FULL:
        if any(f"[Errno {code}]" in str(x) for x in chain):
            return OSError(code, os.strerror(code))
    return None


def disk_full_error(folder: Path, path: str, need: int, cause: OSError) -> DiskFullError:
    return DiskFullError(
        cause.errno,
        f"{cause.strerror} saving {Path(path).name} to {folder}: the save needs about "
        f"{_size(need)}, {_size(free_bytes(folder))} left; the partial save was removed, earlier "
        "checkpoints kept",
    )


def _size(n: int) -> str:
    if n >= 2**30:
        return f"{n / 2**30:,.2f} GiB"
    return f"{n / 2**20:,.1f} MiB" if n >= 2**20 else f"{n:,} bytes"
