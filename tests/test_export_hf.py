"""Hugging Face export: logits equal OLMo-core's forward (float32, < 1e-4); generation runs."""

import pytest
import torch

pytest.importorskip("transformers", reason="the hf extra (pip install -e '.[hf]')")
from transformers import AutoModelForCausalLM, Olmo2ForCausalLM  # noqa: E402

from olmo_patches.config import load_spec  # noqa: E402
from olmo_patches.launch.layout import load_and_resolve  # noqa: E402
from olmo_patches.train.checkpoints import load_model_state  # noqa: E402
from olmo_patches.train import train  # noqa: E402

from .conftest import REPO, run_in_process, run_script, tiny_overrides  # noqa: E402

# end to end: runs trained, processes or ranks started (make test-fast leaves them out)
pytestmark = pytest.mark.slow

BASELINE = REPO / "configs" / "demo" / "baseline.yaml"
VARIABLE_WIDTH = REPO / "configs" / "demo" / "variable-width.yaml"
VARIANTS = {
    "olmo2": ("baseline", ["model.norm_placement=post", "model.qk_norm=true"], "olmo2"),
    "baseline-pre": ("baseline", [], "custom"),
    "hourglass-pre": ("hourglass", [], "custom"),
    "hourglass-post-qk": (
        "hourglass",
        ["model.norm_placement=post", "model.qk_norm=true", "model.K=3"],
        "custom",
    ),
    # Attention width apart from d_model (2 x 24 = 48 on d_model 32), GQA, Llama-3.1 RoPE scaling
    # (the authors' revised recipe; old context 16 so that the 24-token test sequence spans all
    # three bands).
    "olmo2-gqa-head_dim": (
        "baseline",
        [
            "model.norm_placement=post",
            "model.qk_norm=true",
            "model.n_heads=4",
            "model.n_kv_heads=2",
            "model.head_dim=6",
            "model.d_ff=72",
        ],
        "olmo2",
    ),
    "hourglass-revised": (
        "hourglass",
        [
            "model.qk_norm=true",
            "model.n_heads=4",
            "model.n_kv_heads=1",
            "model.head_dim=12",
            "model.tie_embeddings=true",
            "model.norm_eps=1e-5",
            "model.rope_scaling.original_max_position_embeddings=16",
            "train.decay_norms=false",
            "train.decay_embeddings=true",
            "train.schedule_lag=1",
        ],
        "custom",
    ),
}
# Variable width (h = 32): w_1 > h (the embedding is zero-padded), a narrowing, a widening (reads
# dims [16, 32) kept from layer 1, zeros, or a learned projection) and w_L < h (the output norm's
# extension to h). muP: the solved x schedule with the paper's multipliers.
WIDTHS = ["model.n_layers=4", "model.widths.schedule=list", "model.widths.values=[48,16,32,24]"]
VW_VARIANTS = {
    "carry_forward": [*WIDTHS, "model.widths.resize=carry_forward"],
    "zero": [*WIDTHS, "model.widths.resize=zero"],
    "learned": [*WIDTHS, "model.widths.resize=learned"],
    "mup-x": [
        "model.n_layers=4",
        "model.widths.multiple=4",
        "model.widths.init=mup",
    ],  # widths [44, 20, 8, 44]
    "head_dim-gqa": [
        *WIDTHS,
        "model.n_heads=4",
        "model.n_kv_heads=2",
        "model.head_dim=10",
        "model.qk_norm=true",
    ],
    "hourglass-post-qk-learned-mup": [
        *WIDTHS,
        "model.widths.resize=learned",
        "model.ffn=hourglass",
        "model.K=2",
        "model.d_h=16",
        "model.norm_placement=post",
        "model.qk_norm=true",
        "model.widths.init=mup",  # m_residual on each sub-MLP
    ],
}


