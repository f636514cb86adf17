"""The experiment spec: typed dataclasses for every key a config file may set (the model's are
olmo_patches/blocks/: the keys every kind shares, and each kind's own), each key's check beside
it, as OLMo-core's configs keep theirs (their ``__post_init__``/``validate``; those import torch,
olmo_core/config.py line 21, and a config loads without it).

A config file states its intent in short keys (``model.block: hourglass``, ``model.K: 4``); each
field's comment is its documentation. A number's domain is its field's (:func:`ranged`); what reads
two keys of one section is that section's ``validate``; what reads two sections is
:meth:`ExperimentSpec.validate`'s. A failure is one line naming the file (or "command line") that
set the key, the key and the value.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from omegaconf import MISSING

from ..blocks import BLOCKS, block_of
from ..blocks.base import ConfigError, ModelSpec
from ..blocks.checks import MAX_MATRIX, check_model
from ..shapes.choices import StrEnum

if TYPE_CHECKING:  # the model's classes are imported by build(): loading a config imports no torch
    from olmo_core.data import TokenizerConfig
    from olmo_core.nn.transformer import TransformerConfig
    from olmo_core.train.train_module import TransformerActivationCheckpointingConfig

# The fixed choices: omegaconf refuses any other value at load, naming the key. The model's are
# beside its keys (olmo_patches/blocks/).


class DataSource(StrEnum):
    demo = "demo"
    olmo2_stage1 = "olmo2_stage1"
    prefix = "prefix"
    numpy = "numpy"


class Tokenizer(StrEnum):
    demo = "demo"
    dolma2 = "dolma2"


class LRSchedule(StrEnum):
    cosine = "cosine"
    power = "power"


class Optimizer(StrEnum):
    adamw = "adamw"
    # OLMo-core's: skips steps whose loss or grad norm is 6 std above the last 128
    skip_step_adamw = "skip_step_adamw"


class Precision(StrEnum):
    bf16 = "bf16"
    fp32 = "fp32"


class Float8(StrEnum):
    off = "off"
    tensorwise = "tensorwise"
    rowwise = "rowwise"
    rowwise_with_gw_hp = "rowwise_with_gw_hp"


class Hardware(StrEnum):
    auto = "auto"  # the GPU torch sees
    none = "none"  # no preset
    rtx6000ada = "rtx6000ada"  # launch/cards.py
    h100 = "h100"
    h200 = "h200"
    b200 = "b200"


class DataParallel(StrEnum):
    fsdp = "fsdp"
    hsdp = "hsdp"
    ddp = "ddp"


class Device(StrEnum):
    auto = "auto"  # cuda when available
    cpu = "cpu"
    cuda = "cuda"


def failer(where=lambda key: "config"):
    """``fail(key, value, why)``: raises the one-line ConfigError naming where ``key`` was set."""

    def fail(key: str, value: Any, why: str):
        raise ConfigError(f"{where(key)}: {key}={value}: {why}")

    fail.where = where  # a check that blames the key changed last asks it
    return fail


def one_line(e: BaseException) -> str:
    """An exception's message on one line (a ConfigError's reason from a library's error)."""
    msg = getattr(e, "msg", None) or str(e)
    return " ".join(str(msg).split())


# ---- each value's domain, beside its key --------------------------------------------------------

# no key's value is larger: the largest integer a float holds exactly (token counts reach 1e13)
_MAX_NUMBER = 2**53
# tokens per sequence: 8x Llama 3.1's 128K context; OLMo-core builds the RoPE table for it
_MAX_SEQUENCE = 2**20
_MAX_STEP_TOKENS = 2**32  # tokens per optimizer step: 1000x OLMo-2's 4M


def ranged(default: Any, rule: str, note: str = "") -> Any:
    """A number key's default and its domain, which :func:`check_fields` checks at load: ``>= N``,
    ``> N`` or an interval ``[a, b]`` / ``[a, b)`` (``2^k`` allowed); null is not checked. ``note``
    ends the refusal (what the bound is, what null means)."""
    return field(default=default, metadata={"rule": rule, "note": note})


def _number(text: str) -> float:
    base, _, power = text.strip().partition("^")
    return float(base) ** int(power) if power else float(base)


