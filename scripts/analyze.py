"""Per-layer analyses of checkpoints on a validation batch (paper 2's Figures 5-9), variants
overlaid.

    python scripts/analyze.py CHECKPOINT [CHECKPOINT ...] --out DIR [--batch 8] [--seq 128]
                              [--tokens FILE --dtype uint32] [--names a b ...] [--threshold 0.01]
                              [--uncentred] [--per-prompt] [--normaliser layer|fixed]

CHECKPOINT: a checkpoint (RUN/stepN) or a run folder (its latest), of any variant (baseline,
hourglass, variable width, MoE). Per block: MLP activation utilisation and dead units, the residual
stream's normalised matrix entropy and participation ratio, and the logit lens (the model's head on
each block's output: the next token's probability); olmo_patches/report/analysis.py defines each.
Writes DIR/analysis.json and DIR/analysis.png (four panels against layer / L, one line per
checkpoint). The batch: the first batch x (seq + 1) tokens of the run's validation data (the demo
corpus's), or of --tokens (a raw numpy token file, --dtype) for runs whose validation data are
remote.

The conventions where definitions differ (the paper does not fix them): the stream's Gram matrix
column-centred (default) or --uncentred; all tokens pooled (default) or --per-prompt (averaged over
the batch's sequences); the entropy over ln min(N - 1, w_l) (--normaliser layer, default) or over ln
h of every layer (fixed). The analysis module's docstring gives the reasons for the defaults;
analysis.json records the conventions used.

--out is a new or empty folder, or one holding only an earlier analysis (analysis.json and
analysis.png, replaced); a folder with anything else is written into only with --force. What needs
no model (the arguments, --out, each checkpoint's folder and config.yaml) is checked before torch is
imported, and every checkpoint's weights against its config's model (their shapes, from its
metadata) before any model loads.
"""

import argparse
from pathlib import Path

from olmo_patches.cli import ArgumentParser, at_least, out_arg, refuse, refuse_alike
from olmo_patches.config import ConfigError, load_spec
from olmo_patches.report.analysis_conventions import NORMALISERS, THRESHOLD, Conventions

OUTPUTS = {"analysis.json", "analysis.png"}  # what --out receives: an earlier analysis is replaced


def _check_before_torch(args) -> None:
    """The arguments, --out's rule (the module docstring) and each checkpoint's folder and config:
    one line, exit 2, before torch is imported."""
    if args.names and len(args.names) != len(args.checkpoints):
        refuse_alike(
            f"analyze: command line: --names: {len(args.names)} names for {len(args.checkpoints)} "
            "checkpoints"
        )
    if args.tokens is not None and not args.tokens.is_file():
        refuse_alike(f"analyze: command line: --tokens={args.tokens}: no such file")
    out = out_arg("analyze: command line: --out", args.out)
    if (
        not args.force
        and out.is_dir()
        and (others := sorted(p.name for p in out.iterdir() if p.name not in OUTPUTS))
    ):
        refuse_alike(
            f"analyze: command line: --out {out}: holds other files ({others[0]}, ...); --force to "
            "write into it"
        )
    for checkpoint in args.checkpoints:
        path = Path(checkpoint)
        if not path.is_dir():
            refuse_alike(
                f"analyze: command line: CHECKPOINT={checkpoint}: "
                f"{'not a folder' if path.exists() else 'no such folder'}"
            )
        config = (
            path / "config.yaml"
            if (path / "config.yaml").is_file()
            else path.parent / "config.yaml"
        )
        if not config.is_file():
            refuse_alike(
                f"analyze: command line: CHECKPOINT={checkpoint}: no config.yaml beside it "
                f"({config})"
            )
        try:
            load_spec(config, ["train.hardware=none", "train.device=cpu"])
        except ConfigError as e:
            refuse_alike(f"analyze: config error: {e}")


