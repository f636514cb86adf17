"""What a loaded spec becomes on this machine, for these ranks (:func:`resolve`, called at launch
and by the dry run): the checks that read the machine (CUDA, flash attention, torchao, the folders
it writes, a data prefix, the installed eval tasks), the per-rank batch arithmetic, the hardware
preset's choices, the attention backend and the loader's workers. Loading a config
(``config.load_spec``) is pure; this is not. The data files are checked by what reads them
(launch/data_files.py), not here."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from ..config.load import load_spec, where_set
from ..config.spec import (
    ActivationCheckpointing,
    ConfigError,
    ExperimentSpec,
    demo_cache,
    failer,
    one_line,
)
from .cards import CARDS, detect, no_cuda_driver
from .ranks import Layout

# the model's modules import torch and OLMo-core: imported once the pure checks pass
if TYPE_CHECKING:
    from ..nn.attention import BackendChoice
    from .memory import MemoryEstimate

log = logging.getLogger(__name__)

# data.num_workers=null on CUDA: 15x an 8-GPU 113M rank's need from the local prefix
# (docs/performance.md)
CUDA_WORKERS = 4


def resolve(spec: ExperimentSpec, layout: Optional[Layout] = None) -> ExperimentSpec:
    """``spec`` (as loaded) for the ranks of ``layout`` (default: torchrun's environment) on this
    machine, in place: the machine checks, the per-rank batch, then the hardware preset's keys left
    at null. Idempotent. What it changed is kept in ``spec.resolved`` (key -> value; the dry run
    prints it). Raises :class:`ConfigError` with one line naming the file or the command line."""
    where = where_set(spec)
    layout = layout or Layout.from_env()
    before = asdict(spec.train)
    check_machine(spec, where)  # these two import no torch: a refusal in about a second
    fit_world_size(spec, layout, where)
    check_devices(spec, where)
    apply_hardware(spec, where, layout)  # fills the train keys left at null
    after = asdict(spec.train)
    changed = {f"train.{k}": getattr(spec.train, k) for k in after if after[k] != before[k]}
    spec.resolved = {**getattr(spec, "resolved", {}), **changed}  # type: ignore[attr-defined]  # not a key
    return spec


def load_and_resolve(
    path, overrides: Optional[list] = None, layout: Optional[Layout] = None
) -> ExperimentSpec:
    """``config.load_spec`` then :func:`resolve`: a config as it runs here, on ``layout``'s
    ranks."""
    return resolve(load_spec(path, overrides), layout)


def check_machine(spec: ExperimentSpec, where=lambda key: "config") -> None:
    """What a spec needs of this machine that is read without torch: a CUDA driver for
    train.device=cuda, a data.base folder, folders it writes in that are not files (writable:
    :func:`check_writable`, for a run), a prefix that matches the run (the rest:
    :func:`check_devices`; the data files: launch/data_files.py)."""
    d, t = spec.data, spec.train
    fail = failer(where)
    if t.device == "cuda" and (why := no_cuda_driver()):  # else torch's own check (check_devices)
        fail("train.device", t.device, f"CUDA is not available on this machine ({why})")
    if d.base is not None and "://" not in d.base and not Path(d.base).is_dir():
        fail("data.base", d.base, "no such folder")
    for key, folder in _written(spec):
        if why := not_a_folder(Path(folder)):
            fail(key, folder, why)
    if d.source == "prefix" and d.prefix_dir:
        _check_prefix(spec, fail)


def check_devices(spec: ExperimentSpec, where=lambda key: "config") -> None:
    """What a spec needs of this machine that imports torch: CUDA for train.device=cuda, an explicit
    flash backend that runs here (a login node without CUDA passes), torchao for float8, and
    downstream tasks the installed ai2-olmo-eval knows."""
    t, m = spec.train, spec.model
    fail = failer(where)
    # nn.attention.FLASH, without importing OLMo-core
    flash = m.attention_backend.startswith("flash_")
    cuda = False
    if t.device != "cpu" or flash:
        import torch

        cuda = torch.cuda.is_available()
    if t.device == "cuda" and not cuda:
        fail("train.device", t.device, "CUDA is not available on this machine")
    if flash:
        try:
            resolve_backend(spec, "cuda" if t.device != "cpu" and cuda else "cpu")
        except ValueError as err:
            fail("model.attention_backend", m.attention_backend, str(err))
    if t.float8 != "off":
        try:
            import torchao.float8  # noqa: F401
        except ImportError:
            fail("train.float8", t.float8, "needs torchao: pip install -e '.[float8]'")
    check_downstream_tasks(spec, fail)


def _written(spec: ExperimentSpec) -> list:
    """(key, local folder) of each folder a run writes in."""
    folders = [
        ("run.save_folder", spec.save_folder),
        ("data.work_dir", spec.data.work_dir),
        ("data.demo_cache", str(demo_cache(spec))),
    ]
    return [(key, folder) for key, folder in folders if "://" not in folder]


def check_writable(spec: ExperimentSpec, where=lambda key: "config") -> None:
    """A run's folders can be written in (before anything is): what a count or a plan, which write
    nothing, do not need."""
    fail = failer(where)
    for key, folder in _written(spec):
        if why := unwritable(Path(folder)):
            fail(key, folder, why)


def not_a_folder(path: Path, folder: bool = True) -> str:
    """Why ``path`` cannot be a folder (``folder``) or a file, from what exists: "" if it can."""
    if path.exists() and path.is_dir() != folder:
        return "a file, not a folder" if folder else "a folder, not a file"
    here = next(p for p in (path, *path.parents) if p.exists())
    return "" if here.is_dir() or here == path else f"under {here}, a file"


def unwritable(path: Path, folder: bool = True) -> str:
    """Why ``path`` cannot be written as a folder (``folder``) or a file: "" if it can. A folder
    that is there is asked for its permissions (a run's own folder is left as it is); else the one
    the first write goes to (``path``'s nearest that exists) is tried with a folder made and
    removed, its modification time then put back."""
    if why := not_a_folder(path, folder):
        return why
    if path.is_dir():
        return "" if os.access(path, os.W_OK | os.X_OK) else f"cannot write in {path}"
    here = next(p for p in path.parents if p.exists())
    times = here.stat()
    try:
        os.rmdir(tempfile.mkdtemp(dir=here))
    except OSError as e:
        return f"cannot write in {here} ({e.strerror})"
    with contextlib.suppress(OSError):
        os.utime(here, ns=(times.st_atime_ns, times.st_mtime_ns))
    return ""


def check_downstream_tasks(spec: ExperimentSpec, fail) -> None:
    """eval.downstream_tasks: tasks the installed ai2-olmo-eval knows."""
    if spec.eval.downstream_tasks:
        try:
            from olmo_eval import list_tasks
        except ImportError:
            fail(
                "eval.downstream_tasks",
                spec.eval.downstream_tasks,
                "needs ai2-olmo-eval, the eval extra (or eval.downstream_tasks=[])",
            )
        if unknown := [n for n in spec.eval.downstream_tasks if n not in list_tasks()]:
            fail(
                "eval.downstream_tasks",
                unknown,
                "not an ai2-olmo-eval task (olmo_eval.list_tasks())",
            )


def _check_prefix(spec: ExperimentSpec, fail) -> None:
    from ..data.order import DataOrderError
    from ..data.prefix import prefix_index

    d, t = spec.data, spec.train
    if not Path(d.prefix_dir).is_dir():
        fail(
            "data.prefix_dir",
            d.prefix_dir,
            "no such folder (run: scripts/data_order.py materialize)",
        )
    try:
        prefix = prefix_index(Path(d.prefix_dir))["spec"]
    except DataOrderError as e:
        fail("data.prefix_dir", d.prefix_dir, one_line(e))
    if prefix["seq_len"] != d.sequence_length:
        fail(
            "data.sequence_length",
            d.sequence_length,
            f"the prefix in {d.prefix_dir} has {prefix['seq_len']}-token instances",
        )
    if prefix["seed"] != d.order_seed:
        fail(
            "data.order_seed",
            d.order_seed,
            f"the prefix in {d.prefix_dir} was made with order seed {prefix['seed']}",
        )
    tokens = (
        t.max_tokens
        if t.max_tokens is not None
        else (t.max_steps or 0) * t.global_batch_size * d.sequence_length
    )
    held = prefix["num_instances"] * prefix["seq_len"]
    if tokens > held:
        key = "train.max_tokens" if t.max_tokens is not None else "train.max_steps"
        fail(
            key,
            getattr(t, key.split(".")[1]),
            f"the run needs {tokens:,} tokens, the prefix in {d.prefix_dir} holds {held:,}",
        )


def fit_world_size(spec: ExperimentSpec, layout: Layout, where=lambda key: "config") -> None:
    """The per-rank arithmetic for ``layout``, before anything is built or written.

    An explicit micro-batch larger than the per-rank batch is lowered to it (one info line): the
    global batch and the data order are unchanged, so the result is the same up to rounding (float8:
    the scales are per micro-batch; docs/running.md, "Same result at any world size"), and a config
    sized for one process then runs on any number. One that does not divide the per-rank
    batch is refused: no value is clearly right (the nearest divisor may halve the throughput)."""
    t = spec.train
    g, n = t.global_batch_size, layout.world_size
    fail = failer(where)
    if g % n:
        fail(
            "train.global_batch_size",
            g,
            f"is not divisible by the {layout}: each rank takes a whole number of sequences",
        )
    per_rank = g // n
    m = t.micro_batch_size
    if m is not None and m > per_rank:
        log.info(
            f"train.micro_batch_size={m} > the per-rank batch {per_rank} ({g} sequences / "
            f"{layout}): using {per_rank}"
        )
        t.micro_batch_size = per_rank
    elif m is not None and per_rank % m:
        fail(
            "train.micro_batch_size",
            m,
            f"does not divide the per-rank batch {per_rank} (train.global_batch_size={g} / "
            f"{layout})",
        )
    if t.data_parallel == "hsdp" and n > 1 and layout.nodes * layout.local != n:
        fail(
            "train.data_parallel",
            t.data_parallel,
            f"HSDP shards over a node's ranks and replicates across nodes: {layout} is not "
            f"{layout.nodes} equal nodes",
        )


def apply_hardware(
    spec: ExperimentSpec, where=lambda key: "config", layout: Optional[Layout] = None
) -> None:
    """Fill the train keys left at null from ``train.hardware`` (presets.py for this
    model), per rank of ``layout`` (after :func:`fit_world_size`)."""
    from .presets import Settings, choose

    t = spec.train
    if (t.micro_batch_size, t.activation_checkpointing, t.compile).count(None) == 0:
        return
    layout = layout or Layout.from_env()
    per_rank = t.global_batch_size // layout.world_size
    card = (
        None if t.device == "cpu" else detect() if t.hardware == "auto" else CARDS.get(t.hardware)
    )
    if card is None:  # none, a CPU run, or auto without a GPU
        settings = Settings(t.micro_batch_size or per_rank, ActivationCheckpointing("off"), False)
    else:
        est = memory_estimate(spec, layout)
        try:
            settings = choose(est, card, per_rank, t.micro_batch_size, t.activation_checkpointing)
        except ValueError as e:
            raise ConfigError(
                f"{where('train.hardware')}: train.hardware={t.hardware}: {spec.run.name} {e}"
            ) from None
    filled = {
        k: getattr(settings, k)
        for k in ("micro_batch_size", "activation_checkpointing", "compile")
        if getattr(t, k) is None
    }
    for key, value in filled.items():
        setattr(t, key, value)
    if card is not None:  # without a card nothing is chosen: no preset line
        log.info(
            f"train.hardware={t.hardware} -> {card.name} ({layout}): "
            + ", ".join(f"{k}={v}" for k, v in filled.items())
        )
    ac = t.activation_checkpointing
    if ac is not None and ac.mode == "budget" and not t.compile:  # OLMo-core refuses it at build
        failer(where)(
            "train.activation_checkpointing", ac, "the compiler's budget needs train.compile=true"
        )


def memory_estimate(spec: ExperimentSpec, layout: Layout) -> MemoryEstimate:
    """memory.estimate for this spec's model on one rank of ``layout`` (FSDP: sharded over all
    ranks, HSDP: a node's), compiled unless train.compile is false (null: a GPU preset compiles)."""
    from ..nn.lm_loss import lm_loss
    from .memory import estimate

    shards = {"fsdp": layout.world_size, "hsdp": layout.local, "ddp": 1}.get(
        spec.train.data_parallel, 1
    )
    loss = lm_loss(spec, "cpu" if spec.train.device == "cpu" else "cuda")  # a card means CUDA
    return estimate(
        spec,
        spec.data.sequence_length,
        shards,
        fused_head=loss.name == "fused_linear",
        float8=spec.train.float8 != "off",
        compiled=spec.train.compile is not False,
    )


def attention_backend(spec: ExperimentSpec, device: str) -> BackendChoice:
    """The attention backend this spec runs with on ``device`` (cpu | cuda); raises ConfigError
    for an explicit flash backend that cannot run on this CUDA machine (load_spec checks it
    first)."""
    try:
        return resolve_backend(spec, device)
    except ValueError as e:
        raise ConfigError(
            f"config: model.attention_backend={spec.model.attention_backend}: {e}"
        ) from None


def resolve_backend(spec: ExperimentSpec, device: str) -> BackendChoice:
    from ..nn.attention import resolve_attention_backend

    return resolve_attention_backend(
        spec.model.attention_backend,
        spec.model.head_dims,
        cuda=device == "cuda",
        bf16=spec.train.precision == "bf16",
    )


def data_workers(spec: ExperimentSpec, device: str) -> int:
    """data.num_workers, or its default: 0 on CPU (no worker start-up: tests and demos),
    CUDA_WORKERS on CUDA."""
    if spec.data.num_workers is not None:
        return spec.data.num_workers
    return CUDA_WORKERS if device == "cuda" else 0
