"""Hugging Face modeling code for models trained with hourglass-olmo (copied into each export).

Plain PyTorch, no OLMo-core needed: load with ``AutoModelForCausalLM.from_pretrained(DIR,
trust_remote_code=True)`` (``AutoModel``: the model without its output projection, whose hidden
states are the output norm's). Parameter names are OLMo-core's under ``model.``, but for the output
norm (``model.norm``) and the output projection (``lm_head``). Attention goes through transformers'
attention interface: ``attn_implementation`` = ``eager`` (here), ``sdpa``, ``flash_attention_2`` or
any function registered with ``AttentionInterface.register`` (a serving engine's, e.g. vLLM's
Transformers backend). Covers the blocks
this project trains: the conventional SwiGLU FFN and the hourglass FFN (K stacked wide-narrow-wide
sub-MLPs, each with its own norm and residual), wired into each layer's residual stream as
``wiring`` lists (attention then FFN, pre-norm as the papers' equations or post-norm as OLMo-2's
reordered norm, by default; any other arrangement of the layer's attention, FFN and norms, such as
a parallel block's, by its list), with or without QK-norm, RoPE (optionally Llama-3.1 scaled),
grouped-query attention, a head size apart from d_model / n_heads, untied or tied LM head; and
variable-width models (paper 2): layer l at its own width w_l inside a stream max(h, max w_l) wide,
resized by ``carry_forward``, ``zero`` or ``learned`` (see ``Block``), with the paper's muP forward
multipliers. A uniform model is the special case w_l = d_model. Generation keeps a KV cache
(transformers' ``DynamicCache``): each layer caches its n_kv_heads x head_dim keys and values per
token at its own width, after RoPE (``use_cache=False`` recomputes the prefix instead). A batch
padded on the left (``attention_mask``, as ``generate()`` and lm-eval pad prompts) has its padding
masked and its positions counted over its tokens: each row gives what it gives alone.
"""

from typing import List, Optional

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import PretrainedConfig, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.generation import GenerationMixin
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

# The KV cache's argument and output field: "cache" from transformers 5.24 on, "past_key_values"
# before.
CACHE = (
    "cache"
    if "cache" in getattr(CausalLMOutputWithPast, "__dataclass_fields__", {})
    else "past_key_values"
)

FFN_FORMS = ("swiglu", "hourglass")  # the FFNs this file builds (the config's ffn)


