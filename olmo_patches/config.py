"""YAML (omegaconf) -> a typed experiment spec -> OLMo-core configs.

A config file states its intent in short keys (``model.block: hourglass``, ``model.K: 4``); this
module validates it against the dataclasses below (unknown key, wrong type, impossible shape: one
line naming the key, value and file) and builds OLMo-core's own ``TransformerConfig`` from it.

A file may extend another (``extends: ../base.yaml``, relative to the file); the variant's keys
override the base's, and omegaconf interpolation (``${model.d_model}``) works across the chain.
``key=value`` overrides from the command line are applied last.
"""

from __future__ import annotations

import copy
import logging
import math
import os
from dataclasses import dataclass, field, fields, replace
from functools import cache, partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Optional

from olmo_core.nn.feed_forward import FeedForwardConfig
from olmo_core.nn.rope import StepwiseRoPEScalingConfig
from olmo_core.nn.transformer import TransformerBlockConfig, TransformerBlockType, TransformerConfig
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .nn.attention import ATTENTION_BACKENDS, FLASH, BackendChoice, head_dims, resolve_attention_backend
from .nn.hourglass_block import HourglassBlockConfig
from .hardware import CARDS, HARDWARE, Settings, choose, detect, estimate
from .nn.hourglass import HourglassFeedForwardConfig, NormPlacement
from .nn.hourglass_moe import HourglassMoEConfig
from .nn.moe import Experts, LayerMoEConfig, expert_hidden_size
from .nn.variable_width import SCHEDULES, SHAPES, MoEShape, MuPConfig, ResizeMode, VariableWidthTransformerConfig, schedule_widths

if TYPE_CHECKING:
    from olmo_core.data import TokenizerConfig

log = logging.getLogger(__name__)

__all__ = [
    "ConfigError",
    "ModelSpec",
    "MoESpec",
    "DataSpec",
    "TrainSpec",
    "PowerSpec",
    "EvalSpec",
    "RunSpec",
    "ExperimentSpec",
    "load_spec",
    "vocab_size",
    "tokenizer_config",
    "Layout",
    "fit_world_size",
    "attention_backend",
    "data_workers",
]

BLOCKS = ("baseline", "hourglass", "variable_width")
CUDA_WORKERS = 4  # data.num_workers=null on CUDA: 15x an 8-GPU 113M rank's need from the local prefix (docs/performance.md)


class ConfigError(ValueError):
    """A bad config: the message is one line naming the file, the key and the value."""


@dataclass
class WidthSpec:
    """Variable-width layers (paper 2): the schedule of w_1..w_L, the resizing and the init."""

    schedule: str = "geometric"  # geometric | arithmetic | constant | list
    shape: str = "x"  # x (wide-narrow-wide) | v | ^ | 3 (narrow-wide-narrow)
    r_l: float = 0.75  # position of the extreme layer, k = r_l L (paper)
    r_d: float = 0.3  # narrowest continuous width / d_model (paper)
    multiple: int = 32  # each w_l rounded to this multiple (paper)
    values: Optional[List[int]] = None  # schedule=list: the explicit widths
    resize: str = "carry_forward"  # carry_forward | zero | learned
    init: str = "olmo"  # olmo (OLMo-core's init) | mup (the paper's multipliers and init below)
    m_width: float = 8.0  # mup: logits / m_width (paper)
    m_emb: float = 12.0  # mup: embeddings x m_emb (paper)
    m_residual: float = 0.22  # mup: residual branches x m_residual (paper)
    init_range: float = 0.1  # mup: base init std (paper)


@dataclass
class MoESpec:
    """A mixture of experts in place of every layer's FFN (variable_width, paper 2's 3B MoE): OLMo-core's
    dropless MoE at each layer's width w_l (olmo_patches/nn/moe.py)."""

    num_experts: int = MISSING  # E: routed experts per layer (no shared expert)
    top_k: int = MISSING  # k: experts per token (softmax over the k selected logits)
    expert_hidden: Optional[int] = None  # swiglu: one expert's hidden size at width h; layer l uses round(w_l expert_hidden / h)
    lb_loss_weight: float = 0.01  # load-balancing loss weight per layer, summed over layers (the authors' router_aux_loss_coef; 0: off)
    z_loss_weight: float = 0.001  # router z-loss weight per layer, summed over layers (the authors' 0.1 x 0.01; 0: off)
    experts: str = "swiglu"  # swiglu: OLMo-core's dropless SwiGLU experts | hourglass: K sub-MLPs of d_h (model.K, model.d_h), new here


@dataclass
class RoPEScalingSpec:
    """Llama-3.1 ("llama3") RoPE scaling, in Hugging Face's names; OLMo-core's StepwiseRoPEScalingConfig."""

    factor: float = 32.0  # low frequencies divided by this
    low_freq_factor: float = 1.0  # wavelengths above original / low_freq_factor: fully scaled
    high_freq_factor: float = 4.0  # wavelengths below original / high_freq_factor: unchanged
    original_max_position_embeddings: int = 8192

    def build(self) -> StepwiseRoPEScalingConfig:
        return StepwiseRoPEScalingConfig(
            factor=self.factor, low_freq_proportion=1 - 1 / self.low_freq_factor,
            high_freq_proportion=1 / self.high_freq_factor, old_context_len=self.original_max_position_embeddings,
        )


