"""Reading token files by byte range: HTTP(S) with retries and timeouts, or local disk.

Standard library only (``http.client``): one keep-alive connection per thread and host.
A reply is retried on connection errors, timeouts, 5xx and short bodies; a 4xx is final.
Every failure ends in a one-line :class:`DataOrderError` naming the URL and what went wrong.
Other URL schemes (s3://, gs://, ...) go through ``olmo_core.io``.

Why not ``olmo_core.io.get_bytes_range`` for HTTP too (OLMo-core 3.0.0, tests/test_remote_reads.py):
it retries a dropped connection, but a 5xx other than 502 or a short 206 body ends the read at the
first reply, and its requests carry no timeout (requests' default: wait forever), so a server that
stops answering holds a read (and the prefix build waiting on it) for good.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence
from urllib.parse import urlsplit

from rich.console import Console
from rich.progress import Progress, ProgressColumn

from .order import DataOrderError

_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_RETRYABLE = (OSError, http.client.HTTPException)  # resets, timeouts, dropped bodies


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5
    backoff_s: float = 1.0  # doubles after every failed attempt
    timeout_s: float = 60.0


class _Retry(Exception):
    """A reply worth another attempt (5xx, short body)."""


def is_http(path: str) -> bool:
    return path.startswith(("http://", "https://"))


def _is_other_url(path: str) -> bool:
    return "://" in path and not is_http(path) and not path.startswith("file://")


def _local(path: str) -> str:
    return path[len("file://") :] if path.startswith("file://") else path


class RangeReader:
    """Sizes and byte ranges of local files and URLs; safe to share between threads."""

    def __init__(self, retry: RetryPolicy = RetryPolicy()):
        self.retry = retry
        self._tls = threading.local()

    # -- public API -----------------------------------------------------------------------

    def size(self, path: str) -> int:
        if is_http(path):
            status, headers, _ = self._http(path, "HEAD", {})
            if status != 200:  # e.g. a redirect: its Content-Length is not the file's
                raise DataOrderError(f"HEAD {path}: HTTP {status}, expected 200")
            if "content-length" not in headers:
                raise DataOrderError(f"HEAD {path}: no Content-Length in the reply")
            return int(headers["content-length"])
        if _is_other_url(path):
            from olmo_core.io import get_file_size

            return get_file_size(path)
        try:
            return os.stat(_local(path)).st_size
        except FileNotFoundError:
            raise DataOrderError(f"token file not found: {path}") from None

    def read(self, path: str, start: int, length: int, expect_size: Optional[int] = None) -> bytes:
        """Bytes ``[start, start + length)`` of ``path``; exactly ``length`` of them or an error.

        ``expect_size`` is the file's size from the manifest: a file that has since changed
        size is an error, not a silent shift of every later instance.
        """
        if is_http(path):
            return self._http_range(path, start, length, expect_size)
        if _is_other_url(path):
            from olmo_core.io import get_bytes_range, get_file_size

            # before the read
            if expect_size is not None and (actual := get_file_size(path)) != expect_size:
                raise DataOrderError(f"{path} is {actual} bytes, the manifest says {expect_size}")
            data = get_bytes_range(path, start, length)
        else:
            local = _local(path)
            try:
                if expect_size is not None and (actual := os.stat(local).st_size) != expect_size:
                    raise DataOrderError(
                        f"{path} is {actual} bytes, the manifest says {expect_size}"
                    )
                with open(local, "rb") as f:
                    f.seek(start)
                    data = f.read(length)
            except FileNotFoundError:
                raise DataOrderError(f"token file not found: {path}") from None
        if len(data) != length:
            raise DataOrderError(f"{path}: got {len(data)} of {length} bytes at offset {start}")
        return data

    # -- HTTP ------------------------------------------------------------------------------

    def _http_range(self, url: str, start: int, length: int, expect_size: Optional[int]) -> bytes:
        def check(status: int, headers: dict[str, str], body: bytes) -> None:
            # A 200 would be the whole file: the server ignored the range.
            if status != 206:
                raise DataOrderError(
                    f"GET {url} bytes={start}-{start + length - 1}: HTTP {status}, expected 206"
                )
            match = _CONTENT_RANGE.fullmatch(headers.get("content-range", ""))
            total = match.group(3) if match else None
            if expect_size is not None and total not in (None, "*") and int(total) != expect_size:
                raise DataOrderError(
                    f"{url} is {total} bytes, the manifest says {expect_size}: rebuild the manifest"
                )
            if len(body) != length:
                raise _Retry(f"got {len(body)} of {length} bytes at offset {start}")

        headers = {"Range": f"bytes={start}-{start + length - 1}"}
        return self._http(url, "GET", headers, check)[2]

    def _http(self, url: str, method: str, headers: dict[str, str], check=None):
        """One request with retries; returns (status, lower-cased headers, body)."""
        last = ""
        for attempt in range(self.retry.attempts):
            if attempt:
                time.sleep(self.retry.backoff_s * 2 ** (attempt - 1))
            try:
                status, reply_headers, body = self._send(url, method, headers)
                if status == 404:
                    raise DataOrderError(f"{method} {url}: HTTP 404 not found")
                if 400 <= status < 500 and status != 429:
                    raise DataOrderError(f"{method} {url}: HTTP {status}")
                if status >= 500 or status == 429:
                    raise _Retry(f"HTTP {status}")
                if check is not None:
                    check(status, reply_headers, body)
                return status, reply_headers, body
            except _Retry as exc:
                last = str(exc)
                self._drop_connection(url)
            except _RETRYABLE as exc:
                last = f"{type(exc).__name__}: {exc}"
                self._drop_connection(url)
        raise DataOrderError(
            f"{method} {url} failed after {self.retry.attempts} attempts, last: {last}"
        )

    def _send(self, url: str, method: str, headers: dict[str, str]):
        parts = urlsplit(url)
        conn = self._connection(parts.scheme, parts.netloc)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        conn.request(method, target, headers=headers)
        resp = conn.getresponse()
        body = resp.read()  # raises IncompleteRead if the connection drops mid-body
        reply_headers = {k.lower(): v for k, v in resp.getheaders()}
        if resp.will_close:
            self._drop_connection(url)
        return resp.status, reply_headers, body

    def _connection(self, scheme: str, netloc: str) -> http.client.HTTPConnection:
        pool: dict = self._tls.__dict__.setdefault("pool", {})
        key = (scheme, netloc)
        if key not in pool:
            cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
            pool[key] = cls(netloc, timeout=self.retry.timeout_s)
        return pool[key]

    def _drop_connection(self, url: str) -> None:
        parts = urlsplit(url)
        conn = self._tls.__dict__.get("pool", {}).pop((parts.scheme, parts.netloc), None)
        if conn is not None:
            conn.close()


def progress_bar(enabled: bool, *columns: str | ProgressColumn) -> Progress:
    """A rich progress bar; when disabled it prints nothing at all (not even a newline)."""
    return Progress(*columns, disable=not enabled, console=None if enabled else Console(quiet=True))


# -- the size manifest -------------------------------------------------------------------


def fetch_sizes(
    paths: Sequence[str], reader: RangeReader, workers: int = 32, progress: bool = True
) -> list[int]:
    """Byte size of every file (HEAD for URLs), in parallel; duplicates are asked once."""
    unique = list(dict.fromkeys(paths))
    with progress_bar(progress) as bar:
        task = bar.add_task("sizes", total=len(unique))

        def one(path: str) -> int:
            size = reader.size(path)
            bar.advance(task)
            return size

        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(one, p) for p in unique]
            try:
                sizes = {p: f.result() for p, f in zip(unique, futures)}
            except BaseException:  # first failure: drop the queued requests, not wait for them
                pool.shutdown(wait=False, cancel_futures=True)
                raise
    return [sizes[p] for p in paths]


def save_manifest(path: Path, paths: Sequence[str], sizes: Sequence[int]) -> None:
    """Write ``{"files": [[path, size], ...]}`` atomically."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(
        json.dumps({"files": [[p, int(s)] for p, s in zip(paths, sizes)]}, indent=0) + "\n"
    )
    os.replace(tmp, path)


def load_manifest(path: Path, paths: Sequence[str]) -> list[int]:
    """Sizes from a manifest, which must list exactly ``paths`` in the same order."""
    path = Path(path)
    if not path.is_file():
        raise DataOrderError(f"manifest not found: {path} (run: scripts/data_order.py manifest)")
    try:
        files = json.loads(path.read_text())["files"]
    except (ValueError, KeyError) as exc:
        raise DataOrderError(f"manifest {path} is not a valid manifest ({exc})") from None
    listed = [f[0] for f in files]
    if listed != list(paths):
        first = next(
            (i for i, (a, b) in enumerate(zip(listed, paths)) if a != b),
            min(len(listed), len(paths)),
        )
        raise DataOrderError(
            f"manifest {path} does not match the file list (first difference at entry {first}): "
            "rebuild it"
        )
    return [int(f[1]) for f in files]
