"""Hourglass experts (an MoE whose routed experts are hourglass stacks) against plain PyTorch
written from the equations, against OLMo-core's own MoE for K=1, and their counts against the built
module."""

import pytest
import torch
import torch.nn.functional as F
from olmo_core.nn.attention import AttentionConfig
from olmo_core.nn.layer_norm import LayerNormConfig, LayerNormType
from olmo_core.nn.lm_head import LMHeadConfig
from olmo_core.nn.moe import MoEConfig, MoERouterConfig, MoEType
from olmo_core.nn.moe.mlp import DroplessMoEMLP
from olmo_core.nn.transformer import (
    TransformerBlockConfig,
    TransformerBlockType,
    TransformerConfig,
    TransformerType,
)
from torch.utils.flop_counter import FlopCounterMode

from olmo_patches.nn.hourglass_moe import HourglassMoEBlockConfig, HourglassMoEConfig
from olmo_patches.nn.moe import PortableDroplessMLP

EPS = 1e-6
NORM = LayerNormConfig(
    name=LayerNormType.rms, eps=EPS, bias=False, full_precision=False
)  # float64 stays float64
D, E, TOP_K, K, D_H = 32, 4, 2, 2, 8


def rms_norm(x, gain):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * gain


def reference(u, p, *, top_k, renormalize, alpha):
    """The equations, every expert computed densely for every token, then combined with the gates.

    p: Wr (E, d), gr (d) the router's norm gain, W1, W3 (E, K, d_h, d), W2 (E, K, d_h, d) (the up
    projection applied as x @ W2), G (E, K, d) the sub-MLP norm gains.
    Returns the MoE output sum_e g_e E_e(u), the load-balancing loss and the router z-loss.
    """
    logits = rms_norm(u, p["gr"]) @ p["Wr"].T  # (B, S, E)
    probs = logits.softmax(-1)
    gates, chosen = probs.topk(top_k, dim=-1)
    if renormalize:
        gates = gates / gates.sum(-1, keepdim=True)
    out = torch.zeros_like(u)
    n_experts, n_sub = p["G"].shape[:2]
    for e in range(n_experts):
        z = u
        for k in range(n_sub):
            y = rms_norm(z, p["G"][e, k])
            z = z + alpha * (F.silu(y @ p["W1"][e, k].T) * (y @ p["W3"][e, k].T)) @ p["W2"][e, k]
        g_e = (gates * (chosen == e)).sum(
            -1, keepdim=True
        )  # 0 where e is not among the token's top-k
        out = out + g_e * (z - u)  # E_e(u) = z_K - u
    T = u.shape[0] * u.shape[1]
    count = F.one_hot(chosen, n_experts).sum((0, 1, 2)).to(u.dtype)  # assignments per expert
    lb = n_experts / top_k * (count * probs.mean((0, 1))).sum() / T
    z_loss = torch.logsumexp(logits, -1).square().sum() / T
    return out, lb, z_loss


def _moe_config(*, K=K, top_k=TOP_K, renormalize=False, lb=0.01, z=0.001):
    return HourglassMoEConfig(
        name=MoEType.dropless,
        num_experts=E,
        hidden_size=D_H,
        K=K,
        router=MoERouterConfig(top_k=top_k, normalize_expert_weights=1.0 if renormalize else None),
        layer_norm=NORM,
        lb_loss_weight=lb,
        z_loss_weight=z,
        scale_loss_by_num_layers=False,
    )


