"""The papers' tables from finished (or partial) runs, beside the numbers the papers reported.

A run is a folder with ``config.yaml`` (the resolved spec) and ``metrics.jsonl``; it is known by
its ``run.name``. The reported numbers come from ``paper_results.yaml`` only. Each table is a list
of rows (dicts) written as markdown and CSV; a row whose run is missing says "not run", and one
whose run stopped short of its planned steps says so in its ``steps``.

Validation PPL of a run = exp(mean CE loss over the paper's four validation sets) at the run's
last evaluation; where none of the four were evaluated (e.g. the demo's single "val" set), the
mean over the sets that were.

Seeds (:func:`group_seeds`): the runs ``NAME-seedS`` (``scripts/sweep.py --seeds``; ``NAME`` is
seed 0) are one :class:`SeedGroup` known as ``NAME``. Its cells give the mean over seeds with its
95% Student-t interval (report/stats.py; PPL: exp of the loss's, the geometric mean), and a
``seeds`` column appears in a table with such a row. Seeds whose recorded configs differ beyond
the seeds (and the keys a rerun may change) are refused, never pooled.
"""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional

import numpy as np
import yaml
from omegaconf import OmegaConf

from ..blocks import get_block
from ..config import ConfigError, ExperimentSpec, load_spec
from ..eval.names import PAPER_VALIDATION_SETS
from ..launch.run_folder import changed_between, read_metrics, recorded_configs
from ..launch.sweep import SEED_KEYS, seed_of
from ..resources import data_root
from . import stats

__all__ = [
    "Run",
    "SeedGroup",
    "load_runs",
    "group_seeds",
    "paper_results",
    "build_tables",
    "ablation_configs",
    "write_tables",
    "NOT_RUN",
    "NO_NUMBER",
    "variable_width_table",
]

PAPER_RESULTS = Path(__file__).with_name("paper_results.yaml")
REPO = data_root()  # configs/ of the checkout or the installed wheel
NOT_RUN = "not run"
NO_NUMBER = "no number reported"
_LM = re.compile(r"^eval/lm/(.+)/CE loss$")
_DOWNSTREAM = re.compile(r"^eval/downstream/(.+) \((.+)\)$")


def paper_results() -> dict:
    return yaml.safe_load(PAPER_RESULTS.read_text())


@dataclass
class Run:
    path: Path
    config: Dict[str, Any]
    metrics: Dict[int, Dict[str, float]] = field(default_factory=dict)
    record: Optional[Path] = None  # the config file it trains with (None: path / config.yaml)

    @property
    def name(self) -> str:
        return str(self.config["run"]["name"])

    @property
    def model(self) -> Dict[str, Any]:
        return self.config["model"]

    @property
    def stacks_ffn(self) -> bool:
        """Its block kind stacks K sub-MLPs per layer at constant width (has model.K): a point of
        the K sweeps (a variable-width kind's K shapes its hourglass FFN, no point of them)."""
        kind = get_block(str(self.model.get("block", "baseline")))
        return "K" in kind.knobs and kind.constant_width

    @cached_property
    def spec(self) -> ExperimentSpec:
        """The run's recorded config, loaded as a run loads it (its keys resolved)."""
        return load_spec(self.record or self.path / "config.yaml")

    @property
    def d_h(self) -> Optional[int]:
        """The bottleneck width of a K-sweep point (``d_h``, ``d_h_ratio`` or K=1's d_ff), else
        None."""
        return self.spec.model.resolved_d_h if self.stacks_ffn else None

    @cached_property
    def latest(self) -> Dict[str, float]:
        """Each logged key's value at the last step that logged it (read once: tables ask often)."""
        return {k: v for step in sorted(self.metrics) for k, v in self.metrics[step].items()}

    def last(self, key: str) -> Optional[float]:
        return self.latest.get(key)

    @property
    def last_step(self) -> int:
        return max(self.metrics, default=0)

    def val_losses(self) -> Dict[str, float]:
        """{validation set: CE loss} at each set's last evaluation."""
        keys = {m.group(1) for k in self.latest if (m := _LM.match(k))}
        return {
            label.removesuffix("-validation"): self.last(f"eval/lm/{label}/CE loss")
            for label in sorted(keys)
        }  # type: ignore[misc]

    def val_loss(self) -> Optional[float]:
        losses = self.val_losses()
        chosen = [v for k, v in losses.items() if k in PAPER_VALIDATION_SETS] or list(
            losses.values()
        )
        return sum(chosen) / len(chosen) if chosen else None

    def val_ppl(self) -> Optional[float]:
        loss = self.val_loss()
        return math.exp(loss) if loss is not None else None

    def downstream(self, task: str, metric: str) -> Optional[float]:
        """accuracy (length-normalized where reported, else plain) or ppl (exp CE loss)."""
        found = {
            m.group(2): v
            for k, v in self.latest.items()
            if (m := _DOWNSTREAM.match(k)) and m.group(1) == task
        }
        if metric == "ppl":
            return math.exp(found["CE loss"]) if "CE loss" in found else None
        for kind in ("length-normalized accuracy", "accuracy"):
            if kind in found:
                return found[kind]
        return None


