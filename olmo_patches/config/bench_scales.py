"""The scales scripts/bench.py times (olmo_patches/train/bench.py): each a set of parameter-matched
variants and the step shape. Known without torch, so that a bad ``--scale`` is refused at once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

__all__ = ["Scale", "SCALES"]


@dataclass(frozen=True)
class Scale:
    """A set of parameter-matched variants (variant name -> config) and the step shape to time."""

    configs: Dict[str, str]  # the first entry is the baseline
    seq_len: int
    batch: int


SCALES: Dict[str, Scale] = {
    # CPU demo: configs/demo, at their own training shape (16 x 128 tokens).
    "demo": Scale(
        {
            "baseline": "configs/demo/baseline.yaml",
            "hourglass": "configs/demo/hourglass.yaml",
            "variable_width": "configs/demo/variable-width.yaml",
        },
        seq_len=128,
        batch=16,
    ),
    # 113M shapes; short sequences so that a CPU step takes seconds (a GPU run passes --seq 4096).
    # The hourglass is the paper's controlled K=8, d_h=384 at the baseline's d_model and L, so that
    # the two differ only in the FFN's shape; hg_exact is the headline shape matched within 0.001%
    # (d_h 621, head dim 72), hg_aligned its sibling within 0.3% (d_h 576, head dim 48): what exact
    # matching costs.
    "113M": Scale(
        {
            "baseline": "configs/113M/baseline.yaml",
            "hourglass": "configs/113M/hourglass-K8-dh384.yaml",
            "variable_width": "configs/113M/variable-width.yaml",
            "hg_exact": "configs/113M/hourglass-exact.yaml",
            "hg_aligned": "configs/113M/hourglass-aligned.yaml",
        },
        seq_len=128,
        batch=1,
    ),
    "1B": Scale(
        {
            "baseline": "configs/1B/baseline.yaml",
            "hourglass": "configs/1B/hourglass.yaml",
            "variable_width": "configs/1B/variable-width.yaml",
        },
        seq_len=4096,
        batch=4,
    ),
}
