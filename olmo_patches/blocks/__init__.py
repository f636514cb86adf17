"""Block kinds: one module per transformer shape, and the registry every other part reads
(base.py). The papers' kinds register themselves here; a kind of your own registers itself when its
module is imported: name the module in ``HOURGLASS_BLOCKS`` (comma-separated import paths), and
every command, every torchrun rank and every resume imports it before reading a config
(docs/adding_a_block.md). A module that is not there ends the command in one line, exit 2."""

import importlib
import os
import sys

from . import baseline, hourglass, variable_width  # noqa: F401  (each registers its kind)
from .base import WIDTH, BLOCKS, BlockKind, ModelSpec, block_of, get_block, model_spec, register

__all__ = ["BLOCKS", "BlockKind", "ModelSpec", "WIDTH", "block_of", "get_block", "model_spec"]
__all__ += ["register"]

for _module in filter(None, (m.strip() for m in os.environ.get("HOURGLASS_BLOCKS", "").split(","))):
    try:
        importlib.import_module(_module)
    except ModuleNotFoundError as e:
        if e.name is None or not (_module + ".").startswith(e.name + "."):
            raise  # a module the kind's own file imports: its traceback says which
        if os.environ.get("LOCAL_RANK", "0") == "0":  # once a node under torchrun
            print(
                f"config error: HOURGLASS_BLOCKS: no module {_module!r} to import (the import "
                "paths of your kinds' modules, comma-separated)",
                file=sys.stderr,
            )
        raise SystemExit(2) from None
