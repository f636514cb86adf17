"""YAML (omegaconf, ``extends:``, key=value overrides) -> a typed, validated spec -> OLMo-core configs.

- ``spec``: the dataclasses (every key a config may set, each with its one-line comment) and
  ``ModelSpec.build()`` -> OLMo-core's ``TransformerConfig``
- ``load``: the ``extends`` chain and the overrides merged into a spec
- ``validate``: shape, recipe and domain checks (one line naming the file, key and value)
- ``layout``: the ranks a run has, and what follows from them and the device (per-rank batch,
  hardware preset, attention backend, loader workers)
"""

from .layout import CUDA_WORKERS, Layout, apply_hardware, attention_backend, data_workers, fit_world_size, memory_estimate
from .load import coerce_shorthands, load_spec, spec_to_yaml
from .spec import (
    BLOCKS,
    ConfigError,
    DataSpec,
    EvalSpec,
    ExperimentSpec,
    ModelSpec,
    MoESpec,
    PowerSpec,
    RoPEScalingSpec,
    RunSpec,
    TrainSpec,
    WidthSpec,
    tokenizer_config,
    vocab_size,
)
from .validate import validate, validate_evals

__all__ = [
    "BLOCKS",
    "CUDA_WORKERS",
    "ConfigError",
    "DataSpec",
    "EvalSpec",
    "ExperimentSpec",
    "Layout",
    "ModelSpec",
    "MoESpec",
    "PowerSpec",
    "RoPEScalingSpec",
    "RunSpec",
    "TrainSpec",
    "WidthSpec",
    "apply_hardware",
    "attention_backend",
    "coerce_shorthands",
    "data_workers",
    "fit_world_size",
    "load_spec",
    "memory_estimate",
    "spec_to_yaml",
    "tokenizer_config",
    "validate",
    "validate_evals",
    "vocab_size",
]
