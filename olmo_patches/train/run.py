"""A training run as OLMo-core's own main template lays it out: the model, train module, data
loader and trainer (with its callbacks) built from the resolved spec (experiment.py's configs), a
checkpoint loaded, ``trainer.fit()``. What the template lacks is around it:

- the refusals before anything is written (the data files, the downstream tasks, then
  :func:`check_before_writing`'s: the folder's recorded config, the checkpoint it resumes from, the
  disk's room), on rank 0, then raised on every rank;
- the run folder's lock and recorded config (launch/run_folder.py), the watch of the other ranks
  (launch/peers.py: an error on one rank ends the others), every node seeing the folder;
- the checkpoint to resume from: the newest that verifies (checkpoints.py), or ``--resume-from``;
- one line and an exit code for every end (:func:`exit_line`: 0 stopped or done, 2 refused,
  3 diverged, 4 out of space, 1 otherwise).

The callbacks (callbacks/) say what each adds to OLMo-core's. Works alone or under torchrun (CPU:
gloo).
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist
from olmo_core.distributed.utils import barrier, broadcast_object, get_world_size
from olmo_core.exceptions import OLMoConfigurationError
from olmo_core.io import is_url
from olmo_core.train import prepare_training_environment, teardown_training_environment
from olmo_core.train.callbacks import Callback
from olmo_core.train.train_module import TransformerTrainModule

from ..config import ConfigError, ExperimentSpec
from ..config.spec import one_line
from ..launch import peers
from ..launch.data_files import check_data_files
from ..launch.layout import data_workers
from ..launch.run_folder import Lock, RunFolderError, check_config, record_config
from ..launch.shared_fs import require_data, require_shared
from ..nn.lm_loss import logits_in_eval
from ..nn.moe import count_experts_first
from .callbacks.checkpointer import DiskFullError, causes, check_room
from .callbacks.console import announce, quiet_console, quiet_start
from .callbacks.nonfinite import NonFiniteError
from .checkpoints import (
    check_own_checkpoint,
    check_resume_from,
    holds_checkpoints,
    latest_complete,
    load_explicit,
    prune_incomplete,
    select_resume_checkpoint,
)
from .experiment import build_experiment, check_downstream, compile_on_cpu, device_for
from .init_from import check_init_from, load_init_weights
from .sources import check_sources, resolve_data

log = logging.getLogger(__name__)

__all__ = ["train", "check_before_writing", "exit_line"]


def train(
    spec: ExperimentSpec,
    resume_from: Optional[str] = None,
    callbacks: Optional[dict[str, Callback]] = None,
    data_checked: bool = False,
) -> Path:
    """Train through OLMo-core's Trainer; works alone or under torchrun (CPU: gloo).

    Resumes from the newest good checkpoint in the save folder (checkpoints.py), or from
    ``resume_from``. Raises :class:`RunFolderError` (nothing written) when the folder holds another
    run or another process, :class:`ConfigError` (nothing written) for a downstream task that
    cannot fit its sequence length or a local folder not every node sees, and
    :class:`NonFiniteError` when the run diverges (its last good checkpoint kept). An error on one
    rank ends the others (peers.py). ``callbacks`` (name -> OLMo-core callback) are added, or
    replace the run's of the same name. Rank 0 checks the data files first (launch/data_files.py),
    unless ``data_checked``: the launch did (``cli.load_or_exit(..., data=True)``, before torch).
    """
    if not hasattr(spec, "resolved"):  # resolved once, at launch: the machine's choices are its
        raise TypeError("train() takes a spec resolved at launch (launch.layout.resolve)")
    device = device_for(spec)
    save_folder = Path(spec.save_folder)
    lock = Lock(save_folder)
    rank0 = int(os.environ.get("RANK", "0")) == 0
    # Before the process group: the demo corpus is built by rank 0 alone.
    start_lines: list[logging.LogRecord] = []
    with quiet_start(start_lines):  # what the checks log (the model's printout): train.log only
        refused, record = _refusal(spec, resume_from, data_checked) if rank0 else (None, None)
    start_lines += _start_process_group(spec, device)
    start_method = _fork_without_workers(spec, device)
    # OLMo-core runs gc.collect() after every evaluation and at the end (gc_cuda): 0.6 s each over
    # the ~400k objects of the imported modules. Collected once and frozen, those are skipped for
    # the run (unless the caller froze objects itself: then its freeze is left as it is).
    froze = gc.get_freeze_count() == 0
    # OLMo-core's budget checkpointing sets the partitioner's budget for the process and leaves it
    # (nn/transformer/model.py, apply_activation_checkpointing): put back after the run
    budget = torch._functorch.config.activation_memory_budget
    try:
        _take_folder(spec, lock, refused, resume_from)
        if froze:
            gc.collect()
            gc.freeze()
        with quiet_console(save_folder, start_lines):
            return _fit(spec, resume_from, device, callbacks, record)
    except Exception as e:  # before the process group goes: peers waiting in a collective hear why
        peers.announce(*exit_line(e))
        raise
    finally:
        peers.stop_watching()
        if froze:
            gc.unfreeze()
        multiprocessing.set_start_method(start_method, force=True)
        torch._functorch.config.activation_memory_budget = budget
        # OLMo-core 3.0.0 caches num_flops_per_token with functools.lru_cache on the method, which
        # keeps every train module (model, gradients, AdamW state) alive for the process: 3.1,
        # 7.6 and 24.3 GiB held on an H200 before the 2nd, 3rd and 4th run of one process
        TransformerTrainModule.num_flops_per_token.cache_clear()
        if rank0:
            lock.release()
        teardown_training_environment()


def _fork_without_workers(spec: ExperimentSpec, device: str) -> Optional[str]:
    """OLMo-core's start method ("spawn"), to restore after the run. It chose "spawn" for its
    loader workers; with none (a CPU run), the only processes are its dataset preparation's pools,
    which would each start a fresh interpreter (5-10 s of imports a pool on a CPU run): the
    platform's default (fork on Linux) starts them at once."""
    start_method = multiprocessing.get_start_method(allow_none=True)
    if device == "cpu" and data_workers(spec, device) == 0:
        multiprocessing.set_start_method(multiprocessing.get_all_start_methods()[0], force=True)
    return start_method


