"""Export a checkpoint to a Hugging Face model folder.

    python scripts/export_hf.py CHECKPOINT OUT_DIR [--config RUN/config.yaml] [--tokenizer FILE]

OLMo-2-shaped baselines become Olmo2ForCausalLM; hourglass and pre-norm models carry their own
modeling code (load with trust_remote_code=True).
"""

import argparse

from olmo_patches.cli import ArgumentParser, out_arg, refuse
from olmo_patches.config import ConfigError


def main() -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a trainer checkpoint folder, e.g. runs/NAME/step1000")
    parser.add_argument("out_dir")
    parser.add_argument("--config", help="the run's config.yaml (default: CHECKPOINT/../config.yaml)")
    parser.add_argument(
        "--tokenizer", help="the run's tokenizer JSON to ship with the model (checked against its vocabulary and ids)"
    )
    args = parser.parse_args()

    from olmo_patches.export import export_hf

    out_arg("OUT_DIR", args.out_dir)
    try:
        kind = export_hf(args.checkpoint, args.out_dir, config=args.config, tokenizer_file=args.tokenizer)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        refuse(f"export_hf: {e}")
    print(f"wrote {args.out_dir} ({'Olmo2ForCausalLM' if kind == 'olmo2' else 'custom modeling code, trust_remote_code=True'})")


if __name__ == "__main__":
    main()
