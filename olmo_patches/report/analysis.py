"""Per-layer analyses of a trained model on a validation batch (paper 2, Section 5, Figures 5-9).

For each transformer block l of a checkpoint's model, on one batch of N = batch x seq tokens:

- MLP activation utilisation (Figures 5, 6): the FFN's hidden activations A (N x units; SwiGLU's
  SiLU(W_1 x) * W_3 x; an hourglass layer's K sub-MLPs side by side, K d_h units). A unit is active
  on a token when |a| exceeds ``threshold`` times the layer's RMS activation; a unit active on no
  token of the batch is dead. ``dead_fraction`` = dead units / units; ``utilisation`` = the mean
  over units of the fraction of tokens each is active on. An MoE layer's experts have no per-unit
  hook: None.
- Residual-stream matrix entropy (Figure 7): Z = the block's output over its own width w_l (a
  variable-width layer's first w_l dims; d_model otherwise), N x w_l; p_i = the eigenvalues of the
  Gram matrix Z^T Z over their sum; H = -sum p_i ln p_i (nats), normalised: 0 when the stream
  collapses onto one direction, 1 when every direction it can have carries as much (the baseline's
  mid-layer "compression valley" is low).
- Participation ratio (Figure 9): PR = (sum lambda_i)^2 / sum lambda_i^2 of the same eigenvalues,
  the number of directions that carry the stream, and PR / w_l (the paper: below 5% mid-stack in the
  baseline).
- Logit lens (Figure 8): the model's own output head (final norm and LM head) applied to the block's
  output; the mean over tokens of the probability of the next token.

The paper names these metrics without defining their details, so where definitions in use differ the
analyses offer each, in :class:`Conventions` (the defaults are this project's choices, for the
reasons given there; ``scripts/analyze.py`` switches them):

- ``centre``: the Gram matrix of the column-centred stream (its covariance; default) or of the
  stream as it is. A common offset shared by every token is one direction carrying most of an
  uncentred Gram's trace, so uncentred the entropy of any stream with a large mean is near 0
  whatever the tokens do;
- ``pooling``: one matrix of all N tokens (default) or one per prompt (seq tokens), the metric
  averaged over prompts. Pooling measures directions across prompts too, and keeps N above w_l at
  the paper's widths (8 x 512 tokens against w_l up to 3040), where one prompt's 512 tokens cap the
  rank below w_l;
- ``normaliser``: the entropy over ln of the most directions this layer can have, min(N - 1, w_l)
  (min(N, w_l) uncentred; default), or over a fixed ln h (h: the model's d_model) for every layer.
  The per-layer normaliser rates a narrow layer against its own width (a 480-wide bottleneck at h
  1600 reads ln 1600 / ln 480 = 1.195 times its fixed-normaliser value); the fixed one compares
  absolute entropies (a layer wider than h can exceed 1).

A rank-r stream whose r directions carry equal variance has H = ln r and PR = r
(tests/test_analysis.py, with one constructed example per convention switch). Everything is computed
in float64 from the model's float32 activations, captured by forward hooks on the built OLMo-core
model (and, for the hourglass FFN, by wrapping its ``sub_mlp``).
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

from ..blocks import block_of
from .analysis_conventions import NORMALISERS, POOLINGS, THRESHOLD, Conventions

__all__ = [
    "dead_units",
    "matrix_entropy",
    "participation_ratio",
    "target_probability",
    "analyze_model",
    "checkpoint_spec",
    "load_checkpoint_model",
    "validation_batch",
    "analysis_figure",
    "write_json",
    "THRESHOLD",
    "NORMALISERS",
    "POOLINGS",
    "Conventions",
]


def _matrices(Z: torch.Tensor, pooling: str) -> List[torch.Tensor]:
    """The float64 matrices a metric is computed on: all tokens of Z (..., d) as one (pooled), or
    one per prompt (per_prompt: Z is (prompts, seq, d); a 2-D Z is one prompt)."""
    Z = Z.to(torch.float64)
    if pooling == "pooled" or Z.dim() == 2:
        return [Z.reshape(-1, Z.shape[-1])]
    return [z.reshape(-1, Z.shape[-1]) for z in Z.reshape(-1, *Z.shape[-2:])]


def _eigenvalues(Z: torch.Tensor, centre: bool = True) -> torch.Tensor:
    """Eigenvalues of the Gram matrix Z^T Z of the N x d matrix Z (columns centred first with
    ``centre``), from Z's singular values."""
    if centre:
        Z = Z - Z.mean(dim=0, keepdim=True)
    return torch.linalg.svdvals(Z) ** 2


