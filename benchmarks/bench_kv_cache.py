#!/usr/bin/env python
"""KV-cache memory and cached generation speed of the exported Hugging Face models, side by side in
one run: the variable-width x shape and the hourglass against the constant-width baseline, at demo
scale on CPU. The comparison is at equal size: each shape matched to the baseline's parameters, as
paper 2's equal-size rows (mean width, hence KV cache per token, 10-11% below the baseline's at
200M-2B). The abstract's "15% less KV-cache memory and I/O" is a matched-loss figure: the x family's
fit of loss on mean width reaches the 2B baseline's loss at 85.1% of its mean width
(olmo_patches/report/scaling.py, ``paper_matched_loss``); an equal-size pair does not measure it.

Each config's OLMo-core model (seeded init; neither measure depends on the weights) goes through the
custom-code export (olmo_patches/export/hf.py ``custom_model``, the same modeling file for every
shape) and generates greedily with transformers' KV cache (``DynamicCache``) from a random prompt.
Measured: the bytes of the cache's key and value tensors at the end, against
batch x cached tokens x K and V elements per token x bytes per element from OLMo-core's count
(``count_params.py --json``'s kv_cache_per_token), and new tokens per second, median over --repeats
rounds that visit the shapes in turn.

    python benchmarks/bench_kv_cache.py [--batch 4] [--prompt 64] [--new 64] [--repeats 3] \\
        [--dtype fp32]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CONFIGS = {
    "baseline": "configs/demo/baseline.yaml",
    "x": "configs/demo/variable-width.yaml",
    "hourglass": "configs/demo/hourglass.yaml",
}
# paper 2's 2B row: x's mean width (KV cache per token) vs the baseline's, equal size
PAPER_EQUAL_SIZE = -0.109
# paper 2: x's mean width at the 2B baseline's loss, fitted per family (the abstract's 15%)
PAPER_MATCHED_LOSS = 0.851


def exported(config: str, dtype: torch.dtype):
    from olmo_patches.config import load_spec, vocab_size
    from olmo_patches.export.hf import custom_model
    from olmo_patches.report.counts import count

    spec = load_spec(REPO / config)
    built = spec.model.build(vocab_size(spec))
    built.init_seed = 0
    model = built.build(init_device="meta")
    model.init_weights(device=torch.device("cpu"), max_seq_len=spec.data.sequence_length)
    hf = custom_model(spec, model.state_dict()).to(dtype).eval()
    return hf, count(spec).kv_cache_per_token


def cache_bytes(cache) -> int:
    return sum(
        t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
    )


def generate(hf, prompt: torch.Tensor, new: int):
    """(seconds, the cache) for ``new`` greedy tokens with the cache on (no early stop at eos)."""
    start = time.perf_counter()
    with torch.no_grad():
        out = hf.generate(
            prompt,
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            use_cache=True,
            return_dict_in_generate=True,
            eos_token_id=None,
            pad_token_id=0,
        )
    return time.perf_counter() - start, out.past_key_values


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens")
    parser.add_argument(
        "--new",
        type=int,
        default=64,
        help="generated tokens (prompt + new within the demo's 128-token context)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--dtype",
        choices=("bf16", "fp32"),
        default="fp32",
        help="fp32: CPU bf16 matmuls are slow; the bytes halve at bf16",
    )
    return parser.parse_args()


def main() -> None:
    args = _parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    torch.manual_seed(0)
    models = {name: exported(path, dtype) for name, path in CONFIGS.items()}
    prompt = torch.randint(1, models["baseline"][0].config.vocab_size, (args.batch, args.prompt))
    for hf, _ in models.values():  # warm-up
        generate(hf, prompt[:, :8], 2)
    times: dict[str, list[float]] = {name: [] for name in models}
    caches: dict[str, int] = {}
    for _ in range(args.repeats):
        for name, (hf, _) in models.items():
            seconds, cache = generate(hf, prompt, args.new)
            times[name].append(seconds)
            caches[name] = cache_bytes(cache)
    tokens = args.prompt + args.new - 1  # the last generated token is never fed back: not cached
    base_bytes = caches["baseline"]
    base_rate = args.batch * args.new / statistics.median(times["baseline"])
    print(
        f"KV cache and cached generation, demo scale, CPU ({torch.get_num_threads()} threads),"
        f" {args.dtype}, batch {args.batch}, {args.prompt} prompt + {args.new} new tokens,"
        f" median of {args.repeats}"
    )
    print(
        f"{'shape':10} {'K+V per token (count)':>22} {'cache MiB':>10} {'= count':>8}"
        f" {'vs baseline':>12} {'new tokens/s':>13} {'vs baseline':>12}"
    )
    for name, (hf, per_token) in models.items():
        counted = args.batch * tokens * per_token * (2 if dtype == torch.bfloat16 else 4)
        rate = args.batch * args.new / statistics.median(times[name])
        print(
            f"{name:10} {per_token:>22,} {caches[name] / 2**20:>10.2f}"
            f" {str(caches[name] == counted):>8} "
            f"{caches[name] / base_bytes - 1:>+12.1%} {rate:>13.1f} {rate / base_rate:>11.2f}x"
        )
    print(
        f"equal size (this table): paper 2's x caches {PAPER_EQUAL_SIZE:+.1%} vs its baseline"
        " at 2B (-10.0% to -11.0% at 200M-2B); at matched loss (not measured here)"
        f" {PAPER_MATCHED_LOSS - 1:+.1%} (the abstract's 15%)"
    )


if __name__ == "__main__":
    main()