@dataclass
class ModelSpec:
    block: str = "baseline"  # baseline (SwiGLU, hidden d_ff or ffn_ratio * d_model) | hourglass | variable_width
    d_model: int = MISSING  # d_model: width of the residual stream
    n_layers: int = MISSING  # L: number of transformer layers
    n_heads: int = MISSING  # attention (query) heads
    head_dim: Optional[int] = None  # per-head size; attention width = n_heads x head_dim (null: d_model / n_heads)
    n_kv_heads: Optional[int] = None  # GQA: key/value heads, dividing n_heads (null: n_heads, MHA)
    ffn_ratio: int = 4  # baseline FFN hidden size = ffn_ratio * d_model (the conventional 4) ...
    d_ff: Optional[int] = None  # ... or this explicit hidden size
    K: int = 1  # hourglass: stacked wide-narrow-wide sub-MLPs per layer
    d_h: Optional[int] = None  # hourglass: bottleneck width d_h ...
    d_h_ratio: Optional[float] = None  # ... or d_h / d_model, rounded to a multiple of d_h_multiple
    d_h_multiple: int = 1  # rounding multiple for d_h when given as a ratio
    norm_placement: str = "pre"  # pre: x + f(norm(x)) (papers); post: x + norm(f(x)) (OLMo-2)
    qk_norm: bool = False  # RMSNorm on queries and keys (OLMo-2)
    rope_theta: int = 500_000
    norm_eps: float = 1e-6  # RMSNorm epsilon
    vocab_size: Optional[int] = None  # default: the tokenizer's vocabulary padded to 128
    rope_scaling: Optional[RoPEScalingSpec] = None  # Llama-3.1 RoPE scaling (null: off)
    tie_embeddings: bool = False
    init_std: float = 0.02  # OLMo-core's init: normal(0, init_std) cut at 3 std
    ffn: str = "swiglu"  # variable_width: each layer's FFN, swiglu | hourglass (K, d_h scaled with w_l)
    widths: WidthSpec = field(default_factory=WidthSpec)  # variable_width: w_l (d_model is h)
    moe: Optional[MoESpec] = None  # variable_width: a mixture of experts in every layer instead of the FFN (null: dense FFN)
    attention_backend: str = "auto"  # auto (flash attention where it runs, else torch) | torch | flash_2 | flash_3 | flash_4 | te (nn/attention.py)

    @property
    def moe_hidden(self) -> int:
        """One expert's hidden size at width h: expert_hidden (swiglu), d_h of each of its K sub-MLPs (hourglass)."""
        assert self.moe is not None
        return self.resolved_d_h if self.moe.experts == "hourglass" else self.moe.expert_hidden  # type: ignore[return-value]

    @property
    def moe_shape(self) -> Optional[MoEShape]:
        """The MoE as the width solver counts it (None: dense FFN); an hourglass expert's 3 K d_h w weights
        count as a SwiGLU expert of hidden K d_h."""
        e = self.moe
        if e is None:
            return None
        K = self.K if e.experts == "hourglass" else 1
        return MoEShape(e.num_experts, e.top_k, K * self.moe_hidden / self.d_model)

    @property
    def resolved_widths(self) -> List[int]:
        """w_1..w_L of a variable-width model (raises ValueError for an impossible schedule); with an MoE,
        matched to the baseline's total parameters (every expert), as the authors' solver does."""
        w = self.widths
        return schedule_widths(
            w.schedule, self.d_model, self.n_layers, shape=w.shape, r_l=w.r_l, r_d=w.r_d, multiple=w.multiple,
            widths=w.values, moe=self.moe_shape,
        )

    @property
    def resolved_d_h(self) -> int:
        """d_h, from ``d_h`` or from ``d_h_ratio * d_model`` rounded to ``d_h_multiple``."""
        if self.d_h is not None:
            return self.d_h
        if self.d_h_ratio is not None:
            m = self.d_h_multiple
            return int(round(self.d_h_ratio * self.d_model / m)) * m
        return self.resolved_d_ff  # K=1 default: the conventional FFN width

    @property
    def resolved_d_ff(self) -> int:
        return self.d_ff if self.d_ff is not None else self.ffn_ratio * self.d_model

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def resolved_n_kv_heads(self) -> int:
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    def build(self, vocab_size: int) -> TransformerConfig:
        """OLMo-core's ``TransformerConfig`` for this shape (init seed set by the trainer)."""
        post = NormPlacement(self.norm_placement) == NormPlacement.post
        config = TransformerConfig.llama_like(
            d_model=self.d_model,
            vocab_size=self.vocab_size or vocab_size,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            n_kv_heads=self.n_kv_heads,
            head_dim=self.head_dim,
            rope_scaling=self.rope_scaling.build() if self.rope_scaling is not None else None,
            qk_norm=self.qk_norm,
            layer_norm_eps=self.norm_eps,
            rope_theta=self.rope_theta,
            block_name=TransformerBlockType.reordered_norm if post else TransformerBlockType.default,
            feed_forward=FeedForwardConfig(hidden_size=self.resolved_d_ff, bias=False),
            tie_word_embeddings=self.tie_embeddings,
            init_std=self.init_std,
        )
        hourglass = self.block == "hourglass" or (self.block == "variable_width" and self.ffn == "hourglass")
        if hourglass:
            block = config.block
            assert isinstance(block, TransformerBlockConfig) and block.layer_norm is not None
            config.block = HourglassBlockConfig(
                sequence_mixer=block.sequence_mixer,
                layer_norm=block.layer_norm,
                feed_forward=HourglassFeedForwardConfig(
                    hidden_size=self.resolved_d_h,
                    K=self.K,
                    bias=False,
                    layer_norm=block.layer_norm,
                    norm_placement=NormPlacement(self.norm_placement),
                ),
            )
        if self.moe is not None:  # every layer: OLMo-core's MoE at w_l (nn/moe.py), no dense FFN
            e = self.moe
            hourglass_experts = e.experts == "hourglass"
            moe = (HourglassMoEConfig if hourglass_experts else LayerMoEConfig).authors(
                num_experts=e.num_experts, top_k=e.top_k, hidden_size=self.moe_hidden, lb_loss_weight=e.lb_loss_weight,
                z_loss_weight=e.z_loss_weight,
            )
            if hourglass_experts:  # K sub-MLPs per expert, each with the model's norm
                moe = replace(moe, K=self.K, layer_norm=config.block.layer_norm)  # type: ignore[union-attr]
            config.block = replace(config.block, feed_forward=None, feed_forward_moe=moe)
        if self.block == "variable_width":
            w = self.widths
            base = {f.name: getattr(config, f.name) for f in fields(TransformerConfig)}
            return VariableWidthTransformerConfig(
                **base,
                widths=self.resolved_widths,
                resize=ResizeMode(w.resize),
                ffn_hidden_ratio=(self.resolved_d_h if hourglass else self.resolved_d_ff) / self.d_model,
                ffn_hidden_multiple=self.d_h_multiple if hourglass else 1,
                mup=MuPConfig(w.m_width, w.m_emb, w.m_residual, w.init_range) if w.init == "mup" else None,
            )
        return config


