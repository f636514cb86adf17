#!/usr/bin/env python
"""What it costs to record a checkpoint's integrity: file sizes against a checksum of every byte
(crc32, what safety.write_manifest records; sha256 for comparison), on one file of N MiB written
like a checkpoint shard, measured side by side with the write itself (the save). Prints MiB/s, the
checksum's time as a share of the save's, and both extrapolated to a 1B-parameter checkpoint
(12 bytes a parameter: fp32 weights + AdamW's moments). The run computes the CRCs in a background
thread (safety.ManifestWriter), so the share is disk and CPU time on rank 0, not time the step
waits.

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
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mib", type=int, default=512)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "__0_0.distcp"
        chunks = [os.urandom(CHUNK) for _ in range(args.mib // 16)]
        start = time.perf_counter()
        with open(path, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        save_s = time.perf_counter() - start
        size = path.stat().st_size
        start = time.perf_counter()
        for _ in range(1000):
            path.stat().st_size
        stat_s = (time.perf_counter() - start) / 1000
        crc = [0]
        timings = {
            "crc32 (zlib)": _read(path, lambda b: crc.__setitem__(0, zlib.crc32(b, crc[0]))),
            "sha256": _read(path, hashlib.sha256().update),
        }
    one_b = ONE_B_CHECKPOINT / 2**30
    print(f"{size / 2**20:.0f} MiB file; 1B-param checkpoint: {one_b:.1f} GiB")
    print(
        f"{'save (write + fsync)':28s} {size / save_s / 2**20:10.0f} MiB/s"
        f"   1B: {ONE_B_CHECKPOINT / size * save_s:6.1f} s"
    )
    print(
        f"{'sizes (os.stat, one file)':28s} {stat_s * 1e6:10.1f} us per file (independent of size)"
    )
    for name, seconds in timings.items():
        rate = size / seconds / 2**20
        print(
            f"{name:28s} {rate:10.0f} MiB/s   1B: {ONE_B_CHECKPOINT / size * seconds:6.1f} s"
            f" = {seconds / save_s:.2f} x the save"
        )


if __name__ == "__main__":
    main()
