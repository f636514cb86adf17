"""Generation through the Hugging Face export (olmo_patches/export/generation.py, what
`scripts/bench.py --generate` prints): the 113M baseline, hourglass and variable-width shapes
(config/bench_scales.py) with transformers' generate, greedy, a static KV cache, the decode step
compiled (CUDA graphs), at batch 1 and 64: prefill and decode tokens/s as ratios to the baseline,
each beside its forward FLOPs and KV-cache bytes per token (shown: paper 1's open question, answered
in docs/performance.md). Judged: the static cache holds exactly the counted KV bytes. A rehearsal
runs the demo shapes eager at toy lengths."""

import pytest
import torch

from olmo_patches.config.bench_scales import SCALES

pytestmark = pytest.mark.gpu


def test_generation_speed(env, rows):
    env.need("transformers", "generation through the HF export")
    from olmo_patches.export.generation import run_generation

    scale = "demo" if env.rehearse else "113M"
    prompt, new, repeats = (8, 4, 1) if env.rehearse else (512, 64, 2)
    names = list(SCALES[scale].configs)[:3]
    results = run_generation(
        {n: SCALES[scale].configs[n] for n in names},
        batches=[1, 64],
        prompt=prompt,
        new=new,
        repeats=repeats,
        compiled=env.cuda,
        dtype=torch.bfloat16 if env.cuda else torch.float32,
        device=env.device,
        log=lambda m: None,
    )
    base = results[0]
    for r in results:
        rows.judge(
            f"{scale} {r.name}: KV cache bytes = count",
            f"{r.kv_bytes_per_token:,} a token",
            r.cache_bytes_ok,
            "the static cache's tensors",
        )
        for b in (1, 64):
            for what, got, ref in (
                ("prefill", r.prefill[b], base.prefill[b]),
                ("decode", r.decode[b], base.decode[b]),
            ):
                rows.show(
                    f"{scale} {r.name}: {what} tokens/s, batch {b}",
                    f"{got:,.0f} ({got / ref:.3f} x baseline)",
                    f"FLOPs {r.flops_per_token / base.flops_per_token:.3f} x, KV bytes "
                    f"{r.kv_bytes_per_token / base.kv_bytes_per_token:.3f} x the baseline's; "
                    f"{prompt} + {new} tokens, decode {'compiled' if env.cuda else 'eager'}",
                )
    rows.check()
