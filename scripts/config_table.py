"""Markdown table of the hourglass paper's shipped configs under configs/ (sizes and their
ablations).

python scripts/config_table.py [ROOT]

ROOT: default the checkout's (or the installed package's) configs/; configs/demo is skipped.
"""

import argparse
from pathlib import Path

from olmo_patches.blocks import block_of
from olmo_patches.cli import ArgumentParser, folder_arg, load_or_exit
from olmo_patches.resources import data_path


def baseline_of(path: Path, root: Path) -> Path:
    """The size folder's baseline.yaml; baseline-revised.yaml for the authors' revised runs."""
    name = "baseline-revised.yaml" if path.name.endswith("-revised.yaml") else "baseline.yaml"
    return root / path.relative_to(root).parts[0] / name


def main() -> None:
    parser = ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "root",
        nargs="?",
        metavar="ROOT",
        help="the configs' folder (default: the package's configs/)",
    )
    args = parser.parse_args()
    root = folder_arg("ROOT", args.root) if args.root is not None else data_path("configs")
    paths = sorted(
        p
        for p in root.rglob("*.yaml")
        if p.stem not in ("base", "base-revised", "base-paper2")
        and p.relative_to(root).parts[0] != "demo"
    )
    # every config and its baseline loaded (a bad one refused) before torch is imported; the
    # hourglass paper's constant-width runs only (variable width has its own table); shapes, not
    # evaluations: no eval task is asked of the installed ai2-olmo-eval
    shapes = ["eval.downstream_tasks=[]"]
    specs = {path: load_or_exit(str(path), shapes) for path in paths}
    paths = [p for p in paths if block_of(specs[p].model).constant_width]
    for base in sorted({baseline_of(p, root) for p in paths} - set(specs)):
        specs[base] = load_or_exit(str(base), shapes)

    from olmo_patches.report.counts import count
    from olmo_patches.report.plan import plan

    budgets: dict[Path, int] = {}
    print(
        "| config | d_model | L | FFN shape | heads | attention | FFN | non-embedding | total | vs "
        "baseline | tokens | steps |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for path in paths:
        spec = specs[path]
        kind = block_of(spec.model)
        b, m = count(spec), spec.model
        base = baseline_of(path, root)
        if base not in budgets:
            budgets[base] = count(specs[base]).non_embedding
        p = plan(spec)
        print(
            f"| {path.relative_to(root)} | {m.d_model} | {m.n_layers} | "
            f"{kind.describe(m) or kind.name} | {m.n_heads} x {m.resolved_head_dim}"
            f"{f' (kv {m.n_kv_heads})' if m.resolved_n_kv_heads != m.n_heads else ''} "
            f"| {b.attention:,} | {b.ffn:,} | {b.non_embedding:,} | {b.total:,} "
            f"| {(b.non_embedding - budgets[base]) / budgets[base]:+.2e} | {p.tokens / 1e9:g}B | "
            f"{p.steps:,} |"
        )


if __name__ == "__main__":
    main()
