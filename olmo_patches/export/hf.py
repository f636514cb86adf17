"""Export a trainer checkpoint (``RUN/stepN``) to a Hugging Face model folder.

- A model with the OLMo-2 shape (OLMo-core's blocks and SwiGLU: its kind's export config is the
  default one; post-norm "reordered norm", QK-norm; any head size and GQA; no RoPE scaling, which
  transformers' Olmo2 lacks) becomes transformers' own ``Olmo2ForCausalLM``: weights renamed,
  nothing else.
- Every other model is written with the modeling code ``modeling_hourglass_olmo.py`` (plain
  PyTorch) beside the weights, and loads with ``trust_remote_code=True``. Its block kind gives its
  fields of that file's config (FFN form, widths, the wiring of a layer's modules) and its weights'
  shapes there (``BlockKind.hf_config``, ``hf_weights``, blocks/base.py); the names are OLMo-core's.
The run's ``config.yaml`` (the folder above the checkpoint, or ``config``) gives the shape.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Dict, Iterator, Optional

import torch

from ..blocks import block_of
from ..config import ExperimentSpec, load_spec, tokenizer_config, vocab_size
from ..train.checkpoints import check_checkpoint_fits, checkpoint_shapes, load_model_state

__all__ = ["custom_model", "export_hf", "MODELING", "token_ids"]

MODELING = Path(__file__).with_name("modeling_hourglass_olmo.py")


def hf_fields(spec: ExperimentSpec, vocab: int) -> Dict:
    """The kind's fields of the modeling file's config (``BlockKind.hf_config``; ConfigError: no
    export), its FFN form one the file has."""
    from .modeling_hourglass_olmo import FFN_FORMS

    m = spec.model
    fields = block_of(m).hf_config(m, m.build(vocab_size=vocab))
    if fields["ffn"] not in FFN_FORMS:
        raise ValueError(
            f"model.block={m.block}: the modeling file has no FFN {fields['ffn']!r} (it has "
            f"{', '.join(FFN_FORMS)}: export/modeling_hourglass_olmo.py)"
        )
    return fields


def is_olmo2_shape(spec: ExperimentSpec, vocab: int) -> bool:
    m = spec.model
    # transformers' Olmo2 has no Llama-3.1 RoPE scaling
    return (
        hf_fields(spec, vocab) == dict(ffn="swiglu", ffn_hidden=m.resolved_d_ff)
        and m.norm_placement == "post"
        and m.qk_norm
        and m.rope_scaling is None
    )


def to_olmo2_names(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """OLMo-core parameter names -> transformers' Olmo2 names."""
    layer = {
        "attention.w_q": "self_attn.q_proj",
        "attention.w_k": "self_attn.k_proj",
        "attention.w_v": "self_attn.v_proj",
        "attention.w_out": "self_attn.o_proj",
        "attention.q_norm": "self_attn.q_norm",
        "attention.k_norm": "self_attn.k_norm",
        "attention_norm": "post_attention_layernorm",
        "feed_forward_norm": "post_feedforward_layernorm",
        "feed_forward.w1": "mlp.gate_proj",
        "feed_forward.w3": "mlp.up_proj",
        "feed_forward.w2": "mlp.down_proj",
    }
    out = {}
    for key, value in state.items():
        if key == "embeddings.weight":
            out["model.embed_tokens.weight"] = value
        elif key == "lm_head.norm.weight":
            out["model.norm.weight"] = value
        elif key == "lm_head.w_out.weight":
            out["lm_head.weight"] = value
        else:
            _, i, rest = key.split(".", 2)
            module, param = rest.rsplit(".", 1)
            out[f"model.layers.{i}.{layer[module]}.{param}"] = value
    return out


def _olmo2(spec: ExperimentSpec, state: Dict[str, torch.Tensor], vocab: int, max_len: int):
    from transformers import Olmo2Config, Olmo2ForCausalLM

    m = spec.model
    config = Olmo2Config(
        vocab_size=vocab,
        hidden_size=m.d_model,
        intermediate_size=m.resolved_d_ff,
        num_hidden_layers=m.n_layers,
        num_attention_heads=m.n_heads,
        num_key_value_heads=m.resolved_n_kv_heads,
        head_dim=m.resolved_head_dim,
        rms_norm_eps=m.norm_eps,
        rope_theta=float(m.rope_theta),
        max_position_embeddings=max_len,
        tie_word_embeddings=m.tie_embeddings,
        attention_bias=False,
        torch_dtype="float32",
        **token_ids(spec),
    )
    model = Olmo2ForCausalLM(config)
    model.load_state_dict(to_olmo2_names(state), strict=not m.tie_embeddings)
    return model


