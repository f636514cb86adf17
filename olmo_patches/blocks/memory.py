"""What the memory model (launch/memory.py) reads of a model: each layer's terms in plain numbers,
stated by the model's kind (``BlockKind.memory_layers``, base.py's ``model_memory``) from its own
OLMo-core build, so that the launch builds no model config and knows no block.

Each term is a :class:`Saved` pair: the bytes a token a module keeps for backward run eager (every
op keeps its own inputs) and compiled (what inductor's min-cut partitioner keeps: matmul inputs,
attention's outputs, reductions; the elementwise ops between them recomputed in backward). Both are
measured against torch in tests/test_memory.py (saved-tensor hooks; compiled through AOT autograd
with inductor's decompositions and partitioner)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

__all__ = [
    "Saved", "LayerMemory", "ModelMemory", "layer_memory", "norm_bytes", "swiglu_bytes",
    "router_bytes",
]  # fmt: skip


@dataclass(frozen=True)
class Saved:
    """Bytes a token kept for backward, eager and compiled."""

    eager: int
    compiled: int

    def __add__(self, other: "Saved") -> "Saved":
        return Saved(self.eager + other.eager, self.compiled + other.compiled)

    def __mul__(self, n: int) -> "Saved":
        return Saved(n * self.eager, n * self.compiled)

    __rmul__ = __mul__

    def of(self, compiled: bool) -> int:
        return self.compiled if compiled else self.eager


NONE = Saved(0, 0)


@dataclass(frozen=True)
class LayerMemory:
    """One layer as the memory model counts it (launch/memory.py's docstring)."""

    width: int  # w_l
    params: int  # the layer's parameters (one FSDP unit)
    n_heads: int
    head_dim: int
    n_kv_heads: int
    qk_norm: bool  # OLMo-2's norms of Q and K
    ffn: Saved  # bytes a token its FFN keeps for backward (its own norms included)
    widest: int  # the widest input of its FFN's matmuls (float8's cast of it)
    norms: int = 2  # the block's norms outside attention and FFN, each keeping norm_bytes(w)
    weight_copy: int = 0  # bytes of weight copies autograd keeps per micro-batch
    moe: bool = False  # a mixture of experts
    # the rest of a wider stream that the layer's input is a view of, kept with it: 2 (S - w_l)
    # compiled (the partitioner keeps the input as given), and eager after a post-norm block's
    # Q/K/V matmul (a pre-norm keeps its norm's fp32 copy instead)
    view: Saved = NONE
    unfolded: int = 0  # compiled bytes a token more where its FFN's norms cannot fold (float8)
    # bytes a token more where the stream is fp32 (bf16 autocast: one process, DDP)
    fp32_stream: Saved = NONE


@dataclass(frozen=True)
class ModelMemory:
    """A model as the memory model reads it: its size, vocabulary and layers."""

    d_model: int  # the residual stream's width (embedding, final norm, LM head)
    vocab_size: int
    params: int  # every parameter (P)
    layers: Tuple[LayerMemory, ...]


def norm_bytes(w: int) -> Saved:
    """OLMo-core's RMSNorm at width ``w``, computing in fp32: eager its fp32 input and output,
    compiled its bf16 input (the fp32 copy and the output recomputed); and the rsqrt."""
    return Saved(8 * w + 4, 2 * w + 4)


def swiglu_bytes(w: int, hidden: int) -> Saved:
    """A SwiGLU at width ``w``: its bf16 input, w1, w3 and their product (bf16, ``hidden``) and,
    eager, SiLU's output."""
    return Saved(2 * w + 8 * hidden, 2 * w + 6 * hidden)


def router_bytes(w: int, experts: int, top_k: int) -> Saved:
    """OLMo-core's MoE router and dispatch at width ``w``: the router's fp32 input, its fp32 scores
    (eager three E-wide tensors and a sum, compiled one), the top-k weights and indices, the
    dispatch's indices and gates (30 k)."""
    return Saved(4 * w + 12 * (experts + 1) + 30 * top_k, 4 * w + 4 * (experts + 1) + 30 * top_k)


def layer_memory(block, w: int) -> LayerMemory:
    """An OLMo-core block config at width ``w``: its attention, one SwiGLU FFN (OLMo-core's MoE: its
    router, then the top-k SwiGLU experts, each keeping its output for the gate's gradient) and the
    block's two norms, no weight copy. With an fp32 stream, eager, each matmul reading it casts its
    own bf16 copy (Q, K, V: 4 w more; w1, w3: 2 w; the experts' dispatch 2 w (k - 1)); compiled, a
    pre-norm block keeps its input in fp32 (2 w more) and the experts their outputs (2 w k)."""
    mixer, moe = block.sequence_mixer, block.feed_forward_moe
    hidden = (block.feed_forward if moe is None else moe).hidden_size
    ffn, pre = swiglu_bytes(w, hidden), "reordered" not in str(block.name)
    fp32_stream = Saved(6 * w, 2 * w if pre else 0)
    if moe is not None:
        k = moe.router.top_k
        ffn = router_bytes(w, moe.num_experts, k) + k * (ffn + Saved(2 * w, 2 * w))
        fp32_stream = Saved(2 * w * (k + 1), 2 * w * k)
    return LayerMemory(
        width=w,
        params=block.num_params(w),
        n_heads=mixer.n_heads,
        head_dim=getattr(mixer, "head_dim", None) or w // mixer.n_heads,
        n_kv_heads=getattr(mixer, "n_kv_heads", None) or mixer.n_heads,
        qk_norm=bool(getattr(mixer, "qk_norm", None)),
        ffn=ffn,
        widest=max(w, hidden),
        moe=moe is not None,
        fp32_stream=fp32_stream,
    )