@dataclass
class SeedGroup(Run):
    """One config trained at several seeds: ``seeds`` {offset: run}, the first's path and config.
    Its numbers are means over the seeds that have them; ``last_step`` is the fewest steps any
    seed ran."""

    group: str = ""
    seeds: Dict[int, Run] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.group

    @property
    def last_step(self) -> int:
        return min(r.last_step for r in self.seeds.values())

    def _found(self, value: Callable[[Run], Optional[float]]) -> List[float]:
        return [v for r in self.seeds.values() if (v := value(r)) is not None]

    def _mean(self, value: Callable[[Run], Optional[float]]) -> Optional[float]:
        found = self._found(value)
        return float(np.mean(found)) if found else None

    def val_losses(self) -> Dict[str, float]:
        per_seed = [r.val_losses() for r in self.seeds.values()]
        sets = sorted({k for losses in per_seed for k in losses})
        return {k: float(np.mean([s[k] for s in per_seed if k in s])) for k in sets}

    def val_loss(self) -> Optional[float]:
        return self._mean(Run.val_loss)

    def downstream(self, task: str, metric: str) -> Optional[float]:
        """The mean accuracy; ppl: exp of the mean CE loss (the geometric mean PPL)."""
        if metric != "ppl":
            return self._mean(lambda r: r.downstream(task, metric))
        loss = self._mean(lambda r: _log(r.downstream(task, metric)))
        return math.exp(loss) if loss is not None else None

    def interval(self, value: Callable[[Run], Optional[float]], log: bool = False):
        """The mean of ``value`` over seeds with its t-interval (log: of ln value, exp'd), or
        None."""
        found = self._found(value)
        if not found:
            return None
        if log:
            return stats.mean_interval(np.log(found)).exp()
        return stats.mean_interval(found)


def _log(x: Optional[float]) -> Optional[float]:
    return math.log(x) if x is not None else None


def load_runs(paths: Iterable[str | Path]) -> Dict[str, Run]:
    """Runs by name, each with the config it trains with (its newest record: a change made with
    --resume-from is config.N.yaml); a folder without config.yaml is searched one level down (a
    runs/ root)."""
    runs: Dict[str, Run] = {}
    for p in map(Path, paths):
        folders = (
            [p]
            if (p / "config.yaml").exists()
            else sorted(q.parent for q in p.glob("*/config.yaml"))
        )
        for folder in folders:
            newest = recorded_configs(folder)[-1]
            config = OmegaConf.to_container(OmegaConf.load(newest), resolve=False)
            run = Run(folder, config, read_metrics(folder), newest)  # type: ignore[arg-type]
            runs[run.name] = run
    return runs


