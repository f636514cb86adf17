"""The hourglass FFN and block against plain PyTorch written from the paper's equations."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from olmo_core.nn.attention import AttentionConfig
from olmo_core.nn.feed_forward import FeedForwardConfig
from olmo_core.nn.layer_norm import LayerNormConfig, LayerNormType
from olmo_core.nn.transformer import TransformerBlockConfig, TransformerBlockType
from torch.utils.flop_counter import FlopCounterMode

from olmo_patches.nn.hourglass_block import HourglassBlockConfig
from olmo_patches.blocks import model_spec
from olmo_patches.nn.hourglass import HourglassFeedForwardConfig
from olmo_patches.shapes.choices import NormPlacement
from olmo_patches.nn.accounting import breakdown
from olmo_patches.shapes.counts import analytic_non_embedding

EPS = 1e-6
NORM = LayerNormConfig(
    name=LayerNormType.rms, eps=EPS, bias=False, full_precision=False
)  # float64 stays float64


# bf16 keeps 8 significant bits (u = 2^-8): a few roundings per matmul input, accumulated in fp32;
# as the GPU check's bf16 rows (tests/gpu/_common.py), written here
BF16_OUT, BF16_GRAD = 16 * 2.0**-8, 32 * 2.0**-8
M_RESIDUAL = 0.35  # a muP residual multiplier (paper 2: every branch x m_residual)


def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * weight


class ReferenceHourglass(nn.Module):
    """h_{i+1} = h_i + a MLP_i(norm_i(h_i))  (pre)  or  h_i + a norm_i(MLP_i(h_i))  (post),
    MLP_i(x) = W_u_i (SiLU(W_d1_i x) * (W_d2_i x)); one nn.Linear per matrix."""

    def __init__(self, d_model: int, d_h: int, K: int, placement: str, alpha: float = 1.0):
        super().__init__()
        self.placement, self.alpha = placement, alpha
        self.W_d1 = nn.ModuleList(nn.Linear(d_model, d_h, bias=False) for _ in range(K))
        self.W_d2 = nn.ModuleList(nn.Linear(d_model, d_h, bias=False) for _ in range(K))
        self.W_u = nn.ModuleList(nn.Linear(d_h, d_model, bias=False) for _ in range(K))
        self.g = nn.ParameterList(nn.Parameter(1 + 0.1 * torch.randn(d_model)) for _ in range(K))

    def forward(self, h):
        for W_d1, W_d2, W_u, g in zip(self.W_d1, self.W_d2, self.W_u, self.g):
            mlp = lambda x: W_u(F.silu(W_d1(x)) * W_d2(x))  # noqa: E731
            f = mlp(rms_norm(h, g)) if self.placement == "pre" else rms_norm(mlp(h), g)
            h = h + self.alpha * f
        return h

    def load_into(self, ffn) -> None:
        with torch.no_grad():
            for i in range(len(self.W_u)):
                ffn.w1.stacked[i].copy_(self.W_d1[i].weight)
                ffn.w3.stacked[i].copy_(self.W_d2[i].weight)
                ffn.w2.stacked[i].copy_(self.W_u[i].weight)
                ffn.norms[i].weight.copy_(self.g[i])


def _pair(K: int, placement: str, alpha: float, d_model=32, d_h=12, fold=None):
    torch.manual_seed(0)
    ffn = HourglassFeedForwardConfig(
        hidden_size=d_h, K=K, bias=False, layer_norm=NORM, norm_placement=NormPlacement(placement)
    ).build(d_model)
    ffn.residual_alpha, ffn.fold_norms = alpha, fold
    ref = ReferenceHourglass(d_model, d_h, K, placement, alpha)
    ref.load_into(ffn)
    return ffn, ref


def _run(module, x, autocast: bool = False):
    """Output and the gradients of x and of each sub-MLP's W_d1, W_d2, W_u and g, in turn."""
    module.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = module(x)
    (out.float() * torch.arange(out.numel()).reshape(out.shape).sin()).sum().backward()
    if isinstance(module, ReferenceHourglass):
        mats = [[lin.weight.grad for lin in ms] for ms in (module.W_d1, module.W_d2, module.W_u)]
        gains = [g.grad for g in module.g]
    else:
        mats = [w.weight.grad.view_as(w.stacked) for w in (module.w1, module.w3, module.w2)]
        gains = [n.weight.grad for n in module.norms]
    return out.detach(), [
        x.grad,
        *(t for i, g in enumerate(gains) for t in (*(m[i] for m in mats), g)),
    ]


