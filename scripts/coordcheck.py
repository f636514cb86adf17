"""Coordinate check: each sublayer's activation scale over a few training steps at x1, x2, x4 the
width (and depth, and K for hourglass) of a config (olmo_patches/train/coordcheck.py): flat under
muP, growing under the standard parametrisation; the command says which it sees.

python scripts/coordcheck.py CONFIG [key=value ...] [--axes width,depth,K] [--steps 10] [--out DIR]

Writes DIR/coordcheck.json (every scale, the slopes, the verdicts) and DIR/coordcheck.png (scale
against step, a line per multiplier). Random token ids, CPU, the config's init, optimizer groups
and LR (constant): seconds at the demo's size; set model.d_model / model.n_layers smaller for a
large config (a proxy: the check is about how scales move with the multiplier).
"""

import argparse
import json
from pathlib import Path

from olmo_patches.cli import ArgumentParser, at_least, out_arg, refuse_alike
from olmo_patches.config import ConfigError, load_spec
from olmo_patches.resources import find_config

AXES = ("width", "depth", "K")


def axes_arg(text: str) -> list:
    axes = text.split(",")
    if bad := [a for a in axes if a not in AXES]:
        raise argparse.ArgumentTypeError(
            f"{','.join(bad)}: not an axis (choose from {', '.join(AXES)})"
        )
    if len(set(axes)) < len(axes):
        raise argparse.ArgumentTypeError(f"{text}: an axis appears twice")
    return axes


def main() -> None:
    parser = ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    parser.add_argument(
        "--axes",
        type=axes_arg,
        help="comma-separated, of width, depth, K (default: width,depth and K for hourglass)",
    )
    parser.add_argument("--steps", type=at_least(1), default=10, help="training steps per run")
    parser.add_argument("--batch", type=at_least(1), default=8, help="sequences per step")
    parser.add_argument("--seq", type=at_least(2), default=64, help="tokens per sequence")
    parser.add_argument("--seed", type=at_least(0), default=0, help="seed of the random batches")
    parser.add_argument("--out", type=Path, help="output folder (default: coordcheck/RUN_NAME)")
    args = parser.parse_args()
    try:
        spec = load_spec(find_config(args.config), args.overrides)
    except ConfigError as e:
        refuse_alike(f"config error: {e}")
    from olmo_patches.train.coordcheck import axes_of

    if args.axes and (other := [a for a in args.axes if a not in axes_of(spec)]):
        refuse_alike(
            f"--axes {','.join(args.axes)}: {other[0]} is not an axis of model.block="
            f"{spec.model.block} (its axes: {', '.join(axes_of(spec))})"
        )
    out = out_arg("--out", args.out or Path("coordcheck") / spec.run.name)

    from olmo_patches.train.coordcheck import coord_check, plot

    check = coord_check(
        str(find_config(args.config)),
        args.overrides,
        args.axes,
        args.steps,
        args.batch,
        args.seq,
        args.seed,
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "coordcheck.json").write_text(json.dumps(check.to_json(), indent=1) + "\n")
    plot(check, out / "coordcheck.png")
    print(check.summary())
    print(out / "coordcheck.json")
    print(out / "coordcheck.png")


if __name__ == "__main__":
    main()
