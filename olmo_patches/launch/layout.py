"""What a loaded spec becomes on this machine, for these ranks (:func:`resolve`, called at launch and
by the dry run): the checks that read the machine (CUDA, flash attention, torchao, local files, the
installed eval tasks), the per-rank batch arithmetic, the hardware preset's choices, the attention
backend and the loader's workers. Loading a config (``config.load_spec``) is pure; this is not."""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from ..config.load import load_spec, where_set
from ..config.spec import (
    ActivationCheckpointing,
    ConfigError,
    ExperimentSpec,
    demo_cache,
    failer,
    one_line,
    tokenizer_config,
    vocab_size,
)
from ..nn.attention import FLASH, BackendChoice, resolve_attention_backend
from .ranks import Layout
from ..nn.lm_loss import lm_loss, set_lm_loss
from .cards import CARDS, detect
from .memory import MemoryEstimate, estimate, with_float8
from .presets import Settings, choose

log = logging.getLogger(__name__)

CUDA_WORKERS = 4  # data.num_workers=null on CUDA: 15x an 8-GPU 113M rank's need from the local prefix (docs/performance.md)


def resolve(spec: ExperimentSpec, layout: Optional[Layout] = None) -> ExperimentSpec:
    """``spec`` (as loaded) for the ranks of ``layout`` (default: torchrun's environment) on this
    machine, in place: the machine checks, the per-rank batch, then the hardware preset's keys left
    at null. Idempotent. What it changed is kept in ``spec.resolved`` (key -> value; the dry run prints
    it). Raises :class:`ConfigError` with one line naming the file or the command line."""
    where = where_set(spec)
    layout = layout or Layout.from_env()
    before = asdict(spec.train)
    check_machine(spec, where)
    fit_world_size(spec, layout, where)
    apply_hardware(spec, where, layout)  # fills the train keys left at null
    after = asdict(spec.train)
    changed = {f"train.{k}": getattr(spec.train, k) for k in after if after[k] != before[k]}
    spec.resolved = {**getattr(spec, "resolved", {}), **changed}  # type: ignore[attr-defined]  # not a key
    return spec


def load_and_resolve(path, overrides: Optional[list] = None, layout: Optional[Layout] = None) -> ExperimentSpec:
    """``config.load_spec`` then :func:`resolve`: a config as it runs here, on ``layout``'s ranks."""
    return resolve(load_spec(path, overrides), layout)


def check_machine(spec: ExperimentSpec, where=lambda key: "config") -> None:
    """What a spec needs of this machine: CUDA for train.device=cuda, an explicit flash backend that
    runs here (a login node without CUDA passes), torchao for float8, local token files that hold whole
    tokens and a global batch, folders it writes in that are not files, a prefix that matches the run,
    and downstream tasks the installed ai2-olmo-eval knows."""
    d, t, m = spec.data, spec.train, spec.model
    fail = failer(where)
    cuda = False
    if t.device != "cpu" or m.attention_backend in FLASH:
        import torch

        cuda = torch.cuda.is_available()
    if t.device == "cuda" and not cuda:
        fail("train.device", t.device, "CUDA is not available on this machine")
    if m.attention_backend in FLASH:
        try:
            resolve_backend(spec, "cuda" if t.device != "cpu" and cuda else "cpu")
        except ValueError as err:
            fail("model.attention_backend", m.attention_backend, str(err))
    if t.float8 != "off":
        try:
            import torchao.float8  # noqa: F401
        except ImportError:
            fail("train.float8", t.float8, "needs torchao: pip install -e '.[float8]'")
    if d.base is not None and "://" not in d.base and not Path(d.base).is_dir():
        fail("data.base", d.base, "no such folder")
    if d.source == "numpy":
        _check_token_files(spec, fail)
    for key, folder in (
        ("run.save_folder", spec.save_folder),
        ("data.work_dir", d.work_dir),
        ("data.demo_cache", str(demo_cache(spec))),
    ):
        if "://" not in folder and (why := _not_a_folder(Path(folder))):
            fail(key, folder, why)
    if d.tokenizer_file is not None:
        _check_tokenizer_file(spec, fail)
    if d.source == "prefix" and d.prefix_dir:
        _check_prefix(spec, fail)
    check_downstream_tasks(spec, fail)


def _not_a_folder(path: Path) -> str:
    """Why ``path`` cannot be a folder this run writes in ("" if it is one, or can be made)."""
    if path.exists():
        return "" if path.is_dir() else "a file, not a folder"
    for parent in path.parents:
        if parent.exists():
            return "" if parent.is_dir() else f"under {parent}, a file"
    return ""


