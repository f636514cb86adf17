"""Shared fixtures: a tiny model on the embedded demo corpus, and helpers to read finished runs."""

import atexit
import contextlib
import fcntl
import io
import logging
import os
import runpy
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

# transformers copies an exported model's modeling code into a cache named after its folder ("hf"):
# one per test process, so that pytest-xdist workers never write the same file at once.
os.environ["HF_MODULES_CACHE"] = tempfile.mkdtemp(prefix="hf-modules-")
atexit.register(shutil.rmtree, os.environ["HF_MODULES_CACHE"], ignore_errors=True)

# torch.compile (inductor) on CPU: one kernel cache for the test run's compiled runs, and kernels
# built in the compiling process (no pool of workers, each importing torch, on a 2-core machine). A
# GPU run of scripts/gpu_check.py sets both first: a cache kept for a second try, and a pool of
# compile workers.
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")
    atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

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


# make test runs the suite on every core (pytest-xdist, --dist loadfile: a file's tests, and so its
# module fixtures, stay on one worker). Files go to the workers in this order, the slowest first
# (each file's wall time in one run of the suite, docs/performance.md), so that no worker is left
# alone with a long file at the end; the rest follow in collection order.
SLOW_FIRST = (
    "test_gpu_install.py",
    "test_multinode.py",
    "test_doc_commands.py",
    "test_resume.py",
    "test_paper_configs.py",
    "test_shipped_shards.py",
    "test_precision.py",
    "test_export_hf.py",
    "test_gpu_ready.py",
    "test_training.py",
    "test_variable_width.py",
    "test_sweep.py",
    "test_launch_slurm.py",
    "test_shipped_widths.py",
    "test_demo.py",
    "test_float8.py",
    "test_fuzz_inputs.py",
    "test_world_size.py",
    "test_config_pure.py",
    "test_memory.py",
    "test_moe_world_size.py",
    "test_new_block.py",
    "test_lm_eval.py",
    "test_performance.py",
    "test_checkpoint_contract.py",
    "test_logging.py",
    "test_statistics.py",
    "test_rerun.py",
    "test_data_paths.py",
    "test_presets.py",
    "test_stacked_shards.py",
)


def pytest_configure(config):
    if hasattr(
        config.option, "loadscopereorder"
    ):  # pytest-xdist: keep this order (not by number of tests)
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(
        key=lambda item: rank.get(item.path.name, len(SLOW_FIRST))
    )  # stable: each file keeps its order