def _custom_config(spec: ExperimentSpec, vocab: int, max_len: int):
    """The modeling file's config: the attention, norms, RoPE and vocabulary of the spec, the rest
    as its block kind gives it (read off OLMo-core's built config)."""
    from .modeling_hourglass_olmo import HourglassOlmoConfig

    m = spec.model
    config = HourglassOlmoConfig(
        vocab_size=vocab,
        d_model=m.d_model,
        n_layers=m.n_layers,
        n_heads=m.n_heads,
        head_dim=m.head_dim,
        n_kv_heads=m.resolved_n_kv_heads,
        llama3_rope=asdict(m.rope_scaling) if m.rope_scaling is not None else None,
        norm_placement=m.norm_placement,
        qk_norm=m.qk_norm,
        rope_theta=float(m.rope_theta),
        norm_eps=m.norm_eps,
        tie_word_embeddings=m.tie_embeddings,
        max_position_embeddings=max_len,
        **token_ids(spec),
        **hf_fields(spec, vocab),
    )
    config.auto_map = {
        "AutoConfig": "modeling_hourglass_olmo.HourglassOlmoConfig",
        # what vLLM's Transformers backend builds
        "AutoModel": "modeling_hourglass_olmo.HourglassOlmoModel",
        "AutoModelForCausalLM": "modeling_hourglass_olmo.HourglassOlmoForCausalLM",
    }
    return config


