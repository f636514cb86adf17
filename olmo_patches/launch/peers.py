"""A failure on one rank ends every rank, and its line reaches every node's terminal.

A rank that refuses or fails calls :func:`announce`: its line and exit code go to the launch's store
(the first failure is kept). On every rank a watch thread (:func:`watch`) polls the store and, once
another rank has failed, exits with that rank's code: ``os._exit``, since the main thread may be
waiting in a collective for the rank that left (the process group's timeout is 15 min). The first
rank of each node to announce or see a failure prints the first failure's line, so each node
prints it once.

The store is torchrun's (``TORCHELASTIC_USE_AGENT_STORE``): it outlives the workers and is there
before the process group, so a rank refusing its config still stops peers waiting to rendezvous.
Other launchers: the process group's store, from its start on. A rank killed outright (SIGKILL, an
out-of-memory kill) announces nothing; torchrun and the collectives' own errors end those.
"""

from __future__ import annotations

import os
import sys
import threading
from datetime import timedelta
from typing import Optional, Tuple

import torch.distributed as dist

__all__ = ["announce", "watch", "stop_watching", "forget", "POLL_S"]

POLL_S = 0.5  # how often the watch thread looks for a failure
_FAILURE = "failure"  # the first failure: "CODE LINE"

_store: Optional[dist.Store] = None
_stop: Optional[threading.Event] = None
_announced: Optional[Tuple[str, int, bool]] = None  # this rank's failure, as announce() answered it


def _node() -> str:
    return os.environ.get("GROUP_RANK", "0")


def _connect() -> Optional[dist.Store]:
    """torchrun's store, else the process group's (None before it, or outside torchrun)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        try:
            agent = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=30))
        except (RuntimeError, KeyError, ValueError):  # torchrun's agent is gone
            return None
        return dist.PrefixStore(f"olmo_patches/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/", agent)
    if dist.is_initialized() and dist.get_world_size() == int(os.environ.get("WORLD_SIZE", "1")):  # this launch's group
        return dist.PrefixStore("olmo_patches/", dist.distributed_c10d._get_default_store())
    return None


def announce(line: str, code: int) -> Tuple[str, int, bool]:
    """Record this rank's failure for the others. Returns the launch's first failure (``line`` and
    ``code`` unless another rank failed before: this one may be its consequence, a collective cut
    off) and whether this rank prints it (the first on its node); a second call returns the first's
    answer. Without a store (before the process group outside torchrun) every
    rank fails alike, and each node's local rank 0 prints."""
    global _store, _announced
    if _announced is not None:
        return _announced
    if os.environ.get("WORLD_SIZE", "1") == "1":
        return line, code, True
    if (_store := _store or _connect()) is None:
        return line, code, os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")) == "0"
    try:
        first_code, first = _store.compare_set(_FAILURE, "", f"{code} {line}").decode().split(" ", 1)
        _announced = first, int(first_code), _store.add(f"printed/{_node()}", 1) == 1
    except RuntimeError:  # the store went with its host: print here
        _announced = line, code, True
    return _announced


def watch() -> None:
    """Start this rank's watch thread for a run (again once its process group is up: outside
    torchrun its store is the one); a new run forgets the last one's failure."""
    global _store, _stop
    forget()
    if _stop is not None or os.environ.get("WORLD_SIZE", "1") == "1" or (store := _connect()) is None:
        return
    _store, _stop = store, threading.Event()
    threading.Thread(target=_watch, args=(store, _stop), name="olmo_patches.peers", daemon=True).start()


def forget() -> None:
    """A new command in this process (tests run many): no earlier run's failure or store."""
    global _store, _announced
    if _stop is None:
        _store, _announced = None, None


def stop_watching() -> None:
    """Stop the watch thread (the run is over); :func:`announce` still reaches the store."""
    global _stop
    if _stop is not None:
        _stop.set()
        _stop = None


def _watch(store: dist.Store, stop: threading.Event) -> None:
    while not stop.wait(POLL_S):
        try:
            if _announced is not None or not store.check([_FAILURE]):
                continue
            code, line = store.get(_FAILURE).decode().split(" ", 1)
            if store.add(f"printed/{_node()}", 1) == 1:
                print(line, file=sys.stderr, flush=True)
        except RuntimeError:  # the store is gone with the launch: nothing left to watch
            return
        if _announced is None:  # this rank's own exit path runs once it has announced
            os._exit(int(code))
