"""The memory model: bytes per GPU of a run, by term, for choosing a hardware preset (presets.py).

It models what is stored; the CPU-measurable parts, the tensors each block saves for backward
(eager, and compiled as inductor's partitioner keeps them) and the loss's, are checked against
torch in tests/test_memory.py. Each layer's terms (width, heads, MLPs and their hidden sizes, norms,
weight copy, parameters) come from the model's block kind (``BlockKind.memory_layers``,
blocks/memory.py), which reads them off its own OLMo-core build.

Static, whatever the micro-batch:
- states = 16 P / W: fp32 weights, fp32 grads and AdamW's two fp32 moments of all P parameters,
  sharded over W ranks (FSDP: all ranks; HSDP: a node's; DDP and one process: W = 1).
- buffers: under FSDP2 (W > 1) FSDP_BYTES per parameter of the largest FSDP unit (a block, the LM
  head or the embedding: V d_model each, the largest at every paper size): its bf16 parameters and
  the prefetched unit's (2 x 2), their all-gather buffers (2 x 2), its bf16 gradients (2), their
  fp32 copy for the fp32 reduce-scatter (4) and the previous unit's gradients still reducing (2).
  Without FSDP (one process, DDP) bf16 autocast keeps a bf16 copy of every weight from forward to
  backward: 2 P; and the fused linear cross-entropy (below) its fp32 (V, d_model) weight gradient.
- weight copies (a layer's ``weight_copy``: the hourglass experts' gains folded into their weights,
  which the grouped matmuls keep): weights a block's forward copies and autograd keeps until that
  block's backward; a checkpointed block keeps none (one at a time while it is recomputed).
Per sequence of s tokens (a micro-batch of m sequences costs m times this), eager or compiled
(train.compile: each block compiled, inductor's min-cut partitioner choosing what backward keeps and
recomputing the rest; :class:`~olmo_patches.blocks.memory.Saved` holds both):
- each layer of width w saves A = n N + 2 w + 8 a + 4 n_heads + F_l bytes per token: OLMo-core's
  RMSNorm computes in fp32 and saves its fp32 input and output, N = 8 w + 4 (compiled its bf16 input
  and the rsqrt, N = 2 w + 4); the bf16 input of Q/K/V (2 w); Q, K, V and the attention output (8 a
  for a = n_heads head_dim: OLMo-core's torch backend repeats GQA's K and V to n_heads; flash keeps
  n_kv_heads, so there this is an upper bound), fp32 log-sum-exp per head and with QK-norm (OLMo-2)
  the norms of Q and K, N(a) + N(a_kv); and the FFN's F_l as its kind states it
  (``LayerMemory.ffn``): a SwiGLU MLP of hidden H its bf16 input 2 w and w1, w3, SiLU, product 8 H
  (compiled 6 H: SiLU recomputed; hourglass: K of hidden d_h, each with its own norm N_k, compiled
  folded into its matmuls: 2 w less each; MoE: the router, then top-k experts of hidden I_l with
  their outputs, no norm of their own). The block's norms outside attention and FFN count N each
  (n = 2; an hourglass block's n = 1, its K FFN norms being in F_l). A layer whose input is a slice
  of a wider stream keeps the whole stream with it where it keeps that input (``LayerMemory.view``).
  Without FSDP (one process, DDP: bf16 autocast over fp32 weights) the stream is fp32 and each kind
  states the bytes more (``LayerMemory.fp32_stream``): eager, each matmul reading an fp32 tensor
  keeps its own bf16 cast; compiled, the partitioner keeps some stream tensors in fp32.
- a block's backward holds its gradients beside what every block saved: the stream's and those of
  the tensors it kept, as many bytes again as its A (the largest A_l; the GPU check judges it).
- the head: the final norm N and the head's input 2 w, and LOGIT_BYTES per logit (V per token):
  OLMo-core's fp32 cross-entropy with z-loss saves the fp32 logits and their log-softmax (8,
  measured), and its backward holds two fp32 logit gradients (CE and z-loss, 8) and their bf16 cast
  (2); compiled (the LM head and its loss one graph) it saves the bf16 logits (2, measured) and its
  backward writes one bf16 gradient (2). Under the fused linear cross-entropy (nn/lm_loss.py:
  Liger-Kernel, CUDA) no logit lives to the backward: FUSED_HEAD_BYTES per d_model instead, the
  input's bf16 gradient the forward computes and keeps (2) and the chunk of logits it projects at a
  time, about as many logits as the micro-batch has hidden values (Liger's chunk: tokens / ceil(V /
  d_model), rounded up to a power of 2, so at most 2 x), in bf16 (4). The full (V, d_model) weight
  gradient it accumulates is one more head-sized unit, within the FSDP buffers counted above.
Activation checkpointing (train.activation_checkpointing, OLMo-core's modes):
- a checkpointed block keeps only its input (2 w bf16 under FSDP, 4 w fp32 under autocast) and one
  block's A at a time while it is recomputed; ``full``: every block; ``selected_blocks:n``: blocks
  0, n, 2n, ...; ``selected_modules``: a glob matching ``blocks.i.attention`` or
  ``blocks.i.feed_forward`` (or a whole block) keeps that module's input (2 w) instead of its part
  of A (finer globs are counted as not checkpointed: an upper bound); ``budget:b``: the compiler's
  min-cut keeps b of the difference between none and full (inductor's activation_memory_budget,
  counted as linear).
Float8 (train.float8; :func:`estimate`'s ``float8``): the master weights, gradients, moments and
saved activations stay as above (torchao saves its matmuls' high-precision inputs and recasts in
backward; the hourglass norms do not fold); added are the transient float8 copies of the running
block's matmul weights, 1 byte each for the forward cast and 1 for the transposed one backward needs
(2 P_block), and of the widest matmul input, 1 byte per element per token (max_l max(w_l, H_l)); a
float8 path casts each matmul's weight on its own, so it keeps no weight copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatch

from ..blocks.base import model_memory
from ..blocks.memory import LayerMemory, Saved, norm_bytes
from ..config import ExperimentSpec, vocab_size
from ..config.spec import ActivationCheckpointing

__all__ = [
    "Layer",
    "MemoryEstimate",
    "estimate",
    "FSDP_BYTES",
    "LOGIT_BYTES",
    "FUSED_HEAD_BYTES",
    "OFF",
]

FSDP_BYTES = 16  # FSDP2's backward buffers per parameter of the largest unit (module docstring)
# cross-entropy + z-loss per logit: eager 8 saved, 8 fp32 gradients, 2 bf16 gradient; compiled the
# bf16 logits saved and their bf16 gradient
LOGIT_BYTES = Saved(18, 4)
# fused linear cross-entropy, per d_model a token: 2 the kept input gradient, 4 the logit chunk
FUSED_HEAD_BYTES = 6


OFF = ActivationCheckpointing("off")


@dataclass(frozen=True)
class Layer:
    """One block's bytes: per token, by the module that saves them, and per micro-batch."""

    attention: float  # the attention module (Q/K/V input, Q, K, V, output, log-sum-exp)
    feed_forward: float  # the FFN module (hourglass: its K norms too; MoE: the top-k experts)
    norms: float  # the block's own: its norms, its input's stream (outside those modules)
    width: int
    weight_copy: float  # per micro-batch

    @property
    def saved(self) -> float:
        return self.attention + self.feed_forward + self.norms


