"""Kinds that are not the papers', each registered from one file, run through the commands with no
other file changed: the parallel block (tests/_parallel_block.py: another block, OLMo-core's SwiGLU)
and OLMo-core's block with an ungated GELU FFN (tests/_ungated_ffn.py: another FFN). Their forwards
are their equations; count_params, the dry run at 8 ranks, float8, training and an exact resume,
FSDP over 2 gloo ranks as one process, a sweep's report, analyze.py, the config table and the
Hugging Face export (the parallel block's logits; the ungated FFN, which the modeling file lacks,
refused in one line); a kind that lacks a hook a tool needs is refused by that tool in one line
naming the hook."""

import json
import sys

import pytest
import torch
import torch.nn.functional as F

from olmo_patches.blocks import BLOCKS, BlockKind
from olmo_patches.config import ConfigError, load_spec, vocab_size
from olmo_patches.launch.layout import load_and_resolve
from olmo_patches.launch.run_folder import read_metrics
from olmo_patches.train import train

from . import _parallel_block, _ungated_ffn  # noqa: F401  (registered, as HOURGLASS_BLOCKS does)
from .conftest import REPO, TINY, load_weights, ranks, run, run_in_process, tiny_overrides

# end to end: runs trained, processes or ranks started (make test-fast leaves them out)
pytestmark = pytest.mark.slow

BASELINE = REPO / "configs" / "demo" / "baseline.yaml"
KIND = {"parallel": ["model.block=parallel"], "ungated": ["model.block=ungated"]}
UNGATED = KIND["ungated"]
PLUGIN = {"HOURGLASS_BLOCKS": "tests._parallel_block, tests._ungated_ffn"}
D, L, D_FF, SEQ, V = 32, 2, 4 * 32, 32, 4096  # TINY's shape, the demo's vocabulary


def _losses(run_dir):
    return {
        step: m["train/CE loss"]
        for step, m in read_metrics(run_dir).items()
        if "train/CE loss" in m
    }


def test_registered_and_refused_elsewhere():
    """Without HOURGLASS_BLOCKS the kind is unknown, and the line says where a kind comes from; a
    module that is not there is refused in one line naming the variable."""
    assert {"parallel", "ungated"} <= set(BLOCKS)
    with pytest.raises(ConfigError) as e:
        load_spec(BASELINE, ["model.block=gelu"])
    assert str(e.value) == (
        "command line: model.block=gelu: choose one of baseline, hourglass, variable_width, "
        "parallel, ungated (olmo_patches/blocks/), or name the module of your own in "
        "HOURGLASS_BLOCKS"
    )
    count = [sys.executable, "scripts/count_params.py", str(BASELINE), *TINY, *UNGATED]
    r = run(count, HOURGLASS_BLOCKS="tests._parallel_block,tests._ungated")
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "config error: HOURGLASS_BLOCKS: no module 'tests._ungated' to import (the import paths "
        "of your kinds' modules, comma-separated)"
    ]


