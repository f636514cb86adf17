"""Per-layer analyses of a trained model on a validation batch (paper 2, Section 5, Figures 5-9).

For each transformer block l of a checkpoint's model, on one batch of N = batch x seq tokens:

- MLP activation utilisation (Figures 5, 6): the FFN's hidden activations A (N x units; SwiGLU's
  SiLU(W_1 x) * W_3 x; an hourglass layer's K sub-MLPs side by side, K d_h units). A unit is active on a
  token when |a| exceeds ``threshold`` times the layer's RMS activation; a unit active on no token of
  the batch is dead. ``dead_fraction`` = dead units / units; ``utilisation`` = the mean over units of the
  fraction of tokens each is active on. An MoE layer's experts have no per-unit hook: None.
- Residual-stream matrix entropy (Figure 7): Z = the block's output over its own width w_l (a
  variable-width layer's first w_l dims; d_model otherwise), N x w_l, columns centred; p_i = the
  eigenvalues of Z^T Z over their sum; H = -sum p_i ln p_i (nats), normalised by ln min(N - 1, w_l),
  the most a centred N x w_l matrix can have: 0 when the stream collapses onto one direction, 1 when
  every direction carries as much (the baseline's mid-layer "compression valley" is low).
- Participation ratio (Figure 9): PR = (sum lambda_i)^2 / sum lambda_i^2 of the same eigenvalues, the
  number of directions that carry the stream, and PR / w_l (the paper: below 5% mid-stack in the baseline).
- Logit lens (Figure 8): the model's own output head (final norm and LM head) applied to the block's
  output; the mean over tokens of the probability of the next token.

A rank-r stream whose r directions carry equal variance has H = ln r and PR = r (tests/test_analysis.py).
Everything is computed in float64 from the model's float32 activations, captured by forward hooks on
the built OLMo-core model (and, for the hourglass FFN, by wrapping its ``sub_mlp``).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "dead_units",
    "matrix_entropy",
    "participation_ratio",
    "target_probability",
    "analyze_model",
    "load_checkpoint_model",
    "validation_batch",
    "analysis_figure",
    "write_json",
    "THRESHOLD",
]

THRESHOLD = 0.01  # a unit is active on a token when |a| > 1% of its layer's RMS activation


def _eigenvalues(Z: torch.Tensor) -> torch.Tensor:
    """Eigenvalues of Zc^T Zc (Zc: Z with its columns centred), float64, from Z's singular values."""
    Z = Z.reshape(-1, Z.shape[-1]).to(torch.float64)
    Z = Z - Z.mean(dim=0, keepdim=True)
    return torch.linalg.svdvals(Z) ** 2


def matrix_entropy(Z: torch.Tensor) -> tuple[float, float]:
    """(H, H / ln min(N - 1, d)) of the N x d representations Z: H = -sum p ln p, p = eigenvalues / sum."""
    lam = _eigenvalues(Z)
    p = lam / lam.sum()
    p = p[p > 0]
    H = float(-(p * p.log()).sum())
    N, d = Z.reshape(-1, Z.shape[-1]).shape
    most = math.log(min(N - 1, d))
    return H, H / most if most > 0 else 0.0


def participation_ratio(Z: torch.Tensor) -> float:
    """(sum lambda)^2 / sum lambda^2 of the centred N x d representations' covariance eigenvalues."""
    lam = _eigenvalues(Z)
    return float(lam.sum() ** 2 / (lam**2).sum())


def dead_units(A: torch.Tensor, threshold: float = THRESHOLD) -> tuple[float, float]:
    """(dead fraction, utilisation) of hidden activations A (..., units): active where |a| > threshold x
    RMS(A); dead: active on no token; utilisation: the mean over units of each one's active fraction."""
    A = A.reshape(-1, A.shape[-1]).to(torch.float64).abs()
    rms = float(A.pow(2).mean().sqrt())
    active = A > threshold * rms if rms > 0 else torch.zeros_like(A, dtype=torch.bool)
    return float((~active.any(dim=0)).double().mean()), float(active.double().mean())


