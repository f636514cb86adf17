"""Honest MFU and compile-friendliness; speed itself is measured by scripts/bench.py, not here.

- every block's ``num_flops_per_token`` equals the weight-matmul FLOPs torch's FlopCounterMode
  counts in its forward + backward, plus the attention-score term written here from its definition;
- the trainer's FLOP count (what OLMo-core's SpeedMonitorCallback turns into MFU) is the model's;
- the hourglass and variable-width blocks trace under torch.compile without graph breaks.
"""

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from olmo_patches.blocks import model_spec
from olmo_patches.blocks.variable_width import WidthSpec
from olmo_patches.launch.layout import load_and_resolve
from olmo_patches.train import train

from .conftest import REPO, spawn, tiny_overrides

H, HEADS, T, B, VOCAB = 64, 4, 24, 2, 256
WIDTHS = [
    96,
    32,
    48,
    128,
]  # wide-narrow-wide, first and last wider than h (both waste terms present)

VARIANTS = {
    "baseline-pre": dict(block="baseline"),
    "baseline-post": dict(block="baseline", norm_placement="post"),
    "hourglass-pre": dict(block="hourglass", K=3, d_h=24),
    "hourglass-post": dict(block="hourglass", K=3, d_h=24, norm_placement="post"),
    **{
        f"vw-{ffn}-{resize}": dict(
            block="variable_width",
            ffn=ffn,
            **(dict(K=2, d_h_ratio=0.5) if ffn == "hourglass" else {}),  # read by an hourglass FFN
            widths=WidthSpec(schedule="list", values=WIDTHS, resize=resize),
        )
        for ffn in ("swiglu", "hourglass")
        for resize in ("carry_forward", "zero", "learned")
    },
}


def _model(variant: str):
    kw = dict(VARIANTS[variant])
    model = model_spec(d_model=H, n_layers=len(WIDTHS), n_heads=HEADS, **kw).build(VOCAB).build()
    model.init_weights(device=torch.device("cpu"), max_seq_len=T)
    return model


def _attention_scores(width: int) -> float:
    """Q K^T and P V per token, forward + backward, over the causal (query, key) pairs:
    2 matmuls x 2 FLOPs x 3 (fwd + bwd) x width x (T (T + 1) / 2) / T. CPU SDPA is not counted by
    FlopCounterMode, so this term is the one part of num_flops_per_token that is not measured."""
    return 12 * width * (T * (T + 1) / 2) / T


def _matmul_flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn().float().square().sum().backward()
    counts = counter.get_flop_counts().get("Global", {})
    assert not any(
        "attention" in str(op) for op in counts
    )  # otherwise the scores would count twice
    return sum(v for op, v in counts.items() if str(op).split(".")[1] in ("mm", "addmm", "bmm"))


def _block_inputs(model) -> list:
    """Each block's input shape in a real forward (variable-width blocks see the stream or
    y_l-1)."""
    shapes, hooks = (
        [],
        [
            b.register_forward_pre_hook(lambda m, a: shapes.append(a[0].shape))
            for b in model.blocks.values()
        ],
    )
    model(torch.randint(0, VOCAB, (B, T)))
    for h in hooks:
        h.remove()
    return shapes


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_block_flops_match_flop_counter(variant):
    model = _model(variant)
    for block, shape in zip(model.blocks.values(), _block_inputs(model)):
        width = block.attention.n_heads * block.attention.head_dim
        measured = _matmul_flops(lambda: block(torch.randn(shape, requires_grad=True)))
        predicted = (block.num_flops_per_token(T) - _attention_scores(width)) * B * T
        assert measured == pytest.approx(predicted, rel=0.01), (
            variant,
            type(block).__name__,
            width,
        )


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_model_flops_match_flop_counter(variant):
    """The whole model, LM head included: what the trainer's MFU divides."""
    model = _model(variant)
    widths = [b.attention.n_heads * b.attention.head_dim for b in model.blocks.values()]
    measured = _matmul_flops(lambda: model(torch.randint(0, VOCAB, (B, T))))
    predicted = (model.num_flops_per_token(T) - sum(_attention_scores(w) for w in widths)) * B * T
    assert measured == pytest.approx(predicted, rel=0.01)


def test_hourglass_counts_its_k_sub_mlps_not_6n():
    """The hourglass FFN's count is 18 K d_model d_h (3 matrices), independent of its K norms."""
    model = _model("hourglass-pre")
    ffn = model.blocks["0"].feed_forward
    assert ffn.num_flops_per_token(T) == 6 * 3 * 3 * H * 24
    assert ffn.num_flops_per_token(T) < 6 * sum(p.numel() for p in ffn.parameters())


