"""Coordinate check: does a shape's parametrisation keep activations in scale as it grows?

The check of muP (Yang et al., "Tensor Programs V", 2022, section 7 and appendix D; the ``mup``
package's coord check): train the same model at several widths for a few steps at one learning
rate, and record each sublayer's output scale, mean |x| over its coordinates, at every step. Under
muP the curves of the widths lie on each other (flat in width); under the standard
parametrisation (one learning rate and init std for every width) the update of a hidden activation
grows with the width, so the later steps' curves rise with it.

A check scales one axis of a config by x1, x2, x4 (``MULTIPLIERS``):

- **width**: d_model (and an explicit d_h, d_ff, list of widths w_l alike); under paper 2's muP
  (model.widths.init=mup) m_width scales with d_model too, as muP defines it (m_width =
  d_model / d_base: logits / m_width, hidden init std ~ 1/sqrt(d_model), hidden LR lr / m_width);
- **depth**: n_layers; **K** (hourglass): the sub-MLPs per layer.

Each run: the model the trainer builds (the config's init, optimizer groups and LR, constant, no
warmup), a fresh batch of random token ids per step, the same batches at every multiplier. The
scale of a sublayer kind (embedding, attention, ffn, block, logits; attention, ffn and block
averaged over layers) against the multiplier m gives a slope, d ln(scale) / d ln(m), at the last
step. The check is **flat** when no kind grows: every slope below ``FLAT`` = 0.2 (x4 raises no scale
by 1.32x or more). A shrinking kind does not count against it: muP's logits start at a scale that
vanishes with the width (readout / m_width, Tensor Programs V table 3) and reach their limit as
training moves them; the verdict names it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..blocks.base import axes, scaled
from ..config import ExperimentSpec, load_spec
from .optimizer import optimizer

__all__ = ["MULTIPLIERS", "FLAT", "CoordCheck", "axis_overrides", "coord_check", "plot"]

MULTIPLIERS = (1, 2, 4)
FLAT = 0.2  # d ln(scale) / d ln(multiplier) below this for every kind: flat (no scale grows)
KINDS = ("embedding", "attention", "ffn", "block", "logits")


def axis_overrides(spec: ExperimentSpec, axis: str, k: int) -> List[str]:
    """The overrides scaling ``axis`` of ``spec`` by ``k``: every model key on that axis (width:
    d_model and an explicit d_ff, d_h, list of widths w_l, muP's m_width)."""
    return scaled(spec.model, axis, k)


def axes_of(spec: ExperimentSpec) -> List[str]:
    return axes(spec.model)


def _kind(name: str) -> Optional[str]:
    """A module's kind from its name in OLMo-core's Transformer (blocks.i.attention, ...)."""
    parts = name.split(".")
    if name == "embeddings":
        return "embedding"
    if name == "lm_head":
        return "logits"
    if len(parts) == 2 and parts[0] == "blocks":
        return "block"
    if len(parts) == 3 and parts[0] == "blocks":
        return {"attention": "attention", "feed_forward": "ffn", "feed_forward_moe": "ffn"}.get(
            parts[2]
        )
    return None


def _scales_per_step(
    spec: ExperimentSpec, steps: int, batch: int, seq: int, seed: int
) -> List[Dict[str, float]]:
    """{kind: mean |x|} of each step's forward (step 0: at init), then that step's update."""
    config = spec.model_config()
    config.init_seed = spec.train.seed
    model = config.build(init_device="cpu")
    model.init_weights(max_seq_len=seq, device=torch.device("cpu"))
    model.train()
    optim = optimizer(spec, config, "cpu").build(model)
    sums: Dict[str, List[float]] = {}

    def hook(kind):
        def record(_module, _inputs, output):
            x = output[0] if isinstance(output, tuple) else output
            x = getattr(x, "logits", x)
            sums.setdefault(kind, []).append(float(x.detach().abs().mean()))

        return record

    handles = [
        mod.register_forward_hook(hook(kind))
        for name, mod in model.named_modules()
        if (kind := _kind(name))
    ]
    gen = torch.Generator().manual_seed(seed)
    vocab = config.vocab_size
    out = []
    try:
        for _ in range(steps):
            ids = torch.randint(0, vocab, (batch, seq + 1), generator=gen)
            sums.clear()
            logits = model(ids[:, :-1])
            loss = F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1)
            )
            out.append({k: float(np.mean(v)) for k, v in sums.items()})
            optim.zero_grad(set_to_none=True)
            loss.backward()
            optim.step()
    finally:
        for h in handles:
            h.remove()
    return out


