"""The Hugging Face export's refusals and its writes, in process on a tiny checkpoint written
directly (OLMo-core's layout: the model's tensors under ``model.`` in model_and_optim/, the run's
config.yaml above), no training run."""

import errno
import os

import pytest
import torch

pytest.importorskip("transformers", reason="the hf extra (pip install -e '.[hf]')")

from olmo_patches.blocks import BLOCKS, BlockKind  # noqa: E402
from olmo_patches.config import load_spec, spec_to_yaml  # noqa: E402

from .conftest import REPO, run_in_process, tiny_overrides  # noqa: E402

BASELINE = REPO / "configs" / "demo" / "baseline.yaml"


def write_checkpoint(run, *overrides):
    """``run/step1`` of a tiny model of ``overrides`` (its initial weights), ``run/config.yaml``."""
    import torch.distributed.checkpoint as dcp

    spec = load_spec(BASELINE, tiny_overrides(run, *overrides))
    torch.manual_seed(0)
    state = spec.model_config().build(init_device="cpu").state_dict()
    step = run / "step1"
    dcp.save({"model": state}, storage_writer=dcp.FileSystemWriter(step), no_dist=True)
    (run / "config.yaml").write_text(spec_to_yaml(spec))
    return step


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("run"))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A tokenizer JSON with the demo's special ids (eos 0, pad 1)."""
    from tokenizers import Tokenizer, models

    vocab = {"<|endoftext|>": 0, "<|pad|>": 1, "a": 2}
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    Tokenizer(models.WordLevel(vocab, unk_token="a")).save(str(path))
    return path


def _files(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_a_failed_write_keeps_the_earlier_export(checkpoint, tokenizer, tmp_path, monkeypatch):
    """A disk that fills while the weights are written (safetensors' own error, as ulimit -f or a
    full disk give it): one line, exit 1, the earlier export byte for byte, nothing left beside
    it; the export then replaces it whole."""
    import transformers.modeling_utils as mu
    from safetensors import SafetensorError

    out = tmp_path / "hf"
    args = [str(checkpoint), str(out), "--force", "--tokenizer", str(tokenizer)]
    assert run_in_process("export_hf.py", *args).returncode == 0
    before = _files(out)
    assert {"model.safetensors", "tokenizer.json"} <= set(before)

    def full(*a, **k):
        raise SafetensorError(f"Error while serializing: I/O error: {os.strerror(errno.ENOSPC)}")

    monkeypatch.setattr(mu, "safe_save_file", full)
    r = run_in_process("export_hf.py", *args)
    line = r.stderr.strip().splitlines()[-1]  # after transformers' progress bar
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert line.startswith(f"export_hf: OUT_DIR {out}: writing the export failed (Error while ")
    assert line.endswith("No space left on device); nothing there changed")
    assert _files(out) == before and os.listdir(tmp_path) == ["hf"]
    monkeypatch.undo()
    r = run_in_process("export_hf.py", *args[:3])  # without the tokenizer: its files go
    assert r.returncode == 0 and set(_files(out)) == set(before) - {
        "tokenizer.json",
        "tokenizer_config.json",
    }


class GeluTanh(BlockKind):
    """OLMo-core's own block and FeedForward, its gate GELU (tanh) instead of SiLU: the same config
    types and weight names as the baseline, another forward."""

    name = "gelu_tanh"

    def build(self, m, config):
        from olmo_core.nn.feed_forward import ActivationFunction

        config.block.feed_forward.activation = ActivationFunction.gelu_tanh
        return config


def test_a_kind_that_changes_a_field_the_export_does_not_map_is_refused(
    checkpoint, tmp_path, monkeypatch
):
    """The default hf_config exports OLMo-core's SwiGLU config of the model's keys and nothing
    else: a kind that changes a field of it is refused in one line naming the field, nothing
    written."""
    monkeypatch.setitem(BLOCKS, GeluTanh.name, GeluTanh())
    config = tmp_path / "config.yaml"
    spec = load_spec(BASELINE, tiny_overrides(tmp_path, "model.block=gelu_tanh"))
    config.write_text(spec_to_yaml(spec))
    r = run_in_process("export_hf.py", str(checkpoint), str(tmp_path / "hf"), "--config", config)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"export_hf: {config}: model.block=gelu_tanh: the Hugging Face export (its "
        "block.feed_forward.activation is gelu_tanh, not silu) needs BlockKind.hf_config of it "
        "(docs/adding_a_block.md)"
    ]
    assert sorted(os.listdir(tmp_path)) == ["config.yaml"]


