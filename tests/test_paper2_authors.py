"""Paper 2 as its authors ran it: the variable-width model of configs/paper2/ against a float64
reference written from the authors' code (github ZhaofengWu/variable-width-transformers,
width_varying_model.py "WVM", on lm-engine "LME"), not from ours: muP init, move_up / zero / linear
resizing (zero mode's output fill included), RoPE theta 10000; logits and every gradient."""

import math

import pytest
import torch
import torch.nn.functional as F
from olmo_core.optim import AdamWConfig

from olmo_patches.launch.layout import load_and_resolve
from olmo_patches.train.optimizer import optim_groups

from .conftest import REPO

X = REPO / "configs" / "paper2" / "500M" / "x.yaml"
H, HEADS, V, T, B = 32, 2, 64, 8, 2
# w_1 > h, a narrowing, a widening refilled from layer 1, a widening past every earlier width,
# and w_L < h (the output fill).
WIDTHS = [48, 16, 32, 64, 24]
# The authors' numbers (moe_1b3b.yml / dense_*.yml; lm-engine defaults), written here, not read from
# our code.
M_EMB, M_RES, M_WIDTH, INIT_RANGE, EPS, THETA = 12.0, 0.22, 8.0, 0.1, 1e-5, 10000
MODES = {"move_up": "carry_forward", "zero": "zero", "linear": "learned"}
# The MoE (moe_1b3b.yml's kind, tiny): E experts, top-k, expert hidden at h (I_l = round(w_l
# 16 / 32)); an x schedule: w_1 > h, narrowing, widening refilled by carry-forward, w_L > h.
N_EXPERTS, TOP_K, EXPERT_HIDDEN, AUX_COEF = 4, 2, 16, 0.01
MOE_WIDTHS = [64, 32, 16, 32, 48]
MOE = (
    f"model.moe.num_experts={N_EXPERTS}",
    f"model.moe.top_k={TOP_K}",
    f"model.moe.expert_hidden={EXPERT_HIDDEN}",
)


def _spec(mode, widths=WIDTHS, h=H, extra=()):
    return load_and_resolve(
        X,
        [
            f"model.d_model={h}",
            f"model.n_layers={len(widths)}",
            f"model.n_heads={HEADS}",
            f"model.vocab_size={V}",
            "model.widths.schedule=list",
            f"model.widths.values=[{','.join(map(str, widths))}]",
            f"model.widths.resize={MODES[mode]}",
            "train.device=cpu",
            *extra,
            "data.source=demo",
            "data.tokenizer=demo",
            f"data.demo_vocab_size={V}",  # a tokenizer the tiny vocabulary holds
        ],
    )


def _model(mode, widths=WIDTHS, h=H, seed=0, extra=()):
    config = _spec(mode, widths, h, extra).model.build(V)
    config.init_seed = seed
    model = config.build(init_device="meta")
    model.init_weights(device=torch.device("cpu"), max_seq_len=T)
    for m in (
        model.modules()
    ):  # float64 end to end: OLMo-core's RMSNorm and RoPE otherwise compute in float32
        if hasattr(m, "full_precision"):
            m.full_precision = False
    return model


# --- the reference (from the authors' width_varying_model.py:615-746 and lm-engine's modules) -----


def _rmsnorm(x, g):  # LME normalization.py: nn.RMSNorm(eps=1e-5)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * g


def _rope(x):  # LME rope.py: inv_freq in float32, cat(freqs, freqs), x cos + rotate_half(x) sin
    d = x.shape[-1]
    inv = 1.0 / (THETA ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = torch.outer(torch.arange(x.shape[-2], dtype=torch.float32), inv)
    emb = torch.cat((ang, ang), -1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), -1) * sin


def _fill(cands, lo, hi):
    """WVM _expand_using_closest_layers: dims [lo, hi) from the newest candidate wider than each
    dim."""
    cur, parts = lo, []
    for c in cands:
        if cur == hi:
            break
        if c.shape[-1] <= cur:
            continue
        parts.append(c[..., cur : min(c.shape[-1], hi)])
        cur = min(c.shape[-1], hi)
    if cur < hi:
        parts.append(torch.zeros(*cands[0].shape[:-1], hi - cur, dtype=cands[0].dtype))
    return parts