@dataclass
class DataSpec:
    # demo: the embedded stdlib corpus | olmo2_stage1: OLMo-2 1B's Stage 1 files (data_order/'s
    # pinned, checksummed list), shuffled as OLMo-2 was | prefix: a local materialized prefix of that
    # order (scripts/data_order.py materialize), read in order | numpy: any token files or mix
    source: str = "demo"
    paths: List[str] = field(default_factory=list)  # numpy: token files (local paths or URLs)
    base: Optional[str] = None  # olmo2_stage1: a mirror replacing http://olmo-data.org in the pinned list (local folder or any URL OLMo-core reads)
    mix: Optional[str] = None  # numpy: or an OLMo-core DataMix name, e.g. OLMoE-mix-0824
    mix_base_dir: str = "http://olmo-data.org"  # where the mix (and validation sets) live
    prefix_dir: Optional[str] = None  # prefix: the materialized folder
    instance_filter: bool = False  # OLMo-2's repetition filter (loss masked on degenerate instances)
    tokenizer: str = "demo"  # demo (trained on the demo corpus) | dolma2
    tokenizer_file: Optional[str] = None  # a local tokenizer JSON (else the Hugging Face hub)
    sequence_length: int = 4096
    order_seed: int = 6198  # data order seed as the old OLMo trainer counts it (epoch 0)
    work_dir: str = ".cache/olmo-data"  # OLMo-core's dataset cache
    demo_vocab_size: int = 4096  # BPE vocabulary trained on the demo corpus
    demo_cache: str = ".cache/demo-corpus"
    num_workers: Optional[int] = None  # loader processes per rank (null: 0 on CPU, CUDA_WORKERS on CUDA); order unchanged
    prefetch_factor: Optional[int] = None  # batches each worker reads ahead (null: torch's 2)


@dataclass
class PowerSpec:
    """train.schedule=power: lm-engine's lr = lr min(1, (a / lr) (n c)^b) after a linear warmup (optim/power.py)."""

    a: Optional[float] = None  # the authors: 4 x sequences per step
    b: float = -0.566  # the authors' exponent
    c: Optional[float] = None  # tokens per step: sequences per step x sequence length


