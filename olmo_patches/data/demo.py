"""The embedded demo corpus: the running interpreter's standard library source.

Every machine with Python has it, so the demo job needs no download. The first call
reads the ``*.py`` files, splits them train/validation by file, trains a small
byte-level BPE tokenizer on the training split and writes OLMo-core token files
(raw little-endian arrays, no header). Later calls reuse the cache folder as long as
the cache key (Python version, file contents, settings) is unchanged.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

__all__ = ["DemoCorpus", "prepare_demo_corpus", "cached_demo_corpus", "load_tokenizer"]

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}
TOKENIZER_SAMPLE_CHARS = 8_000_000  # BPE is trained on this much of the training split
SHARD_TOKENS = 4_000_000  # a new train/val file starts after this many tokens
ENCODE_BATCH = 64  # documents per encode_batch call


@dataclass(frozen=True)
class DemoCorpus:
    root: Path  # the cache folder of this build
    train_paths: list[str]  # token files for training
    val_paths: list[str]  # token files for validation
    tokenizer_file: str  # the HF tokenizers JSON
    vocab_size: int  # the tokenizer's vocab size (including specials)
    eos_token_id: int
    pad_token_id: int
    dtype: str  # numpy dtype name of the token files, e.g. "uint16"
    n_train_tokens: int
    n_val_tokens: int


def load_tokenizer(corpus: DemoCorpus) -> Tokenizer:
    return Tokenizer.from_file(corpus.tokenizer_file)


def prepare_demo_corpus(
    cache_dir: str | Path = ".cache/demo-corpus",
    *,
    vocab_size: int = 4096,
    val_fraction: float = 0.05,
    max_train_tokens: int | None = 16_000_000,
    source_dir: str | Path | None = None,
) -> DemoCorpus:
    """Build the demo corpus into ``cache_dir/<key>`` once; return the cached build after.

    ``source_dir`` defaults to the running interpreter's stdlib (tests pass a small folder).
    ``max_train_tokens`` caps the training split (``None``: no cap).
    """
    source, files, settings, key, root = _build_key(
        cache_dir, vocab_size, val_fraction, max_train_tokens, source_dir
    )
    cache_dir = Path(cache_dir)
    if (corpus := _load(root, key)) is not None:
        log.info(f"Using the cached demo corpus in {root}")
        return corpus

    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key[:16]}-", dir=cache_dir))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
    try:
        log.info(f"Building the demo corpus from {source} into {root} (first run only)")
        start = time.perf_counter()
        _build(tmp, key, settings, files)
        if _load(root, key) is None:  # else another process finished it meanwhile
            shutil.rmtree(root, ignore_errors=True)  # a stale folder without a valid manifest
            try:
                os.replace(tmp, root)
            except OSError:
                if _load(root, key) is None:  # not a lost race to a valid build
                    raise
        log.info(f"Built the demo corpus in {time.perf_counter() - start:.1f}s")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    corpus = _load(root, key)
    assert corpus is not None
    log.info(
        f"Demo corpus: {corpus.n_train_tokens:,d} train / {corpus.n_val_tokens:,d} val tokens, "
        f"vocab {corpus.vocab_size}"
    )
    return corpus


def cached_demo_corpus(
    cache_dir: str | Path = ".cache/demo-corpus", *, vocab_size: int = 4096
) -> DemoCorpus | None:
    """The corpus :func:`prepare_demo_corpus` would return, if built already (writes nothing)."""
    _, _, _, key, root = _build_key(cache_dir, vocab_size)
    return _load(root, key)


def _build_key(
    cache_dir: str | Path,
    vocab_size: int,
    val_fraction: float = 0.05,
    max_train_tokens: int | None = 16_000_000,
    source_dir: str | Path | None = None,
) -> tuple[Path, dict[str, bytes], dict, str, Path]:
    """(source folder, its files, the build settings, the cache key, the build's folder)."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    if max_train_tokens is not None and max_train_tokens < 1:
        raise ValueError(f"max_train_tokens must be positive or None, got {max_train_tokens}")
    source = Path(source_dir or sysconfig.get_paths()["stdlib"]).resolve()
    files = _read_sources(source)
    settings = {
        "format_version": FORMAT_VERSION,
        "python": sys.version,
        "vocab_size": vocab_size,
        "val_fraction": val_fraction,
        "max_train_tokens": max_train_tokens,
        "tokenizer_sample_chars": TOKENIZER_SAMPLE_CHARS,
        "shard_tokens": SHARD_TOKENS,
    }
    key = _cache_key(settings, files)
    return source, files, settings, key, Path(cache_dir) / key[:16]


def _read_sources(source: Path) -> dict[str, bytes]:
    """Relative posix path -> raw bytes of every readable ``*.py`` file, sorted by path."""
    if not source.is_dir():
        raise FileNotFoundError(f"Demo corpus source folder not found: {source}")
    files: dict[str, bytes] = {}
    for dirpath, dirnames, filenames in os.walk(source):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        for name in filenames:
            if name.endswith(".py"):
                path = Path(dirpath, name)
                try:
                    files[path.relative_to(source).as_posix()] = path.read_bytes()
                except OSError:
                    continue
    return dict(sorted(files.items()))


def _cache_key(settings: dict, files: dict[str, bytes]) -> str:
    h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for rel, data in files.items():
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(hashlib.sha256(data).digest())
    return h.hexdigest()


def _path_hash(rel: str) -> float:
    """A stable number in [0, 1) per relative path: decides the split and the document order."""
    return int.from_bytes(hashlib.sha256(rel.encode()).digest()[:8], "big") / 2**64


def _split(files: dict[str, bytes], val_fraction: float) -> tuple[dict[str, str], dict[str, str]]:
    """UTF-8 documents (undecodable files dropped) in path-hash order, split by file."""
    train: dict[str, str] = {}
    val: dict[str, str] = {}
    for rel in sorted(files, key=_path_hash):
        try:
            text = files[rel].decode("utf-8")
        except UnicodeDecodeError:
            continue
        if text:
            (val if _path_hash(rel) < val_fraction else train)[rel] = text
    if not train or not val:
        raise ValueError(
            f"Demo corpus split is empty ({len(train)} train / {len(val)} val files); "
            "use more source files or another val_fraction"
        )
    return train, val


def _train_tokenizer(docs: dict[str, str], vocab_size: int) -> Tokenizer:
    sample, n_chars = [], 0
    for text in docs.values():
        if n_chars >= TOKENIZER_SAMPLE_CHARS:
            break
        sample.append(text)
        n_chars += len(text)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(sample, trainer, length=len(sample))
    return tokenizer


def _encode(
    tokenizer: Tokenizer,
    docs: dict[str, str],
    eos: int,
    dtype: np.dtype,
    max_tokens: int | None,
    progress: Progress,
    name: str,
) -> list[tuple[str, np.ndarray]]:
    """(path, token ids + eos) per document, in order; the last one is cut at ``max_tokens``."""
    items = list(docs.items())
    task = progress.add_task(f"Tokenizing {name}", total=len(items))
    out: list[tuple[str, np.ndarray]] = []
    total = 0
    for i in range(0, len(items), ENCODE_BATCH):
        batch = items[i : i + ENCODE_BATCH]
        encodings = tokenizer.encode_batch_fast([t for _, t in batch], add_special_tokens=False)
        for (rel, _), enc in zip(batch, encodings):
            ids = np.array(enc.ids + [eos], dtype=dtype)
            if max_tokens is not None and total + len(ids) >= max_tokens:
                out.append((rel, ids[: max_tokens - total]))
                progress.update(task, completed=len(items))
                return out
            out.append((rel, ids))
            total += len(ids)
        progress.advance(task, len(batch))
    return out


def _write_split(folder: Path, name: str, docs: list[tuple[str, np.ndarray]]) -> dict:
    """Write ``{name}-00000.npy``... (a new file after SHARD_TOKENS); return the manifest entry."""
    files: list[dict] = []
    shard: list[np.ndarray] = []

    def flush() -> None:
        data = np.concatenate(shard)
        file = f"{name}-{len(files):05d}.npy"
        data.astype(data.dtype.newbyteorder("<")).tofile(folder / file)
        files.append({"file": file, "n_tokens": int(data.size)})
        shard.clear()

    n_tokens = 0
    for _, ids in docs:
        shard.append(ids)
        n_tokens += ids.size
        if n_tokens >= SHARD_TOKENS:
            flush()
            n_tokens = 0
    if shard:
        flush()
    return {"files": files, "documents": [[rel, int(ids.size)] for rel, ids in docs]}


def _build(folder: Path, key: str, settings: dict, files: dict[str, bytes]) -> None:
    """Write tokenizer, token files and (last) the manifest into ``folder``."""
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )
    with progress:
        train_docs, val_docs = _split(files, settings["val_fraction"])
        task = progress.add_task("Training the BPE tokenizer", total=None)
        tokenizer = _train_tokenizer(train_docs, settings["vocab_size"])
        tokenizer.save(str(folder / "tokenizer.json"))
        progress.update(task, total=1, completed=1)

        vocab_size = tokenizer.get_vocab_size()
        eos, pad = tokenizer.token_to_id(EOS_TOKEN), tokenizer.token_to_id(PAD_TOKEN)
        dtype = np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)
        tokenizer.encode_special_tokens = True  # a literal "<|endoftext|>" in a source is text
        train = _encode(
            tokenizer, train_docs, eos, dtype, settings["max_train_tokens"], progress, "train"
        )
        val = _encode(tokenizer, val_docs, eos, dtype, None, progress, "val")

    manifest = {
        "key": key,
        "settings": settings,
        "tokenizer_file": "tokenizer.json",
        "vocab_size": vocab_size,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "dtype": dtype.name,
        "train": _write_split(folder, "train", train),
        "val": _write_split(folder, "val", val),
    }
    # The manifest goes last: a folder without it is never taken as a finished build.
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))


def _load(root: Path, key: str) -> DemoCorpus | None:
    """The finished build in ``root`` if its manifest has ``key`` and its files are intact."""
    try:
        manifest = json.loads((root / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("key") != key:
        return None
    itemsize = np.dtype(manifest["dtype"]).itemsize
    for split in ("train", "val"):
        for f in manifest[split]["files"]:
            path = root / f["file"]
            if not path.is_file() or path.stat().st_size != f["n_tokens"] * itemsize:
                return None
    return DemoCorpus(
        root=root.resolve(),
        train_paths=[str((root / f["file"]).resolve()) for f in manifest["train"]["files"]],
        val_paths=[str((root / f["file"]).resolve()) for f in manifest["val"]["files"]],
        tokenizer_file=str((root / manifest["tokenizer_file"]).resolve()),
        vocab_size=manifest["vocab_size"],
        eos_token_id=manifest["eos_token_id"],
        pad_token_id=manifest["pad_token_id"],
        dtype=manifest["dtype"],
        n_train_tokens=sum(f["n_tokens"] for f in manifest["train"]["files"]),
        n_val_tokens=sum(f["n_tokens"] for f in manifest["val"]["files"]),
    )