def _resize(x, out_dim, mode, hist, P=None):  # WVM resize_if_needed (301-461)
    if x.shape[-1] >= out_dim:
        return x[..., :out_dim]
    if mode == "linear":
        return x @ P.T
    if mode == "zero":
        return torch.cat((x, torch.zeros(*x.shape[:-1], out_dim - x.shape[-1], dtype=x.dtype)), -1)
    return torch.cat([x, *_fill(list(reversed(hist)), x.shape[-1], out_dim)], -1)


def _authors_moe(a, p):
    """LME mlp_blocks/moe.py (normalized_topk, no shared expert, no sonicmoe): (output, aux_l)."""
    u = a.reshape(-1, a.shape[-1])
    logits = u @ p["gate"].T  # moe.py:298, bias-free Linear(w_l -> E)
    top, idx = logits.topk(TOP_K, dim=-1)  # moe.py:302, 385-391: top-k on the raw logits
    g = top.softmax(-1)  # moe.py:303-304: softmax over the k selected only
    y = 0
    for j in range(TOP_K):
        e = idx[:, j]
        up, gate = torch.einsum("niw,nw->ni", p["c_fc"][e], u).chunk(
            2, dim=-1
        )  # glu.py: x[0] * silu(x[1])
        y = y + g[:, j : j + 1] * torch.einsum("nwi,ni->nw", p["c_proj"][e], up * F.silu(gate))
    probs = logits.softmax(-1)  # moe.py:393-416: over all E
    freq = torch.bincount(idx.flatten(), minlength=N_EXPERTS).to(probs.dtype)  # no gradient
    switch = (
        N_EXPERTS * (F.normalize(probs.sum(0), p=1, dim=0) * F.normalize(freq, p=1, dim=0)).sum()
    )
    z = (torch.logsumexp(logits, dim=-1) ** 2).mean()
    return y.view(a.shape), switch + 0.1 * z


def _authors_forward(W, ids, widths, mode, pad_output=False, aux=None):
    """W: the authors' tensors by role (see _weights). Returns logits (B, T, V). ``pad_output``:
    zero padding at the output instead of the authors' fill (what the project did before). MoE
    layers append their aux_l to ``aux``."""
    h = W["wte"].shape[1]
    e = W["wte"][ids] * M_EMB  # LME base.py:249-260
    hist, x = [e], e
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    for l, w in enumerate(widths):
        p, d = W["blocks"][l], w // HEADS
        x = _resize(x, w, mode, hist, p.get("linear"))
        a = _rmsnorm(x, p["ln_1"])
        q, k, v = ((a @ p[n].T).view(B, T, HEADS, d).transpose(1, 2) for n in ("q", "k", "v"))
        q, k = _rope(q), _rope(k)
        s = (q @ k.transpose(-1, -2)) / d  # attention_multiplier = 1 / head_dim (WVC:429-430)
        o = (s.masked_fill(mask, float("-inf")).softmax(-1) @ v).transpose(1, 2).reshape(B, T, w)
        x = x + M_RES * (o @ p["attn_proj"].T)  # LME layer.py:45-72
        a = _rmsnorm(x, p["ln_2"])  # the router and the experts read ln_2's output at width w_l
        if "gate" in p:
            y, aux_l = _authors_moe(a, p)
            x = x + M_RES * y
            aux.append(aux_l)
        else:
            u, g = (a @ p["c_fc"].T).chunk(2, dim=-1)  # LME glu.py: first half up, second half gate
            x = x + M_RES * ((u * F.silu(g)) @ p["mlp_proj"].T)
        hist.append(x)
    y = _rmsnorm(x, W["ln_f"])
    # WVM:732-742: the output resize turns zero into move_up
    y = _resize(
        y,
        h,
        "move_up" if mode == "zero" and not pad_output else mode,
        hist,
        W.get("linear_for_unembed"),
    )
    return (y @ W["lm_head"].T) / M_WIDTH  # LME main.py:110-118


