"""Shared fixtures: a tiny model on the embedded demo corpus, and helpers to read finished runs."""

import fcntl
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


# torch.distributed's rendezvous variables, which in-process runs leave behind: a child must not inherit them.
DIST_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")


def child_env(**extra: str) -> dict:
    """The environment of every process a test starts: this checkout first on PYTHONPATH (so a child
    imports this tree's olmo_patches, not another editable install's), no torch.distributed
    variables, one intra-op thread, unbuffered output."""
    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


def start(cmd: list, capture: bool = True, **extra_env: str) -> subprocess.Popen:
    """Start a command from the repo root with child_env(), in its own process group."""
    pipe = subprocess.PIPE if capture else None
    return subprocess.Popen([str(c) for c in cmd], cwd=REPO, env=child_env(**extra_env), stdout=pipe, stderr=pipe, text=True,
                            start_new_session=True)


def finish(proc: subprocess.Popen, timeout: int = 300) -> subprocess.CompletedProcess:
    """Wait for a started command; on a timeout its whole process group is killed (torchrun's
    workers included: no orphans holding cores)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run(cmd: list, timeout: int = 300, **extra_env: str) -> subprocess.CompletedProcess:
    """Run a command from the repo root with child_env() and wait for it."""
    return finish(start(cmd, **extra_env), timeout)


def run_script(script: str, *args: str, torchrun: int = 0, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run one of scripts/ (or tests/ helpers, given as "tests/NAME.py") in a fresh interpreter,
    optionally under torchrun with that many processes."""
    path = REPO / script if "/" in script else REPO / "scripts" / script
    cmd = [sys.executable, str(path), *args]
    if torchrun:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(torchrun), *cmd[1:]]
    return run(cmd, timeout=timeout)


def load_weights(step_dir: Path) -> dict:
    """The model weights of an OLMo-core checkpoint folder (stepN), as full tensors."""
    from olmo_patches.train.checkpoints import load_model_state

    return load_model_state(step_dir)


@pytest.fixture(scope="session")
def demo_corpus():
    """The demo corpus, built once into the repo's cache (as the demo itself does). Under
    pytest-xdist the first worker builds it and the others wait on the lock, then read the cache."""
    from olmo_patches.data.demo import prepare_demo_corpus

    cache = REPO / ".cache" / "demo-corpus"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".build-lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return prepare_demo_corpus(cache)


@pytest.fixture(autouse=True)
def _fresh_rendezvous_port():
    """An in-process run picks a free MASTER_PORT and leaves it in os.environ; dropped after each
    test, the next run picks a port free at that moment (pytest-xdist workers train side by side)."""
    yield
    os.environ.pop("MASTER_PORT", None)
