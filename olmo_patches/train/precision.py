"""Mixed precision and compile as the trainer applies them, the same on CPU as on GPU.

bf16 (``train.precision``): FSDP2 and HSDP keep fp32 parameters (the master weights AdamW updates
and checkpoints hold), all-gather bf16 compute copies of them and reduce-scatter the gradients in
fp32. One process and DDP run under bf16 autocast instead: DDP would cast the parameters themselves
(and AdamW's state) to bf16. gloo all-gathers, reduce-scatters and all-reduces bf16 (torch 2.13), so
CPU runs take the GPU's path.

float8 (``train.float8``): torchao's float8 matmuls through OLMo-core's Float8Config, which its
``parallelize_model`` applies before compile, activation checkpointing and FSDP; emulated where the
device has no float8 matmuls (CPU, pre-SM89), with one info line.

compile (``train.compile``): OLMo-core's per-block ``apply_compile`` (inductor), which its
``parallelize_model`` applies after float8 and activation checkpointing and before FSDP/DDP, but
only where CUDA is available ("Skipping model compilation"). On CPU :func:`compile_on_cpu` applies
it at that same point.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import torch
from olmo_core.config import DType
from olmo_core.distributed.parallel import DataParallelType
from olmo_core.nn.transformer import Transformer
from olmo_core.train.train_module import TransformerDataParallelConfig

from ..config import ExperimentSpec
from ..nn.float8 import ShapeFloat8Config, has_float8_matmuls

__all__ = [
    "Precision",
    "precision_of",
    "data_parallel",
    "autocast",
    "float8_config",
    "olmo_core_compiles",
    "compile_on_cpu",
    "describe_compile",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Precision:
    """The dtypes of one run: parameters (and master weights), compute, gradient reduction."""

    param: str
    compute: str
    reduce: Optional[str]  # None: one process, nothing reduced
    how: str  # which mechanism gives the compute dtype

    def __str__(self) -> str:
        reduce = (
            f"{self.reduce} gradient reduction"
            if self.reduce
            else "no gradient reduction (1 process)"
        )
        return (
            f"{self.param} parameters and master weights, {self.compute} compute ({self.how}), "
            f"{reduce}"
        )


def _fsdp(spec: ExperimentSpec, world_size: int) -> bool:
    """FSDP2 or HSDP (not DDP, not one process)."""
    return world_size > 1 and spec.train.data_parallel != "ddp"


def data_parallel(spec: ExperimentSpec, world_size: int) -> Optional[TransformerDataParallelConfig]:
    """FSDP2 (one unit per block), HSDP or DDP across ranks; none for one process."""
    if world_size == 1:
        return None
    bf16 = spec.train.precision == "bf16" and _fsdp(spec, world_size)
    return TransformerDataParallelConfig(
        name=DataParallelType(spec.train.data_parallel),
        param_dtype=DType.bfloat16 if bf16 else None,
        reduce_dtype=DType.float32,
    )


def autocast(spec: ExperimentSpec, world_size: int) -> Optional[DType]:
    """bf16 autocast where FSDP's mixed precision does not apply: one process, or DDP."""
    return (
        DType.bfloat16 if spec.train.precision == "bf16" and not _fsdp(spec, world_size) else None
    )


def precision_of(spec: ExperimentSpec, world_size: int) -> Precision:
    """What :func:`data_parallel` and :func:`autocast` give this run, for its log and the dry
    run."""
    reduce = "fp32" if world_size > 1 else None
    if spec.train.precision == "fp32":
        return Precision("fp32", "fp32", reduce, "no autocast")
    how = (
        f"{spec.train.data_parallel.upper()} mixed precision"
        if _fsdp(spec, world_size)
        else "torch.autocast"
    )
    return Precision("fp32", "bf16", reduce, how)


def float8_config(
    spec: ExperimentSpec, device: str, world_size: int
) -> Optional[ShapeFloat8Config]:
    """OLMo-core's Float8Config for train.float8 (nn/float8.py), emulated where there are no float8
    matmuls; on float8 hardware each matmul converts where it wins at a micro-batch's tokens on this
    card; tensorwise under FSDP all-gathers the linears' weights in float8 (OLMo-core's
    recommended)."""
    from olmo_core.float8 import AOFloat8LinearConfig, AOFloat8LinearRecipe

    from ..launch.cards import CARDS, known_card

    f8 = spec.train.float8
    if f8 == "off":
        return None
    emulate = not has_float8_matmuls(torch.device(device))
    if emulate:
        log.info(f"train.float8={f8}: no float8 matmuls on {device}, using torchao's emulation")
    card = known_card(torch.cuda.get_device_name(device)) if not emulate else None
    size = dict(
        emulate=emulate,
        tokens=(spec.train.micro_batch_size or 1) * spec.data.sequence_length,
        roof=(card or CARDS["h100"]).roof,
    )
    if f8 == "tensorwise":
        all_gather = _fsdp(spec, world_size)
        return ShapeFloat8Config(
            ao=AOFloat8LinearConfig(enable_fsdp_float8_all_gather=all_gather), **size
        )
    return ShapeFloat8Config(ao_recipe=AOFloat8LinearRecipe(f8), **size)


def olmo_core_compiles(spec: ExperimentSpec, device: str) -> bool:
    """OLMo-core's compile_model flag. On CPU :func:`compile_on_cpu` compiles instead, and the flag
    is set only for activation checkpointing's ``budget`` mode, which OLMo-core's train module
    refuses without it (its parallelize_model then skips compiling on CPU, and compile_on_cpu
    compiles)."""
    ac = spec.train.activation_checkpointing
    return bool(spec.train.compile) and (
        device != "cpu" or (ac is not None and ac.mode == "budget")
    )


def describe_compile(spec: ExperimentSpec, world_size: int) -> str:
    """What train.compile does, on any device, for the run's log and the dry run."""
    if not spec.train.compile:
        return "off (eager)"
    return "torch.compile per block (inductor)" + (
        f", before {spec.train.data_parallel.upper()}" if world_size > 1 else ""
    )


# parallelize_model calls one of these right after where it compiles on CUDA (init_weights always).
_AFTER_COMPILE = ("apply_fsdp", "apply_ddp", "init_weights")


def compile_on_cpu(model: Transformer) -> None:
    """Make the next of ``model``'s apply_fsdp / apply_ddp / init_weights compile it first: the
    point where OLMo-core's parallelize_model would have called ``model.apply_compile()`` with
    CUDA."""

    def compiling_first(name: str):
        method = getattr(model, name)

        def call(*args, **kwargs):
            for other in _AFTER_COMPILE:
                del model.__dict__[other]  # back to the class's methods
            model.apply_compile()
            return method(*args, **kwargs)

        return call

    for name in _AFTER_COMPILE:
        setattr(model, name, compiling_first(name))
    logging.getLogger("olmo_core.train.train_module.transformer.common").addFilter(_compiled_here)


def _compiled_here(record: logging.LogRecord) -> bool:
    """Drops OLMo-core's "Skipping model compilation" warning where compile_on_cpu compiles
    instead."""
    return not record.getMessage().startswith("Skipping model compilation")
