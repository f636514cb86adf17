"""Fast unit tests of nn/variable_width.py, one function at a time (with the in-process tests of
test_variable_width.py, the mutation-testing set of that module:
`bash tests/mutation.sh variable_width`). Configs are built straight from OLMo-core's
TransformerConfig.llama_like (no YAML); every expected number is written here from paper 2's
equations (docs/papers.md)."""

import dataclasses
import math

import pytest
import torch
from olmo_core.exceptions import OLMoConfigurationError
from olmo_core.nn.layer_norm import LayerNormConfig, LayerNormType
from olmo_core.nn.lm_head import LMHeadType
from olmo_core.nn.transformer import TransformerConfig
from olmo_core.nn.transformer.block import TransformerBlock
from olmo_core.nn.transformer.config import TransformerBlockType

from olmo_patches.nn.variable_width import (
    MuPConfig,
    OutputNorm,
    ResizeMode,
    VariableWidthLMHeadConfig,
    VariableWidthTransformerConfig,
)
from olmo_patches.shapes.widths import paper_flops, paper_params, schedule_widths, solve_schedule

H, HEADS, VOCAB = 32, 2, 64


def _config(
    widths, *, h=H, heads=HEADS, head_dim=None, block_name=TransformerBlockType.default, **kw
):
    base = TransformerConfig.llama_like(
        d_model=h,
        vocab_size=VOCAB,
        n_layers=len(widths),
        n_heads=heads,
        head_dim=head_dim,
        block_name=block_name,
    )
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(TransformerConfig)}
    fields.update(kw.pop("base", {}))
    return VariableWidthTransformerConfig(**fields, widths=list(widths), **kw)


def _continuous(b, steps, kind):
    w = [b]
    for s in steps:
        w.append(w[-1] * s if kind == "geometric" else w[-1] + b * s)
    return w


# --- the paper's counts ---------------------------------------------------------------------------


def test_paper_params_subtract_the_input_and_output_waste():
    # sum 16 w^2 - 3 (w_1 - h) w_1 [w_1 > h] - 4 w_L (w_L - h) [w_L > h]
    assert paper_params([48, 16, 40], 32) == 16 * (48**2 + 16**2 + 40**2) - 3 * 16 * 48 - 4 * 40 * 8
    assert paper_params([48, 16], 32) == 16 * (48**2 + 16**2) - 3 * 16 * 48
    assert paper_params([16, 40], 32) == 16 * (16**2 + 40**2) - 4 * 40 * 8
    assert paper_params([32, 16, 32], 32) == 16 * (32**2 + 16**2 + 32**2)  # w = h: no waste
    assert paper_params([40.5, 20.0], 32) == pytest.approx(16 * (40.5**2 + 20**2) - 3 * 8.5 * 40.5)


def test_paper_flops_from_the_formula():
    s, V, h = 8, 50, 32
    head = 2 * s * h * V

    def layers(ws):
        return sum(32 * s * w * w + 4 * s * s * w for w in ws)

    assert (
        paper_flops([48, 16, 40], h, V, s)
        == head + layers([48, 16, 40]) - 6 * s * 48 * 16 - 8 * s * 40 * 8
    )
    assert paper_flops([48, 16], h, V, s) == head + layers([48, 16]) - 6 * s * 48 * 16
    assert paper_flops([16, 40], h, V, s) == head + layers([16, 40]) - 8 * s * 40 * 8
    assert paper_flops([32, 32], h, V, s) == head + layers([32, 32])
    assert isinstance(paper_flops([32], h, V, s), float)


