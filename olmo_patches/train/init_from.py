"""train.init_from (``--init-from``): a new run starts from another model's weights, with its own
run folder, a fresh optimizer and schedule. The weights come from a run checkpoint of the same shape
(checked by content first: safety.verify) or from a Hugging Face OLMo-2-style folder, converted by
OLMo-core's converter (olmo_core.nn.hf). A rerun of the new run resumes from its own checkpoints."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Dict

import torch

from ..config import ConfigError, ExperimentSpec
from .checkpoints import latest_complete, load_model_state
from .safety import verify

log = logging.getLogger(__name__)

__all__ = ["check_init_from", "init_state", "load_init_weights"]


def init_state(source: str) -> Dict[str, torch.Tensor]:
    """The full weights at ``source``, keyed as OLMo-core's Transformer; ConfigError (one line) for a
    folder that is missing, neither kind, or unreadable."""
    where, path = f"train.init_from={source}", Path(source)
    if not path.is_dir():
        raise ConfigError(f"{where}: {'a file, not a folder' if path.exists() else 'no such folder'}")
    checkpoint = latest_complete(path)  # a checkpoint holds a config.json too: asked first
    if checkpoint is None:
        if (path / "config.json").is_file():
            return _from_hf(path, where)
        raise ConfigError(f"{where}: neither a complete checkpoint nor a Hugging Face folder (config.json)")
    if (why := verify(checkpoint)) is not None:
        raise ConfigError(f"{where}: {why}")
    return load_model_state(checkpoint)


def _from_hf(path: Path, where: str) -> Dict[str, torch.Tensor]:
    from olmo_core.nn.hf import convert_state_from_hf
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
        config = model.config
        return convert_state_from_hf(config, model.state_dict(), model_type=config.model_type)
    except Exception as e:  # noqa: BLE001 (a cut or foreign file: transformers' or safetensors' error)
        raise ConfigError(
            f"{where}: unreadable Hugging Face model ({type(e).__name__}: {' '.join(str(e).split())[:160]})"
        ) from None


def _shapes(spec: ExperimentSpec) -> Dict[str, torch.Size]:
    """The weights of the config's model and their shapes (built on the meta device: no memory)."""
    model = spec.model_config().build(init_device="meta")
    return {k: v.shape for k, v in model.state_dict().items()}


def check_init_from(spec: ExperimentSpec) -> None:
    """ConfigError naming the first weight whose shape differs (or that one side lacks), with both
    shapes, before anything is written."""
    if not spec.train.init_from:
        return
    state, where = init_state(spec.train.init_from), f"train.init_from={spec.train.init_from}"
    for key, shape in _shapes(spec).items():
        if key not in state:
            raise ConfigError(f"{where}: no weight {key} there ({list(shape)} in this config's model)")
        if state[key].shape != shape:
            there, here = list(state[key].shape), list(shape)
            raise ConfigError(f"{where}: first differing weight {key}: {there} there, {here} in this config's model")
    if extra := [k for k in state if k not in _shapes(spec)]:
        raise ConfigError(f"{where}: weight {extra[0]} {list(state[extra[0]].shape)} there, not in this config's model")


@torch.no_grad()
def load_init_weights(model: torch.nn.Module, source: str) -> None:
    """Copy the weights at ``source`` into ``model`` (sharded by FSDP or not), on every rank."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    state = init_state(source)
    for name, param in model.state_dict().items():
        full = state[name].to(param.dtype)
        if isinstance(param, DTensor):
            param.copy_(distribute_tensor(full.to(param.device), param.device_mesh, param.placements))
        else:
            param.copy_(full)
    log.info(f"weights from {source}")
