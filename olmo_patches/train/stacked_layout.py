"""Checkpoints with the hourglass's earlier stacked layout resume into the (K out, in) one.

The hourglass FFN's stacked weights were (K, out, in) tensors and the hourglass experts' (K, E d_h,
d_model) ones; they are now (K out, in) and (K E d_h, d_model) matrices (nn/hourglass.py,
nn/hourglass_moe.py), the same elements in the same order under the same names. torch's distributed
checkpoint refuses a tensor whose saved size differs from the model's (``default_planner.py``: "Size
mismatch"), so a run resumed from such a checkpoint reads each of those tensors (the weights and
their AdamW moments) whole on every rank, in the saved size, and hands the train module each rank's
rows of the (K out, in) matrix. Every other tensor loads as OLMo-core loads it, resharded by DCP to
the run's world size and data parallelism.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import torch
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.tensor import DTensor

__all__ = ["load_earlier_stacked_layout"]


def _folded(
    metadata: Metadata,
    state: Dict[str, Any],
    prefix: str,
    out: List[Tuple[Dict[str, Any], str, Any]],
) -> None:
    """Swap each tensor saved as (K, out, in) and wanted as (K out, in) for a whole tensor of the
    saved size."""
    for key, value in list(state.items()):
        fqn = f"{prefix}{key}"
        if isinstance(value, dict):
            _folded(metadata, value, f"{fqn}.", out)
            continue
        saved = metadata.state_dict_metadata.get(fqn)
        if not (isinstance(value, torch.Tensor) and isinstance(saved, TensorStorageMetadata)):
            continue
        if len(saved.size) == 3 and value.ndim == 2 and saved.size.numel() == value.numel():
            # read whole (replicated)
            state[key] = torch.empty(saved.size, dtype=saved.properties.dtype or value.dtype)
            out.append((state, key, value))


def _rows_of(whole: torch.Tensor, target: Any) -> Any:
    """``whole`` (K, out, in) as ``target``: (K out, in), this rank's part of it when ``target`` is
    a DTensor."""
    flat = whole.reshape(target.shape)
    if not isinstance(target, DTensor):
        return flat.to(target.device, target.dtype)
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(
        target.shape, target.device_mesh, target.placements
    )
    local = flat[tuple(slice(o, o + n) for o, n in zip(offset, shape))]
    return DTensor.from_local(
        local.to(target.to_local().device, target.dtype).contiguous(),
        target.device_mesh,
        target.placements,
        run_check=False,
        shape=target.shape,
        stride=target.stride(),
    )


def load_earlier_stacked_layout(train_module) -> None:
    """Let ``train_module`` (OLMo-core's, for its Checkpointer) load checkpoints that hold stacked
    weights as (K, out, in): its ``state_dict_to_load`` and ``load_state_dict`` wrapped on the
    instance."""
    to_load, load = train_module.state_dict_to_load, train_module.load_state_dict
    pending: List[Tuple[Dict[str, Any], str, Any]] = []

    def state_dict_to_load(metadata: Metadata, **kwargs) -> Dict[str, Any]:
        state = to_load(metadata, **kwargs)
        pending.clear()
        _folded(metadata, state, "", pending)
        return state

    def load_state_dict(state_dict: Dict[str, Any]) -> None:
        for container, key, target in pending:
            container[key] = _rows_of(container[key], target)
        pending.clear()
        load(state_dict)

    train_module.state_dict_to_load = state_dict_to_load
    train_module.load_state_dict = load_state_dict