# --- the solver -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(kind="cosine"), "schedule must be geometric or arithmetic, got cosine"),
        (dict(shape="w"), "shape must be one of x, v, ^, 3, got w"),
        (dict(r_d=0.0), "r_d must be in (0, 1), got 0.0"),
        (dict(r_d=1.0), "r_d must be in (0, 1), got 1.0"),
        (dict(L=1, shape="v"), "shape v needs its extreme layer inside 1 < k < L (L=1, r_l=0.75)"),
        (
            dict(L=4, r_l=0.3),
            "shape x needs its extreme layer inside 1 < k < L (L=4, r_l=0.3)",
        ),  # k = round(1.2) = 1
        (
            dict(L=4, r_l=1.0, shape="3"),
            "shape 3 needs its extreme layer inside 1 < k < L (L=4, r_l=1.0)",
        ),  # k = L
        (
            dict(L=4, r_l=0.9),
            "shape x needs its extreme layer inside 1 < k < L (L=4, r_l=0.9)",
        ),  # k = round(3.6) = L
    ],
)
def test_solve_schedule_rejects_bad_arguments(kwargs, message):
    args = dict(h=960, L=24) | kwargs
    with pytest.raises(ValueError) as e:
        solve_schedule(args.pop("h"), args.pop("L"), **args)
    assert str(e.value) == message


def test_solve_schedule_defaults_are_the_papers_x():
    """Defaults: geometric, shape x, r_l = 0.75, r_d = 0.3, widths multiples of 32 (paper 2,
    docs/papers.md)."""
    h, L = 960, 24
    s = solve_schedule(h, L)
    assert s.kind == "geometric" and len(s.steps) == L - 1
    k = round(0.75 * L)  # the narrowest layer, numbered from 1
    e, r = s.steps[0], s.steps[-1]
    assert s.steps == [e] * (k - 1) + [r] * (L - k) and e < 1 < r
    assert e ** (k - 1) * r ** (L - k) == pytest.approx(1.0)  # symmetric: w_L = w_1
    cont = _continuous(s.b, s.steps, "geometric")
    assert min(cont) == pytest.approx(0.3 * h, rel=1e-6) and cont.index(min(cont)) == k - 1
    assert sum(16 * w * w for w in cont) - 3 * (cont[0] - h) * cont[0] - 4 * cont[-1] * (
        cont[-1] - h
    ) == pytest.approx(16 * L * h * h)
    # The authors' rounding: integer b, the widths regenerated by repeated multiplication, each
    # rounded to 32.
    assert s.widths == [
        int(round(w / 32)) * 32 for w in _continuous(float(round(s.b)), s.steps, "geometric")
    ]


@pytest.mark.parametrize("shape", ["x", "v", "^", "3"])
def test_solve_schedule_rounds_the_continuous_widths(shape):
    h, L = 640, 16
    s = solve_schedule(h, L, kind="arithmetic", shape=shape, r_l=0.5, r_d=0.4, multiple=1)
    cont = _continuous(float(round(s.b)), s.steps, "arithmetic")
    assert (
        s.kind == "arithmetic" and s.widths == [int(round(w)) for w in cont] and len(s.widths) == L
    )
    exact = _continuous(s.b, s.steps, "arithmetic")
    assert min(exact) == pytest.approx(0.4 * h, rel=1e-6)
    waste = 3 * (exact[0] - h) * exact[0] * (exact[0] > h) + 4 * exact[-1] * (exact[-1] - h) * (
        exact[-1] > h
    )
    assert sum(16 * w * w for w in exact) - waste == pytest.approx(16 * L * h * h, rel=1e-9)
    extreme = {"x": 7, "v": 0, "^": L - 1, "3": 7}[shape]  # k = r_l L = 8 for x and 3
    if shape == "3":  # widest at k, both ends r_d h
        assert exact.index(max(exact)) == extreme and exact[0] == pytest.approx(exact[-1])
    else:
        assert exact.index(min(exact)) == extreme


def test_solve_schedule_smallest_depths():
    """v and ^ need only L = 2; x needs its narrowest layer k inside 1 < k < L, so k = 2 is
    allowed."""
    for shape in ("v", "^"):
        assert len(solve_schedule(640, 2, shape=shape, multiple=1).widths) == 2
    w = solve_schedule(640, 4, r_l=0.4, multiple=1).widths  # k = round(1.6) = 2
    assert w.index(min(w)) == 1 and len(w) == 4