@dataclass
class TrainSpec:
    seed: int = 6198  # init seed and the seed of every RNG
    global_batch_size: int = MISSING  # sequences per optimizer step, all ranks together
    micro_batch_size: Optional[int] = None  # sequences per forward/backward on one rank (null: train.hardware's)
    max_tokens: Optional[int] = None  # training length in tokens ...
    max_steps: Optional[int] = None  # ... or in steps
    lr: float = 4e-4  # peak learning rate
    betas: List[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    weight_decay: float = 0.1  # AdamW's decoupled weight decay ...
    decay_embeddings: bool = False  # ... on the embedding (tied: also the LM head) (OLMo-2: off)
    decay_norms: bool = True  # ... on 1-D tensors: every norm gain, QK norms included (OLMo-2: on)
    warmup_steps: Optional[int] = None  # linear warmup in steps ...
    warmup_tokens: Optional[int] = None  # ... or in tokens
    schedule_tokens: Optional[int] = None  # cosine horizon if not the training length (OLMo-2: 5e12)
    final_lr_ratio: float = 0.1  # lr at the end of the cosine, as a fraction of the peak
    schedule: str = "cosine"  # cosine (warmup, then cosine to final_lr_ratio) | power (lm-engine's, train.power)
    power: PowerSpec = field(default_factory=PowerSpec)  # schedule=power: a, b, c
    schedule_lag: int = 0  # update n runs at the schedule's step n - lag (Megatron: 1, the first update at lr 0)
    z_loss: Optional[float] = 1e-5  # z-loss multiplier (None: off)
    max_grad_norm: Optional[float] = 1.0  # clip the gradient norm to this (null: no clipping)
    optimizer: str = "adamw"  # adamw | skip_step_adamw (OLMo-core's: skips steps whose loss or grad norm is 6 std above the last 128)
    precision: str = "bf16"  # bf16 (params bf16, reductions fp32) | fp32
    compile: Optional[bool] = None  # torch.compile each block (null: train.hardware's)
    activation_checkpointing: Optional[bool] = None  # recompute each block in backward (null: train.hardware's)
    hardware: str = "auto"  # preset for the null keys above: auto | none | rtx6000ada | h100 | h200 | b200 (hardware.py)
    data_parallel: str = "fsdp"  # fsdp | hsdp | ddp across ranks (FSDP2 wraps each block)
    device: str = "auto"  # auto (cuda when available) | cpu | cuda


@dataclass
class EvalSpec:
    interval: int = 1000  # in-loop validation every N steps (and at the end)
    max_batches: Optional[int] = None  # cap the validation batches (None: the whole set)
    validation_sets: List[str] = field(default_factory=list)  # v3-small-ppl-validation names (olmo_patches.evals)
    validation_base_dir: Optional[str] = None  # root of eval-data/perplexity/... (default: data.mix_base_dir)
    downstream_tasks: List[str] = field(default_factory=list)  # olmo_eval task labels, e.g. arc_easy
    downstream_interval: Optional[int] = None  # downstream evals every N steps (default: interval)
    downstream_sequence_length: Optional[int] = None  # tasks' context in tokens, longer queries cut from the left (null: data.sequence_length)


@dataclass
class RunSpec:
    name: str = MISSING
    save_folder: Optional[str] = None  # default runs/<name>
    save_interval: int = 1000  # permanent checkpoints every N steps
    ephemeral_save_interval: Optional[int] = 250  # checkpoints replaced by the next one
    ephemeral_keep: int = 1  # how many ephemeral checkpoints are kept (the newest ones)
    log_interval: int = 10  # collect and print metrics every N steps
    stop_at_step: Optional[int] = None  # stop early (with a checkpoint), schedule unchanged; rerun resumes
    wandb_project: Optional[str] = None  # log to wandb when set and wandb is installed
    trace_batches: bool = False  # record each step's instance indices in SAVE/batches/ (batch_trace.py)


@dataclass
class ExperimentSpec:
    run: RunSpec = field(default_factory=RunSpec)
    model: ModelSpec = field(default_factory=ModelSpec)
    data: DataSpec = field(default_factory=DataSpec)
    train: TrainSpec = field(default_factory=TrainSpec)
    eval: EvalSpec = field(default_factory=EvalSpec)

    @property
    def save_folder(self) -> str:
        return self.run.save_folder or f"runs/{self.run.name}"


def tokenizer_config(spec: ExperimentSpec) -> "TokenizerConfig":
    """The tokenizer's size and special ids without building data: dolma2's, or the demo's (its two
    special tokens are trained first: eos 0, pad 1)."""
    from olmo_core.data import TokenizerConfig

    if spec.data.tokenizer == "dolma2":
        return TokenizerConfig.dolma2()
    return TokenizerConfig(vocab_size=spec.data.demo_vocab_size, eos_token_id=0, pad_token_id=1)


def vocab_size(spec: ExperimentSpec) -> int:
    """The model's vocabulary without building data: explicit, dolma2's padded, or the demo's."""
    return spec.model.vocab_size or tokenizer_config(spec).padded_vocab_size()


# --- loading -------------------------------------------------------------------------------------


def _read_chain(path: Path, seen: tuple[Path, ...] = ()) -> list[tuple[Path, DictConfig]]:
    """The files of an ``extends`` chain, base first."""
    path = path.resolve()
    if path in seen:
        raise ConfigError(f"{path}: extends: circular chain {' -> '.join(map(str, seen))}")
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    try:
        cfg = OmegaConf.load(path)
    except Exception as e:  # yaml syntax
        raise ConfigError(f"{path}: cannot parse YAML: {_one_line(e)}") from e
    if not isinstance(cfg, DictConfig):
        raise ConfigError(f"{path}: a config file must be a mapping")
    parent = cfg.pop("extends", None)
    chain = _read_chain(path.parent / str(parent), seen + (path,)) if parent else []
    return chain + [(path, cfg)]


def _one_line(e: BaseException) -> str:
    msg = getattr(e, "msg", None) or str(e)
    return " ".join(str(msg).split())


def _where(key: str, chain: list[tuple[Path, DictConfig]], cli: list[str]) -> str:
    """The command line or the last file of the chain that sets ``key``."""
    if any(key == k or key.startswith(k + ".") for k in (o.split("=", 1)[0] for o in cli)):
        return "command line"
    for path, cfg in reversed(chain):
        node: Any = OmegaConf.to_container(cfg, resolve=False)  # a file sets a key, resolvable or not
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            return str(path)
    return str(chain[-1][0])


@cache
def _schema() -> DictConfig:
    """ExperimentSpec as an OmegaConf schema: built once (half of a config's load), copied per load."""
    return OmegaConf.structured(ExperimentSpec)


def load_spec(path: str | Path, overrides: Optional[List[str]] = None, layout: Optional[Layout] = None) -> ExperimentSpec:
    """Load, merge, validate for the ranks of ``layout`` (default: torchrun's environment).
    Raises :class:`ConfigError` with a one-line message."""
    overrides = list(overrides or [])
    chain = _read_chain(Path(path))
    merged: Any = copy.deepcopy(_schema())
    for source, cfg in chain:
        try:
            merged.merge_with(cfg)  # in place: OmegaConf.merge would deep-copy the whole config per file
        except OmegaConfBaseException as e:
            key = getattr(e, "full_key", "") or "?"
            raise ConfigError(f"{source}: {key}: {_one_line(e)}") from e
    for o in overrides:
        if "=" not in o:
            raise ConfigError(f"command line: override '{o}' is not key=value")
    try:
        merged.merge_with(OmegaConf.from_dotlist(overrides))
        spec: ExperimentSpec = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "") or "?"
        raise ConfigError(f"{_where(key, chain, overrides)}: {key}: {_one_line(e)}") from e
    where = partial(_where, chain=chain, cli=overrides)
    validate(spec, where)
    layout = layout or Layout.from_env()
    fit_world_size(spec, layout, where)
    apply_hardware(spec, where, layout)  # fills the train keys left at null
    return spec


