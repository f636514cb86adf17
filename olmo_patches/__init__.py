"""hourglass-olmo: hourglass FFNs and variable-width transformers for OLMo-core."""

__version__ = "0.1.0"
