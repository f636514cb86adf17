"""The attention kernel at every head dim of every shipped config (configs/*/*.yaml, variable width:
each layer's w_l / n_heads): the backend the trainer picks (``auto``: flash-attn 3 or 2 where it
runs) in bf16 against torch SDPA in fp32, logits and gradients of a one-layer model. On CUDA a
flash-attn that does not import is a FAIL row, flash-attn 3 on Hopper too
(``--allow-missing flash_attn_2`` / ``flash_attn_3``: a SKIP row, and the head dims run what
``auto`` picks without it, torch SDPA's CUDA kernels at worst). A rehearsal runs three head dims
(the smallest, the largest and the first that is not a multiple of 8) with torch SDPA in bf16
standing in for the kernel. Then torch SDPA's own kernels, timed per head dim (the table
nn/attention.py's SDPA_KERNELS is filled from)."""

import statistics
import time

import pytest
import torch
import torch.nn.functional as F

from olmo_patches.nn.attention import resolve_attention_backend

from .table import DEPENDENCIES, probe
from ._common import (
    BF16_TOL,
    build,
    compare,
    forward_backward,
    shipped_head_dims,
    small_spec,
    token_ids,
)

pytestmark = pytest.mark.gpu


def _dims(rehearse: bool) -> tuple[int, ...]:
    dims = shipped_head_dims()
    if rehearse:
        return tuple(sorted({dims[0], dims[-1], next((d for d in dims if d % 8), dims[0])}))
    return dims


def test_flash_attn_imports(env, rows):
    if not env.cuda:
        choice = resolve_attention_backend("auto", [128], cuda=False, bf16=True)
        rows.show("flash attention", choice.name, "rehearsal: no CUDA device, torch SDPA stands in")
        return
    env.need("flash_attn_2", "flash-attn 2 at every shipped head dim")
    fa3 = probe(DEPENDENCIES["flash_attn_3"])[0] is not None
    choice = resolve_attention_backend("auto", [128], cuda=True, bf16=True)
    expected = "flash_3" if env.hopper and fa3 else "flash_2"
    rows.judge(
        "auto's kernel (head_dim 128)", choice.name, choice.name == expected, expected, str(choice)
    )
    rows.check()
    if (
        env.hopper and not fa3
    ):  # flash-attn 2 checked above; flash-attn 3 a SKIP (allowed) or a FAIL
        env.need("flash_attn_3", "the kernel auto picks on H100/H200")


def test_every_shipped_head_dim(env, rows):
    dims = _dims(env.rehearse)
    rows.show("head dims checked", str(len(dims)), f"{dims[0]} to {dims[-1]}")
    for head_dim in dims:
        choice = resolve_attention_backend("auto", [head_dim], cuda=env.cuda, bf16=True)
        spec = small_spec(
            ["model.n_heads=2", f"model.head_dim={head_dim}", "model.n_layers=1"], env.device
        )
        ids = token_ids(spec, env.device, 64 if env.rehearse else 1024, seed=2)
        ref = forward_backward(build(spec, env.device), ids, bf16=False)
        got = forward_backward(build(spec, env.device, backend=choice.name), ids, bf16=True)
        detail = "CPU: torch SDPA in bf16 stands in for the kernel" if not env.cuda else str(choice)
        compare(
            rows,
            f"{choice.name} (bf16) vs torch SDPA (fp32), head_dim {head_dim}",
            got,
            ref,
            detail,
        )
    assert BF16_TOL > 0
    rows.check()


# The head dims the SDPA kernel table covers: the kernels' own (64, 96, 128) and the hourglass
# headline configs' (72: 113M, 56: 906M, 152: 1B, 218: 403M), each layer's of paper 2's shapes
# falling between them.
SDPA_HEAD_DIMS = (56, 64, 72, 96, 128, 152, 218)


def _sdpa_seconds(kernel, q, k, v, steps: int) -> float:
    """Median seconds of a causal SDPA forward + backward with only ``kernel`` enabled."""
    from torch.nn.attention import sdpa_kernel

    grad = torch.randn_like(q)
    times = []
    with sdpa_kernel([kernel]):
        for i in range(steps + 2):
            sync = torch.cuda.synchronize if q.is_cuda else (lambda: None)
            sync()
            start = time.perf_counter()
            F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)
            sync()
            if i >= 2:  # two warm-up calls
                times.append(time.perf_counter() - start)
    return statistics.median(times)


def test_sdpa_kernels_per_head_dim(env, rows):
    """torch SDPA's flash, cuDNN and memory-efficient kernels one at a time, bf16, causal, forward +
    backward (3.5 x the forward's 2 S^2 head_dim FLOPs per head, causal), at each head dim of
    SDPA_HEAD_DIMS with heads x head_dim about 2048 wide: TFLOP/s each, and the fastest, the row for
    nn/attention.py's SDPA_KERNELS. Shown, not judged (a kernel that refuses the shape says so)."""
    from torch.nn.attention import SDPBackend

    kernels = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
    }
    batch, seq, steps = (1, 128, 1) if env.rehearse else (2, 4096, 5)
    fastest = {}
    for d in SDPA_HEAD_DIMS:
        heads = max(1, round((256 if env.rehearse else 2048) / d))
        shape = (batch, heads, seq, d)
        q, k, v = (
            torch.randn(shape, device=env.device, dtype=torch.bfloat16, requires_grad=True)
            for _ in range(3)
        )
        flops = 3.5 * 2 * batch * heads * seq * seq * d
        speed = {}
        for name, kernel in kernels.items():
            try:
                speed[name] = flops / _sdpa_seconds(kernel, q, k, v, steps) / 1e12
            except RuntimeError as e:  # "No available kernel": this kernel refuses the shape
                rows.show(f"SDPA {name}, head_dim {d}", "refused", str(e).splitlines()[0][:120])
                continue
            rows.show(f"SDPA {name}, head_dim {d}: TFLOP/s", f"{speed[name]:.4g}", f"{heads} heads")
        if speed:
            fastest[d] = max(speed, key=speed.get)
    rows.show(
        "SDPA_KERNELS (nn/attention.py)",
        repr(fastest),
        "the fastest kernel per head dim"
        + (": rehearsal, not a measurement" if env.rehearse else ""),
    )
