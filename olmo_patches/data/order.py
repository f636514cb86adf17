"""The exact OLMo-2 1B Stage 1 data order.

The old OLMo trainer (allenai/OLMo, the one OLMo-2 1B was trained with) cuts every token
file into fixed windows of ``seq_len`` tokens, file after file in list order, dropping each
file's remainder; it then shuffles the window indices once:

    indices = arange(N, dtype=uint32)
    Generator(PCG64(seed + epoch)).shuffle(indices)        # epoch 0, seed 6198

and global batch k is ``indices[k*B:(k+1)*B]``. OLMo-core builds the same permutation but
counts epochs from 1, so its loader seed 6197 gives the same order.

This module holds the pinned file list, the permutation (one uint32 array, so the real mix
of ~1e9 instances costs the 4 GB of the permutation and nothing more) and the map from a
global instance to (file, token offset), which needs only the per-file counts.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from ..resources import data_path

DATA_ORDER_DIR = data_path("data_order")  # the checkout's or the installed wheel's
PINNED_LIST = DATA_ORDER_DIR / "olmo2-1b-stage1.txt"
PINNED_MANIFEST = DATA_ORDER_DIR / "olmo2-1b-stage1.sizes.json"
PINNED_ORIGIN = "http://olmo-data.org"  # every pinned path starts here; a mirror keeps what follows

OLD_TRAINER_SEED = 6198  # allenai/OLMo configs/official-0425/OLMo2-1B-stage1.yaml


def olmo_core_seed(old_trainer_seed: int) -> int:
    """OLMo-core's loader seed giving the old trainer's order: both shuffle with PCG64(seed +
    epoch), but OLMo-core's first epoch is 1 and the old trainer's 0."""
    return old_trainer_seed - 1


OLMO_CORE_SEED = olmo_core_seed(OLD_TRAINER_SEED)
SEQ_LEN = 4096
GLOBAL_BATCH_INSTANCES = 512
TOKEN_DTYPE = np.uint32  # dolma2 token files: raw uint32 arrays, no header
TOKEN_BYTES = np.dtype(TOKEN_DTYPE).itemsize

_FILL_BLOCK = 1 << 24  # instances written per step when filling arange into a memmap


class DataOrderError(RuntimeError):
    """A one-line, user-facing error: a changed list, a bad server reply, a stale file."""


def sha256_file(path: Path, block: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def read_paths_file(path: Path) -> list[str]:
    """Read a list of token files (local paths or URLs), one per line.

    Blank lines and ``#`` comments are skipped. If ``<path>.sha256`` exists beside the list
    (``sha256sum`` format), the list must match it.
    """
    path = Path(path)
    if not path.exists() or path.is_dir():  # a device such as /dev/null reads as empty
        raise DataOrderError(f"paths file not found: {path}")
    checksum_file = path.with_name(path.name + ".sha256")
    if checksum_file.is_file():
        expected = checksum_file.read_text().split()[0]
        actual = sha256_file(path)
        if actual != expected:
            raise DataOrderError(
                f"{path} has sha256 {actual}, but {checksum_file.name} pins {expected}: the file "
                "list changed"
            )
    paths = [
        line.strip()
        for line in path.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if not paths:
        raise DataOrderError(f"paths file {path} lists no files")
    return paths


def rebase(paths: Sequence[str], base: Optional[str], origin: str = PINNED_ORIGIN) -> list[str]:
    """The same relative paths under a mirror ``base`` (a local folder, or a URL of any scheme
    OLMo-core's IO reads: http(s), s3, gs, ...) instead of ``origin``; unchanged without one."""
    if base is None:
        return list(paths)
    if "://" not in base:
        base = str(Path(base).resolve())
    base, origin = base.rstrip("/"), origin.rstrip("/") + "/"
    out = []
    for p in paths:
        if not p.startswith(origin):
            raise DataOrderError(f"{p} is not under {origin}: cannot rebase it onto {base}")
        out.append(f"{base}/{p[len(origin) :]}")
    return out


def load_pinned_list(base: Optional[str] = None) -> list[str]:
    """The 1122 OLMo-2 1B Stage 1 files, checked against their pinned sha256; under ``base``."""
    return rebase(read_paths_file(PINNED_LIST), base)


def instance_counts(sizes: Sequence[int], seq_len: int, itemsize: int = TOKEN_BYTES) -> np.ndarray:
    """Instances per file: ``file_bytes // (itemsize * seq_len)``; a file's remainder is dropped."""
    return np.asarray(sizes, dtype=np.int64) // (itemsize * seq_len)


@dataclass(frozen=True)
class Layout:
    """Where each global instance lives: files laid end to end, ``counts[i]`` windows each."""

    paths: tuple[str, ...]
    counts: np.ndarray  # int64, instances per file
    seq_len: int

    @classmethod
    def from_sizes(cls, paths: Sequence[str], sizes: Sequence[int], seq_len: int) -> "Layout":
        if len(paths) != len(sizes):
            raise DataOrderError(f"{len(paths)} paths but {len(sizes)} sizes")
        return cls(tuple(paths), instance_counts(sizes, seq_len), seq_len)

    @property
    def starts(self) -> np.ndarray:
        """First global instance of each file, plus the total at the end (len = files + 1)."""
        return np.concatenate([[0], np.cumsum(self.counts)])

    @property
    def num_instances(self) -> int:
        return int(self.counts.sum())

    def locate(self, instances: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Global instance ids -> (file index, token offset within that file)."""
        instances = np.asarray(instances, dtype=np.int64)
        starts = self.starts
        if instances.size and (instances.min() < 0 or instances.max() >= starts[-1]):
            raise DataOrderError(f"instance id out of range [0, {starts[-1]})")
        # 'right' skips files with zero instances, whose start equals the next file's start.
        file_idx = np.searchsorted(starts, instances, side="right") - 1
        return file_idx, (instances - starts[file_idx]) * self.seq_len


def shuffled_indices(num_instances: int, seed: int, epoch: int = 0) -> np.ndarray:
    """``arange(N, uint32)`` shuffled by ``PCG64(seed + epoch)``, as the old trainer does.

    Built in place in one uint32 array (4 bytes per instance, 4 GB for the real mix): the
    arange is filled block by block, so no second copy ever exists. The shuffle runs in
    anonymous memory on purpose: shuffling inside a file-backed memmap turns into random
    disk writes (dirty-page writeback) and was >10x slower at 1e9 instances.
    """
    if num_instances >= np.iinfo(np.uint32).max:
        raise DataOrderError(f"{num_instances} instances do not fit the trainers' uint32 indices")
    out = np.empty(num_instances, dtype=np.uint32)
    for start in range(0, num_instances, _FILL_BLOCK):
        stop = min(start + _FILL_BLOCK, num_instances)
        out[start:stop] = np.arange(start, stop, dtype=np.uint32)
    np.random.Generator(np.random.PCG64(seed + epoch)).shuffle(out)
    return out


def write_global_indices(
    out: Path,
    num_instances: int,
    seed: int,
    *,
    epoch: int = 0,
    world_size: int = 1,
    npy_header: bool = False,
) -> int:
    """Write the order to ``out`` exactly as the old trainer writes ``global_indices.npy``.

    The old trainer writes a raw uint32 array (``np.memmap``, no .npy header, despite the name)
    and, with ``drop_last`` (set in the OLMo-2 configs), keeps the first
    ``(N // world_size) * world_size`` entries. ``npy_header=True`` writes a standard .npy
    (``np.load``-able) instead. Written sequentially to a temporary name and renamed, so the
    file is whole or absent; returns the number of entries written.
    """
    out = Path(out)
    total = (num_instances // world_size) * world_size
    indices = shuffled_indices(num_instances, seed, epoch)[:total]  # a view, not a copy
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            if npy_header:
                np.lib.format.write_array(f, indices, allow_pickle=False)
            else:
                indices.tofile(f)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return total
