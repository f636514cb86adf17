"""Shared command-line plumbing for scripts/: one-line config errors, the console."""

from __future__ import annotations

import logging
import os
import sys
from typing import List, NoReturn, Optional

from .config import ConfigError, ExperimentSpec, Layout, load_spec
from .report.console import console
from .peers import announce

__all__ = ["console", "load_or_exit", "refuse"]


def load_or_exit(path: str, overrides: Optional[List[str]] = None, layout: Optional[Layout] = None) -> ExperimentSpec:
    """Load a config for ``layout``'s ranks (default: torchrun's); on a bad one print one line
    naming file, key and value (:func:`refuse`) and exit 2."""
    _config_log(_rank0())
    try:
        return load_spec(path, overrides, layout)
    except ConfigError as e:
        refuse(f"config error: {e}")


def refuse(line: str, code: int = 2) -> NoReturn:
    """Exit with ``code`` after one line on stderr, once a node however many ranks refuse; the other
    ranks of the launch exit with the same code (peers.py: where another rank failed first, its
    line and code)."""
    line, code, prints = announce(line, code)
    if prints:
        print(line, file=sys.stderr)
    raise SystemExit(code) from None


def _rank0() -> bool:
    return os.environ.get("RANK", "0") == "0"


def _config_log(rank0: bool) -> None:
    """config/'s info lines (presets, a lowered micro-batch) on rank 0's stderr: the trainer's
    logging is set up only after the config has loaded."""
    logger = logging.getLogger("olmo_patches.config")
    if not logger.handlers:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(logging.INFO if rank0 else logging.WARNING)


class _StderrHandler(logging.StreamHandler):
    """A StreamHandler on whatever sys.stderr is when a record is emitted (not the one at creation:
    a redirected or replaced stderr, e.g. a script run in process, gets the lines)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _):
        pass