def _rel(a, b) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("K", [1, 2, 4])
@pytest.mark.parametrize("placement,fold", [("pre", False), ("pre", True), ("post", None)])
def test_ffn_matches_equations(K, placement, fold):
    """Against the equations in float64, the plain path (eager's) and the folded one (compiled's,
    forced here): equal in float64 (1e-10), within 1e-6 in fp32, and under bf16 autocast within
    bf16's tolerances, output and every gradient, with muP's residual multiplier on every
    branch."""
    ffn, ref = _pair(K, placement, M_RESIDUAL, fold=fold)
    x = torch.randn(2, 7, 32)
    want, want_grads = _run(copy.deepcopy(ref).double(), x.double())
    got, grads = _run(copy.deepcopy(ffn).double(), x.double())
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)
    got, grads = _run(ffn, x)
    assert _rel(got, want) < 1e-6 and max(map(_rel, grads, want_grads)) < 1e-6
    got, grads = _run(ffn, x, autocast=True)
    assert _rel(got, want) < BF16_OUT and max(map(_rel, grads, want_grads)) < BF16_GRAD


def test_pre_norms_fold_into_the_matmuls_and_write_no_normalised_tensor():
    """Folded (compiled's path, forced in eager here), pre-norm RMSNorms fold into W_d: forward
    saves h_i (one d_model-wide activation per sub-MLP) and no normalised n_i; the norm modules
    never run. Eager's default and post norms run the norms as written."""
    saved: list = []

    def pack(t):
        saved.append(t)
        return t

    for placement, fold, norm_calls, wide in (
        ("pre", True, 0, 4), ("pre", None, 4, None), ("post", True, 4, None)
    ):  # fmt: skip
        ffn, _ = _pair(4, placement, 1.0, fold=fold)
        calls = []
        for n in ffn.norms:
            n.register_forward_hook(lambda *a: calls.append(1))
        saved.clear()
        x = torch.randn(3, 5, 32, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            ffn(x)
        assert len(calls) == norm_calls
        storages = {t.untyped_storage().data_ptr() for t in saved if t.shape == x.shape}
        if wide is not None:
            assert len(storages) == wide, len(storages)


@pytest.mark.slow
def test_compiled_ffn_matches_eager():
    """torch.compile, whose trace takes the folded path, against eager's plain one: K=2 with muP's
    multiplier, output and gradients within 1e-6 in fp32 (dynamo and AOT autograd, the graph
    inductor is given; its C++ kernels, a minute of CPU here, are the GPU check's to run)."""
    ffn, _ = _pair(2, "pre", M_RESIDUAL, d_model=16, d_h=8)
    x = torch.randn(2, 3, 16)
    want, want_grads = _run(ffn, x)
    compiled = torch.compile(copy.deepcopy(ffn), backend="aot_eager", fullgraph=True)
    got, grads = _run(compiled, x)
    assert _rel(got, want) < 1e-6 and max(map(_rel, grads, want_grads)) < 1e-6


def _attention(n_heads=4):
    return AttentionConfig(n_heads=n_heads, bias=False)


@pytest.mark.parametrize(
    "placement,block_type",
    [("pre", TransformerBlockType.default), ("post", TransformerBlockType.reordered_norm)],
)
def test_k1_block_is_conventional_block(placement, block_type):
    """K=1, d_h = 4 d_model: the hourglass block computes OLMo-core's own SwiGLU block exactly
    (eager runs the norm as written; the fold is compiled's: test_compiled_ffn_matches_eager)."""
    torch.manual_seed(0)
    d_model = 32
    conventional = TransformerBlockConfig(
        name=block_type,
        sequence_mixer=_attention(),
        layer_norm=NORM,
        feed_forward=FeedForwardConfig(hidden_size=4 * d_model, bias=False),
    ).build(d_model=d_model, block_idx=0, n_layers=1)
    hourglass = HourglassBlockConfig(
        sequence_mixer=_attention(),
        layer_norm=NORM,
        feed_forward=HourglassFeedForwardConfig(
            hidden_size=4 * d_model,
            K=1,
            bias=False,
            layer_norm=NORM,
            norm_placement=NormPlacement(placement),
        ),
    ).build(d_model=d_model, block_idx=0, n_layers=1)
    with torch.no_grad():
        for p in conventional.parameters():
            p.copy_(torch.randn_like(p) * 0.1 + (1.0 if p.ndim == 1 else 0.0))
        hourglass.attention.load_state_dict(conventional.attention.state_dict())
        hourglass.attention_norm.weight.copy_(conventional.attention_norm.weight)
        ffn, ref = hourglass.feed_forward, conventional.feed_forward
        ffn.w1.stacked[0].copy_(ref.w1.weight)
        ffn.w3.stacked[0].copy_(ref.w3.weight)
        ffn.w2.stacked[0].copy_(ref.w2.weight)
        ffn.norms[0].weight.copy_(conventional.feed_forward_norm.weight)
    # Same parameter count: the block has no FFN norm of its own, the FFN's one norm replaces it.
    assert sum(p.numel() for p in hourglass.parameters()) == sum(
        p.numel() for p in conventional.parameters()
    )
    x = torch.randn(2, 9, d_model)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    a, b = hourglass(x1), conventional(x2)
    assert torch.equal(a, b)
    a.square().sum().backward()
    b.square().sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-5, atol=1e-5)