@dataclass(frozen=True)
class MemoryEstimate:
    states: float  # 16 P / W
    buffers: float  # FSDP2's backward buffers (W > 1) or autocast's bf16 weight copies (W = 1)
    layers: tuple[Layer, ...]  # each block, in order
    head: float  # bytes per token: final norm, head input, logits
    sequence_length: int
    residual_bytes: (
        int  # a checkpointed block's input: 2 (bf16 under FSDP) or 4 (fp32 under autocast)
    )
    moe: bool = False
    compiled: bool = False  # the compiled terms (train.compile on)
    float8_weights: float = 0.0  # float8: the running block's float8 weight copies
    float8_inputs: float = 0.0  # float8: bytes per token of the widest matmul input's float8 cast

    def _kept(self, ac: ActivationCheckpointing) -> tuple[list[float], list[float], list[float]]:
        """Per layer: bytes per token kept until backward, bytes per token while recomputed, weight
        copies kept."""
        kept, recomputed, copies = [], [], []
        for i, layer in enumerate(self.layers):
            block = ac.mode == "full" or (
                ac.mode == "selected_blocks" and i % (ac.block_interval or 1) == 0
            )
            parts = {"attention": layer.attention, "feed_forward": layer.feed_forward}
            if ac.mode == "selected_modules":
                globs = ac.modules or []
                block = any(fnmatch(f"blocks.{i}", g) for g in globs)
                parts = {
                    k: v
                    for k, v in parts.items()
                    if any(fnmatch(f"blocks.{i}.{k}", g) for g in globs)
                }
            if block:
                kept.append(self.residual_bytes * layer.width)
                recomputed.append(layer.saved)
                copies.append(0.0)
            elif ac.mode == "selected_modules" and parts:
                kept.append(layer.saved - sum(parts.values()) + 2 * layer.width * len(parts))
                recomputed.append(max(parts.values()))
                copies.append(0.0 if "feed_forward" in parts else layer.weight_copy)
            else:
                kept.append(layer.saved)
                recomputed.append(0.0)
                copies.append(layer.weight_copy)
        return kept, recomputed, copies

    def terms(self, micro_batch: int, ac: ActivationCheckpointing = OFF) -> dict[str, float]:
        """The estimate's terms in bytes for a micro-batch in mode ``ac`` (their sum:
        :meth:`total`)."""
        # inductor's budget: this fraction of the saving between full and none
        if ac.mode == "budget":
            none, full = (
                self.terms(micro_batch),
                self.terms(micro_batch, ActivationCheckpointing("full")),
            )
            b = 1.0 if ac.budget is None else ac.budget
            return {k: full[k] + b * (none[k] - full[k]) for k in none}
        kept, recomputed, copies = self._kept(ac)
        tokens = micro_batch * self.sequence_length
        # one block's, during its recompute
        recomputing = max(layer.weight_copy for layer in self.layers) if max(recomputed) else 0.0
        return {
            "states (16 P / W)": self.states,
            "FSDP / autocast buffers": self.buffers,
            "hourglass weight copies": sum(copies) + recomputing,
            "block activations": tokens * (sum(kept) + max(recomputed)),
            "a block's backward": tokens * max(layer.saved for layer in self.layers),
            "logits and head": tokens * self.head,
            "float8 copies": self.float8_weights + tokens * self.float8_inputs,
        }

    def total(self, micro_batch: int, ac: ActivationCheckpointing = OFF) -> float:
        return sum(self.terms(micro_batch, ac).values())


