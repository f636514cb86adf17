"""What a run shows its operator: one progress line per log interval on rank 0, the start's
lines and warnings; everything else OLMo-core logs goes to ``SAVE/train.log``.

What OLMo-core lacks: its ConsoleLoggerCallback prints a marker line and one line per metric at
every log interval (olmo_core/train/callbacks/console_logger.py lines 68-80), and OLMo-core logs to
the terminal only (``setup_logging``: a stream handler, olmo_core/utils.py). Here, e.g.

    step 120/400 | loss 4.2130 | val 4.3050 | 8,120 tok/s | MFU 41.2% | 6m05s left

(val: the mean CE loss over the validation sets evaluated at that step; MFU: GPUs with a known
peak only), the model printout, the per-step metrics, the data and checkpoint steps in train.log.
"""

from __future__ import annotations

import logging
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from olmo_core.distributed.utils import get_rank, get_world_size
from olmo_core.train.callbacks import ConsoleLoggerCallback

log = logging.getLogger(__name__)

LOSS = "train/CE loss"
VAL_LOSS = re.compile(r"^eval/lm/.+/CE loss$")  # one per validation set
TPS = "throughput/device/TPS (actual avg)"
MFU = "throughput/device/MFU (actual avg)"


def format_progress(
    step: int,
    total: Optional[int],
    metrics: Dict[str, float],
    *,
    world_size: int = 1,
    seconds_left: Optional[float] = None,
) -> str:
    """One progress line from a step's metrics (tokens/s summed over ranks)."""
    parts = [f"step {step}/{total if total is not None else '?'}"]
    if LOSS in metrics:
        parts.append(f"loss {metrics[LOSS]:.4f}")
    val = [v for k, v in metrics.items() if VAL_LOSS.match(k)]
    if val:
        parts.append(f"val {sum(val) / len(val):.4f}")
    if TPS in metrics:
        parts.append(f"{metrics[TPS] * world_size:,.0f} tok/s")
    if MFU in metrics:
        parts.append(f"MFU {metrics[MFU]:.1f}%")
    if seconds_left is not None and seconds_left >= 1:
        h, rem = divmod(int(seconds_left), 3600)
        parts.append(f"{h}h{rem // 60:02d}m left" if h else f"{rem // 60}m{rem % 60:02d}s left")
    return " | ".join(parts)


@dataclass
class ProgressCallback(ConsoleLoggerCallback):
    """OLMo-core's console logger (so the Trainer adds no other), one line per logged step."""

    def post_step(self):
        pass  # everything is printed from log_metrics, once the step's metrics are reduced

    # the last step with a line: OLMo-core logs a save step's and the last step's metrics twice
    _printed: int = -1

    def log_metrics(self, step: int, metrics: Dict[str, float]):
        if get_rank() != 0 or not self._should_log_metrics(step) or step <= self._printed:
            return
        self._printed = step
        progress = self.trainer.training_progress
        seconds_left = None
        if progress.bps and progress.total_steps is not None:
            seconds_left = max(progress.total_steps - step, 0) / progress.bps
        log.info(
            format_progress(
                step,
                progress.total_steps,
                metrics,
                world_size=get_world_size(),
                seconds_left=seconds_left,
            )
        )


def announce(line: str) -> None:
    """A line for the operator's terminal (rank 0), beside the progress lines: where a run starts
    from."""
    log.info(line)


LOG_FILE = "train.log"


# The loggers of OLMo-core's prepare_training_environment (env vars, the process group, the
# backend).
_START_LOGGERS = ("olmo_core.utils", "olmo_core.distributed.utils", "olmo_core.train")


@contextmanager
def quiet_start(kept: List[logging.LogRecord]):
    """OLMo-core's start-up lines (``Setting env var ...``, ``Will skip setting env var ...``, the
    process group) and what the checks before a run log (a meta build of the model prints it) into
    ``kept`` instead of the terminal (:func:`quiet_console` writes them to ``train.log``); errors
    still pass. Before its logging is set up OLMo-core prints them unless a root handler takes INFO:
    this one does. After an earlier run in the same process (the demo's variants, a local sweep)
    OLMo-core's console handler is there already: it shows warnings and errors only, as in
    :func:`quiet_console`."""

    def divert(record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        kept.append(record)
        return False

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if divert(record) and root.handlers == [self]:  # nothing else shows an error
                logging.lastResort.handle(record)

    root, handler = logging.getLogger(), _Keep(logging.INFO)
    level = root.level
    consoles, keep = list(root.handlers), _ProgressOrWarning()
    for h in consoles:
        h.addFilter(keep)
    root.addHandler(handler)
    root.setLevel(min(level, logging.INFO) or logging.INFO)
    loggers = [logging.getLogger(name) for name in _START_LOGGERS]
    for logger in loggers:
        logger.addFilter(divert)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(divert)
        for h in consoles:
            h.removeFilter(keep)
        root.removeHandler(handler)
        if not root.handlers:  # OLMo-core's logging was not set up here: as it was
            root.setLevel(level)


@contextmanager
def quiet_console(save_folder: Path, kept: Sequence[logging.LogRecord] = ()):
    """The terminal shows the progress lines and warnings; everything OLMo-core logs (the model
    printout, its per-step metrics, the data and checkpoint steps) goes to ``SAVE/train.log``, after
    the start-up lines ``kept`` by :func:`quiet_start`."""
    root = logging.getLogger()
    consoles = [
        h
        for h in root.handlers
        if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
    ]
    keep = _ProgressOrWarning()
    file = None
    if get_rank() == 0:
        file = logging.FileHandler(save_folder / LOG_FILE)
        # made before OLMo-core's fields
        early = logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s")
        file.setFormatter(consoles[0].formatter if consoles else early)
        file.stream.writelines(early.format(record) + "\n" for record in kept)
        root.addHandler(file)
    for h in consoles:
        h.addFilter(keep)
    try:
        yield
    finally:
        for h in consoles:
            h.removeFilter(keep)
        if file is not None:
            root.removeHandler(file)
            file.close()


class _ProgressOrWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        # the trainer's two-line report; scripts/train.py prints one
        if "NonFiniteError" in str(record.msg):
            return False
        # announce() said "new run"
        if str(record.msg).startswith("No checkpoint found in save folder"):
            return False
        return record.levelno >= logging.WARNING or record.name == __name__
