"""report/advice.py: the one-line GPU warnings of the dry run and a run's start."""

from pathlib import Path

from olmo_patches.launch.layout import load_and_resolve
from olmo_patches.report.advice import advice

from .conftest import run_in_process

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_unaligned_matmul_dims_are_named_once():
    lines = advice(load_and_resolve(CONFIGS / "113M/hourglass-K4-L6-exact.yaml"))
    # d_model 1314 and d_h 759 are not multiples of 8, nor is the head dim 146 (1314 / 9).
    assert len(lines) == 1 and all(f"{d} (" in lines[0] for d in (759, 1314, 146)), lines
    assert advice(load_and_resolve(CONFIGS / "113M/hourglass-K4-L6-aligned.yaml")) == []


def test_every_layers_unaligned_head_dim_is_named():
    """The 3B MoE's x shape: head dims w_l / 16 (h 1600: 100 at constant width), 190 in its first
    and last layers, 178 in its second, 30 in its narrowest (layer 30)."""
    (line,) = advice(load_and_resolve(CONFIGS / "paper2/3B-MoE/x.yaml", ["train.hardware=h100"]))
    for named in ("190 (head_dim of layers 1, 40)", "178 (head_dim of layer 2)", "30 (head_dim of"):
        assert named in line, line


def test_http_data_slower_than_a_rank_needs(tmp_path):
    # 113M baseline on a B200: 40% x 2250 TFLOP/s / (OLMo-core's ~1.37 GFLOP/token x 4096) ~ 160
    # instances/s per rank, twice the 73 measured over HTTP; the 1B on an H100 needs ~11.
    b200 = advice(load_and_resolve(CONFIGS / "113M/baseline.yaml", ["train.hardware=b200"]))
    assert len(b200) == 1 and "over HTTP" in b200[0] and "73 measured" in b200[0]
    need = float(b200[0].split("needs ")[1].split()[0])
    assert 140 < need < 180
    assert advice(load_and_resolve(CONFIGS / "1B/baseline.yaml", ["train.hardware=h100"])) == []
    local = ["train.hardware=b200", f"data.base={tmp_path}"]  # a local mirror: not HTTP
    assert advice(load_and_resolve(CONFIGS / "113M/baseline.yaml", local)) == []


def test_the_dry_run_prints_each_warning_once():
    r = run_in_process(
        "train.py", str(CONFIGS / "113M/hourglass-exact.yaml"), "train.hardware=b200", "--dry-run"
    )
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2 and "621 (" in warnings[0] and "over HTTP" in warnings[1], warnings


def test_a_warmup_longer_than_the_run_is_one_warning():
    # 20 warmup steps of 3 (steps), then 5 steps of 1,000 warmup tokens at 2 x 32 tokens a step
    # (15.6 steps).
    lines = advice(
        load_and_resolve(
            CONFIGS / "demo/baseline.yaml", ["train.max_steps=3", "train.warmup_steps=20"]
        )
    )
    assert lines == [
        "warning: train.warmup_steps=20 ends after the run's 3 steps: "
        "the learning rate never reaches train.lr"
    ]
    tokens = [
        "train.max_steps=5",
        "train.warmup_steps=null",
        "train.warmup_tokens=1000",
        "train.global_batch_size=2",
        "train.micro_batch_size=1",
        "data.sequence_length=32",
    ]
    assert advice(load_and_resolve(CONFIGS / "demo/baseline.yaml", tokens)) == [
        "warning: train.warmup_tokens=1000 ends after the run's 5 steps: "
        "the learning rate never reaches train.lr"
    ]
    assert (
        advice(
            load_and_resolve(
                CONFIGS / "demo/baseline.yaml", ["train.max_steps=20", "train.warmup_steps=20"]
            )
        )
        == []
    )


def test_the_plan_says_how_often_a_run_reads_its_data(tmp_path, demo_corpus):
    """report/plan.data_passes: tokens trained over the corpus's training tokens (its manifest's
    count); before the corpus is built, that it is not known yet, and the look writes nothing."""
    from olmo_patches.report.plan import data_passes

    held = demo_corpus.n_train_tokens
    steps = 2 * held // (16 * 128) + 7  # just over two passes at 16 x 128 tokens a step
    spec = load_and_resolve(
        CONFIGS / "demo/baseline.yaml",
        [f"data.demo_cache={demo_corpus.root.parent}", f"train.max_steps={steps}"],
    )
    tokens = steps * 16 * 128
    assert (
        data_passes(spec, tokens) == f"{tokens / held:.2f} ({tokens:,} of {held:,} tokens): "
        f"the run reads its data {tokens / held:.1f} times"
    )
    assert data_passes(spec, held // 2).startswith("0.50 (")  # half a pass: no warning
    unbuilt = load_and_resolve(
        CONFIGS / "demo/baseline.yaml", [f"data.demo_cache={tmp_path / 'none'}"]
    )
    assert data_passes(unbuilt, tokens).startswith(
        "not known here (the demo corpus is built at the run's start"
    )
    assert not (tmp_path / "none").exists()
