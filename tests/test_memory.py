"""Activation checkpointing modes (train.activation_checkpointing) and the memory model
(launch/memory.py): gradients equal to no checkpointing per block type, the saved tensors and the
loss's bytes measured by torch against the estimate, and the preset choosing a mode where the
estimate says it must."""

import copy

import pytest
import torch
from olmo_core.nn.functional import cross_entropy_loss
from olmo_core.train.train_module.transformer.common import parallelize_model

from olmo_patches.config import ConfigError, vocab_size
from olmo_patches.launch.layout import load_and_resolve, memory_estimate
from olmo_patches.launch.layout import Layout
from olmo_patches.launch.memory import estimate
from olmo_patches.config.spec import ActivationCheckpointing

from . import _parallel_block, _ungated_ffn  # noqa: F401  (kinds of one file each, registered)
from .conftest import REPO

DEMO = REPO / "configs" / "demo" / "baseline.yaml"
SMALL = [
    "model.d_model=64",
    "model.n_heads=4",
    "model.n_layers=4",
    "model.vocab_size=256",
    "data.demo_vocab_size=256",
    "train.hardware=none",
]
BLOCKS = {
    "baseline": [],
    "baseline post": ["model.norm_placement=post"],
    "olmo2": ["model.norm_placement=post", "model.qk_norm=true", "model.n_kv_heads=2"],
    "hourglass": ["model.block=hourglass", "model.K=2", "model.d_h=24"],
    "variable width": [
        "model.block=variable_width",
        "model.widths.schedule=list",
        "model.widths.values=[64,32,32,64]",
    ],
    "variable width hourglass": [
        "model.block=variable_width",
        "model.widths.schedule=list",
        "model.widths.values=[64,32,32,64]",
        "model.ffn=hourglass",
        "model.K=2",
        "model.d_h_ratio=0.5",
    ],
}
KINDS = {"parallel": ["model.block=parallel"], "ungated FFN": ["model.block=ungated"]}
MOE = [
    "model.block=variable_width",
    "model.widths.schedule=list",
    "model.widths.values=[64,32,32,64]",
    "model.moe.num_experts=4",
    "model.moe.top_k=2",
    "model.moe.expert_hidden=16",
]
MODES = [
    "full",
    "selected_blocks:2",
    "selected_modules:blocks.*.feed_forward",
    "selected_modules:blocks.*.attention,blocks.3",
]
SEQ = 16


def _model(overrides, seed=0):
    spec = load_and_resolve(DEMO, [*SMALL, *overrides])
    config = spec.model.build(vocab_size(spec))
    config.init_seed = seed
    model = config.build(init_device="meta")
    model.init_weights(device=torch.device("cpu"), max_seq_len=SEQ)
    return spec, config, model


def _grads(model, ids):
    loss = model(ids[:, :-1], labels=ids[:, 1:]).loss
    loss.backward()
    return {
        n.replace("._checkpoint_wrapped_module", ""): p.grad.clone()
        for n, p in model.named_parameters()
    }


def _checkpointed(model, mode: str):
    """The model as OLMo-core's train module prepares it: its own parallelize_model with the spec's
    ac_config."""
    spec = load_and_resolve(DEMO, [*SMALL, f"train.activation_checkpointing={mode}"])
    ac = spec.train.activation_checkpointing
    return parallelize_model(
        model, world_mesh=None, device=torch.device("cpu"), ac_config=ac.build()
    )


@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_every_mode_keeps_the_gradients(block):
    _, config, model = _model(BLOCKS[block])
    ids = torch.randint(
        0, config.vocab_size, (2, SEQ + 1), generator=torch.Generator().manual_seed(0)
    )
    reference = _grads(copy.deepcopy(model), ids)
    for mode in MODES:
        checkpointed = _checkpointed(copy.deepcopy(model), mode)
        wrapped = [
            n for n, _ in checkpointed.named_modules() if n.endswith("_checkpoint_wrapped_module")
        ]
        assert wrapped, mode  # something was checkpointed
        grads = _grads(checkpointed, ids)
        assert grads.keys() == reference.keys()
        for name, g in grads.items():
            torch.testing.assert_close(
                g, reference[name], rtol=0, atol=1e-7, msg=f"{block} {mode} {name}"
            )


