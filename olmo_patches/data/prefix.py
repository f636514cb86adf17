"""The ordered prefix on local disk: the first N training instances, fetched by byte range.

Layout of a prefix directory::

    order.npy          the first N global instance ids (standard .npy, uint32)
    part-00000.npy     raw uint32 tokens, ``chunk_instances`` instances in training order
    part-00001.npy     ...
    index.json         what was asked for, and the sha256 of every finished part

Parts are fetched in parallel (one HTTP range request per instance, one connection per
worker), written to a temporary name and renamed once complete and hashed, so a part file
is either whole or absent. ``index.json`` is rewritten after every part: an interrupted run,
restarted with the same arguments, verifies the finished parts and fetches only the rest.

Training reads the parts in file order with shuffling off (``data.source: prefix``, through
``olmo_patches.train``; :func:`prefix_dataset` for direct use); that yields the same batches as
OLMo-core's shuffled loader over the remote files with seed ``OLMO_CORE_SEED``.
"""

from __future__ import annotations

import json
import math
import os
import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
from rich.progress import BarColumn, DownloadColumn, TimeRemainingColumn, TransferSpeedColumn

from .order import (
    TOKEN_BYTES,
    TOKEN_DTYPE,
    DataOrderError,
    Layout,
    rebase,
    sha256_file,
    shuffled_indices,
)
from .remote import RangeReader, progress_bar

INDEX = "index.json"
ORDER = "order.npy"
FORMAT = "hourglass-olmo-prefix-v1"


@dataclass(frozen=True)
class PrefixSpec:
    """Everything that determines a prefix's bytes; stored in index.json and checked on resume."""

    paths: tuple[str, ...]
    sizes: tuple[int, ...]
    seq_len: int
    seed: int  # the old trainer's seed (epoch 0)
    num_instances: int
    chunk_instances: int

    @property
    def num_chunks(self) -> int:
        return math.ceil(self.num_instances / self.chunk_instances)

    @classmethod
    def from_index(cls, index: dict[str, Any]) -> "PrefixSpec":
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in index["spec"].items()})

    def chunk_range(self, k: int) -> tuple[int, int]:
        start = k * self.chunk_instances
        return start, min(start + self.chunk_instances, self.num_instances)


def part_name(k: int) -> str:
    return f"part-{k:05d}.npy"


def instances_for_tokens(tokens: int, seq_len: int, batch_instances: int) -> int:
    """Instances covering ``tokens``, rounded up to whole global batches."""
    batches = math.ceil(tokens / (seq_len * batch_instances))
    return batches * batch_instances


def _read_index(out_dir: Path) -> Optional[dict[str, Any]]:
    path = out_dir / INDEX
    if not path.is_file():
        return None
    try:
        index = json.loads(path.read_text())
    except ValueError:
        raise DataOrderError(
            f"{path} is not valid JSON; delete the prefix directory and start again"
        ) from None
    if index.get("format") != FORMAT:
        raise DataOrderError(f"{path} is not a {FORMAT} index")
    return index


def _write_index(out_dir: Path, index: dict[str, Any]) -> None:
    tmp = out_dir / f".{INDEX}.tmp"
    tmp.write_text(json.dumps(index, indent=1) + "\n")
    os.replace(tmp, out_dir / INDEX)


def _prefix_order(
    out_dir: Path, spec: PrefixSpec, layout: Layout, sha256: Optional[str]
) -> np.ndarray:
    """The first N instance ids: order.npy if it matches its recorded sha256, else built anew."""
    path = out_dir / ORDER
    if sha256 is not None and path.is_file() and sha256_file(path) == sha256:
        return np.load(path)
    full = shuffled_indices(layout.num_instances, spec.seed)
    order = full[: spec.num_instances].copy()
    del full  # keep only the prefix, not the 4 GB permutation
    part = out_dir / f".{ORDER}.tmp.npy"
    np.save(part, order)
    os.replace(part, path)
    return order


