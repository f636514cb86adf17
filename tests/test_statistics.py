"""The comparison over seeds (report/stats.py, report/compare.py) against references written here.

Simulation checks, vectorised (seconds): generated final losses and validation curves with a known
gap, ratio and noise; each interval's coverage, false-positive rate and power against the nominal
95% / 5% or the noncentral t's power, within 3 binomial standard errors (sqrt(p (1 - p) / R) for R
repetitions, stated in each test). Then synthetic run folders reported by scripts/sweep.py: the
tables' numbers against the formulas computed here, runs that did not finish left out and named."""

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from olmo_patches.config import load_spec, spec_to_yaml
from olmo_patches.report.stats import (
    accuracy_interval,
    detectable,
    holm,
    log_ratios,
    matched_ratio,
    mean_interval,
    paired_difference,
    t_test,
)

from .conftest import REPO, run_in_process

R = 4000  # repetitions of each simulation
SEEDS = 5
T_975_4 = 2.7764451051977987  # Student t, 97.5% quantile, 4 degrees of freedom (tables)
DEMO_LOSS = 5.5  # the demo baseline's final validation loss (docs/ablations_demo.md: PPL 246)
RUN_SD, SHARED_SD = 0.04, 0.03  # each run's own noise; a seed effect both shapes share
# docs/statistics.md's worked example: paired differences of sd 0.061-0.069 nats; here
# sqrt(2) x 0.04 = 0.057


def _tol(p, reps=R):
    """3 binomial standard errors of a rate p over ``reps`` repetitions."""
    return 3 * math.sqrt(p * (1 - p) / reps)


def _nct_power(delta, df, crit):
    """The two-sided t-test's power at noncentrality delta (the reference)."""
    return 1 - sps.nct.cdf(crit, df, delta) + sps.nct.cdf(-crit, df, delta)


def _diffs(rng, gap, k=1):
    """(R, k, SEEDS) member - baseline final losses of k members against one shared baseline."""
    shared = SHARED_SD * rng.standard_normal((R, 1, SEEDS))
    base = DEMO_LOSS + shared + RUN_SD * rng.standard_normal((R, 1, SEEDS))
    member = DEMO_LOSS + np.asarray(gap).reshape(1, -1, 1) + shared
    return member + RUN_SD * rng.standard_normal((R, k, SEEDS)) - base


def test_t_interval_matches_the_textbook_formula():
    x = [5.51, 5.47, 5.53, 5.49, 5.50]
    mean = sum(x) / 5
    sd = math.sqrt(sum((v - mean) ** 2 for v in x) / 4)
    i = mean_interval(x)
    assert i.mean == pytest.approx(mean) and i.n == 5
    assert i.lo == pytest.approx(mean - T_975_4 * sd / math.sqrt(5))
    assert i.hi == pytest.approx(mean + T_975_4 * sd / math.sqrt(5))


def test_paired_difference_covers_stays_quiet_and_finds_a_gap_at_its_power():
    """4000 repetitions, 5 seeds, run sd 0.04, shared seed sd 0.03: coverage 95% +- 0.010,
    false "distinguishable" 5% +- 0.010, power at a 1% gap = the noncentral t's +- 0.022."""
    rng = np.random.default_rng(1)
    gap = 0.01 * DEMO_LOSS
    mean, half, p, sd = t_test(_diffs(rng, gap)[:, 0])
    assert abs(np.mean(np.abs(mean - gap) <= half) - 0.95) <= _tol(0.95)
    _, _, p0, _ = t_test(_diffs(rng, 0.0)[:, 0])
    assert abs(np.mean(p0 < 0.05) - 0.05) <= _tol(0.05)
    power = _nct_power(gap / (RUN_SD * math.sqrt(2) / math.sqrt(SEEDS)), SEEDS - 1, T_975_4)
    assert abs(np.mean(p < 0.05) - power) <= _tol(power), (np.mean(p < 0.05), power)
    # the dict form is the same test
    member = dict(enumerate(DEMO_LOSS + gap + np.array([0.01, -0.03, 0.02, 0.0, 0.04])))
    one = paired_difference(member, dict(enumerate([DEMO_LOSS] * SEEDS)))
    assert one.diff.mean == pytest.approx(gap + 0.008) and one.verdict == "distinguishable"
    assert one.sd == pytest.approx(np.std([0.01, -0.03, 0.02, 0.0, 0.04], ddof=1))


