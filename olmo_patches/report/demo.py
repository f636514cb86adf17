"""The embedded default job's comparison of the demo variants, once scripts/demo.py has trained them.

It reads each run's metrics file. Output: a table on the console, ``summary.json`` (one entry per
variant) and ``loss_curves.png`` in the output folder.
"""

from __future__ import annotations

import json
import logging
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from .console import console as rich_console  # noqa: E402
from ..blocks import block_of  # noqa: E402
from ..config import ExperimentSpec  # noqa: E402
from ..launch.run_folder import read_metrics  # noqa: E402
from .counts import count  # noqa: E402
from .figures import save_figure  # noqa: E402

__all__ = ["compare"]

VAL_LOSS, VAL_PPL = "eval/lm/val/CE loss", "eval/lm/val/PPL"
TRAIN_LOSS, TPS = "train/CE loss", "throughput/device/TPS"


@dataclass
class VariantResult:
    name: str
    block: str
    val_loss: float  # validation CE loss at the end of training (nats per token)
    val_ppl: float
    first_val_loss: float  # validation loss at initialisation, to show how far training moved it
    tokens_per_second: float  # median per-step training throughput (evaluation excluded)
    non_embedding_params: int
    matched_params: int  # what the paper matches: non-embedding, or for variable width sum 16 w_l^2 - waste
    attention_params: int
    ffn_params: int
    train_tokens: int


def summarize(spec: ExperimentSpec, run_dir: Path) -> VariantResult:
    """A finished run's numbers from its metrics file."""
    metrics = read_metrics(run_dir)
    steps = sorted(metrics)
    vals = [metrics[s] for s in steps if VAL_LOSS in metrics[s]]
    if not vals:
        raise RuntimeError(f"{run_dir}: no validation loss in the metrics file")
    # Skip the first logged interval: it includes start-up and allocator warm-up.
    tps = [metrics[s][TPS] for s in steps if TPS in metrics[s]][1:] or [metrics[steps[-1]].get(TPS, 0.0)]
    b = count(spec)
    matched = block_of(spec.model).matched_params(spec.model, b.non_embedding)
    seq, batch = spec.data.sequence_length, spec.train.global_batch_size
    return VariantResult(
        name=spec.run.name,
        block=spec.model.block,
        val_loss=vals[-1][VAL_LOSS],
        val_ppl=vals[-1][VAL_PPL],
        first_val_loss=vals[0][VAL_LOSS],
        tokens_per_second=statistics.median(tps),
        non_embedding_params=b.non_embedding,
        matched_params=matched,
        attention_params=b.attention,
        ffn_params=b.ffn,
        train_tokens=steps[-1] * seq * batch,
    )


def _table(results: list[VariantResult]) -> Table:
    base = results[0]
    table = Table(
        title="Demo: validation on held-out stdlib files (lower is better)",
        caption="mismatch: the papers' matched count (variable width: sum 16 w_l^2 - waste, off by the rounding "
        "of w_l to model.widths.multiple). val loss moved: at initialisation -> at the end.",
    )
    for col in ("variant", "non-embedding", "attn / FFN", "mismatch", "val loss", "val PPL", "train tokens/s", "val loss moved"):
        table.add_column(col, justify="left" if col == "variant" else "right")
    for r in results:
        mismatch = (r.matched_params - base.matched_params) / base.matched_params
        table.add_row(
            r.name,
            f"{r.non_embedding_params:,}",
            f"{r.attention_params / 1e3:,.0f}k / {r.ffn_params / 1e3:,.0f}k",
            f"{mismatch:+.4%}",
            f"{r.val_loss:.4f}",
            f"{r.val_ppl:.2f}",
            f"{r.tokens_per_second:,.0f} ({r.tokens_per_second / base.tokens_per_second:.2f}x)",
            f"{r.first_val_loss:.2f} -> {r.val_loss:.2f}",
        )
    return table


def _plot(runs: list[tuple[str, Path]], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (name, run_dir) in enumerate(runs):
        metrics = read_metrics(run_dir)
        steps = sorted(s for s in metrics if TRAIN_LOSS in metrics[s])
        color = f"C{i}"
        ax.plot(steps, [metrics[s][TRAIN_LOSS] for s in steps], color=color, alpha=0.6, label=f"{name} train")
        val_steps = sorted(s for s in metrics if VAL_LOSS in metrics[s])
        ax.plot(val_steps, [metrics[s][VAL_LOSS] for s in val_steps], "o-", color=color, label=f"{name} validation")
    ax.set(xlabel="step", ylabel="cross-entropy (nats/token)", title="Demo loss curves")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def compare(specs: list[ExperimentSpec], out_dir: Path, console: Console | None = None) -> list[VariantResult]:
    """Compare the finished runs of ``specs``: a table on the console, summary.json and loss_curves.png in ``out_dir``."""
    console = console or rich_console()
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = [(spec.run.name, Path(spec.save_folder)) for spec in specs]
    olmo_core_log = logging.getLogger("olmo_core")
    level = olmo_core_log.level
    olmo_core_log.setLevel(logging.WARNING)  # count() builds each model: no printout on the terminal
    try:
        results = [summarize(spec, run_dir) for spec, (_, run_dir) in zip(specs, runs)]
    finally:
        olmo_core_log.setLevel(level)
    (out_dir / "summary.json").write_text(json.dumps({r.name: asdict(r) for r in results}, indent=2) + "\n")
    _plot(runs, out_dir / "loss_curves.png")
    console.print(_table(results))
    console.print(f"wrote {out_dir / 'summary.json'} and {out_dir / 'loss_curves.png'}")
    disk = sum(f.stat().st_size for _, run_dir in runs for f in run_dir.glob("step*/**/*") if f.is_file())
    console.print(
        f"checkpoints: {disk / 2**20:,.1f} MiB in {', '.join(str(d) for _, d in runs)} (step*/; the log of each run: train.log)"
    )
    return results
