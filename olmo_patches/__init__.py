"""hourglass-olmo: hourglass FFNs and variable-width transformers for OLMo-core.

Layers, each importing only those above it in this list (never below):
  nn/, optim/, data/, eval/, hardware.py
                                   the papers' blocks; LR schedules; token data; evaluators; GPU cards
  config/                          YAML -> typed spec -> OLMo-core configs, validated at load
  train/                           an experiment on OLMo-core's Trainer: wiring, resume, progress, metrics
  report/, export/                 counts, plans, tables, figures, benchmarks, the demo; Hugging Face export
  cli.py                           command-line plumbing for scripts/
"""

__version__ = "0.2.0"

import importlib
import importlib.abc
import importlib.util
import logging
import sys
import warnings

# OLMo-core warns at import when the optional Transformer Engine kernels are absent (always, on CPU).
logging.getLogger("olmo_core.nn.attention.te_attn_api").setLevel(logging.ERROR)
# Third-party import noise, kept off the terminal and out of --json output: torchao's probes of its
# optional compiled kernels (mxfp8, cutlass: recipes this project does not use), torch's deprecation of
# the Enum registration torchao makes at import, OLMo-core's note that the optional grouped_gemm
# package is absent (its MoE runs without it; report/advice.py's GPU lines say what a GPU run lacks).
logging.getLogger("torchao").setLevel(logging.ERROR)
logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
warnings.filterwarnings("ignore", message="Grouped GEMM not available", category=UserWarning)

# Modules of 0.1 (one flat folder) -> their place now. Configs that OLMo-core saved before the move
# name classes by the old paths (`_CLASS_: olmo_patches.blocks.HourglassBlockConfig` in a
# checkpoint's config.json); importing an old path gives the new module's names.
MOVED = {
    "olmo_patches.hourglass": "olmo_patches.nn.hourglass",
    "olmo_patches.blocks": "olmo_patches.nn.hourglass_block",
    "olmo_patches.variable_width": "olmo_patches.nn.variable_width",
    "olmo_patches.shapes": "olmo_patches.nn.accounting",
    "olmo_patches.search": "olmo_patches.nn.search",
    "olmo_patches.evals": "olmo_patches.eval.evaluators",
    "olmo_patches.resume": "olmo_patches.train.resume",
    "olmo_patches.progress": "olmo_patches.train.progress",
    "olmo_patches.metrics": "olmo_patches.train.metrics",
    "olmo_patches.batch_trace": "olmo_patches.train.batch_trace",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def exec_module(self, module):
        new = importlib.import_module(MOVED[module.__name__])
        module.__dict__.update({k: v for k, v in vars(new).items() if not k.startswith("__")})


sys.meta_path.append(_MovedModules())
