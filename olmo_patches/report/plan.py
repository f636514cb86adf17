"""What a run will do, before it does it: tokens, steps, batches, first data files, GPU-hours.

GPU-hours = FLOPs per token (OLMo-core's count for the built model: 6 per weight plus causal
attention) x tokens / (peak dense bf16 FLOP/s x MFU) / 3600. The peaks are the vendors' dense (no
sparsity) bf16 tensor figures; MFU is an assumption, stated in the table.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional
from dataclasses import dataclass

from rich.table import Table

from ..blocks import block_of
from ..config import ExperimentSpec
from ..launch.layout import Layout, attention_backend, data_workers
from ..launch.cards import CARDS, GIB
from ..config.spec import demo_cache
from ..train import device_for
from ..train.callbacks.checkpointer import CHECKPOINT_BYTES_PER_PARAM
from ..train.experiment import describe_compile, precision_of
from ..nn.attention import on_gpu
from ..nn.lm_loss import lm_loss
from .counts import aligned_sibling, count, float8_row

__all__ = [
    "ASSUMED_MFU",
    "RunPlan",
    "plan",
    "plan_table",
    "first_data_files",
    "checkpoint_disk",
    "preset_rows",
    "device_rows",
    "signal_lead",
    "data_tokens",
    "data_passes",
    "mixture_table",
]


# Model FLOPs utilization assumed for every card of launch/cards.py (typical of OLMo-core at
# 0.1-1B, bf16, FSDP)
ASSUMED_MFU = 0.40
# Checkpoint write rate for the signal lead when the run has not measured its own
# (SAVE/save_rate.json): 97 MiB/s, the write+fsync measured by
# benchmarks/bench_checkpoint_manifest.py (docs/running.md), a conservative figure for a shared
# folder written by all ranks together.
SAVE_BYTES_PER_S = 97 * 2**20
SIGNAL_MARGIN_S = 60  # on top of a step and a save: stopping the processes, the requeue


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
        return [f"demo corpus (built in {demo_cache(spec)})"]
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


def data_tokens(spec: ExperimentSpec) -> Optional[int]:
    """Training tokens the run's data holds, where known without reading it: a materialized prefix
    (its index), the demo corpus once built (its manifest); None otherwise."""
    d = spec.data
    if d.source == "prefix" and d.prefix_dir:
        from ..data.prefix import prefix_index

        return int(prefix_index(Path(d.prefix_dir))["spec"]["num_instances"]) * d.sequence_length
    if d.source == "demo":
        from ..data.demo import cached_demo_corpus

        corpus = cached_demo_corpus(demo_cache(spec), vocab_size=d.demo_vocab_size)
        return corpus.n_train_tokens if corpus is not None else None
    return None


def data_passes(spec: ExperimentSpec, tokens: int) -> str:
    """How many times a run of ``tokens`` reads its data, for the dry run."""
    held = data_tokens(spec)
    if held is None:
        why = (
            "the demo corpus is built at the run's start"
            if spec.data.source == "demo"
            else "its size is read at the run's start"
        )
        return f"not known here ({why}; the start line says)"
    passes = tokens / held
    return f"{passes:.2f} ({tokens:,} of {held:,} tokens)" + (
        f": the run reads its data {passes:.1f} times" if passes > 1 else ""
    )


def mixture_table(rows) -> Table:
    """data.mixture's sources: tokens held, ratio, tokens the run reads, passes
    (train.sources.mixture_plan)."""
    table = Table(title="data.mixture (OLMo-core's source mixture)")
    for column in ("source", "tokens", "ratio", "tokens read", "passes", "max_repetition"):
        table.add_column(column, justify="left" if column == "source" else "right")
    for source, needed, passes in rows:
        ratio, most = f"{source.ratio:.3f}", f"{source.max_repetition:g}"
        table.add_row(
            source.name, f"{source.tokens:,}", ratio, f"{needed:,}", f"{passes:.2f}", most
        )
    return table


def plan(spec: ExperimentSpec) -> RunPlan:
    t, seq = spec.train, spec.data.sequence_length
    per_step = t.global_batch_size * seq
    steps = spec.steps or 0
    tokens = t.max_tokens if t.max_tokens is not None else steps * per_step
    warmup = (
        t.warmup_steps
        if t.warmup_steps is not None
        else math.ceil((t.warmup_tokens or 0) / per_step)
    )
    b = count(spec)  # builds the model (meta): once
    return RunPlan(
        tokens=tokens,
        steps=steps,
        warmup_steps=warmup,
        global_batch_sequences=t.global_batch_size,
        micro_batch_sequences=t.micro_batch_size,
        tokens_per_step=per_step,
        flops_per_token=b.flops_per_token,
        params=b.total,
        first_files=first_data_files(spec),
        kv_cache_per_token=b.kv_cache_per_token,
    )


def checkpoint_disk(spec: ExperimentSpec, p: RunPlan) -> tuple[int, int]:
    """(checkpoints left at the end, their bytes): step 0, every run.save_interval (all kept), the
    last step, and the newest run.ephemeral_keep ephemeral ones."""
    r = spec.run
    last = min(p.steps, r.stop_at_step or p.steps)
    permanent = set(range(0, last + 1, r.save_interval)) | {last}
    ephemeral = 0
    if r.ephemeral_save_interval:
        ephemeral = min(
            r.ephemeral_keep,
            len(
                [
                    s
                    for s in range(r.ephemeral_save_interval, last + 1, r.ephemeral_save_interval)
                    if s not in permanent
                ]
            ),
        )
    n = len(permanent) + ephemeral
    return n, n * p.params * CHECKPOINT_BYTES_PER_PARAM


def signal_lead(spec: ExperimentSpec, layout: Layout) -> tuple[int, str]:
    """(seconds, how) for SLURM's time-limit signal (``--signal=B:USR1@N``): the run stops at the
    next step and saves, so N >= one step (on the slowest preset card at ASSUMED_MFU) + one save
    (the checkpoint at the rate the run measured at its last save, SAVE/save_rate.json, else at
    SAVE_BYTES_PER_S) + SIGNAL_MARGIN_S, rounded up to 30 s."""
    from ..train.callbacks.checkpointer import SAVE_RATE, measured_save_rate

    p = plan(spec)
    card = min(CARDS.values(), key=lambda c: c.bf16_flops or 0)
    assert card.bf16_flops is not None
    step = (
        p.flops_per_token * p.tokens_per_step / (layout.world_size * card.bf16_flops * ASSUMED_MFU)
    )
    size = p.params * CHECKPOINT_BYTES_PER_PARAM
    if (measured := measured_save_rate(spec.save_folder)) is not None:
        rate = measured["bytes"] / measured["seconds"]
        source = f"measured at step {measured['step']}: {SAVE_RATE}"
    else:
        rate, source = SAVE_BYTES_PER_S, "stated, conservative: docs/running.md"
    save = size / rate
    lead = 30 * math.ceil((step + save + SIGNAL_MARGIN_S) / 30)
    how = (
        f"--signal=B:USR1@{lead}: a step {step:,.0f} s ({layout.world_size} x {card.name}, MFU "
        f"{ASSUMED_MFU:.0%}) + a save {save:,.0f} s ({size / 2**30:,.1f} GiB at "
        f"{rate / 2**20:,.0f} MiB/s, {source}) + {SIGNAL_MARGIN_S} s"
    )
    return lead, how


def preset_rows(
    config: str, overrides: list[str], layout: Optional[Layout] = None
) -> list[tuple[str, str]]:
    """What train.hardware would choose on each GPU preset (micro-batch, activation checkpointing,
    compile), as rows for the plan; a preset the model does not fit says so."""
    from ..config import ConfigError
    from ..launch.layout import load_and_resolve, memory_estimate

    rows = []
    for name in CARDS:
        try:
            spec = load_and_resolve(
                config, [*overrides, f"train.hardware={name}", "train.device=auto"], layout
            )
            t = spec.train
            assert t.micro_batch_size is not None and t.activation_checkpointing is not None
            est = memory_estimate(spec, layout or Layout.from_env())
            gib = est.total(t.micro_batch_size, t.activation_checkpointing) / GIB
            value = (
                f"{t.micro_batch_size} sequences, checkpointing {t.activation_checkpointing}, "
                f"compile {'on' if t.compile else 'off'}, estimate {gib:.1f} GiB "
                f"({'compiled' if est.compiled else 'eager'} terms)"
            )
        except ConfigError as e:
            value = str(e).split(": ", 2)[-1]
        rows.append((f"micro-batch per GPU, train.hardware={name}", value))
    return rows


def device_rows(spec: ExperimentSpec, world_size: int) -> list[tuple[str, str]]:
    """What the trainer will do on the device this run gets (the code the trainer runs decides it),
    and the settings that device ignores, with why."""
    t, device = spec.train, device_for(spec)
    ignored = []
    # train.device=auto applies it (launch/layout.py)
    if t.device == "cpu" and t.hardware not in ("auto", "none"):
        ignored.append(
            f"train.hardware={t.hardware} (train.device=cpu: the keys left null take "
            "train.hardware=none's values)"
        )
    if device == "cpu" or t.precision != "bf16":
        ignored.append(
            "MFU (OLMo-core's speed monitor has a peak FLOP/s for a known GPU in bf16 only)"
        )
    return [
        (
            f"precision ({device} here, {world_size} rank{'s' if world_size > 1 else ''})",
            f"train.precision={t.precision}: {precision_of(spec, world_size)}",
        ),
        (f"compile ({device} here)", describe_compile(spec, world_size)),
        (f"activation checkpointing ({device} here)", str(t.activation_checkpointing or "off")),
        (f"attention backend ({device} here)", str(attention_backend(spec, device))),
        (
            "attention kernel (a CUDA node with flash-attn)",
            _with_sibling(
                spec,
                on_gpu(
                    spec.model.attention_backend, spec.model.head_dims, bf16=t.precision == "bf16"
                ),
            ),
        ),
        (f"LM loss ({device} here)", str(lm_loss(spec, device))),
        *(
            [("LM loss (a CUDA node, this install)", str(lm_loss(spec, "cuda")))]
            if device != "cuda"
            else []
        ),
        (f"ignored ({device} here)", "; ".join(ignored) or "nothing"),
    ]


def _with_sibling(spec: ExperimentSpec, text: str) -> str:
    """``text`` (head-dim padding, float8 skips) naming the config's aligned sibling, if any."""
    sibling = (
        aligned_sibling(spec.run.name)
        if "padding" in text or "kept high precision" in text
        else None
    )
    return f"{text}; aligned sibling: {sibling}" if sibling else text


