"""torchrun for a run that stops on a signal: ``python -m olmo_patches.torchrun [torchrun arguments]``.

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
- A worker that failed ends the launch with one line naming the first failed rank, its node and how
  it ended (an exit code or a signal) and torchrun's exit code, instead of torchrun's error table.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import List, Optional, Sequence

__all__ = ["main", "children", "PASSED_ON", "failure_line"]

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
    print(f"torchrun on {socket.gethostname()}: {signal.Signals(signum).name} passed to {len(workers)} worker(s); "
          "they save at their next step, then exit", file=sys.stderr, flush=True)


def failure_line(error) -> tuple[str, int]:
    """One line for torchrun's ``ChildFailedError``: the first failed rank, its node, how it ended."""
    rank, failure = error.get_first_failure()
    how = (f"killed by {signal.Signals(-failure.exitcode).name}" if failure.exitcode < 0
           else f"exit code {failure.exitcode}")
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
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    logging.getLogger("torch.distributed.elastic.multiprocessing.errors").setLevel(logging.CRITICAL)
    try:
        torchrun(args)
    except ChildFailedError as e:
        line, code = failure_line(e)
        print(line, file=sys.stderr, flush=True)
        sys.exit(code)


if __name__ == "__main__":
    main()
