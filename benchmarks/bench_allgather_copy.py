#!/usr/bin/env python
"""What FSDP2's all-gather costs after the collective, per placement of a weight: the copy out of
the all-gather buffer into the unsharded weight (torch 2.13,
``_fsdp_collectives.foreach_all_gather_copy_out``).

A dim-0 shard (every matrix, and the hourglass FFN's (K out, in) weights) is copied once, rank by
rank, into the unsharded weight. A shard on dim 1 or 2 (a (K, rows, cols) stack split on rows or
columns, as the hourglass experts' are) is copied into a full-size temporary first, then
chunk-concatenated into the weight: one more full-size allocation and one more full copy. The
benchmark runs those copies on CPU for a weight of the given shape and prints their times and ratios
side by side.

    python benchmarks/bench_allgather_copy.py [--shape 2 2752 3192] [--ranks 8] [--repeats 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def _time(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shape", type=int, nargs=3, default=[2, 2752, 3192], metavar=("K", "ROWS", "COLS")
    )
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    args = parser.parse_args()
    K, rows, cols = args.shape
    W, dtype = args.ranks, getattr(torch, args.dtype)
    torch.manual_seed(0)
    print(
        f"weight (K={K}, {rows}, {cols}) {args.dtype}, {W} ranks, median of {args.repeats},"
        f" {torch.get_num_threads()} threads"
    )
    results = {}
    for dim in (0, 1, 2):
        full = (K * rows, cols) if dim == 0 else (K, rows, cols)
        d = 0 if dim == 0 else dim
        if full[d] % W:
            print(f"dim {dim}: {full[d]} not divisible by {W}, skipped")
            continue
        shard = list(full)
        shard[d] //= W
        n = torch.Size(shard).numel()
        gathered = torch.randn(W, n).to(
            dtype
        )  # the all-gather's output: every rank's shard, rank-major
        weight = torch.empty(full, dtype=dtype)
        temp = torch.empty(full, dtype=dtype)

        def copy_out(out=weight):
            out.view(W, -1).copy_(gathered)  # split_with_sizes_copy: rank r's shard to its place

        def chunk_cat():
            copy_out(temp)  # into the full-size temporary ...
            torch.cat(
                temp.view(W, *shard).unbind(0), dim=d, out=weight
            )  # ... then chunk-cat along dim

        results[dim] = _time(copy_out if dim == 0 else chunk_cat, args.repeats)
        extra = (
            ""
            if dim == 0
            else f", plus a {temp.numel() * temp.element_size() / 2**20:.0f} MiB temporary"
        )
        placement = (
            "(K out, in) rows" if dim == 0 else "stacked " + ("rows" if dim == 1 else "columns")
        )
        print(f"dim {dim} ({placement}): {results[dim] * 1e3:7.2f} ms{extra}")
    if 0 in results:
        print(
            "ratio to dim 0: "
            + "  ".join(f"dim {d} {t / results[0]:.2f}x" for d, t in results.items())
        )


if __name__ == "__main__":
    main()
