"""Generation speed of the exported models: prefill and decode tokens/s, side by side in one run.

Paper 1 leaves open whether the hourglass's narrower, deeper stacks generate slower (kernel
launches, memory traffic); paper 2 says the same of variable widths. This measures what users run:
each config's OLMo-core model (seeded init; speed does not depend on the weights) through the
custom-code Hugging Face export (export/hf.py ``custom_model``, the same modeling file for every
shape) and transformers' ``generate``, greedy, with a static KV cache (``cache_implementation=
"static"``), whose decode step transformers compiles (``compile_config``: inductor; CUDA graphs on
a GPU) while the prefill runs eager, as it does for users.

Per shape and batch: prefill tokens/s (batch x prompt over ``generate`` of one new token) and decode
tokens/s (batch x (new - 1) over the rest of a ``generate`` of ``new`` tokens), each the median of
``repeats`` rounds that visit the shapes in turn, as ratios to the first shape (the baseline),
beside its forward FLOPs per token (OLMo-core's count / 3: 2 per weight and the attention scores)
and its KV-cache bytes per token (2 n_kv_heads head_dim per layer x bytes per element; the cache's
tensors are checked against it).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List

import torch

from ..config import load_spec, vocab_size
from ..nn.accounting import breakdown
from ..resources import data_root
from .hf import custom_model

__all__ = ["GenerationResult", "exported", "run_generation", "format_generation"]


@dataclass
class GenerationResult:
    name: str
    config: str
    flops_per_token: float  # forward, at the context the run ends with
    kv_bytes_per_token: int
    cache_bytes_ok: bool  # the static cache's tensors = batch x its length x kv bytes per token
    prefill: Dict[int, float] = field(default_factory=dict)  # batch -> tokens/s (median)
    decode: Dict[int, float] = field(default_factory=dict)


def exported(config: str, dtype: torch.dtype, device: torch.device):
    """(the custom-code HF model of ``config`` in eval mode, its OLMo-core breakdown)."""
    spec = load_spec(data_root() / config)
    built = spec.model.build(vocab_size(spec))
    built.init_seed = 0
    model = built.build(init_device="meta")
    model.init_weights(device=torch.device("cpu"), max_seq_len=spec.data.sequence_length)
    counts = breakdown(model, spec.data.sequence_length)
    hf = custom_model(spec, model.state_dict()).to(device=device, dtype=dtype).eval()
    return hf, counts, model


def _generate(hf, prompt: torch.Tensor, new: int, compiled: bool) -> tuple[float, object]:
    """(seconds, the cache) of ``new`` greedy tokens with a static cache (no early stop)."""
    from transformers import CompileConfig

    config = CompileConfig(fullgraph=False, dynamic=True)  # one graph for every batch size
    config._compile_all_devices = True  # transformers compiles on CUDA only unless told
    sync = torch.cuda.synchronize if prompt.is_cuda else (lambda: None)
    sync()
    start = time.perf_counter()
    with torch.no_grad():
        out = hf.generate(
            prompt,
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            cache_implementation="static",
            compile_config=config,
            disable_compile=not compiled,
            return_dict_in_generate=True,
        )
    sync()
    cache = getattr(out, "cache", None)  # transformers 5.24's name; past_key_values before
    return time.perf_counter() - start, out.past_key_values if cache is None else cache


def run_generation(
    configs: Dict[str, str],
    *,
    batches: List[int],
    prompt: int,
    new: int,
    repeats: int,
    compiled: bool,
    dtype: torch.dtype,
    device: torch.device,
    log: Callable[[str], None] = print,
) -> List[GenerationResult]:
    """Every shape of ``configs`` (name -> config; the first is the baseline) at every batch size,
    interleaved; compiled graphs are built in one untimed warm-up per shape and batch."""
    models, results = {}, []
    for name, config in configs.items():
        hf, counts, olmo = exported(config, dtype, device)
        fwd = olmo.num_flops_per_token(prompt + new) / 3
        kv = counts.kv_cache_per_token * torch.finfo(dtype).bits // 8
        models[name] = hf
        results.append(GenerationResult(name, config, fwd, kv, True))
    for batch in batches:
        ids = torch.randint(1, 1000, (batch, prompt), generator=torch.Generator().manual_seed(0))
        ids = ids.to(device)
        for r in results:  # compile (each batch size its own static shapes) and warm up
            log(f"generation: warming up {r.name}, batch {batch}")
            _, cache = _generate(models[r.name], ids, new, compiled)
            size = sum(
                t.numel() * t.element_size() for lay in cache.layers for t in (lay.keys, lay.values)
            )
            r.cache_bytes_ok &= size == batch * (prompt + new - 1) * r.kv_bytes_per_token
        times: Dict[str, Dict[str, List[float]]] = {r.name: {"p": [], "d": []} for r in results}
        for _ in range(repeats):
            for r in results:
                first = _generate(models[r.name], ids, 1, compiled)[0]
                whole = _generate(models[r.name], ids, new, compiled)[0]
                times[r.name]["p"].append(batch * prompt / first)
                times[r.name]["d"].append(batch * (new - 1) / max(whole - first, 1e-9))
        for r in results:
            r.prefill[batch] = statistics.median(times[r.name]["p"])
            r.decode[batch] = statistics.median(times[r.name]["d"])
    return results


def format_generation(results: List[GenerationResult], header: str) -> str:
    """A Markdown table: each shape's figures and its ratios to the first shape's."""
    base = results[0]
    batches = sorted(base.decode)
    cols = [f"{k} b{b}" for b in batches for k in ("prefill", "decode")]
    lines = [
        header,
        "",
        "| shape | fwd FLOPs/token | KV bytes/token (= cache) | "
        + " | ".join(f"{c} tok/s (x base)" for c in cols)
        + " |",
        "|---" * (3 + len(cols)) + "|",
    ]
    for r in results:
        cells = [
            r.name,
            f"{r.flops_per_token / 1e9:.3g} G ({r.flops_per_token / base.flops_per_token:.3f})",
            f"{r.kv_bytes_per_token:,} ({r.kv_bytes_per_token / base.kv_bytes_per_token:.3f},"
            f" {'yes' if r.cache_bytes_ok else 'NO'})",
        ]
        for b in batches:
            for got, ref in ((r.prefill[b], base.prefill[b]), (r.decode[b], base.decode[b])):
                cells.append(f"{got:,.0f} ({got / ref:.3f})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
