"""The comparison over seeds (report/stats.py, report/compare.py) against references written here:
generated final losses with a known gap and known noise (the interval's coverage, the false-alarm
rate, the power of the paired t-test from the noncentral t distribution), and synthetic run folders
reported by scripts/sweep.py (the table's numbers against the t-interval computed by hand)."""

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from olmo_patches.config import load_spec, spec_to_yaml
from olmo_patches.report.stats import (
    matched_loss_ratio,
    mean_interval,
    noise_floor,
    paired_difference,
    tokens_to_reach,
)

from .conftest import REPO, run_in_process

CASES = 2000
SEEDS = 5
T_975_4 = 2.7764451051977987  # Student t, 97.5% quantile, 4 degrees of freedom (tables)
DEMO_LOSS = 5.5  # the demo baseline's final validation loss (docs/ablations_demo.md: PPL 246)
# The demo's seed-to-seed standard deviation of the final validation loss: ASSUMED (0.4% of the
# loss), not measured; docs/statistics.md says how to measure it with the worked example's command.
DEMO_SD = 0.02


def _draws(rng, gap, sd, shared_sd=0.0):
    """(member, baseline) final losses by seed: a seed effect both share (same init and data order)
    plus each run's own noise."""
    shared = shared_sd * rng.standard_normal(SEEDS)
    base = DEMO_LOSS + shared + sd * rng.standard_normal(SEEDS)
    member = DEMO_LOSS + gap + shared + sd * rng.standard_normal(SEEDS)
    return dict(enumerate(member)), dict(enumerate(base))


def test_t_interval_matches_the_textbook_formula():
    x = [5.51, 5.47, 5.53, 5.49, 5.50]
    mean = sum(x) / 5
    sd = math.sqrt(sum((v - mean) ** 2 for v in x) / 4)
    i = mean_interval(x)
    assert i.mean == pytest.approx(mean) and i.n == 5
    assert i.lo == pytest.approx(mean - T_975_4 * sd / math.sqrt(5))
    assert i.hi == pytest.approx(mean + T_975_4 * sd / math.sqrt(5))


def test_interval_covers_the_true_gap_in_95_percent_of_cases():
    rng = np.random.default_rng(1)
    gap = 0.055
    covered = sum(
        paired_difference(*_draws(rng, gap, DEMO_SD, 0.03)).diff.covers(gap) for _ in range(CASES)
    )
    # binomial: 0.95 +- 3 x sqrt(0.95 x 0.05 / 2000) = 0.95 +- 0.015; a normal (z) interval at 5
    # seeds would cover about 88%
    assert 0.935 <= covered / CASES <= 0.965, covered / CASES


def test_baseline_against_itself_is_not_distinguishable():
    rng = np.random.default_rng(2)
    verdicts = [paired_difference(*_draws(rng, 0.0, DEMO_SD, 0.03)).verdict for _ in range(CASES)]
    rate = verdicts.count("not distinguishable") / CASES
    assert set(verdicts) == {"distinguishable", "not distinguishable"}
    # A 95% test calls 5% of equal pairs distinguishable by construction: "at least 95%" holds in
    # expectation, and 2000 cases scatter around it with a binomial sd of 0.005 (3 sd allowed);
    # an interval too narrow (a z interval at 5 seeds) falls to about 88%.
    assert rate >= 0.95 - 3 * math.sqrt(0.95 * 0.05 / CASES), rate


def test_planted_one_percent_gap_is_detected_at_the_t_tests_power():
    rng = np.random.default_rng(3)
    gap = 0.01 * DEMO_LOSS
    found = [
        paired_difference(*_draws(rng, gap, DEMO_SD)).verdict == "distinguishable"
        for _ in range(CASES)
    ]
    # reference: the paired t-test's power, noncentral t with 4 df, noncentrality gap / (sd sqrt(2)
    # / sqrt(5))
    delta = gap / (DEMO_SD * math.sqrt(2) / math.sqrt(SEEDS))
    power = 1 - sps.nct.cdf(T_975_4, SEEDS - 1, delta) + sps.nct.cdf(-T_975_4, SEEDS - 1, delta)
    rate = sum(found) / CASES
    assert rate >= 0.85 and abs(rate - power) < 0.025, (rate, power)


def test_pairing_by_seed_removes_the_shared_seed_effect():
    """A seed effect 10x the gap: pooled, the seeds hide the gap; paired, it is found."""
    rng = np.random.default_rng(4)
    member, base = _draws(rng, 0.055, 0.002, shared_sd=0.5)
    assert paired_difference(member, base).verdict == "distinguishable"
    assert mean_interval(list(member.values())).covers(mean_interval(list(base.values())).mean)


