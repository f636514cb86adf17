"""Training throughput (forward + backward), peak memory and MFU of parameter-matched variants;
with --generate, their generation speed (prefill and decode tokens/s) through the HF export.

    python scripts/bench.py [--scale demo,113M] [--compile on,off] [--repeats 5] [--steps 2]
                            [--optimizer] [--json]
    python scripts/bench.py --generate [--scale 113M,1B] [--batches 1,64] [--prompt 512] [--new 128]

Variants of a scale run interleaved (a rotated order per repeat) and every ratio is to the baseline
measured in the same run. Defaults: on a CPU the demo scale, fp32; on a GPU the 113M and 1B shapes
at their configs' sequence length (4096) in bf16. See docs/performance.md and
olmo_patches/train/bench.py.
"""

import argparse
import json
import sys

from olmo_patches.cli import ArgumentParser, at_least, refuse
from olmo_patches.config.bench_scales import SCALES


def _list(s: str) -> list:
    return [x for x in s.split(",") if x]


def _parser() -> argparse.ArgumentParser:
    """The command line: what is timed and how (read before torch is imported: the defaults that
    depend on a GPU are filled after)."""
    parser = ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--scale",
        default=None,
        help=f"comma list of {', '.join(SCALES)} (default: 113M,1B on a GPU, else demo)",
    )
    parser.add_argument(
        "--variants",
        default=None,
        help="comma list (default: all of the scale's; baseline always runs)",
    )
    parser.add_argument(
        "--compile", default="off,on", help="comma list of off|on (torch.compile per block)"
    )
    parser.add_argument(
        "--seq",
        type=at_least(2),
        default=None,
        help="sequence length (default: the scale's; 4096 on a GPU)",
    )
    parser.add_argument(
        "--batch", type=at_least(1), default=None, help="sequences per step (default: the scale's)"
    )
    _timing_args(parser)
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object instead of the table"
    )
    gen = parser.add_argument_group("--generate (olmo_patches/export/generation.py)")
    gen.add_argument(
        "--generate",
        action="store_true",
        help="generation speed of the scale's first three variants (baseline, hourglass, variable "
        "width) through the HF export, static KV cache, decode compiled (--compile off: eager)",
    )
    gen.add_argument("--batches", default="1,64", help="comma list of batch sizes (1,64)")
    gen.add_argument(
        "--prompt", type=at_least(1), default=None, help="prompt tokens (512 on a GPU, else 64)"
    )
    gen.add_argument(
        "--new", type=at_least(2), default=None, help="new tokens (128 on a GPU, else 32)"
    )
    return parser


def _timing_args(parser: ArgumentParser) -> None:
    """How each variant is timed: repeats, steps, precision, threads, optimizer, float8."""
    parser.add_argument(
        "--repeats",
        type=at_least(1),
        default=None,
        help="interleaved repeats (median): 10, with --generate 3",
    )
    parser.add_argument(
        "--steps", type=at_least(1), default=1, help="timed steps per variant per repeat"
    )
    parser.add_argument(
        "--warmup",
        type=at_least(0),
        default=2,
        help="untimed steps per variant (compilation happens here)",
    )
    parser.add_argument(
        "--dtype", default=None, choices=["fp32", "bf16"], help="default: bf16 on a GPU, else fp32"
    )
    parser.add_argument(
        "--threads",
        type=at_least(1),
        default=None,
        help="CPU threads (default 1: on a shared machine, OpenMP threads that wait on each other "
        "made steps up to 10x slower and the timings meaningless)",
    )
    parser.add_argument(
        "--optimizer",
        action="store_true",
        help="an AdamW step in every timed step (as the trainer's)",
    )
    parser.add_argument(
        "--float8",
        nargs="?",
        const="tensorwise",
        default=None,
        help="also time each variant with train.float8=RECIPE (default tensorwise; emulated "
        "without float8 matmuls)",
    )