def shard_row(spec: ExperimentSpec, layout: Layout) -> Optional[tuple[str, str]]:
    """FSDP/HSDP: the parameters each rank holds (FSDP2 pads every rank's piece to the largest), and
    how the kind's own weights split (its ``fsdp_splits``, nn/shards.py); None without sharding."""
    from ..nn.shards import padded_share

    shards = {"fsdp": layout.world_size, "hsdp": layout.local}.get(spec.train.data_parallel, 1)
    if shards <= 1 or layout.world_size <= 1:
        return None
    model = spec.model_config().build(init_device="meta")
    shapes = [(n, tuple(q.shape)) for n, q in model.named_parameters()]
    total = sum(math.prod(s) for _, s in shapes)
    held = sum(padded_share(s, shards) for _, s in shapes)
    stacked = block_of(spec.model).fsdp_splits(spec.model)
    padding = held * shards / total - 1
    line = f"{held:,} parameters a rank ({padding:+.2%} padding over {total:,} / {shards})"
    return f"FSDP2 shards over {shards} ranks", "; ".join([line, *stacked])


def plan_table(
    spec: ExperimentSpec, layout: Layout = Layout(), presets: list[tuple[str, str]] = ()
) -> Table:
    p = plan(spec)
    table = Table(title=f"{spec.run.name}: run plan")
    table.add_column("", no_wrap=True)
    table.add_column("value", justify="right", overflow="fold")
    rows = [
        *_batch_rows(spec, layout, p),
        *_machine_rows(spec, layout, p, presets),
        *_cost_rows(spec, layout, p),
    ]
    for label, value in rows:
        table.add_row(label, value)
    return table


