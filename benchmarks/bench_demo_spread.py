"""How far the demo's figures travel: each demo variant trained under every CPU vector unit torch
dispatches to here (ATEN_CPU_CAPABILITY = default, avx2, avx512: what hosts without AVX-512, or
without AVX2, run), one intra-op thread each, and each loss's spread (largest - smallest).

    python benchmarks/bench_demo_spread.py [--steps 200] [--units default,avx512] [--jobs 2]
                                           [--out docs/demo/spread.json]

--steps N stops every variant at step N of the demo's own schedule (run.stop_at_step); at the
demo's 200 its final validation loss (the README's figure) is compared too. Written to --out: the
first PREFIX training losses and the final validation loss of each variant under each unit;
tests/test_demo.py holds a fresh run of the demo's first steps within that spread. docs/demo's
record was made with --units default,avx512 (the two ends; with --steps 3, avx2's losses equal
default's for every variant).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from olmo_patches.config.spec import default_demo_cache  # noqa: E402
from olmo_patches.data.demo import prepare_demo_corpus  # noqa: E402
from olmo_patches.launch.run_folder import read_metrics  # noqa: E402
from olmo_patches.report.demo import TRAIN_LOSS, VAL_LOSS  # noqa: E402

VARIANTS = ("baseline", "hourglass", "variable-width")
UNITS = ("default", "avx2", "avx512")  # torch's names, in the order torch.backends.cpu ranks them
PREFIX = 10  # training losses recorded per run


def _units() -> list[str]:
    """The vector units this CPU runs (torch dispatches to the best one by default)."""
    import torch

    best = torch.backends.cpu.get_cpu_capability().lower()
    return list(UNITS[: UNITS.index(best) + 1]) if best in UNITS else ["default"]


def _train(unit: str, variant: str, steps: int, work: Path) -> dict:
    folder = work / unit / variant
    command = [
        sys.executable,
        str(REPO / "scripts" / "train.py"),
        str(REPO / "configs" / "demo" / f"{variant}.yaml"),
        f"run.save_folder={folder}",
        "run.log_interval=1",
        *([f"run.stop_at_step={steps}"] if steps < 200 else []),
    ]
    env = dict(os.environ, ATEN_CPU_CAPABILITY=unit, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    r = subprocess.run(command, env=env, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"{unit} {variant}: exit {r.returncode}: {r.stderr.strip()[-2000:]}")
    metrics = read_metrics(folder)
    train = [metrics[s][TRAIN_LOSS] for s in sorted(metrics) if TRAIN_LOSS in metrics[s]]
    val = [metrics[s][VAL_LOSS] for s in sorted(metrics) if VAL_LOSS in metrics[s]]
    return {"train_loss": train[:PREFIX], "val_loss": val[-1], "steps": len(train)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=200, help="steps of each run (200: the demo)")
    parser.add_argument("--units", help="a comma-separated subset (default: every one here)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="runs at once")
    parser.add_argument("--out", type=Path, help="the JSON record (default: none written)")
    args = parser.parse_args()
    prepare_demo_corpus(default_demo_cache())  # once, before the runs read it
    units = [u for u in _units() if not args.units or u in args.units.split(",")]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        runs = {
            (v, u): pool.submit(_train, u, v, args.steps, Path(tmp))
            for v in VARIANTS
            for u in units
        }
        result = {k: r.result() for k, r in runs.items()}
    record = {"steps": args.steps, "threads": 1, "units": units, "variants": {}}
    for v in VARIANTS:
        record["variants"][v] = {u: result[v, u] for u in units}
        val = [result[v, u]["val_loss"] for u in units]
        train = [result[v, u]["train_loss"] for u in units]
        first_apart = next((i + 1 for i, ls in enumerate(zip(*train)) if len(set(ls)) > 1), None)
        final = (
            f"validation loss {' / '.join(f'{u} {x:.4f}' for u, x in zip(units, val))}, spread "
            f"{max(val) - min(val):.4f}; "
            if args.steps >= 200
            else ""
        )
        print(f"{v}: {final}training losses first apart at step {first_apart or f'> {PREFIX}'}")
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
