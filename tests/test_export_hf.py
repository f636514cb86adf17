"""Hugging Face export: logits equal OLMo-core's forward (float32, < 1e-4); generation runs."""

import pytest
import torch

from transformers import AutoModelForCausalLM, Olmo2ForCausalLM  # noqa: E402

from olmo_patches.config import load_spec  # noqa: E402
from olmo_patches.train.resume import load_model_state  # noqa: E402
from olmo_patches.train import train  # noqa: E402

from .conftest import REPO, run_script, tiny_overrides  # noqa: E402

BASELINE = REPO / "configs" / "demo" / "baseline.yaml"
VARIABLE_WIDTH = REPO / "configs" / "demo" / "variable-width.yaml"
VARIANTS = {
    "olmo2": ("baseline", ["model.norm_placement=post", "model.qk_norm=true"], "olmo2"),
    "baseline-pre": ("baseline", [], "custom"),
    "hourglass-pre": ("hourglass", [], "custom"),
    "hourglass-post-qk": ("hourglass", ["model.norm_placement=post", "model.qk_norm=true", "model.K=3"], "custom"),
}
# Variable width (h = 32): w_1 > h (the embedding is zero-padded), a narrowing, a widening (reads
# dims [16, 32) kept from layer 1, zeros, or a learned projection) and w_L < h (the output norm's
# extension to h). muP: the solved x schedule with the paper's multipliers.
WIDTHS = ["model.n_layers=4", "model.widths.schedule=list", "model.widths.values=[48,16,32,24]"]
VW_VARIANTS = {
    "carry_forward": [*WIDTHS, "model.widths.resize=carry_forward"],
    "zero": [*WIDTHS, "model.widths.resize=zero"],
    "learned": [*WIDTHS, "model.widths.resize=learned"],
    "mup-x": ["model.n_layers=4", "model.widths.multiple=4", "model.widths.init=mup"],  # widths [44, 20, 8, 44]
    "hourglass-post-qk-learned": [
        *WIDTHS, "model.widths.resize=learned", "model.ffn=hourglass", "model.K=2", "model.d_h=16",
        "model.norm_placement=post", "model.qk_norm=true",
    ],
}


def _export_and_check(tmp_path, demo_corpus, config, overrides, kind):
    """Train 2 steps, export with the script, then: logits = OLMo-core's forward (float32, < 1e-4),
    and greedy generate() = the argmax continuation of OLMo-core's model."""
    run = tmp_path / "run"
    spec = load_spec(config, [*overrides, "train.max_steps=2", "run.save_interval=1000", "run.ephemeral_save_interval=null"])
    train(spec)
    out = tmp_path / "hf"
    r = run_script("export_hf.py", str(run / "step2"), str(out), "--tokenizer", str(demo_corpus.tokenizer_file))
    assert r.returncode == 0, r.stderr[-3000:]
    assert (out / "modeling_hourglass_olmo.py").exists() == (kind == "custom")
    # The exported tokenizer, loaded back by transformers, encodes and decodes as the run's own file.
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    text = "def f(x):\n    return x + 1  # é\n"
    tok, ids = AutoTokenizer.from_pretrained(out), Tokenizer.from_file(str(demo_corpus.tokenizer_file)).encode(text).ids
    assert tok(text)["input_ids"] == ids and len(ids) > 5 and tok.decode(ids) == Tokenizer.from_file(str(demo_corpus.tokenizer_file)).decode(ids)

    reference = spec.model.build(vocab_size=4096).build(init_device="cpu")
    reference.load_state_dict(load_model_state(run / "step2"))
    reference.eval()
    hf = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True, torch_dtype=torch.float32).eval()
    assert isinstance(hf, Olmo2ForCausalLM) == (kind == "olmo2")
    ids = torch.randint(0, 4096, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = reference(ids), hf(ids).logits
    assert got.shape == want.shape
    assert (got - want).abs().max().item() < 1e-4
    generated = hf.generate(ids[:1, :8], max_new_tokens=4, do_sample=False)
    assert generated.shape == (1, 12) and torch.equal(generated[0, :8], ids[0, :8])
    # Greedy continuation = argmax of the reference model's logits, token by token.
    seq = ids[:1, :8]
    for _ in range(4):
        with torch.no_grad():
            seq = torch.cat([seq, reference(seq)[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(generated, seq)
    return hf


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_export_matches_olmo_core(tmp_path, demo_corpus, variant):
    block, extra, kind = VARIANTS[variant]
    _export_and_check(tmp_path, demo_corpus, BASELINE, tiny_overrides(tmp_path / "run", *extra, block=block), kind)


@pytest.mark.parametrize("variant", sorted(VW_VARIANTS))
def test_variable_width_export_matches_olmo_core(tmp_path, demo_corpus, variant):
    spec_overrides = tiny_overrides(tmp_path / "run", *VW_VARIANTS[variant])
    hf = _export_and_check(tmp_path, demo_corpus, VARIABLE_WIDTH, spec_overrides, "custom")
    spec = load_spec(VARIABLE_WIDTH, spec_overrides)
    assert hf.config.widths == spec.model.resolved_widths
    if variant.startswith("mup"):  # the paper's multipliers reached the exported config
        w = spec.model.widths
        assert (hf.config.embed_scale, hf.config.residual_scale, hf.config.logit_scale) == (w.m_emb, w.m_residual, 1 / w.m_width)


def test_export_refuses_unknown_checkpoint(tmp_path):
    r = run_script("export_hf.py", str(tmp_path / "nope" / "step1"), str(tmp_path / "out"))
    assert r.returncode == 2 and "export_hf:" in r.stderr