@pytest.mark.parametrize("renormalize,alpha", [(False, 1.0), (True, 0.22)])
def test_moe_matches_equations_in_float64(renormalize, alpha):
    """Outputs, every gradient (the aux losses' included) and both aux losses, against the
    reference."""
    torch.manual_seed(0)
    moe = _moe_config(renormalize=renormalize).build(D).double()
    moe.experts.mlp.residual_alpha = alpha  # as the block sets it (muP's m_residual)
    router_norm = NORM.build(D).double()
    with torch.no_grad():
        for prm in (moe.experts.mlp.w1, moe.experts.mlp.w2, moe.experts.mlp.w3):
            prm.normal_(0, 0.3)
        moe.experts.mlp.norm_weight.uniform_(0.5, 1.5)
        moe.router.weight.normal_(0, 0.5)
        router_norm.weight.uniform_(0.5, 1.5)
    mlp = moe.experts.mlp
    p = {
        "Wr": moe.router.weight.detach().view(E, D),
        "gr": router_norm.weight.detach(),
        "W1": mlp.w1.detach().view(K, E, D_H, D).transpose(0, 1),
        "W3": mlp.w3.detach().view(K, E, D_H, D).transpose(0, 1),
        "W2": mlp.w2.detach().view(K, E, D_H, D).transpose(0, 1),
        "G": mlp.norm_weight.detach().view(E, K, D),
    }
    p = {k: v.clone().requires_grad_() for k, v in p.items()}
    u = torch.randn(2, 6, D, dtype=torch.float64)
    u1, u2 = u.clone().requires_grad_(), u.clone().requires_grad_()
    weights = torch.arange(u.numel(), dtype=torch.float64).reshape(u.shape).sin()

    moe.train()
    out = moe(u1, router_input=router_norm(u1))
    (
        out * weights
    ).sum().backward()  # the aux losses reach the router through OLMo-core's attached loss
    expected, lb, z_loss = reference(u2, p, top_k=TOP_K, renormalize=renormalize, alpha=alpha)
    ((expected * weights).sum() + 0.01 * lb + 0.001 * z_loss).backward()

    # OLMo-core's router computes its logits, gates and aux losses in float32: that is the error
    # floor.
    tol = dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out, expected, **tol)
    torch.testing.assert_close(moe.router.load_balancing_loss.double(), lb.detach(), **tol)
    torch.testing.assert_close(moe.router.z_loss.double(), z_loss.detach(), **tol)
    torch.testing.assert_close(u1.grad, u2.grad, **tol)
    torch.testing.assert_close(moe.router.weight.grad.view(E, D), p["Wr"].grad, **tol)
    torch.testing.assert_close(router_norm.weight.grad, p["gr"].grad, **tol)
    # An expert's weight and norm gradients sum their tokens' float32 gates times float64
    # activations: a few 1e-6 (measured 2.8e-6 and 1.5e-6); a wrong routing or a missing residual
    # term is off by whole units.
    grad_tol = dict(rtol=1e-5, atol=1e-5)
    for name, key in (("w1", "W1"), ("w3", "W3"), ("w2", "W2")):
        torch.testing.assert_close(
            getattr(mlp, name).grad.view(K, E, D_H, D).transpose(0, 1), p[key].grad, **grad_tol
        )
    torch.testing.assert_close(mlp.norm_weight.grad.view(E, K, D), p["G"].grad, **grad_tol)


def test_k1_experts_are_olmo_cores_swiglu_experts_of_the_normalised_input():
    """E_e(u) = z_1 - u = SwiGLU_e(norm_e(u)): OLMo-core's DroplessMoEMLP on norm(u), with the same
    weights."""
    torch.manual_seed(0)
    ours = _moe_config(K=1).build(D).experts.mlp
    theirs = DroplessMoEMLP(d_model=D, hidden_size=D_H, num_experts=E)
    gain = torch.rand(D) + 0.5
    with torch.no_grad():
        for name in ("w1", "w2", "w3"):
            getattr(ours, name).copy_(getattr(theirs, name))
        ours.norm_weight.copy_(gain.repeat(E))
    rows = torch.randn(10, D)
    sizes = torch.tensor([3, 0, 5, 2])  # rows grouped by expert, one expert idle
    torch.testing.assert_close(
        ours(rows, sizes), theirs(rms_norm(rows, gain), sizes), rtol=1e-6, atol=1e-6
    )


def _transformer(block: TransformerBlockConfig, n_layers=2, vocab=128) -> TransformerConfig:
    return TransformerConfig(
        name=TransformerType.moe,
        d_model=D,
        vocab_size=vocab,
        n_layers=n_layers,
        block=block,
        lm_head=LMHeadConfig(layer_norm=NORM, bias=False),
    )