def test_the_smallest_detectable_gap_is_found_80_percent_of_the_time():
    """At the gap ``detectable`` names for the true sd of the differences, the test says
    "distinguishable" in 80% +- 0.019 of 4000 repetitions; at 3 seeds too."""
    rng = np.random.default_rng(2)
    sd_d = RUN_SD * math.sqrt(2)
    for n in (5, 3):
        gap = float(detectable(sd_d, n))
        d = gap + sd_d * rng.standard_normal((R, n))
        assert abs(np.mean(t_test(d)[2] < 0.05) - 0.80) <= _tol(0.80), (n, gap)


def test_holm_keeps_the_familywise_error_at_5_percent_and_finds_a_real_gap():
    """k identical members against one baseline (4000 repetitions): unadjusted, some false
    "distinguishable" in 19.5% (k=5) and 34% (k=10) of sweeps; Holm's in 5% or less (+ 0.010).
    One real 1.5% gap among 5: Holm finds it at least as often as Bonferroni's power (noncentral t
    at 0.05 / 5) and no more often than the unadjusted test's, +- 0.023."""
    rng = np.random.default_rng(3)
    for k, unadjusted in ((5, 0.17), (10, 0.30)):
        p = t_test(_diffs(rng, [0.0] * k, k))[2]
        assert np.mean((p < 0.05).any(axis=1)) > unadjusted
        assert np.mean((holm(p) < 0.05).any(axis=1)) <= 0.05 + _tol(0.05)
    gap = 0.015 * DEMO_LOSS
    found = np.mean(holm(t_test(_diffs(rng, [gap, 0, 0, 0, 0], 5))[2])[:, 0] < 0.05)
    delta = gap / (RUN_SD * math.sqrt(2) / math.sqrt(SEEDS))
    bonferroni = _nct_power(delta, SEEDS - 1, sps.t.ppf(1 - 0.01 / 2, SEEDS - 1))
    raw = _nct_power(delta, SEEDS - 1, T_975_4)
    assert bonferroni - _tol(0.5) <= found <= raw + _tol(0.5), (bonferroni, found, raw)


# curves: L(t) = E + A t^-alpha, the demo's shape (8.3 at step 0, 5.44 at 410k tokens)
TOKENS = np.array([0, 50, 100, 150, 200]) * 2048.0
E, ALPHA = 3.0, 0.3
A = 2.44 * TOKENS[-1] ** ALPHA


def _curve(t):
    return np.where(t > 0, E + A * np.maximum(t, 1.0) ** -ALPHA, 8.3)


def _curves(rng, c):
    """(baseline, member) curves (R, SEEDS, evaluations): the member learns as if it had seen c x
    the tokens; seed effects as _diffs, and each evaluation's own noise sd 0.005."""
    shape = (R, SEEDS, 1)
    shared = SHARED_SD * rng.standard_normal(shape)
    noise = [RUN_SD * rng.standard_normal(shape) + 0.005 * rng.standard_normal((R, SEEDS, 5))
             for _ in range(2)]  # fmt: skip
    return _curve(TOKENS) + shared + noise[0], _curve(c * TOKENS) + shared + noise[1]