def _check_token_files(spec: ExperimentSpec, fail) -> None:
    """Each local token file readable, whole tokens of the dtype OLMo-core will read it as (the smallest
    unsigned type holding the tokenizer's ids, NumpyDatasetConfig.get_dtype), at least one sequence;
    together at least one global batch: an empty dataset would have OLMo-core enumerate epochs without
    end. Then every id of every file of the run below the vocabulary (:func:`_check_token_ids`)."""
    import numpy as np

    d, t = spec.data, spec.train
    tokenizer = tokenizer_config(spec)
    dtype = next(np.dtype(k) for k in (np.uint8, np.uint16, np.uint32, np.uint64) if tokenizer.vocab_size - 1 <= np.iinfo(k).max)
    instances, local = 0, True
    files = _manifest_files(spec, fail)
    for path in files:
        if "://" in path:
            local = False
            continue
        file = Path(path)
        if file.is_dir():
            fail("data.paths", path, "a folder, not a token file")
        if not file.is_file():
            fail("data.paths", path, "no such file")
        size = file.stat().st_size
        if size % dtype.itemsize:
            fail(
                "data.paths",
                path,
                f"{size} bytes is not a whole number of {dtype.name} tokens (this tokenizer's ids are read as {dtype.name})",
            )
        if size // dtype.itemsize < d.sequence_length:
            fail(
                "data.paths",
                path,
                f"{size // dtype.itemsize} tokens, fewer than one sequence of data.sequence_length={d.sequence_length}",
            )
        instances += size // dtype.itemsize // d.sequence_length
    if local and d.paths and instances < t.global_batch_size:
        fail(
            "data.paths",
            d.paths,
            f"{instances} instances of {d.sequence_length} tokens, fewer than one global batch of {t.global_batch_size}",
        )
    keyed = [("data.paths", p) for p in files] + _mixture_files(spec) + _validation_files(spec)
    _check_token_ids(spec, fail, keyed, dtype)


def _mixture_files(spec: ExperimentSpec) -> list[tuple[str, str]]:
    """(key, path) of data.mixture's token files: its manifests' files, its paths with local globs
    expanded; a file missing or of another tokenizer is train/sources.py's to refuse, later."""
    import glob

    from ..data.tokenize import InputError, read_manifest

    out = []
    for name, s in spec.data.mixture.items():
        key = f"data.mixture.{name}.{'manifest' if s.manifest else 'paths'}"
        entries = []
        if s.manifest:
            try:
                entries = read_manifest(s.manifest)[1]
            except InputError:
                pass
        for p in s.paths:
            entries += [p] if "://" in p or "*" not in p else sorted(glob.glob(p))
        out += [(key, p) for p in entries if "://" in p or Path(p).is_file()]
    return out


def _validation_files(spec: ExperimentSpec) -> list[tuple[str, str]]:
    """(key, path) of the local files of eval.validation_sets (token files of the run's tokenizer
    too: the evaluator reads them with the run's model); none for the demo (its own split). Those at
    a URL are not HEAD-checked: data.mix_base_dir's default is a public server."""
    e = spec.eval
    if spec.data.source == "demo" or not e.validation_sets:
        return []
    from ..eval.evaluators import validation_files

    paths, _ = validation_files(list(e.validation_sets), e.validation_base_dir or spec.data.mix_base_dir)
    return [("eval.validation_sets", p) for p in paths if Path(p).is_file()]  # URLs: not HEAD-checked


def _check_token_ids(spec: ExperimentSpec, fail, files: list[tuple[str, str]], dtype) -> None:
    """Every id of every local token file (``(key, path)``) below the vocabulary, the whole file
    read (data/contract.py: cached in data.work_dir by size and modification time); every HTTP(S)
    one answering a HEAD."""
    from ..data.contract import HEAD_TIMEOUT_S, max_token, unreachable

    d, vocab = spec.data, tokenizer_config(spec).vocab_size  # <= model.vocab_size (config/validate.py)
    if (bad := unreachable([p for _, p in files])) is not None:
        key = next(k for k, p in files if p == bad[0])
        fail(key, bad[0], f"{bad[1]} (a HEAD within {HEAD_TIMEOUT_S:g} s)")
    local = [(k, p) for k, p in files if "://" not in p]
    cache = None if "://" in d.work_dir else Path(d.work_dir)
    try:
        found = max_token([p for _, p in local], dtype, cache)
    except OSError as e:
        fail("data.paths", e.filename, f"cannot read: {e.strerror}")
    for key, path in local:
        if (top := found[path]).max >= vocab:
            fail(
                key,
                path,
                f"token id {top.max} at token {top.position} >= the vocabulary's {vocab} "
                f"(data.tokenizer={d.tokenizer}, model.vocab_size={vocab_size(spec)}; {dtype.name} tokens)",
            )