def _check_tokenizer(out, demo_corpus):
    """The exported tokenizer, loaded back by transformers, encodes and decodes as the run's own
    file."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    text = "def f(x):\n    return x + 1  # é\n"
    tok, ids = (
        AutoTokenizer.from_pretrained(out),
        Tokenizer.from_file(str(demo_corpus.tokenizer_file)).encode(text).ids,
    )
    assert (
        tok(text)["input_ids"] == ids
        and len(ids) > 5
        and tok.decode(ids) == Tokenizer.from_file(str(demo_corpus.tokenizer_file)).decode(ids)
    )


def _export_and_check(tmp_path, demo_corpus, config, overrides, kind):
    """Train 2 steps, export with the script (in this process), then: logits = OLMo-core's forward
    (float32, < 1e-4), and greedy generate() = the argmax continuation of OLMo-core's model."""
    run = tmp_path / "run"
    spec = load_and_resolve(
        config,
        [
            *overrides,
            "train.max_steps=2",
            "run.save_interval=1000",
            "run.ephemeral_save_interval=null",
        ],
    )
    train(spec)
    out = tmp_path / "hf"
    r = run_in_process(
        "export_hf.py", str(run / "step2"), str(out), "--tokenizer", str(demo_corpus.tokenizer_file)
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert (out / "modeling_hourglass_olmo.py").exists() == (kind == "custom")
    _check_tokenizer(out, demo_corpus)

    reference = spec.model.build(vocab_size=4096).build(init_device="cpu")
    reference.load_state_dict(load_model_state(run / "step2"))
    reference.eval()
    hf = AutoModelForCausalLM.from_pretrained(
        out, trust_remote_code=True, torch_dtype=torch.float32
    ).eval()
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
    _check_model_card(out, spec, kind, reference)
    if kind == "custom":
        _check_attention_implementations(out, ids, want)
        _check_static_cache(hf, ids)
        _check_left_padding(hf, ids, reference)
        _check_hidden_states(hf, ids, reference)
    _check_cached_steps(hf, ids, got)
    return hf


def _check_hidden_states(hf, ids, reference) -> None:
    """output_hidden_states: each block's input, OLMo-core's (forward hooks), then the output
    norm's; a config.json naming a form the modeling code does not build is refused, not run as
    another."""
    inputs = []
    blocks = reference.blocks.values()
    hooks = [b.register_forward_pre_hook(lambda _, a: inputs.append(a[0])) for b in blocks]
    with torch.no_grad():
        reference(ids)
        out = hf(ids, output_hidden_states=True)
    for hook in hooks:
        hook.remove()
    assert len(out.hidden_states) == len(inputs) + 1
    assert all((got - want).abs().max() < 1e-4 for got, want in zip(out.hidden_states, inputs))
    for key, value in (("ffn", "geglu"), ("norm_placement", "sandwich"), ("resize", "copy")):
        with pytest.raises(ValueError, match=f"{key}='{value}'"):
            type(hf.config)(**{key: value})


def _check_left_padding(hf, ids, reference) -> None:
    """A batch of prompts left-padded (as generate() and lm-eval pad them): the padded row's logits
    are OLMo-core's on its tokens alone, and each row generates what it generates alone, with the
    dynamic cache and the static one."""
    pad = 3
    batch = torch.stack([ids[0, :8], torch.cat([torch.zeros(pad, dtype=ids.dtype), ids[1, :5]])])
    mask = torch.ones_like(batch)
    mask[1, :pad] = 0
    with torch.no_grad():
        got, want = hf(batch, attention_mask=mask).logits[1, pad:], reference(ids[1:, :5])[0]
    assert (got - want).abs().max().item() < 1e-4
    kw = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    alone = [hf.generate(ids[i : i + 1, :n], **kw)[0, n:] for i, n in ((0, 8), (1, 5))]
    for cache in ("dynamic", "static"):
        together = hf.generate(batch, attention_mask=mask, cache_implementation=cache, **kw)
        assert torch.equal(together[:, 8:], torch.stack(alone)), cache


def _check_static_cache(hf, ids) -> None:
    """A static cache (compiled generation's: its keys preallocated, the unwritten ones masked)
    generates as the dynamic one: the same tokens, the same scores."""
    kw = dict(max_new_tokens=4, do_sample=False, output_scores=True, return_dict_in_generate=True)
    a = hf.generate(ids[:, :8], **kw)
    b = hf.generate(ids[:, :8], cache_implementation="static", **kw)
    assert torch.equal(a.sequences, b.sequences)
    assert max((x - y).abs().max().item() for x, y in zip(a.scores, b.scores)) < 1e-4


def _check_cached_steps(hf, ids, got) -> None:
    """generate() ran with the KV cache: token by token from a cached 16-token prefix, the logits
    of one forward."""
    with torch.no_grad():
        out = hf(ids[:, :16], use_cache=True)
        steps = [out.logits] + [
            hf(ids[:, t : t + 1], past_key_values=out.past_key_values, use_cache=True).logits
            for t in range(16, 24)
        ]
    assert (
        out.past_key_values.get_seq_length() == 24
        and (torch.cat(steps, 1) - got).abs().max().item() < 1e-4
    )


def _check_model_card(out, spec, kind, reference):
    """README.md: the architecture, the parameter count (OLMo-core's model's), the steps, the
    config, how to load."""
    card = (out / "README.md").read_text()
    total = sum(
        p.numel() for p in reference.parameters()
    )  # tied weights counted once, as parameters() does
    assert f"total {total:,}" in card and "2 steps of 4 x 32 tokens (256 tokens)" in card
    assert (
        f"d_model {spec.model.d_model}, {spec.model.n_layers} layers" in card
        and "## The run's config" in card
    )
    assert ("trust_remote_code=True" in card) == (kind == "custom") and "vllm serve" in card


def _check_attention_implementations(out, ids, want):
    """transformers' attention interface: eager and sdpa give OLMo-core's logits (and each other's),
    also from a cached prefix (an explicit mask); AutoModel (what vLLM's Transformers backend
    builds) from the config alone. References: OLMo-core's forward; transformers'
    AutoModel.from_config documentation."""
    from transformers import AutoConfig, AutoModel

    logits = {}
    for implementation in ("eager", "sdpa"):
        hf = AutoModelForCausalLM.from_pretrained(
            out,
            trust_remote_code=True,
            torch_dtype=torch.float32,
            attn_implementation=implementation,
        ).eval()
        assert hf.config._attn_implementation == implementation
        with torch.no_grad():
            logits[implementation] = hf(ids).logits
            prefix = hf(ids[:, :16], use_cache=True)
            cache = prefix.past_key_values
            rest = hf(
                ids[:, 16:], past_key_values=cache, use_cache=True
            ).logits  # 8 queries after 16 cached keys
        assert (logits[implementation] - want).abs().max().item() < 1e-4
        assert (rest - want[:, 16:]).abs().max().item() < 1e-4
    assert (logits["eager"] - logits["sdpa"]).abs().max().item() < 1e-5
    config = AutoConfig.from_pretrained(out, trust_remote_code=True)
    base = AutoModel.from_config(config, trust_remote_code=True)
    assert type(base).__name__ == "HourglassOlmoModel" and not hasattr(base, "lm_head")
    assert [s["width"] for s in config.layer_shapes] == (
        config.widths or [config.d_model] * config.n_layers
    )


def test_a_registered_attention_function_is_called(tmp_path):
    """AttentionInterface.register (transformers' documented way in for a serving engine's
    attention): the export calls it once per layer and forward, and its logits are sdpa's."""
    import shutil

    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from olmo_patches.export.hf import MODELING, custom_model

    calls = []

    def counting(module, query, key, value, attention_mask, **kwargs):
        calls.append(module.layer_idx)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("counting_sdpa", counting)
    spec = load_spec(BASELINE, tiny_overrides(tmp_path, block="hourglass"))
    torch.manual_seed(0)
    reference = spec.model.build(vocab_size=4096).build(init_device="cpu").eval()
    state = {
        k: torch.ones_like(v) if "norm" in k else 0.05 * torch.randn_like(v)
        for k, v in reference.state_dict().items()
    }
    reference.load_state_dict(state)
    custom_model(spec, state).save_pretrained(tmp_path / "hf")
    shutil.copy(MODELING, tmp_path / "hf" / MODELING.name)
    ids = torch.randint(0, 4096, (2, 12), generator=torch.Generator().manual_seed(0))
    got = {}
    for implementation in ("counting_sdpa", "sdpa"):
        hf = AutoModelForCausalLM.from_pretrained(
            tmp_path / "hf",
            trust_remote_code=True,
            torch_dtype=torch.float32,
            attn_implementation=implementation,
        ).eval()
        with torch.no_grad():
            got[implementation] = hf(ids).logits
    assert calls == [0, 1]  # the tiny model's two layers, once each
    assert torch.equal(got["counting_sdpa"], got["sdpa"])
    with torch.no_grad():
        assert (got["sdpa"] - reference(ids)).abs().max().item() < 1e-4


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_export_matches_olmo_core(tmp_path, demo_corpus, variant):
    block, extra, kind = VARIANTS[variant]
    overrides = tiny_overrides(tmp_path / "run", *extra, block=block)
    _export_and_check(tmp_path, demo_corpus, BASELINE, overrides, kind)
    # and back into OLMo-core through its own converter (olmo_core.nn.hf): the same weights, logits
    if kind == "olmo2":
        from olmo_core.nn.hf.checkpoint import load_hf_model

        model = (
            load_spec(BASELINE, overrides)
            .model.build(vocab_size=4096)
            .build(init_device="cpu")
            .eval()
        )
        state = model.state_dict()
        load_hf_model(str(tmp_path / "hf"), state)
        model.load_state_dict(state)
        want = load_model_state(tmp_path / "run" / "step2")
        assert state.keys() == want.keys() and all(torch.equal(state[k], want[k]) for k in want)
        reference = (
            load_spec(BASELINE, overrides)
            .model.build(vocab_size=4096)
            .build(init_device="cpu")
            .eval()
        )
        reference.load_state_dict(want)
        ids = torch.randint(0, 4096, (1, 16), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            assert torch.equal(model(ids), reference(ids))


@pytest.mark.parametrize("variant", sorted(VW_VARIANTS))
def test_variable_width_export_matches_olmo_core(tmp_path, demo_corpus, variant):
    spec_overrides = tiny_overrides(tmp_path / "run", *VW_VARIANTS[variant])
    hf = _export_and_check(tmp_path, demo_corpus, VARIABLE_WIDTH, spec_overrides, "custom")
    spec = load_spec(VARIABLE_WIDTH, spec_overrides)
    assert hf.config.widths == spec.model.resolved_widths
    if variant.startswith("mup"):  # the paper's multipliers reached the exported config
        w = spec.model.widths
        assert (hf.config.embed_scale, hf.config.residual_scale, hf.config.logit_scale) == (
            w.m_emb,
            w.m_residual,
            1 / w.m_width,
        )


def test_export_refuses_unknown_checkpoint(tmp_path):
    r = run_script("export_hf.py", str(tmp_path / "nope" / "step1"), str(tmp_path / "out"))
    assert r.returncode == 2 and "export_hf:" in r.stderr


def test_export_refuses_an_moe_model(tmp_path):
    from olmo_patches.export.hf import export_hf

    with pytest.raises(
        ValueError,
        match=r"x\.yaml: model\.moe: the Hugging Face export has no mixture-of-experts model",
    ):
        export_hf(
            tmp_path / "step1",
            tmp_path / "hf",
            config=REPO / "configs" / "paper2" / "3B-MoE" / "x.yaml",
        )


def test_export_sets_token_ids_and_generate_stops_at_eos(tmp_path, demo_corpus):
    import json

    from tokenizers import Tokenizer, models
    from transformers import AutoTokenizer

    from olmo_patches.export import export_hf

    run = tmp_path / "run"
    train(
        load_and_resolve(
            BASELINE, tiny_overrides(run, "train.max_steps=1", "run.ephemeral_save_interval=null")
        )
    )
    # The demo tokenizer's own ids: "<|endoftext|>" and "<|pad|>" are its first two tokens.
    ids = dict(bos_token_id=0, eos_token_id=0, pad_token_id=1)

    # Refused with one line, nothing written: a JSON that is not a tokenizer, a vocabulary too big.
    (bad := tmp_path / "bad.json").write_text(json.dumps({"vocab": {"a": 0}}))
    big = Tokenizer(models.WordLevel({f"t{i}": i for i in range(5000)}, unk_token="t0"))
    big.save(str(tmp_path / "big.json"))
    with pytest.raises(
        ValueError,
        match=r"--tokenizer .*big\.json: vocabulary 5000 does not fit the model's 4096 embeddings",
    ):
        export_hf(run / "step1", tmp_path / "hf-big", tokenizer_file=tmp_path / "big.json")
    r = run_script(
        "export_hf.py", str(run / "step1"), str(tmp_path / "hf-bad"), "--tokenizer", str(bad)
    )
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
    assert r.stderr.startswith("export_hf: --tokenizer") and "not a tokenizer JSON" in r.stderr
    assert not (tmp_path / "hf-bad").exists() and not (tmp_path / "hf-big").exists()

    out = tmp_path / "hf"
    export_hf(run / "step1", out, tokenizer_file=demo_corpus.tokenizer_file)
    config, gen = (
        json.loads((out / f).read_text()) for f in ("config.json", "generation_config.json")
    )
    assert all(config[k] == v and gen[k] == v for k, v in ids.items())
    tok = AutoTokenizer.from_pretrained(out)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (0, 0, 1)
    assert (tok.eos_token, tok.pad_token) == ("<|endoftext|>", "<|pad|>")

    hf = AutoModelForCausalLM.from_pretrained(
        out, trust_remote_code=True, torch_dtype=torch.float32
    ).eval()
    prompt = torch.tensor([tok.encode("def main():")])
    with torch.no_grad():
        hf.get_output_embeddings().weight.zero_()  # every logit 0: greedy picks id 0, the eos
        generated = hf.generate(prompt, max_new_tokens=5, do_sample=False)
    assert (
        generated[0, -1].item() == 0 and generated.shape[1] == prompt.shape[1] + 1
    )  # stopped at eos


def test_dolma2_token_ids():
    from olmo_patches.export.hf import token_ids

    # OLMo-2's Hugging Face config: bos = eos = 100257 ("<|endoftext|>"), pad 100277 ("<|pad|>").
    assert token_ids(load_spec(REPO / "configs" / "1B" / "baseline.yaml")) == dict(
        bos_token_id=100257, eos_token_id=100257, pad_token_id=100277
    )


def test_generation_bench_prints_the_shapes_side_by_side():
    """scripts/bench.py --generate at toy sizes (eager): one row per demo shape with its forward
    FLOPs and KV bytes per token beside prefill and decode tokens/s, as ratios to the baseline. The
    demo x model caches 2 sum(w_l) = 2 (176 + 80 + 32 + 176) = 928 K and V elements per token
    against the baseline's 2 x 4 x 128 = 1024 (fp32: 4 bytes each); the static cache's tensors hold
    exactly that."""
    r = run_in_process(
        "bench.py",
        *("--generate", "--batches", "1,2", "--prompt", "4", "--new", "3"),
        *("--repeats", "1", "--compile", "off"),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {
        cells[0]: cells[1:]
        for line in r.stdout.splitlines()
        if line.startswith("| ") and not line.startswith("| shape")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    assert list(rows) == ["baseline", "hourglass", "variable_width"]
    assert (
        rows["baseline"][1] == "4,096 (1.000, yes)" and rows["hourglass"][1] == "4,096 (1.000, yes)"
    )
    assert rows["variable_width"][1] == f"{928 * 4:,} ({928 / 1024:.3f}, yes)"
    assert rows["hourglass"][0].endswith("(1.000)") and len(rows["baseline"]) == 2 + 4
    assert "decode eager" in r.stdout
