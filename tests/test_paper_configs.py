"""Every shipped config loads and builds; the paper's sizes and matching hold (paper 1,
docs/papers.md)."""

import math
from pathlib import Path

import pytest

from olmo_patches.config import load_spec, vocab_size
from olmo_patches.launch.layout import load_and_resolve
from olmo_patches.report.plan import plan
from olmo_patches.report.counts import count
from olmo_patches.report.scaling import authors_flops_per_token

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(
    p
    for p in (ROOT / "configs").rglob("*.yaml")
    if p.name not in ("base.yaml", "base-revised.yaml", "base-paper2.yaml")
)
SIZES = {
    "113M": 113.2e6,
    "403M": 402.7e6,
    "906M": 906.0e6,
    "1B": 1073.7e6,
}  # paper 1, to the rounding shown
TOKENS = {"113M": 2.5e9, "403M": 7e9, "906M": 18e9, "1B": 21e9}  # paper 1 (docs/papers.md)
ALIGNED_TOLERANCE = 3e-3  # the authors' revised configs match their baselines within 0.3%
UNMATCHED = "k-sweep-unmatched"  # the paper's K ablation: parameters grow with K by design
# The paper's splits (head dims % 8) and the sweeps: within the tightest of the authors' revised
# configs (0.04%; they range to 0.29%) instead of the paper's 0.001%.
AUTHORS_TOLERANCE = 4e-4
AT_AUTHORS_TOLERANCE = {"113M/hourglass.yaml", "113M/hourglass-K4-L6.yaml"}
AUTHORS_FOLDERS = {"width-depth-K2", "width-depth-K4", "d_h-ratio", "k-sweep"}


def rel(p: Path) -> str:
    return str(p.relative_to(ROOT / "configs"))


def closed_form(spec) -> int:
    """Independent of the code under test: paper 1's counting, L (4 d^2 + FFN)."""
    m = spec.model
    ffn = (
        3 * m.K * m.d_model * m.resolved_d_h
        if m.block == "hourglass"
        else 3 * m.d_model * m.resolved_d_ff
    )
    head_dim = (
        m.head_dim or m.d_model // m.n_heads
    )  # Q, O: n_heads head_dim wide; K, V: n_kv_heads head_dim
    attention = 2 * m.d_model * head_dim * (m.n_heads + (m.n_kv_heads or m.n_heads))
    return m.n_layers * (attention + ffn)


def check_variable_width(spec, b, path) -> None:
    """The variable-width paper's rule, written out here: sum_l 16 w_l^2 - waste = 16 L h^2, with
    waste = 3 (w_1 - h) w_1 [w_1 > h] + 4 w_L (w_L - h) [w_L > h]; rounding each w_l to a multiple
    of 32 leaves it within 1% (the paper's own rounding). An MoE (the authors' solver): per layer
    (4 + 3 E r) w^2 + E w (every expert of hidden r w, the router), output waste E r; hourglass
    experts (K sub-MLPs of d_h): the 3 K d_h w weights of a hidden r w = K d_h. The report's compute
    axis, the authors' compute_metrics: 3 x (2 s (h V + the weights a token uses, the k active
    experts, less the idle slices) + 4 s^2 sum w_l) / s."""
    m, V, s = spec.model, vocab_size(spec), spec.data.sequence_length
    w, h, L, e = m.resolved_widths, m.d_model, m.n_layers, m.moe
    hidden = (m.K * m.d_h if e.experts == "hourglass" else e.expert_hidden) if e is not None else 0

    def weights(experts):  # per layer c2 w^2 + c1 w, less the idle slices
        K, G, out = (
            (16, 0, 4)
            if e is None
            else (4 + 3 * experts * hidden / h, e.num_experts, experts * hidden / h)
        )
        waste = 3 * max(w[0] - h, 0) * w[0] + out * w[-1] * max(w[-1] - h, 0)
        return sum(K * x * x + G * x for x in w) - waste, L * (K * h * h + G * h)

    total, target = weights(e.num_experts if e else 0)
    # Paper 2's r_l / r_d grid off its optimum: at 200M (h 640) a multiple of 32 is 5% of h, and
    # the rounded widths land up to 1.9% from the target (the authors' solver rounds the same way).
    tolerance = 0.02 if "ablations" in path.parts else 0.01
    assert abs(total - target) <= tolerance * target
    assert b.attention == sum(4 * x * x for x in w)
    forward = 2 * s * (h * V + weights(e.top_k if e else 0)[0]) + 4 * s * s * sum(w)
    assert authors_flops_per_token(spec) == pytest.approx(3 * forward / s, rel=1e-12)