def test_matched_loss_ratio_covers_stays_quiet_and_finds_a_ratio_at_its_power():
    """4000 repetitions of 5 seeds' curves at 4 evaluations: the interval covers the true ratio
    1 / c in 95% +- 0.010 (c = 1.25: 0.8), excludes 1 for identical shapes in 5% +- 0.010, and
    at c = 1.1 in the noncentral t's power +- 0.024 (the log ratio's sd linearised:
    sd(run noise difference) / (alpha A T^-alpha))."""
    rng = np.random.default_rng(4)
    for c in (1.25, 1.0):
        base, member = _curves(rng, c)
        r = log_ratios(member, TOKENS, base, TOKENS)
        assert not np.isnan(r).any()
        mean, half, p, _ = t_test(r)
        if c == 1.25:
            assert abs(np.mean(np.abs(mean + math.log(c)) <= half) - 0.95) <= _tol(0.95)
        else:
            assert abs(np.mean(p < 0.05) - 0.05) <= _tol(0.05)
    base, member = _curves(rng, 1.1)
    p = t_test(log_ratios(member, TOKENS, base, TOKENS))[2]
    sd_r = RUN_SD * math.sqrt(2) / (ALPHA * A * TOKENS[-1] ** -ALPHA)
    power = _nct_power(math.log(1.1) / (sd_r / math.sqrt(SEEDS)), SEEDS - 1, T_975_4)
    assert abs(np.mean(p < 0.05) - power) <= _tol(0.5), (np.mean(p < 0.05), power)


def test_matched_loss_ratio_says_why_it_is_not_estimable():
    exact = {s: _curve(TOKENS) for s in range(3)}
    ratio, why = matched_ratio({s: _curve(1.25 * TOKENS) for s in range(3)}, TOKENS, exact, TOKENS)
    assert why == "" and ratio.mean == pytest.approx(0.8, rel=1e-3)
    worse = {0: _curve(1.25 * TOKENS), 1: _curve(0.3 * TOKENS), 2: _curve(0.3 * TOKENS)}
    assert matched_ratio(worse, TOKENS, exact, TOKENS) == (
        None,
        "seed(s) 1,2 do not reach the baseline's final loss within 2x their tokens",
    )
    assert matched_ratio(exact, TOKENS[:3], exact, TOKENS[:3])[1].startswith("fewer than 3")


def test_accuracy_interval_covers_with_clustered_items_and_seeds():
    """1000 repetitions: 300 items in 50 passages of 6 (a passage effect), 5 seeds (a seed
    effect): the interval covers the population accuracy in 95% +- 0.021; treating the items as
    independent (no clusters) covers less than 85%."""
    rng = np.random.default_rng(5)
    z = rng.standard_normal(2_000_000)
    truth = np.mean(1 / (1 + np.exp(-(0.4 + math.hypot(1.5, 0.5, 0.15) * z))))
    reps, clusters = 1000, np.repeat(np.arange(50), 6)
    covered, naive = 0, 0
    for _ in range(reps):
        logit = (0.4 + 1.5 * rng.standard_normal(50)[clusters] + 0.5 * rng.standard_normal(300))[
            None
        ]
        p = 1 / (1 + np.exp(-(logit + 0.15 * rng.standard_normal((SEEDS, 1)))))
        correct = rng.random((SEEDS, 300)) < p
        clustered, plain = accuracy_interval(correct, clusters), accuracy_interval(correct)
        covered += clustered.lo <= truth <= clustered.hi
        naive += plain.lo <= truth <= plain.hi
    assert abs(covered / reps - 0.95) <= _tol(0.95, reps), covered / reps
    assert naive / reps < 0.85, naive / reps


# --- synthetic run folders through scripts/sweep.py report -----------------------------------

SHAPES = {
    "syn-base": "model: {block: baseline}",
    "syn-hg": "model: {block: hourglass, K: 2, d_h: 64}",
    "syn-hg2": "model: {block: hourglass, K: 2, d_h: 32}",
}


def _configs(root, shapes=SHAPES):
    cfg = root / "configs"
    cfg.mkdir()
    for name, model in shapes.items():
        (cfg / f"{name}.yaml").write_text(
            f"extends: {REPO / 'configs/demo/baseline.yaml'}\n{model}\n"
            f"run: {{name: {name}, save_folder: {root / 'runs' / name}}}\n"
        )
    return cfg


