"""Hugging Face modeling code for models trained with hourglass-olmo (copied into each export).

Plain PyTorch, no OLMo-core needed: load with ``AutoModelForCausalLM.from_pretrained(DIR,
trust_remote_code=True)``. Parameter names are OLMo-core's, under ``model.``. Covers the blocks
this project trains: the conventional SwiGLU FFN and the hourglass FFN (K stacked wide-narrow-wide
sub-MLPs, each with its own norm and residual), pre-norm (the papers' equations) or post-norm
(OLMo-2's reordered norm), with or without QK-norm, RoPE (optionally Llama-3.1 scaled), grouped-query
attention, a head size apart from d_model / n_heads, untied or tied LM head; and
variable-width models (paper 2): layer l at its own width w_l inside a stream max(h, max w_l) wide,
resized by ``carry_forward``, ``zero`` or ``learned`` (see ``Block``), with the paper's muP forward
multipliers. A uniform model is the special case w_l = d_model. Generation keeps a KV cache
(transformers' ``DynamicCache``): each layer caches its n_kv_heads x head_dim keys and values per
token at its own width, after RoPE (``use_cache=False`` recomputes the prefix instead).
"""

from typing import List, Optional

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import PretrainedConfig, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.generation import GenerationMixin
from transformers.modeling_outputs import CausalLMOutputWithPast


