"""hourglass-olmo: hourglass FFNs and variable-width transformers for OLMo-core.

Layers, each importing only those above it in this list (never below):
  resources.py                where configs/, data_order/, scripts/ are (the checkout or the wheel)
  shapes/                     pure shape arithmetic: the papers' closed-form counts, the hourglass
                              search, paper 2's widths
  nn/, optim/, data/, eval/   the papers' blocks; LR schedules; token data; evaluators
  config/                     YAML -> a typed, validated spec -> OLMo-core configs (pure: the same
                              spec everywhere)
  launch/                     what depends on the machine and the job: resolve, cards and memory,
                              run folders, peers, sweeps
  train/                      an experiment on OLMo-core's Trainer: wiring, resume, progress,
                              metrics; the benchmark
  report/, export/            counts, plans, tables, figures, the demo's comparison; Hugging Face
                              export
  cli.py                      command-line plumbing for scripts/
  commands.py, __main__.py    hourglass-* console commands, python -m olmo_patches COMMAND
"""

__version__ = "0.3.0"

import logging
import warnings

# OLMo-core warns at import when the optional Transformer Engine kernels are absent (always, on
# CPU).
logging.getLogger("olmo_core.nn.attention.te_attn_api").setLevel(logging.ERROR)
# Third-party import noise, kept off the terminal and out of --json output: torchao's probes of its
# optional compiled kernels (mxfp8, cutlass: recipes this project does not use), torch's deprecation
# of the Enum registration torchao makes at import, OLMo-core's note that the optional grouped_gemm
# package is absent (its MoE runs without it; report/advice.py's GPU lines say what a GPU run
# lacks).
logging.getLogger("torchao").setLevel(logging.ERROR)
logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
warnings.filterwarnings("ignore", message="Grouped GEMM not available", category=UserWarning)
