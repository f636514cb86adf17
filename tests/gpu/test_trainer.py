"""OLMo-core Trainer steps for the 113M and 1B baselines and their head-dim-native hourglass
siblings (configs/*/hourglass-hd*.yaml: the headline shapes with attention at a native head dim) on
synthetic tokens, bf16, with the hardware preset's micro-batch, compile and activation
checkpointing, and the 1B baseline in float8 (train.float8=tensorwise: the matmuls whose sizes win,
nn/float8.py). Each run's row names what it measured: the attention kernel, the LM loss kernel,
float8, compile and activation checkpointing. Shown: tokens/s, MFU (OLMo-core's FLOPs per token over
the card's dense bf16 peak in launch/cards.py) with the attention (weights and SDPA) and LM-head
shares of those FLOPs. Judged: hourglass / baseline MFU >= MFU_RATIO; 1B float8 / bf16 tokens/s >=
FLOAT8_SPEEDUP and its losses within LOSS_TOL of bf16's; the peak memory the caching allocator
reserved against the memory model's estimate (launch/memory.py estimate, for the same model,
sequence, micro-batch, checkpointing mode and compile: its compiled terms, the fp32 stream of one
process): reserved <= estimate (the preset fits) and estimate <= ESTIMATE_SLACK x reserved (not so
loose that presets waste the card); and what the run left allocated once it returned (at most
LEFT_GIB: a returned run keeps nothing alive). The compile section runs the same shapes eager and
judges their peaks against the eager estimate (:func:`eager_peaks`). A rehearsal runs the same
configs at toy sizes on the CPU in fp32 (no preset, no compile): figures shown."""

from dataclasses import dataclass

import pytest
import torch

from olmo_patches.config import vocab_size
from olmo_patches.launch.layout import Layout, memory_estimate
from olmo_patches.launch.cards import GIB, known_card
from olmo_patches.launch.layout import attention_backend
from olmo_patches.nn.float8 import has_float8_matmuls
from olmo_patches.nn.lm_loss import lm_loss
from olmo_patches.report.counts import count

from ._common import REPO, timed_run

pytestmark = pytest.mark.gpu
ESTIMATE_SLACK = 1.15  # estimate / reserved at most
MFU_RATIO = 0.95  # hourglass / baseline whole-model MFU
FLOAT8_SPEEDUP = 1.15  # 1B float8 / bf16 tokens/s
LOSS_TOL = 0.05  # float8 vs bf16 loss, relative, at each step
LEFT_GIB = 0.5  # left allocated by a returned run at most (a kept 113M baseline: 3.1 GiB)
# (global batch in sequences of 4096 tokens, the hourglass sibling) per scale: a few seconds of
# steps each on one H200
SCALES = {"113M": (32, "hourglass-hd96"), "1B": (16, "hourglass-hd128")}
TOY = [
    "train.hardware=none",
    "train.precision=fp32",
    "train.compile=false",
    "train.micro_batch_size=null",
    "model.d_model=32",
    "model.n_heads=2",
    "model.n_layers=2",
    "model.head_dim=null",
]


@dataclass
class Figures:
    tokens_per_s: float
    mfu: float | None


def _judge_memory(rows, run, what: str) -> None:
    """The run's peak reserved memory against the memory model's estimate, both ways."""
    t = run.spec.train
    est = memory_estimate(run.spec, Layout.from_env())
    gib = est.total(t.micro_batch_size, t.activation_checkpointing) / GIB
    terms = f"{'compiled' if est.compiled else 'eager'} terms, " + (
        "bf16 stream (FSDP)" if est.residual_bytes == 2 else "fp32 stream (autocast)"
    )
    reserved = run.peak_reserved_gib
    value = f"{reserved:.2f} GiB" if reserved is not None else "-"
    rows.judge(
        f"{what}: peak reserved <= estimate",
        value,
        reserved is not None and reserved <= gib,
        f"<= {gib:.2f} GiB",
        terms
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
        "-" if not reserved else f"{gib / reserved:.2f}",
        reserved is not None and gib <= ESTIMATE_SLACK * reserved,
        f"<= {ESTIMATE_SLACK}",
        terms,
        gpu_only=True,
    )