class HourglassOlmoConfig(PretrainedConfig):
    model_type = "hourglass_olmo"

    def __init__(
        self,
        vocab_size: int = 100352,
        d_model: int = 768,  # h: the embedding and LM head width
        n_layers: int = 12,
        n_heads: int = 12,
        head_dim: Optional[int] = None,  # per-head size (None: layer width / n_heads)
        n_kv_heads: Optional[int] = None,  # key/value heads, GQA (None: n_heads)
        block: str = "baseline",  # baseline (SwiGLU, hidden ffn_hidden) | hourglass
        ffn_hidden: int = 3072,  # baseline: SwiGLU hidden size
        K: int = 1,  # hourglass: sub-MLPs per layer
        d_h: int = 384,  # hourglass: bottleneck width
        norm_placement: str = "pre",  # pre: x + f(norm(x)) | post: x + norm(f(x))
        qk_norm: bool = False,
        rope_theta: float = 500000.0,
        # Llama-3.1 RoPE scaling: factor, low_freq_factor, high_freq_factor, original_max_position_embeddings
        # (not "rope_scaling", which transformers 5 rewrites into its own rope_parameters)
        llama3_rope: Optional[dict] = None,
        norm_eps: float = 1e-6,
        tie_word_embeddings: bool = False,
        widths: Optional[List[int]] = None,  # variable width: w_1..w_L (None: every layer d_model)
        hidden_sizes: Optional[List[int]] = None,  # per layer: SwiGLU hidden or d_h (None: ffn_hidden / d_h)
        resize: str = "carry_forward",  # variable width: carry_forward | zero | learned
        embed_scale: float = 1.0,  # muP: embeddings x m_emb
        residual_scale: float = 1.0,  # muP: every residual branch (attention, SwiGLU, each hourglass sub-MLP) x m_residual
        logit_scale: float = 1.0,  # muP: 1 / m_width, after the output norm
        attention_scale_power: float = 0.5,  # scores x head_dim^-power: 0.5 standard, 1 muP
        **kwargs,
    ):
        self.d_model, self.n_layers, self.n_heads = d_model, n_layers, n_heads
        self.block, self.ffn_hidden, self.K, self.d_h = block, ffn_hidden, K, d_h
        self.norm_placement, self.qk_norm = norm_placement, qk_norm
        self.rope_theta, self.norm_eps, self.llama3_rope = rope_theta, norm_eps, llama3_rope
        self.head_dim, self.n_kv_heads = head_dim, n_kv_heads
        self.widths, self.hidden_sizes, self.resize = widths, hidden_sizes, resize
        self.embed_scale, self.residual_scale, self.logit_scale = embed_scale, residual_scale, logit_scale
        self.attention_scale_power = attention_scale_power
        self.hidden_size, self.num_hidden_layers, self.num_attention_heads = d_model, n_layers, n_heads
        super().__init__(vocab_size=vocab_size, tie_word_embeddings=tie_word_embeddings, **kwargs)

    @property
    def layer_widths(self) -> List[int]:
        return list(self.widths) if self.widths else [self.d_model] * self.n_layers

    @property
    def layer_hidden_sizes(self) -> List[int]:
        if self.hidden_sizes:
            return list(self.hidden_sizes)
        return [self.d_h if self.block == "hourglass" else self.ffn_hidden] * self.n_layers

    @property
    def stream_width(self) -> int:
        return max(self.d_model, *self.layer_widths)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * x).to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _inv_freq(theta: float, head_dim: int, scaling: Optional[dict], device) -> torch.Tensor:
    """RoPE frequencies; Llama-3.1 scaling divides the low ones by ``factor``, blending in between."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float) / head_dim))
    if not scaling:
        return inv_freq
    factor, old = scaling["factor"], scaling["original_max_position_embeddings"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    return torch.where((wavelen <= old / low) & (wavelen >= old / high), blended, scaled)


class Attention(nn.Module):
    """n_heads query heads and n_kv_heads key/value heads (each shared by n_heads / n_kv_heads queries)
    of head_dim each: d -> n_heads head_dim -> d, whatever d."""

    def __init__(self, c: HourglassOlmoConfig, d: int):
        super().__init__()
        self.n_heads, self.n_kv_heads = c.n_heads, c.n_kv_heads or c.n_heads
        self.head_dim, self.theta, self.llama3_rope = c.head_dim or d // c.n_heads, c.rope_theta, c.llama3_rope
        self.scale = self.head_dim ** -c.attention_scale_power
        q_width, kv_width = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        self.w_q, self.w_out = nn.Linear(d, q_width, bias=False), nn.Linear(q_width, d, bias=False)
        self.w_k, self.w_v = nn.Linear(d, kv_width, bias=False), nn.Linear(d, kv_width, bias=False)
        self.q_norm = RMSNorm(q_width, c.norm_eps) if c.qk_norm else None
        self.k_norm = RMSNorm(kv_width, c.norm_eps) if c.qk_norm else None

    def forward(self, x: torch.Tensor, cache: Optional[Cache] = None, layer: int = 0) -> torch.Tensor:
        B, T, _ = x.shape
        past = cache.get_seq_length(layer) if cache is not None else 0
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k, v = (t.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2) for t in (k, v))
        inv_freq = _inv_freq(self.theta, self.head_dim, self.llama3_rope, x.device)
        freqs = torch.outer(torch.arange(past, past + T, device=x.device, dtype=torch.float), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        sin, cos = emb.sin()[None, None], emb.cos()[None, None]
        qf, kf = q.float(), k.float()
        q = (qf * cos + _rotate_half(qf) * sin).type_as(v)
        k = (kf * cos + _rotate_half(kf) * sin).type_as(v)
        if cache is not None:  # the n_kv_heads heads, before they are shared: GQA caches each once
            k, v = cache.update(k, v, layer)
        k, v = (t.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1) for t in (k, v))
        # Query i (position past + i) sees keys 0..past + i; a single new query sees every key.
        mask = None if T == 1 else torch.ones(T, past + T, dtype=torch.bool, device=x.device).tril(past)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        return self.w_out(y.transpose(1, 2).reshape(B, T, -1))


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(d_model, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d_model, bias=False)
        self.w3 = nn.Linear(d_model, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class _Stacked(nn.Module):
    def __init__(self, K: int, out_features: int, in_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(K, out_features, in_features))


class HourglassFFN(nn.Module):
    """h_{i+1} = h_i + a MLP_i(norm_i(h_i)) (pre) or h_i + a norm_i(MLP_i(h_i)) (post); returns h_K."""

    def __init__(self, c: HourglassOlmoConfig, d: int, d_h: int):
        super().__init__()
        self.post, self.alpha = c.norm_placement == "post", c.residual_scale
        self.w1, self.w3 = _Stacked(c.K, d_h, d), _Stacked(c.K, d_h, d)
        self.w2 = _Stacked(c.K, d, d_h)
        self.norms = nn.ModuleList(RMSNorm(d, c.norm_eps) for _ in range(c.K))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for i, norm in enumerate(self.norms):
            w1, w3, w2 = self.w1.weight[i], self.w3.weight[i], self.w2.weight[i]
            if self.post:
                f = norm(F.linear(F.silu(F.linear(h, w1)) * F.linear(h, w3), w2))
            else:
                x = norm(h)
                f = F.linear(F.silu(F.linear(x, w1)) * F.linear(x, w3), w2)
            h = torch.add(h, f, alpha=self.alpha)
        return h


class Block(nn.Module):
    """Layer l at width w_l. In a stream S = max(h, max w) wide (carry_forward, zero) it reads
    s[:w_l] (zero: dims past w_{l-1} read as zeros) and writes y_l there; the other dims keep their value.
    learned: no stream; it reads y_{l-1} truncated to w_l, or projected by ``resize`` when wider."""

    def __init__(self, c: HourglassOlmoConfig, layer: int):
        super().__init__()
        widths = c.layer_widths
        d, hidden = widths[layer], c.layer_hidden_sizes[layer]
        in_width = widths[layer - 1] if layer else c.d_model
        self.width, self.in_width, self.stream_width, self.mode, self.index = d, in_width, c.stream_width, c.resize, layer
        self.alpha = c.residual_scale
        self.post, self.hourglass = c.norm_placement == "post", c.block == "hourglass"
        self.attention = Attention(c, d)
        self.attention_norm = RMSNorm(d, c.norm_eps)
        if self.hourglass:
            self.feed_forward = HourglassFFN(c, d, hidden)
        else:
            self.feed_forward = SwiGLU(d, hidden)
            self.feed_forward_norm = RMSNorm(d, c.norm_eps)
        self.resize = nn.Linear(in_width, d, bias=False) if self.mode == "learned" and in_width < d else None

    def layer(self, x: torch.Tensor, cache: Optional[Cache] = None) -> torch.Tensor:
        """The block at its own width; residual branches x alpha (muP's m_residual, else 1)."""
        if self.post:
            attn = self.attention_norm(self.attention(x, cache, self.index))
        else:
            attn = self.attention(self.attention_norm(x), cache, self.index)
        h = torch.add(x, attn, alpha=self.alpha)
        if self.hourglass:
            return self.feed_forward(h)
        ffn = self.feed_forward_norm(self.feed_forward(h)) if self.post else self.feed_forward(self.feed_forward_norm(h))
        return torch.add(h, ffn, alpha=self.alpha)

    def forward(self, x: torch.Tensor, cache: Optional[Cache] = None) -> torch.Tensor:
        if self.mode == "learned":  # x is y_{l-1} (or the embedding)
            return self.layer(self.resize(x) if self.resize is not None else x[..., : self.width], cache)
        if x.shape[-1] < self.stream_width:  # the embedding: dims h..S start at zero
            x = F.pad(x, (0, self.stream_width - x.shape[-1]))
        inp = x[..., : self.width]
        if self.mode == "zero" and self.in_width < self.width:  # new dims read zeros
            inp = F.pad(inp[..., : self.in_width], (0, self.width - self.in_width))
        y = self.layer(inp, cache)
        if self.width == self.stream_width:
            return y
        return torch.cat((y, x[..., self.width :]), dim=-1)  # the stream carries forward in both modes


class OutputNorm(RMSNorm):
    """RMSNorm over the last layer's w_L dims, then to h dims: truncated when w_L >= h, else extended
    by the stream's dims [w_L, h) (carry_forward and zero) or ``resize`` (learned); x logit_scale."""

    def __init__(self, c: HourglassOlmoConfig):
        last = c.layer_widths[-1]
        super().__init__(last, c.norm_eps)
        self.last_width, self.d_model, self.mode, self.logit_scale = last, c.d_model, c.resize, c.logit_scale
        self.resize = nn.Linear(last, c.d_model, bias=False) if self.mode == "learned" and last < c.d_model else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x[..., : self.last_width])
        if self.last_width >= self.d_model:
            y = y[..., : self.d_model]
        elif self.resize is not None:
            y = self.resize(y)
        else:  # carry_forward and zero alike (the authors' output resize)
            y = torch.cat((y, x[..., self.last_width : self.d_model]), dim=-1)
        return y * self.logit_scale if self.logit_scale != 1.0 else y


