"""Hardware presets (train.hardware): values from the documented memory estimate, device-name
detection, explicit values winning, and a bad preset name failing at load."""

import functools
from types import SimpleNamespace

import pytest
import torch

from olmo_patches.blocks import block_of
from olmo_patches.config import ConfigError, vocab_size
from olmo_patches.launch.layout import load_and_resolve
from olmo_patches.launch.cards import CARDS, GIB, card_for_device, known_card
from olmo_patches.launch.memory import estimate

from .conftest import REPO, run_script

OLMO2_1B = REPO / "configs" / "1B" / "olmo2.yaml"
PAPER = sorted(
    p
    for p in [*REPO.glob("configs/*/*.yaml"), *REPO.glob("configs/paper2/*/*.yaml")]
    if "demo" not in p.parts
)


@pytest.fixture
def eight_ranks(monkeypatch):
    """What torchrun --nproc-per-node 8 sets; and no GPU, whatever the machine has."""
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def _norm(w):
    # RMSNorm compiled (as every GPU preset runs): inductor keeps its bf16 input and the rsqrt
    return 2 * w + 4


def test_estimate_by_hand_for_olmo2_1b(eight_ranks):
    """The docstring's compiled formula with OLMo-2 1B's numbers written out (d 2048, L 16, 16
    heads, SwiGLU 8192, V 100352, s 4096, QK-norm, untied), and the micro-batch each card gets from
    it."""
    d, L, n_h, H, V, s = 2048, 16, 16, 8192, 100352, 4096
    block = 4 * d * d + 3 * d * H + 4 * d  # attention, SwiGLU, q/k norms and the two block norms
    P = 2 * V * d + L * block + d  # embeddings, LM head, blocks, final norm
    assert P == 1_484_916_736
    static = 16 * P / 8 + 16 * V * d  # the LM head (V d) is the largest FSDP unit
    A = (
        2 * _norm(d) + 2 * d + 8 * d + 4 * n_h + 2 * _norm(d) + 2 * d + 6 * H
    )  # norms, attention, QK-norm, SwiGLU (SiLU recomputed)
    # the layers, the last one's backward (its gradients: A again), the head (bf16 logits, their
    # bf16 gradient)
    per_seq = s * (L * A + A + _norm(d) + 2 * d + 4 * V)
    spec = load_and_resolve(OLMO2_1B, ["train.hardware=h100"])
    est = estimate(spec, s, shards=8, compiled=True)
    est_static = est.states + est.buffers
    assert est_static == pytest.approx(static) and est.total(1) - est_static == pytest.approx(
        per_seq
    )
    for card, want in (("rtx6000ada", 4), ("h100", 8), ("b200", 16)):
        usable = 0.85 * CARDS[card].memory_gib * GIB
        assert (
            static + want * per_seq <= usable < static + 2 * want * per_seq
        )  # the largest divisor of 64 that fits
        t = load_and_resolve(OLMO2_1B, [f"train.hardware={card}"]).train
        assert (t.micro_batch_size, str(t.activation_checkpointing), t.compile) == (
            want,
            "off",
            True,
        )


def _moe(block, w):
    """An MoE's bytes a token compiled and its weight copies: the router (its fp32 input, fp32
    scores, top-k weights and indices, the dispatch's indices and gates), then per routed expert its
    input and output (2 w each) and its SwiGLU's w1, w3, product (6 I), or per hourglass sub-MLP
    z, 1/rms, and a, b, their fp32 scalings, SiLU and product (2 w + 4 + 18 d_h) with its folded
    gains' weight copies (2 of E d_h w in bf16)."""
    moe = block.feed_forward_moe
    mlp, E, k = moe.experts.mlp, moe.router.num_experts, moe.top_k
    router = 4 * w + 4 * (E + 1) + 30 * k
    if not hasattr(mlp, "K"):
        return router + k * (4 * w + 6 * mlp.hidden_size), 0
    K, d_h = mlp.K, mlp.hidden_size
    return router + k * (2 * w + K * (2 * w + 4 + 18 * d_h)), K * 2 * 2 * E * d_h * w


def _view(block, w):
    """A variable-width layer keeps the wider tensor its input is a slice of (its input kept)."""
    mode, S, w_in = str(getattr(block, "resize_mode", "")), getattr(block, "stream_width", w), 0
    w_in = getattr(block, "in_width", w)
    if mode in ("zero", "learned") and w_in < w:
        return 0
    return 2 * ((w_in if mode == "learned" else S) - w)