def test_k1_model_same_seed_same_weights_and_logits():
    """With the same init seed, a K=1, d_h=4 d_model hourglass model *is* the baseline model: the
    same weights, the same logits."""
    kw = dict(d_model=32, n_layers=2, n_heads=4, vocab_size=256)
    base = model_spec("baseline", **kw).build(256).build()
    hour = model_spec("hourglass", K=1, d_h=128, **kw).build(256).build()
    for m in (base, hour):
        m.init_weights(device=torch.device("cpu"))
    assert torch.equal(
        base.blocks["1"].feed_forward.w2.weight, hour.blocks["1"].feed_forward.w2.stacked[0]
    )
    x = torch.randint(0, 256, (2, 16))
    assert torch.equal(base(x), hour(x))


@pytest.mark.parametrize(
    "block,extra",
    [
        ("baseline", {}),
        ("hourglass", dict(K=3, d_h=20)),
        ("hourglass", dict(K=2, d_h=24, norm_placement="post", qk_norm=True)),
    ],
)
def test_num_params_against_built_model(block, extra):
    spec = model_spec(block, d_model=48, n_layers=3, n_heads=4, **extra)
    config = spec.build(vocab_size=320)
    model = config.build()
    assert config.num_params == model.num_params == sum(p.numel() for p in model.parameters())
    b = breakdown(model, seq_len=16)
    assert b.total == model.num_params
    closed = analytic_non_embedding(
        48, 3, **({} if block == "baseline" else dict(K=extra["K"], d_h=extra["d_h"]))
    )
    assert (b.attention, b.ffn) == (closed["attention"], closed["ffn"])
    # norms: attention norm + (1 FFN norm | K sub-MLP norms) per layer, final norm, QK norms.
    norms_per_layer = 1 + (extra.get("K", 1)) + (2 if extra.get("qk_norm") else 0)
    assert b.norm == 48 * (3 * norms_per_layer + 1)


def _train_flops(module, x):
    with FlopCounterMode(display=False) as counter:
        module(x).float().square().sum().backward()
    return counter.get_flop_counts()


def test_ffn_flops_match_flop_counter():
    ffn = HourglassFeedForwardConfig(hidden_size=24, K=4, bias=False, layer_norm=NORM).build(64)
    tokens = 2 * 50
    counts = _train_flops(ffn, torch.randn(2, 50, 64, requires_grad=True))
    matmul = sum(v for op, v in counts["Global"].items() if "mm" in str(op))
    assert abs(matmul / tokens - ffn.num_flops_per_token(50)) / ffn.num_flops_per_token(50) < 0.01