def _check_tokenizer_file(spec: ExperimentSpec, fail) -> None:
    """data.tokenizer_file: a tokenizers JSON whose ids fit the model's vocabulary."""
    from ..data.contract import tokenizer_vocab

    file = spec.data.tokenizer_file
    if not Path(file).is_file():
        fail("data.tokenizer_file", file, "a folder, not a tokenizer JSON" if Path(file).is_dir() else "no such file")
    try:
        ids = tokenizer_vocab(file)
    except (OSError, ValueError) as e:
        fail("data.tokenizer_file", file, getattr(e, "strerror", None) or str(e))
    if ids > vocab_size(spec):
        fail("data.tokenizer_file", file, f"{ids} token ids, more than model.vocab_size={vocab_size(spec)}")


def _manifest_files(spec: ExperimentSpec, fail) -> list:
    """data.paths with each hourglass-tokenize folder or manifest.json replaced by its token files,
    its tokens checked against the config's tokenizer."""
    from ..data.tokenize import MANIFEST, InputError, other_tokenizer, read_manifest

    d, tok, out = spec.data, tokenizer_config(spec), []
    for path in d.paths:
        if "://" in path or not (path.endswith(MANIFEST) or (Path(path) / MANIFEST).is_file()):
            out.append(path)
            continue
        try:
            manifest, files = read_manifest(path)
        except InputError as e:
            fail("data.paths", path, str(e))
        ids = (tok.vocab_size, tok.eos_token_id, tok.bos_token_id)
        if why := other_tokenizer(manifest, f"data.tokenizer={d.tokenizer}", *ids, d.tokenizer_file):
            fail("data.paths", path, why)
        out.extend(files)
    return out


def check_downstream_tasks(spec: ExperimentSpec, fail) -> None:
    """eval.downstream_tasks: tasks the installed ai2-olmo-eval knows."""
    if spec.eval.downstream_tasks:
        from olmo_eval import list_tasks

        if unknown := [n for n in spec.eval.downstream_tasks if n not in list_tasks()]:
            fail("eval.downstream_tasks", unknown, "not an ai2-olmo-eval task (olmo_eval.list_tasks())")


def _check_prefix(spec: ExperimentSpec, fail) -> None:
    from ..data.order import DataOrderError
    from ..data.prefix import prefix_index

    d, t = spec.data, spec.train
    if not Path(d.prefix_dir).is_dir():
        fail("data.prefix_dir", d.prefix_dir, "no such folder (run: scripts/data_order.py materialize)")
    try:
        prefix = prefix_index(Path(d.prefix_dir))["spec"]
    except DataOrderError as e:
        fail("data.prefix_dir", d.prefix_dir, one_line(e))
    if prefix["seq_len"] != d.sequence_length:
        fail("data.sequence_length", d.sequence_length, f"the prefix in {d.prefix_dir} has {prefix['seq_len']}-token instances")
    if prefix["seed"] != d.order_seed:
        fail("data.order_seed", d.order_seed, f"the prefix in {d.prefix_dir} was made with order seed {prefix['seed']}")
    tokens = t.max_tokens if t.max_tokens is not None else (t.max_steps or 0) * t.global_batch_size * d.sequence_length
    held = prefix["num_instances"] * prefix["seq_len"]
    if tokens > held:
        key = "train.max_tokens" if t.max_tokens is not None else "train.max_steps"
        fail(key, getattr(t, key.split(".")[1]), f"the run needs {tokens:,} tokens, the prefix in {d.prefix_dir} holds {held:,}")