def _blocks(K=1):
    attention = AttentionConfig(n_heads=4, bias=False)
    olmo = MoEConfig(
        name=MoEType.dropless,
        num_experts=E,
        hidden_size=D_H,
        router=MoERouterConfig(top_k=TOP_K),
        lb_loss_weight=0.01,
        z_loss_weight=0.001,
        scale_loss_by_num_layers=False,
    )
    ours = TransformerBlockConfig(
        name=TransformerBlockType.moe,
        sequence_mixer=attention,
        layer_norm=NORM,
        feed_forward_moe=olmo,
    )
    hourglass = HourglassMoEBlockConfig(
        name=TransformerBlockType.moe,
        sequence_mixer=attention,
        layer_norm=NORM,
        feed_forward_moe=_moe_config(K=K),
    )
    return ours, hourglass


def test_k1_model_is_olmo_cores_moe_model_at_the_same_seed():
    """K=1, same init seed: the same initial weights (every norm gain 1), the same logits and
    gradients as OLMo-core's MoE transformer with SwiGLU experts of hidden d_h (its dispatch run by
    PortableDroplessMLP)."""
    olmo_block, hourglass_block = _blocks(K=1)
    olmo, ours = _transformer(olmo_block).build(), _transformer(hourglass_block).build()
    for model in (olmo, ours):
        model.init_weights(device=torch.device("cpu"))
    for block in (
        olmo.blocks.values()
    ):  # OLMo-core's Triton permutation does not run on CPU: same experts, torch dispatch
        moe = block.feed_forward_moe
        moe.experts = PortableDroplessMLP(mlp=moe.experts.mlp, top_k=moe.top_k)
    theirs_params = dict(olmo.named_parameters())
    for name, prm in ours.named_parameters():
        if name.endswith("norm_weight"):
            assert torch.equal(prm, torch.ones_like(prm))
        else:  # the experts' (K=1, E d_h, d_model): OLMo-core's (E d_h, d_model) with a leading 1
            theirs = theirs_params[name]
            assert prm.shape in (theirs.shape, (1, *theirs.shape)) and torch.equal(
                prm.view(theirs.shape), theirs
            ), name
    x = torch.randint(0, 128, (2, 12))
    a, b = ours(x), olmo(x)
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    a.square().mean().backward()  # in training mode: the aux losses are in both backward passes
    b.square().mean().backward()
    for name, prm in ours.named_parameters():
        want = theirs_params.get(name)
        if name.endswith("feed_forward_norm.weight"):
            # OLMo-core's FFN norm gain feeds the router and every expert; ours, the router only,
            # the experts having their own gains (all equal here): its gradient is the sum of both.
            experts = dict(ours.named_parameters())[
                name.replace("feed_forward_norm.weight", "feed_forward_moe.experts.mlp.norm_weight")
            ]
            torch.testing.assert_close(
                prm.grad + experts.grad.view(E, D).sum(0), want.grad, rtol=1e-4, atol=1e-8, msg=name
            )
        elif want is not None:
            torch.testing.assert_close(
                prm.grad.view(want.shape), want.grad, rtol=1e-4, atol=1e-8, msg=name
            )


def test_counts_against_the_built_module_and_the_shapes():
    """d=32, E=4, top-2, K=2, d_h=8: router 32*4 = 128; one expert K (3 d d_h + d) = 2 (768 + 32) =
    1600."""
    cfg = _moe_config()
    moe = cfg.build(D)
    assert sum(p.numel() for p in moe.parameters()) == cfg.num_params(D) == 128 + 4 * 1600 == 6528
    assert cfg.num_active_params(D) == 128 + 2 * 1600 == 3328
    # 6 per weight: router 128 + top-2 x K=2 x 3 x 32 x 8 = 3072 expert weights per token.
    assert moe.num_flops_per_token(16) == 6 * (128 + 3072) == 19200


def test_moe_flops_match_flop_counter():
    """Matmul FLOPs of a forward + backward, measured by PyTorch's FlopCounterMode: dropless routing
    sends exactly top_k rows per token, so they equal the per-token count."""
    moe = _moe_config(lb=None, z=None).build(D)
    tokens = 3 * 20
    with FlopCounterMode(display=False) as counter:
        moe(torch.randn(3, 20, D, requires_grad=True)).square().sum().backward()
    measured = sum(v for op, v in counter.get_flop_counts()["Global"].items() if "mm" in str(op))
    assert measured == moe.num_flops_per_token(20) * tokens


