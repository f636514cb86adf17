"""Validation: the checks that the schema's types cannot express, and every number's domain, by
section: each section's ``validate`` in config/spec.py runs its ``check_*`` here (this module
imports nothing of spec.py). A failure is one line naming the file (or "command line"), the key and
the value."""

from __future__ import annotations

import math
from fnmatch import fnmatch
from dataclasses import fields, is_dataclass
from typing import Any

from ..blocks import BLOCKS, block_of

# no key's value is larger: the largest integer a float holds exactly (token counts reach 1e13)
_MAX_NUMBER = 2**53
_MAX_SEED = 2**32  # numpy's seed range, which OLMo-core's seed_all passes the seed to
# tokens per sequence: 8x Llama 3.1's 128K context; OLMo-core builds the RoPE table for it
_MAX_SEQUENCE = 2**20
_MAX_STEP_TOKENS = 2**32  # tokens per optimizer step: 1000x OLMo-2's 4M
_MAX_MATRIX = 2**40  # elements in one weight matrix: far beyond any GPU's memory, far below int64
# bytes: the largest card of launch/cards.py (b200), the size check's bound
_LARGEST_CARD = 180 * 2**30
_STATE_BYTES = (
    16  # fp32 weights, fp32 gradients, AdamW's two fp32 moments, per parameter (launch/memory.py)
)
_KEPT_BYTES = (
    2  # a checkpointed block's bf16 input, per token and per unit of its width (launch/memory.py)
)


def check_every_value(spec, fail, node: Any = None, prefix: str = "") -> None:
    """Every number finite and at most 2^53 in magnitude, every string non-empty (null unsets a
    key), the items of every list too: whatever the key, before any check that does arithmetic with
    it."""
    node = spec if node is None else node
    for f in fields(node):
        key, value = f"{prefix}{f.name}", getattr(node, f.name)
        if is_dataclass(value):
            check_every_value(spec, fail, value, f"{key}.")
            continue
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, bool) or item is None:
                continue
            if isinstance(item, (int, float)) and not (
                math.isfinite(item) and abs(item) <= _MAX_NUMBER
            ):
                fail(key, value, "must be a finite number of magnitude at most 2^53")
            if isinstance(item, str) and not item.strip():
                fail(
                    key,
                    repr(value),
                    "must not be empty" + (" (null: unset)" if f.default is None else ""),
                )


def _check_numbers(fail, *checks: tuple[str, Any, bool, str]) -> None:
    """Each ``(key, value, ok, why)``: a number in its range (null: unset, not checked)."""
    for key, value, ok, why in checks:
        if value is not None and (
            not ok or (isinstance(value, float) and not math.isfinite(value))
        ):
            fail(key, value, why)


def check_data(d, fail) -> None:
    """The data section (a DataSpec): every knob's domain (whether or not the source reads it), the
    source's keys, the loader's."""
    if not 0 <= d.order_seed < _MAX_SEED:
        fail("data.order_seed", d.order_seed, "must be in [0, 2^32) (numpy's seed range)")
    if d.demo_vocab_size < 2:
        fail(
            "data.demo_vocab_size",
            d.demo_vocab_size,
            "must be >= 2 (the end-of-text and padding tokens)",
        )
    if not 2 <= d.sequence_length:
        fail("data.sequence_length", d.sequence_length, "must be >= 2")
    if d.sequence_length > _MAX_SEQUENCE:
        fail("data.sequence_length", d.sequence_length, "must be at most 2^20")
    if d.base is not None and d.source != "olmo2_stage1":
        fail(
            "data.base",
            d.base,
            f"a mirror of the pinned list applies to data.source=olmo2_stage1, not {d.source}",
        )
    if d.source == "prefix" and not d.prefix_dir:
        fail("data.prefix_dir", d.prefix_dir, "a prefix data source needs the materialized folder")
    if d.source == "numpy" and not d.paths and not d.mix and not d.mixture:
        fail(
            "data.source",
            d.source,
            "a numpy data source needs data.paths, data.mix or data.mixture",
        )
    # numpy: either tokenizer
    if d.source != "numpy" and (d.source == "demo") != (d.tokenizer == "demo"):
        fail(
            "data.tokenizer",
            d.tokenizer,
            f"data.source={d.source} is tokenized with "
            f"{'demo' if d.source == 'demo' else 'dolma2'}",
        )
    _check_mixture(d, fail)
    if d.num_workers is not None and d.num_workers < 0:
        fail("data.num_workers", d.num_workers, "must be >= 0")
    if d.prefetch_factor is not None and (d.prefetch_factor < 1 or d.num_workers == 0):
        fail(
            "data.prefetch_factor",
            d.prefetch_factor,
            "must be >= 1, and needs data.num_workers > 0",
        )


