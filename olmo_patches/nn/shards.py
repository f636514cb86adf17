"""What FSDP2 holds on each rank, from the parameters' shapes alone (no process group): the check a
launch runs before anything starts, and the per-rank shares the dry run and the tests compare.

FSDP2 (torch 2.13, ``torch/distributed/fsdp/_fully_shard/_fsdp_param.py``) splits each parameter
along one dimension with ``torch.chunk`` and pads every rank's piece to the first (the largest), so
every rank allocates ceil(n / ranks) slices of it; only dim 0 may be split unevenly. Matrices and
vectors split on dim 0; the hourglass experts' K-stacked (K, rows, cols) weights on the dimension
:func:`~.hourglass.stacked_placement` picks (the dense hourglass FFN stores (K out, in) matrices).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import torch.nn as nn

from .hourglass import stacked_placement

__all__ = ["shard_dim", "padded_share", "unshardable"]


def shard_dim(shape: Sequence[int], shards: int) -> Optional[int]:
    """The dimension FSDP2 splits a parameter of ``shape`` along over ``shards`` ranks; None: none can."""
    if len(shape) == 3:
        p = stacked_placement(shape, shards)
        return None if p is None else p.dim
    return 0


def padded_share(shape: Sequence[int], shards: int) -> int:
    """Elements every rank allocates for a parameter of ``shape`` (its padded piece)."""
    dim = shard_dim(shape, shards)
    n = math.prod(shape)
    if dim is None or not n:
        return n
    return math.ceil(shape[dim] / shards) * (n // shape[dim])


def unshardable(model: nn.Module, shards: int) -> Optional[Tuple[str, Tuple[int, ...]]]:
    """The first parameter of ``model`` (built on any device, "meta" too) FSDP2 cannot split over
    ``shards`` ranks, with its shape; None when every one can."""
    if shards <= 1:
        return None
    for name, p in model.named_parameters():
        if shard_dim(tuple(p.shape), shards) is None:
            return name, tuple(p.shape)
    return None
