"""The offline wheelhouse (scripts/wheelhouse.py) resolved for Python 3.12 on manylinux x86_64.

Downloading the 69 wheels (123 MiB) took 3.5 min here, too long for the suite; the test resolves the
same pins with pip against PyPI for the target (``--dry-run --report``: the index's metadata, no wheel
downloaded; 1.5 min here on 2 shared cores), then checks from the chosen wheels' own metadata and file
names, independently of the venv the pins come from, that the set is complete, installable on the
target and small (sizes from HEAD requests). Needs network to PyPI, as the wheelhouse itself does.
"""

import tomllib
from concurrent.futures import ThreadPoolExecutor
from urllib.request import Request, urlopen

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from olmo_patches.wheelhouse import pinned_set, resolve

from .conftest import REPO

EXTRAS = ["wandb", "hf"]
TARGET = {"python_version": "3.12", "python_full_version": "3.12.0", "sys_platform": "linux", "platform_system": "Linux",
          "platform_machine": "x86_64", "os_name": "posix", "implementation_name": "cpython", "platform_python_implementation": "CPython"}


def _node_has(name: str) -> bool:  # a CUDA torch install: torch, triton, the nvidia-* libraries
    return name in ("torch", "triton") or name.startswith("nvidia-")


def _needed(requirement: str) -> bool:
    """A Requires-Dist line that applies on the target without extras."""
    req = Requirement(requirement)
    return req.marker is None or Marker(str(req.marker)).evaluate({**TARGET, "extra": ""})


def _size(url: str) -> int:
    with urlopen(Request(url, method="HEAD"), timeout=60) as r:
        return int(r.headers["Content-Length"])


def test_wheelhouse_for_python_312_is_complete_and_small():
    pins = pinned_set(EXTRAS, "3.12")
    assert not any(_node_has(n) for n in pins)  # the node's CUDA torch stays
    assert {"ai2-olmo-core", "omegaconf", "numpy", "tokenizers", "wandb", "transformers"} <= set(pins)
    wheels = resolve(pins, "3.12")
    assert {n: v for n, (v, _, _) in wheels.items()} == pins
    for name, (version, requires, url) in wheels.items():
        _, _, _, tags = parse_wheel_filename(url.rsplit("/", 1)[-1])
        # CPython 3.12 on glibc x86_64: a pure wheel, or a manylinux x86_64 one built for cp312, for the
        # stable ABI (abi3) or for no Python ABI (a py3-none binary such as wandb's).
        assert any(t.platform == "any" or (t.platform.startswith("manylinux") and t.platform.endswith("x86_64")
                   and (t.interpreter == "cp312" or t.abi in ("abi3", "none"))) for t in tags), url
        for line in requires:
            if _needed(line):
                dep = canonicalize_name(Requirement(line).name)
                assert dep in wheels or _node_has(dep), f"{name} {version} needs {line}: not in the wheelhouse"
                if dep in wheels:
                    assert Requirement(line).specifier.contains(wheels[dep][0], prereleases=True), (name, line)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lines = project["dependencies"] + [l for e in EXTRAS for l in project["optional-dependencies"][e]]
    for line in filter(str.strip, lines):  # the project's own requirements
        req = Requirement(line)
        assert _node_has(req.name) or req.specifier.contains(wheels[canonicalize_name(req.name)][0]), line
    with ThreadPoolExecutor(16) as pool:
        total = sum(pool.map(_size, [url for _, _, url in wheels.values()]))
    print(f"wheelhouse for Python 3.12: {len(wheels)} wheels, {total / 2**20:.0f} MiB")
    assert len(wheels) < 100 and total < 200 * 2**20  # small: no torch (~900 MB CUDA build), no CUDA libraries
