"""Float8 training for every shape: OLMo-core's ``Float8Config`` (torchao's ``Float8Linear``), which
also converts the hourglass's K-stacked sub-MLP weights, and runs torchao's emulation where the
hardware has no float8 matmuls.

torchao converts ``nn.Linear`` modules: attention (every head_dim and GQA shape), the baseline FFN,
each variable-width layer at its own width, the learned resizes. A matmul module that is not an
``nn.Linear`` converts itself: it has ``to_float8(config)`` (a torchao ``Float8LinearConfig``) and
``matmul_shape``, each of its matmuls' (out, in), so a block of its own needs no change here. The
hourglass FFN keeps its K sub-MLPs stacked (nn/hourglass.py's ``StackedLinear``, one (K out, in)
weight per w1/w3/w2), and converting it runs each sub-MLP's matmul through torchao's own float8
matmul (``matmul_with_hp_or_float8_args``, what ``Float8Linear.forward`` calls), with its own
scales. The LM head (OLMo-core ignores ``lm_head.w_out``), embeddings and MoE router are not
linears here and stay in high precision. A matmul whose dims are not multiples of 16 (float8 GEMMs
need them) stays in high precision, as OLMo-core's own filter does, and is counted by
:func:`float8_matmuls`.
"""

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Dict, List, Optional, Set

import torch
import torch.nn as nn
from olmo_core.float8 import AOFloat8LinearConfig, Float8Config

if TYPE_CHECKING:
    from torchao.float8 import Float8LinearConfig

__all__ = [
    "RECIPES",
    "ShapeFloat8Config",
    "converts_itself",
    "float8_matmuls",
    "has_float8_matmuls",
]

log = logging.getLogger(__name__)

# torchao's recipes (OLMo-core's AOFloat8LinearRecipe)
RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
LM_HEAD = "lm_head.w_out"  # OLMo-core's Transformer.apply_fp8 keeps it in high precision


def has_float8_matmuls(device: torch.device) -> bool:
    """Whether ``device`` has float8 tensor cores (SM89 and later); elsewhere torchao emulates."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def converts_itself(m: nn.Module) -> bool:
    """A matmul module that is not an ``nn.Linear`` (the module docstring's ``to_float8``)."""
    return callable(getattr(m, "to_float8", None))


def _aligned(m: nn.Module) -> bool:
    shape = m.matmul_shape if converts_itself(m) else m.weight.shape  # each matmul's (out, in)
    return all(d % 16 == 0 for d in shape[-2:])


def float8_matmuls(model: nn.Module) -> Dict[str, List[str]]:
    """The model's matmul modules (nn.Linear and those that convert themselves, not the LM head) by
    what float8 does with them: {'float8': names converted (or convertible), 'skipped': names left
    in high precision because a dim is not a multiple of 16}."""
    out: Dict[str, List[str]] = {"float8": [], "skipped": []}
    for name, m in model.named_modules():
        if name == LM_HEAD or not (isinstance(m, nn.Linear) or converts_itself(m)):
            continue
        out["float8" if _aligned(m) else "skipped"].append(name)
    return out


@dataclass
class ShapeFloat8Config(Float8Config):
    """OLMo-core's :class:`Float8Config` (a torchao recipe or ``ao`` config), also converting the
    matmul modules that convert themselves (the hourglass's StackedLinear); applied by OLMo-core's
    train module before compile, activation checkpointing and FSDP."""

    emulate: bool = (
        False  # torchao's emulation: float8 rounding, high-precision GEMMs (CPU, pre-SM89 GPUs)
    )

    def linear_config(self) -> "Float8LinearConfig":
        from torchao.float8 import Float8LinearConfig

        if self.ao_recipe is not None:
            config = Float8LinearConfig.from_recipe_name(self.ao_recipe.to_ao_type())
        else:
            config = (self.ao if self.ao is not None else AOFloat8LinearConfig()).to_ao_type()
        return replace(config, emulate=True) if self.emulate else config

    def apply_float8_linear(
        self, model: nn.Module, *, modules_to_ignore: Optional[Set[str]] = None
    ):
        if not self.enabled:
            return
        if self.ao_mx is not None:  # MX formats (SM100): OLMo-core's own path, nn.Linear only
            raise ValueError(
                "train.float8: MX formats are not wired for the hourglass's stacked weights"
            )
        from torchao.float8 import convert_to_float8_training

        ignore = set(modules_to_ignore or ()) | set(self.modules_to_ignore or ())
        matmuls = float8_matmuls(model)
        convertible = set(matmuls["float8"]) - ignore
        if matmuls["skipped"]:
            log.warning(
                f"float8: {len(matmuls['skipped'])} of"
                f" {len(matmuls['skipped']) + len(matmuls['float8'])} matmul modules "
                f"stay in high precision (a dim not a multiple of 16), e.g. {matmuls['skipped'][0]}"
            )
        config = self.linear_config()
        frozen = {
            n for n, p in model.named_parameters() if not p.requires_grad
        }  # torchao#1871, as OLMo-core
        convert_to_float8_training(
            model,
            config=config,
            module_filter_fn=lambda m, fqn: isinstance(m, nn.Linear) and fqn in convertible,
        )
        for name, m in model.named_modules():
            if converts_itself(m) and name in convertible:
                m.to_float8(config)
        for n in frozen:
            model.get_parameter(n).requires_grad = False
