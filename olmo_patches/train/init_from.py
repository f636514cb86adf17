"""train.init_from (``--init-from``): a new run starts from another model's weights, with its own
run folder, a fresh optimizer and schedule. The weights come from a run checkpoint of the same shape
(checked by content first: checkpoints.verify) or from a Hugging Face OLMo-2-style folder, converted
by OLMo-core's converter (olmo_core.nn.hf). A rerun of the new run resumes from its own
checkpoints."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, Optional

import torch

from ..config import ConfigError, ExperimentSpec
from .checkpoints import (
    checkpoint_shapes,
    first_difference,
    latest_complete,
    load_model_state,
    model_shapes,
    verify,
)

log = logging.getLogger(__name__)

__all__ = ["check_init_from", "init_state", "load_init_weights"]


def init_state(source: str) -> Dict[str, torch.Tensor]:
    """The full weights at ``source``, keyed as OLMo-core's Transformer; ConfigError (one line) for
    a folder that is missing, neither kind, or unreadable."""
    checkpoint = _checkpoint(source)
    return (
        _from_hf(Path(source), f"train.init_from={source}")
        if checkpoint is None
        else load_model_state(checkpoint)
    )


def _checkpoint(source: str) -> Optional[str]:
    """The verified run checkpoint at ``source``, or None for a Hugging Face folder; ConfigError
    (one line) for a folder that is neither kind, or damaged (a missing folder, or a Hugging Face
    model not OLMo-2's, is refused before torch: launch/data_files.py)."""
    where, path = f"train.init_from={source}", Path(source)
    checkpoint = latest_complete(path)  # a checkpoint holds a config.json too: asked first
    if checkpoint is None:
        if (path / "config.json").is_file():
            return None
        raise ConfigError(
            f"{where}: neither a complete checkpoint nor a Hugging Face folder (config.json)"
        )
    if (why := verify(checkpoint)) is not None:
        raise ConfigError(f"{where}: {why}")
    return checkpoint


class _ToLog(logging.Handler):
    """transformers' records as this module's INFO lines (a run's train.log)."""

    def emit(self, record: logging.LogRecord) -> None:
        log.info(f"transformers: {record.getMessage()}")


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' log lines (to :class:`_ToLog`) and progress bars off the terminal."""
    from transformers.utils import logging as hf_logging

    hf, bars = logging.getLogger("transformers"), hf_logging.is_progress_bar_enabled()
    handlers, hf.handlers = hf.handlers, [_ToLog()]
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf.handlers = handlers
        if bars:
            hf_logging.enable_progress_bar()


def _from_hf(path: Path, where: str) -> Dict[str, torch.Tensor]:
    from olmo_core.nn.hf import convert_state_from_hf
    from transformers import AutoModelForCausalLM

    try:
        with _quiet_transformers():
            model = AutoModelForCausalLM.from_pretrained(
                path, local_files_only=True, dtype=torch.float32
            )
        config = model.config
        return convert_state_from_hf(config, model.state_dict(), model_type=config.model_type)
    except Exception as e:  # noqa: BLE001 (a cut or foreign file: transformers' or safetensors' error)
        raise ConfigError(
            f"{where}: unreadable Hugging Face model ({type(e).__name__}: "
            f"{' '.join(str(e).split())[:160]})"
        ) from None


def check_init_from(spec: ExperimentSpec) -> None:
    """ConfigError naming the first weight whose shape differs (or that one side lacks), with both
    shapes, before anything is written. A run checkpoint's shapes come from its metadata (no weight
    is read); a Hugging Face folder's from its converted weights."""
    if not spec.train.init_from:
        return
    source = spec.train.init_from
    checkpoint = _checkpoint(source)
    if checkpoint is None:
        shapes = {
            k: v.shape for k, v in _from_hf(Path(source), f"train.init_from={source}").items()
        }
    else:
        shapes = checkpoint_shapes(checkpoint)
    if (why := first_difference(shapes, model_shapes(spec))) is not None:
        raise ConfigError(f"train.init_from={source}: {why}")


@torch.no_grad()
def load_init_weights(model: torch.nn.Module, source: str) -> None:
    """Copy the weights at ``source`` into ``model`` (sharded by FSDP or not), on every rank."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    state = init_state(source)
    for name, param in model.state_dict().items():
        full = state[name].to(param.dtype)
        if isinstance(param, DTensor):
            param.copy_(
                distribute_tensor(full.to(param.device), param.device_mesh, param.placements)
            )
        else:
            param.copy_(full)
    log.info(f"weights from {source}")
