"""A local HTTP file server with Range support and scripted faults, for offline tests.

Serves in-memory files on 127.0.0.1 from a thread. Faults are set per file name:

- ``missing``: the name answers 404.
- ``fail[name] = n``: the next n GETs answer 500.
- ``drop[name] = n``: the next n GETs announce the full length, send half, and hang up.
- ``short[name] = n``: the next n GETs answer 206 with fewer bytes than asked.
- ``moved``: the name answers 301 (a redirect) to HEAD and GET.
- ``stall[name] = n``: the next n GETs send nothing until ``release`` is set (a server that hangs).

Every request is logged as (method, name, Range header) in ``requests``. ``latency_s``
delays every reply, to stand in for a distant server in benchmarks.
"""

from __future__ import annotations

import re
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional

_RANGE = re.compile(r"bytes=(\d+)-(\d+)")


class FileServer:
    def __init__(self, files: Optional[dict[str, bytes]] = None, latency_s: float = 0.0):
        self.files: dict[str, bytes] = dict(files or {})
        self.latency_s = latency_s
        self.missing: set[str] = set()
        self.moved: set[str] = set()
        self.fail: dict[str, int] = defaultdict(int)
        self.drop: dict[str, int] = defaultdict(int)
        self.short: dict[str, int] = defaultdict(int)
        self.stall: dict[str, int] = defaultdict(int)
        self.release = threading.Event()
        self.requests: list[tuple[str, str, Optional[str]]] = []
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def url(self, name: str) -> str:
        return f"{self.base_url}/{name}"

    def count(self, method: str = "GET") -> int:
        with self._lock:
            return sum(1 for m, _, _ in self.requests if m == method)

    def __enter__(self) -> "FileServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def _take(self, faults: dict[str, int], name: str) -> bool:
        """Consume one scripted fault for ``name``, if any is left."""
        with self._lock:
            if faults[name] > 0:
                faults[name] -= 1
                return True
            return False

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        return type("Handler", (_Handler,), {"owner": self})


class _Handler(BaseHTTPRequestHandler):
    """Answers from ``owner``, the FileServer it is bound to (``_handler``)."""

    owner: FileServer
    protocol_version = "HTTP/1.1"  # keep-alive, as real servers
    disable_nagle_algorithm = True  # headers and body go out in separate writes

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass

    def _lookup(self, method: str) -> Optional[bytes]:
        name = self.path.lstrip("/")
        with self.owner._lock:
            self.owner.requests.append((method, name, self.headers.get("Range")))
        if self.owner.latency_s:
            time.sleep(self.owner.latency_s)
        data = self.owner.files.get(name)
        if data is None or name in self.owner.missing:
            self._reply(404, b"not found")
            return None
        if name in self.owner.moved:
            self._reply(301, b"moved", {"Location": f"/{name}.moved"})
            return None
        return data

    def _reply(
        self, status: int, body: bytes, headers: Optional[dict] = None, send_body=True
    ) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def do_HEAD(self) -> None:
        data = self._lookup("HEAD")
        if data is not None:
            self._reply(200, data, {"Accept-Ranges": "bytes"}, send_body=False)

    def do_GET(self) -> None:
        data = self._lookup("GET")
        if data is None:
            return
        name = self.path.lstrip("/")
        if self.owner._take(self.owner.stall, name):
            self.owner.release.wait()
        if self.owner._take(self.owner.fail, name):
            self._reply(500, b"internal error")
            return
        match = _RANGE.fullmatch(self.headers.get("Range", ""))
        if not match:
            self._reply(200, data)
            return
        start, end = (int(match.group(1)), min(int(match.group(2)), len(data) - 1))
        body = data[start : end + 1]
        if self.owner._take(self.owner.short, name):
            body = body[: len(body) // 2]
            end = start + len(body) - 1
        headers = {"Content-Range": f"bytes {start}-{end}/{len(data)}"}
        if self.owner._take(self.owner.drop, name):
            self.send_response(206)
            self.send_header("Content-Range", headers["Content-Range"])
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self._reply(206, body, headers)