@dataclass
class CoordCheck:
    """Per axis: the scales {multiplier: [{kind: scale} per step]} and the slopes at the last
    step."""

    config: str
    steps: int
    scales: Dict[str, Dict[int, List[Dict[str, float]]]] = field(default_factory=dict)
    overrides: Dict[str, Dict[int, List[str]]] = field(default_factory=dict)

    def slopes(self, axis: str) -> Dict[str, float]:
        """{kind: least-squares slope of ln(scale at the last step) against ln(multiplier)}."""
        runs = self.scales[axis]
        x = np.log(sorted(runs))
        out = {}
        for kind in KINDS:
            y = [runs[m][-1].get(kind) for m in sorted(runs)]
            if all(v is not None and v > 0 for v in y):
                out[kind] = float(np.polyfit(x, np.log(y), 1)[0])
        return out

    def grows(self, axis: str) -> bool:
        return max(self.slopes(axis).values()) >= FLAT

    def verdict(self, axis: str) -> str:
        slopes = self.slopes(axis)
        kind = max(slopes, key=slopes.__getitem__)
        s = slopes[kind]
        shrink = [f"{k} as {axis}^{v:+.2f}" for k, v in slopes.items() if v <= -FLAT]
        if s >= FLAT:
            text = (
                f"grows with {axis}: {kind} scales as {axis}^{s:+.2f} (x{4**s:.2f} from x1 to x4)"
            )
        else:
            text = f"flat in {axis}: no sublayer's scale grows (largest slope {s:+.2f}, {kind})"
        return (
            text
            + (f"; shrinks: {', '.join(shrink)}" if shrink else "")
            + f"; after {self.steps} steps"
        )

    def summary(self) -> str:
        """What the width axis says about the parametrisation, then every axis's verdict."""
        head = (
            "standard-parametrisation-like: activations grow with the width (the LR that fits one "
            "width is too large for a wider one)"
            if self.grows("width")
            else "muP-like: no activation grows with the width"
        )
        return "\n".join([head, *(f"- {self.verdict(a)}" for a in self.scales)])

    def to_json(self) -> dict:
        return {
            "config": self.config,
            "steps": self.steps,
            "flat_below": FLAT,
            "axes": {
                a: {
                    "slopes": self.slopes(a),
                    "verdict": self.verdict(a),
                    "runs": {
                        str(m): {"overrides": self.overrides[a][m], "scales": s}
                        for m, s in runs.items()
                    },
                }
                for a, runs in self.scales.items()
            },
        }


def coord_check(
    config: str,
    overrides: Sequence[str] = (),
    axes: Optional[Sequence[str]] = None,
    steps: int = 10,
    batch: int = 8,
    seq: int = 64,
    seed: int = 0,
    say=print,
) -> CoordCheck:
    """Run the check on each axis (default: width, depth, and K for hourglass) of ``config``."""
    base = load_spec(config, list(overrides))
    torch.manual_seed(seed)
    check = CoordCheck(config, steps)
    for axis in axes or axes_of(base):
        check.scales[axis], check.overrides[axis] = {}, {}
        for k in MULTIPLIERS:
            extra = axis_overrides(base, axis, k)
            spec = load_spec(config, [*overrides, *extra])
            say(f"{axis} x{k}: {' '.join(extra)}")
            check.scales[axis][k] = _scales_per_step(spec, steps, batch, seq, seed)
            check.overrides[axis][k] = extra
    return check


def plot(check: CoordCheck, path) -> None:
    """One row per axis, one panel per sublayer kind: scale against step, a line per multiplier."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes = list(check.scales)
    fig, grid = plt.subplots(
        len(axes), len(KINDS), figsize=(3 * len(KINDS), 2.6 * len(axes)), squeeze=False
    )
    for row, axis in zip(grid, axes):
        for ax, kind in zip(row, KINDS):
            for m, steps in sorted(check.scales[axis].items()):
                ax.plot([s.get(kind, math.nan) for s in steps], label=f"{axis} x{m}")
            ax.set(title=f"{kind} ({axis})", xlabel="step", ylabel="mean |x|", yscale="log")
        row[0].legend(fontsize="small")
    fig.suptitle(check.config)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