def check_before_writing(
    spec: ExperimentSpec, resume_from: Optional[str] = None
) -> tuple[list[str], bool, Optional[list]]:
    """What a start refuses before it writes anything (ConfigError, one line), the dry run too:
    ``--resume-from``, the sources, train.init_from, the folder's recorded config, the checkpoint it
    resumes from, one checkpoint's room. Returns what record_config takes once the run is built (the
    config's changes from the folder's record, and whether the folder holds a complete checkpoint:
    a record without any is replaced), then the mixture's plan (check_sources's: the dry run's)."""
    if resume_from is not None:
        check_resume_from(resume_from, spec)
    mixture = check_sources(spec)  # manifests against the tokenizer, the mixture against its ratios
    check_init_from(spec)  # a new run's weights: there, readable, of this model's shapes
    checkpointed = holds_checkpoints(spec.save_folder)
    changes = check_config(spec, deliberate=resume_from is not None, checkpointed=checkpointed)
    if resume_from is None:
        check_own_checkpoint(spec)  # the checkpoint the run resumes from fits its model
    check_room(spec)
    return changes, checkpointed, mixture


def _refusal(spec: ExperimentSpec, resume_from: Optional[str], data_checked: bool):
    """Rank 0's checks before writing, those of the dry run and the data files (unless the launch
    checked them) and the downstream tasks' fit (their documents: the tokenizer, which a dry run
    need not fetch): (the refusal, None) or (None, record_config's arguments)."""
    try:
        if not data_checked:
            check_data_files(spec)  # token ids below the vocabulary, URLs, the tokenizer file
        check_downstream(spec)
        return None, check_before_writing(spec, resume_from)[:2]
    except ConfigError as e:  # RunFolderError, bad data, a downstream task that cannot fit
        return e, None