def matrix_entropy(
    Z: torch.Tensor,
    centre: bool = True,
    pooling: str = "pooled",
    normaliser: str = "layer",
    h: Optional[int] = None,
) -> tuple[float, float]:
    """(H, normalised H) of the representations Z (..., d): H = -sum p ln p, p = the Gram's
    eigenvalues over their sum; normalised by ln min(N - 1, d) (ln min(N, d) uncentred) or,
    ``normaliser="fixed"``, by ln h. ``pooling="per_prompt"``: both averaged over Z's prompts (Z:
    prompts x seq x d)."""
    if normaliser == "fixed" and h is None:
        raise ValueError("normaliser='fixed' needs h, the model's width")
    Hs, normed = [], []
    for M in _matrices(Z, pooling):
        lam = _eigenvalues(M, centre)
        p = lam / lam.sum()
        p = p[p > 0]
        H = float(-(p * p.log()).sum())
        N, d = M.shape
        n = N - 1 if centre else N
        most = math.log(h if normaliser == "fixed" else min(n, d))  # type: ignore[arg-type]
        Hs.append(H)
        normed.append(H / most if most > 0 else 0.0)
    return sum(Hs) / len(Hs), sum(normed) / len(normed)


def participation_ratio(Z: torch.Tensor, centre: bool = True, pooling: str = "pooled") -> float:
    """(sum lambda)^2 / sum lambda^2 of the Gram eigenvalues of the representations Z (..., d),
    centred with ``centre``; ``pooling="per_prompt"``: averaged over Z's prompts (Z: prompts x seq x
    d)."""
    prs = [
        float(lam.sum() ** 2 / (lam**2).sum())
        for lam in (_eigenvalues(M, centre) for M in _matrices(Z, pooling))
    ]
    return sum(prs) / len(prs)


def dead_units(
    A: torch.Tensor, threshold: float = THRESHOLD, pooling: str = "pooled"
) -> tuple[float, float]:
    """(dead fraction, utilisation) of hidden activations A (..., units): active where |a| >
    threshold x RMS(A) (the whole batch's); dead: active on no token (``pooling="per_prompt"``: on
    no token of a prompt, the fraction averaged over the prompts of A, prompts x seq x units);
    utilisation: the mean over units of each one's active fraction (the same in both poolings when
    the prompts are equally long)."""
    A = A.to(torch.float64).abs()
    rms = float(A.pow(2).mean().sqrt())
    dead = []
    for M in _matrices(A, pooling):
        active = M > threshold * rms if rms > 0 else torch.zeros_like(M, dtype=torch.bool)
        dead.append(float((~active.any(dim=0)).double().mean()))
    active = A > threshold * rms if rms > 0 else torch.zeros_like(A, dtype=torch.bool)
    return sum(dead) / len(dead), float(active.double().mean())


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
    # how the metrics were taken (Conventions)
    conventions: Dict[str, object] = field(default_factory=lambda: asdict(Conventions()))


