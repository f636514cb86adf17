"""One GPU acceptance run (scripts/gpu_check.py): what a cluster user needs to trust before a run.

The checks are the list :data:`CHECKS` (section, function of a :class:`Context` -> rows); a check
added there runs, prints and counts like the others. Each row passes within its tolerance, fails, or
is skipped with the reason (only where the device cannot run it: no row is skipped on CUDA).

1. bf16 vs fp32: every block type (baseline pre/post norm, hourglass pre/post, variable width in each
   resize mode) as a 2-layer model; logits and parameter gradients under bf16 autocast against fp32
   on the same weights, as relative errors ||a - b|| / ||b||. Tolerance: BF16_TOL = 16 u with u =
   2^-8, bf16's unit roundoff (8 significant bits): a few roundings per matmul input, accumulated in
   fp32, over a couple of layers.
2. attention kernels: at every head dim of every shipped config (configs/*/**.yaml; --tiny: three), the trainer's
   attention backend (``auto``: flash-attn where it runs) in bf16 against torch SDPA in fp32, logits
   and gradients. On CUDA a flash-attn that does not import FAILS (``--no-flash``: skipped, saying so);
   on a CPU torch SDPA in bf16 stands in for the kernel (the same rows and arithmetic).
3. compile: every block type compiled per block as the trainer does (OLMo-core's apply_compile,
   inductor; on a CPU the aot_eager backend stands in: inductor's C++ build takes minutes) against
   eager: logits, gradients, and the loss after a few AdamW steps; the graphs dynamo compiled are
   counted (a variable-width model compiles once per width: recompiles, not a failure).
4. resume: a run stopped (checkpointed) at step 2 and resumed to step 4 against the uninterrupted
   run: every step's loss, and AdamW's state (exp_avg, exp_avg_sq, step) at step 4 (bit-identity is
   reported; GPU backward kernels are not deterministic, so the pass mark is BF16_TOL).
5. trainer: real OLMo-core Trainer steps (train.train) on synthetic uniform tokens for the 113M and 1B
   baseline and hourglass configs, with the hardware preset's micro-batch, compile and checkpointing
   choices: tokens/s over the steps after warm-up, MFU against hardware.CARDS' dense bf16 peak (model
   FLOPs per token: OLMo-core's count), peak memory (max_memory_allocated) next to hardware.estimate
   for the same setting, and the hourglass/baseline ratio of tokens/s. Under torchrun
   (``--nproc-per-node N``) the same steps run under FSDP2 with bf16 parameters, each rank's peak
   against the estimate for N ranks.
6. float8 (train.float8=tensorwise against bf16, same data and steps): trainer tokens/s ratio for the
   1B baseline and a 1B hourglass whose matmuls are float8-aligned (K=4, d_h=2048: the baseline's FFN
   parameters; the solved 1B hourglass has d_model 3192, not a multiple of 16, so nothing of it would
   convert), target FLOAT8_SPEEDUP (OLMo-core's 1B: 55k -> 65k tokens/s per H100); loss parity over
   the first steps within FLOAT8_LOSS_TOL. Without float8 matmuls (CPU, pre-SM89) the speed row is
   reported, not judged (torchao emulates).

``--device cpu --tiny`` runs the same code at tiny shapes (the demo model, sequence 32), fp32 trainer
steps, no memory statistics: the CPU test that keeps this path working.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import logging
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F
from olmo_core.train.callbacks import Callback

from ..config import ExperimentSpec, vocab_size
from ..launch.layout import Layout, attention_backend, memory_estimate
from ..launch.layout import load_and_resolve as load_spec
from ..launch.hardware import GIB, known_card
from ..nn.attention import head_dims, resolve_attention_backend, set_attention_backend
from ..resources import data_root
from ..train import train
from ..train.checkpoints import load_optim_state
from ..launch.run_folder import read_metrics
from ..train.resume import ResumeCheckpointerCallback

__all__ = ["BF16_TOL", "CHECKS", "Check", "CheckResult", "Context", "TrainResult", "GpuCheck", "shipped_head_dims",
           "flash_backend", "FLOAT8_SPEEDUP", "check_float8", "set_ratios", "run_gpu_check", "to_markdown", "to_json", "from_json"]

log = logging.getLogger(__name__)
REPO = data_root()  # configs/ of the checkout or the installed wheel
BF16_TOL = 16 * 2.0**-8  # 16 unit roundoffs of bf16 (module docstring)

# (name, ModelSpec overrides on top of the demo model): every block type of nn/
BLOCK_TYPES = {
    "baseline pre": [],
    "baseline post": ["model.norm_placement=post"],
    "hourglass pre": ["model.block=hourglass", "model.K=2", "model.d_h=32"],
    "hourglass post": ["model.block=hourglass", "model.K=2", "model.d_h=32", "model.norm_placement=post"],
    **{f"variable width {mode}": ["model.block=variable_width", "model.widths.schedule=list", "model.widths.values=[128,64]",
                                  f"model.widths.resize={mode}"] for mode in ("carry_forward", "zero", "learned")},
}
COMPILE_TINY = ("baseline pre", "hourglass pre", "variable width learned")  # --tiny compiles one of each family
TRAIN_CONFIGS = {"113M": ("configs/113M/baseline.yaml", "configs/113M/hourglass.yaml"),
                 "1B": ("configs/1B/baseline.yaml", "configs/1B/hourglass.yaml")}


@dataclass
class CheckResult:
    section: str
    name: str
    error: Optional[float]  # relative error (None: no number, see verdict)
    tolerance: float
    detail: str = ""
    verdict: Optional[bool] = None  # a row without a number: False failed (a missing kernel), None skipped

    @property
    def passed(self) -> Optional[bool]:
        return self.verdict if self.error is None else self.error <= self.tolerance


@dataclass
class Context:
    """What every check is given: the device, the shapes, a scratch folder and the command line's choices."""

    device: torch.device
    work: Path
    tiny: bool = False
    seq: int = 1024  # tokens per sequence in the model-level checks
    flash: bool = True  # False: --no-flash (a CUDA machine without flash-attn, on purpose)


