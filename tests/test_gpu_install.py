"""The GPU acceptance run's offline install, rehearsed on CPU: `make wheelhouse` for this Python, a
flash-attn wheel beside it, a fresh venv that already holds torch (as a GPU node's Python does), then
`scripts/gpu_check.py --wheelhouse --rehearse` in that venv: pip install --no-index from the folder alone
(no index, no other find-links, no pip configuration), torch left as it was, every section on CPU.

Slow: pip downloads the wheelhouse (about 80 wheels, 120 MiB) and installs torch and it into the venv."""

import json
import os
import sys
import zipfile
from pathlib import Path

import pytest

from .conftest import run

pytestmark = pytest.mark.slow
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


def flash_attn_stand_in(folder: Path) -> Path:
    """A wheel with flash-attn 2.8.3's name, version and requirements (its setup.py: install_requires
    torch and einops) and no module: what the wheelhouse must complete, while `import flash_attn` still
    fails (OLMo-core then sees no flash-attn, as on a CPU)."""
    dist = "flash_attn-2.8.3.dist-info"
    files = {
        f"{dist}/METADATA": "Metadata-Version: 2.1\nName: flash-attn\nVersion: 2.8.3\nRequires-Dist: torch\nRequires-Dist: einops\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist}/RECORD"] = "".join(f"{name},,\n" for name in files) + f"{dist}/RECORD,,\n"
    path = folder / "flash_attn-2.8.3-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


def test_offline_install_keeps_torch_and_rehearses(tmp_path):
    wheelhouse, venv, out = tmp_path / "wheelhouse", tmp_path / "venv", tmp_path / "out"
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
    assert {"hourglass_olmo", "ai2_olmo_core", "torchao", "transformers", "einops", "pytest"} <= wheels, wheels
    assert not wheels & {"torch", "triton"} and not any(w.startswith("nvidia") for w in wheels), wheels  # the node's own
    flash_attn_stand_in(wheelhouse)
    print(r.stdout.strip().splitlines()[-1])

    # The node: a Python with torch and nothing of this project (torch from this machine's usual source).
    assert run([sys.executable, "-m", "venv", venv]).returncode == 0
    python = venv / "bin" / "python"
    r = run([python, "-m", "pip", "install", "--quiet", "torch==2.13.0"], timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    probe = ["-c", "import importlib.metadata as m, torch; print(torch.__version__, m.distribution('torch')._path)"]
    torch_before = run([python, *probe]).stdout

    offline = {"PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": str(wheelhouse), "PIP_NO_INDEX": "1"}
    r = run(
        [python, "scripts/gpu_check.py", "--wheelhouse", wheelhouse, "--rehearse", "--budget-scale", "3", "--out", out],
        timeout=1800,
        **offline,
    )  # budgets x3: a shared 2-core machine, and pip installs every wheel (a GPU node's Python has many already)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    assert run([python, *probe]).stdout == torch_before  # the same torch, in the same place: not replaced
    frozen = run([python, "-m", "pip", "freeze"], **offline).stdout.lower()
    assert (
        "hourglass-olmo==" in frozen
        and "flash-attn==2.8.3" in frozen
        and "einops==0.8.2" in frozen
        and "torchao==0.18.0" in frozen
    )

    result = json.loads((out / "gpu_check.json").read_text())
    install, *sections = result["sections"]
    assert install["title"] == "offline install" and install["result"] == "pass", install
    assert [s["title"] for s in sections] == ["bf16 vs fp32", "attention kernels", "compile", "resume", "trainer", "float8"]
    assert all(s["result"] == "pass" and s["seconds"] <= s["budget_s"] for s in sections), sections
    assert all(row["rehearsal"] for s in sections for row in s["rows"])
    print((out / "gpu_check.md").read_text().split("\n\n")[1])  # the sections' times against their budgets
