"""Reading what a save folder holds: its latest complete checkpoint, a checkpoint's step, its model
weights as plain tensors. Used by resume and safety; imports OLMo-core only."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional

import torch
from olmo_core.aliases import PathOrStr
from olmo_core.train.checkpoint import Checkpointer

__all__ = [
    "latest_complete",
    "holds_checkpoints",
    "checkpoint_step",
    "checkpoint_shapes",
    "load_model_state",
    "load_optim_state",
]


def latest_complete(folder: PathOrStr) -> Optional[str]:
    """``folder`` itself when it is a complete checkpoint, else the latest complete checkpoint in
    it, or None."""
    if Checkpointer.dir_is_checkpoint(folder):
        return str(folder)
    try:
        return Checkpointer.latest_checkpoint(folder)
    except FileNotFoundError:
        return None


def holds_checkpoints(folder: PathOrStr) -> bool:
    """Whether a run folder holds a complete checkpoint, or step folders set aside in a subfolder
    (safety.py's rejected/, resume.py's superseded-TIME/): its recorded config then stays, since it
    says what wrote them."""
    if latest_complete(folder) is not None:
        return True
    return Path(folder).is_dir() and any(p.is_dir() for p in Path(folder).glob("*/step*"))


def checkpoint_step(checkpoint: PathOrStr) -> int:
    """The global step a checkpoint was saved at (its trainer state)."""
    state = torch.load(Path(checkpoint) / "train" / "rank0.pt", weights_only=False)
    return int(state["global_step"])


def load_model_state(checkpoint: PathOrStr) -> Dict[str, torch.Tensor]:
    """The model weights of a trainer checkpoint (``stepN``) or of a bare model checkpoint, as
    full tensors keyed like OLMo-core's ``Transformer.state_dict()``. Reads in this process alone,
    with or without a process group (rank 0 checks a save folder's checkpoints under torchrun)."""
    return _load_tensors(checkpoint, "model.")


def load_optim_state(checkpoint: PathOrStr) -> Dict[str, torch.Tensor]:
    """The optimizer's state tensors of a trainer checkpoint (AdamW: each parameter's ``exp_avg``,
    ``exp_avg_sq`` and ``step``), as full tensors keyed ``PARAM.NAME``; read as
    :func:`load_model_state` reads."""
    return _load_tensors(checkpoint, "optim.state.")


def checkpoint_shapes(checkpoint: PathOrStr) -> Dict[str, torch.Size]:
    """The model weights' shapes of a checkpoint, keyed as :func:`load_model_state`'s tensors, from
    its metadata alone (torch.distributed.checkpoint's ``.metadata``: no tensor is read)."""
    _, metadata = _metadata(checkpoint)
    return {k[len("model.") :]: m.size for k, m in _tensors(metadata, "model.").items()}


def _metadata(checkpoint: PathOrStr):
    """(the folder of the DCP files, their metadata): a trainer checkpoint's model_and_optim/, or a
    bare one."""
    from olmo_core.distributed.checkpoint import get_checkpoint_metadata

    root = Path(checkpoint)
    model_dir = (
        root / "model_and_optim" if (root / "model_and_optim" / ".metadata").exists() else root
    )
    return model_dir, get_checkpoint_metadata(model_dir)


def _tensors(metadata, prefix: str) -> dict:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    items = metadata.state_dict_metadata.items()
    return {k: m for k, m in items if k.startswith(prefix) and isinstance(m, TensorStorageMetadata)}


def _load_tensors(checkpoint: PathOrStr, prefix: str) -> Dict[str, torch.Tensor]:
    # OLMo-core's load_keys without its guard against a process group: its read is local (no_dist).
    from olmo_core.distributed.checkpoint import _get_key, _load_unsharded_keys

    model_dir, metadata = _metadata(checkpoint)
    keys = list(_tensors(metadata, prefix))
    state = _load_unsharded_keys(model_dir, keys)
    return {k[len(prefix) :]: _get_key(state, k, pop=True) for k in keys}
