"""What a run's data must agree with before anything is written: every id of every local token file
below the vocabulary (a full scan, cached), every HTTP(S) token file answering, a tokenizer file
that is a tokenizers JSON. numpy and the standard library only: no torch.

The scan is a vectorised max over a memory map, ``CHUNK_TOKENS`` at a time (a file of any size is
never loaded whole), about the speed of reading the file (benchmarks/bench_token_scan.py). Its
result is kept in ``CACHE`` in the run's ``data.work_dir``, keyed by the file's resolved path, size
and modification time: a rerun reads no token file again, and a rewritten file is scanned again.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence
from urllib.error import HTTPError, URLError
from urllib.request import Request, urlopen

import numpy as np

__all__ = ["CACHE", "TokenMax", "max_token", "unreachable", "tokenizer_vocab"]

CACHE = (
    "token-max.json"  # in data.work_dir: {resolved path: {size, mtime_ns, dtype, max, position}}
)
CHUNK_TOKENS = 1 << 24  # tokens per vectorised max (64 MiB of uint32): memory stays flat
SHOW_PROGRESS_BYTES = 1 << 30  # a scan reading more than this shows a progress bar
HEAD_TIMEOUT_S = 3.0  # one HEAD per URL; a server silent this long is named as unreachable
HEAD_WORKERS = (
    32  # HEADs in flight at once (a mix of thousands of files: about 1 s per 1,000 at 30 ms)
)


@dataclass(frozen=True)
class TokenMax:
    """A token file's largest id and the first position (in tokens) holding it (-1, -1: empty)."""

    max: int
    position: int


def _key(path: Path, dtype: np.dtype) -> tuple[str, dict]:
    st = path.stat()
    return str(path.resolve()), {
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "dtype": dtype.name,
    }


def _read_cache(cache: Optional[Path]) -> dict:
    try:
        entries = json.loads(cache.read_text()) if cache is not None else {}
        return entries if isinstance(entries, dict) else {}
    except (OSError, ValueError):  # none yet, or unreadable: scanned again
        return {}


def _write_cache(cache: Optional[Path], entries: dict) -> None:
    """Written whole under a temporary name (a concurrent run reads the old or the new file), into a
    work folder that exists: a check makes no folder (the run makes it, and its next start caches);
    a folder that cannot be written only costs the next run its scan."""
    if cache is None or not cache.parent.is_dir():
        return
    try:
        tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(entries, indent=0) + "\n")
        os.replace(tmp, cache)
    except OSError:
        pass


def scan(path: Path, dtype: np.dtype, advance: Callable[[int], None] = lambda n: None) -> TokenMax:
    """The largest id of ``path`` read as whole ``dtype`` tokens, chunk by chunk."""
    n = path.stat().st_size // dtype.itemsize
    if n == 0:
        return TokenMax(-1, -1)
    tokens = np.memmap(path, dtype=dtype, mode="r", shape=(n,))
    best, where = -1, -1
    for start in range(0, n, CHUNK_TOKENS):
        chunk = tokens[start : start + CHUNK_TOKENS]
        top = int(chunk.max())
        if top > best:  # the first position of the largest id
            best, where = top, start + int(np.argmax(chunk))
        advance(len(chunk) * dtype.itemsize)
    del tokens
    return TokenMax(best, where)


def max_token(
    paths: Sequence[str], dtype: np.dtype, cache_dir: Optional[Path]
) -> dict[str, TokenMax]:
    """Each local token file's largest id, from the cache in ``cache_dir`` where the file's size and
    modification time match, else scanned (a rich progress bar when the scans read over 1 GiB)."""
    cache = cache_dir / CACHE if cache_dir is not None else None
    entries = _read_cache(cache)
    found: dict[str, TokenMax] = {}
    todo: list[tuple[str, Path, str, dict]] = []
    for p in paths:
        key, stamp = _key(Path(p), dtype)
        if (hit := entries.get(key)) and all(hit.get(k) == v for k, v in stamp.items()):
            found[p] = TokenMax(hit["max"], hit["position"])
        else:
            todo.append((p, Path(p), key, stamp))
    if not todo:
        return found
    total = sum(stamp["size"] for *_, stamp in todo)
    with _Progress(total) as advance:
        for p, path, key, stamp in todo:
            found[p] = result = scan(path, dtype, advance)
            entries[key] = dict(stamp, max=result.max, position=result.position)
    _write_cache(cache, entries)
    return found


class _Progress:
    """``advance(bytes)`` of a rich progress bar on stderr for a long scan; no-op for short ones."""

    def __init__(self, total: int):
        self.total, self.bar = total, None

    def __enter__(self) -> Callable[[int], None]:
        if self.total < SHOW_PROGRESS_BYTES:
            return lambda n: None
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TransferSpeedColumn,
        )

        columns = (TextColumn("token ids"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
        self.bar = Progress(*columns, console=Console(stderr=True), transient=True)
        self.bar.start()
        task = self.bar.add_task("scan", total=self.total)
        return lambda n: self.bar.advance(task, n)  # type: ignore[union-attr]

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()


def _head(url: str, timeout: float) -> Optional[str]:
    """Why ``url`` does not answer a HEAD with 2xx (after redirects), or None."""
    try:
        with urlopen(Request(url, method="HEAD"), timeout=timeout):
            return None
    except HTTPError as e:
        return f"HTTP {e.code} {e.reason}"
    except URLError as e:
        reason = e.reason
        if isinstance(reason, OSError) and reason.strerror:
            reason = reason.strerror
        return f"unreachable ({reason})"
    except (OSError, ValueError) as e:  # a timeout mid-reply, a malformed URL
        return f"unreachable ({type(e).__name__}: {' '.join(str(e).split()) or 'no answer'})"


def unreachable(urls: Sequence[str], timeout: float = HEAD_TIMEOUT_S) -> Optional[tuple[str, str]]:
    """The first (in the given order) HTTP(S) URL of ``urls`` that does not answer, and why; None
    when every one does. One HEAD each, ``HEAD_WORKERS`` at a time; other schemes (s3, gs, r2, weka)
    are not checked here (OLMo-core's clients need their credentials)."""
    http = [u for u in dict.fromkeys(urls) if u.startswith(("http://", "https://"))]
    if not http:
        return None
    with ThreadPoolExecutor(min(HEAD_WORKERS, len(http))) as pool:
        for url, why in zip(http, pool.map(lambda u: _head(u, timeout), http)):
            if why is not None:
                pool.shutdown(wait=False, cancel_futures=True)  # the rest are not waited for
                return url, why
    return None


def tokenizer_vocab(path: str) -> int:
    """The number of ids of a tokenizers JSON file (its model's vocabulary and added tokens), read
    as JSON; a ValueError in one line when it is not one."""
    try:
        data = json.loads(Path(path).read_bytes())
    except UnicodeDecodeError:
        raise ValueError("not a tokenizers JSON file (not UTF-8 text)") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"not a tokenizers JSON file (line {e.lineno}: {e.msg})") from None
    model = data.get("model") if isinstance(data, dict) else None
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if not isinstance(vocab, (dict, list)):
        raise ValueError(
            "not a tokenizers JSON file (no model.vocab: save it with tokenizers' Tokenizer.save)"
        )
    ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab)))
    ids += [t.get("id", -1) for t in data.get("added_tokens") or [] if isinstance(t, dict)]
    if not all(isinstance(i, int) for i in ids):
        raise ValueError("not a tokenizers JSON file (a token id that is not an integer)")
    return max(ids, default=-1) + 1