def _write_run(config, overrides, final, rng, reached=200, nan_at=None):
    """A run folder as training leaves it: config.yaml, a validation curve ending at ``final``
    (at step ``reached``; a NaN loss from ``nan_at``, then exit 3) and a checkpoint at the last
    step reached (the planned 200: complete)."""
    spec = load_spec(config, overrides)
    folder = Path(spec.save_folder)
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(spec_to_yaml(spec))
    lines = [{"step": 0, "eval/lm/val/CE loss": 8.3}]
    for step in range(50, reached + 1, 50):
        loss = final + 0.3 * (200 / step - 1) ** 0.5 + 1e-4 * rng.random()
        lines.append({"step": step, "eval/lm/val/CE loss": loss if step < 200 else final})
    if nan_at:
        lines.append({"step": nan_at, "train/CE loss": math.nan})
        (folder / "sweep-last.json").write_text(json.dumps({"exit": 3, "error": "diverged"}))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (folder / f"step{reached}").mkdir()
    (folder / f"step{reached}" / ".metadata").touch()  # OLMo-core: a complete checkpoint
    return folder


def _seed_overrides(name, root, s, lr_scale=1.0):
    """The run of seed offset s at LR scale x, as docs/statistics.md names it: NAME-lrXx-seedS."""
    own, suffix = [], ""
    if lr_scale != 1.0:
        own, suffix = [f"train.lr={3e-3 * lr_scale}"], f"-lr{lr_scale:g}x"
    if s:
        own += [f"train.seed={6198 + s}", f"data.order_seed={6198 + s}"]
        suffix += f"-seed{s}"
    if not suffix:
        return []
    return [*own, f"run.name={name}{suffix}", f"run.save_folder={root / 'runs' / name}{suffix}"]