def test_schedule_widths_by_name():
    assert schedule_widths("constant", 48, 3) == [48, 48, 48]
    given = [64, 32, 48]
    got = schedule_widths("list", 48, 3, widths=given)
    assert got == given and got is not given
    for bad in ([64, 32], None):
        with pytest.raises(ValueError) as e:
            schedule_widths("list", 48, 3, widths=bad)
        assert str(e.value) == f"an explicit width list needs 3 widths, got {bad}"
    with pytest.raises(ValueError) as e:
        schedule_widths("cosine", 48, 3)
    assert (
        str(e.value)
        == "unknown schedule cosine; choose one of geometric, arithmetic, constant, list"
    )


def test_schedule_widths_passes_every_knob_to_the_solver():
    h, L = 960, 24
    x = schedule_widths(
        "geometric", h, L, r_l=0.5, multiple=1
    )  # narrowest at layer round(0.5 L) = 12
    assert x.index(min(x)) == 11 and abs(min(x) - 0.3 * h) <= 1 and x[0] == x[-1]
    assert (
        schedule_widths("geometric", h, L)
        == solve_schedule(h, L, kind="geometric", shape="x", r_l=0.75, r_d=0.3, multiple=32).widths
    )
    assert all(w % 64 == 0 for w in schedule_widths("geometric", h, L, multiple=64))
    assert all(w % 32 == 0 for w in schedule_widths("geometric", h, L))
    v = schedule_widths("geometric", h, L, shape="v", r_d=0.5, multiple=1)  # narrow to wide
    assert v == sorted(v) and abs(v[0] - 0.5 * h) <= 1
    a = schedule_widths(
        "arithmetic", h, L, multiple=1
    )  # constant increments (up to rounding) in each phase
    steps = [b - c for c, b in zip(a, a[1:])]
    assert max(steps[:17]) - min(steps[:17]) <= 2 and max(steps[17:]) - min(steps[17:]) <= 2
    assert abs(min(a) - 0.3 * h) <= 1 and a.index(min(a)) == 17


# --- the config -----------------------------------------------------------------------------------


def test_config_rejects_what_it_cannot_build():
    def err(**kw):
        with pytest.raises(OLMoConfigurationError) as e:
            _config(**kw)
        return str(e.value)

    block = _config([32, 32]).block
    assert (
        err(widths=[32, 32], base=dict(block_overrides={0: block}))
        == "a variable-width model builds its own per-layer blocks"
    )
    assert (
        err(widths=[32, 32], base=dict(tie_word_embeddings=True))
        == "a variable-width model needs untied embeddings"
    )
    cfg = _config([32, 32])
    with pytest.raises(OLMoConfigurationError, match="widths has 3 entries for n_layers=2"):
        dataclasses.replace(cfg, widths=[32, 32, 32])
    assert err(widths=[32, 31]) == "w_2=31 is not a positive multiple of n_heads=2"
    assert err(widths=[0, 32]) == "w_1=0 is not a positive multiple of n_heads=2"
    # An explicit head_dim: every layer's attention is n_heads x head_dim wide, any w_l >= 1 is
    # fine.
    assert _config([1, 31, 48], head_dim=8).widths == [1, 31, 48]
    assert _config([2, 32], heads=1).widths == [2, 32]
    assert err(widths=[0, 32], head_dim=8) == "w_1=0 is not a positive multiple of n_heads=1"


