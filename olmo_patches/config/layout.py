"""The ranks a run has, and what follows from them and the device: the per-rank batch arithmetic,
the hardware preset's choices, the attention backend and the loader's workers."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Optional

from ..hardware import CARDS, ActivationCheckpointing, MemoryEstimate, Settings, choose, detect, estimate, with_float8
from ..nn.attention import BackendChoice, head_dims, resolve_attention_backend
from .spec import ConfigError, ExperimentSpec, vocab_size

log = logging.getLogger(__name__)

CUDA_WORKERS = 4  # data.num_workers=null on CUDA: 15x an 8-GPU 113M rank's need from the local prefix (docs/performance.md)

@dataclass(frozen=True)
class Layout:
    """The ranks a run has: ``world_size`` processes, ``local`` per node, on ``nodes`` nodes (as
    OLMo-core counts them for HSDP: NUM_NODES, else world / local)."""

    world_size: int = 1
    local: int = 1
    nodes: int = 1

    @classmethod
    def plan(cls, nproc_per_node: int, nodes: int = 1) -> "Layout":
        return cls(nproc_per_node * nodes, nproc_per_node, nodes)

    @classmethod
    def from_env(cls) -> "Layout":
        """torchrun's WORLD_SIZE and LOCAL_WORLD_SIZE; one process without them."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        return cls(world, local, int(os.environ.get("NUM_NODES", 0)) or max(world // local, 1))

    def __str__(self) -> str:
        return f"{_count(self.world_size, 'rank')} ({_count(self.nodes, 'node')} x {self.local})"


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def fit_world_size(spec: ExperimentSpec, layout: Layout, where=lambda key: "config") -> None:
    """The per-rank arithmetic for ``layout``, before anything is built or written.

    An explicit micro-batch larger than the per-rank batch is lowered to it (one info line): the
    micro-batch only trades memory for speed, the global batch (hence the result) is unchanged, and a
    config sized for one process then runs on any number. One that does not divide the per-rank
    batch is refused: no value is clearly right (the nearest divisor may halve the throughput)."""
    t = spec.train
    g, n = t.global_batch_size, layout.world_size

    def fail(key: str, value: Any, why: str):
        raise ConfigError(f"{where(key)}: {key}={value}: {why}")

    if g % n:
        fail("train.global_batch_size", g, f"is not divisible by the {layout}: each rank takes a whole number of sequences")
    per_rank = g // n
    m = t.micro_batch_size
    if m is not None and m > per_rank:
        log.info(f"train.micro_batch_size={m} > the per-rank batch {per_rank} ({g} sequences / {layout}): using {per_rank}")
        t.micro_batch_size = per_rank
    elif m is not None and per_rank % m:
        fail("train.micro_batch_size", m,
             f"does not divide the per-rank batch {per_rank} (train.global_batch_size={g} / {layout})")
    if t.data_parallel == "hsdp" and n > 1 and layout.nodes * layout.local != n:
        fail("train.data_parallel", t.data_parallel,
             f"HSDP shards over a node's ranks and replicates across nodes: {layout} is not {layout.nodes} equal nodes")
    shards = {"fsdp": n, "hsdp": layout.local}.get(t.data_parallel, 1)
    if shards > 1 and spec.model.moe is not None:  # only K-stacked (hourglass) experts can be refused
        from ..nn.shards import unshardable

        if (bad := unshardable(spec.model.build(vocab_size(spec)).build(init_device="meta"), shards)) is not None:
            fail("train.data_parallel", t.data_parallel,
                 f"{bad[0]} of shape {bad[1]} cannot be sharded over {shards} ranks: FSDP2 pads only dim 0 "
                 f"(K), and a K-stacked weight splits on a dimension the rank count divides (docs/performance.md)")


def apply_hardware(spec: ExperimentSpec, where=lambda key: "config", layout: Optional[Layout] = None) -> None:
    """Fill the train keys left at null from ``train.hardware`` (hardware.py's presets for this
    model), per rank of ``layout`` (after :func:`fit_world_size`)."""
    t = spec.train
    if (t.micro_batch_size, t.activation_checkpointing, t.compile).count(None) == 0:
        return
    layout = layout or Layout.from_env()
    per_rank = t.global_batch_size // layout.world_size
    card = None if t.device == "cpu" else detect() if t.hardware == "auto" else CARDS.get(t.hardware)
    if card is None:  # none, a CPU run, or auto without a GPU
        settings = Settings(t.micro_batch_size or per_rank, ActivationCheckpointing("off"), False)
    else:
        est = memory_estimate(spec, layout)
        try:
            settings = choose(est, card, per_rank, t.micro_batch_size, t.activation_checkpointing)
        except ValueError as e:
            raise ConfigError(f"{where('train.hardware')}: train.hardware={t.hardware}: {spec.run.name} {e}") from None
    filled = {k: getattr(settings, k) for k in ("micro_batch_size", "activation_checkpointing", "compile") if getattr(t, k) is None}
    for key, value in filled.items():
        setattr(t, key, value)
    if card is not None:  # without a card nothing is chosen: no preset line
        log.info(f"train.hardware={t.hardware} -> {card.name} ({layout}): " + ", ".join(f"{k}={v}" for k, v in filled.items()))
    ac = t.activation_checkpointing
    if ac is not None and ac.mode == "budget" and not t.compile:  # OLMo-core refuses it at build
        raise ConfigError(f"{where('train.activation_checkpointing')}: train.activation_checkpointing={ac}: the compiler's budget needs train.compile=true")


def memory_estimate(spec: ExperimentSpec, layout: Layout) -> MemoryEstimate:
    """hardware.estimate for this spec's model on one rank of ``layout`` (FSDP: sharded over all ranks, HSDP: a node's)."""
    shards = {"fsdp": layout.world_size, "hsdp": layout.local, "ddp": 1}.get(spec.train.data_parallel, 1)
    model = spec.model.build(vocab_size(spec))
    est = estimate(model, spec.data.sequence_length, shards)
    return with_float8(est, model) if spec.train.float8 != "off" else est


def attention_backend(spec: ExperimentSpec, device: str) -> BackendChoice:
    """The attention backend this spec runs with on ``device`` (cpu | cuda); raises ConfigError
    for an explicit flash backend that cannot run on this CUDA machine (load_spec checks it first)."""
    try:
        return resolve_backend(spec, device)
    except ValueError as e:
        raise ConfigError(f"config: model.attention_backend={spec.model.attention_backend}: {e}") from None


def resolve_backend(spec: ExperimentSpec, device: str) -> BackendChoice:
    dims = head_dims(spec.model.build(vocab_size(spec)))
    return resolve_attention_backend(spec.model.attention_backend, dims, cuda=device == "cuda", bf16=spec.train.precision == "bf16")


def data_workers(spec: ExperimentSpec, device: str) -> int:
    """data.num_workers, or its default: 0 on CPU (no worker start-up: tests and demos), CUDA_WORKERS on CUDA."""
    if spec.data.num_workers is not None:
        return spec.data.num_workers
    return CUDA_WORKERS if device == "cuda" else 0

