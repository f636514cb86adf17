"""Where the repository's data files are: configs/, data_order/ and scripts/ (the SLURM launcher and
the command scripts), in a checkout and in an installed wheel alike.

A checkout reads them in place (beside the ``olmo_patches`` folder). A wheel carries a copy under
``olmo_patches/_data/`` (setup.py's build step copies them at build time; the repository keeps them
where they are). Both are found through ``importlib.resources``; pip installs wheels unpacked, so
the result is a real folder.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["data_root", "data_path", "find_config"]

BUNDLED = "_data"  # the wheel's folder inside the package (setup.py)


def data_root() -> Path:
    """The folder holding configs/, data_order/ and scripts/: the checkout's, else the wheel's
    copy."""
    package = Path(str(resources.files("olmo_patches")))
    checkout = package.parent
    if (checkout / "configs").is_dir() and (checkout / "scripts").is_dir():
        return checkout
    bundled = package / BUNDLED
    if bundled.is_dir():
        return bundled
    raise FileNotFoundError(
        f"neither {checkout}/configs nor {bundled}: a broken install (reinstall hourglass-olmo)"
    )


def data_path(*parts: str) -> Path:
    """``data_path("configs", "demo")``: a path under :func:`data_root` (it need not exist)."""
    return data_root().joinpath(*parts)


def find_config(path: str | Path) -> Path:
    """A config as given when it exists (relative to the working folder), else the same relative
    path under :func:`data_root` when that exists (``configs/demo/baseline.yaml`` from any folder
    once the package is installed), else as given (the loader then names the missing file)."""
    given = Path(path)
    if given.exists() or given.is_absolute():
        return given
    shipped = data_root() / given
    return shipped if shipped.exists() else given
