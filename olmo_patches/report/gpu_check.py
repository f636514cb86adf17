"""One GPU acceptance run (scripts/gpu_check.py): what a cluster user needs to trust before a run.

1. precision: every block type (baseline pre/post norm, hourglass pre/post, variable width in each
   resize mode) as a 2-layer model; logits and parameter gradients under bf16 autocast (what a
   one-GPU run computes) against fp32 on the same weights, as relative errors ||a - b|| / ||b||.
   Tolerance: BF16_TOL = 16 u with u = 2^-8, bf16's unit roundoff (8 significant bits): a few
   roundings per matmul input, accumulated in fp32, over a couple of layers.
2. kernels: flash attention (flash_2/flash_3, when it imports) against torch SDPA, same weights,
   bf16: logits within BF16_TOL; torch.compile (OLMo-core's per-block apply_compile) against eager.
3. trainer: real OLMo-core Trainer steps (train.train) on synthetic uniform tokens for the 113M and 1B
   baseline and hourglass configs, with the hardware preset's micro-batch, compile and checkpointing
   choices: tokens/s over the steps after warm-up, MFU against hardware.CARDS' dense bf16 peak (model
   FLOPs per token: OLMo-core's count), peak memory (max_memory_allocated) next to hardware.estimate
   for the same setting, and the hourglass/baseline ratio of tokens/s.
5. float8 (train.float8=tensorwise against bf16, same data and steps): trainer tokens/s ratio for the
   1B baseline and a 1B hourglass whose matmuls are float8-aligned (K=4, d_h=2048: the baseline's FFN
   parameters; the solved 1B hourglass has d_model 3192, not a multiple of 16, so nothing of it would
   convert), target FLOAT8_SPEEDUP (OLMo-core's 1B: 55k -> 65k tokens/s per H100); loss parity over
   the first steps within FLOAT8_LOSS_TOL. Without float8 matmuls (CPU, pre-SM89) the speed row is
   reported, not judged (torchao emulates).
4. resume: a run stopped (checkpointed) at step 2 and resumed to step 4 against the uninterrupted
   run: losses and weights (bit-identity is reported; GPU backward kernels are not deterministic, so
   the pass mark is BF16_TOL).

``--device cpu --tiny`` runs the same code at tiny shapes (the demo model, sequence 32), fp32 trainer
steps, no memory statistics: the CPU test that keeps this path working.
"""

from __future__ import annotations

import copy
import json
import logging
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F
from olmo_core.train.callbacks import Callback

from ..config import ExperimentSpec, attention_backend, load_spec, vocab_size
from ..hardware import GIB, estimate, known_card
from ..nn.attention import set_attention_backend
from ..train import train
from ..train.checkpoints import load_model_state
from ..train.resume import ResumeCheckpointerCallback

__all__ = ["BF16_TOL", "FLOAT8_SPEEDUP", "check_float8", "CheckResult", "TrainResult", "GpuCheck", "run_gpu_check", "to_markdown", "to_json"]

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]
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
TRAIN_CONFIGS = {"113M": ("configs/113M/baseline.yaml", "configs/113M/hourglass.yaml"),
                 "1B": ("configs/1B/baseline.yaml", "configs/1B/hourglass.yaml")}


@dataclass
class CheckResult:
    section: str
    name: str
    error: Optional[float]  # relative error (None: skipped)
    tolerance: float
    detail: str = ""

    @property
    def passed(self) -> Optional[bool]:
        return None if self.error is None else self.error <= self.tolerance


@dataclass
class TrainResult:
    scale: str
    variant: str
    config: str
    micro_batch: int
    compile: bool
    activation_checkpointing: bool
    attention: str
    tokens_per_s: float
    mfu: Optional[float]  # percent of the card's dense bf16 peak (None: no datasheet peak on this device)
    peak_mem_gib: Optional[float]  # max_memory_allocated (None on CPU)
    estimate_gib: float  # hardware.estimate for the same model, sequence length and micro-batch
    ratio: float = 1.0  # tokens/s over the baseline's


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
    config = spec.model.build(vocab_size(spec))
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


def check_precision(device: torch.device, tiny: bool, seq: int) -> list[CheckResult]:
    out = []
    for name, overrides in BLOCK_TYPES.items():
        spec = _spec(overrides, tiny, device.type)
        model = _build(spec, device)
        ids = torch.randint(0, vocab_size(spec), (2, seq + 1), generator=torch.Generator().manual_seed(1)).to(device)
        ref_logits, ref_grads = _forward_backward(model, ids, bf16=False)
        logits, grads = _forward_backward(model, ids, bf16=True)
        grad_err = max(_rel(g, r) for g, r in zip(grads, ref_grads))
        out.append(CheckResult("bf16 vs fp32", f"{name}: logits", _rel(logits, ref_logits), BF16_TOL))
        out.append(CheckResult("bf16 vs fp32", f"{name}: gradients (worst tensor)", grad_err, 2 * BF16_TOL))
    return out


