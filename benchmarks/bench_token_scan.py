"""The token-id check's full scan (olmo_patches/data/contract.py) against reading the same bytes,
side by side, and the cached rerun.

    python benchmarks/bench_token_scan.py [--megabytes 1024] [--repeats 3] [--dir DIR]

A file of random uint32 ids (--megabytes of them) is written once under --dir (default: the system's
temporary folder) and removed at the end. Two references: reading the file in the scan's chunk size
into one reused buffer (``readinto``: a copy of every byte, no arithmetic), and the naive check,
``np.fromfile(path).max()`` (the whole file in memory at once). The scan is ``max_token`` without a
cache (memory map, vectorised max per chunk, first position of the largest id). All run with the
file in the page cache (each is run once before timing). Printed: MB/s of each (the best of
--repeats), the ratios, and the rerun through the cache (size and mtime read, no token read).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from olmo_patches.data import contract  # noqa: E402


def _read(path: Path) -> None:
    buf = bytearray(contract.CHUNK_TOKENS * 4)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def _best(fn, repeats: int) -> float:
    fn()  # the page cache warmed, imports done
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--megabytes", type=float, default=1024, help="size of the token file (MB, 10^6 bytes)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="where the file is written (default: the temp folder)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path, cache = Path(tmp) / "tokens.npy", Path(tmp) / "work"
        n = int(args.megabytes * 1e6) // 4
        rng = np.random.default_rng(0)
        with open(path, "wb") as f:
            for start in range(0, n, contract.CHUNK_TOKENS):
                f.write(
                    rng.integers(
                        0, 100_278, min(contract.CHUNK_TOKENS, n - start), dtype=np.uint32
                    ).tobytes()
                )
        size_mb = path.stat().st_size / 1e6
        dtype = np.dtype(np.uint32)
        read_s = _best(lambda: _read(path), args.repeats)
        naive_s = _best(lambda: int(np.fromfile(path, dtype=dtype).max()), args.repeats)
        scan_s = _best(lambda: contract.max_token([str(path)], dtype, None), args.repeats)
        contract.max_token([str(path)], dtype, cache)  # the cache written
        cached_s = _best(lambda: contract.max_token([str(path)], dtype, cache), args.repeats)
        print(f"token file: {size_mb:,.0f} MB of uint32 ids")
        print(
            f"read (readinto, {contract.CHUNK_TOKENS * 4 >> 20} MiB blocks):"
            f" {size_mb / read_s:,.0f} MB/s ({read_s:.3f} s)"
        )
        print(f"scan (max_token, no cache):      {size_mb / scan_s:,.0f} MB/s ({scan_s:.3f} s)")
        print(f"np.fromfile(...).max():          {size_mb / naive_s:,.0f} MB/s ({naive_s:.3f} s)")
        print(
            f"scan time / read time: {scan_s / read_s:.2f}x;"
            f" scan time / np.fromfile max time: {scan_s / naive_s:.2f}x"
        )
        print(
            f"cached rerun: {cached_s * 1e3:.2f} ms"
            f" ({scan_s / cached_s:,.0f}x faster than the scan)"
        )


if __name__ == "__main__":
    main()
