"""The experiment spec: typed dataclasses for every key a config file may set (the model's are
olmo_patches/blocks/: the keys every kind shares, and each kind's own).

A config file states its intent in short keys (``model.block: hourglass``, ``model.K: 4``); each
field's comment is its documentation.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from omegaconf import MISSING

from ..blocks.base import ConfigError, ModelSpec
from ..blocks.checks import check_model
from ..shapes.choices import StrEnum
from .validate import (
    check_across,
    check_data,
    check_depth,
    check_eval,
    check_every_value,
    check_run,
    check_train,
)

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


@dataclass
class MixSource:
    """One source of data.mixture: its token files and its share of the training tokens."""

    ratio: float = (
        MISSING  # share of the training tokens (the sources' ratios are divided by their sum)
    )
    paths: List[str] = field(default_factory=list)  # token files or globs ...
    manifest: Optional[str] = None  # ... or an hourglass-tokenize folder (its manifest.json)
    max_repetition: float = 1.0  # most passes over the source's tokens (1: none repeated)


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
    sequence_length: int = 4096  # tokens per instance, in [2, 2^20]
    order_seed: int = 6198  # data order seed as the old OLMo trainer counts it (epoch 0)
    work_dir: str = ".cache/olmo-data"  # OLMo-core's dataset cache
    demo_vocab_size: int = 4096  # BPE vocabulary trained on the demo corpus
    # null: the checkout's .cache/demo-corpus, else the user's cache folder (default_demo_cache)
    demo_cache: Optional[str] = None
    num_workers: Optional[int] = (
        None  # loader processes per rank (null: 0 on CPU, CUDA_WORKERS on CUDA); order unchanged
    )
    prefetch_factor: Optional[int] = None  # batches each worker reads ahead (null: torch's 2)

    def validate(self, fail) -> None:
        """Every check that reads only the data section: config/validate.py."""
        check_data(self, fail)


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


@dataclass
class ActivationCheckpointing:
    """OLMo-core's activation checkpointing (recompute in backward:
    TransformerActivationCheckpointingConfig), in its names."""

    mode: str = "full"  # off | full (every block) | selected_blocks | selected_modules | budget
    block_interval: Optional[int] = (
        None  # selected_blocks: blocks 0, n, 2n, ... are recomputed in backward
    )
    modules: Optional[List[str]] = (
        None  # selected_modules: module-name globs, e.g. blocks.*.feed_forward
    )
    budget: Optional[float] = (
        None  # budget: activation memory kept, 0 (recompute all) .. 1 (none); needs train.compile
    )

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
        key = {
            "selected_blocks": "block_interval",
            "selected_modules": "modules",
            "budget": "budget",
        }.get(mode)
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
    seed: int = 6198  # init seed and the seed of every RNG, in [0, 2^32)
    # sequences per optimizer step, all ranks together (x sequence_length at most 2^32 tokens)
    global_batch_size: int = MISSING
    micro_batch_size: Optional[int] = (
        None  # sequences per forward/backward on one rank (null: train.hardware's)
    )
    max_tokens: Optional[int] = None  # training length in tokens ...
    max_steps: Optional[int] = None  # ... or in steps
    lr: float = 4e-4  # peak learning rate
    betas: List[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    weight_decay: float = 0.1  # AdamW's decoupled weight decay ...
    decay_embeddings: bool = False  # ... on the embedding (tied: also the LM head) (OLMo-2: off)
    decay_norms: bool = True  # ... on 1-D tensors: every norm gain, QK norms included (OLMo-2: on)
    warmup_steps: Optional[int] = (
        None  # linear warmup in steps (past the end of training: a one-line warning) ...
    )
    warmup_tokens: Optional[int] = None  # ... or in tokens
    schedule_tokens: Optional[int] = (
        None  # cosine horizon if not the training length (OLMo-2: 5e12)
    )
    final_lr_ratio: float = 0.1  # lr at the end of the cosine, as a fraction of the peak
    # cosine (warmup, then cosine to final_lr_ratio) | power (lm-engine's, train.power)
    schedule: LRSchedule = LRSchedule.cosine
    power: PowerSpec = field(default_factory=PowerSpec)  # schedule=power: a, b, c
    schedule_lag: int = (
        0  # update n runs at the schedule's step n - lag (Megatron: 1, the first update at lr 0)
    )
    z_loss: Optional[float] = 1e-5  # z-loss multiplier (None: off)
    max_grad_norm: Optional[float] = 1.0  # clip the gradient norm to this (null: no clipping)
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
        """Every check that reads only the train section (train.power,
        train.activation_checkpointing too)."""
        check_train(self, fail)


@dataclass
class EvalSpec:
    interval: int = 1000  # in-loop validation every N steps (and at the end)
    max_batches: Optional[int] = None  # cap the validation batches (None: the whole set)
    # v3-small-ppl-validation names (olmo_patches.evals)
    validation_sets: List[str] = field(default_factory=list)
    validation_base_dir: Optional[str] = (
        None  # root of eval-data/perplexity/... (default: data.mix_base_dir)
    )
    # olmo_eval task labels, e.g. arc_easy
    downstream_tasks: List[str] = field(default_factory=list)
    downstream_interval: Optional[int] = None  # downstream evals every N steps (default: interval)
    downstream_sequence_length: Optional[int] = (
        None  # tasks' context; longer ones cut from the left (null: data.sequence_length)
    )

    def validate(self, fail) -> None:
        """Every check that reads only the eval section (also the evaluate command's, on its
        flags)."""
        check_eval(self, fail)


@dataclass
class RunSpec:
    name: str = MISSING
    save_folder: Optional[str] = None  # default runs/<name>
    save_interval: int = 1000  # permanent checkpoints every N steps
    ephemeral_save_interval: Optional[int] = 250  # checkpoints replaced by the next one
    ephemeral_keep: int = 1  # how many ephemeral checkpoints are kept (the newest ones)
    log_interval: int = 10  # collect and print metrics every N steps
    # stop early (with a checkpoint), schedule unchanged; rerun resumes (past end: refused)
    stop_at_step: Optional[int] = None
    wandb_project: Optional[str] = None  # log to wandb when set and wandb is installed
    trace_batches: bool = (
        False  # record each step's instance indices in SAVE/batches/ (batch_trace.py)
    )

    def validate(self, fail) -> None:
        """Every check that reads only the run section."""
        check_run(self, fail)


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
        """Every check that the types cannot express (config/validate.py; the model's keys:
        blocks/checks.py), a failure one ConfigError line naming where ``key`` was set
        (``where(key)``: a file or "command line"): every value's domain, then each section's
        checks, then those that read two sections."""
        fail = failer(where)
        check_every_value(self, fail)
        check_depth(self, fail)  # before the model's checks build a list of n_layers widths
        check_model(self.model, fail)
        for section in (self.data, self.train, self.eval, self.run):
            section.validate(fail)
        check_across(self, fail, tokenizer_vocab(self), vocab_size(self))

    def model_config(self) -> "TransformerConfig":
        """OLMo-core's ``TransformerConfig`` of this run's model, at its vocabulary."""
        return self.model.build(vocab_size(self))


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
