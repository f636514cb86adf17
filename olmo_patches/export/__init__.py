"""Hugging Face export: OLMo-2-shaped baselines to Olmo2ForCausalLM, other blocks with their own
modeling code (trust_remote_code). See :mod:`olmo_patches.export.hf`."""

from .hf import export_hf

__all__ = ["export_hf"]