def validate(spec: ExperimentSpec, where=lambda key: "config") -> None:
    """Shape and recipe checks that the schema's types cannot express."""

    def fail(key: str, value: Any, why: str):
        raise ConfigError(f"{where(key)}: {key}={value}: {why}")

    m, t, d = spec.model, spec.train, spec.data
    for key, value in (("model.d_model", m.d_model), ("model.n_layers", m.n_layers), ("model.n_heads", m.n_heads)):
        if value < 1:
            fail(key, value, "must be >= 1")
    _validate_attention(m, fail)
    if m.block not in BLOCKS:
        fail("model.block", m.block, f"unknown block; choose one of {', '.join(BLOCKS)}")
    if m.norm_placement not in NormPlacement.__members__:
        fail("model.norm_placement", m.norm_placement, "must be pre or post")
    if m.ffn_ratio < 1:
        fail("model.ffn_ratio", m.ffn_ratio, "must be >= 1")
    hourglass_experts = m.moe is not None and m.moe.experts == "hourglass"
    if m.block == "hourglass" or (m.block == "variable_width" and m.ffn == "hourglass") or hourglass_experts:
        if hourglass_experts and m.d_h is None and m.d_h_ratio is None:
            fail("model.d_h", None, "hourglass experts need model.d_h (or model.d_h_ratio): each sub-MLP's bottleneck at width h")
        if m.K < 1:
            fail("model.K", m.K, "must be >= 1")
        if m.d_h is not None and m.d_h_ratio is not None:
            fail("model.d_h_ratio", m.d_h_ratio, "give d_h or d_h_ratio, not both")
        if m.d_h_ratio is not None and m.d_h_ratio <= 0:
            fail("model.d_h_ratio", m.d_h_ratio, "must be > 0")
        if m.resolved_d_h < 1:
            fail("model.d_h", m.resolved_d_h, "must be >= 1")
        if m.K > 1 and m.d_h is None and m.d_h_ratio is None:
            fail("model.d_h", None, f"give d_h or d_h_ratio for K={m.K} (the default 4 d_model is the K=1 FFN)")
    if m.moe is not None:
        _validate_moe(m, t, fail)
    if m.block == "variable_width":
        _validate_widths(m, fail)
    if (t.max_tokens is None) == (t.max_steps is None):
        key = "train.max_tokens" if t.max_tokens is not None and where("train.max_tokens") == "command line" else "train.max_steps"
        fail(key, getattr(t, key.split(".")[1]), "give exactly one of train.max_tokens and train.max_steps")
    if t.global_batch_size < 1:
        fail("train.global_batch_size", t.global_batch_size, "must be >= 1")
    if t.micro_batch_size is not None and t.micro_batch_size < 1:
        fail("train.micro_batch_size", t.micro_batch_size, "must be >= 1")
    if t.schedule_lag < 0:
        fail("train.schedule_lag", t.schedule_lag, "must be >= 0")
    if t.warmup_steps is not None and t.warmup_tokens is not None:
        fail("train.warmup_tokens", t.warmup_tokens, "give warmup_steps or warmup_tokens, not both")
    _validate_schedule(t, fail)
    if t.precision not in ("bf16", "fp32"):
        fail("train.precision", t.precision, "must be bf16 or fp32")
    if t.data_parallel not in ("fsdp", "hsdp", "ddp"):
        fail("train.data_parallel", t.data_parallel, "must be fsdp, hsdp or ddp")
    if t.hardware not in HARDWARE:
        fail("train.hardware", t.hardware, f"unknown preset; choose one of {', '.join(HARDWARE)}")
    if t.device not in ("auto", "cpu", "cuda"):
        fail("train.device", t.device, "must be auto, cpu or cuda")
    if d.source not in ("demo", "numpy", "olmo2_stage1", "prefix"):
        fail("data.source", d.source, "must be demo, olmo2_stage1, prefix or numpy")
    if d.base is not None and d.source != "olmo2_stage1":
        fail("data.base", d.base, f"a mirror of the pinned list applies to data.source=olmo2_stage1, not {d.source}")
    if d.base is not None and "://" not in d.base and not Path(d.base).is_dir():
        fail("data.base", d.base, "no such folder")
    if d.source == "prefix" and not d.prefix_dir:
        fail("data.prefix_dir", d.prefix_dir, "a prefix data source needs the materialized folder")
    if d.source == "numpy" and not d.paths and not d.mix:
        fail("data.source", d.source, "a numpy data source needs data.paths or data.mix")
    if d.tokenizer not in ("demo", "dolma2"):
        fail("data.tokenizer", d.tokenizer, "must be demo or dolma2")
    if (d.source == "demo") != (d.tokenizer == "demo"):
        fail("data.tokenizer", d.tokenizer, f"data.source={d.source} is tokenized with {'demo' if d.source == 'demo' else 'dolma2'}")
    _validate_numbers(spec, fail)
    _validate_shapes(spec, fail)
    _validate_sources(spec, fail)
    validate_evals(spec, fail)
    if d.sequence_length < 2:
        fail("data.sequence_length", d.sequence_length, "must be >= 2")
    _validate_device_keys(spec, fail)


def _validate_device_keys(spec: ExperimentSpec, fail) -> None:
    m, d = spec.model, spec.data
    if m.attention_backend not in ATTENTION_BACKENDS:
        fail("model.attention_backend", m.attention_backend, f"choose one of {', '.join(ATTENTION_BACKENDS)}")
    if m.attention_backend in FLASH and spec.train.precision == "fp32":
        fail("model.attention_backend", m.attention_backend, "flash attention needs train.precision=bf16")
    if m.attention_backend in FLASH:  # on this machine's CUDA device, if any (a login node's dry run passes)
        import torch

        try:
            _resolve_backend(spec, "cuda" if spec.train.device != "cpu" and torch.cuda.is_available() else "cpu")
        except ValueError as e:
            fail("model.attention_backend", m.attention_backend, str(e))
    if d.num_workers is not None and d.num_workers < 0:
        fail("data.num_workers", d.num_workers, "must be >= 0")
    if d.prefetch_factor is not None and (d.prefetch_factor < 1 or d.num_workers == 0):
        fail("data.prefetch_factor", d.prefetch_factor, "must be >= 1, and needs data.num_workers > 0")


def _validate_schedule(t: TrainSpec, fail) -> None:
    if t.schedule not in ("cosine", "power"):
        fail("train.schedule", t.schedule, "must be cosine or power")
    if t.schedule != "power":
        return
    for key in ("a", "c"):
        if (value := getattr(t.power, key)) is None or value <= 0:
            fail(f"train.power.{key}", value, "schedule=power needs a value > 0")
    if t.warmup_tokens is not None or t.schedule_tokens is not None:
        key = "train.warmup_tokens" if t.warmup_tokens is not None else "train.schedule_tokens"
        fail(key, getattr(t, key.split(".")[1]), "schedule=power counts steps: give train.warmup_steps, no token horizon")