def test_moe_checkpoints_what_olmo_core_allows():
    from olmo_patches.nn import moe

    if not hasattr(moe, "PortableDroplessMoE"):
        pytest.fail("nn/moe.py lost its CPU MoE")
    _, config, model = _model(MOE)
    ids = torch.randint(
        0, config.vocab_size, (2, SEQ + 1), generator=torch.Generator().manual_seed(0)
    )
    reference = _grads(copy.deepcopy(model), ids)
    grads = _grads(_checkpointed(copy.deepcopy(model), "selected_modules:blocks.*.attention"), ids)
    for name, g in grads.items():
        torch.testing.assert_close(g, reference[name], rtol=0, atol=1e-7, msg=name)
    for mode, match in (
        ("true", r"=full: OLMo-core cannot checkpoint MoE blocks whole"),
        ("selected_blocks:2", r"=selected_blocks:2: OLMo-core cannot checkpoint MoE blocks whole"),
        (
            "selected_modules:blocks.*.feed_forward_moe",
            r"\.modules=blocks\.\*\.feed_forward_moe: matches an MoE module",
        ),
    ):
        with pytest.raises(
            ConfigError, match=rf"command line: train\.activation_checkpointing{match}"
        ):
            load_and_resolve(DEMO, [*SMALL, *MOE, f"train.activation_checkpointing={mode}"])


@pytest.mark.parametrize(
    "value, want",
    [
        ("true", "full"),
        ("false", "off"),
        ("null", "off"),
        ("full", "full"),
        ("selected_blocks:3", "selected_blocks:3"),
        ("selected_modules:blocks.*.feed_forward", "selected_modules:blocks.*.feed_forward"),
    ],
)
def test_mode_shorthands(value, want):
    ac = load_and_resolve(
        DEMO, [*SMALL, f"train.activation_checkpointing={value}"]
    ).train.activation_checkpointing
    assert str(ac) == want


def test_mode_mappings_in_files_and_overrides(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text(
        f"extends: {DEMO}\ntrain:\n  activation_checkpointing: {{mode: selected_blocks, "
        "block_interval: 2}\n"
    )
    assert str(load_and_resolve(base, SMALL).train.activation_checkpointing) == "selected_blocks:2"
    child = (
        tmp_path / "child.yaml"
    )  # a later shorthand replaces the whole mode (no block_interval left over)
    child.write_text(f"extends: {base}\ntrain:\n  activation_checkpointing: true\n")
    ac = load_and_resolve(child, SMALL).train.activation_checkpointing
    assert (ac.mode, ac.block_interval) == ("full", None)
    ac = load_and_resolve(
        base, [*SMALL, "train.activation_checkpointing.block_interval=4"]
    ).train.activation_checkpointing
    assert str(ac) == "selected_blocks:4"
    off = tmp_path / "off.yaml"  # YAML reads off as false
    off.write_text(f"extends: {DEMO}\ntrain:\n  activation_checkpointing: {{mode: off}}\n")
    assert str(load_and_resolve(off, SMALL).train.activation_checkpointing) == "off"


@pytest.mark.parametrize(
    "value, match",
    [
        ("bogus", r"train\.activation_checkpointing\.mode=bogus: choose one of off, full"),
        (
            "selected_blocks",
            r"train\.activation_checkpointing\.block_interval=None: mode selected_blocks needs it",
        ),
        ("selected_blocks:0", r"train\.activation_checkpointing\.block_interval=0: must be >= 1"),
        ("selected_blocks:two", r"train\.activation_checkpointing\.block_interval"),
        (
            "selected_modules:blocks.*.mlp",
            r"train\.activation_checkpointing\.modules=blocks\.\*\.mlp: matches no module",
        ),
        ("budget:1.5", r"train\.activation_checkpointing\.budget=1\.5: must be in \[0, 1\]"),
        (
            "budget:0.5",
            r"train\.activation_checkpointing=budget:0\.5: "
            r"the compiler's budget needs train\.compile=true",
        ),
        ("full:2", r"train\.activation_checkpointing\.mode=full:2: choose one of"),
    ],
)
def test_bad_modes_fail_in_one_line(value, match):
    with pytest.raises(ConfigError) as e:
        load_and_resolve(DEMO, [*SMALL, f"train.activation_checkpointing={value}"])
    assert "\n" not in str(e.value) and str(e.value).startswith("command line: ")
    assert e.match(match)


# --- the memory model against torch's own accounting ----------------------------------------------


HOURGLASS = ["model.block=hourglass", "model.d_h=24"]
MOE_KINDS = {
    "MoE": MOE,
    "hourglass experts": [*MOE[:-1], "model.moe.experts=hourglass", "model.K=2", "model.d_h=12"],
}
SAVED = {
    **BLOCKS,
    **KINDS,
    **MOE_KINDS,
    **{f"hourglass K={K}": [*HOURGLASS, f"model.K={K}"] for K in (1, 2, 4)},
}
# (block, stream) compiled: every kind with FSDP2's bf16 stream, the shapes of the GPU check
# (baseline, hourglass) with the fp32 stream of one process's autocast
COMPILED = [
    *((b, "fp32") for b in ("baseline", "hourglass K=2")),
    *((b, "bf16") for b in ("olmo2", "hourglass K=1", "hourglass K=4")),
    *((b, "bf16") for b in ("variable width hourglass", "MoE", "hourglass experts")),
]


def _saved(fn, params) -> list[int]:
    """The sizes of the distinct storages autograd saves for backward while ``fn`` runs, parameters
    excluded."""
    weights = {p.untyped_storage().data_ptr() for p in params}
    saved: dict[int, int] = {}

    @torch.compiler.disable  # called from compiled frames too (an MoE's graph breaks)
    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return list(saved.values())


def _measure(block: str, stream: str, compiled: bool, layers=None):
    """Per layer (all, or those given): the estimate's layer, and the bytes a token and the fixed
    bytes it saves, its input made as a block's is (not a leaf: autocast caches the casts of
    leaves), in bf16 (FSDP2's bf16 parameters and stream: 8 ranks) or under bf16 autocast (fp32
    parameters and stream: one process). Eager: the slope from 1 to 3 sequences. Compiled with
    inductor's decompositions and min-cut partitioner (aot_eager_decomp_partition, the kernels left
    eager), once, on 7 sequences: the storages of a multiple of 7 x SEQ tokens grow with the batch
    (no other size here has a factor 7)."""
    spec, config, model = _model(SAVED[block])
    fp32 = stream == "fp32"
    model = model if fp32 else model.to(torch.bfloat16)
    est = estimate(spec, SEQ, shards=1 if fp32 else 8, compiled=compiled)
    out = []
    for i, module in enumerate(model.blocks.values()):
        if layers is not None and i not in layers:
            continue
        run = torch.compile(module, backend="aot_eager_decomp_partition") if compiled else module
        width = getattr(module, "stream_width", config.d_model)  # variable width: max w_l
        saved = {}
        for batch in (7,) if compiled else (1, 3):
            x = torch.randn(batch, SEQ, width, dtype=torch.float32 if fp32 else torch.bfloat16)
            x = x.requires_grad_() * 1
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=fp32):
                saved[batch] = _saved(lambda: run(x), model.parameters())
        if compiled:
            grows = sum(n for n in saved[7] if n % (7 * SEQ) == 0)
            per_token, fixed = grows / (7 * SEQ), sum(saved[7]) - grows
        else:
            per_token = (sum(saved[3]) - sum(saved[1])) / (2 * SEQ)
            fixed = sum(saved[1]) - per_token * SEQ
        casts = 2 * sum(p.numel() for p in module.parameters()) if fp32 else 0
        out.append((i, est.layers[i], per_token, fixed, casts))
    return spec, out