def _check_mixture(d, fail) -> None:
    """data.mixture: numpy sources alone, each with token files and a ratio, the ratios' sum
    positive."""
    if not d.mixture:
        return
    if d.source != "numpy" or d.paths or d.mix:
        fail(
            "data.mixture",
            ", ".join(d.mixture),
            "needs data.source=numpy and neither data.paths nor data.mix",
        )
    for name, s in d.mixture.items():
        key = f"data.mixture.{name}"
        if not (math.isfinite(s.ratio) and s.ratio >= 0):
            fail(f"{key}.ratio", s.ratio, "must be a finite number >= 0")
        if bool(s.paths) == bool(s.manifest):
            fail(
                f"{key}.paths", list(s.paths), "give the source paths or a manifest, one of the two"
            )
        if not (math.isfinite(s.max_repetition) and s.max_repetition >= 1):
            fail(f"{key}.max_repetition", s.max_repetition, "must be a finite number >= 1")
    if not sum(s.ratio for s in d.mixture.values()) > 0:
        ratios = ", ".join(f"{n}={s.ratio}" for n, s in d.mixture.items())
        fail("data.mixture", ratios, "the ratios must sum to a positive number")


def check_train(t, fail) -> None:
    """The train section (a TrainSpec): length, batch, schedule (train.power), optimizer, activation
    checkpointing."""
    if not 0 <= t.seed < _MAX_SEED:
        fail("train.seed", t.seed, "must be in [0, 2^32) (numpy's seed range)")
    if (t.max_tokens is None) == (t.max_steps is None):
        cli = t.max_tokens is not None and fail.where("train.max_tokens") == "command line"
        key = "train.max_tokens" if cli else "train.max_steps"
        fail(
            key,
            getattr(t, key.split(".")[1]),
            "give exactly one of train.max_tokens and train.max_steps",
        )
    if t.global_batch_size < 1:
        fail("train.global_batch_size", t.global_batch_size, "must be >= 1")
    if t.micro_batch_size is not None and t.micro_batch_size < 1:
        fail("train.micro_batch_size", t.micro_batch_size, "must be >= 1")
    if t.schedule_lag < 0:
        fail("train.schedule_lag", t.schedule_lag, "must be >= 0")
    if t.warmup_steps is not None and t.warmup_tokens is not None:
        fail("train.warmup_tokens", t.warmup_tokens, "give warmup_steps or warmup_tokens, not both")
    if t.schedule == "power":
        for key in ("a", "c"):
            if (value := getattr(t.power, key)) is None or value <= 0:
                fail(f"train.power.{key}", value, "schedule=power needs a value > 0")
        if t.warmup_tokens is not None or t.schedule_tokens is not None:
            key = "train.warmup_tokens" if t.warmup_tokens is not None else "train.schedule_tokens"
            fail(
                key,
                getattr(t, key.split(".")[1]),
                "schedule=power counts steps: give train.warmup_steps, no token horizon",
            )
    if len(t.betas) != 2:
        fail("train.betas", list(t.betas), "give two betas [beta1, beta2]")
    if not all(0 <= beta < 1 for beta in t.betas):
        fail("train.betas", list(t.betas), "each beta must be in [0, 1)")
    _check_train_numbers(t, fail)
    if t.activation_checkpointing is not None:
        _check_checkpointing(t.activation_checkpointing, fail)