def _validate_attention(m: ModelSpec, fail) -> None:
    """Head size, GQA groups, FFN size and RoPE scaling."""
    if m.head_dim is None:
        if m.d_model % m.n_heads:
            fail("model.n_heads", m.n_heads, f"does not divide model.d_model={m.d_model} (or set model.head_dim)")
        if (m.d_model // m.n_heads) % 2:
            fail("model.n_heads", m.n_heads, f"head_dim {m.d_model // m.n_heads} = model.d_model / model.n_heads is odd; RoPE needs it even")
    elif m.head_dim < 2 or m.head_dim % 2:
        fail("model.head_dim", m.head_dim, "must be even and >= 2 (RoPE rotates pairs of dimensions)")
    if m.n_kv_heads is not None and (m.n_kv_heads < 1 or m.n_heads % m.n_kv_heads):
        fail("model.n_kv_heads", m.n_kv_heads, f"must divide model.n_heads={m.n_heads} (GQA groups)")
    if m.d_ff is not None and m.d_ff < 1:
        fail("model.d_ff", m.d_ff, "must be >= 1")
    if (r := m.rope_scaling) is not None:
        if r.factor < 1:
            fail("model.rope_scaling.factor", r.factor, "must be >= 1")
        if not 1 <= r.low_freq_factor < r.high_freq_factor:
            fail("model.rope_scaling.low_freq_factor", r.low_freq_factor,
                 f"must be >= 1 and < model.rope_scaling.high_freq_factor={r.high_freq_factor}")


# --- domains: every number in range, every local path there (issue 11) ---------------------------

_MAX_MATRIX = 2**40  # elements in one weight matrix: far beyond any GPU's memory, far below int64


def _validate_numbers(spec: ExperimentSpec, fail) -> None:
    """Numbers finite and in range; list lengths."""
    m, t, e, r = spec.model, spec.train, spec.eval, spec.run

    def check(key: str, value: Any, ok: bool, why: str) -> None:
        if value is not None and (not ok or (isinstance(value, float) and not math.isfinite(value))):
            fail(key, value, why)

    check("train.lr", t.lr, t.lr > 0, "must be finite and > 0")
    if len(t.betas) != 2:
        fail("train.betas", list(t.betas), "give two betas [beta1, beta2]")
    if not all(0 <= beta < 1 for beta in t.betas):
        fail("train.betas", list(t.betas), "each beta must be in [0, 1)")
    check("train.eps", t.eps, t.eps > 0, "must be finite and > 0")
    check("train.weight_decay", t.weight_decay, t.weight_decay >= 0, "must be finite and >= 0")
    check("train.final_lr_ratio", t.final_lr_ratio, 0 <= t.final_lr_ratio <= 1, "must be in [0, 1]")
    check("train.max_grad_norm", t.max_grad_norm, t.max_grad_norm is None or t.max_grad_norm > 0, "must be > 0 (null: no clipping)")
    check("train.z_loss", t.z_loss, t.z_loss is None or t.z_loss >= 0, "must be finite and >= 0 (null: off)")
    if t.optimizer not in ("adamw", "skip_step_adamw"):
        fail("train.optimizer", t.optimizer, "must be adamw or skip_step_adamw")
    for key in ("max_steps", "max_tokens", "schedule_tokens"):
        value = getattr(t, key)
        check(f"train.{key}", value, value is None or value >= 1, "must be >= 1")
    for key in ("warmup_steps", "warmup_tokens"):
        value = getattr(t, key)
        check(f"train.{key}", value, value is None or value >= 0, "must be >= 0")
    check("model.init_std", m.init_std, m.init_std > 0, "must be finite and > 0")
    check("model.norm_eps", m.norm_eps, m.norm_eps > 0, "must be finite and > 0")
    check("model.rope_theta", m.rope_theta, m.rope_theta > 0, "must be > 0")
    check("eval.interval", e.interval, e.interval >= 1, "must be >= 1")
    check("eval.max_batches", e.max_batches, e.max_batches is None or e.max_batches >= 1, "must be >= 1 (null: the whole set)")
    check("eval.downstream_interval", e.downstream_interval, e.downstream_interval is None or e.downstream_interval >= 1, "must be >= 1")
    check("run.log_interval", r.log_interval, r.log_interval >= 1, "must be >= 1")
    check("run.save_interval", r.save_interval, r.save_interval >= 1, "must be >= 1")
    check("run.ephemeral_keep", r.ephemeral_keep, r.ephemeral_keep >= 1, "must be >= 1")
    check("run.stop_at_step", r.stop_at_step, r.stop_at_step is None or r.stop_at_step >= 1, "must be >= 1")
    if r.ephemeral_save_interval is not None and not 1 <= r.ephemeral_save_interval < r.save_interval:
        fail("run.ephemeral_save_interval", r.ephemeral_save_interval, f"must be >= 1 and < run.save_interval={r.save_interval} (null: none)")
    if not r.name or "/" in r.name:
        fail("run.name", r.name, "must be a non-empty name without '/'")


def _validate_shapes(spec: ExperimentSpec, fail) -> None:
    """Shape arithmetic in Python integers: no matrix too large to build, a vocabulary that holds the tokenizer's."""
    m = spec.model
    vocab = vocab_size(spec)
    tokenizer_vocab = spec.data.demo_vocab_size if spec.data.tokenizer == "demo" else _dolma2_vocab()
    if m.vocab_size is not None and m.vocab_size < tokenizer_vocab:
        fail("model.vocab_size", m.vocab_size, f"smaller than the {spec.data.tokenizer} tokenizer's {tokenizer_vocab} tokens")
    hourglass = m.block == "hourglass" or (m.block == "variable_width" and m.ffn == "hourglass")
    hidden_key, hidden = ("model.d_h", m.resolved_d_h) if hourglass else ("model.ffn_ratio", m.ffn_ratio * m.d_model)
    for key, rows, cols in (("model.d_model", m.d_model, m.d_model), (hidden_key, m.d_model, hidden), ("model.vocab_size", vocab, m.d_model)):
        if rows * cols > _MAX_MATRIX:
            fail(key, getattr(m, key.split(".")[1]), f"a {rows} x {cols} weight matrix is over 2^40 elements")


def _dolma2_vocab() -> int:
    from olmo_core.data import TokenizerConfig

    return TokenizerConfig.dolma2().vocab_size


def _validate_sources(spec: ExperimentSpec, fail) -> None:
    """Local data paths and prefix folders exist; a prefix matches the run; cuda is there."""
    d, t = spec.data, spec.train
    if t.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            fail("train.device", t.device, "CUDA is not available on this machine")
    if d.source == "numpy":
        for path in d.paths:
            if "://" not in path and not Path(path).is_file():
                fail("data.paths", path, "no such file")
    if d.source == "prefix" and d.prefix_dir:
        _validate_prefix(spec, fail)


def _validate_prefix(spec: ExperimentSpec, fail) -> None:
    from .data.order import DataOrderError
    from .data.prefix import prefix_index

    d, t = spec.data, spec.train
    if not Path(d.prefix_dir).is_dir():
        fail("data.prefix_dir", d.prefix_dir, "no such folder (run: scripts/data_order.py materialize)")
    try:
        prefix = prefix_index(Path(d.prefix_dir))["spec"]
    except DataOrderError as e:
        fail("data.prefix_dir", d.prefix_dir, _one_line(e))
    if prefix["seq_len"] != d.sequence_length:
        fail("data.sequence_length", d.sequence_length, f"the prefix in {d.prefix_dir} has {prefix['seq_len']}-token instances")
    if prefix["seed"] != d.order_seed:
        fail("data.order_seed", d.order_seed, f"the prefix in {d.prefix_dir} was made with order seed {prefix['seed']}")
    tokens = t.max_tokens if t.max_tokens is not None else (t.max_steps or 0) * t.global_batch_size * d.sequence_length
    held = prefix["num_instances"] * prefix["seq_len"]
    if tokens > held:
        key = "train.max_tokens" if t.max_tokens is not None else "train.max_steps"
        fail(key, getattr(t, key.split(".")[1]), f"the run needs {tokens:,} tokens, the prefix in {d.prefix_dir} holds {held:,}")


def validate_evals(spec: ExperimentSpec, fail) -> None:
    from .eval.evaluators import VALIDATION_SETS

    e = spec.eval
    if unknown := [n for n in e.validation_sets if n not in VALIDATION_SETS]:
        fail("eval.validation_sets", unknown, f"unknown; choose from {', '.join(VALIDATION_SETS)}")
    if e.downstream_tasks:
        from olmo_eval import list_tasks

        if unknown := [n for n in e.downstream_tasks if n not in list_tasks()]:
            fail("eval.downstream_tasks", unknown, "not an ai2-olmo-eval task (olmo_eval.list_tasks())")
    if e.downstream_sequence_length is not None and e.downstream_sequence_length < 2:
        fail("eval.downstream_sequence_length", e.downstream_sequence_length, "must be >= 2 (a context token and an answer token)")


def _validate_widths(m: ModelSpec, fail) -> None:
    w = m.widths
    if m.ffn not in ("swiglu", "hourglass"):
        fail("model.ffn", m.ffn, "must be swiglu or hourglass")
    if w.schedule not in SCHEDULES:
        fail("model.widths.schedule", w.schedule, f"choose one of {', '.join(SCHEDULES)}")
    if w.shape not in SHAPES:
        fail("model.widths.shape", w.shape, f"choose one of {', '.join(SHAPES)}")
    if w.resize not in ResizeMode.__members__:
        fail("model.widths.resize", w.resize, f"choose one of {', '.join(ResizeMode.__members__)}")
    if w.init not in ("olmo", "mup"):
        fail("model.widths.init", w.init, "must be olmo or mup")
    if w.init == "mup" and m.ffn == "hourglass":
        fail("model.widths.init", w.init, "mup init is not supported with ffn=hourglass")
    if m.tie_embeddings:
        fail("model.tie_embeddings", m.tie_embeddings, "a variable-width model needs untied embeddings")
    if w.multiple < 1:
        fail("model.widths.multiple", w.multiple, "must be >= 1")
    if w.schedule == "list" and (w.values is None or len(w.values) != m.n_layers):
        fail("model.widths.values", w.values, f"schedule=list needs n_layers={m.n_layers} widths")
    try:
        widths = m.resolved_widths
    except ValueError as e:
        fail("model.widths.schedule", w.schedule, _one_line(e))
    key = "model.widths.values" if w.schedule == "list" else "model.widths.multiple"
    step = 1 if m.head_dim is not None else 2 * m.n_heads  # explicit head_dim: any width w_l
    why = "positive" if m.head_dim is not None else f"a positive multiple of 2 model.n_heads={step} (even head_dim for RoPE)"
    for layer, width in enumerate(widths, start=1):
        if width < 1 or width % step:
            fail(key, w.values if w.schedule == "list" else w.multiple, f"w_{layer}={width} is not {why}")
    if m.moe is not None and expert_hidden_size(min(widths), m.moe_hidden, m.d_model) < 1:
        key = "model.d_h" if m.moe.experts == "hourglass" else "model.moe.expert_hidden"
        fail(key, m.moe_hidden, f"the narrowest layer (w={min(widths)}) would get experts of hidden size 0")


def _validate_moe(m: ModelSpec, t: TrainSpec, fail) -> None:
    e = m.moe
    assert e is not None
    if m.block != "variable_width":
        fail("model.moe", "{...}", f"a mixture of experts needs model.block=variable_width (a constant schedule is the baseline), not {m.block}")
    if m.ffn != "swiglu":
        fail("model.ffn", m.ffn, "the MoE replaces the FFN; give the experts' kind as model.moe.experts")
    if m.norm_placement != "pre":
        fail("model.norm_placement", m.norm_placement, "the variable-width MoE block is pre-norm (the authors' lm-engine block)")
    if e.experts not in Experts.__members__:
        fail("model.moe.experts", e.experts, f"choose one of {', '.join(Experts.__members__)}")
    if e.num_experts < 1:
        fail("model.moe.num_experts", e.num_experts, "must be >= 1")
    if not 1 <= e.top_k <= e.num_experts:
        fail("model.moe.top_k", e.top_k, f"must be in [1, model.moe.num_experts={e.num_experts}]")
    if e.experts == "hourglass":  # the experts' shape is model.K and model.d_h (checked in validate)
        if e.expert_hidden is not None:
            fail("model.moe.expert_hidden", e.expert_hidden, "hourglass experts take their shape from model.K and model.d_h; remove it")
    elif e.expert_hidden is None or e.expert_hidden < 1:
        fail("model.moe.expert_hidden", e.expert_hidden, "must be >= 1 for swiglu experts")
    for key in ("lb_loss_weight", "z_loss_weight"):
        if not (math.isfinite(value := getattr(e, key)) and value >= 0):
            fail(f"model.moe.{key}", value, "must be finite and >= 0 (0: off)")
    if t.activation_checkpointing:
        fail("train.activation_checkpointing", t.activation_checkpointing, "OLMo-core cannot checkpoint MoE blocks; use false or null")


@dataclass(frozen=True)
class Layout:
    """The ranks a run has: ``world_size`` processes, ``local`` per node, on ``nodes`` nodes (as
    OLMo-core counts them for HSDP: NUM_NODES, else world / local)."""

    world_size: int = 1
    local: int = 1
    nodes: int = 1

    @classmethod
    def plan(cls, nproc_per_node: int, nodes: int = 1) -> "Layout":
        return cls(nproc_per_node * nodes, nproc_per_node, nodes)

    @classmethod
    def from_env(cls) -> "Layout":
        """torchrun's WORLD_SIZE and LOCAL_WORLD_SIZE; one process without them."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        return cls(world, local, int(os.environ.get("NUM_NODES", 0)) or max(world // local, 1))

    def __str__(self) -> str:
        return f"{_count(self.world_size, 'rank')} ({_count(self.nodes, 'node')} x {self.local})"


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def fit_world_size(spec: ExperimentSpec, layout: Layout, where=lambda key: "config") -> None:
    """The per-rank arithmetic for ``layout``, before anything is built or written.

    An explicit micro-batch larger than the per-rank batch is lowered to it (one info line): the
    micro-batch only trades memory for speed, the global batch (hence the result) is unchanged, and a
    config sized for one process then runs on any number. One that does not divide the per-rank
    batch is refused: no value is clearly right (the nearest divisor may halve the throughput)."""
    t = spec.train
    g, n = t.global_batch_size, layout.world_size

    def fail(key: str, value: Any, why: str):
        raise ConfigError(f"{where(key)}: {key}={value}: {why}")

    if g % n:
        fail("train.global_batch_size", g, f"is not divisible by the {layout}: each rank takes a whole number of sequences")
    per_rank = g // n
    m = t.micro_batch_size
    if m is not None and m > per_rank:
        log.info(f"train.micro_batch_size={m} > the per-rank batch {per_rank} ({g} sequences / {layout}): using {per_rank}")
        t.micro_batch_size = per_rank
    elif m is not None and per_rank % m:
        fail("train.micro_batch_size", m,
             f"does not divide the per-rank batch {per_rank} (train.global_batch_size={g} / {layout})")
    if t.data_parallel == "hsdp" and n > 1 and layout.nodes * layout.local != n:
        fail("train.data_parallel", t.data_parallel,
             f"HSDP shards over a node's ranks and replicates across nodes: {layout} is not {layout.nodes} equal nodes")


def apply_hardware(spec: ExperimentSpec, where=lambda key: "config", layout: Optional[Layout] = None) -> None:
    """Fill the train keys left at null from ``train.hardware`` (hardware.py's presets for this
    model), per rank of ``layout`` (after :func:`fit_world_size`)."""
    t = spec.train
    if (t.micro_batch_size, t.activation_checkpointing, t.compile).count(None) == 0:
        return
    layout = layout or Layout.from_env()
    per_rank = t.global_batch_size // layout.world_size
    card = None if t.device == "cpu" else detect() if t.hardware == "auto" else CARDS.get(t.hardware)
    if card is None:  # none, a CPU run, or auto without a GPU
        settings = Settings(t.micro_batch_size or per_rank, False, False)
    else:
        shards = {"fsdp": layout.world_size, "hsdp": layout.local, "ddp": 1}.get(t.data_parallel, 1)
        est = estimate(spec.model.build(vocab_size(spec)), spec.data.sequence_length, shards)
        try:
            ac = False if spec.model.moe is not None else t.activation_checkpointing  # OLMo-core cannot checkpoint MoE blocks
            settings = choose(est, card, per_rank, t.micro_batch_size, ac)
        except ValueError as e:
            raise ConfigError(f"{where('train.hardware')}: train.hardware={t.hardware}: {spec.run.name} {e}") from None
    filled = {k: getattr(settings, k) for k in ("micro_batch_size", "activation_checkpointing", "compile") if getattr(t, k) is None}
    for key, value in filled.items():
        setattr(t, key, value)
    if card is not None:  # without a card nothing is chosen: no preset line
        log.info(f"train.hardware={t.hardware} -> {card.name} ({layout}): {filled}")


def attention_backend(spec: ExperimentSpec, device: str) -> BackendChoice:
    """The attention backend this spec runs with on ``device`` (cpu | cuda); raises ConfigError
    for an explicit flash backend that cannot run on this CUDA machine (load_spec checks it first)."""
    try:
        return _resolve_backend(spec, device)
    except ValueError as e:
        raise ConfigError(f"config: model.attention_backend={spec.model.attention_backend}: {e}") from None


def _resolve_backend(spec: ExperimentSpec, device: str) -> BackendChoice:
    dims = head_dims(spec.model.build(vocab_size(spec)))
    return resolve_attention_backend(spec.model.attention_backend, dims, cuda=device == "cuda", bf16=spec.train.precision == "bf16")


def data_workers(spec: ExperimentSpec, device: str) -> int:
    """data.num_workers, or its default: 0 on CPU (no worker start-up: tests and demos), CUDA_WORKERS on CUDA."""
    if spec.data.num_workers is not None:
        return spec.data.num_workers
    return CUDA_WORKERS if device == "cuda" else 0


def spec_to_yaml(spec: ExperimentSpec) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(spec))
