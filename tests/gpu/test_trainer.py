"""OLMo-core Trainer steps for the 113M and 1B baseline and hourglass configs on synthetic tokens,
bf16, with the hardware preset's micro-batch, compile and activation checkpointing: information
rows, not the hourglass claim (tests/gpu/test_ffn.py measures the FFNs alone). Each run's row names
what it measured: the attention kernel, the LM loss kernel, float8, compile and activation
checkpointing. Shown: tokens/s, MFU (OLMo-core's FLOPs per token over the card's dense bf16 peak in
launch/cards.py) with the attention (weights and SDPA) and LM-head shares of those FLOPs, and
hourglass / baseline MFU and tokens/s. Judged: the peak memory the caching allocator reserved
against the memory model's estimate (launch/memory.py estimate, for the same model, sequence,
micro-batch and checkpointing mode): reserved <= estimate (the preset fits) and estimate <= 1.5 x
reserved (not so loose that presets waste the card); and what the run left allocated once it
returned (at most LEFT_GIB: a returned run keeps nothing alive). The estimate's logits term was
measured eager; the row says when the run compiled its head. A rehearsal runs the same configs at
toy sizes on the CPU in fp32 (no preset, no compile): figures shown."""

from dataclasses import dataclass

import pytest
import torch

from olmo_patches.config import vocab_size
from olmo_patches.launch.layout import Layout, memory_estimate
from olmo_patches.launch.cards import GIB, known_card
from olmo_patches.launch.layout import attention_backend
from olmo_patches.nn.lm_loss import lm_loss
from olmo_patches.report.counts import count

from ._common import REPO, timed_run

pytestmark = pytest.mark.gpu
ESTIMATE_SLACK = 1.5  # estimate / reserved at most
LEFT_GIB = 0.5  # left allocated by a returned run at most (a kept 113M baseline: 3.1 GiB)
# (global batch in sequences of 4096 tokens) per scale: a few seconds of steps each on one H200
SCALES = {"113M": 32, "1B": 16}
TOY = [
    "train.hardware=none",
    "train.precision=fp32",
    "train.compile=false",
    "train.micro_batch_size=null",
    "model.d_model=32",
    "model.n_heads=2",
    "model.n_layers=2",
]


@dataclass
class Figures:
    tokens_per_s: float
    mfu: float | None


def _judge_memory(rows, run, what: str) -> None:
    """The run's peak reserved memory against the memory model's estimate, both ways."""
    t = run.spec.train
    est = (
        memory_estimate(run.spec, Layout.from_env()).total(
            t.micro_batch_size, t.activation_checkpointing
        )
        / GIB
    )
    reserved = run.peak_reserved_gib
    value = f"{reserved:.2f} GiB" if reserved is not None else "-"
    rows.judge(
        f"{what}: peak reserved <= estimate",
        value,
        reserved is not None and reserved <= est,
        f"<= {est:.2f} GiB",
        (
            "head and loss compiled; the estimate's logits term was measured eager"
            if t.compile
            else "eager, as estimated"
        )
        + (
            ""
            if reserved is None
            else f"; peak allocated {run.peak_allocated_gib:.2f} GiB, "
            f"{run.held_before_gib:.2f} GiB held before the run"
        ),
        gpu_only=True,
    )
    rows.judge(
        f"{what}: allocated once it returned, beyond before it",
        "-" if run.left_gib is None else f"{run.left_gib:.2f} GiB",
        run.left_gib is not None and run.left_gib <= LEFT_GIB,
        f"<= {LEFT_GIB} GiB",
        "what the run kept alive (OLMo-core's lru_cache on num_flops_per_token kept every model)",
        gpu_only=True,
    )
    rows.judge(
        f"{what}: estimate / peak reserved",
        "-" if not reserved else f"{est / reserved:.2f}",
        reserved is not None and est <= ESTIMATE_SLACK * reserved,
        f"<= {ESTIMATE_SLACK}",
        gpu_only=True,
    )


def _run(env, rows, scale: str, variant: str) -> Figures:
    config = REPO / "configs" / scale / f"{variant}.yaml"
    if env.rehearse:
        overrides = [*TOY, *(["model.d_h=16"] if variant == "hourglass" else [])]
        seq, batch, steps, warmup = 32, 4, 3, 1
    else:
        overrides = ["train.precision=bf16"]
        seq, batch, steps, warmup = 4096, SCALES[scale], 6, 2
    run = timed_run(
        config,
        overrides,
        env.work / f"{scale}-{variant}",
        env.device,
        seq=seq,
        batch=batch,
        steps=steps,
        warmup=warmup,
    )
    t = run.spec.train
    assert t.micro_batch_size is not None and t.activation_checkpointing is not None
    model = run.spec.model.build(vocab_size(run.spec))
    flops = model.build(init_device="meta").num_flops_per_token(seq)
    parts = count(run.spec)
    head = 6 * run.spec.model.d_model * vocab_size(run.spec)  # the LM head's matmul (tied or not)
    attention = flops - 6 * parts.ffn - head  # the attention weights and SDPA's QK^T and PV
    card = known_card(torch.cuda.get_device_name(env.device)) if env.cuda else None
    mfu = run.tokens_per_s * flops / card.bf16_flops if card and card.bf16_flops else None
    what = f"{scale} {variant}" + (" (toy)" if env.rehearse else "")
    device = env.device.type
    setting = (
        f"attention {attention_backend(run.spec, device).name}, "
        f"loss {lm_loss(run.spec, device).name}, "
        f"float8 {t.float8}, compile {'on' if t.compile else 'off'}, "
        f"checkpointing {t.activation_checkpointing}, "
        f"micro-batch {t.micro_batch_size}"
    )
    rows.show(f"{what}: tokens/s", f"{run.tokens_per_s:,.0f}", setting)
    rows.show(
        f"{what}: MFU",
        "-" if mfu is None else f"{100 * mfu:.1f}%",
        f"{card.name if card else 'no datasheet peak for this device'}; of the FLOPs: attention "
        f"{attention / flops:.0%}, LM head {head / flops:.0%}",
    )
    _judge_memory(rows, run, what)
    return Figures(run.tokens_per_s, mfu)


@pytest.mark.parametrize("scale", SCALES)
def test_trainer_steps(scale, env, rows):
    base, hourglass = _run(env, rows, scale, "baseline"), _run(env, rows, scale, "hourglass")
    tps = hourglass.tokens_per_s / base.tokens_per_s
    ratio = hourglass.mfu / base.mfu if base.mfu and hourglass.mfu else None
    rows.show(
        f"{scale}: MFU hourglass / baseline",
        "-" if ratio is None else f"{ratio:.3f}",
        f"tokens/s hourglass / baseline {tps:.3f}; information: "
        "the FFN claim is the FFN vs FFN section",
    )
    rows.check()