@dataclass(frozen=True)
class Check:
    section: str
    run: Callable[[Context], list[CheckResult]]


@dataclass
class TrainResult:
    scale: str
    variant: str
    config: str
    micro_batch: int
    compile: bool
    activation_checkpointing: str  # the mode (hardware.ActivationCheckpointing)
    attention: str
    tokens_per_s: float
    mfu: Optional[float]  # percent of the card's dense bf16 peak (None: no datasheet peak on this device)
    peak_mem_gib: Optional[float]  # max_memory_allocated (None on CPU)
    estimate_gib: float  # hardware.estimate for the same model, sequence length, micro-batch, mode and ranks
    ratio: float = 1.0  # tokens/s over the baseline's
    rank: int = 0  # under torchrun: this row's rank of world_size (FSDP2)
    world_size: int = 1


@dataclass
class GpuCheck:
    device: str
    torch: str
    checks: list[CheckResult] = field(default_factory=list)
    train: list[TrainResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> list[CheckResult]:
        return [c for c in self.checks if c.passed is False]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().float().flatten(), b.detach().float().flatten()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _spec(overrides: list[str], tiny: bool, device: str) -> ExperimentSpec:
    small = ["model.d_model=128", "model.n_heads=2", "model.n_layers=2"] if not tiny else ["model.d_model=128", "model.n_heads=4", "model.n_layers=2"]
    return load_spec(REPO / "configs" / "demo" / "baseline.yaml", [*small, f"train.device={device}", "train.hardware=none", *overrides])


def _build(spec: ExperimentSpec, device: torch.device, backend: str = "torch", seed: int = 0) -> torch.nn.Module:
    config = spec.model_config()
    set_attention_backend(config, backend)
    torch.manual_seed(seed)
    model = config.build(init_device="cpu")
    model.init_weights(device=torch.device("cpu"))
    return model.to(device)


def _forward_backward(model: torch.nn.Module, ids: torch.Tensor, bf16: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = model(ids[:, :-1])
    F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten()).backward()
    return logits.detach().float(), [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def _ids(spec: ExperimentSpec, ctx: Context, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab_size(spec), (2, ctx.seq + 1), generator=torch.Generator().manual_seed(seed)).to(ctx.device)


def _compare(section: str, name: str, got: tuple[torch.Tensor, list[torch.Tensor]], ref: tuple[torch.Tensor, list[torch.Tensor]],
             detail: str = "") -> list[CheckResult]:
    """Logits within BF16_TOL and every gradient (its worst tensor) within 2 BF16_TOL."""
    grad_err = max(_rel(g, r) for g, r in zip(got[1], ref[1]))
    return [CheckResult(section, f"{name}: logits", _rel(got[0], ref[0]), BF16_TOL, detail),
            CheckResult(section, f"{name}: gradients (worst tensor)", grad_err, 2 * BF16_TOL, detail)]


def check_precision(ctx: Context) -> list[CheckResult]:
    out = []
    for name, overrides in BLOCK_TYPES.items():
        spec = _spec(overrides, ctx.tiny, ctx.device.type)
        model = _build(spec, ctx.device)
        ids = _ids(spec, ctx, 1)
        ref = _forward_backward(model, ids, bf16=False)
        out += _compare("bf16 vs fp32", name, _forward_backward(model, ids, bf16=True), ref)
    return out


@functools.cache
def shipped_head_dims() -> tuple[int, ...]:
    """Every head dim of every config under configs/ (variable width: each layer's w_l / n_heads)."""
    dims: set[int] = set()
    for path in sorted((REPO / "configs").rglob("*/*.yaml")):  # configs/base*.yaml are bases, not runs
        spec = load_spec(path, ["train.hardware=none", "train.device=cpu"])
        dims.update(head_dims(spec.model_config()))
    return tuple(sorted(dims))


def flash_backend(ctx: Context, dims: list[int]) -> tuple[Optional[str], Optional[CheckResult]]:
    """The kernel the trainer would use for these head dims on this device (``auto``), or why none:
    on CUDA a flash-attn that does not import is a failure row unless --no-flash (then a skip row)."""
    cuda = ctx.device.type == "cuda"
    choice = resolve_attention_backend("auto", dims, cuda=cuda, bf16=True)
    if choice.name.startswith("flash") or not cuda:
        return choice.name, None
    if not ctx.flash:
        return None, CheckResult("attention kernels", "flash attention", None, BF16_TOL, f"--no-flash: {choice}")
    return None, CheckResult("attention kernels", "flash attention", None, BF16_TOL,
                             f"{choice}: install flash-attn (scripts/gpu_check.py --wheelhouse) or pass --no-flash", verdict=False)


def check_attention(ctx: Context) -> list[CheckResult]:
    out = []
    dims = shipped_head_dims()
    if ctx.tiny:  # the smallest, the largest and the first that is not a multiple of 8
        dims = tuple(sorted({dims[0], dims[-1], next((d for d in dims if d % 8), dims[0])}))
    for head_dim in dims:
        backend, missing = flash_backend(ctx, [head_dim])
        if missing is not None:
            missing.name += f" at head_dim {head_dim}"
            out.append(missing)
            continue
        assert backend is not None
        spec = _spec(["model.n_heads=2", f"model.head_dim={head_dim}", "model.n_layers=1"], ctx.tiny, ctx.device.type)
        ids = _ids(spec, ctx, 2)
        ref = _forward_backward(_build(spec, ctx.device), ids, bf16=False)
        got = _forward_backward(_build(spec, ctx.device, backend=backend), ids, bf16=True)
        stand_in = "" if ctx.device.type == "cuda" else "CPU: torch SDPA in bf16 stands in for the kernel"
        out += _compare("attention kernels", f"{backend} (bf16) vs torch SDPA (fp32), head_dim {head_dim}", got, ref, stand_in)
    return out


def _compile(model: torch.nn.Module, device: torch.device) -> None:
    """Per-block compile as the trainer does it (OLMo-core's apply_compile: inductor); aot_eager on a CPU."""
    if device.type == "cuda":
        model.apply_compile()  # type: ignore[operator]
        return
    for block in model.blocks.values():  # type: ignore[union-attr]
        block.compile(backend="aot_eager", fullgraph=False)
    model.lm_head.compile(backend="aot_eager", fullgraph=False)  # type: ignore[union-attr]


def _train_steps(model: torch.nn.Module, ids: torch.Tensor, steps: int, bf16: bool) -> float:
    """The loss after ``steps`` AdamW steps on one batch."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        _forward_backward(model, ids, bf16)
        opt.step()
    with torch.no_grad(), torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = model(ids[:, :-1])
    return float(F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten()))


def check_compile(ctx: Context) -> list[CheckResult]:
    from torch._dynamo.utils import counters

    bf16 = ctx.device.type == "cuda"
    out = []
    for name, overrides in BLOCK_TYPES.items():
        if ctx.tiny and name not in COMPILE_TINY:
            continue
        spec = _spec(overrides, ctx.tiny, ctx.device.type)
        eager = _build(spec, ctx.device)
        compiled = copy.deepcopy(eager)
        torch._dynamo.reset()
        before = int(counters["stats"]["unique_graphs"])
        _compile(compiled, ctx.device)
        ids = _ids(spec, ctx, 3)
        ref = _forward_backward(eager, ids, bf16)
        got = _forward_backward(compiled, ids, bf16)
        graphs = int(counters["stats"]["unique_graphs"]) - before
        backend = "inductor" if ctx.device.type == "cuda" else "aot_eager (CPU stand-in for inductor)"
        detail = f"{backend}, {graphs} graphs compiled"
        out += _compare("compile", f"{name}: compiled vs eager", got, ref, detail)
        loss, ref_loss = _train_steps(compiled, ids, 3, bf16), _train_steps(eager, ids, 3, bf16)
        out.append(CheckResult("compile", f"{name}: loss after 3 AdamW steps, compiled vs eager", abs(loss - ref_loss) / ref_loss,
                               BF16_TOL, f"{loss:.4f} vs {ref_loss:.4f}"))
    return out


class _StepTimer(Callback):
    """Wall time after every step (device synchronised) and the peak allocated memory."""

    def __init__(self, device: torch.device):
        self.device = device
        self.times: list[float] = []

    def pre_train(self):
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def post_step(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.times.append(time.perf_counter())


def _synthetic_tokens(folder: Path, vocab: int, tokens: int) -> str:
    """The same uniform tokens on every rank, each written whole before it is renamed into place."""
    path = folder / f"synthetic-{vocab}-{tokens}.npy"
    rng = np.random.default_rng(0)
    part = folder / f".{path.name}.{os.getpid()}"
    rng.integers(1, vocab, tokens, dtype=np.uint32).tofile(part)
    os.replace(part, path)
    return str(path)


def _train_overrides(folder: Path, tokens_file: str, seq: int, batch: int, steps: int, device: str, extra: list[str]) -> list[str]:
    return [f"run.save_folder={folder}", f"data.work_dir={folder / 'cache'}", "data.source=numpy", "data.tokenizer=dolma2",
            f"data.paths=[{tokens_file}]", f"data.sequence_length={seq}", f"train.global_batch_size={batch}",
            f"train.max_steps={steps}", "train.max_tokens=null", "train.warmup_steps=1", "train.warmup_tokens=null",
            f"train.device={device}", "eval.validation_sets=[]", "eval.downstream_tasks=[]", "run.log_interval=1",
            "run.ephemeral_save_interval=null", "run.wandb_project=null", *extra]


def check_training(device: torch.device, work: Path, tiny: bool, steps: int, batch: int, seq: int, warmup: int,
                   scales: list[str], variants: tuple[str, ...] = ("baseline", "hourglass")) -> list[TrainResult]:
    card = known_card(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    configs = {"tiny": ("configs/demo/baseline.yaml", "configs/demo/hourglass.yaml")} if tiny else {s: TRAIN_CONFIGS[s] for s in scales}
    extra = ["model.vocab_size=null", "train.precision=fp32", "train.hardware=none"] if tiny else ["train.precision=bf16"]
    if tiny:
        extra += ["model.d_model=32", "model.n_heads=2", "model.n_layers=2", "model.d_h=16", "train.micro_batch_size=null"]
    tokens_file = _synthetic_tokens(work, 100_000, (steps + 1) * batch * (seq + 1))
    results = []
    for scale, pair in configs.items():
        for variant, config in zip(("baseline", "hourglass"), pair):
            if variant not in variants:
                continue
            folder = work / f"{scale}-{variant}"
            spec = load_spec(REPO / config, _train_overrides(folder, tokens_file, seq, batch, steps, device.type, extra))
            timer = _StepTimer(device)
            train(spec, callbacks={"gpu_check": timer, "checkpointer": ResumeCheckpointerCallback(enabled=False)})
            t = spec.train
            times = timer.times[warmup - 1:]
            tps = (len(times) - 1) * batch * seq / (times[-1] - times[0])
            model = spec.model_config()
            fpt = model.build(init_device="meta").num_flops_per_token(seq)
            layout = Layout.from_env()
            assert t.micro_batch_size is not None and t.activation_checkpointing is not None
            results.append(TrainResult(
                scale, variant, config, t.micro_batch_size, bool(t.compile), str(t.activation_checkpointing),
                attention_backend(spec, device.type).name, tps,
                100 * tps * fpt / card.bf16_flops if card and card.bf16_flops else None,
                torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else None,
                memory_estimate(spec, layout).total(t.micro_batch_size, t.activation_checkpointing) / GIB,
                rank=int(os.environ.get("RANK", 0)), world_size=layout.world_size,
            ))
            log.info(f"gpu_check: {scale} {variant}: {tps:,.0f} tokens/s")
    return set_ratios(results)


def set_ratios(results: list[TrainResult]) -> list[TrainResult]:
    """Each row's tokens/s over its scale's baseline on the same rank (when that row is there)."""
    for r in results:
        base = next((b for b in results if b.scale == r.scale and b.variant == "baseline" and b.rank == r.rank), None)
        r.ratio = r.tokens_per_s / base.tokens_per_s if base else float("nan")
    return results


def check_resume(ctx: Context) -> list[CheckResult]:
    device, work, tiny = ctx.device, ctx.work, ctx.tiny
    seq, batch = (32, 4) if tiny else (512, 8)
    tokens_file = _synthetic_tokens(work, 4096, 5 * batch * (seq + 1))
    extra = ["train.hardware=none", "train.micro_batch_size=null", "run.save_interval=2", "data.tokenizer=dolma2",
             "train.precision=" + ("fp32" if device.type == "cpu" else "bf16"), "model.d_model=64", "model.n_heads=2",
             "model.vocab_size=null"]  # dolma2's: OLMo-core's dry-run batch draws from the tokenizer's vocabulary
    folders = {}
    for name in ("straight", "resumed"):
        folder = folders[name] = work / f"resume-{name}"
        overrides = _train_overrides(folder, tokens_file, seq, batch, 4, device.type, extra)
        if name == "resumed":
            train(load_spec(REPO / "configs" / "demo" / "baseline.yaml", [*overrides, "run.stop_at_step=2"]))
        train(load_spec(REPO / "configs" / "demo" / "baseline.yaml", overrides))
    losses = {name: {s: m["train/CE loss"] for s, m in read_metrics(f).items() if "train/CE loss" in m} for name, f in folders.items()}
    out = []
    steps = sorted(losses["straight"])
    if sorted(losses["resumed"]) != steps or steps != [1, 2, 3, 4]:
        out.append(CheckResult("resume", "per-step losses", None, BF16_TOL, f"steps logged: {steps} vs {sorted(losses['resumed'])}", verdict=False))
    else:
        worst = max(abs(losses["resumed"][s] - losses["straight"][s]) / abs(losses["straight"][s]) for s in steps)
        exact = all(losses["resumed"][s] == losses["straight"][s] for s in steps)
        out.append(CheckResult("resume", "stopped at step 2, resumed to 4: loss at every step vs uninterrupted (worst)", worst,
                               BF16_TOL, "bit-identical" if exact else "not bit-identical"))
    a, b = (load_optim_state(folders[name] / "step4") for name in ("straight", "resumed"))
    if a.keys() != b.keys() or not a:
        out.append(CheckResult("resume", "AdamW state at step 4", None, BF16_TOL, "state keys differ", verdict=False))
    else:
        worst = max(_rel(b[k], a[k]) for k in a)
        exact = all(torch.equal(a[k], b[k]) for k in a)
        out.append(CheckResult("resume", f"AdamW state at step 4 vs uninterrupted ({len(a)} tensors: exp_avg, exp_avg_sq, step; worst)",
                               worst, BF16_TOL, "bit-identical" if exact else "not bit-identical"))
    return out


# The checks, in order (trainer steps run after them, see run_gpu_check). Add a check here.
CHECKS: list[Check] = [
    Check("bf16 vs fp32", check_precision),
    Check("attention kernels", check_attention),
    Check("compile", check_compile),
    Check("resume", check_resume),
]


FLOAT8_SPEEDUP = 1.20  # float8 / bf16 tokens/s the anchors publish (OLMo-core 1B: 65k / 55k; torchtitan 8B: 1.28)
FLOAT8_LOSS_TOL = 0.05  # float8 vs bf16 loss, relative, at each of the first steps
# (label, config, overrides): float8-aligned 1B shapes (every matmul dim a multiple of 16)
FLOAT8_CONFIGS = (("1B baseline", "configs/1B/baseline.yaml", []),
                  ("1B hourglass K4 d_h 2048", "configs/1B/baseline.yaml", ["model.block=hourglass", "model.K=4", "model.d_h=2048"]))


def check_float8(device: torch.device, work: Path, tiny: bool, steps: int, batch: int, seq: int, warmup: int) -> list[CheckResult]:
    """train.float8=tensorwise against bf16 (off): tokens/s ratio and the first steps' losses."""
    from ..nn.float8 import has_float8_matmuls
    from ..launch.run_folder import read_metrics

    extra = ["model.vocab_size=null", "train.hardware=none", "model.d_model=32", "model.n_heads=2", "model.n_layers=2",
             "model.d_h=16", "train.micro_batch_size=null"] if tiny else ["train.precision=bf16"]
    tokens_file = _synthetic_tokens(work, 100_000, (steps + 1) * batch * (seq + 1))
    judged = has_float8_matmuls(device)
    results = []
    for label, config, overrides in FLOAT8_CONFIGS:
        tps, losses = {}, {}
        for f8 in ("off", "tensorwise"):
            folder = work / f"float8-{label.replace(' ', '_')}-{f8}"
            spec = load_spec(REPO / config, [*overrides, *_train_overrides(folder, tokens_file, seq, batch, steps, device.type, extra),
                                             f"train.float8={f8}"])
            timer = _StepTimer(device)
            train(spec, callbacks={"gpu_check": timer, "checkpointer": ResumeCheckpointerCallback(enabled=False)})
            times = timer.times[warmup - 1:]
            tps[f8] = (len(times) - 1) * batch * seq / (times[-1] - times[0])
            losses[f8] = [m["train/CE loss"] for _, m in sorted(read_metrics(folder).items()) if "train/CE loss" in m]
        ratio = tps["tensorwise"] / tps["off"]
        detail = f"{tps['tensorwise']:,.0f} / {tps['off']:,.0f} tokens/s = {ratio:.3f}x (target >= {FLOAT8_SPEEDUP}x)"
        results.append(CheckResult("float8", f"{label}: tokens/s float8 / bf16", FLOAT8_SPEEDUP / ratio if judged else None, 1.0,
                                   detail if judged else detail + ", torchao emulation: not judged"))
        worst = max(abs(a - b) / abs(b) for a, b in zip(losses["tensorwise"], losses["off"]))
        results.append(CheckResult("float8", f"{label}: loss float8 vs bf16, first {len(losses['off'])} steps (worst)", worst,
                                   FLOAT8_LOSS_TOL, " ".join(f"{a:.4f}/{b:.4f}" for a, b in zip(losses["tensorwise"], losses["off"]))))
        log.info(f"gpu_check: float8 {label}: {detail}")
    return results


def run_gpu_check(device: str = "cuda", *, tiny: bool = False, work: Optional[Path] = None, steps: int = 8, warmup: int = 3,
                  batch: int = 32, seq: int = 4096, scales: Optional[list[str]] = None, flash: bool = True,
                  only: Optional[list[str]] = None, variants: tuple[str, ...] = ("baseline", "hourglass"),
                  progress: Callable[[str], None] = print) -> GpuCheck:
    """Every check of :data:`CHECKS` (or the sections in ``only``; "trainer" names the trainer steps)."""
    dev = torch.device(device)
    if tiny:
        steps, warmup, batch, seq = 3, 1, 4, 32
    start = time.perf_counter()
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    result = GpuCheck(name, torch.__version__)
    with _scratch(work) as tmp:
        ctx = Context(dev, Path(tmp), tiny, 64 if tiny else 1024, flash)
        for check in CHECKS:
            if only is None or check.section in only:
                progress(f"{check.section} ...")
                result.checks += check.run(ctx)
        if only is None or "float8" in only:
            progress("float8 ...")
            result.checks += check_float8(dev, Path(tmp), tiny, steps, batch, seq, warmup)
        if only is None or "trainer" in only:
            progress("trainer steps ...")
            result.train = check_training(dev, Path(tmp), tiny, steps, batch, seq, warmup, scales or list(TRAIN_CONFIGS), variants)
    result.seconds = time.perf_counter() - start
    return result


@contextlib.contextmanager
def _scratch(work: Optional[Path]):
    """A scratch folder: a fresh temporary one, or under torchrun WORK/ranks, one save folder for all ranks."""
    if int(os.environ.get("WORLD_SIZE", 1)) == 1:
        with tempfile.TemporaryDirectory(dir=work) as tmp:
            yield tmp
        return
    folder = Path(work or ".") / "ranks"
    folder.mkdir(parents=True, exist_ok=True)
    yield str(folder)


def to_markdown(result: GpuCheck) -> str:
    lines = [f"gpu_check on {result.device}, torch {result.torch}, {result.seconds:.0f} s", "",
             "| check | relative error | tolerance | result |", "|---|---|---|---|"]
    for c in result.checks:
        verdict = {True: "pass", False: "FAIL", None: "skipped"}[c.passed]
        err = "-" if c.error is None else f"{c.error:.2e}"
        lines.append(f"| {c.section}: {c.name} | {err} | {c.tolerance:.2e} | {verdict}{' (' + c.detail + ')' if c.detail else ''} |")
    lines += ["", "| scale | variant | rank | micro-batch | compile | act. ckpt | attention | tokens/s | MFU % | peak mem GiB | estimate GiB | est./peak | vs baseline |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result.train:
        mfu = "-" if r.mfu is None else f"{r.mfu:.1f}"
        mem = "-" if r.peak_mem_gib is None else f"{r.peak_mem_gib:.2f}"
        ratio = "-" if not r.peak_mem_gib else f"{r.estimate_gib / r.peak_mem_gib:.2f}"
        lines.append(f"| {r.scale} | {r.variant} | {r.rank} of {r.world_size} | {r.micro_batch} | {'on' if r.compile else 'off'} | "
                     f"{r.activation_checkpointing} | {r.attention} | {r.tokens_per_s:,.0f} | {mfu} | {mem} | "
                     f"{r.estimate_gib:.2f} | {ratio} | {r.ratio:.3f} |")
    return "\n".join(lines) + "\n"


def to_json(result: GpuCheck) -> str:
    data: dict[str, Any] = asdict(result)
    for c, raw in zip(result.checks, data["checks"]):
        raw["passed"] = c.passed
    return json.dumps(data, indent=1)


def from_json(text: str) -> GpuCheck:
    """A result :func:`to_json` wrote (a torchrun rank's, merged by scripts/gpu_check.py)."""
    data = json.loads(text)
    checks = [CheckResult(**{k: v for k, v in c.items() if k != "passed"}) for c in data.pop("checks")]
    train = [TrainResult(**r) for r in data.pop("train")]
    return GpuCheck(**data, checks=checks, train=train)
