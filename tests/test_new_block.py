"""A block kind that is not the papers', registered from one file (tests/_parallel_block.py), runs
through the commands with no other file changed: its forward is the parallel block's equation, the
counts, the dry run, training, an exact resume, FSDP over 2 gloo ranks as one process, its row in a
sweep's report, and its Hugging Face export's logits."""

import json
import sys

import pytest
import torch

from olmo_patches.blocks import BLOCKS
from olmo_patches.config import load_spec
from olmo_patches.launch.layout import load_and_resolve
from olmo_patches.launch.run_folder import read_metrics
from olmo_patches.train import train

from . import _parallel_block  # noqa: F401  (registers "parallel", as HOURGLASS_BLOCKS does in a child)
from .conftest import REPO, TINY, load_weights, run, run_in_process, run_script, tiny_overrides

BASELINE = REPO / "configs" / "demo" / "baseline.yaml"
PARALLEL = ["model.block=parallel"]
PLUGIN = {"HOURGLASS_BLOCKS": "tests._parallel_block"}


def _losses(run_dir):
    return {
        step: m["train/CE loss"]
        for step, m in read_metrics(run_dir).items()
        if "train/CE loss" in m
    }


def test_registered_and_refused_elsewhere():
    assert "parallel" in BLOCKS
    r = run(
        [sys.executable, "scripts/count_params.py", str(BASELINE), "model.block=parallel", *TINY]
    )  # not imported: unknown
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].endswith(
        "model.block=parallel: choose one of baseline, hourglass, variable_width "
        "(olmo_patches/blocks/)"
    )


def test_forward_is_the_parallel_equation():
    """y = x + Attn(norm(x)) + FFN(norm(x)), one norm per layer, in float64 with OLMo-core's own
    attention and SwiGLU modules."""
    spec = load_spec(BASELINE, [*TINY, *PARALLEL])
    model = spec.model_config().build(init_device="cpu").double()
    model.init_weights(device=torch.device("cpu"))
    block = model.blocks["0"]
    x = torch.randn(2, 8, 32, dtype=torch.float64)
    n = block.attention_norm(x)
    torch.testing.assert_close(
        block(x), x + block.attention(n) + block.feed_forward(n), rtol=0, atol=1e-12
    )
    assert not hasattr(block, "feed_forward_norm")


def test_counts_and_dry_run():
    """count_params: attention 4 d^2 L and the SwiGLU's 3 d d_ff L, as the baseline's; one norm per
    layer instead of two (and the final norm)."""
    r = run_in_process("count_params.py", str(BASELINE), *TINY, *PARALLEL, "--json")
    assert r.returncode == 0, r.stderr
    c = json.loads(r.stdout)
    d, L, d_ff = 32, 2, 4 * 32
    assert (c["attention"], c["ffn"], c["non_embedding"]) == (
        4 * d * d * L,
        3 * d * d_ff * L,
        4 * d * d * L + 3 * d * d_ff * L,
    )
    assert c["norm"] == d * (L + 1)
    r = run_in_process(
        "train.py", str(BASELINE), *TINY, *PARALLEL, "train.max_steps=2", "--dry-run"
    )
    assert r.returncode == 0 and "parallel" in r.stdout, r.stderr


@pytest.fixture(scope="module")
def straight(tmp_path_factory, demo_corpus):
    folder = tmp_path_factory.mktemp("straight")
    train(load_and_resolve(BASELINE, tiny_overrides(folder, "train.max_steps=4", *PARALLEL)))
    return folder


def test_trains_and_resumes_exactly(straight, tmp_path):
    resumed = tmp_path / "resumed"
    train(
        load_and_resolve(
            BASELINE, tiny_overrides(resumed, "train.max_steps=4", "run.stop_at_step=2", *PARALLEL)
        )
    )
    train(
        load_and_resolve(BASELINE, tiny_overrides(resumed, "train.max_steps=4", *PARALLEL))
    )  # resumes from step2
    losses = _losses(straight)
    assert sorted(losses) == [1, 2, 3, 4] and losses[4] < losses[1]
    assert losses == _losses(resumed)
    a, b = load_weights(straight / "step4"), load_weights(resumed / "step4")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_fsdp_on_two_gloo_ranks_matches_one_process(straight, tmp_path):
    overrides = tiny_overrides(tmp_path, "train.max_steps=4", *PARALLEL)
    r = run_script("train.py", str(BASELINE), *overrides, torchrun=2, timeout=600, **PLUGIN)
    assert r.returncode == 0, r.stderr[-3000:]
    one, two = _losses(straight), _losses(tmp_path)
    assert sorted(two) == [1, 2, 3, 4]
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=1e-5), step


def test_sweep_report_has_its_row(straight, tmp_path):
    """The finished run as a sweep's member: its status row, with the validation perplexity of its
    metrics file, and the tables and figures written."""
    from olmo_patches.launch.sweep import load_sweep
    from olmo_patches.report.sweep import report

    config = tmp_path / "configs" / "tiny-parallel.yaml"
    config.parent.mkdir()
    config.write_text(
        f"extends: {BASELINE}\nmodel: {{block: parallel}}\n"
        f"run: {{name: tiny-parallel, save_folder: {straight}}}\ntrain: {{max_steps: 4}}\n"
    )
    members = load_sweep([str(config.parent)], [*TINY, f"data.work_dir={straight / 'cache'}"])
    report(members, tmp_path / "report", figures=True)
    rows = [
        line
        for line in (tmp_path / "report" / "sweep.md").read_text().splitlines()
        if "tiny-parallel" in line
    ]
    val = [m["eval/lm/val/PPL"] for m in read_metrics(straight).values() if "eval/lm/val/PPL" in m][
        -1
    ]
    assert len(rows) == 1 and "done" in rows[0] and "4/4" in rows[0] and f"{val:.2f}" in rows[0], (
        rows
    )


def test_hugging_face_export_gives_olmo_cores_logits(straight, tmp_path):
    """export_hf of the trained run, loaded by transformers' AutoModelForCausalLM from the folder
    alone (its shipped modeling file, trust_remote_code, local files only): OLMo-core's logits on
    the same tokens (float32, < 1e-4, as tests/test_export_hf.py), in one forward and from a cached
    prefix; each layer has the one norm."""
    pytest.importorskip("transformers", reason="the hf extra (pip install -e '.[hf]')")
    from transformers import AutoModelForCausalLM

    out = tmp_path / "hf"
    r = run_in_process("export_hf.py", str(straight / "step4"), str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    spec = load_spec(straight / "config.yaml")
    reference = spec.model_config().build(init_device="cpu")
    reference.load_state_dict(load_weights(straight / "step4"))
    hf = AutoModelForCausalLM.from_pretrained(
        out, trust_remote_code=True, local_files_only=True, torch_dtype=torch.float32
    )
    assert type(hf).__name__ == "HourglassOlmoForCausalLM"
    assert {
        n.rsplit(".", 2)[-2] for n, _ in hf.named_parameters() if "blocks.0." in n and "norm" in n
    } == {"attention_norm"}
    ids = torch.randint(0, 4096, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = reference.eval()(ids), hf.eval()(ids).logits
        cache = hf(ids[:, :16], use_cache=True).past_key_values
        rest = hf(ids[:, 16:], past_key_values=cache, use_cache=True).logits
    assert got.shape == want.shape == (2, 24, 4096)
    assert (got - want).abs().max().item() < 1e-4
    assert (rest - want[:, 16:]).abs().max().item() < 1e-4
