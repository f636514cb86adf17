"""Good work is never lost: no non-finite checkpoint, a record of what each checkpoint holds, and a
resume that falls back past a checkpoint that fails either check.

- :class:`NonFiniteGuardCallback` stops the run at the first step whose loss or gradient norm is
  not finite (:class:`NonFiniteError`, one line: step, what, the last good checkpoint), reading the
  device only where the trainer syncs anyway and before a save (no host sync per step).
- :func:`check_before_save` runs before every save (``ResumeCheckpointerCallback``): the guard's
  unread steps, then :func:`assert_finite_params`, so a model with a non-finite weight is never
  written, whichever save it is (permanent, ephemeral, final, SIGTERM).
- :func:`write_manifest` records the files, sizes and CRC-32s of a saved checkpoint
  (``manifest.json``) and that its weights were checked finite; :func:`verify` checks a checkpoint
  against it. The CRCs are computed off the training thread (:class:`ManifestWriter`: zlib releases
  the GIL), at about disk speed; ``benchmarks/bench_checkpoint_manifest.py`` measures their cost
  against the save itself.
- :func:`select_resume_checkpoint` moves a checkpoint that fails (a missing, cut or corrupted file,
  non-finite weights written by an older version) to ``SAVE/rejected/`` (never deleted) with one
  warning line, so that OLMo-core's own "latest complete checkpoint" is the newest good one.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Dict, List, Optional, Tuple, Union

import torch
import torch.distributed as dist
from olmo_core.aliases import PathOrStr
from olmo_core.distributed.utils import broadcast_object, get_local_tensor, get_rank, is_distributed
from olmo_core.train.callbacks import Callback
from olmo_core.train.checkpoint import Checkpointer

from .checkpoints import load_model_state

log = logging.getLogger(__name__)

__all__ = [
    "MANIFEST",
    "NonFiniteError",
    "NonFiniteGuardCallback",
    "check_before_save",
    "write_manifest",
    "ManifestWriter",
    "verify",
    "checkpoints_at",
    "select_resume_checkpoint",
]

_STEP = re.compile(r"^step\d+$")
# in each stepN/: {"files": {relative path: {"bytes": n, "crc32": hex}}, "finite": true}
MANIFEST = "manifest.json"
CHUNK = 16 * 2**20  # bytes read at a time for the CRC
LOSS = "train/CE loss"
GRAD_NORM = "optim/total grad norm"
_GUARDED = (LOSS, GRAD_NORM)


class NonFiniteError(RuntimeError):
    """The run diverged: one line naming the step, what was not finite and the last good
    checkpoint."""


def _last_good(trainer) -> str:
    """The newest checkpoint of the save folder that verifies (its files, without loading
    weights)."""
    good: Optional[str] = None
    if get_rank() == 0:
        ManifestWriter.wait_all()
        good = next(
            (
                p
                for _, p in checkpoints_in(trainer.save_folder)
                if verify(p, load_weights=False) is None
            ),
            None,
        )
    if is_distributed():
        good = broadcast_object(good)
    return good or "none (rerun starts from scratch)"


def assert_finite_params(trainer) -> None:
    """Raise :class:`NonFiniteError` (on every rank) when a model weight is not finite."""
    model = trainer.train_module.model
    bad = next(
        (
            n
            for n, p in model.named_parameters()
            if not torch.isfinite(get_local_tensor(p.detach())).all()
        ),
        None,
    )
    finite = torch.tensor(int(bad is None), device=next(model.parameters()).device)
    if is_distributed():
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)
    if not finite.item():
        raise NonFiniteError(
            f"step {trainer.global_step}: non-finite "
            f"weights{f' ({bad})' if bad else ' (another rank)'}; "
            f"not saved; last good checkpoint: {_last_good(trainer)}"
        )


@dataclass
class NonFiniteGuardCallback(Callback):
    """Stops at the first step with a non-finite loss or gradient norm, without a host sync per
    step: each step's values stay on the device until :meth:`check` reads all pending steps at once
    (one all-reduce, one copy to the host). It runs on the steps the trainer collects metrics (it
    syncs there anyway, and OLMo-core's own non-finite check comes after it), at the end of training
    or an epoch, on a cancel, and before every save (:func:`check_before_save`).

    Runs before the checkpointer (higher priority), so the step that diverged is never saved."""

    priority: ClassVar[int] = 2
    # (step, [loss, grad norm]) unread
    _pending: List[Tuple[int, torch.Tensor]] = field(default_factory=list)
    _started: bool = False  # the first step is checked (OLMo-core collects metrics there too)

    def post_train_batch(self):
        metrics = self.trainer._metrics.get(self.step, {})
        if any(k in metrics for k in _GUARDED):
            values = [
                metrics[k].detach().float().reshape(()) if k in metrics else None for k in _GUARDED
            ]
            zero = next(v for v in values if v is not None).new_zeros(())
            self._pending.append(
                (self.step, torch.stack([zero if v is None else v for v in values]))
            )
        if self._collects_now():
            self.check()
        self._started = True

    def _collects_now(self) -> bool:
        """Whether the trainer reduces metrics after this step (OLMo-core's _fit_epoch)."""
        t, dl = self.trainer, self.trainer.data_loader
        last = min(
            s for s in (t.max_steps, t.hard_stop and t.convert_duration_to_steps(t.hard_stop)) if s
        )
        epoch_end = dl.total_batches is not None and dl.batches_processed >= dl.total_batches
        return (
            not self._started
            or self.step % t.metrics_collect_interval == 0
            or self.step >= last
            or epoch_end
            or t.is_canceled
        )

    def check(self) -> None:
        """Raise :class:`NonFiniteError` (on every rank) at the first pending step whose values are
        not finite on some rank."""
        if not self._pending:
            return
        steps = [s for s, _ in self._pending]
        values = torch.stack([v for _, v in self._pending])
        self._pending.clear()
        finite = torch.isfinite(values).all(dim=1).to(torch.int32)
        if is_distributed():
            dist.all_reduce(finite, op=dist.ReduceOp.MIN)
        # the one sync
        host = torch.cat([finite[:, None].to(values.dtype), values], dim=1).cpu().tolist()
        bad = next((i for i, row in enumerate(host) if not row[0]), None)
        if bad is None:
            return
        what = ", ".join(
            f"{k.split('/')[-1]}={v}"
            for k, v in zip(_GUARDED, host[bad][1:])
            if not math.isfinite(v)
        )
        raise NonFiniteError(
            f"step {steps[bad]}: non-finite {what or 'loss on another rank'}; last good "
            f"checkpoint: {_last_good(self.trainer)}"
        )


def check_before_save(trainer) -> None:
    """Before any save: the guard's pending steps, then the weights
    (:func:`assert_finite_params`)."""
    for callback in trainer.callbacks.values():
        if isinstance(callback, NonFiniteGuardCallback):
            callback.check()
    assert_finite_params(trainer)


def crc32(path: Path) -> str:
    """The CRC-32 of a file (zlib's, 8 hex digits)."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


def write_manifest(checkpoint: PathOrStr) -> None:
    """Record the files, sizes and CRCs of a local checkpoint just saved (its weights were checked
    finite)."""
    path = Path(checkpoint)
    files = {
        str(p.relative_to(path)): {"bytes": p.stat().st_size, "crc32": crc32(p)}
        for p in sorted(path.rglob("*"))
        if p.is_file() and not p.name.startswith(MANIFEST)
    }
    tmp = path / f"{MANIFEST}.tmp"
    tmp.write_text(json.dumps({"files": files, "finite": True}, indent=1))
    tmp.replace(path / MANIFEST)


class ManifestWriter:
    """:func:`write_manifest` in a background thread (rank 0): the training thread goes on while the
    files are read back. A kill before it ends leaves no manifest: the checkpoint is then checked by
    loading its weights (:func:`verify`)."""

    _threads: ClassVar[List[threading.Thread]] = []

    @classmethod
    def start(cls, checkpoint: PathOrStr) -> None:
        thread = threading.Thread(
            target=write_manifest, args=(checkpoint,), name=f"manifest {checkpoint}"
        )
        thread.start()
        cls._threads.append(thread)

    @classmethod
    def wait_all(cls) -> None:
        while cls._threads:
            cls._threads.pop(0).join()


def _check_files(
    path: Path, recorded: Dict[str, Union[int, Dict[str, Union[int, str]]]]
) -> Optional[str]:
    for name, entry in recorded.items():
        size, crc = (
            (entry, None) if isinstance(entry, int) else (entry["bytes"], entry.get("crc32"))
        )
        f = path / name
        if not f.is_file():
            return f"{f} missing"
        if f.stat().st_size != size:
            return f"{f} has {f.stat().st_size} bytes, {size} when saved"
        if crc is not None and (now := crc32(f)) != crc:
            return f"{f} is corrupted (CRC-32 {now}, {crc} when saved)"
    return None


def verify(checkpoint: PathOrStr, load_weights: bool = True) -> Optional[str]:
    """Why a complete checkpoint cannot be resumed, or None. With a manifest: every file there at
    its size and CRC-32 (a manifest of sizes only, from 0.2: also the weights' check below). Without
    one (an older version, or a kill before the manifest was written): its files load and its
    weights are finite (``load_weights=False``: only OLMo-core's required files are there)."""
    path = Path(checkpoint)
    manifest = path / MANIFEST
    checksummed = False
    if manifest.is_file():
        try:
            recorded = json.loads(manifest.read_text())["files"]
        except (ValueError, KeyError) as e:
            return f"{manifest} unreadable ({e})"
        if (why := _check_files(path, recorded)) is not None:
            return why
        checksummed = all(isinstance(e, dict) and "crc32" in e for e in recorded.values())
    if checksummed:
        return None
    for name in ("train/rank0.pt", "model_and_optim/.metadata"):  # what OLMo-core requires
        if not (path / name).is_file():
            return f"{path / name} missing"
    if not load_weights:
        return None
    try:
        finite = all(bool(torch.isfinite(v).all()) for v in load_model_state(path).values())
        return None if finite else f"{path} has non-finite weights"
    except Exception as e:  # a cut or missing model file
        return f"{path} unreadable ({type(e).__name__}: {' '.join(str(e).split())[:200]})"


def checkpoints_in(save_folder: PathOrStr) -> List[tuple[int, str]]:
    """(step, path) of every complete checkpoint (a ``stepN`` with its completion marker), newest
    first."""
    folder = Path(save_folder)
    if not folder.is_dir():
        return []
    marked = [
        (int(p.name[4:]), str(p))
        for p in folder.glob("step*")
        if _STEP.match(p.name) and (p / Checkpointer.METADATA_FNAME).is_file()
    ]
    return sorted(marked, reverse=True)


def checkpoints_at(path: Path) -> List[Tuple[int, str]]:
    """The checkpoint at ``path`` itself, or every complete checkpoint of a run folder
    (:func:`checkpoints_in`)."""
    return (
        [(0, str(path))] if (path / Checkpointer.METADATA_FNAME).is_file() else checkpoints_in(path)
    )


def select_resume_checkpoint(save_folder: PathOrStr) -> Optional[str]:
    """Move aside (to ``SAVE/rejected/``) every checkpoint (a ``stepN`` with its completion marker)
    newer than the newest good one; return that one (None: start from scratch). Local folders, rank
    0 only."""
    folder = Path(save_folder)
    if not folder.is_dir():
        return None
    rejected = []
    for step, path in checkpoints_in(folder):
        why = verify(path)
        if why is None:
            if rejected:
                log.warning(
                    f"Resuming from step {step} ({path}): {'; '.join(rejected)} (moved to "
                    f"{folder / 'rejected'})"
                )
            return path
        aside = folder / "rejected"
        aside.mkdir(exist_ok=True)
        target = aside / Path(path).name
        n = 1
        while target.exists():
            target, n = aside / f"{Path(path).name}.{n}", n + 1
        Path(path).rename(target)
        rejected.append(why)
    if rejected:
        log.warning(
            f"No good checkpoint: {'; '.join(rejected)} (moved to {folder / 'rejected'}); starting "
            "from scratch"
        )
    return None