def test_config_head_hidden_and_per_layer_blocks():
    mup = MuPConfig(m_width=4.0, m_emb=10.0, m_residual=0.5, init_range=0.02)
    cfg = _config(
        [48, 16, 64], resize="learned", ffn_hidden_ratio=2.5, ffn_hidden_multiple=8, mup=mup
    )
    assert cfg.stream_width == 64 and cfg.embed_scale == 10.0
    head = cfg.lm_head
    assert isinstance(head, VariableWidthLMHeadConfig)
    assert (head.last_width, head.resize, head.logit_scale) == (64, ResizeMode.learned, 0.25)
    assert (
        head.layer_norm is not None
        and head.layer_norm.name == LayerNormType.rms
        and head.bias is False
    )
    assert cfg._head_dim(48) == 24 and _config([48, 16, 64], head_dim=8)._head_dim(48) == 8
    assert [cfg._hidden(w) for w in (48, 16, 20)] == [
        120,
        40,
        48,
    ]  # round(2.5 w / 8) x 8: 120, 40, round(6.25) x 8
    blocks = cfg.resolved_block_configs
    assert [(b.width, b.in_width, b.stream_width) for b in blocks] == [
        (48, H, 64),
        (16, 48, 64),
        (64, 16, 64),
    ]
    assert [b.feed_forward.hidden_size for b in blocks] == [120, 40, 160]
    assert all(
        b.resize == ResizeMode.learned and b.name == TransformerBlockType.default for b in blocks
    )
    assert [b.softmax_scale for b in blocks] == [1 / 24, 1 / 8, 1 / 32]  # muP: 1 / head_dim
    assert all(b.attention_residual_alpha == b.feed_forward_residual_alpha == 0.5 for b in blocks)
    plain = _config([48, 16, 64])
    assert plain.lm_head.logit_scale == 1.0 and plain.embed_scale is None
    assert all(
        b.softmax_scale is None and b.attention_residual_alpha is None
        for b in plain.resolved_block_configs
    )
    assert all(b.resize == ResizeMode.carry_forward for b in plain.resolved_block_configs)


def test_blocks_built_at_their_own_widths():
    for name, cls in (
        (TransformerBlockType.default, "VariableWidthBlock"),
        (TransformerBlockType.reordered_norm, "VariableWidthReorderedNormBlock"),
    ):
        cfg = _config(
            [48, 16, 64],
            block_name=name,
            resize="learned",
            base=dict(block=dataclasses.replace(_config([32]).block, name=name, dropout=0.25)),
        )
        bcfg = cfg.resolved_block_configs[2]
        block = bcfg.build(d_model=H, block_idx=2, n_layers=3)  # init_device defaults to the CPU
        assert type(block).__name__ == cls and block.attention_norm.weight.device.type == "cpu"
        assert (block.width, block.in_width, block.stream_width, block.resize_mode) == (
            64,
            16,
            64,
            ResizeMode.learned,
        )
        assert block.resize.weight.shape == (64, 16) and block.resize.bias is None
        assert block.attention.w_q.weight.shape == (
            64,
            64,
        ) and block.feed_forward.w1.weight.shape == (256, 64)
        assert block.attention_residual_stream.dropout.p == 0.25
        narrowing = cfg.resolved_block_configs[1].build(
            d_model=H, block_idx=1, n_layers=3, init_device="meta"
        )
        assert narrowing.resize is None and narrowing.attention_norm.weight.device.type == "meta"
    mup = MuPConfig(m_width=4.0, m_emb=10.0, m_residual=0.5, init_range=0.02)
    block = (
        _config([48, 16], mup=mup)
        .resolved_block_configs[0]
        .build(d_model=H, block_idx=0, n_layers=2, init_device="meta")
    )
    assert block.attention.backend.scale == 1 / 24
    assert block.attention_residual_stream.alpha == block.feed_forward_residual_stream.alpha == 0.5
    carry = (
        _config([48, 64])
        .resolved_block_configs[1]
        .build(d_model=H, block_idx=1, n_layers=2, init_device="meta")
    )
    assert (
        carry.resize is None and carry.attention_residual_stream.alpha == 1.0
    )  # OLMo-core's default alpha