class LMHead(nn.Module):
    def __init__(self, c: HourglassOlmoConfig):
        super().__init__()
        self.norm = OutputNorm(c)
        self.w_out = nn.Linear(c.d_model, c.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_out(self.norm(x))


class Transformer(nn.Module):
    """OLMo-core's Transformer, parameter names included."""

    def __init__(self, c: HourglassOlmoConfig):
        super().__init__()
        self.embed_scale = c.embed_scale
        self.embeddings = nn.Embedding(c.vocab_size, c.d_model)
        self.blocks = nn.ModuleDict({str(i): Block(c, i) for i in range(c.n_layers)})
        self.lm_head = LMHead(c)

    def forward(self, input_ids: torch.Tensor, cache: Optional[Cache] = None) -> torch.Tensor:
        h = self.embeddings(input_ids)
        if self.embed_scale != 1.0:
            h = h * self.embed_scale
        for block in self.blocks.values():
            h = block(h, cache)
        return self.lm_head(h)


class HourglassOlmoForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = HourglassOlmoConfig
    base_model_prefix = "model"
    # {tied: source}: transformers 5 ties by it (when tie_word_embeddings), 4.x reads its keys
    _tied_weights_keys = {"model.lm_head.w_out.weight": "model.embeddings.weight"}

    def __init__(self, config: HourglassOlmoConfig):
        super().__init__(config)
        self.model = Transformer(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embeddings

    def set_input_embeddings(self, value):
        self.model.embeddings = value

    def get_output_embeddings(self):
        return self.model.lm_head.w_out

    def set_output_embeddings(self, value):
        self.model.lm_head.w_out = value

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: Optional[torch.Tensor] = None,
        labels: Optional[torch.LongTensor] = None,
        past_key_values: Optional[Cache] = None,
        use_cache: Optional[bool] = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        # Left padding is not supported (no position offsets): pass unpadded or right-padded inputs.
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache()
        logits = self.model(input_ids, past_key_values)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=past_key_values)

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, past_key_values=None, use_cache=None, **kwargs):
        if past_key_values is not None:  # only the tokens the cache has not seen
            input_ids = input_ids[:, past_key_values.get_seq_length():]
        return {"input_ids": input_ids, "attention_mask": attention_mask, "past_key_values": past_key_values, "use_cache": use_cache}
