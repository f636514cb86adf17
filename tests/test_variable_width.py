"""Variable-width transformers (paper 2): the schedule solver against the paper's numbers, the model
against a plain-PyTorch reference that applies the resizing rule layer by layer, counts,
training."""

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from olmo_patches.config import ConfigError
from olmo_patches.launch.layout import load_and_resolve
from olmo_patches.launch.run_folder import read_metrics
from olmo_patches.report.counts import count, paper_report
from olmo_patches.train import train
from olmo_patches.shapes.widths import (
    MoEShape,
    paper_active_params,
    paper_flops,
    paper_params,
    solve_schedule,
)

from .conftest import REPO, load_weights, tiny_overrides

BASELINE = REPO / "configs" / "demo" / "baseline.yaml"
VOCAB, SEQ = 100263, 4096  # paper: cl100k, sequence 4096 (paper 2, docs/papers.md)

# Paper 2's table (docs/papers.md): (h, L, reported FLOPs change %, reported mean width change %).
PAPER = {
    "200M": (640, 16, -3.2, -10.0),
    "500M": (960, 24, -3.7, -11.0),
    "1B": (1280, 32, -2.6, -10.5),
    "2B": (1600, 40, -2.5, -10.9),
}


# --- the schedule ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PAPER)
def test_solver_reproduces_paper_flops_and_mean_width(name):
    h, L, flops_pct, _ = PAPER[name]
    w = solve_schedule(h, L, r_l=0.75, r_d=0.3, multiple=32).widths

    # FLOPs as the paper (the authors' solve_hparams.compute_metrics) defines them: forward, per
    # sequence, 2 per multiply-add: 32 s w_l^2 weights + 4 s^2 w_l (non-causal scores and values)
    # per layer, 2 s h V for the head, minus the first layer's QKV and last layer's down-projection
    # waste. Written here independently of paper_flops().
    def flops(widths):
        f = 2 * SEQ * h * VOCAB + sum(32 * SEQ * x * x + 4 * SEQ * SEQ * x for x in widths)
        f -= 6 * SEQ * widths[0] * max(widths[0] - h, 0) + 8 * SEQ * widths[-1] * max(
            widths[-1] - h, 0
        )
        return f

    change = 100 * (flops(w) / flops([h] * L) - 1)
    assert change == pytest.approx(flops_pct, abs=0.15)
    assert 100 * (flops(w) / flops([h] * L) - 1) == pytest.approx(
        100 * (paper_flops(w, h, VOCAB, SEQ) / paper_flops([h] * L, h, VOCAB, SEQ) - 1)
    )
    mean_below = 1 - sum(w) / L / h
    assert 0.0995 <= mean_below <= 0.1105, mean_below  # "10 to 11 percent below h"
    k = int(0.75 * L)
    assert all(x % 32 == 0 for x in w) and w[0] == w[-1] > h and min(w) == w[k - 1]


# The authors' solver (scripts/solve_hparams.py) on their dense_2b.yml and moe_1b3b.yml (22 experts,
# top-3, expert hidden 512 at h 1600): the widths, and for the MoE its total / active parameters
# (embeddings at cl100k included), FLOPs and mean width, computed from the paper's formulas.
DENSE_2B = [
    3040,
    2848,
    2656,
    2496,
    2336,
    2208,
    2080,
    1952,
    1824,
    1696,
    1600,
    1504,
    1408,
    1312,
    1248,
    1184,
    1088,
    1024,
    960,
    896,
    864,
    800,
    736,
    704,
    672,
    608,
    576,
    544,
    512,
    480,
    576,
    704,
    832,
    992,
    1216,
    1440,
    1728,
    2080,
    2528,
    3040,
]
MOE_3B = [
    3040,
    2848,
    2656,
    2496,
    2336,
    2208,
    2080,
    1952,
    1824,
    1696,
    1600,
    1504,
    1408,
    1312,
    1248,
    1152,
    1088,
    1024,
    960,
    896,
    864,
    800,
    736,
    704,
    672,
    608,
    576,
    544,
    512,
    480,
    576,
    704,
    832,
    992,
    1216,
    1440,
    1728,
    2080,
    2528,
    3040,
]
MOE_3B_I = [
    973,
    911,
    850,
    799,
    748,
    707,
    666,
    625,
    584,
    543,
    512,
    481,
    451,
    420,
    399,
    369,
    348,
    328,
    307,
    287,
    276,
    256,
    236,
    225,
    215,
    195,
    184,
    174,
    164,
    154,
    184,
    225,
    266,
    317,
    389,
    461,
    553,
    666,
    809,
    973,
]


