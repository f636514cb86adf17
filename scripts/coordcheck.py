"""Coordinate check: each sublayer's scale at init and the change its updates make, at x1, x2, x4,
x8 the width of a config, over seeds (olmo_patches/train/coordcheck.py); says whether it is muP and,
where not, which parameter group is out of scale and whether its init or its learning rate is.

python scripts/coordcheck.py CONFIG [key=value ...] [--axes width,depth,K] [--steps 5] [--seeds 3]
                             [--out DIR]

Writes DIR/coordcheck.json (every scale, slope and verdict) and DIR/coordcheck.png (scale against
the multiplier, the init and each step). One fixed batch of random tokens, CPU, the config's init,
optimizer groups and LR (constant): seconds at the demo's size with model.d_model=32; a large
config wants smaller model.d_model / model.n_layers (the check is about how scales move with the
multiplier).
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
        default=["width"],
        help="comma-separated, of width (muP's, the default), depth, K (hourglass): described",
    )
    parser.add_argument("--steps", type=at_least(1), default=5, help="updates per run")
    parser.add_argument("--seeds", type=at_least(1), default=3, help="init seeds per multiplier")
    parser.add_argument("--batch", type=at_least(1), default=2, help="sequences in the batch")
    parser.add_argument("--seq", type=at_least(2), default=16, help="tokens per sequence")
    parser.add_argument("--out", type=Path, help="output folder (default: coordcheck/RUN_NAME)")
    args = parser.parse_args()
    try:
        spec = load_spec(find_config(args.config), args.overrides)
    except ConfigError as e:
        refuse_alike(f"config error: {e}")
    from olmo_patches.blocks.base import axes
    from olmo_patches.train.coordcheck import coord_check, plot

    if other := [a for a in args.axes if a not in axes(spec.model)]:
        refuse_alike(
            f"--axes {','.join(args.axes)}: {other[0]} is not an axis of model.block="
            f"{spec.model.block} (its axes: {', '.join(axes(spec.model))})"
        )
    out = out_arg("--out", args.out or Path("coordcheck") / spec.run.name)
    check = coord_check(
        str(find_config(args.config)),
        args.overrides,
        args.axes,
        args.steps,
        args.seeds,
        args.batch,
        args.seq,
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "coordcheck.json").write_text(json.dumps(check.to_json(), indent=1) + "\n")
    plot(check, out / "coordcheck.png")
    print(check.summary())
    print(out / "coordcheck.json")
    print(out / "coordcheck.png")


if __name__ == "__main__":
    main()
