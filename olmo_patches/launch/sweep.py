"""Sweeps: many configs launched, tracked and reported as one (``scripts/sweep.py``).

A sweep is a list of configs (files, folders searched recursively, globs) and overrides applied to
each; its runs are the configs' save folders. The sweep keeps no state of its own: everything is in
the run folders, beside what training writes there (``config.yaml``, ``metrics.jsonl``, ``stepN/``):

- ``sweep-claim.json``: who runs it now, ``{"host", "pid"}`` (a local launch) or
  ``{"slurm_job": "A_i"}`` (element i of array job A). A launch takes it only when no live claim is
  there, so two launches never start the same run; a claim whose process (this host) or job
  (``squeue``) is gone is stale and retaken. Taken as a run folder's ``.lock`` is (the guard file
  ``.sweep-claim.lock``, :func:`~olmo_patches.launch.run_folder.take_record`).
- ``sweep.log`` and ``sweep-last.json``: a local launch's output (appended) and its last exit code
  and error line.

A run's state: **done** (a complete checkpoint at the last step), **running** (a live claim, or
a live process holding the run folder's lock: a run started by hand),
**failed** (the last attempt exited non-zero, or SLURM says FAILED/TIMEOUT/OUT_OF_MEMORY/...),
**stopped** (anything else begun: a checkpoint, metrics or a config) or **not started**.

Seeds and learning rates (:class:`Variants`): each config can run over seeds and over a grid of
learning rates around its own. Seed offset s adds s to ``train.seed`` (the init) and/or
``data.order_seed`` (the data order), whichever ``vary`` names; LR scale x multiplies
``train.lr``. Offset 0 at scale 1 is the config's own run (its name and folder); another variant is
the run ``NAME-lrXx-seedS`` in the folder ``SAVE_FOLDER-lrXx-seedS`` (``-seedS-init`` or
``-seedS-order`` where one seed is varied), an ordinary run folder (resumed, claimed and reported as
any).
"""

from __future__ import annotations

import getpass
import glob
from functools import partial
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..config import ConfigError, ExperimentSpec, load_spec
from ..resources import data_root, find_config
from .run_folder import (
    METRICS_FILE,
    Lock,
    RunFolderError,
    check_config,
    drop_record,
    guarded,
    latest_step,
    pid_alive,
    read_metrics,
    read_record,
    take_record,
    write_record,
)

__all__ = [
    "SEED_KEYS",
    "seed_of",
    "Member",
    "Variants",
    "RunStatus",
    "SlurmInfo",
    "load_sweep",
    "sweep_status",
    "launch_local",
    "launch_slurm",
    "take_claim",
]