@pytest.mark.slow
@pytest.mark.parametrize(
    "variant",
    [
        "hourglass-pre",
        "hourglass-post",
        "vw-swiglu-carry_forward",
        "vw-swiglu-zero",
        "vw-swiglu-learned",
        "vw-hourglass-carry_forward",
    ],
)
def test_blocks_compile_without_graph_breaks(variant):
    model = _model(variant)
    for block, shape in zip(model.blocks.values(), _block_inputs(model)):
        torch._dynamo.reset()
        explanation = torch._dynamo.explain(block)(torch.randn(shape))
        assert explanation.graph_break_count == 0, (
            variant,
            [str(r.reason) for r in explanation.break_reasons],
        )
        assert explanation.graph_count == 1


@pytest.mark.slow
@pytest.mark.parametrize("block", ["hourglass", "variable_width"])
def test_trainer_flops_are_the_models(tmp_path, demo_corpus, block):
    """OLMo-core's SpeedMonitorCallback (MFU = its FLOP/s / the device peak) counts the model's
    FLOPs, checked against a count written here (885,312 and 1,149,696 per token)."""
    extra = (
        ["model.block=hourglass", "model.K=2", "model.d_h=16"]
        if block == "hourglass"
        else [
            "model.block=variable_width",
            "model.widths.schedule=list",
            "model.widths.values=[48,16,32]",
            "model.n_layers=3",
        ]
    )
    spec = load_and_resolve(
        REPO / "configs" / "demo" / "baseline.yaml",
        tiny_overrides(tmp_path, "train.max_steps=2", *extra),
    )
    train(spec)
    last = [
        json.loads(line)
        for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
        if "throughput/total tokens" in line
    ][-1]
    trainer_flops_per_token = (
        last["throughput/total petaflops"] * 1e15 / last["throughput/total tokens"]
    )
    # Counted here from the shapes: 6 FLOPs per matmul weight and token (forward + backward), 12 per
    # head dimension and causal (query, key) pair (QK^T and AV), the LM head and its norm; V = 4096
    # (demo).
    s, V, d = 32, 4096, 32
    if block == "hourglass":  # 2 layers of width 32: attention 4 d^2, K=2 sub-MLPs of d_h=16
        layers = [(32, 3 * 2 * 32 * 16)] * 2
    else:  # widths 48, 16, 32 with SwiGLU hidden 4 w
        layers = [(w, 3 * w * 4 * w) for w in (48, 16, 32)]
    want = sum(
        6 * (4 * w * w + ffn) + 12 * w * (s * (s + 1) // 2) // s for w, ffn in layers
    ) + 6 * (V * d + d)
    assert trainer_flops_per_token == pytest.approx(want, rel=1e-6)


def _fsdp_collectives(rank: int, port: int, out: str) -> None:
    """One rank of a 2-process gloo FSDP2 step: count the all-gathers and reduce-scatters per
    variant."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as group

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    calls = {"all_gather": 0, "reduce_scatter": 0}
    gather, reduce = group.foreach_all_gather, group.foreach_reduce

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    group.foreach_all_gather, group.foreach_reduce = (
        counted("all_gather", gather),
        counted("reduce_scatter", reduce),
    )
    counts = {}
    for variant in ("baseline-pre", "hourglass-pre"):
        model = _model(variant)
        model.apply_fsdp(dp_mesh=init_device_mesh("cpu", (2,)))
        for key in calls:
            calls[key] = 0
        model(torch.randint(0, VOCAB, (B, T))).square().mean().backward()
        counts[variant] = dict(calls)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(counts, f)
    dist.destroy_process_group()


@pytest.mark.slow
def test_fsdp_one_unit_per_block_whatever_k(tmp_path):
    """OLMo-core's per-block wrapping: an hourglass block (K=3 sub-MLPs) is one FSDP unit, so a step
    has the baseline's collectives (one all-gather per block in forward, one again in backward for
    the resharded block, one reduce-scatter per block), not K per layer."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "counts.json"
    spawn(_fsdp_collectives, 2, port, str(out))
    counts = json.loads(out.read_text())
    assert counts["hourglass-pre"] == counts["baseline-pre"]
    n_units = len(WIDTHS) + 2  # the blocks, the LM head, and the root (the embeddings)
    assert counts["baseline-pre"]["reduce_scatter"] == n_units
    assert counts["baseline-pre"]["all_gather"] <= 2 * n_units
