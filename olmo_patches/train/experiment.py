"""Build the model, data, optimizer and OLMo-core Trainer from an :class:`ExperimentSpec`; run it.

Everything below is OLMo-core's own machinery (its Trainer, train module, numpy datasets, data
loader, checkpointer and evaluator); this module only translates the spec into its configs.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, Optional

import numpy as np
import torch
import torch.distributed as dist
from olmo_core.config import Config
from olmo_core.data import InstanceFilterConfig, NumpyDataLoaderConfig, NumpyFSLDatasetConfig, TokenizerConfig
from olmo_core.exceptions import OLMoConfigurationError
from olmo_core.io import is_url
from olmo_core.distributed.utils import barrier, broadcast_object, get_rank, get_world_size, is_distributed
from olmo_core.nn.transformer import TransformerConfig
from olmo_core.optim import AdamWConfig, CosWithWarmup, OptimGroupOverride, SkipStepAdamWConfig
from olmo_core.optim.scheduler import Scheduler, SchedulerUnits
from olmo_core.train import Duration, TrainerConfig, prepare_training_environment, teardown_training_environment
from olmo_core.train.callbacks import Callback, CallbackConfig, ConfigSaverCallback, SpeedMonitorCallback
from olmo_core.train.train_module import TransformerTrainModuleConfig

from .batch_trace import BatchTraceCallback
from ..optim.lagged import LaggedScheduler
from ..data.order import olmo_core_seed
from ..config import ConfigError, ExperimentSpec
from ..config.spec import demo_cache, one_line
from ..launch.layout import attention_backend, data_workers, resolve
from ..optim.power import PowerScheduler
from ..eval.evaluators import check_downstream_fit, downstream_evaluator, lm_evaluator, validation_files
from ..launch.hardware import known_card
from ..nn.attention import set_attention_backend
from ..nn.lm_loss import lm_loss, logits_in_eval, set_lm_loss
from .metrics import MetricsFileCallback
from ..launch import peers
from .checkpoints import latest_complete
from .disk import DiskFullError, check_room
from .precision import autocast, compile_on_cpu, data_parallel, describe_compile, float8_config, olmo_core_compiles, precision_of
from .progress import ProgressCallback, announce, quiet_console, quiet_start, wandb_callback
from .resume import ResumeCheckpointerCallback, check_resume_from, load_explicit, prune_incomplete
from ..launch.run_folder import Lock, RunFolderError, check_config, record_config
from .stop import StopOnSignalCallback
from .safety import NonFiniteError, NonFiniteGuardCallback, select_resume_checkpoint
from ..launch.shared_fs import require_data, require_shared
from .stacked_layout import load_earlier_stacked_layout

log = logging.getLogger(__name__)

__all__ = [
    "Experiment",
    "DataSources",
    "resolve_data",
    "build_experiment",
    "train",
    "exit_line",
    "device_for",
    "downstream_length",
    "eval_callbacks",
]


@dataclass
class DataSources:
    """Where the tokens come from, and how to read them."""

    tokenizer: TokenizerConfig
    train_paths: list[str]  # empty when a named mix is used
    val_paths: list[str]
    dtype: Optional[str] = None  # numpy dtype of the token files (None: OLMo-core infers it)


def resolve_data(spec: ExperimentSpec) -> DataSources:
    """The demo corpus is built on first use (rank 0 first, the other ranks then read its cache)."""
    d = spec.data
    if d.source == "demo":
        from ..data.demo import prepare_demo_corpus

        if is_distributed() and get_rank() != 0:
            barrier()
        corpus = prepare_demo_corpus(demo_cache(spec), vocab_size=d.demo_vocab_size)
        if is_distributed() and get_rank() == 0:
            barrier()
        tok = TokenizerConfig(
            vocab_size=corpus.vocab_size,
            eos_token_id=corpus.eos_token_id,
            pad_token_id=corpus.pad_token_id,
            identifier=corpus.tokenizer_file,
        )
        return DataSources(tok, list(corpus.train_paths), list(corpus.val_paths), corpus.dtype)
    tok = TokenizerConfig.dolma2()
    if d.source == "olmo2_stage1":
        from ..data.order import TOKEN_DTYPE, load_pinned_list

        return DataSources(tok, load_pinned_list(d.base), [], np.dtype(TOKEN_DTYPE).name)
    if d.source == "prefix":
        from ..data.prefix import prefix_paths

        assert d.prefix_dir is not None  # validate() checked its sequence length
        return DataSources(tok, prefix_paths(Path(d.prefix_dir)), [], "uint32")
    return DataSources(tok, list(d.paths), [])


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


def _optim_groups(spec: ExperimentSpec, model: TransformerConfig) -> list[OptimGroupOverride]:
    """No weight decay on the embedding unless train.decay_embeddings (OLMo-2), nor on the 1-D tensors
    (norm gains, read off the model's parameters; an MoE router's flat weight is a matrix) unless
    train.decay_norms. An untied LM head's matrix is always decayed (OLMo-2 and lm-engine alike; tied, it is
    the embedding). Under the variable-width paper's muP, the hidden matrices (attention and FFN
    weights; an MoE's router and experts) train at lr / m_width, as lm-engine's muP groups do."""
    no_decay = [] if spec.train.decay_embeddings else ["embeddings.weight"]
    if not spec.train.decay_norms:
        no_decay += [
            n for n, p in model.build(init_device="meta").named_parameters() if p.ndim == 1 and not n.endswith("router.weight")
        ]
    groups = [OptimGroupOverride(params=no_decay, opts=dict(weight_decay=0.0))] if no_decay else []
    widths = spec.model.widths
    if spec.model.block == "variable_width" and widths.init == "mup":
        ffn = (
            ["blocks.*.feed_forward_moe.router.weight", "blocks.*.feed_forward_moe.experts.mlp.w*"]
            if spec.model.moe
            else ["blocks.*.feed_forward.w*.weight"]
        )
        hidden = ["blocks.*.attention.w_*.weight", *ffn]
        groups.append(OptimGroupOverride(params=hidden, opts=dict(lr=spec.train.lr / widths.m_width)))
    return groups


def _scheduler(spec: ExperimentSpec) -> Scheduler:
    """Cosine with linear warmup (OLMo-2), or lm-engine's power schedule (the variable-width paper)."""
    t = spec.train
    if t.schedule == "power":
        p = t.power
        assert p.a is not None and p.c is not None  # validate()
        return PowerScheduler(a=p.a, b=p.b, c=p.c, lr0=t.lr, warmup=t.warmup_steps or 0)
    warmup = t.warmup_tokens if t.warmup_tokens is not None else t.warmup_steps
    units = SchedulerUnits.tokens if t.warmup_tokens is not None or t.schedule_tokens else SchedulerUnits.steps
    if units == SchedulerUnits.tokens and t.warmup_steps is not None:
        warmup = t.warmup_steps * t.global_batch_size * spec.data.sequence_length
    return CosWithWarmup(units=units, warmup=warmup or 0, alpha_f=t.final_lr_ratio, t_max=t.schedule_tokens)