def _start_process_group(spec: ExperimentSpec, device: str) -> list[logging.LogRecord]:
    """OLMo-core's process group, with the watch of the other ranks on each side of it; returns
    its start's log lines (OLMo-core's env vars and process group: for train.log only)."""
    peers.watch()  # torchrun's store: a peer that refused its config ends the wait for it
    start_lines: list[logging.LogRecord] = []
    try:
        with quiet_start(start_lines):
            backend = "cpu:gloo" if device == "cpu" else "cpu:gloo,cuda:nccl"
            prepare_training_environment(seed=spec.train.seed, backend=backend)
    except BaseException:
        peers.stop_watching()  # no watch thread outlives a run that did not start
        raise
    _set_default_backend()
    peers.watch()  # or the process group's
    return start_lines


def _take_folder(
    spec: ExperimentSpec, lock: Lock, refused: Optional[ConfigError], resume_from: Optional[str]
) -> None:
    """Every node sees the folder; rank 0 locks it and picks the checkpoint to resume from (the
    config is recorded once the run is built: :func:`_fit`); a refusal on rank 0 is raised on every
    rank."""
    save_folder = Path(spec.save_folder)
    if not is_url(spec.save_folder):  # before the folder is written: every node must see it
        require_shared({"run.save_folder": save_folder, "data.work_dir": Path(spec.data.work_dir)})
    if int(os.environ.get("RANK", "0")) == 0 and refused is None:
        try:
            lock.acquire()
            prune_incomplete(save_folder)
            if resume_from is None:
                select_resume_checkpoint(save_folder)
        except ConfigError as e:
            refused = e
    if (refused := broadcast_object(refused)) is not None:
        raise refused
    barrier()


def _plan_line(spec: ExperimentSpec, trainer, dataset) -> str:
    """Steps, tokens, and how many times the run reads its data (more than once: said)."""
    t, seq = spec.train, spec.data.sequence_length
    steps = trainer.max_steps
    tokens = steps * t.global_batch_size * seq if steps is not None else None
    line = (
        f"{steps} steps of {t.global_batch_size} x {seq} tokens ({_count(tokens)})"
        if tokens
        else "until train.max_tokens"
    )
    data_tokens = len(dataset) * seq
    if tokens and tokens > data_tokens:
        line += f", {tokens / data_tokens:.1f} passes over the data's {_count(data_tokens)} tokens"
    return line


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n:,}"


def _set_default_backend() -> None:
    """Name gloo the default backend of a ``cpu:gloo`` process group, as torch's init_process_group
    does when no backend plugin is registered: with one registered (torch's FAKE, which an import
    registers) it leaves the default unset, and destroy_process_group's hook check then prints the
    C++ "No backend of type 0 found" warning on every exit
    (distributed_c10d._new_process_group_helper)."""
    pg = dist.GroupMember.WORLD if dist.is_initialized() else None
    if type(pg) is dist.ProcessGroup and "nccl" not in str(dist.get_backend_config(pg)):
        pg._set_default_backend(dist.ProcessGroup.BackendType.GLOO)


def _fit(
    spec: ExperimentSpec,
    resume_from: Optional[str],
    device: str,
    callbacks: Optional[dict[str, Callback]],
    record: Optional[tuple[list[str], bool]],
) -> Path:
    """Build everything through OLMo-core and run its Trainer; rank 0 (``record``: its changes and
    whether the folder was checkpointed) records the config once all is built, before the first
    checkpoint: a start that fails while building leaves no record."""
    trainer, dataset = _build(spec, device, callbacks)
    loaded = _load(spec, trainer, resume_from)
    start = f" from the weights of {spec.train.init_from}" if spec.train.init_from else ""
    plan = _plan_line(spec, trainer, dataset)
    announce(
        f"resuming from step {trainer.global_step} ({loaded}); {plan}"
        if loaded
        else f"new run in {spec.save_folder}{start}; {plan}"
    )
    if trainer.max_steps is not None and trainer.global_step >= trainer.max_steps:
        # No evaluation, nothing written.
        log.warning(f"Already finished (step {trainer.global_step}): nothing to do")
        return Path(spec.save_folder)
    if record is not None and (replaced := record_config(spec, *record)):
        announce(replaced)
    trainer.fit()
    if trainer.is_canceled:
        log.warning(
            f"Stopped at step {trainer.global_step}: checkpoint saved, "
            "rerun the same command to resume"
        )
    return Path(spec.save_folder)


