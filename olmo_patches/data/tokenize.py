"""Text to OLMo-core token files: documents from jsonl / jsonl.gz / parquet / plain text folders / a
Hugging Face ``datasets`` folder, encoded by a ``tokenizers`` JSON file over worker processes.

The output is what OLMo-core's numpy datasets read: raw little-endian arrays (``.npy`` by name, no
header), each document's ids followed by the EOS id (a BOS first when the tokenizer has one), in the
smallest unsigned dtype that holds the vocabulary (OLMo-core's ``NumpyDatasetConfig.get_dtype``).
Documents are never split: a shard closes after the document that brings it to ``shard_tokens``.

A shard is written under a temporary name and renamed when complete; ``progress.json``, written
first, records the finished shards and the document the next one starts at, so a rerun skips them
and produces the same bytes as an uninterrupted run. ``manifest.json`` (files, token counts, SHA-256
checksums, the tokenizer's id) is written last; training checks it against the config's tokenizer,
and refuses a folder (or a file or glob of its files) holding ``progress.json`` without it.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import multiprocessing
import os
import signal
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np

from .contract import tokenizer_vocab

__all__ = [
    "InputError",
    "TokenizerInfo",
    "dtype_for",
    "find_inputs",
    "read_manifest",
    "scan",
    "tokenize",
    "tokenize_folder",
]

MANIFEST = "manifest.json"
PROGRESS = "progress.json"
FORMAT_VERSION = 1
JSONL = (".jsonl", ".json", ".ndjson")
SKIP_NAMES = {MANIFEST, PROGRESS, ".DS_Store"}


class InputError(ValueError):
    """A bad input or tokenizer: one line naming the file (and line)."""


@dataclass(frozen=True)
class TokenizerInfo:
    """A tokenizer as the token files record it (manifest.json's ``tokenizer``)."""

    file: str  # the tokenizers JSON
    sha256: str  # the tokenizer's id: its file's checksum
    vocab_size: int  # tokens, added ones included
    eos_token_id: int  # ends every document
    bos_token_id: Optional[int] = None  # starts every document when set

    @classmethod
    def from_file(
        cls, path: str, eos: str = "<|endoftext|>", bos: Optional[str] = None
    ) -> "TokenizerInfo":
        """The tokenizer of a tokenizers JSON file, its EOS (and BOS) given as token strings."""
        from tokenizers import Tokenizer

        if not Path(path).is_file():
            raise InputError(f"{path}: no such tokenizer file")
        try:
            tokenizer_vocab(path)  # the JSON read first: valid JSON that is not a tokenizer
            tok = Tokenizer.from_file(str(path))
        except ValueError as e:
            raise InputError(f"{path}: {e}") from None
        except Exception as e:  # noqa: BLE001 (the library's own error, kept to one line)
            raise InputError(
                f"{path}: not a tokenizers JSON file ({' '.join(str(e).split())[:120]})"
            ) from None
        ids = {}
        for flag, token in (("--eos", eos), ("--bos", bos)):
            ids[flag] = tok.token_to_id(token) if token else None
            if token is not None and ids[flag] is None:
                raise InputError(f"{path}: no token {token!r} ({flag})")
        vocab = tok.get_vocab_size(with_added_tokens=True)
        return cls(str(path), _sha256(Path(path)), vocab, ids["--eos"], ids["--bos"])

    @property
    def dtype(self) -> np.dtype:
        return dtype_for(self.vocab_size)


def dtype_for(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype holding ids below ``vocab_size``, as OLMo-core picks it."""
    for dtype in (np.uint8, np.uint16, np.uint32, np.uint64):
        if vocab_size - 1 <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise InputError(f"a vocabulary of {vocab_size} tokens is too large for uint64")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ---- inputs --------------------------------------------------------------------------------------


def _kind(path: Path) -> str:
    name = path.name.lower()
    if path.is_dir():
        return (
            "hf"
            if (path / "dataset_info.json").is_file() or (path / "state.json").is_file()
            else "folder"
        )
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith(tuple(s + ".gz" for s in JSONL)):
        return "jsonl.gz"
    if name.endswith(JSONL):
        return "jsonl"
    return "text"


def find_inputs(paths: Sequence[str]) -> List[Tuple[str, str]]:
    """(file, kind) for every input in order: a folder of plain files is each of its files (sorted),
    a ``datasets`` folder (``save_to_disk``) is one input."""
    out: List[Tuple[str, str]] = []
    for p in map(Path, paths):
        if not p.exists():
            raise InputError(f"{p}: no such file or folder")
        kind = _kind(p)
        if kind == "folder":
            files = sorted(f for f in p.rglob("*") if f.is_file() and f.name not in SKIP_NAMES)
            if not files:
                raise InputError(f"{p}: empty input folder (no files)")
            out.extend((str(f), _kind(f)) for f in files)
        elif kind == "hf" and (p / "dataset_dict.json").is_file():
            raise InputError(f"{p}: a DatasetDict; pass one split's folder, e.g. {p / 'train'}")
        else:
            out.append((str(p), kind))
    seen: dict = {}
    for file, _ in out:  # a file given twice (or also inside a folder given) would be read twice
        if (key := Path(file).resolve()) in seen:
            raise InputError(
                f"{file}: given twice (also as {seen[key]}): its documents would repeat"
            )
        seen[key] = file
    return out


def _utf8(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(
            f"{where}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1})"
        ) from None


def iter_texts(path: str, kind: str, field: str) -> Iterator[str]:
    """The documents of one input, in order; a bad one: :class:`InputError` naming file and line."""
    reader = {
        "jsonl": _jsonl_texts,
        "jsonl.gz": _jsonl_texts,
        "parquet": _parquet_texts,
        "hf": _hf_texts,
    }.get(kind, _text_file)
    n = 0
    for text in reader(path, kind, field):
        n += 1
        yield text
    if n == 0:
        raise InputError(f"{path}: empty input file (no documents)")


def _jsonl_texts(path: str, kind: str, field: str) -> Iterator[str]:
    opener = gzip.open if kind == "jsonl.gz" else open
    with opener(path, "rb") as f:
        try:
            for line_no, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                where = f"{path}:{line_no}"
                try:
                    doc = json.loads(_utf8(raw, where))
                except json.JSONDecodeError as e:
                    raise InputError(f"{where}: not a JSON line ({e.msg})") from None
                if not isinstance(doc, dict) or field not in doc:
                    raise InputError(f"{where}: no {field!r} field (--text-field)")
                if not isinstance(doc[field], str):
                    raise InputError(f"{where}: {field!r} is {type(doc[field]).__name__}, not text")
                yield doc[field]
        except (OSError, EOFError) as e:  # a truncated or corrupt gzip stream
            raise InputError(f"{path}: unreadable ({' '.join(str(e).split())})") from None


def _parquet_texts(path: str, kind: str, field: str) -> Iterator[str]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # noqa: BLE001 (pyarrow's ArrowInvalid and friends)
        raise InputError(f"{path}: not a parquet file ({' '.join(str(e).split())[:120]})") from None
    _check_column(path, field, pf.schema_arrow.names)
    batches = pf.iter_batches(columns=[field], batch_size=1024)
    yield from _column_texts(path, field, (b.column(0).to_pylist() for b in batches))


def _hf_texts(path: str, kind: str, field: str) -> Iterator[str]:
    try:
        import datasets
    except ImportError:
        raise InputError(
            f"{path}: a Hugging Face datasets folder needs the datasets package"
        ) from None
    ds = datasets.load_from_disk(path)
    _check_column(path, field, ds.column_names)
    batches = ds.select_columns([field]).iter(batch_size=1024)
    yield from _column_texts(path, field, (b[field] for b in batches))


def _check_column(path: str, field: str, names: Sequence[str]) -> None:
    if field not in names:
        raise InputError(f"{path}: no {field!r} column (--text-field; it has {', '.join(names)})")


def _column_texts(path: str, field: str, batches: Iterator[list]) -> Iterator[str]:
    """A table column's values, in batches, each checked to be text (rows numbered from 1)."""
    n = 0
    for batch in batches:
        for text in batch:
            n += 1
            if not isinstance(text, str):
                raise InputError(
                    f"{path}:{n}: row {n}'s {field!r} is {type(text).__name__}, not text"
                )
            yield text


def _text_file(path: str, kind: str, field: str) -> Iterator[str]:
    """A plain text file: one document."""
    raw = Path(path).read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise InputError(
            f"{path}:{line}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})"
        ) from None
    if text:
        yield text


def scan(inputs: Sequence[Tuple[str, str]], field: str) -> List[int]:
    """Documents per input, every document read and checked before anything is written."""
    return [sum(1 for _ in iter_texts(path, kind, field)) for path, kind in inputs]


def _documents(inputs: Sequence[Tuple[str, str]], field: str, skip: int) -> Iterator[str]:
    n = 0
    for path, kind in inputs:
        for text in iter_texts(path, kind, field):
            if n >= skip:
                yield text
            n += 1


# ---- workers -------------------------------------------------------------------------------------

_worker: dict = {}


def _init_worker(tokenizer_file: str, eos: int, bos: Optional[int], dtype: str) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core a worker: the pool is the parallelism
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    from tokenizers import Tokenizer

    _worker.update(tok=Tokenizer.from_file(tokenizer_file), eos=eos, bos=bos, dtype=np.dtype(dtype))


def _encode(texts: List[str]) -> Tuple[np.ndarray, np.ndarray]:
    """(the documents' ids, each [bos] + ids + [eos], concatenated; each document's length)."""
    w = _worker
    encodings = w["tok"].encode_batch(texts, add_special_tokens=False)
    extra = 1 + (w["bos"] is not None)
    lengths = np.fromiter(
        (len(e.ids) + extra for e in encodings), dtype=np.int64, count=len(encodings)
    )
    out = np.empty(int(lengths.sum()), dtype=w["dtype"])
    ends = np.cumsum(lengths)
    starts = ends - lengths
    for enc, start, end in zip(encodings, starts, ends):
        out[start + extra - 1 : end - 1] = enc.ids
    out[ends - 1] = w["eos"]
    if w["bos"] is not None:
        out[starts] = w["bos"]
    return out, lengths


# ---- shards --------------------------------------------------------------------------------------


@dataclass
class _Shard:
    file: str
    tokens: int
    documents: int
    sha256: str
    next_document: int  # the first document of the next shard


class _Writer:
    """Appends documents to the current shard (a temporary file), renaming it when full."""

    def __init__(
        self, out: Path, shard_tokens: int, settings: dict, shards: List[_Shard], first_doc: int
    ):
        self.out, self.shard_tokens = out, shard_tokens
        self.settings, self.shards = settings, shards
        self.doc, self.written = first_doc, 0  # this run's documents and tokens
        self._record()  # first: the folder reads as unfinished from the start
        self._open()

    def _record(self) -> None:
        _write_json(
            self.out / PROGRESS, dict(self.settings, shards=[asdict(s) for s in self.shards])
        )

    def _open(self) -> None:
        self.name = f"part-{len(self.shards):05d}.npy"
        self.tmp = self.out / (self.name + ".tmp")
        self.f = open(self.tmp, "wb")
        self.hash, self.tokens, self.docs = hashlib.sha256(), 0, 0

    def add(self, ids: np.ndarray, lengths: np.ndarray) -> None:
        ends = np.cumsum(lengths)
        start = 0
        while start < len(lengths):
            # documents up to and including the one that brings the shard to shard_tokens
            before = ends[start - 1] if start else 0
            full = np.searchsorted(ends - before, self.shard_tokens - self.tokens)
            stop = min(int(full) + 1, len(lengths))
            chunk = ids[before : ends[stop - 1]].astype(ids.dtype.newbyteorder("<"), copy=False)
            self.f.write(chunk.tobytes())
            self.hash.update(chunk.tobytes())
            self.tokens += len(chunk)
            self.written += len(chunk)
            self.docs += stop - start
            self.doc += stop - start
            start = stop
            if self.tokens >= self.shard_tokens:
                self._close()
                self._open()

    def _close(self) -> None:
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        if self.docs:
            os.replace(self.tmp, self.out / self.name)
            self.shards.append(
                _Shard(self.name, self.tokens, self.docs, self.hash.hexdigest(), self.doc)
            )
            self._record()
        else:
            self.tmp.unlink()

    def finish(self) -> None:
        self._close()


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


def _settings(
    inputs, counts, tokenizer: TokenizerInfo, name: str, field: str, shard_tokens: int
) -> dict:
    return {
        "format_version": FORMAT_VERSION,
        "inputs": [
            {"path": str(Path(p).resolve()), "kind": k, "bytes": _size(p), "documents": n}
            for (p, k), n in zip(inputs, counts)
        ],
        "text_field": field,
        "shard_tokens": shard_tokens,
        "tokenizer": dict(asdict(tokenizer), name=name, file=str(Path(tokenizer.file).resolve())),
        "dtype": tokenizer.dtype.name,
    }


def _size(path: str) -> int:
    p = Path(path)
    return (
        sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        if p.is_dir()
        else p.stat().st_size
    )


def _same_run(old: dict, new: dict) -> List[str]:
    """The settings that differ from the earlier run's in the same folder."""
    keys = ("format_version", "inputs", "text_field", "shard_tokens", "dtype")
    changed = [k for k in keys if old.get(k) != new.get(k)]
    if old.get("tokenizer", {}).get("sha256") != new["tokenizer"]["sha256"]:
        changed.append("tokenizer")
    return changed


def tokenize(
    inputs: Sequence[Tuple[str, str]],
    out: Path,
    tokenizer: TokenizerInfo,
    *,
    name: str,
    field: str = "text",
    shard_tokens: int = 100_000_000,
    workers: int = 1,
    batch_docs: int = 256,
    progress=None,
) -> dict:
    """Tokenize ``inputs`` (:func:`find_inputs`) into ``out``; returns the manifest. Every input is
    read and checked first (:class:`InputError`, nothing written). A folder holding another
    tokenization (other inputs, tokenizer or settings) is refused; one holding this one resumes."""
    counts = scan(inputs, field)
    settings = _settings(inputs, counts, tokenizer, name, field, shard_tokens)
    finished, shards = _earlier_run(out, settings, tokenizer)
    if finished is not None:
        return finished
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.tmp"):  # a shard cut off by a crash: redone from its first document
        stale.unlink()
    first = shards[-1].next_document if shards else 0
    total = sum(counts)
    writer = _Writer(out, shard_tokens, settings, shards, first)
    docs = _documents(inputs, field, first)
    _encode_all(docs, writer, tokenizer, workers, batch_docs, progress, total, first)
    manifest = dict(
        settings,
        files=[
            {"path": s.file, "tokens": s.tokens, "documents": s.documents, "sha256": s.sha256}
            for s in shards
        ],
        tokens=sum(s.tokens for s in shards),
        documents=total,
    )
    _write_json(out / MANIFEST, manifest)
    (out / PROGRESS).unlink()
    return manifest


def _earlier_run(
    out: Path, settings: dict, tokenizer: TokenizerInfo
) -> Tuple[Optional[dict], List[_Shard]]:
    """What ``out`` holds of this tokenization: (its manifest, []) when finished, else (None, the
    shards finished so far, checked against their records); another tokenization is refused."""
    shards: List[_Shard] = []
    for earlier in (out / MANIFEST, out / PROGRESS):
        if earlier.is_file():
            old = json.loads(earlier.read_text())
            if changed := _same_run(old, settings):
                raise InputError(
                    f"{out}: holds another tokenization (changed: {', '.join(changed)}); "
                    "use another --out"
                )
            if earlier.name == MANIFEST:
                return old, []
            shards = [_Shard(**s) for s in old["shards"]]
            break
    for s in shards:  # a finished shard is kept only as it was recorded
        if (
            not (out / s.file).is_file()
            or (out / s.file).stat().st_size != s.tokens * tokenizer.dtype.itemsize
        ):
            raise InputError(
                f"{out / s.file}: not the recorded {s.tokens} tokens; remove {out} and rerun"
            )
    return None, shards


def _encode_all(
    docs: Iterator[str],
    writer: _Writer,
    tokenizer: TokenizerInfo,
    workers: int,
    batch_docs: int,
    progress,
    total: int,
    first: int,
) -> None:
    """Encode ``docs`` over ``workers`` processes and write them in order, then close the shard."""
    task = (
        progress.add_task("tokenizing", total=total, completed=first, tokens=0)
        if progress is not None
        else None
    )
    dtype = tokenizer.dtype.name
    init = (tokenizer.file, tokenizer.eos_token_id, tokenizer.bos_token_id, dtype)
    # fresh workers: no thread of this process (rich's) forked
    ctx = multiprocessing.get_context("spawn")
    if progress is not None:  # a rich Progress, shown once the checks have passed
        progress.start()
    try:
        with ctx.Pool(workers, initializer=_init_worker, initargs=init) as pool:
            pending: deque = deque()  # a bounded window, written in order
            for batch in _batches(docs, batch_docs):
                pending.append(pool.apply_async(_encode, (batch,)))
                if len(pending) >= 2 * workers:
                    _write(writer, pending.popleft().get(), progress, task)
            while pending:
                _write(writer, pending.popleft().get(), progress, task)
        writer.finish()
    finally:
        if progress is not None:
            progress.stop()


def _batches(docs: Iterator[str], n: int) -> Iterator[List[str]]:
    batch: List[str] = []
    for doc in docs:
        batch.append(doc)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


def _write(writer: _Writer, result: Tuple[np.ndarray, np.ndarray], progress, task) -> None:
    ids, lengths = result
    writer.add(ids, lengths)
    if progress is not None:
        progress.update(task, advance=len(lengths), tokens=writer.written)


def read_manifest(path: str) -> Tuple[dict, List[str]]:
    """A manifest (its file, or the folder holding it) and its token files' paths; a missing file or
    one whose size is not its recorded token count raises :class:`InputError`."""
    p = Path(path)
    file = p / MANIFEST if p.is_dir() else p
    if not file.is_file() and (file.parent / PROGRESS).is_file():
        raise InputError(
            f"{file.parent}: an unfinished tokenization ({PROGRESS}, no {MANIFEST}): rerun its "
            "hourglass-tokenize command to finish it"
        )
    if not file.is_file():
        raise InputError(f"{path}: no {MANIFEST} there (hourglass-tokenize writes it last)")
    try:
        manifest = json.loads(file.read_text())
        itemsize = np.dtype(manifest["dtype"]).itemsize
        entries = manifest["files"]
        tokenizer = manifest["tokenizer"]
        assert isinstance(tokenizer["vocab_size"], int) and isinstance(
            tokenizer["eos_token_id"], int
        )
    except (ValueError, KeyError, TypeError, AssertionError) as e:
        raise InputError(f"{file}: not a tokenize manifest ({type(e).__name__}: {e})") from None
    paths = []
    for entry in entries:
        data = file.parent / entry["path"]
        if not data.is_file() or data.stat().st_size != entry["tokens"] * itemsize:
            raise InputError(f"{data}: missing or not the manifest's {entry['tokens']} tokens")
        paths.append(str(data))
    return manifest, paths


def tokenize_folder(entry: str) -> Optional[Path]:
    """The hourglass-tokenize folder that ``entry`` names (the folder or its manifest.json) or lies
    in (one of its files, or a glob of them), finished or not; None for anything else."""
    for folder in (Path(entry), Path(entry).parent):
        if (folder / MANIFEST).is_file() or (folder / PROGRESS).is_file():
            return folder
    return None


def other_tokenizer(
    manifest: dict,
    name: str,
    vocab_size: int,
    eos: int,
    bos: Optional[int],
    tokenizer_file: Optional[str] = None,
) -> Optional[str]:
    """Why ``manifest``'s tokens are not the tokenizer ``name`` (its size and special ids, its
    dtype, the checksum of ``tokenizer_file`` when given), or None."""
    got = manifest["tokenizer"]
    mine, theirs = (
        (vocab_size, eos, bos),
        (got["vocab_size"], got["eos_token_id"], got.get("bos_token_id")),
    )
    if mine != theirs:
        return (
            f"tokenized with {got.get('name')} ({_ids(*theirs)}), "
            f"not the config's {name} ({_ids(*mine)})"
        )
    if manifest["dtype"] != dtype_for(vocab_size).name:
        return f"dtype {manifest['dtype']}, the vocabulary's is {dtype_for(vocab_size).name}"
    if (
        tokenizer_file
        and Path(tokenizer_file).is_file()
        and _sha256(Path(tokenizer_file)) != got["sha256"]
    ):
        return f"tokenized with another tokenizer file than {tokenizer_file}"
    return None


def _ids(vocab: int, eos: int, bos: Optional[int]) -> str:
    return f"{vocab} tokens, eos {eos}" + (f", bos {bos}" if bos is not None else "")