def _check_forms(**given: str) -> None:
    """A value this file does not build is no model it runs: ValueError naming it."""
    forms = {"ffn": FFN_FORMS, "norm_placement": ("pre", "post")}
    forms["resize"] = ("carry_forward", "zero", "learned")
    for key, value in given.items():
        if value not in forms[key]:
            raise ValueError(f"{key}={value!r}: this modeling code builds {', '.join(forms[key])}")


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
        ffn: str = "swiglu",  # swiglu (hidden ffn_hidden) | hourglass (K sub-MLPs of d_h)
        ffn_hidden: int = 3072,  # swiglu: hidden size
        K: int = 1,  # hourglass: sub-MLPs per layer
        d_h: int = 384,  # hourglass: bottleneck width
        norm_placement: str = "pre",  # pre: x + f(norm(x)) | post: x + norm(f(x))
        # Each layer's residual steps in order: a step adds the sum of its branches to the stream
        # (x residual_scale), a branch applies the layer's modules it names in turn: "attention",
        # "feed_forward", or a norm ("..._norm"). None: attention then FFN, each normed as
        # norm_placement says (the hourglass FFN norms its own sub-MLPs).
        wiring: Optional[List[List[List[str]]]] = None,
        qk_norm: bool = False,
        rope_theta: float = 500000.0,
        # Llama-3.1 RoPE scaling: factor, low_freq_factor, high_freq_factor,
        # original_max_position_embeddings (not "rope_scaling", which transformers 5 rewrites
        # into its own rope_parameters)
        llama3_rope: Optional[dict] = None,
        norm_eps: float = 1e-6,
        tie_word_embeddings: bool = False,
        widths: Optional[List[int]] = None,  # variable width: w_1..w_L (None: every layer d_model)
        # per layer: SwiGLU hidden or d_h (None: ffn_hidden / d_h)
        hidden_sizes: Optional[List[int]] = None,
        resize: str = "carry_forward",  # variable width: carry_forward | zero | learned
        embed_scale: float = 1.0,  # muP: embeddings x m_emb
        # muP: every residual branch (attention, SwiGLU, each hourglass sub-MLP) x m_residual
        residual_scale: float = 1.0,
        logit_scale: float = 1.0,  # muP: 1 / m_width, after the output norm
        attention_scale_power: float = 0.5,  # scores x head_dim^-power: 0.5 standard, 1 muP
        **kwargs,
    ):
        _check_forms(ffn=ffn, norm_placement=norm_placement, resize=resize)
        self.d_model, self.n_layers, self.n_heads = d_model, n_layers, n_heads
        self.ffn, self.ffn_hidden, self.K, self.d_h = ffn, ffn_hidden, K, d_h
        self.norm_placement, self.qk_norm = norm_placement, qk_norm
        self.wiring = wiring or self._default_wiring()
        if sum(chain.count("attention") for step in self.wiring for chain in step) != 1:
            raise ValueError(f"wiring {self.wiring}: name attention once (it updates the cache)")
        self.rope_theta, self.norm_eps, self.llama3_rope = rope_theta, norm_eps, llama3_rope
        self.head_dim, self.n_kv_heads = head_dim, n_kv_heads
        self.widths, self.hidden_sizes, self.resize = widths, hidden_sizes, resize
        self.embed_scale, self.residual_scale = embed_scale, residual_scale
        self.logit_scale, self.attention_scale_power = logit_scale, attention_scale_power
        # transformers' names
        self.hidden_size, self.num_hidden_layers = d_model, n_layers
        self.num_attention_heads, self.num_key_value_heads = n_heads, n_kv_heads or n_heads
        kwargs.pop("layer_shapes", None)  # derived below (a saved config.json holds it too)
        self.layer_shapes = self._layer_shapes()
        kwargs.setdefault("layer_types", ["full_attention"] * n_layers)
        super().__init__(vocab_size=vocab_size, tie_word_embeddings=tie_word_embeddings, **kwargs)

    def _default_wiring(self) -> List[List[List[str]]]:
        """Attention, then the FFN: pre-norm x + f(norm(x)) or post-norm x + norm(f(x)) each."""
        post = self.norm_placement == "post"
        steps = [
            [["attention", "attention_norm"] if post else ["attention_norm", "attention"]],
            [
                ["feed_forward", "feed_forward_norm"]
                if post
                else ["feed_forward_norm", "feed_forward"]
            ],
        ]
        if self.ffn == "hourglass":  # its K sub-MLPs norm their own inputs (or outputs)
            steps[1] = [["feed_forward"]]
        return steps

    def _layer_shapes(self) -> List[dict]:
        """Each layer's width, heads and head size (its KV cache per token: 2 x n_kv_heads x
        head_dim), for a serving engine that sizes caches per layer (all full causal attention)."""
        return [
            {
                "width": w,
                "num_attention_heads": self.n_heads,
                "num_key_value_heads": self.num_key_value_heads,
                "head_dim": self.head_dim or w // self.n_heads,
                "ffn_hidden": f,
            }
            for w, f in zip(self.layer_widths, self.layer_hidden_sizes)
        ]

    @property
    def layer_widths(self) -> List[int]:
        return list(self.widths) if self.widths else [self.d_model] * self.n_layers

    @property
    def layer_hidden_sizes(self) -> List[int]:
        if self.hidden_sizes:
            return list(self.hidden_sizes)
        return [self.d_h if self.ffn == "hourglass" else self.ffn_hidden] * self.n_layers

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
    """RoPE frequencies; Llama-3.1 scaling divides the low ones by ``factor``, blends the middle."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float) / head_dim)
    )
    if not scaling:
        return inv_freq
    factor, old = scaling["factor"], scaling["original_max_position_embeddings"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    return torch.where((wavelen <= old / low) & (wavelen >= old / high), blended, scaled)


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
):
    """softmax(q k^T scaling + mask) v, the key/value heads shared by ``num_key_value_groups``
    queries each; returns (B, T, heads, head_dim) and the weights, as transformers' do."""
    key = key.repeat_interleave(module.num_key_value_groups, dim=1)
    value = value.repeat_interleave(module.num_key_value_groups, dim=1)
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = F.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def causal_mask(
    implementation: str,
    slots: torch.Tensor,
    n_keys: int,
    dtype: torch.dtype,
    static: bool,
    keys: Optional[torch.Tensor] = None,
    batch: int = 1,
) -> Optional[torch.Tensor]:
    """The mask the attention function gets: an additive (B or 1, 1, T, n_keys) mask where the query
    in cache slot p sees keys 0..p, less the padding ``keys`` marks 0 (the caller's 2-D
    ``attention_mask``); None where the function applies causality itself on a cache of exactly
    the keys seen and nothing is padded (any other than eager without a cached prefix, as sdpa's
    ``is_causal`` and a serving engine's own attention do: no T x T mask for a long prompt). A
    ``static`` cache (transformers' StaticCache: keys preallocated to its length, compiled
    generation) always gets the mask, which hides its unwritten slots too. Flash attention, causal
    aligned to the last key, gets a (``batch``, n_keys) mask of the keys to read, or None."""
    T, arange = slots.shape[-1], torch.arange(n_keys, device=slots.device)
    if keys is not None:  # unwritten slots of a static cache are past every query: not padding
        keys = F.pad(keys[:, :n_keys].bool(), (0, max(0, n_keys - keys.shape[1])), value=True)
    if "flash" in implementation:  # a 2-D mask of the keys to read, transformers' flash path
        # unpads by it; a static cache's keys it reads up to the mask's length: those written
        if not static:
            return keys
        written = int(slots[0, -1]) + 1
        return keys[:, :written] if keys is not None else arange[:written].expand(batch, -1) >= 0
    simple = T == 1 or (implementation != "eager" and n_keys == T)
    if simple and not static and keys is None:
        return None
    allowed = arange <= slots[..., None]
    if keys is not None:
        allowed = allowed & keys[:, None]
    mask = torch.zeros(allowed.shape, dtype=dtype, device=slots.device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)[:, None]