def test_a_bad_tokenizer_is_refused_before_any_weight_is_read(checkpoint, tmp_path, monkeypatch):
    """--tokenizer is checked against the vocabulary of the checkpoint's metadata: a path with a
    typo is one line before the weights are read, nothing written."""
    from olmo_patches.export import hf

    def read(path):
        raise AssertionError("the weights were read")

    monkeypatch.setattr(hf, "load_model_state", read)
    typo = tmp_path / "tokenizr.json"
    with pytest.raises(ValueError, match=rf"^--tokenizer {typo}: not a tokenizer JSON \(No such "):
        hf.export_hf(checkpoint, tmp_path / "hf", tokenizer_file=typo)
    assert os.listdir(tmp_path) == []


def _flash(module, q, k, v, mask, scaling=None, dropout=0.0, **kw):
    """transformers' flash-attention path (modeling_flash_attention_utils._upad_input) on CPU: a
    2-D mask cuts a static cache's keys to its length and unpads the keys by it, the queries by its
    last T entries; causal aligned to each row's last key, as flash-attn >= 2.1."""
    B, H, T, D = q.shape
    k, v = (t.repeat_interleave(H // t.shape[1], 1) for t in (k, v))
    out = torch.zeros(B, T, H, D)
    for b in range(B):
        mask_b = torch.ones(k.shape[2]) if mask is None else mask[b]
        keys, queries = mask_b.bool().nonzero()[:, 0], mask_b[-T:].bool().nonzero()[:, 0]
        kb, vb, n = k[b][:, keys], v[b][:, keys], len(queries)
        causal = torch.arange(len(keys)) <= (len(keys) - n + torch.arange(n))[:, None]
        w = (q[b][:, queries] @ kb.transpose(1, 2) * scaling).masked_fill(~causal, -torch.inf)
        out[b, queries] = (w.softmax(-1) @ vb).transpose(0, 1)
    return out, None


def test_flash_attention_reads_the_keys_eager_does():
    """The modeling code's masks as a flash-attention kernel reads them (2-D, in transformers'
    own path): generate() gives eager's tokens and scores with a dynamic and a static cache, on a
    batch left-padded and on one prompt."""
    from transformers import AttentionInterface

    from olmo_patches.export import modeling_hourglass_olmo as hf

    AttentionInterface.register("flash_on_cpu", _flash)
    torch.manual_seed(0)
    config = hf.HourglassOlmoConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4,
                                    ffn_hidden=64, pad_token_id=0)  # fmt: skip
    model = hf.HourglassOlmoForCausalLM(config).eval()
    ids = torch.randint(2, 50, (2, 6))
    ids[1, :2], mask = 0, (ids != 0).long()
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None)
    kw.update(output_scores=True, return_dict_in_generate=True, disable_compile=True)
    for x, m in ((ids[:1], None), (ids, mask)):
        got = {}
        for implementation in ("eager", "flash_on_cpu"):
            model.config._attn_implementation = implementation
            for cache in ("dynamic", "static"):
                got[implementation, cache] = model.generate(
                    x, attention_mask=m, cache_implementation=cache, **kw
                )
        want = got.pop(("eager", "dynamic"))
        for out in got.values():
            assert torch.equal(out.sequences, want.sequences)
            assert max((a - b).abs().max().item() for a, b in zip(out.scores, want.scores)) < 1e-5
