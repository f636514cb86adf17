"""Float8 training for every shape: OLMo-core's ``Float8Config`` (torchao's ``Float8Linear``), which
also converts the hourglass's K-stacked sub-MLP weights, and runs torchao's emulation where the
hardware has no float8 matmuls.

torchao converts ``nn.Linear`` modules: attention (every head_dim and GQA shape), the baseline FFN,
each variable-width layer at its own width, the learned resizes. A matmul module that is not an
``nn.Linear`` converts itself: it has ``to_float8(config)`` (a torchao ``Float8LinearConfig``) and
``matmul_shape``, each of its matmuls' (out, in), so a block of its own needs no change here. The
hourglass FFN keeps its K sub-MLPs stacked (nn/hourglass.py's ``StackedLinear``, one (K out, in)
weight per w1/w3/w2): converted, each step casts each stack once (tensorwise: one scale for its K
maps) and runs each sub-MLP's matmul through torchao's own float8 matmul
(``matmul_with_hp_or_float8_args``, what ``Float8Linear.forward`` calls). The LM head (OLMo-core
ignores ``lm_head.w_out``), embeddings and MoE router are not linears here and stay in high
precision.

Which matmuls convert (:func:`float8_matmuls`), each from its sizes: a dim not a multiple of 16
(float8 GEMMs need them) never; on float8 hardware also not one below torchao's own size filter
(``_auto_filter_for_recipe``, its H100 measurements: the floor) nor one whose casts cost more than
its GEMMs save at the run's micro-batch on the run's card (shapes/roofline.py ``float8_gain``). An
emulated run (CPU, GPUs before SM89) converts every aligned matmul: it tests float8's numerics, not
its speed. The dry run and count_params show the choice.
"""

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Set, Tuple

import torch
import torch.nn as nn
from olmo_core.float8 import AOFloat8LinearConfig, Float8Config

from ..shapes.roofline import Roof, float8_gain

if TYPE_CHECKING:
    from torchao.float8 import Float8LinearConfig

__all__ = [
    "ShapeFloat8Config",
    "converts_itself",
    "float8_choice",
    "float8_matmuls",
    "has_float8_matmuls",
]

log = logging.getLogger(__name__)

LM_HEAD = "lm_head.w_out"  # OLMo-core's Transformer.apply_fp8 keeps it in high precision


def has_float8_matmuls(device: torch.device) -> bool:
    """Whether ``device`` has float8 tensor cores (SM89 and later); elsewhere torchao emulates."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def converts_itself(m: nn.Module) -> bool:
    """A matmul module that is not an ``nn.Linear`` (the module docstring's ``to_float8``)."""
    return callable(getattr(m, "to_float8", None))


def _torchao_floor(recipe: str) -> Callable[[int, int], bool]:
    """torchao's own small-layer filter for ``recipe`` as a test of (out, in); rowwise_with_gw_hp,
    which it does not cover, at rowwise's sizes."""
    from torchao.float8.float8_linear_utils import _auto_filter_for_recipe

    keep = _auto_filter_for_recipe("tensorwise" if recipe == "tensorwise" else "rowwise", [])
    return lambda n, k: keep(nn.Linear(k, n, bias=False, device="meta"), "")


def float8_choice(
    shape: Tuple[int, int], tokens: Optional[int], recipe: str, roof: Optional[Roof]
) -> str:
    """'float8' for a matmul of weight ``shape`` (out, in), else why not: "unaligned", or "small"
    (below torchao's floor, or float8_gain <= 0 at ``tokens`` on ``roof``). Without ``roof`` (an
    emulated run) every aligned matmul converts."""
    n, k = shape
    if n % 16 or k % 16:
        return "unaligned"
    if roof is None:
        return "float8"
    if not _torchao_floor(recipe)(n, k) or (tokens and float8_gain(tokens, n, k, roof) <= 0):
        return "small"
    return "float8"


def float8_matmuls(
    model: nn.Module,
    tokens: Optional[int] = None,
    recipe: str = "tensorwise",
    roof: Optional[Roof] = None,
) -> Dict[str, List[str]]:
    """The model's matmul modules (nn.Linear and those that convert themselves, not the LM head) by
    :func:`float8_choice`: {'float8': names, 'unaligned': names, 'small': names}."""
    out: Dict[str, List[str]] = {"float8": [], "unaligned": [], "small": []}
    for name, m in model.named_modules():
        if name == LM_HEAD or not (isinstance(m, nn.Linear) or converts_itself(m)):
            continue
        shape = m.matmul_shape if converts_itself(m) else tuple(m.weight.shape)
        out[float8_choice(shape, tokens, recipe, roof)].append(name)
    return out


@dataclass
class ShapeFloat8Config(Float8Config):
    """OLMo-core's :class:`Float8Config` (a torchao recipe or ``ao`` config), also converting the
    matmul modules that convert themselves (the hourglass's StackedLinear); applied by OLMo-core's
    train module before compile, activation checkpointing and FSDP."""

    emulate: bool = (
        False  # torchao's emulation: float8 rounding, high-precision GEMMs (CPU, pre-SM89 GPUs)
    )
    tokens: Optional[int] = None  # a micro-batch's tokens: the GEMMs' M for the size filter
    roof: Optional[Roof] = None  # the card's roofline (None: no size filter)

    @property
    def recipe(self) -> str:
        return self.ao_recipe.value if self.ao_recipe is not None else "tensorwise"

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

        ignore = set(modules_to_ignore or ())
        ignore |= set(self.modules_to_ignore or ())
        roof = None if self.emulate else self.roof
        matmuls = float8_matmuls(model, self.tokens, self.recipe, roof)
        convertible = set(matmuls["float8"]) - ignore
        kept = len(matmuls["unaligned"]) + len(matmuls["small"])
        if kept:
            log.info(
                f"float8: {len(convertible)} matmul modules in float8, {kept} kept in high "
                f"precision ({len(matmuls['unaligned'])} with a dim not a multiple of 16, "
                f"{len(matmuls['small'])} where float8 would lose at {self.tokens} tokens)"
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