def _check_seeds(base: str, seeds: Dict[int, Run]) -> None:
    """ConfigError naming the first seed folder whose recorded config is not seed 0's (compared as
    a rerun's is: launch/run_folder.py)."""
    first = seeds[min(seeds)]
    for s, run in sorted(seeds.items()):
        changes = changed_between(run.config, first.config, ignore=SEED_KEYS)
        if changes:
            raise ConfigError(
                f"{run.path / 'config.yaml'}: seed {s} of {base} was trained with another config "
                f"than {first.path.name} ({'; '.join(changes)}); the seeds of one config must "
                "share it"
            )


def group_seeds(runs: Dict[str, Run]) -> Dict[str, Run]:
    """Runs by name, the seeds of one config (NAME, NAME-seed1, ...) as one :class:`SeedGroup`
    named NAME; a run alone stays as it is. ConfigError (nothing pooled) when a seed's recorded
    config differs from its group's beyond the seeds, or two runs are the same seed of one name."""
    by_base: Dict[str, Dict[int, Run]] = {}
    for name, run in runs.items():
        base, seed = seed_of(name)
        if seed in by_base.setdefault(base, {}):
            raise ConfigError(
                f"{run.path}: seed {seed} of {base} again (also {by_base[base][seed].path})"
            )
        by_base[base][seed] = run
    out: Dict[str, Run] = {}
    for base, seeds in by_base.items():
        if len(seeds) == 1:
            ((_, run),) = seeds.items()
            out[run.name] = run
            continue
        _check_seeds(base, seeds)
        first = seeds[min(seeds)]
        seeds = dict(sorted(seeds.items()))
        out[base] = SeedGroup(
            first.path, first.config, record=first.record, group=base, seeds=seeds
        )
    return out


# --- rows ----------------------------------------------------------------------------------------


def _fmt(x: Optional[float], digits: int = 3) -> str:
    return NOT_RUN if x is None else f"{x:.{digits}f}"


def _cell(
    run: Optional[Run], value: Callable[[Run], Optional[float]], digits: int = 3, log: bool = False
) -> str:
    """A run's number, or a seed group's mean [95% interval] over its seeds (``log``: the interval
    of ln value, exp'd: a PPL's from its loss's, around the geometric mean)."""
    if isinstance(run, SeedGroup):
        interval = run.interval(value, log)
        return NOT_RUN if interval is None else interval.text(digits)
    return _fmt(value(run) if run else None, digits)


def _set_ppl(name: str) -> Callable[[Run], Optional[float]]:
    """A run's PPL on one validation set, or None."""
    return lambda r: _exp(r.val_losses().get(name))


def _exp(x: Optional[float]) -> Optional[float]:
    return math.exp(x) if x is not None else None


def _steps(run: Optional[Run]) -> str:
    """The steps a run reached (a seed group: its fewest); short of the steps its config plans,
    both and "unfinished": a run still going, stopped or diverged, whose numbers are those of its
    last evaluation."""
    if run is None:
        return ""
    planned = run.spec.steps
    if planned is None or run.last_step >= planned:
        return str(run.last_step)
    return f"{run.last_step} of {planned} (unfinished)"


def _diff(ours: Optional[float], paper: Optional[float]) -> str:
    return "" if ours is None or paper is None else f"{ours - paper:+.3f}"


def _shape(run: Optional[Run]) -> Dict[str, Any]:
    if run is None:
        return {}
    m, d_h = run.model, run.d_h
    d_model, layers = m.get("d_model"), m.get("n_layers")
    out = {"K": m.get("K") if d_h else "", "L": layers, "d_model": d_model, "d_h": d_h or ""}
    out["d_h/d_model"] = f"{d_h / d_model:.3f}" if d_h and d_model else ""
    out["d_model/L"] = f"{d_model / layers:.0f}" if d_model and layers else ""
    return out


