"""YAML (omegaconf, ``extends:``, key=value overrides) -> a typed, validated spec -> OLMo-core
configs.

- ``spec``: the dataclasses (every key a config may set, each with its one-line comment; the
  model's keys and ``ModelSpec.build()`` -> OLMo-core's ``TransformerConfig`` are
  olmo_patches/blocks/)
- ``load``: the ``extends`` chain and the overrides merged into a spec
- ``validate``: shape, recipe and domain checks by section (each section's ``validate()`` runs its
  own, ``ExperimentSpec.validate()`` all of them): one line naming the file, key and value
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
