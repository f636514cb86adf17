"""The programs of the fake SLURM (tests/_fake_slurm.py): ``python _fake_slurm_bin.py TOOL ARGS``,
TOOL one of srun, scancel, scontrol, squeue, python. Standard library only.

What a job's processes are: SLURM tracks each step's processes in a container (a cgroup) that
every descendant of a task joins; signals to a step go to all of it (slurmstepd
``_handle_signal_container`` -> ``proctrack_g_signal``, src/slurmd/slurmstepd/req.c). Here the
container is an environment variable every descendant inherits: ``FAKE_SLURM_STEP=JOB/STEP`` (STEP
``batch`` for the batch script and its children, 0, 1, ... for srun's steps), read back from
``/proc/PID/environ``.

Semantics, with their sources (SchedMD/slurm: doc/man/man1/*.1, doc/man/man5/slurm.conf.5, src/):

- ``srun CMD``: one task a node (``--ntasks-per-node=1``), each with SLURM_PROCID/SLURM_NODEID. Its
  own SIGTERM, SIGHUP or SIGQUIT: "srun: forcing job termination" and SIGKILL to every process of
  the step; SIGINT: a status line, a second within 1 s: SIGINT then SIGKILL to the step; SIGCONT:
  noted; any other signal (USR1, USR2): passed to every process of the step (src/srun/signals.c,
  ``_forward_signal``). ``--kill-on-bad-exit=1``: a task that exits non-zero ends the step
  (SIGKILL). When the tasks have ended, what is left of the step is killed (the step's container
  ends with it). Exit: the highest task exit code, 128 + n for a task ended by signal n (srun(1),
  RETURN VALUE). ``FAKE_SRUN_RUN`` unset: srun only records its argv.
- ``scancel --signal=SIG JOB``: every process of every step, not the batch script; ``--batch``: the
  batch shell alone, not its children; ``--full``: the batch shell, its children (srun among them)
  and every step (scancel(1), -b/-f). Without --signal: the job ends (below).
- ``scontrol requeue JOB``: the job ends at once, as any end of a running job: SIGCONT and SIGTERM
  to every process of the job (batch script included), SIGKILL KillWait s later (slurm.conf(5)
  KillWait); ``scontrol show hostnames``: node001..nodeN.
- ``python``: the batch script's pre-flight ``scripts/train.py ... --dry-run`` is recorded and exits
  ``FAKE_PYTHON_EXIT``; any other command runs the real Python (``FAKE_REAL_PYTHON``; the nodes
  are this machine: a rendezvous endpoint becomes 127.0.0.1:``FAKE_RDZV_PORT``), or, with
  ``FAKE_STAND_IN`` set, a stand-in rank: SIGTERM or SIGUSR1 makes it save (``FAKE_SAVE_S`` seconds,
  then ``LOG/checkpoint``) and exit 0; another signal during the save is noted, not obeyed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

MARK = "FAKE_SLURM_STEP"


def _log() -> Path:
    return Path(os.environ["FAKE_SLURM_LOG"])


def _job() -> str:
    return os.environ["FAKE_SLURM_JOB"]


def _record(tool: str, argv: list, mode: str = "w") -> None:
    with open(_log() / f"{tool}.args", mode + "b") as f:
        f.write(b"".join(a.encode() + b"\0" for a in argv))


def _note(name: str, line: str) -> None:
    with open(_log() / name, "a") as f:
        f.write(line + "\n")


def processes(job: str, steps=None) -> list:
    """The pids of a job's processes (of ``steps`` only: "batch", "0", ...), this one excluded."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{entry.name}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z":  # a zombie: ended, not yet reaped
            continue
        mark = next(
            (e[len(MARK) + 1 :].decode() for e in env if e.startswith(MARK.encode() + b"=")), None
        )
        if mark is None or not mark.startswith(job + "/"):
            continue
        if steps is None or mark[len(job) + 1 :] in steps:
            out.append(int(entry.name))
    return out


