"""Training throughput, peak memory and MFU of the baseline, hourglass and variable-width models.

One run builds every variant of a scale from its YAML config (``ModelSpec.build(...).build()``, the
trainer's own model, with the attention backend the trainer picks on this device), then times
forward + backward (cross-entropy on random tokens, gradients dropped after each step;
``--optimizer``: and an AdamW step) with the variants interleaved: repeat r runs the variants
in an order rotated by r, each for ``steps`` steps. The reported tokens/s is the median over
repeats, and each ratio to the baseline is the median of the repeats' paired ratios, so slow
drifts of a shared machine cancel.

FLOPs are the model's own ``num_flops_per_token(seq_len)`` (what OLMo-core's SpeedMonitorCallback
uses for MFU; tests/test_performance.py holds it against torch's FlopCounterMode). MFU divides the
achieved model FLOP/s by a peak: on a GPU the datasheet's dense bf16 peak (OLMo-core's table, plus
the H200, which OLMo-core's table would count as an A100); on a CPU no datasheet applies, so the
peak is *measured*: the best FLOP/s of a large fp32 matmul on this machine.

Peak memory: on CUDA ``max_memory_allocated`` during the variant's steps, less what other variants
hold, plus the variant's own weights; on a CPU (no allocator statistics) the weights, their
gradients, and the bytes autograd saves for backward in one step (distinct storages, measured
with saved-tensor hooks): an estimate of the same quantity.
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from olmo_core.train.callbacks.speed_monitor import get_device_peak_flops_per_second

from ..config import load_spec
from ..config.bench_scales import SCALES
from ..launch.cards import known_card
from ..nn.attention import head_dims, resolve_attention_backend, set_attention_backend
from ..nn.accounting import breakdown
from ..resources import data_root

__all__ = ["run_bench", "format_results", "as_json"]

REPO = data_root()  # configs/ of the checkout or the installed wheel


def measured_matmul_flops(
    device: torch.device, dtype: torch.dtype, n: int = 2048, tries: int = 10
) -> float:
    """The best FLOP/s of an n x n x n matmul on this device: the CPU's stand-in for a datasheet
    peak."""
    a, b = (
        torch.randn(n, n, device=device, dtype=dtype),
        torch.randn(n, n, device=device, dtype=dtype),
    )
    best = 0.0
    for _ in range(tries + 2):
        _sync(device)
        t = time.perf_counter()
        a @ b
        _sync(device)
        best = max(best, 2 * n**3 / (time.perf_counter() - t))
    return best


def peak_flops_per_second(device: torch.device, dtype: torch.dtype) -> tuple[float, str]:
    """(peak FLOP/s, where it comes from) for MFU on this device."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        half = dtype in (torch.bfloat16, torch.float16)
        if half and (card := known_card(name)) is not None and card.bf16_flops is not None:
            return card.bf16_flops, f"{name}: datasheet dense bf16 (launch/cards.py)"
        peak = get_device_peak_flops_per_second(name, using_half_precision=half)
        if peak is not None:
            return float(peak), f"{name}: OLMo-core's datasheet table (dense bf16)"
    return measured_matmul_flops(
        device, dtype
    ), f"measured: best 2048^3 {str(dtype).split('.')[-1]} matmul on this {device.type}"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class BenchResult:
    scale: str
    variant: str
    compile: bool
    config: str
    seq_len: int
    batch: int
    params_total: int
    params_non_embedding: int  # the papers' count: attention + FFN matrices
    flops_per_token: int  # model.num_flops_per_token(seq_len), forward + backward
    tokens_per_s: float  # median over repeats
    tokens_per_s_all: List[float]
    peak_mem_mb: Optional[float]
    mfu: float  # percent of the peak
    ratio: float = 1.0  # tokens/s / baseline's: median of per-repeat paired ratios
    # first and third quartiles of the paired ratios (the noise)
    ratio_quartiles: tuple = (1.0, 1.0)
    flops_ratio: float = 1.0  # flops_per_token / baseline's
    per_flop_ratio: float = 1.0  # ratio x flops_ratio: model FLOP/s relative to the baseline's
    extra: dict = field(default_factory=dict)