def _build(spec: ExperimentSpec, device: str, callbacks: Optional[dict[str, Callback]]):
    """The run's Trainer and dataset, built through OLMo-core (experiment.py) on every rank."""
    data = resolve_data(spec)
    mixed = [p for source in data.mixture for p in source.paths]
    # Every rank reads the same token files.
    require_data([*data.train_paths, *mixed, *data.val_paths])
    exp = build_experiment(spec, data, world_size=get_world_size())
    exp.trainer.callbacks.update(callbacks or {})
    model = exp.model.build(init_device="meta")
    logits_in_eval(model)  # the fused loss trains; the evaluators get logits
    if spec.train.compile and device == "cpu":
        compile_on_cpu(model)
    train_module = exp.train_module.build(model, device=torch.device(device))
    count_experts_first(train_module)  # model.moe.load_balance=global_batch: the counts first
    dataset = exp.dataset.build()
    data_loader = exp.data_loader.build(dataset, dp_process_group=train_module.dp_process_group)
    try:  # builds the evaluators (a task that cannot fit was refused before anything was written)
        trainer = exp.trainer.build(train_module, data_loader)
    except OLMoConfigurationError as e:
        raise ConfigError(" ".join(str(e).split())) from None
    # every checkpoint records the config; OLMo-core's config saver hands it to wandb too
    trainer.callbacks["config_saver"].config = exp.as_config_dict()  # type: ignore[attr-defined]
    return trainer, dataset


def _load(spec: ExperimentSpec, trainer, resume_from: Optional[str]) -> Optional[str]:
    """The checkpoint the run resumes from, loaded (None: a new run, which takes
    train.init_from's weights if set, and this run's optimizer)."""
    if resume_from is not None:
        loaded: Optional[str] = load_explicit(trainer, resume_from)
    else:  # what fit() would load, loaded first to see whether the run is already finished
        trainer.maybe_load_checkpoint(
            spec.save_folder, load_trainer_state=True, load_optim_state=True
        )
        loaded = latest_complete(spec.save_folder) if trainer.checkpoint_loaded else None
    if not loaded and spec.train.init_from:
        load_init_weights(trainer.train_module.model, spec.train.init_from)
    return loaded


def _unreadable_file(e: BaseException) -> Optional[str]:
    """ "FILE (Error: why)" for an OSError naming a file among ``e`` and what is behind it
    (OLMo-core's data thread raises OLMoThreadError from the reader's error), else None."""
    x = next((x for x in causes(e) if isinstance(x, OSError) and x.filename), None)
    return None if x is None else f"{x.filename} ({type(x).__name__}: {x.strerror or x})"


def exit_line(e: Exception) -> tuple[str, int]:
    """The one line and exit code a run that raised ``e`` ends with (scripts/train.py)."""
    rank = os.environ.get("RANK", "0")
    if isinstance(e, RunFolderError):
        return f"error: {e}", 2
    if isinstance(e, ConfigError):  # found while building the run (a task that cannot fit)
        return f"config error: {e}", 2
    if isinstance(e, NonFiniteError):
        return f"diverged: {e}", 3
    if isinstance(e, DiskFullError):
        return f"error: {e.strerror}", 4
    if (unread := _unreadable_file(e)) is not None:  # a data file gone after the start, say
        return f"rank {rank} cannot read {unread}", 2
    # OLMo-core's Trainer re-raises a bookkeeping thread's error as RuntimeError("An error
    # occurred") from it (trainer.py, training_complete and is_canceled): the line names the cause
    while str(e) == "An error occurred" and isinstance(e.__cause__, Exception):
        e = e.__cause__
    return f"rank {rank} failed: {type(e).__name__}: {one_line(e)}", 1
