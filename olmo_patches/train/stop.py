"""A stop signal saves and exits 0: SIGTERM (preemption, a cancel) and SIGUSR1 (the time limit).

Under SLURM the signals come from slurmstepd to every process of a step (torchrun and its workers
alike; docs/running.md, scripts/launch_slurm.sbatch) and, outside it, from ``olmo_patches.launch.torchrun``,
which passes them to its workers. Each rank then stops at the next step, saves a checkpoint and
exits 0 (rerunning the command, or the requeued job, resumes from it):

- :func:`install` installs the handler for the rest of the process (scripts/train.py: a signal
  after the run, while the process ends, is ignored too); :func:`stop_signals` for a block (an
  in-process run), restoring the previous handlers after it. The first signal is logged; another one, or one during a save, is only noted: nothing cuts a save
  short (SLURM's SIGKILL after GraceTime or KillWait aside).
- :class:`StopOnSignalCallback` turns a signal received before or between steps into OLMo-core's
  ``cancel_run``: the trainer agrees on it across ranks at its next cancel check
  (``cancel_check_interval=1``: every step) and ``post_train`` saves the step reached. OLMo-core's own
  SIGTERM handler (installed during ``fit()``) does the same for SIGTERM.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from dataclasses import dataclass
from typing import ClassVar, Iterator, Optional

from olmo_core.train.callbacks import Callback

log = logging.getLogger(__name__)

__all__ = ["install", "ignore", "requested", "StopOnSignalCallback"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

_requested: Optional[str] = None  # the first stop signal's name


def requested() -> Optional[str]:
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


def install() -> dict:
    """SIGTERM and SIGUSR1 request a stop from now on (main thread only); returns the previous handlers."""
    global _requested
    if threading.current_thread() is not threading.main_thread():
        return {}
    _requested = None
    return {s: signal.signal(s, _handle) for s in STOP_SIGNALS}


def ignore() -> None:
    """Ignore SIGTERM and SIGUSR1 from now on: the run is over (saved), the process is ending. An
    ignored signal stays ignored while the interpreter exits; a Python handler would not: Python's
    finalization restores the default action (signalmodule.c, ``_PySignal_Fini``), and a SIGTERM
    then would end a stopped run's clean exit with -15."""
    if threading.current_thread() is threading.main_thread():
        for s in STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """Within it, SIGTERM and SIGUSR1 request a stop (:func:`requested`) instead of ending the
    process; the previous handlers come back after it. Outside the main thread: nothing."""
    previous = install()
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


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
