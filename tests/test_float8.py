"""train.float8 (nn/float8.py) on CPU, in torchao's emulation: which matmuls convert per block type,
the hourglass's stacked sub-MLPs against torchao's own Float8Linear, training losses against fp32,
resume, FSDP x2 with float8 all-gather, the HF export, and the one-line refusals."""

import copy
import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from olmo_patches.config import ConfigError, vocab_size
from olmo_patches.launch.layout import load_and_resolve
from olmo_patches.train import train
from olmo_patches.train.checkpoints import load_model_state
from olmo_patches.launch.run_folder import read_metrics

from .conftest import REPO, ranks, run_in_process, tiny_overrides

pytest.importorskip("torchao.float8", reason="the float8 extra (pip install -e '.[float8]')")
from torchao.float8 import Float8LinearConfig  # noqa: E402
from torchao.float8.float8_linear import Float8Linear  # noqa: E402

# end to end: runs trained, processes or ranks started (make test-fast leaves them out)
pytestmark = pytest.mark.slow

BASELINE = REPO / "configs" / "demo" / "baseline.yaml"
# Per block type, the tiny model (d_model 32, 2 layers) and the matmul modules it has, counted here:
# attention w_q, w_k, w_v, w_out per layer; SwiGLU w1, w2, w3; the hourglass's three stacked weights
# (each K sub-MLP matmuls); the learned resizes (layer 1 widens 16 -> 32, the output 32 -> 48).
SHAPES = {
    "baseline": ([], 2 * (4 + 3), 0),
    "hourglass": (["model.block=hourglass", "model.K=2", "model.d_h=16"], 2 * 4 + 2 * 3, 2 * 3),
    "variable_width": (
        [
            "model.block=variable_width",
            "model.widths.schedule=list",
            "model.widths.values=[16,32]",
            "model.widths.resize=learned",
            "model.d_model=48",
        ],
        2 * (4 + 3) + 2,
        0,
    ),
    "revised_gqa": (
        [
            "model.block=hourglass",
            "model.K=2",
            "model.d_h=16",
            "model.n_heads=4",
            "model.n_kv_heads=1",
            "model.head_dim=16",
            "model.qk_norm=true",
        ],
        2 * 4 + 2 * 3,
        2 * 3,
    ),
}


def _spec(tmp_path, shape, *extra):
    return load_and_resolve(BASELINE, tiny_overrides(tmp_path, *SHAPES[shape][0], *extra))


def _emulated(recipe="tensorwise"):
    from olmo_core.float8 import AOFloat8LinearRecipe

    from olmo_patches.nn.float8 import ShapeFloat8Config

    return ShapeFloat8Config(ao_recipe=AOFloat8LinearRecipe(recipe), emulate=True)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_attention_and_ffn_matmul_converts(tmp_path, shape):
    spec = _spec(tmp_path, shape, "train.float8=tensorwise")
    model = spec.model.build(vocab_size(spec)).build()
    model.init_weights(device=torch.device("cpu"))
    model.apply_fp8(_emulated())
    _, modules, stacked = SHAPES[shape]
    f8 = [n for n, m in model.named_modules() if isinstance(m, Float8Linear)]
    f8_stacked = [n for n, m in model.named_modules() if getattr(m, "float8", None) is not None]
    assert len(f8) + len(f8_stacked) == modules and len(f8_stacked) == stacked, (f8, f8_stacked)
    assert not isinstance(model.lm_head.w_out, Float8Linear) and isinstance(
        model.embeddings, nn.Embedding
    )
    # The count the dry run prints: every attention and FFN weight (and the resizes) in float8.
    from olmo_patches.report.counts import count, float8_report

    b, f = count(spec), float8_report(spec)
    # on a GPU (an H100 here) these toy matmuls stay bf16: below torchao's size floor
    assert f["float8_params"] == 0 and f["float8_unaligned"] == []
    assert f["float8_kept_params"] == b.attention + b.ffn + b.resize
    with torch.no_grad():
        assert torch.isfinite(model(torch.randint(0, 64, (2, 16)))).all()


def _cast(t: torch.Tensor, dtype=torch.float8_e4m3fn) -> torch.Tensor:
    """Tensorwise float8 as torchao defines it: scale = max / amax (fp32), round to the format,
    saturated; returned dequantized."""
    big = torch.finfo(dtype).max
    scale = (big / t.detach().abs().max().double().clamp_min(1e-12)).float()
    return (t.float() * scale).clamp(-big, big).to(dtype).float() / scale


