"""Sweeps: a local sweep of two tiny configs (stopped, resumed, relaunched, reported), claims, and
the SLURM path against fake sbatch/squeue/sacct/srun written here."""

import json
import math
import os
import shlex
import socket
import sys

import pytest

from olmo_patches.launch.sweep import (
    SlurmInfo,
    launch_local,
    launch_slurm,
    load_sweep,
    sweep_status,
    take_claim,
)
from olmo_patches.report.sweep import report

from .conftest import REPO, TINY, run, run_in_process, run_script, start

# end to end: runs trained, processes or ranks started (make test-fast leaves them out)
pytestmark = pytest.mark.slow

NAMES = ("tiny-sweep-a", "tiny-sweep-b")


def _write_configs(root):
    """Two tiny configs (a baseline and an hourglass), each with its own run folder."""
    cfg = root / "configs"
    cfg.mkdir()
    blocks = {
        "tiny-sweep-a": "model: {block: baseline}",
        "tiny-sweep-b": "model: {block: hourglass, K: 2, d_h: 16}",
    }
    for name, model in blocks.items():
        (cfg / f"{name}.yaml").write_text(
            f"extends: {REPO / 'configs/demo/baseline.yaml'}\n{model}\n"
            f"run: {{name: {name}, save_folder: {root / 'runs' / name}}}\ntrain: {{max_steps: 4}}\n"
        )
    return cfg


def _sets(root):
    tiny = [o for o in TINY if not o.startswith("eval.interval")] + [
        "eval.interval=2",
        f"data.work_dir={root / 'cache'}",
    ]
    return ["--set", *tiny]  # several key=value pairs after one --set


def _steps(folder):
    """{step: number of metrics records} of train loss, read from metrics.jsonl."""
    counts = {}
    for line in (folder / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "train/CE loss" in rec:
            counts[rec["step"]] = counts.get(rec["step"], 0) + 1
    return counts


def _complete(folder, step):
    return (folder / f"step{step}" / ".metadata.json").exists()


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory, demo_corpus):
    """The sweep launched three times: stopped at step 2, resumed to the end, relaunched."""
    root = tmp_path_factory.mktemp("sweep")
    cfg, sets = _write_configs(root), _sets(root)
    first = run_in_process(
        "sweep.py", "launch", "--local", str(cfg), *sets, "--set", "run.stop_at_step=2"
    )  # its runs: processes
    after_first = {n: sorted(p.name for p in (root / "runs" / n).glob("step*")) for n in NAMES}
    second = run_script("sweep.py", "launch", "--local", str(cfg / "*.yaml"), *sets, timeout=900)
    logs = {n: (root / "runs" / n / "sweep.log").read_text() for n in NAMES}
    said = []  # the relaunch in-process: it only checks, nothing trains
    failed = launch_local(load_sweep([str(cfg)], sets[1:]), sets[1:], say=said.append)
    return dict(
        root=root,
        cfg=cfg,
        sets=sets,
        first=first,
        after_first=after_first,
        second=second,
        logs=logs,
        third=(failed, said),
    )


def test_local_sweep_stops_resumes_and_is_idempotent(local_sweep):
    root, first, second, third = (
        local_sweep["root"],
        local_sweep["first"],
        local_sweep["second"],
        local_sweep["third"],
    )
    assert first.returncode == 0, first.stderr[-3000:]
    for name in NAMES:
        # Stopped at step 2 with a complete checkpoint, not at the end.
        assert local_sweep["after_first"][name] == ["step0", "step2"]
    assert second.returncode == 0, second.stderr[-3000:]
    for name in NAMES:
        folder = root / "runs" / name
        assert f"{name}: resuming from step 2" in second.stdout
        # each run's progress on the terminal, as in its log
        assert any(
            line.startswith(f"{name} | ") and "step 4/4 | loss" in line
            for line in second.stdout.splitlines()
        )
        # OLMo-core loaded the stopped run's checkpoint, and steps 1-2 were not trained again.
        assert (
            f"Loading checkpoint from '{folder / 'step2'}'" in (folder / "train.log").read_text()
        )  # OLMo-core's log
        assert _complete(folder, 4)
        assert _steps(folder) == {1: 1, 2: 1, 3: 1, 4: 1}
    # Relaunch: nothing trains again, no run's log grows.
    assert third == (0, [f"{name}: done, skipped" for name in NAMES])
    assert {n: (root / "runs" / n / "sweep.log").read_text() for n in NAMES} == local_sweep["logs"]


