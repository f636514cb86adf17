"""hourglass-olmo: hourglass FFNs and variable-width transformers for OLMo-core."""

__version__ = "0.1.0"

import logging

# OLMo-core warns at import when the optional Transformer Engine kernels are absent (always, on CPU).
logging.getLogger("olmo_core.nn.attention.te_attn_api").setLevel(logging.ERROR)
