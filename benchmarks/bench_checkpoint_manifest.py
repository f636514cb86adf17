#!/usr/bin/env python
"""What it costs to record a checkpoint's integrity: file sizes (what safety.write_manifest records)
against a checksum of every byte (sha256, crc32), on one file of N MiB written like a checkpoint
shard, read back cold as far as the page cache allows. Prints MiB/s side by side and what each
would take on a 1B-parameter checkpoint (12 bytes a parameter: fp32 weights + AdamW's moments).

    python benchmarks/bench_checkpoint_manifest.py [--mib 512]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
import time
import zlib
from pathlib import Path

CHUNK = 16 * 2**20
ONE_B_CHECKPOINT = 1.2e9 * 12  # bytes


def _read(path: Path, update) -> float:
    start = time.perf_counter()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            update(chunk)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=512)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "__0_0.distcp"
        with open(path, "wb") as f:
            for _ in range(args.mib // 16):
                f.write(os.urandom(CHUNK))
        size = path.stat().st_size
        start = time.perf_counter()
        for _ in range(1000):
            path.stat().st_size
        stat_s = (time.perf_counter() - start) / 1000
        crc = [0]
        timings = {
            "sizes (os.stat, one file)": stat_s,
            "sha256": _read(path, hashlib.sha256().update),
            "crc32": _read(path, lambda b: crc.__setitem__(0, zlib.crc32(b, crc[0]))),
        }
    print(f"{size / 2**20:.0f} MiB file")
    for name, seconds in timings.items():
        if name.startswith("sizes"):
            print(f"{name:28s} {seconds * 1e6:10.1f} us per file (independent of size)")
        else:
            rate = size / seconds / 2**20
            print(f"{name:28s} {rate:10.0f} MiB/s   1B-param checkpoint ({ONE_B_CHECKPOINT / 2**30:.1f} GiB): {ONE_B_CHECKPOINT / (rate * 2**20):.0f} s")


if __name__ == "__main__":
    main()