def test_stacked_sub_mlps_cast_each_stack_once():
    """The hourglass FFN in float8 (emulated, tensorwise) = the equations with every matmul input
    cast on its own and each stacked weight cast once, one scale for its K maps (not one per map):
    the forward against that reference; gradients reach every map, within float8's rounding of the
    high-precision ones."""
    from olmo_core.nn.layer_norm import LayerNormConfig

    from olmo_patches.nn.hourglass import HourglassFeedForward

    torch.manual_seed(0)
    K, d, d_h = 3, 32, 16
    ffn = HourglassFeedForward(d_model=d, d_h=d_h, K=K, layer_norm=LayerNormConfig(name="rms"))
    for p in ffn.parameters():
        nn.init.normal_(p, 0, 0.2)
    with torch.no_grad():
        for w in (ffn.w1, ffn.w3, ffn.w2):
            w.stacked[0] *= 0.3  # each map's own amax would give it another scale
    hp = copy.deepcopy(ffn)
    for m in (ffn.w1, ffn.w3, ffn.w2):
        m.to_float8(Float8LinearConfig(emulate=True))

    def reference(x, per_map: bool):
        W = [
            torch.stack([_cast(w.stacked[i]) for i in range(K)]) if per_map else _cast(w.stacked)
            for w in (hp.w1, hp.w3, hp.w2)
        ]
        h = x
        for i in range(K):
            n = _cast(hp.norms[i](h))
            s = F.silu(n @ W[0][i].T) * (n @ W[1][i].T)
            h = h + _cast(s) @ W[2][i].T
        return h

    x = torch.randn(4, 8, d)
    got = ffn(x)
    torch.testing.assert_close(got, reference(x, per_map=False), rtol=1e-5, atol=1e-5)
    assert (got - reference(x, per_map=True)).abs().max() > 1e-4
    got.square().sum().backward()
    hp(x).square().sum().backward()
    for w, ref in zip((ffn.w1, ffn.w3, ffn.w2), (hp.w1, hp.w3, hp.w2)):
        for i in range(K):
            g, r = w.weight.grad.view_as(w.stacked)[i], ref.weight.grad.view_as(ref.stacked)[i]
            assert (g - r).norm() / r.norm() < 4 * 2.0**-4


def _losses(run):
    return [
        m["train/CE loss"] for _, m in sorted(read_metrics(run).items()) if "train/CE loss" in m
    ]


RUN = ["train.max_steps=4", "run.save_interval=2", "run.ephemeral_save_interval=null"]


def _check_close(fp32_run, f8_run, steps=(2, 4)):
    """4 steps: float8 (emulated) losses within 5% of fp32's, not identical; every checkpoint
    finite."""
    fp32, f8 = _losses(fp32_run), _losses(f8_run)
    assert len(fp32) == len(f8) == 4 and fp32 != f8
    assert all(abs(a - b) <= 0.05 * a for a, b in zip(fp32, f8)), (fp32, f8)
    for step in steps:
        assert all(
            torch.isfinite(w).all() for w in load_model_state(f8_run / f"step{step}").values()
        )


@pytest.fixture(scope="module")
def hourglass_runs(tmp_path_factory, demo_corpus):
    """The tiny hourglass (K=2), 4 steps in fp32 and in float8 (tensorwise), checkpoints at 2 and
    4."""
    root = tmp_path_factory.mktemp("float8")
    train(_spec(root / "fp32", "hourglass", *RUN))
    train(_spec(root / "f8", "hourglass", *RUN, "train.float8=tensorwise"))
    return root


@pytest.mark.parametrize(
    "shape, recipe", [("baseline", "rowwise"), ("variable_width", "tensorwise")]
)
def test_float8_losses_within_5_percent_of_fp32(tmp_path, demo_corpus, shape, recipe):
    train(_spec(tmp_path / "fp32", shape, *RUN))
    train(_spec(tmp_path / "f8", shape, *RUN, f"train.float8={recipe}"))
    _check_close(tmp_path / "fp32", tmp_path / "f8")


def test_hourglass_float8_losses_within_5_percent_of_fp32(hourglass_runs):
    _check_close(hourglass_runs / "fp32", hourglass_runs / "f8")


