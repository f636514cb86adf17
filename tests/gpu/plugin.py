"""The GPU acceptance run's table: a pytest plugin that gives each section (a test file of tests/gpu/)
a time budget, enforces it, and writes every row to OUT/gpu_check.json and OUT/gpu_check.md after
each test, so a run cut short still leaves its rows (scripts/gpu_check.py passes it to pytest).

A row is one judged or shown figure of a test (the ``rows`` fixture of tests/gpu/conftest.py). A test
that raises adds a FAIL row with the error's last line; a skipped test a "skipped" row with its reason.
Budgets: the section's setup, calls and teardowns together; when they run past it, SIGALRM raises
:class:`OverBudget` in the test running, the section gets a FAIL row, its remaining tests are not run
(a FAIL row each) and the next section starts.
"""

from __future__ import annotations

import json
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import pytest

HERE = Path(__file__).resolve().parent
REHEARSE = pytest.StashKey[bool]()
NO_FLASH = pytest.StashKey[bool]()

# The sections in the order they run: test file, title, budget in seconds on one H200 (docs/gpu_checks.md
# gives each one's work). With the offline install's INSTALL_BUDGET_S they add up to 470 s, under 8 minutes.
SECTIONS = {
    "test_bf16.py": ("bf16 vs fp32", 20),
    "test_attention.py": ("attention kernels", 30),
    "test_compile.py": ("compile", 70),
    "test_resume.py": ("resume", 45),
    "test_trainer.py": ("trainer", 165),
    "test_float8.py": ("float8", 80),
}
INSTALL_BUDGET_S = 60


class OverBudget(Exception):
    pass


class RowsFailed(AssertionError):
    """Raised by a test whose own rows hold a FAIL (already in the table)."""


@dataclass
class Row:
    section: str
    test: str
    name: str
    value: str = ""
    threshold: str = ""
    result: str = "pass"  # pass | FAIL | shown (a figure, not judged) | skipped
    detail: str = ""


@dataclass
class Section:
    file: str
    title: str
    budget_s: float
    seconds: float = 0.0
    started: Optional[float] = None
    over: bool = False
    finished: bool = False
    rows: list[Row] = field(default_factory=list)

    @property
    def result(self) -> str:
        if self.started is None:
            return "not run"
        if not self.finished and not any(r.result == "FAIL" for r in self.rows):
            return "running"  # a run cut short here: its rows so far are in the table
        return "FAIL" if self.over or any(r.result == "FAIL" for r in self.rows) else "pass"


class GpuCheck:
    """The plugin. ``device`` and ``torch_version`` head the table; ``extra`` sections (the offline
    install) come first, already timed."""

    def __init__(
        self,
        out: Path,
        *,
        rehearse: bool,
        no_flash: bool = False,
        device: str = "",
        torch_version: str = "",
        sections: Optional[dict[str, tuple[str, float]]] = None,
        extra: tuple[Section, ...] = (),
        budget_scale: float = 1.0,
    ):
        self.out, self.rehearse, self.no_flash, self.budget_scale = out, rehearse, no_flash, budget_scale
        self.device, self.torch_version = device, torch_version
        self.sections = {f: Section(f, t, b * budget_scale) for f, (t, b) in (SECTIONS if sections is None else sections).items()}
        self.extra = list(extra)
        self.started = time.time()
        self.outcomes: dict[str, list] = {}

    # -- pytest hooks ---------------------------------------------------------------------------
    def pytest_configure(self, config):
        config.stash[REHEARSE] = self.rehearse
        config.stash[NO_FLASH] = self.no_flash

    def pytest_report_header(self, config):
        mode = "rehearsal on CPU at toy sizes" if self.rehearse else "on the GPU"
        scale = f" (x {self.budget_scale:g}: --budget-scale)" if self.budget_scale != 1 else ""
        lines = [f"gpu_check {mode}: budgets (s){scale}, enforced per section"]
        lines += [
            f"  {s.title:<20} {s.budget_s:>5.0f}" + (f"  (took {s.seconds:.0f})" if s.started else "")
            for s in (*self.extra, *self.sections.values())
        ]
        lines.append(f"  {'total':<20} {sum(s.budget_s for s in (*self.extra, *self.sections.values())):>5.0f}")
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
                item.add_marker(pytest.mark.skip(reason=f"not run: the section's {section.budget_s:.0f} s budget was spent"))
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
                reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
                reason = reason.removeprefix("Skipped: ")
                spent = reason.startswith("not run: the section's")
                rows.append(Row(section.title, test, test, result="FAIL" if spent else "skipped", detail=reason))
            elif "RowsFailed" not in report.longreprtext:
                text = report.longreprtext
                last = [line for line in text.splitlines() if line.startswith("E ")]
                why = (last[-1][1:].strip() if last else text.strip().splitlines()[-1])[:300]
                if "OverBudget" in text:  # raised inside a library (dynamo wraps it): say what stopped the test
                    why = f"over the section's budget of {section.budget_s:.0f} s"
                rows.append(Row(section.title, test, f"{test} ({report.when})", result="FAIL", detail=why))
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

    def all_sections(self) -> list[Section]:
        return [*self.extra, *self.sections.values()]

    @property
    def failed(self) -> bool:
        return any(s.result == "FAIL" for s in self.all_sections())

    def to_json(self) -> dict:
        return {
            "device": self.device,
            "torch": self.torch_version,
            "mode": "rehearsal" if self.rehearse else "gpu",
            "budget_scale": self.budget_scale,
            "date": time.strftime("%Y-%m-%d", time.gmtime(self.started)),
            "budget_s": sum(s.budget_s for s in self.all_sections()),
            "seconds": round(time.time() - self.started, 1),
            "sections": [
                {
                    "title": s.title,
                    "file": s.file,
                    "budget_s": s.budget_s,
                    "seconds": round(s.seconds, 1),
                    "result": s.result,
                    "rows": [{**asdict(r), "rehearsal": self.rehearse} for r in s.rows],
                }
                for s in self.all_sections()
            ],
        }

    def to_markdown(self) -> str:
        data = self.to_json()
        mode = " (rehearsal: CPU, toy sizes; speed and memory rows not judged)" if self.rehearse else ""
        mode += f" (budgets x {self.budget_scale:g})" if self.budget_scale != 1 else ""
        lines = [
            f"gpu_check on {data['device']}, torch {data['torch']}, {data['date']}{mode}: {data['seconds']:.0f} s of a "
            f"{data['budget_s']:.0f} s budget",
            "",
            "| section | budget s | time s | result |",
            "|---|---|---|---|",
        ]
        lines += [f"| {s['title']} | {s['budget_s']:.0f} | {s['seconds']:.1f} | {s['result']} |" for s in data["sections"]]
        lines += ["", "| section | check | value | threshold | result | detail |", "|---|---|---|---|---|---|"]
        for s in data["sections"]:
            for r in s["rows"]:
                result = r["result"] + (" (rehearsal)" if self.rehearse else "")
                cells = [r["section"], r["name"], r["value"], r["threshold"], result, r["detail"]]
                lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
        return "\n".join(lines) + "\n"

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "gpu_check.json").write_text(json.dumps(self.to_json(), indent=1))
        (self.out / "gpu_check.md").write_text(self.to_markdown())
