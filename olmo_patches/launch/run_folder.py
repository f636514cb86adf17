"""One folder, one run: the save folder records its config once and is held by one process.

What OLMo-core lacks: its ConfigSaverCallback writes OLMo-core's config into each checkpoint
(olmo_core/train/callbacks/config_saver.py line 57; kept, run.py sets it), and on a resume its data
loader refuses a changed dataset fingerprint and keeps the checkpoint's data seed with a warning
(olmo_core/data/data_loader.py lines 451-474); nothing compares the rest of a rerun's config (the
model, the recipe) with the run it continues, nor keeps a second process out of the folder.

- The first start writes ``SAVE/config.yaml`` once the run is built, before its first checkpoint (a
  start that fails before that leaves no record). A rerun whose model, data or recipe differs is
  refused (:class:`RunFolderError`, one line listing the changed keys); keys in :data:`MAY_CHANGE`
  (when to stop, hardware, micro-batch, logging, evaluation, checkpoint cadence, local caches) may.
  ``--resume-from`` makes a change deliberate: the new config is recorded beside the first as
  ``config.N.yaml``, and later reruns compare with the newest. A record with no complete checkpoint
  beside it (a run that ended before its first save) binds nothing: the next start replaces it.
- ``SAVE/.lock`` names the process holding the folder (host, pid, SLURM job). A second process is
  refused; a lock whose process is dead on this host, or left by this same SLURM job (a requeue), is
  taken over.

Holder records (this ``.lock``, a sweep's ``sweep-claim.json``) are read, checked and written by
:func:`take_record` while a ``filelock.FileLock`` of a guard file beside them is held: ``flock(2)``,
which Linux's NFS client turns into an NFS lock seen by every node; on a file system without
``flock`` (Lustre mounted without ``-o flock``) filelock falls back to its ``SoftFileLock`` (an
``O_EXCL`` file, broken when its holder's pid is gone on this host). Lustre's ``-o localflock``
locks per node only: two nodes could then both take a record.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from filelock import FileLock
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..blocks.base import BLOCKS
from ..config import ConfigError, ExperimentSpec, coerce_shorthands, spec_to_yaml
from ..config.load import drop_foreign_defaults, kind_schema

log = logging.getLogger(__name__)

__all__ = [
    "RunFolderError",
    "MAY_CHANGE",
    "changed_keys",
    "changed_between",
    "earlier_layout",
    "check_config",
    "record_config",
    "Lock",
    "read_record",
    "write_record",
    "guarded",
    "take_record",
    "drop_record",
    "METRICS_FILE",
    "pid_alive",
    "read_metrics",
    "recorded_configs",
    "latest_step",
]

LOCK, GUARD = ".lock", ".lock.guard"

# Keys (or key prefixes ending in ".") that a rerun may change: they do not change what is trained.
MAY_CHANGE = tuple(
    "run.name run.save_folder run.stop_at_step run.save_interval run.ephemeral_save_interval "
    "run.ephemeral_keep run.log_interval run.wandb_project run.trace_batches "
    "train.micro_batch_size train.compile train.activation_checkpointing train.hardware "
    "train.device train.data_parallel eval. data.work_dir data.demo_cache data.mix_base_dir "
    "data.tokenizer_file".split()
)


class RunFolderError(ConfigError):
    """A run folder refused this start: one line saying why and what to do."""


def _flat(tree: Any, prefix: str = "") -> Dict[str, Any]:
    if isinstance(tree, dict):
        out: Dict[str, Any] = {}
        for k, v in tree.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: tree}


def _may_change(key: str) -> bool:
    return any(key == k or key.startswith(k if k.endswith(".") else k + ".") for k in MAY_CHANGE)


def as_read_now(recorded: Any) -> Dict[str, Any]:
    """A recorded config (YAML text or its tree), flat, as this code reads it: shorthands
    coerced, other kinds' keys at their defaults dropped (config/load.py), a key it lacks at its
    default (a start refuses such a record first: :func:`earlier_layout`)."""
    tree = coerce_shorthands(OmegaConf.create(recorded))  # e.g. activation_checkpointing: false
    block = str(OmegaConf.select(tree, "model.block", default="baseline"))
    try:
        tree = OmegaConf.merge(kind_schema(block), drop_foreign_defaults(tree, block))
    except (OmegaConfBaseException, KeyError):  # a key removed since, a kind not registered
        pass
    return _flat(OmegaConf.to_container(tree))


def earlier_layout(recorded: str) -> Optional[str]:
    """Why a recorded config (YAML text) is of an earlier layout of this project: a key it has
    that this code's config has not, or the first it lacks; None for a record of this layout."""
    tree = coerce_shorthands(OmegaConf.create(recorded))
    if (block := str(OmegaConf.select(tree, "model.block", default="baseline"))) not in BLOCKS:
        return None  # the config's own check names it
    try:
        now = OmegaConf.merge(kind_schema(block), tree)
    except OmegaConfBaseException as e:
        return f"{getattr(e, 'full_key', '') or e}: not a key now"
    lacks = _flat(OmegaConf.to_container(now)).keys() - _flat(OmegaConf.to_container(tree)).keys()
    return f"{min(lacks)}: not recorded" if lacks else None


