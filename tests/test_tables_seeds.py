"""The papers' tables over seeds (scripts/make_tables.py, report/tables.py, report/scaling.py):
synthetic run folders with several seeds of a config and a known gap, each cell against the
Student-t interval computed here from the textbook formula; the scaling fit's bootstrap over seeds
against a generated law and the least-squares standard error written here."""

import csv
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from olmo_patches.config import load_spec, spec_to_yaml
from olmo_patches.report.scaling import Point, fit_rows, matched_rows
from olmo_patches.report.figures import ppl_vs_dh_ratio
from olmo_patches.report.tables import build_tables, group_seeds, load_runs

from .conftest import REPO, run_in_process

SEEDS = 5
T_975_4 = 2.7764451051977987  # Student t, 97.5% quantile, 4 degrees of freedom (tables)
BASELINE = REPO / "configs" / "demo" / "baseline.yaml"
HOURGLASS = ["model.block=hourglass", "model.K=2", "model.d_h=64"]
GAP = 0.05  # the hourglass's planted gap to the baseline, nats
X_GAP = -0.03  # paper 2's x against its baseline, nats


def _write_run(
    root: Path, name: str, seed: int, shape: list, final: float, last: int = 200
) -> Path:
    """The run of seed offset ``seed`` as a sweep names it (NAME, NAME-seedS; launch/sweep.py),
    its config as training records it and its curves: validation ending at ``final``, training
    loss 0.1 above it at every logged step."""
    suffix = f"-seed{seed}" if seed else ""
    seeds = [f"train.seed={6198 + seed}", f"data.order_seed={6198 + seed}"] if seed else []
    folder = root / f"{name}{suffix}"
    spec = load_spec(
        BASELINE, [*shape, *seeds, f"run.name={name}{suffix}", f"run.save_folder={folder}"]
    )
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(spec_to_yaml(spec))
    lines = [
        {
            "step": step,
            "eval/lm/val/CE loss": final + 0.3 * (last / step - 1),
            "train/CE loss": final + 0.1 + 0.3 * (last / step - 1),
        }
        for step in (last // 4, last // 2, 3 * last // 4, last)
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return folder


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    """113M-baseline and 113M-hourglass (another shape, GAP above) and paper 2's 200M baseline and
    x (X_GAP) at 5 seeds each; 403M-baseline at one seed."""
    root = tmp_path_factory.mktemp("seeds") / "runs"
    rng = np.random.default_rng(11)
    base = 5.5 + 0.02 * rng.standard_normal(SEEDS)
    finals = {
        "113M-baseline": ([], base),
        "113M-hourglass": (HOURGLASS, base + GAP + 0.01 * rng.standard_normal(SEEDS)),
        "paper2-200M-baseline": ([], base + 0.2),
        "paper2-200M-x": (HOURGLASS, base + 0.2 + X_GAP + 0.01 * rng.standard_normal(SEEDS)),
        "403M-baseline": ([], np.array([5.61])),
    }
    for name, (shape, losses) in finals.items():
        for s, loss in enumerate(losses):
            _write_run(root, name, s, shape, float(loss))
    return root, {k: v[1] for k, v in finals.items()}


def _rows(path: Path, key: str = "run") -> dict:
    with open(path) as f:
        return {row[key]: row for row in csv.DictReader(f)}


def _t_interval(x: np.ndarray) -> tuple:
    """mean, lo, hi: the textbook Student-t interval at 5 values."""
    half = T_975_4 * x.std(ddof=1) / math.sqrt(len(x))
    return x.mean(), x.mean() - half, x.mean() + half


@pytest.mark.slow
def test_tables_give_the_mean_over_seeds_with_its_t_interval(seeded, tmp_path):
    root, finals = seeded
    out = tmp_path / "tables"
    r = run_in_process("make_tables.py", str(root), "--out", str(out), "--no-figures")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = _rows(out / "validation_ppl.csv")
    m, lo, hi = _t_interval(finals["113M-baseline"])
    base = rows["113M-baseline"]
    # PPL: exp of the loss's interval, around the geometric mean PPL
    assert base["val PPL"] == f"{math.exp(m):.3f} [{math.exp(lo):.3f}, {math.exp(hi):.3f}]"
    assert base["seeds"] == "5" and base["steps"] == "200"
    assert base["diff"] == f"{math.exp(m) - 36.441:+.3f}"  # the paper's 36.441
    # one seed: its number alone, as without seeds
    assert rows["403M-baseline"]["val PPL"] == f"{math.exp(5.61):.3f}"
    assert rows["403M-baseline"]["seeds"] == "1" and rows["906M-baseline"]["seeds"] == ""
    # the other shape is its own row, its own seeds' mean: never pooled with the baseline's
    m, lo, hi = _t_interval(finals["113M-hourglass"])
    hg = _rows(out / "hourglass_runs.csv")
    assert set(hg) == {"113M-hourglass", "paper2-200M-x"}
    assert hg["113M-hourglass"]["val loss"] == f"{m:.4f} [{lo:.4f}, {hi:.4f}]"
    assert hg["113M-hourglass"]["seeds"] == "5"
    assert list(hg["113M-hourglass"])[:2] == ["run", "seeds"]


def test_paper2_gap_is_paired_by_seed_and_covers_the_planted_gap(seeded, tmp_path):
    root, finals = seeded
    out = tmp_path / "tables"
    r = run_in_process("make_tables.py", str(root), "--out", str(out), "--no-figures")
    assert r.returncode == 0, r.stderr[-3000:]
    x = _rows(out / "variable_width.csv")["paper2-200M-x"]
    d = finals["paper2-200M-x"] - finals["paper2-200M-baseline"]
    m, lo, hi = _t_interval(d)
    assert x["gap to own baseline"] == f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}] (seeds 0,1,2,3,4)"
    assert lo < X_GAP < hi and hi < 0  # the planted gap inside, 0 outside
    assert x["diff"] == f"{m - (3.430 - 3.452):+.3f}"  # paper 2's 200M gap: 3.430 - 3.452
    m, lo, hi = _t_interval(finals["paper2-200M-x"])
    assert x["val loss"] == f"{m:.3f} [{lo:.3f}, {hi:.3f}]" and x["seeds"] == "5"