def main() -> None:
    args = _parser().parse_args()
    for s in _list(args.scale or ""):
        if s not in SCALES:
            refuse(f"bench: --scale: unknown scale {s!r}; choose from {', '.join(SCALES)}")
    if args.scale is not None and not _list(args.scale):
        refuse(f"bench: --scale: {args.scale!r} names no scale; choose from {', '.join(SCALES)}")
    modes = _list(args.compile)
    if not modes or any(m not in ("on", "off") for m in modes):
        refuse(f"bench: --compile: {args.compile!r} must be a comma list of on|off")
    known = {n for s in _list(args.scale or "113M,1B,demo") for n in SCALES[s].configs}
    if unknown := [v for v in _list(args.variants or "") if v not in known]:
        refuse(
            f"bench: --variants: unknown variant {unknown[0]!r}; the scales' variants are "
            f"{', '.join(sorted(known))}"
        )
    batches = _list(args.batches)
    if not batches or not all(b.isdigit() and int(b) > 0 for b in batches):
        refuse(f"bench: --batches: {args.batches!r} must be a comma list of positive integers")
    import torch

    if args.generate:
        return _generate(args, [int(b) for b in batches], modes)
    from olmo_patches.train.bench import as_json, format_results, run_bench

    gpu = torch.cuda.is_available()
    args.scale = args.scale or ("113M,1B" if gpu else "demo")
    args.dtype = args.dtype or ("bf16" if gpu else "fp32")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    if args.threads or not gpu:
        torch.set_num_threads(args.threads or 1)
    log = (
        (lambda s: print(s, file=sys.stderr, flush=True))
        if args.json
        else (lambda s: print(s, flush=True))
    )
    results, machine = [], {}
    for s in _list(args.scale):
        # On a GPU the 113M shapes run at their training shape (4096 tokens, micro-batch 8).
        seq = args.seq or (4096 if gpu and s == "113M" else None)
        batch = args.batch or (8 if gpu and s == "113M" else None)
        res, machine = run_bench(
            s,
            compile_modes=[m == "on" for m in modes],
            variants=_list(args.variants) if args.variants else None,
            seq_len=seq,
            batch=batch,
            repeats=args.repeats or 10,
            steps=args.steps,
            warmup=args.warmup,
            dtype=dtype,
            optimizer=args.optimizer,
            float8=args.float8,
            log=log,
        )
        results += res
    if args.json:
        print(json.dumps(as_json(results, machine)))
    else:
        print(format_results(results, machine))


def _generate(args, batches: list, modes: list) -> None:
    """--generate: each scale's baseline and its next two variants (or --variants), compiled unless
    --compile ends with off."""
    import torch

    from olmo_patches.config.bench_scales import SCALES
    from olmo_patches.export.generation import format_generation, run_generation

    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    dtype = (
        torch.bfloat16 if (args.dtype or ("bf16" if gpu else "fp32")) == "bf16" else torch.float32
    )
    if not gpu:
        torch.set_num_threads(args.threads or 1)
    prompt, new = args.prompt or (512 if gpu else 64), args.new or (128 if gpu else 32)
    compiled = modes[-1] == "on"
    for s in _list(args.scale or ("113M,1B" if gpu else "demo")):
        # the scale's baseline first (the ratios' reference), then the variants it has
        chosen = _list(args.variants) if args.variants else list(SCALES[s].configs)[:3]
        configs = {n: c for n, c in SCALES[s].configs.items() if n in chosen or n == "baseline"}
        results = run_generation(
            configs,
            batches=batches,
            prompt=prompt,
            new=new,
            repeats=args.repeats or 3,
            compiled=compiled,
            dtype=dtype,
            device=device,
            log=lambda m: print(m, file=sys.stderr, flush=True),
        )
        where = (
            torch.cuda.get_device_name(0) if gpu else f"CPU, {torch.get_num_threads()} thread(s)"
        )
        print(
            format_generation(
                results,
                f"{s}: {where}, {str(dtype).split('.')[-1]}, {prompt} prompt + {new} new tokens, "
                f"static KV cache, decode {'compiled' if compiled else 'eager'}",
            )
        )


if __name__ == "__main__":
    main()
