"""scripts/launch_slurm.sbatch against a fake SLURM (tests/_fake_slurm.py): the pre-flight check and
the torchrun line it builds for 1 and 2 nodes, HSDP across nodes, overrides passed through as given;
what reaches the ranks at the time limit (USR1 to the batch shell) and at preemption (SIGTERM to the
steps), never srun's own SIGTERM (which SIGKILLs them); and scripts/train.py itself under it: the
checkpoint at the step reached, a clean exit, and a resume equal to an uninterrupted run."""

import json
import os
import re
import signal
import socket
import time

import pytest
import torch
from olmo_core.train.checkpoint import Checkpointer
from torch.distributed.run import get_args_parser

from olmo_patches.launch.layout import Layout, load_and_resolve
from olmo_patches.report.counts import count
from olmo_patches.report.plan import signal_lead
from olmo_patches.train import train
from olmo_patches.launch.run_folder import read_metrics

from ._fake_slurm import SBATCH, fake_slurm
from .conftest import REPO, finish, load_weights, tiny_overrides

# end to end: runs trained, processes or ranks started (make test-fast leaves them out)
pytestmark = pytest.mark.slow

CONFIG = "configs/1B/hourglass.yaml"
# Values a shell would split, glob or re-parse if the script re-quoted them.
ODD = [
    "run.name=my run",
    "run.wandb_project=a=b",
    "eval.validation_sets=[c4_en,wikitext_103]",
    "run.save_folder=/tmp/x y/*",
]


@pytest.fixture
def slurm(tmp_path):
    return fake_slurm(tmp_path)


def _torchrun(slurm):
    """srun's argv: its own flag, then a torchrun command parsed with torchrun's own parser."""
    argv = slurm.args("srun")
    assert argv[:4] == ["--kill-on-bad-exit=1", "python", "-m", "olmo_patches.launch.torchrun"], (
        argv
    )
    return get_args_parser().parse_args(argv[4:])


@pytest.mark.parametrize("nodes, gpus, procs", [(1, "8", 8), (2, "8", 8), (4, "h100:4", 4)])
def test_torchrun_line(slurm, nodes, gpus, procs):
    r = slurm.run(CONFIG, "train.lr=1e-3", nodes=nodes, gpus=gpus)
    assert r.returncode == 0, r.stderr
    t = _torchrun(slurm)
    assert (t.nnodes, t.nproc_per_node) == (str(nodes), str(procs))
    # the port: 29500 + the job id (4242) mod 1000, its own on a node shared with another job
    assert (t.rdzv_backend, t.rdzv_endpoint, t.rdzv_id) == ("c10d", "node001:29742", "4242")
    # torchrun waits for its workers' save as long as the time-limit signal's lead (torchrun's
    # default: 30 s).
    lead = int(re.search(r"^#SBATCH --signal=B:USR1@(\d+)$", SBATCH.read_text(), re.M).group(1))
    assert t.shutdown_timeout == lead
    hsdp = ["train.data_parallel=hsdp"] if nodes > 1 else []  # HSDP exactly when multi-node
    assert [t.training_script, *t.training_script_args] == [
        "scripts/train.py",
        CONFIG,
        *hsdp,
        "train.lr=1e-3",
    ]
    # The pre-flight: the same arguments, checked and planned for these ranks before srun.
    plan = ["--dry-run", "--nproc-per-node", str(procs), "--nodes", str(nodes)]
    assert slurm.args("python") == ["scripts/train.py", CONFIG, *hsdp, "train.lr=1e-3", *plan]


def test_overrides_pass_through_unchanged(slurm):
    r = slurm.run(CONFIG, *ODD, "train.data_parallel=fsdp", nodes=2)
    assert r.returncode == 0, r.stderr
    t = _torchrun(slurm)
    # The user's own data_parallel comes last, so it wins over the script's HSDP.
    assert t.training_script_args == [
        CONFIG,
        "train.data_parallel=hsdp",
        *ODD,
        "train.data_parallel=fsdp",
    ]
    assert slurm.args("python")[1:-5] == t.training_script_args


def test_bad_config_stops_before_srun(slurm):
    r = slurm.run(CONFIG, "train.global_batch_size=12", nodes=1, python_exit=2)
    assert r.returncode == 2
    assert slurm.args("srun") is None and slurm.requeues() == []