def validation_table(runs: Dict[str, Run], paper: dict) -> List[dict]:
    rows = []
    for r in paper["hourglass"]["validation_ppl"]:
        run = runs.get(r["run"])
        ours = run.val_ppl() if run else None
        row = {"size": r["size"], "variant": r["variant"], "run": r["run"], "steps": _steps(run)}
        row.update(
            {
                "val PPL": _cell(run, Run.val_ppl, log=True),
                "paper": _fmt(r.get("ppl")) if "ppl" in r else NO_NUMBER,
                "diff": _diff(ours, r.get("ppl")),
            }
        )
        for name in PAPER_VALIDATION_SETS:
            loss = run.val_losses().get(name) if run else None
            row[f"PPL {name}"] = (
                _cell(run, _set_ppl(name), log=True)
                if loss is not None
                else ("" if run else NOT_RUN)
            )
        rows.append(row)
    return rows


def downstream_table(runs: Dict[str, Run], paper: dict) -> List[dict]:
    """Every (task, size) cell of the paper's downstream evaluation, hourglass and baseline: the
    paper's number where its text gives one, "no number reported" elsewhere."""
    size_runs = {r["size"]: {} for r in paper["hourglass"]["validation_ppl"]}
    for r in paper["hourglass"]["validation_ppl"]:
        size_runs[r["size"]][r["variant"]] = r["run"]
    reported = {(t["task"], t["size"]): t for t in paper["hourglass"]["downstream"]}
    rows = []
    for t in paper["hourglass"]["downstream_tasks"]:
        log = t["metric"] == "ppl"  # a PPL's interval from its loss's
        for size in size_runs:
            cell = reported.get((t["task"], size), {})
            for variant in ("hourglass", "baseline"):
                name = size_runs[size][variant]
                run = runs.get(name)
                ours = run.downstream(t["task"], t["metric"]) if run else None
                rows.append(
                    {
                        "task": t["label"],
                        "size": size,
                        "metric": t["metric"],
                        "variant": variant,
                        "run": name,
                        "ours": _cell(run, lambda r: r.downstream(t["task"], t["metric"]), log=log),
                        "paper": _fmt(cell[variant]) if variant in cell else NO_NUMBER,
                        "diff": _diff(ours, cell.get(variant)),
                    }
                )
    return rows


def controlled_table(runs: Dict[str, Run], paper: dict) -> List[dict]:
    rows = []
    for r in paper["hourglass"]["controlled_113M"]:
        run = runs.get(r["run"])
        ours = run.val_ppl() if run else None
        rows.append(
            {
                "run": r["run"],
                **_shape(run),
                "val PPL": _cell(run, Run.val_ppl, log=True),
                "paper": _fmt(r["ppl"]),
                "diff": _diff(ours, r["ppl"]),
                "note": r["note"],
            }
        )
    return rows


def _folders(folders: Any) -> List[str]:
    return [folders] if isinstance(folders, str) else list(folders or [])


def _in_folders(config: Path, folders: List[str]) -> bool:
    """Whether a config lies in one of the repo's folders (matched by trailing path: copies match
    too)."""
    parts = config.resolve().parent.parts
    return any(parts[-len(Path(f).parts) :] == Path(f).parts for f in folders)


def _config_name(path: Path) -> Optional[str]:
    cfg = yaml.safe_load(path.read_text())
    return cfg["run"]["name"] if cfg and "run" in cfg and "name" in cfg["run"] else None


