"""A failure on one rank ends every rank, and its line reaches every node's terminal.

A rank that refuses or fails calls :func:`announce`: its line and exit code go to the launch's store
(the first failure is kept). On every rank a watch thread (:func:`watch`) polls the store and, once
another rank has failed, exits with that rank's code: ``os._exit``, since the main thread may be
waiting in a collective for the rank that left (the process group's timeout is 15 min). The first
rank of each node to announce or see a failure prints the first failure's line, so each node
prints it once.

The store is torchrun's (``TORCHELASTIC_USE_AGENT_STORE``): it outlives the workers and is there
before the process group, so a rank refusing its config still stops peers waiting to rendezvous.
Other launchers: the process group's store, from its start on.

A rank killed outright (SIGKILL, an out-of-memory kill) announces nothing itself: its node's
``python -m olmo_patches.launch.torchrun`` announces it (:func:`announce_for`: the rank, its node,
the signal), and a peer whose collective failed because of it (a closed connection) waits a few
seconds for that cause before announcing its own error, so every node prints the lost rank's line,
not a traceback. A node whose torchrun died (a SIGKILL, a lost machine) leaves its workers orphans:
their watch sees the parent gone, announces the node lost and exits; where the lost torchrun held
the store, the other nodes' watch sees the store gone and ends them, with one line a node.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import threading
import time
from datetime import timedelta
from typing import Optional, Tuple

import torch.distributed as dist

__all__ = ["announce", "announce_for", "watch", "stop_watching", "POLL_S", "LOST_PEER_WAIT_S"]

POLL_S = 0.5  # how often the watch thread looks for a failure
LOST_PEER_WAIT_S = 5.0  # how long a rank whose collective lost a peer waits for that peer's cause
_FAILURE = "failure"  # the first failure: "CODE LINE"
# A collective cut off by a peer that went away: the consequence of another rank's end, not a cause.
_LOST_PEER = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|"
    r"DistNetworkError|DistBackendError|"
    r"NCCL communicator was aborted|ProcessGroupNCCL.*(?:Watchdog|timeout)",
    re.IGNORECASE,
)

_store: Optional[dist.Store] = None
_stop: Optional[threading.Event] = None
_thread: Optional[threading.Thread] = None
_announced: Optional[Tuple[str, int, bool]] = None  # this rank's failure, as announce() answered it


def _node() -> str:
    return os.environ.get("GROUP_RANK", "0")


def _launch_store(env, timeout_s: float = 30) -> Optional[dist.Store]:
    """A client of the store at the worker environment ``env``'s MASTER_ADDR:MASTER_PORT: torchrun's
    (its agent's) or the process group's (rank 0's, from init_process_group's env:// rendezvous).
    None: gone."""
    try:
        timeout = timedelta(seconds=timeout_s)
        store = dist.TCPStore(
            env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=timeout
        )
    except (RuntimeError, KeyError, ValueError):  # its host is gone
        return None
    return dist.PrefixStore(f"olmo_patches/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/", store)


def _connect() -> Optional[dist.Store]:
    """torchrun's store, else the process group's once it is up (None before it)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return _launch_store(os.environ)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if dist.is_initialized() and dist.get_world_size() == world:  # this launch's group
        return _launch_store(os.environ)
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
        # a peer went away: wait a little for its own line
        if code == 1 and _LOST_PEER.search(line):
            deadline = time.monotonic() + LOST_PEER_WAIT_S
            while not _store.check([_FAILURE]) and time.monotonic() < deadline:
                time.sleep(0.1)
        first_code, first = (
            _store.compare_set(_FAILURE, "", f"{code} {line}").decode().split(" ", 1)
        )
        _announced = first, int(first_code), True  # printed here if the store goes before the count
        _announced = first, int(first_code), _store.add(f"printed/{_node()}", 1) == 1
    except (
        RuntimeError
    ):  # the store went with its host: print here (the first failure, if it was read)
        _announced = _announced or (line, code, True)
    return _announced


def watch() -> None:
    """Start this rank's watch thread for a run (again once its process group is up: outside
    torchrun its store is the one); a new run forgets the last one's failure."""
    global _store, _stop
    _forget()
    if (
        _stop is not None
        or os.environ.get("WORLD_SIZE", "1") == "1"
        or (store := _connect()) is None
    ):
        return
    _store, _stop = store, threading.Event()
    # The local torchrun, whose end this rank watches for.
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    parent = os.getppid() if agent else None
    global _thread
    _thread = threading.Thread(
        target=_watch, args=(store, _stop, parent), name="olmo_patches.peers", daemon=True
    )
    _thread.start()


def _forget() -> None:
    """A new run in this process (the demo trains several): no earlier run's failure or store."""
    global _store, _announced
    if _stop is None:
        _store, _announced = None, None


def stop_watching() -> None:
    """Stop the watch thread (the run is over) and wait for it to leave the store, so no thread is
    inside a store call when the process group and the store are torn down; :func:`announce` still
    reaches the store."""
    global _stop, _thread
    if _stop is not None:
        _stop.set()
        _stop = None
    if _thread is not None and _thread is not threading.current_thread():
        _thread.join(timeout=2 * POLL_S + 5)  # one poll, and a store call in flight
        _thread = None


def _ranks() -> str:
    """This node's ranks, "ranks 2-3" (torchrun's environment)."""
    local, rank = int(os.environ.get("LOCAL_WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    first = rank - int(os.environ.get("LOCAL_RANK", "0"))
    return f"ranks {first}-{first + local - 1}" if local > 1 else f"rank {first}"


def _end(store: Optional[dist.Store], line: str, code: int) -> None:
    """Record ``line`` as the launch's failure unless one came first; print the first failure once
    on this node (without a store: local rank 0 prints) and exit with its code."""
    prints = os.environ.get("LOCAL_RANK", "0") == "0"
    try:
        if store is not None:
            first_code, line = (
                store.compare_set(_FAILURE, "", f"{code} {line}").decode().split(" ", 1)
            )
            code, prints = int(first_code), store.add(f"printed/{_node()}", 1) == 1
    except RuntimeError:  # the store went with its host
        pass
    if prints:
        print(line, file=sys.stderr, flush=True)
    os._exit(code)


def _watch(store: dist.Store, stop: threading.Event, parent: Optional[int]) -> None:
    host = socket.gethostname()
    while not stop.wait(POLL_S):
        # the local torchrun is gone
        if parent is not None and os.getppid() != parent and not stop.is_set():
            _end(
                store,
                f"node {_node()} ({host}) lost: its torchrun (pid {parent}) ended; its {_ranks()} "
                "stop",
                1,
            )
        try:
            if _announced is not None or not store.check([_FAILURE]):
                continue
            code, line = store.get(_FAILURE).decode().split(" ", 1)
            if store.add(f"printed/{_node()}", 1) == 1:
                print(line, file=sys.stderr, flush=True)
        except RuntimeError:  # the store is gone with the launch
            if parent is None or stop.is_set() or _announced is not None:
                return  # nothing left to watch
            where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
            _end(
                None,
                f"the launch's store ({where}) is gone: the torchrun that held it ended; "
                f"node {_node()} ({host}) stops its {_ranks()}",
                1,
            )
        if _announced is None:  # this rank's own exit path runs once it has announced
            os._exit(int(code))


def announce_for(env: dict, line: str, code: int) -> Tuple[str, bool]:
    """For a worker that cannot (killed outright): record its failure in its launch's store, as
    :func:`announce` would (``env``: the worker's environment). Returns the launch's first failure
    and whether the caller prints it on this node (no store: ``line``, True)."""
    if (store := _launch_store(env, timeout_s=5)) is None:
        return line, True
    try:
        first = store.compare_set(_FAILURE, "", f"{code} {line}").decode().split(" ", 1)[1]
        return first, store.add(f"printed/{env.get('GROUP_RANK', '0')}", 1) == 1
    except RuntimeError:
        return line, True