def target_probability(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """The mean over tokens of softmax(logits)[target] (logits (..., V), targets (...))."""
    logp = F.log_softmax(logits.to(torch.float64), dim=-1)
    return float(logp.gather(-1, targets.unsqueeze(-1)).exp().mean())


@dataclass
class LayerStats:
    layer: int  # 1..L
    width: int  # the residual width the stream metrics use (w_l or d_model)
    units: Optional[int]  # FFN hidden units (None: an MoE layer)
    dead_fraction: Optional[float]
    utilisation: Optional[float]
    entropy: float  # nats
    normalized_entropy: float
    participation_ratio: float
    participation_ratio_fraction: float  # PR / width
    target_probability: float  # logit lens


@dataclass
class Analysis:
    name: str
    checkpoint: str
    block: str
    tokens: int
    layers: List[LayerStats] = field(default_factory=list)
    final_target_probability: float = math.nan  # the model's own output


def _hidden_hooks(block: torch.nn.Module, record: Callable[[torch.Tensor], None]) -> List[Callable[[], None]]:
    """Capture a block's FFN hidden activations: OLMo-core's FeedForward (the input of w2), the
    hourglass FFN (each sub-MLP's SiLU(gate) * value, by wrapping its sub_mlp). Returns undo callables."""
    from olmo_core.nn.feed_forward import FeedForward

    from ..nn.hourglass import HourglassFeedForward

    undo = []
    for module in block.modules():
        if isinstance(module, HourglassFeedForward):
            original = module.sub_mlp

            def sub_mlp(x, w_down, w_up, _original=original):
                gate, value = F.linear(x, w_down).chunk(2, dim=-1)
                record(F.silu(gate) * value)
                return _original(x, w_down, w_up)

            module.sub_mlp = sub_mlp  # the instance attribute shadows the static method
            undo.append(lambda m=module: m.__dict__.pop("sub_mlp", None))
        elif isinstance(module, FeedForward):
            handle = module.w2.register_forward_pre_hook(lambda _m, args: record(args[0]))
            undo.append(handle.remove)
    return undo


@torch.no_grad()
def analyze_model(
    model: torch.nn.Module,
    tokens: torch.Tensor,
    *,
    name: str = "",
    checkpoint: str = "",
    block: str = "",
    threshold: float = THRESHOLD,
) -> Analysis:
    """The four analyses per block of an OLMo-core Transformer on ``tokens`` (batch, seq + 1): inputs
    tokens[:, :-1], targets tokens[:, 1:]."""
    model.eval()
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    blocks = list(model.blocks.values())
    outputs: Dict[int, torch.Tensor] = {}
    hidden: Dict[int, List[torch.Tensor]] = {i: [] for i in range(len(blocks))}
    undo: List[Callable[[], None]] = []
    for i, b in enumerate(blocks):
        undo.append(b.register_forward_hook(lambda _m, _a, out, i=i: outputs.__setitem__(i, out)).remove)
        undo += _hidden_hooks(b, hidden[i].append)
    try:
        logits = model(inputs)
    finally:
        for u in undo:
            u()
    result = Analysis(name, checkpoint, block, int(inputs.numel()))
    for i, b in enumerate(blocks):
        out = outputs[i]
        width = int(getattr(b, "width", out.shape[-1]))
        Z = out[..., :width]
        H, H_norm = matrix_entropy(Z)
        PR = participation_ratio(Z)
        if hidden[i]:
            A = torch.cat([h.reshape(-1, h.shape[-1]) for h in hidden[i]], dim=-1) if len(hidden[i]) > 1 else hidden[i][0]
            units = int(A.shape[-1])
            dead, util = dead_units(A, threshold)
        else:
            units = dead = util = None
        lens = target_probability(model.lm_head(out), targets)
        result.layers.append(LayerStats(i + 1, width, units, dead, util, H, H_norm, PR, PR / width, lens))
    result.final_target_probability = target_probability(logits, targets)
    return result


def validation_batch(path: str | Path, dtype: str, batch: int, seq: int, offset: int = 0) -> torch.Tensor:
    """``batch`` consecutive windows of seq + 1 tokens from a token file (numpy raw, ``dtype``)."""
    data = np.memmap(path, dtype=np.dtype(dtype), mode="r")
    need = batch * (seq + 1)
    if offset + need > len(data):
        raise ValueError(f"{path}: {len(data):,} tokens, fewer than batch x (seq + 1) = {need:,}")
    return torch.from_numpy(np.array(data[offset : offset + need], dtype=np.int64)).view(batch, seq + 1)


def load_checkpoint_model(checkpoint: str | Path):
    """(spec, model, step folder) of a checkpoint (RUN/stepN) or a run folder (its latest complete
    checkpoint), on CPU in float32. Raises ValueError naming what is missing."""
    from ..config import load_spec, vocab_size
    from ..train.checkpoints import latest_complete, load_model_state

    path = Path(checkpoint)
    if not path.is_dir():
        raise ValueError(f"CHECKPOINT={checkpoint}: no such folder")
    if (latest := latest_complete(path)) is None:
        raise ValueError(f"CHECKPOINT={checkpoint}: neither a checkpoint (stepN) nor a run folder with one")
    path = Path(latest)
    config = path.parent / "config.yaml"
    if not config.is_file():
        raise ValueError(f"CHECKPOINT={checkpoint}: no config.yaml beside it ({config})")
    spec = load_spec(config, ["train.hardware=none", "train.device=cpu"])
    model = spec.model.build(vocab_size(spec)).build(init_device="cpu")
    model.load_state_dict(load_model_state(path))
    return spec, model.float().eval(), path


def write_json(analyses: Sequence[Analysis], out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({a.name: asdict(a) for a in analyses}, indent=1) + "\n")
    return out


PANELS = (
    ("utilisation", "MLP activation utilisation\n(mean fraction of tokens a unit is active)"),
    ("normalized_entropy", "residual stream matrix entropy\n(normalised)"),
    ("participation_ratio_fraction", "participation ratio / width"),
    ("target_probability", "logit lens: p(next token)"),
)


def analysis_figure(analyses: Sequence[Analysis], out: Path, title: str = "") -> Path:
    """One figure, four panels (the metrics against relative depth l / L), the variants overlaid."""
    from .figures import save_figure  # first: it puts matplotlib on its Agg backend

    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(10, 7.5))
    for ax, (key, label) in zip(axes.flat, PANELS):
        for a in analyses:
            L = len(a.layers)
            pts = [(s.layer / L, getattr(s, key)) for s in a.layers if getattr(s, key) is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=a.name)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("layer / L")
        ax.set_xlim(0, 1.02)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=11)
    out.parent.mkdir(parents=True, exist_ok=True)
    return save_figure(fig, out, dpi=110)