def paper_finding(kind: str, spec: dict, shape: Dict[str, Any]) -> str:
    """What the paper reports for an ablation row of this shape: its number, the finding of the
    range the shape falls in, or NO_NUMBER."""
    if kind == "K" and (ppl := spec["reported_by_K"].get(shape.get("K"))) is not None:
        return _fmt(ppl)
    if kind == "d_h_ratio" and shape.get("d_h/d_model"):
        ratio = float(shape["d_h/d_model"])
        for r in spec["ranges"]:
            if r["from"] <= ratio < r["to"] or ratio == r["to"] == spec["ranges"][-1]["to"]:
                return f"{r['from']}-{r['to']}: {r['finding']}"
    if kind == "width_depth" and shape.get("d_model/L"):
        lo, hi = spec["best_range"]
        best = spec["best_d_model_per_L"].get(shape.get("K"))
        where = "inside" if lo <= float(shape["d_model/L"]) <= hi else "outside"
        return f"{where} the best range {lo}-{hi}" + (
            f" (K={shape['K']}: best near {best})" if best else ""
        )
    return NO_NUMBER


def ablation_table(
    runs: Dict[str, Run], kind: str, spec: dict, configs: Optional[List[Path]] = None
) -> List[dict]:
    """One row per config of the ablation (``configs``, default the folders of ``spec["configs"]``,
    in file order), with the paper's number or finding beside the run's; the difference only for
    the paper's own configs (a demo-scale run is compared by trend, not value)."""
    rows = []
    if configs is None:  # the repo's folder(s) of the ablation, each sorted by file name
        configs = [
            path
            for folder in _folders(spec["configs"])
            for path in sorted((REPO / folder).glob("*.yaml"))
        ]
    for path in configs:
        if (name := _config_name(path)) is None:
            continue
        run = runs.get(name)
        ours = run.val_ppl() if run else None
        shape = _shape(run) or _shape_from_name(name)
        in_paper = _in_folders(path, _folders(spec["configs"]))
        reported = spec.get("reported_by_K", {}).get(shape.get("K")) if in_paper else None
        finding = paper_finding(kind, spec, shape)
        # the paper's run this sweep grows from (the K ablation's K=4)
        if in_paper and (base := spec.get("base_run")) and shape.get("K") == base["K"]:
            reported, finding = base["ppl"], f"{_fmt(base['ppl'])} ({base['note']})"
        rows.append(
            {
                "run": name,
                **shape,
                "steps": _steps(run),
                "val PPL": _cell(run, Run.val_ppl, log=True),
                "paper": finding,
                "diff": _diff(ours, reported),
            }
        )
    return rows


def ablation_configs(sweep_configs: List[Path]) -> Dict[str, List[Path]]:
    """The sweep's configs by ablation: those whose folder is one of its folders (``configs`` or
    ``demo_configs``, matched by their trailing path, so a copy of the repo matches too)."""
    groups: Dict[str, List[Path]] = {}
    for kind, spec in paper_results()["hourglass"]["ablations"].items():
        folders = _folders(spec["configs"]) + _folders(spec.get("demo_configs"))
        groups[kind] = [c for c in sweep_configs if _in_folders(c, folders)]
    return {k: v for k, v in groups.items() if v}


def _shape_from_name(name: str) -> Dict[str, Any]:
    """K, L, d_model, d_h from an ablation run's name (…-K4-L11-d979-dh550, …-dh415-a1024: with its
    attention width), for runs not made yet."""
    m = re.search(r"K(\d+)-L(\d+)-d(\d+)-dh(\d+)(?:-a\d+)?(?:-kv\d+)?$", name)
    if not m:
        return {}
    K, L, d, dh = map(int, m.groups())
    return {
        "K": K,
        "L": L,
        "d_model": d,
        "d_h": dh,
        "d_h/d_model": f"{dh / d:.3f}",
        "d_model/L": f"{d / L:.0f}",
    }


def hourglass_runs_table(runs: Dict[str, Run]) -> List[dict]:
    """Every hourglass run given, whatever its name: the points the figures plot."""
    return [
        {
            "run": name,
            **_shape(run),
            "steps": _steps(run),
            "val loss": _cell(run, Run.val_loss, 4),
            "val PPL": _cell(run, Run.val_ppl, log=True),
        }
        for name, run in sorted(runs.items())
        if run.stacks_ffn
    ]