def test_one_seed_prints_as_before(seeded, tmp_path):
    """One seed of a config (its seed 0 folder alone): no seeds column, its row the plain numbers;
    seed 3 alone keeps its own name (it is not the config's row)."""
    root, finals = seeded
    out = tmp_path / "one"
    folders = [root / "113M-baseline", root / "113M-hourglass-seed3"]
    r = run_in_process("make_tables.py", *map(str, folders), "--out", str(out), "--no-figures")
    assert r.returncode == 0, r.stderr[-3000:]
    md = (out / "validation_ppl.md").read_text()
    assert md.startswith("| size | variant | run | steps | val PPL | paper | diff |")
    ppl = math.exp(finals["113M-baseline"][0])
    assert (
        f"| 113M | baseline | 113M-baseline | 200 | {ppl:.3f} | 36.441 | {ppl - 36.441:+.3f} |"
        in md
    )
    assert "| 113M | hourglass | 113M-hourglass |  | not run |" in md
    assert "seeds" not in md and "seeds" not in (out / "hourglass_runs.md").read_text()
    loss = finals["113M-hourglass"][3]
    hg = _rows(out / "hourglass_runs.csv")["113M-hourglass-seed3"]
    assert hg["val loss"] == f"{loss:.4f}" and hg["val PPL"] == f"{math.exp(loss):.3f}"


def test_a_seed_of_another_shape_is_refused(seeded, tmp_path):
    root, _ = seeded
    copy = tmp_path / "runs"
    shutil.copytree(root, copy)
    seed2 = copy / "113M-hourglass-seed2" / "config.yaml"
    seed2.write_text(seed2.read_text().replace("d_h: 64", "d_h: 32"))
    out = tmp_path / "tables"
    r = run_in_process("make_tables.py", str(copy), "--out", str(out), "--no-figures")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert str(seed2) in lines[0] and "model.d_h: 32 -> 64" in lines[0]
    assert not out.exists()


def test_a_seed_recorded_before_a_key_existed_still_pools(seeded, tmp_path):
    """A seed whose record lacks a key added since (its default then ran) is the same config, as
    a rerun counts it (launch/run_folder.py): grouped, not refused."""
    root, finals = seeded
    copy = tmp_path / "runs"
    shutil.copytree(root, copy)
    seed3 = copy / "113M-baseline-seed3" / "config.yaml"
    old = seed3.read_text()
    seed3.write_text(old.replace("  qk_norm: false\n", ""))
    assert seed3.read_text() != old  # the key is gone from the record
    group = group_seeds(load_runs([copy]))["113M-baseline"]
    assert sorted(group.seeds) == list(range(SEEDS))
    assert group.val_loss() == pytest.approx(float(np.mean(finals["113M-baseline"])), abs=1e-12)