def _lagged(scheduler: Scheduler, spec: ExperimentSpec) -> Scheduler:
    """train.schedule_lag steps behind (Megatron's convention), in the schedule's units."""
    t = spec.train
    if not t.schedule_lag:
        return scheduler
    per_step = t.global_batch_size * spec.data.sequence_length if scheduler.units == SchedulerUnits.tokens else 1
    return LaggedScheduler(units=scheduler.units, inner=scheduler, lag=t.schedule_lag * per_step)


def _dataset_kwargs(spec: ExperimentSpec, data: DataSources) -> dict:
    """OLMo-core numpy dataset arguments shared by training and validation."""
    kwargs: dict = dict(sequence_length=spec.data.sequence_length, tokenizer=data.tokenizer, work_dir=spec.data.work_dir)
    if data.dtype is not None:
        kwargs["dtype"] = data.dtype
    return kwargs


def _eval_tokenizer(spec: ExperimentSpec, data: DataSources) -> TokenizerConfig:
    """The run's tokenizer, identified by the local file when data.tokenizer_file is set."""
    return replace(data.tokenizer, identifier=spec.data.tokenizer_file) if spec.data.tokenizer_file else data.tokenizer


def _check_downstream_fit(spec: ExperimentSpec) -> None:
    """ConfigError for a downstream task that cannot fit eval.downstream_sequence_length, before a run writes anything."""
    if spec.eval.downstream_tasks:
        try:
            check_downstream_fit(
                list(spec.eval.downstream_tasks), _eval_tokenizer(spec, resolve_data(spec)), downstream_length(spec)
            )
        except OLMoConfigurationError as e:
            raise ConfigError(" ".join(str(e).split())) from None