def materialize(
    out_dir: Path,
    spec: PrefixSpec,
    *,
    reader: Optional[RangeReader] = None,
    workers: int = 16,
    progress: bool = True,
    base: Optional[str] = None,
) -> dict[str, Any]:
    """Write the first ``spec.num_instances`` instances, in training order, under ``out_dir``.

    Returns the final index. Resumes a previous run with the same spec; a directory made
    with a different spec is an error (nothing there is touched). ``base``: read the listed
    files from this mirror (:func:`~.order.rebase`); the prefix records the listed paths.
    """
    out_dir = Path(out_dir)
    reader = reader or RangeReader()
    sources = rebase(spec.paths, base)
    layout = Layout.from_sizes(spec.paths, spec.sizes, spec.seq_len)
    _check_request(spec, layout)

    out_dir.mkdir(parents=True, exist_ok=True)
    index = _open_index(out_dir, spec)
    order = _prefix_order(out_dir, spec, layout, index.get("order_sha256"))
    index["order_sha256"] = sha256_file(out_dir / ORDER)
    file_idx, token_off = layout.locate(order)
    todo = _parts_to_do(out_dir, spec, index)
    index["complete"] = False
    _write_index(out_dir, index)

    lock = threading.Lock()
    stop = threading.Event()

    def fetch_chunk(k: int, advance: Callable[[int], None]) -> None:
        def read(i: int) -> bytes:
            fi = int(file_idx[i])
            offset = int(token_off[i]) * TOKEN_BYTES
            return reader.read(sources[fi], offset, spec.seq_len * TOKEN_BYTES, spec.sizes[fi])

        record = _write_part(out_dir, spec, k, read, stop, advance)
        if record is not None:
            with lock:
                index["chunks"][part_name(k)] = record
                _write_index(out_dir, index)

    total = sum(spec.chunk_range(k)[1] - spec.chunk_range(k)[0] for k in todo)
    total *= spec.seq_len * TOKEN_BYTES
    _run_parts(todo, fetch_chunk, stop, total, f"{len(todo)} parts -> {out_dir}", progress, workers)
    index["complete"] = True
    _write_index(out_dir, index)
    return index


def _check_request(spec: PrefixSpec, layout: Layout) -> None:
    if spec.num_instances > layout.num_instances:
        raise DataOrderError(
            f"asked for {spec.num_instances} instances, the mix has {layout.num_instances}"
        )
    if spec.num_instances <= 0 or spec.chunk_instances <= 0:
        raise DataOrderError("num_instances and chunk_instances must be positive")


def _write_part(
    out_dir: Path,
    spec: PrefixSpec,
    k: int,
    read: Callable[[int], bytes],
    stop: threading.Event,
    advance: Callable[[int], None],
) -> Optional[dict[str, Any]]:
    """Write part ``k`` (instances ``read(i)`` in order) atomically; its index record, or None
    when ``stop`` was set before it was complete (nothing is left behind)."""
    start, stop_at = spec.chunk_range(k)
    final = out_dir / part_name(k)
    tmp = out_dir / f".{final.name}.tmp"
    try:
        with open(tmp, "wb") as f:
            for i in range(start, stop_at):
                if stop.is_set():
                    return None
                data = read(i)
                f.write(data)
                advance(len(data))
            f.flush()
            os.fsync(f.fileno())
        digest = sha256_file(tmp)
        os.replace(tmp, final)
        return {"start": start, "count": stop_at - start, "sha256": digest}
    finally:
        tmp.unlink(missing_ok=True)


def _open_index(out_dir: Path, spec: PrefixSpec) -> dict[str, Any]:
    """``out_dir``'s index for ``spec`` (a new one written); another spec's: an error."""
    spec_json = json.loads(json.dumps(asdict(spec)))  # tuples -> lists, as stored
    index = _read_index(out_dir)
    if index is None:
        index = {
            "format": FORMAT,
            "spec": spec_json,
            "order_sha256": None,
            "chunks": {},
            "complete": False,
        }
        _write_index(out_dir, index)
    elif index["spec"] != spec_json:
        changed = [k for k in spec_json if index["spec"].get(k) != spec_json[k]]
        raise DataOrderError(
            f"{out_dir} holds a prefix made with different {', '.join(changed)}; use a new "
            "directory"
        )
    return index


def _parts_to_do(out_dir: Path, spec: PrefixSpec, index: dict[str, Any]) -> list[int]:
    """The parts to fetch: a finished one is kept if its bytes match its recorded sha256."""
    todo = []
    for k in range(spec.num_chunks):
        name = part_name(k)
        done = index["chunks"].get(name)
        if done and (out_dir / name).is_file() and sha256_file(out_dir / name) == done["sha256"]:
            continue
        todo.append(k)
    return todo


