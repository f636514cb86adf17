"""Resume exactness: a run stopped (checkpointed) at step 2 and resumed to step 4 against the
uninterrupted run, the loss at every step and AdamW's state at step 4 (exp_avg, exp_avg_sq, step of
every parameter), on the demo corpus's real tokens (its BPE over Python's standard library), so a
resumed run that read the wrong batches shows in its loss. Bit-identity is reported; GPU backward
kernels are not deterministic, so the pass mark is BF16_TOL."""

import pytest
import torch

from olmo_patches.launch.layout import load_and_resolve
from olmo_patches.train import train
from olmo_patches.train.checkpoints import load_optim_state
from olmo_patches.launch.run_folder import read_metrics

from ._common import BF16_TOL, REPO, demo_overrides, rel

pytestmark = pytest.mark.gpu


def test_stopped_and_resumed_equals_uninterrupted(env, rows):
    seq, batch = (32, 4) if env.rehearse else (512, 8)
    extra = [
        "train.hardware=none",
        "train.micro_batch_size=null",
        "run.save_interval=2",
        "model.d_model=64",
        "model.n_heads=2",
        "train.precision=" + ("bf16" if env.cuda else "fp32"),
    ]
    folders = {}
    for name in ("straight", "resumed"):
        folder = folders[name] = env.work / f"resume-{name}"
        overrides = [*demo_overrides(folder, seq, batch, 4, env.device), *extra]
        if name == "resumed":
            train(
                load_and_resolve(
                    REPO / "configs" / "demo" / "baseline.yaml", [*overrides, "run.stop_at_step=2"]
                )
            )
        train(load_and_resolve(REPO / "configs" / "demo" / "baseline.yaml", overrides))
    losses = {
        n: {s: m["train/CE loss"] for s, m in read_metrics(f).items() if "train/CE loss" in m}
        for n, f in folders.items()
    }
    steps = sorted(losses["straight"])
    assert steps == [1, 2, 3, 4] and sorted(losses["resumed"]) == steps, (
        steps,
        sorted(losses["resumed"]),
    )
    worst = max(
        abs(losses["resumed"][s] - losses["straight"][s]) / abs(losses["straight"][s])
        for s in steps
    )
    exact = all(losses["resumed"][s] == losses["straight"][s] for s in steps)
    rows.judge(
        "loss at steps 1-4, stopped at 2 and resumed vs uninterrupted (worst)",
        f"{worst:.2e}",
        worst <= BF16_TOL,
        f"<= {BF16_TOL:.2e}",
        "bit-identical" if exact else "not bit-identical",
    )
    a, b = (load_optim_state(folders[name] / "step4") for name in ("straight", "resumed"))
    assert a and a.keys() == b.keys(), "AdamW state keys differ"
    worst = max(rel(b[k], a[k]) for k in a)
    exact = all(torch.equal(a[k], b[k]) for k in a)
    rows.judge(
        f"AdamW state at step 4 ({len(a)} tensors; worst)",
        f"{worst:.2e}",
        worst <= BF16_TOL,
        f"<= {BF16_TOL:.2e}",
        "bit-identical" if exact else "not bit-identical",
    )
    rows.check()
