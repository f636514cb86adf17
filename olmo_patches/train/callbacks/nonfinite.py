"""No non-finite checkpoint, and a divergence named in one line: the step, what was not finite, the
last good checkpoint (exit 3: run.py's ``exit_line``).

What OLMo-core lacks: its Trainer checks only the CE loss, and only when it logs metrics
(olmo_core/train/trainer.py line 1639, every ``metrics_collect_interval`` steps, line 1736), after
the step's ``post_train_batch`` callbacks (line 1731), where its checkpointer saves: a save at that
step already holds the diverged weights, and its RuntimeError names no checkpoint to go back to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, List, Optional, Tuple

import torch
import torch.distributed as dist
from olmo_core.distributed.utils import broadcast_object, get_local_tensor, get_rank, is_distributed
from olmo_core.train.callbacks import Callback

from ..checkpoints import ManifestWriter, checkpoints_in, verify

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
        checkpoints = checkpoints_in(trainer.save_folder)
        good = next((p for _, p in checkpoints if verify(p, load_weights=False) is None), None)
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
            row = [zero if v is None else v for v in values]
            self._pending.append((self.step, torch.stack(row)))
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
