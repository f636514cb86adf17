"""A save folder's checkpoints: which are complete, what they hold (step, weights, shapes, the
config that wrote them), whether they can be resumed, and the one a run resumes from.

OLMo-core's own: a checkpoint is complete once ``stepN/.metadata.json`` exists (written last, after
the folder's atomic rename: olmo_core/train/checkpoint.py lines 145, 507), found by
``Checkpointer.dir_is_checkpoint``/``latest_checkpoint``; ``Trainer.load_checkpoint`` loads one.
What it lacks, here:

- :func:`prune_incomplete`: a save cut off between the rename and its metadata leaves ``stepN``
  without it, and OLMo-core's next save of that step refuses the folder (``FileExistsError``,
  checkpoint.py line 445; ``save_overwrite=True`` would clear any folder first, the checkpoint a
  finished run was resumed from included): removed before a run starts.
- :func:`write_manifest` / :func:`verify`: each checkpoint's files, sizes and CRC-32s
  (``manifest.json``), checked before a resume; OLMo-core checks that three files exist
  (checkpoint.py line 339). :func:`select_resume_checkpoint` moves one that fails to
  ``SAVE/rejected/`` (never deleted), so that OLMo-core's latest complete checkpoint is the newest
  good one.
- :func:`check_checkpoint_fits`: a checkpoint's weights' shapes (its metadata, no tensor read)
  against a config's model (a meta build), one line before any work.
- :func:`load_explicit`: ``--resume-from PATH``; checkpoints in the save folder newer than PATH are
  moved aside (never deleted) so that they neither shadow nor collide with the resumed run's saves.
"""

from __future__ import annotations

import math
import json
import logging
import re
import shutil
import threading
import time
import zlib
from pathlib import Path
from typing import ClassVar, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import yaml
from olmo_core.aliases import PathOrStr
from olmo_core.distributed.utils import barrier, broadcast_object, get_rank
from olmo_core.io import is_url
from olmo_core.train.checkpoint import Checkpointer

from ..blocks import BLOCKS
from ..config import ConfigError, ExperimentSpec
from ..config.load import at_default
from ..launch.run_folder import RunFolderError

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step(\d+)(-tmp)?$")
# in each stepN/: {"files": {relative path: {"bytes": n, "crc32": hex}}, "finite": true}
MANIFEST = "manifest.json"
CHUNK = 16 * 2**20  # bytes read at a time for the CRC


# ---- finding and reading checkpoints ------------------------------------------------------------


def latest_complete(folder: PathOrStr) -> Optional[str]:
    """``folder`` itself when it is a complete checkpoint, else the latest complete checkpoint in
    it, or None."""
    if Checkpointer.dir_is_checkpoint(folder):
        return str(folder)
    try:
        return Checkpointer.latest_checkpoint(folder)
    except FileNotFoundError:
        return None


def checkpoints_in(save_folder: PathOrStr) -> List[Tuple[int, str]]:
    """(step, path) of every ``stepN`` with its completion marker, newest first: one with a file
    gone too (which OLMo-core's ``find_checkpoints`` passes over), so that it is verified."""
    folder = Path(save_folder)
    if not folder.is_dir():
        return []
    marked = [
        (int(m.group(1)), str(p))
        for p in folder.iterdir()
        if (m := _STEP_DIR.match(p.name))
        and not m.group(2)
        and (p / Checkpointer.METADATA_FNAME).is_file()
    ]
    return sorted(marked, reverse=True)


def checkpoints_at(path: Path) -> List[Tuple[int, str]]:
    """The checkpoint at ``path`` itself, or every complete checkpoint of a run folder."""
    if (path / Checkpointer.METADATA_FNAME).is_file():
        return [(0, str(path))]
    return checkpoints_in(path)


def holds_checkpoints(folder: PathOrStr) -> bool:
    """Whether a run folder holds a complete checkpoint, or step folders set aside in a subfolder
    (rejected/, superseded-TIME/): its recorded config then stays, since it says what wrote them."""
    if Checkpointer.contains_checkpoint(folder):
        return True
    return Path(folder).is_dir() and any(p.is_dir() for p in Path(folder).glob("*/step*"))


def checkpoint_step(checkpoint: PathOrStr) -> int:
    """The global step a checkpoint was saved at (its trainer state)."""
    state = torch.load(Path(checkpoint) / "train" / "rank0.pt", weights_only=False)
    return int(state["global_step"])