def fit_world_size(spec: ExperimentSpec, layout: Layout, where=lambda key: "config") -> None:
    """The per-rank arithmetic for ``layout``, before anything is built or written.

    An explicit micro-batch larger than the per-rank batch is lowered to it (one info line): the global
    batch and the data order are unchanged, so the result is the same up to rounding (float8: the
    scales are per micro-batch; docs/running.md, "Same result at any world size"), and a config sized
    for one process then runs on any number. One that does not divide the per-rank
    batch is refused: no value is clearly right (the nearest divisor may halve the throughput)."""
    t = spec.train
    g, n = t.global_batch_size, layout.world_size
    fail = failer(where)
    if g % n:
        fail("train.global_batch_size", g, f"is not divisible by the {layout}: each rank takes a whole number of sequences")
    per_rank = g // n
    m = t.micro_batch_size
    if m is not None and m > per_rank:
        log.info(f"train.micro_batch_size={m} > the per-rank batch {per_rank} ({g} sequences / {layout}): using {per_rank}")
        t.micro_batch_size = per_rank
    elif m is not None and per_rank % m:
        fail(
            "train.micro_batch_size", m, f"does not divide the per-rank batch {per_rank} (train.global_batch_size={g} / {layout})"
        )
    if t.data_parallel == "hsdp" and n > 1 and layout.nodes * layout.local != n:
        fail(
            "train.data_parallel",
            t.data_parallel,
            f"HSDP shards over a node's ranks and replicates across nodes: {layout} is not {layout.nodes} equal nodes",
        )


def apply_hardware(spec: ExperimentSpec, where=lambda key: "config", layout: Optional[Layout] = None) -> None:
    """Fill the train keys left at null from ``train.hardware`` (presets.py for this
    model), per rank of ``layout`` (after :func:`fit_world_size`)."""
    t = spec.train
    if (t.micro_batch_size, t.activation_checkpointing, t.compile).count(None) == 0:
        return
    layout = layout or Layout.from_env()
    per_rank = t.global_batch_size // layout.world_size
    card = None if t.device == "cpu" else detect() if t.hardware == "auto" else CARDS.get(t.hardware)
    if card is None:  # none, a CPU run, or auto without a GPU
        settings = Settings(t.micro_batch_size or per_rank, ActivationCheckpointing("off"), False)
    else:
        est = memory_estimate(spec, layout)
        try:
            settings = choose(est, card, per_rank, t.micro_batch_size, t.activation_checkpointing)
        except ValueError as e:
            raise ConfigError(f"{where('train.hardware')}: train.hardware={t.hardware}: {spec.run.name} {e}") from None
    filled = {
        k: getattr(settings, k) for k in ("micro_batch_size", "activation_checkpointing", "compile") if getattr(t, k) is None
    }
    for key, value in filled.items():
        setattr(t, key, value)
    if card is not None:  # without a card nothing is chosen: no preset line
        log.info(f"train.hardware={t.hardware} -> {card.name} ({layout}): " + ", ".join(f"{k}={v}" for k, v in filled.items()))
    ac = t.activation_checkpointing
    if ac is not None and ac.mode == "budget" and not t.compile:  # OLMo-core refuses it at build
        failer(where)("train.activation_checkpointing", ac, "the compiler's budget needs train.compile=true")


def memory_estimate(spec: ExperimentSpec, layout: Layout) -> MemoryEstimate:
    """memory.estimate for this spec's model on one rank of ``layout`` (FSDP: sharded over all ranks, HSDP: a node's)."""
    shards = {"fsdp": layout.world_size, "hsdp": layout.local, "ddp": 1}.get(spec.train.data_parallel, 1)
    model = spec.model_config()
    set_lm_loss(model, lm_loss(spec, "cpu" if spec.train.device == "cpu" else "cuda").name)  # a card means CUDA
    est = estimate(model, spec.data.sequence_length, shards)
    return with_float8(est, model) if spec.train.float8 != "off" else est


def attention_backend(spec: ExperimentSpec, device: str) -> BackendChoice:
    """The attention backend this spec runs with on ``device`` (cpu | cuda); raises ConfigError
    for an explicit flash backend that cannot run on this CUDA machine (load_spec checks it first)."""
    try:
        return resolve_backend(spec, device)
    except ValueError as e:
        raise ConfigError(f"config: model.attention_backend={spec.model.attention_backend}: {e}") from None


def resolve_backend(spec: ExperimentSpec, device: str) -> BackendChoice:
    return resolve_attention_backend(
        spec.model.attention_backend, spec.model.head_dims, cuda=device == "cuda", bf16=spec.train.precision == "bf16"
    )


def data_workers(spec: ExperimentSpec, device: str) -> int:
    """data.num_workers, or its default: 0 on CPU (no worker start-up: tests and demos), CUDA_WORKERS on CUDA."""
    if spec.data.num_workers is not None:
        return spec.data.num_workers
    return CUDA_WORKERS if device == "cuda" else 0