@pytest.mark.parametrize("kind", KIND)
def test_forward_is_the_kinds_equation(kind):
    """Parallel: y = x + Attn(norm(x)) + FFN(norm(x)), one norm, OLMo-core's SwiGLU; ungated:
    h = x + Attn(norm_1(x)), y = h + W_2 GELU(W_1 norm_2(h)). In float64, from the weights."""
    spec = load_spec(BASELINE, [*TINY, *KIND[kind]])
    model = spec.model_config().build(init_device="cpu").double()
    model.init_weights(device=torch.device("cpu"))
    block = model.blocks["0"]
    x = torch.randn(2, 8, D, dtype=torch.float64)
    n = block.attention_norm(x)
    if kind == "parallel":
        want = x + block.attention(n) + block.feed_forward(n)
        assert not hasattr(block, "feed_forward_norm")
    else:
        h = x + block.attention(n)
        ffn = block.feed_forward
        want = h + F.linear(
            F.gelu(F.linear(block.feed_forward_norm(h), ffn.w1.weight)), ffn.w2.weight
        )
        assert [n for n, _ in ffn.named_parameters()] == ["w1.weight", "w2.weight"]
    torch.testing.assert_close(block(x), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", KIND)
def test_counts_and_dry_run_at_eight_ranks(kind, tmp_path):
    """count_params: attention 4 d^2 L; the FFN 3 d d_ff L (SwiGLU) or 2 d d_ff L (ungated); one
    norm a layer (parallel) or two, and the final one; the authors' FLOPs a token 3 x (2 x those
    weights + 2 d V + 4 s d L). The dry run plans FSDP over 8 ranks, the memory of every card."""
    r = run_in_process("count_params.py", str(BASELINE), *TINY, *KIND[kind], "--json")
    assert r.returncode == 0, r.stderr
    c = json.loads(r.stdout)
    ffn = (3 if kind == "parallel" else 2) * D * D_FF * L
    assert (c["attention"], c["ffn"], c["norm"]) == (
        4 * D * D * L,
        ffn,
        D * ((1 if kind == "parallel" else 2) * L + 1),
    )
    forward = 2 * (4 * D * D * L + ffn) + 2 * D * V + 4 * SEQ * D * L
    assert c["authors_flops_per_token"] == 3 * forward
    eight = [*TINY, *KIND[kind], "train.global_batch_size=16", f"run.save_folder={tmp_path}"]
    eight += ["--nproc-per-node", "8"]
    r = run_in_process("train.py", str(BASELINE), *eight, "--dry-run")
    assert r.returncode == 0 and "8 ranks (1 node x 8)" in r.stdout, r.stderr
    assert r.stdout.count("estimate 0.0 GiB") == 4 and "BlockKind" not in r.stdout


def test_float8_converts_every_ungated_matmul():
    """float8_matmuls finds the six linears a layer (Q, K, V, out; W_1, W_2), all multiples of 16,
    and not the LM head; the memory model's float8 term casts the widest matmul input (the hidden
    d_ff) and one block's weights twice."""
    from olmo_patches.launch.memory import estimate
    from olmo_patches.nn.float8 import float8_matmuls

    spec = load_and_resolve(BASELINE, [*TINY, *UNGATED])
    model = spec.model_config().build(init_device="meta")
    found = float8_matmuls(model)
    linears = ("attention.w_q", "attention.w_k", "attention.w_v", "attention.w_out")
    want = [
        f"blocks.{i}.{m}"
        for i in range(L)
        for m in (*linears, "feed_forward.w1", "feed_forward.w2")
    ]
    assert sorted(found["float8"]) == sorted(want) and found["unaligned"] == found["small"] == []
    f8 = estimate(spec, SEQ, float8=True)
    block = sum(p.numel() for p in model.blocks["0"].parameters())
    assert f8.float8_inputs == D_FF and f8.float8_weights == 2 * block


@pytest.fixture(scope="module")
def straight(tmp_path_factory, demo_corpus):
    """Each kind trained 4 steps, uninterrupted."""
    folders = {kind: tmp_path_factory.mktemp(kind) for kind in KIND}
    for kind, folder in folders.items():
        train(load_and_resolve(BASELINE, tiny_overrides(folder, "train.max_steps=4", *KIND[kind])))
    return folders


def test_trains_and_resumes_exactly(straight, tmp_path):
    resumed = tmp_path / "resumed"
    stopped = tiny_overrides(resumed, "train.max_steps=4", "run.stop_at_step=2", *UNGATED)
    train(load_and_resolve(BASELINE, stopped))
    train(load_and_resolve(BASELINE, tiny_overrides(resumed, "train.max_steps=4", *UNGATED)))
    losses = _losses(straight["ungated"])
    assert sorted(losses) == [1, 2, 3, 4] and losses[4] < losses[1]
    assert losses == _losses(resumed)
    a, b = load_weights(straight["ungated"] / "step4"), load_weights(resumed / "step4")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_fsdp_on_two_gloo_ranks_matches_one_process(straight, tmp_path):
    overrides = tiny_overrides(tmp_path, "train.max_steps=4", *UNGATED)
    r = ranks(2, "train.py", str(BASELINE), *overrides, **PLUGIN)
    assert r.returncode == 0, r.stderr[-3000:]
    one, two = _losses(straight["ungated"]), _losses(tmp_path)
    assert sorted(two) == [1, 2, 3, 4]
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=1e-5), step


