"""The attention kernel at every head dim of every shipped config (configs/*/*.yaml, variable width: each
layer's w_l / n_heads): the backend the trainer picks (``auto``: flash-attn 3 or 2 where it runs) in bf16
against torch SDPA in fp32, logits and gradients of a one-layer model. On CUDA a flash-attn that does not
import is a FAIL row (``--no-flash``: torch SDPA's own CUDA kernels in bf16 are checked instead, and the
flash row is skipped saying so). A rehearsal runs three head dims (the smallest, the largest and the first
that is not a multiple of 8) with torch SDPA in bf16 standing in for the kernel."""

import pytest

from olmo_patches.nn.attention import resolve_attention_backend

from ._common import BF16_TOL, build, compare, forward_backward, shipped_head_dims, small_spec, token_ids

pytestmark = pytest.mark.gpu


def _dims(rehearse: bool) -> tuple[int, ...]:
    dims = shipped_head_dims()
    if rehearse:
        return tuple(sorted({dims[0], dims[-1], next((d for d in dims if d % 8), dims[0])}))
    return dims


def test_flash_attn_imports(env, rows):
    choice = resolve_attention_backend("auto", [128], cuda=env.cuda, bf16=True)
    if not env.cuda:
        rows.show("flash attention", choice.name, "rehearsal: no CUDA device, torch SDPA stands in")
    elif not choice.name.startswith("flash") and not env.flash:
        pytest.skip(f"--no-flash: {choice}")
    else:
        rows.judge(
            "flash attention imports (head_dim 128)",
            choice.name,
            choice.name.startswith("flash"),
            "flash_3 or flash_2",
            ""
            if choice.name.startswith("flash")
            else f"{choice}: install a flash-attn wheel with the wheelhouse, or pass --no-flash",
        )
    rows.check()


def test_every_shipped_head_dim(env, rows):
    dims = _dims(env.rehearse)
    rows.show("head dims checked", str(len(dims)), f"{dims[0]} to {dims[-1]}")
    for head_dim in dims:
        choice = resolve_attention_backend("auto", [head_dim], cuda=env.cuda, bf16=True)
        spec = small_spec(["model.n_heads=2", f"model.head_dim={head_dim}", "model.n_layers=1"], env.device)
        ids = token_ids(spec, env.device, 64 if env.rehearse else 1024, seed=2)
        ref = forward_backward(build(spec, env.device), ids, bf16=False)
        got = forward_backward(build(spec, env.device, backend=choice.name), ids, bf16=True)
        detail = "CPU: torch SDPA in bf16 stands in for the kernel" if not env.cuda else str(choice)
        compare(rows, f"{choice.name} (bf16) vs torch SDPA (fp32), head_dim {head_dim}", got, ref, detail)
    assert BF16_TOL > 0
    rows.check()
