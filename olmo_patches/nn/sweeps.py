"""The paper's 113M sweeps (hourglass paper, Section 4 and its ablations) as scripts/search.py commands.

Each entry is one folder under configs/ and the search.py arguments that write it; every config in
the folder is generated (its first lines name the command), so ``python scripts/make_sweeps.py``
rewrites them all. Choices, against the paper's own numbers (docs/paper_runs.md, "The sweeps"):

- ``k-sweep-unmatched``: the K ablation, parameters growing with K (val PPL 40.153 at K=1 to 32.832 at
  K=8). Its base is the reallocation shape (K=4, L=6, d_model 1368, d_h 694), so K=4 is the 35.101 run;
  on the controlled base (d_model 768, L 12, d_h 384) K=8 would be the 36.179 run, not 32.832.
- ``width-depth-K2``/``-K4``: the U-curves of val loss against d_model/L at d_h/d_model 0.5, with
  points at and around the floors (K=2 near 180: L 7-9; K=4 near 110: L 9-11).
- ``d_h-ratio``: K=4 at L=12 exactly (the paper's fixed-L search, best near 0.4), d_h/d_model 0.1-0.8
  with 0.45 and 0.55 between.
- ``k-sweep``: K at a matched budget (d_h/d_model 0.5, L 12 +- 2), the paper's 0.001%.

The matched sweeps other than ``k-sweep`` keep head dims that are multiples of 8 (``--heads8``) within
the authors' 0.04% (0.001% has no such shape at most of these L).
"""

from __future__ import annotations

__all__ = ["SWEEPS", "BASELINE_113M"]

BASELINE_113M = "configs/113M/baseline.yaml"
_K = [str(k) for k in range(1, 9)]

# folder -> scripts/search.py arguments after BUDGET (the folder's --write is added by the caller)
SWEEPS: dict[str, list[str]] = {
    "configs/113M/ablations/k-sweep-unmatched": ["--K", *_K, "--d-model", "1368", "--layers", "6", "--d-h", "694"],
    "configs/113M/ablations/k-sweep": ["--K", *_K, "--layers", "12", "--layer-slack", "2", "--d-h-ratio", "0.5"],
    "configs/113M/ablations/width-depth-K2": ["--K", "2", "--layers", "6", "7", "8", "9", "10", "11", "12", "14", "16",
                                             "--d-h-ratio", "0.5", "--heads8"],
    "configs/113M/ablations/width-depth-K4": ["--K", "4", "--layers", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "16",
                                             "--d-h-ratio", "0.5", "--heads8"],
    "configs/113M/ablations/d_h-ratio": ["--K", "4", "--layers", "12", "--d-h-ratio", "0.1", "0.2", "0.3", "0.4", "0.45", "0.5",
                                         "0.55", "0.6", "0.7", "0.8", "--heads8"],
}