def _changes(old: Dict[str, Any], new: Dict[str, Any], ignore: Sequence[str]) -> List[str]:
    return [
        f"{k}: {old.get(k)} -> {new.get(k)}"
        for k in sorted(old.keys() | new.keys())
        if old.get(k) != new.get(k) and not _may_change(k) and k not in ignore
    ]


def changed_keys(recorded_yaml: str, spec: ExperimentSpec) -> List[str]:
    """``key: old -> new`` for every key outside :data:`MAY_CHANGE` that differs."""
    new = _flat(OmegaConf.to_container(OmegaConf.create(spec_to_yaml(spec))))
    return _changes(as_read_now(recorded_yaml), new, ())


def changed_between(old: Any, new: Any, ignore: Sequence[str] = ()) -> List[str]:
    """:func:`changed_keys` between two recorded configs (YAML text or trees), ``ignore`` aside."""
    return _changes(as_read_now(old), as_read_now(new), ignore)


def recorded_configs(folder: Path) -> List[Path]:
    """config.yaml, config.1.yaml, ... oldest first: the last is the config the run trains with
    (a change made with --resume-from is recorded as config.N.yaml)."""
    numbered = [p for p in folder.glob("config.*.yaml") if p.name.split(".")[1].isdigit()]
    first = [folder / "config.yaml"] if (folder / "config.yaml").is_file() else []
    return first + sorted(numbered, key=lambda p: int(p.name.split(".")[1]))


def check_config(
    spec: ExperimentSpec, deliberate: bool = False, checkpointed: bool = True
) -> List[str]:
    """Refuse a start whose config changes the recorded run (unless ``deliberate``, or the folder
    holds no complete checkpoint: ``checkpointed`` False); returns the changes."""
    folder = Path(spec.save_folder)
    recorded = recorded_configs(folder)
    if not recorded:
        return []
    if checkpointed and not deliberate and (why := earlier_layout(recorded[-1].read_text())):
        raise RunFolderError(
            f"{recorded[-1]}: recorded by an earlier layout of this project ({why}), which this "
            "code does not resume (CHANGELOG.md); start a new run with another run.name or "
            "run.save_folder"
        )
    changes = changed_keys(recorded[-1].read_text(), spec)
    if changes and not deliberate and checkpointed:
        raise RunFolderError(
            f"{folder} holds a run with another config (changed: {'; '.join(changes)}); start a "
            "new run with another run.name or run.save_folder, or pass --resume-from CHECKPOINT "
            "to change this one deliberately"
        )
    return changes


def record_config(
    spec: ExperimentSpec, changes: List[str], checkpointed: bool = True
) -> Optional[str]:
    """Write config.yaml at a run's first start, config.N.yaml after a deliberate change; a record
    without a complete checkpoint (``checkpointed`` False) is replaced by config.yaml. Returns the
    line saying a record was replaced (None otherwise)."""
    folder = Path(spec.save_folder)
    recorded = recorded_configs(folder)
    replaced = None
    # a start that ended before its first checkpoint: its record goes
    if recorded and not checkpointed:
        if changes:
            replaced = (
                f"{folder} holds no checkpoint: its recorded config replaced ({'; '.join(changes)})"
            )
        for old in recorded:
            old.unlink()
        recorded, changes = [], []
    if recorded and not changes:
        return None
    path = folder / (f"config.{len(recorded)}.yaml" if recorded else "config.yaml")
    path.write_text(spec_to_yaml(spec))
    if recorded:
        log.warning(f"Config changed on purpose ({'; '.join(changes)}): recorded in {path}")
    return replaced


def pid_alive(pid: int) -> bool:
    """Whether a process of this host with that pid exists (not ours to signal still counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_record(path: Path) -> Optional[Dict[str, Any]]:
    """A holder record (JSON); None when absent or unreadable (a torn write is taken over)."""
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def write_record(path: Path, data: Dict[str, Any]) -> None:
    """Replaced whole (a temporary file renamed over it): a reader never sees half a record."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data) + "\n")
    tmp.replace(path)


