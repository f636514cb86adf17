"""The parallel block of tests/_parallel_block.py, which states nothing about memory, FSDP or
float8, gets them from the constant-width SwiGLU defaults of its kind: the memory model an upper
bound of what torch saves (by the norm it does not have and the FFN input it shares), its states
and FSDP buffers from the built model's parameters, and every one of its matmuls converted by
float8."""

import torch

from olmo_patches.config import vocab_size
from olmo_patches.launch.layout import load_and_resolve
from olmo_patches.launch.memory import estimate

from . import _parallel_block  # noqa: F401  (registers "parallel")
from .test_memory import DEMO, SEQ, SMALL, _saved_bytes

PARALLEL = [*SMALL, "model.block=parallel"]  # d_model 64, 4 heads, 4 layers, vocabulary 256


def _parallel():
    spec = load_and_resolve(DEMO, PARALLEL)
    model = spec.model.build(vocab_size(spec)).build(init_device="meta")
    model.init_weights(device=torch.device("cpu"), max_seq_len=SEQ)
    return spec, model


def test_memory_model_bounds_what_the_parallel_block_saves():
    """Each block in bf16 at 1 and 3 sequences: the bytes per token torch saves are the default's
    A_l less one RMSNorm (8 w + 4: the parallel block norms its input once, the default counts the
    block's two norms) and less the FFN's bf16 input (2 w: the attention's normed input, the same
    tensor, saved once), and no weight copy; the states are 16 bytes per parameter of the built
    model over 8 ranks, the FSDP buffers 16 per parameter of its largest unit (a block here)."""
    spec, model = _parallel()
    model = model.to(torch.bfloat16)
    est = estimate(spec, SEQ, shards=8)
    d, V = 64, 256
    assert len(est.layers) == 4
    for layer, block in zip(est.layers, model.blocks.values()):
        measured = {}
        for batch in (1, 3):
            x = torch.randn(batch, SEQ, d, dtype=torch.bfloat16, requires_grad=True)
            measured[batch] = _saved_bytes(lambda: block(x), model.parameters())
        per_token = (measured[3] - measured[1]) / (2 * SEQ)
        assert layer.width == d and layer.weight_copy == 0
        assert abs(layer.saved - (8 * d + 4) - 2 * d - per_token) <= 0.01 * per_token
        assert per_token < layer.saved
    params = sum(p.numel() for p in model.parameters())
    block = sum(p.numel() for p in model.blocks["0"].parameters())
    assert block > V * d  # the embedding and the LM head: 256 x 64 each
    assert est.states == 16 * params / 8 and est.buffers == 16 * block


def test_float8_converts_every_parallel_matmul():
    """float8_matmuls finds the parallel block's seven linears a layer (Q, K, V, out; w1, w2, w3),
    all multiples of 16, and not the LM head; the memory model's float8 term casts the widest matmul
    input (the SwiGLU's hidden 4 d_model) and one block's weights twice."""
    from olmo_patches.nn.float8 import float8_matmuls

    spec, model = _parallel()
    found = float8_matmuls(model)
    want = [
        f"blocks.{i}.{m}"
        for i in range(4)
        for m in (
            "attention.w_q",
            "attention.w_k",
            "attention.w_v",
            "attention.w_out",
            "feed_forward.w1",
            "feed_forward.w2",
            "feed_forward.w3",
        )
    ]
    assert sorted(found["float8"]) == sorted(want) and found["unaligned"] == found["small"] == []
    base, f8 = estimate(spec, SEQ), estimate(spec, SEQ, float8=True)
    block = sum(p.numel() for p in model.blocks["0"].parameters())
    assert f8.float8_inputs == 4 * 64 and f8.float8_weights == 2 * block
    assert base.float8_inputs == 0 and base.total(1) < f8.total(1)
