"""Coordinate check: does a parametrisation keep every activation in scale as the model grows?

muP's check (Yang et al., "Tensor Programs V", 2022, section 7 and appendix D; microsoft/mup's
``get_coord_data``): the model at x1, x2, x4, x8 its width, trained ``steps`` steps on one fixed
batch of random tokens (the same at every step, width and seed) with the config's init, optimizer
groups and LR (constant), over several init seeds. Per sublayer kind (``GROUPS``; attention, FFN
and block averaged over layers) it records on that batch the init scale, mean |x_0|, and the
update, mean |x_t - x_0| after t = 1..steps updates; each gives a slope d ln(scale) /
d ln(multiplier). Under muP both are Theta(1) in the width (Tensor Programs V, table 3), save the
logits, whose init vanishes by design (:func:`allowed`). A slope outside muP's range by ``BOUND``
(x8 moves the scale 1.68x) is out of scale, growing or shrinking, with its cause: the init (or a
multiplier), the learning rate, or both (the standard parametrisation: one init std and LR at
every width). Depth and the kind's own axes (the hourglass's K) are measured alike; muP claims
nothing about them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from ..blocks.base import scaled
from ..config import ExperimentSpec, load_spec, vocab_size
from .optimizer import optimizer

__all__ = ["MULTIPLIERS", "BOUND", "GROUPS", "CoordCheck", "coord_check", "plot"]

MULTIPLIERS = (1, 2, 4, 8)
BOUND = 0.25  # |slope| at or above: flagged (x8 moves the scale by 8^0.25 = 1.68x or more)
GROUPS = {  # each kind recorded, and the parameters whose scaling sets it
    "embedding": "embedding (its init and multiplier)",
    "attention logits": "query/key matrices and the attention scale",
    "attention": "attention matrices (init, LR)",
    "ffn": "FFN matrices (init, LR)",
    "block": "residual stream (every block's output multiplier)",
    "logits": "readout (LM head: init, LR, logit multiplier)",
}
LOGITS = ("attention logits", "logits")  # sums over d_head, d_model: muP divides them by it


def _kind(name: str) -> Optional[str]:
    """A module's kind from its name in OLMo-core's Transformer (blocks.i.attention, ...)."""
    p = name.split(".")
    if p[0] != "blocks":
        return {"embeddings": "embedding", "lm_head": "logits"}.get(name)
    sub = {"attention": "attention", "feed_forward": "ffn", "feed_forward_moe": "ffn"}
    return {2: "block", 3: sub.get(p[-1])}.get(len(p)) or (
        "attention logits" if p[2:] == ["attention", "backend"] else None
    )


def _attention_logits(backend, args) -> torch.Tensor:
    """q.k x scale of every causal pair, from the attention backend's (q, k, v) input."""
    q, k = args[0][0].float(), args[0][1].float()
    scale = backend.scale if backend.scale is not None else q.shape[-1] ** -0.5
    s = torch.einsum("bthd,bshd->bhts", q, k) * scale
    return s[..., torch.ones(s.shape[-2:], dtype=torch.bool).tril()]


def _model(spec: ExperimentSpec, seed: int):
    """The config's model at init seed ``train.seed + seed`` and its optimizer."""
    config = spec.model_config()
    config.init_seed = spec.train.seed + seed
    model = config.build(init_device="cpu")
    model.init_weights(max_seq_len=spec.data.sequence_length, device=torch.device("cpu"))
    return model, optimizer(spec, config, "cpu").build(model)


def _hooks(model, seen: Dict[str, torch.Tensor], dims: Dict[str, int]) -> list:
    """Forward hooks keeping each recorded module's output in ``seen`` (the attention logits: from
    the backend's input), and the dimension each logit sums over in ``dims``."""

    def keep(name, x):
        x = x[0] if isinstance(x, tuple) else x
        seen[name] = getattr(x, "logits", x).detach().float().clone()

    def logits(name, backend, args):
        dims["attention logits"] = args[0][0].shape[-1]  # d_head (grows alike in every layer)
        keep(name, _attention_logits(backend, args))

    handles = []
    for name, mod in model.named_modules():
        if (kind := _kind(name)) == "attention logits":
            handles.append(mod.register_forward_pre_hook(partial(logits, name)))
        elif kind:
            handles.append(mod.register_forward_hook(lambda m, a, x, n=name: keep(n, x)))
        if kind == "logits":
            dims["logits"] = mod.w_out.in_features  # d_model
    return handles