def _run_parts(
    todo, fetch, stop: threading.Event, total: int, title: str, progress: bool, workers: int
) -> None:
    """``fetch(k, advance)`` for every part ``k`` of ``todo`` on ``workers`` threads, under one
    progress bar of ``total`` bytes; the first error stops the others and is raised."""
    columns = (
        "{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with progress_bar(progress, *columns) as bar:
        task = bar.add_task(title, total=total)

        def advance(n: int) -> None:
            bar.advance(task, n)

        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            futures = [pool.submit(fetch, k, advance) for k in todo]
            try:
                wait(futures, return_when=FIRST_EXCEPTION)
            finally:  # on the first error, or Ctrl-C: running parts stop, queued ones never start
                stop.set()
                for f in futures:
                    f.cancel()
        for f in futures:
            if not f.cancelled() and f.exception() is not None:
                raise f.exception()  # type: ignore[misc]


def verify_prefix(
    out_dir: Path,
    *,
    reader: Optional[RangeReader] = None,
    sample: int = 0,
    base: Optional[str] = None,
) -> list[str]:
    """Problems with a prefix directory (empty list: all good).

    Checks every part's size and sha256 against index.json and, with ``sample`` > 0, compares
    that many randomly chosen instances with the remote files (under the mirror ``base`` if given).
    """
    out_dir = Path(out_dir)
    index = _read_index(out_dir)
    if index is None:
        return [f"{out_dir / INDEX} not found"]
    spec = PrefixSpec.from_index(index)
    problems = [] if index["complete"] else ["materialize did not finish; run it again to resume"]
    for k in range(spec.num_chunks):
        name, (start, stop) = part_name(k), spec.chunk_range(k)
        path = out_dir / name
        entry = index["chunks"].get(name)
        if entry is None or not path.is_file():
            problems.append(f"{name}: missing")
        elif path.stat().st_size != (stop - start) * spec.seq_len * TOKEN_BYTES:
            problems.append(
                f"{name}: {path.stat().st_size} bytes, expected "
                f"{(stop - start) * spec.seq_len * TOKEN_BYTES}"
            )
        elif sha256_file(path) != entry["sha256"]:
            problems.append(f"{name}: sha256 differs from index.json")
    if sample and not problems:
        reader = reader or RangeReader()
        sources = rebase(spec.paths, base)
        layout = Layout.from_sizes(spec.paths, spec.sizes, spec.seq_len)
        order = np.load(out_dir / ORDER)
        picks = np.random.default_rng().choice(
            spec.num_instances, size=min(sample, spec.num_instances), replace=False
        )
        file_idx, token_off = layout.locate(order[picks])
        n = spec.seq_len * TOKEN_BYTES
        for pos, fi, off in zip(picks, file_idx, token_off):
            k, within = divmod(int(pos), spec.chunk_instances)
            with open(out_dir / part_name(k), "rb") as f:
                f.seek(within * n)
                local = f.read(n)
            if local != reader.read(sources[fi], int(off) * TOKEN_BYTES, n, spec.sizes[fi]):
                problems.append(f"instance {pos} (part {k}) differs from {sources[fi]}")
    return problems


def prefix_index(out_dir: Path) -> dict[str, Any]:
    """The index of a finished prefix (one-line error if there is none)."""
    index = _read_index(Path(out_dir))
    if index is None or not index["complete"]:
        raise DataOrderError(
            f"{out_dir} holds no finished prefix (run: scripts/data_order.py materialize)"
        )
    return index


def prefix_paths(out_dir: Path) -> list[str]:
    """The part files of a finished prefix, in training order."""
    spec = PrefixSpec.from_index(prefix_index(Path(out_dir)))
    return [str(Path(out_dir) / part_name(k)) for k in range(spec.num_chunks)]


def prefix_dataset(out_dir: Path, **dataset_kwargs: Any):
    """An OLMo-core ``NumpyFSLDataset`` over a finished prefix, instances in training order.

    Wrap it with ``NumpyDataLoaderBase.wrap_numpy_dataset(..., shuffle=False)``: the prefix is
    already in training order. ``dataset_kwargs`` are the usual ones (pad/eos token ids,
    vocab size); ``sequence_length`` and ``dtype`` come from the prefix.
    """
    from olmo_core.data import NumpyFSLDataset

    seq_len = prefix_index(Path(out_dir))["spec"]["seq_len"]
    return NumpyFSLDataset(
        *prefix_paths(out_dir), sequence_length=seq_len, dtype=TOKEN_DTYPE, **dataset_kwargs
    )