def _catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (Linux: SigCgt in /proc/PID/status)."""
    line = next(l for l in open(f"/proc/{pid}/status") if l.startswith("SigCgt:"))
    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)


def _wait(ready, proc, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline or proc.poll() is not None:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"{what}: {proc.communicate()}")
        time.sleep(0.05)


def _stand_in(slurm, save_s: float = 1.0, **kwargs):
    """The batch script on 2 nodes whose ranks are stand-ins that take ``save_s`` to save; returned
    once both ranks run and the script's trap is set."""
    proc = slurm.start(CONFIG, nodes=2, stand_in=True, save_s=save_s, **kwargs)
    _wait(
        lambda: len(slurm._lines("rank.started")) == 2 and _catches(proc.pid, signal.SIGUSR1),
        proc,
        "no ranks, or no trap",
    )
    return proc


def test_time_limit_passes_usr1_to_the_ranks_then_requeues(slurm):
    proc = _stand_in(
        slurm, kill_wait=0.3
    )  # KillWait shorter than the save: a requeue before it would cut it
    slurm.time_limit_warning()  # --signal=B:USR1@LEAD: the batch shell alone
    finish(
        proc, timeout=30
    )  # the requeue ends the job: the script's own exit status is not SLURM's record
    assert slurm.signals() == ["SIGUSR1"]  # srun had USR1 from the script, never a SIGTERM
    assert (
        slurm.rank_signals() == ["SIGUSR1", "SIGUSR1"] and slurm.saved()
    )  # each rank, through srun's step
    assert slurm.requeues() == ["requeue", "4242"] and slurm.steps_alive_at_requeue() == [
        0
    ]  # after the save


def test_preemption_sigterm_reaches_the_ranks_not_srun(slurm):
    proc = _stand_in(slurm, kill_wait=0.3)
    slurm.preempt(
        grace_s=20
    )  # SIGCONT, SIGTERM to the steps' processes; the batch step's (srun) are not
    r = finish(proc, timeout=30)
    assert r.returncode == 0 and not slurm.grace_expired()  # saved and done within GraceTime
    assert slurm.rank_signals() == ["SIGTERM", "SIGTERM"] and slurm.saved()
    assert slurm.signals() == []  # srun got nothing: its SIGTERM would have killed the ranks
    assert slurm.requeues() == []  # SLURM requeues a job preempted within its GraceTime itself


def test_srun_turns_its_sigterm_into_sigkill_of_the_ranks(slurm):
    # What a SIGTERM to srun does (the batch step's processes: scancel --full): no rank saves.
    proc = _stand_in(slurm, save_s=5.0, kill_wait=10)
    slurm.scancel("--full", "--signal=TERM")
    r = finish(proc, timeout=30)
    assert slurm.signals() == ["SIGTERM"] and "srun: forcing job termination" in r.stderr
    assert not slurm.saved()  # the ranks' own SIGTERM came too, but SIGKILL cut their 5 s save
    assert r.returncode == 128 + signal.SIGKILL  # srun: 128 + the signal that ended a task


