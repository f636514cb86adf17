"""Hardware presets: ``train.hardware`` -> micro-batch size, activation checkpointing and compile.

``train.hardware`` is ``auto`` (the GPU torch sees: its name and memory), ``none`` (no GPU preset:
no checkpointing, no compile, the whole per-rank batch in one micro-batch) or a card:
``rtx6000ada`` (48 GB), ``h100`` (80 GB), ``h200`` (141 GB), ``b200`` (180 GB). A preset only fills the keys the config
left at null (``train.micro_batch_size``, ``train.activation_checkpointing``, ``train.compile``):
any value a config file or the command line sets wins, and ``key=null`` hands a key back to the
preset. The values come from the memory estimate below for the run's own model, so each config
gets its own micro-batch on each card.

The memory estimate (per GPU, bytes; NOT measured here: a model of what is stored, for choosing)
----------------------------------------------------------------------------------------------
- static = 16 P / W + 4 P_block: fp32 weights, fp32 grads and AdamW's two fp32 moments of all P
  parameters, sharded over W ranks (FSDP: all ranks; HSDP: a node's; DDP: none, W = 1), plus the
  largest block's bf16 weights gathered twice (current and prefetched).
- per sequence of s tokens without checkpointing = s (sum_l A_l + 12 V), where a layer of width w
  stores A = 12 w + sum_k (4 w + 8 H_k) bytes per token: bf16 tensors saved for backward after
  Korthikanti et al. 2022 (Table 2) with fused attention (no s^2 term): attention 10 w (input, Q, K,
  V, output; 2 w + 4 a + 4 a_kv for attention width a = n_heads head_dim and a_kv = n_kv_heads head_dim)
  and its norm 2 w; each MLP k (SwiGLU: one, hidden H; hourglass: K of hidden d_h; MoE: top-k experts of hidden I_l) its norm
  2 w, input 2 w and 8 H (w1 and w3 outputs, SiLU, product). 12 V: the logits in bf16 and their fp32
  log-softmax and gradient (V = vocabulary).
- with checkpointing (each block recomputed in backward) = s (4 w L + max_l A_l + 12 V): each
  block's fp32 input, one block's activations during its recompute, the logits.
- float8 (train.float8, :func:`with_float8`): the master weights, gradients, moments and saved
  activations stay as above (torchao saves its matmuls' high-precision inputs and recasts in
  backward); added are the transient float8 copies of the running block's matmul weights, 1 byte
  each for the forward cast and 1 for the transposed one backward needs (2 P_block), and of the
  widest matmul input, 1 byte per element (s max_l max(w_l, H_l) per sequence).
A card's usable memory is 85% of it (CUDA context, NCCL buffers, allocator fragmentation). The
micro-batch is the largest divisor of the per-rank batch that fits without checkpointing; only
when not one sequence fits is checkpointing turned on. Compile is on for every GPU preset.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from olmo_core.nn.transformer import TransformerConfig

__all__ = ["Card", "CARDS", "HARDWARE", "known_card", "Settings", "MemoryEstimate", "card_for_device", "detect", "estimate", "with_float8", "choose"]

GIB = 2**30
USABLE = 0.85  # fraction of a card's memory the estimate may fill


@dataclass(frozen=True)
class Card:
    name: str
    memory_gib: float
    device_name: str = ""  # a substring of torch.cuda.get_device_name for this card
    bf16_flops: Optional[float] = None  # dense bf16 tensor-core FLOP/s (datasheet, no sparsity): MFU, GPU-hours


# The one table of the GPUs this project plans for (vendor datasheets): memory for the presets, peak
# for MFU (the trainer's and the benchmark's) and for the dry run's GPU-hours.
CARDS = {
    "rtx6000ada": Card("rtx6000ada", 48.0, "RTX 6000 Ada", 364.2e12),  # the paper's GPU; 1457 TFLOP/s FP8 sparse / 4
    "h100": Card("h100", 80.0, "H100", 989.4e12),
    "h200": Card("h200", 141.0, "H200", 989.5e12),  # the H100's die: 1979 TFLOP/s sparse / 2
    "b200": Card("b200", 180.0, "B200", 2250e12),  # the paper's other GPU (HGX B200, per GPU)
}
HARDWARE = ("auto", "none", *CARDS)


def card_for_device(device_name: str, memory_gib: float) -> Card:
    """The preset of a CUDA device (torch.cuda.get_device_name, total memory); another GPU gets a
    preset sized by its own memory. Never more memory than the device reports (MIG slices)."""
    if (card := known_card(device_name)) is not None:
        return replace(card, memory_gib=min(card.memory_gib, memory_gib))
    return Card(f"gpu ({device_name})", memory_gib, device_name)


def known_card(device_name: str) -> Optional[Card]:
    """The card of :data:`CARDS` whose name torch's device name contains, else None."""
    return next((card for card in CARDS.values() if card.device_name in device_name), None)