def _weights(model, widths):
    """The model's parameters as float64 leaves, named by the authors' roles."""
    P = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}
    blocks = []
    for l in range(len(widths)):
        b = f"blocks.{l}."
        blk = dict(
            q=P[b + "attention.w_q.weight"],
            k=P[b + "attention.w_k.weight"],
            v=P[b + "attention.w_v.weight"],
            attn_proj=P[b + "attention.w_out.weight"],
            ln_1=P[b + "attention_norm.weight"],
            ln_2=P[b + "feed_forward_norm.weight"],
        )
        if (
            b + "feed_forward_moe.router.weight" in P
        ):  # OLMo-core stores (E I, w) flat; lm-engine (E, 2I, w) and (E, w, I)
            m, w = b + "feed_forward_moe.", widths[l]
            blk["gate"] = P[m + "router.weight"].view(N_EXPERTS, w)
            w1, w2, w3 = (
                P[m + f"experts.mlp.{n}"].view(N_EXPERTS, -1, w) for n in ("w1", "w2", "w3")
            )
            blk["c_fc"] = torch.cat((w3, w1), dim=1)  # [up; gate] per expert
            blk["c_proj"] = w2.transpose(1, 2)
        else:
            blk["mlp_proj"] = P[b + "feed_forward.w2.weight"]
            blk["c_fc"] = torch.cat(
                (P[b + "feed_forward.w3.weight"], P[b + "feed_forward.w1.weight"])
            )  # [up; gate]
        if b + "resize.weight" in P:
            blk["linear"] = P[b + "resize.weight"]
        blocks.append(blk)
    W = dict(
        wte=P["embeddings.weight"],
        ln_f=P["lm_head.norm.weight"],
        lm_head=P["lm_head.w_out.weight"],
        blocks=blocks,
    )
    if "lm_head.norm.resize.weight" in P:
        W["linear_for_unembed"] = P["lm_head.norm.resize.weight"]
    return P, W


@pytest.mark.parametrize("mode", list(MODES))
def test_logits_and_gradients_match_the_authors_model_in_float64(mode):
    model = _model(mode).double()
    ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(1))
    logits = model(ids)
    F.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1)).backward()

    P, W = _weights(model, WIDTHS)
    ref = _authors_forward(W, ids, WIDTHS, mode)
    F.cross_entropy(ref[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1)).backward()
    scale = ref.abs().max().item()
    assert (logits - ref).abs().max().item() <= 1e-12 * scale
    assert len(P) == len(dict(model.named_parameters()))
    for n, p in model.named_parameters():
        gscale = P[n].grad.abs().max().item() + 1e-30
        assert (p.grad - P[n].grad).abs().max().item() <= 1e-10 * gscale, n
    if (
        mode == "zero"
    ):  # the output fill is live: dims [w_L, h) of the logits' input come from layer 4
        assert model.blocks["3"].attention.w_q.weight.grad.abs().sum() > 0
        assert P["blocks.3.feed_forward.w2.weight"].grad[WIDTHS[-1] : H].abs().sum() > 0


def test_zero_mode_output_is_not_zero_padding():
    """w_L < h: zero padding at the output (the project before) gives other logits than the
    authors'."""
    model = _model("zero").double()
    ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(2))
    _, W = _weights(model, WIDTHS)
    with torch.no_grad():
        ours = model(ids)
        padded = _authors_forward(W, ids, WIDTHS, "zero", pad_output=True)
    assert (
        ours - padded
    ).abs().max() > 1e-4  # 1e8 times the agreement with the authors' model above


