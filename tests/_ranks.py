"""The ranks of a gloo launch as processes forked from one server (test helper; conftest.ranks).

A torchrun launch starts an interpreter per rank, each importing torch and OLMo-core (5-10 s of
CPU); forked from a server that imported them once (multiprocessing's forkserver, preloading this
module), a rank starts at once. Each rank gets the environment torchrun gives a worker of
``--standalone --nproc-per-node N`` (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
MASTER_ADDR, MASTER_PORT: rank 0 hosts the process group's store), imports the block kinds named
in HOURGLASS_BLOCKS (the server imported the registry before they were set), runs a script as its
``__main__`` and exits with its code, its output in files. What torchrun itself does (its
agent, its store, its signals) is tested through torchrun: tests/test_multinode.py,
tests/test_world_size.py.
"""

import importlib
import os
import runpy
import sys

import olmo_core.train  # noqa: F401  (imported once, in the server)
import torch

import olmo_patches.train  # noqa: F401


def rank_main(
    rank: int,
    world: int,
    nodes: int,
    port: int,
    script: str,
    args: list,
    env: dict,
    cwd: str,
    out: str,
) -> None:
    """One rank of ``world`` on ``nodes`` nodes: the worker environment, its output to
    ``out/rank{rank}.{out,err}``, ``script ARGS`` (``args``: a list per node), then the exit code
    (SystemExit's, as the interpreter would)."""
    per_node = world // nodes
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank % per_node),
        GROUP_RANK=str(rank // per_node),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(per_node),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    os.chdir(cwd)
    torch.set_num_threads(1)
    for module in filter(None, env.get("HOURGLASS_BLOCKS", "").split(",")):
        importlib.import_module(module.strip())
    for fd, name in ((1, "out"), (2, "err")):
        f = os.open(f"{out}/rank{rank}.{name}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(f, fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    sys.argv = [script, *args[rank // per_node]]
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no atexit of the server's modules, as a rank of torchrun ends