def test_status_and_report_have_both_runs(local_sweep, tmp_path):
    root, cfg, sets = local_sweep["root"], local_sweep["cfg"], local_sweep["sets"]
    overrides = sets[1:]
    members = load_sweep([str(cfg)], overrides)
    assert [m.name for m in members] == list(NAMES)
    out = tmp_path / "report"
    report(members, out, figures=True)
    md = (out / "sweep.md").read_text()
    for name in NAMES:
        metrics = [
            json.loads(line)
            for line in (root / "runs" / name / "metrics.jsonl").read_text().splitlines()
        ]
        last_val = [m["eval/lm/val/CE loss"] for m in metrics if "eval/lm/val/CE loss" in m][-1]
        row = next(line for line in md.splitlines() if f"| {name} |" in line)
        # state, steps of total, tokens (4 steps x 4 sequences x 32 tokens), exp(last validation
        # loss)
        assert f"| done | 4/4 | 512 | {math.exp(last_val):.2f} |" in row
    assert "tiny-sweep-b" in (out / "hourglass_runs.md").read_text()
    assert (out / "loss_curves.png").stat().st_size > 1000
    status = run_in_process("sweep.py", "status", str(cfg), *sets)
    assert status.returncode == 0, status.stderr[-3000:]
    assert status.stdout.count("done") == 2 and "4/4" in status.stdout


def test_failed_run_shows_its_last_error_line(tmp_path):
    cfg = _write_configs(tmp_path)
    bad = tmp_path / "runs" / "tiny-sweep-a"
    bad.mkdir(parents=True)
    (bad / "sweep.log").write_text(
        "Traceback (most recent call last):\n  File x\nRuntimeError: out of memory\n"
        "[rank0] exiting\n"
    )
    (bad / "sweep-last.json").write_text(
        json.dumps({"exit": 1, "error": "RuntimeError: out of memory"})
    )
    states = {s.member.name: (s.state, s.error) for s in sweep_status(load_sweep([str(cfg)]))}
    assert states == {
        "tiny-sweep-a": ("failed", "RuntimeError: out of memory"),
        "tiny-sweep-b": ("not started", ""),
    }


def test_a_live_claim_is_never_taken_twice(tmp_path):
    cfg = _write_configs(tmp_path)
    folder = tmp_path / "runs" / "tiny-sweep-a"
    folder.mkdir(parents=True)
    holder = start([sys.executable, "-c", "import time; time.sleep(60)"], capture=False)
    try:
        (folder / "sweep-claim.json").write_text(
            json.dumps({"host": socket.gethostname(), "pid": holder.pid})
        )
        assert not take_claim(folder, SlurmInfo({}, {}))
        assert sweep_status(load_sweep([str(cfg)]))[0].state == "running"
    finally:
        holder.kill()
        holder.wait()
    # The holder is gone: its claim is stale, and this process takes it.
    assert take_claim(folder, SlurmInfo({}, {}))
    assert json.loads((folder / "sweep-claim.json").read_text())["pid"] == os.getpid()


def _race(args):
    """One of several forked launches: wait for the others, then try to claim."""
    folder, barrier = args
    barrier.wait()
    return take_claim(folder, SlurmInfo({}, {}))


