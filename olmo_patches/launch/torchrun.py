"""torchrun for a run that stops on a signal:
``python -m olmo_patches.launch.torchrun [torchrun arguments]``.

torchrun (torch.distributed.run) turns its own SIGTERM, SIGINT, SIGHUP and SIGQUIT into a
``SignalException``: it sends the signal to its workers, waits ``--shutdown-timeout`` for them,
and exits 1 with a traceback, whether or not the workers saved and exited 0 (so
``srun --kill-on-bad-exit=1`` ends the other nodes mid-save and SLURM marks the job FAILED); its
SIGUSR1 ends it at once (the default action). Here, as torchrun otherwise:

- SIGTERM and SIGUSR1 are passed to the workers (each time one arrives: a worker saves once,
  olmo_patches/train/callbacks/stop.py) and torchrun goes on watching them: once they have saved
  and exited 0, it exits 0. Under SLURM every process of the step gets the signal from slurmstepd
  as well, so each worker may see it twice. torchrun keeps its own handling of SIGINT, SIGHUP and
  SIGQUIT (its ``--signals-to-handle``, unless given).
- A worker killed outright (SIGKILL, an out-of-memory kill) cannot say so itself. A thread here
  sees each worker end within 20 ms (``os.waitid`` with ``WNOWAIT``: the status is read and the
  worker left for torchrun's agent to reap, which looks every ``--monitor-interval``: 1 s here
  unless given, so that on a loaded machine the watch reads the status before the agent reaps it;
  torchrun's default is 0.1 s); a worker killed by a signal has its line (the rank, its node, its
  pid, the signal) put in the launch's store (olmo_patches/launch/peers.py), so every rank of every
  node stops within a second or so, each node printing that one line. Where the agent reaped the
  worker first all the same, its ``ChildFailedError`` gives the signal and the line is put in the
  store then. Once a worker
  failed, torchrun's error table and logs give way to it (this node's own line if no rank printed
  one); a rendezvous whose store went with another node: one line. ``--max-restarts 0`` (torchrun's
  default, passed unless given): a failed worker ends the launch. No private torch API is used.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Set

__all__ = ["main", "children"]

PASSED_ON = (signal.SIGTERM, signal.SIGUSR1)
_HANDLED_BY_TORCHRUN = "SIGINT,SIGHUP,SIGQUIT"


def children(pid: Optional[int] = None) -> List[int]:
    """The child processes of ``pid`` (this process): every thread's, from /proc (Linux)."""
    pid = pid or os.getpid()
    out: List[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:  # the thread ended meanwhile
            pass
    return sorted(set(out))


def _pass_on(signum, frame) -> None:
    workers = children()
    for pid in workers:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass
    print(
        f"torchrun on {socket.gethostname()}: {signal.Signals(signum).name} passed to "
        f"{len(workers)} worker(s); they save at their next step, then exit",
        file=sys.stderr,
        flush=True,
    )


def _environ(pid: int) -> Dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(e.decode(errors="replace").split("=", 1) for e in raw.split(b"\0") if b"=" in e)


_envs: Dict[
    int, Dict[str, str]
] = {}  # this node's workers' environments, by pid (read while they live)
_announced = threading.Event()  # a killed worker's line is in the launch's store (and printed here)
# A worker of this node failed (its line is printed: by it, or announced).
_failed = threading.Event()
# How often the workers' ends are looked for (torchrun's agent: --monitor-interval, MONITOR_S).
WATCH_S = 0.02
MONITOR_S = "1"  # torchrun's --monitor-interval unless given (its default: 0.1 s)
ENV_S = 0.5  # how often new workers' environments are read


def _watch_workers(stop: threading.Event) -> None:
    """This node's workers: each one's environment read while it lives (a zombie's is empty: its
    store, rank and node), and the moment one ends, how (``waitid`` with ``WNOWAIT``, POSIX: the
    status is read, not reaped: torchrun's agent still reaps the worker and reports it as ever)."""
    ended: Set[int] = set()
    read_at = 0.0
    while not stop.wait(WATCH_S):
        if time.monotonic() - read_at > ENV_S:
            read_at = time.monotonic()
            for pid in children():
                if pid not in _envs and (env := _environ(pid)).get("RANK") is not None:
                    _envs[pid] = env
        for pid, env in list(_envs.items()):
            if pid in ended:
                continue
            try:
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:  # reaped by the agent first: its ChildFailedError says how
                ended.add(pid)
                continue
            if info is not None:
                ended.add(pid)
                _ended(pid, env, info)


def _ended(pid: int, env: Dict[str, str], info) -> None:
    """A worker has ended: one killed by a signal (it could say nothing) is announced to all."""
    if info.si_code == os.CLD_EXITED and info.si_status == 0:
        return
    _failed.set()
    if info.si_code == os.CLD_EXITED:  # an exit code: the worker said why
        return
    _killed(pid, env, info.si_status)


def _killed(pid: int, env: Dict[str, str], signum: int) -> None:
    """A worker killed by ``signum``: its line in the launch's store (once a node) and printed."""
    if _announced.is_set():
        return
    node = env.get("GROUP_RANK", os.environ.get("GROUP_RANK", "?"))
    where = f"node {node}, {socket.gethostname()}, pid {pid}"
    line = (
        f"rank {env['RANK']} ({where}) was killed by {signal.Signals(signum).name}; every rank "
        "stops"
    )
    _announced.set()
    from .peers import announce_for

    first, prints = announce_for(env, line, 128 + signum) if "MASTER_PORT" in env else (line, True)
    if prints:
        print(first, file=sys.stderr, flush=True)


def failure_line(error) -> tuple[str, int]:
    """One line for torchrun's ``ChildFailedError``: the first failed rank, its node, how it
    ended."""
    rank, failure = error.get_first_failure()
    how = (
        f"killed by {signal.Signals(-failure.exitcode).name}"
        if failure.exitcode < 0
        else f"exit code {failure.exitcode}"
    )
    try:
        message = (
            failure.message
            if isinstance(failure.message, str)
            else failure.message.get("message", "")
        )
    except AttributeError:
        message = ""
    last = message.strip().splitlines()[-1] if message and message.strip() else ""
    host = socket.gethostname()
    line = f"torchrun on {host}: rank {rank} (local rank {failure.local_rank}) ended: {how}"
    if last and "Signal" not in last and "exitcode" not in last:
        line += f" ({last[:300]})"
    code = failure.exitcode if failure.exitcode > 0 else 128 - failure.exitcode
    return f"{line}; this node stops, exit {code}", code


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    given = {a.split("=")[0].replace("_", "-") for a in args if a.startswith("--")}
    if "--signals-to-handle" not in given:
        args = ["--signals-to-handle", _HANDLED_BY_TORCHRUN, *args]
    if "--max-restarts" not in given:  # a failed worker ends the launch (torchrun's default, said)
        args = ["--max-restarts", "0", *args]
    if "--monitor-interval" not in given and "PET_MONITOR_INTERVAL" not in os.environ:
        args = ["--monitor-interval", MONITOR_S, *args]  # the watch reads a worker's end first
    for s in PASSED_ON:
        signal.signal(s, _pass_on)
    # torch's C++ log (a store whose host has gone: a page of C++ frames a process): here only its
    # fatal errors, in the workers from ERROR up, unless set; read when torch loads.
    level = os.environ.get("TORCH_CPP_LOG_LEVEL")
    os.environ["TORCH_CPP_LOG_LEVEL"] = level or "FATAL"
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    os.environ["TORCH_CPP_LOG_LEVEL"] = level or "ERROR"

    if "LOGLEVEL" not in os.environ:  # a failed worker's line says it; torchrun's table and logs go
        for name in list(logging.Logger.manager.loggerDict):
            if name.startswith("torch.distributed.elastic"):
                logging.getLogger(name).setLevel(logging.CRITICAL)
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    stop = threading.Event()
    threading.Thread(
        target=_watch_workers, args=(stop,), name="olmo_patches.launch.torchrun", daemon=True
    ).start()
    try:
        torchrun(args)
    except ChildFailedError as e:
        line, code = failure_line(e)
        failure = e.get_first_failure()[1]
        if not _announced.is_set() and failure.exitcode < 0:  # a worker that said nothing itself
            if (env := _envs.get(failure.pid)) is not None:  # reaped before the watch read it
                _killed(failure.pid, env, -failure.exitcode)
            else:
                print(line, file=sys.stderr, flush=True)
        sys.exit(code)
    except RendezvousError as e:  # the rendezvous store's host (another node's torchrun) is gone
        if _failed.is_set():  # this node's workers failed first and said why
            sys.exit(1)
        print(
            f"torchrun on {socket.gethostname()}: the rendezvous ended ({type(e).__name__}: "
            f"{' '.join(str(e).split())[:200]}); "
            "the torchrun that held its store is gone; this node stops",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(1)
    finally:
        stop.set()


if __name__ == "__main__":
    main()
