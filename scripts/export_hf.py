"""Export a checkpoint to a Hugging Face model folder.

    python scripts/export_hf.py CHECKPOINT OUT_DIR [--config RUN/config.yaml] [--tokenizer FILE]
                                [--force]

OLMo-2-shaped baselines become Olmo2ForCausalLM; hourglass and pre-norm models carry their own
modeling code (load with trust_remote_code=True).

OUT_DIR is a new or empty folder; one that holds anything is written into only with --force, which
replaces an earlier export's files there (config, weights, modeling code, card, tokenizer) and
leaves the others; never a run folder (OUT_DIR holding CHECKPOINT, or inside it). The export is
written beside OUT_DIR and moved in once whole: a write that fails (a full disk) leaves OUT_DIR as
it was. What needs no
model (the arguments, the checkpoint's folder, the config, OUT_DIR) is checked before torch is
imported; the checkpoint's weights against the config's model (their shapes, from the checkpoint's
metadata) before any weight is read.
"""

import argparse
from pathlib import Path

from olmo_patches.cli import ArgumentParser, out_arg, refuse, refuse_alike
from olmo_patches.config import ConfigError, load_spec


def _check_before_torch(args) -> None:
    """The checkpoint folder, OUT_DIR's rule (module docstring) and the config: one line, exit 2."""
    checkpoint, out = Path(args.checkpoint), out_arg("OUT_DIR", args.out_dir)
    if not checkpoint.is_dir():
        refuse_alike(
            f"export_hf: CHECKPOINT {checkpoint}: "
            f"{'a file, not a checkpoint folder' if checkpoint.exists() else 'no such folder'}"
        )
    # DCP's metadata
    if not any((checkpoint / d / ".metadata").is_file() for d in ("model_and_optim", ".")):
        refuse_alike(
            f"export_hf: CHECKPOINT {checkpoint}: not a checkpoint (no model_and_optim/.metadata)"
        )
    here, there = out.resolve(), checkpoint.resolve()
    if here == there or here in there.parents or there in here.parents:
        refuse_alike(
            f"export_hf: OUT_DIR {out}: holds CHECKPOINT {checkpoint} or lies inside it; export "
            "elsewhere"
        )
    if not args.force and out.is_dir() and any(out.iterdir()):
        refuse_alike(
            f"export_hf: OUT_DIR {out}: not empty ({len(list(out.iterdir()))} entries); --force to "
            "write into it"
        )
    config = Path(args.config) if args.config else checkpoint.parent / "config.yaml"
    if not config.is_file():
        refuse_alike(
            f"export_hf: {'--config' if args.config else 'CHECKPOINT'} {config}: no such file (the "
            "run's config.yaml)"
        )
    try:
        load_spec(config)
    except ConfigError as e:
        refuse_alike(f"export_hf: config error: {e}")


def main() -> None:
    parser = ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkpoint", help="a trainer checkpoint folder, e.g. runs/NAME/step1000")
    parser.add_argument("out_dir", help="a new or empty folder (--force: one that holds files)")
    parser.add_argument(
        "--config", help="the run's config.yaml (default: CHECKPOINT/../config.yaml)"
    )
    parser.add_argument(
        "--tokenizer",
        help="the run's tokenizer JSON to ship with the model (checked against its vocabulary and "
        "ids)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="write into an OUT_DIR that is not empty (an earlier export there replaced)",
    )
    args = parser.parse_args()
    _check_before_torch(args)

    from olmo_patches.export import export_hf

    try:
        kind = export_hf(
            args.checkpoint,
            args.out_dir,
            config=args.config,
            tokenizer_file=args.tokenizer,
            replace=args.force,
        )
    except (ConfigError, ValueError, FileNotFoundError) as e:
        refuse(f"export_hf: {e}")
    except OSError as e:  # the write failed (a full disk): OUT_DIR as it was
        refuse(f"export_hf: {e}", 1)
    what = "Olmo2ForCausalLM" if kind == "olmo2" else "custom modeling code, trust_remote_code=True"
    print(f"wrote {args.out_dir} ({what})")


if __name__ == "__main__":
    main()