@pytest.mark.parametrize("path", CONFIGS, ids=rel)
def test_config_loads_builds_and_matches_its_baseline(path):
    spec = load_and_resolve(path)
    b = count(spec)  # builds on the meta device
    V, s = vocab_size(spec), spec.data.sequence_length
    if spec.model.block == "variable_width":
        return check_variable_width(spec, b, path)
    assert b.non_embedding == closed_form(spec)
    # The report's compute axis: 3 x (2 x the weights a token uses, 2 d V, 4 s n_heads head_dim L).
    m = spec.model
    a = m.n_heads * (m.head_dim or m.d_model // m.n_heads)
    forward = 2 * (b.non_embedding - b.inactive) + 2 * m.d_model * V + 4 * s * a * m.n_layers
    assert authors_flops_per_token(spec) == 3 * forward
    size = rel(path).split("/")[0]
    if size not in SIZES or path.name.endswith(
        "-revised.yaml"
    ):  # the authors' later runs: test_attention_width.py
        return
    budget = closed_form(load_and_resolve(ROOT / "configs" / size / "baseline.yaml"))
    if (
        UNMATCHED in path.parts
    ):  # K=1 below the budget, K=8 well above (test_k_sweep_as_the_paper_...)
        return
    # the paper: 0.001%; aligned and head-dim siblings (-hdN: only the heads change): 0.3%
    sibling = path.name.endswith("-aligned.yaml") or path.stem.rpartition("-")[2].startswith("hd")
    tolerance = ALIGNED_TOLERANCE if sibling else 1e-5
    if rel(path) in AT_AUTHORS_TOLERANCE or AUTHORS_FOLDERS & set(path.parts):
        tolerance = AUTHORS_TOLERANCE
        # the splits' head dims flash-attention kernels like; the sweeps' MHA heads even
        assert spec.model.resolved_head_dim % (8 if rel(path) in AT_AUTHORS_TOLERANCE else 2) == 0
    assert abs(b.non_embedding - budget) <= tolerance * budget, (
        f"{rel(path)}: {b.non_embedding} vs {budget}"
    )
    assert spec.train.max_tokens == TOKENS[size]


@pytest.mark.parametrize(
    "exact,sibling",
    [
        ("113M/hourglass-exact.yaml", "113M/hourglass-aligned.yaml"),
        ("113M/hourglass-K4-L6-exact.yaml", "113M/hourglass-K4-L6-aligned.yaml"),
        ("403M/hourglass.yaml", "403M/hourglass-aligned.yaml"),
        ("906M/hourglass.yaml", "906M/hourglass-aligned.yaml"),
    ],
)
def test_each_hourglass_has_an_aligned_sibling(exact, sibling):
    """Beside each exact shape, one GPU matmuls like: d_model, d_h and head_dim multiples of 8, d_h
    of 64, the same K and L, within the authors' 0.3% of the baseline's non-embedding parameters."""
    e = load_and_resolve(ROOT / "configs" / exact).model
    aligned = load_and_resolve(ROOT / "configs" / sibling)
    m = aligned.model
    assert (m.K, m.n_layers) == (e.K, e.n_layers)
    assert m.d_model % 8 == 0 and m.resolved_d_h % 64 == 0 and m.resolved_head_dim % 8 == 0
    budget = closed_form(load_and_resolve(ROOT / "configs" / exact.split("/")[0] / "baseline.yaml"))
    assert abs(closed_form(aligned) - budget) <= ALIGNED_TOLERANCE * budget


@pytest.mark.parametrize("size", SIZES)
def test_baselines_give_the_spec_counts(size):
    spec = load_and_resolve(ROOT / "configs" / size / "baseline.yaml")
    assert round(count(spec).non_embedding / 1e5) == round(SIZES[size] / 1e5)
    assert spec.model.block == "baseline" and spec.model.d_model % spec.model.n_heads == 0


def test_controlled_113M_ffn_equals_baseline_exactly():
    base, hg = (
        count(load_and_resolve(ROOT / "configs/113M" / f))
        for f in ("baseline.yaml", "hourglass-K8-dh384.yaml")
    )
    assert hg.ffn == base.ffn == 12 * 768 * 768 * 12 and hg.attention == base.attention


def test_k_sweep_as_the_paper_parameters_grow_with_K():
    """The paper's K ablation (val PPL 40.153 at K=1 to 32.832 at K=8) grows K on the reallocation
    shape (K=4, L=6: the 35.101 run), not on the controlled one (K=8 there is the 36.179 run)."""
    specs = sorted(
        (load_and_resolve(p) for p in (ROOT / "configs/113M/ablations" / UNMATCHED).glob("*.yaml")),
        key=lambda s: s.model.K,
    )
    assert [s.model.K for s in specs] == list(range(1, 9))
    ffn = [count(s).ffn for s in specs]
    assert ffn == [3 * k * 1368 * 694 * 6 for k in range(1, 9)]
    assert {count(s).attention for s in specs} == {4 * 1368 * 1368 * 6}
    k4 = load_and_resolve(ROOT / "configs/113M/hourglass-K4-L6.yaml").model
    assert (k4.d_model, k4.n_layers, k4.d_h, k4.n_heads) == (
        specs[3].model.d_model,
        6,
        specs[3].model.d_h,
        specs[3].model.n_heads,
    )


@pytest.mark.parametrize(
    "name,K,L,attention,ffn",
    [("hourglass-K4-L6.yaml", 4, 6, 45e6, 68e6), ("hourglass.yaml", 2, 8, 66e6, 47e6)],
)
def test_the_papers_splits(name, K, L, attention, ffn):
    """The reallocation run (K=4, L=6: attention about 45M, FFN about 68M) and the headline run
    (66M/47M, K=2 at the paper's K=2 optimum d_model/L 180): each within 0.5M of the paper's split,
    within 0.1% of the baseline's non-embedding parameters, at a head dim that is a multiple of
    8."""
    spec = load_and_resolve(ROOT / "configs/113M" / name)
    b, m = count(spec), spec.model
    assert (m.K, m.n_layers) == (K, L)
    assert abs(b.attention - attention) <= 0.5e6 and abs(b.ffn - ffn) <= 0.5e6, (b.attention, b.ffn)
    assert abs(b.non_embedding - 113_246_208) <= 1e-3 * 113_246_208
    assert (m.d_model // m.n_heads) % 8 == 0
    if K == 2:
        assert abs(m.d_model / m.n_layers - 180) <= 5


def test_sweeps_sample_the_papers_floors():
    """The U-curves have points at and on both sides of their floors (K=2 near d_model/L 180, K=4
    near 110); the d_h/d_model sweep runs at L=12 with points between 0.4 and 0.55."""

    def shapes(folder):
        return [
            load_and_resolve(p).model
            for p in sorted((ROOT / "configs/113M/ablations" / folder).glob("*.yaml"))
        ]

    for folder, floor in (("width-depth-K2", 180), ("width-depth-K4", 110)):
        ratios = sorted(m.d_model / m.n_layers for m in shapes(folder))
        assert any(abs(r / floor - 1) < 0.05 for r in ratios), (folder, ratios)
        assert (
            sum(r < floor * 0.95 for r in ratios) >= 2
            and sum(r > floor * 1.05 for r in ratios) >= 2
        ), (folder, ratios)
        assert ratios[0] < 100 and ratios[-1] > 250  # the paper's 50-300 range, both ends of the U
    dh = shapes("d_h-ratio")
    assert {m.n_layers for m in dh} == {12} and {m.K for m in dh} == {4}
    ratios = sorted(m.d_h / m.d_model for m in dh)
    assert sum(0.4 <= r <= 0.55 for r in ratios) >= 2 and ratios[0] < 0.15 and ratios[-1] > 0.75, (
        ratios
    )


def heads(d_model: int) -> int:
    """Paper 1's standard MHA as the headline configs take it, written here: the head dim an even
    divisor of d_model in 48-256, a multiple of 8 where one is, nearest 64 (128 from 2048)."""
    dims = [h for h in range(48, 257, 2) if d_model % h == 0]
    dims = [h for h in dims if h % 8 == 0] or dims
    target = 64 if d_model < 2048 else 128
    return d_model // min(dims, key=lambda h: (abs(h - target), -h))


def test_the_hourglass_experts_cost_their_twins_flops():
    """Hourglass experts of K d_h = the SwiGLU experts' hidden size: the x shape's weights, so its
    7,961,458,299 FLOPs a token on the authors' count (not the 8,398,145,280 of a count with one
    attention width for every layer and the idle slices computed)."""
    for name in ("x.yaml", "x-hourglass-experts.yaml"):
        spec = load_and_resolve(ROOT / "configs/paper2/3B-MoE" / name)
        assert round(authors_flops_per_token(spec)) == 7_961_458_299, name


def test_every_hourglass_config_has_one_head_rule():
    """Standard MHA in every hourglass config of paper 1's sizes but 403M's aligned one (23 x 96 on
    2240, a native flash-attention head dim; the authors' revised configs free the attention width
    as their code does) and the head-dim siblings (-hdN: a native head dim, all else the
    original's); the K ablation, which changes only K, keeps the reallocation run's d_model and
    heads."""
    for path in CONFIGS:
        if (
            path.name.startswith("hourglass")
            and "revised" not in path.name
            and "demo" not in path.parts
        ):
            m = load_spec(path).model
            if path.stem.rpartition("-")[2].startswith("hd"):  # a head-dim sibling: heads only
                o = load_spec(path.with_name("hourglass.yaml")).model
                assert m.head_dim in (64, 96, 128) and f"hd{m.head_dim}" in path.stem
                assert (m.d_model, m.K, m.d_h, m.n_layers) == (o.d_model, o.K, o.d_h, o.n_layers)
            elif rel(path) != "403M/hourglass-aligned.yaml":
                assert m.head_dim is None and m.n_heads == heads(m.d_model), rel(path)
    k4 = load_and_resolve(ROOT / "configs/113M/hourglass-K4-L6.yaml").model
    for p in (ROOT / "configs/113M/ablations" / UNMATCHED).glob("*.yaml"):
        m = load_and_resolve(p).model
        assert (
            (m.d_model, m.n_heads, m.head_dim, m.n_layers)
            == (k4.d_model, k4.n_heads, k4.head_dim, 6)
            == (1368, 19, None, 6)
        )


def test_d_h_ratio_sweep_has_the_papers_optimum():
    """Paper 1: at K=4, L=12 the best d_h/d_model is near 0.4; the sweep has a point within 0.005 of
    0.40, matched within the authors' 0.04% (closed form, written here)."""
    near = []
    for p in (ROOT / "configs/113M/ablations/d_h-ratio").glob("*.yaml"):
        spec = load_and_resolve(p)
        m = spec.model
        if abs(m.d_h / m.d_model - 0.40) <= 0.005:
            near.append(rel(p))
            assert (m.K, m.n_layers) == (4, 12)
            assert abs(closed_form(spec) - 113_246_208) <= AUTHORS_TOLERANCE * 113_246_208
    assert len(near) == 1, near


@pytest.mark.slow
def test_sweep_folders_reproduce_from_one_command(tmp_path):
    """scripts/make_sweeps.py rewrites a sweep folder byte for byte (here the K sweep, fixed shapes:
    fast)."""
    import shutil

    from .conftest import run_in_process

    for name in ("base.yaml", "113M/baseline.yaml"):  # the sweep's baseline and what it extends
        (tmp_path / "configs" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "configs" / name, tmp_path / "configs" / name)
    shutil.copytree(
        ROOT / "configs/113M/ablations/k-sweep-unmatched",
        tmp_path / "configs/113M/ablations/k-sweep-unmatched",
    )
    folder = "configs/113M/ablations/k-sweep-unmatched"
    for p in (tmp_path / folder).glob("*.yaml"):
        p.write_text("stale\n")
    (tmp_path / folder / "hourglass-K9-stale.yaml").write_text("stale\n")
    r = run_in_process("make_sweeps.py", folder, "--root", str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    shipped = {p.name: p.read_text() for p in (ROOT / folder).glob("*.yaml")}
    assert {p.name: p.read_text() for p in (tmp_path / folder).glob("*.yaml")} == shipped and len(
        shipped
    ) == 8


def test_paper2_width_grid_brackets_the_optimum():
    """Paper 2's Figure 3 grid at 200M, 500M and 1B: r_l and r_d on both sides of the optimum (0.75,
    0.3), each config the size's x config with only r_l and r_d changed."""
    grid = ROOT / "configs/paper2/ablations/r_l-r_d"
    for size in ("200M", "500M", "1B"):
        x = load_and_resolve(ROOT / "configs/paper2" / size / "x.yaml").model
        points = set()
        for p in grid.joinpath(size).glob("*.yaml"):
            m = load_and_resolve(p).model
            points.add((m.widths.r_l, m.widths.r_d))
            assert (m.d_model, m.n_layers, m.widths.shape, m.widths.multiple) == (
                x.d_model,
                x.n_layers,
                x.widths.shape,
                x.widths.multiple,
            )
        r_ls, r_ds = {p[0] for p in points}, {p[1] for p in points}
        assert (0.75, 0.3) in points and len(points) == len(r_ls) * len(r_ds) >= 9
        assert min(r_ls) < 0.75 < max(r_ls) and min(r_ds) < 0.3 < max(r_ds)


def test_generated_configs_say_how():
    for p in (ROOT / "configs/113M/ablations").rglob("*.yaml"):
        head = p.read_text().splitlines()[:2]
        assert (
            head[0].startswith("# Generated by scripts/search.py")
            and "python scripts/search.py" in head[1]
        ), p
    for p in (ROOT / "configs/paper2/ablations").rglob("*.yaml"):
        assert p.read_text().startswith("# Generated by scripts/make_sweeps.py"), p


def test_olmo2_config_is_the_stage1_recipe():
    s = load_and_resolve(ROOT / "configs/1B/olmo2.yaml")
    m, t, d = s.model, s.train, s.data
    assert (m.d_model, m.n_layers, m.n_heads, m.ffn_ratio * m.d_model) == (2048, 16, 16, 8192)
    assert (
        m.norm_placement == "post"
        and m.qk_norm
        and not m.tie_embeddings
        and m.rope_theta == 500_000
    )
    assert (t.lr, t.warmup_steps, t.schedule_tokens, t.final_lr_ratio) == (4e-4, 4000, 5e12, 0.1)
    assert (t.betas, t.eps, t.weight_decay, t.z_loss, t.max_grad_norm) == (
        [0.9, 0.95],
        1e-8,
        0.1,
        1e-5,
        1.0,
    )
    # The pinned list equals OLMo-core's OLMoE-mix-0824 (tests/test_data_order.py checks that).
    assert (t.global_batch_size, d.sequence_length, d.order_seed, d.source) == (
        512,
        4096,
        6198,
        "olmo2_stage1",
    )
    assert d.instance_filter
    assert t.max_tokens == 21e9


def test_plan_steps_and_gpu_hours():
    spec = load_and_resolve(ROOT / "configs/113M/baseline.yaml")
    p = plan(spec)
    assert p.steps == math.ceil(2.5e9 / (512 * 4096)) == 1193
    assert p.first_files[0].startswith("http://olmo-data.org/preprocessed/")
    # 6 N D rule of thumb (with the LM head and attention it is a little above): within 2x
    approx = 6 * (113_246_208 + 100352 * 768) * 2.5e9
    assert 1.0 < p.total_flops / approx < 2.0
    # The dry run's tokens row: what the run trains, whole steps of the batch, beside the budget.
    from rich.console import Console

    from olmo_patches.report.plan import plan_table

    console = Console(width=200, record=True)
    console.print(plan_table(spec))
    assert (
        f"1,193 x 512 x 4096 = {1193 * 512 * 4096:,} (budget 2,500,000,000)"
        in console.export_text()
    )


@pytest.mark.parametrize("path", CONFIGS, ids=rel)
def test_attention_runs_at_every_width(path):
    """Each distinct layer width's attention (RoPE included) runs a forward: catches shapes that
    count right but cannot run, e.g. odd head dims."""
    import torch

    from olmo_patches.config import vocab_size

    spec = load_and_resolve(path)
    config = spec.model.build(vocab_size(spec))
    widths = {}
    for block in config.resolved_block_configs:
        widths.setdefault(getattr(block, "width", None) or config.d_model, block)
    with torch.no_grad():
        for width, block in widths.items():
            # weights left uninitialised (meta, then empty memory): the input is zeros, only shapes
            # matter
            attention = block.sequence_mixer.build(
                width, layer_idx=0, n_layers=1, init_device="meta"
            ).to_empty(device="cpu")
            x = torch.zeros(1, 4, width)
            assert attention(x).shape == x.shape


def test_paper2_parameter_match_at_the_optimum_and_across_the_grid():
    """Paper 2's parameter rule (sum_l 16 w_l^2 - waste = 16 L h^2, waste as in the config test
    above) after the widths are rounded to multiples of 32: the x configs (r_l 0.75, r_d 0.3) land
    +0.28%, -0.73%, +0.19%, -0.19% from it at 200M-2B; the r_l / r_d grid's worst is +1.91% (200M),
    -0.81% (500M), -0.50% (1B) (docs/variable_width.md states these)."""

    def off(path) -> float:
        m = load_and_resolve(path).model
        w, h, L = m.resolved_widths, m.d_model, m.n_layers
        waste = 3 * max(w[0] - h, 0) * w[0] + 4 * w[-1] * max(w[-1] - h, 0)
        return round(100 * ((sum(16 * x * x for x in w) - waste) / (16 * L * h * h) - 1), 2)

    assert [off(ROOT / "configs/paper2" / s / "x.yaml") for s in ("200M", "500M", "1B", "2B")] == [
        0.28,
        -0.73,
        0.19,
        -0.19,
    ]
    grid = ROOT / "configs/paper2/ablations/r_l-r_d"
    worst = [
        max((off(p) for p in (grid / s).glob("*.yaml")), key=abs) for s in ("200M", "500M", "1B")
    ]
    assert worst == [1.91, -0.81, -0.50]
