"""Translate an :class:`ExperimentSpec` into OLMo-core's configs: model, dataset, data loader, train
module (its data parallelism, precision, float8 and compile) and Trainer with its callbacks.

Everything built from them is OLMo-core's own machinery (its Trainer, train module, numpy datasets,
data loader, checkpointer and evaluators); run.py builds and runs them.

bf16 (``train.precision``): FSDP2 and HSDP keep fp32 parameters (the master weights AdamW updates
and checkpoints hold), all-gather bf16 compute copies of them and reduce-scatter the gradients in
fp32. One process and DDP run under bf16 autocast instead: DDP would cast the parameters themselves
(and AdamW's state) to bf16. gloo all-gathers, reduce-scatters and all-reduces bf16 (torch 2.13), so
CPU runs take the GPU's path.

float8 (``train.float8``): torchao's float8 matmuls through OLMo-core's Float8Config, which its
``parallelize_model`` applies before compile, activation checkpointing and FSDP; emulated where the
device has no float8 matmuls (CPU, pre-SM89), with one info line.

compile (``train.compile``): OLMo-core's per-block ``apply_compile`` (inductor), which its
``parallelize_model`` applies after float8 and activation checkpointing and before FSDP/DDP, but
only where CUDA is available (olmo_core/train/train_module/transformer/common.py line 113: "Skipping
model compilation"). On CPU :func:`compile_on_cpu` applies it at that same point.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Dict, Optional

import torch
from olmo_core.config import Config, DType
from olmo_core.data import (
    InstanceFilterConfig,
    NumpyDataLoaderConfig,
    NumpyFSLDatasetConfig,
    TokenizerConfig,
)
from olmo_core.data.source_mixture import (
    SourceMixtureConfig,
    SourceMixtureDatasetConfig,
    SourceMixtureList,
)
from olmo_core.exceptions import OLMoConfigurationError
from olmo_core.distributed.parallel import DataParallelType
from olmo_core.nn.transformer import Transformer, TransformerConfig
from olmo_core.train import Duration, TrainerConfig
from olmo_core.train.callbacks import CallbackConfig, ConfigSaverCallback, SpeedMonitorCallback
from olmo_core.train.train_module import TransformerDataParallelConfig, TransformerTrainModuleConfig

from ..config import ConfigError, ExperimentSpec
from ..data.order import olmo_core_seed
from ..eval.evaluators import (
    check_downstream_fit,
    downstream_evaluator,
    lm_evaluator,
    validation_files,
)
from ..launch.cards import known_card
from ..launch.layout import attention_backend, data_workers
from ..nn.attention import set_attention_backend, use_sdpa_kernel
from ..nn.float8 import ShapeFloat8Config, has_float8_matmuls
from ..nn.lm_loss import lm_loss, set_lm_loss
from .batch_trace import BatchTraceCallback
from .optimizer import lagged, optimizer, scheduler
from .callbacks.checkpointer import ResumeCheckpointerCallback
from .callbacks.console import ProgressCallback
from .callbacks.metrics_file import MetricsFileCallback
from .callbacks.nonfinite import NonFiniteGuardCallback
from .callbacks.stop import StopOnSignalCallback
from .callbacks.wandb import wandb_callback
from .sources import DataSources, resolve_data

log = logging.getLogger(__name__)


def device_for(spec: ExperimentSpec) -> str:
    if spec.train.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return spec.train.device


def downstream_length(spec: ExperimentSpec) -> int:
    """The downstream tasks' context length: their own key, else the training length."""
    return spec.eval.downstream_sequence_length or spec.data.sequence_length


@dataclass
class OrderedDataLoaderConfig(NumpyDataLoaderConfig):
    """OLMo-core's data loader config plus the switch it lacks, the loader's ``shuffle``
    (olmo_core/data/data_loader.py line 1107: no such field): a materialized prefix is already in
    training order and must be read without reshuffling."""

    shuffle: bool = True

    def build(self, dataset, **kwargs):  # type: ignore[override]
        loader = super().build(dataset, **kwargs)
        loader.shuffle = self.shuffle  # read by the loader when it builds its global indices
        return loader