@contextmanager
def guarded(guard: Path) -> Iterator[None]:
    """One process at a time, on every host that sees ``guard`` (see the module docstring)."""
    guard.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(guard):
        yield


def take_record(
    path: Path, guard: Path, me: Dict[str, Any], stale: Callable[[Dict[str, Any]], bool]
) -> Tuple[bool, Optional[Dict[str, Any]]]:
    """Write ``me`` to ``path`` unless a live holder's record is there: (taken, the previous
    holder)."""
    with guarded(guard):
        holder = read_record(path)
        if holder is not None and not stale(holder):
            return False, holder
        write_record(path, me)
        return True, holder


def drop_record(path: Path, guard: Path) -> None:
    """Remove ``path`` if it is still this process's record (its host and pid)."""
    with guarded(guard):
        holder = read_record(path) or {}
        if (holder.get("pid"), holder.get("host")) == (os.getpid(), socket.gethostname()):
            path.unlink()


class Lock:
    """``SAVE/.lock``, taken with :func:`take_record`; see the module docstring."""

    def __init__(self, folder: str | Path):
        self.path, self.guard = Path(folder) / LOCK, Path(folder) / GUARD
        self.me = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "slurm_job": os.environ.get("SLURM_JOB_ID"),
            "since": time.strftime("%Y-%m-%d %H:%M:%S"),
        }

    def _stale(self, holder: Dict[str, Any]) -> bool:
        if holder.get("slurm_job") and holder.get("slurm_job") == self.me["slurm_job"]:
            return True  # this job, requeued (possibly on another node)
        return holder.get("host") == self.me["host"] and not pid_alive(int(holder.get("pid", 0)))

    def holder(self) -> Optional[Dict[str, Any]]:
        """The live process (another than this one) that holds the folder, or None."""
        holder = read_record(self.path) if self.path.is_file() else None
        if holder is not None and holder.get("pid") != os.getpid() and not self._stale(holder):
            return holder
        return None

    def check(self) -> None:
        """What :meth:`acquire` would refuse, read only (a dry run): the folder held by a live
        process."""
        if (holder := self.holder()) is not None:
            raise self._busy(holder)

    def _busy(self, holder: Dict[str, Any]) -> RunFolderError:
        return RunFolderError(
            f"{self.path.parent} is in use by pid {holder.get('pid')} on {holder.get('host')} "
            f"since {holder.get('since')}; wait for it, or remove {self.path} if that process is "
            "gone"
        )

    def acquire(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RunFolderError(
                f"run.save_folder {self.path.parent}: cannot create it ({e.strerror})"
            ) from None
        try:
            taken, holder = take_record(self.path, self.guard, self.me, self._stale)
        except PermissionError as e:
            raise RunFolderError(
                f"run.save_folder {self.path.parent}: cannot write there ({e.strerror})"
            ) from None
        if not taken:
            raise self._busy(holder)  # type: ignore[arg-type]
        if holder is not None:
            log.warning(
                f"Taking over {self.path} left by pid {holder.get('pid')} on {holder.get('host')} "
                "(no longer running)"
            )

    def release(self) -> None:
        if self.guard.exists():  # never taken (a refused start): nothing to drop, nothing written
            drop_record(self.path, self.guard)


# every metric the Trainer logs, one JSON line per step (train/callbacks/metrics_file.py)
METRICS_FILE = "metrics.jsonl"


def read_metrics(run_dir: str | Path) -> Dict[int, Dict[str, float]]:
    """{step: {metric: value}} from a run folder; a missing file gives {}, a torn last line (a run
    killed as it wrote, a full disk) is left out, a bad line before it is a RunFolderError."""
    path = Path(run_dir) / METRICS_FILE
    out: Dict[int, Dict[str, float]] = {}
    text = path.read_text() if path.exists() else ""
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    for n, line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            if n < lines[-1][0]:  # a torn last line is left out
                raise RunFolderError(f"{path} line {n}: not JSON ({e.msg})") from None
            break
        out.setdefault(int(record.pop("step")), {}).update(record)
    return out


def latest_step(run_dir: str | Path) -> int:
    """The step of the run folder's newest complete checkpoint (its ``stepN`` name); -1: none."""
    if not Path(run_dir).is_dir():
        return -1
    # imports torch: only when a run folder is looked at
    from olmo_core.train.checkpoint import Checkpointer

    return max((step for step, _ in Checkpointer.find_checkpoints(run_dir)), default=-1)
