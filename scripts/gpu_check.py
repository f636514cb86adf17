"""One GPU acceptance run: bf16 vs fp32 per block type, the attention kernel vs SDPA at every shipped
head dim, compile per block type, save/resume, trainer tokens/s, MFU and peak memory vs the estimate
for 113M and 1B, float8 / bf16 tokens/s and loss parity (olmo_patches/report/gpu_check.py).

    python scripts/gpu_check.py [--out gpu_check/] [--wheelhouse FOLDER] [--scales 113M,1B] [--no-flash]
    python scripts/gpu_check.py --nproc-per-node 8      # the trainer steps under torchrun: FSDP2, bf16, per rank
    python scripts/gpu_check.py --device cpu --tiny      # the same code at tiny shapes (tests)

On a node whose Python has a CUDA torch and nothing else of this project: --wheelhouse FOLDER
(scripts/wheelhouse.py, with --add for the node's flash-attn wheel) first installs every other
dependency from it, offline. On CUDA a flash-attn that does not import fails the check (--no-flash:
skipped on purpose). Writes OUT/gpu_check.json and OUT/gpu_check.md; exits 1 if a check fails.
"""

import argparse
import os
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
    parser.add_argument("--no-flash", action="store_true", help="no flash-attn on purpose: its rows are skipped, not failed")
    parser.add_argument("--nproc-per-node", type=int, default=0, help="run the trainer steps under torchrun on this many ranks")
    parser.add_argument("--only", default=None, help="comma list of sections (bf16 vs fp32, attention kernels, compile, resume, float8, trainer)")
    parser.add_argument("--variant", default="baseline,hourglass", help="trainer variants to time")
    args = parser.parse_args()
    if args.wheelhouse:
        from_folder = ["hourglass-olmo", *(["flash-attn"] if any(args.wheelhouse.glob("flash_attn-*.whl")) else [])]
        if len(from_folder) == 1 and args.device == "cuda" and not args.no_flash:
            print(f"--wheelhouse {args.wheelhouse}: no flash-attn wheel in it (scripts/wheelhouse.py --add WHEEL), or pass --no-flash", file=sys.stderr)
            sys.exit(2)
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(args.wheelhouse), *from_folder], check=True)
    sys.path.insert(0, str(REPO))  # this checkout, whatever the wheelhouse installed
    from olmo_patches.report.gpu_check import CHECKS, from_json, run_gpu_check, set_ratios, to_json, to_markdown

    rank = os.environ.get("RANK")  # a torchrun worker of --nproc-per-node
    only = args.only.split(",") if args.only else None
    if args.nproc_per_node and rank is None:
        only = [s for s in (*(c.section for c in CHECKS), "float8") if only is None or s in only]  # the trainer steps go to torchrun
    args.out.mkdir(parents=True, exist_ok=True)
    result = run_gpu_check(args.device, tiny=args.tiny, steps=args.steps, warmup=args.warmup, batch=args.batch,
                           scales=[s for s in args.scales.split(",") if s], flash=not args.no_flash, only=only, work=args.out,
                           variants=tuple(args.variant.split(",")))
    if rank is not None:  # the launching process merges every rank's rows
        (args.out / f"gpu_check.rank{rank}.json").write_text(to_json(result))
        return
    if args.nproc_per_node and (only is None or "trainer" in (args.only or "trainer")):
        for variant in args.variant.split(","):  # one launch per run: a process group is made once per process
            ranks = args.out / "torchrun" / variant
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc_per_node}", __file__,
                   "--only", "trainer", "--variant", variant, "--out", str(ranks), "--device", args.device, "--scales", args.scales,
                   "--steps", str(args.steps), "--warmup", str(args.warmup), "--batch", str(args.batch), *(["--tiny"] if args.tiny else [])]
            if subprocess.run(cmd).returncode != 0:
                print(f"gpu_check: the trainer steps under torchrun failed: {' '.join(cmd)}", file=sys.stderr)
                sys.exit(1)
            for r in range(args.nproc_per_node):
                result.train += from_json((ranks / f"gpu_check.rank{r}.json").read_text()).train
        set_ratios(result.train)
    (args.out / "gpu_check.json").write_text(to_json(result))
    (args.out / "gpu_check.md").write_text(table := to_markdown(result))
    print(table)
    if result.failed:
        print("FAILED: " + "; ".join(f"{c.section}: {c.name}" for c in result.failed), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