def _run(
    env, rows, scale: str, variant: str, float8: str = "off", eager: bool = False
) -> tuple[Figures, list]:
    """The trainer on ``scale``'s ``variant`` config; ``eager``: compile off, 2 steps (memory)."""
    config = REPO / "configs" / scale / f"{variant}.yaml"
    if env.rehearse:
        overrides = [*TOY, *(["model.d_h=16"] if variant.startswith("hourglass") else [])]
        seq, batch, steps, warmup = 32, 4, 3, 1
    else:
        overrides = ["train.precision=bf16", *(["train.compile=false"] if eager else [])]
        seq, batch, steps, warmup = 4096, SCALES[scale][0], 2 if eager else 6, 1 if eager else 2
    overrides.append(f"train.float8={float8}")
    run = timed_run(
        config,
        overrides,
        env.work / f"{scale}-{variant}-{float8}",
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
    what = f"{scale} {variant}" + (f" float8 {float8}" if float8 != "off" else "")
    what += (" eager" if eager else "") + (" (toy)" if env.rehearse else "")
    device = env.device.type
    setting = (
        f"attention {attention_backend(run.spec, device).name}, "
        f"loss {lm_loss(run.spec, device).name}, "
        f"float8 {t.float8}, compile {'on' if t.compile else 'off'}, "
        f"checkpointing {t.activation_checkpointing}, "
        f"micro-batch {t.micro_batch_size}"
    )
    if eager:  # memory alone: 2 steps (the second's backward holds AdamW's moments too)
        _judge_memory(rows, run, what)
        return Figures(run.tokens_per_s, None), run.losses
    rows.show(f"{what}: tokens/s", f"{run.tokens_per_s:,.0f}", setting)
    rows.show(
        f"{what}: MFU",
        "-" if mfu is None else f"{100 * mfu:.1f}%",
        f"{card.name if card else 'no datasheet peak for this device'}; of the FLOPs: attention "
        f"{attention / flops:.0%}, LM head {head / flops:.0%}",
    )
    _judge_memory(rows, run, what)
    return Figures(run.tokens_per_s, mfu), run.losses


@pytest.mark.parametrize("scale", SCALES)
def test_trainer_steps(scale, env, rows):
    sibling = SCALES[scale][1]
    (base, bf16_losses), (hourglass, _) = (_run(env, rows, scale, v) for v in ("baseline", sibling))
    tps = hourglass.tokens_per_s / base.tokens_per_s
    ratio = hourglass.mfu / base.mfu if base.mfu and hourglass.mfu else None
    rows.judge(
        f"{scale}: MFU {sibling} / baseline",
        "-" if ratio is None else f"{ratio:.3f}",
        ratio is not None and ratio >= MFU_RATIO,
        f">= {MFU_RATIO}",
        f"tokens/s {sibling} / baseline {tps:.3f}",
        gpu_only=True,
    )
    if scale == "1B":
        env.need("torchao", "float8 against bf16 in the trainer")
        f8, losses = _run(env, rows, scale, "baseline", "tensorwise")
        speed = f8.tokens_per_s / base.tokens_per_s
        detail = f"{f8.tokens_per_s:,.0f} / {base.tokens_per_s:,.0f} tokens/s"
        if not has_float8_matmuls(env.device):
            detail += "; no float8 matmuls here (torchao emulates): not judged"
        rows.judge(
            "1B: tokens/s float8 / bf16",
            f"{speed:.3f}",
            speed >= FLOAT8_SPEEDUP,
            f">= {FLOAT8_SPEEDUP}",
            detail,
            gpu_only=True,
        )
        worst = max(abs(a - b) / abs(b) for a, b in zip(losses, bf16_losses))
        rows.judge(
            f"1B: loss float8 vs bf16, steps 1-{len(losses)} (worst)",
            f"{worst:.2e}",
            len(losses) == len(bf16_losses) and worst <= LOSS_TOL,
            f"<= {LOSS_TOL}",
            " ".join(f"{a:.4f}/{b:.4f}" for a, b in zip(losses, bf16_losses)),
        )
    rows.check()


def eager_peaks(env, rows, scale: str) -> None:
    """The compile section's memory rows: each trainer shape of ``scale`` eager (compile off, the
    preset's micro-batch and mode for the eager estimate), its peak against the eager estimate."""
    for variant in ("baseline", SCALES[scale][1]):
        _run(env, rows, scale, variant, eager=True)
