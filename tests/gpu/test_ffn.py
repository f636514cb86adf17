"""The hourglass FFN against a baseline SwiGLU of equal FLOPs, alone (tests/gpu/ffn.py): forward and
backward, compiled (inductor), at the shipped 113M and 1B shapes, their aligned siblings and the
authors' revised 906M, at a real micro-batch (65,536 tokens: 16 x 4096). Judged: hourglass /
baseline TFLOP/s >= 0.95 (K = 1, the 1B shapes: >= 1.0) in bf16, shown beside the roofline's bound
for that ratio on this card (shapes/roofline.py: what is left to win); the compiled hourglass
against eager (BF16_TOL); float8 as the trainer converts it (train.float8=tensorwise: each matmul
where its sizes win on this card, nn/float8.py): hourglass float8 / bf16 >= FLOAT8_NEVER_LOSES, and
where a matmul converted, the FFN's output against bf16 within FLOAT8_TOL. A rehearsal runs them
eager on the CPU, d_model and d_h cut 16-fold, 64 tokens (float8 emulated, every aligned matmul):
ratios shown.
"""

import copy

import pytest
import torch

from olmo_patches.launch.cards import CARDS, known_card
from olmo_patches.nn.float8 import float8_matmuls, has_float8_matmuls
from olmo_patches.shapes.roofline import ffn_roofline_ratio

from ._common import BF16_TOL, REPO, rel
from .ffn import FFN_RATIO, ffn_pair, float8_error, judge_pair, seconds_per_step, to_float8

pytestmark = pytest.mark.gpu
CONFIGS = (
    "113M/hourglass",
    "113M/hourglass-aligned",
    "1B/hourglass",
    "1B/hourglass-aligned",
    "906M/hourglass-revised",
)
TOKENS = 16 * 4096  # a micro-batch of the 1B preset on one H100/H200
# float8 e4m3 keeps 3 significant bits (unit roundoff 2^-4); both matmul operands rounded, three
# matmuls in a row and K sub-MLPs in series: four roundoffs on the FFN's output
FLOAT8_TOL = 4 * 2.0**-4
# float8 "never loses": at least bf16's speed, less the noise of two timings (where no matmul
# converts, the two are the same work)
FLOAT8_NEVER_LOSES = 0.98


def _roof(env):
    card = known_card(torch.cuda.get_device_name(env.device)) if env.cuda else None
    return (card or CARDS["h100"]).roof, (card.name if card else "an H100's datasheet")


@pytest.mark.parametrize("config", CONFIGS)
def test_hourglass_ffn_against_swiglu(config, env, rows):
    path = REPO / "configs" / f"{config}.yaml"
    hourglass, baseline, weights = ffn_pair(path, env.device, torch.bfloat16, toy=env.rehearse)
    tokens, steps, repeats = (64, 2, 3) if env.rehearse else (TOKENS, 5, 3)
    x = torch.randn(tokens, hourglass.d_model, device=env.device, dtype=torch.bfloat16) * 0.5
    compiled = (lambda m: torch.compile(m)) if env.cuda else (lambda m: m)
    d, K, d_h = hourglass.d_model, hourglass.K, hourglass.d_h
    roof, card = _roof(env)
    real = ffn_pair(path, torch.device("meta"), torch.bfloat16)[0]  # the shipped shape
    bound = ffn_roofline_ratio(TOKENS, real.d_model, real.K, real.d_h, roof)
    shape = (
        f"d_model {d}, K {K}, d_h {d_h}; roofline {bound:.3f} (d_model {real.d_model}) on {card}"
        f" at {TOKENS} tokens"
    )
    pair = {"hourglass": compiled(hourglass), "baseline": compiled(baseline)}
    bf16 = seconds_per_step(pair, x, steps=steps, repeats=repeats)
    target = 1.0 if K == 1 else FFN_RATIO
    judge_pair(
        rows, f"{config} bf16", bf16, weights, tokens, gpu_only=True, detail=shape, threshold=target
    )
    err = rel(pair["hourglass"](x).detach(), hourglass(x).detach())
    rows.judge(
        f"{config}: compiled vs eager output",
        f"{err:.2e}",
        err <= BF16_TOL,
        f"<= {BF16_TOL:.2e}",
        "inductor" if env.cuda else "rehearsal: eager both",
    )
    env.need("torchao", "float8 on the hourglass FFN")
    emulate = not has_float8_matmuls(env.device)
    chosen = float8_matmuls(hourglass, tokens, "tensorwise", None if emulate else roof)
    kept = ", ".join(chosen["unaligned"] + chosen["small"]) or "none"
    where = "emulated: every aligned matmul" if emulate else f"at {tokens} tokens on {card}"
    if not chosen["float8"]:
        rows.show(f"{config} float8", "nothing converts", f"{where}; kept bf16: {kept}")
        rows.check()
        return
    h8, b8 = (to_float8(copy.deepcopy(m), emulate, tokens, roof) for m in (hourglass, baseline))
    f8 = seconds_per_step(
        {"hourglass": compiled(h8), "baseline": compiled(b8)}, x, steps=steps, repeats=repeats
    )
    speed = bf16["hourglass"] / f8["hourglass"]
    rows.judge(
        f"{config} float8 / bf16: hourglass FFN",
        f"{speed:.3f}",
        speed >= FLOAT8_NEVER_LOSES,
        f">= {FLOAT8_NEVER_LOSES}",
        f"{where}: {', '.join(chosen['float8'])} in float8; kept bf16: {kept}",
        gpu_only=True,
    )
    rows.show(f"{config} float8 / bf16: SwiGLU", f"{bf16['baseline'] / f8['baseline']:.3f}")
    out, grad = float8_error(hourglass, h8, x)
    rows.judge(
        f"{config} float8 vs bf16: output", f"{out:.2e}", out <= FLOAT8_TOL, f"<= {FLOAT8_TOL}"
    )
    rows.show(f"{config} float8 vs bf16: input gradient", f"{grad:.2e}", "e5m2 gradients")
    rows.check()
