"""Hourglass shapes matched to a parameter budget: solve, rank, print, optionally write configs.

    python scripts/search.py BUDGET [--K 4] [--d-h-ratio 0.5] [--layers 6] [--top 30]
                             [--write DIR] [--attn-fraction 0.5 1.0 --head-dim 64] [--kv-group 4]
                             [--aligned] [--attention 45M] [--nearest-ratio]

BUDGET is a baseline config (its non-embedding parameters, paper definition) or a count
(113246208, 113.2M). Without --layers every L whose solved d_model/L lies in 50..300 is tried.
--d-model/--d-h fix those dimensions instead of solving (the paper's K ablation, whose parameters
grow with K). --write DIR writes one YAML per shape, extending the baseline config (BUDGET must
then be a config), each saying that it was generated and by which command. --attn-fraction frees the
attention width (n_heads x --head-dim near that fraction of d_model, the authors' revised shapes);
--kv-group G makes every G query heads share a key/value head (GQA). --aligned keeps the shapes GPU
matmuls like (d_model % 8, d_h % 64, head dims % 8) within the authors' 0.3% instead of the paper's
0.001%. --attention N solves for the paper's reported attention/FFN split instead of a d_h/d_model
(with --K and --layers; d_model nearest sqrt(N / 4 L), head dims multiples of 8); --nearest-ratio
takes, at each target, the shape whose d_h/d_model is nearest it (any even d_model with its MHA
heads). Both default to the authors' tightest tolerance, 0.04%.
"""

import argparse
import itertools
import shlex
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from olmo_patches.cli import (
    ArgumentParser,
    at_least,
    count,
    fraction,
    load_or_exit,
    out_arg,
    refuse,
)
from olmo_patches.config.spec import DOLMA2_VOCAB, padded_vocab
from olmo_patches.config import vocab_size
from olmo_patches.config.shape_config import unextendable, write_config
from olmo_patches.shapes.search import (
    ALIGNED_TOLERANCE,
    SPLIT_TOLERANCE,
    TOLERANCE,
    Shape,
    attention_heads,
    enumerate_shapes,
    rank_key,
    solve,
    solve_split,
)


def parse_budget(text: str) -> tuple[int, Path | None, int, int]:
    """(budget, baseline config or None, vocab size, sequence length)."""
    if text.endswith((".yaml", ".yml")):
        from olmo_patches.report.counts import count as counts  # builds the model (meta): torch

        spec = load_or_exit(text)
        return counts(spec).non_embedding, Path(text), vocab_size(spec), spec.data.sequence_length
    try:
        budget = round(count(text))
    except argparse.ArgumentTypeError as e:
        refuse(f"search: BUDGET={text}: not a config file or a parameter count ({e})")
    return budget, None, padded_vocab(DOLMA2_VOCAB), 4096


def _refuse_unused(args) -> None:
    """One line for an option the chosen mode would ignore: --attention solves MHA shapes from
    the attention count alone; --d-model takes d_h from --d-h, which needs it."""
    ignored, defaults = ("d_h_ratio", "aligned", "nearest_ratio"), _parser()
    for key, options in (
        ("attention", (*ignored, "d_model", "d_h", "attn_fraction", "kv_group", "head_dim")),
        ("d_model", ignored),
    ):
        given = [o for o in options if getattr(args, o) != defaults.get_default(o)]
        if getattr(args, key) is not None and given:
            refuse(f"search: --{key.replace('_', '-')} ignores --{given[0].replace('_', '-')}")
    if args.d_h is not None and args.d_model is None:
        refuse("search: --d-h needs --d-model (solved shapes take --d-h-ratio)")


def shapes(args, budget: int, misses: list[str]) -> list[Shape]:
    """The shapes of the grid searched; each grid point that has none is added to ``misses``."""
    _refuse_unused(args)
    Ks = args.K or list(range(1, 11))
    fractions = tuple(args.attn_fraction or (None,))
    attention = dict(head_dim=args.head_dim, kv_group=args.kv_group)
    if args.attention is not None:  # the paper's split: d_model from the attention count
        return _split_shapes(args, budget, misses)
    if args.d_model:  # fixed dimensions: no solving
        return _fixed_shapes(args, Ks, fractions, attention)
    return _solved_shapes(args, budget, misses, Ks, fractions, attention)


