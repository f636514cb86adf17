"""A folder of wheels to install this project on an offline node whose Python already has a CUDA torch.

The set is the tested one: this project's requirements (pyproject.toml, with the chosen extras) and,
recursively, theirs, at the versions installed in the environment that runs this (the CPU venv the
tests pass in), with the markers evaluated for the target Python. torch's CUDA stack (torch, triton,
nvidia-*) is left out: the node brings its own torch, and ``install_requires`` accepts any version
OLMo-core does. flash-attn (the ``gpu`` extra) publishes no wheels on PyPI; it is installed on the
node from a wheel built for its torch and CUDA (``--add WHEEL`` puts it in the folder, where
``scripts/gpu_check.py --wheelhouse`` installs it; gpu_check fails on CUDA without it). Every wheel is fetched with ``pip download --no-deps
--only-binary=:all:`` for the target's Python version and platform tags, and :func:`missing` re-reads
the requirements from the downloaded wheels' own metadata to confirm that nothing is missing.

    python scripts/wheelhouse.py wheelhouse/ --python-version 3.12 --extras wandb,hf
    # on the node:
    pip install --no-index --find-links wheelhouse/ 'hourglass-olmo[wandb,hf]'
"""

from __future__ import annotations

import importlib.metadata as md
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import Iterable, Optional

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

__all__ = ["PLATFORMS", "GPU_CHECK_NEEDS", "brought_by_node", "project_requirements", "pinned_set", "download", "resolve", "wheels_in",
           "missing", "gpu_check_missing", "build"]

REPO = Path(__file__).resolve().parents[1]
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux2014_x86_64")  # glibc >= 2.28 nodes (RHEL 8, Ubuntu 20.04 and newer)


GPU_CHECK_NEEDS = ("flash-attn",)  # what scripts/gpu_check.py checks beyond the install: a wheel built on the node (no PyPI wheel)


def brought_by_node(name: str) -> bool:
    """torch and its CUDA stack: on the node already, never in the wheelhouse."""
    name = canonicalize_name(name)
    return name in ("torch", "triton", "pytorch-triton", "flash-attn") or name.startswith(("nvidia-", "cuda-"))


def _env(python_version: str, extra: str = "") -> dict:
    env = dict(default_environment())
    env.update(python_version=python_version, python_full_version=f"{python_version}.0", sys_platform="linux",
               platform_system="Linux", platform_machine="x86_64", os_name="posix", extra=extra)
    return env


def _applies(req: Requirement, python_version: str, extras: Iterable[str]) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate(_env(python_version, e)) for e in ("", *extras))


def project_requirements(extras: Iterable[str]) -> list[Requirement]:
    """pyproject.toml's dependencies plus the chosen extras (this checkout's, not an installed copy's)."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in extras:
        lines += project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines if line.strip()]


def pinned_set(extras: Iterable[str], python_version: str) -> dict[str, str]:
    """{name: version} of every distribution the project needs on the target, torch's stack excluded."""
    pinned: dict[str, str] = {}
    todo = [(r, ()) for r in project_requirements(extras)]
    while todo:
        req, req_extras = todo.pop()
        name = canonicalize_name(req.name)
        if brought_by_node(name) or not _applies(req, python_version, req_extras) or name in pinned:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            raise RuntimeError(f"{req} is needed on Python {python_version} but is not installed here to pin its version") from None
        if not req.specifier.contains(dist.version, prereleases=True):
            raise RuntimeError(f"{req} is needed but {name} {dist.version} is installed here")
        pinned[name] = dist.version
        todo += [(Requirement(r), tuple(req.extras)) for r in dist.requires or []]
    return dict(sorted(pinned.items()))


def _pip_target(python_version: str, platforms: Iterable[str]) -> list[str]:
    args = ["--no-deps", "--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
            "--abi", f"cp{python_version.replace('.', '')}", "--abi", "abi3", "--abi", "none"]
    for p in platforms:
        args += ["--platform", p]
    return args


