"""Hugging Face export: OLMo-2-shaped baselines to Olmo2ForCausalLM, other blocks with their own
modeling code (trust_remote_code). Imports config, nn and train.checkpoints;
modeling_hourglass_olmo.py imports only torch and transformers (it ships in the exported folder)."""

from .hf import export_hf

__all__ = ["export_hf"]
