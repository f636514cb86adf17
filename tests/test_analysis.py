"""Paper 2's per-layer analyses (report/analysis.py): each metric against a float64 reference
written from its definition on tensors with a known answer; the hooks on built models;
scripts/analyze.py end to end."""

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from olmo_patches.config import load_spec, vocab_size
from olmo_patches.launch.layout import load_and_resolve
from olmo_patches.report.analysis import (
    analyze_model,
    dead_units,
    matrix_entropy,
    participation_ratio,
    target_probability,
)
from olmo_patches.train import train

from .conftest import REPO, run_in_process, tiny_overrides

DEMO = REPO / "configs" / "demo"


def rank_r(N: int, d: int, r: int, seed: int = 0, spectrum=None) -> np.ndarray:
    """N x d, centred columns, rank r: U diag(s) V^T with U's columns orthonormal and orthogonal to
    the ones vector."""
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
    """An unequal spectrum: the definitions written out on numpy's covariance eigenvalues
    (float64)."""
    Z = rank_r(300, 32, 8, seed=1, spectrum=[5, 4, 3, 2, 1, 0.5, 0.25, 0.1])
    Zc = Z - Z.mean(axis=0)
    lam = np.clip(np.linalg.eigvalsh(Zc.T @ Zc), 0, None)
    p = lam[lam > 1e-12] / lam.sum()
    H_ref, PR_ref = -(p * np.log(p)).sum(), lam.sum() ** 2 / (lam**2).sum()
    H, H_norm = matrix_entropy(torch.from_numpy(Z))
    assert H == pytest.approx(H_ref, rel=1e-8) and participation_ratio(
        torch.from_numpy(Z)
    ) == pytest.approx(PR_ref, rel=1e-8)
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
    assert target_probability(torch.from_numpy(logits), torch.from_numpy(targets)) == pytest.approx(
        ref, rel=1e-12
    )


@pytest.mark.parametrize(
    "variant,units",
    [
        ("baseline", lambda m: 4 * m.d_model),
        ("hourglass", lambda m: m.K * m.d_h),
        ("variable-width", None),
    ],
)
def test_hooks_on_each_variant(tmp_path, variant, units):
    """On a built (untrained) tiny model: one row per block, the FFN's hidden units (SwiGLU 4
    d_model; the hourglass's K sub-MLPs of d_h; variable width: 4 w_l at each layer's width), the
    last block's logit lens equal to the model's own output, and a unit whose gate row is zero is
    dead."""
    spec = load_spec(
        DEMO / f"{variant}.yaml", ["model.n_layers=3", "train.device=cpu", "train.hardware=none"]
    )
    torch.manual_seed(0)
    model = spec.model.build(vocab_size(spec)).build(init_device="cpu")
    model.init_weights(device=torch.device("cpu"))
    ffn = model.blocks["0"].feed_forward
    with torch.no_grad():
        w1 = ffn.w1.weight
        (
            w1[0, :3] if w1.dim() == 3 else w1[:3]
        ).zero_()  # first sub-MLP / the FFN: 3 units read nothing
    tokens = torch.randint(0, vocab_size(spec), (2, 33))
    a = analyze_model(model, tokens, spec.model, name=variant)
    m = spec.model
    assert [s.layer for s in a.layers] == [1, 2, 3]
    widths = m.resolved_widths if m.block == "variable_width" else [m.d_model] * 3
    assert [s.width for s in a.layers] == widths
    assert [s.units for s in a.layers] == (
        [4 * w for w in widths] if units is None else [units(m)] * 3
    )
    assert a.layers[0].dead_fraction >= 3 / a.layers[0].units
    assert a.layers[-1].target_probability == pytest.approx(a.final_target_probability, rel=1e-6)
    for s in a.layers:
        assert (
            0 <= s.normalized_entropy <= 1 + 1e-9 and 1 <= s.participation_ratio <= s.width + 1e-6
        )
        assert 0 <= s.utilisation <= 1 and 0 < s.target_probability < 1