@pytest.mark.parametrize("K", [1, 2])
def test_model_counts_against_the_built_model(K):
    """OLMo-core's TransformerConfig counts (total and active) with hourglass experts equal the
    built model."""
    _, block = _blocks(K=K)
    config = _transformer(block, n_layers=3)
    model = config.build()
    assert config.num_params == sum(p.numel() for p in model.parameters())
    # Per layer: attention 4 d^2 + 2 norms d + router d E + E (inactive: E - top_k) experts of K (3
    # d d_h + d).
    expert = K * (3 * D * D_H + D)
    layer = 4 * D * D + 2 * D + D * E
    embed_head = 2 * 128 * D + D
    assert config.num_params == embed_head + 3 * (layer + E * expert)
    assert config.num_active_params == embed_head + 3 * (layer + TOP_K * expert)


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(K=0), "hourglass experts need K >= 1, got K=0"),
        (dict(hidden_size=0), "hourglass experts need d_h >= 1, got d_h=0"),
        (dict(name=MoEType.default), "hourglass experts need the dropless MoE (name: dropless)"),
        (dict(layer_norm=None), "hourglass experts need a layer_norm config for their K norms"),
        (
            dict(layer_norm=LayerNormConfig(name=LayerNormType.default, bias=False)),
            "hourglass experts' norms are RMSNorms with a gain and no bias"
            " (layer_norm: name rms, bias false, elementwise_affine true)",
        ),
    ],
)
def test_bad_shapes_are_named(change, message):
    import dataclasses
    import re

    from olmo_core.exceptions import OLMoConfigurationError

    with pytest.raises(OLMoConfigurationError, match=f"^{re.escape(message)}$"):
        dataclasses.replace(_moe_config(), **change).build(D)


# A tiny variable-width model (w = 48, 32 around h = 32) whose layers are MoEs of hourglass experts.
HOURGLASS_EXPERTS = [
    "model.moe.num_experts=4",
    "model.moe.top_k=2",
    "model.moe.experts=hourglass",
    "model.K=2",
    "model.d_h=16",
    "model.widths.schedule=list",
    "model.widths.values=[48,32]",
]


def _spec(folder, cache, *extra):
    from olmo_patches.launch.layout import load_and_resolve

    from .conftest import REPO, tiny_overrides

    run = [
        "train.max_steps=4",
        "run.save_interval=2",
        "run.ephemeral_save_interval=null",
        f"data.work_dir={cache}",
    ]
    return load_and_resolve(
        REPO / "configs" / "demo" / "variable-width.yaml",
        tiny_overrides(folder, *HOURGLASS_EXPERTS, *run, *extra),
    )


@pytest.mark.slow
def test_a_config_with_hourglass_experts_trains_saves_and_resumes_bit_identically(
    tmp_path, demo_corpus
):
    from olmo_patches.train import train
    from olmo_patches.train.checkpoints import load_model_state
    from olmo_patches.launch.run_folder import read_metrics

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(_spec(straight, tmp_path / "cache"))
    train(
        _spec(resumed, tmp_path / "cache"), resume_from=str(straight / "step2")
    )  # trains steps 3 and 4
    a, b = load_model_state(straight / "step4"), load_model_state(resumed / "step4")
    assert "blocks.0.feed_forward_moe.experts.mlp.norm_weight" in a and a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    metrics = read_metrics(straight)
    assert (
        metrics[4]["train/block 01/load balancing loss"] > 0
    )  # OLMo-core's router losses, logged per block
    assert [metrics[s]["train/CE loss"] for s in (3, 4)] == [
        read_metrics(resumed)[s]["train/CE loss"] for s in (3, 4)
    ]


def test_the_paper_scale_example_differs_from_x_only_in_its_experts():
    """configs/paper2/3B-MoE/x-hourglass-experts.yaml: x.yaml's widths; per layer, 22 experts of K=2
    sub-MLPs of d_h_l = round(w_l 256 / 1600) (+ their 2 norm gains) instead of one SwiGLU of
    I_l = round(w_l 512 / 1600); the counts differ by exactly that (OLMo-core's config counts, no
    build)."""
    from olmo_patches.config import vocab_size
    from olmo_patches.launch.layout import load_and_resolve

    from .conftest import REPO

    folder = REPO / "configs" / "paper2" / "3B-MoE"
    x, hg = (load_and_resolve(folder / name) for name in ("x.yaml", "x-hourglass-experts.yaml"))
    widths = x.model.resolved_widths
    assert hg.model.resolved_widths == widths and len(widths) == 40
    cx, ch = (s.model.build(vocab_size(s)) for s in (x, hg))
    swiglu = [3 * w * round(w * 512 / 1600) for w in widths]
    hourglass = [2 * (3 * w * round(w * 256 / 1600) + w) for w in widths]
    assert ch.num_params - cx.num_params == sum(22 * (h - s) for h, s in zip(hourglass, swiglu))
    assert ch.num_active_params - cx.num_active_params == sum(
        3 * (h - s) for h, s in zip(hourglass, swiglu)
    )