@functools.cache
def _memory_model(path):
    """(static bytes, per-layer (A_l bytes per token, attention's part, w_l, weight copy), head
    bytes per token, sequence length, per-rank batch, MoE) of the docstring's memory model for 8
    ranks, compiled as the presets run, computed here from the built model's own modules (parameter
    counts and weight shapes), not through memory.estimate()."""
    spec = load_and_resolve(path)
    model = spec.model.build(vocab_size(spec)).build(init_device="meta")
    P = sum(p.numel() for p in model.parameters())
    layers = []
    for block in model.blocks.values():
        att = block.attention
        w, a = att.w_q.in_features, att.w_q.out_features
        attention = (
            2 * w
            + 8 * a
            + 4 * att.n_heads
            + (_norm(a) + _norm(att.w_k.out_features) if att.q_norm is not None else 0)
        )
        copy = 0
        if hasattr(block, "feed_forward_moe"):  # MoE: no norms of their own but hourglass ones
            (ffn, copy), norms = _moe(block, w), 2 * _norm(w)
        else:
            w1 = getattr(block.feed_forward.w1, "stacked", block.feed_forward.w1.weight)
            if w1.ndim == 3:  # hourglass (K, d_h, w): a norm per sub-MLP, folded where pre-norm
                K, H = w1.shape[0], w1.shape[1]
                fold = str(block.feed_forward.norm_placement) == "pre"
                ffn, norms = K * (_norm(w) + (0 if fold else 2 * w) + 6 * H), _norm(w)
            else:
                ffn, norms = 2 * w + 6 * w1.shape[0], 2 * _norm(w)
        layers.append((norms + _view(block, w) + attention + ffn, attention, w, copy))
    V, d = model.embeddings.weight.shape
    units = max([sum(p.numel() for p in b.parameters()) for b in model.blocks.values()] + [V * d])
    static = 16 * P / 8 + 16 * units
    head = _norm(d) + 2 * d + 4 * V
    return (
        static,
        tuple(layers),
        head,
        spec.data.sequence_length,
        spec.train.global_batch_size // 8,
        block_of(spec.model).routed_experts(spec.model),
    )


def _total(path, micro, mode, n=None):
    """The model's bytes at a micro-batch in mode off | blocks (every n-th block, n=1: full) |
    attention; a block's backward holds its gradients, its A again."""
    static, layers, head, s, _, _ = _memory_model(path)
    head += max(A for A, *_ in layers)
    if mode == "off":
        return static + sum(c for *_, c in layers) + micro * s * (sum(A for A, *_ in layers) + head)
    if mode == "attention":  # selected_modules blocks.*.attention: its input (2 w) kept instead
        kept = sum(A - att + 2 * w for A, att, w, _ in layers) + max(att for _, att, _, _ in layers)
        return static + sum(c for *_, c in layers) + micro * s * (kept + head)
    ckpt = [i % n == 0 for i in range(len(layers))]
    kept = sum(2 * w if c else A for (A, _, w, _), c in zip(layers, ckpt)) + max(
        A for (A, *_), c in zip(layers, ckpt) if c
    )
    copies = sum(copy for (*_, copy), c in zip(layers, ckpt) if not c) + max(
        copy for *_, copy in layers
    )
    return static + copies + micro * s * (kept + head)


def _expected_preset(path, memory_gib: float):
    """(micro-batch, mode): the first mode (off, every 4th block, every 2nd, every block; MoE: off,
    attention) in which one sequence fits 85% of the card, and the largest divisor of the per-rank
    batch that fits in it."""
    *_, per_rank, moe = _memory_model(path)
    modes = (
        [("off", None, "off"), ("attention", None, "selected_modules:blocks.*.attention")]
        if moe
        else [
            ("off", None, "off"),
            ("blocks", 4, "selected_blocks:4"),
            ("blocks", 2, "selected_blocks:2"),
            ("blocks", 1, "full"),
        ]
    )
    for mode, n, name in modes:
        fits = [
            m
            for m in range(1, per_rank + 1)
            if per_rank % m == 0 and _total(path, m, mode, n) <= 0.85 * memory_gib * 2**30
        ]
        if fits:
            return max(fits), name
    return None


# The cards' memory (vendor datasheets), written here: RTX 6000 Ada 48 GB, H100 80 GB, H200 141 GB,
# B200 180 GB.
CARD_GIB = {"rtx6000ada": 48.0, "h100": 80.0, "h200": 141.0, "b200": 180.0}


@pytest.mark.parametrize("card", sorted(CARD_GIB))
def test_every_paper_config_gets_the_memory_models_preset(eight_ranks, card):
    assert CARDS[card].memory_gib == CARD_GIB[card]
    for path in PAPER:
        spec = load_and_resolve(path, [f"train.hardware={card}"])
        t = spec.train
        assert (t.micro_batch_size, str(t.activation_checkpointing)) == _expected_preset(
            path, CARD_GIB[card]
        ), path
        assert t.compile is True and t.global_batch_size // 8 % t.micro_batch_size == 0, path


def test_checkpointing_when_nothing_else_fits(eight_ranks):
    spec = load_and_resolve(OLMO2_1B, ["train.hardware=rtx6000ada", "data.sequence_length=32768"])
    est = estimate(spec, spec.data.sequence_length, shards=8, compiled=True)
    assert est.total(1) > 0.85 * 48 * GIB  # not one sequence without checkpointing
    assert spec.train.activation_checkpointing.enabled and spec.train.micro_batch_size >= 1
    with pytest.raises(ConfigError, match=r"train\.hardware=rtx6000ada: .*does not fit"):
        load_and_resolve(OLMO2_1B, ["train.hardware=rtx6000ada", "data.sequence_length=1048576"])