def _data(run: Optional[Run]) -> str:
    """The data a run trained on: its source and tokenizer (config data.source, data.tokenizer)."""
    if run is None:
        return ""
    data = run.config.get("data") or {}
    return f"{data.get('source', '?')}, {data.get('tokenizer', '?')}"


def _gap(run: Optional[Run], base: Optional[Run]) -> tuple:
    """(run's val loss - its baseline's, its text): with seeds on both sides, the mean difference
    paired by seed offset, with its t-interval (report/stats.py), and the seeds it pairs."""
    ours, theirs = (r.val_loss() if r else None for r in (run, base))
    if ours is None or theirs is None:
        return None, ""
    if not (isinstance(run, SeedGroup) and isinstance(base, SeedGroup)):
        return ours - theirs, _diff(ours, theirs)
    losses = [
        {s: v for s, r in g.seeds.items() if (v := r.val_loss()) is not None} for g in (run, base)
    ]
    if not losses[0].keys() & losses[1].keys():
        return ours - theirs, f"{_diff(ours, theirs)} (no seed in common)"
    d = stats.paired_difference(*losses)
    seeds = ",".join(map(str, d.seeds))
    if d.diff.n < 2:
        return d.diff.mean, f"{d.diff.mean:+.3f} (seed {seeds})"
    return d.diff.mean, f"{d.diff.mean:+.3f} [{d.diff.lo:+.3f}, {d.diff.hi:+.3f}] (seeds {seeds})"


def variable_width_table(runs: Dict[str, Run], paper: dict) -> List[dict]:
    """Paper 2's rows beside the runs. Its data (DCLM, cl100k) differ from the runs' (OLMo-2's mix,
    dolma2), so absolute losses do not compare: each x row's ``diff`` is the run's gap to its own
    baseline minus the paper's gap to its baseline (negative: the run's x gains more); the ``data``
    column names each side's."""
    rows = []
    vw = paper["variable_width"]

    def row(size, variant, run_name, paper_loss, base_run, base_paper, **extra):
        run = runs.get(run_name)
        gap = _gap(run, runs.get(base_run) if run_name != base_run else None)
        paper_gap = (
            paper_loss - base_paper if paper_loss is not None and run_name != base_run else None
        )
        return {
            "size": size,
            "variant": variant,
            "run": run_name,
            "data (run / paper)": f"{_data(run) or '-'} / {vw['data']}",
            "val loss": _cell(run, Run.val_loss),
            "paper": _fmt(paper_loss) if paper_loss is not None else NO_NUMBER,
            "gap to own baseline": gap[1],
            "paper gap": _diff(paper_gap, 0.0) if paper_gap is not None else "",
            "diff": _diff(gap[0], paper_gap),
            **extra,
        }

    for r in vw["sizes"]:
        base = (r["baseline_run"], r["baseline"])
        rows.append(
            row(r["size"], "baseline", *base, *base, **{"paper FLOPs": "", "paper mean width": ""})
        )
        rows.append(
            row(
                r["size"],
                "x",
                r["x_run"],
                r["x"],
                *base,
                **{"paper FLOPs": r["flops"], "paper mean width": r["mean_width"]},
            )
        )
    base_500 = next(r for r in vw["ablations_500M"] if r["variant"] == "constant width")
    for r in vw["ablations_500M"]:
        rows.append(
            row("500M", r["variant"], r["run"], r.get("loss"), base_500["run"], base_500["loss"])
        )
    return rows + _hourglass_sizes_variable_width(runs, paper)