def load_model_state(checkpoint: PathOrStr) -> Dict[str, torch.Tensor]:
    """The model weights of a trainer checkpoint (``stepN``) or of a bare model checkpoint, as
    full tensors keyed like OLMo-core's ``Transformer.state_dict()``. Reads in this process alone,
    with or without a process group (rank 0 checks a save folder's checkpoints under torchrun)."""
    return _load_tensors(checkpoint, "model.")


def load_optim_state(checkpoint: PathOrStr) -> Dict[str, torch.Tensor]:
    """The optimizer's state tensors of a trainer checkpoint (AdamW: each parameter's ``exp_avg``,
    ``exp_avg_sq`` and ``step``), as full tensors keyed ``PARAM.NAME``; read as
    :func:`load_model_state` reads."""
    return _load_tensors(checkpoint, "optim.state.")


def checkpoint_shapes(checkpoint: PathOrStr) -> Dict[str, torch.Size]:
    """The model weights' shapes of a checkpoint, keyed as :func:`load_model_state`'s tensors, from
    its metadata alone (torch.distributed.checkpoint's ``.metadata``: no tensor is read)."""
    _, metadata = _metadata(checkpoint)
    return {k[len("model.") :]: m.size for k, m in _tensors(metadata, "model.").items()}


def _metadata(checkpoint: PathOrStr):
    """(the folder of the DCP files, their metadata): a trainer checkpoint's model_and_optim/, or a
    bare one."""
    from olmo_core.distributed.checkpoint import get_checkpoint_metadata

    root = Path(checkpoint)
    model_dir = (
        root / "model_and_optim" if (root / "model_and_optim" / ".metadata").exists() else root
    )
    return model_dir, get_checkpoint_metadata(model_dir)


def _tensors(metadata, prefix: str) -> dict:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    items = metadata.state_dict_metadata.items()
    return {k: m for k, m in items if k.startswith(prefix) and isinstance(m, TensorStorageMetadata)}


def _load_tensors(checkpoint: PathOrStr, prefix: str) -> Dict[str, torch.Tensor]:
    # OLMo-core's load_keys without its guard against a process group: its read is local (no_dist).
    from olmo_core.distributed.checkpoint import _get_key, _load_unsharded_keys

    model_dir, metadata = _metadata(checkpoint)
    keys = list(_tensors(metadata, prefix))
    state = _load_unsharded_keys(model_dir, keys)
    return {k[len(prefix) :]: _get_key(state, k, pop=True) for k in keys}


# ---- a checkpoint against a config --------------------------------------------------------------


def model_shapes(spec: ExperimentSpec) -> dict[str, torch.Size]:
    """The weights of the config's model and their shapes (built on the meta device: no memory)."""
    model = spec.model_config().build(init_device="meta")
    return {k: v.shape for k, v in model.state_dict().items()}


def first_difference(
    there: Mapping[str, Sequence[int]], here: Mapping[str, Sequence[int]]
) -> Optional[str]:
    """How the weights ``there`` (name: shape) differ from the config's model's ``here``, the first
    difference in the model's order; None when every weight fits."""
    for key, shape in here.items():
        if key not in there:
            return f"no weight {key} there ({list(shape)} in this config's model)"
        if list(there[key]) != list(shape):
            # the same elements in another shape: a layout this code does not read
            earlier = math.prod(there[key]) == math.prod(shape)
            return (
                f"first differing weight {key}: {list(there[key])} there, {list(shape)} in this "
                "config's model"
                + ("; a checkpoint of an earlier layout (CHANGELOG.md)" if earlier else "")
            )
    if extra := [k for k in there if k not in here]:
        return f"weight {extra[0]} {list(there[extra[0]])} there, not in this config's model"
    return None


def written_by(checkpoint: str | Path) -> str:
    """The config a checkpoint was written with, in a few words: its run folder's config.yaml and
    model, or that none is there."""
    recorded = Path(checkpoint).parent / "config.yaml"
    try:
        model = (yaml.safe_load(recorded.read_text()) or {}).get("model") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        return f"no readable config.yaml beside it ({recorded})"
    kind = BLOCKS.get(str(model.get("block")))
    # its kind's knobs where the record sets them (a record is a full dump: defaults are noise)
    knobs = [k for k in (kind.knobs if kind else ()) if not at_default(kind, k, model.get(k))]
    keys = ["block", "d_model", "n_layers", *knobs]
    shape = ", ".join(f"{k} {_short(model[k])}" for k in keys if model.get(k) is not None)
    return f"written by {recorded} ({shape})"


def _short(value) -> str:
    """A knob's value in a few words: a section (e.g. model.widths) by its shape or schedule."""
    if isinstance(value, dict):
        return str(value.get("shape") or value.get("schedule") or value.get("experts") or "{...}")
    return str(value)