def test_sweep_report_and_config_table_have_its_row(straight, tmp_path):
    """The finished run as a sweep's member: its status row, with the validation perplexity of its
    metrics file, and the tables and figures written; its config's row in the config table names
    its FFN as the kind describes it."""
    from olmo_patches.launch.sweep import load_sweep
    from olmo_patches.report.sweep import report

    config = tmp_path / "configs" / "tiny-ungated.yaml"
    config.parent.mkdir()
    config.write_text(
        f"extends: {BASELINE}\nmodel: {{block: ungated}}\n"
        f"run: {{name: tiny-ungated, save_folder: {straight['ungated']}}}\n"
        "train: {max_steps: 4}\n"
    )
    cache = f"data.work_dir={straight['ungated'] / 'cache'}"
    report(load_sweep([str(config.parent)], [*TINY, cache]), tmp_path / "report", figures=True)
    rows = [
        line
        for line in (tmp_path / "report" / "sweep.md").read_text().splitlines()
        if "tiny-ungated" in line
    ]
    val = [
        m["eval/lm/val/PPL"]
        for m in read_metrics(straight["ungated"]).values()
        if "eval/lm/val/PPL" in m
    ][-1]
    assert len(rows) == 1 and "done" in rows[0] and "4/4" in rows[0] and f"{val:.2f}" in rows[0]
    (tmp_path / "configs" / "baseline.yaml").write_text(f"extends: {BASELINE}\n")
    r = run_in_process("config_table.py", str(tmp_path))
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if "tiny-ungated" in line)
    assert "| ungated GELU d_ff " in row and "SwiGLU" not in row


def test_analyze_reads_its_hidden_units(straight, tmp_path):
    """analyze.py on the ungated run: d_ff hidden units a layer (GELU(W_1 x), as the kind hands
    them), a dead fraction and utilisation for each."""
    r = run_in_process(
        "analyze.py", str(straight["ungated"]), "--out", str(tmp_path), "--seq", "16"
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (analysis,) = json.loads((tmp_path / "analysis.json").read_text()).values()
    assert [layer["units"] for layer in analysis["layers"]] == [D_FF] * L
    assert all(layer["utilisation"] is not None for layer in analysis["layers"])


def test_a_kind_without_a_hook_is_refused_by_the_tools_that_need_it(monkeypatch):
    """The ungated FFN without its memory, hidden-unit and export hooks: each tool that depends on
    the FFN's form says which hook it needs, in one line, and counts nothing as a SwiGLU."""
    from olmo_patches.blocks.base import model_memory

    class Bare(BlockKind):
        name = "bare"
        build = _ungated_ffn.Ungated.build

    monkeypatch.setitem(BLOCKS, "bare", Bare())
    spec = load_spec(BASELINE, [*TINY, "model.block=bare"])
    m, built = spec.model, spec.model_config()
    block = built.build(init_device="meta").blocks["0"]
    for call, hook in (
        (lambda: model_memory(m, vocab_size(spec)), "memory_layers"),
        (lambda: Bare().record_hidden(m, block, print), "record_hidden"),
        (lambda: Bare().hf_config(m, built), "hf_config"),
    ):
        with pytest.raises(ConfigError, match=rf"^model.block=bare: .* needs BlockKind.{hook} "):
            call()


def test_hugging_face_export(straight, tmp_path):
    """export_hf of the trained parallel run, loaded by transformers' AutoModelForCausalLM from the
    folder alone (its shipped modeling file, trust_remote_code, local files only): OLMo-core's
    logits on the same tokens (float32, < 1e-4, as tests/test_export_hf.py), in one forward and
    from a cached prefix; each layer has the one norm. The ungated FFN: refused in one line."""
    pytest.importorskip("transformers", reason="the hf extra (pip install -e '.[hf]')")
    from transformers import AutoModelForCausalLM

    r = run_in_process("export_hf.py", str(straight["ungated"] / "step4"), str(tmp_path / "no"))
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].endswith(
        "model.block=ungated: the Hugging Face export (its FFN in the modeling file) needs "
        "BlockKind.hf_config of it (docs/adding_a_block.md)"
    )
    assert not (tmp_path / "no").exists()
    out = tmp_path / "hf"
    r = run_in_process("export_hf.py", str(straight["parallel"] / "step4"), str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    spec = load_spec(straight["parallel"] / "config.yaml")
    reference = spec.model_config().build(init_device="cpu")
    reference.load_state_dict(load_weights(straight["parallel"] / "step4"))
    hf = AutoModelForCausalLM.from_pretrained(
        out, trust_remote_code=True, local_files_only=True, torch_dtype=torch.float32
    )
    assert type(hf).__name__ == "HourglassOlmoForCausalLM"
    assert {
        n.rsplit(".", 2)[-2] for n, _ in hf.named_parameters() if "blocks.0." in n and "norm" in n
    } == {"attention_norm"}
    ids = torch.randint(0, V, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = reference.eval()(ids), hf.eval()(ids).logits
        cache = hf(ids[:, :16], use_cache=True).past_key_values
        rest = hf(ids[:, 16:], past_key_values=cache, use_cache=True).logits
    assert got.shape == want.shape == (2, 24, V)
    assert (got - want).abs().max().item() < 1e-4
    assert (rest - want[:, 16:]).abs().max().item() < 1e-4