def _hourglass_sizes_variable_width(runs: Dict[str, Run], paper: dict) -> List[dict]:
    """The hourglass paper's sizes trained with the variable-width block (no paper number)."""
    return [
        {
            "size": r["size"],
            "variant": "variable-width (hourglass paper's sizes)",
            "run": r["run"],
            "data (run / paper)": f"{_data(runs.get(r['run'])) or '-'} / -",
            "val loss": _cell(runs.get(r["run"]), Run.val_loss),
            "paper": NO_NUMBER,
            "diff": "",
        }
        for r in paper["hourglass"]["validation_ppl"]
        if r["variant"] == "variable-width"
    ]


def build_tables(
    runs: Dict[str, Run], sweep_configs: Optional[List[Path]] = None
) -> Dict[str, List[dict]]:
    """Every table; with ``sweep_configs`` the ablation tables list the sweep's configs of each
    ablation (e.g. the demo-scale sweeps) instead of the 113M folders."""
    paper = paper_results()
    abl = paper["hourglass"]["ablations"]
    abl["K"]["reported_by_K"] = {int(k): v for k, v in abl["K"]["reported_by_K"].items()}
    abl["width_depth"]["best_d_model_per_L"] = {
        int(k): v for k, v in abl["width_depth"]["best_d_model_per_L"].items()
    }
    groups = ablation_configs(sweep_configs) if sweep_configs is not None else {}
    tables = {
        "validation_ppl": validation_table(runs, paper),
        "downstream": downstream_table(runs, paper),
        "controlled_113M": controlled_table(runs, paper),
    }
    for kind in ("K", "d_h_ratio", "width_depth"):
        tables[f"ablation_{kind}"] = ablation_table(
            runs, kind, abl[kind], groups.get(kind, [] if sweep_configs is not None else None)
        )
    tables["variable_width"] = variable_width_table(runs, paper)
    tables["hourglass_runs"] = hourglass_runs_table(runs)
    return {name: _with_seeds(rows, runs) for name, rows in tables.items()}


def _with_seeds(rows: List[dict], runs: Dict[str, Run]) -> List[dict]:
    """A ``seeds`` column after ``run`` in a table with a seed group's row (1 for a single run);
    a table without one is left as it is."""
    if not any(isinstance(runs.get(r.get("run")), SeedGroup) for r in rows):
        return rows
    out = []
    for row in rows:
        run = runs.get(row["run"])
        n = len(run.seeds) if isinstance(run, SeedGroup) else (1 if run else "")
        new: dict = {}
        for k, v in row.items():
            new[k] = v
            if k == "run":
                new["seeds"] = n
        out.append(new)
    return out


# --- output --------------------------------------------------------------------------------------


def to_markdown(rows: List[dict]) -> str:
    if not rows:
        return "(no runs)\n"
    cols = list(dict.fromkeys(k for row in rows for k in row))
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(str(row.get(c, "")) for c in cols) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def to_csv(rows: List[dict]) -> str:
    out = io.StringIO()
    cols = list(dict.fromkeys(k for row in rows for k in row))
    writer = csv.DictWriter(out, fieldnames=cols)
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def write_tables(tables: Dict[str, List[dict]], out: Path) -> List[Path]:
    """NAME.md and NAME.csv per table, and tables.md with all of them (with the notes)."""
    out.mkdir(parents=True, exist_ok=True)
    paper = paper_results()
    notes = {
        f"ablation_{kind}": spec["note"] for kind, spec in paper["hourglass"]["ablations"].items()
    }
    written: List[Path] = []
    sections = [
        f"# Tables\n\nReported numbers: {paper['hourglass']['paper']}; "
        f"{paper['variable_width']['paper']}.\n"
    ]
    for name, rows in tables.items():
        (out / f"{name}.md").write_text(to_markdown(rows))
        (out / f"{name}.csv").write_text(to_csv(rows))
        written += [out / f"{name}.md", out / f"{name}.csv"]
        note = f"\nPaper: {notes[name]}.\n" if name in notes else ""
        sections.append(f"## {name}\n{note}\n{to_markdown(rows)}")
    (out / "tables.md").write_text("\n".join(sections))
    return written + [out / "tables.md"]
