"""The one line and exit code a run that raised an error ends with (scripts/train.py)."""

from __future__ import annotations

import os
from typing import Optional

from ..config import ConfigError
from ..config.spec import one_line
from ..launch.run_folder import RunFolderError
from .disk import DiskFullError
from .safety import NonFiniteError

__all__ = ["exit_line"]


def _unreadable_file(e: Optional[BaseException]) -> Optional[str]:
    """ "FILE (Error: why)" for an OSError naming a file among ``e`` and its causes (OLMo-core's data
    thread raises OLMoThreadError from the reader's error), else None."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.filename:
            return f"{e.filename} ({type(e).__name__}: {e.strerror or e})"
        e = e.__cause__ or e.__context__
    return None


def exit_line(e: Exception) -> tuple[str, int]:
    """The one line and exit code a run that raised ``e`` ends with (scripts/train.py)."""
    if isinstance(e, RunFolderError):
        return f"error: {e}", 2
    if isinstance(e, ConfigError):  # found while building the run (a downstream task that cannot fit)
        return f"config error: {e}", 2
    if isinstance(e, NonFiniteError):
        return f"diverged: {e}", 3
    if (unread := _unreadable_file(e)) is not None:  # a data file gone after the start, say
        return f"rank {os.environ.get('RANK', '0')} cannot read {unread}", 2
    if isinstance(e, DiskFullError):
        return f"error: {e.strerror}", 4
    return f"rank {os.environ.get('RANK', '0')} failed: {type(e).__name__}: {one_line(e)}", 1
