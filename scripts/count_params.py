"""Parameters and FLOPs per token of a config's model, built on the meta device.

python scripts/count_params.py CONFIG [key=value ...] [--json]
"""

import argparse
import json

from olmo_patches.cli import ArgumentParser, console, load_or_exit, refuse


def main() -> None:
    parser = ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    # a bad config is refused here, before torch is imported
    spec = load_or_exit(args.config, args.overrides)

    from olmo_patches.config import ConfigError
    from olmo_patches.report.counts import (
        attention_report,
        count,
        exact_gap,
        float8_report,
        gpu_report,
        paper_report,
        param_table,
    )

    if args.json:
        out = {
            **count(spec).as_dict(),
            **attention_report(spec),
            **gpu_report(spec),
            **exact_gap(args.config),
        }
        try:
            out.update(paper_report(spec))
        except ConfigError as e:  # a kind that does not count itself as its papers do
            refuse(f"count_params: {e}")
        if spec.train.float8 != "off":
            out.update(float8_report(spec))
        print(json.dumps(out))
    else:
        console().print(param_table(spec))


if __name__ == "__main__":
    main()