def _two_checkpoints(tmp_path) -> list:
    """A tiny baseline (2 layers) and variable-width run (4 layers), 2 steps each: their folders."""
    runs = []
    for variant, L in (
        ("baseline", 2),
        ("variable-width", 4),
    ):  # x needs its narrowest layer inside 1 < k < L
        folder = tmp_path / variant
        spec = load_and_resolve(
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
    return runs


@pytest.mark.slow
def test_analyze_script_on_two_checkpoints(tmp_path, demo_corpus):
    """scripts/analyze.py on a baseline and a variable-width checkpoint: the JSON has the four
    metrics per layer for each, and one figure; a missing checkpoint is a one-line error."""
    runs = _two_checkpoints(tmp_path)
    r = run_in_process(
        "analyze.py", *runs, "--out", str(tmp_path / "out"), "--batch", "2", "--seq", "16"
    )
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads((tmp_path / "out" / "analysis.json").read_text())
    assert sorted(got) == ["tiny-baseline", "tiny-variable-width"]
    for a, L in zip(got.values(), (2, 4)):
        assert len(a["layers"]) == L and a["tokens"] == 32
        for layer in a["layers"]:
            for key in (
                "utilisation",
                "dead_fraction",
                "normalized_entropy",
                "participation_ratio",
                "target_probability",
            ):
                assert isinstance(layer[key], float), key
    with Image.open(tmp_path / "out" / "analysis.png") as im:
        assert im.size[0] > 600 and im.size[1] > 400
    assert all(
        a["conventions"] == {"centre": True, "pooling": "pooled", "normaliser": "layer"}
        for a in got.values()
    )
    switched = tmp_path / "switched"
    args = ("--batch", "2", "--seq", "16", "--uncentred", "--per-prompt", "--normaliser", "fixed")
    r = run_in_process("analyze.py", *runs, "--out", str(switched), *args)
    assert r.returncode == 0, r.stderr[-3000:]
    other = json.loads((switched / "analysis.json").read_text())
    assert other["tiny-baseline"]["conventions"] == {
        "centre": False,
        "pooling": "per_prompt",
        "normaliser": "fixed",
    }
    assert (
        other["tiny-baseline"]["layers"][0]["entropy"]
        != got["tiny-baseline"]["layers"][0]["entropy"]
    )
    bad = run_in_process("analyze.py", str(tmp_path / "nowhere"), "--out", str(tmp_path / "bad"))
    assert (
        bad.returncode == 2
        and len(bad.stderr.strip().splitlines()) == 1
        and "nowhere" in bad.stderr
    )
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_moe_layers_have_stream_metrics_and_no_unit_hook():
    """Paper 2's variable-width MoE (shrunk): the residual stream and logit lens per layer at each
    layer's width; its experts' hidden units are not hooked (None), not counted as dead."""
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
    a = analyze_model(model, torch.randint(0, 1000, (2, 17)), spec.model)
    assert [s.width for s in a.layers] == spec.model.resolved_widths
    assert all(
        s.units is None and s.dead_fraction is None and s.utilisation is None for s in a.layers
    )
    assert a.layers[-1].target_probability == pytest.approx(a.final_target_probability, rel=1e-6)


# --- the conventions (Conventions): each switch on a constructed example, the value its definition
# predicts


def offset_stream(
    N: int = 200, d: int = 48, r: int = 4, offset: float = 3.0, seed: int = 4
) -> tuple[np.ndarray, float]:
    """N x d: r equal centred directions (singular values 1) plus one offset c shared by every
    token, c orthogonal to those directions; returns (Z, N |c|^2), the uncentred Gram's extra
    eigenvalue."""
    rng = np.random.default_rng(seed)
    M = rng.normal(size=(N, r))
    M -= M.mean(axis=0)
    U, _ = np.linalg.qr(M)
    Q, _ = np.linalg.qr(rng.normal(size=(d, r + 1)))
    c = offset * Q[:, 0]
    return U @ Q[:, 1:].T + c, N * offset**2


def test_centring_removes_a_common_offset():
    """Centred: the r equal directions, H = ln r, PR = r. Uncentred: Z^T Z = Zc^T Zc + N c c^T (the
    columns of Zc sum to 0), so the eigenvalues are r ones and N |c|^2: a near-zero entropy from the
    offset alone."""
    r = 4
    Z, big = offset_stream(r=r)
    Z = torch.from_numpy(Z)
    H_c, norm_c = matrix_entropy(Z)
    assert H_c == pytest.approx(math.log(r), abs=1e-9) and participation_ratio(Z) == pytest.approx(
        r, rel=1e-9
    )
    assert norm_c == pytest.approx(math.log(r) / math.log(48), abs=1e-9)
    lam = np.array([1.0] * r + [big])
    p = lam / lam.sum()
    H_u, norm_u = matrix_entropy(Z, centre=False)
    assert H_u == pytest.approx(-(p * np.log(p)).sum(), rel=1e-9) and H_u < 0.05 * H_c
    assert norm_u == pytest.approx(H_u / math.log(48), rel=1e-9)  # min(N, d) = 48 uncentred
    assert participation_ratio(Z, centre=False) == pytest.approx(
        lam.sum() ** 2 / (lam**2).sum(), rel=1e-9
    )


def test_pooling_across_prompts_against_per_prompt():
    """Two prompts, each moving along its own direction (centred within the prompt, equal variance):
    each prompt alone is rank 1 (H 0, PR 1), the pooled tokens rank 2 with equal variance (H ln 2,
    PR 2)."""
    seq, d = 64, 16
    t = np.random.default_rng(5).normal(size=seq)
    t = (t - t.mean()) / np.linalg.norm(t - t.mean())
    Z = np.zeros((2, seq, d))
    Z[0, :, 0], Z[1, :, 1] = t, t
    Z = torch.from_numpy(Z)
    assert matrix_entropy(Z)[0] == pytest.approx(math.log(2), abs=1e-9) and participation_ratio(
        Z
    ) == pytest.approx(2, rel=1e-9)
    assert matrix_entropy(Z)[1] == pytest.approx(
        math.log(2) / math.log(16), abs=1e-9
    )  # N - 1 = 127 > d
    H, H_norm = matrix_entropy(Z, pooling="per_prompt")
    assert H == pytest.approx(0, abs=1e-9) and H_norm == pytest.approx(0, abs=1e-9)
    assert participation_ratio(Z, pooling="per_prompt") == pytest.approx(1, rel=1e-9)
    # Dead units: unit 0 fires on prompt 0 only, unit 1 on neither: pooled 1 of 4 dead; per prompt 2
    # of 4 on prompt 1 and 1 of 4 on prompt 0, so 3/8. Utilisation is the same mean either way.
    A = np.ones((2, seq, 4))
    A[1, :, 0] = 0.0
    A[:, :, 1] = 0.0
    A = torch.from_numpy(A)
    assert dead_units(A) == pytest.approx((1 / 4, (4 * 2 * seq - 3 * seq) / (4 * 2 * seq)))
    assert dead_units(A, pooling="per_prompt") == pytest.approx((3 / 8, dead_units(A)[1]))


def test_per_layer_normaliser_against_a_fixed_ln_h():
    """A 16-wide stream (a narrow layer) of 4 equal directions in a model of h 64: H = ln 4 either
    way; over ln min(N - 1, 16) it reads 0.5, over ln 64 one third (their ratio ln 64 / ln 16 =
    1.5)."""
    Z = torch.from_numpy(rank_r(100, 16, 4, seed=6))
    H, layer = matrix_entropy(Z)
    H_fixed, fixed = matrix_entropy(Z, normaliser="fixed", h=64)
    assert H == H_fixed == pytest.approx(math.log(4), abs=1e-9)
    assert layer == pytest.approx(0.5, abs=1e-9) and fixed == pytest.approx(1 / 3, abs=1e-9)
    with pytest.raises(ValueError, match="needs h"):
        matrix_entropy(Z, normaliser="fixed")


def test_analyze_model_takes_the_conventions_it_is_given():
    """On a built tiny variable-width model: the fixed normaliser rescales each layer's normalised
    entropy by ln min(N - 1, w_l) / ln h and leaves H alone; the conventions are recorded with the
    result."""
    from olmo_patches.report.analysis import Conventions

    spec = load_spec(
        DEMO / "variable-width.yaml",
        ["model.n_layers=4", "train.device=cpu", "train.hardware=none"],
    )
    torch.manual_seed(0)
    model = spec.model.build(vocab_size(spec)).build(init_device="cpu")
    model.init_weights(device=torch.device("cpu"))
    tokens = torch.randint(0, vocab_size(spec), (2, 33))
    layer = analyze_model(model, tokens, spec.model)
    fixed = analyze_model(model, tokens, spec.model, conventions=Conventions(normaliser="fixed"))
    N, h = 64, spec.model.d_model
    for a, b in zip(layer.layers, fixed.layers):
        assert b.entropy == pytest.approx(a.entropy, rel=1e-12)
        assert b.normalized_entropy == pytest.approx(
            a.normalized_entropy * math.log(min(N - 1, a.width)) / math.log(h), rel=1e-9
        )
    assert layer.conventions == {"centre": True, "pooling": "pooled", "normaliser": "layer"}
    assert fixed.conventions["normaliser"] == "fixed"
    with pytest.raises(ValueError, match="pooling"):
        Conventions(pooling="mean")