def build_model(config: str, device: torch.device, dtype: torch.dtype) -> tuple[nn.Module, str]:
    """The trainer's model of ``config`` and the attention backend the trainer would pick for it
    here."""
    spec = load_spec(REPO / config if not Path(config).is_absolute() else config)
    model_config = spec.model_config()
    backend = resolve_attention_backend(
        spec.model.attention_backend,
        head_dims(model_config),
        cuda=device.type == "cuda",
        bf16=dtype == torch.bfloat16,
    )
    set_attention_backend(model_config, backend.name)
    model = model_config.build(init_device="cpu")
    model.init_weights(device=torch.device("cpu"))
    return model.to(device=device, dtype=dtype), backend.name


FLOAT8 = " float8"  # the suffix of a variant's float8 twin (--float8)


def to_float8(model: nn.Module, recipe: str, device: torch.device, tokens: int) -> nn.Module:
    """``model`` with train.float8=``recipe`` applied as the trainer does (before compile, the
    matmuls whose sizes win at ``tokens`` a step on this card), emulated where ``device`` has no
    float8 matmuls."""
    from olmo_core.float8 import AOFloat8LinearRecipe

    from ..launch.cards import CARDS
    from ..nn.float8 import ShapeFloat8Config, has_float8_matmuls

    card = known_card(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    model.apply_fp8(
        ShapeFloat8Config(
            ao_recipe=AOFloat8LinearRecipe(recipe),
            emulate=not has_float8_matmuls(device),
            tokens=tokens,
            roof=(card or CARDS["h100"]).roof,
        )
    )  # type: ignore[operator]
    return model


def _train_step(
    model: nn.Module, ids: torch.Tensor, optimizer: Optional[torch.optim.Optimizer] = None
) -> None:
    logits = model(ids[:, :-1])
    F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten()).backward()
    if optimizer is not None:
        optimizer.step()
    for p in model.parameters():
        p.grad = None