@pytest.mark.parametrize("resize", ["carry_forward", "zero", "learned"])
def test_block_num_params_counts_its_own_width(resize):
    cfg = _config([48, 16, 64], resize=resize)
    for bcfg in cfg.resolved_block_configs:
        block = bcfg.build(d_model=H, block_idx=0, n_layers=3, init_device="meta")
        assert bcfg.num_params(H) == sum(p.numel() for p in block.parameters())
        w, w_in = bcfg.width, bcfg.in_width
        # 4 w^2 attention + 3 w (4 w) SwiGLU + 2 norms of w, plus the learned projection when
        # widening
        assert bcfg.num_params(12345) == 4 * w * w + 12 * w * w + 2 * w + (
            w_in * w if resize == "learned" and w_in < w else 0
        )


# --- the LM head and its output norm --------------------------------------------------------------


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


@pytest.mark.parametrize(
    "last,resize",
    [
        (48, "carry_forward"),
        (32, "carry_forward"),
        (24, "carry_forward"),
        (24, "zero"),
        (24, "learned"),
    ],
)
def test_output_norm_from_the_rule(last, resize):
    """RMSNorm over the first w_L dims; to h dims: truncate (w_L >= h), else carry dims [w_L, h) of
    the stream (carry_forward and zero) or project (learned); then x logit_scale."""
    torch.manual_seed(0)
    norm = OutputNorm(
        last_width=last,
        d_model=H,
        resize=resize,
        logit_scale=0.5,
        init_device="cpu",
        eps=1e-6,
        bias=False,
    )
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 3, 64)
    y = _rms(x[..., :last], norm.weight, 1e-6)
    if last >= H:
        ref = y[..., :H]
    elif resize == "learned":
        assert norm.resize.weight.shape == (H, last) and norm.resize.bias is None
        ref = y @ norm.resize.weight.T
    else:
        assert norm.resize is None
        ref = torch.cat((y, x[..., last:H]), -1)
    for scale in (0.5, 1.0, 2.0):
        norm.logit_scale = scale
        torch.testing.assert_close(norm(x), scale * ref)
    assert (
        OutputNorm(
            last_width=48, d_model=H, resize="learned", logit_scale=1.0, init_device="cpu"
        ).resize
        is None
    )


def test_lm_head_config_builds_and_counts():
    rms = LayerNormConfig(name=LayerNormType.rms, eps=None, bias=False)
    head_cfg = VariableWidthLMHeadConfig(
        layer_norm=rms, bias=True, last_width=24, resize="learned", logit_scale=0.25
    )
    head = head_cfg.build(d_model=H, vocab_size=VOCAB, init_device="cpu")
    assert (
        isinstance(head.norm, OutputNorm)
        and head.norm.eps == 1e-5
        and head.norm.logit_scale == 0.25
    )
    assert (head.norm.last_width, head.norm.d_model, head.norm.resize_mode) == (
        24,
        H,
        ResizeMode.learned,
    )
    assert (
        head.norm.weight.dtype == torch.float32
        and head.norm.bias is None
        and head.w_out.bias is not None
    )
    # h V + V (bias) + w_L h (the projection) + w_L (the norm)
    assert (
        head_cfg.num_params(H, VOCAB)
        == H * VOCAB + VOCAB + 24 * H + 24
        == sum(p.numel() for p in head.parameters())
    )
    for last, resize, extra in (
        (24, "carry_forward", 0),
        (48, "learned", 0),
        (32, "learned", 0),
        (24, "zero", 0),
    ):
        cfg = VariableWidthLMHeadConfig(layer_norm=rms, bias=False, last_width=last, resize=resize)
        assert cfg.num_params(H, VOCAB) == H * VOCAB + last + extra
        assert cfg.build(d_model=H, vocab_size=VOCAB, init_device="meta").w_out.bias is None
    bare = VariableWidthLMHeadConfig(layer_norm=None, bias=False, last_width=24)
    assert (
        bare.num_params(H, VOCAB) == H * VOCAB
        and bare.build(d_model=H, vocab_size=VOCAB).norm is None
    )
    eps = VariableWidthLMHeadConfig(
        layer_norm=dataclasses.replace(rms, eps=1e-3), last_width=24
    ).build(d_model=H, vocab_size=VOCAB)
    assert eps.norm.eps == 1e-3
    with pytest.raises(
        OLMoConfigurationError, match="a variable-width model needs RMSNorm, got default"
    ):
        VariableWidthLMHeadConfig(
            layer_norm=LayerNormConfig(name=LayerNormType.default), last_width=24
        ).build(d_model=H, vocab_size=VOCAB)
    with pytest.raises(
        OLMoConfigurationError, match="a variable-width model needs the default LM head"
    ):
        VariableWidthLMHeadConfig(name=LMHeadType.normalized, layer_norm=rms, last_width=24).build(
            d_model=H, vocab_size=VOCAB
        )


