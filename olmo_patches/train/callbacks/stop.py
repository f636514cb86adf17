"""SIGTERM and SIGUSR1 from the process's start to its end: save at the next step, exit 0.

What OLMo-core lacks: its Trainer handles SIGTERM and SIGINT only while ``fit()`` runs
(olmo_core/train/trainer.py lines 740-775: installed, then the previous handlers restored) and never
SIGUSR1, SLURM's time-limit signal (scripts/launch_slurm.sbatch); a signal while the run is built
or loaded, or while the process ends, would kill it unsaved.

Under SLURM the signals come from slurmstepd to every process of a step (torchrun and its workers
alike; docs/running.md) and, outside it, from ``olmo_patches.launch.torchrun``, which passes them to
its workers. :func:`install_stop_signals` records the first one for the rest of the process
(another one, or one during a save, is only noted: nothing cuts a save short);
:class:`StopOnSignalCallback` turns it into OLMo-core's ``cancel_run``, which the trainer agrees on
across ranks at its next cancel check (``cancel_check_interval=1``) and ``post_train`` saves
(OLMo-core's own handler does the same for a SIGTERM inside ``fit()``). Once the run is over,
:func:`ignore_stop_signals`.
"""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass
from typing import ClassVar, Optional

from olmo_core.train.callbacks import Callback

log = logging.getLogger(__name__)

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