def eval_callbacks(spec: ExperimentSpec, data: DataSources) -> Dict[str, CallbackConfig]:
    """The run's evaluators as OLMo-core callback configs: validation loss, downstream tasks."""
    e, out = spec.eval, {}
    if data.val_paths:  # the corpus's own validation split, evaluated from initialisation on
        lm_eval = lm_evaluator(
            data.val_paths, ["val"] * len(data.val_paths), e.interval, e.max_batches, _dataset_kwargs(spec, data), True
        )
    else:  # v3-small-ppl-validation
        paths, labels = validation_files(list(e.validation_sets), e.validation_base_dir or spec.data.mix_base_dir)
        lm_eval = lm_evaluator(paths, labels, e.interval, e.max_batches, _dataset_kwargs(spec, data))
    if lm_eval is not None:
        out["lm_evaluator"] = lm_eval
    downstream = downstream_evaluator(
        list(e.downstream_tasks), _eval_tokenizer(spec, data), e.downstream_interval or e.interval, downstream_length(spec)
    )
    if downstream is not None:
        out["downstream_evaluator"] = downstream
    return out


def optimizer(spec: ExperimentSpec, model, device: str):
    """OLMo-core's optimizer config for ``spec``. AdamW on CUDA takes torch's fused kernel (one kernel
    for every parameter's update; torch.optim.AdamW's ``fused=True``, CUDA tensors only); on a CPU, torch's
    default. SkipStepAdamW is OLMo-core's own (foreach kernels, its default)."""
    t = spec.train
    kwargs = dict(
        lr=t.lr,
        betas=(t.betas[0], t.betas[1]),
        eps=t.eps,
        weight_decay=t.weight_decay,
        group_overrides=_optim_groups(spec, model),
    )
    if t.optimizer == "skip_step_adamw":
        return SkipStepAdamWConfig(**kwargs)
    return AdamWConfig(**kwargs, fused=True if device == "cuda" else None)