def _split_shapes(args, budget: int, misses: list[str]) -> list[Shape]:
    """The paper's attention/FFN split: d_model from the attention count, per K and L."""
    if not (args.K and args.layers):
        refuse("search: --attention needs --K and --layers")
    found = [
        (
            K,
            L,
            solve_split(
                budget, K=K, n_layers=L, attention=args.attention, tolerance=args.tolerance
            ),
        )
        for K in args.K
        for L in args.layers
    ]
    misses += [f"K={K}, L={L}, attention {args.attention:,.0f}" for K, L, s in found if s is None]
    return [s for _, _, s in found if s is not None]


def _fixed_shapes(args, Ks: list[int], fractions: tuple, attention: dict) -> list[Shape]:
    """--d-model and --d-h as given (no solving), per K, L and attention fraction."""
    if not (args.layers and args.d_h):
        refuse("search: --d-model needs --layers and --d-h")
    heads = [
        h for f in fractions if (h := attention_heads(args.d_model, f, **attention)) is not None
    ]
    if not heads:
        refuse(f"search: --d-model={args.d_model}: no valid head count")
    return [
        Shape(K, args.d_model, L, args.d_h, rounding="fixed", **h)
        for K in Ks
        for L in args.layers
        for h in heads
    ]


def _solved_shapes(
    args, budget: int, misses: list[str], Ks: list[int], fractions: tuple, attention: dict
) -> list[Shape]:
    """d_model and d_h solved for the budget at each K, d_h/d_model and fraction (and L)."""
    ratios = tuple(args.d_h_ratio or (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8))
    solving = dict(tolerance=args.tolerance, aligned=args.aligned, nearest_ratio=args.nearest_ratio)
    if not args.layers:
        return list(
            enumerate_shapes(
                budget, Ks=Ks, d_h_ratios=ratios, attn_fractions=fractions, **solving, **attention
            )
        )
    found: dict[tuple, Shape] = {}
    for K, r, f, L in itertools.product(Ks, ratios, fractions, args.layers):
        s = solve(
            budget,
            K=K,
            n_layers=L,
            d_h_ratio=r,
            layer_slack=args.layer_slack,
            attn_fraction=f,
            ratio_slack=args.ratio_slack,
            **solving,
            **attention,
        )
        if s is None:
            misses.append(f"K={K}, L={L}, d_h/d_model={r}")
        else:
            found.setdefault((s.K, s.n_layers, s.d_model, s.d_h, s.n_heads, s.head_dim), s)
    return list(found.values())


def table(rows: list[Shape], budget: int, vocab: int, seq: int) -> Table:
    t = Table(title=f"hourglass shapes for a budget of {budget:,} non-embedding parameters")
    for col in (
        "K",
        "L",
        "d_model",
        "d_h",
        "heads x dim",
        "kv heads",
        "attn width",
        "d_h/d_model",
        "d_model/L",
        "attention",
        "FFN",
        "attn share",
        "mismatch",
        "GFLOPs/token",
        "rounding",
    ):
        t.add_column(col, justify="right")
    for s in rows:
        t.add_row(
            str(s.K),
            str(s.n_layers),
            str(s.d_model),
            str(s.d_h),
            f"{s.n_heads} x {s.head_dim}",
            str(s.n_kv_heads or s.n_heads),
            f"{s.attention_width} ({s.attention_width / s.d_model:.2f})",
            f"{s.d_h_ratio:.3f}",
            f"{s.width_depth:.0f}",
            f"{s.attention / 1e6:.2f}M",
            f"{s.ffn / 1e6:.2f}M",
            f"{s.attention / s.non_embedding:.1%}",
            f"{s.mismatch(budget):+.2e}",
            f"{s.flops_per_token(seq, vocab) / 1e9:.3f}",
            s.rounding,
        )
    return t


