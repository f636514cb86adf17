"""The GPU checks' fixtures. Every test here is marked ``gpu`` (as OLMo-core's ``requires_gpu``):
without a CUDA device it is skipped with the reason, unless scripts/gpu_check.py --rehearse runs it
on CPU at toy sizes through the same code (its rows marked "rehearsal"; speed and memory rows shown,
not judged)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import pytest
import torch

from .plugin import ALLOW_MISSING, REHEARSE, Row, RowsFailed
from .table import DEPENDENCIES, SECTIONS, probe

NEEDS_GPU = "needs a CUDA GPU (python scripts/gpu_check.py --rehearse runs it on CPU at toy sizes)"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if (
        item.get_closest_marker("gpu")
        and not torch.cuda.is_available()
        and not item.config.stash.get(REHEARSE, False)
    ):
        pytest.skip(NEEDS_GPU)


@dataclass(frozen=True)
class Env:
    """Where and how big: the CUDA device at the real sizes, or (rehearse) the CPU at toy sizes."""

    device: torch.device
    rehearse: bool
    allow_missing: (
        frozenset  # dependencies whose checks are SKIP rows when missing (--allow-missing)
    )
    work: Path

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def hopper(self) -> bool:
        return self.cuda and torch.cuda.get_device_capability(self.device)[0] == 9

    def need(self, name: str, claim: str) -> None:
        """Go on only if dependency ``name`` imports: else a SKIP (allowed by --allow-missing) or a
        FAIL."""
        version, why = probe(DEPENDENCIES[name])
        if version is not None:
            return
        if name in self.allow_missing:
            pytest.skip(f"SKIP: {name} missing (--allow-missing {name}): {claim} not checked")
        pytest.fail(
            f"{name} missing ({why}): {claim} needs it; --allow-missing {name} to run without it",
            pytrace=False,
        )


@pytest.fixture(scope="module")
def env(request, tmp_path_factory) -> Env:
    rehearse = request.config.stash.get(REHEARSE, False)
    device = torch.device("cpu" if rehearse else "cuda")
    allowed = request.config.stash.get(ALLOW_MISSING, frozenset())
    return Env(device, rehearse, allowed, tmp_path_factory.mktemp("gpu"))


class Rows:
    """A test's rows of the table, recorded on the test item as they are added (a test that raises
    still leaves them). ``judge`` passes or fails a figure; with ``gpu_only`` a rehearsal shows it
    instead (toy sizes on a CPU say nothing about speed or CUDA memory)."""

    def __init__(self, item, env: Env):
        self.item, self.env = item, env
        self.section = SECTIONS.get(item.path.name, (item.path.stem, 0))[0]
        self.rows: list[Row] = []

    def _add(self, row: Row) -> Row:
        self.rows.append(row)
        self.item.user_properties.append(("gpu_check_row", asdict(row)))
        return row

    def judge(
        self,
        name: str,
        value: str,
        ok: bool,
        threshold: str,
        detail: str = "",
        gpu_only: bool = False,
    ) -> Row:
        if gpu_only and self.env.rehearse:
            return self.show(
                name,
                value,
                detail or f"not judged in a rehearsal (on a GPU: {threshold})",
                threshold,
            )
        return self._add(
            Row(
                self.section,
                self.item.name,
                name,
                value,
                threshold,
                "pass" if ok else "FAIL",
                detail,
            )
        )

    def show(self, name: str, value: str, detail: str = "", threshold: str = "") -> Row:
        return self._add(Row(self.section, self.item.name, name, value, threshold, "shown", detail))

    def check(self) -> None:
        failed = [
            f"{r.name}: {r.value} (threshold {r.threshold})"
            for r in self.rows
            if r.result == "FAIL"
        ]
        if failed:
            raise RowsFailed("; ".join(failed))


@pytest.fixture
def rows(request, env) -> Rows:
    return Rows(request.node, env)
