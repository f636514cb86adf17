"""The GPU acceptance run's offline install, rehearsed on CPU: `make wheelhouse` for this Python
(what the run imports, at most 56 MiB), a fresh venv that already holds torch (as a GPU node's
Python does), then `scripts/gpu_check.py --wheelhouse --rehearse` in that venv: pip install
--no-index --no-deps from the folder alone (no index, no other find-links, no pip configuration),
torch left as it was, every section on CPU (its rows judged as far as a CPU can); then torchao
uninstalled: the run exits 1 naming it, and with --allow-missing torchao exits 0, its row SKIP.

Slow: pip downloads the wheelhouse (56 wheels, 54 MiB) and installs torch and it into the venv."""

import json
import os
import sys
from pathlib import Path

import pytest

from .conftest import REPO, run
from .gpu.table import DEFAULT_RUN, INSTALL_ESTIMATE_S, SECTIONS, STARTUP_ESTIMATE_S, budget

pytestmark = pytest.mark.install
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
    """The offline install and every section passed, within budget, each row a rehearsal, and
    the rows judged as far as a CPU can: bf16's errors, the attention kernels at the shipped head
    dims, compile against eager, the resume, the trainer's and float8's rows."""
    result = json.loads((out / "gpu_check.json").read_text())
    install, deps, *sections = result["sections"]
    assert install["title"] == "offline install" and install["result"] == "pass", install
    assert deps["title"] == "dependencies" and deps["result"] == "SKIP", deps  # transformers
    titles = [
        "bf16 vs fp32",
        "attention kernels",
        "compile",
        "resume",
        "FFN vs FFN",
        "trainer",
        "generation",
    ]
    assert [s["title"] for s in sections] == titles
    skip = {"generation"}  # needs transformers
    assert all(
        s["result"] == ("SKIP" if s["title"] in skip else "pass")
        and (s["title"] in skip or 0 < s["seconds"])
        and s["seconds"] <= s["budget_s"]
        for s in sections
    ), sections
    assert all(row["rehearsal"] for s in [deps, *sections] for row in s["rows"])
    assert "pass (rehearsal)" in (out / "gpu_check.md").read_text()
    _check_dependencies({r["name"]: r for r in deps["rows"]})
    assert result["mode"] == "rehearsal" and result["device"] == "cpu (rehearsal)"
    assert result["budget_scale"] == 5
    # the default run's budgets on one H200 with start-up and the offline install: 6 minutes, so a
    # lent GPU (15 minutes, its start included) runs it twice
    default = sum(SECTIONS[f][1] for f in DEFAULT_RUN)
    assert default + budget(INSTALL_ESTIMATE_S) + STARTUP_ESTIMATE_S <= 6 * 60
    rows = {f"{s['title']}: {r['name']}": r for s in sections for r in s["rows"]}
    by_title = {s["title"]: s for s in sections}
    _check_bf16_and_attention(rows, by_title)
    _check_compile_and_resume(rows, by_title)
    _check_trainer_ffn_and_generation(rows, by_title)
    print(
        (out / "gpu_check.md").read_text().split("\n\n")[1]
    )  # the sections' times against their budgets


def _check_dependencies(deps: dict) -> None:
    """The dependency rows: the lock's torchao; the GPU-only kernels the wheelhouse leaves out named
    with their stand-ins (Liger is in it: the liger extra)."""
    assert deps["torchao"]["result"] == "pass" and deps["torchao"]["value"] == "0.18.0", deps
    for name in ("flash_attn_2", "flash_attn_3", "grouped_gemm"):
        assert deps[name]["result"] == "missing" and deps[name]["detail"].startswith("instead: "), (
            deps[name]
        )
    # the hf extra is not in the wheelhouse (64 MiB with the checkout): generation a SKIP there
    assert deps["transformers"]["result"] == "SKIP", deps["transformers"]


def _check_bf16_and_attention(rows: dict, sections: dict) -> None:
    """bf16 against fp32 per block, and the attention kernels at the shipped head dims."""
    for block in [
        "baseline pre",
        "baseline post",
        "hourglass pre",
        "hourglass post",
        "variable width carry_forward",
        "variable width zero",
        "variable width learned",
    ]:
        logits = rows[f"bf16 vs fp32: {block}: logits"]
        # bf16 really ran (errors well above fp32's 2^-24), and stayed within 16 bf16 roundoffs
        # (2^-8 each).
        assert 2.0**-16 < float(logits["value"]) <= 16 * 2.0**-8 and logits["result"] == "pass", (
            logits
        )
    # The attention rows at the rehearsal's three head dims of the shipped configs: the smallest,
    # the largest and the first that is not a multiple of 8 (read here from the configs themselves).
    from olmo_patches.config import load_spec
    from olmo_patches.nn.attention import head_dims

    shipped = sorted(
        {
            d
            for p in (REPO / "configs").rglob("*.yaml")
            if p.parent != REPO / "configs"  # configs/base*.yaml: bases
            for d in head_dims(load_spec(p).model_config())
        }
    )
    attention = sections["attention kernels"]["rows"]
    kernels = [r for r in attention if "vs torch SDPA (fp32), head_dim" in r["name"]]
    # torch SDPA's own kernels timed per head dim, the table's row last (CPU: flash only)
    assert (
        attention[-1]["name"] == "SDPA_KERNELS (nn/attention.py)"
        and "flash" in attention[-1]["value"]
    )
    dims = sorted({int(r["name"].split("head_dim ")[1].split(":")[0]) for r in kernels})
    odd = next(d for d in shipped if d % 8)
    assert len(kernels) == 2 * len(dims) == 6 and dims == sorted({shipped[0], shipped[-1], odd}), (
        dims,
        shipped,
    )
    assert all(2.0**-16 < float(r["value"]) and "stands in" in r["detail"] for r in kernels)