def test_mup_init_stds_match_lm_engine():
    """LME attention.py:118-131, mlp.py:33-46, embedding.py, main.py: plain normal; block
    in-projections 0.1 / sqrt(8) * sqrt(h / w_l) (WVM:50-52), out-projections a further / sqrt(2 L),
    L the model's depth."""
    h, widths = 128, [256, 64, 128, 256, 256, 192]
    L = len(widths)
    model = _model("move_up", widths=widths, h=h)
    assert model.embeddings.weight.std().item() == pytest.approx(INIT_RANGE, rel=0.03)
    assert model.lm_head.w_out.weight.std().item() == pytest.approx(INIT_RANGE, rel=0.03)
    for l, w in enumerate(widths):
        blk = model.blocks[str(l)]
        s_l = 0.1 * math.sqrt(h / w) / math.sqrt(8)
        for name in (
            "attention.w_q",
            "attention.w_k",
            "attention.w_v",
            "feed_forward.w1",
            "feed_forward.w3",
        ):
            assert blk.get_submodule(name).weight.std().item() == pytest.approx(s_l, rel=0.05), (
                l,
                name,
            )
        for name in ("attention.w_out", "feed_forward.w2"):
            assert blk.get_submodule(name).weight.std().item() == pytest.approx(
                s_l / math.sqrt(2 * L), rel=0.05
            ), (l, name)
        for name in ("attention_norm", "feed_forward_norm"):
            assert torch.equal(blk.get_submodule(name).weight, torch.ones(w))
    # Not truncated: a plain normal reaches past 3 std in a 256 x 1024 matrix.
    w1 = model.blocks["0"].feed_forward.w1.weight
    assert w1.abs().max() > 3.5 * w1.std()


PAPER2_CONFIGS = sorted((REPO / "configs" / "paper2").rglob("*.yaml"))


def test_paper2_configs_use_the_authors_rope_theta():
    for path in PAPER2_CONFIGS:
        assert load_and_resolve(path).model.rope_theta == THETA, path
    model = _model("move_up")
    assert model.blocks["0"].attention.rope.theta == THETA


def test_paper2_configs_decay_as_lm_engine():
    """LME normalization.py:91-92 marks every norm gain no-decay, nothing else (embedding.py,
    main.py:33-36): the embedding, the untied LM head, the muP matrices, the router and the experts
    decay at 0.1."""
    assert (
        len(PAPER2_CONFIGS) == 16 + 36
    )  # the paper's runs and its r_l x r_d grid (ablations/r_l-r_d: 3 sizes x 4 x 3)
    for path in PAPER2_CONFIGS:
        t = load_and_resolve(path).train
        assert (t.decay_embeddings, t.decay_norms, t.weight_decay) == (True, False, 0.1), path
    spec = load_and_resolve(
        REPO / "configs" / "paper2" / "3B-MoE" / "x-hourglass-experts.yaml",
        [
            "model.d_model=64",
            "model.n_layers=4",
            "model.n_heads=2",
            "model.moe.num_experts=4",
            "model.moe.top_k=2",
            "model.d_h=16",
            "model.vocab_size=64",
            "data.source=demo",
            "data.tokenizer=demo",
            "data.demo_vocab_size=64",
        ],
    )
    config = spec.model.build(64)
    model = config.build(init_device="meta")
    opt = AdamWConfig(
        lr=0.01, weight_decay=spec.train.weight_decay, group_overrides=optim_groups(spec, config)
    ).build(model)
    decay = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    norms = 0
    for name, p in model.named_parameters():
        is_norm = name.endswith("norm.weight") or name.endswith(
            "norm_weight"
        )  # block, final and experts' gains
        norms += is_norm
        assert decay[id(p)] == (0.0 if is_norm else 0.1), name
    assert (
        norms == 4 * 3 + 1
    )  # attention_norm, feed_forward_norm, the experts' gains per block; lm_head.norm


# --- the 3B MoE (moe_1b3b.yml; LME mlp_blocks/moe.py) ---------------------------------------------


def _aux(model):
    """Our aux loss of the last forward: OLMo-core's per-router losses times their weights,
    summed."""
    routers = [b.feed_forward_moe.router for b in model.blocks.values()]
    return sum(
        r.lb_loss_weight * r.load_balancing_loss + r.z_loss_weight * r.z_loss for r in routers
    )


