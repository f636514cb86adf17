"""The GPU acceptance run's table without pytest: rows, sections, their budgets, the dependency rows
and the writer of OUT/gpu_check.json and OUT/gpu_check.md. scripts/gpu_check.py writes it even when
the offline install failed (no pytest to run the sections); tests/gpu/plugin.py fills it from
pytest.

Results: pass, FAIL, SKIP (a check that needs a package the run was told may be missing:
``--allow-missing NAME``), shown (a figure, not judged), missing (a package no judged claim here
needs, with what ran instead). Exit 1 on any FAIL; SKIP and missing rows name themselves.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Optional

# The sections in the order they run: test file -> (title, estimate s) on one H200. An estimate is
# the section's time on one H200, rounded up, its cold compiles (each trainer run resets dynamo) and
# warm-up steps included: bf16, the attention kernels' numerics, compile and resume from the
# acceptance run of 2026-12-04 (torch 2.11.0+cu130, flash-attn absent: docs/performance.md), and
# compile's four eager trainer runs (7 s each: no compile, 2 steps); FFN, trainer and generation
# scaled from it by their new work (not yet run). The budget is the
# estimate x BUDGET_MARGIN, rounded up to 5 s (docs/gpu_checks.md). DEFAULT_RUN, what a plain run
# runs, fits 6 minutes of budgets with the install and start-up, so that a lent GPU can run it
# twice; compile and resume run with --only.
BUDGET_MARGIN = 1.3
ESTIMATES = {
    "test_bf16.py": ("bf16 vs fp32", 5),
    "test_attention.py": ("attention kernels", 20),
    "test_compile.py": ("compile", 114),
    "test_resume.py": ("resume", 36),
    "test_ffn.py": ("FFN vs FFN", 60),
    "test_trainer.py": ("trainer", 100),
    "test_generation.py": ("generation", 50),
}
DEFAULT_RUN = ("test_bf16.py", "test_attention.py", "test_ffn.py", "test_trainer.py",
               "test_generation.py")  # fmt: skip
INSTALL_ESTIMATE_S = 18  # pip --no-deps of the wheelhouse's 50-odd wheels, no resolution
STARTUP_ESTIMATE_S = (
    15  # Python, torch and pytest imports, collection, before the first section's clock
)


def budget(estimate: float) -> float:
    return 5 * -(-estimate * BUDGET_MARGIN // 5)


SECTIONS = {
    f: (title, budget(estimate)) for f, (title, estimate) in ESTIMATES.items()
}  # file -> (title, budget s)


@dataclass(frozen=True)
class Dependency:
    name: str  # as --allow-missing names it
    modules: tuple[
        str, ...
    ]  # any of these importing makes it present (OLMo-core's own import order)
    dists: tuple[str, ...]  # distributions to read the version from
    instead: str  # what runs without it


DEPENDENCIES = {
    d.name: d
    for d in (
        Dependency("torchao", ("torchao",), ("torchao",), "nothing: train.float8 cannot run"),
        Dependency(
            "flash_attn_2",
            ("flash_attn",),
            ("flash-attn", "flash_attn"),
            "torch SDPA (attention backend torch)",
        ),
        Dependency(
            "flash_attn_3",
            ("flash_attn_3.flash_attn_interface", "flash_attn_interface"),
            ("flash-attn-3", "flash_attn_3", "flashattn-hopper"),
            "flash_attn_2 where it imports, else torch SDPA",
        ),
        Dependency(
            "liger",
            ("liger_kernel.ops.fused_linear_cross_entropy",),
            ("liger-kernel", "liger_kernel"),
            "OLMo-core's default loss: the fp32 logits over the 100k vocabulary, "
            "then cross-entropy",
        ),
        Dependency(
            "transformers",
            ("transformers",),
            ("transformers",),
            "nothing: the generation section cannot run (the hf extra; not in the wheelhouse)",
        ),
        Dependency(
            "grouped_gemm",
            ("grouped_gemm",),
            ("grouped_gemm", "grouped-gemm"),
            "OLMo-core's MoE experts one at a time",
        ),
    )
}


def needed_by(name: str, *, cuda: bool, hopper: bool, generation: bool = True) -> str:
    """The judged claim of this run that needs dependency ``name`` ("" none): float8 everywhere (a
    rehearsal emulates it), generation through the HF export everywhere, the flash kernels on CUDA
    only (flash-attn 3 on Hopper, where ``auto`` picks it)."""
    return {
        "torchao": "float8: StackedLinear and the trainer in float8",
        "transformers": "generation: the HF export's generate" if generation else "",
        "flash_attn_2": "attention kernels: flash-attn 2 at every shipped head dim" if cuda else "",
        "flash_attn_3": "attention kernels: auto picks flash_3 on H100/H200"
        if cuda and hopper
        else "",
    }.get(name, "")


def probe(dep: Dependency) -> tuple[Optional[str], str]:
    """(version, "") when ``dep`` imports, else (None, why)."""
    why = ""
    for module in dep.modules:
        try:
            mod = importlib.import_module(module)
        except Exception as e:  # a wheel built for another torch raises ImportError or OSError
            why = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
            continue
        for dist in dep.dists:
            try:
                return importlib.metadata.version(dist), ""
            except importlib.metadata.PackageNotFoundError:
                pass
        return str(getattr(mod, "__version__", "version unknown")), ""
    return None, why


@dataclass
class Row:
    section: str
    test: str
    name: str
    value: str = ""
    threshold: str = ""
    result: str = "pass"  # pass | FAIL | SKIP | shown | missing
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
        results = {r.result for r in self.rows}
        if not self.finished and "FAIL" not in results:
            return "running"  # a run cut short here: its rows so far are in the table
        if self.over or "FAIL" in results:
            return "FAIL"
        return "SKIP" if "SKIP" in results else "pass"


def dependency_section(
    allowed: frozenset[str], *, cuda: bool, hopper: bool, generation: bool = True
) -> Section:
    """One row per dependency: present (its version), or missing with what runs instead; FAIL when a
    judged claim needs it and it is not in ``allowed``, SKIP when it is."""
    section = Section("", "dependencies", 0.0, started=0.0, finished=True)
    for dep in DEPENDENCIES.values():
        version, why = probe(dep)
        need = needed_by(dep.name, cuda=cuda, hopper=hopper, generation=generation)
        if version is not None:
            result, detail = "pass", need or "not needed by a judged claim here"
        elif not need:
            result, detail = "missing", f"instead: {dep.instead} ({why})"
        elif dep.name in allowed:
            result, detail = (
                "SKIP",
                f"--allow-missing {dep.name}: {need} not judged; instead: {dep.instead}",
            )
        else:
            result, detail = (
                "FAIL",
                f"{need} needs it ({why}); --allow-missing {dep.name} to run without it",
            )
        section.rows.append(
            Row("dependencies", "", dep.name, version or "missing", "", result, detail)
        )
    return section


class Table:
    """``device`` and ``torch_version`` head the table; ``extra`` sections (the offline install, the
    dependencies) come first, already done."""

    def __init__(
        self,
        out,
        *,
        rehearse: bool,
        device: str = "",
        torch_version: str = "",
        sections: Optional[dict[str, tuple[str, float]]] = None,
        extra: tuple[Section, ...] = (),
        budget_scale: float = 1.0,
    ):
        self.out, self.rehearse, self.budget_scale = out, rehearse, budget_scale
        self.device, self.torch_version = device, torch_version
        chosen = SECTIONS if sections is None else sections
        self.sections = {f: Section(f, t, b * budget_scale) for f, (t, b) in chosen.items()}
        self.extra = list(extra)
        self.started = time.time()

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
        mode = (
            " (rehearsal: CPU, toy sizes; speed and memory rows not judged)"
            if self.rehearse
            else ""
        )
        mode += f" (budgets x {self.budget_scale:g})" if self.budget_scale != 1 else ""
        lines = [
            f"gpu_check on {data['device']}, torch {data['torch']}, {data['date']}{mode}: "
            f"{data['seconds']:.0f} s of a "
            f"{data['budget_s']:.0f} s budget",
            "",
            "| section | budget s | time s | result |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {s['title']} | {s['budget_s']:.0f} | {s['seconds']:.1f} | {s['result']} |"
            for s in data["sections"]
        ]
        lines += [
            "",
            "| section | check | value | threshold | result | detail |",
            "|---|---|---|---|---|---|",
        ]
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
