"""torchrun for a run that stops on a signal: ``python -m olmo_patches.launch.torchrun [torchrun arguments]``.

torchrun (torch.distributed.run) turns its own SIGTERM, SIGINT, SIGHUP and SIGQUIT into a
``SignalException``: it sends the signal to its workers, waits ``--shutdown-timeout`` for them,
and exits 1 with a traceback, whether or not the workers saved and exited 0 (so
``srun --kill-on-bad-exit=1`` ends the other nodes mid-save and SLURM marks the job FAILED); its
SIGUSR1 ends it at once (the default action). Here, as torchrun otherwise:

- SIGTERM and SIGUSR1 are passed to the workers (each time one arrives: a worker saves once,
  olmo_patches/train/stop.py) and torchrun goes on watching them: once they have saved and exited 0,
  it exits 0. Under SLURM every process of the step gets the signal from slurmstepd as well, so
  each worker may see it twice. torchrun keeps its own handling of SIGINT, SIGHUP and SIGQUIT
  (its ``--signals-to-handle``, unless given).
- A worker killed outright (SIGKILL, an out-of-memory kill) cannot say so itself: the moment
  torchrun's monitor sees it (``LocalElasticAgent._monitor_workers``), before it stops the other
  workers, its line (the rank, its node, the signal) goes to the launch's store
  (olmo_patches/launch/peers.py), so every rank of every node stops within a second or so, each node
  printing that one line. Once a worker failed, torchrun's error table and logs give way to it (this
  node's own line if no rank printed one); a rendezvous whose store went with another node: one line.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Dict, List, Optional, Sequence

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
        f"torchrun on {socket.gethostname()}: {signal.Signals(signum).name} passed to {len(workers)} worker(s); "
        "they save at their next step, then exit",
        file=sys.stderr,
        flush=True,
    )


def _environ(pid: int) -> Dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(e.decode(errors="replace").split("=", 1) for e in raw.split(b"\0") if b"=" in e)


_announced = threading.Event()  # a killed worker's line is in the launch's store (and printed here)
_failed = threading.Event()  # torchrun saw a worker of this node fail (its line is printed: by it, or announced)
_envs: Dict[int, Dict[str, str]] = {}  # each worker's environment, read while it lives


def _watch_workers(stop: threading.Event, poll_s: float = 0.5) -> None:
    """Read each worker's environment while it lives (a zombie's is empty): its store and rank."""
    while not stop.wait(poll_s):
        for pid in children():
            if pid not in _envs and (env := _environ(pid)).get("RANK") is not None:
                _envs[pid] = env


def _announce_killed(result) -> None:
    """torchrun's view of a failed worker group: announce the first worker killed by a signal."""
    for rank, failure in sorted((getattr(result, "failures", None) or {}).items()):
        if failure.exitcode >= 0 or _announced.is_set():
            continue
        env = _envs.get(failure.pid) or _environ(failure.pid)
        name = signal.Signals(-failure.exitcode).name
        line = (
            f"rank {rank} (node {env.get('GROUP_RANK', os.environ.get('GROUP_RANK', '?'))}, {socket.gethostname()}, "
            f"pid {failure.pid}) was killed by {name}; every rank stops"
        )
        _announced.set()
        # From another thread: where this torchrun holds the store, its server must not wait on the
        # monitor that is announcing (the agent goes on to stop its other workers meanwhile).
        threading.Thread(target=_announce, args=(env, line, 128 - failure.exitcode), name="olmo_patches.announce").start()


def _announce(env: Dict[str, str], line: str, code: int) -> None:
    from .peers import announce_for

    first, prints = announce_for(env, line, code) if "MASTER_PORT" in env else (line, True)
    if prints:
        print(first, file=sys.stderr, flush=True)


def _hook_monitor() -> None:
    """Announce a killed worker the moment torchrun sees it (LocalElasticAgent._monitor_workers), before
    it stops the others and while its store is up; a torch without that method: torchrun's own end."""
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    original = getattr(LocalElasticAgent, "_monitor_workers", None)
    if original is None or getattr(original, "_olmo_patches", False):
        return

    def monitor(self, worker_group):
        result = original(self, worker_group)
        try:
            if result.is_failed():
                _failed.set()
                _announce_killed(result)
        except Exception:  # never in torchrun's way
            pass
        return result

    monitor._olmo_patches = True  # type: ignore[attr-defined]
    LocalElasticAgent._monitor_workers = monitor


def failure_line(error) -> tuple[str, int]:
    """One line for torchrun's ``ChildFailedError``: the first failed rank, its node, how it ended."""
    rank, failure = error.get_first_failure()
    how = f"killed by {signal.Signals(-failure.exitcode).name}" if failure.exitcode < 0 else f"exit code {failure.exitcode}"
    try:
        message = failure.message if isinstance(failure.message, str) else failure.message.get("message", "")
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
    if not any(a.split("=")[0] in ("--signals-to-handle", "--signals_to_handle") for a in args):
        args = ["--signals-to-handle", _HANDLED_BY_TORCHRUN, *args]
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

    _hook_monitor()
    stop = threading.Event()
    threading.Thread(target=_watch_workers, args=(stop,), name="olmo_patches.launch.torchrun", daemon=True).start()
    try:
        torchrun(args)
    except ChildFailedError as e:
        line, code = failure_line(e)
        if not _announced.is_set() and e.get_first_failure()[1].exitcode < 0:  # a worker that said nothing itself
            print(line, file=sys.stderr, flush=True)
        sys.exit(code)
    except RendezvousError as e:  # the rendezvous store's host (another node's torchrun) is gone
        if _failed.is_set():  # this node's workers failed first and said why
            sys.exit(1)
        print(
            f"torchrun on {socket.gethostname()}: the rendezvous ended ({type(e).__name__}: {' '.join(str(e).split())[:200]}); "
            "the torchrun that held its store is gone; this node stops",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(1)
    finally:
        stop.set()


if __name__ == "__main__":
    main()