@pytest.mark.parametrize("block,extra", [("baseline", {}), ("hourglass", dict(K=4, d_h=32))])
def test_model_flops_match_flop_counter(block, extra):
    """Weight-matmul FLOPs of a whole model step (fwd + bwd) against OLMo-core's per-token count."""
    seq, batch = 32, 2
    model = model_spec(block, d_model=64, n_layers=2, n_heads=4, **extra).build(256).build()
    model.init_weights(device=torch.device("cpu"))
    counts = _train_flops(model, torch.randint(0, 256, (batch, seq)))["Global"]
    measured = sum(v for op, v in counts.items() if str(op).startswith(("aten.mm", "aten.addmm")))
    # OLMo-core adds the attention-score term 12 * n_heads * head_dim * (causal positions / seq).
    attn_scores = sum(12 * 64 * (seq + 1) / 2 for _ in range(2))
    predicted = (model.num_flops_per_token(seq) - attn_scores) * batch * seq
    assert abs(measured - predicted) / predicted < 0.01


@pytest.mark.parametrize("dtype,device", [(torch.bfloat16, "meta"), (torch.float64, "cpu")])
def test_ffn_is_built_in_the_dtype_and_on_the_device_asked(dtype, device):
    """The K-stacked matrices in the dtype given (a config dtype wins), everything on the device
    given; the K norms are built as OLMo-core builds a block's norms (their own config's dtype, fp32
    here)."""
    from olmo_core.config import DType

    for cfg, want in (
        (HourglassFeedForwardConfig(hidden_size=8, K=3, bias=False, layer_norm=NORM), dtype),
        (
            HourglassFeedForwardConfig(
                hidden_size=8, K=3, bias=False, layer_norm=NORM, dtype=DType.bfloat16
            ),
            torch.bfloat16,
        ),
    ):
        ffn = cfg.build(16, dtype=dtype, init_device=device)
        assert {ffn.w1.weight.dtype, ffn.w2.weight.dtype, ffn.w3.weight.dtype} == {want}
        assert {p.dtype for p in ffn.norms.parameters()} == {torch.float32}
        assert {p.device.type for p in ffn.parameters()} == {device}
        assert dict(
            (n, tuple(p.shape)) for n, p in ffn.named_parameters() if n.startswith("w")
        ) == {"w1.weight": (24, 16), "w3.weight": (24, 16), "w2.weight": (48, 8)}  # (K out, in)
        assert (ffn.w1.stacked.shape, ffn.w2.stacked.shape) == ((3, 8, 16), (3, 16, 8))
    assert "K=3, in_features=16, out_features=8, bias=False" in repr(
        HourglassFeedForwardConfig(hidden_size=8, K=3, bias=False, layer_norm=NORM).build(
            16, init_device="meta"
        )
    )


def test_stacked_weights_reset_to_olmo_cores_std():
    """reset_parameters draws every stacked matrix from OLMo-core's init_linear at std 0.02
    (truncated at 3 std)."""
    ffn = HourglassFeedForwardConfig(hidden_size=256, K=2, bias=False, layer_norm=NORM).build(256)
    for w in (ffn.w1, ffn.w2, ffn.w3):
        w.reset_parameters()
        assert w.weight.abs().max() <= 3 * 0.02 + 1e-6 and 0.018 < w.weight.std().item() < 0.0205


@pytest.mark.parametrize(
    "K,d_h,bias,norm,message",
    [
        (0, 8, False, NORM, "hourglass K must be >= 1, got K=0"),
        (2, 0, False, NORM, "hourglass d_h must be >= 1, got d_h=0"),
        (2, 8, True, NORM, "the hourglass FFN has no biases (bias must be false)"),
        (2, 8, False, None, "the hourglass FFN needs a layer_norm config for its K norms"),
    ],
)
def test_bad_ffn_shapes_are_named(K, d_h, bias, norm, message):
    import re

    from olmo_core.exceptions import OLMoConfigurationError

    with pytest.raises(OLMoConfigurationError, match=f"^{re.escape(message)}$"):
        HourglassFeedForwardConfig(hidden_size=d_h, K=K, bias=bias, layer_norm=norm).build(16)


def test_a_one_wide_bottleneck_is_valid():
    ffn = HourglassFeedForwardConfig(hidden_size=1, K=2, bias=False, layer_norm=NORM).build(16)
    assert ffn.w1.stacked.shape == (2, 1, 16)
