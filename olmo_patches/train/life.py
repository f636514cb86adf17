"""How a run ends (run.py's ``train`` is its course): the room it needs before it starts, a stop
signal that saves and exits 0, a full disk during a save, and the one line and exit code of every
end (:func:`exit_line`: 0 stopped or done, 2 refused, 3 diverged, 4 out of space, 1 otherwise).

Stop signals: SIGTERM (preemption, a cancel) and SIGUSR1 (the time limit). Under SLURM they come
from slurmstepd to every process of a step (torchrun and its workers alike; docs/running.md,
scripts/launch_slurm.sbatch) and, outside it, from ``olmo_patches.launch.torchrun``, which passes
them to its workers. Each rank then stops at the next step, saves a checkpoint and exits 0
(rerunning the command, or the requeued job, resumes from it):

- :func:`install_stop_signals` installs the handler for the rest of the process (scripts/train.py:
  a signal after the run, while the process ends, is ignored too: :func:`ignore_stop_signals`). The
  first signal is logged; another one, or one during a save, is only noted: nothing cuts a save
  short (SLURM's SIGKILL after GraceTime or KillWait aside).
- :class:`StopOnSignalCallback` turns a signal received before or between steps into OLMo-core's
  ``cancel_run``: the trainer agrees on it across ranks at its next cancel check
  (``cancel_check_interval=1``: every step) and ``post_train`` saves the step reached. OLMo-core's
  own SIGTERM handler (installed during ``fit()``) does the same for SIGTERM.

Disk space: a run folder is checked for one checkpoint's room before the run starts
(:func:`check_room`), and a save that runs out of space (ENOSPC, or EDQUOT for a quota: errno(3))
becomes one line naming the folder, the bytes the save needed and what is left
(:func:`disk_full_error`; resume.py removes the partial folder, every good checkpoint is kept).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Iterator, Optional

from olmo_core.train.callbacks import Callback

from ..config import ConfigError, ExperimentSpec
from ..config.spec import one_line
from ..launch.run_folder import RunFolderError
from .safety import NonFiniteError

log = logging.getLogger(__name__)

__all__ = [
    "install_stop_signals",
    "ignore_stop_signals",
    "stop_requested",
    "StopOnSignalCallback",
    "DiskFullError",
    "check_room",
    "checkpoint_bytes",
    "full_error",
    "disk_full_error",
    "CHECKPOINT_BYTES_PER_PARAM",
    "exit_line",
]

# ---- stop signals: save at the next step, exit 0 ------------------------------------------------

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

_requested: Optional[str] = None  # the first stop signal's name


def stop_requested() -> Optional[str]:
    """The name of the first stop signal this run received, or None."""
    return _requested


def _handle(signum, frame) -> None:
    global _requested
    name = signal.Signals(signum).name
    if _requested is None:
        _requested = name
        log.warning(f"{name} received: saving a checkpoint at the next step, then stopping")
    else:
        log.info(f"{name} received again: already stopping (a save in progress goes on)")


def install_stop_signals() -> None:
    """SIGTERM and SIGUSR1 request a stop from now on (main thread only)."""
    global _requested
    if threading.current_thread() is threading.main_thread():
        _requested = None
        for s in STOP_SIGNALS:
            signal.signal(s, _handle)


def ignore_stop_signals() -> None:
    """Ignore SIGTERM and SIGUSR1 from now on: the run is over (saved), the process is ending. An
    ignored signal stays ignored while the interpreter exits; a Python handler would not: Python's
    finalization restores the default action (signalmodule.c, ``_PySignal_Fini``), and a SIGTERM
    then would end a stopped run's clean exit with -15."""
    if threading.current_thread() is threading.main_thread():
        for s in STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)


@dataclass
class StopOnSignalCallback(Callback):
    """Cancels the run (OLMo-core's ``cancel_run``) once a stop signal has arrived."""

    priority: ClassVar[int] = 3  # before the checkpointer: a step's stop is seen before its saves
    _canceled: bool = False

    def pre_train(self):
        self._check()

    def post_step(self):
        self._check()

    def _check(self) -> None:
        if _requested is not None and not self._canceled:
            self._canceled = True
            self.trainer.cancel_run(f"{_requested} received")


# ---- disk space: room for a checkpoint before the start, a full disk during a save -------------

FULL = (errno.ENOSPC, errno.EDQUOT)  # "No space left on device", "Disk quota exceeded"
CHECKPOINT_BYTES_PER_PARAM = 12  # fp32 weights + AdamW's two fp32 moments (the trainer state: KB)


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
    folder = Path(spec.save_folder)
    if "://" in spec.save_folder:
        return
    need, free = checkpoint_bytes(spec), free_bytes(folder)
    if free < need:
        raise ConfigError(
            f"run.save_folder={folder}: {_size(free)} free on its disk, "
            f"one checkpoint needs about {_size(need)}"
        )


def _chain(e: BaseException) -> Iterator[BaseException]:
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
    chain = list(_chain(e))
    if found := next((x for x in chain if isinstance(x, OSError) and x.errno in FULL), None):
        return found
    for code in FULL:
        if any(f"[Errno {code}]" in str(x) for x in chain):
            return OSError(code, os.strerror(code))
    return None


def disk_full_error(folder: Path, path: str, need: int, cause: OSError) -> DiskFullError:
    free = free_bytes(folder)
    return DiskFullError(
        cause.errno,
        f"{cause.strerror} saving {Path(path).name} to {folder}: the save needs about "
        f"{_size(need)}, {_size(free)} left; the partial save was removed, earlier checkpoints "
        "kept",
    )


def _size(n: int) -> str:
    if n >= 2**30:
        return f"{n / 2**30:,.2f} GiB"
    return f"{n / 2**20:,.1f} MiB" if n >= 2**20 else f"{n:,} bytes"


# ---- the exit line ------------------------------------------------------------------------------


def _unreadable_file(e: BaseException) -> Optional[str]:
    """ "FILE (Error: why)" for an OSError naming a file among ``e`` and what is behind it
    (OLMo-core's data thread raises OLMoThreadError from the reader's error), else None."""
    x = next((x for x in _chain(e) if isinstance(x, OSError) and x.filename), None)
    return None if x is None else f"{x.filename} ({type(x).__name__}: {x.strerror or x})"


def exit_line(e: Exception) -> tuple[str, int]:
    """The one line and exit code a run that raised ``e`` ends with (scripts/train.py)."""
    rank = os.environ.get("RANK", "0")
    if isinstance(e, RunFolderError):
        return f"error: {e}", 2
    if isinstance(e, ConfigError):  # found while building the run (a task that cannot fit)
        return f"config error: {e}", 2
    if isinstance(e, NonFiniteError):
        return f"diverged: {e}", 3
    if isinstance(e, DiskFullError):
        return f"error: {e.strerror}", 4
    if (unread := _unreadable_file(e)) is not None:  # a data file gone after the start, say
        return f"rank {rank} cannot read {unread}", 2
    return f"rank {rank} failed: {type(e).__name__}: {one_line(e)}", 1