def test_float8_stop_and_resume_is_bit_exact(tmp_path, hourglass_runs):
    resumed = tmp_path / "resumed"
    train(_spec(resumed, "hourglass", *RUN, "train.float8=tensorwise", "run.stop_at_step=2"))
    train(_spec(resumed, "hourglass", *RUN, "train.float8=tensorwise"))
    straight = hourglass_runs / "f8"
    assert _losses(straight) == _losses(resumed) and len(_losses(straight)) == 4
    a, b = load_model_state(straight / "step4"), load_model_state(resumed / "step4")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_fsdp_two_ranks_with_float8_all_gather(tmp_path, hourglass_runs):
    """torchrun x2 (gloo, FSDP2), tensorwise: OLMo-core's float8 all-gather of the linears' weights
    (precomputed scales); losses within 5% of one fp32 process's, the checkpoints finite."""
    overrides = tiny_overrides(
        tmp_path / "fsdp", *SHAPES["hourglass"][0], *RUN, "train.float8=tensorwise"
    )
    r = ranks(2, "train.py", str(BASELINE), *overrides)
    assert r.returncode == 0, r.stderr[-3000:]
    config = json.loads((tmp_path / "fsdp" / "step4" / "config.json").read_text())
    assert config["train_module"]["float8_config"]["ao"]["enable_fsdp_float8_all_gather"] is True
    _check_close(hourglass_runs / "fp32", tmp_path / "fsdp")


