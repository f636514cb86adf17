"""Translate an :class:`ExperimentSpec` into OLMo-core's configs: model, dataset, data loader, train
module and Trainer with its callbacks.

Everything built from them is OLMo-core's own machinery (its Trainer, train module, numpy datasets,
data loader, checkpointer and evaluators); run.py builds and runs them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Dict

import torch
from olmo_core.config import Config
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
from olmo_core.nn.transformer import TransformerConfig
from olmo_core.train import Duration, TrainerConfig
from olmo_core.train.callbacks import CallbackConfig, ConfigSaverCallback, SpeedMonitorCallback
from olmo_core.train.train_module import TransformerTrainModuleConfig

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
from ..nn.lm_loss import lm_loss, set_lm_loss
from .batch_trace import BatchTraceCallback
from .metrics import MetricsFileCallback
from .optimizer import lagged, optimizer, scheduler
from .precision import (
    autocast,
    data_parallel,
    describe_compile,
    float8_config,
    olmo_core_compiles,
    precision_of,
)
from .progress import ProgressCallback, wandb_callback
from .resume import ResumeCheckpointerCallback
from .safety import NonFiniteGuardCallback
from .sources import DataSources, resolve_data
from .life import StopOnSignalCallback

log = logging.getLogger(__name__)

__all__ = [
    "Experiment",
    "OrderedDataLoaderConfig",
    "build_experiment",
    "check_downstream",
    "device_for",
    "downstream_length",
    "eval_callbacks",
    "mixture_config",
]


def device_for(spec: ExperimentSpec) -> str:
    if spec.train.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return spec.train.device


def downstream_length(spec: ExperimentSpec) -> int:
    """The downstream tasks' context length: their own key, else the training length."""
    return spec.eval.downstream_sequence_length or spec.data.sequence_length


@dataclass
class OrderedDataLoaderConfig(NumpyDataLoaderConfig):
    """OLMo-core's data loader config plus the switch its config lacks: a materialized prefix is
    already in training order and must be read without reshuffling."""

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
        save_overwrite=False,  # cut-off saves are pruned before a run starts (resume.py)
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
    # SIGTERM/SIGUSR1: save and stop (life.py)
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
        # The peak of launch/cards.py: OLMo-core's own table lacks some (H200: it would use an
        # A100's, MFU x3.2).
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