class Attention(nn.Module):
    """n_heads query heads and n_kv_heads key/value heads (each shared by n_heads / n_kv_heads
    queries) of head_dim each: d -> n_heads head_dim -> d, whatever d. The attention itself is the
    function ``config._attn_implementation`` names."""

    is_causal = True

    def __init__(self, c: HourglassOlmoConfig, d: int, layer: int):
        super().__init__()
        self.config, self.layer_idx = c, layer
        self.n_heads, self.n_kv_heads = c.n_heads, c.n_kv_heads or c.n_heads
        self.num_key_value_groups = self.n_heads // self.n_kv_heads
        self.head_dim, self.theta, self.llama3_rope = (
            c.head_dim or d // c.n_heads,
            c.rope_theta,
            c.llama3_rope,
        )
        self.scale = self.head_dim**-c.attention_scale_power
        q_width, kv_width = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        self.w_q, self.w_out = nn.Linear(d, q_width, bias=False), nn.Linear(q_width, d, bias=False)
        self.w_k, self.w_v = nn.Linear(d, kv_width, bias=False), nn.Linear(d, kv_width, bias=False)
        self.q_norm = RMSNorm(q_width, c.norm_eps) if c.qk_norm else None
        self.k_norm = RMSNorm(kv_width, c.norm_eps) if c.qk_norm else None

    def forward(
        self, x: torch.Tensor, position_ids: torch.Tensor, cache: Optional[Cache] = None, **kwargs
    ) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k, v = (t.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2) for t in (k, v))
        inv_freq = _inv_freq(self.theta, self.head_dim, self.llama3_rope, x.device)
        # (B or 1, T, head_dim / 2)
        freqs = position_ids.to(x.device, torch.float)[..., None] * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]
        sin, cos = emb.sin(), emb.cos()
        qf, kf = q.float(), k.float()
        q = (qf * cos + _rotate_half(qf) * sin).type_as(v)
        k = (kf * cos + _rotate_half(kf) * sin).type_as(v)
        if cache is not None:  # the n_kv_heads heads, before they are shared: GQA caches each once
            k, v = cache.update(k, v, self.layer_idx)
        implementation = self.config._attn_implementation or "eager"
        attend = (
            eager_attention_forward
            if implementation == "eager"
            else ALL_ATTENTION_FUNCTIONS[implementation]
        )
        kwargs.pop("attention_mask", None)  # the model's, read as ``keys``
        slots, keys = kwargs.pop("slots"), kwargs.pop("keys", None)
        static = getattr(cache, "is_compileable", False)
        mask = causal_mask(implementation, slots, k.shape[-2], q.dtype, static, keys, B)
        y, _ = attend(self, q, k, v, mask, dropout=0.0, scaling=self.scale, **kwargs)
        return self.w_out(y.reshape(B, T, -1))


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
    """h_{i+1} = h_i + a f_i, f_i = MLP_i(norm_i(h_i)) (pre) or norm_i(MLP_i(h_i)) (post): returns
    f_0 + ... + f_{K-1}, which the layer's step adds x a (h_0 + a sum f_i = h_K)."""

    def __init__(self, c: HourglassOlmoConfig, d: int, d_h: int):
        super().__init__()
        self.post, self.alpha = c.norm_placement == "post", c.residual_scale
        self.w1, self.w3 = _Stacked(c.K, d_h, d), _Stacked(c.K, d_h, d)
        self.w2 = _Stacked(c.K, d, d_h)
        self.norms = nn.ModuleList(RMSNorm(d, c.norm_eps) for _ in range(c.K))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        total = torch.zeros_like(h)
        for i, norm in enumerate(self.norms):
            w1, w3, w2 = self.w1.weight[i], self.w3.weight[i], self.w2.weight[i]
            if self.post:
                f = norm(F.linear(F.silu(F.linear(h, w1)) * F.linear(h, w3), w2))
            else:
                x = norm(h)
                f = F.linear(F.silu(F.linear(x, w1)) * F.linear(x, w3), w2)
            h, total = torch.add(h, f, alpha=self.alpha), total + f
        return total