def _outside(value: float, rule: str) -> bool:
    if rule.startswith("["):
        lo, hi = (_number(x) for x in rule[1:-1].split(","))
        return not (lo <= value and (value <= hi if rule.endswith("]") else value < hi))
    op, bound = rule.split()
    return not (value >= _number(bound) if op == ">=" else value > _number(bound))


def check_fields(node: Any, fail, prefix: str = "") -> None:
    """Every value of a spec section, of its sections and of its mixture's sources: each number
    finite, at most 2^53 in magnitude and in its key's domain (:func:`ranged`), each string
    non-empty (null unsets a key), the items of every list too; before any check that does
    arithmetic with them."""
    for f in fields(node):
        key, value = f"{prefix}{f.name}", getattr(node, f.name)
        if is_dataclass(value):
            check_fields(value, fail, f"{key}.")
            continue
        if isinstance(value, dict):
            for name, item in value.items():
                if is_dataclass(item):
                    check_fields(item, fail, f"{key}.{name}.")
            continue
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, bool) or item is None:
                continue
            if isinstance(item, (int, float)) and not (
                math.isfinite(item) and abs(item) <= _MAX_NUMBER
            ):
                fail(key, value, "must be a finite number of magnitude at most 2^53")
            if isinstance(item, str) and not item.strip():
                null = " (null: unset)" if f.default is None else ""
                fail(key, repr(value), f"must not be empty{null}")
        if (rule := f.metadata.get("rule")) and value is not None and _outside(value, rule):
            how = f"in {rule}" if rule.startswith("[") else rule
            fail(key, value, " ".join(filter(None, [f"must be {how}", f.metadata["note"]])))


# ---- the sections -------------------------------------------------------------------------------


@dataclass
class MixSource:
    """One source of data.mixture: its token files and its share of the training tokens."""

    # share of the training tokens (the sources' ratios are divided by their sum)
    ratio: float = ranged(MISSING, ">= 0")
    paths: List[str] = field(default_factory=list)  # token files or globs ...
    manifest: Optional[str] = None  # ... or an hourglass-tokenize folder (its manifest.json)
    # most passes over the source's tokens (1: none repeated)
    max_repetition: float = ranged(1.0, ">= 1")