@dataclass
class Experiment(Config):
    """OLMo-core's configs for one run, as the Trainer consumes them."""

    model: TransformerConfig
    dataset: NumpyFSLDatasetConfig
    data_loader: OrderedDataLoaderConfig
    train_module: TransformerTrainModuleConfig
    trainer: TrainerConfig


def _dataset_kwargs(spec: ExperimentSpec, data: DataSources) -> dict:
    """OLMo-core numpy dataset arguments shared by training and validation."""
    kwargs: dict = dict(
        sequence_length=spec.data.sequence_length,
        tokenizer=data.tokenizer,
        work_dir=spec.data.work_dir,
    )
    if data.dtype is not None:
        kwargs["dtype"] = data.dtype
    return kwargs


def _eval_tokenizer(spec: ExperimentSpec, data: DataSources) -> TokenizerConfig:
    """The run's tokenizer, identified by the local file when data.tokenizer_file is set."""
    return (
        replace(data.tokenizer, identifier=spec.data.tokenizer_file)
        if spec.data.tokenizer_file
        else data.tokenizer
    )


def check_downstream(spec: ExperimentSpec) -> None:
    """ConfigError for a downstream task that cannot fit eval.downstream_sequence_length, before a
    run writes anything."""
    if spec.eval.downstream_tasks:
        try:
            check_downstream_fit(
                list(spec.eval.downstream_tasks),
                _eval_tokenizer(spec, resolve_data(spec)),
                downstream_length(spec),
            )
        except OLMoConfigurationError as e:
            raise ConfigError(" ".join(str(e).split())) from None


def eval_callbacks(spec: ExperimentSpec, data: DataSources) -> Dict[str, CallbackConfig]:
    """The run's evaluators as OLMo-core callback configs: validation loss, downstream tasks."""
    e, out = spec.eval, {}
    if data.val_paths:  # the corpus's own validation split, evaluated from initialisation on
        lm_eval = lm_evaluator(
            data.val_paths,
            ["val"] * len(data.val_paths),
            e.interval,
            e.max_batches,
            _dataset_kwargs(spec, data),
            True,
        )
    else:  # v3-small-ppl-validation
        paths, labels = validation_files(
            list(e.validation_sets), e.validation_base_dir or spec.data.mix_base_dir
        )
        lm_eval = lm_evaluator(
            paths, labels, e.interval, e.max_batches, _dataset_kwargs(spec, data)
        )
    if lm_eval is not None:
        out["lm_evaluator"] = lm_eval
    downstream = downstream_evaluator(
        list(e.downstream_tasks),
        _eval_tokenizer(spec, data),
        e.downstream_interval or e.interval,
        downstream_length(spec),
    )
    if downstream is not None:
        out["downstream_evaluator"] = downstream
    return out


def mixture_config(spec: ExperimentSpec, data: DataSources) -> SourceMixtureDatasetConfig:
    """data.mixture as OLMo-core's source mixture: each source's share of the run's tokens, drawn
    with data.order_seed (the loader then shuffles the instances with the run's data order seed)."""
    seq = spec.data.sequence_length
    sources = [
        SourceMixtureConfig(
            s.name, target_ratio=s.ratio, paths=s.paths, max_repetition_ratio=s.max_repetition
        )
        for s in data.mixture
    ]
    return SourceMixtureDatasetConfig(
        source_list=SourceMixtureList(sources=sources),
        requested_tokens=(spec.steps or 0) * spec.train.global_batch_size * seq,
        global_batch_size=spec.train.global_batch_size * seq,  # OLMo-core counts tokens
        seed=olmo_core_seed(spec.data.order_seed),
        render_tables=False,  # the dry run prints the mixture's table (report/plan.py)
        quiet=True,
    )