def _check_train_numbers(t, fail) -> None:
    """The train section's numbers: finite, and in their domain."""
    _check_numbers(
        fail,
        ("train.lr", t.lr, t.lr > 0, "must be finite and > 0"),
        ("train.eps", t.eps, t.eps > 0, "must be finite and > 0"),
        ("train.weight_decay", t.weight_decay, t.weight_decay >= 0, "must be finite and >= 0"),
        ("train.final_lr_ratio", t.final_lr_ratio, 0 <= t.final_lr_ratio <= 1, "must be in [0, 1]"),
        (
            "train.max_grad_norm",
            t.max_grad_norm,
            t.max_grad_norm is None or t.max_grad_norm > 0,
            "must be > 0 (null: no clipping)",
        ),
        (
            "train.z_loss",
            t.z_loss,
            t.z_loss is None or t.z_loss >= 0,
            "must be finite and >= 0 (null: off)",
        ),
        ("train.max_steps", t.max_steps, t.max_steps is None or t.max_steps >= 1, "must be >= 1"),
        (
            "train.max_tokens",
            t.max_tokens,
            t.max_tokens is None or t.max_tokens >= 1,
            "must be >= 1",
        ),
        (
            "train.schedule_tokens",
            t.schedule_tokens,
            t.schedule_tokens is None or t.schedule_tokens >= 1,
            "must be >= 1",
        ),
        (
            "train.warmup_steps",
            t.warmup_steps,
            t.warmup_steps is None or t.warmup_steps >= 0,
            "must be >= 0",
        ),
        (
            "train.warmup_tokens",
            t.warmup_tokens,
            t.warmup_tokens is None or t.warmup_tokens >= 0,
            "must be >= 0",
        ),
    )


AC_MODES = ("off", "full", "selected_blocks", "selected_modules", "budget")
AC_EXAMPLE = {
    "selected_blocks": "2",
    "selected_modules": "blocks.*.feed_forward",
    "budget": "0.5",
}  # in the error line


def _check_checkpointing(ac, fail) -> None:
    """OLMo-core's own checks on its TransformerActivationCheckpointingConfig, at load, in one line
    (those that read the model: :func:`check_across`)."""
    key = "train.activation_checkpointing"
    if ac.mode not in AC_MODES:
        fail(f"{key}.mode", ac.mode, f"choose one of {', '.join(AC_MODES)} (or true, false)")
    needs = {"selected_blocks": "block_interval", "selected_modules": "modules", "budget": "budget"}
    for mode, arg in needs.items():
        if getattr(ac, arg) is not None and ac.mode != mode:
            fail(f"{key}.{arg}", getattr(ac, arg), f"applies to mode {mode} only, not {ac.mode}")
    if ac.mode in needs and getattr(ac, needs[ac.mode]) in (None, []):
        fail(
            f"{key}.{needs[ac.mode]}",
            getattr(ac, needs[ac.mode]),
            f"mode {ac.mode} needs it (e.g. {ac.mode}:{AC_EXAMPLE[ac.mode]})",
        )
    if ac.mode == "selected_blocks" and ac.block_interval < 1:  # type: ignore[operator]
        fail(
            f"{key}.block_interval",
            ac.block_interval,
            "must be >= 1 (blocks 0, n, 2n, ... are checkpointed)",
        )
    if ac.mode == "budget" and not 0 <= ac.budget <= 1:  # type: ignore[operator]
        fail(f"{key}.budget", ac.budget, "must be in [0, 1] (0: recompute everything, 1: nothing)")


def check_eval(e, fail) -> None:
    """The eval section (an EvalSpec)."""
    from ..eval.names import VALIDATION_SETS

    _check_numbers(
        fail,
        ("eval.interval", e.interval, e.interval >= 1, "must be >= 1"),
        (
            "eval.max_batches",
            e.max_batches,
            e.max_batches is None or e.max_batches >= 1,
            "must be >= 1 (null: the whole set)",
        ),
        (
            "eval.downstream_interval",
            e.downstream_interval,
            e.downstream_interval is None or e.downstream_interval >= 1,
            "must be >= 1",
        ),
    )
    if unknown := [n for n in e.validation_sets if n not in VALIDATION_SETS]:
        fail("eval.validation_sets", unknown, f"unknown; choose from {', '.join(VALIDATION_SETS)}")
    if e.downstream_sequence_length is not None and e.downstream_sequence_length < 2:
        fail(
            "eval.downstream_sequence_length",
            e.downstream_sequence_length,
            "must be >= 2 (a context token and an answer token)",
        )