def test_loss_curves_draw_a_seed_groups_mean_with_a_min_max_band(seeded, tmp_path, monkeypatch):
    from olmo_patches.report.figures import loss_curves, plt

    root, finals = seeded
    runs = group_seeds(load_runs([root]))
    kept = []  # the figure, kept open when the module closes it
    monkeypatch.setattr(plt, "close", kept.append)
    (png,) = loss_curves({"113M-baseline": runs["113M-baseline"]}, tmp_path)
    monkeypatch.undo()
    ax = kept[0].axes[0]
    (line,) = ax.lines
    final_train = finals["113M-baseline"] + 0.1  # each seed's training loss at the last step
    assert line.get_ydata()[-1] == pytest.approx(final_train.mean())
    assert "5 seeds, band min-max" in line.get_label() and png.stat().st_size > 10_000
    (band,) = ax.collections
    edge = band.get_paths()[0].vertices
    last = edge[np.isclose(edge[:, 0], line.get_xdata()[-1]), 1]
    assert last.min() == pytest.approx(final_train.min())
    assert last.max() == pytest.approx(final_train.max())
    plt.close(kept[0])


# --- the scaling fit's bootstrap over seeds -------------------------------------------------------

C = np.array([1.0, 4.0, 16.0, 64.0])  # compute budgets, PF-days
LAWS = {"baseline": (3.16, -0.0498), "x": (3.12, -0.0503)}  # the true a, b (paper 2's)
SD = 0.004  # each seed's noise on ln L
# paper 2's printed fits and matched-loss fractions (the tables' "paper" column)
REF = dict(baseline_a=3.16, baseline_b=-0.0498, x_a=3.12, x_b=-0.0503)
REF.update(x_flops_fraction=0.778, x_mean_width_fraction=0.851)


def _points(rng, seeds: int = SEEDS) -> dict:
    """Both families' points, losses on their law at ``seeds`` seeds each; the mean width W =
    C^(1/3), so that L = a W^(3b)."""
    out = {}
    for f, (a, b) in LAWS.items():
        pts = []
        for c in C:
            losses = a * c**b * np.exp(SD * rng.standard_normal(seeds))
            pts.append(
                Point(
                    c,
                    float(losses.mean()),
                    f"{f}-{c:g}",
                    c ** (1 / 3),
                    c,
                    tuple(losses) if seeds > 1 else (),
                )
            )
        out[f] = pts
    return out


def _bracket(text: str) -> tuple:
    mid, rest = text.split(" [")
    lo, hi = rest.rstrip("]").split(", ")
    return tuple(float(v.rstrip("%")) for v in (mid, lo, hi))


@pytest.mark.slow
def test_bootstrap_over_seeds_covers_the_true_exponent_and_ratio():
    """300 generated cases (4 budgets x 5 seeds per family): how often the intervals cover the
    true b and the true matched-loss ratios, and their width against the least-squares standard
    error of b with the noise known."""
    rng = np.random.default_rng(12)
    target = 2.9
    (ab, bb), (ax_, bx) = LAWS["baseline"], LAWS["x"]
    true_c = (target / ax_) ** (1 / bx) / (target / ab) ** (1 / bb)  # C = (L / a)^(1/b)
    truth = {"b baseline": bb, "b x": bx, "C": 100 * true_c, "W": 100 * true_c ** (1 / 3)}
    # the sd of a point's mean ln L over the spread of ln C
    se_b = SD / math.sqrt(SEEDS) / math.sqrt(np.sum((np.log(C) - np.log(C).mean()) ** 2))
    covered, widths, cases = dict.fromkeys(truth, 0), [], 300
    for _ in range(cases):
        points = _points(rng)
        fit = {r["family"]: r for r in fit_rows(points, REF)}
        x = {r["family"]: r for r in matched_rows(points, REF, target)}["x"]
        got = {
            "b baseline": _bracket(fit["baseline"]["b [95%, bootstrap over seeds]"]),
            "b x": _bracket(fit["x"]["b [95%, bootstrap over seeds]"]),
            "C": _bracket(x["C / baseline's [95%, bootstrap over seeds]"]),
            "W": _bracket(x["mean width / baseline's [95%, bootstrap over seeds]"]),
        }
        for k, (_, lo, hi) in got.items():
            covered[k] += lo < truth[k] < hi
        widths.append((got["b x"][2] - got["b x"][1]) / (2 * 1.96 * se_b))
    # A percentile bootstrap from 5 seeds per point sees their spread with divisor n, not n - 1
    # (sqrt(4/5) narrower), and no t quantile: about 89% coverage, not 95% (86-90% here;
    # docs/statistics.md says so). 300 cases: binomial sd 0.018, 3.5 sd below 89% allowed.
    rates = {k: v / cases for k, v in covered.items()}
    assert all(0.83 <= r <= 0.96 for r in rates.values()), rates
    # the typical width: 2 x 1.96 standard errors x sqrt(4/5) x E[s / sd] (about 0.87)
    assert 0.75 < float(np.median(widths)) < 1.0, np.median(widths)
    assert fit["x"]["seeds per point"] == "5, 5, 5, 5"
    _, lo, hi = _bracket(fit["x"]["a [95%, bootstrap over seeds]"])
    assert lo < float(fit["x"]["a"]) < hi


