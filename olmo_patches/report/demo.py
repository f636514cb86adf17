"""The embedded default job's comparison of the demo variants, once scripts/demo.py has trained
them.

It reads each run's metrics file. Output: a table on the console, ``summary.json`` (one entry per
variant) and ``loss_curves.png`` in the output folder. A variant that did not reach its planned
steps is listed as unfinished and left out of the comparison: the ratios are taken against the first
finished variant, and none is given for an unfinished one.
"""

from __future__ import annotations

import json
import logging
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from .console import console as rich_console  # noqa: E402
from ..config import ExperimentSpec  # noqa: E402
from ..launch.run_folder import read_metrics  # noqa: E402
from .counts import count, paper_report  # noqa: E402
from .figures import save_figure  # noqa: E402

__all__ = ["compare"]

VAL_LOSS, VAL_PPL = "eval/lm/val/CE loss", "eval/lm/val/PPL"
TRAIN_LOSS, TPS = "train/CE loss", "throughput/device/TPS"


@dataclass
class VariantResult:
    name: str
    block: str
    val_loss: Optional[float]  # final validation CE loss (nats per token); None: none yet
    val_ppl: Optional[float]
    first_val_loss: Optional[float]  # at initialisation: how far training moved it
    tokens_per_second: float  # median per-step training throughput (evaluation excluded)
    non_embedding_params: int
    matched_params: int  # the paper's match: non-embedding, variable width sum 16 w_l^2 - waste
    attention_params: int
    ffn_params: int
    train_tokens: int
    steps: int  # optimizer steps trained (the metrics file's last step)
    planned_steps: int  # the config's (train.max_steps, or train.max_tokens in steps)
    finished: bool  # steps == planned_steps; an unfinished variant is left out of the comparison


def summarize(spec: ExperimentSpec, run_dir: Path) -> VariantResult:
    """A run's numbers from its metrics file (a run that did not finish: where it stopped)."""
    metrics = read_metrics(run_dir)
    steps = sorted(metrics) or [0]
    finished = steps[-1] >= spec.steps
    vals = [metrics[s] for s in steps if VAL_LOSS in metrics.get(s, {})]
    if not vals and finished:
        raise RuntimeError(f"{run_dir}: no validation loss in the metrics file")
    last, first = (vals[-1], vals[0]) if vals else ({}, {})
    # Skip the first logged interval: it includes start-up and allocator warm-up.
    tps = [metrics[s][TPS] for s in steps if TPS in metrics.get(s, {})][1:] or [
        metrics.get(steps[-1], {}).get(TPS, 0.0)
    ]
    b = count(spec)
    matched = paper_report(spec)["matched_params"]
    seq, batch = spec.data.sequence_length, spec.train.global_batch_size
    return VariantResult(
        name=spec.run.name,
        block=spec.model.block,
        val_loss=last.get(VAL_LOSS),
        val_ppl=last.get(VAL_PPL),
        first_val_loss=first.get(VAL_LOSS),
        tokens_per_second=statistics.median(tps),
        non_embedding_params=b.non_embedding,
        matched_params=matched,
        attention_params=b.attention,
        ffn_params=b.ffn,
        train_tokens=steps[-1] * seq * batch,
        steps=steps[-1],
        planned_steps=spec.steps,
        finished=finished,
    )