def check_run(r, fail) -> None:
    """The run section (a RunSpec)."""
    _check_numbers(
        fail,
        ("run.log_interval", r.log_interval, r.log_interval >= 1, "must be >= 1"),
        ("run.save_interval", r.save_interval, r.save_interval >= 1, "must be >= 1"),
        ("run.ephemeral_keep", r.ephemeral_keep, r.ephemeral_keep >= 1, "must be >= 1"),
        (
            "run.stop_at_step",
            r.stop_at_step,
            r.stop_at_step is None or r.stop_at_step >= 1,
            "must be >= 1",
        ),
    )
    if (
        r.ephemeral_save_interval is not None
        and not 1 <= r.ephemeral_save_interval < r.save_interval
    ):
        fail(
            "run.ephemeral_save_interval",
            r.ephemeral_save_interval,
            f"must be >= 1 and < run.save_interval={r.save_interval} (null: none)",
        )
    if not r.name or "/" in r.name:
        fail("run.name", r.name, "must be a non-empty name without '/'")


# The size check: a run is refused at load when even the largest world size it allows cannot hold it
# on the largest card. That world size is W = train.global_batch_size ranks (one sequence each, FSDP
# over all of them), and each rank holds at least 16 P / W bytes of parameter states (fp32 weights,
# gradients, AdamW moments: launch/memory.py's states) plus 2 s sum_l w_l bytes, the bf16 input of
# each block for its sequence of s tokens, which full activation checkpointing still keeps (a
# sequence is not split across ranks). P counts the embedding (and the LM head unless tied) and each
# layer's floor as its kind states it (BlockKind.layer_params_floor: attention and FFN matrices,
# shapes/counts.py; none stated: no parameter); a layer whose width is solved later counts width 1
# (variable width). Lower bounds all: only a run that
# cannot fit anywhere is refused, every shipped config passes (tests/test_data_contract.py).


def _gib(n: float) -> str:
    return f"{n / 2**30:,.0f} GiB"


def check_depth(spec, fail) -> None:
    """The size check on the layers' kept inputs alone, before the model's checks build a list of
    n_layers widths (OLMo-core a list of n_layers blocks): 2 s L w bytes for one sequence."""
    m, s = spec.model, spec.data.sequence_length
    if min(m.n_layers, m.d_model, s) < 1:
        return  # the sections' checks name it
    if (kind := BLOCKS.get(m.block)) is None:
        return  # the model's checks name it
    w = m.d_model if kind.constant_width else 1  # a layer at least 1 wide
    kept = _KEPT_BYTES * s * m.n_layers * w
    if kept > _LARGEST_CARD:
        key = _size_key(fail, ("model.n_layers", "data.sequence_length", "model.d_model"))
        fail(
            key,
            _value(spec, key),
            f"{m.n_layers:,} layers keep {_gib(kept)} for one sequence of {s} tokens even fully "
            f"checkpointed ({_KEPT_BYTES} bytes x {w} wide a token a layer), over the largest "
            f"card's {_gib(_LARGEST_CARD)}",
        )


def _size_key(fail, keys) -> str:
    """The size check names the first of ``keys`` set on the command line, else the first."""
    return next((k for k in keys if fail.where(k) == "command line"), keys[0])


def _value(spec, key: str):
    section, name = key.split(".")
    return getattr(getattr(spec, section), name)


def counted_params(m, vocab: int) -> int:
    """The parameters the size check counts for a model ``m`` (a ModelSpec) of ``vocab`` ids: the
    embedding, an untied LM head, each layer's floor of attention and FFN matrices (its kind's
    ``layer_params_floor``; no norms)."""
    return vocab * m.d_model * (1 if m.tie_embeddings else 2) + m.n_layers * block_of(
        m
    ).layer_params_floor(m)


def check_size(spec, fail, vocab: int) -> None:
    """The size check (the rule above), the model's parameters counted: one line naming them and the
    bytes a rank needs."""
    m, s, g = spec.model, spec.data.sequence_length, spec.train.global_batch_size
    params = counted_params(m, vocab)
    states = _STATE_BYTES * params / g
    kept = _KEPT_BYTES * s * m.n_layers * (m.d_model if block_of(m).constant_width else 1)
    if states + kept > _LARGEST_CARD:
        keys = (
            "model.n_layers",
            "model.d_model",
            "model.vocab_size",
            "train.global_batch_size",
            "data.sequence_length",
        )
        key = _size_key(fail, keys)
        fail(
            key,
            _value(spec, key),
            f"{params:,} parameters need {_gib(states + kept)} a GPU even on {g} GPUs (one "
            f"sequence each, {_STATE_BYTES} bytes a parameter sharded, inputs checkpointed), over "
            f"the largest card's {_gib(_LARGEST_CARD)}",
        )