@dataclass
class DataSpec:
    # demo: the embedded stdlib corpus | olmo2_stage1: OLMo-2 1B's Stage 1 files (data_order/'s
    # pinned, checksummed list), shuffled as OLMo-2 was | prefix: a local materialized prefix of
    # that order (scripts/data_order.py materialize), read in order | numpy: any token files or mix
    source: DataSource = DataSource.demo
    paths: List[str] = field(default_factory=list)  # numpy: token files (local paths or URLs)
    base: Optional[str] = (
        None  # olmo2_stage1: a mirror for http://olmo-data.org in the pinned list (folder or URL)
    )
    mix: Optional[str] = None  # numpy: or an OLMo-core DataMix name, e.g. OLMoE-mix-0824
    # numpy: or named sources mixed by ratio
    mixture: Dict[str, MixSource] = field(default_factory=dict)
    mix_base_dir: str = "http://olmo-data.org"  # where the mix (and validation sets) live
    prefix_dir: Optional[str] = None  # prefix: the materialized folder
    instance_filter: bool = (
        False  # OLMo-2's repetition filter (loss masked on degenerate instances)
    )
    tokenizer: Tokenizer = Tokenizer.demo  # demo (trained on the demo corpus) | dolma2
    tokenizer_file: Optional[str] = None  # a local tokenizer JSON (else the Hugging Face hub)
    sequence_length: int = ranged(4096, ">= 2")  # tokens per instance, in [2, 2^20]
    # data order seed as the old OLMo trainer counts it (epoch 0)
    order_seed: int = ranged(6198, "[0, 2^32)", "(numpy's seed range)")
    work_dir: str = ".cache/olmo-data"  # OLMo-core's dataset cache
    # BPE vocabulary trained on the demo corpus
    demo_vocab_size: int = ranged(4096, ">= 2", "(the end-of-text and padding tokens)")
    # null: the checkout's .cache/demo-corpus, else the user's cache folder (default_demo_cache)
    demo_cache: Optional[str] = None
    # loader processes per rank (null: 0 on CPU, CUDA_WORKERS on CUDA); order unchanged
    num_workers: Optional[int] = ranged(None, ">= 0")
    # batches each worker reads ahead (null: torch's 2)
    prefetch_factor: Optional[int] = ranged(None, ">= 1", "(and needs data.num_workers > 0)")

    def validate(self, fail) -> None:
        """The source's keys, the mixture's, the loader's."""
        if self.sequence_length > _MAX_SEQUENCE:
            fail("data.sequence_length", self.sequence_length, "must be at most 2^20")
        if self.base is not None and self.source != "olmo2_stage1":
            fail(
                "data.base",
                self.base,
                f"a mirror of the pinned list applies to data.source=olmo2_stage1, not "
                f"{self.source}",
            )
        if self.source == "prefix" and not self.prefix_dir:
            fail("data.prefix_dir", None, "a prefix data source needs the materialized folder")
        if self.source == "numpy" and not (self.paths or self.mix or self.mixture):
            fail(
                "data.source",
                "numpy",
                "a numpy data source needs data.paths, data.mix or data.mixture",
            )
        if self.source != "numpy" and (self.source == "demo") != (self.tokenizer == "demo"):
            used = "demo" if self.source == "demo" else "dolma2"
            fail(
                "data.tokenizer",
                self.tokenizer,
                f"data.source={self.source} is tokenized with {used}",
            )
        if self.prefetch_factor is not None and self.num_workers == 0:
            fail("data.prefetch_factor", self.prefetch_factor, "needs data.num_workers > 0")
        if self.mixture:
            self._check_mixture(fail)

    def _check_mixture(self, fail) -> None:
        """numpy sources alone, each with token files or a manifest, the ratios' sum positive."""
        if self.source != "numpy" or self.paths or self.mix:
            fail(
                "data.mixture",
                ", ".join(self.mixture),
                "needs data.source=numpy and neither data.paths nor data.mix",
            )
        for name, s in self.mixture.items():
            if bool(s.paths) == bool(s.manifest):
                fail(
                    f"data.mixture.{name}.paths",
                    list(s.paths),
                    "give the source paths or a manifest, one of the two",
                )
        if not sum(s.ratio for s in self.mixture.values()) > 0:
            ratios = ", ".join(f"{n}={s.ratio}" for n, s in self.mixture.items())
            fail("data.mixture", ratios, "the ratios must sum to a positive number")


def default_demo_cache() -> Path:
    """Where the demo corpus is built once for every working folder: the checkout's
    .cache/demo-corpus (this package's own checkout: an editable install), else $XDG_CACHE_HOME (or
    ~/.cache)/hourglass-olmo/demo-corpus."""
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file() and (checkout / "olmo_patches").is_dir():
        return checkout / ".cache" / "demo-corpus"
    return (
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        / "hourglass-olmo"
        / "demo-corpus"
    )


def demo_cache(spec: "ExperimentSpec") -> Path:
    """The demo corpus cache of ``spec``: data.demo_cache, or :func:`default_demo_cache`."""
    return Path(spec.data.demo_cache) if spec.data.demo_cache else default_demo_cache()


@dataclass
class PowerSpec:
    """train.schedule=power: lm-engine's lr = lr min(1, (a / lr) (n c)^b) after a linear warmup
    (optim/power.py)."""

    a: Optional[float] = None  # the authors: 4 x sequences per step
    b: float = -0.566  # the authors' exponent
    c: Optional[float] = None  # tokens per step: sequences per step x sequence length


AC_MODES = ("off", "full", "selected_blocks", "selected_modules", "budget")
# each mode's argument, and an example of it for the refusal
AC_ARGS = {
    "selected_blocks": ("block_interval", "2"),
    "selected_modules": ("modules", "blocks.*.feed_forward"),
    "budget": ("budget", "0.5"),
}