# --- the model: compile limits, initialisation ----------------------------------------------------


def test_apply_compile_raises_the_recompile_limits(monkeypatch):
    import torch._dynamo

    cfg = torch._dynamo.config
    monkeypatch.setattr(cfg, "recompile_limit", 8)
    monkeypatch.setattr(cfg, "accumulated_recompile_limit", 10)
    compiled = []
    monkeypatch.setattr(
        torch.nn.Module, "compile", lambda self, **kw: compiled.append(type(self).__name__)
    )
    assert (
        next(_config([32]).build().parameters()).device.type == "cpu"
    )  # init_device defaults to the CPU
    model = _config([48, 16, 48, 64]).build(init_device="meta")
    model.apply_compile()
    assert compiled == ["VariableWidthBlock"] * 4 + [
        "LMHead"
    ]  # OLMo-core compiles each block and the head
    needed = 2 * 3 + 8  # 3 distinct widths, each its own graph, + dynamo's default 8
    assert (cfg.recompile_limit, cfg.accumulated_recompile_limit) == (needed, 4 * needed)
    monkeypatch.setattr(cfg, "recompile_limit", 100)
    monkeypatch.setattr(cfg, "accumulated_recompile_limit", 1000)
    model.apply_compile()
    assert (cfg.recompile_limit, cfg.accumulated_recompile_limit) == (100, 1000)  # never lowered


def _normal_std_ok(t, std):
    n = t.numel()
    assert abs(t.mean().item()) < 6 * std / math.sqrt(n), (t.mean().item(), std)
    assert t.std().item() == pytest.approx(std, rel=6 / math.sqrt(n) + 0.01)