def check_across(spec, fail, tokenizer_size: int, vocab: int) -> None:
    """The checks that read two sections: tokens per step, float8 with an MoE, stop_at_step against
    the step count, the vocabulary (``vocab``) against the tokenizer's and every matrix's size (in
    Python integers), flash attention's precision, and activation checkpointing against the model
    (built on the meta device)."""
    m, t, d = spec.model, spec.train, spec.data
    if t.global_batch_size * d.sequence_length > _MAX_STEP_TOKENS:
        fail(
            "train.global_batch_size",
            t.global_batch_size,
            f"{t.global_batch_size * d.sequence_length:.3g} tokens per step (x "
            f"data.sequence_length={d.sequence_length}) is over 2^32",
        )
    if t.float8 != "off" and block_of(m).routed_experts(m):
        fail(
            "train.float8",
            t.float8,
            "float8 MoE experts are not supported (torchao converts nn.Linear, not OLMo-core's "
            "grouped experts)",
        )
    r, steps = spec.run, spec.steps
    if r.stop_at_step is not None and steps is not None and r.stop_at_step > steps:
        fail(
            "run.stop_at_step",
            r.stop_at_step,
            f"past the end of training ({steps} steps); drop it to train to the end",
        )
    if m.vocab_size is not None and m.vocab_size < tokenizer_size:
        fail(
            "model.vocab_size",
            m.vocab_size,
            f"smaller than the {d.tokenizer} tokenizer's {tokenizer_size} tokens",
        )
    hidden_key = "model.d_ff" if m.d_ff is not None else "model.ffn_ratio"
    # dolma2's is fixed
    vocab_key = "model.vocab_size" if m.vocab_size is not None else "data.demo_vocab_size"
    for key, rows, cols in (
        ("model.d_model", m.d_model, m.d_model),
        (hidden_key, m.d_model, m.resolved_d_ff),
        (vocab_key, vocab, m.d_model),
    ):
        if rows * cols > _MAX_MATRIX:
            section, name = key.split(".")
            fail(
                key,
                getattr(m if section == "model" else d, name),
                f"a {rows} x {cols} weight matrix is over 2^40 elements",
            )
    check_size(spec, fail, vocab)
    if m.attention_backend.startswith("flash_") and t.precision == "fp32":
        fail(
            "model.attention_backend",
            m.attention_backend,
            "flash attention needs train.precision=bf16",
        )
    _check_checkpointing_against_model(spec, fail)


def _check_checkpointing_against_model(spec, fail) -> None:
    """train.activation_checkpointing against the model: no whole MoE blocks, and module globs
    that match modules of the model (built on the meta device), none of them an MoE."""
    m, ac = spec.model, spec.train.activation_checkpointing
    if ac is None:
        return
    key = "train.activation_checkpointing"
    if block_of(m).routed_experts(m) and ac.mode in ("full", "selected_blocks"):
        fail(
            key,
            ac,
            "OLMo-core cannot checkpoint MoE blocks whole; use "
            "selected_modules:blocks.*.attention, false or null",
        )
    if ac.mode == "selected_modules":
        from olmo_core.nn.moe import MoEBase

        names = dict(spec.model_config().build(init_device="meta").named_modules())
        for glob in ac.modules:  # type: ignore[union-attr]
            matched = [n for n in names if fnmatch(n, glob)]
            if not matched:
                fail(
                    f"{key}.modules",
                    glob,
                    "matches no module of the model (e.g. blocks.*.attention, "
                    "blocks.*.feed_forward)",
                )
            if any(isinstance(names[n], MoEBase) for n in matched):
                fail(
                    f"{key}.modules",
                    glob,
                    "matches an MoE module, which OLMo-core cannot checkpoint; use "
                    "blocks.*.attention",
                )