@dataclass
class ActivationCheckpointing:
    """OLMo-core's activation checkpointing (recompute in backward:
    TransformerActivationCheckpointingConfig), in its names; its checks are OLMo-core's own
    (``TransformerActivationCheckpointingConfig`` at build), here at load, in one line (those that
    read the model: :meth:`ExperimentSpec.validate`)."""

    mode: str = "full"  # off | full (every block) | selected_blocks | selected_modules | budget
    # selected_blocks: blocks 0, n, 2n, ... are recomputed in backward
    block_interval: Optional[int] = ranged(None, ">= 1", "(blocks 0, n, 2n, ... are checkpointed)")
    modules: Optional[List[str]] = (
        None  # selected_modules: module-name globs, e.g. blocks.*.feed_forward
    )
    # budget: activation memory kept, 0 (recompute all) .. 1 (none); needs train.compile
    budget: Optional[float] = ranged(None, "[0, 1]", "(0: recompute everything, 1: nothing)")

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    def __str__(self) -> str:
        arg = {
            "selected_blocks": self.block_interval,
            "budget": self.budget,
            "selected_modules": ",".join(self.modules or []),
        }.get(self.mode)
        return self.mode if arg is None else f"{self.mode}:{arg}"

    def validate(self, fail) -> None:
        """A known mode, with its own argument and no other mode's."""
        key = "train.activation_checkpointing"
        if self.mode not in AC_MODES:
            fail(f"{key}.mode", self.mode, f"choose one of {', '.join(AC_MODES)} (or true, false)")
        for mode, (arg, _) in AC_ARGS.items():
            if getattr(self, arg) is not None and self.mode != mode:
                fail(
                    f"{key}.{arg}",
                    getattr(self, arg),
                    f"applies to mode {mode} only, not {self.mode}",
                )
        if self.mode in AC_ARGS and getattr(self, (arg := AC_ARGS[self.mode][0])) in (None, []):
            example = f"{self.mode}:{AC_ARGS[self.mode][1]}"
            fail(f"{key}.{arg}", getattr(self, arg), f"mode {self.mode} needs it (e.g. {example})")

    def build(self) -> Optional["TransformerActivationCheckpointingConfig"]:
        """OLMo-core's config (None: off)."""
        from olmo_core.nn.transformer.config import TransformerActivationCheckpointingMode
        from olmo_core.train.train_module import TransformerActivationCheckpointingConfig

        if not self.enabled:
            return None
        return TransformerActivationCheckpointingConfig(
            mode=TransformerActivationCheckpointingMode(self.mode),
            block_interval=self.block_interval,
            modules=self.modules,
            activation_memory_budget=self.budget,
        )


def coerce_activation_checkpointing(value: Any) -> Any:
    """A shorthand of ``train.activation_checkpointing`` as its full mapping (every key, so a later
    file or the command line replaces an earlier mode whole); a mapping or null as it is."""
    if isinstance(value, bool):
        return asdict(ActivationCheckpointing("full" if value else "off"))
    # MODE or MODE:ARG; the schema converts ARG or names it, validate names a bad MODE
    if isinstance(value, str):
        mode, _, arg = value.partition(":")
        key = AC_ARGS[mode][0] if mode in AC_ARGS else None
        if arg and key is None:
            mode = value
        return {
            **asdict(ActivationCheckpointing(mode)),
            **({key: arg.split(",") if key == "modules" else arg} if arg and key else {}),
        }
    if isinstance(value, dict) and value.get("mode") is False:  # YAML reads `off` as false
        return {**value, "mode": "off"}
    return value


