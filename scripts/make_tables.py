"""The papers' tables (markdown + CSV) and figures (PNG) from runs, beside the reported numbers.

    python scripts/make_tables.py RUN_DIR... --out DIR [--target-loss L]

RUN_DIR is a run folder (config.yaml + metrics.jsonl) or a folder of them (e.g. runs/). Missing
runs appear as "not run"; partial runs use their last evaluation.

Seeds: the runs NAME, NAME-seed1, NAME-seed2, ... (scripts/sweep.py --seeds) are one config at
several seeds, one row NAME: its numbers are the mean over seeds with the 95% Student-t interval,
mean [lo, hi] (PPL: exp of the loss's, the geometric mean), beside a "seeds" column; paper 2's gap
to its own baseline is paired by seed. A single run prints as it would alone. A seed folder whose
recorded config differs from seed 0's (beyond train.seed, data.order_seed and the keys a rerun may
change) is refused, one line, exit 2, nothing written: the seeds of different shapes never pool.
loss_curves.png draws a seed group's mean training loss with a min-max band.

Scaling fit (scaling_fit.md, matched_loss.md, scaling.png; olmo_patches/report/scaling.py): the
runs fall into families (baseline, x and the other variable-width shapes, hourglass; MoE apart). A
family with runs at 2 or more compute budgets gets L = a C^b, C = training FLOPs in PF-days
(8.64e19 FLOPs, the paper's unit) on the authors' count (paper 2's compute_metrics: 2 per weight,
full attention, the idle first/last-layer slices left out; OLMo-core's count in separately
labelled columns), L = final validation loss, by least squares in log space, with the standard
errors of a and b (3+ runs), beside the paper's fits (baseline L = 3.16 C^-0.0498, x L = 3.12
C^-0.0503, which scaling.png draws too). matched_loss gives the FLOPs each family's fit needs to
reach --target-loss (default: the loss of the baseline run with the most compute) and their ratio
to the baseline's: the paper's x reaches its 2B baseline's loss with 77.8% of the FLOPs. The same
solve against each family's fit of loss on mean layer width (L = a W^b) gives the mean width,
hence the KV cache per token, at matched loss. matched_loss_paper.md does both on the paper's own
four dense rows: a 3.160, b -0.0498 and a 3.125, b -0.0503, x needs 77.6% of the baseline's FLOPs
(the paper: 77.8%; its printed constants give 75.5%) and 85.1% of its mean width (the abstract's
15% less KV cache), beside the equal-size changes at 2B (-2.5% FLOPs, -10.9% mean width).

A seed group is one point of a fit, at its mean loss. Where a family's points have several seeds,
a, b and the matched-loss FLOPs and width ratios get 95% percentile bootstrap intervals over seeds
(a numpy resample, 2000 draws; the unit: one seed's run, resampled with replacement within its
config, each config on its own; each point's C and the target loss held); a family with one seed
per point says it has the standard errors only. docs/statistics.md has the assumptions.
"""

import argparse
import sys
from pathlib import Path

from olmo_patches.cli import ArgumentParser, at_least, out_arg


def main() -> None:
    parser = ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="+", help="run folders, or folders of run folders")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--no-figures", action="store_true")
    parser.add_argument(
        "--target-loss",
        type=at_least(0, float),
        help="matched-loss FLOPs at this loss (default: the largest baseline run's)",
    )
    args = parser.parse_args()

    from olmo_patches.report.figures import make_figures, scaling_figure
    from olmo_patches.report.scaling import paper_matched_loss_rows, scaling_points, scaling_tables
    from olmo_patches.config import ConfigError
    from olmo_patches.report.tables import (
        build_tables,
        group_seeds,
        load_runs,
        paper_results,
        write_tables,
    )

    out_arg("--out", args.out)
    missing = [p for p in args.runs if not Path(p).is_dir()]
    if missing:
        print(f"make_tables: no such folder: {', '.join(missing)}", file=sys.stderr)
        raise SystemExit(2)
    try:
        runs = group_seeds(load_runs(args.runs))
    except ConfigError as e:
        print(f"make_tables: {e}", file=sys.stderr)
        raise SystemExit(2)
    out, points = Path(args.out), scaling_points(runs)
    tables = {
        **build_tables(runs),
        **scaling_tables(points, paper_results(), args.target_loss),
        "matched_loss_paper": paper_matched_loss_rows(paper_results()),
    }
    written = write_tables(tables, out)
    if not args.no_figures:
        written += make_figures(runs, out) + scaling_figure(points, out, paper_results())
    print(f"{len(runs)} row(s) (a config's seeds one row): {', '.join(sorted(runs)) or '-'}")
    for path in written:
        print(path)


if __name__ == "__main__":
    main()