class Records(logging.Handler):
    """The messages of every log record a logger passes on (attach with logger.addHandler)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def tiny_overrides(tmp_path: Path, *extra: str, block: str = "baseline") -> list:
    hourglass = (
        ["model.block=hourglass", "model.K=2", "model.d_h=16"] if block == "hourglass" else []
    )
    return [
        *TINY,
        *hourglass,
        f"run.save_folder={tmp_path}",
        f"data.work_dir={tmp_path / 'cache'}",
        *extra,
    ]


# torch.distributed's rendezvous variables, which in-process runs leave behind: a child must not
# inherit them.
DIST_VARS = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
)


def child_env(**extra: str) -> dict:
    """The environment of every process a test starts: this checkout first on PYTHONPATH (so a child
    imports this tree's olmo_patches, not another editable install's), no torch.distributed
    variables, one intra-op thread, unbuffered output."""
    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


def start(cmd: list, capture: bool = True, cwd: Path = REPO, **extra_env: str) -> subprocess.Popen:
    """Start a command from ``cwd`` (the repo root) with child_env(), in its own process group."""
    pipe = subprocess.PIPE if capture else None
    return subprocess.Popen(
        [str(c) for c in cmd],
        cwd=cwd,
        env=child_env(**extra_env),
        stdout=pipe,
        stderr=pipe,
        text=True,
        start_new_session=True,
    )


def run_elsewhere(
    cmd: list, cwd: Path, env: dict, timeout: int = 300
) -> subprocess.CompletedProcess:
    """A process that must not run this checkout (pip building the wheel, an unpacked or installed
    copy): its working folder and whole environment are the caller's; its process group killed on a
    timeout."""
    proc = subprocess.Popen(
        [str(c) for c in cmd],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    return finish(proc, timeout)


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


def run(
    cmd: list, timeout: int = 300, cwd: Path = REPO, **extra_env: str
) -> subprocess.CompletedProcess:
    """Run a command from ``cwd`` (the repo root) with child_env() and wait for it."""
    return finish(start(cmd, cwd=cwd, **extra_env), timeout)


def script_path(script: str) -> Path:
    """scripts/NAME, or a path from the repo root ("tests/NAME.py", "benchmarks/NAME.py")."""
    return REPO / script if "/" in script else REPO / "scripts" / script


def run_script(
    script: str, *args: str, torchrun: int = 0, timeout: int = 300, **extra_env: str
) -> subprocess.CompletedProcess:
    """Run one of scripts/ (or tests/ helpers, given as "tests/NAME.py") in a fresh interpreter,
    optionally under torchrun with that many processes, with ``extra_env`` set."""
    cmd = [sys.executable, str(script_path(script)), *args]
    if torchrun:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(torchrun),
            *cmd[1:],
        ]
    return run(cmd, timeout=timeout, **extra_env)


def _fork_server():
    """multiprocessing's fork server, preloading torch, OLMo-core and this checkout's library
    (tests/_ranks.py) once per test process."""
    import multiprocessing

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["tests._ranks"])
    return ctx


def spawn(fn, world: int, *args) -> None:
    """``torch.multiprocessing.spawn(fn, args, nprocs=world)`` with each rank forked from the fork
    server (no interpreter a rank); ``fn`` must be a module-level function of a test module."""
    _fork_server()
    torch.multiprocessing.start_processes(fn, args=args, nprocs=world, start_method="forkserver")


def ranks(
    world: int,
    script: str,
    *args: str,
    nodes: int = 1,
    node_args: Optional[list] = None,
    timeout: int = 600,
    **extra_env: str,
) -> subprocess.CompletedProcess:
    """``script ARGS`` (as :func:`run_script` names it) at ``world`` ranks on gloo, as ``torchrun
    --standalone --nproc-per-node WORLD`` runs it (``nodes``: as many torchruns of WORLD / NODES
    ranks each would, on one store; ``node_args``: each node's arguments after ARGS), each rank
    forked from a server that imported torch, OLMo-core and this checkout's library once
    (tests/_ranks.py), with child_env() and ``extra_env``: rank 0's stdout, every rank's stderr,
    and the first non-zero exit code (a rank over ``timeout`` is killed: -9)."""
    from . import _ranks

    ctx = _fork_server()
    out = Path(tempfile.mkdtemp(prefix="ranks-"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [[str(a) for a in (*args, *(node_args[n] if node_args else ()))] for n in range(nodes)]
    common = (world, nodes, port, str(script_path(script)), argv, child_env(**extra_env))
    common = (*common, str(REPO), str(out))
    procs = [ctx.Process(target=_ranks.rank_main, args=(r, *common)) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(deadline - time.monotonic(), 0))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    codes = [p.exitcode for p in procs]
    stdout = (out / "rank0.out").read_text()
    stderr = "".join((out / f"rank{r}.err").read_text() for r in range(world))
    shutil.rmtree(out)
    code = next((c for c in codes if c), 0)
    return subprocess.CompletedProcess(["ranks", str(world), script, *args], code, stdout, stderr)


def train_each(runs: list, world: int = 2, timeout: int = 600) -> subprocess.CompletedProcess:
    """scripts/train.py once per argument list, one launch of ``world`` ranks after another
    (:func:`ranks`), stopping at the first that fails: its code, the launches' output joined."""
    out, err, code = [], [], 0
    for argv in runs:
        r = ranks(world, "train.py", *argv, timeout=timeout)
        out.append(r.stdout)
        err.append(r.stderr)
        if code := r.returncode:
            break
    return subprocess.CompletedProcess(["train_each"], code, "".join(out), "".join(err))


class ScriptTimeout(BaseException):
    """A script run in process ran over its time (a BaseException: no script's handler swallows
    it)."""


def run_in_process(
    script: str, *args: str, cwd: Path | None = None, timeout: int = 900
) -> subprocess.CompletedProcess:
    """A script's ``__main__`` run in this process as ``python SCRIPT ARGS`` would run it (sys.argv,
    working folder, child_env()'s environment for the processes it starts, stdout, stderr, exit
    code), without a fresh interpreter's 5-10 s of imports: for tests of what a script does. Tests
    of the process itself (its one-line errors and exit codes, the checkout it imports, torchrun)
    use run_script."""
    path = script_path(script)
    out, err = io.StringIO(), io.StringIO()
    old_argv, old_cwd, old_env, code = sys.argv, Path.cwd(), dict(os.environ), 0
    sys.argv = [str(path), *map(str, args)]

    def expired(signum, frame):
        raise ScriptTimeout(f"{script} {' '.join(map(str, args))}: over {timeout} s")

    # a script's stop signals: scripts/train.py ignores SIGTERM and SIGUSR1 as its process ends
    # (train/callbacks/stop.py); here the process goes on, and a child started later would inherit
    # them ignored (bash could not trap them)
    old_signals = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    old_alarm = signal.signal(signal.SIGALRM, expired)
    signal.alarm(
        timeout
    )  # as run()'s timeout: a hang fails the test instead of blocking its worker
    try:
        os.environ.clear()
        os.environ.update(child_env())
        os.chdir(cwd or old_cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_path(str(path), run_name="__main__")
    except SystemExit as e:  # as the interpreter exits: None is 0, a message goes to stderr with 1
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            err.write(f"{e.code}\n")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old_alarm)
        for s, handler in old_signals.items():
            signal.signal(s, handler)
        sys.argv = old_argv
        os.chdir(old_cwd)
        os.environ.clear()
        os.environ.update(old_env)
        _forget_peers()  # the next command starts as a fresh process would
    return subprocess.CompletedProcess(
        [sys.executable, str(path), *args], code, out.getvalue(), err.getvalue()
    )


def load_weights(step_dir: Path) -> dict:
    """The model weights of an OLMo-core checkpoint folder (stepN), as full tensors."""
    from olmo_patches.train.checkpoints import load_model_state

    return load_model_state(step_dir)


@pytest.fixture(scope="session")
def demo_corpus():
    """The demo corpus, built once into the repo's cache (as the demo itself does). Under
    pytest-xdist the first worker builds it and the others wait on the lock, then read the cache."""
    from olmo_patches.config.spec import default_demo_cache
    from olmo_patches.data.demo import prepare_demo_corpus

    cache = default_demo_cache()  # where every run with data.demo_cache=null finds it
    assert cache == REPO / ".cache" / "demo-corpus", (
        cache
    )  # this checkout's: the tests build nothing outside it
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".build-lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return prepare_demo_corpus(cache)


@pytest.fixture(autouse=True)
def _fresh_peers():
    """Many commands run in one test process: after each test, no run's watch thread, store or
    announced failure is left for the next (a real command is one process; launch/peers.py)."""
    yield
    _forget_peers()


def _forget_peers() -> None:
    if (peers := sys.modules.get("olmo_patches.launch.peers")) is not None:
        peers.stop_watching()
        peers._forget()


@pytest.fixture(autouse=True)
def _platform_start_method():
    """Each test starts with the platform's start method (fork on Linux), as a fresh command does:
    an in-process run leaves OLMo-core's "spawn" set (prepare_training_environment), and a pool of
    OLMo-core's dataset preparation then starts an interpreter a worker (5-10 s of imports each)."""
    import multiprocessing

    multiprocessing.set_start_method(multiprocessing.get_all_start_methods()[0], force=True)


@pytest.fixture(autouse=True)
def _fresh_rendezvous_port():
    """An in-process run picks a free MASTER_PORT and leaves it in os.environ; dropped after each
    test, the next run picks a port free at that moment (pytest-xdist workers train side by
    side)."""
    os.environ.pop("MASTER_PORT", None)
    yield
    os.environ.pop("MASTER_PORT", None)