def test_moe_solver_matches_the_authors_widths_and_counts():
    h, L, E, k, I = 1600, 40, 22, 3, 512
    assert solve_schedule(h, L).widths == DENSE_2B  # the dense solve is unchanged
    w = solve_schedule(h, L, moe=MoEShape(E, k, I / h)).widths
    assert w == MOE_3B
    assert [int(round(x * I / h)) for x in w] == MOE_3B_I
    # The authors' counts, written here: per layer (4 + 3 E r) w^2 + E w, waste 3 w_1 (w_1 - h) and
    # E r w_L (w_L - h); active: minus (1 - k / E) of 3 E r w^2; FLOPs (8 + 6 k r) s w^2 + 2 E s w +
    # 4 s^2 w.
    r = I / h

    def params(ws, active=False):
        p = 2 * VOCAB * h + sum((4 + 3 * E * r) * x * x + E * x for x in ws)
        p -= 3 * ws[0] * max(ws[0] - h, 0) + E * r * ws[-1] * max(ws[-1] - h, 0)
        return p - (1 - k / E) * sum(3 * E * r * x * x for x in ws) if active else p

    def flops(ws):
        f = 2 * SEQ * h * VOCAB + sum(
            (8 + 6 * k * r) * SEQ * x * x + 2 * E * SEQ * x + 4 * SEQ * SEQ * x for x in ws
        )
        return (
            f - 6 * SEQ * ws[0] * max(ws[0] - h, 0) - 2 * k * r * SEQ * ws[-1] * max(ws[-1] - h, 0)
        )

    assert round(params(w) / 1e6, 1) == 2891.7 and round(params([h] * L) / 1e6, 1) == 2894.5
    assert (
        round(params(w, True) / 1e6, 1) == 994.0 and round(params([h] * L, True) / 1e6, 1) == 1026.8
    )
    moe = MoEShape(E, k, r)
    assert paper_params(w, h, moe) + 2 * VOCAB * h == pytest.approx(params(w), rel=1e-12)
    assert paper_active_params(w, h, moe) + 2 * VOCAB * h == pytest.approx(
        params(w, True), rel=1e-12
    )
    change = flops(w) / flops([h] * L) - 1
    assert paper_flops(w, h, VOCAB, SEQ, moe) / paper_flops(
        [h] * L, h, VOCAB, SEQ, moe
    ) - 1 == pytest.approx(change, rel=1e-12)
    assert round(100 * change, 2) == -4.59 and round(100 * change, 1) == -4.6  # the paper: -4.6%
    assert round(100 * (sum(w) / L / h - 1), 2) == -11.00  # the paper: -10.9%


@pytest.mark.parametrize("shape", ["x", "v", "^", "3"])
@pytest.mark.parametrize("kind", ["geometric", "arithmetic"])
def test_continuous_schedule_is_parameter_matched_with_bottleneck(kind, shape):
    h, L = 960, 24
    s = solve_schedule(h, L, kind=kind, shape=shape, r_l=0.75, r_d=0.3, multiple=32)
    cont = [s.b]
    for step in s.steps:
        cont.append(cont[-1] * step if kind == "geometric" else cont[-1] + s.b * step)
    waste = 3 * (cont[0] - h) * cont[0] * (cont[0] > h) + 4 * cont[-1] * (cont[-1] - h) * (
        cont[-1] > h
    )
    assert sum(16 * x * x for x in cont) - waste == pytest.approx(16 * L * h * h, rel=1e-9)
    assert min(cont) == pytest.approx(0.3 * h, rel=1e-6)
    first, last, narrowest = cont[0], cont[-1], cont.index(min(cont))
    expected_narrowest = {"x": 17, "v": 0, "^": L - 1, "3": 0}[shape]
    assert narrowest == expected_narrowest or (shape == "3" and narrowest == L - 1)
    if shape in ("x", "3"):
        assert first == pytest.approx(last)
    if kind == "arithmetic":  # constant increments within each phase
        diffs = [b - a for a, b in zip(cont, cont[1:])]
        assert diffs[0] == pytest.approx(diffs[1])


# --- the model against a plain-PyTorch reference --------------------------------------------------