def test_moe_logits_gradients_and_aux_loss_match_the_authors_model():
    """OLMo-core's router, losses and experts at each w_l against lm-engine's MoE in float64. The
    router computes its logits in float32 (OLMo-core's MoELinearRouter), so the agreement is
    float32's."""
    model = _model("move_up", widths=MOE_WIDTHS, extra=MOE).double()
    ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(3))
    logits = model(
        ids
    )  # training mode: the aux losses ride on the experts' input (attach_auxiliary_loss)
    F.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1)).backward()

    P, W = _weights(model, MOE_WIDTHS)
    aux = []
    ref = _authors_forward(W, ids, MOE_WIDTHS, "move_up", aux=aux)
    ref_ce = F.cross_entropy(ref[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))
    (ref_ce + AUX_COEF * sum(aux)).backward()  # LME pretraining.py: loss = CE + coef sum_l aux_l
    assert len(aux) == len(MOE_WIDTHS)
    assert (logits - ref).abs().max().item() <= 1e-8 * ref.abs().max().item()
    assert _aux(model).item() == pytest.approx(AUX_COEF * sum(aux).item(), rel=1e-6)
    assert len(P) == len(dict(model.named_parameters()))
    for n, p in model.named_parameters():
        gscale = P[n].grad.abs().max().item() + 1e-30
        assert (p.grad - P[n].grad).abs().max().item() <= 1e-5 * gscale, n
    # The aux loss is live: without it the routers' gradients would be off by far more than the
    # tolerance.
    P2, W2 = _weights(model, MOE_WIDTHS)
    F.cross_entropy(
        _authors_forward(W2, ids, MOE_WIDTHS, "move_up", aux=[])[:, :-1].reshape(-1, V),
        ids[:, 1:].reshape(-1),
    ).backward()
    router = "blocks.2.feed_forward_moe.router.weight"
    assert (P2[router].grad - P[router].grad).abs().max() > 1e-3 * P[router].grad.abs().max()
    # I_l = round(w_l 16 / 32) experts of the authors' size (WVC:432).
    assert [b.feed_forward_moe.experts.mlp.hidden_size for b in model.blocks.values()] == [
        32,
        16,
        8,
        16,
        24,
    ]


def test_moe_mup_init_and_lr_groups_match_lm_engine():
    """LME moe.py:176-220: router and c_fc std s_l, c_proj s_l / sqrt(2 L); all three in the muP
    group (lr / 8)."""
    h, widths = 64, [128, 32, 64, 128]
    spec = _spec(
        "move_up",
        widths=widths,
        h=h,
        extra=(*MOE, "model.moe.num_experts=32", "model.moe.expert_hidden=64"),
    )
    model = spec.model.build(V).build(init_device="meta")
    model.init_weights(device=torch.device("cpu"), max_seq_len=T)
    L = len(widths)
    for l, w in enumerate(widths):
        moe = model.blocks[str(l)].feed_forward_moe
        s_l = 0.1 * math.sqrt(h / w) / math.sqrt(8)
        for t, std in (
            (moe.router.weight, s_l),
            (moe.experts.mlp.w1, s_l),
            (moe.experts.mlp.w3, s_l),
            (moe.experts.mlp.w2, s_l / math.sqrt(2 * L)),
        ):
            assert t.std().item() == pytest.approx(std, rel=0.05), l
    opt = AdamWConfig(lr=0.01, group_overrides=optim_groups(spec, spec.model.build(V))).build(model)
    lr = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    named = dict(model.named_parameters())
    for name in (
        "blocks.0.feed_forward_moe.router.weight",
        "blocks.1.feed_forward_moe.experts.mlp.w2",
        "blocks.3.attention.w_q.weight",
    ):
        assert lr[id(named[name])] == pytest.approx(0.01 / M_WIDTH), name
    for name in ("embeddings.weight", "lm_head.w_out.weight", "blocks.0.feed_forward_norm.weight"):
        assert lr[id(named[name])] == pytest.approx(0.01), name
