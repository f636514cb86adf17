"""YAML (omegaconf, ``extends:``, key=value overrides) -> a typed, validated spec -> OLMo-core
configs.

- ``spec``: the dataclasses (every key a config may set, each with its one-line comment and its
  check beside it: one line naming the file, key and value; the model's keys and
  ``ModelSpec.build()`` -> OLMo-core's ``TransformerConfig`` are olmo_patches/blocks/)
- ``load``: the ``extends`` chain and the overrides merged into a spec
"""

from .load import coerce_shorthands, load_spec, spec_to_yaml
from .spec import ConfigError, ExperimentSpec, tokenizer_config, vocab_size

__all__ = [
    "ConfigError",
    "ExperimentSpec",
    "coerce_shorthands",
    "load_spec",
    "spec_to_yaml",
    "tokenizer_config",
    "vocab_size",
]