def _parser() -> ArgumentParser:
    parser = ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkpoints", nargs="+", help="checkpoints (RUN/stepN) or run folders")
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        help="folder for analysis.json and analysis.png (new, empty, or an earlier analysis's)",
    )
    parser.add_argument(
        "--force", action="store_true", help="write into an --out folder that holds other files"
    )
    parser.add_argument(
        "--names", nargs="+", help="one label per checkpoint (default: each run's name)"
    )
    parser.add_argument("--batch", type=at_least(1), default=8, help="sequences in the batch")
    parser.add_argument(
        "--seq", type=at_least(2), help="tokens per sequence (default: the run's, at most 512)"
    )
    parser.add_argument(
        "--tokens",
        type=Path,
        help="a raw numpy token file for the batch (default: the run's validation data)",
    )
    parser.add_argument("--dtype", default="uint32", help="with --tokens: its numpy dtype")
    _convention_args(parser)
    return parser


def _convention_args(parser: ArgumentParser) -> None:
    """The conventions where the metrics' definitions differ (the module docstring)."""
    parser.add_argument(
        "--threshold",
        type=at_least(0, float),
        default=THRESHOLD,
        help="a unit is active where |a| > this x its layer's RMS activation",
    )
    parser.add_argument(
        "--uncentred",
        action="store_true",
        help="the Gram matrix of the stream as it is (default: centred)",
    )
    parser.add_argument(
        "--per-prompt",
        action="store_true",
        help="the metrics per sequence, averaged (default: pooled)",
    )
    parser.add_argument(
        "--normaliser",
        choices=NORMALISERS,
        default="layer",
        help="entropy over ln min(N - 1, w_l) (layer) or ln h (fixed)",
    )


def _batch(args, checkpoint: str, spec):
    """The checkpoint's validation batch: --tokens, else its run's local validation file."""
    from olmo_patches.report.analysis import validation_batch
    from olmo_patches.train.sources import resolve_data

    seq = args.seq or min(spec.data.sequence_length, 512)
    if args.tokens is not None:
        source, dtype = args.tokens, args.dtype
    else:
        data = resolve_data(spec)
        if not data.val_paths or not Path(data.val_paths[0]).is_file():
            refuse(
                f"analyze: {checkpoint}: data.source={spec.data.source}: no local validation "
                "file; pass --tokens FILE --dtype"
            )
        source, dtype = data.val_paths[0], data.dtype or "uint32"
    try:
        return validation_batch(source, dtype, args.batch, seq), seq
    except ValueError as e:
        refuse(f"analyze: command line: --batch/--seq: {e}")


def main() -> None:
    args = _parser().parse_args()
    _check_before_torch(args)
    pooling = "per_prompt" if args.per_prompt else "pooled"
    conventions = Conventions(
        centre=not args.uncentred, pooling=pooling, normaliser=args.normaliser
    )
    from olmo_patches.report.analysis import (
        analysis_figure,
        analyze_model,
        checkpoint_spec,
        load_checkpoint_model,
        write_json,
    )

    found = []  # every checkpoint against its config, before any model loads
    for checkpoint in args.checkpoints:
        try:
            found.append(checkpoint_spec(checkpoint))
        except ValueError as e:
            refuse(f"analyze: command line: {e}")
    analyses = []
    for i, (checkpoint, (spec, path)) in enumerate(zip(args.checkpoints, found)):
        model = load_checkpoint_model(spec, path)
        tokens, seq = _batch(args, checkpoint, spec)
        name = args.names[i] if args.names else spec.run.name
        try:
            a = analyze_model(
                model,
                tokens,
                spec.model,
                name=name,
                checkpoint=str(path),
                threshold=args.threshold,
                conventions=conventions,
            )
        except ConfigError as e:  # a kind that does not hand over its FFN's hidden units
            refuse(f"analyze: {e}")
        analyses.append(a)
        print(
            f"{name}: {len(a.layers)} layers, {a.tokens:,} tokens, "
            f"p(next token) {a.final_target_probability:.4f}"
        )
    print(write_json(analyses, args.out / "analysis.json"))
    print(
        analysis_figure(
            analyses, args.out / "analysis.png", f"{args.batch} x {seq} validation tokens"
        )
    )


if __name__ == "__main__":
    main()
