"""Paper 2's per-layer analyses (report/analysis.py): each metric against a float64 reference written from
its definition on tensors with a known answer; the hooks on built models; scripts/analyze.py end to end."""

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from olmo_patches.config import load_spec, vocab_size
from olmo_patches.report.analysis import analyze_model, dead_units, matrix_entropy, participation_ratio, target_probability
from olmo_patches.train import train

from .conftest import REPO, run_in_process, tiny_overrides

DEMO = REPO / "configs" / "demo"


def rank_r(N: int, d: int, r: int, seed: int = 0, spectrum=None) -> np.ndarray:
    """N x d, centred columns, rank r: U diag(s) V^T with U's columns orthonormal and orthogonal to the ones vector."""
    rng = np.random.default_rng(seed)
    M = rng.normal(size=(N, r))
    M -= M.mean(axis=0)
    U, _ = np.linalg.qr(M)
    V, _ = np.linalg.qr(rng.normal(size=(d, r)))
    s = np.ones(r) if spectrum is None else np.asarray(spectrum, dtype=float)
    return (U * s) @ V.T + 3.0  # a constant offset: centring removes it


@pytest.mark.parametrize("r", [1, 3, 17])
def test_rank_r_stream_has_participation_ratio_r_and_entropy_log_r(r):
    Z = torch.from_numpy(rank_r(200, 48, r))
    H, H_norm = matrix_entropy(Z)
    assert participation_ratio(Z) == pytest.approx(r, rel=1e-9)
    assert H == pytest.approx(math.log(r), abs=1e-9)
    assert H_norm == pytest.approx(math.log(r) / math.log(48), abs=1e-9)  # min(N - 1, d) = 48


def test_entropy_and_participation_ratio_against_the_covariance_eigenvalues():
    """An unequal spectrum: the definitions written out on numpy's covariance eigenvalues (float64)."""
    Z = rank_r(300, 32, 8, seed=1, spectrum=[5, 4, 3, 2, 1, 0.5, 0.25, 0.1])
    Zc = Z - Z.mean(axis=0)
    lam = np.clip(np.linalg.eigvalsh(Zc.T @ Zc), 0, None)
    p = lam[lam > 1e-12] / lam.sum()
    H_ref, PR_ref = -(p * np.log(p)).sum(), lam.sum() ** 2 / (lam**2).sum()
    H, H_norm = matrix_entropy(torch.from_numpy(Z))
    assert H == pytest.approx(H_ref, rel=1e-8) and participation_ratio(torch.from_numpy(Z)) == pytest.approx(PR_ref, rel=1e-8)
    assert H_norm == pytest.approx(H_ref / math.log(32), rel=1e-8)


def test_a_dead_unit_counts_as_dead():
    rng = np.random.default_rng(2)
    A = rng.normal(size=(64, 10))
    A[:, [2, 7]] = 0.0  # never active
    A[:5, 4] = 0.0  # active on 59 of 64 tokens: alive
    A[5:, 9] = 1e-9  # below 1% of the RMS on 59 tokens, active on 5
    dead, util = dead_units(torch.from_numpy(A), threshold=0.01)
    rms = np.sqrt((A**2).mean())
    assert dead == pytest.approx(2 / 10)
    assert util == pytest.approx((np.abs(A) > 0.01 * rms).mean())
    assert dead_units(torch.zeros(8, 4))[0] == 1.0


def test_target_probability_is_softmax_at_the_target():
    rng = np.random.default_rng(3)
    logits, targets = rng.normal(size=(2, 5, 11)) * 3, rng.integers(0, 11, size=(2, 5))
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)
    ref = np.take_along_axis(p, targets[..., None], axis=-1).mean()
    assert target_probability(torch.from_numpy(logits), torch.from_numpy(targets)) == pytest.approx(ref, rel=1e-12)


