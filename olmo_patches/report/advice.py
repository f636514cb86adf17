"""What a valid config will cost on GPUs, as one-line warnings (the dry run and a run's start print
them):

- a matmul dimension (a weight's rows or columns, the head dim) that is not a multiple of 8: tensor
  cores pad it or fall back (the exact 0.001% shapes; ``scripts/search.py --aligned`` gives shapes
  within 0.3% that avoid it, configs/*/*-aligned.yaml);
- the remote (HTTP) data slower than one rank consumes: ``benchmarks/bench_loader.py`` measured
  :data:`HTTP_INSTANCES_PER_S` per rank (docs/performance.md), the need is ASSUMED_MFU x the card's
  peak / (FLOPs per token x sequence length);
- a warmup that ends after the run's last step (the learning rate never reaches train.lr).
"""

from __future__ import annotations

from typing import List, Optional

from ..config import ExperimentSpec
from ..launch.cards import CARDS
from .counts import count
from .plan import ASSUMED_MFU

__all__ = ["advice"]

MATMUL_ALIGN = 8  # bf16 tensor-core tiles (and flash-attention head dims) want multiples of 8
# benchmarks/bench_loader.py, HTTP +20 ms per request, 4 workers per rank (docs/performance.md: 73
# at 4 and 8 workers, 84 without workers): the most one rank's loader was measured to read remotely.
HTTP_INSTANCES_PER_S = 73.0


def unaligned_dims(spec: ExperimentSpec) -> dict[int, str]:
    """Matmul dims not a multiple of MATMUL_ALIGN -> where the first one is (a weight, or the head
    dim: of every layer, or of the layers named)."""
    model = spec.model_config().build(init_device="meta")
    found: dict[int, str] = {}
    from ..nn.float8 import converts_itself

    # A matmul module that is not an nn.Linear states each matmul's (out, in) (nn/float8.py): a
    # stacked hourglass weight is K (out, in) maps, not one.
    maps = {f"{n}.weight": m.matmul_shape for n, m in model.named_modules() if converts_itself(m)}
    for name, p in model.named_parameters():
        shape = maps.get(name, p.shape)
        for d in shape[-2:] if len(shape) >= 2 else ():
            if d % MATMUL_ALIGN:
                found.setdefault(d, name)
    layers: dict[int, list[int]] = {}  # each unaligned head dim: its layers (1..L)
    for layer, head_dim in enumerate(spec.model.head_dims, start=1):
        if head_dim % MATMUL_ALIGN:
            layers.setdefault(head_dim, []).append(layer)
    for head_dim, at in layers.items():
        every = len(at) == spec.model.n_layers
        where = "" if every else f" of layer{'s' * (len(at) > 1)} {', '.join(map(str, at))}"
        found.setdefault(head_dim, f"head_dim{where}")
    return found


def _over_http(spec: ExperimentSpec) -> bool:
    d, remote = spec.data, ("http://", "https://")
    if d.source == "olmo2_stage1":
        return d.base is None or d.base.startswith(remote)
    return d.source == "numpy" and (
        any(p.startswith(remote) for p in d.paths)
        or bool(d.mix and d.mix_base_dir.startswith(remote))
    )


def http_need(spec: ExperimentSpec) -> tuple[float, str]:
    """(instances/s one rank consumes, on which card): train.hardware's card, else the H100."""
    card = CARDS.get(spec.train.hardware, CARDS["h100"])
    assert card.bf16_flops is not None
    seq = spec.data.sequence_length
    return ASSUMED_MFU * card.bf16_flops / (count(spec).flops_per_token * seq), card.name


def long_warmup(spec: ExperimentSpec) -> Optional[str]:
    """The warning for a warmup longer than the run, else None."""
    t = spec.train
    per_step = t.global_batch_size * spec.data.sequence_length
    steps = spec.steps
    key, warmup = (
        ("train.warmup_steps", t.warmup_steps)
        if t.warmup_steps is not None
        else ("train.warmup_tokens", t.warmup_tokens)
    )
    warmup_steps = (warmup or 0) if key == "train.warmup_steps" else (warmup or 0) / per_step
    if steps and warmup_steps > steps:
        return (
            f"warning: {key}={warmup} ends after the run's {steps} steps: the learning rate never "
            "reaches train.lr"
        )
    return None


def advice(spec: ExperimentSpec) -> List[str]:
    lines = [warmup] if (warmup := long_warmup(spec)) else []
    if dims := unaligned_dims(spec):
        where = ", ".join(f"{d} ({name})" for d, name in sorted(dims.items()))
        lines.append(
            f"warning: matmul dimensions not a multiple of {MATMUL_ALIGN} (GPU tensor cores pad "
            f"them): {where}; aligned shapes within 0.3%: scripts/search.py --aligned"
        )
    if _over_http(spec):
        need, card = http_need(spec)
        if need > HTTP_INSTANCES_PER_S:
            lines.append(
                f"warning: data.source={spec.data.source} over HTTP: one rank needs {need:.0f} "
                f"instances/s ({card}, MFU {ASSUMED_MFU:.0%}), {HTTP_INSTANCES_PER_S:.0f} measured "
                "(benchmarks/bench_loader.py); materialize a prefix (docs/data_order.md) or set "
                "data.base to a local mirror"
            )
    return lines
