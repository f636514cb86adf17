"""Shared command-line plumbing for scripts/: one-line config errors, the console."""

from __future__ import annotations

import sys
from typing import List, Optional

from .config import ConfigError, ExperimentSpec, load_spec
from .report.console import console

__all__ = ["console", "load_or_exit"]


def load_or_exit(path: str, overrides: Optional[List[str]] = None) -> ExperimentSpec:
    """Load a config; on a bad one print one line naming file, key and value and exit 2."""
    try:
        return load_spec(path, overrides)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
