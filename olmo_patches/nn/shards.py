"""What FSDP2 holds on each rank, from the parameters' shapes alone (no process group): the per-rank
shares the dry run and the tests compare.

FSDP2 (torch 2.13, ``torch/distributed/fsdp/_fully_shard/_fsdp_param.py``) splits each parameter
along dim 0 with ``torch.chunk`` and pads every rank's piece to the first (the largest), so every
rank allocates ceil(n / ranks) rows of it, at any rank count. Every weight here is a matrix or a
vector: the hourglass FFN's K sub-MLPs are (K out, in) matrices (nn/hourglass.py), the hourglass
experts' (K E d_h, d_model) ones (nn/hourglass_moe.py).
"""

from __future__ import annotations

import math
from typing import Sequence

__all__ = ["padded_share"]


def padded_share(shape: Sequence[int], shards: int) -> int:
    """Elements every rank allocates for a parameter of ``shape`` (its padded piece of dim 0)."""
    n = math.prod(shape)
    if not n:
        return n
    return math.ceil(shape[0] / shards) * (n // shape[0])