def _cpu_dispatch(block: str, spec, w: int) -> int:
    """The CPU MoE dispatch's index_add_ keeps its source too (k 2 w), where OLMo-core's scatter
    kernel keeps the expert outputs once (nn/moe.py)."""
    return 2 * w * spec.model.moe.top_k if block in MOE_KINDS else 0


def _fixed_ok(spec, layer, fixed: float, casts: int) -> bool:
    """What does not grow with the batch: RoPE's fp32 sin/cos tables (2 x SEQ x head_dim), the
    weight copies the layer keeps (hourglass experts: their folded gains, in fp32 under autocast)
    and, under autocast, the weights' bf16 casts (within 64 w)."""
    rope = 2 * 4 * SEQ * spec.model.d_model // spec.model.n_heads
    return layer.weight_copy <= fixed <= 2 * layer.weight_copy + rope + casts + 64 * layer.width


@pytest.mark.parametrize("stream", ["bf16", "fp32"])
@pytest.mark.parametrize("block", sorted(SAVED))
def test_saved_tensors_per_block_match_the_estimate(block, stream):
    """Each layer of each block eager, in bf16 and with an fp32 stream: the bytes a token are the
    estimate's A_l, the rest what :func:`_fixed_ok` allows; a kind of one file (tests/_*.py) states
    its own terms."""
    spec, layers = _measure(block, stream, compiled=False)
    for i, layer, per_token, fixed, casts in layers:
        want = layer.saved + _cpu_dispatch(block, spec, layer.width)
        assert per_token == pytest.approx(want, rel=0.01), (block, i)
        assert _fixed_ok(spec, layer, fixed, casts), (block, i, fixed)


@pytest.mark.parametrize("block, stream", COMPILED)
def test_compiled_blocks_save_what_the_partitioner_keeps(block, stream):
    """A layer of each kind compiled as inductor partitions it (the first narrower than the
    stream, where one is): the bytes a token its forward graph hands its backward are the
    estimate's compiled A_l (hourglass: its norms folded into its matmuls)."""
    spec, layers = _measure(block, stream, compiled=True, layers={1})
    for i, layer, per_token, fixed, casts in layers:
        assert per_token == pytest.approx(layer.saved, rel=0.01), (block, stream)
        assert _fixed_ok(spec, layer, fixed, casts), (block, stream, fixed)


