"""Attention width apart from d_model (model.head_dim), GQA (model.n_kv_heads), Llama-3.1 RoPE
scaling, and the authors' revised 906M / 3B / 8B configs (Hourglass_LM on Megatron-Bridge)."""

import json
import math

import pytest
import torch
from olmo_core.nn.feed_forward import FeedForwardConfig
from olmo_core.nn.transformer import TransformerConfig
from olmo_core.optim import AdamWConfig
from torch.utils.flop_counter import FlopCounterMode

from olmo_patches.blocks import model_spec
from olmo_patches.blocks.base import ModelSpec, RoPEScalingSpec
from olmo_patches.config import ConfigError, vocab_size
from olmo_patches.launch.layout import load_and_resolve
from olmo_patches.report.counts import count

from .conftest import REPO, run_in_process

V = 256
SCALING = RoPEScalingSpec(
    factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=16
)


# --- a reference from the equations ---------------------------------------------------------------


def llama31_inv_freq(theta: float, head_dim: int, scaling) -> list:
    """Meta's Llama-3.1 ``apply_scaling``, per frequency (their reference loop)."""
    freqs = [1.0 / theta ** (i / head_dim) for i in range(0, head_dim, 2)]
    if scaling is None:
        return freqs
    factor, low, high, old = (
        scaling.factor,
        scaling.low_freq_factor,
        scaling.high_freq_factor,
        scaling.original_max_position_embeddings,
    )
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(f)
        elif wavelen > old / low:
            out.append(f / factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return out


def reference_attention(x, Wq, Wk, Wv, Wo, gq, gk, *, H, G, hd, theta, scaling, eps):
    """o_t = W_o [softmax_s<=t(q_t,h . k_s,g(h) / sqrt(hd)) v_s,g(h)]_h, g(h) = h // (H / G);
    q = RoPE(norm(W_q x)), k = RoPE(norm(W_k x)) with full-width RMSNorm gains g_q (H hd) and g_k (G
    hd); RoPE rotates halves."""
    B, T, _ = x.shape
    rms = lambda y, g: y / torch.sqrt(y.pow(2).mean(-1, keepdim=True) + eps) * g  # noqa: E731
    q, k, v = x @ Wq.T, x @ Wk.T, x @ Wv.T
    if gq is not None:
        q, k = rms(q, gq), rms(k, gk)
    q, k, v = q.view(B, T, H, hd), k.view(B, T, G, hd), v.view(B, T, G, hd)
    angles = torch.arange(T, dtype=x.dtype)[:, None] * torch.tensor(
        llama31_inv_freq(theta, hd, scaling), dtype=x.dtype
    )
    cos, sin = (
        torch.cat([angles.cos()] * 2, -1)[:, None],
        torch.cat([angles.sin()] * 2, -1)[:, None],
    )
    rotate = lambda y: torch.cat([-y[..., hd // 2 :], y[..., : hd // 2]], -1)  # noqa: E731
    q, k = q * cos + rotate(q) * sin, k * cos + rotate(k) * sin
    group = [h // (H // G) for h in range(H)]
    k, v = k[:, :, group], v[:, :, group]
    scores = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(hd)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.einsum("bhts,bshd->bthd", scores.softmax(-1), v).reshape(B, T, H * hd)
    return out @ Wo.T


def _randomize(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(
                (1 + 0.2 * torch.randn(p.shape, generator=g))
                if p.ndim == 1
                else 0.2 * torch.randn(p.shape, generator=g)
            )


# d_model 32: the attention is 4 x 12 = 48 wide (> d_model), 4 x 4 = 16 (< d_model), GQA 4:2, 4:1
ATTENTION = {
    "wide": dict(n_heads=4, head_dim=12),
    "narrow-gqa": dict(n_heads=4, head_dim=4, n_kv_heads=2),
    "wide-mqa-qknorm": dict(n_heads=4, head_dim=12, n_kv_heads=1, qk_norm=True),
    "gqa-qknorm-scaled": dict(n_heads=4, n_kv_heads=2, qk_norm=True, rope_scaling=SCALING),
}
BLOCKS = {
    "baseline": dict(block="baseline"),
    "hourglass": dict(block="hourglass", K=2, d_h=16),
    "variable_width": dict(block="variable_width", widths=dict(schedule="list", values=[48, 24])),
}


def _spec(block: str, attention: dict, **kw) -> ModelSpec:
    from olmo_patches.blocks.variable_width import WidthSpec

    extra = dict(BLOCKS[block])
    if "widths" in extra:
        extra["widths"] = WidthSpec(**extra["widths"])
    return model_spec(d_model=32, n_layers=2, norm_eps=1e-5, **extra, **attention, **kw)


@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("block", BLOCKS)
def test_attention_matches_the_equations(block, attention):
    """OLMo-core's attention inside each block type, outputs and gradients, against the
    reference."""
    spec = _spec(block, ATTENTION[attention])
    model = spec.build(V).build(init_device="cpu")
    layer = model.blocks["1"]
    attn = layer.attention
    _randomize(attn)
    d = getattr(layer, "width", 32)  # a variable-width layer runs at its own width w_l
    H, G = spec.n_heads, spec.resolved_n_kv_heads
    hd = spec.head_dim or d // H
    x = torch.randn(2, 24, d, generator=torch.Generator().manual_seed(1), requires_grad=True)
    out = attn(x)
    out.square().sum().backward()
    weights = [attn.w_q.weight, attn.w_k.weight, attn.w_v.weight, attn.w_out.weight]
    assert [tuple(w.shape) for w in weights] == [(H * hd, d), (G * hd, d), (G * hd, d), (d, H * hd)]
    norms = [attn.q_norm.weight, attn.k_norm.weight] if spec.qk_norm else [None, None]
    ref_params = [
        p.detach().clone().requires_grad_() for p in weights + [n for n in norms if n is not None]
    ]
    ref_x = x.detach().clone().requires_grad_()
    gq, gk = ref_params[4:] if spec.qk_norm else (None, None)
    ref = reference_attention(
        ref_x,
        *ref_params[:4],
        gq,
        gk,
        H=H,
        G=G,
        hd=hd,
        theta=spec.rope_theta,
        scaling=spec.rope_scaling,
        eps=spec.norm_eps,
    )
    ref.square().sum().backward()
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(x.grad, ref_x.grad, rtol=1e-4, atol=1e-4)
    for p, r in zip(weights + [n for n in norms if n is not None], ref_params):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-4, atol=1e-4)


def test_default_head_dim_and_kv_heads_give_olmo_cores_own_block_bit_for_bit():
    """head_dim = d_model / n_heads and n_kv_heads = n_heads: the same model as OLMo-core's
    llama_like without them (baseline), and the same as leaving them null (hourglass), bit for
    bit."""
    x = torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(0))
    ours = (
        ModelSpec(d_model=32, n_layers=2, n_heads=4, head_dim=8, n_kv_heads=4, qk_norm=True)
        .build(V)
        .build()
    )
    olmo = TransformerConfig.llama_like(
        d_model=32,
        vocab_size=V,
        n_layers=2,
        n_heads=4,
        qk_norm=True,
        layer_norm_eps=1e-6,
        feed_forward=FeedForwardConfig(hidden_size=128, bias=False),
        tie_word_embeddings=False,
    ).build()
    olmo.init_weights(device=torch.device("cpu"))
    ours.load_state_dict(olmo.state_dict())
    assert torch.equal(ours(x), olmo(x))
    explicit, null = (
        model_spec("hourglass", d_model=32, n_layers=2, n_heads=4, K=2, d_h=16, **kw)
        .build(V)
        .build()
        for kw in (dict(head_dim=8, n_kv_heads=4), {})
    )
    null.init_weights(device=torch.device("cpu"))
    explicit.load_state_dict(null.state_dict())
    assert torch.equal(explicit(x), null(x))


@pytest.mark.parametrize("attention", ["wide", "narrow-gqa", "wide-mqa-qknorm"])
@pytest.mark.parametrize("block", BLOCKS)
def test_flops_match_flop_counter(block, attention):
    """Weight-matmul FLOPs of a whole fwd + bwd against OLMo-core's per-token count, minus its
    attention-score term 12 n_heads head_dim (causal positions / seq) per layer."""
    seq, batch = 32, 2
    spec = _spec(block, ATTENTION[attention])
    model = spec.build(V).build()
    model.init_weights(device=torch.device("cpu"))
    with FlopCounterMode(display=False) as counter:
        model(torch.randint(0, V, (batch, seq))).float().square().sum().backward()
    measured = sum(
        v
        for op, v in counter.get_flop_counts()["Global"].items()
        if str(op).startswith(("aten.mm", "aten.addmm"))
    )
    widths = spec.resolved_widths if block == "variable_width" else [32, 32]
    head_dims = [spec.head_dim or w // spec.n_heads for w in widths]
    scores = sum(12 * spec.n_heads * hd * (seq + 1) / 2 for hd in head_dims)
    predicted = (model.num_flops_per_token(seq) - scores) * batch * seq
    assert abs(measured - predicted) / predicted < 0.01


@pytest.mark.parametrize(
    "override,message",
    [
        ("model.n_kv_heads=3", "model.n_kv_heads=3: must divide model.n_heads=2"),
        ("model.n_kv_heads=0", "model.n_kv_heads=0: must divide"),
        ("model.head_dim=7", "model.head_dim=7: must be even"),
        ("model.d_ff=0", "model.d_ff=0: must be >= 1"),
        (
            "model.rope_scaling.low_freq_factor=4",
            "model.rope_scaling.low_freq_factor=4.0: must be >= 1 and <",
        ),
        ("train.schedule_lag=-1", "train.schedule_lag=-1: must be >= 0"),
    ],
)
def test_bad_attention_shapes_fail_at_load_with_one_line(override, message):
    with pytest.raises(ConfigError) as e:
        load_and_resolve(
            REPO / "configs" / "demo" / "hourglass.yaml", ["model.n_heads=2", override]
        )
    assert str(e.value).startswith(f"command line: {message}")
    assert "\n" not in str(e.value)


def test_head_dim_frees_the_head_count_from_d_model():
    """With head_dim set, n_heads need not divide d_model (the authors' 3B hourglass: 24 heads on
    3696)."""
    spec = load_and_resolve(
        REPO / "configs" / "demo" / "hourglass.yaml", ["model.n_heads=3", "model.head_dim=8"]
    )
    assert (
        spec.model.d_model % 3
        and spec.model.build(vocab_size(spec))
        .build(init_device="meta")
        .blocks["0"]
        .attention.w_q.out_features
        == 24
    )


# --- the authors' revised configs -----------------------------------------------------------------

# From their YAMLs (Hourglass_LM @1f0ae80, hourglass_lm/pretraining_script/conf/): num_layers,
# hidden_size, num_attention_heads, num_query_groups, kv_channels (unset: hidden / heads),
# num_mlp_layers, mlp_intermediate_sizes.
THEIRS = {
    "906M/baseline": dict(
        L=24, d=1536, H=16, G=16, kv=96, K=1, dh=6144, iters=4297, lr=2.5e-4, warmup=25
    ),
    "906M/hourglass": dict(
        L=12, d=2496, H=16, G=16, kv=96, K=4, dh=2016, iters=4297, lr=2.5e-4, warmup=25
    ),
    "3B/baseline": dict(
        L=28, d=3072, H=24, G=24, kv=128, K=1, dh=8192, iters=14305, lr=1.6e-4, warmup=100
    ),
    "3B/hourglass": dict(
        L=18, d=3696, H=24, G=24, kv=128, K=4, dh=2944, iters=14305, lr=1.6e-4, warmup=100
    ),
    "8B/baseline": dict(
        L=32, d=4096, H=32, G=32, kv=128, K=1, dh=14336, iters=23842, lr=1.2e-4, warmup=100
    ),
    "8B/hourglass": dict(
        L=22, d=4992, H=32, G=32, kv=128, K=4, dh=4544, iters=23842, lr=1.2e-4, warmup=100
    ),
}
# Megatron's totals (tied embedding padded to 100352 rows), as computed from their configs.
MEGATRON_TOTAL = {
    "906M/baseline": 1_060_259_328,
    "906M/hourglass": 1_159_291_584,
    "3B/baseline": 3_479_522_304,
    "3B/hourglass": 3_539_145_168,
    "8B/baseline": 8_196_198_400,
    "8B/hourglass": 8_289_531_008,
}


def megatron_params(L, d, H, G, kv, K, dh, vocab=100352, **_):
    """Their patched Megatron's model: embedding (tied) + L x [input RMSNorm d, QKV d (H + 2G) kv,
    q/k norms over the packed H kv and G kv, out-proj H kv d, K x (RMSNorm d, fc1 d 2 d_h, fc2 d_h
    d)] + final RMSNorm d."""
    layer = d + d * (H + 2 * G) * kv + H * kv + G * kv + H * kv * d + K * (d + 2 * d * dh + dh * d)
    return vocab * d + L * layer + d


@pytest.mark.parametrize("name", THEIRS)
def test_revised_config_is_their_run_with_their_parameter_count(name):
    size, kind = name.split("/")
    spec = load_and_resolve(REPO / "configs" / size / f"{kind}-revised.yaml")
    m, t, c = spec.model, spec.train, THEIRS[name]
    shape = (m.n_layers, m.d_model, m.n_heads, m.resolved_n_kv_heads, m.resolved_head_dim)
    assert shape == (c["L"], c["d"], c["H"], c["G"], c["kv"])
    ffn = (m.K, m.resolved_d_h) if kind == "hourglass" else (1, m.resolved_d_ff)
    assert ffn == (c["K"], c["dh"])
    assert megatron_params(**c) == MEGATRON_TOTAL[name] == count(spec).total
    # Their recipe (Megatron-Bridge's applied values): tied, eps 1e-5, Llama-3.1 RoPE x32.
    assert m.tie_embeddings and m.qk_norm and m.norm_eps == 1e-5 and m.norm_placement == "pre"
    assert m.rope_scaling == RoPEScalingSpec(32.0, 1.0, 4.0, 8192) and m.rope_theta == 500_000
    assert (t.global_batch_size, spec.data.sequence_length, t.max_steps, t.lr, t.warmup_steps) == (
        1024,
        4096,
        c["iters"],
        c["lr"],
        c["warmup"],
    )
    assert t.lr * t.final_lr_ratio == pytest.approx(6e-5)  # their absolute min_lr
    assert (t.weight_decay, t.decay_embeddings, t.decay_norms, t.z_loss, t.seed) == (
        0.033,
        True,
        False,
        None,
        6198,
    )
    assert (
        not spec.data.instance_filter
        and t.betas == [0.9, 0.95]
        and t.max_grad_norm == 1.0
        and t.schedule_lag == 1
    )


@pytest.mark.parametrize("units", ["steps", "tokens"])
def test_revised_schedule_is_megatrons(units):
    """Megatron-LM's OptimizerParamScheduler, written out: update n (1..N) runs at f(n - 1), f(k) =
    lr k / W up to W, then min_lr + (lr - min_lr) (1 + cos(pi (k - W) / (N - W))) / 2 (min_lr 6e-5
    absolute)."""
    from olmo_core.optim import CosWithWarmup
    from olmo_core.optim.scheduler import SchedulerUnits

    from olmo_patches.train.optimizer import lagged

    W, N = 3, 10
    spec = load_and_resolve(
        REPO / "configs" / "906M" / "hourglass-revised.yaml",
        [f"train.max_steps={N}", f"train.warmup_steps={W}"],
    )
    lr, step_tokens = spec.train.lr, 1024 * 4096
    scale = step_tokens if units == "tokens" else 1
    inner = CosWithWarmup(
        units=SchedulerUnits(units), warmup=W * scale, alpha_f=spec.train.final_lr_ratio
    )
    scheduler = lagged(inner, spec)

    def f(k):
        return (
            lr * k / W
            if k <= W
            else 6e-5 + (lr - 6e-5) * (1 + math.cos(math.pi * (k - W) / (N - W))) / 2
        )

    got = [scheduler.get_lr(lr, n * scale, N * scale) for n in range(1, N + 1)]
    assert got == pytest.approx([f(n - 1) for n in range(1, N + 1)], rel=1e-9, abs=1e-15)
    assert got[0] == 0 and scheduler.units == SchedulerUnits(units)


def test_revised_weight_decay_groups():
    """Decay 0.033 on every matrix and the tied embedding; none on any norm gain (QK norms
    included)."""
    from olmo_patches.train.optimizer import optim_groups

    spec = load_and_resolve(
        REPO / "configs" / "906M" / "hourglass-revised.yaml", ["model.n_layers=2"]
    )
    config = spec.model.build(vocab_size(spec))
    model = config.build(init_device="meta")
    optim = AdamWConfig(
        lr=spec.train.lr,
        weight_decay=spec.train.weight_decay,
        group_overrides=optim_groups(spec, config),
    ).build(model)
    wd = {id(p): g["weight_decay"] for g in optim.param_groups for p in g["params"]}
    names = [n for n, _ in model.named_parameters()]
    assert "embeddings.weight" in names and "lm_head.w_out.weight" not in names  # tied
    assert any(".attention.q_norm." in n for n in names) and any(
        ".feed_forward.norms." in n for n in names
    )
    for name, p in model.named_parameters():
        assert wd[id(p)] == (0.0 if "norm" in name else 0.033), name
    # The default recipe (OLMo-2): embedding not decayed, norms decayed.
    base = load_and_resolve(REPO / "configs" / "demo" / "hourglass.yaml", ["model.qk_norm=true"])
    config = base.model.build(vocab_size(base))
    model = config.build(init_device="meta")
    optim = AdamWConfig(
        lr=1e-3, weight_decay=0.1, group_overrides=optim_groups(base, config)
    ).build(model)
    wd = {id(p): g["weight_decay"] for g in optim.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        assert wd[id(p)] == (0.0 if name == "embeddings.weight" else 0.1), name


def test_count_params_json_reports_attention_width_and_kv_heads():
    r = run_in_process(
        "count_params.py", str(REPO / "configs" / "3B" / "hourglass-revised.yaml"), "--json"
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert (
        out["n_heads"],
        out["head_dim"],
        out["n_kv_heads"],
        out["attention_width"],
        out["kv_width"],
    ) == (24, 128, 24, 3072, 3072)
    assert out["total"] == MEGATRON_TOTAL["3B/hourglass"]