class Block(nn.Module):
    """Layer l at width w_l: its modules wired as ``config.wiring`` says. In a stream S = max(h,
    max w) wide (carry_forward, zero) it reads s[:w_l] (zero: dims past w_{l-1} read as zeros)
    and writes y_l there; the other dims keep their value. learned: no stream; it reads y_{l-1}
    truncated to w_l, or projected by ``resize`` when wider."""

    def __init__(self, c: HourglassOlmoConfig, layer: int):
        super().__init__()
        widths = c.layer_widths
        d, hidden = widths[layer], c.layer_hidden_sizes[layer]
        in_width = widths[layer - 1] if layer else c.d_model
        self.width, self.in_width, self.stream_width, self.mode, self.index = (
            d,
            in_width,
            c.stream_width,
            c.resize,
            layer,
        )
        self.alpha, self.wiring = c.residual_scale, c.wiring
        for name in dict.fromkeys(n for step in c.wiring for chain in step for n in chain):
            if name == "attention":
                module: nn.Module = Attention(c, d, layer)
            elif name == "feed_forward":
                ffn = c.ffn == "hourglass"
                module = HourglassFFN(c, d, hidden) if ffn else SwiGLU(d, hidden)
            elif name.endswith("_norm"):
                module = RMSNorm(d, c.norm_eps)
            else:
                raise ValueError(f"wiring: {name!r} is not attention, feed_forward or a *_norm")
            self.add_module(name, module)
        self.resize = (
            nn.Linear(in_width, d, bias=False) if self.mode == "learned" and in_width < d else None
        )

    def layer(
        self, x: torch.Tensor, position_ids: torch.Tensor, cache: Optional[Cache] = None, **kwargs
    ) -> torch.Tensor:
        """The block at its own width: each step x + alpha (the sum of its branches), alpha muP's
        m_residual, else 1."""
        for step in self.wiring:
            branches = []
            for chain in step:
                y = x
                for name in chain:
                    module = getattr(self, name)
                    y = (
                        module(y, position_ids, cache, **kwargs)
                        if name == "attention"
                        else module(y)
                    )
                branches.append(y)
            x = torch.add(x, sum(branches[1:], branches[0]), alpha=self.alpha)
        return x

    def forward(
        self, x: torch.Tensor, position_ids: torch.Tensor, cache: Optional[Cache] = None, **kwargs
    ) -> torch.Tensor:
        if self.mode == "learned":  # x is y_{l-1} (or the embedding)
            return self.layer(
                self.resize(x) if self.resize is not None else x[..., : self.width],
                position_ids,
                cache,
                **kwargs,
            )
        if x.shape[-1] < self.stream_width:  # the embedding: dims h..S start at zero
            x = F.pad(x, (0, self.stream_width - x.shape[-1]))
        inp = x[..., : self.width]
        if self.mode == "zero" and self.in_width < self.width:  # new dims read zeros
            inp = F.pad(inp[..., : self.in_width], (0, self.width - self.in_width))
        y = self.layer(inp, position_ids, cache, **kwargs)
        if self.width == self.stream_width:
            return y
        # the stream carries forward in both modes
        return torch.cat((y, x[..., self.width :]), dim=-1)