def signal_all(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _steps_of(job: str) -> list:
    """Every step's name but the batch script's (the job is named by its log folder)."""
    steps = Path(job) / "steps"
    return [str(i) for i in range(int(steps.read_text()) if steps.exists() else 0)]


def end_job(job: str, kill_wait: float) -> None:
    """End a running job as slurmd does: SIGCONT, SIGTERM to every process, SIGKILL after KillWait
    (from a process outside the job)."""
    env = {k: v for k, v in os.environ.items() if k != MARK}
    subprocess.Popen(
        [sys.executable, __file__, "_end", job, str(kill_wait)],
        env=env,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _end(job: str, kill_wait: str) -> None:
    signal_all(processes(job), signal.SIGCONT)
    signal_all(processes(job), signal.SIGTERM)
    deadline = time.monotonic() + float(kill_wait)
    while time.monotonic() < deadline and processes(job):
        time.sleep(0.05)
    signal_all(processes(job), signal.SIGKILL)


def _forward_signals(job: str, step_id: str, mine) -> None:
    """srun's handling of the signals it gets: what it prints, and what reaches the step's
    tasks."""
    last_int = [0.0]

    def on_signal(signum, frame):
        name = signal.Signals(signum).name
        _note("srun.signals", name)
        if signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
            print("srun: forcing job termination", file=sys.stderr, flush=True)
            signal_all(mine(), signal.SIGKILL)
        elif signum == signal.SIGINT:
            if time.monotonic() - last_int[0] < 1:
                print(
                    f"srun: sending Ctrl-C to StepId={job}.{step_id}", file=sys.stderr, flush=True
                )
                signal_all(mine(), signal.SIGINT)
                print("srun: forcing job termination", file=sys.stderr, flush=True)
                signal_all(mine(), signal.SIGKILL)
            else:
                print(
                    "srun: interrupt (one more within 1 sec to abort)", file=sys.stderr, flush=True
                )
            last_int[0] = time.monotonic()
        elif signum == signal.SIGCONT:
            print("srun: got SIGCONT", file=sys.stderr, flush=True)
        else:
            signal_all(mine(), signum)

    for s in (
        signal.SIGTERM,
        signal.SIGHUP,
        signal.SIGQUIT,
        signal.SIGINT,
        signal.SIGCONT,
        signal.SIGUSR1,
        signal.SIGUSR2,
    ):
        signal.signal(s, on_signal)


def _start_tasks(cmd: list, job: str, step_id: str) -> list:
    """One task a node, each in its own session, marked with its job and step."""
    tasks = []
    for i in range(int(os.environ.get("SLURM_JOB_NUM_NODES", "1"))):
        env = dict(
            os.environ,
            SLURM_PROCID=str(i),
            SLURM_NODEID=str(i),
            SLURM_LOCALID="0",
            SLURM_STEP_ID=step_id,
            SLURMD_NODENAME=f"node{i + 1:03d}",
            **{MARK: f"{job}/{step_id}"},
        )
        tasks.append(subprocess.Popen(cmd, env=env, start_new_session=True))
    return tasks


def _wait_tasks(tasks: list, mine, kill_on_bad_exit: bool) -> list:
    """Every task's exit code; a failed task is reported as srun does (and, with
    --kill-on-bad-exit, ends the step)."""
    codes = [None] * len(tasks)
    while any(c is None for c in codes):
        for i, t in enumerate(tasks):
            if codes[i] is None and (c := t.poll()) is not None:
                codes[i] = c
                if c != 0:
                    how = f"Killed by signal {-c}" if c < 0 else f"Exited with exit code {c}"
                    print(
                        f"srun: error: node{i + 1:03d}: task {i}: {how}",
                        file=sys.stderr,
                        flush=True,
                    )
                    if kill_on_bad_exit:
                        signal_all(mine(), signal.SIGKILL)
        time.sleep(0.05)
    return codes


def srun(argv: list) -> int:
    _record("srun", argv)
    if not os.environ.get("FAKE_SRUN_RUN"):
        return 0
    opts, cmd = [], list(argv)
    while cmd and cmd[0].startswith("-"):
        opts.append(cmd.pop(0))
    kill_on_bad_exit = "--kill-on-bad-exit=1" in opts or "--kill-on-bad-exit" in opts
    step = _steps_of(_job())
    step_id = str(len(step))
    (_log() / "steps").write_text(str(len(step) + 1))
    job = _job()
    mine = lambda: processes(job, [step_id])  # noqa: E731
    _forward_signals(job, step_id, mine)
    codes = _wait_tasks(_start_tasks(cmd, job, step_id), mine, kill_on_bad_exit)
    signal_all(mine(), signal.SIGKILL)  # the step is over: its container goes with it
    return max(c if c >= 0 else 128 - c for c in codes)


def scancel(argv: list) -> int:
    _record("scancel", argv, "a")
    sig, batch, full, job = None, False, False, None
    it = iter(argv)
    for a in it:
        if a.startswith("--signal="):
            sig = a.split("=", 1)[1]
        elif a in ("-s", "--signal"):
            sig = next(it)
        elif a in ("-b", "--batch"):
            batch = True
        elif a in ("-f", "--full"):
            full = True
        else:
            job = a
    assert job == os.environ["SLURM_JOB_ID"], (job, argv)
    if sig is None:
        end_job(_job(), float(os.environ["FAKE_KILL_WAIT"]))
        return 0
    signum = (
        int(sig)
        if sig.isdigit()
        else getattr(signal, sig if sig.startswith("SIG") else "SIG" + sig)
    )
    if full:
        signal_all(processes(_job()), signum)
    elif batch:
        signal_all([int((_log() / "batch.pid").read_text())], signum)
    else:
        signal_all(processes(_job(), _steps_of(_job())), signum)
    return 0


def scontrol(argv: list) -> int:
    if argv[:1] == ["show"]:
        for i in range(int(os.environ["FAKE_NODES"])):
            print(f"node{i + 1:03d}")
    elif argv[:1] == ["requeue"]:
        _record("scontrol.requeue", argv, "a")
        _note("requeue.steps_alive", str(len(processes(_job(), _steps_of(_job())))))
        end_job(_job(), float(os.environ["FAKE_KILL_WAIT"]))
    return 0


def stand_in() -> int:
    """A rank: saves on SIGTERM or SIGUSR1, once."""
    saving = []

    def on_signal(signum, frame):
        _note("rank.signals", signal.Signals(signum).name)
        saving.append(signum)

    for s in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(s, on_signal)
    _note("rank.started", str(os.getpid()))
    deadline = time.monotonic() + 60
    while not saving and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(float(os.environ.get("FAKE_SAVE_S", "0")))
    (_log() / "checkpoint").touch()
    return 0


def python(argv: list) -> int:
    if "--dry-run" in argv:
        _record("python", argv)
        return int(os.environ.get("FAKE_PYTHON_EXIT", "0"))
    if os.environ.get("FAKE_STAND_IN"):
        return stand_in()
    if port := os.environ.get("FAKE_RDZV_PORT"):  # the fake cluster's nodes are this machine
        argv = [
            f"--rdzv-endpoint=127.0.0.1:{port}" if a.startswith("--rdzv-endpoint=") else a
            for a in argv
        ]
    os.execv(os.environ["FAKE_REAL_PYTHON"], [os.environ["FAKE_REAL_PYTHON"], *argv])


if __name__ == "__main__":
    tool, *args = sys.argv[1:]
    if tool == "_end":
        _end(*args)
        sys.exit(0)
    sys.exit(
        {
            "srun": srun,
            "scancel": scancel,
            "scontrol": scontrol,
            "python": python,
            "squeue": lambda a: print(f"{os.environ['SLURM_JOB_ID']} RUNNING") or 0,
        }[tool](args)
    )