def to_custom_names(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """OLMo-core parameter names -> the modeling file's: ``model.`` before each, but the output
    norm (``lm_head.norm`` -> ``model.norm``) and projection (``lm_head.w_out`` -> ``lm_head``)."""
    out = {}
    for key, value in state.items():
        if key.startswith("lm_head.norm."):
            out["model.norm." + key.removeprefix("lm_head.norm.")] = value
        elif key == "lm_head.w_out.weight":
            out["lm_head.weight"] = value
        else:
            out["model." + key] = value
    return out


def _custom(spec: ExperimentSpec, state: Dict[str, torch.Tensor], vocab: int, max_len: int):
    from .modeling_hourglass_olmo import HourglassOlmoForCausalLM

    model = HourglassOlmoForCausalLM(_custom_config(spec, vocab, max_len))
    custom = to_custom_names(block_of(spec.model).hf_weights(spec.model, state))
    missing, unexpected = model.load_state_dict(custom, strict=False)
    tied = ["lm_head.weight"] if spec.model.tie_embeddings else []
    if unexpected or not set(missing) <= set(tied):
        raise ValueError(
            f"the checkpoint does not fit the exported model: missing {missing}, unexpected "
            f"{unexpected}"
        )
    if tied:
        model.tie_weights()
    return model


def custom_model(spec: ExperimentSpec, state: Dict[str, torch.Tensor]):
    """The custom-code export of any shape (uniform too), in memory, with OLMo-core's ``state``."""
    return _custom(spec, state, state["embeddings.weight"].shape[0], spec.data.sequence_length)


# The special tokens of both tokenizers (dolma2 and the demo's) by name, as tokenizer_config.json
# names them.
SPECIAL_TOKENS = {"eos_token": "<|endoftext|>", "pad_token": "<|pad|>"}


def token_ids(spec: ExperimentSpec) -> Dict[str, int]:
    """bos, eos and pad ids of the run's tokenizer; no BOS token: bos = eos (OLMo-2's HF config)."""
    tok = tokenizer_config(spec)
    bos = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    return dict(bos_token_id=bos, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)


def _check_tokenizer(path: Path, ids: Dict[str, int], vocab: int) -> Dict[str, str]:
    """The special tokens of a tokenizer JSON that fits the model; ValueError (one line) if not."""
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # not JSON, or JSON that is not a tokenizer
        raise ValueError(
            f"--tokenizer {path}: not a tokenizer JSON ({' '.join(str(e).split())[:200]})"
        ) from None
    if (n := tok.get_vocab_size()) > vocab:
        raise ValueError(
            f"--tokenizer {path}: vocabulary {n} does not fit the model's {vocab} embeddings"
        )
    for name, text in SPECIAL_TOKENS.items():
        if (got := tok.token_to_id(text)) != ids[name + "_id"]:
            raise ValueError(
                f"--tokenizer {path}: {text} is id {got}, the model was trained with {name}_id "
                f"{ids[name + '_id']}"
            )
    return {"bos_token": tok.id_to_token(ids["bos_token_id"]), **SPECIAL_TOKENS}


DATA = {
    "demo": "the demo corpus (the Python standard library's own source, BPE 4096)",
    "olmo2_stage1": "OLMo-2 1B's Stage 1 data, in the order OLMo-2 read it (data_order/)",
    "prefix": "a materialized prefix of OLMo-2 1B's Stage 1 data order",
}


def _step(checkpoint: Path) -> Optional[int]:
    name = checkpoint.name
    return int(name[4:]) if name.startswith("step") and name[4:].isdigit() else None


def _architecture(spec: ExperimentSpec, vocab: int) -> list[str]:
    """The card's architecture lines: the block kind's shape (its description: a variable-width
    model's widths w_1..w_L), the attention."""
    m = spec.model
    return [
        f"- block: {m.block}" + (f" ({more})" if (more := block_of(m).describe(m)) else ""),
        f"- d_model {m.d_model}, {m.n_layers} layers, {m.n_heads} heads ({m.resolved_n_kv_heads} "
        f"key/value heads), {m.norm_placement}-norm{', QK-norm' if m.qk_norm else ''}, vocabulary "
        f"{vocab}",
    ]


def _how_to_load(kind: str) -> tuple[str, str]:
    """The card's Python and vLLM lines for an ``olmo2`` or a ``custom`` export."""
    if kind == "olmo2":
        load = (
            "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
            "model = AutoModelForCausalLM.from_pretrained(FOLDER)  # transformers' "
            "Olmo2ForCausalLM\n"
            "tokenizer = AutoTokenizer.from_pretrained(FOLDER)"
        )
        return load, "vllm serve FOLDER  # vLLM's own Olmo2ForCausalLM"
    load = (
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "model = AutoModelForCausalLM.from_pretrained(FOLDER, trust_remote_code=True)  # "
        "modeling_hourglass_olmo.py\n"
        "# attn_implementation='eager' | 'sdpa' | 'flash_attention_2' | any registered function\n"
        "# transformers >= 5 reads config.json before the tokenizer: without "
        "trust_remote_code=True a terminal asks\n"
        "tokenizer = AutoTokenizer.from_pretrained(FOLDER, trust_remote_code=True)"
    )
    return (
        load,
        "vllm serve FOLDER --trust-remote-code --model-impl transformers  # vLLM's Transformers "
        "backend",
    )


def model_card(spec: ExperimentSpec, kind: str, checkpoint: Path, vocab: int) -> str:
    """The export's README.md: architecture, parameters, data and steps, the config, how to load."""
    from ..config import spec_to_yaml
    from ..nn.accounting import breakdown

    m, d = spec.model, spec.data
    counts = breakdown(m.build(vocab_size=vocab).build(init_device="meta"), d.sequence_length)
    shape = _architecture(spec, vocab)
    load, serve = _how_to_load(kind)
    what = (
        "transformers Olmo2ForCausalLM"
        if kind == "olmo2"
        else "custom-code (modeling_hourglass_olmo.py)"
    )
    return "\n".join(
        [
            f"# {spec.run.name}",
            "",
            f"A {what} export of an "
            "hourglass-olmo checkpoint (OLMo-core), written by `hourglass-export` "
            "(scripts/export_hf.py).",
            "",
            "## Architecture",
            "",
            *shape,
            "",
            "## Parameters",
            "",
            f"- total {counts.total:,}; non-embedding (attention and FFN weight matrices, as the "
            f"papers count) {counts.non_embedding:,}",
            "",
            "## Training",
            "",
            *_training(spec, checkpoint),
            "",
            "## How to load",
            "",
            "```python",
            load,
            "```",
            "",
            "```bash",
            serve,
            "```",
            "",
            "## The run's config",
            "",
            "```yaml",
            spec_to_yaml(spec).rstrip(),
            "```",
            "",
        ]
    )


def _training(spec: ExperimentSpec, checkpoint: Path) -> list[str]:
    """The model card's training lines: the data and the steps up to the checkpoint."""
    d = spec.data
    step = _step(checkpoint)
    tokens = step * spec.train.global_batch_size * d.sequence_length if step is not None else None
    source = DATA.get(d.source, f"token files ({d.mix or ', '.join(d.paths) or 'numpy'})")
    steps = (
        f"{step:,} steps of {spec.train.global_batch_size} x {d.sequence_length} tokens "
        f"({tokens:,} tokens)"
        if step is not None
        else "unknown steps"
    )
    return [
        f"- data: {source}; sequence length {d.sequence_length}",
        f"- {steps}, checkpoint `{checkpoint.name}`",
    ]


def _exportable(config_path: Path) -> ExperimentSpec:
    spec = load_spec(config_path)
    try:
        hf_fields(spec, vocab_size(spec))
    except ValueError as e:
        raise ValueError(f"{config_path}: {e}") from None
    return spec


# What an export writes (save_pretrained's config, weights and generation config; the modeling
# code, the model card, the tokenizer): those of an earlier export in OUT_DIR that this one does not
# write are removed once it is written, when it replaces another.
EXPORT_FILES = (
    "config.json",
    "generation_config.json",
    "model*.safetensors*",
    "pytorch_model*.bin*",
    "modeling_*.py",
    "README.md",
    "tokenizer.json",
    "tokenizer_config.json",
)


def export_hf(
    checkpoint: str | Path,
    out_dir: str | Path,
    *,
    config: Optional[str | Path] = None,
    tokenizer_file: Optional[str | Path] = None,
    replace: bool = False,
) -> str:
    """Write the HF model folder; returns which kind it wrote ("olmo2" or "custom"). The export is
    written into a folder beside ``out_dir`` and moved in once whole: a write that fails (a full
    disk) is an OSError of one line, and ``out_dir`` is left as it was. ``replace``: an earlier
    export's files in ``out_dir`` (EXPORT_FILES) that this one does not write are removed, so that
    none of them (another model's tokenizer, say) is left beside this one; other files stay."""
    checkpoint, out = Path(checkpoint), Path(out_dir)
    spec = _checked_sources(checkpoint, out, config)
    vocab = checkpoint_shapes(checkpoint)["embeddings.weight"][0]  # before any weight is read
    ids = token_ids(spec)
    specials = (
        _check_tokenizer(Path(tokenizer_file), ids, vocab) if tokenizer_file is not None else None
    )
    state = load_model_state(checkpoint)
    kind = "olmo2" if is_olmo2_shape(spec, vocab) else "custom"
    model = (_olmo2 if kind == "olmo2" else _custom)(spec, state, vocab, spec.data.sequence_length)
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(**ids)  # generate() stops at eos and pads with pad
    with _written_beside(out, replace) as folder:
        model.save_pretrained(folder)
        if kind == "custom":
            shutil.copy(MODELING, folder / MODELING.name)
        (folder / "README.md").write_text(model_card(spec, kind, checkpoint, vocab))
        if tokenizer_file is not None:
            _write_tokenizer(folder, Path(tokenizer_file), spec.data.sequence_length, specials)
    return kind


@contextmanager
def _written_beside(out: Path, replace: bool) -> Iterator[Path]:
    """A new folder beside ``out`` (the same file system) to write the export into; once written,
    its files replace ``out``'s (os.replace each, then the earlier export's others go, with
    ``replace``). A write that fails: the folder removed, ``out`` untouched, an OSError of one
    line."""
    from safetensors import SafetensorError

    out.parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f".{out.name}-export-", dir=out.parent))
    try:
        yield folder
    except (OSError, SafetensorError) as e:
        raise OSError(
            f"OUT_DIR {out}: writing the export failed ({' '.join(str(e).split())[:200]}); nothing "
            "there changed"
        ) from None
    else:
        new = {p.name for p in folder.iterdir()}
        out.mkdir(exist_ok=True)
        for name in sorted(new):
            os.replace(folder / name, out / name)
        if replace:
            for old in {p for pattern in EXPORT_FILES for p in out.glob(pattern)}:
                if old.name not in new:
                    old.unlink()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _checked_sources(checkpoint: Path, out: Path, config: Optional[str | Path]):
    """The spec to export, once the checkpoint, the output folder and the config are checked
    (another model's checkpoint, its vocabulary too, is refused by its metadata before any
    weight is read)."""
    # an explicit config is checked before the checkpoint
    spec = _exportable(Path(config)) if config is not None else None
    if not checkpoint.is_dir():
        what = "a file, not a checkpoint folder" if checkpoint.exists() else "no such folder"
        raise ValueError(f"CHECKPOINT {checkpoint}: {what}")
    if not any((checkpoint / d / ".metadata").is_file() for d in ("model_and_optim", ".")):
        raise ValueError(
            f"CHECKPOINT {checkpoint}: not a checkpoint (no model_and_optim/.metadata)"
        )
    if out.exists() and not out.is_dir():
        raise ValueError(f"OUT_DIR {out}: a file, not a folder")
    config_path = Path(config) if config else checkpoint.parent / "config.yaml"
    spec = spec or _exportable(config_path)
    where = (
        f"--config {config_path}: CHECKPOINT {checkpoint}" if config else f"CHECKPOINT {checkpoint}"
    )
    check_checkpoint_fits(checkpoint, spec, where)
    return spec


def _write_tokenizer(out: Path, tokenizer_file: Path, max_len: int, specials: Optional[dict]):
    """The tokenizer beside the model, as ``AutoTokenizer`` loads it."""
    shutil.copy(tokenizer_file, out / "tokenizer.json")
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_len,
        **(specials or {}),
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=1))