def build_experiment(spec: ExperimentSpec, data: DataSources, *, world_size: int = 1) -> Experiment:
    t, d = spec.train, spec.data
    device = device_for(spec)
    seq = d.sequence_length
    assert t.micro_batch_size is not None, "resolve the spec first (launch.layout.resolve fills the micro-batch)"
    model = spec.model.build(vocab_size=data.tokenizer.padded_vocab_size())
    model.init_seed = t.seed
    backend = attention_backend(spec, device)
    set_attention_backend(model, backend.name)
    log.info(f"model.attention_backend={spec.model.attention_backend} -> {backend}")
    loss = lm_loss(spec, device)
    set_lm_loss(model, loss.name)
    log.info(f"LM loss: {loss}")
    log.info(
        f"train.precision={t.precision} -> {precision_of(spec, world_size)}; train.compile={t.compile} -> {describe_compile(spec, world_size)}"
    )

    dataset_kwargs = _dataset_kwargs(spec, data)
    # OLMo-2 Stage 1's repetition filter: the loss is masked on instances with a token n-gram
    # (period 1..13) repeated 32 times or more. It masks, so the order is unchanged.
    instance_filter = InstanceFilterConfig(repetition_max_period=13, repetition_min_period=1, repetition_max_count=32)
    train_kwargs = dict(dataset_kwargs, instance_filter_config=instance_filter if d.instance_filter else None)
    if d.mix and not data.train_paths:
        dataset = NumpyFSLDatasetConfig(mix=d.mix, mix_base_dir=d.mix_base_dir, **train_kwargs)
    else:
        dataset = NumpyFSLDatasetConfig(paths=data.train_paths, **train_kwargs)
    data_loader = OrderedDataLoaderConfig(
        global_batch_size=t.global_batch_size * seq,  # OLMo-core counts tokens
        seed=olmo_core_seed(d.order_seed),  # data.order_seed counts as the old OLMo trainer did
        # Workers read whole batches round-robin (OLMo-core), so the order is the same for any count.
        num_workers=(workers := data_workers(spec, device)),
        prefetch_factor=d.prefetch_factor if workers else None,
        shuffle=d.source != "prefix",
    )

    train_module = TransformerTrainModuleConfig(
        rank_microbatch_size=t.micro_batch_size * seq,
        max_sequence_length=seq,
        optim=optimizer(spec, model, device),
        scheduler=_lagged(_scheduler(spec), spec),
        max_grad_norm=t.max_grad_norm,
        z_loss_multiplier=t.z_loss,
        compile_model=olmo_core_compiles(spec, device),
        float8_config=float8_config(spec, device, world_size),
        dp_config=data_parallel(spec, world_size),
        ac_config=t.activation_checkpointing.build() if t.activation_checkpointing is not None else None,
        autocast_precision=autocast(spec, world_size),
    )

    duration = Duration.tokens(t.max_tokens) if t.max_tokens is not None else Duration.steps(t.max_steps)  # type: ignore[arg-type]
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
    trainer = trainer.with_callback("stop_on_signal", StopOnSignalCallback())  # SIGTERM/SIGUSR1: save and stop (stop.py)
    trainer = trainer.with_callback("config_saver", ConfigSaverCallback())
    trainer = trainer.with_callback("metrics_file", MetricsFileCallback())
    trainer = trainer.with_callback("console", ProgressCallback(metrics_log_interval=spec.run.log_interval))
    if device == "cuda" and t.precision == "bf16" and (card := known_card(torch.cuda.get_device_name())) and card.bf16_flops:
        # The peak of hardware.CARDS: OLMo-core's own table lacks some (H200: it would use an A100's, MFU x3.2).
        trainer = trainer.with_callback("speed_monitor", SpeedMonitorCallback(device_peak_flops_per_second=int(card.bf16_flops)))
    if spec.run.trace_batches:
        trainer = trainer.with_callback("batch_trace", BatchTraceCallback())
    for name, callback in eval_callbacks(spec, data).items():
        trainer = trainer.with_callback(name, callback)
    if (wandb := wandb_callback(spec.run.wandb_project, spec.run.name)) is not None:
        trainer = trainer.with_callback("wandb", wandb)
    return Experiment(model, dataset, data_loader, train_module, trainer)


