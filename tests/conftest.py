"""Shared fixtures: a tiny model on the embedded demo corpus, and helpers to read finished runs."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

# One intra-op thread here and in every child process (run_script sets OMP_NUM_THREADS=1): float
# reductions then sum in the same order in-process and in a subprocess, so their runs are bit-equal.
torch.set_num_threads(1)

# A model small enough that a training step takes milliseconds on one CPU core.
TINY = [
    "model.d_model=32",
    "model.n_layers=2",
    "model.n_heads=2",
    "data.sequence_length=32",
    "train.global_batch_size=4",
    "train.micro_batch_size=2",
    "train.warmup_steps=2",
    "eval.interval=1000",
    "eval.max_batches=2",
    "run.log_interval=1",
]


def tiny_overrides(tmp_path: Path, *extra: str, block: str = "baseline") -> list:
    hourglass = ["model.block=hourglass", "model.K=2", "model.d_h=16"] if block == "hourglass" else []
    return [*TINY, *hourglass, f"run.save_folder={tmp_path}", f"data.work_dir={tmp_path / 'cache'}", *extra]


def run_script(script: str, *args: str, torchrun: int = 0, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run one of scripts/ in a fresh interpreter (optionally under torchrun), from the repo root."""
    cmd = [sys.executable, str(REPO / "scripts" / script), *args]
    if torchrun:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(torchrun), *cmd[1:]]
    # In-process runs leave torch.distributed's rendezvous variables behind; a child must not inherit them.
    dist_vars = {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"}
    env = {k: v for k, v in os.environ.items() if k not in dist_vars}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    # Its own process group, so that a timeout also ends torchrun's workers (no orphans holding cores).
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def load_weights(step_dir: Path) -> dict:
    """The model weights of an OLMo-core checkpoint folder (stepN), as full tensors."""
    from olmo_patches.train.checkpoints import load_model_state

    return load_model_state(step_dir)


@pytest.fixture(scope="session")
def demo_corpus():
    """The demo corpus, built once into the repo's cache (as the demo itself does)."""
    from olmo_patches.data.demo import prepare_demo_corpus

    return prepare_demo_corpus(REPO / ".cache" / "demo-corpus")
