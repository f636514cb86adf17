"""The package as pip builds it: the wheel carries configs/, data_order/ and scripts/ (as
olmo_patches/_data/), py.typed and the hourglass-* commands; an unpacked wheel, away from any
checkout, finds its own copies. The full path (a fresh venv beside a current Hugging Face stack, the
commands and a 2-step demo from another folder) is .ci/install_check: minutes of pip, run by
.ci/run.
"""

import os
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from .conftest import REPO, run_elsewhere


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel pip builds from this checkout, offline (this venv's setuptools:
    --no-build-isolation)."""
    out = tmp_path_factory.mktemp("dist")
    r = run_elsewhere(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "-w",
            out,
            REPO,
        ],
        cwd=out,
        env=dict(os.environ),
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (path,) = out.glob("hourglass_olmo-*.whl")
    return path


@pytest.mark.slow
def test_wheel_carries_data_types_and_commands(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for rel in (
            "configs/demo/baseline.yaml",
            "configs/1B/hourglass.yaml",
            "data_order/olmo2-1b-stage1.txt",
            "scripts/launch_slurm.sbatch",
            "scripts/train.py",
        ):
            assert z.read(f"olmo_patches/_data/{rel}") == (REPO / rel).read_bytes(), rel
        shipped = {
            n.removeprefix("olmo_patches/_data/")
            for n in names
            if n.startswith("olmo_patches/_data/configs/")
        }
        assert shipped == {
            str(p.relative_to(REPO)) for p in (REPO / "configs").rglob("*") if p.is_file()
        }
        assert (
            "olmo_patches/py.typed" in names and "olmo_patches/report/paper_results.yaml" in names
        )
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        text = z.read(entry_points).decode()
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert "hourglass-train" in scripts and "hourglass-count" in scripts
    for name, target in scripts.items():
        assert f"{name} = {target}" in text


def test_unpacked_wheel_finds_its_own_data(wheel, tmp_path):
    """Away from the checkout (another folder, only the unpacked wheel on the path): the wheel's
    copies; ``python -m olmo_patches`` with an unknown command: one line, exit 2."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(site)}
    code = (
        "import olmo_patches.resources as r; "
        "print(r.data_root()); print(r.find_config('configs/demo/baseline.yaml')); "
        "print(r.find_config('nope.yaml'))"
    )
    r = run_elsewhere([sys.executable, "-c", code], cwd=elsewhere, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    root, config, missing = r.stdout.splitlines()
    assert Path(root) == site / "olmo_patches" / "_data"
    assert Path(config) == site / "olmo_patches" / "_data" / "configs" / "demo" / "baseline.yaml"
    assert missing == "nope.yaml"  # as given: the loader names the missing file
    r = run_elsewhere(
        [sys.executable, "-m", "olmo_patches", "nope"], cwd=elsewhere, env=env, timeout=120
    )
    assert (
        r.returncode == 2
        and r.stderr.count("\n") == 1
        and r.stderr.startswith("command line: unknown command 'nope'")
    )


def test_checkout_reads_its_own_folders(tmp_path, monkeypatch):
    from olmo_patches.resources import data_root, find_config

    assert data_root() == REPO
    monkeypatch.chdir(tmp_path)
    assert find_config("configs/demo/baseline.yaml") == REPO / "configs" / "demo" / "baseline.yaml"
    (tmp_path / "configs" / "demo").mkdir(parents=True)
    (tmp_path / "configs" / "demo" / "baseline.yaml").write_text("x: 1\n")
    assert find_config("configs/demo/baseline.yaml") == Path(
        "configs/demo/baseline.yaml"
    )  # the working folder's first


def test_a_missing_extra_is_named_in_one_line(tmp_path, monkeypatch, capsys):
    """A command that imports a module of an extra not installed (an install of the declared
    dependencies alone: .ci/install_check) ends in one line naming the extra, exit 2; a module no
    extra brings is an error of the project: its traceback."""
    import olmo_patches.commands as commands

    script = tmp_path / "needs.py"
    monkeypatch.setattr(commands, "data_path", lambda *parts: script)
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers: not installed
    for imported, code in (("transformers.modeling_utils", 2), ("no_such_module", None)):
        script.write_text(f"import {imported}\n")
        with pytest.raises(SystemExit if code else ModuleNotFoundError) as e:
            commands.run_command("export", [])
        assert code is None or e.value.code == code
    err = capsys.readouterr().err
    assert (
        err
        == "hourglass-export: needs transformers, the hf extra: pip install 'hourglass-olmo[hf]'\n"
    )