def train(spec: ExperimentSpec, resume_from: Optional[str] = None, callbacks: Optional[dict[str, Callback]] = None) -> Path:
    """Train through OLMo-core's Trainer; works alone or under torchrun (CPU: gloo).

    Resumes from the newest good checkpoint in the save folder (safety.py), or from ``resume_from``.
    Raises :class:`RunFolderError` (nothing written) when the folder holds another run or another
    process, :class:`ConfigError` (nothing written) for a downstream task that cannot fit its sequence
    length or a local folder not every node sees, and :class:`NonFiniteError` when the run diverges
    (its last good checkpoint kept). An error on one rank ends the others (peers.py).
    ``callbacks`` (name -> OLMo-core callback) are added, or replace the run's of the same name.
    """
    resolve(spec)  # a spec resolved at launch stays as it is (idempotent)
    device = device_for(spec)
    save_folder = Path(spec.save_folder)
    lock = Lock(save_folder)
    refused: Optional[ConfigError] = None
    changes: list[str] = []
    rank0 = int(os.environ.get("RANK", "0")) == 0
    if rank0:  # before the process group: the demo corpus is built by rank 0 alone
        try:
            if resume_from is not None:
                check_resume_from(resume_from)
            _check_downstream_fit(spec)
            changes = check_config(spec, deliberate=resume_from is not None)
            check_room(spec)  # one checkpoint's room on the run folder's disk
        except ConfigError as e:  # RunFolderError, or a downstream task that cannot fit
            refused = e
    peers.watch()  # torchrun's store: a peer that refused its config ends the wait for it
    start_lines: list[logging.LogRecord] = []  # OLMo-core's env vars and process group: for train.log only
    try:
        with quiet_start(start_lines):
            prepare_training_environment(seed=spec.train.seed, backend="cpu:gloo" if device == "cpu" else "cpu:gloo,cuda:nccl")
    except BaseException:
        peers.stop_watching()  # no watch thread outlives a run that did not start
        raise
    _set_default_backend()
    peers.watch()  # or the process group's
    start_method = multiprocessing.get_start_method(allow_none=True)  # OLMo-core's ("spawn"), restored after the run
    if device == "cpu" and data_workers(spec, device) == 0:
        # OLMo-core chose "spawn" for its loader workers; with none, the only processes are its
        # dataset preparation's pools, which would each start a fresh interpreter (5-10 s of
        # imports a pool on a CPU run): the platform's default (fork on Linux) starts them at once.
        multiprocessing.set_start_method(multiprocessing.get_all_start_methods()[0], force=True)
    # OLMo-core runs gc.collect() after every evaluation and at the end (gc_cuda): 0.6 s each over the
    # ~400k objects of the imported modules. Collected once and frozen, those are skipped for the run
    # (unless the caller froze objects itself: then its freeze is left as it is).
    froze = gc.get_freeze_count() == 0
    try:
        if not is_url(spec.save_folder):  # before the folder is written: every node must see it
            require_shared({"run.save_folder": save_folder, "data.work_dir": Path(spec.data.work_dir)})
        if rank0 and refused is None:
            try:
                lock.acquire()
                record_config(spec, changes)
                prune_incomplete(save_folder)
                if resume_from is None:
                    select_resume_checkpoint(save_folder)
            except ConfigError as e:
                refused = e
        if (refused := broadcast_object(refused)) is not None:
            raise refused
        barrier()
        if froze:
            gc.collect()
            gc.freeze()
        with quiet_console(save_folder, start_lines):
            return _fit(spec, resume_from, device, callbacks)
    except Exception as e:  # before the process group goes: peers waiting in a collective hear why
        peers.announce(*exit_line(e))
        raise
    finally:
        peers.stop_watching()
        if froze:
            gc.unfreeze()
        multiprocessing.set_start_method(start_method, force=True)
        if rank0:
            lock.release()
        teardown_training_environment()