def _f(x: Optional[float], fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _table(results: list[VariantResult]) -> Table:
    # the ratios' reference: a finished variant
    base = next((r for r in results if r.finished), None)
    table = Table(
        title="Demo: validation on held-out stdlib files (lower is better)",
        caption="mismatch: the papers' matched count (variable width: sum 16 w_l^2 - waste, off by "
        "the rounding of w_l to model.widths.multiple). val loss moved: at initialisation "
        "-> at the end. One seed each: no interval; two demo shapes' one-seed gap scatters by "
        "about 0.06 nats (docs/statistics.md).",
    )
    cols = (
        "variant",
        "steps",
        "non-embedding",
        "attn / FFN",
        "mismatch",
        "val loss",
        "val PPL",
        "train tokens/s",
        "val loss moved",
    )
    for col in cols:
        table.add_column(col, justify="left" if col == "variant" else "right")
    for r in results:
        compared = r.finished and base is not None
        table.add_row(
            r.name,
            f"{r.steps}/{r.planned_steps}" + ("" if r.finished else " [bold red]UNFINISHED[/]"),
            f"{r.non_embedding_params:,}",
            f"{r.attention_params / 1e3:,.0f}k / {r.ffn_params / 1e3:,.0f}k",
            f"{(r.matched_params - base.matched_params) / base.matched_params:+.4%}"
            if compared
            else "-",
            _f(r.val_loss, ".4f"),
            _f(r.val_ppl, ".2f"),
            f"{r.tokens_per_second:,.0f}"
            + (f" ({r.tokens_per_second / base.tokens_per_second:.2f}x)" if compared else ""),
            f"{_f(r.first_val_loss, '.2f')} -> {_f(r.val_loss, '.2f')}",
        )
    return table


def _plot(runs: list[tuple[VariantResult, Path]], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (r, run_dir) in enumerate(runs):
        metrics = read_metrics(run_dir)
        steps = sorted(s for s in metrics if TRAIN_LOSS in metrics[s])
        color, name = (
            f"C{i}",
            r.name if r.finished else f"{r.name} (UNFINISHED, {r.steps}/{r.planned_steps} steps)",
        )
        style = "-" if r.finished else ":"
        ax.plot(
            steps,
            [metrics[s][TRAIN_LOSS] for s in steps],
            style,
            color=color,
            alpha=0.6,
            label=f"{name} train",
        )
        val_steps = sorted(s for s in metrics if VAL_LOSS in metrics[s])
        val = [metrics[s][VAL_LOSS] for s in val_steps]
        ax.plot(val_steps, val, "o" + style, color=color, label=f"{name} validation")
    ax.set(xlabel="step", ylabel="cross-entropy (nats/token)", title="Demo loss curves")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def compare(
    specs: list[ExperimentSpec], out_dir: Path, console: Console | None = None
) -> list[VariantResult]:
    """Compare the runs of ``specs``: a table on the console, summary.json and loss_curves.png in
    ``out_dir``; an unfinished run is marked in each and left out of the comparison."""
    console = console or rich_console()
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = [(spec.run.name, Path(spec.save_folder)) for spec in specs]
    olmo_core_log = logging.getLogger("olmo_core")
    level = olmo_core_log.level
    # count() builds each model: no printout on the terminal
    olmo_core_log.setLevel(logging.WARNING)
    try:
        results = [summarize(spec, run_dir) for spec, (_, run_dir) in zip(specs, runs)]
    finally:
        olmo_core_log.setLevel(level)
    (out_dir / "summary.json").write_text(
        json.dumps({r.name: asdict(r) for r in results}, indent=2) + "\n"
    )
    _plot([(r, run_dir) for r, (_, run_dir) in zip(results, runs)], out_dir / "loss_curves.png")
    console.print(_table(results))
    if unfinished := [
        f"{r.name} ({r.steps}/{r.planned_steps} steps)" for r in results if not r.finished
    ]:
        console.print(
            f"[bold red]UNFINISHED[/] (fewer steps than planned), left out of the comparison (no "
            f"mismatch or ratio): {', '.join(unfinished)}"
        )
    console.print(f"wrote {out_dir / 'summary.json'} and {out_dir / 'loss_curves.png'}")
    disk = sum(
        f.stat().st_size for _, run_dir in runs for f in run_dir.glob("step*/**/*") if f.is_file()
    )
    console.print(
        f"checkpoints: {disk / 2**20:,.1f} MiB in {', '.join(str(d) for _, d in runs)} (step*/; "
        "the log of each run: train.log)"
    )
    return results