@pytest.fixture(scope="module")
def synthetic_sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("stats")
    cfg = _configs(root)
    rng = np.random.default_rng(6)
    base = 5.5 + 0.02 * rng.standard_normal(SEEDS)
    finals = {"syn-base": base, "syn-hg": base + 0.05 + 0.01 * rng.standard_normal(SEEDS)}
    finals["syn-hg2"] = base + 0.01 + 0.01 * rng.standard_normal(SEEDS)
    for name, losses in finals.items():
        for s, loss in enumerate(losses):
            folder = _write_run(
                cfg / f"{name}.yaml", _seed_overrides(name, root, s), float(loss), rng
            )
            # post-hoc downstream outcomes (scripts/evaluate.py): 40 documents, 10 passages
            correct = [float(v) for v in rng.random(40) < 0.6]
            items = {
                "doc": list(range(40)),
                "correct": correct,
                "cluster": [str(d // 4) for d in range(40)],
            }
            (folder / "items-step200.json").write_text(json.dumps({"boolq": items}))
    return root, cfg, finals


def _csv(path):
    with open(path) as f:
        return {row["member"]: row for row in csv.DictReader(f)}


def _interval(x, digits=4):
    t = T_975_4 if len(x) == 5 else sps.t.ppf(0.975, len(x) - 1)
    half = t * np.std(x, ddof=1) / math.sqrt(len(x))
    return (
        f"{np.mean(x):.{digits}f} [{np.mean(x) - half:.{digits}f}, {np.mean(x) + half:.{digits}f}]"
    )


@pytest.mark.slow
def test_report_gives_intervals_paired_differences_and_what_the_seeds_could_see(synthetic_sweep):
    root, cfg, finals = synthetic_sweep
    out = root / "report"
    r = run_in_process("sweep.py", "report", str(cfg), "--seeds", "5", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    assert (out / "val_curves.png").stat().st_size > 10_000  # mean curves with their bands
    rows = _csv(out / "comparison.csv")
    base = finals["syn-base"]
    assert rows["syn-base"]["val loss [95%]"] == _interval(base)
    assert (
        rows["syn-base"]["seeds"] == "5"
        and rows["syn-base"]["diff to baseline [95%]"] == "baseline"
    )
    p = {}
    for name in ("syn-hg", "syn-hg2"):
        d = finals[name] - base
        assert rows[name]["diff to baseline [95%]"] == _interval(d)
        assert rows[name]["sd of diffs"] == f"{np.std(d, ddof=1):.4f}"
        p[name] = 2 * sps.t.sf(abs(d.mean()) / (np.std(d, ddof=1) / math.sqrt(5)), 4)
        assert float(rows[name]["p"]) == pytest.approx(p[name], rel=1e-2)
    # Holm for two: the smaller p x 2, the larger x 1, kept non-decreasing
    small, large = sorted(p, key=p.get)
    assert float(rows[small]["p (Holm)"]) == pytest.approx(min(1, 2 * p[small]), rel=1e-2)
    assert float(rows[large]["p (Holm)"]) == pytest.approx(max(2 * p[small], p[large]), rel=1e-2)
    assert rows["syn-hg"]["verdict"] == rows["syn-hg"]["verdict (Holm)"] == "distinguishable"
    # every seed finished: the tokens ratio has an interval
    assert rows["syn-hg"]["tokens ratio [95%]"].count("[") == 1, rows["syn-hg"]
    seeds = _csv(out / "seeds.csv")  # one LR: one row per member
    assert (
        seeds["syn-hg"]["seed 3"]
        == f"{finals['syn-hg'][3]:.4f} ({finals['syn-hg'][3] - base[3]:+.4f})"
    )
    boolq = _csv(out / "downstream.csv")["syn-hg"]
    outcomes = [json.loads((root / "runs" / f"syn-hg{f'-seed{s}' * bool(s)}" / "items-step200.json")
                .read_text())["boolq"]["correct"] for s in range(5)]  # fmt: skip
    assert (boolq["task"], boolq["documents"], boolq["passages"]) == ("boolq", "40", "10")
    assert boolq["accuracy [95%]"].startswith(f"{np.mean(outcomes):.4f} [")
    notes = (out / "comparison_notes.md").read_text()
    assert "5 seed(s), offsets 0, 1, 2, 3, 4 added to train.seed (init)" in notes
    assert "Baseline: syn-base" in notes


@pytest.mark.slow
def test_report_refuses_seeds_of_another_shape(synthetic_sweep, tmp_path):
    root, cfg, _ = synthetic_sweep
    seed2 = root / "runs" / "syn-hg-seed2" / "config.yaml"
    good = seed2.read_text()
    seed2.write_text(good.replace("d_h: 64", "d_h: 32"))
    try:
        out = tmp_path / "report"
        r = run_in_process(
            "sweep.py", "report", str(cfg), "--seeds", "5", "--out", str(out), "--no-figures"
        )
    finally:
        seed2.write_text(good)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert str(seed2.parent) in lines[0] and "model.d_h: 32 -> 64" in lines[0]
    assert not out.exists()


@pytest.fixture(scope="module")
def lr_grid(tmp_path_factory):
    """Planted optima: the baseline's at x1, the hourglass's at x2 (the grid's edge), 3 seeds.
    Left out: a diverged baseline run at x2 (NaN at step 120, exit 3, its last validation loss 5.0
    the lowest of all), an hourglass seed stopped at step 100 of 200, one never started."""
    root = tmp_path_factory.mktemp("lr")
    cfg = _configs(root, {k: v for k, v in SHAPES.items() if k != "syn-hg2"})
    rng = np.random.default_rng(7)
    planted = {
        "syn-base": {0.5: 5.53, 1.0: 5.50, 2.0: 5.56},
        "syn-hg": {0.5: 5.70, 1.0: 5.60, 2.0: 5.45},
    }
    finals = {}
    for name, by_lr in planted.items():
        for x, loss in by_lr.items():
            for s in range(3):
                if (name, x, s) == ("syn-hg", 0.5, 0):
                    continue  # never started
                final = finals[name, x, s] = loss + 0.005 * rng.standard_normal()
                kw = {
                    ("syn-base", 2.0, 1): dict(final=5.0, reached=100, nan_at=120),
                    ("syn-hg", 1.0, 2): dict(reached=100),
                }.get((name, x, s), {})
                _write_run(cfg / f"{name}.yaml", _seed_overrides(name, root, s, x),
                           **{"final": final, "rng": rng, **kw})  # fmt: skip
    return root, cfg, finals


LR_GRID = ["--seeds", "3", "--lr-grid", "0.5,2", "--no-figures"]


@pytest.mark.slow
def test_lr_sweep_and_comparison_read_only_finished_runs_and_name_the_others(lr_grid):
    root, cfg, finals = lr_grid
    out = root / "config-lr"
    r = run_in_process("sweep.py", "report", str(cfg), *LR_GRID, "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    sweep = _csv(out / "lr_sweep.csv")
    used = [finals["syn-base", 2.0, s] for s in (0, 2)]
    assert sweep["syn-base"]["x2"] == f"{np.mean(used):.4f} (2 of 3)"
    assert (sweep["syn-base"]["best LR"], sweep["syn-base"]["best / config"]) == ("0.003", "x1")
    assert sweep["syn-base"]["note"] == "inside the grid; finer: --lr-grid 0.5,0.707,1.41,2"
    assert sweep["syn-hg"]["x0.5"].endswith("(2 of 3)") and sweep["syn-hg"]["best LR"] == "0.006"
    assert sweep["syn-hg"]["note"].endswith("extend with --lr-grid 0.5,2,4")
    at_config = _csv(out / "comparison.csv")
    assert (
        at_config["syn-hg"]["LR"] == "0.003 (config)" and at_config["syn-hg"]["seeds"] == "2 of 3"
    )
    hg = [finals["syn-hg", 1.0, s] for s in (0, 1)]
    assert at_config["syn-hg"]["val loss [95%]"] == _interval(hg)
    with open(out / "seeds.csv") as f:
        seeds = {(r["member"], r["LR x"]): r for r in csv.DictReader(f)}
    assert seeds["syn-hg", "1"]["seed 2"] == "left out: stopped at step 100/200"
    assert seeds["syn-hg", "0.5"]["seed 0"] == "left out: not started"
    assert seeds["syn-base", "2"]["seed 1"] == "left out: failed at step 120/200 (diverged)"
    # the papers' tables read each member once, at the LR it is compared at: no row of its own for
    # another scale of the grid
    with open(out / "hourglass_runs.csv") as f:
        (row,) = csv.DictReader(f)
    assert (row["run"], row["seeds"], row["val loss"]) == ("syn-hg", "2", _interval(hg))


@pytest.mark.slow
def test_comparison_at_each_members_best_lr_and_confirmed_on_fresh_seeds(lr_grid):
    root, cfg, finals = lr_grid
    out = root / "best-lr"
    r = run_in_process("sweep.py", "report", str(cfg), *LR_GRID, "--best-lr", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    best = _csv(out / "comparison.csv")
    assert best["syn-hg"]["LR"] == "0.006 (own best, x2)"
    assert best["syn-base"]["LR"] == "0.003 (own best, x1)"
    # at its own best, the hourglass wins: 5.45 - 5.50
    assert float(best["syn-hg"]["diff to baseline [95%]"].split()[0]) == pytest.approx(
        -0.05, abs=0.02
    )
    assert best["syn-hg"]["verdict"] == "distinguishable"
    assert "each member at its own best LR" in (out / "comparison_notes.md").read_text()
    with open(out / "hourglass_runs.csv") as f:
        (row,) = csv.DictReader(f)
    assert (row["run"], row["steps"]) == ("syn-hg", "200")  # its seeds at x2, all three
    assert row["val loss"] == _interval([finals["syn-hg", 2.0, s] for s in range(3)])
    # --confirm 2: fresh seeds 3, 4 at each member's best LR (the baseline's x1, the hourglass's
    # x2), compared on them alone
    fresh = {("syn-base", 1.0): [5.52, 5.49], ("syn-hg", 2.0): [5.47, 5.45]}
    for (name, x), losses in fresh.items():
        for s, loss in zip((3, 4), losses):
            _write_run(
                cfg / f"{name}.yaml",
                _seed_overrides(name, root, s, x),
                loss,
                np.random.default_rng(8),
            )
    out = root / "confirm"
    r = run_in_process(
        "sweep.py", "report", str(cfg), *LR_GRID, "--confirm", "2", "--out", str(out)
    )
    assert r.returncode == 0, r.stderr[-3000:]
    confirmed = _csv(out / "comparison.csv")
    assert (
        confirmed["syn-hg"]["LR"] == "0.006 (own best, x2)" and confirmed["syn-hg"]["seeds"] == "2"
    )
    assert confirmed["syn-hg"]["diff to baseline [95%]"].startswith("-0.0450 [")
    assert "compared on fresh seeds 3, 4" in (out / "comparison_notes.md").read_text()
