"""One GPU acceptance run: bf16 vs fp32 per block type, flash vs SDPA, compile on/off, trainer
tokens/s, MFU and peak memory vs the estimate for 113M and 1B, save/resume (olmo_patches/report/gpu_check.py).

    python scripts/gpu_check.py [--out gpu_check/] [--wheelhouse FOLDER] [--scales 113M,1B]
    python scripts/gpu_check.py --device cpu --tiny      # the same code at tiny shapes (tests)

On a node whose Python has a CUDA torch and nothing else of this project: --wheelhouse FOLDER
(scripts/wheelhouse.py) first installs every other dependency from it, offline. Writes
OUT/gpu_check.json and OUT/gpu_check.md; exits 1 if a check fails.
"""

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cuda (default) or cpu")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes, a few steps (the CPU test)")
    parser.add_argument("--out", type=Path, default=Path("gpu_check"), help="folder for gpu_check.json and gpu_check.md")
    parser.add_argument("--wheelhouse", type=Path, help="install the dependencies from this folder first (no network)")
    parser.add_argument("--scales", default="113M,1B", help="trainer configs to time: 113M, 1B")
    parser.add_argument("--steps", type=int, default=8, help="trainer steps per config (the first --warmup untimed)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed trainer steps (compilation happens here)")
    parser.add_argument("--batch", type=int, default=32, help="global batch in sequences (the preset picks the micro-batch)")
    args = parser.parse_args()
    if args.wheelhouse:
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(args.wheelhouse), "hourglass-olmo"], check=True)
    sys.path.insert(0, str(REPO))  # this checkout, whatever the wheelhouse installed
    from olmo_patches.report.gpu_check import run_gpu_check, to_json, to_markdown

    result = run_gpu_check(args.device, tiny=args.tiny, steps=args.steps, warmup=args.warmup, batch=args.batch,
                           scales=[s for s in args.scales.split(",") if s])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check.json").write_text(to_json(result))
    (args.out / "gpu_check.md").write_text(table := to_markdown(result))
    print(table)
    if result.failed:
        print("FAILED: " + "; ".join(f"{c.section}: {c.name}" for c in result.failed), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