@pytest.mark.parametrize(
    "extra,message",
    [
        (
            ["model.d_h=null"],
            "command line: model.d_h=None: hourglass experts need model.d_h (or model.d_h_ratio): "
            "each sub-MLP's bottleneck at width h",
        ),
        (
            ["model.moe.expert_hidden=64"],
            "command line: model.moe.expert_hidden=64: hourglass experts take their shape from "
            "model.K and model.d_h; remove it",
        ),
        (["model.K=0"], "command line: model.K=0: must be >= 1"),
        (
            ["model.moe.experts=swiglu", "model.K=1", "model.d_h=null"],
            "model.moe.expert_hidden=None: must be >= 1 for swiglu experts",
        ),
        (  # swiglu experts read no K: the hourglass experts' K left set is refused
            ["model.moe.experts=swiglu", "model.moe.expert_hidden=64"],
            "command line: model.K=2: read only with model.ffn=hourglass or "
            "model.moe.experts=hourglass",
        ),
    ],
)
def test_bad_hourglass_expert_configs_are_named_in_one_line(tmp_path, extra, message):
    from olmo_patches.config import ConfigError

    with pytest.raises(ConfigError) as e:
        _spec(tmp_path, tmp_path / "cache", *extra)
    assert str(e.value).endswith(message) and "\n" not in str(e.value)


def test_mup_init_and_multiplier_reach_the_hourglass_experts(tmp_path):
    """Under muP every sub-MLP residual is x m_residual, and the experts' weights get the paper's
    std: init_range / sqrt(m_width) sqrt(h / w_l), with w2 (the output projection) a
    further / sqrt(2 L)."""
    from olmo_patches.config import vocab_size

    spec = _spec(tmp_path, tmp_path / "cache", "model.widths.init=mup")
    model = spec.model.build(vocab_size(spec)).build()
    model.init_weights(device=torch.device("cpu"))
    for block, w in zip(model.blocks.values(), (48, 32)):
        mlp = block.feed_forward_moe.experts.mlp
        assert mlp.residual_alpha == 0.22
        std = 0.1 / 8**0.5 * (32 / w) ** 0.5
        for name, want in (("w1", std), ("w3", std), ("w2", std / (2 * 2) ** 0.5)):
            assert abs(getattr(mlp, name).std().item() / want - 1) < 0.05, name
        assert torch.equal(mlp.norm_weight, torch.ones_like(mlp.norm_weight))


def test_count_params_reports_the_hourglass_experts(tmp_path):
    """count_params' numbers (report/counts.py) for the tiny config, against counts written from the
    shapes: w = 48, 32; d_h,l = round(w 16 / 32) = 24, 16; E = 4, top-2, K = 2."""
    from olmo_patches.config import vocab_size
    from olmo_patches.report.counts import count, paper_report

    spec = _spec(tmp_path, tmp_path / "cache")
    b, report = count(spec), paper_report(spec)
    assert report["expert_K"] == 2 and report["expert_hidden"] == [24, 16]
    # FFN: router w E + E K 3 w d_h per layer (the sub-MLP norm gains count as norms).
    assert b.ffn == (48 * 4 + 4 * 2 * 3 * 48 * 24) + (32 * 4 + 4 * 2 * 3 * 32 * 16)
    # Inactive: 2 of 4 experts per layer, their K (3 w d_h + w) each.
    assert b.inactive == 2 * 2 * (3 * 48 * 24 + 48) + 2 * 2 * (3 * 32 * 16 + 32)
    config = spec.model.build(vocab_size(spec))
    assert (b.total, b.active) == (config.num_params, config.num_active_params)