@pytest.mark.parametrize(
    "variant,units", [("baseline", lambda m: 4 * m.d_model), ("hourglass", lambda m: m.K * m.d_h), ("variable-width", None)]
)
def test_hooks_on_each_variant(tmp_path, variant, units):
    """On a built (untrained) tiny model: one row per block, the FFN's hidden units (SwiGLU 4 d_model;
    the hourglass's K sub-MLPs of d_h; variable width: 4 w_l at each layer's width), the last block's logit
    lens equal to the model's own output, and a unit whose gate row is zero is dead."""
    spec = load_spec(DEMO / f"{variant}.yaml", ["model.n_layers=3", "train.device=cpu", "train.hardware=none"])
    torch.manual_seed(0)
    model = spec.model.build(vocab_size(spec)).build(init_device="cpu")
    model.init_weights(device=torch.device("cpu"))
    ffn = model.blocks["0"].feed_forward
    with torch.no_grad():
        w1 = ffn.w1.weight
        (w1[0, :3] if w1.dim() == 3 else w1[:3]).zero_()  # first sub-MLP / the FFN: 3 units read nothing
    tokens = torch.randint(0, vocab_size(spec), (2, 33))
    a = analyze_model(model, tokens, name=variant)
    m = spec.model
    assert [s.layer for s in a.layers] == [1, 2, 3]
    widths = m.resolved_widths if m.block == "variable_width" else [m.d_model] * 3
    assert [s.width for s in a.layers] == widths
    assert [s.units for s in a.layers] == ([4 * w for w in widths] if units is None else [units(m)] * 3)
    assert a.layers[0].dead_fraction >= 3 / a.layers[0].units
    assert a.layers[-1].target_probability == pytest.approx(a.final_target_probability, rel=1e-6)
    for s in a.layers:
        assert 0 <= s.normalized_entropy <= 1 + 1e-9 and 1 <= s.participation_ratio <= s.width + 1e-6
        assert 0 <= s.utilisation <= 1 and 0 < s.target_probability < 1


def test_analyze_script_on_two_checkpoints(tmp_path, demo_corpus):
    """scripts/analyze.py on a baseline and a variable-width checkpoint: the JSON has the four metrics per
    layer for each, and one figure; a missing checkpoint is a one-line error."""
    runs = []
    for variant, L in (("baseline", 2), ("variable-width", 4)):  # x needs its narrowest layer inside 1 < k < L
        folder = tmp_path / variant
        spec = load_spec(
            DEMO / f"{variant}.yaml",
            tiny_overrides(
                folder,
                "train.max_steps=2",
                "run.save_interval=2",
                f"model.n_layers={L}",
                "run.ephemeral_save_interval=null",
                f"run.name=tiny-{variant}",
            ),
        )
        train(spec)
        runs.append(str(folder))
    r = run_in_process("analyze.py", *runs, "--out", str(tmp_path / "out"), "--batch", "2", "--seq", "16")
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads((tmp_path / "out" / "analysis.json").read_text())
    assert sorted(got) == ["tiny-baseline", "tiny-variable-width"]
    for a, L in zip(got.values(), (2, 4)):
        assert len(a["layers"]) == L and a["tokens"] == 32
        for layer in a["layers"]:
            for key in ("utilisation", "dead_fraction", "normalized_entropy", "participation_ratio", "target_probability"):
                assert isinstance(layer[key], float), key
    with Image.open(tmp_path / "out" / "analysis.png") as im:
        assert im.size[0] > 600 and im.size[1] > 400
    bad = run_in_process("analyze.py", str(tmp_path / "nowhere"), "--out", str(tmp_path / "bad"))
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "nowhere" in bad.stderr
    assert not (tmp_path / "bad").exists()


def test_moe_layers_have_stream_metrics_and_no_unit_hook():
    """Paper 2's variable-width MoE (shrunk): the residual stream and logit lens per layer at each layer's
    width; its experts' hidden units are not hooked (None), not counted as dead."""
    spec = load_spec(
        REPO / "configs/paper2/3B-MoE/x.yaml",
        [
            "model.d_model=128",
            "model.n_layers=4",
            "model.n_heads=4",
            "model.moe.num_experts=4",
            "model.moe.top_k=2",
            "model.moe.expert_hidden=64",
            "train.device=cpu",
            "train.hardware=none",
        ],
    )
    torch.manual_seed(0)
    model = spec.model.build(vocab_size(spec)).build(init_device="cpu")
    model.init_weights(device=torch.device("cpu"))
    a = analyze_model(model, torch.randint(0, 1000, (2, 17)))
    assert [s.width for s in a.layers] == spec.model.resolved_widths
    assert all(s.units is None and s.dead_fraction is None and s.utilisation is None for s in a.layers)
    assert a.layers[-1].target_probability == pytest.approx(a.final_target_probability, rel=1e-6)
