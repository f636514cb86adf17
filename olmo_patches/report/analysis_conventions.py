"""The per-layer analyses' conventions where the definitions in use differ (analysis.py's docstring
gives the reasons for the defaults), without torch: a command line parses them before torch is
imported."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["THRESHOLD", "POOLINGS", "NORMALISERS", "Conventions"]

THRESHOLD = 0.01  # a unit is active on a token when |a| > 1% of its layer's RMS activation


@dataclass(frozen=True)
class Conventions:
    """The analyses' choices where the definitions in use differ (analysis.py's docstring: why)."""

    centre: bool = True  # Gram of the column-centred stream (its covariance) | False: as it is
    pooling: str = "pooled"  # pooled: one matrix of all tokens | per_prompt: one per sequence
    normaliser: str = "layer"  # layer: ln min(N - 1, w_l) | fixed: ln h (the model's d_model)

    def __post_init__(self):
        if self.pooling not in POOLINGS or self.normaliser not in NORMALISERS:
            raise ValueError(
                f"pooling={self.pooling} (one of {POOLINGS}), normaliser={self.normaliser} (one of "
                f"{NORMALISERS})"
            )


POOLINGS = ("pooled", "per_prompt")
NORMALISERS = ("layer", "fixed")