def test_loss_saves_what_the_estimate_counts():
    """OLMo-core's fp32 cross-entropy with z-loss on bf16 logits saves 8 bytes per logit (the fp32
    logits and their log-softmax); the estimate's 18 add the backward's two fp32 gradients and their
    bf16 cast. Compiled it keeps the bf16 logits (2, beside a few numbers per row); the estimate's
    4 add their bf16 gradient."""
    V, N = 1024, 64
    logits = torch.randn(N, V, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, V, (N,))

    def loss(logits):
        ce, z = cross_entropy_loss(logits, labels, compute_z_loss=True)
        return ce + z

    compiled = torch.compile(loss, backend="aot_eager_decomp_partition")
    for fn, want in ((loss, 8), (compiled, 2)):
        per_logit = sum(_saved(lambda: fn(logits), [])) / (N * V)
        assert per_logit == pytest.approx(want, rel=0.02)
    spec, config, _ = _model([])
    d = config.d_model
    head = estimate(spec, SEQ).head
    assert head == 8 * d + 4 + 2 * d + (8 + 4 + 4 + 2) * config.vocab_size
    assert estimate(spec, SEQ, compiled=True).head == 2 * d + 4 + 2 * d + 4 * config.vocab_size


def test_checkpointing_modes_order_the_estimate():
    """On the 1B hourglass (8 ranks): full < every 2nd block < every 4th < off, selected modules in
    between, budget between full and off in proportion; and the largest FSDP unit is the LM head."""
    spec = load_and_resolve(REPO / "configs" / "1B" / "hourglass.yaml", ["train.hardware=none"])
    est = memory_estimate(spec, Layout.plan(8))
    V, d = vocab_size(spec), spec.model.d_model
    assert est.buffers == 16 * V * d
    total = {m: est.total(1, ActivationCheckpointing(m)) for m in ("off", "full")}
    for n in (2, 4):
        total[n] = est.total(1, ActivationCheckpointing("selected_blocks", block_interval=n))
    ffn = est.total(
        1, ActivationCheckpointing("selected_modules", modules=["blocks.*.feed_forward"])
    )
    assert total["full"] < total[2] < total[4] < total["off"] and total["full"] < ffn < total["off"]
    half = est.total(1, ActivationCheckpointing("budget", budget=0.5))
    assert half == pytest.approx((total["full"] + total["off"]) / 2)


def test_preset_checkpoints_where_the_estimate_says_it_must(monkeypatch):
    """The 1B hourglass on 8 x 48 GB and 8 x 80 GB: the mode the preset picks is the first of off,
    every 4th, every 2nd, every block in which one sequence fits 85% of the card (compiled, as a
    preset runs)."""
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    path = REPO / "configs" / "1B" / "hourglass.yaml"
    spec = load_and_resolve(path, ["train.hardware=none", "train.compile=true"])
    est = memory_estimate(spec, Layout.plan(8))
    order = [
        ActivationCheckpointing("off"),
        ActivationCheckpointing("selected_blocks", block_interval=4),
        ActivationCheckpointing("selected_blocks", block_interval=2),
        ActivationCheckpointing("full"),
    ]
    for card, gib in (("rtx6000ada", 48.0), ("h100", 80.0)):
        t = load_and_resolve(path, [f"train.hardware={card}", "train.device=auto"]).train
        want = next(m for m in order if est.total(1, m) <= 0.85 * gib * 2**30)
        assert str(t.activation_checkpointing) == str(want), card
        assert est.total(t.micro_batch_size, t.activation_checkpointing) <= 0.85 * gib * 2**30


def test_a_run_recorded_with_a_boolean_resumes_with_any_mode():
    """A run folder's config.yaml from before the modes (``activation_checkpointing: false``)
    against a restart in another mode: the mode may change between restarts, nothing else counts as
    changed."""
    from olmo_patches.config import spec_to_yaml
    from olmo_patches.launch.run_folder import changed_keys

    spec = load_and_resolve(DEMO, [*SMALL, "train.activation_checkpointing=false"])
    recorded = spec_to_yaml(spec).replace(
        "  activation_checkpointing:\n    mode: 'off'\n    block_interval: null\n"
        "    modules: null\n    budget: null\n",
        "  activation_checkpointing: false\n",
    )
    assert "activation_checkpointing: false" in recorded
    assert (
        changed_keys(
            recorded,
            load_and_resolve(DEMO, [*SMALL, "train.activation_checkpointing=selected_blocks:2"]),
        )
        == []
    )
    assert changed_keys(recorded, load_and_resolve(DEMO, [*SMALL, "train.lr=0.1"])) == [
        f"train.lr: {spec.train.lr} -> 0.1"
    ]