def check_kernels(device: torch.device, tiny: bool, seq: int) -> list[CheckResult]:
    spec = _spec(["train.precision=bf16"], tiny, device.type)
    ids = torch.randint(0, vocab_size(spec), (2, seq + 1), generator=torch.Generator().manual_seed(2)).to(device)
    sdpa = _build(spec, device)
    ref, _ = _forward_backward(sdpa, ids, bf16=True)
    out = []
    flash = attention_backend(spec, device.type)
    if flash.name.startswith("flash"):
        model = _build(spec, device, backend=flash.name)
        model.load_state_dict(sdpa.state_dict())
        logits, _ = _forward_backward(model, ids, bf16=True)
        out.append(CheckResult("kernels", f"{flash.name} vs torch SDPA logits (bf16)", _rel(logits, ref), BF16_TOL))
    else:
        out.append(CheckResult("kernels", "flash attention vs torch SDPA", None, BF16_TOL, f"auto -> {flash}"))
    if device.type != "cuda":  # inductor's C++ build for a CPU takes minutes on a shared machine
        out.append(CheckResult("kernels", "torch.compile on vs off", None, BF16_TOL, "checked on CUDA only"))
        return out
    compiled = copy.deepcopy(sdpa)
    compiled.apply_compile()  # type: ignore[operator]
    logits, _ = _forward_backward(compiled, ids, bf16=True)
    out.append(CheckResult("kernels", "torch.compile on vs off logits (bf16)", _rel(logits, ref), BF16_TOL))
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
    path = folder / "synthetic.npy"
    rng = np.random.default_rng(0)
    rng.integers(1, vocab, tokens, dtype=np.uint32).tofile(path)
    return str(path)


def _train_overrides(folder: Path, tokens_file: str, seq: int, batch: int, steps: int, device: str, extra: list[str]) -> list[str]:
    return [f"run.save_folder={folder}", f"data.work_dir={folder / 'cache'}", "data.source=numpy", "data.tokenizer=dolma2",
            f"data.paths=[{tokens_file}]", f"data.sequence_length={seq}", f"train.global_batch_size={batch}",
            f"train.max_steps={steps}", "train.max_tokens=null", "train.warmup_steps=1", "train.warmup_tokens=null",
            f"train.device={device}", "eval.validation_sets=[]", "eval.downstream_tasks=[]", "run.log_interval=1",
            "run.ephemeral_save_interval=null", "run.wandb_project=null", *extra]