def test_racing_launches_take_a_claim_once(tmp_path):
    """Four processes claim one run at the same instant: exactly one gets it (filelock's guard), and
    the record names that process."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Manager().Barrier(4)
    with ctx.Pool(4) as pool:
        taken = pool.map(_race, [(tmp_path, barrier)] * 4)
    assert sorted(taken) == [False, False, False, True]
    assert json.loads((tmp_path / "sweep-claim.json").read_text())["host"] == socket.gethostname()


def test_a_requeued_jobs_lock_is_taken_over_another_jobs_refused(tmp_path, monkeypatch):
    """A run folder's .lock left by this SLURM job on another node (a requeue) is taken over; one
    held by another job on another node is not (its pid cannot be checked from here)."""
    from olmo_patches.launch.run_folder import Lock, RunFolderError

    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    (tmp_path / ".lock").write_text(
        json.dumps({"host": "node-elsewhere", "pid": 1, "slurm_job": "4242", "since": "then"})
    )
    Lock(tmp_path).acquire()
    assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()
    (tmp_path / ".lock").write_text(
        json.dumps({"host": "node-elsewhere", "pid": 1, "slurm_job": "77", "since": "then"})
    )
    with pytest.raises(RunFolderError, match="is in use by pid 1 on node-elsewhere since then"):
        Lock(tmp_path).acquire()


def _fake(bin_dir, name, body):
    path = bin_dir / name
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)


def test_slurm_array_submission_and_status(tmp_path, monkeypatch):
    cfg = _write_configs(tmp_path)
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir(), state.mkdir()
    _fake(bin_dir, "sbatch", f'printf "%s\\n" "$@" > {state}/sbatch.args; echo "4242;cluster"')
    _fake(bin_dir, "squeue", f"cat {state}/squeue 2>/dev/null; true")
    _fake(bin_dir, "sacct", f'echo "$@" > {state}/sacct.args; cat {state}/sacct 2>/dev/null; true')
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    members = load_sweep([str(cfg)], ["train.lr=1e-3"])

    assert (
        launch_slurm(
            members, ["train.lr=1e-3"], nodes=2, gpus_per_node=4, sbatch_args=["--time=1:00:00"]
        )
        == "4242"
    )
    args = (state / "sbatch.args").read_text().splitlines()
    assert args[:6] == [
        "--parsable",
        "--array=0-1",
        "--nodes=2",
        "--gpus-per-node=4",
        "--output=logs/%x-%A_%a.out",
        "--time=1:00:00",
    ]
    assert args[6] == str(REPO / "scripts" / "launch_slurm.sbatch") and args[7] == "--array"
    manifest = [shlex.split(line) for line in open(args[8]).read().splitlines()]
    assert manifest == [[str(m.config), "train.lr=1e-3"] for m in members]

    # Queued: both running; a second launch submits nothing.
    (state / "squeue").write_text("4242_0 RUNNING\n4242_1 PENDING\n999 RUNNING\n")
    assert [(s.state, s.slurm_job) for s in sweep_status(members)] == [
        ("running", "4242_0"),
        ("running", "4242_1"),
    ]
    (state / "sbatch.args").unlink()
    assert launch_slurm(members, ["train.lr=1e-3"], nodes=2, gpus_per_node=4) is None
    assert not (state / "sbatch.args").exists()

    # Ended: element 0 failed (its log's error line), element 1 was cancelled after writing its
    # config.
    (state / "squeue").write_text("")
    (state / "sacct").write_text("4242_0|FAILED\n4242_1|CANCELLED by 1000\n")
    (tmp_path / "logs" / "hourglass-olmo-4242_0.out").write_text(
        "step 1\ntorch.OutOfMemoryError: CUDA out of memory\nsrun: error\n"
    )
    (tmp_path / "runs" / "tiny-sweep-b" / "config.yaml").write_text("run: {name: tiny-sweep-b}\n")
    statuses = sweep_status(members)
    assert [(s.state, s.error) for s in statuses] == [
        ("failed", "SLURM FAILED: torch.OutOfMemoryError: CUDA out of memory"),
        ("stopped", ""),
    ]
    assert "-j 4242" in (state / "sacct.args").read_text()


def test_array_element_runs_its_manifest_line(tmp_path):
    """scripts/launch_slurm.sbatch --array MANIFEST: element i trains line i (fake
    srun/scontrol)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake(bin_dir, "srun", f'printf "%s\\n" "$@" > {tmp_path}/srun.args')
    _fake(bin_dir, "scontrol", "echo node7")
    _fake(
        bin_dir, "python", "exit 0"
    )  # the script's pre-flight dry run (tests/test_launch_slurm.py checks it)
    manifest = tmp_path / "manifest.txt"
    manifest.write_text("configs/a.yaml train.lr=1e-3\nconfigs/b.yaml 'train.lr=2e-3'\n")
    r = run(
        ["bash", REPO / "scripts" / "launch_slurm.sbatch", "--array", manifest],
        timeout=60,
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        SLURM_ARRAY_TASK_ID="1",
        SLURM_JOB_ID="77",
        SLURM_JOB_NUM_NODES="1",
        SLURM_GPUS_PER_NODE="2",
        SLURM_JOB_NODELIST="node7",
        SLURM_SUBMIT_DIR=str(REPO),
    )
    assert r.returncode == 0, r.stderr
    command = " ".join((tmp_path / "srun.args").read_text().split())
    assert "scripts/train.py configs/b.yaml train.lr=2e-3" in command and "a.yaml" not in command
    assert "--rdzv-endpoint=node7:29577" in command  # 29500 + the element's job id, 77


def test_demo_ablations_are_the_papers_two_sweeps():
    """K sweep: d_model, L and d_h fixed, parameters growing with K; width/depth: K=4 at the demo
    baseline's budget (the paper's counting: 16 L d^2 = 16 x 4 x 128^2), d_model/L on both sides of
    the paper's best range 100-250."""
    from olmo_patches.launch.layout import load_and_resolve

    def non_embedding(m):
        return m.n_layers * (4 * m.d_model**2 + 3 * m.K * m.d_model * m.d_h)

    k = sorted(
        (
            load_and_resolve(p).model
            for p in (REPO / "configs/demo/ablations/k-sweep").glob("*.yaml")
        ),
        key=lambda m: m.K,
    )
    assert [m.K for m in k] == [1, 2, 4, 8]
    assert {(m.d_model, m.n_layers, m.d_h) for m in k} == {(128, 4, 64)}
    counts = [non_embedding(m) for m in k]
    assert counts == sorted(set(counts))
    wd = [
        load_and_resolve(p).model
        for p in (REPO / "configs/demo/ablations/width-depth-K4").glob("*.yaml")
    ]
    assert len(wd) >= 5 and all(m.K == 4 and m.block == "hourglass" for m in wd)
    assert all(abs(non_embedding(m) - 16 * 4 * 128**2) <= 1e-3 * 16 * 4 * 128**2 for m in wd)
    ratios = [m.d_model / m.n_layers for m in wd]
    assert min(ratios) < 100 and max(ratios) > 250 and any(100 <= r <= 250 for r in ratios)
