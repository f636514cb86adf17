"""lm-engine's power LR schedule (the variable-width paper's runs) as an OLMo-core scheduler: its lr
at every step against lm-engine's formula driven by torch's LambdaLR as lm-engine drives it, the
paper-2 configs' numbers, and a train / stop / resume run."""

import math

import pytest
import torch
from olmo_core.data import TokenizerConfig

from olmo_patches.config import ConfigError
from olmo_patches.launch.layout import load_and_resolve
from olmo_patches.train import train
from olmo_patches.train import DataSources, build_experiment
from olmo_patches.launch.run_folder import read_metrics

from .conftest import REPO, tiny_overrides

BASELINE = REPO / "configs" / "demo" / "baseline.yaml"
P500 = REPO / "configs" / "paper2" / "500M" / "baseline.yaml"
# The authors' 500M run (dense_500m.yml): lr 0.01, 23844 steps, 8% warmup, a = 4 x 256, c = 256 x
# 4096.
LR, STEPS, W, A, B_EXP, C = 0.01, 23844, 1908, 1024, -0.566, 256 * 4096


def _lm_engine_lrs(base_lrs, steps, warmup, a, b, c):
    """The lr of each optimizer update 1..steps, as lm-engine's PowerScheduler (a LambdaLR) gives
    it."""
    lr0 = base_lrs[0]
    max_warm = min(1, a / lr0 * (warmup * c) ** b)

    def lam(n):  # lm-engine optimization/scheduler.py _lr_lambda
        if warmup > 0 and n <= warmup:
            return max_warm / warmup * n
        return min(1, a / lr0 * (n * c) ** b)

    params = [torch.nn.Parameter(torch.zeros(1)) for _ in base_lrs]
    opt = torch.optim.SGD([{"params": [p], "lr": lr} for p, lr in zip(params, base_lrs)])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lam)
    out = []
    # lm-engine pretrain.py: optimizer.step() then lr_scheduler.step(); the updates themselves do
    # not matter here
    opt.step()
    for _ in range(steps):
        out.append([g["lr"] for g in opt.param_groups])
        sched.step()
    return out


class _Trainer:  # the two fields OLMo-core's Scheduler.set_lr reads
    def __init__(self, step, max_steps):
        self.global_step, self.max_steps = step, max_steps


def _scheduler(spec):
    exp = build_experiment(spec, DataSources(TokenizerConfig.dolma2(), [], []))
    return exp.train_module.scheduler


def test_500m_schedule_matches_lm_engine_at_every_step():
    spec = load_and_resolve(P500)
    sched = _scheduler(spec)
    assert type(sched).__name__ == "PowerScheduler"
    groups = [
        {"lr": LR},
        {"lr": LR / 8},
    ]  # lm-engine's "normal" group 0 and the muP group at lr / m_width
    ref = _lm_engine_lrs([LR, LR / 8], STEPS, W, A, B_EXP, C)
    worst = 0.0
    for step in range(1, STEPS + 1):  # OLMo-core sets the lr after incrementing global_step
        got = [sched.set_lr(g, _Trainer(step, STEPS)) for g in groups]
        for x, y in zip(got, ref[step - 1]):
            worst = max(worst, abs(x - y) / max(abs(y), 1e-30))
    assert worst < 1e-12
    # Computed by hand from lm-engine's formula: 0 at the first update, peak factor 0.55697
    # at the end of warmup, 1.334e-3 at the last update; no floor, no decay phase.
    lr = lambda step: sched.get_lr(LR, step, STEPS)  # noqa: E731
    assert lr(1) == 0.0
    assert lr(W + 1) == pytest.approx(0.55697 * LR, rel=1e-4)
    assert lr(W + 1) > lr(W) and lr(W + 2) < lr(W + 1)
    assert lr(STEPS) == pytest.approx(1.334e-3, rel=1e-3)
    assert lr(STEPS) / lr(W + 1) == pytest.approx(0.2394, abs=2e-4)


def test_paper2_configs_use_power_and_others_cosine():
    for size, batch in (("200M", 128), ("500M", 256), ("1B", 512), ("2B", 1024)):
        for name in ("baseline", "x"):
            t = load_and_resolve(REPO / "configs" / "paper2" / size / f"{name}.yaml").train
            assert t.schedule == "power" and t.global_batch_size == batch
            assert (t.power.a, t.power.b, t.power.c) == (4 * batch, -0.566, batch * 4096)
    for path in (
        BASELINE,
        REPO / "configs" / "1B" / "baseline.yaml",
        REPO / "configs" / "113M" / "variable-width.yaml",
    ):
        spec = load_and_resolve(path)
        assert (
            spec.train.schedule == "cosine" and type(_scheduler(spec)).__name__ == "CosWithWarmup"
        )


def test_power_without_a_fails_at_load():
    # the command line made train.power (its c) without a: the line names it
    with pytest.raises(
        ConfigError, match=r"^command line: train\.power\.a=None: schedule=power needs a value > 0"
    ):
        load_and_resolve(BASELINE, ["train.schedule=power", "train.power.c=128"])
    with pytest.raises(ConfigError, match=r"train\.schedule=linear: choose one of cosine, power"):
        load_and_resolve(BASELINE, ["train.schedule=linear"])


@pytest.mark.slow
def test_train_stop_and_resume_with_power(tmp_path, demo_corpus):
    """The schedule is a function of the step: a run stopped at step 2 resumes on the same lr
    curve."""
    power = [
        "train.schedule=power",
        "train.lr=0.01",
        "train.power.a=0.1",
        "train.power.c=128",
        "train.max_steps=4",
    ]
    train(load_and_resolve(BASELINE, tiny_overrides(tmp_path, *power, "run.stop_at_step=2")))
    assert 2 in read_metrics(tmp_path) and 3 not in read_metrics(tmp_path)
    train(load_and_resolve(BASELINE, tiny_overrides(tmp_path, *power)))  # resumes from step2
    m = read_metrics(tmp_path)
    key = next(k for k in m[1] if k.startswith("optim/LR"))
    # tiny_overrides: warmup 2 steps, 4 x 32 tokens per step (c = 128), lr0 = 0.01, a = 0.1, b =
    # -0.566; update i uses n = i - 1: 0, half the warmup's end, P(2), P(3) with P(n) = (a / lr0)
    # (128 n)^b.
    p2, p3 = 0.1 / 0.01 * 256**-0.566, 0.1 / 0.01 * 384**-0.566
    assert p3 < p2 < 1
    assert [m[s][key] for s in (1, 2, 3, 4)] == pytest.approx(
        [0.0, 0.5 * p2 * 0.01, p2 * 0.01, p3 * 0.01], rel=1e-6
    )
    assert (tmp_path / "step4").is_dir() and all(
        math.isfinite(m[s]["train/CE loss"]) for s in (3, 4)
    )