class OutputNorm(RMSNorm):
    """RMSNorm over the last layer's w_L dims, then to h dims: truncated when w_L >= h, else
    extended by the stream's dims [w_L, h) (carry_forward and zero) or ``resize`` (learned);
    times logit_scale."""

    def __init__(self, c: HourglassOlmoConfig):
        last = c.layer_widths[-1]
        super().__init__(last, c.norm_eps)
        self.last_width, self.d_model, self.mode, self.logit_scale = (
            last,
            c.d_model,
            c.resize,
            c.logit_scale,
        )
        self.resize = (
            nn.Linear(last, c.d_model, bias=False)
            if self.mode == "learned" and last < c.d_model
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x[..., : self.last_width])
        if self.last_width >= self.d_model:
            y = y[..., : self.d_model]
        elif self.resize is not None:
            y = self.resize(y)
        else:  # carry_forward and zero alike (the authors' output resize)
            y = torch.cat((y, x[..., self.last_width : self.d_model]), dim=-1)
        return y * self.logit_scale if self.logit_scale != 1.0 else y


class HourglassOlmoPreTrainedModel(PreTrainedModel):
    config_class = HourglassOlmoConfig
    base_model_prefix = "model"
    _no_split_modules = ["Block"]
    # attention through ALL_ATTENTION_FUNCTIONS: transformers' sdpa and flash kernels, and any
    # registered function
    _supports_attention_backend = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flash_attn_2 = True  # transformers 4.x's name

    def _init_weights(self, module):
        """A fresh model (``from_config``): normal(0, 0.02) matrices, unit norms; loaded: kept."""
        if isinstance(module, (nn.Linear, nn.Embedding, _Stacked)):
            nn.init.normal_(module.weight, std=0.02)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)


# What transformers may pass a model's forward besides the tensors; the rest of **kwargs goes to
# attention.
_NOT_ATTENTION = tuple(
    "output_attentions output_hidden_states return_dict use_cache cache_position token_type_ids "
    "logits_to_keep num_items_in_batch".split()
)


