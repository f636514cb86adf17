"""Block kinds: one module per transformer shape, and the registry every other part reads
(base.py). The papers' kinds register themselves here; a kind of your own registers itself when its
module is imported: name the module in ``HOURGLASS_BLOCKS`` (comma-separated import paths), and
every command, every torchrun rank and every resume imports it before reading a config
(docs/adding_a_block.md)."""

import importlib
import os

from . import baseline, hourglass, variable_width  # noqa: F401  (each registers its kind)
from .base import BLOCKS, BlockKind, block_of, get_block, model_spec, register

__all__ = ["BLOCKS", "BlockKind", "block_of", "get_block", "model_spec", "register"]

for _module in filter(None, (m.strip() for m in os.environ.get("HOURGLASS_BLOCKS", "").split(","))):
    importlib.import_module(_module)
