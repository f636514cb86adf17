"""The shape choices a config names and a module builds, defined once and without torch (a config
loads without it; nn/ builds with them)."""

from enum import Enum

__all__ = ["NormPlacement", "ResizeMode", "StrEnum"]


class StrEnum(str, Enum):
    """A choice that is its string (as OLMo-core's StrEnum, which imports torch)."""

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return repr(self.value)


class NormPlacement(StrEnum):
    pre = "pre"  # x + f(norm(x)): the papers' equations (Llama-style pre-norm)
    post = "post"  # x + norm(f(x)): OLMo-2's reordered norm


class ResizeMode(StrEnum):
    carry_forward = "carry_forward"  # untouched dims keep the last value written (authors' move_up)
    zero = "zero"  # a widening layer reads zeros in its new dims
    learned = "learned"  # a learned projection when widening (the ablation)