def _layer(layer: LayerMemory, compiled: bool, float8: bool, fp32: bool) -> Layer:
    """A layer's bytes from its kind's terms (the module docstring's A_l); ``fp32``: the stream is
    fp32 (bf16 autocast)."""
    w, heads = layer.width, layer.n_heads
    norm = lambda n: norm_bytes(n).of(compiled)  # noqa: E731
    qk_norm = norm(layer.head_dim * heads) + norm(layer.head_dim * layer.n_kv_heads)
    return Layer(
        # K, V repeated to n_heads
        attention=2 * w
        + 8 * layer.head_dim * heads
        + 4 * heads
        + (qk_norm if layer.qk_norm else 0),
        feed_forward=layer.ffn.of(compiled) + (layer.unfolded if compiled and float8 else 0),
        norms=norm(w) * layer.norms
        + layer.view.of(compiled)
        + (layer.fp32_stream.of(compiled) if fp32 else 0),
        width=w,
        weight_copy=0 if float8 else layer.weight_copy,
    )


def estimate(
    spec: ExperimentSpec,
    sequence_length: int,
    shards: int = 1,
    *,
    fused_head: bool = False,
    float8: bool = False,
    compiled: bool = False,
) -> MemoryEstimate:
    """The module docstring's estimate for ``spec``'s model (its kind states each layer's terms,
    blocks/memory.py) at ``sequence_length`` tokens per sequence, FSDP2 over ``shards`` ranks (1:
    none); ``fused_head``: the fused linear cross-entropy; ``float8``: train.float8 on;
    ``compiled``: train.compile on (the compiled terms)."""
    model = model_memory(spec.model, vocab_size(spec))
    d, vocab = model.d_model, model.vocab_size
    units = [*(layer.params for layer in model.layers), vocab * d]
    fsdp = shards > 1
    logits = FUSED_HEAD_BYTES * d if fused_head else LOGIT_BYTES.of(compiled) * vocab
    return MemoryEstimate(
        states=16 * model.params / shards,
        # without FSDP: autocast's weight copies, the fused head's fp32 weight gradient
        buffers=FSDP_BYTES * max(units) if fsdp else 2 * model.params + 4 * vocab * d * fused_head,
        layers=tuple(_layer(layer, compiled, float8, not fsdp) for layer in model.layers),
        head=norm_bytes(d).of(compiled) + 2 * d + logits,
        sequence_length=sequence_length,
        residual_bytes=2 if fsdp else 4,
        moe=any(layer.moe for layer in model.layers),
        compiled=compiled,
        float8_weights=2 * max(layer.params for layer in model.layers) if float8 else 0.0,
        float8_inputs=max(layer.widest for layer in model.layers) if float8 else 0.0,
    )
