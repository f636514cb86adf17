"""The rich console every report prints to."""

from rich.console import Console


def console() -> Console:
    """A rich console; wide when writing to a file or pipe, where rich would assume 80 columns."""
    return Console(width=None if Console().is_terminal else 160)