def _batch_rows(spec: ExperimentSpec, layout: Layout, p: RunPlan) -> list[tuple[str, str]]:
    """The tokens, steps and batches, globally and per rank."""
    seq = spec.data.sequence_length
    # What the run trains: whole steps of the global batch (OLMo-core stops at the step that
    # reaches max_tokens), beside the budget when it is not a whole number of steps.
    trained = p.steps * p.tokens_per_step
    budget = f" (budget {p.tokens:,})" if trained != p.tokens else ""
    per_rank = p.global_batch_sequences // layout.world_size
    data_parallel = spec.train.data_parallel if layout.world_size > 1 else "none"
    rows = [
        ("tokens", f"{p.steps:,} x {p.global_batch_sequences} x {seq} = {trained:,}{budget}"),
        ("passes over the data", data_passes(spec, p.tokens)),
        ("steps", f"{p.steps:,}"),
        ("warmup steps", f"{p.warmup_steps:,}"),
        ("global batch", f"{p.global_batch_sequences} x {seq} = {p.tokens_per_step:,} tokens"),
        ("ranks", f"{layout}, data parallel {data_parallel}"),
        (
            "per-rank batch",
            f"{per_rank} sequences = {per_rank // p.micro_batch_sequences} micro-batches",
        ),
    ]
    if (row := shard_row(spec, layout)) is not None:
        rows.append(row)
    return rows


