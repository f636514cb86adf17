"""The GPU acceptance run's offline install, rehearsed on CPU: `make wheelhouse` for this Python
(what the run imports, at most 56 MiB), a fresh venv that already holds torch (as a GPU node's
Python does), then `scripts/gpu_check.py --wheelhouse --rehearse` in that venv: pip install
--no-index --no-deps from the folder alone (no index, no other find-links, no pip configuration),
torch left as it was, every section on CPU; then torchao uninstalled: the run exits 1 naming it, and
with --allow-missing torchao exits 0, its row SKIP.

Slow: pip downloads the wheelhouse (56 wheels, 54 MiB) and installs torch and it into the venv."""

import json
import os
import sys
from pathlib import Path

import pytest

from .conftest import run

pytestmark = pytest.mark.slow
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
WHEELHOUSE_MIB = (
    56  # what travels with a command to the lent GPU machine: 64 MiB, the checkout included
)


def _wheelhouse(wheelhouse: Path) -> None:
    """make wheelhouse: what the GPU run imports, torch and never-imported packages left out."""
    r = run(
        [
            "make",
            "-o",
            "install",
            "wheelhouse",
            f"BIN={Path(sys.executable).parent}",
            f"WHEELHOUSE={wheelhouse}",
            f"WHEEL_PYTHON={PYTHON}",
        ],
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    wheels = {p.name.split("-")[0].lower() for p in wheelhouse.glob("*.whl")}
    assert {
        "hourglass_olmo",
        "ai2_olmo_core",
        "torchao",
        "pytest",
        "numpy",
        "omegaconf",
    } <= wheels, wheels
    assert not wheels & {"torch", "triton", "transformers", "pandas", "matplotlib"}, (
        wheels
    )  # the node's, or never imported
    assert not any(w.startswith("nvidia") for w in wheels), wheels
    assert sum(p.stat().st_size for p in wheelhouse.iterdir()) <= WHEELHOUSE_MIB * 2**20
    print(r.stdout.strip().splitlines()[-1])


def _node_python(venv: Path) -> Path:
    """The node: a Python with torch and nothing of this project (torch from this machine's usual
    source)."""
    assert run([sys.executable, "-m", "venv", venv]).returncode == 0
    python = venv / "bin" / "python"
    r = run([python, "-m", "pip", "install", "--quiet", "torch==2.13.0"], timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return python


def _torch_where(python: Path) -> str:
    """The node's torch version and where it is installed."""
    probe = [
        "-c",
        "import importlib.metadata as m, torch; print(torch.__version__, "
        "m.distribution('torch')._path)",
    ]
    return run([python, *probe]).stdout


def _check_the_rehearsal(out: Path) -> None:
    """The offline install and every section passed, within budget, each row a rehearsal."""
    result = json.loads((out / "gpu_check.json").read_text())
    install, deps, *sections = result["sections"]
    assert install["title"] == "offline install" and install["result"] == "pass", install
    assert deps["title"] == "dependencies" and deps["result"] == "pass", deps
    titles = [
        "bf16 vs fp32",
        "attention kernels",
        "compile",
        "resume",
        "FFN vs FFN",
        "trainer",
        "float8",
    ]
    assert [s["title"] for s in sections] == titles
    assert all(s["result"] == "pass" and s["seconds"] <= s["budget_s"] for s in sections), sections
    assert all(row["rehearsal"] for s in sections for row in s["rows"])
    print(
        (out / "gpu_check.md").read_text().split("\n\n")[1]
    )  # the sections' times against their budgets


def _check_without_torchao(python: Path, gpu_check: list, tmp_path: Path, offline: dict) -> None:
    """torchao removed: the run says so and fails; allowed, it is a SKIP and the run passes."""
    assert (
        run([python, "-m", "pip", "uninstall", "--quiet", "--yes", "torchao"], **offline).returncode
        == 0
    )
    r = run(
        [*gpu_check, "--only", "bf16", "--out", tmp_path / "no-torchao"], timeout=900, **offline
    )
    rows = {
        r["name"]: r
        for r in json.loads((tmp_path / "no-torchao" / "gpu_check.json").read_text())["sections"][
            0
        ]["rows"]
    }
    assert (
        r.returncode == 1
        and rows["torchao"]["result"] == "FAIL"
        and "| torchao | missing |" in r.stdout
    ), r.stdout[-2000:]
    r = run(
        [*gpu_check, "--only", "bf16", "--allow-missing", "torchao", "--out", tmp_path / "allowed"],
        timeout=900,
        **offline,
    )
    rows = {
        r["name"]: r
        for r in json.loads((tmp_path / "allowed" / "gpu_check.json").read_text())["sections"][0][
            "rows"
        ]
    }
    assert r.returncode == 0 and rows["torchao"]["result"] == "SKIP", r.stdout[-2000:]


def test_offline_install_keeps_torch_and_rehearses(tmp_path):
    wheelhouse, venv, out = tmp_path / "wheelhouse", tmp_path / "venv", tmp_path / "out"
    _wheelhouse(wheelhouse)
    python = _node_python(venv)
    torch_before = _torch_where(python)
    offline = {
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_FIND_LINKS": str(wheelhouse),
        "PIP_NO_INDEX": "1",
    }
    gpu_check = [python, "scripts/gpu_check.py", "--rehearse", "--budget-scale", "5"]
    r = run([*gpu_check, "--wheelhouse", wheelhouse, "--out", out], timeout=1800, **offline)
    # budgets x5: a shared 2-core machine, and pip installs every wheel (a GPU node's Python has
    # many already)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    assert _torch_where(python) == torch_before  # the same torch, in the same place: not replaced
    frozen = run([python, "-m", "pip", "freeze"], **offline).stdout.lower()
    assert "hourglass-olmo==" in frozen and "torchao==0.18.0" in frozen
    _check_the_rehearsal(out)
    _check_without_torchao(python, gpu_check, tmp_path, offline)