def check_checkpoint_fits(
    checkpoint: str | Path,
    spec: ExperimentSpec,
    where: str,
    error: type = ConfigError,
    unreadable_ok: bool = False,
) -> None:
    """``error`` (one line, starting with ``where``) unless the weights of ``checkpoint`` (a step
    folder) have the shapes of ``spec``'s model; metadata that cannot be read is an ``error`` too,
    unless ``unreadable_ok``."""
    try:
        there = checkpoint_shapes(checkpoint)
    except Exception as e:  # noqa: BLE001 (a cut or foreign .metadata: DCP's or pickle's error)
        if unreadable_ok:
            return
        raise error(
            f"{where}: unreadable checkpoint metadata ({type(e).__name__}: "
            f"{' '.join(str(e).split())[:120]})"
        ) from None
    if (why := first_difference(there, model_shapes(spec))) is not None:
        raise error(f"{where}: {written_by(checkpoint)}; {why}")


def check_resume_from(resume_from: PathOrStr, spec: ExperimentSpec) -> None:
    """:class:`RunFolderError` (one line) unless ``--resume-from`` names a checkpoint or a folder
    with a complete one whose weights fit ``spec``'s model; local paths only (a URL is checked when
    it is loaded). Before anything is written."""
    if is_url(resume_from):
        return
    path = Path(resume_from)
    if not path.is_dir():
        what = "a file, not a checkpoint folder" if path.exists() else "no such folder"
        raise RunFolderError(f"--resume-from {path}: {what}")
    if (latest := latest_complete(path)) is None:
        raise RunFolderError(
            f"--resume-from {path}: no complete checkpoint there (a stepN folder with "
            f"{Checkpointer.METADATA_FNAME})"
        )
    check_checkpoint_fits(latest, spec, f"--resume-from {latest}", RunFolderError)


def check_own_checkpoint(spec: ExperimentSpec) -> None:
    """:class:`RunFolderError` (one line) when the newest complete checkpoint in the save folder,
    which a start without ``--resume-from`` resumes from, does not fit ``spec``'s model; one whose
    metadata cannot be read is left to the start's own check (it is set aside)."""
    if is_url(spec.save_folder) or (latest := latest_complete(spec.save_folder)) is None:
        return
    where = f"{spec.save_folder}: its newest checkpoint {Path(latest).name}"
    check_checkpoint_fits(latest, spec, where, RunFolderError, unreadable_ok=True)


# ---- what a checkpoint holds, checked -----------------------------------------------------------