@torch.no_grad()
def analyze_model(
    model: torch.nn.Module,
    tokens: torch.Tensor,
    m,
    *,
    name: str = "",
    checkpoint: str = "",
    threshold: float = THRESHOLD,
    conventions: Conventions = Conventions(),
) -> Analysis:
    """The four analyses per block of an OLMo-core Transformer of model spec ``m`` on ``tokens``
    (batch, seq + 1): inputs tokens[:, :-1], targets tokens[:, 1:]; the FFN hidden units as the
    block kind hands them (``BlockKind.record_hidden``); the stream metrics and dead units taken as
    ``conventions`` say."""
    kind = block_of(m)
    model.eval()
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    blocks = list(model.blocks.values())
    outputs: Dict[int, torch.Tensor] = {}
    hidden: Dict[int, List[torch.Tensor]] = {i: [] for i in range(len(blocks))}
    undo: List[Callable[[], None]] = []
    for i, b in enumerate(blocks):
        undo.append(
            b.register_forward_hook(lambda _m, _a, out, i=i: outputs.__setitem__(i, out)).remove
        )
        undo += kind.record_hidden(m, b, hidden[i].append)
    try:
        logits = model(inputs)
    finally:
        for u in undo:
            u()
    c = conventions
    result = Analysis(name, checkpoint, m.block, int(inputs.numel()), conventions=asdict(c))
    batch = inputs.shape[0]
    for i, b in enumerate(blocks):
        out = outputs[i]
        width = int(getattr(b, "width", out.shape[-1]))
        Z = out[..., :width].reshape(batch, -1, width)
        H, H_norm = matrix_entropy(Z, c.centre, c.pooling, c.normaliser, h=int(model.d_model))
        PR = participation_ratio(Z, c.centre, c.pooling)
        if hidden[i]:
            A = torch.cat([h.reshape(batch, -1, h.shape[-1]) for h in hidden[i]], dim=-1)
            units = int(A.shape[-1])
            dead, util = dead_units(A, threshold, c.pooling)
        else:
            units = dead = util = None
        lens = target_probability(model.lm_head(out), targets)
        result.layers.append(
            LayerStats(i + 1, width, units, dead, util, H, H_norm, PR, PR / width, lens)
        )
    result.final_target_probability = target_probability(logits, targets)
    return result


def validation_batch(
    path: str | Path, dtype: str, batch: int, seq: int, offset: int = 0
) -> torch.Tensor:
    """``batch`` consecutive windows of seq + 1 tokens from a token file (numpy raw, ``dtype``)."""
    data = np.memmap(path, dtype=np.dtype(dtype), mode="r")
    need = batch * (seq + 1)
    if offset + need > len(data):
        raise ValueError(f"{path}: {len(data):,} tokens, fewer than batch x (seq + 1) = {need:,}")
    return torch.from_numpy(np.array(data[offset : offset + need], dtype=np.int64)).view(
        batch, seq + 1
    )


def checkpoint_spec(checkpoint: str | Path):
    """(spec, step folder) of a checkpoint (RUN/stepN) or a run folder (its latest complete
    checkpoint), the spec from the run folder's config.yaml, whose model the checkpoint's weights
    must fit (their shapes, from its metadata). Raises ValueError (a ConfigError for a misfit)
    naming what is missing or differs."""
    from ..config import load_spec
    from ..train.checkpoints import latest_complete
    from ..train.checkpoints import check_checkpoint_fits

    path = Path(checkpoint)
    if not path.is_dir():
        raise ValueError(f"CHECKPOINT={checkpoint}: no such folder")
    if (latest := latest_complete(path)) is None:
        raise ValueError(
            f"CHECKPOINT={checkpoint}: neither a checkpoint (stepN) nor a run folder with one"
        )
    path = Path(latest)
    config = path.parent / "config.yaml"
    if not config.is_file():
        raise ValueError(f"CHECKPOINT={checkpoint}: no config.yaml beside it ({config})")
    spec = load_spec(config, ["train.hardware=none", "train.device=cpu"])
    check_checkpoint_fits(path, spec, f"CHECKPOINT={path}")
    return spec, path


def load_checkpoint_model(spec, path: str | Path):
    """The model of a checkpoint, as :func:`checkpoint_spec` found it (its spec and step folder,
    already checked against each other), on CPU in float32."""
    from ..config import vocab_size
    from ..train.checkpoints import load_model_state

    model = spec.model.build(vocab_size(spec)).build(init_device="cpu")
    model.load_state_dict(load_model_state(path))
    return model.float().eval()


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
