"""Which of OLMo-core's LM-head losses a run computes (``LMHeadConfig.loss_implementation``).

``default`` projects every token to its V logits and takes the cross-entropy in fp32: the logits,
their log-softmax and their gradients are the largest activation of a small model (launch/memory.py,
LOGIT_BYTES per logit). ``fused_linear`` is Liger-Kernel's fused linear cross-entropy (OLMo-core's
``nn.functional.fused_linear_cross_entropy_loss``, imported when ``liger_kernel`` is installed: the
``gpu`` extra): it projects a chunk of tokens at a time and computes the input's gradient in the
forward, so no (tokens, V) tensor lives to the backward. It is a Triton kernel (CUDA only). So a run
takes ``fused_linear`` on CUDA with the kernel importing, else ``default``. The fused loss returns
no logits, which OLMo-core's downstream evaluators need ("Downstream evaluators require full
logits"): :func:`logits_in_eval` has the head compute the default loss in eval mode (no backward
there, so nothing to save), the fused one in training.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from olmo_core.nn.lm_head import LMLossImplementation

# the module (olmo_core.nn.functional re-exports its function under the same name)
olmo_ce = importlib.import_module("olmo_core.nn.functional.cross_entropy_loss")

__all__ = ["LossChoice", "fused_linear_installed", "lm_loss", "logits_in_eval", "set_lm_loss"]


@dataclass(frozen=True)
class LossChoice:
    name: str  # an LMLossImplementation value
    reason: str

    def __str__(self) -> str:
        return f"{self.name} ({self.reason})"


def fused_linear_installed() -> bool:
    """OLMo-core imported Liger-Kernel's fused linear cross-entropy (its module-level
    try/except)."""
    return getattr(olmo_ce, "_fused_linear_cross_entropy_loss", None) is not None


def lm_loss(spec, device: str) -> LossChoice:
    """The loss ``spec`` computes on ``device`` (cpu | cuda): see the module."""
    if device != "cuda":
        return LossChoice("default", "fused linear cross-entropy is a CUDA kernel")
    if not fused_linear_installed():
        why = "liger-kernel does not import (pip install 'hourglass-olmo[liger]')"
        return LossChoice("default", why)
    return LossChoice(
        "fused_linear", "Liger-Kernel's fused linear cross-entropy: no (tokens, V) logits"
    )


def set_lm_loss(config, name: str) -> None:
    """Set the LM head's loss on an OLMo-core TransformerConfig (this package's included)."""
    config.lm_head.loss_implementation = LMLossImplementation(name)


def logits_in_eval(model) -> None:
    """On a built model whose head computes the fused loss: the default loss (with logits) while the
    model is in eval mode (OLMo-core's evaluators; ``model.eval()``), the fused one while it
    trains."""
    head = model.lm_head
    fused = head.loss_implementation
    if fused != LMLossImplementation.fused_linear:
        return

    def by_mode(module, args):
        module._loss_implementation = fused if module.training else LMLossImplementation.default

    head.register_forward_pre_hook(by_mode)
