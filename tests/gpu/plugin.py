"""The GPU acceptance run's table: a pytest plugin that gives each section (a test file of
tests/gpu/) a time budget, enforces it, and writes every row to OUT/gpu_check.json and
OUT/gpu_check.md after each test, so a run cut short still leaves its rows (scripts/gpu_check.py
passes it to pytest).

A row is one judged or shown figure of a test (the ``rows`` fixture of tests/gpu/conftest.py). A
test that raises adds a FAIL row with the error's last line; a test skipped for a dependency the run
may miss (``--allow-missing``) a SKIP row naming it, any other skip a FAIL row with its reason (no
silent pass). Budgets: the section's setup, calls and teardowns together; when they run past it,
SIGALRM raises :class:`OverBudget` in the test running, the section gets a FAIL row, its remaining
tests are not run (a FAIL row each) and the next section starts.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Optional

import pytest

from .table import Row, Section, Table

HERE = Path(__file__).resolve().parent
REHEARSE = pytest.StashKey[bool]()
ALLOW_MISSING = pytest.StashKey[frozenset]()


class OverBudget(Exception):
    pass


class RowsFailed(AssertionError):
    """Raised by a test whose own rows hold a FAIL (already in the table)."""


class GpuCheck(Table):
    """The plugin: :class:`Table` filled from pytest. ``allow_missing``: the dependencies whose
    checks are SKIP rows, not FAILs, when they do not import (scripts/gpu_check.py
    --allow-missing)."""

    def __init__(self, out: Path, *, allow_missing: frozenset = frozenset(), **kwargs):
        super().__init__(out, **kwargs)
        self.allow_missing = allow_missing
        self.outcomes: dict[str, list] = {}

    # -- pytest hooks ---------------------------------------------------------------------------
    def pytest_configure(self, config):
        config.stash[REHEARSE] = self.rehearse
        config.stash[ALLOW_MISSING] = self.allow_missing

    def pytest_report_header(self, config):
        mode = "rehearsal on CPU at toy sizes" if self.rehearse else "on the GPU"
        scale = f" (x {self.budget_scale:g}: --budget-scale)" if self.budget_scale != 1 else ""
        lines = [f"gpu_check {mode}: budgets (s){scale}, enforced per section"]
        lines += [
            f"  {s.title:<20} {s.budget_s:>5.0f}"
            + (f"  (took {s.seconds:.0f})" if s.started else "")
            for s in (*self.extra, *self.sections.values())
        ]
        lines.append(
            f"  {'total':<20} "
            f"{sum(s.budget_s for s in (*self.extra, *self.sections.values())):>5.0f}"
        )
        return lines

    def _section(self, item) -> Optional[Section]:
        return self.sections.get(item.path.name)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        section = self._section(item)
        if section is not None:
            if section.started is None:
                section.started = time.perf_counter()
            if section.over:
                item.add_marker(
                    pytest.mark.skip(
                        reason=f"not run: the section's {section.budget_s:.0f} s budget was spent"
                    )
                )
        self.outcomes[item.nodeid] = []
        yield
        if section is None:
            return
        self._collect(item, section)
        if nextitem is None or self._section(nextitem) is not section:
            self._finish(section)
        self.write()

    def _arm(self, item):
        section = self._section(item)
        if section is None or section.started is None:
            return
        left = section.budget_s - (time.perf_counter() - section.started)

        def alarm(signum, frame):
            section.over = True
            raise OverBudget(f"over the section's budget of {section.budget_s:.0f} s")

        if left <= 0:
            section.over = True
            raise OverBudget(f"over the section's budget of {section.budget_s:.0f} s")
        signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, left)

    @staticmethod
    def _disarm():
        signal.setitimer(signal.ITIMER_REAL, 0)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item):
        if item.get_closest_marker("skip") is None:
            self._arm(item)
        try:
            return (yield)
        finally:
            self._disarm()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        self._arm(item)
        try:
            return (yield)
        finally:
            self._disarm()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item, nextitem):
        section = self._section(item)
        if section is not None and not section.over:
            self._arm(item)
        try:
            return (yield)
        finally:
            self._disarm()

    def pytest_collectreport(self, report):
        """A test file that does not import (a missing package): a FAIL row of its section."""
        section = self.sections.get(Path(str(report.nodeid).split("::")[0]).name)
        if report.failed and section is not None:
            lines = [
                line for line in report.longreprtext.splitlines() if line.startswith("E ")
            ] or report.longreprtext.splitlines()[-1:]
            section.started = section.started or time.perf_counter()
            section.rows.append(
                Row(
                    section.title,
                    "",
                    "collection",
                    result="FAIL",
                    detail=lines[-1].removeprefix("E").strip()[:300] if lines else "",
                )
            )
            self.write()

    def pytest_runtest_logreport(self, report):
        if report.nodeid in self.outcomes and (report.failed or report.skipped):
            self.outcomes[report.nodeid].append(report)

    # -- the table ------------------------------------------------------------------------------
    def _collect(self, item, section: Section) -> None:
        test = item.name
        rows = [Row(**r) for k, r in item.user_properties if k == "gpu_check_row"]
        for report in self.outcomes.get(item.nodeid, []):
            if report.skipped:
                reason = (
                    report.longrepr[2]
                    if isinstance(report.longrepr, tuple)
                    else str(report.longrepr)
                )
                reason = reason.removeprefix("Skipped: ")
                # a SKIP the run was allowed (--allow-missing); any other skip in this run is a FAIL
                result = "SKIP" if reason.startswith("SKIP:") else "FAIL"
                rows.append(
                    Row(
                        section.title,
                        test,
                        test,
                        result=result,
                        detail=reason.removeprefix("SKIP: "),
                    )
                )
            elif "RowsFailed" not in report.longreprtext:
                text = report.longreprtext
                last = [line for line in text.splitlines() if line.startswith("E ")]
                why = (last[-1][1:].strip() if last else text.strip().splitlines()[-1])[:300]
                if (
                    "OverBudget" in text
                ):  # raised inside a library (dynamo wraps it): say what stopped the test
                    why = f"over the section's budget of {section.budget_s:.0f} s"
                rows.append(
                    Row(section.title, test, f"{test} ({report.when})", result="FAIL", detail=why)
                )
        section.rows += rows

    def _finish(self, section: Section) -> None:
        section.finished = True
        section.seconds = time.perf_counter() - section.started
        if section.seconds > section.budget_s:
            section.over = True
        if section.over:
            section.rows.append(
                Row(
                    section.title,
                    "",
                    "section time",
                    f"{section.seconds:.1f} s",
                    f"<= {section.budget_s:.0f} s",
                    "FAIL",
                    "over budget: the rest of the run went on",
                )
            )