def test_noise_floor_is_every_pair_of_the_baselines_seeds():
    floor = noise_floor({0: 5.50, 1: 5.53, 2: 5.46})
    gaps = [0.03, 0.04, 0.07]
    assert floor.pairs == 3
    assert floor.largest == pytest.approx(0.07)
    assert floor.rms == pytest.approx(math.sqrt(sum(g * g for g in gaps) / 3))
    assert noise_floor({0: 5.5}) is None


def test_tokens_to_reach_interpolates_between_evaluations():
    assert tokens_to_reach([100, 200, 300], [6.0, 5.0, 4.0], 4.5) == pytest.approx(250)
    assert tokens_to_reach([100, 200, 300], [6.0, 5.0, 4.0], 6.5) == pytest.approx(100)
    assert math.isnan(tokens_to_reach([100, 200, 300], [6.0, 5.0, 4.0], 3.9))


def test_matched_loss_ratio_recovers_a_known_compute_multiplier():
    """Loss L(t) = 2.5 + 40 / sqrt(t): a member that learns as if it had seen 1.25 x the tokens
    reaches the baseline's final loss at 1 / 1.25 = 0.8 of its tokens; the bootstrap interval covers
    0.8."""
    rng = np.random.default_rng(5)
    t = np.linspace(1e5, 1e6, 91)
    base = {s: 2.5 + 40 / np.sqrt(t) + 0.0003 * rng.standard_normal() for s in range(SEEDS)}
    member = {
        s: 2.5 + 40 / np.sqrt(1.25 * t) + 0.0003 * rng.standard_normal() for s in range(SEEDS)
    }
    ratio = matched_loss_ratio(member, base, t)
    assert ratio.mean == pytest.approx(0.8, abs=0.03)
    assert ratio.lo < 0.8 < ratio.hi and ratio.hi - ratio.lo < 0.2


def test_matched_loss_ratio_without_a_curve_is_none_not_an_error():
    """Only the step-0 evaluation (0 tokens): the baseline "reaches" its loss at once; no ratio."""
    ratio = matched_loss_ratio({0: [8.3]}, {0: [8.3]}, [0.0])
    assert math.isnan(ratio.mean) and ratio.n == 1


# --- synthetic run folders through scripts/sweep.py report -----------------------------------


def _configs(root):
    cfg = root / "configs"
    cfg.mkdir()
    shapes = {
        "syn-base": "model: {block: baseline}",
        "syn-hg": "model: {block: hourglass, K: 2, d_h: 64}",
    }
    for name, model in shapes.items():
        (cfg / f"{name}.yaml").write_text(
            f"extends: {REPO / 'configs/demo/baseline.yaml'}\n{model}\n"
            f"run: {{name: {name}, save_folder: {root / 'runs' / name}}}\n"
        )
    return cfg


def _write_run(config, overrides, final, rng):
    """A run folder as training leaves it: config.yaml and a validation curve ending at
    ``final``."""
    spec = load_spec(config, overrides)
    folder = Path(spec.save_folder)
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(spec_to_yaml(spec))
    lines = []
    for step in (50, 100, 150, 200):
        lines.append(
            {
                "step": step,
                "eval/lm/val/CE loss": final
                + 3.0 * (200 / step - 1) ** 0.5 / 10
                + 1e-4 * rng.random(),
            }
        )
    lines[-1]["eval/lm/val/CE loss"] = final
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
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
    finals = {"syn-base": 5.5 + 0.02 * rng.standard_normal(SEEDS)}
    finals["syn-hg"] = finals["syn-base"] + 0.05 + 0.01 * rng.standard_normal(SEEDS)
    for name, losses in finals.items():
        for s, loss in enumerate(losses):
            _write_run(cfg / f"{name}.yaml", _seed_overrides(name, root, s), float(loss), rng)
    return root, cfg, finals


def _csv(path):
    with open(path) as f:
        return {row["member"]: row for row in csv.DictReader(f)}