def crc32(path: Path) -> str:
    """The CRC-32 of a file (zlib's, 8 hex digits)."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


def write_manifest(checkpoint: PathOrStr) -> None:
    """Record the files, sizes and CRCs of a local checkpoint just saved (its weights were checked
    finite)."""
    path = Path(checkpoint)
    files = {
        str(p.relative_to(path)): {"bytes": p.stat().st_size, "crc32": crc32(p)}
        for p in sorted(path.rglob("*"))
        if p.is_file() and not p.name.startswith(MANIFEST)
    }
    tmp = path / f"{MANIFEST}.tmp"
    tmp.write_text(json.dumps({"files": files, "finite": True}, indent=1))
    tmp.replace(path / MANIFEST)


class ManifestWriter:
    """:func:`write_manifest` in a background thread (rank 0): the training thread goes on while the
    files are read back (zlib releases the GIL; benchmarks/bench_checkpoint_manifest.py measures the
    cost against the save). A kill before it ends leaves no manifest: the checkpoint is then
    checked by loading its weights (:func:`verify`)."""

    _threads: ClassVar[List[threading.Thread]] = []

    @classmethod
    def start(cls, checkpoint: PathOrStr) -> None:
        thread = threading.Thread(
            target=write_manifest, args=(checkpoint,), name=f"manifest {checkpoint}"
        )
        thread.start()
        cls._threads.append(thread)

    @classmethod
    def wait_all(cls) -> None:
        while cls._threads:
            cls._threads.pop(0).join()


def _check_files(
    path: Path, recorded: Dict[str, Union[int, Dict[str, Union[int, str]]]]
) -> Optional[str]:
    for name, entry in recorded.items():
        size, crc = (
            (entry, None) if isinstance(entry, int) else (entry["bytes"], entry.get("crc32"))
        )
        f = path / name
        if not f.is_file():
            return f"{f} missing"
        if f.stat().st_size != size:
            return f"{f} has {f.stat().st_size} bytes, {size} when saved"
        if crc is not None and (now := crc32(f)) != crc:
            return f"{f} is corrupted (CRC-32 {now}, {crc} when saved)"
    return None


def verify(checkpoint: PathOrStr, load_weights: bool = True) -> Optional[str]:
    """Why a complete checkpoint cannot be resumed, or None. With a manifest: every file there at
    its size and CRC-32 (a manifest of sizes only, from 0.2: also the weights' check below). Without
    one (an older version, or a kill before the manifest was written): its files load and its
    weights are finite (``load_weights=False``: only OLMo-core's required files are there)."""
    path = Path(checkpoint)
    manifest = path / MANIFEST
    checksummed = False
    if manifest.is_file():
        try:
            recorded = json.loads(manifest.read_text())["files"]
        except (ValueError, KeyError) as e:
            return f"{manifest} unreadable ({e})"
        if (why := _check_files(path, recorded)) is not None:
            return why
        checksummed = all(isinstance(e, dict) and "crc32" in e for e in recorded.values())
    if checksummed:
        return None
    for name in ("train/rank0.pt", "model_and_optim/.metadata"):  # what OLMo-core requires
        if not (path / name).is_file():
            return f"{path / name} missing"
    if not load_weights:
        return None
    try:
        finite = all(bool(torch.isfinite(v).all()) for v in load_model_state(path).values())
        return None if finite else f"{path} has non-finite weights"
    except Exception as e:  # a cut or missing model file
        return f"{path} unreadable ({type(e).__name__}: {' '.join(str(e).split())[:200]})"


# ---- the checkpoint a run resumes from (rank 0, local folders, before the run writes) ------------


def prune_incomplete(save_folder: PathOrStr) -> List[Path]:
    """Remove the cut-off saves of a local save folder (``stepN`` without its completion marker,
    ``stepN-tmp``); rank 0 only: a local save folder is shared by all nodes. Returns what went. A
    folder with its marker but a file gone is a damaged checkpoint: :func:`select_resume_checkpoint`
    moves it aside."""
    removed: List[Path] = []
    folder = Path(save_folder)
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        m = _STEP_DIR.match(path.name)
        if (
            m
            and path.is_dir()
            and (m.group(2) or not (path / Checkpointer.METADATA_FNAME).is_file())
        ):
            log.warning(f"Removing incomplete checkpoint folder '{path}' (a save was cut off)")
            shutil.rmtree(path)
            removed.append(path)
    return removed


def select_resume_checkpoint(save_folder: PathOrStr) -> Optional[str]:
    """Move aside (to ``SAVE/rejected/``) every checkpoint newer than the newest good one; return
    that one (None: start from scratch)."""
    folder = Path(save_folder)
    rejected = []
    for step, path in checkpoints_in(folder):
        why = verify(path)
        if why is None:
            if rejected:
                log.warning(
                    f"Resuming from step {step} ({path}): {'; '.join(rejected)} (moved to "
                    f"{folder / 'rejected'})"
                )
            return path
        aside = folder / "rejected"
        aside.mkdir(exist_ok=True)
        target, n = aside / Path(path).name, 1
        while target.exists():
            target, n = aside / f"{Path(path).name}.{n}", n + 1
        Path(path).rename(target)
        rejected.append(why)
    if rejected:
        log.warning(
            f"No good checkpoint: {'; '.join(rejected)} (moved to {folder / 'rejected'}); starting "
            "from scratch"
        )
    return None


def load_explicit(trainer, resume_from: PathOrStr) -> str:
    """Load ``resume_from`` (a checkpoint or a folder of checkpoints) into ``trainer`` before
    ``fit()``; save-folder checkpoints newer than it move to ``SAVE/superseded-<time>/``."""
    path = broadcast_object(latest_complete(resume_from) if get_rank() == 0 else None)
    if path is None:
        raise FileNotFoundError(f"--resume-from {resume_from}: no complete checkpoint there")
    save_folder = Path(trainer.save_folder)
    if get_rank() == 0 and save_folder.is_dir():
        step = checkpoint_step(path)
        aside = save_folder / f"superseded-{time.strftime('%Y%m%d-%H%M%S')}"
        for other_step, other in Checkpointer.find_checkpoints(save_folder):
            if other_step > step and Path(other).resolve() != Path(path).resolve():
                aside.mkdir(exist_ok=True)
                log.warning(
                    f"Moving '{other}' (newer than the resume point, step {step}) to '{aside}'"
                )
                Path(other).rename(aside / Path(other).name)
    barrier()
    trainer.load_checkpoint(path, load_trainer_state=True, load_optim_state=True)
    return path