def _param_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _cpu_peak_bytes(model: nn.Module, ids: torch.Tensor) -> int:
    """Weights + gradients + the distinct storages autograd saves in one forward."""
    saved: Dict[int, int] = {}

    def pack(t: torch.Tensor):
        if not isinstance(t, nn.Parameter):
            s = t.untyped_storage()
            saved[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _train_step(model, ids)
    return 2 * _param_bytes(model) + sum(saved.values())


def _build_variants(
    sc,
    names: List[str],
    device,
    dtype,
    seq_len: int,
    batch: int,
    optimizer: bool,
    float8: Optional[str],
    compiled: bool,
) -> tuple[Dict[str, nn.Module], Dict[str, Optional[torch.optim.Optimizer]], Dict[str, dict]]:
    """Each variant's model (compiled as the trainer compiles it; a float8 twin converted), its
    AdamW (or None) and its counts."""
    models: Dict[str, nn.Module] = {}
    optimizers: Dict[str, Optional[torch.optim.Optimizer]] = {}
    info: Dict[str, dict] = {}
    for name in names:
        model, backend = build_model(sc.configs[name.removesuffix(FLOAT8)], device, dtype)
        if name.endswith(FLOAT8):
            to_float8(model, float8, device, seq_len * batch)  # type: ignore[arg-type]
        b = breakdown(model, seq_len)
        info[name] = dict(
            params_total=b.total,
            params_non_embedding=b.non_embedding,
            flops_per_token=b.flops_per_token,
            extra=dict(attention=backend, optimizer="adamw" if optimizer else "none"),
        )
        optimizers[name] = torch.optim.AdamW(model.parameters(), lr=1e-4) if optimizer else None
        if compiled:
            model.apply_compile()  # type: ignore[operator]  # OLMo-core's per-block compile, as the trainer's
        models[name] = model
    return models, optimizers, info


def _time_interleaved(
    models: Dict[str, nn.Module],
    optimizers: dict,
    ids: torch.Tensor,
    device,
    repeats: int,
    steps: int,
    log,
) -> tuple[Dict[str, List[float]], Dict[str, Optional[float]]]:
    """Tokens/s of each model per repeat, the models taking turns (each repeat starts one further
    along), and each one's peak memory in MiB."""
    names = list(models)
    batch, seq_len = ids.shape[0], ids.shape[1] - 1
    tps: Dict[str, List[float]] = {n: [] for n in names}
    mem: Dict[str, Optional[float]] = {n: None for n in names}
    resident = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            _sync(device)
            t = time.perf_counter()
            for _ in range(steps):
                _train_step(models[name], ids, optimizers[name])
            _sync(device)
            tps[name].append(steps * batch * seq_len / (time.perf_counter() - t))
            if device.type == "cuda":
                own = (
                    torch.cuda.max_memory_allocated(device) - resident + _param_bytes(models[name])
                )
                mem[name] = max(mem[name] or 0.0, own / 2**20)
        log(f"repeat {r + 1}/{repeats}: " + ", ".join(f"{n} {tps[n][-1]:.0f}" for n in names))
    if device.type != "cuda":
        for name, model in models.items():
            mem[name] = _cpu_peak_bytes(model, ids) / 2**20
    return tps, mem


def _paired(tps: Dict[str, List[float]], name: str, other: str) -> List[float]:
    return [a / b for a, b in zip(tps[name], tps[other])]


def _result(
    sc, name: str, base: str, info: dict, tps: dict, mem: dict, peak: float, run: dict
) -> BenchResult:
    """Variant ``name``'s result: its median tokens/s, MFU, and its tokens/s over ``base``'s paired
    by repeat (median and quartiles)."""
    med, paired = statistics.median(tps[name]), _paired(tps, name, base)
    ratio = statistics.median(paired)
    q1, _, q3 = statistics.quantiles(paired, n=4) if len(paired) > 1 else (ratio, ratio, ratio)
    flops_ratio = info[name]["flops_per_token"] / info[base]["flops_per_token"]
    extra = dict(info[name]["extra"])
    if name.endswith(FLOAT8):
        extra["float8_ratio"] = statistics.median(_paired(tps, name, name.removesuffix(FLOAT8)))
    return BenchResult(
        variant=name,
        config=sc.configs[name.removesuffix(FLOAT8)],
        extra=extra,
        **run,
        **{k: v for k, v in info[name].items() if k != "extra"},
        tokens_per_s=med,
        tokens_per_s_all=tps[name],
        peak_mem_mb=mem[name],
        mfu=100 * med * info[name]["flops_per_token"] / peak,
        ratio=ratio,
        ratio_quartiles=(q1, q3),
        flops_ratio=flops_ratio,
        per_flop_ratio=ratio * flops_ratio,
    )


def run_bench(
    scale: str,
    *,
    compile_modes: List[bool],
    variants: Optional[List[str]] = None,
    seq_len: Optional[int] = None,
    batch: Optional[int] = None,
    repeats: int = 5,
    steps: int = 2,
    warmup: int = 2,
    device: Optional[torch.device] = None,
    dtype: torch.dtype = torch.float32,
    optimizer: bool = False,
    float8: Optional[str] = None,
    log: Callable[[str], None] = lambda s: None,
) -> tuple[List[BenchResult], dict]:
    """Time every variant of ``scale`` interleaved (with ``optimizer``: an AdamW step in each step;
    with ``float8``, a recipe: each also as its float8 twin, ``extra['float8_ratio']`` its tokens/s
    over the variant's); returns (results, machine info)."""
    sc = SCALES[scale]
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    seq_len, batch = seq_len or sc.seq_len, batch or sc.batch
    names = [n for n in sc.configs if variants is None or n in variants or n == "baseline"]
    names += [n + FLOAT8 for n in names] if float8 else []
    peak, peak_source = peak_flops_per_second(device, dtype)
    machine = dict(
        device=torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"cpu x {torch.get_num_threads()} threads",
        dtype=str(dtype).split(".")[-1],
        torch=torch.__version__,
        peak_flops_per_second=peak,
        peak_source=peak_source,
    )
    log(f"peak {peak / 1e12:.3f} TFLOP/s ({peak_source})")
    gen = torch.Generator().manual_seed(0)
    results: List[BenchResult] = []
    for compiled in compile_modes:
        torch.compiler.reset()
        models, optimizers, info = _build_variants(
            sc, names, device, dtype, seq_len, batch, optimizer, float8, compiled
        )
        vocab = min(m.vocab_size for m in models.values())  # type: ignore[misc]
        ids = torch.randint(0, vocab, (batch, seq_len + 1), generator=gen).to(device)
        for name, model in models.items():
            t = time.perf_counter()
            for _ in range(warmup):
                _train_step(model, ids, optimizers[name])
            _sync(device)
            log(f"{scale} compile={compiled} {name}: warm-up {time.perf_counter() - t:.1f}s")
        tps, mem = _time_interleaved(models, optimizers, ids, device, repeats, steps, log)
        base = {"scale": scale, "compile": compiled, "seq_len": seq_len, "batch": batch}
        results += [_result(sc, name, names[0], info, tps, mem, peak, base) for name in names]
        del models
        gc.collect()
    return results, machine


def format_results(results: List[BenchResult], machine: dict) -> str:
    lines = [
        f"machine: {machine['device']}, {machine['dtype']}, torch {machine['torch']}; "
        f"MFU peak {machine['peak_flops_per_second'] / 1e12:.3f} TFLOP/s ({machine['peak_source']})"
    ]
    if results:  # the trainer's attention backend here, and whether the step includes AdamW's
        lines.append(
            f"attention {results[0].extra.get('attention')}, optimizer "
            f"{results[0].extra.get('optimizer')}"
        )
    head = (
        f"{'scale':6} {'variant':22} {'compile':7} {'params':>9} {'GFLOP/tok':>9} {'tok/s':>9} "
        f"{'ratio':>6} {'(IQR)':>13} {'FLOPs':>6} {'per-FLOP':>8} {'MFU%':>6} {'mem MB':>8}"
    )
    lines += [head, "-" * len(head)]
    for r in results:
        mem = f"{r.peak_mem_mb:8.0f}" if r.peak_mem_mb is not None else f"{'-':>8}"
        lines.append(
            f"{r.scale:6} {r.variant:22} {'on' if r.compile else 'off':7} "
            f"{r.params_non_embedding / 1e6:8.2f}M "
            f"{r.flops_per_token / 1e9:9.4f} {r.tokens_per_s:9.0f} {r.ratio:6.3f} "
            f"({r.ratio_quartiles[0]:.3f}-{r.ratio_quartiles[1]:.3f}) {r.flops_ratio:6.3f} "
            f"{r.per_flop_ratio:8.3f} {r.mfu:6.1f} {mem}"
            + (
                f"  float8/high precision {r.extra['float8_ratio']:.3f}"
                if "float8_ratio" in r.extra
                else ""
            )
        )
    lines.append(
        "ratio: tokens/s over the baseline's (median of paired repeats, IQR: their quartiles); "
        "FLOPs: model FLOPs/token over the baseline's; per-FLOP: ratio x FLOPs (1 = same model "
        "FLOP/s as the baseline); params: non-embedding"
    )
    return "\n".join(lines)


def as_json(results: List[BenchResult], machine: dict) -> dict:
    return {"machine": machine, "results": [asdict(r) for r in results]}
