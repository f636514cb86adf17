"""YAML (omegaconf) -> a typed experiment spec -> OLMo-core configs.

A config file states its intent in short keys (``model.block: hourglass``, ``model.K: 4``); this
module validates it against the dataclasses below (unknown key, wrong type, impossible shape: one
line naming the key, value and file) and builds OLMo-core's own ``TransformerConfig`` from it.

A file may extend another (``extends: ../base.yaml``, relative to the file); the variant's keys
override the base's, and omegaconf interpolation (``${model.d_model}``) works across the chain.
``key=value`` overrides from the command line are applied last.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any, List, Optional

from olmo_core.nn.feed_forward import FeedForwardConfig
from olmo_core.nn.transformer import TransformerBlockConfig, TransformerBlockType, TransformerConfig
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .nn.hourglass_block import HourglassBlockConfig
from .hardware import CARDS, HARDWARE, Settings, choose, detect, estimate
from .nn.hourglass import HourglassFeedForwardConfig, NormPlacement
from .nn.variable_width import SCHEDULES, SHAPES, MuPConfig, ResizeMode, VariableWidthTransformerConfig, schedule_widths

log = logging.getLogger(__name__)

__all__ = [
    "ConfigError",
    "ModelSpec",
    "DataSpec",
    "TrainSpec",
    "EvalSpec",
    "RunSpec",
    "ExperimentSpec",
    "load_spec",
    "vocab_size",
]

BLOCKS = ("baseline", "hourglass", "variable_width")


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
class ModelSpec:
    block: str = "baseline"  # baseline (SwiGLU, hidden ffn_ratio * d_model) | hourglass | variable_width
    d_model: int = MISSING  # d_model: width of the residual stream
    n_layers: int = MISSING  # L: number of transformer layers
    n_heads: int = MISSING  # attention heads (MHA); head_dim = d_model / n_heads
    ffn_ratio: int = 4  # baseline FFN hidden size = ffn_ratio * d_model (the conventional 4)
    K: int = 1  # hourglass: stacked wide-narrow-wide sub-MLPs per layer
    d_h: Optional[int] = None  # hourglass: bottleneck width d_h ...
    d_h_ratio: Optional[float] = None  # ... or d_h / d_model, rounded to a multiple of d_h_multiple
    d_h_multiple: int = 1  # rounding multiple for d_h when given as a ratio
    norm_placement: str = "pre"  # pre: x + f(norm(x)) (papers); post: x + norm(f(x)) (OLMo-2)
    qk_norm: bool = False  # RMSNorm on queries and keys (OLMo-2)
    rope_theta: int = 500_000
    norm_eps: float = 1e-6  # RMSNorm epsilon
    vocab_size: Optional[int] = None  # default: the tokenizer's vocabulary padded to 128
    tie_embeddings: bool = False
    init_std: float = 0.02  # OLMo-core's init: normal(0, init_std) cut at 3 std
    ffn: str = "swiglu"  # variable_width: each layer's FFN, swiglu | hourglass (K, d_h scaled with w_l)
    widths: WidthSpec = field(default_factory=WidthSpec)  # variable_width: w_l (d_model is h)

    @property
    def resolved_widths(self) -> List[int]:
        """w_1..w_L of a variable-width model (raises ValueError for an impossible schedule)."""
        w = self.widths
        return schedule_widths(
            w.schedule, self.d_model, self.n_layers, shape=w.shape, r_l=w.r_l, r_d=w.r_d, multiple=w.multiple,
            widths=w.values,
        )

    @property
    def resolved_d_h(self) -> int:
        """d_h, from ``d_h`` or from ``d_h_ratio * d_model`` rounded to ``d_h_multiple``."""
        if self.d_h is not None:
            return self.d_h
        if self.d_h_ratio is not None:
            m = self.d_h_multiple
            return int(round(self.d_h_ratio * self.d_model / m)) * m
        return self.ffn_ratio * self.d_model  # K=1 default: the conventional FFN width

    def build(self, vocab_size: int) -> TransformerConfig:
        """OLMo-core's ``TransformerConfig`` for this shape (init seed set by the trainer)."""
        post = NormPlacement(self.norm_placement) == NormPlacement.post
        config = TransformerConfig.llama_like(
            d_model=self.d_model,
            vocab_size=self.vocab_size or vocab_size,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            qk_norm=self.qk_norm,
            layer_norm_eps=self.norm_eps,
            rope_theta=self.rope_theta,
            block_name=TransformerBlockType.reordered_norm if post else TransformerBlockType.default,
            feed_forward=FeedForwardConfig(hidden_size=self.ffn_ratio * self.d_model, bias=False),
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
        if self.block == "variable_width":
            w = self.widths
            base = {f.name: getattr(config, f.name) for f in fields(TransformerConfig)}
            return VariableWidthTransformerConfig(
                **base,
                widths=self.resolved_widths,
                resize=ResizeMode(w.resize),
                ffn_hidden_ratio=(self.resolved_d_h if hourglass else self.ffn_ratio * self.d_model) / self.d_model,
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
    weight_decay: float = 0.1  # embeddings are not decayed
    warmup_steps: Optional[int] = None  # linear warmup in steps ...
    warmup_tokens: Optional[int] = None  # ... or in tokens
    schedule_tokens: Optional[int] = None  # cosine horizon if not the training length (OLMo-2: 5e12)
    final_lr_ratio: float = 0.1  # lr at the end of the cosine, as a fraction of the peak
    z_loss: Optional[float] = 1e-5  # z-loss multiplier (None: off)
    max_grad_norm: float = 1.0
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
    ephemeral_save_interval: Optional[int] = 250  # checkpoints kept until the next one
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


def vocab_size(spec: ExperimentSpec) -> int:
    """The model's vocabulary without building data: explicit, dolma2's padded, or the demo's."""
    if spec.model.vocab_size:
        return spec.model.vocab_size
    from olmo_core.data import TokenizerConfig

    if spec.data.tokenizer == "dolma2":
        return TokenizerConfig.dolma2().padded_vocab_size()
    # The demo tokenizer's ids (eos 0, pad 1) do not change the padded size.
    return TokenizerConfig(vocab_size=spec.data.demo_vocab_size, eos_token_id=0, pad_token_id=1).padded_vocab_size()


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
    if any(o.split("=", 1)[0] == key for o in cli):
        return "command line"
    for path, cfg in reversed(chain):
        if OmegaConf.select(cfg, key, default=None, throw_on_missing=False) is not None:
            return str(path)
    return str(chain[-1][0])


def load_spec(path: str | Path, overrides: Optional[List[str]] = None) -> ExperimentSpec:
    """Load, merge, validate. Raises :class:`ConfigError` with a one-line message."""
    overrides = list(overrides or [])
    chain = _read_chain(Path(path))
    merged: Any = OmegaConf.structured(ExperimentSpec)
    for source, cfg in chain:
        try:
            merged = OmegaConf.merge(merged, cfg)
        except OmegaConfBaseException as e:
            key = getattr(e, "full_key", "") or "?"
            raise ConfigError(f"{source}: {key}: {_one_line(e)}") from e
    for o in overrides:
        if "=" not in o:
            raise ConfigError(f"command line: override '{o}' is not key=value")
    try:
        merged = OmegaConf.merge(merged, OmegaConf.from_dotlist(overrides))
        spec: ExperimentSpec = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "") or "?"
        raise ConfigError(f"{_where(key, chain, overrides)}: {key}: {_one_line(e)}") from e
    where = partial(_where, chain=chain, cli=overrides)
    validate(spec, where)
    apply_hardware(spec, where)  # fills the train keys left at null
    return spec


def validate(spec: ExperimentSpec, where=lambda key: "config") -> None:
    """Shape and recipe checks that the schema's types cannot express."""

    def fail(key: str, value: Any, why: str):
        raise ConfigError(f"{where(key)}: {key}={value}: {why}")

    m, t, d = spec.model, spec.train, spec.data
    for key, value in (("model.d_model", m.d_model), ("model.n_layers", m.n_layers), ("model.n_heads", m.n_heads)):
        if value < 1:
            fail(key, value, "must be >= 1")
    if m.d_model % m.n_heads:
        fail("model.n_heads", m.n_heads, f"does not divide model.d_model={m.d_model}")
    if (m.d_model // m.n_heads) % 2:
        fail("model.n_heads", m.n_heads, f"head_dim {m.d_model // m.n_heads} = model.d_model / model.n_heads is odd; RoPE needs it even")
    if m.block not in BLOCKS:
        fail("model.block", m.block, f"unknown block; choose one of {', '.join(BLOCKS)}")
    if m.norm_placement not in NormPlacement.__members__:
        fail("model.norm_placement", m.norm_placement, "must be pre or post")
    if m.ffn_ratio < 1:
        fail("model.ffn_ratio", m.ffn_ratio, "must be >= 1")
    if m.block == "hourglass" or (m.block == "variable_width" and m.ffn == "hourglass"):
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
    if m.block == "variable_width":
        _validate_widths(m, fail)
    if (t.max_tokens is None) == (t.max_steps is None):
        fail("train.max_steps", t.max_steps, "give exactly one of train.max_tokens and train.max_steps")
    if t.global_batch_size < 1 or (t.micro_batch_size is not None and t.micro_batch_size < 1):
        fail("train.micro_batch_size", t.micro_batch_size, "batch sizes must be >= 1")
    if t.micro_batch_size is not None and t.global_batch_size % t.micro_batch_size:
        fail("train.micro_batch_size", t.micro_batch_size, f"does not divide train.global_batch_size={t.global_batch_size}")
    if t.warmup_steps is not None and t.warmup_tokens is not None:
        fail("train.warmup_tokens", t.warmup_tokens, "give warmup_steps or warmup_tokens, not both")
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
    if d.source == "prefix" and not d.prefix_dir:
        fail("data.prefix_dir", d.prefix_dir, "a prefix data source needs the materialized folder")
    if d.source == "numpy" and not d.paths and not d.mix:
        fail("data.paths", d.paths, "a numpy data source needs data.paths or data.mix")
    if d.tokenizer not in ("demo", "dolma2"):
        fail("data.tokenizer", d.tokenizer, "must be demo or dolma2")
    if (d.source == "demo") != (d.tokenizer == "demo"):
        fail("data.tokenizer", d.tokenizer, f"data.source={d.source} is tokenized with {'demo' if d.source == 'demo' else 'dolma2'}")
    _validate_evals(spec, fail)
    if d.sequence_length < 2:
        fail("data.sequence_length", d.sequence_length, "must be >= 2")


def _validate_evals(spec: ExperimentSpec, fail) -> None:
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
    if spec.data.source == "prefix" and spec.data.prefix_dir and Path(spec.data.prefix_dir).exists():
        from .data.prefix import prefix_seq_len

        if (seq := prefix_seq_len(spec.data.prefix_dir)) != spec.data.sequence_length:
            fail("data.sequence_length", spec.data.sequence_length, f"the prefix in {spec.data.prefix_dir} has {seq}-token instances")


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
    for layer, width in enumerate(widths, start=1):
        if width < 1 or width % (2 * m.n_heads):
            fail(key, w.values if w.schedule == "list" else w.multiple,
                 f"w_{layer}={width} is not a positive multiple of 2 model.n_heads={2 * m.n_heads} (even head_dim for RoPE)")


def apply_hardware(spec: ExperimentSpec, where=lambda key: "config", world_size: Optional[int] = None) -> None:
    """Fill the train keys left at null from ``train.hardware`` (hardware.py's presets for this model)."""
    t = spec.train
    if (t.micro_batch_size, t.activation_checkpointing, t.compile).count(None) == 0:
        return
    world_size = world_size or int(os.environ.get("WORLD_SIZE", "1"))
    card = None if t.device == "cpu" else detect() if t.hardware == "auto" else CARDS.get(t.hardware)
    if card is None:  # none, a CPU run, or auto without a GPU
        settings = Settings(t.micro_batch_size or max(t.global_batch_size // world_size, 1), False, False)
    else:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        shards = {"fsdp": world_size, "hsdp": local, "ddp": 1}.get(t.data_parallel, 1)
        est = estimate(spec.model.build(vocab_size(spec)), spec.data.sequence_length, shards)
        try:
            settings = choose(est, card, max(t.global_batch_size // world_size, 1), t.micro_batch_size, t.activation_checkpointing)
        except ValueError as e:
            raise ConfigError(f"{where('train.hardware')}: train.hardware={t.hardware}: {spec.run.name} {e}") from None
    filled = {k: getattr(settings, k) for k in ("micro_batch_size", "activation_checkpointing", "compile") if getattr(t, k) is None}
    for key, value in filled.items():
        setattr(t, key, value)
    log.info(f"train.hardware={t.hardware} -> {card.name if card else 'none'} ({world_size} ranks): {filled}")


def spec_to_yaml(spec: ExperimentSpec) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(spec))