def download(folder: Path, pins: dict[str, str], python_version: str, platforms: Iterable[str] = PLATFORMS) -> None:
    """``pip download --no-deps --only-binary=:all:`` of every pin for the target interpreter."""
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(folder), *_pip_target(python_version, platforms)]
    subprocess.run(cmd + [f"{n}=={v}" for n, v in pins.items()], check=True)


def resolve(pins: dict[str, str], python_version: str, platforms: Iterable[str] = PLATFORMS) -> dict[str, tuple[str, list[str], str]]:
    """{name: (version, Requires-Dist, wheel URL)} of the wheel pip picks for each pin on the target,
    from the index's metadata only (``pip install --dry-run --report``: no wheel is downloaded)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed", "--report", str(report),
               "--target", str(Path(tmp) / "target"), *_pip_target(python_version, platforms)]
        subprocess.run(cmd + [f"{n}=={v}" for n, v in pins.items()], check=True)
        items = json.loads(report.read_text())["install"]
    return {canonicalize_name(i["metadata"]["name"]): (i["metadata"]["version"], i["metadata"].get("requires_dist", []),
                                                       i["download_info"]["url"]) for i in items}


def wheels_in(folder: Path) -> dict[str, tuple[str, list[str], str]]:
    """{name: (version, Requires-Dist, file)} of the wheels in ``folder``, from their own METADATA."""
    out = {}
    for path in sorted(folder.glob("*.whl")):
        name, version, _, _ = parse_wheel_filename(path.name)
        with zipfile.ZipFile(path) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            msg = Parser().parsestr(z.read(meta).decode())
        out[canonicalize_name(name)] = (str(version), msg.get_all("Requires-Dist") or [], str(path))
    return out


def missing(wheels: dict[str, tuple[str, list[str], str]], extras: Iterable[str], python_version: str) -> list[str]:
    """Requirements of the project and, recursively, of the wheels (their own metadata, markers for
    ``python_version``) that no wheel meets, torch's stack aside: "requirement (needed by X)"."""
    extras = tuple(extras)
    needs: list[tuple[Requirement, tuple, str]] = [(r, extras, "hourglass-olmo") for r in project_requirements(extras)]
    seen, out = set(), []
    while needs:
        req, req_extras, by = needs.pop()
        name = canonicalize_name(req.name)
        if brought_by_node(name) or not _applies(req, python_version, req_extras) or (name, req_extras) in seen:
            continue
        seen.add((name, req_extras))
        if name not in wheels or not req.specifier.contains(wheels[name][0], prereleases=True):
            out.append(f"{req} (needed by {by})")
            continue
        needs += [(Requirement(r), tuple(req.extras), name) for r in wheels[name][1]]
    return sorted(out)


def gpu_check_missing(folder: Path) -> list[str]:
    """The names of :data:`GPU_CHECK_NEEDS` that no wheel in ``folder`` provides."""
    have = {canonicalize_name(parse_wheel_filename(w.name)[0]) for w in folder.glob("*.whl")}
    return [name for name in GPU_CHECK_NEEDS if canonicalize_name(name) not in have]


def build(folder: Path, extras: Iterable[str], python_version: str, platforms: Optional[Iterable[str]] = None,
          add: Iterable[Path] = ()) -> list[str]:
    """The wheelhouse: pins, downloads, this project's own wheel, and the wheels of ``add`` (a
    flash-attn built for the node's torch and CUDA); returns what is :func:`missing`."""
    folder.mkdir(parents=True, exist_ok=True)
    for wheel in add:
        shutil.copy2(wheel, folder / wheel.name)
    extras = tuple(extras)
    download(folder, pinned_set(extras, python_version), python_version, platforms or PLATFORMS)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir", str(folder), str(REPO)], check=True)
    return missing(wheels_in(folder), extras, python_version)