def test_init_weights_mup_and_learned_resize():
    """muP (paper 2, docs/papers.md): embedding and LM head N(0, init_range); block matrices N(0,
    init_range / sqrt(m_width) sqrt(h / w_l)), w_out and w2 further / sqrt(2 L); norms ones; the
    learned projections nn.Linear's U(+-1/sqrt(fan_in)), untouched by muP."""
    h, widths = 64, [128, 32, 64, 128]
    mup = MuPConfig(m_width=4.0, m_emb=10.0, m_residual=0.5, init_range=0.05)
    cfg = _config(widths, h=h, heads=2, resize="learned", mup=mup)
    cfg.init_seed = 3
    model = cfg.build(init_device="meta")
    model.init_weights(device=torch.device("cpu"), max_seq_len=16)
    assert model.widths == widths and model.mup is mup
    _normal_std_ok(model.embeddings.weight, 0.05)
    _normal_std_ok(model.lm_head.w_out.weight, 0.05)
    L = len(widths)
    for l, w in enumerate(widths):
        block = model.blocks[str(l)]
        std = 0.05 / math.sqrt(4.0) * math.sqrt(h / w)
        for name in (
            "attention.w_q",
            "attention.w_k",
            "attention.w_v",
            "feed_forward.w1",
            "feed_forward.w3",
        ):
            _normal_std_ok(block.get_submodule(name).weight, std)
        for name in ("attention.w_out", "feed_forward.w2"):
            _normal_std_ok(block.get_submodule(name).weight, std / math.sqrt(2 * L))
        assert torch.equal(block.attention_norm.weight, torch.ones(w))
        if block.resize is not None:  # widening layers: 64 (h) -> 128, 32 -> 64 -> 128
            bound = block.resize.in_features**-0.5
            assert block.resize.weight.abs().max().item() <= bound
            assert block.resize.weight.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05)
    assert [l for l in range(L) if model.blocks[str(l)].resize is not None] == [
        0,
        2,
        3,
    ]  # h -> w_1 too
    assert torch.equal(model.lm_head.norm.weight, torch.ones(128))
    plain = _config(
        [64, 16, 32], resize="learned"
    )  # OLMo-core's init; the projections still nn.Linear's
    plain.init_seed = 0
    m = plain.build(init_device="meta")
    m.init_weights(device=torch.device("cpu"), max_seq_len=16)
    r = m.blocks["2"].resize.weight
    assert r.abs().max().item() <= 16**-0.5 and r.std().item() == pytest.approx(
        16**-0.5 / math.sqrt(3), rel=0.15
    )
    assert m.mup is None and m.lm_head.norm.resize is None  # w_L = h: nothing to project


def test_forward_widens_by_the_rule():
    """One block at a time, against the paper's rule with the block's own output y_l computed
    separately: carry_forward keeps dims a layer does not have, zero feeds zeros to new dims,
    learned projects y_l-1; the stream carries dims [w_l, S) in both stream modes."""
    torch.manual_seed(0)
    # longer than the stream is wide: the padding must go by the last dim, not by the sequence
    T = 50
    x = torch.randn(2, T, 48)  # the stream, S = 48
    emb = torch.randn(2, T, H)  # the embedding, h dims (the first layer pads it to S)
    for mode in ("carry_forward", "zero"):
        cfg = _config([16, 40, 48], resize=mode)
        model = cfg.build(init_device="meta")
        model.init_weights(device=torch.device("cpu"), max_seq_len=T)
        first, widen, full = (model.blocks[str(i)] for i in range(3))
        plain = TransformerBlock.forward  # OLMo-core's block at its own width
        torch.testing.assert_close(
            first(emb),
            torch.cat((plain(first, emb[..., :16]), emb[..., 16:], torch.zeros(2, T, 16)), -1),
        )
        inp = x[..., :40].clone()
        if mode == "zero":
            inp[..., 16:] = 0  # layer 2 widens 16 -> 40: dims [16, 40) read zeros
        torch.testing.assert_close(widen(x), torch.cat((plain(widen, inp), x[..., 40:]), -1))
        torch.testing.assert_close(
            full(x),
            plain(
                full,
                x
                if mode == "carry_forward"
                else torch.cat((x[..., :40], torch.zeros(2, T, 8)), -1),
            ),
        )
    model = _config([16, 40], resize="learned").build(init_device="meta")
    model.init_weights(device=torch.device("cpu"), max_seq_len=T)
    narrow, widen = model.blocks["0"], model.blocks["1"]
    y = torch.randn(2, T, 16)
    torch.testing.assert_close(narrow(emb), TransformerBlock.forward(narrow, emb[..., :16]))
    torch.testing.assert_close(widen(y), TransformerBlock.forward(widen, y @ widen.resize.weight.T))
    assert (
        widen.num_flops_per_token(8) == TransformerBlock.num_flops_per_token(widen, 8) + 6 * 16 * 40
    )
    assert narrow.num_flops_per_token(8) == TransformerBlock.num_flops_per_token(narrow, 8)