class HourglassOlmoModel(HourglassOlmoPreTrainedModel):
    """OLMo-core's Transformer without its output projection (``AutoModel``): the embeddings, the
    blocks and the output norm (x logit_scale); its hidden states are what the LM head projects."""

    def __init__(self, config: HourglassOlmoConfig):
        super().__init__(config)
        self.embed_scale = config.embed_scale
        self.embeddings = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleDict({str(i): Block(config, i) for i in range(config.n_layers)})
        self.norm = OutputNorm(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings

    def set_input_embeddings(self, value):
        self.embeddings = value

    def forward(
        self,
        input_ids: Optional[torch.LongTensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.LongTensor] = None,
        inputs_embeds: Optional[torch.Tensor] = None,
        use_cache: Optional[bool] = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        cache = kwargs.pop("cache", None)
        cache = kwargs.pop("past_key_values", None) if cache is None else cache
        if use_cache and cache is None:
            cache = DynamicCache()
        if kwargs.get("output_attentions") or self.config.output_attentions:
            raise ValueError("output_attentions: the attention functions here return no weights")
        hidden = kwargs.get("output_hidden_states") or self.config.output_hidden_states
        for name in _NOT_ATTENTION:
            kwargs.pop(name, None)
        h = self.embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        # each token's slot among the keys; a static cache's length is a tensor: added, not read,
        # so compiled decoding keeps it
        past = cache.get_seq_length() if cache is not None else 0
        kwargs["slots"] = (past + torch.arange(h.shape[1], device=h.device))[None]
        if attention_mask is not None and (
            torch.compiler.is_compiling() or not bool(attention_mask.all())
        ):  # padding (a batch of prompts left-padded, as generate() pads them): masked, and the
            # positions count the tokens only
            kwargs["keys"] = attention_mask
            if position_ids is None:
                position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
                position_ids = position_ids[:, -h.shape[1] :]
        if position_ids is None:
            position_ids = kwargs["slots"]
        if self.embed_scale != 1.0:
            h = h * self.embed_scale
        states = []  # each block's input (the embedding, then the stream), as transformers' models
        for block in self.blocks.values():
            states.append(h)
            h = block(h, position_ids, cache, **kwargs)
        h = self.norm(h)
        states = tuple(states) + (h,) if hidden else None  # the last: the output norm's
        return BaseModelOutputWithPast(last_hidden_state=h, hidden_states=states, **{CACHE: cache})


class HourglassOlmoForCausalLM(HourglassOlmoPreTrainedModel, GenerationMixin):
    # {tied: source}: transformers 5 ties by it (when tie_word_embeddings), 4.x reads its keys
    _tied_weights_keys = {"lm_head.weight": "model.embeddings.weight"}

    def __init__(self, config: HourglassOlmoConfig):
        super().__init__(config)
        self.model = HourglassOlmoModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embeddings

    def set_input_embeddings(self, value):
        self.model.embeddings = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def forward(
        self,
        input_ids: Optional[torch.LongTensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        labels: Optional[torch.LongTensor] = None,
        use_cache: Optional[bool] = None,
        logits_to_keep: int = 0,  # the last positions' logits only (generate: 1); 0: all
        **kwargs,
    ) -> CausalLMOutputWithPast:
        out = self.model(input_ids, attention_mask=attention_mask, use_cache=use_cache, **kwargs)
        h = out.last_hidden_state
        logits = self.lm_head(h[:, -logits_to_keep:] if logits_to_keep else h)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100
            )
        return CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            hidden_states=out.hidden_states,
            **{CACHE: getattr(out, CACHE)},
        )

    def prepare_inputs_for_generation(
        self, input_ids, attention_mask=None, use_cache=None, **kwargs
    ):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if cache is not None:  # only the tokens the cache has not seen
            input_ids = input_ids[:, cache.get_seq_length() :]
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            CACHE: cache,
            "use_cache": use_cache,
            "logits_to_keep": kwargs.get("logits_to_keep", 0),
        }
