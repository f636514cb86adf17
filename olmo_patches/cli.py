"""Shared command-line plumbing for scripts/: one-line config and argument errors, the console."""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, List, NoReturn, Optional

from .config import ConfigError, ExperimentSpec, load_spec
from .config.load import where_set
from .launch.layout import Layout, check_writable, resolve, unwritable
from .report.console import console
from .resources import find_config

__all__ = [
    "console",
    "load_or_exit",
    "refuse",
    "refuse_alike",
    "ArgumentParser",
    "at_least",
    "count",
    "fraction",
    "folder_arg",
    "out_arg",
    "DEVICES",
    "device_name",
    "check_device",
]


def load_or_exit(
    path: str,
    overrides: Optional[List[str]] = None,
    layout: Optional[Layout] = None,
    data: bool = False,
) -> ExperimentSpec:
    """Load a config and resolve it for ``layout``'s ranks (default: torchrun's) on this machine; on
    a bad one print one line naming file, key and value and exit 2. The config is read and checked
    before torch is imported (a refusal takes about a second); what depends on the machine after. A
    relative path missing from the working folder is looked up among the package's configs
    (``configs/demo/baseline.yaml`` from anywhere). ``data``: a script that runs (and so reads the
    run's data and writes its folders) also checks its data files (launch/data_files.py), before
    torch, on the first rank of each node, and its folders once resolved: each node prints its line
    and ends on its own (where rank 0 alone refused before the rendezvous, the other nodes'
    torchrun lost its store and printed a traceback, no line)."""
    _config_log(os.environ.get("RANK", "0") == "0")
    try:
        spec = load_spec(find_config(path), overrides)
    except ConfigError as e:
        refuse_alike(f"config error: {e}")
    if data and os.environ.get("LOCAL_RANK", "0") == "0":  # the node's other ranks: ended with it
        from .launch.data_files import check_data_files  # numpy and the standard library

        try:
            check_data_files(spec)  # token ids, URLs, the tokenizer file
        except ConfigError as e:
            refuse_alike(f"config error: {e}")
    try:
        resolve(spec, layout)
        if data:  # a run: the folders it writes in (a count or a plan writes nothing)
            check_writable(spec, where_set(spec))
        return spec
    except ConfigError as e:
        refuse(f"config error: {e}")


def refuse_alike(line: str) -> NoReturn:
    """Exit 2 after one line on stderr, once a node: a refusal every rank makes alike (a bad config
    or argument is the same on every rank), before torch is imported or a process group exists."""
    if os.environ.get("LOCAL_RANK", "0") == "0":
        print(line, file=sys.stderr)
    raise SystemExit(2) from None


def refuse(line: str, code: int = 2) -> NoReturn:
    """Exit with ``code`` after one line on stderr, once a node however many ranks refuse; the other
    ranks of the launch exit with the same code (peers.py: where another rank failed first, its
    line and code). One process alone has no peers: torch is not imported for them."""
    if os.environ.get("WORLD_SIZE", "1") == "1":  # peers.announce's own answer, without its import
        print(line, file=sys.stderr)
        raise SystemExit(code) from None
    from .launch.peers import announce

    line, code, prints = announce(line, code)
    if prints:
        print(line, file=sys.stderr)
    raise SystemExit(code) from None


def _config_log(rank0: bool) -> None:
    """config/'s info lines (presets, a lowered micro-batch) on rank 0's stderr: the trainer's
    logging is set up only after the config has loaded."""
    logger = logging.getLogger("olmo_patches.launch")
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


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors are one line (``PROG: error: ...``, exit 2) instead of
    the usage block and the error; ``--help`` still prints the usage. A negative number in exponent
    form (``-5e6``) is a value, as ``-5`` and ``-0.5`` are to argparse, not an unknown option."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(
            r"^-\d+$|^-\d*\.\d+$|^-(\d+\.?\d*|\.\d+)[eE][-+]?\d+$"
        )

    def error(self, message: str) -> NoReturn:
        refuse_alike(f"{self.prog}: error: {' '.join(message.split())} (--help for usage)")


MAX_NUMBER = 2**53  # no argument is larger: the largest integer a float holds exactly


def at_least(low: float, kind: type = int, most: float = MAX_NUMBER) -> Callable[[str], Any]:
    """An argparse ``type``: a finite number of ``kind`` in ``[low, most]``, e.g.
    ``type=at_least(1)``, ``type=at_least(0, float, most=1)``."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not {'an integer' if kind is int else 'a number'}"
            ) from None
        if not low <= value:  # NaN fails too
            raise argparse.ArgumentTypeError(f"must be >= {low:g}, got {text}")
        if not value <= most:  # infinity too
            raise argparse.ArgumentTypeError(f"must be at most {most:g}, got {text}")
        return value

    return parse


def fraction(text: str) -> float:
    """An argparse ``type``: a number in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= 1:  # NaN fails too
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def count(text: str) -> float:
    """An argparse ``type``: a count, plain or with one suffix K, M or B (45M, 45e6, 45000000 ->
    45e6), in (0, 2^53]."""
    scale = {"K": 1e3, "M": 1e6, "B": 1e9}.get(text[-1:].upper())
    try:
        value = float(text[:-1] if scale else text) * (scale or 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count (45000000, 45e6, 45M)") from None
    if not 0 < value <= 2**53:  # NaN and infinity too
        raise argparse.ArgumentTypeError(f"must be in (0, 2^53], got {text}")
    return value


DEVICES = "cpu, cuda, cuda:N, mps"  # the devices a script that loads a model accepts (--device)


def device_name(text: str) -> str:
    """An argparse ``type``: a device name from :data:`DEVICES`, checked by name only (no torch)."""
    if not re.fullmatch(r"cpu|cuda(:\d+)?|mps", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device here (one of {DEVICES})")
    return text


def check_device(name: str, device: str) -> None:
    """One line naming the argument (exit 2) when ``device`` is not on this machine; imports torch.
    (:func:`device_name` has checked the name.)"""
    import torch

    kind, _, index = device.partition(":")
    if kind == "cuda" and not torch.cuda.is_available():
        refuse_alike(f"{name} {device}: CUDA is not available on this machine")
    if kind == "cuda" and index and int(index) >= torch.cuda.device_count():
        refuse_alike(
            f"{name} {device}: this machine has {torch.cuda.device_count()} CUDA device(s)"
        )
    if kind == "mps" and not torch.backends.mps.is_available():
        refuse_alike(f"{name} {device}: MPS is not available on this machine")


def out_arg(name: str, path: str | Path, folder: bool = True) -> Path:
    """``path`` as a folder (``folder``) or a file to write, before any work: one line naming the
    argument (exit 2) if it is the other kind or lies under a file."""
    if why := unwritable(Path(path), folder):
        refuse_alike(f"{name} {path}: {why}")
    return Path(path)


def folder_arg(name: str, path: str) -> Path:
    """``path`` as an existing folder, else one line naming the argument (exit 2)."""
    p = Path(path)
    if not p.is_dir():
        refuse(f"{name} {path}: {'a file, not a folder' if p.exists() else 'no such folder'}")
    return p