def _check_compile_and_resume(rows: dict, sections: dict) -> None:
    """Compiled against eager per block (no graph breaks, no recompiles), the trainer's shapes run
    eager for memory, and a bit-identical resume."""
    for block in ("baseline pre", "hourglass pre", "variable width learned"):
        for row in (
            "compiled vs eager: logits",
            "compiled vs eager: gradients (worst tensor)",
            "loss after 3 AdamW steps, compiled vs eager",
        ):
            # aot_eager runs the eager kernels; the hourglass's trace folds its norms (compiled
            # only: nn/hourglass.py), so its figures differ from eager's by fp32 rounding
            err = float(rows[f"compile: {block}: {row}"]["value"])
            assert err == 0.0 if block != "hourglass pre" else err <= 1e-5, (block, row, err)
        assert rows[f"compile: {block}: graph breaks (first 2 steps)"]["value"] == "0"
        assert (
            int(rows[f"compile: {block}: graph breaks (first 2 steps)"]["detail"].split()[0]) >= 2
        )  # each block: 2 graphs
        assert rows[f"compile: {block}: graphs compiled in 3 more training steps"]["value"] == "0"
    for what in ("113M baseline", "113M hourglass-hd96", "1B baseline", "1B hourglass-hd128"):
        row = rows[f"compile: {what} eager (toy): peak reserved <= estimate"]
        assert row["result"] == "shown" and row["detail"].startswith("eager terms"), row
    resume = sections["resume"]["rows"]
    assert [r["detail"] for r in resume] == ["bit-identical"] * 2  # one CPU process: deterministic


def _check_trainer_ffn_and_generation(rows: dict, sections: dict) -> None:
    """The trainer's rows at both scales (the 1B float8 run close to bf16), the FFN-against-FFN rows
    and the generation rows."""
    for scale, sibling in (("113M", "hourglass-hd96"), ("1B", "hourglass-hd128")):
        for variant in ("baseline", sibling):
            what = f"trainer: {scale} {variant} (toy)"
            assert float(rows[f"{what}: tokens/s"]["value"].replace(",", "")) > 0
            assert rows[f"{what}: peak reserved <= estimate"]["result"] == "shown"
            setting = rows[f"{what}: tokens/s"]["detail"]
            assert setting.startswith(
                "attention torch, loss default, float8 off, compile off, checkpointing off"
            ), setting
        assert rows[f"trainer: {scale}: MFU {sibling} / baseline"]["result"] == "shown"
    speed, loss = (
        rows["trainer: 1B: tokens/s float8 / bf16"],
        rows["trainer: 1B: loss float8 vs bf16, steps 1-3 (worst)"],
    )
    assert speed["result"] == "shown" and "torchao emulates" in speed["detail"]
    # float8 really ran, close to bf16
    assert 0 < float(loss["value"]) <= 0.05 and loss["result"] == "pass", loss
    for config in ("113M/hourglass", "113M/hourglass-aligned", "1B/hourglass",
                   "1B/hourglass-aligned", "906M/hourglass-revised"):  # fmt: skip
        ratio = rows[f"FFN vs FFN: {config} bf16: hourglass / baseline TFLOP/s"]
        assert ratio["result"] == "shown" and "roofline" in ratio["detail"], ratio
        assert rows[f"FFN vs FFN: {config}: compiled vs eager output"]["result"] == "pass"
        assert rows[f"FFN vs FFN: {config} float8 vs bf16: output"]["result"] == "pass"
    # without transformers (the hf extra, not in the wheelhouse) the generation section is a SKIP;
    # tests/test_gpu_ready.py and the plain rehearsal run it
    assert sections["generation"]["result"] == "SKIP", sections["generation"]


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
    every = ",".join(f[len("test_") : -len(".py")] for f in SECTIONS)  # compile, resume too
    r = run(
        [*gpu_check, "--wheelhouse", wheelhouse, "--only", every, "--out", out]
        + ["--allow-missing", "transformers"],
        timeout=1800,
        **offline,
    )
    # budgets x5: a shared 2-core machine, and pip installs every wheel (a GPU node's Python has
    # many already)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    assert _torch_where(python) == torch_before  # the same torch, in the same place: not replaced
    frozen = run([python, "-m", "pip", "freeze"], **offline).stdout.lower()
    assert "hourglass-olmo==" in frozen and "torchao==0.18.0" in frozen
    _check_the_rehearsal(out)
    _check_without_torchao(python, gpu_check, tmp_path, offline)