@pytest.mark.slow
def test_make_tables_fits_seed_groups_at_their_mean_loss(tmp_path):
    """Four budgets of one config (100-800 steps, so C in proportion), 3 seeds each: the fit's b is
    the least-squares slope of ln(mean loss) on ln(steps) (numpy's polyfit here), inside its
    bootstrap interval, and the seeds are counted per point."""
    rng = np.random.default_rng(14)
    steps, means = [100, 200, 400, 800], []
    for n in steps:
        losses = 4.0 * n**-0.1 * np.exp(0.003 * rng.standard_normal(3))
        means.append(losses.mean())
        for s, loss in enumerate(losses):
            _write_run(tmp_path / "runs", f"budget-{n}", s, [], float(loss), last=n)
    out = tmp_path / "tables"
    r = run_in_process("make_tables.py", str(tmp_path / "runs"), "--out", str(out), "--no-figures")
    assert r.returncode == 0, r.stderr[-3000:]
    fit = _rows(out / "scaling_fit.csv", "family")["baseline"]
    slope = np.polyfit(np.log(steps), np.log(means), 1)[0]
    b, lo, hi = _bracket(fit["b [95%, bootstrap over seeds]"])
    assert fit["b"] == f"{slope:.5f}" and b == pytest.approx(slope, abs=1e-5) and lo < b < hi
    assert fit["seeds per point"] == "3, 3, 3, 3" and hi - lo < 0.02
    assert fit["runs"] == "budget-100, budget-200, budget-400, budget-800"
    matched = _rows(out / "matched_loss.csv", "family")["baseline"]
    assert matched["C / baseline's [95%, bootstrap over seeds]"] == ""  # the baseline itself


def test_one_seed_per_point_keeps_the_standard_errors_and_says_so():
    rng = np.random.default_rng(13)
    points = _points(rng, seeds=1)
    rows = fit_rows(points, REF)
    assert all("seeds per point" not in r and "a std err" in r for r in rows)
    # one seeded family beside a single-seed one: the single-seed family says it has no interval
    points["x"] = _points(rng)["x"]
    fit = {r["family"]: r for r in fit_rows(points, REF)}
    assert fit["baseline"]["b [95%, bootstrap over seeds]"] == "one seed per point: std errors only"
    assert fit["baseline"]["seeds per point"] == "1, 1, 1, 1"
    assert fit["x"]["b [95%, bootstrap over seeds]"].count("[") == 1


def test_a_K1_hourglass_without_d_h_reads_the_width_training_gave_it(tmp_path):
    """K=1 with neither model.d_h nor model.d_h_ratio trains at the conventional FFN's width, 4
    d_model (the demo config's comment): the table's d_h and the d_h/d_model figure read that."""
    _write_run(tmp_path, "k1", 0, ["model.block=hourglass", "model.K=1"], 5.5)
    runs = load_runs([tmp_path])
    (row,) = build_tables(runs)["hourglass_runs"]
    assert (row["d_h"], row["d_h/d_model"]) == (4 * 128, "4.000")
    assert [p.name for p in ppl_vs_dh_ratio(runs, tmp_path)] == ["ppl_vs_dh_ratio.png"]


def test_a_run_short_of_its_planned_steps_is_marked_unfinished(tmp_path):
    """A run stopped (or diverged) at step 100 of the config's 200 (train.max_steps of
    configs/demo/baseline.yaml) shows its numbers with that said beside them."""
    _write_run(tmp_path, "short", 0, HOURGLASS, 5.5, last=100)
    _write_run(tmp_path, "done", 0, HOURGLASS, 5.5)
    rows = {r["run"]: r for r in build_tables(load_runs([tmp_path]))["hourglass_runs"]}
    assert rows["short"]["steps"] == "100 of 200 (unfinished)" and rows["done"]["steps"] == "200"


def test_a_run_extended_on_purpose_is_judged_by_its_newest_record(tmp_path):
    """A run whose steps were raised with --resume-from (train.py records config.1.yaml): its
    table reads the config it trains with, 100 of 400 steps, not its first record's 200."""
    folder = _write_run(tmp_path, "longer", 0, HOURGLASS, 5.5, last=100)
    spec = load_spec(BASELINE, [*HOURGLASS, "run.name=longer", "train.max_steps=400"])
    (folder / "config.1.yaml").write_text(spec_to_yaml(spec))
    (row,) = build_tables(load_runs([tmp_path]))["hourglass_runs"]
    assert row["steps"] == "100 of 400 (unfinished)"