H, HEADS, VOCAB_TINY, T = 32, 2, 64, 12
# w_1 > h (zero-initialised dims), a narrowing, a widening that carries dims [16, 32) from layer 1,
# a widening past every earlier width (dims [48, 64) never written: zeros), and w_L < h at the
# output.
WIDTHS = [48, 16, 32, 64, 24]


def _spec(resize="carry_forward", init="olmo", ffn="swiglu", widths=WIDTHS, extra=()):
    overrides = [
        f"model.d_model={H}",
        f"model.n_layers={len(widths)}",
        f"model.n_heads={HEADS}",
        f"model.vocab_size={VOCAB_TINY}",
        f"data.demo_vocab_size={VOCAB_TINY}",
        "model.block=variable_width",
        f"model.ffn={ffn}",
        "model.widths.schedule=list",
        f"model.widths.values=[{','.join(map(str, widths))}]",
        f"model.widths.resize={resize}",
        f"model.widths.init={init}",
        # the hourglass FFN's K sub-MLPs of d_h = 2 w_l (a swiglu FFN reads neither)
        *(["model.K=2", "model.d_h_ratio=2.0"] if ffn == "hourglass" else []),
        *extra,
    ]
    return load_and_resolve(BASELINE, overrides)


def _build(spec, seed=0):
    config = spec.model.build(VOCAB_TINY)
    config.init_seed = seed
    model = config.build(init_device="meta")
    model.init_weights(device=torch.device("cpu"), max_seq_len=T)
    return config, model


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x, theta):  # x: (B, T, heads, d); rotate-half RoPE over head_dim
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float) / d)
    ang = torch.outer(torch.arange(x.shape[1], dtype=torch.float), inv)
    sin, cos = (
        torch.cat((ang, ang), -1).sin()[None, :, None],
        torch.cat((ang, ang), -1).cos()[None, :, None],
    )
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), -1) * sin


def _ref_attention(x, P, p: str, w: int, mup, eps: float, theta: float):
    """Layer ``p``'s causal self-attention over its input x (w dims, HEADS heads), before w_out."""
    B, d = x.shape[0], w // HEADS
    a_in = _rms(x, P[p + "attention_norm.weight"], eps)
    q, k, v = (a_in @ P[p + f"attention.w_{n}.weight"].T for n in "qkv")
    q, k, v = (t.view(B, T, HEADS, d) for t in (q, k, v))
    q, k = _rope(q, theta), _rope(k, theta)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * (1.0 / d if mup else d**-0.5)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(B, T, w)


def _ref_ffn(u, P, p: str, ffn: str, K: int, m_res: float, eps: float):
    """Layer ``p``'s FFN on the residual stream u, with its residual added."""
    if ffn == "swiglu":
        f_in = _rms(u, P[p + "feed_forward_norm.weight"], eps)
        g, val = (
            f_in @ P[p + "feed_forward.w1.weight"].T,
            f_in @ P[p + "feed_forward.w3.weight"].T,
        )
        y = u + m_res * ((F.silu(g) * val) @ P[p + "feed_forward.w2.weight"].T)
    # hourglass: K residual wide-narrow-wide sub-MLPs, each with its own norm (muP: each branch
    # x m_res)
    else:
        y = u
        for i in range(K):
            n = _rms(y, P[p + f"feed_forward.norms.{i}.weight"], eps)
            w1, w3, w2 = (
                P[p + f"feed_forward.{w}.weight"].view(
                    K, -1, P[p + f"feed_forward.{w}.weight"].shape[-1]
                )
                for w in ("w1", "w3", "w2")
            )
            g, val = n @ w1[i].T, n @ w3[i].T  # the (K out, in) storage's K maps
            y = y + m_res * ((F.silu(g) * val) @ w2[i].T)
    return y


