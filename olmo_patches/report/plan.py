"""What a run will do, before it does it: tokens, steps, batches, first data files, GPU-hours.

GPU-hours = FLOPs per token (OLMo-core's count for the built model: 6 per weight plus causal attention)
x tokens / (peak dense bf16 FLOP/s x MFU) / 3600. The peaks are the vendors' dense (no sparsity) bf16
tensor figures; MFU is an assumption, stated in the table.
"""

from __future__ import annotations

import math
from typing import Optional
from dataclasses import dataclass

from rich.table import Table

from ..config import ExperimentSpec, Layout, attention_backend, data_workers
from ..hardware import CARDS
from ..train import device_for
from .counts import count

__all__ = ["ASSUMED_MFU", "RunPlan", "plan", "plan_table", "first_data_files", "checkpoint_disk", "preset_rows"]

CHECKPOINT_BYTES_PER_PARAM = 12  # fp32 weights + AdamW's two fp32 moments (the trainer state is a few KB)

ASSUMED_MFU = 0.40  # model FLOPs utilization assumed for every card of hardware.CARDS (typical of OLMo-core at 0.1-1B, bf16, FSDP)


@dataclass(frozen=True)
class RunPlan:
    tokens: int
    steps: int
    warmup_steps: int
    global_batch_sequences: int
    micro_batch_sequences: int
    tokens_per_step: int
    flops_per_token: int
    params: int
    first_files: list[str]
    kv_cache_per_token: int = 0  # K and V elements cached per token at inference (nn/accounting.py)

    @property
    def total_flops(self) -> float:
        return float(self.flops_per_token) * self.tokens

    def gpu_hours(self, peak: float, mfu: float = ASSUMED_MFU) -> float:
        return self.total_flops / (peak * mfu) / 3600


def first_data_files(spec: ExperimentSpec, n: int = 3) -> list[str]:
    """The first files of the training data, in list order (a prefix: in training order)."""
    d = spec.data
    if d.source == "demo":
        return [f"demo corpus (built in {d.demo_cache})"]
    if d.source in ("olmo2_stage1", "prefix"):
        from ..train import resolve_data

        return resolve_data(spec).train_paths[:n]
    if d.paths:
        return list(d.paths[:n])
    if d.mix:
        from olmo_core.data import DataMix, TokenizerConfig

        paths, _ = DataMix(d.mix).build(d.mix_base_dir, TokenizerConfig.dolma2().identifier or "")
        return paths[:n]
    return []


def plan(spec: ExperimentSpec) -> RunPlan:
    t, seq = spec.train, spec.data.sequence_length
    per_step = t.global_batch_size * seq
    if t.max_tokens is not None:
        steps, tokens = math.ceil(t.max_tokens / per_step), t.max_tokens  # OLMo-core stops at ceil
    else:
        steps, tokens = int(t.max_steps or 0), int(t.max_steps or 0) * per_step
    warmup = t.warmup_steps if t.warmup_steps is not None else math.ceil((t.warmup_tokens or 0) / per_step)
    return RunPlan(
        tokens=tokens,
        steps=steps,
        warmup_steps=warmup,
        global_batch_sequences=t.global_batch_size,
        micro_batch_sequences=t.micro_batch_size,
        tokens_per_step=per_step,
        flops_per_token=count(spec).flops_per_token,
        params=count(spec).total,
        first_files=first_data_files(spec),
        kv_cache_per_token=count(spec).kv_cache_per_token,
    )


def checkpoint_disk(spec: ExperimentSpec, p: RunPlan) -> tuple[int, int]:
    """(checkpoints left at the end, their bytes): step 0, every run.save_interval (all kept), the
    last step, and the newest run.ephemeral_keep ephemeral ones."""
    r = spec.run
    last = min(p.steps, r.stop_at_step or p.steps)
    permanent = set(range(0, last + 1, r.save_interval)) | {last}
    ephemeral = 0
    if r.ephemeral_save_interval:
        ephemeral = min(r.ephemeral_keep, len([s for s in range(r.ephemeral_save_interval, last + 1, r.ephemeral_save_interval) if s not in permanent]))
    n = len(permanent) + ephemeral
    return n, n * p.params * CHECKPOINT_BYTES_PER_PARAM


def preset_rows(config: str, overrides: list[str], layout: Optional[Layout] = None) -> list[tuple[str, str]]:
    """What train.hardware would choose on each GPU preset (micro-batch, activation checkpointing,
    compile), as rows for the plan; a preset the model does not fit says so."""
    from ..config import ConfigError, load_spec

    rows = []
    for name in CARDS:
        try:
            t = load_spec(config, [*overrides, f"train.hardware={name}", "train.device=auto"], layout).train
            value = f"{t.micro_batch_size} sequences, activation checkpointing {'on' if t.activation_checkpointing else 'off'}, compile {'on' if t.compile else 'off'}"
        except ConfigError as e:
            value = str(e).split(": ", 2)[-1]
        rows.append((f"micro-batch per GPU, train.hardware={name}", value))
    return rows


def plan_table(spec: ExperimentSpec, layout: Layout = Layout(), presets: list[tuple[str, str]] = ()) -> Table:
    p = plan(spec)
    table = Table(title=f"{spec.run.name}: run plan")
    table.add_column("", no_wrap=True)
    table.add_column("value", justify="right", overflow="fold")
    table.add_row("tokens", f"{p.tokens:,}")
    table.add_row("steps", f"{p.steps:,}")
    table.add_row("warmup steps", f"{p.warmup_steps:,}")
    table.add_row("global batch", f"{p.global_batch_sequences} x {spec.data.sequence_length} = {p.tokens_per_step:,} tokens")
    per_rank = p.global_batch_sequences // layout.world_size
    table.add_row("ranks", f"{layout}, data parallel {spec.train.data_parallel if layout.world_size > 1 else 'none'}")
    table.add_row("per-rank batch", f"{per_rank} sequences = {per_rank // p.micro_batch_sequences} micro-batches")
    device = device_for(spec)
    table.add_row(f"micro-batch per process, this machine ({device})", f"{p.micro_batch_sequences} sequences")
    for label, value in presets:
        table.add_row(label, value)
    table.add_row(f"attention backend ({device} here)", str(attention_backend(spec, device)))
    table.add_row(f"data loader workers per rank ({device} here)", str(data_workers(spec, device)))
    table.add_row("FLOPs per token (train)", f"{p.flops_per_token:,}")
    table.add_row("total FLOPs", f"{p.total_flops:.3e}")
    table.add_row(f"KV cache per sequence (bf16, {spec.data.sequence_length} tokens)", f"{p.kv_cache_per_token * 2 * spec.data.sequence_length / 2**20:,.1f} MiB ({p.kv_cache_per_token:,} K and V elements per token)")
    for card in CARDS.values():
        assert card.bf16_flops is not None
        label = f"GPU-hours, {card.device_name} ({card.bf16_flops / 1e12:.0f} TFLOP/s bf16, MFU {ASSUMED_MFU:.0%})"
        table.add_row(label, f"{p.gpu_hours(card.bf16_flops):,.1f}")
    n, size = checkpoint_disk(spec, p)
    table.add_row("checkpoint disk at the end", f"{size / 2**30:,.2f} GiB ({n} checkpoints x {p.params:,} params x {CHECKPOINT_BYTES_PER_PARAM} bytes)")
    for i, f in enumerate(p.first_files):
        table.add_row(f"data file {i + 1}", f)
    return table