@dataclass
class TrainSpec:
    # init seed and the seed of every RNG
    seed: int = ranged(6198, "[0, 2^32)", "(numpy's seed range)")
    # sequences per optimizer step, all ranks together (x sequence_length at most 2^32 tokens)
    global_batch_size: int = ranged(MISSING, ">= 1")
    # sequences per forward/backward on one rank (null: train.hardware's)
    micro_batch_size: Optional[int] = ranged(None, ">= 1")
    max_tokens: Optional[int] = ranged(None, ">= 1")  # training length in tokens ...
    max_steps: Optional[int] = ranged(None, ">= 1")  # ... or in steps
    lr: float = ranged(4e-4, "> 0")  # peak learning rate
    betas: List[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = ranged(1e-8, "> 0")
    weight_decay: float = ranged(0.1, ">= 0")  # AdamW's decoupled weight decay ...
    decay_embeddings: bool = False  # ... on the embedding (tied: also the LM head) (OLMo-2: off)
    decay_norms: bool = True  # ... on 1-D tensors: every norm gain, QK norms included (OLMo-2: on)
    # linear warmup in steps (past the end of training: a one-line warning) ...
    warmup_steps: Optional[int] = ranged(None, ">= 0")
    warmup_tokens: Optional[int] = ranged(None, ">= 0")  # ... or in tokens
    # cosine horizon if not the training length (OLMo-2: 5e12)
    schedule_tokens: Optional[int] = ranged(None, ">= 1")
    # lr at the end of the cosine, as a fraction of the peak
    final_lr_ratio: float = ranged(0.1, "[0, 1]")
    # cosine (warmup, then cosine to final_lr_ratio) | power (lm-engine's, train.power)
    schedule: LRSchedule = LRSchedule.cosine
    power: PowerSpec = field(default_factory=PowerSpec)  # schedule=power: a, b, c
    # update n runs at the schedule's step n - lag (Megatron: 1, the first update at lr 0)
    schedule_lag: int = ranged(0, ">= 0")
    z_loss: Optional[float] = ranged(1e-5, ">= 0", "(null: off)")  # z-loss multiplier
    # clip the gradient norm to this (null: no clipping)
    max_grad_norm: Optional[float] = ranged(1.0, "> 0", "(null: no clipping)")
    optimizer: Optimizer = Optimizer.adamw  # adamw | skip_step_adamw
    precision: Precision = Precision.bf16  # bf16 (params bf16, reductions fp32) | fp32
    compile: Optional[bool] = None  # torch.compile each block (null: train.hardware's)
    # torchao float8 matmuls: off | tensorwise | rowwise | rowwise_with_gw_hp (nn/float8.py)
    float8: Float8 = Float8.off
    activation_checkpointing: Optional[ActivationCheckpointing] = (
        None  # bool | MODE[:ARG] | {mode: ...} (null: train.hardware's)
    )
    # preset for the null keys above: auto | none | rtx6000ada | h100 | h200 | b200
    hardware: Hardware = Hardware.auto
    # fsdp | hsdp | ddp across ranks (FSDP2 wraps each block)
    data_parallel: DataParallel = DataParallel.fsdp
    device: Device = Device.auto  # auto (cuda when available) | cpu | cuda
    # a new run's weights: a run checkpoint (or run folder), or a Hugging Face OLMo-2 folder
    init_from: Optional[str] = None

    def validate(self, fail) -> None:
        """The length, the warmup, the power schedule's keys, the betas, activation
        checkpointing."""
        if (self.max_tokens is None) == (self.max_steps is None):
            cli = self.max_tokens is not None and fail.where("train.max_tokens") == "command line"
            key = "train.max_tokens" if cli else "train.max_steps"
            value = self.max_tokens if cli else self.max_steps
            fail(key, value, "give exactly one of train.max_tokens and train.max_steps")
        if self.warmup_steps is not None and self.warmup_tokens is not None:
            fail(
                "train.warmup_tokens",
                self.warmup_tokens,
                "give warmup_steps or warmup_tokens, not both",
            )
        if self.schedule == "power":
            for key in ("a", "c"):
                if (value := getattr(self.power, key)) is None or value <= 0:
                    fail(f"train.power.{key}", value, "schedule=power needs a value > 0")
            if self.warmup_tokens is not None or self.schedule_tokens is not None:
                key = "warmup_tokens" if self.warmup_tokens is not None else "schedule_tokens"
                fail(
                    f"train.{key}",
                    getattr(self, key),
                    "schedule=power counts steps: give train.warmup_steps, no token horizon",
                )
        if len(self.betas) != 2:
            fail("train.betas", list(self.betas), "give two betas [beta1, beta2]")
        if not all(0 <= beta < 1 for beta in self.betas):
            fail("train.betas", list(self.betas), "each beta must be in [0, 1)")
        if self.activation_checkpointing is not None:
            self.activation_checkpointing.validate(fail)


@dataclass
class EvalSpec:
    interval: int = ranged(1000, ">= 1")  # in-loop validation every N steps (and at the end)
    # cap the validation batches (None: the whole set)
    max_batches: Optional[int] = ranged(None, ">= 1", "(null: the whole set)")
    # v3-small-ppl-validation names (olmo_patches.evals)
    validation_sets: List[str] = field(default_factory=list)
    validation_base_dir: Optional[str] = (
        None  # root of eval-data/perplexity/... (default: data.mix_base_dir)
    )
    # olmo_eval task labels, e.g. arc_easy
    downstream_tasks: List[str] = field(default_factory=list)
    # downstream evals every N steps (default: interval)
    downstream_interval: Optional[int] = ranged(None, ">= 1")
    # tasks' context; longer ones cut from the left (null: data.sequence_length)
    downstream_sequence_length: Optional[int] = ranged(
        None, ">= 2", "(a context token and an answer token)"
    )

    def validate(self, fail) -> None:
        """The validation sets' names (also the evaluate command's, on its flags)."""
        from ..eval.names import VALIDATION_SETS

        if unknown := [n for n in self.validation_sets if n not in VALIDATION_SETS]:
            fail(
                "eval.validation_sets",
                unknown,
                f"unknown; choose from {', '.join(VALIDATION_SETS)}",
            )


@dataclass
class RunSpec:
    name: str = MISSING
    save_folder: Optional[str] = None  # default runs/<name>
    save_interval: int = ranged(1000, ">= 1")  # permanent checkpoints every N steps
    # checkpoints replaced by the next one
    ephemeral_save_interval: Optional[int] = 250
    # how many ephemeral checkpoints are kept (the newest ones)
    ephemeral_keep: int = ranged(1, ">= 1")
    log_interval: int = ranged(10, ">= 1")  # collect and print metrics every N steps
    # stop early (with a checkpoint), schedule unchanged; rerun resumes (past end: refused)
    stop_at_step: Optional[int] = ranged(None, ">= 1")
    wandb_project: Optional[str] = None  # log to wandb when set and wandb is installed
    trace_batches: bool = (
        False  # record each step's instance indices in SAVE/batches/ (batch_trace.py)
    )

    def validate(self, fail) -> None:
        """The ephemeral saves between the permanent ones, a name that is one folder."""
        e = self.ephemeral_save_interval
        if e is not None and not 1 <= e < self.save_interval:
            fail(
                "run.ephemeral_save_interval",
                e,
                f"must be >= 1 and < run.save_interval={self.save_interval} (null: none)",
            )
        if not self.name or "/" in self.name:
            fail("run.name", self.name, "must be a non-empty name without '/'")


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

    @property
    def steps(self) -> Optional[int]:
        """Optimizer steps: train.max_steps, or train.max_tokens in whole steps (OLMo-core stops at
        the ceiling)."""
        t = self.train
        if t.max_steps is not None:
            return t.max_steps
        if t.max_tokens is not None and t.global_batch_size >= 1:
            return -(-t.max_tokens // (t.global_batch_size * self.data.sequence_length))
        return None

    def validate(self, where=lambda key: "config") -> None:
        """Every check that the types cannot express (the model's keys: blocks/checks.py), a
        failure one ConfigError line naming where ``key`` was set (``where(key)``: a file or
        "command line"): every value's domain, then each section's checks, then those that read
        two sections."""
        fail = failer(where)
        check_fields(self, fail)
        check_depth(self, fail)  # before the model's checks build a list of n_layers widths
        check_model(self.model, fail)
        for section in (self.data, self.train, self.eval, self.run):
            section.validate(fail)
        self._check_across(fail)
        check_size(self, fail, vocab_size(self))
        self._check_attention_and_checkpointing(fail)

    def _check_across(self, fail) -> None:
        """Tokens per step, float8 with an MoE, stop_at_step against the step count, the
        vocabulary against the tokenizer's, every matrix's size (in Python integers)."""
        m, t, d = self.model, self.train, self.data
        if t.global_batch_size * d.sequence_length > _MAX_STEP_TOKENS:
            fail(
                "train.global_batch_size",
                t.global_batch_size,
                f"{t.global_batch_size * d.sequence_length:.3g} tokens per step (x "
                f"data.sequence_length={d.sequence_length}) is over 2^32",
            )
        if t.float8 != "off" and block_of(m).routed_experts(m):
            fail(
                "train.float8",
                t.float8,
                "float8 MoE experts are not supported (torchao converts nn.Linear, not "
                "OLMo-core's grouped experts)",
            )
        stop, steps = self.run.stop_at_step, self.steps
        if stop is not None and steps is not None and stop > steps:
            fail(
                "run.stop_at_step",
                stop,
                f"past the end of training ({steps} steps); drop it to train to the end",
            )
        if m.vocab_size is not None and m.vocab_size < (own := tokenizer_vocab(self)):
            fail(
                "model.vocab_size",
                m.vocab_size,
                f"smaller than the {d.tokenizer} tokenizer's {own} tokens",
            )
        hidden_key = "model.d_ff" if m.d_ff is not None else "model.ffn_ratio"
        vocab_key = "model.vocab_size" if m.vocab_size is not None else "data.demo_vocab_size"
        for key, rows, cols in (
            ("model.d_model", m.d_model, m.d_model),
            (hidden_key, m.d_model, m.resolved_d_ff),
            (vocab_key, vocab_size(self), m.d_model),
        ):
            if rows * cols > MAX_MATRIX:
                fail(
                    key, _value(self, key), f"a {rows} x {cols} weight matrix is over 2^40 elements"
                )

    def _check_attention_and_checkpointing(self, fail) -> None:
        """Flash attention's precision; activation checkpointing against the model: no whole MoE
        blocks, and module globs that match modules of the model (built on the meta device), none
        of them an MoE."""
        m, ac, key = (
            self.model,
            self.train.activation_checkpointing,
            "train.activation_checkpointing",
        )
        if m.attention_backend.startswith("flash_") and self.train.precision == "fp32":
            fail(
                "model.attention_backend",
                m.attention_backend,
                "flash attention needs train.precision=bf16",
            )
        if ac is None:
            return
        if block_of(m).routed_experts(m) and ac.mode in ("full", "selected_blocks"):
            fail(
                key,
                ac,
                "OLMo-core cannot checkpoint MoE blocks whole; use "
                "selected_modules:blocks.*.attention, false or null",
            )
        if ac.mode == "selected_modules":
            from olmo_core.nn.moe import MoEBase

            names = dict(self.model_config().build(init_device="meta").named_modules())
            for glob in ac.modules:  # type: ignore[union-attr]
                matched = [n for n in names if fnmatch(n, glob)]
                if not matched:
                    fail(
                        f"{key}.modules",
                        glob,
                        "matches no module of the model (e.g. blocks.*.attention, "
                        "blocks.*.feed_forward)",
                    )
                if any(isinstance(names[n], MoEBase) for n in matched):
                    fail(
                        f"{key}.modules",
                        glob,
                        "matches an MoE module, which OLMo-core cannot checkpoint; use "
                        "blocks.*.attention",
                    )

    def model_config(self) -> "TransformerConfig":
        """OLMo-core's ``TransformerConfig`` of this run's model, at its vocabulary."""
        return self.model.build(vocab_size(self))


def _value(spec: ExperimentSpec, key: str) -> Any:
    section, name = key.split(".")
    return getattr(getattr(spec, section), name)


# ---- the size check ------------------------------------------------------------------------------
# A run is refused at load when even the largest world size it allows cannot hold it on the largest
# card. That world size is W = train.global_batch_size ranks (one sequence each, FSDP over all of
# them), and each rank holds at least 16 P / W bytes of parameter states (fp32 weights, gradients,
# AdamW moments: launch/memory.py's states) plus 2 s sum_l w_l bytes, the bf16 input of each block
# for its sequence of s tokens, which full activation checkpointing still keeps (a sequence is not
# split across ranks). P counts the embedding (and the LM head unless tied) and each layer's floor
# as its kind states it (BlockKind.layer_params_floor: attention and FFN matrices,
# shapes/counts.py; none stated: no parameter); a layer whose width is solved later counts width 1
# (variable width). Lower bounds all: only a run that cannot fit anywhere is refused, every shipped
# config passes (tests/test_data_contract.py).

LARGEST_CARD = 180 * 2**30  # bytes: the largest card of launch/cards.py (b200)
_STATE_BYTES = 16  # fp32 weights, gradients, AdamW's two moments, per parameter (launch/memory.py)
_KEPT_BYTES = 2  # a checkpointed block's bf16 input, per token and unit of width (launch/memory.py)


def _gib(n: float) -> str:
    return f"{n / 2**30:,.0f} GiB"


def _size_key(fail, keys) -> str:
    """The size check names the first of ``keys`` set on the command line, else the first."""
    return next((k for k in keys if fail.where(k) == "command line"), keys[0])


def check_depth(spec: ExperimentSpec, fail) -> None:
    """The size check on the layers' kept inputs alone, before the model's checks build a list of
    n_layers widths (OLMo-core a list of n_layers blocks): 2 s L w bytes for one sequence."""
    m, s = spec.model, spec.data.sequence_length
    if min(m.n_layers, m.d_model, s) < 1 or (kind := BLOCKS.get(m.block)) is None:
        return  # the sections' (the model's) checks name it
    w = m.d_model if kind.constant_width else 1  # a layer at least 1 wide
    kept = _KEPT_BYTES * s * m.n_layers * w
    if kept > LARGEST_CARD:
        key = _size_key(fail, ("model.n_layers", "data.sequence_length", "model.d_model"))
        fail(
            key,
            _value(spec, key),
            f"{m.n_layers:,} layers keep {_gib(kept)} for one sequence of {s} tokens even fully "
            f"checkpointed ({_KEPT_BYTES} bytes x {w} wide a token a layer), over the largest "
            f"card's {_gib(LARGEST_CARD)}",
        )


def counted_params(m: ModelSpec, vocab: int) -> int:
    """The parameters the size check counts for a model ``m`` of ``vocab`` ids: the embedding, an
    untied LM head, each layer's floor of attention and FFN matrices (its kind's
    ``layer_params_floor``; no norms)."""
    embeddings = vocab * m.d_model * (1 if m.tie_embeddings else 2)
    return embeddings + m.n_layers * block_of(m).layer_params_floor(m)


def check_size(spec: ExperimentSpec, fail, vocab: int) -> None:
    """The size check (the rule above), the model's parameters counted: one line naming them and the
    bytes a rank needs."""
    m, s, g = spec.model, spec.data.sequence_length, spec.train.global_batch_size
    params = counted_params(m, vocab)
    states = _STATE_BYTES * params / g
    kept = _KEPT_BYTES * s * m.n_layers * (m.d_model if block_of(m).constant_width else 1)
    if states + kept > LARGEST_CARD:
        key = _size_key(
            fail,
            ("model.n_layers", "model.d_model", "model.vocab_size", "train.global_batch_size")
            + ("data.sequence_length",),
        )
        fail(
            key,
            _value(spec, key),
            f"{params:,} parameters need {_gib(states + kept)} a GPU even on {g} GPUs (one "
            f"sequence each, {_STATE_BYTES} bytes a parameter sharded, inputs checkpointed), over "
            f"the largest card's {_gib(LARGEST_CARD)}",
        )


def tokenizer_config(spec: ExperimentSpec) -> "TokenizerConfig":
    """The tokenizer's size and special ids without building data: dolma2's, or the demo's (its two
    special tokens are trained first: eos 0, pad 1)."""
    from olmo_core.data import TokenizerConfig

    if spec.data.tokenizer == "dolma2":
        return TokenizerConfig.dolma2()
    return TokenizerConfig(vocab_size=spec.data.demo_vocab_size, eos_token_id=0, pad_token_id=1)


# OLMo-core's TokenizerConfig.dolma2().vocab_size (known here: a config loads without torch)
DOLMA2_VOCAB = 100278
PAD_MULTIPLE = 128  # OLMo-core's padded_vocab_size pads the embedding to a multiple of 128


def tokenizer_vocab(spec: ExperimentSpec) -> int:
    """The tokenizer's own vocabulary: dolma2's, or the demo's."""
    return DOLMA2_VOCAB if spec.data.tokenizer == "dolma2" else spec.data.demo_vocab_size


def padded_vocab(n: int) -> int:
    """A tokenizer's ``n`` tokens padded as OLMo-core pads the embedding (``padded_vocab_size``)."""
    return PAD_MULTIPLE * math.ceil(n / PAD_MULTIPLE)


def vocab_size(spec: ExperimentSpec) -> int:
    """The model's vocabulary without building data: explicit, else the tokenizer's, padded."""
    return spec.model.vocab_size or padded_vocab(tokenizer_vocab(spec))