def _reference(P, ids, widths, resize, *, mup=None, ffn="swiglu", K=2, eps=1e-6, theta=500_000):
    """Explicit per-layer tensors: states[0] = embedding (h dims), states[l] = y_l (w_l dims)."""
    m_emb, m_res, m_width = mup or (1.0, 1.0, 1.0)
    states = [P["embeddings.weight"][ids] * m_emb]

    def widen(x, width, mode=resize):  # dims [x.shape[-1], width) by the paper's rule
        if mode == "zero":
            return F.pad(x, (0, width - x.shape[-1]))
        parts = [x]
        for dim in range(
            x.shape[-1], width
        ):  # carry forward: the most recent state that had the dim
            src = next((s for s in reversed(states) if s.shape[-1] > dim), None)
            parts.append(
                src[..., dim : dim + 1] if src is not None else torch.zeros_like(x[..., :1])
            )
        return torch.cat(parts, -1)

    for l, w in enumerate(widths):
        p = f"blocks.{l}."
        prev = states[-1]
        if prev.shape[-1] >= w:
            x = prev[..., :w]
        elif resize == "learned":
            x = prev @ P[p + "resize.weight"].T
        else:
            x = widen(prev, w)
        att = _ref_attention(x, P, p, w, mup, eps, theta)
        u = x + m_res * (att @ P[p + "attention.w_out.weight"].T)
        y = _ref_ffn(u, P, p, ffn, K, m_res, eps)
        states.append(y)
    last = states[-1]
    out = _rms(last, P["lm_head.norm.weight"], eps)
    if out.shape[-1] >= H:
        out = out[..., :H]
    elif resize == "learned":
        out = out @ P["lm_head.norm.resize.weight"].T
    else:  # zero mode too: the authors' output resize carries forward (width_varying_model.py:735)
        states[-1] = out  # the normalised dims, then dims [w_L, h) carried from earlier states
        out = widen(out, H, "carry_forward")
    return (out / m_width) @ P["lm_head.w_out.weight"].T


@pytest.mark.parametrize(
    "resize,init,ffn",
    [
        ("carry_forward", "olmo", "swiglu"),
        ("zero", "olmo", "swiglu"),
        ("learned", "olmo", "swiglu"),
        ("carry_forward", "mup", "swiglu"),
        ("carry_forward", "olmo", "hourglass"),
        ("carry_forward", "mup", "hourglass"),
    ],
)
def test_model_matches_per_layer_reference(resize, init, ffn):
    spec = _spec(resize, init, ffn)
    _, model = _build(spec)
    ids = torch.randint(0, VOCAB_TINY, (2, T), generator=torch.Generator().manual_seed(1))
    logits = model(ids)
    loss = logits.square().mean()
    loss.backward()

    P = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}
    w = spec.model.widths
    mup = (w.m_emb, w.m_residual, w.m_width) if init == "mup" else None
    ref = _reference(P, ids, WIDTHS, resize, mup=mup, ffn=ffn)
    ref.square().mean().backward()
    torch.testing.assert_close(logits, ref, rtol=1e-5, atol=1e-5)
    for n, p in model.named_parameters():
        assert p.grad is not None, n
        torch.testing.assert_close(p.grad, P[n].grad, rtol=1e-4, atol=1e-6, msg=n)
    # Layer 1's Q/K/V columns for the never-written dims [h, w_1) get exactly zero gradient.
    if resize != "learned":
        assert torch.all(model.blocks["0"].attention.w_q.weight.grad[:, H:] == 0)


def test_mup_init_stds():
    spec = _spec(
        "carry_forward", "mup", widths=[256, 64, 128, 256, 256], extra=["model.d_model=128"]
    )
    config = spec.model.build(VOCAB_TINY)
    config.init_seed = 0
    model = config.build(init_device="meta")
    model.init_weights(device=torch.device("cpu"), max_seq_len=T)
    w = spec.model.widths
    assert model.embeddings.weight.std().item() == pytest.approx(w.init_range, rel=0.05)
    for l, width in enumerate([256, 64, 128, 256, 256]):
        expected = w.init_range / math.sqrt(w.m_width) * math.sqrt(128 / width)
        got = model.blocks[str(l)].feed_forward.w1.weight.std().item()
        assert got == pytest.approx(expected, rel=0.05), l