def detect() -> Optional[Card]:
    import torch

    if not torch.cuda.is_available():
        return None
    return card_for_device(torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0).total_memory / GIB)


@dataclass(frozen=True)
class MemoryEstimate:
    static: float  # bytes per GPU, whatever the micro-batch
    per_sequence: float  # bytes per sequence in a micro-batch, without activation checkpointing
    per_sequence_ac: float  # ... with every block checkpointed


def estimate(config: TransformerConfig, sequence_length: int, shards: int = 1) -> MemoryEstimate:
    """The module docstring's estimate for the model of OLMo-core's ``config`` (this package's
    blocks included) at ``sequence_length`` tokens per sequence."""
    vocab = config.vocab_size
    blocks = config.resolved_block_configs
    widths = list(getattr(config, "widths", [config.d_model] * config.n_layers))
    per_token = []
    for block, w in zip(blocks, widths):
        ffn, moe = block.feed_forward, block.feed_forward_moe
        if moe is not None:  # each token through its top-k experts (k MLPs of hidden I_l; hourglass: k K of d_h)
            K, hidden = moe.router.top_k * getattr(moe, "K", 1), moe.hidden_size
        else:
            assert ffn is not None
            K, hidden = getattr(ffn, "K", 1), ffn.hidden_size
        mixer = block.sequence_mixer
        head_dim = getattr(mixer, "head_dim", None) or w // getattr(mixer, "n_heads", 1)
        a, a_kv = (n * head_dim for n in (mixer.n_heads, getattr(mixer, "n_kv_heads", None) or mixer.n_heads))
        per_token.append(4 * w + 4 * a + 4 * a_kv + K * (4 * w + 8 * hidden))
    block_params = max(block.num_params(w) for block, w in zip(blocks, widths))
    s, logits = sequence_length, 12 * vocab
    return MemoryEstimate(
        static=16 * config.num_params / shards + 4 * block_params,
        per_sequence=s * (sum(per_token) + logits),
        per_sequence_ac=s * (4 * sum(widths) + max(per_token) + logits),
    )


def with_float8(est: MemoryEstimate, config: TransformerConfig, sequence_length: int) -> MemoryEstimate:
    """``est`` (:func:`estimate`) plus float8's extra state (the module docstring's float8 term)."""
    blocks = config.resolved_block_configs
    widths = list(getattr(config, "widths", [config.d_model] * config.n_layers))
    block_params = max(block.num_params(w) for block, w in zip(blocks, widths))
    hidden = [(b.feed_forward_moe or b.feed_forward).hidden_size for b in blocks]  # type: ignore[union-attr]
    widest = max(max(w, h) for w, h in zip(widths, hidden))
    return replace(est, static=est.static + 2 * block_params, per_sequence=est.per_sequence + sequence_length * widest,
                   per_sequence_ac=est.per_sequence_ac + sequence_length * widest)


@dataclass(frozen=True)
class Settings:
    micro_batch_size: int
    activation_checkpointing: bool
    compile: bool


def _fits(est: MemoryEstimate, card: Card, micro: int, ac: bool) -> bool:
    return est.static + micro * (est.per_sequence_ac if ac else est.per_sequence) <= USABLE * card.memory_gib * GIB


def choose(
    est: MemoryEstimate, card: Card, per_rank_batch: int, micro_batch_size: Optional[int] = None,
    activation_checkpointing: Optional[bool] = None,
) -> Settings:
    """The preset for one card, around the values already given (an explicit micro-batch turns
    checkpointing on if it needs it; explicit checkpointing sizes the micro-batch with it)."""
    ac_given = activation_checkpointing
    if micro_batch_size is not None:
        ac = ac_given if ac_given is not None else not _fits(est, card, micro_batch_size, False)
        return Settings(micro_batch_size, ac, True)
    for ac in (False, True) if ac_given is None else (ac_given,):
        fitting = [m for m in range(1, per_rank_batch + 1) if per_rank_batch % m == 0 and _fits(est, card, m, ac)]
        if fitting:
            return Settings(max(fitting), ac, True)
    need = est.static + (est.per_sequence if ac_given is False else est.per_sequence_ac)
    raise ValueError(
        f"does not fit {card.name} at micro-batch 1: estimate {need / GIB:.1f} GiB of {USABLE * card.memory_gib:.1f} "
        f"usable; use more GPUs or a bigger card"
    )