def _run(spec: ExperimentSpec, ids: torch.Tensor, steps: int, seed: int):
    """({kind: [mean |x_0|, then mean |x_t - x_0| for t = 1..steps]}, {kind: its dimension}) on
    the batch ``ids``, each kind averaged over its modules (layers)."""
    model, optim = _model(spec, seed)
    model.train()
    seen: Dict[str, torch.Tensor] = {}
    dims: Dict[str, int] = {}
    handles = _hooks(model, seen, dims)
    out: Dict[str, List[float]] = {}
    first: Dict[str, torch.Tensor] = {}
    try:
        for t in range(steps + 1):
            logits = model(ids[:, :-1])
            first = first or dict(seen)
            by_kind: Dict[str, List[float]] = {}
            for name, x in seen.items():
                d = x - first[name] if t else x
                by_kind.setdefault(str(_kind(name)), []).append(float(d.abs().mean()))
            for kind, v in by_kind.items():
                out.setdefault(kind, []).append(float(np.mean(v)))
            if t < steps:
                loss = F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())
                optim.zero_grad(set_to_none=True)
                loss.backward()
                optim.step()
    finally:
        for h in handles:
            h.remove()
    return out, dims


def _slope(y: np.ndarray) -> float:
    """Least-squares slope of ln(y) against ln(multiplier) (NaN where some y is 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ly = np.log(y)
    return (
        float(np.polyfit(np.log(MULTIPLIERS[: len(y)]), ly, 1)[0])
        if np.isfinite(ly).all()
        else math.nan
    )


def allowed(kind: str, what: str, h: float) -> Tuple[float, float]:
    """muP's range of a kind's slope (``what``: init or update); ``h``: the slope of the dimension
    a logit sums over (d_head, d_model). Hidden activations: flat. A logit (q.k / d_head, readout /
    m_width) of independent factors vanishes as dim^-0.5 at init (or faster: a zero readout); its
    update is Theta(1) where the trained alignment of its factors dominates, and vanishes as
    dim^-0.5 where the change carried through random weights does (a check's small widths)."""
    if kind not in LOGITS:
        return -BOUND, BOUND
    return (-math.inf, -0.5 * h + BOUND) if what == "init" else (-0.5 * h - BOUND, BOUND)


def _slope_text(axis: str, what: str, v: dict) -> str:
    bad = v["out of muP's range"].get(what)
    return f"{what} {axis}^{v[what]:+.2f}" + (
        f" (muP: {bad[0]:+.2f} to {bad[1]:+.2f})" if bad else ""
    )


@dataclass
class CoordCheck:
    """Per axis: the overrides per multiplier, each kind's scales (multipliers, seeds, 1 + steps:
    the init, then the update after each step) and the logits' dimensions (multipliers)."""

    config: str
    steps: int
    seeds: int
    overrides: Dict[str, List[List[str]]] = field(default_factory=dict)
    scales: Dict[str, Dict[str, np.ndarray]] = field(default_factory=dict)
    dims: Dict[str, Dict[str, np.ndarray]] = field(default_factory=dict)

    def judged(self, axis: str) -> Dict[str, dict]:
        """{kind: its init and update slopes (the seeds' mean; the update's over the steps too),
        the ranges of muP they leave, and the cause: its init (std or forward multiplier) where the
        init leaves its range, its learning rate where the update moves apart from the init (by
        BOUND or more, or alone)}."""
        out = {}
        for kind, a in self.scales[axis].items():
            s = {"init": _slope(a[..., 0].mean(1)), "update": _slope(a[..., 1:].mean((1, 2)))}
            h = _slope(self.dims[axis][kind]) if kind in LOGITS else 0.0
            ranges = {w: allowed(kind, w, h) for w in s}
            bad = {w: r for w, r in ranges.items() if not r[0] < s[w] < r[1]}  # NaN: zero init
            lr = "update" in bad and ("init" not in bad or abs(s["update"] - s["init"]) >= BOUND)
            cause = ["init/multiplier"] * ("init" in bad) + ["learning rate"] * lr
            out[kind] = {**s, "out of muP's range": bad, "cause": " and ".join(cause)}
        return out

    def causes(self, axis: str) -> Dict[str, str]:
        return {k: v["cause"] for k, v in self.judged(axis).items() if v["cause"]}

    def summary(self) -> str:
        """The width's verdict (what muP promises), then a line per kind of each axis."""
        out = []
        if "width" in self.scales:
            causes = "; ".join(f"{k}: {c}" for k, c in self.causes("width").items())
            out.append(
                f"not muP in width (an LR tuned at one width does not carry to another): {causes}"
                if causes
                else "muP-like: every init and update in scale across widths"
            )
        for axis in self.scales:
            out.append(f"{axis} x{'/'.join(map(str, MULTIPLIERS))}, {self.seeds} seeds, "
                       f"{self.steps} steps:")  # fmt: skip
            for kind, v in self.judged(axis).items():
                slopes = ", ".join(_slope_text(axis, w, v) for w in ("init", "update"))
                state = f"OUT OF SCALE: {v['cause']}" if v["cause"] else "in scale"
                out.append(f"- {kind} [{GROUPS[kind]}]: {slopes}: {state}")
        return "\n".join(out)

    def to_json(self) -> dict:
        return {
            **{k: getattr(self, k) for k in ("config", "steps", "seeds")},
            "multipliers": list(MULTIPLIERS),
            "bound": BOUND,
            "axes": {
                a: {
                    "overrides": self.overrides[a],
                    "verdicts": self.judged(a),
                    "dims": {k: v.tolist() for k, v in self.dims[a].items()},
                    "scales": {k: v.tolist() for k, v in self.scales[a].items()},
                }
                for a in self.scales
            },
        }


def coord_check(
    config: str,
    overrides: Sequence[str] = (),
    axes: Sequence[str] = ("width",),
    steps: int = 5,
    seeds: int = 3,
    batch: int = 2,
    seq: int = 16,
    say=print,
) -> CoordCheck:
    """Run the check on each axis of ``config`` (width: muP's; depth and K: described)."""
    base = load_spec(config, list(overrides))
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab_size(base), (batch, seq + 1), generator=gen)
    check = CoordCheck(config, steps, seeds)
    for axis in axes:
        check.overrides[axis] = [scaled(base.model, axis, k) for k in MULTIPLIERS]
        runs = []
        for k, extra in zip(MULTIPLIERS, check.overrides[axis]):
            say(f"{axis} x{k}: {' '.join(extra)} ({seeds} seeds)")
            spec = load_spec(config, [*overrides, *extra])
            runs.append([_run(spec, ids, steps, s) for s in range(seeds)])
        check.scales[axis] = {
            kind: np.array([[r[0][kind] for r in m] for m in runs]) for kind in runs[0][0][0]
        }
        check.dims[axis] = {kind: np.array([m[0][1][kind] for m in runs]) for kind in runs[0][0][1]}
    return check


def plot(check: CoordCheck, path) -> None:
    """mup's plot: per axis and kind, scale against the multiplier (log-log), the init dashed and
    one line per step of updates, means over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes, kinds = list(check.scales), list(GROUPS)
    fig, grid = plt.subplots(
        len(axes), len(kinds), figsize=(3 * len(kinds), 2.8 * len(axes)), squeeze=False
    )
    for row, axis in zip(grid, axes):
        for ax, kind in zip(row, kinds):
            if kind not in check.scales[axis]:
                ax.set_axis_off()
                continue
            a = check.scales[axis][kind].mean(1)
            ax.plot(MULTIPLIERS, a[:, 0], "k--", label="init |x_0|")
            for t, y in enumerate(a[:, 1:].T, 1):
                ax.plot(MULTIPLIERS, y, color=plt.cm.viridis(t / check.steps), label=f"t={t}")
            ax.set(title=kind, xlabel=axis, xscale="log", yscale="log")
            ax.set_xticks(MULTIPLIERS, [f"x{m}" for m in MULTIPLIERS])
            ax.set_xticks([], minor=True)
        row[0].set_ylabel("mean |x_0|, |x_t - x_0|")
        row[0].legend(fontsize="x-small")
    fig.suptitle(check.config)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