def _machine_rows(
    spec: ExperimentSpec, layout: Layout, p: RunPlan, presets: list[tuple[str, str]]
) -> list[tuple[str, str]]:
    """What this machine and the launch decided, and the presets that apply."""
    device = device_for(spec)
    # launch.layout.resolve: what the machine and the ranks decided
    resolved = getattr(spec, "resolved", {})
    return [
        (
            f"micro-batch per process, this machine ({device})",
            f"{p.micro_batch_sequences} sequences",
        ),
        (
            f"resolved at launch ({device}, {layout.world_size} ranks)",
            ", ".join(f"{k}={v}" for k, v in resolved.items()) or "nothing (every key set)",
        ),
        *presets,
        *device_rows(spec, layout.world_size),
        (f"data loader workers per rank ({device} here)", str(data_workers(spec, device))),
    ]


def _cost_rows(spec: ExperimentSpec, layout: Layout, p: RunPlan) -> list[tuple[str, str]]:
    """FLOPs, KV cache, GPU-hours, checkpoint disk, the SLURM signal lead and the data files."""
    rows = [("FLOPs per token (train)", f"{p.flops_per_token:,}")]
    if spec.train.float8 != "off":
        label, value = float8_row(spec)
        rows.append(
            (label, _with_sibling(spec, value) if "kept high precision" in value else value)
        )
    rows.append(("total FLOPs", f"{p.total_flops:.3e}"))
    seq = spec.data.sequence_length
    kv_mib = p.kv_cache_per_token * 2 * seq / 2**20
    rows.append(
        (
            f"KV cache per sequence (bf16, {seq} tokens)",
            f"{kv_mib:,.1f} MiB ({p.kv_cache_per_token:,} K and V elements per token)",
        )
    )
    for card in CARDS.values():
        assert card.bf16_flops is not None
        label = (
            f"GPU-hours, {card.device_name} ({card.bf16_flops / 1e12:.0f} TFLOP/s bf16, "
            f"MFU {ASSUMED_MFU:.0%})"
        )
        rows.append((label, f"{p.gpu_hours(card.bf16_flops):,.1f}"))
    n, size = checkpoint_disk(spec, p)
    rows.append(
        (
            "checkpoint disk at the end",
            f"{size / 2**30:,.2f} GiB ({n} checkpoints x {p.params:,} params x "
            f"{CHECKPOINT_BYTES_PER_PARAM} bytes)",
        )
    )
    rows.append(("SLURM signal lead (scripts/launch_slurm.sbatch)", signal_lead(spec, layout)[1]))
    rows.extend((f"data file {i + 1}", f) for i, f in enumerate(p.first_files))
    return rows
