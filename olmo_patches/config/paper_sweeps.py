"""The paper's 113M sweeps (hourglass paper, Section 4 and its ablations) as scripts/search.py
commands.

Each entry is one folder under configs/ and the search.py arguments that write it; every config in
the folder is generated (its first lines name the command), so ``python scripts/make_sweeps.py``
rewrites them all. Choices, against the paper's own numbers (docs/paper_runs.md, "The sweeps"):

- ``k-sweep-unmatched``: the K ablation, parameters growing with K (val PPL 40.153 at K=1 to 32.832
  at K=8). Its base is the reallocation shape (K=4, L=6, d_model 1368, d_h 694), so K=4 is the
  35.101 run (configs/113M/hourglass-K4-L6.yaml); on the controlled base (d_model 768, L 12, d_h
  384) K=8 would be the 36.179 run, not 32.832.
- ``width-depth-K2``/``-K4``: the U-curves of val loss against d_model/L at d_h/d_model 0.5, with
  points at and around the floors (K=2 near 180: L 7-9; K=4 near 110: L 9-11).
- ``d_h-ratio``: K=4 at L=12 exactly (the paper's fixed-L search, best near 0.4), d_h/d_model
  0.1-0.8 with 0.45 and 0.55 between; the point nearest 0.4 is 0.399 (d_model 1040, d_h 415).
- ``k-sweep``: K at a matched budget (d_h/d_model 0.5, L 12 +- 2).

One head rule for the sweeps whose points differ in d_model (:data:`HEADS`): heads of 64 dimensions
(paper 1 uses standard MHA and reports no head counts), n_heads = round(d_model / 64), so the
attention width is d_model where d_model is a multiple of 64 and within 32 of it elsewhere; the
solver counts that attention exactly when it matches the budget. Under the rule it replaces (MHA at
d_model, a head dim in 48-256 nearest 64) the heads ranged from 4 x 232 to 34 x 48, and no shape
near d_h/d_model 0.40 had a head dim that is a multiple of 8. These sweeps keep d_model % 8 within
the authors' 0.04% (``--heads8``; at 0.001% K=7 has no such shape at L 10-14), the d_h/d_model
nearest each target winning. The one exception, ``k-sweep-unmatched``, changes only K: every point
has the reallocation run's d_model 1368 and its heads (19 x 72), so heads do not vary within it and
K=4 stays that run's config.

Paper 2's hyperparameter grid (its Figure 3: the narrowest layer's position r_l and width r_d,
searched at 200M, 500M and 1B; best at r_l 0.75, r_d 0.3 at every size) is :data:`WIDTH_GRID`: one
config per (size, r_l, r_d) extending that size's x config, its widths solved as the x config's are.
The grid's points are not given in the paper's text; this one brackets the optimum on both axes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import List

__all__ = ["SWEEPS", "BASELINE_113M", "HEADS", "HEAD_DIM", "WIDTH_GRID", "write_width_grid"]

BASELINE_113M = "configs/113M/baseline.yaml"
_K = [str(k) for k in range(1, 9)]
HEAD_DIM = 64  # the head size of every sweep whose d_model varies
HEADS = ["--attn-fraction", "1.0", "--head-dim", str(HEAD_DIM)]  # n_heads = round(d_model / 64)

# folder -> scripts/search.py arguments after BUDGET (the folder's --write is added by the caller)
SWEEPS: dict[str, list[str]] = {
    "configs/113M/ablations/k-sweep-unmatched": [
        "--K",
        *_K,
        "--d-model",
        "1368",
        "--layers",
        "6",
        "--d-h",
        "694",
    ],
    "configs/113M/ablations/k-sweep": [
        *"--K 1 2 3 4 5 6 7 8 --layers 12 --layer-slack 2 --d-h-ratio 0.5 --heads8".split(),
        *HEADS,
    ],
    "configs/113M/ablations/width-depth-K2": [
        *"--K 2 --layers 6 7 8 9 10 11 12 14 16 --d-h-ratio 0.5 --heads8".split(),
        *HEADS,
    ],
    "configs/113M/ablations/width-depth-K4": [
        *"--K 4 --layers 5 6 7 8 9 10 11 12 13 14 16 --d-h-ratio 0.5 --heads8".split(),
        *HEADS,
    ],
    "configs/113M/ablations/d_h-ratio": [
        *"--K 4 --layers 12 --d-h-ratio 0.1 0.2 0.3 0.4 0.45 0.5 0.55 0.6 0.7 0.8 --heads8".split(),
        *HEADS,
    ],
}

# Paper 2's r_l / r_d grid: folder -> (the sizes' x configs, r_l values, r_d values)
WIDTH_GRID: dict[str, tuple[tuple[str, ...], tuple[float, ...], tuple[float, ...]]] = {
    "configs/paper2/ablations/r_l-r_d": (
        ("configs/paper2/200M/x.yaml", "configs/paper2/500M/x.yaml", "configs/paper2/1B/x.yaml"),
        (0.5, 0.625, 0.75, 0.875),
        (0.2, 0.3, 0.4),
    )
}


def write_width_grid(root: Path, folder: str) -> List[Path]:
    """Write :data:`WIDTH_GRID`'s ``folder`` under ``root`` (the repository):
    FOLDER/<size>/x-rl<r_l>-rd<r_d>.yaml, each extending its size's x config; every config is loaded
    (its widths solved) before it is kept."""
    from ..config import load_spec

    configs, r_ls, r_ds = WIDTH_GRID[folder]
    written = []
    for config in configs:
        size = Path(config).parent.name
        out = root / folder / size
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("*.yaml"):
            old.unlink()
        rel = os.path.relpath(root / config, out)
        for r_l in r_ls:
            for r_d in r_ds:
                name = f"x-rl{r_l:g}-rd{r_d:g}"
                path = out / f"{name}.yaml"
                header = (
                    "# Generated by scripts/make_sweeps.py (olmo_patches/config/paper_sweeps.py, "
                    "WIDTH_GRID); do not edit by hand.\n"
                    f"# Paper 2's r_l / r_d grid (Figure 3) at {size}: the x shape with its "
                    "narrowest layer at r_l L and its\n"
                    "# continuous bottleneck width r_d h; the widths are solved to the baseline's "
                    f"parameters as in {Path(config).name}.\n"
                )
                path.write_text(
                    header
                    + f"""extends: {rel}
run:
  name: paper2-{size}-{name}
model:
  widths:
    r_l: {r_l:g}
    r_d: {r_d:g}
"""
                )
                load_spec(path)  # solvable, or ConfigError naming the file
                written.append(path)
    return written
