"""Each script's success path on tiny sizes, run as a user runs it (a fresh interpreter on this
checkout), or in this process for count_params.py and train.py (their processes are tested in
test_bad_inputs.py and test_resume.py); counts checked against the papers'
formulas written here."""

import json

import pytest

from .conftest import REPO, run_in_process, run_script, tiny_overrides

# end to end: runs trained, processes or ranks started (make test-fast leaves them out)
pytestmark = pytest.mark.slow

DEMO = REPO / "configs" / "demo"
# tiny_overrides' hourglass: d_model 32, 2 layers, K=2, d_h=16. Per layer attention 4 d^2, hourglass
# FFN 3 K d d_h.
D, L, K, D_H = 32, 2, 2, 16


def test_count_params_json(tmp_path):
    r = run_in_process(
        "count_params.py",
        str(DEMO / "hourglass.yaml"),
        *tiny_overrides(tmp_path, block="hourglass"),
        "--json",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["attention"] == L * 4 * D * D and out["ffn"] == L * 3 * K * D * D_H


def test_train_dry_run_prints_the_resolved_config_and_writes_nothing(tmp_path):
    r = run_in_process(
        "train.py",
        str(DEMO / "hourglass.yaml"),
        *tiny_overrides(tmp_path / "run", block="hourglass"),
        "--dry-run",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert (
        "d_model: 32" in r.stdout
        and "d_h: 16" in r.stdout
        and f"{L * 3 * K * D * D_H:,}" in r.stdout
    )
    # K and V per token: 2 d_model per layer (MHA at head_dim d_model / n_heads); bf16 = 2 bytes, 32
    # tokens.
    assert (
        "KV cache per sequence (bf16, 32 tokens)" in r.stdout
        and f"({L * 2 * D} K and V elements per token)" in r.stdout
    )
    assert not (tmp_path / "run").exists()


def test_config_table_rows(tmp_path):
    size = tmp_path / "113M"
    size.mkdir()
    for name in ("baseline", "hourglass"):
        (size / f"{name}.yaml").write_text(f"extends: {REPO / 'configs' / '113M' / name}.yaml\n")
    r = run_in_process("config_table.py", str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [line for line in r.stdout.splitlines() if line.startswith("| 113M/")]
    assert [row.split("|")[1].strip() for row in rows] == [
        "113M/baseline.yaml",
        "113M/hourglass.yaml",
    ]
    # The paper's 113.2M baseline: 12 layers of 16 d_model^2 (d_model 768), exactly on its own
    # budget.
    assert f"| {12 * 16 * 768 * 768:,} |" in rows[0] and "| +0.00e+00 |" in rows[0]


def test_bench_json_on_tiny_sizes():
    r = run_in_process(
        "bench.py",
        "--scale",
        "demo",
        "--compile",
        "off",
        "--repeats",
        "1",
        "--steps",
        "1",
        "--warmup",
        "0",
        "--seq",
        "32",
        "--batch",
        "2",
        "--optimizer",
        "--json",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    results = json.loads(r.stdout)["results"]
    by_variant = {x["variant"]: x for x in results}
    assert (
        "baseline" in by_variant and len(by_variant) >= 2 and by_variant["baseline"]["ratio"] == 1.0
    )
    assert all(x["tokens_per_s"] > 0 and x["seq_len"] == 32 and x["batch"] == 2 for x in results)
    # The trainer's attention backend on a CPU (OLMo-core's torch SDPA), and AdamW in every step.
    assert all(x["extra"] == {"attention": "torch", "optimizer": "adamw"} for x in results)


def test_demo_script_with_a_tiny_override_set(tmp_path, demo_corpus):
    sets = [a for o in tiny_overrides(tmp_path / "run", "train.max_steps=2") for a in ("--set", o)]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "left_by_an_earlier_demo").write_text("")
    r = run_in_process(
        "demo.py", str(DEMO / "baseline.yaml"), "--out", str(tmp_path / "out"), *sets, "--fresh"
    )
    assert r.returncode == 0, r.stderr[-2000:]
    # --fresh: a new comparison; the earlier folder moved aside whole, nothing deleted
    assert not (tmp_path / "run" / "left_by_an_earlier_demo").exists()
    assert [p.name for p in tmp_path.glob("run.before-*/*")] == ["left_by_an_earlier_demo"]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (
        list(summary) == ["demo-baseline"]
        and summary["demo-baseline"]["train_tokens"] == 2 * 4 * 32
    )
    assert (tmp_path / "out" / "loss_curves.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_data_order_on_tiny_sizes():
    r = run_script(
        "benchmarks/bench_data_order.py",
        "--instances",
        "32",
        "--latency-instances",
        "8",
        "--order-sizes",
        "1000",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "MB/s" in r.stdout


def test_a_script_run_in_process_logs_to_its_own_stderr():
    """config/'s info lines reach the stderr of each in-process run, not the first run's captured
    one."""
    for _ in range(2):
        r = run_in_process(
            "train.py", "configs/demo/baseline.yaml", "--dry-run", "--nproc-per-node", "2"
        )
        assert r.returncode == 0
        assert "train.micro_batch_size=16 > the per-rank batch 8" in r.stderr