@pytest.mark.parametrize(
    "name, gib, preset, memory",
    [
        ("NVIDIA RTX 6000 Ada Generation", 47.4, "rtx6000ada", 47.4),
        ("NVIDIA H100 80GB HBM3", 79.1, "h100", 79.1),
        ("NVIDIA H100 NVL", 93.1, "h100", 93.1),  # the H100 preset's chip with its own 94 GB
        ("NVIDIA H100 PCIe", 79.2, "h100", 79.2),
        ("NVIDIA B200", 178.4, "b200", 178.4),
        ("Quadro RTX 6000", 23.6, None, 23.6),  # Turing, not the Ada card
        (
            "NVIDIA H200",
            139.7,
            "h200",
            139.7,
        ),  # never more than the device reports (141 GB nominal)
        ("NVIDIA A100-SXM4-80GB", 79.3, None, 79.3),  # not a preset: sized by its own memory
    ],
)
def test_device_names_map_to_presets(name, gib, preset, memory):
    card = card_for_device(name, gib)
    assert (card.name if card.name in CARDS else None, card.memory_gib) == (preset, memory)


# Dense bf16 peaks (NVIDIA datasheets, the sparse figure / 2), written here: each model at its own.
@pytest.mark.parametrize(
    "name, peak",
    [
        ("NVIDIA H100 80GB HBM3", 989.4e12),
        ("NVIDIA H100 PCIe", 756.0e12),
        ("NVIDIA H100 NVL", 835.5e12),
        ("NVIDIA H200", 989.5e12),
        ("NVIDIA H200 NVL", 835.5e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA L40S", 362.05e12),
        ("NVIDIA H100 SXM5 64GB", None),
        ("Quadro RTX 6000", None),  # not listed: no peak borrowed from a relative
    ],
)
def test_peaks_by_exact_model(name, peak):
    card = known_card(name)
    assert (card.bf16_flops if card else None) == peak


def test_auto_detects_the_gpu(eight_ranks, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda i=0: SimpleNamespace(total_memory=80 * GIB)
    )
    auto, h100 = (
        load_and_resolve(OLMO2_1B, [f"train.hardware={h}"]).train for h in ("auto", "h100")
    )
    assert (auto.micro_batch_size, str(auto.activation_checkpointing), auto.compile) == (
        8,
        "off",
        True,
    )
    assert (h100.micro_batch_size, h100.compile) == (auto.micro_batch_size, auto.compile)
    cpu = load_and_resolve(OLMO2_1B, ["train.device=cpu"]).train  # a CPU run takes no GPU preset
    assert (cpu.micro_batch_size, str(cpu.activation_checkpointing), cpu.compile) == (
        64,
        "off",
        False,
    )


def test_no_preset_without_a_gpu(eight_ranks):
    for hardware in ("auto", "none"):
        t = load_and_resolve(OLMO2_1B, [f"train.hardware={hardware}"]).train
        assert (t.micro_batch_size, str(t.activation_checkpointing), t.compile) == (
            512 // 8,
            "off",
            False,
        )


def test_explicit_values_win(eight_ranks, tmp_path):
    t = load_and_resolve(
        OLMO2_1B, ["train.hardware=h100", "train.micro_batch_size=2", "train.compile=false"]
    ).train
    assert (t.micro_batch_size, t.compile, str(t.activation_checkpointing)) == (2, False, "off")
    # A file's value wins too; the preset still fills the rest around it: 16 sequences of 4096 do
    # not fit 48 GB without checkpointing, so it turns checkpointing on (every block: nothing less
    # fits 16).
    child = tmp_path / "child.yaml"
    child.write_text(
        f"extends: {OLMO2_1B}\ntrain:\n  micro_batch_size: 16\n  hardware: rtx6000ada\n"
    )
    t = load_and_resolve(child).train
    assert (t.micro_batch_size, str(t.activation_checkpointing), t.compile) == (16, "full", True)
    # Explicit checkpointing sizes the micro-batch with it; null on the command line hands a key
    # back.
    t = load_and_resolve(
        child, ["train.micro_batch_size=null", "train.activation_checkpointing=true"]
    ).train
    assert str(t.activation_checkpointing) == "full" and t.micro_batch_size > 2


def test_bad_preset_fails_at_load_in_one_line():
    with pytest.raises(ConfigError) as e:
        load_and_resolve(OLMO2_1B, ["train.hardware=a100"])
    msg = str(e.value)
    assert (
        "\n" not in msg and msg.startswith("command line: train.hardware=a100:") and "h100" in msg
    )
    r = run_script("train.py", str(OLMO2_1B), "train.hardware=a100", "--dry-run", timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "train.hardware=a100" in lines[0]