def _model(
    spec: ExperimentSpec, data: DataSources, device: str, world_size: int
) -> TransformerConfig:
    """The model's config at the tokenizer's padded vocabulary, with the run's seed, attention
    backend and LM loss (each choice logged)."""
    t = spec.train
    model = spec.model.build(vocab_size=data.tokenizer.padded_vocab_size())
    model.init_seed = t.seed
    backend = attention_backend(spec, device)
    set_attention_backend(model, backend.name)
    use_sdpa_kernel(backend.sdpa)
    log.info(f"model.attention_backend={spec.model.attention_backend} -> {backend}")
    loss = lm_loss(spec, device)
    set_lm_loss(model, loss.name)
    log.info(f"LM loss: {loss}")
    log.info(
        f"train.precision={t.precision} -> {precision_of(spec, world_size)}; "
        f"train.compile={t.compile} -> {describe_compile(spec, world_size)}"
    )
    return model


def _data(
    spec: ExperimentSpec, data: DataSources, device: str
) -> tuple[NumpyFSLDatasetConfig, OrderedDataLoaderConfig]:
    """The training set (a mixture, an OLMo-core DataMix or token files) and its loader."""
    t, d = spec.train, spec.data
    # OLMo-2 Stage 1's repetition filter: the loss is masked on instances with a token n-gram
    # (period 1..13) repeated 32 times or more. It masks, so the order is unchanged.
    instance_filter = InstanceFilterConfig(
        repetition_max_period=13, repetition_min_period=1, repetition_max_count=32
    )
    train_kwargs = dict(
        _dataset_kwargs(spec, data),
        instance_filter_config=instance_filter if d.instance_filter else None,
    )
    if data.mixture:
        dataset = NumpyFSLDatasetConfig.from_src_mix(mixture_config(spec, data), **train_kwargs)
    elif d.mix and not data.train_paths:
        dataset = NumpyFSLDatasetConfig(mix=d.mix, mix_base_dir=d.mix_base_dir, **train_kwargs)
    else:
        dataset = NumpyFSLDatasetConfig(paths=data.train_paths, **train_kwargs)
    data_loader = OrderedDataLoaderConfig(
        global_batch_size=t.global_batch_size * d.sequence_length,  # OLMo-core counts tokens
        seed=olmo_core_seed(d.order_seed),  # data.order_seed counts as the old OLMo trainer did
        # Workers read whole batches round-robin (OLMo-core), so the order is the same for any
        # count.
        num_workers=(workers := data_workers(spec, device)),
        prefetch_factor=d.prefetch_factor if workers else None,
        shuffle=d.source != "prefix",
    )
    return dataset, data_loader


