"""The GPU acceptance run: pytest over tests/gpu/ (the ``gpu`` tests), one time budget per section printed
up front and enforced, every row written to OUT/gpu_check.json and OUT/gpu_check.md as it comes
(tests/gpu/plugin.py). Sections: bf16 vs fp32 per block type, the attention kernel at every shipped head
dim, compile per block family, resume exactness, trainer tokens/s, MFU and peak reserved memory against
the estimate for 113M and 1B, float8 / bf16 tokens/s (docs/gpu_checks.md: the command and what each judges).

    python scripts/gpu_check.py --wheelhouse wheelhouse/ --out gpu_check/   # a node with a CUDA torch and nothing else
    python scripts/gpu_check.py --out gpu_check/                             # the project installed already
    python scripts/gpu_check.py --rehearse --out /tmp/gc                     # every section on CPU at toy sizes

--wheelhouse FOLDER (make wheelhouse) first installs the project and its dependencies from FOLDER with
pip --no-index, keeping the node's torch (a section of its own, with its budget). On CUDA a flash-attn
that does not import fails its row (--no-flash: skipped on purpose). Exit 1 if a row fails.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SECTION_NAMES = ("bf16", "attention", "compile", "resume", "trainer", "float8")  # tests/gpu/test_NAME.py (plugin.py: SECTIONS)


def install(wheelhouse: Path) -> tuple[bool, str]:
    """pip install --no-index from the wheelhouse: the project with its float8 and hf extras, pytest, and the
    flash-attn wheel where the folder has one; the node's torch stays (it meets the project's range)."""
    names = ["hourglass-olmo[float8,hf]", "pytest", *(["flash-attn"] if any(wheelhouse.glob("flash_attn-*.whl")) else [])]
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--find-links", str(wheelhouse), *names]
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode == 0, (r.stderr.strip().splitlines() or [""])[-1] if r.returncode else " ".join(names)


def _parser() -> argparse.ArgumentParser:
    """The command line: the sections to run, and where and how."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("gpu_check"), help="folder for gpu_check.json and gpu_check.md")
    parser.add_argument("--rehearse", action="store_true", help="every section on CPU at toy sizes (rows marked rehearsal)")
    parser.add_argument(
        "--wheelhouse", type=Path, help="install the project and its dependencies from this folder first (no network)"
    )
    parser.add_argument("--no-flash", action="store_true", help="no flash-attn on purpose: its row is skipped, not failed")
    parser.add_argument(
        "--budget-scale", type=float, default=1.0, help="multiply every budget (a slower or busier machine than one H200)"
    )
    parser.add_argument(
        "--only", default="", help="comma list of sections to run (bf16, attention, compile, resume, trainer, float8)"
    )
    return parser


def _checked_sections(args: argparse.Namespace) -> list:
    """The sections --only names; a bad argument: one line, exit 2."""
    if args.budget_scale <= 0:
        print(f"command line: --budget-scale {args.budget_scale}: must be > 0", file=sys.stderr)
        sys.exit(2)
    if args.wheelhouse is not None and not args.wheelhouse.is_dir():
        print(f"command line: --wheelhouse {args.wheelhouse}: not a folder (make wheelhouse writes one)", file=sys.stderr)
        sys.exit(2)
    only = [s for s in args.only.split(",") if s]
    if set(only) - set(SECTION_NAMES):
        print(f"command line: --only {args.only}: the sections are {','.join(SECTION_NAMES)}", file=sys.stderr)
        sys.exit(2)
    return only


def main() -> None:
    args = _parser().parse_args()
    only = _checked_sections(args)

    extra = []
    if args.wheelhouse is not None:
        start = time.perf_counter()
        ok, detail = install(args.wheelhouse)
        seconds = time.perf_counter() - start
    sys.path.insert(0, str(REPO))  # this checkout's tests/ and olmo_patches/
    import pytest
    from tests.gpu.plugin import INSTALL_BUDGET_S, SECTIONS, GpuCheck, Row, Section

    if args.wheelhouse is not None:
        budget = INSTALL_BUDGET_S * args.budget_scale
        install_section = Section("", "offline install", budget, seconds, started=0.0, over=seconds > budget, finished=True)
        install_section.rows.append(
            Row(
                "offline install",
                "",
                f"pip install --no-index --find-links {args.wheelhouse}",
                f"{seconds:.1f} s",
                f"<= {budget:.0f} s",
                "pass" if ok and seconds <= budget else "FAIL",
                detail,
            )
        )
        extra.append(install_section)
    sections = {f: s for f, s in SECTIONS.items() if not args.only or f[len("test_") : -len(".py")] in only}
    import torch  # after the install: torch looks for numpy once, when it is imported

    if not args.rehearse and not torch.cuda.is_available():
        print("command line: no CUDA device here; --rehearse runs every section on CPU at toy sizes", file=sys.stderr)
        sys.exit(2)
    device = "cpu (rehearsal)" if args.rehearse else torch.cuda.get_device_name(0)
    plugin = GpuCheck(
        args.out,
        rehearse=args.rehearse,
        no_flash=args.no_flash,
        device=device,
        torch_version=torch.__version__,
        sections=sections,
        extra=tuple(extra),
        budget_scale=args.budget_scale,
    )
    plugin.write()
    if not args.rehearse:  # inductor's kernel cache kept for a second try, compiled by a pool of workers (tests/conftest.py)
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(tempfile.gettempdir()) / "gpu_check-inductor"))
        os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(min(32, os.cpu_count() or 1)))
    files = [str(REPO / "tests" / "gpu" / f) for f in sections]
    code = pytest.main(
        ["-q", "-p", "no:cacheprovider", "-p", "no:randomly", "--rootdir", str(REPO), "-o", "addopts=", *files], plugins=[plugin]
    )
    plugin.write()
    print((args.out / "gpu_check.md").read_text())
    if plugin.failed or code not in (0, 5):
        print("gpu_check: FAIL rows above", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