def test_hf_export_of_a_float8_run_is_its_high_precision_weights(
    tmp_path, demo_corpus, hourglass_runs
):
    """The checkpoint of a float8 run holds the high-precision weights: the exported model's logits
    are OLMo-core's (no float8) forward with them."""
    from transformers import AutoModelForCausalLM

    step = hourglass_runs / "f8" / "step4"
    out = tmp_path / "hf"
    r = run_in_process(
        "export_hf.py", str(step), str(out), "--tokenizer", str(demo_corpus.tokenizer_file)
    )
    assert r.returncode == 0, r.stderr[-3000:]
    spec = _spec(tmp_path, "hourglass")
    reference = spec.model.build(vocab_size(spec)).build()
    reference.load_state_dict(load_model_state(step))
    hf = AutoModelForCausalLM.from_pretrained(
        out, trust_remote_code=True, torch_dtype=torch.float32
    ).eval()
    ids = torch.randint(0, 4096, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (hf(ids).logits - reference.eval()(ids)).abs().max().item() < 1e-4


@pytest.mark.parametrize(
    "config, value, message",
    [
        (BASELINE, "fp8", "choose one of off, tensorwise, rowwise, rowwise_with_gw_hp"),
        (
            REPO / "configs" / "paper2" / "3B-MoE" / "x.yaml",
            "rowwise",
            "float8 MoE experts are not supported (torchao converts nn.Linear, "
            "not OLMo-core's grouped experts)",
        ),
    ],
)
def test_bad_float8_choices_are_one_line(config, value, message):
    with pytest.raises(ConfigError) as e:
        load_and_resolve(config, [f"train.float8={value}"])
    assert str(e.value) == f"command line: train.float8={value}: {message}"


def test_float8_without_torchao_is_one_line(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(
        sys.modules, "torchao.float8", None
    )  # import fails as if torchao were missing
    with pytest.raises(ConfigError) as e:
        load_and_resolve(BASELINE, tiny_overrides(tmp_path, "train.float8=tensorwise"))
    assert (
        str(e.value)
        == "command line: train.float8=tensorwise: needs torchao: pip install -e '.[float8]'"
    )
    assert load_and_resolve(BASELINE, tiny_overrides(tmp_path)).train.float8 == "off"


def test_unaligned_shapes_stay_high_precision_and_are_counted(tmp_path):
    """d_h = 24 (not a multiple of 16): the stacked FFN weights stay in high precision, named and
    counted."""
    from olmo_patches.report.counts import count, float8_report

    spec = load_and_resolve(
        BASELINE,
        tiny_overrides(
            tmp_path,
            "model.block=hourglass",
            "model.K=2",
            "model.d_h=24",
            "train.float8=tensorwise",
        ),
    )
    f, b = float8_report(spec), count(spec)
    assert f["float8_unaligned"] == [
        f"blocks.{i}.feed_forward.{w}" for i in range(2) for w in ("w1", "w3", "w2")
    ]
    assert f["float8_small"] == [
        f"blocks.{i}.attention.{w}" for i in range(2) for w in ("w_q", "w_k", "w_v", "w_out")
    ]
    assert f["float8_kept_params"] == b.attention + b.ffn == b.attention + 2 * 3 * 2 * 32 * 24


def test_memory_model_counts_float8s_weight_and_input_casts():
    """The memory model's float8 terms on the demo hourglass (d_model 128, 4 layers, K 8, d_h 64,
    seq 128): + 1 byte for each of the forward and transposed float8 copies of one block's weights,
    + 1 byte per element of the widest matmul input per token; compiled, its norms do not fold
    (nn/hourglass.py): each sub-MLP keeps its normalised input too, 2 d_model bytes a token."""
    from olmo_patches.launch.memory import estimate

    spec = load_and_resolve(REPO / "configs" / "demo" / "hourglass.yaml")
    d, K, d_h, s = 128, 8, 64, 128
    block = (
        4 * d * d + d + K * (3 * d * d_h + d)
    )  # attention, its norm, K sub-MLPs with their norms
    base, f8 = estimate(spec, s), estimate(spec, s, float8=True)
    for m in (1, 3):
        b, f = base.terms(m), f8.terms(m)
        assert f["float8 copies"] - b["float8 copies"] == 2 * block + m * s * d
        assert b["hourglass weight copies"] == f["hourglass weight copies"] == 0
        assert all(f[k] == b[k] for k in b if k != "float8 copies")
    base, f8 = estimate(spec, s, compiled=True), estimate(spec, s, float8=True, compiled=True)
    unfolded = s * K * 2 * d  # a sequence, a layer
    b, f = base.terms(1), f8.terms(1)
    assert f["block activations"] - b["block activations"] == 4 * unfolded
    assert f["a block's backward"] - b["a block's backward"] == unfolded


def test_each_matmul_converts_where_its_sizes_win():
    """float8_choice on an H200 at a 65,536-token micro-batch: unaligned dims never; torchao's own
    floor (tensorwise: in <= 4096 and out <= 1024 stay bf16) at any size; the roofline where the
    casts (7 bytes an element of input, output gradient and weight) cost more than the GEMMs save
    (3 M N K at twice the bf16 peak); emulation converts every aligned matmul."""
    from olmo_patches.nn.float8 import float8_choice
    from olmo_patches.shapes.roofline import Roof

    h200, M = Roof(989.5e12, 4.8e12), 65536

    def wins(n, k):  # written from the definition, not imported
        return 3 * M * n * k / 989.5e12 > 7 * (M * k + M * n + n * k) / 4.8e12

    assert float8_choice((678, 1440), M, "tensorwise", h200) == "unaligned"
    assert float8_choice((1024, 4096), 2**20, "tensorwise", h200) == "small"
    assert not wins(576, 1392) and float8_choice((576, 1392), M, "tensorwise", h200) == "small"
    assert wins(2304, 3328) and float8_choice((2304, 3328), M, "tensorwise", h200) == "float8"
    assert float8_choice((2304, 3328), 512, "tensorwise", h200) == "small"  # a tiny micro-batch
    assert float8_choice((128, 128), M, "tensorwise", None) == "float8"  # emulated


def test_ffn_roofline_ratio_bounds():
    """The FFN roofline (shapes/roofline.py): with unlimited bandwidth the hourglass and the SwiGLU
    of equal FLOPs tie; K=1 beats its SwiGLU (the folded norm writes nothing); more sub-MLPs of the
    same total hidden width cost more traffic."""
    from olmo_patches.shapes.roofline import Roof, ffn_roofline_ratio

    h200, M = Roof(989.5e12, 4.8e12), 65536
    assert ffn_roofline_ratio(M, 1440, 2, 678, Roof(989.5e12, 1e30)) == pytest.approx(1.0)
    assert ffn_roofline_ratio(M, 3192, 1, 2752, h200) > 1.0
    ratios = [ffn_roofline_ratio(M, 1536, K, 4096 // K, h200) for K in (1, 2, 4, 8)]
    assert ratios == sorted(ratios, reverse=True) and ratios[-1] < 0.95