def _trainer(spec: ExperimentSpec, data: DataSources, device: str) -> TrainerConfig:
    """OLMo-core's trainer with the run's callbacks: verified checkpoints, the non-finite guard,
    stop signals, the recorded config, the metrics file, progress, evals, wandb."""
    t = spec.train
    duration = (
        Duration.tokens(t.max_tokens) if t.max_tokens is not None else Duration.steps(t.max_steps)
    )  # type: ignore[arg-type]
    trainer = TrainerConfig(
        save_folder=spec.save_folder,
        device=device,
        max_duration=duration,
        metrics_collect_interval=spec.run.log_interval,
        cancel_check_interval=1,  # SIGTERM (preemption) stops the run at the next step
        save_overwrite=False,  # cut-off saves are pruned before a run starts (checkpoints.py)
        hard_stop=Duration.steps(spec.run.stop_at_step) if spec.run.stop_at_step else None,
    )
    trainer = trainer.with_callback(
        "checkpointer",
        ResumeCheckpointerCallback(
            save_interval=spec.run.save_interval,
            ephemeral_save_interval=spec.run.ephemeral_save_interval,
            # Async saves deadlock 2 gloo processes at the first mid-run save (checked here,
            # OLMo-core 3.0.0); CPU runs save synchronously, GPU runs keep OLMo-core's default.
            save_async=False if device == "cpu" else None,
            ephemeral_keep=spec.run.ephemeral_keep,
        ),
    )
    trainer = trainer.with_callback("nonfinite_guard", NonFiniteGuardCallback())
    trainer = trainer.with_callback("stop_on_signal", StopOnSignalCallback())
    trainer = trainer.with_callback("config_saver", ConfigSaverCallback())
    trainer = trainer.with_callback("metrics_file", MetricsFileCallback())
    trainer = trainer.with_callback(
        "console", ProgressCallback(metrics_log_interval=spec.run.log_interval)
    )
    if (
        device == "cuda"
        and t.precision == "bf16"
        and (card := known_card(torch.cuda.get_device_name()))
        and card.bf16_flops
    ):
        # The peak of launch/cards.py: OLMo-core's own table lacks some (H200, RTX 6000 Ada: it
        # takes an A100's, olmo_core/train/callbacks/speed_monitor.py line 49; MFU x3.2 on an H200).
        trainer = trainer.with_callback(
            "speed_monitor", SpeedMonitorCallback(device_peak_flops_per_second=int(card.bf16_flops))
        )
    if spec.run.trace_batches:
        trainer = trainer.with_callback("batch_trace", BatchTraceCallback())
    for name, callback in eval_callbacks(spec, data).items():
        trainer = trainer.with_callback(name, callback)
    if (wandb := wandb_callback(spec.run.wandb_project, spec.run.name)) is not None:
        trainer = trainer.with_callback("wandb", wandb)
    return trainer


def build_experiment(spec: ExperimentSpec, data: DataSources, *, world_size: int = 1) -> Experiment:
    t, seq = spec.train, spec.data.sequence_length
    device = device_for(spec)
    assert t.micro_batch_size is not None, (
        "resolve the spec first (launch.layout.resolve fills the micro-batch)"
    )
    model = _model(spec, data, device, world_size)
    dataset, data_loader = _data(spec, data, device)
    train_module = TransformerTrainModuleConfig(
        rank_microbatch_size=t.micro_batch_size * seq,
        max_sequence_length=seq,
        optim=optimizer(spec, model, device),
        scheduler=lagged(scheduler(spec), spec),
        max_grad_norm=t.max_grad_norm,
        z_loss_multiplier=t.z_loss,
        compile_model=olmo_core_compiles(spec, device),
        float8_config=float8_config(spec, device, world_size),
        dp_config=data_parallel(spec, world_size),
        ac_config=t.activation_checkpointing.build()
        if t.activation_checkpointing is not None
        else None,
        autocast_precision=autocast(spec, world_size),
    )
    return Experiment(model, dataset, data_loader, train_module, _trainer(spec, data, device))


# ---- precision, float8 and compile ---------------------------------------------------------------


def _fsdp(spec: ExperimentSpec, world_size: int) -> bool:
    """FSDP2 or HSDP (not DDP, not one process)."""
    return world_size > 1 and spec.train.data_parallel != "ddp"


def data_parallel(spec: ExperimentSpec, world_size: int) -> Optional[TransformerDataParallelConfig]:
    """FSDP2 (one unit per block), HSDP or DDP across ranks; none for one process."""
    if world_size == 1:
        return None
    bf16 = spec.train.precision == "bf16" and _fsdp(spec, world_size)
    return TransformerDataParallelConfig(
        name=DataParallelType(spec.train.data_parallel),
        param_dtype=DType.bfloat16 if bf16 else None,
        reduce_dtype=DType.float32,
    )


def autocast(spec: ExperimentSpec, world_size: int) -> Optional[DType]:
    """bf16 autocast where FSDP's mixed precision does not apply: one process, or DDP."""
    return (
        DType.bfloat16 if spec.train.precision == "bf16" and not _fsdp(spec, world_size) else None
    )


