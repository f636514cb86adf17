#!/usr/bin/env python
"""Data loader throughput: instances/s of one rank's OLMo-core loader, as a run builds it
(olmo_patches.train.OrderedDataLoaderConfig, in order, 4096 uint32 tokens = 16 KiB per instance),
for data.num_workers = 0, 1, 4, 8, reading (a) token files on local disk, as a materialized prefix
is read, and (b) the same files from a loopback HTTP server (a separate process) with an added
round trip per request, as the remote OLMo-2 files are read (one range request per instance).

Workers start with spawn, as under OLMo-core's training environment; their start-up (once per epoch)
is reported apart from the steady rate. The need: an 8-GPU run consumes
    instances/s = 8 x tokens/s per GPU / 4096,  tokens/s per GPU = MFU x peak / FLOPs per token,
with the MFU the dry run assumes (report/plan.py ASSUMED_MFU, 40%), the H100's dense bf16 peak
(launch/cards.py) and the config's FLOPs per token (OLMo-core's count); one rank's loader must
deliver 1/8 of it.

    python benchmarks/bench_loader.py [--batches 16] [--batch 16] [--latency-ms 20] \\
        [--workers 0,1,4,8]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

SEQ = 4096
FILE_INSTANCES = 64


def write_files(folder: Path, instances: int) -> list[Path]:
    rng = np.random.default_rng(0)
    paths = []
    for k in range(-(-instances // FILE_INSTANCES)):
        path = folder / f"part-{k:03d}.npy"
        rng.integers(0, 100_278, FILE_INSTANCES * SEQ, dtype=np.uint32).tofile(path)
        paths.append(path)
    return paths


def serve(folder: str, latency_s: float) -> None:
    """Child process: serve the folder's files, print the base URL, run until stdin closes."""
    from _http_server import FileServer

    files = {p.name: p.read_bytes() for p in sorted(Path(folder).glob("*.npy"))}
    with FileServer(files, latency_s=latency_s) as server:
        print(server.base_url, flush=True)
        sys.stdin.read()


def measure(
    paths: list[str], workers: int, batch: int, batches: int, work: Path
) -> tuple[float, float]:
    """(seconds to the first batch, steady instances/s) for one loader. The steady rate is timed
    over ``batches`` batches after the 2 x workers that the workers read ahead during start-up
    (torch's default prefetch of 2 batches each), so it is the workers' reading rate."""
    from olmo_core.data import NumpyFSLDatasetConfig, TokenizerConfig

    from olmo_patches.train import OrderedDataLoaderConfig

    dataset = NumpyFSLDatasetConfig(
        paths=paths,
        sequence_length=SEQ,
        tokenizer=TokenizerConfig.dolma2(),
        work_dir=str(work),
        dtype="uint32",
    ).build()
    loader = OrderedDataLoaderConfig(
        global_batch_size=batch * SEQ,
        seed=0,
        num_workers=workers,
        shuffle=False,
        work_dir=str(work),
    ).build(dataset)
    loader.reshuffle(epoch=1)
    start = time.perf_counter()
    it = iter(loader)
    next(it)
    first = time.perf_counter()
    for _ in range(2 * workers):
        next(it)
    steady = time.perf_counter()
    for _ in range(batches):
        next(it)
    end = time.perf_counter()
    loader.reset()
    return first - start, batches * batch / (end - steady)


def need() -> dict[str, float]:
    """Instances/s an 8-GPU run of the 113M and 1B baselines consumes (module docstring)."""
    from olmo_patches.launch.layout import load_and_resolve as load_spec
    from olmo_patches.launch.cards import CARDS
    from olmo_patches.report.counts import count
    from olmo_patches.report.plan import ASSUMED_MFU

    out = {}
    for scale in ("113M", "1B"):
        spec = load_spec(REPO / "configs" / scale / "baseline.yaml", ["train.hardware=none"])
        per_gpu = ASSUMED_MFU * CARDS["h100"].bf16_flops / count(spec).flops_per_token
        print(
            f"{scale}: {count(spec).flops_per_token / 1e9:.2f} GFLOP/token -> {per_gpu:,.0f}"
            f" tokens/s per H100 at {ASSUMED_MFU:.0%} MFU -> {8 * per_gpu / SEQ:,.0f} instances/s"
            f" for 8 GPUs, {per_gpu / SEQ:,.0f} per rank"
        )
        out[scale] = per_gpu / SEQ
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument(
        "--batches",
        type=int,
        default=16,
        help="batches timed per measurement, after start-up and read-ahead",
    )
    parser.add_argument(
        "--batch", type=int, default=16, help="instances per batch (one rank's share)"
    )
    parser.add_argument(
        "--latency-ms", type=float, default=20.0, help="added round trip per HTTP request"
    )
    parser.add_argument("--workers", default="0,1,4,8", help="data.num_workers values")
    args = parser.parse_args()
    if args.serve:
        return serve(args.serve[0], float(args.serve[1]))
    mp.set_start_method("spawn", force=True)  # as OLMo-core's prepare_training_environment
    per_rank = need()
    counts = [int(w) for w in args.workers.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "files"
        folder.mkdir()
        files = write_files(folder, (args.batches + 2 * max(counts) + 1) * args.batch)
        child = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(folder), str(args.latency_ms / 1000)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None
            base = child.stdout.readline().strip()
            sources = {
                "local disk": [str(p) for p in files],
                f"HTTP +{args.latency_ms:g} ms": [f"{base}/{p.name}" for p in files],
            }
            print(
                "\n| source | workers | start-up s | instances/s"
                f" | x 113M rank need ({per_rank['113M']:.0f}/s)"
                f" | x 1B rank need ({per_rank['1B']:.0f}/s) |"
            )
            print("|---|---|---|---|---|---|")
            for label, paths in sources.items():
                for w in counts:
                    with tempfile.TemporaryDirectory(dir=tmp) as work:
                        startup, rate = measure(paths, w, args.batch, args.batches, Path(work))
                    print(
                        f"| {label} | {w} | {startup:.1f} | {rate:,.0f}"
                        f" | {rate / per_rank['113M']:.1f} | {rate / per_rank['1B']:.1f} |",
                        flush=True,
                    )
        finally:
            child.stdin.close()  # type: ignore[union-attr]
            child.wait(timeout=30)


if __name__ == "__main__":
    main()