def _unreadable_file(e: Optional[BaseException]) -> Optional[str]:
    """ "FILE (Error: why)" for an OSError naming a file among ``e`` and its causes (OLMo-core's data
    thread raises OLMoThreadError from the reader's error), else None."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.filename:
            return f"{e.filename} ({type(e).__name__}: {e.strerror or e})"
        e = e.__cause__ or e.__context__
    return None


def exit_line(e: Exception) -> tuple[str, int]:
    """The one line and exit code a run that raised ``e`` ends with (scripts/train.py)."""
    if isinstance(e, RunFolderError):
        return f"error: {e}", 2
    if isinstance(e, ConfigError):  # found while building the run (a downstream task that cannot fit)
        return f"config error: {e}", 2
    if isinstance(e, NonFiniteError):
        return f"diverged: {e}", 3
    if (unread := _unreadable_file(e)) is not None:  # a data file gone after the start, say
        return f"rank {os.environ.get('RANK', '0')} cannot read {unread}", 2
    if isinstance(e, DiskFullError):
        return f"error: {e.strerror}", 4
    return f"rank {os.environ.get('RANK', '0')} failed: {type(e).__name__}: {one_line(e)}", 1


def _plan_line(spec: ExperimentSpec, trainer, dataset) -> str:
    """Steps, tokens, and how many times the run reads its data (more than once: said)."""
    t, seq = spec.train, spec.data.sequence_length
    steps = trainer.max_steps
    tokens = steps * t.global_batch_size * seq if steps is not None else None
    line = f"{steps} steps of {t.global_batch_size} x {seq} tokens ({_count(tokens)})" if tokens else "until train.max_tokens"
    data_tokens = len(dataset) * seq
    if tokens and tokens > data_tokens:
        line += f", {tokens / data_tokens:.1f} passes over the data's {_count(data_tokens)} tokens"
    return line


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n:,}"


def _set_default_backend() -> None:
    """Name gloo the default backend of a ``cpu:gloo`` process group, as torch's init_process_group does
    when no backend plugin is registered: with one registered (torch's FAKE, which an import registers)
    it leaves the default unset, and destroy_process_group's hook check then prints the C++ "No backend
    of type 0 found" warning on every exit (distributed_c10d._new_process_group_helper)."""
    pg = dist.GroupMember.WORLD if dist.is_initialized() else None
    if type(pg) is dist.ProcessGroup and "nccl" not in str(dist.get_backend_config(pg)):
        pg._set_default_backend(dist.ProcessGroup.BackendType.GLOO)


def _fit(spec: ExperimentSpec, resume_from: Optional[str], device: str, callbacks: Optional[dict[str, Callback]]) -> Path:
    """Build everything through OLMo-core and run its Trainer."""
    data = resolve_data(spec)
    require_data([*data.train_paths, *data.val_paths])  # every rank reads the same token files
    exp = build_experiment(spec, data, world_size=get_world_size())
    exp.trainer.callbacks.update(callbacks or {})
    model = exp.model.build(init_device="meta")
    logits_in_eval(model)  # the fused loss trains; the evaluators get logits
    if spec.train.compile and device == "cpu":
        compile_on_cpu(model)
    train_module = exp.train_module.build(model, device=torch.device(device))
    load_earlier_stacked_layout(train_module)  # checkpoints with (K, out, in) hourglass weights resume
    dataset = exp.dataset.build()
    data_loader = exp.data_loader.build(dataset, dp_process_group=train_module.dp_process_group)
    try:  # builds the evaluators (a task that cannot fit was refused before anything was written)
        trainer = exp.trainer.build(train_module, data_loader)
    except OLMoConfigurationError as e:
        raise ConfigError(" ".join(str(e).split())) from None
    for name in ("config_saver", "wandb"):  # the checkpoints and the wandb run record the config
        if name in trainer.callbacks:
            trainer.callbacks[name].config = exp.as_config_dict()  # type: ignore[attr-defined]
    if resume_from is not None:
        loaded: Optional[str] = load_explicit(trainer, resume_from)
    else:  # what fit() would load, loaded first to see whether the run is already finished
        trainer.maybe_load_checkpoint(spec.save_folder, load_trainer_state=True, load_optim_state=True)
        loaded = latest_complete(spec.save_folder) if trainer.checkpoint_loaded else None
    announce(
        f"resuming from step {trainer.global_step} ({loaded}); {_plan_line(spec, trainer, dataset)}"
        if loaded
        else f"new run in {spec.save_folder}; {_plan_line(spec, trainer, dataset)}"
    )
    if trainer.max_steps is not None and trainer.global_step >= trainer.max_steps:
        log.warning(f"Already finished (step {trainer.global_step}): nothing to do")  # no evaluation, nothing written
        return Path(spec.save_folder)
    trainer.fit()
    if trainer.is_canceled:
        log.warning(f"Stopped at step {trainer.global_step}: checkpoint saved, rerun the same command to resume")
    return Path(spec.save_folder)
