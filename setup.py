"""The build step pyproject.toml cannot state: the repository's configs/, data_order/ and scripts/
go into the wheel as olmo_patches/_data/ (olmo_patches/resources.py finds them there), while the
checkout keeps them at the top level. Everything else is in pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
DATA = ("configs", "data_order", "scripts")  # MANIFEST.in carries the same into the sdist


class BuildWithData(build_py):
    def run(self):
        super().run()
        if self.editable_mode:  # an editable install reads the checkout itself
            return
        target = Path(self.build_lib) / "olmo_patches" / "_data"
        for name in DATA:
            if (target / name).exists():
                shutil.rmtree(target / name)
            shutil.copytree(
                HERE / name, target / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
            )


setup(cmdclass={"build_py": BuildWithData})