def precision_of(spec: ExperimentSpec, world_size: int) -> str:
    """What :func:`data_parallel` and :func:`autocast` give this run (parameters and master weights,
    compute, gradient reduction), for its log and the dry run."""
    if spec.train.precision == "fp32":
        compute = "fp32 compute (no autocast)"
    elif _fsdp(spec, world_size):
        compute = f"bf16 compute ({spec.train.data_parallel.upper()} mixed precision)"
    else:
        compute = "bf16 compute (torch.autocast)"
    reduce = "fp32 gradient reduction" if world_size > 1 else "no gradient reduction (1 process)"
    return f"fp32 parameters and master weights, {compute}, {reduce}"


def float8_config(
    spec: ExperimentSpec, device: str, world_size: int
) -> Optional[ShapeFloat8Config]:
    """OLMo-core's Float8Config for train.float8 (nn/float8.py), emulated where there are no float8
    matmuls; on float8 hardware each matmul converts where it wins at a micro-batch's tokens on this
    card; tensorwise under FSDP all-gathers the linears' weights in float8 (OLMo-core's
    recommended)."""
    from olmo_core.float8 import AOFloat8LinearConfig, AOFloat8LinearRecipe

    from ..launch.cards import CARDS

    f8 = spec.train.float8
    if f8 == "off":
        return None
    emulate = not has_float8_matmuls(torch.device(device))
    if emulate:
        log.info(f"train.float8={f8}: no float8 matmuls on {device}, using torchao's emulation")
    card = known_card(torch.cuda.get_device_name(device)) if not emulate else None
    size = dict(
        emulate=emulate,
        tokens=(spec.train.micro_batch_size or 1) * spec.data.sequence_length,
        roof=(card or CARDS["h100"]).roof,
    )
    if f8 == "tensorwise":
        all_gather = _fsdp(spec, world_size)
        return ShapeFloat8Config(
            ao=AOFloat8LinearConfig(enable_fsdp_float8_all_gather=all_gather), **size
        )
    return ShapeFloat8Config(ao_recipe=AOFloat8LinearRecipe(f8), **size)


def olmo_core_compiles(spec: ExperimentSpec, device: str) -> bool:
    """OLMo-core's compile_model flag. On CPU :func:`compile_on_cpu` compiles instead, and the flag
    is set only for activation checkpointing's ``budget`` mode, which OLMo-core's train module
    refuses without it (its parallelize_model then skips compiling on CPU, and compile_on_cpu
    compiles)."""
    ac = spec.train.activation_checkpointing
    return bool(spec.train.compile) and (
        device != "cpu" or (ac is not None and ac.mode == "budget")
    )


def describe_compile(spec: ExperimentSpec, world_size: int) -> str:
    """What train.compile does, on any device, for the run's log and the dry run."""
    if not spec.train.compile:
        return "off (eager)"
    return "torch.compile per block (inductor)" + (
        f", before {spec.train.data_parallel.upper()}" if world_size > 1 else ""
    )


# parallelize_model calls one of these right after where it compiles on CUDA (init_weights always).
_AFTER_COMPILE = ("apply_fsdp", "apply_ddp", "init_weights")


def compile_on_cpu(model: Transformer) -> None:
    """Make the next of ``model``'s apply_fsdp / apply_ddp / init_weights compile it first: the
    point where OLMo-core's parallelize_model would have called ``model.apply_compile()`` with
    CUDA."""

    def compiling_first(name: str):
        method = getattr(model, name)

        def call(*args, **kwargs):
            for other in _AFTER_COMPILE:
                del model.__dict__[other]  # back to the class's methods
            model.apply_compile()
            return method(*args, **kwargs)

        return call

    for name in _AFTER_COMPILE:
        setattr(model, name, compiling_first(name))
    logging.getLogger("olmo_core.train.train_module.transformer.common").addFilter(_compiled_here)


def _compiled_here(record: logging.LogRecord) -> bool:
    """Drops OLMo-core's "Skipping model compilation" warning where compile_on_cpu compiles
    instead."""
    return not record.getMessage().startswith("Skipping model compilation")