# A real run under the fake SLURM: scripts/train.py on the demo config, one node, one rank.
DEMO = "configs/demo/baseline.yaml"
# enough that a stop signal lands mid-run on an idle machine too (10 tiny steps can end first)
STEPS = 40
REAL = [f"train.max_steps={STEPS}", "run.save_interval=100", "run.ephemeral_save_interval=null"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _losses(folder):
    return {
        step: m["train/CE loss"] for step, m in read_metrics(folder).items() if "train/CE loss" in m
    }


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, demo_corpus):
    """The reference: the same run, in one process, never stopped."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    train(load_and_resolve(REPO / DEMO, tiny_overrides(folder, *REAL)))
    assert sorted(_losses(folder)) == list(range(1, STEPS + 1))
    return folder


def _slurm_run(tmp_path, interrupt):
    """scripts/launch_slurm.sbatch running scripts/train.py; ``interrupt(slurm)`` once the run has
    begun."""
    slurm, folder = fake_slurm(tmp_path / "slurm"), tmp_path / "run"
    log = folder / "train.log"
    proc = slurm.start(
        DEMO,
        *tiny_overrides(folder, *REAL),
        nodes=1,
        gpus="1",
        run=True,
        kill_wait=5,
        FAKE_RDZV_PORT=str(_free_port()),
    )
    _wait(
        lambda: log.is_file() and "new run in" in log.read_text(),
        proc,
        "the run did not start",
        timeout=300,
    )
    interrupt(slurm)
    r = finish(proc, timeout=300)
    assert "Traceback" not in r.stdout + r.stderr, r.stderr[-3000:]
    return slurm, folder, r


def _saved_at_the_step_reached_and_resumes(folder, uninterrupted):
    reached = max(_losses(folder))
    assert 1 <= reached < STEPS  # stopped early
    assert (
        max(step for step, _ in Checkpointer.find_checkpoints(folder)) == reached
    )  # saved where it stopped
    train(load_and_resolve(REPO / DEMO, tiny_overrides(folder, *REAL)))  # the requeued job
    assert _losses(folder) == _losses(uninterrupted)
    a, b = load_weights(folder / f"step{STEPS}"), load_weights(uninterrupted / f"step{STEPS}")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_time_limit_saves_the_step_reached_then_requeues_and_resumes(tmp_path, uninterrupted):
    slurm, folder, r = _slurm_run(tmp_path, lambda s: s.time_limit_warning())
    assert slurm.signals() == ["SIGUSR1"]
    assert slurm.requeues() == ["requeue", "4242"] and slurm.steps_alive_at_requeue() == [0]
    _saved_at_the_step_reached_and_resumes(folder, uninterrupted)


def test_preemption_saves_within_grace_time_and_resumes(tmp_path, uninterrupted):
    def preempt(slurm):
        slurm.preempt(grace_s=240)
        time.sleep(0.5)
        slurm.scancel("--signal=TERM")  # a second SIGTERM while the ranks stop and save

    slurm, folder, r = _slurm_run(tmp_path, preempt)
    assert (
        r.returncode == 0 and not slurm.grace_expired()
    )  # every torchrun exited 0: srun, then the script
    assert slurm.signals() == [] and slurm.requeues() == []
    _saved_at_the_step_reached_and_resumes(folder, uninterrupted)


def test_signal_lead_covers_a_step_and_a_save(tmp_path):
    spec = load_and_resolve(
        REPO / "configs/8B/hourglass-revised.yaml", [f"run.save_folder={tmp_path}"]
    )
    n = count(spec)
    # A lower bound on one step on 8 RTX 6000 Ada (364.2 TFLOP/s dense bf16) at 40% MFU: 6 FLOPs per
    # non-embedding weight per token; one save: fp32 weights and AdamW's two moments at 97 MiB/s
    # (the write+fsync docs/running.md measured), never the 1 GiB/s once assumed.
    step = (
        6
        * n.non_embedding
        * spec.train.global_batch_size
        * spec.data.sequence_length
        / (8 * 364.2e12 * 0.4)
    )
    save = 12 * n.total / (97 * 2**20)
    lead, how = signal_lead(spec, Layout(world_size=8, local=8, nodes=1))
    assert step + save + 60 <= lead < step + save + 60 + 60 and lead % 30 == 0
    assert lead > 300 and how.startswith(
        f"--signal=B:USR1@{lead}:"
    )  # more than the script's default
    assert "97 MiB/s" in how
    # A run that measured its own last save (SAVE/save_rate.json): its rate, here 1 GiB in 4 s.
    (tmp_path / "save_rate.json").write_text('{"step": 250, "bytes": 1073741824, "seconds": 4.0}')
    measured, how = signal_lead(spec, Layout(world_size=8, local=8, nodes=1))
    save = 12 * n.total / (2**30 / 4)
    assert (
        step + save + 60 <= measured < step + save + 60 + 60
        and "256 MiB/s, measured at step 250" in how
    )


def test_a_run_records_its_save_rate(tmp_path, demo_corpus):
    """Each save leaves its bytes and seconds in the run folder (what the lead above reads)."""
    train(
        load_and_resolve(
            REPO / DEMO, tiny_overrides(tmp_path, "train.max_steps=2", "run.save_interval=1")
        )
    )
    record = json.loads((tmp_path / "save_rate.json").read_text())
    files = sum(
        p.stat().st_size
        for p in (tmp_path / "step2").rglob("*")
        if p.is_file() and p.name != "manifest.json"
    )
    assert record["step"] == 2 and 0 < record["seconds"] < 60
    assert (
        abs(record["bytes"] - files) <= 2**16
    )  # the checkpoint's files (the config and manifest: a few KB, written after)
