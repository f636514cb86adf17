"""The hourglass FFN against a baseline SwiGLU of equal FLOPs, alone (tests/gpu/ffn.py): forward and
backward, compiled (inductor), bf16 and float8 (tensorwise, where every matmul dim is a multiple of
16), at the shipped 113M and 1B shapes, their aligned siblings and the authors' revised 906M, 8192
tokens (a micro-batch of 2 x 4096). Judged: hourglass / baseline TFLOP/s >= 0.95 each; float8 on
StackedLinear against bf16: the FFN's output within FLOAT8_TOL (its input gradient and the speed
ratio shown). A rehearsal runs them eager on the CPU, d_model and d_h cut 16-fold, 64 tokens (float8
emulated): ratios shown.
"""

import copy

import pytest
import torch

from olmo_patches.nn.float8 import has_float8_matmuls

from ._common import REPO
from .ffn import ffn_pair, float8_error, judge_pair, seconds_per_step, to_float8

pytestmark = pytest.mark.gpu
CONFIGS = (
    "113M/hourglass",
    "113M/hourglass-aligned",
    "1B/hourglass",
    "1B/hourglass-aligned",
    "906M/hourglass-revised",
)
# float8 e4m3 keeps 3 significant bits (unit roundoff 2^-4); both matmul operands rounded, three
# matmuls in a row and K sub-MLPs in series: four roundoffs on the FFN's output
FLOAT8_TOL = 4 * 2.0**-4


def _float8_able(module) -> bool:
    from olmo_patches.nn.float8 import float8_matmuls

    return not float8_matmuls(module)["skipped"]


@pytest.mark.parametrize("config", CONFIGS)
def test_hourglass_ffn_against_swiglu(config, env, rows):
    path = REPO / "configs" / f"{config}.yaml"
    hourglass, baseline, weights = ffn_pair(path, env.device, torch.bfloat16, toy=env.rehearse)
    tokens, steps, repeats = (64, 2, 3) if env.rehearse else (8192, 10, 5)
    x = torch.randn(tokens, hourglass.d_model, device=env.device, dtype=torch.bfloat16) * 0.5
    compiled = (lambda m: torch.compile(m)) if env.cuda else (lambda m: m)
    shape = f"d_model {hourglass.d_model}, K {hourglass.K}, d_h {hourglass.d_h}"
    pair = {"hourglass": compiled(hourglass), "baseline": compiled(baseline)}
    bf16 = seconds_per_step(pair, x, steps=steps, repeats=repeats)
    judge_pair(rows, f"{config} bf16", bf16, weights, tokens, gpu_only=True, detail=shape)
    if not _float8_able(
        ffn_pair(path, torch.device("meta"), torch.bfloat16)[0]
    ):  # the shipped shape
        rows.show(
            f"{config} float8",
            "not float8-able",
            f"{shape}: a dim not a multiple of 16; see its aligned sibling",
        )
        rows.check()
        return
    env.need("torchao", "float8 on StackedLinear")
    emulate = not has_float8_matmuls(env.device)
    h8, b8 = (
        to_float8(copy.deepcopy(hourglass), emulate),
        to_float8(copy.deepcopy(baseline), emulate),
    )
    f8 = seconds_per_step(
        {"hourglass": compiled(h8), "baseline": compiled(b8)}, x, steps=steps, repeats=repeats
    )
    judge_pair(
        rows,
        f"{config} float8",
        f8,
        weights,
        tokens,
        gpu_only=True,
        detail=shape + (", emulated" if emulate else ""),
    )
    out, grad = float8_error(hourglass, h8, x)
    rows.judge(
        f"{config} StackedLinear float8 vs bf16: output",
        f"{out:.2e}",
        out <= FLOAT8_TOL,
        f"<= {FLOAT8_TOL}",
    )
    rows.show(
        f"{config} StackedLinear float8 vs bf16: input gradient",
        f"{grad:.2e}",
        "e5m2 gradients: shown",
    )
    rows.show(
        f"{config} StackedLinear float8 / bf16 speed",
        f"{bf16['hourglass'] / f8['hourglass']:.3f}",
        "emulated: not a speed" if emulate else "",
    )
    rows.check()
