"""What the GPU checks share: small models of every block type, a forward and backward under bf16
autocast or fp32, relative errors, and timed OLMo-core Trainer runs on synthetic tokens."""

from __future__ import annotations

import functools
import gc
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from olmo_core.train.callbacks import Callback

from olmo_patches.config import ExperimentSpec, load_spec, vocab_size
from olmo_patches.launch.layout import load_and_resolve
from olmo_patches.nn.attention import head_dims, set_attention_backend
from olmo_patches.train import train
from olmo_patches.launch.run_folder import read_metrics
from olmo_patches.train.callbacks.checkpointer import ResumeCheckpointerCallback

REPO = Path(__file__).resolve().parents[2]
# bf16 keeps 8 significant bits: unit roundoff u = 2^-8. A few roundings per matmul input,
# accumulated in fp32, over a couple of layers: 16 u for logits, twice that for a parameter's
# gradient.
BF16_TOL = 16 * 2.0**-8

# Every block type of olmo_patches/nn/ as ModelSpec overrides on top of the demo model.
BLOCK_TYPES = {
    "baseline pre": [],
    "baseline post": ["model.norm_placement=post"],
    "hourglass pre": ["model.block=hourglass", "model.K=2", "model.d_h=32"],
    "hourglass post": [
        "model.block=hourglass",
        "model.K=2",
        "model.d_h=32",
        "model.norm_placement=post",
    ],
    **{
        f"variable width {mode}": [
            "model.block=variable_width",
            "model.widths.schedule=list",
            "model.widths.values=[128,64]",
            f"model.widths.resize={mode}",
        ]
        for mode in ("carry_forward", "zero", "learned")
    },
}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b||, in fp32."""
    a, b = a.detach().float().flatten(), b.detach().float().flatten()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def small_spec(overrides: list[str], device: torch.device) -> ExperimentSpec:
    """The demo model at d_model 128, 2 layers, with ``overrides``."""
    return load_and_resolve(
        REPO / "configs" / "demo" / "baseline.yaml",
        [
            "model.d_model=128",
            "model.n_heads=2",
            "model.n_layers=2",
            f"train.device={device.type}",
            "train.hardware=none",
            *overrides,
        ],
    )


def build(
    spec: ExperimentSpec, device: torch.device, backend: str = "torch", seed: int = 0
) -> torch.nn.Module:
    config = spec.model.build(vocab_size(spec))
    set_attention_backend(config, backend)
    torch.manual_seed(seed)
    model = config.build(init_device="cpu")
    model.init_weights(device=torch.device("cpu"))
    return model.to(device)


def token_ids(
    spec: ExperimentSpec, device: torch.device, seq: int, seed: int, batch: int = 2
) -> torch.Tensor:
    return torch.randint(
        0, vocab_size(spec), (batch, seq + 1), generator=torch.Generator().manual_seed(seed)
    ).to(device)


def forward_backward(
    model: torch.nn.Module, ids: torch.Tensor, bf16: bool
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Logits (fp32) and every parameter's gradient of the next-token loss, under bf16 autocast or
    not."""
    model.zero_grad(set_to_none=True)
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = model(ids[:, :-1])
    F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten()).backward()
    return logits.detach().float(), [
        p.grad.detach().clone() for p in model.parameters() if p.grad is not None
    ]


def compare(rows, name: str, got, ref, detail: str = "") -> None:
    """Rows: logits within BF16_TOL, every gradient (its worst tensor) within 2 BF16_TOL."""
    err = rel(got[0], ref[0])
    rows.judge(f"{name}: logits", f"{err:.2e}", err <= BF16_TOL, f"<= {BF16_TOL:.2e}", detail)
    err = max(rel(g, r) for g, r in zip(got[1], ref[1]))
    rows.judge(
        f"{name}: gradients (worst tensor)",
        f"{err:.2e}",
        err <= 2 * BF16_TOL,
        f"<= {2 * BF16_TOL:.2e}",
        detail,
    )


@functools.cache
def shipped_head_dims() -> tuple[int, ...]:
    """Every head dim of every config under configs/ (variable width: each layer's
    w_l / n_heads)."""
    dims: set[int] = set()
    for path in sorted(
        (REPO / "configs").rglob("*/*.yaml")
    ):  # configs/base*.yaml are bases, not runs
        dims.update(head_dims(load_spec(path).model_config()))  # a pure load: no machine checks
    return tuple(sorted(dims))