def test_report_gives_intervals_paired_differences_and_the_noise_floor(synthetic_sweep):
    root, cfg, finals = synthetic_sweep
    out = root / "report"
    r = run_in_process("sweep.py", "report", str(cfg), "--seeds", "5", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    assert (out / "val_curves.png").stat().st_size > 10_000  # mean curves with their bands
    rows = _csv(out / "comparison.csv")
    base, hg = finals["syn-base"], finals["syn-hg"]
    d = hg - base
    half = T_975_4 * d.std(ddof=1) / math.sqrt(5)
    assert rows["syn-hg"]["diff to baseline [95%]"].startswith(
        f"{d.mean():.4f} [{d.mean() - half:.4f}, {d.mean() + half:.4f}]"
    )
    assert rows["syn-hg"]["verdict"] == "distinguishable"
    half_b = T_975_4 * base.std(ddof=1) / math.sqrt(5)
    assert (
        rows["syn-base"]["val loss [95%]"]
        == f"{base.mean():.4f} [{base.mean() - half_b:.4f}, {base.mean() + half_b:.4f}]"
    )
    assert rows["syn-base"]["val PPL [95%]"].startswith(
        f"{math.exp(base.mean()):.2f} [{math.exp(base.mean() - half_b):.2f}"
    )
    assert (
        rows["syn-base"]["seeds"] == "5"
        and rows["syn-base"]["diff to baseline [95%]"] == "baseline"
    )
    floor = _csv(out / "noise_floor.csv")["syn-base"]
    gaps = [abs(a - b) for i, a in enumerate(base) for b in base[i + 1 :]]
    assert floor["seed pairs"] == "10" and floor["largest gap"] == f"{max(gaps):.4f}"
    notes = (out / "comparison_notes.md").read_text()
    assert (
        "5 seed(s), offsets 0, 1, 2, 3, 4 added to train.seed (init) and data.order_seed "
        "(data order)" in notes
    )
    assert "Baseline: syn-base" in notes


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
    assert str(seed2) in lines[0] and "model.d_h: 32 -> 64" in lines[0]
    assert not out.exists()


def test_lr_sweep_finds_each_members_best_lr_and_the_comparison_says_which_it_used(tmp_path):
    """Planted optima: the baseline's at its config's LR (x1), the hourglass's at x2 (the grid's
    edge)."""
    cfg = _configs(tmp_path)
    rng = np.random.default_rng(7)
    planted = {
        "syn-base": {0.5: 5.53, 1.0: 5.50, 2.0: 5.56},
        "syn-hg": {0.5: 5.70, 1.0: 5.60, 2.0: 5.45},
    }
    for name, by_lr in planted.items():
        for x, loss in by_lr.items():
            for s in range(3):
                final = loss + 0.005 * rng.standard_normal()
                _write_run(cfg / f"{name}.yaml", _seed_overrides(name, tmp_path, s, x), final, rng)
    common = ["--seeds", "3", "--lr-grid", "0.5,2", "--no-figures"]
    r = run_in_process(
        "sweep.py", "report", str(cfg), *common, "--out", str(tmp_path / "config-lr")
    )
    assert r.returncode == 0, r.stderr[-3000:]
    sweep = _csv(tmp_path / "config-lr" / "lr_sweep.csv")
    assert (
        sweep["syn-base"]["best LR"],
        sweep["syn-base"]["best / config"],
        sweep["syn-base"]["note"],
    ) == ("0.003", "x1", "")
    assert (sweep["syn-hg"]["best LR"], sweep["syn-hg"]["log2 distance"]) == ("0.006", "+1.00")
    assert "edge" in sweep["syn-hg"]["note"]
    at_config = _csv(tmp_path / "config-lr" / "comparison.csv")
    assert at_config["syn-hg"]["LR"] == "0.003 (config)"
    assert float(at_config["syn-hg"]["diff to baseline [95%]"].split()[0]) == pytest.approx(
        0.10, abs=0.02
    )
    r = run_in_process(
        "sweep.py", "report", str(cfg), *common, "--best-lr", "--out", str(tmp_path / "best-lr")
    )
    assert r.returncode == 0, r.stderr[-3000:]
    best = _csv(tmp_path / "best-lr" / "comparison.csv")
    assert (
        best["syn-hg"]["LR"] == "0.006 (own best, x2)"
        and best["syn-base"]["LR"] == "0.003 (own best, x1)"
    )
    # at its own best, the hourglass wins: 5.45 - 5.50
    assert float(best["syn-hg"]["diff to baseline [95%]"].split()[0]) == pytest.approx(
        -0.05, abs=0.02
    )
    assert best["syn-hg"]["verdict"] == "distinguishable"
    assert (
        "each member at its own best LR"
        in (tmp_path / "best-lr" / "comparison_notes.md").read_text()
    )
