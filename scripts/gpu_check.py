"""The GPU acceptance run: pytest over tests/gpu/ (the ``gpu`` tests), one time budget per section
printed up front and enforced, every row written to OUT/gpu_check.json and OUT/gpu_check.md as it
comes (tests/gpu/plugin.py). Sections: bf16 vs fp32 per block type; the attention kernel at every
shipped head dim and torch SDPA's kernels' TFLOP/s per head dim; the hourglass FFN against a SwiGLU
of equal FLOPs at a 65k-token micro-batch beside its roofline (bf16 and float8); trainer MFU of the
baselines and the head-dim-native hourglass siblings, float8 / bf16 at 1B, and peak reserved memory
against the estimate; generation (prefill and decode tokens/s through the HF export). With --only:
compile per block family (and the trainer's shapes eager: their peaks against the eager estimate)
and resume exactness on the demo corpus (docs/gpu_checks.md: the command and what each judges).
Every dependency (torchao, flash-attn 2 and 3, Liger, grouped_gemm) is a row first: its version, or
missing and what ran instead; missing and needed by a judged check is a FAIL, or with
--allow-missing NAME a SKIP.

    # a node with a CUDA torch and nothing else
    python scripts/gpu_check.py --wheelhouse wheelhouse/ --out gpu_check/
    # the project installed already
    python scripts/gpu_check.py --out gpu_check/
    # every section on CPU at toy sizes
    python scripts/gpu_check.py --rehearse --out /tmp/gc

--wheelhouse FOLDER (make wheelhouse) first installs the project and what the run imports from
FOLDER with pip --no-index --no-deps, keeping the node's torch (a section of its own, with its
budget); a failed install still writes the table. Exit 1 if a row fails.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# tests/gpu/test_NAME.py (tests/gpu/table.py: SECTIONS), in the order they run
SECTION_NAMES = ("bf16", "attention", "compile", "resume", "ffn", "trainer", "generation")
# table.py: DEPENDENCIES
DEPENDENCY_NAMES = (
    "torchao",
    "flash_attn_2",
    "flash_attn_3",
    "liger",
    "transformers",
    "grouped_gemm",
)


def install(wheelhouse: Path) -> tuple[bool, str]:
    """pip install --no-index --no-deps of the wheelhouse's requirements.txt (what the acceptance
    run imports, make wheelhouse) and the project's wheel; the node's torch and its stack stay."""
    project = sorted(wheelhouse.glob("hourglass_olmo-*.whl"))
    listed = wheelhouse / "requirements.txt"
    if not project or not listed.is_file():
        return (
            False,
            f"{wheelhouse}: no hourglass_olmo wheel or requirements.txt (make wheelhouse writes "
            "both)",
        )
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-index",
        "--no-deps",
        "--find-links",
        str(wheelhouse),
    ]
    r = subprocess.run([*cmd, "-r", str(listed), str(project[-1])], capture_output=True, text=True)
    if r.returncode:
        return False, (r.stderr.strip().splitlines() or ["pip failed"])[-1][:300]
    return True, f"{len(listed.read_text().split())} wheels and {project[-1].name}"


class _Parser(argparse.ArgumentParser):
    """argparse's parser with its usage errors on one line (exit 2), as olmo_patches.cli's (not
    imported here: --wheelhouse installs the project after the arguments are read)."""

    def error(self, message: str):
        print(
            f"{self.prog}: error: {' '.join(message.split())} (--help for usage)", file=sys.stderr
        )
        sys.exit(2)


def _parser() -> argparse.ArgumentParser:
    """The command line: the sections to run, and where and how."""
    parser = _Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("gpu_check"),
        help="folder for gpu_check.json and gpu_check.md",
    )
    parser.add_argument(
        "--rehearse",
        action="store_true",
        help="every section on CPU at toy sizes (rows marked rehearsal)",
    )
    parser.add_argument(
        "--wheelhouse",
        type=Path,
        help="install the project and its dependencies from this folder first (no network)",
    )
    parser.add_argument(
        "--allow-missing",
        action="append",
        default=[],
        metavar="NAME",
        help="a dependency that may be missing: its checks become SKIP rows, not FAILs "
        f"({', '.join(DEPENDENCY_NAMES)})",
    )
    parser.add_argument(
        "--budget-scale",
        type=float,
        default=1.0,
        help="multiply every budget (a slower or busier machine than one H200)",
    )
    parser.add_argument(
        "--only",
        default="",
        help=f"comma list of sections to run ({', '.join(SECTION_NAMES)}; default: all but "
        "compile and resume)",
    )
    return parser


def _checked_sections(args: argparse.Namespace) -> list:
    """The sections --only names; a bad argument: one line, exit 2."""
    if not 0 < args.budget_scale < float("inf"):  # NaN too
        print(f"command line: --budget-scale {args.budget_scale}: must be > 0", file=sys.stderr)
        sys.exit(2)
    if args.wheelhouse is not None and not args.wheelhouse.is_dir():
        print(
            f"command line: --wheelhouse {args.wheelhouse}: not a folder (make wheelhouse writes "
            "one)",
            file=sys.stderr,
        )
        sys.exit(2)
    if unknown := set(args.allow_missing) - set(DEPENDENCY_NAMES):
        print(
            f"command line: --allow-missing {sorted(unknown)[0]}: one of "
            f"{', '.join(DEPENDENCY_NAMES)}",
            file=sys.stderr,
        )
        sys.exit(2)
    only = [s for s in args.only.split(",") if s]
    if set(only) - set(SECTION_NAMES):
        print(
            f"command line: --only {args.only}: the sections are {','.join(SECTION_NAMES)}",
            file=sys.stderr,
        )
        sys.exit(2)
    return only


def _install_section(wheelhouse: Path, ok: bool, detail: str, seconds: float, scale: float):
    """The offline install as a section of its own, judged against its budget."""
    from tests.gpu.table import INSTALL_ESTIMATE_S, Row, Section, budget

    limit = budget(INSTALL_ESTIMATE_S) * scale
    section = Section(
        "", "offline install", limit, seconds, started=0.0, over=seconds > limit, finished=True
    )
    result = "pass" if ok and seconds <= limit else "FAIL"
    command = f"pip install --no-index --no-deps --find-links {wheelhouse}"
    section.rows.append(
        Row("offline install", "", command, f"{seconds:.1f} s", f"<= {limit:.0f} s", result, detail)
    )
    return section


def _run_sections(args: argparse.Namespace, plugin, sections: dict) -> None:
    """pytest over the sections' files with only this run's plugin; exit 1 if a row fails."""
    import pytest

    if not args.rehearse:
        # inductor's kernel cache kept for a second try, compiled by a pool of workers
        # (tests/conftest.py)
        os.environ.setdefault(
            "TORCHINDUCTOR_CACHE_DIR", str(Path(tempfile.gettempdir()) / "gpu_check-inductor")
        )
        os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(min(32, os.cpu_count() or 1)))
    # only this run's plugin: nothing the node happens to hold
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    files = [str(REPO / "tests" / "gpu" / f) for f in sections]
    code = pytest.main(
        ["-q", "-p", "no:cacheprovider", "--rootdir", str(REPO), "-o", "addopts=", *files],
        plugins=[plugin],
    )
    plugin.write()
    print((args.out / "gpu_check.md").read_text())
    if plugin.failed or code not in (0, 5):
        print("gpu_check: FAIL rows above", file=sys.stderr)
        sys.exit(1)


def main() -> None:
    args = _parser().parse_args()
    only = _checked_sections(args)
    if not (REPO / "tests" / "gpu").is_dir():  # an installed copy: the wheel holds no tests/
        print(
            f"{REPO}: no tests/gpu/ here; the GPU checks run from a checkout: "
            "python scripts/gpu_check.py",
            file=sys.stderr,
        )
        sys.exit(2)

    if args.wheelhouse is not None:
        start = time.perf_counter()
        ok, detail = install(args.wheelhouse)
        seconds = time.perf_counter() - start
    sys.path.insert(0, str(REPO))  # this checkout's tests/ and olmo_patches/
    from tests.gpu.table import DEFAULT_RUN, SECTIONS, Table, dependency_section

    # the node's own torch: after the install, as torch looks for numpy once, when it is imported
    import torch

    if not args.rehearse and not torch.cuda.is_available():
        print(
            "command line: no CUDA device here; --rehearse runs every section on CPU at toy sizes",
            file=sys.stderr,
        )
        sys.exit(2)
    cuda = not args.rehearse
    extra = []
    if args.wheelhouse is not None:
        extra.append(_install_section(args.wheelhouse, ok, detail, seconds, args.budget_scale))
    allowed = frozenset(args.allow_missing)
    hopper = cuda and torch.cuda.get_device_capability(0)[0] == 9
    chosen = [f"test_{name}.py" for name in only] or DEFAULT_RUN
    generation = "test_generation.py" in chosen
    extra.append(dependency_section(allowed, cuda=cuda, hopper=hopper, generation=generation))
    device = "cpu (rehearsal)" if args.rehearse else torch.cuda.get_device_name(0)
    sections = {f: s for f, s in SECTIONS.items() if f in chosen}
    table = dict(
        device=device, torch_version=torch.__version__, sections=sections, extra=tuple(extra)
    )
    try:
        import pytest  # noqa: F401 (the sections' runner: its absence is reported here)

        from tests.gpu.plugin import GpuCheck
    except ImportError as e:  # a failed install: the table still says what is there
        Table(args.out, rehearse=args.rehearse, budget_scale=args.budget_scale, **table).write()
        print((args.out / "gpu_check.md").read_text())
        print(f"gpu_check: FAIL: {e}: the sections cannot run", file=sys.stderr)
        sys.exit(1)
    plugin = GpuCheck(
        args.out,
        rehearse=args.rehearse,
        allow_missing=allowed,
        budget_scale=args.budget_scale,
        **table,
    )
    plugin.write()
    _run_sections(args, plugin, sections)


if __name__ == "__main__":
    main()