def test_mup_hourglass_ffn_init_and_lr_groups():
    """muP's hidden-matrix rules reach every hidden matrix, the K sub-MLPs' too: std 0.1 sqrt(h /
    w_l) / sqrt(8) (W_u: a further / sqrt(2 L), lm-engine's c_proj rule), lr / 8; the K norm gains
    stay 1 at lr."""
    from olmo_core.optim import AdamWConfig

    from olmo_patches.train.optimizer import optim_groups

    widths = [256, 64, 128, 256]
    spec = _spec("carry_forward", "mup", "hourglass", widths=widths, extra=["model.d_model=128"])
    config, model = _build(spec)
    for l, width in enumerate(widths):
        ffn = model.blocks[str(l)].feed_forward
        std = 0.1 * math.sqrt(128 / width) / math.sqrt(8)
        assert ffn.w1.stacked.shape == (2, 2 * width, width)  # K = 2, d_h = 2 w_l
        assert ffn.w1.weight.std().item() == pytest.approx(std, rel=0.05), l
        assert ffn.w3.weight.std().item() == pytest.approx(std, rel=0.05), l
        assert ffn.w2.weight.std().item() == pytest.approx(
            std / math.sqrt(2 * len(widths)), rel=0.05
        ), l
        assert all(torch.equal(n.weight, torch.ones(width)) for n in ffn.norms)
        assert ffn.residual_alpha == model.blocks[str(l)].residual_alpha == 0.22
    lr0 = spec.train.lr
    optim = AdamWConfig(lr=lr0, group_overrides=optim_groups(spec, config)).build(model)
    lr = {id(p): g["lr"] for g in optim.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        hidden = ".feed_forward.w" in name or ".attention.w_" in name
        assert lr[id(p)] == pytest.approx(lr0 / 8 if hidden else lr0), name


@pytest.mark.slow
def test_kv_cache_per_token_of_the_2b_shapes():
    """count_params --json: K and V elements cached per token = sum over layers of 2 n_kv_heads
    head_dim, head_dim = w_l / 16 (16 heads at every width), from the authors' 2B widths written
    above."""
    import json

    from .conftest import run_in_process

    r = run_in_process(
        "count_params.py", str(REPO / "configs" / "paper2" / "2B" / "x.yaml"), "--json"
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert (
        json.loads(r.stdout)["kv_cache_per_token"]
        == sum(2 * 16 * (w // 16) for w in DENSE_2B)
        == 113984
    )
    assert (
        count(
            load_and_resolve(REPO / "configs" / "paper2" / "2B" / "baseline.yaml")
        ).kv_cache_per_token
        == 2 * 1600 * 40
    )
    # GQA: 2 key/value heads of w_l / 4 each (4 query heads).
    gqa = _spec(widths=[64, 32, 48, 96], extra=["model.n_heads=4", "model.n_kv_heads=2"])
    assert count(gqa).kv_cache_per_token == 2 * 2 * (64 + 32 + 48 + 96) // 4 == 240


def test_constant_schedule_is_olmo_core_baseline():
    common = [
        f"model.d_model={H}",
        "model.n_layers=3",
        f"model.n_heads={HEADS}",
        f"model.vocab_size={VOCAB_TINY}",
        f"data.demo_vocab_size={VOCAB_TINY}",
    ]
    base = load_and_resolve(BASELINE, common)
    const = load_and_resolve(
        BASELINE, [*common, "model.block=variable_width", "model.widths.schedule=constant"]
    )
    _, a = _build(base, seed=7)
    _, b = _build(const, seed=7)
    assert type(a).__name__ == "Transformer" and type(b).__name__ == "VariableWidthTransformer"
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    ids = torch.randint(0, VOCAB_TINY, (2, T))
    assert torch.equal(a(ids), b(ids))
    assert a.num_flops_per_token(T) == b.num_flops_per_token(T) and a.num_params == b.num_params


MOE = ["model.moe.num_experts=4", "model.moe.top_k=2", "model.moe.expert_hidden=16"]


def _megablocks_kernels():
    """megablocks' gather / scatter / scatter_wgrad (olmo_core/kernels/moe.py: Triton, CUDA only) in
    plain PyTorch, so that OLMo-core's own dispatch (ops.moe's autograd functions) runs on a CPU.
    Rows are the k T (token, expert) pairs in expert order; ``indices`` their positions in the (T,
    k) table."""

    def gather(x, indices, bin_ids, weights, bins, top_k):
        out = x[indices.long() // top_k]
        return out if weights is None else out * weights[indices.long()].unsqueeze(-1)

    def scatter(x, indices, bin_ids, weights, bins, top_k):
        rows = x if weights is None else x * weights[indices.long()].unsqueeze(-1)
        table = x.new_zeros(indices.shape[0], x.shape[1])
        table[indices.long()] = rows
        return table.view(-1, top_k, x.shape[1]).sum(1)

    def scatter_wgrad(x, grad, indices, bin_ids, bins, top_k):
        out = x.new_zeros(indices.shape[0])
        out[indices.long()] = (x * grad[indices.long() // top_k]).sum(-1)
        return out

    return SimpleNamespace(gather=gather, scatter=scatter, scatter_wgrad=scatter_wgrad)


def test_constant_schedule_moe_is_olmo_cores_moe_transformer(monkeypatch):
    """A constant schedule with model.moe (OLMo-core's init) is OLMo-core's MoETransformer built
    from its own TransformerConfig (MoE blocks, the same MoEConfig): same weights give the same
    logits, loss, aux losses and gradients, bit for bit with OLMo-core's load balancing
    (micro_batch; global_batch: tests/test_moe_world_size.py)."""
    import olmo_core.ops.moe as moe_ops
    from olmo_core.nn.lm_head import LMHeadConfig
    from olmo_core.nn.moe import MoEConfig, MoERouterConfig, MoEType
    from olmo_core.nn.transformer import TransformerBlockType, TransformerConfig, TransformerType

    spec = _spec(widths=[H, H, H], extra=[*MOE, "model.moe.load_balance=micro_batch"])
    config, ours = _build(spec, seed=5)
    # the authors' routing in OLMo-core's terms: renormalised top-2, losses summed over layers
    moe = MoEConfig(
        name=MoEType.dropless,
        num_experts=4,
        hidden_size=16,
        router=MoERouterConfig(top_k=2, normalize_expert_weights=1.0),
        lb_loss_weight=0.01,
        z_loss_weight=0.001,
        scale_loss_by_num_layers=False,
    )
    fields_ = {f.name: getattr(config, f.name) for f in dataclasses.fields(TransformerConfig)}
    fields_.update(
        name=TransformerType.moe,
        lm_head=LMHeadConfig(layer_norm=config.lm_head.layer_norm, bias=False),
        block=dataclasses.replace(
            config.block, name=TransformerBlockType.moe, feed_forward=None, feed_forward_moe=moe
        ),
    )
    olmo = TransformerConfig(**fields_).build(init_device="cpu")
    assert type(olmo).__name__ == "MoETransformer"
    olmo.load_state_dict(ours.state_dict())  # strict: the same names and shapes
    monkeypatch.setattr(moe_ops, "kernels", _megablocks_kernels())
    ids = torch.randint(0, VOCAB_TINY, (2, T), generator=torch.Generator().manual_seed(0))
    outs = []
    for model in (ours, olmo):
        out = model(ids, labels=ids)
        out.loss.backward()
        metrics = {k: v[0].item() for k, v in model.compute_auxiliary_metrics().items()}
        outs.append(
            (
                out.logits.detach(),
                out.loss.item(),
                metrics,
                {n: p.grad for n, p in model.named_parameters()},
            )
        )
    (la, lossa, ma, ga), (lb, lossb, mb, gb) = outs
    # Bit-equal: with k = 2 each token's two weighted expert outputs are summed in either order
    # exactly.
    assert (
        torch.equal(la, lb)
        and lossa == lossb
        and ma == mb
        and "load balancing loss" in ma
        and "router Z loss" in ma
    )
    assert ga.keys() == gb.keys() and all(torch.equal(ga[n], gb[n]) for n in ga)


def test_moe_counts_equal_the_built_model():
    """count_params of a tiny MoE: total = every parameter of the built model; active from the
    shapes."""
    spec = _spec(widths=[64, 32, 16, 48], extra=MOE)
    config, model = _build(spec)
    b = count(spec)
    assert config.num_params == b.total == sum(p.numel() for p in model.parameters())
    # Active: each layer's experts are 4 x 3 x w_l x I_l with I_l = round(w_l 16 / 32); a token uses
    # 2 of 4.
    experts = sum(3 * 4 * w * int(round(w * 16 / 32)) for w in [64, 32, 16, 48])
    assert b.active == b.total - experts // 2 == config.num_active_params
    report = paper_report(spec)
    assert (
        report["expert_hidden"] == [32, 16, 8, 24]
        and report["baseline_total"] - report["baseline_active"] == 4 * 3 * 4 * 32 * 16 // 2
    )
    assert (
        0 < report["paper_flops_ratio"] < report["paper_total_flops_ratio"]
    )  # active experts: x saves more


@pytest.mark.parametrize(
    "override, match",
    [
        ("model.moe.num_experts=0", r"model\.moe\.num_experts=0: must be >= 1"),
        ("model.ffn=hourglass", r"model\.ffn=hourglass: the MoE replaces the FFN"),
        ("model.moe.top_k=5", r"model\.moe\.top_k=5: must be in \[1, model\.moe\.num_experts=4\]"),
        ("model.moe.experts=mixtral", r"model\.moe\.experts=mixtral: choose one of swiglu"),
        (
            "model.moe.lb_loss_weight=-1",
            r"model\.moe\.lb_loss_weight=-1\.0: must be finite and >= 0",
        ),
        (
            "model.norm_placement=post",
            r"model\.norm_placement=post: the variable-width MoE block is pre-norm",
        ),
        (
            "train.activation_checkpointing=true",
            r"train\.activation_checkpointing=full: OLMo-core cannot checkpoint MoE blocks",
        ),
        (
            "model.moe.expert_hidden=1",
            r"model\.moe\.expert_hidden=1: the narrowest layer \(w=16\) would get experts of "
            r"hidden size 0",
        ),
    ],
)
def test_moe_config_errors(override, match):
    with pytest.raises(ConfigError, match=match):
        _spec(widths=[64, 32, 16, 48], extra=[*MOE, override])


def test_moe_needs_a_variable_width_model():
    with pytest.raises(ConfigError) as e:
        load_and_resolve(BASELINE, MOE)
    assert str(e.value) == (
        "command line: model.moe: a key of model.block=variable_width, not of model.block=baseline"
    )


@pytest.mark.slow
def test_activation_checkpointing_and_compile_keep_the_numbers(monkeypatch):
    from olmo_core.nn.transformer.config import TransformerActivationCheckpointingMode

    ids = torch.randint(0, VOCAB_TINY, (2, T))

    def run(model):
        out = model(ids)
        out.square().mean().backward()
        return out.detach(), {
            n.replace("._checkpoint_wrapped_module", ""): p.grad
            for n, p in model.named_parameters()
        }

    out, grads = run(_build(_spec())[1])
    _, ac = _build(_spec())
    ac.apply_activation_checkpointing(TransformerActivationCheckpointingMode.full)
    compile_ = (
        torch.nn.Module.compile
    )  # aot_eager: dynamo and autograd tracing without a C++ toolchain
    monkeypatch.setattr(
        torch.nn.Module, "compile", lambda self, **kw: compile_(self, backend="aot_eager", **kw)
    )
    _, compiled = _build(_spec())
    compiled.apply_compile()
    for model in (ac, compiled):
        o, g = run(model)
        torch.testing.assert_close(o, out)
        assert g.keys() == grads.keys() and all(
            torch.allclose(g[n], grads[n], atol=1e-6) for n in g
        )


# --- counts ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("resize", ["carry_forward", "zero", "learned"])
@pytest.mark.parametrize("ffn", ["swiglu", "hourglass"])
def test_param_and_flop_counts(resize, ffn):
    spec = _spec(resize, ffn=ffn)
    config, model = _build(spec)
    params = sum(p.numel() for p in model.parameters())
    assert config.num_params == model.num_params == params == count(spec).total
    # Matmul FLOPs measured by torch against 6 x (every matrix's size) x tokens (fwd + bwd).
    matrices = sum(
        p.numel()
        for n, p in model.named_parameters()
        if p.dim() >= 2 and not n.startswith("embeddings.")
    )
    ids = torch.randint(0, VOCAB_TINY, (2, T))
    with FlopCounterMode(display=False) as counter:
        model(ids).square().mean().backward()
    per_op = counter.get_flop_counts()["Global"]
    mm = sum(v for op, v in per_op.items() if "mm" in str(op) and "bmm" not in str(op))
    assert mm == pytest.approx(6 * matrices * 2 * T, rel=0.01)
    # num_flops_per_token: 6 x every parameter but the embedding, plus causal attention per layer.
    norms = sum(
        p.numel() for n, p in model.named_parameters() if p.dim() == 1 and n.startswith("lm_head")
    )
    attn = sum(12 * w * (T * (T + 1) // 2) // T for w in WIDTHS)
    assert model.num_flops_per_token(T) == 6 * (matrices + norms) + attn


def test_count_params_reports_widths_and_flops_ratio():
    spec = load_and_resolve(REPO / "configs" / "paper2" / "500M" / "x.yaml")
    report = paper_report(spec)
    assert len(report["widths"]) == 24 and all(w % 32 == 0 for w in report["widths"])
    assert report["mean_width_ratio"] == pytest.approx(
        1 - 0.110, abs=0.003
    )  # the paper's -11.0% at 500M
    assert 0.9 < report["flops_ratio"] < 1.0 and report["paper_flops_ratio"] == pytest.approx(
        1 - 0.036, abs=0.0015
    )
    # Parameter matched up to rounding once the waste (real but idle weights) is taken out.
    w, h = report["widths"], 960
    waste = 3 * (w[0] - h) * w[0] + 4 * w[-1] * (w[-1] - h)
    base = count(load_and_resolve(REPO / "configs" / "paper2" / "500M" / "baseline.yaml"))
    assert abs(count(spec).non_embedding - waste - base.non_embedding) / base.non_embedding < 0.01
    # GQA's key/value heads are no layer of the authors' count: the built model's is given
    gqa = load_and_resolve(REPO / "configs" / "paper2" / "500M" / "x.yaml", ["model.n_kv_heads=4"])
    assert paper_report(gqa)["matched_params"] == count(gqa).non_embedding


# --- config errors --------------------------------------------------------------------------------


def test_width_not_divisible_by_heads_fails_at_load():
    with pytest.raises(
        ConfigError,
        match=r"model\.widths\.values=.*w_2=30 is not a positive multiple of 2 model\.n_heads=8",
    ):
        load_and_resolve(
            REPO / "configs" / "demo" / "variable-width.yaml",
            ["model.widths.schedule=list", "model.widths.values=[128,30,64,128]"],
        )
    # 4 heads of 9 dims: divisible, but RoPE needs an even head dim.
    with pytest.raises(
        ConfigError,
        match=r"w_2=36 is not a positive multiple of 2 model\.n_heads=8 \(even head_dim",
    ):
        load_and_resolve(
            REPO / "configs" / "demo" / "variable-width.yaml",
            ["model.widths.schedule=list", "model.widths.values=[128,36,64,128]"],
        )
    with pytest.raises(
        ConfigError, match=r"model\.widths\.multiple=6: w_1=.* is not a positive multiple"
    ):
        load_and_resolve(
            REPO / "configs" / "demo" / "variable-width.yaml", ["model.widths.multiple=6"]
        )
    with pytest.raises(ConfigError, match=r"model\.widths\.resize=sideways"):
        load_and_resolve(
            REPO / "configs" / "demo" / "variable-width.yaml", ["model.widths.resize=sideways"]
        )


# --- training -------------------------------------------------------------------------------------


def _losses(run_dir):
    return {
        step: m["train/CE loss"]
        for step, m in read_metrics(run_dir).items()
        if "train/CE loss" in m
    }


@pytest.mark.slow
@pytest.mark.parametrize("moe", [[], MOE], ids=["dense", "moe"])
def test_train_save_and_resume(tmp_path, demo_corpus, moe):
    vw = [
        "model.block=variable_width",
        "model.widths.schedule=list",
        "model.widths.values=[48,16,48]",
        "model.n_layers=3",
        *moe,
    ]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(load_and_resolve(BASELINE, tiny_overrides(straight, "train.max_steps=4", *vw)))
    train(
        load_and_resolve(
            BASELINE, tiny_overrides(resumed, "train.max_steps=4", "run.stop_at_step=2", *vw)
        )
    )
    assert sorted(_losses(resumed)) == [1, 2]
    train(
        load_and_resolve(BASELINE, tiny_overrides(resumed, "train.max_steps=4", *vw))
    )  # resumes from step2
    assert _losses(straight) == _losses(resumed) and sorted(_losses(straight)) == [1, 2, 3, 4]
    a, b = load_weights(straight / "step4"), load_weights(resumed / "step4")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert a["blocks.1.attention.w_q.weight"].shape == (16, 16) and a[
        "lm_head.norm.weight"
    ].shape == (48,)
    if moe:  # OLMo-core's trainer records the routers' losses; layer 2's experts at w = 16, I = 8
        steps = {step: m for step, m in read_metrics(straight).items() if step >= 1}
        assert sorted(steps) == [1, 2, 3, 4] and all(
            "train/load balancing loss" in m and "train/router Z loss" in m for m in steps.values()
        )
        assert a["blocks.1.feed_forward_moe.experts.mlp.w1"].shape == (4 * 8, 16)