# --- Trainer runs ---------------------------------------------------------------------------------


class StepTimer(Callback):
    """Wall time after every step (device synchronised) and the peak memory the caching allocator
    held."""

    def __init__(self, device: torch.device):
        self.device = device
        self.times: list[float] = []

    def pre_train(self):
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)

    def post_step(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.times.append(time.perf_counter())


def synthetic_tokens(folder: Path, vocab: int, tokens: int) -> str:
    """Uniform tokens in an OLMo-core numpy token file, written whole before it is renamed into
    place."""
    path = folder / f"synthetic-{vocab}-{tokens}.npy"
    if not path.exists():
        part = folder / f".{path.name}.{os.getpid()}"
        np.random.default_rng(0).integers(1, vocab, tokens, dtype=np.uint32).tofile(part)
        os.replace(part, path)
    return str(path)


def run_overrides(
    folder: Path, tokens_file: str, seq: int, batch: int, steps: int, device: torch.device
) -> list[str]:
    return [
        "data.source=numpy",
        "data.tokenizer=dolma2",
        f"data.paths=[{tokens_file}]",
        *demo_overrides(folder, seq, batch, steps, device),
    ]


def demo_overrides(
    folder: Path, seq: int, batch: int, steps: int, device: torch.device
) -> list[str]:
    """A short run in ``folder``: the config's own data (the demo corpus for configs/demo/), no
    evals or saves."""
    return [
        f"run.save_folder={folder}",
        f"data.work_dir={folder / 'cache'}",
        f"data.sequence_length={seq}",
        f"train.global_batch_size={batch}",
        f"train.max_steps={steps}",
        "train.max_tokens=null",
        "train.warmup_steps=1",
        "train.warmup_tokens=null",
        f"train.device={device.type}",
        "eval.validation_sets=[]",
        "eval.downstream_tasks=[]",
        "run.log_interval=1",
        "run.ephemeral_save_interval=null",
        "run.wandb_project=null",
        # no loader processes to start per run: a local file read in process keeps up
        # (docs/performance.md)
        "data.num_workers=0",
    ]


@dataclass
class Timed:
    spec: ExperimentSpec
    tokens_per_s: float
    losses: list[float]
    peak_reserved_gib: Optional[float]  # torch.cuda.max_memory_reserved (None on CPU)
    peak_allocated_gib: Optional[float]  # torch.cuda.max_memory_allocated (None on CPU)
    held_before_gib: Optional[float]  # allocated before the run: what earlier runs left alive
    left_gib: Optional[float]  # allocated once it returned (collected) beyond before: what it kept


def timed_run(
    config: Path,
    overrides: list[str],
    folder: Path,
    device: torch.device,
    *,
    seq: int,
    batch: int,
    steps: int,
    warmup: int,
    vocab: int = 100_000,
) -> Timed:
    """``steps`` Trainer steps of ``config`` on synthetic tokens below ``vocab`` (no checkpoints);
    tokens/s over the steps after ``warmup``."""
    tokens_file = synthetic_tokens(folder.parent, vocab, (steps + 1) * batch * (seq + 1))
    spec = load_and_resolve(
        config, [*run_overrides(folder, tokens_file, seq, batch, steps, device), *overrides]
    )
    timer = StepTimer(device)
    # each run compiles its own shapes: no automatic dynamic shapes from the run before
    torch._dynamo.reset()
    held = None
    if device.type == "cuda":  # this run's peaks alone: the process's are since its start
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        held = torch.cuda.memory_allocated(device) / 2**30
    train(
        spec,
        callbacks={"gpu_check": timer, "checkpointer": ResumeCheckpointerCallback(enabled=False)},
    )
    times = timer.times[warmup - 1 :]
    del timer  # it holds the trainer, and so the model
    tps = (len(times) - 1) * batch * seq / (times[-1] - times[0])
    losses = [
        m["train/CE loss"] for _, m in sorted(read_metrics(folder).items()) if "train/CE loss" in m
    ]
    if device.type != "cuda":
        return Timed(spec, tps, losses, None, None, None, None)
    reserved, allocated = (
        torch.cuda.max_memory_reserved(device),
        torch.cuda.max_memory_allocated(device),
    )
    torch.compiler.reset()  # its compiled code, as the next run would
    gc.collect()
    left = torch.cuda.memory_allocated(device) / 2**30 - held
    return Timed(spec, tps, losses, reserved / 2**30, allocated / 2**30, held, left)