def _parser() -> argparse.ArgumentParser:
    """The command line: the budget, the grid searched, the shapes' constraints, the output."""
    parser = ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "budget", help="a baseline config or a non-embedding parameter count (113246208, 113.2M)"
    )
    parser.add_argument("--K", type=at_least(1), nargs="+", help="K values (default 1..10)")
    parser.add_argument(
        "--d-h-ratio",
        type=fraction,
        nargs="+",
        help="target d_h/d_model values in (0, 1] (default 0.1..0.8)",
    )
    parser.add_argument(
        "--layers",
        type=at_least(1),
        nargs="+",
        help="L values (default: every L with d_model/L in 50..300)",
    )
    parser.add_argument(
        "--ratio-slack",
        type=at_least(0, float),
        default=0.2,
        help="allow d_h/d_model this far (relative) from --d-h-ratio (with --layers)",
    )
    parser.add_argument(
        "--layer-slack",
        type=at_least(0),
        default=0,
        help="allow L this far from --layers when unsolvable",
    )
    parser.add_argument(
        "--d-model", type=at_least(1), help="fix d_model (with --layers and --d-h): no solving"
    )
    parser.add_argument("--d-h", type=at_least(1), help="fix d_h (with --d-model)")
    _attention_args(parser)
    parser.add_argument(
        "--tolerance",
        type=at_least(0, float, most=1),
        help="relative budget tolerance (default: the paper's 1e-5; 3e-3 with --aligned; 4e-4 "
        "with --attention, --nearest-ratio)",
    )
    parser.add_argument(
        "--sort",
        choices=("rank", "flops", "attention"),
        default="rank",
        help="rank: olmo_patches.shapes.search.rank_key (the paper's findings); flops; attention "
        "share",
    )
    parser.add_argument("--top", type=at_least(1), default=40, help="rows to print")
    parser.add_argument(
        "--write", type=Path, help="write each shape as a config extending BUDGET into this folder"
    )
    return parser


def _attention_args(parser: ArgumentParser) -> None:
    """The attention's shape and the constraints on the dimensions."""
    parser.add_argument(
        "--attn-fraction",
        type=fraction,
        nargs="+",
        help="attention width n_heads x --head-dim near these fractions of d_model, in (0, 1] "
        "(default: MHA at d_model)",
    )
    parser.add_argument(
        "--head-dim", type=at_least(2), default=64, help="head size with --attn-fraction (even)"
    )
    parser.add_argument(
        "--kv-group",
        type=at_least(1),
        default=1,
        help="query heads per key/value head (GQA; 1: MHA)",
    )
    parser.add_argument(
        "--aligned",
        action="store_true",
        help="only d_model %% 8, d_h %% 64 (head dims %% 8); tolerance 3e-3",
    )
    parser.add_argument(
        "--attention",
        type=count,
        help="solve for this many attention parameters (45M: the paper's split) instead of "
        "--d-h-ratio",
    )
    parser.add_argument(
        "--nearest-ratio",
        action="store_true",
        help="the d_h/d_model nearest each target (any even d_model, MHA heads); tolerance 4e-4",
    )


def main() -> None:
    args = _parser().parse_args()
    if args.head_dim % 2:
        refuse(f"search: --head-dim={args.head_dim}: must be even")
    if args.write is not None:
        out_arg("--write", args.write)
    if args.tolerance is None:
        args.tolerance = (
            ALIGNED_TOLERANCE
            if args.aligned
            else SPLIT_TOLERANCE
            if (args.nearest_ratio or args.attention)
            else TOLERANCE
        )
    budget, baseline, vocab, seq = parse_budget(args.budget)
    if args.write and (why := unextendable(baseline and load_or_exit(str(baseline)))):
        refuse(f"search: --write: BUDGET={args.budget}: {why}")
    misses: list[str] = []
    rows = shapes(args, budget, misses)
    if not rows:  # nothing to show: one line, as for any argument that cannot work
        grid = f" (the first tried: {misses[0]}; {len(misses)} in all)" if misses else ""
        refuse(
            f"search: BUDGET={args.budget}: no shape within a tolerance of {args.tolerance:g}{grid}"
        )
    for miss in misses:
        print(f"search: no shape for {miss} within {args.tolerance:g}", file=sys.stderr)
    rows.sort(
        key={
            "rank": rank_key,
            "flops": lambda s: s.flops_per_token(seq, vocab),
            "attention": lambda s: s.attention,
        }[args.sort]
    )
    Console(width=220).print(table(rows[: args.top], budget, vocab, seq))
    if args.write:
        command = "python scripts/search.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        for s in rows:
            print(write_config(s, args.write, baseline, budget, command, args.tolerance))


if __name__ == "__main__":
    main()