REPO = data_root()  # scripts/ of the checkout or the installed wheel
TRAIN_SCRIPT = REPO / "scripts" / "train.py"
SLURM_LAUNCHER = REPO / "scripts" / "launch_slurm.sbatch"
CLAIM, CLAIM_LOCK = "sweep-claim.json", ".sweep-claim.lock"
LOG, LAST = "sweep.log", "sweep-last.json"
# sacct states of an element that ended in error; other ended states (COMPLETED, CANCELLED,
# PREEMPTED, REQUEUED) leave an unfinished run "stopped".
SLURM_FAILED = {"FAILED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "DEADLINE"}
SLURM_LIVE = set(
    "PENDING RUNNING CONFIGURING COMPLETING REQUEUED RESIZING SUSPENDED REQUEUE_HOLD "
    "REQUEUE_FED".split()
)


SEED_KEYS = ("train.seed", "data.order_seed")  # what a seed offset changes (--vary init, order)
SEED_SUFFIX = "-seed"  # a seed offset's run: NAME-seedS[-init|-order] (NAME: offset 0)


def seed_of(name: str) -> Tuple[str, int]:
    """(NAME, S) of a run named NAME-seedS (or NAME-seedS-init, -order) by a sweep; (name, 0) for
    any other name."""
    m = re.fullmatch(rf"(.+){SEED_SUFFIX}(\d+)(-init|-order)?", name)
    return (m[1], int(m[2])) if m else (name, 0)


@dataclass(frozen=True)
class Variants:
    """The runs each config of a sweep makes: seed offsets x LR scales."""

    seeds: Tuple[int, ...] = (0,)  # offsets added to the config's seeds; 0: the config's own
    vary: Tuple[str, ...] = ("init", "order")  # init: train.seed; order: data.order_seed
    lr_scales: Tuple[float, ...] = (1.0,)  # multiples of the config's train.lr

    def overrides(self, spec: ExperimentSpec, seed: int, lr_scale: float) -> List[str]:
        """The overrides making ``spec`` (a config as loaded) the run of this seed and LR scale."""
        own, suffix = [], ""
        if lr_scale != 1.0:
            own.append(f"train.lr={spec.train.lr * lr_scale!r}")
            suffix += f"-lr{lr_scale:g}x"
        if seed:
            own += [f"train.seed={spec.train.seed + seed}"] * ("init" in self.vary)
            own += [f"data.order_seed={spec.data.order_seed + seed}"] * ("order" in self.vary)
            suffix += f"{SEED_SUFFIX}{seed}" + (f"-{self.vary[0]}" if len(self.vary) == 1 else "")
        if suffix:
            own += [
                f"run.name={spec.run.name}{suffix}",
                f"run.save_folder={spec.save_folder}{suffix}",
            ]
        return own

    def describe(self) -> str:
        seeds = ", ".join(map(str, self.seeds))
        varied = {"init": "train.seed (init)", "order": "data.order_seed (data order)"}
        return (
            f"{len(self.seeds)} seed(s), offsets {seeds} added to "
            + " and ".join(varied[v] for v in self.vary)
            + (" (the other kept at the config's)" if len(self.vary) == 1 else "")
            + f"; LR scales {', '.join(f'{x:g}' for x in self.lr_scales)} x the config's train.lr"
        )


@dataclass
class Member:
    """One run of the sweep: a config at one seed offset and LR scale."""

    config: Path
    spec: ExperimentSpec
    overrides: Tuple[str, ...] = ()  # this run's own (seed, LR, name, folder), after the sweep's
    group: str = ""  # the config's run.name: every seed and LR of one config
    seed: int = 0  # seed offset
    lr_scale: float = 1.0
    copies: Tuple[Path, ...] = ()  # other files of the same config (a run of several ablations)

    @property
    def name(self) -> str:
        return self.spec.run.name

    @property
    def folder(self) -> Path:
        return Path(self.spec.save_folder)

    @property
    def total_steps(self) -> int:
        return self.spec.steps  # type: ignore[return-value]

    @property
    def tokens_per_step(self) -> int:
        return self.spec.train.global_batch_size * self.spec.data.sequence_length


def _in_run_folder(path: Path) -> bool:
    """A file training or a sweep wrote into a run folder (its config.yaml), not a config of the
    sweep."""
    return any((path.parent / marker).exists() for marker in (METRICS_FILE, LOG, CLAIM_LOCK))


def expand_configs(patterns: Sequence[str]) -> List[Path]:
    """Config files from files, folders (every *.yaml below, sorted, run folders left out) and
    globs; each once, in order."""
    found: List[Path] = []
    for p in patterns:
        path = find_config(p)  # configs/... from any folder once installed
        if path.is_dir():
            matches = sorted(m for m in path.rglob("*.yaml") if not _in_run_folder(m))
        elif path.is_file():
            matches = [path]
        else:
            matches = sorted(
                Path(m) for m in glob.glob(p, recursive=True) if m.endswith((".yaml", ".yml"))
            )
        if not matches:
            raise ConfigError(
                f"command line: {p}: no config file, folder of configs or glob matching one"
            )
        found += [m for m in matches if m not in found]
    return found


def load_sweep(
    patterns: Sequence[str], overrides: Sequence[str] = (), variants: Variants = Variants()
) -> List[Member]:
    """Every run of every config loaded and checked (ConfigError on the first bad one); configs
    naming one run folder are one run (the copies of a config in several ablations' folders) or
    refused (two configs), as are two runs of one name (with their -lrXx, -seedS suffixes) and a
    run folder that holds a run of another config (run_folder.check_config, as train.py would
    refuse it; the sweep would take it for done, the report would pool it)."""
    members = []
    for path in expand_configs(patterns):
        spec = load_spec(path, list(overrides))
        for lr_scale in variants.lr_scales:
            for seed in variants.seeds:
                own = variants.overrides(spec, seed, lr_scale)
                run_spec = load_spec(path, [*overrides, *own]) if own else spec
                members.append(Member(path, run_spec, tuple(own), spec.run.name, seed, lr_scale))
    runs: Dict[Path, Member] = {}
    names: Dict[str, Member] = {}  # the report knows a run by its name
    for m in members:
        if (same := runs.setdefault(m.folder.resolve(), m)) is not m and same.spec != m.spec:
            raise ConfigError(
                f"{m.config}: run.save_folder: {m.folder} is also the run folder of {same.config}"
            )
        same.copies += (m.config,) if same is not m else ()
        if (other := names.setdefault(m.name, same)) is not same:
            raise ConfigError(
                f"{m.config}: run.name: {m.name} is also the run name of {other.config}"
            )
        try:  # as train.py would: its newest record, where a complete checkpoint was saved
            check_config(m.spec, checkpointed=latest_step(m.folder) >= 0)
        except RunFolderError as e:
            raise ConfigError(f"{m.config}: {e}") from None
    return list(runs.values())


# --- SLURM queries --------------------------------------------------------------------------------


@dataclass
class SlurmInfo:
    """Job states from squeue (live jobs) and sacct (ended ones); None where the command is
    absent."""

    queue: Optional[Dict[str, str]]
    accounting: Optional[Dict[str, str]]

    @classmethod
    def query(cls, jobs: Sequence[str]) -> "SlurmInfo":
        if not jobs:
            return cls({}, {})
        queue = _parse_states(
            _call(["squeue", "-h", "-r", "-u", getpass.getuser(), "-o", "%i %T"]), " "
        )
        arrays = sorted({j.split("_")[0] for j in jobs})
        accounting = _parse_states(
            _call(["sacct", "-n", "-P", "-X", "-j", ",".join(arrays), "-o", "JobID,State"]), "|"
        )
        return cls(queue, accounting)

    def live(self, job: str) -> Optional[bool]:
        """Whether the job is queued or running; None when squeue is unavailable."""
        return None if self.queue is None else self.queue.get(job) in SLURM_LIVE


def _call(cmd: List[str]) -> Optional[str]:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def _parse_states(text: Optional[str], sep: str) -> Optional[Dict[str, str]]:
    """{job id: state} from ``id<sep>STATE`` lines ("CANCELLED by 123" -> CANCELLED)."""
    if text is None:
        return None
    states = {}
    for line in text.splitlines():
        parts = line.strip().split(sep, 1)
        if len(parts) == 2 and parts[1].strip():
            states[parts[0].strip()] = parts[1].split()[0].rstrip("+")
    return states


# --- claims ---------------------------------------------------------------------------------------


def read_claim(folder: Path) -> Optional[dict]:
    return read_record(folder / CLAIM)


def claim_alive(claim: Optional[dict], slurm: SlurmInfo) -> bool:
    """A claim is live while its SLURM job is queued or running, or its local process is alive.
    A job that squeue cannot be asked about, or a process on another host, counts as live."""
    if claim is None:
        return False
    if claim.get("slurm_job"):
        live = slurm.live(claim["slurm_job"])
        return True if live is None else live
    if claim.get("host") != socket.gethostname():
        return True
    return pid_alive(int(claim["pid"]))


def take_claim(folder: Path, slurm: SlurmInfo) -> bool:
    """Claim the run for this process unless a live claim holds it; True when taken."""
    me = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
    return take_record(
        folder / CLAIM, folder / CLAIM_LOCK, me, lambda claim: not claim_alive(claim, slurm)
    )[0]


def release_claim(folder: Path) -> None:
    drop_record(folder / CLAIM, folder / CLAIM_LOCK)


# --- state ----------------------------------------------------------------------------------------


@dataclass
class RunStatus:
    member: Member
    state: str
    step: int
    slurm_job: str = ""
    error: str = ""

    @property
    def tokens(self) -> int:
        return self.step * self.member.tokens_per_step


def last_error_line(log: Path, start: int = 0) -> str:
    """The last line naming an error (a traceback's last line), else the last line, of a log (from
    byte ``start``: what one attempt appended)."""
    try:
        with log.open("rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        if re.search(r"(Error|Exception|error:|Killed|Traceback)", line):
            return line
    return lines[-1] if lines else ""


def run_status(m: Member, slurm: SlurmInfo, slurm_log_dir: Path = Path("logs")) -> RunStatus:
    folder = m.folder
    metrics = read_metrics(folder)
    ckpt = latest_step(folder)
    step = max(ckpt, max(metrics, default=0), 0)
    claim = read_claim(folder)
    job = (claim or {}).get("slurm_job", "")
    status = RunStatus(m, "not started", step, job)
    if ckpt >= m.total_steps:
        status.state = "done"
    # a lock without a sweep job: a run started by hand (a job's lock on a node SLURM killed
    # looks held from here; its job's state says)
    elif claim_alive(claim, slurm) or (not job and Lock(folder).holder()):
        status.state = "running"
    elif job and (s := (slurm.accounting or {}).get(job)) in SLURM_FAILED:
        status.state, status.error = "failed", f"SLURM {s}: " + _slurm_error(job, slurm_log_dir)
    elif not job and (last := read_record(folder / LAST)) is not None and last["exit"] != 0:
        status.state, status.error = "failed", last.get("error", "")
    elif ckpt >= 0 or metrics or (folder / "config.yaml").exists():
        status.state = "stopped"
    return status


def _slurm_error(job: str, log_dir: Path) -> str:
    logs = sorted(log_dir.glob(f"*-{job}.out"))
    return last_error_line(logs[-1]) if logs else f"no log {log_dir}/*-{job}.out"


def _slurm_for(members: Sequence[Member]) -> SlurmInfo:
    """SLURM's view of the jobs that claimed these runs."""
    return SlurmInfo.query(
        [c["slurm_job"] for m in members if (c := read_claim(m.folder)) and c.get("slurm_job")]
    )


def sweep_status(members: Sequence[Member], slurm_log_dir: Path = Path("logs")) -> List[RunStatus]:
    slurm = _slurm_for(members)
    return [run_status(m, slurm, slurm_log_dir) for m in members]


# --- launching ------------------------------------------------------------------------------------


def launch_local(
    members: Sequence[Member], overrides: Sequence[str], say=partial(print, flush=True)
) -> int:
    """Train each unfinished run in turn (a stopped or failed one resumes from its latest
    checkpoint), each in its own process, output appended to its ``sweep.log`` and shown (``say``),
    each line after the run's name. SIGINT/SIGTERM are passed to the running training (it saves a
    checkpoint) and end the sweep. Returns the number of failed runs."""
    failed = 0
    stop: List[int] = []
    child: List[subprocess.Popen] = []  # the training running now, for the signals

    def forward(signum, _frame):
        stop.append(signum)
        if child:
            child[0].send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for m in members:
            if stop:
                break
            slurm = _slurm_for([m])
            s = run_status(m, slurm)
            if s.state in ("done", "running"):
                say(f"{m.name}: {s.state}, skipped")
            elif not take_claim(m.folder, slurm):
                say(f"{m.name}: claimed by another launch, skipped")
            else:
                failed += _run_claimed(m, s.step, overrides, child, say) == "failed"
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return failed


def _run_claimed(m: Member, step: Optional[int], overrides: Sequence[str], child: list, say) -> str:
    """One run this launch claimed, trained in its own process: its exit recorded in its
    ``LAST`` record, its claim released. Returns its state after."""
    say(f"{m.name}: {'resuming from step ' + str(step) if step else 'starting'} ({m.folder / LOG})")
    start, log = time.time(), m.folder / LOG
    appended_from = log.stat().st_size if log.exists() else 0
    try:
        rc = _train_logged(m, overrides, child, say)
        error = last_error_line(log, appended_from) if rc != 0 else ""
        write_record(
            m.folder / LAST, {"exit": rc, "error": error, "seconds": round(time.time() - start, 1)}
        )
    finally:
        release_claim(m.folder)
    state = run_status(m, _slurm_for([m])).state
    say(f"{m.name}: {state} after {time.time() - start:.0f} s" + (f": {error}" if error else ""))
    return state


def _train_logged(m: Member, overrides: Sequence[str], child: list, say) -> int:
    """scripts/train.py on ``m`` in a child process (held in ``child`` while it runs), its lines
    (its progress) appended to the run's log and, named, shown; its exit code."""
    cmd = [sys.executable, str(TRAIN_SCRIPT), str(m.config), *overrides, *m.overrides]
    with open(m.folder / LOG, "a") as log:
        out = subprocess.PIPE
        child[:] = [
            subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, bufsize=1)
        ]
        for line in child[0].stdout:  # type: ignore[union-attr]
            log.write(line)
            log.flush()
            say(f"{m.name} | {line.rstrip()}")
        rc = child[0].wait()
        child.clear()
    return rc


def launch_slurm(
    members: Sequence[Member],
    overrides: Sequence[str],
    *,
    nodes: int,
    gpus_per_node: int,
    log_dir: Path = Path("logs"),
    sbatch_args: Sequence[str] = (),
    say=print,
) -> Optional[str]:
    """Submit the unfinished, unclaimed runs as one job array, element i running
    scripts/launch_slurm.sbatch on the i-th line of a manifest (``CONFIG key=value ...``). Returns
    the array's job id (None when nothing was left to run)."""
    slurm = _slurm_for(members)
    todo = []
    for s in (run_status(m, slurm, log_dir) for m in members):
        if s.state in ("done", "running"):
            say(f"{s.member.name}: {s.state}, skipped")
        elif take_claim(s.member.folder, slurm):
            todo.append(s.member)
        else:
            say(f"{s.member.name}: claimed by another launch, skipped")
    if not todo:
        return None
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        manifest = log_dir / f"sweep-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt"
        manifest.write_text(
            "".join(shlex.join([str(m.config), *overrides, *m.overrides]) + "\n" for m in todo)
        )
        array = _sbatch_array(len(todo), manifest, nodes, gpus_per_node, log_dir, sbatch_args)
    except BaseException:
        for m in todo:
            release_claim(m.folder)
        raise
    for i, m in enumerate(todo):
        with guarded(m.folder / CLAIM_LOCK):  # this process's claim passes to the job's element
            write_record(
                m.folder / CLAIM,
                {"slurm_job": f"{array}_{i}", "manifest": str(manifest), "since": time.time()},
            )
        say(f"{m.name}: submitted as {array}_{i}")
    return array


def _sbatch_array(
    n: int,
    manifest: Path,
    nodes: int,
    gpus_per_node: int,
    log_dir: Path,
    sbatch_args: Sequence[str],
) -> str:
    """sbatch of a job array of ``n`` elements, one a line of ``manifest``: its job id."""
    cmd = [
        "sbatch",
        "--parsable",
        f"--array=0-{n - 1}",
        f"--nodes={nodes}",
        f"--gpus-per-node={gpus_per_node}",
        f"--output={log_dir}/%x-%A_%a.out",
        *sbatch_args,
        str(SLURM_LAUNCHER),
        "--array",
        str(manifest),
    ]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError:
        raise RuntimeError(
            "sbatch: command not found (launch --slurm runs where SLURM is)"
        ) from None
    if out.returncode != 0:
        raise RuntimeError(
            f"sbatch failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}"
        )
    return out.stdout.strip().split(";")[0]