def check_training(device: torch.device, work: Path, tiny: bool, steps: int, batch: int, seq: int, warmup: int,
                   scales: list[str]) -> list[TrainResult]:
    card = known_card(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    configs = {"tiny": ("configs/demo/baseline.yaml", "configs/demo/hourglass.yaml")} if tiny else {s: TRAIN_CONFIGS[s] for s in scales}
    extra = ["model.vocab_size=null", "train.precision=fp32", "train.hardware=none"] if tiny else ["train.precision=bf16"]
    if tiny:
        extra += ["model.d_model=32", "model.n_heads=2", "model.n_layers=2", "model.d_h=16", "train.micro_batch_size=null"]
    tokens_file = _synthetic_tokens(work, 100_000, (steps + 1) * batch * (seq + 1))
    results = []
    for scale, pair in configs.items():
        for variant, config in zip(("baseline", "hourglass"), pair):
            folder = work / f"{scale}-{variant}"
            spec = load_spec(REPO / config, _train_overrides(folder, tokens_file, seq, batch, steps, device.type, extra))
            timer = _StepTimer(device)
            train(spec, callbacks={"gpu_check": timer, "checkpointer": ResumeCheckpointerCallback(enabled=False)})
            t = spec.train
            times = timer.times[warmup - 1:]
            tps = (len(times) - 1) * batch * seq / (times[-1] - times[0])
            model = spec.model.build(vocab_size(spec))
            fpt = model.build(init_device="meta").num_flops_per_token(seq)
            est = estimate(model, seq, 1)
            per_seq = est.per_sequence_ac if t.activation_checkpointing else est.per_sequence
            assert t.micro_batch_size is not None
            results.append(TrainResult(
                scale, variant, config, t.micro_batch_size, bool(t.compile), bool(t.activation_checkpointing),
                attention_backend(spec, device.type).name, tps,
                100 * tps * fpt / card.bf16_flops if card and card.bf16_flops else None,
                torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else None,
                (est.static + t.micro_batch_size * per_seq) / GIB,
            ))
            log.info(f"gpu_check: {scale} {variant}: {tps:,.0f} tokens/s")
    for r in results:
        base = next(b for b in results if b.scale == r.scale and b.variant == "baseline")
        r.ratio = r.tokens_per_s / base.tokens_per_s
    return results


def check_resume(device: torch.device, work: Path, tiny: bool) -> list[CheckResult]:
    seq, batch = (32, 4) if tiny else (512, 8)
    tokens_file = _synthetic_tokens(work, 4096, 5 * batch * (seq + 1))
    extra = ["train.hardware=none", "train.micro_batch_size=null", "run.save_interval=2", "data.tokenizer=dolma2",
             "train.precision=" + ("fp32" if device.type == "cpu" else "bf16"), "model.d_model=64", "model.n_heads=2",
             "model.vocab_size=null"]  # dolma2's: OLMo-core's dry-run batch draws from the tokenizer's vocabulary
    runs = {}
    for name in ("straight", "resumed"):
        folder = work / f"resume-{name}"
        overrides = _train_overrides(folder, tokens_file, seq, batch, 4, device.type, extra)
        if name == "resumed":
            train(load_spec(REPO / "configs" / "demo" / "baseline.yaml", [*overrides, "run.stop_at_step=2"]))
        train(load_spec(REPO / "configs" / "demo" / "baseline.yaml", overrides))
        runs[name] = load_model_state(folder / "step4")
    a, b = runs["straight"], runs["resumed"]
    exact = all(torch.equal(a[k], b[k]) for k in a)
    worst = max(_rel(b[k], a[k]) for k in a)
    return [CheckResult("resume", "stopped at step 2, resumed to 4: weights vs uninterrupted (worst tensor)", worst, BF16_TOL,
                        "bit-identical" if exact else "not bit-identical")]


FLOAT8_SPEEDUP = 1.20  # float8 / bf16 tokens/s the anchors publish (OLMo-core 1B: 65k / 55k; torchtitan 8B: 1.28)
FLOAT8_LOSS_TOL = 0.05  # float8 vs bf16 loss, relative, at each of the first steps
# (label, config, overrides): float8-aligned 1B shapes (every matmul dim a multiple of 16)
FLOAT8_CONFIGS = (("1B baseline", "configs/1B/baseline.yaml", []),
                  ("1B hourglass K4 d_h 2048", "configs/1B/baseline.yaml", ["model.block=hourglass", "model.K=4", "model.d_h=2048"]))


def check_float8(device: torch.device, work: Path, tiny: bool, steps: int, batch: int, seq: int, warmup: int) -> list[CheckResult]:
    """train.float8=tensorwise against bf16 (off): tokens/s ratio and the first steps' losses."""
    from ..nn.float8 import has_float8_matmuls
    from ..train.metrics import read_metrics

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
                  batch: int = 32, seq: int = 4096, scales: Optional[list[str]] = None,
                  progress: Callable[[str], None] = print) -> GpuCheck:
    dev = torch.device(device)
    if tiny:
        steps, warmup, batch, seq = 3, 1, 4, 32
    start = time.perf_counter()
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    result = GpuCheck(name, torch.__version__)
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        for label, fn in (("bf16 vs fp32", lambda: check_precision(dev, tiny, 64 if tiny else 1024)),
                          ("kernels", lambda: check_kernels(dev, tiny, 64 if tiny else 1024)),
                          ("resume", lambda: check_resume(dev, Path(tmp), tiny))):
            progress(f"{label} ...")
            result.checks += fn()
        progress("float8 ...")
        result.checks += check_float8(dev, Path(tmp), tiny, steps, batch, seq, warmup)
        progress("trainer steps ...")
        result.train = check_training(dev, Path(tmp), tiny, steps, batch, seq, warmup, scales or list(TRAIN_CONFIGS))
    result.seconds = time.perf_counter() - start
    return result


def to_markdown(result: GpuCheck) -> str:
    lines = [f"gpu_check on {result.device}, torch {result.torch}, {result.seconds:.0f} s", "",
             "| check | relative error | tolerance | result |", "|---|---|---|---|"]
    for c in result.checks:
        verdict = {True: "pass", False: "FAIL", None: "skipped"}[c.passed]
        err = "-" if c.error is None else f"{c.error:.2e}"
        lines.append(f"| {c.section}: {c.name} | {err} | {c.tolerance:.2e} | {verdict}{' (' + c.detail + ')' if c.detail else ''} |")
    lines += ["", "| scale | variant | micro-batch | compile | act. ckpt | attention | tokens/s | MFU % | peak mem GiB | estimate GiB | est./peak | vs baseline |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result.train:
        mfu = "-" if r.mfu is None else f"{r.mfu:.1f}"
        mem = "-" if r.peak_mem_gib is None else f"{r.peak_mem_gib:.2f}"
        ratio = "-" if not r.peak_mem_gib else f"{r.estimate_gib / r.peak_mem_gib:.2f}"
        lines.append(f"| {r.scale} | {r.variant} | {r.micro_batch} | {'on' if r.compile else 'off'} | "
                     f"{'on' if r.activation_checkpointing else 'off'} | {r.attention} | {r.tokens_per_s:,.0f} | {mfu} | {mem} | "
                     f"{r.estimate_gib:.2f} | {ratio} | {r.ratio:.3f} |")
    return "\n".join(lines) + "\n"


def to_json(result: GpuCheck) -> str:
    data: dict[str, Any] = asdict(result)
    for c, raw in zip(result.checks, data["checks"]):
        raw["passed"] = c.passed
    return json.dumps(data, indent=1)
