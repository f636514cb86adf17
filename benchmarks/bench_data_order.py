#!/usr/bin/env python
"""Benchmark the data order: materialize throughput, and the cost of the full permutation.

1. Materialize throughput (MB/s) against a local HTTP server (a separate process, so it
   does not share the GIL with the client), real instance size (4096 uint32 tokens = 16 KiB
   per range request), with 1 and with 8 parallel connections; once as fast as the local
   server answers, once with a simulated 20 ms round trip (a distant server).
2. Time and peak resident memory to build the global order for N instances (default 1e8,
   2.5e8 and 1e9; the real mix is ~1e9), each in a fresh process, exactly as
   ``scripts/data_order.py indices`` does: arange + PCG64 shuffle, then the file written.

    python benchmarks/bench_data_order.py                  # everything
    python benchmarks/bench_data_order.py --skip-order     # throughput only
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from olmo_patches.data.order import OLD_TRAINER_SEED, SEQ_LEN, write_global_indices  # noqa: E402
from olmo_patches.data.prefix import PrefixSpec, materialize  # noqa: E402
from olmo_patches.data.remote import RangeReader, fetch_sizes  # noqa: E402

NUM_FILES = 8
FILE_TOKENS = 4 * 1024 * 1024  # 16 MiB per file


def synthetic_files() -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    return {
        f"mix/part-{i:02d}.npy": rng.integers(0, 100278, FILE_TOKENS, dtype=np.uint32).tobytes()
        for i in range(NUM_FILES)
    }


def serve(latency_s: float) -> None:
    """Child process: serve the synthetic mix, print the base URL, run until stdin closes."""
    from _http_server import FileServer

    with FileServer(synthetic_files(), latency_s=latency_s) as server:
        print(server.base_url, flush=True)
        sys.stdin.read()


def bench_materialize(instances: int, latency_ms: float) -> list[dict]:
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(latency_ms / 1000)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        base = child.stdout.readline().strip()
        names = sorted(synthetic_files())
        paths = tuple(f"{base}/{n}" for n in names)
        reader = RangeReader()
        sizes = tuple(fetch_sizes(paths, reader, progress=False))
        results = []
        for workers in (1, 8):
            spec = PrefixSpec(
                paths, sizes, SEQ_LEN, OLD_TRAINER_SEED, instances, chunk_instances=64
            )
            with tempfile.TemporaryDirectory() as out:
                start = time.perf_counter()
                materialize(Path(out), spec, reader=reader, workers=workers, progress=False)
                seconds = time.perf_counter() - start
            mb = instances * SEQ_LEN * 4 / 1e6
            results.append(
                {
                    "latency_ms": latency_ms,
                    "workers": workers,
                    "MB": round(mb, 1),
                    "seconds": round(seconds, 2),
                    "MB/s": round(mb / seconds, 1),
                }
            )
            print(json.dumps(results[-1]), flush=True)
        return results
    finally:
        child.stdin.close()  # type: ignore[union-attr]
        child.wait(timeout=30)


def order_child(n: int, out_dir: str) -> None:
    """Child process: build the order for n instances and write it; report time and peak RSS."""
    start = time.perf_counter()
    write_global_indices(Path(out_dir) / "global_indices.npy", n, OLD_TRAINER_SEED)
    seconds = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    record = {
        "instances": n,
        "seconds": round(seconds, 1),
        "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),  # steadier on a shared box
        "peak_rss_GiB": round(usage.ru_maxrss * 1024 / 2**30, 2),  # Linux: ru_maxrss in KiB
        "file_GiB": round(n * 4 / 2**30, 2),
    }
    print(json.dumps(record), flush=True)


def bench_order(sizes: list[int]) -> None:
    for n in sizes:
        with tempfile.TemporaryDirectory() as out:
            subprocess.run([sys.executable, __file__, "--order-child", str(n), out], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--serve", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--order-child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument(
        "--instances", type=int, default=8192, help="instances to materialize (16 KiB each)"
    )
    parser.add_argument(
        "--latency-instances", type=int, default=1024, help="the same, at 20 ms latency"
    )
    parser.add_argument(
        "--order-sizes", default="1e8,2.5e8,1e9", help="instance counts for the order benchmark"
    )
    parser.add_argument("--skip-order", action="store_true")
    args = parser.parse_args()
    if args.serve is not None:
        return serve(args.serve)
    if args.order_child:
        return order_child(int(args.order_child[0]), args.order_child[1])
    bench_materialize(args.instances, latency_ms=0)
    bench_materialize(args.latency_instances, latency_ms=20)
    if not args.skip_order:
        bench_order([int(float(s)) for s in args.order_sizes.split(",")])


if __name__ == "__main__":
    main()
