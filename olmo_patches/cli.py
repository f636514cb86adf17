"""Shared command-line plumbing: one-line config errors, quiet imports."""

from __future__ import annotations

import sys
from typing import List, Optional

from rich.console import Console

from .config import ConfigError, ExperimentSpec, load_spec

__all__ = ["console", "load_or_exit"]


def console() -> Console:
    """A rich console; wide when writing to a file or pipe, where rich would assume 80 columns."""
    return Console(width=None if Console().is_terminal else 160)


def load_or_exit(path: str, overrides: Optional[List[str]] = None) -> ExperimentSpec:
    """Load a config; on a bad one print one line naming file, key and value and exit 2."""
    try:
        return load_spec(path, overrides)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
