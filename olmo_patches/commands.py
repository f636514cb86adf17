"""The console commands (``hourglass-train`` ...) and ``python -m olmo_patches COMMAND``: each runs
the script of the same job under scripts/ (found by :mod:`olmo_patches.resources`, in a checkout or
a wheel) as ``__main__``, so a command and ``python scripts/NAME.py`` are the same program.

torchrun launches either form: ``torchrun --nproc-per-node N --no-python hourglass-train CONFIG`` or
``torchrun --nproc-per-node N -m olmo_patches train CONFIG``.
"""

from __future__ import annotations

import runpy
import sys
from typing import List, NoReturn, Optional

from .resources import data_path

__all__ = ["COMMANDS", "main"]

# command (after "hourglass-") -> scripts/ file
COMMANDS = {
    "train": "train.py",
    "count": "count_params.py",
    "demo": "demo.py",
    "evaluate": "evaluate.py",
    "export": "export_hf.py",
    "search": "search.py",
    "sweep": "sweep.py",
    "bench": "bench.py",
    "config-table": "config_table.py",
    "tables": "make_tables.py",
    "verify-checkpoints": "verify_checkpoints.py",
    "data-order": "data_order.py",
    "gpu-check": "gpu_check.py",
    "tokenize": "tokenize_data.py",
    "coordcheck": "coordcheck.py",
}


# what an extra of pyproject.toml brings (the module a command imports -> the extra)
EXTRAS = {"transformers": "hf", "olmo_eval": "eval", "lm_eval": "lm-eval", "torchao": "float8"}


def run_command(name: str, argv: List[str]) -> None:
    """Run scripts/COMMANDS[name] with ``argv`` as its arguments, as
    ``python scripts/FILE argv...``; a module of an extra not installed: one line naming the
    extra, exit 2."""
    script = data_path("scripts", COMMANDS[name])
    sys.argv = [f"hourglass-{name}", *argv]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except ModuleNotFoundError as e:
        module = (e.name or "").split(".")[0]
        if (extra := EXTRAS.get(module)) is None:
            raise
        print(
            f"hourglass-{name}: needs {module}, the {extra} extra: "
            f"pip install 'hourglass-olmo[{extra}]'",
            file=sys.stderr,
        )
        raise SystemExit(2) from None


def main(argv: Optional[List[str]] = None) -> NoReturn:
    """``python -m olmo_patches COMMAND [ARGS...]``."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in COMMANDS:
        given = f" {args[0]!r}" if args else ""
        print(
            f"command line: unknown command{given}; choose from {', '.join(COMMANDS)}",
            file=sys.stderr,
        )
        raise SystemExit(2)
    run_command(args[0], args[1:])
    raise SystemExit(0)


def _entry(name: str):
    def run() -> None:
        run_command(name, sys.argv[1:])

    run.__name__ = name.replace("-", "_")
    return run


# console_scripts entry points (pyproject.toml [project.scripts]): hourglass-<name> ->
# olmo_patches.commands:<name>
train = _entry("train")
count = _entry("count")
demo = _entry("demo")
evaluate = _entry("evaluate")
export = _entry("export")
search = _entry("search")
sweep = _entry("sweep")
bench = _entry("bench")
config_table = _entry("config-table")
tables = _entry("tables")
verify_checkpoints = _entry("verify-checkpoints")
data_order = _entry("data-order")
gpu_check = _entry("gpu-check")
tokenize = _entry("tokenize")
coordcheck = _entry("coordcheck")
