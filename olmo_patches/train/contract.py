"""A checkpoint against a config: the shapes of the checkpoint's model weights, read from its
metadata (no tensor loaded), against the config's model built on the meta device (no memory). A
mismatch is one line, before any work: the first differing weight, both shapes, and the config the
checkpoint was written with (its run folder's ``config.yaml``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping, Optional, Sequence

import torch
import yaml

from ..blocks import BLOCKS
from ..config import ConfigError, ExperimentSpec
from ..config.load import at_default
from .checkpoints import checkpoint_shapes

__all__ = ["model_shapes", "first_difference", "check_checkpoint_fits", "written_by"]


def model_shapes(spec: ExperimentSpec) -> dict[str, torch.Size]:
    """The weights of the config's model and their shapes (built on the meta device: no memory)."""
    model = spec.model_config().build(init_device="meta")
    return {k: v.shape for k, v in model.state_dict().items()}


def first_difference(
    there: Mapping[str, Sequence[int]], here: Mapping[str, Sequence[int]]
) -> Optional[str]:
    """How the weights ``there`` (name: shape) differ from the config's model's ``here``, the first
    difference in the model's order; None when every weight fits."""
    for key, shape in here.items():
        if key not in there:
            return f"no weight {key} there ({list(shape)} in this config's model)"
        if list(there[key]) != list(shape):
            # the same elements in another shape: a layout this code does not read
            earlier = math.prod(there[key]) == math.prod(shape)
            return (
                f"first differing weight {key}: {list(there[key])} there, {list(shape)} in this "
                "config's model"
                + ("; a checkpoint of an earlier layout (CHANGELOG.md)" if earlier else "")
            )
    if extra := [k for k in there if k not in here]:
        return f"weight {extra[0]} {list(there[extra[0]])} there, not in this config's model"
    return None


def written_by(checkpoint: str | Path) -> str:
    """The config a checkpoint was written with, in a few words: its run folder's config.yaml and
    model, or that none is there."""
    recorded = Path(checkpoint).parent / "config.yaml"
    try:
        model = (yaml.safe_load(recorded.read_text()) or {}).get("model") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        return f"no readable config.yaml beside it ({recorded})"
    kind = BLOCKS.get(str(model.get("block")))
    # its kind's knobs where the record sets them (a record is a full dump: defaults are noise)
    knobs = [k for k in (kind.knobs if kind else ()) if not at_default(kind, k, model.get(k))]
    keys = ["block", "d_model", "n_layers", *knobs]
    shape = ", ".join(f"{k} {_short(model[k])}" for k in keys if model.get(k) is not None)
    return f"written by {recorded} ({shape})"


def _short(value) -> str:
    """A knob's value in a few words: a section (e.g. model.widths) by its shape or schedule."""
    if isinstance(value, dict):
        return str(value.get("shape") or value.get("schedule") or value.get("experts") or "{...}")
    return str(value)


def check_checkpoint_fits(
    checkpoint: str | Path,
    spec: ExperimentSpec,
    where: str,
    error: type = ConfigError,
    unreadable_ok: bool = False,
) -> None:
    """``error`` (one line, starting with ``where``) unless the weights of ``checkpoint`` (a step
    folder) have the shapes of ``spec``'s model; metadata that cannot be read is an ``error`` too,
    unless ``unreadable_ok``."""
    try:
        there = checkpoint_shapes(checkpoint)
    except Exception as e:  # noqa: BLE001 (a cut or foreign .metadata: DCP's or pickle's error)
        if unreadable_ok:
            return
        raise error(
            f"{where}: unreadable checkpoint metadata ({type(e).__name__}: "
            f"{' '.join(str(e).split())[:120]})"
        ) from None
    if (why := first_difference(there, model_shapes(spec))) is not None:
        raise error(f"{where}: {written_by(checkpoint)}; {why}")
