"""The hourglass FFN against a baseline SwiGLU of equal FLOPs, alone: forward and backward of each
at a shipped shape, timed side by side (interleaved repeats, median), achieved TFLOP/s each and
their ratio, beside the ratio the roofline allows (shapes/roofline.py).

The pair at a config's (d_model, K, d_h): the hourglass as the model builds it (K norms, K sub-MLPs,
K residual adds) and a pre-norm SwiGLU with hidden width K d_h, its norm and its residual add
(OLMo-core's FeedForward): the same 3 K d_h d_model matmul weights, so the same matmul FLOPs per
token, 6 per weight forward and backward. The claim (paper 1: the hourglass is a reallocation of
parameters, not of cost): hourglass TFLOP/s / baseline TFLOP/s >= FFN_RATIO.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
import time
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn as nn
from olmo_core.nn.feed_forward import FeedForwardConfig

from olmo_patches.config import load_spec

FFN_RATIO = 0.95  # hourglass / baseline achieved TFLOP/s at equal FLOPs (K = 1: 1.0)


class SwiGLUResidual(nn.Module):
    """h + FFN(norm(h)): the baseline block's FFN half."""

    def __init__(
        self,
        d_model: int,
        hidden: int,
        norm: nn.Module,
        *,
        dtype: torch.dtype,
        device: torch.device,
    ):
        super().__init__()
        self.norm = norm
        self.ffn = FeedForwardConfig(hidden_size=hidden, bias=False).build(
            d_model, dtype=dtype, init_device=str(device)
        )

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.ffn(self.norm(h))


def ffn_pair(
    config: Path, device: torch.device, dtype: torch.dtype, toy: bool = False
) -> tuple[nn.Module, nn.Module, int]:
    """(hourglass FFN, baseline SwiGLU of equal FLOPs, matmul weights of each) at ``config``'s
    shape; ``toy``: d_model and d_h cut 16-fold (to multiples of 16), K kept."""
    spec = load_spec(config)
    block = spec.model_config().block
    ff, d_model = block.feed_forward, spec.model.d_model
    if toy:
        ff, d_model = (
            replace(ff, hidden_size=16 * -(-ff.hidden_size // 256)),
            16 * -(-d_model // 256),
        )
    hourglass = ff.build(d_model, dtype=dtype, init_device=str(device))
    norm = block.layer_norm.build(d_model, init_device=str(device))
    baseline = SwiGLUResidual(d_model, ff.K * ff.hidden_size, norm, dtype=dtype, device=device)
    torch.manual_seed(0)
    for m in (hourglass, baseline):
        for name, p in m.named_parameters():
            if p.ndim == 2:
                nn.init.normal_(p, std=0.02)
    return hourglass, baseline, 3 * ff.K * ff.hidden_size * d_model


def to_float8(module: nn.Module, emulate: bool, tokens: int, roof) -> nn.Module:
    """module's matmuls in float8, tensorwise, as train.float8=tensorwise converts them at a
    micro-batch of ``tokens`` on the card of ``roof`` (nn/float8.py: those whose sizes win)."""
    from olmo_core.float8 import AOFloat8LinearRecipe

    from olmo_patches.nn.float8 import ShapeFloat8Config

    ShapeFloat8Config(
        ao_recipe=AOFloat8LinearRecipe("tensorwise"), emulate=emulate, tokens=tokens, roof=roof
    ).apply_float8_linear(module)
    return module


def fwd_bwd(module: Callable, x: torch.Tensor, grad: torch.Tensor) -> None:
    x.grad = None
    for p in getattr(module, "parameters", lambda: [])():
        p.grad = None
    module(x).backward(grad)


def seconds_per_step(
    modules: dict[str, Callable], x: torch.Tensor, *, steps: int, repeats: int, warmup: int = 2
) -> dict[str, float]:
    """Median seconds of one forward+backward per module, timed interleaved (``repeats`` rounds of
    ``steps`` steps each, one module after the other), after ``warmup`` untimed steps each
    (compiles)."""
    grad = torch.randn_like(x)
    sync = torch.cuda.synchronize if x.device.type == "cuda" else (lambda: None)
    for m in modules.values():
        for _ in range(warmup):
            fwd_bwd(m, x, grad)
    times: dict[str, list[float]] = {name: [] for name in modules}
    for _ in range(repeats):
        for name, m in modules.items():
            sync()
            start = time.perf_counter()
            for _ in range(steps):
                fwd_bwd(m, x, grad)
            sync()
            times[name].append((time.perf_counter() - start) / steps)
    return {name: statistics.median(t) for name, t in times.items()}


def judge_pair(
    rows,
    label: str,
    seconds: dict[str, float],
    weights: int,
    tokens: int,
    *,
    gpu_only: bool,
    detail: str = "",
    threshold: float = FFN_RATIO,
) -> float:
    """Rows: each side's achieved TFLOP/s (6 FLOPs per weight per token) and the judged ratio."""
    flops = 6 * weights * tokens
    tflops = {name: flops / s / 1e12 for name, s in seconds.items()}
    for name, value in tflops.items():
        rows.show(
            f"{label}: {name} TFLOP/s", f"{value:.3g}", f"{seconds[name] * 1e3:.3f} ms a step"
        )
    ratio = tflops["hourglass"] / tflops["baseline"]
    rows.judge(
        f"{label}: hourglass / baseline TFLOP/s",
        f"{ratio:.3f}",
        ratio >= threshold,
        f">= {threshold}",
        detail or f"{tokens} tokens, equal matmul FLOPs",
        gpu_only=gpu_only,
    )
    return ratio


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().float().flatten(), b.detach().float().flatten()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def float8_error(
    bf16: nn.Module, float8: nn.Module, x: torch.Tensor
) -> tuple[float, Optional[float]]:
    """(output, input gradient) relative errors of ``float8`` against ``bf16`` (the same weights),
    on the FFN's own contribution: FFN(x) - x, not x itself, which the residual carries exactly."""
    outs = []
    for m in (bf16, float8):
        xi = x.detach().clone().requires_grad_(True)
        out = m(xi)
        (out - xi).float().pow(2).sum().backward()
        outs.append(((out - xi).detach(), xi.grad))
    return relative(outs[1][0], outs[0][0]), relative(outs[1][1], outs[0][1])
