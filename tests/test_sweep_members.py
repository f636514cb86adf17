"""A sweep's runs as loaded (no training): one run per run folder and per run name; a config copied
into several ablation folders is one run, listed by each ablation."""

import pytest

from olmo_patches.config import ConfigError
from olmo_patches.launch.sweep import Variants, load_sweep
from olmo_patches.report.tables import ablation_configs

from .conftest import REPO, run_in_process

SHARED = "113M-hourglass-K4-L12-d972-dh485"  # k-sweep, d_h-ratio and width-depth-K4 hold it


def test_a_config_copied_into_several_ablations_is_one_run_in_each(tmp_path):
    members = load_sweep([str(REPO / "configs/113M/ablations")])
    assert len(members) == 46 - 2 - 1  # 46 files; the K4-L12 in 3 folders, the K2-L12 in 2
    (shared,) = [m for m in members if m.name == SHARED]
    configs = [shared.config, *shared.copies]
    assert {p.parent.name for p in configs} == {"k-sweep", "d_h-ratio", "width-depth-K4"}
    # the report's ablation tables (k-sweep, the matched K sweep, is none of them)
    by_kind = ablation_configs(configs)
    assert {k for k, paths in by_kind.items() if len(paths) == 1} == {"d_h_ratio", "width_depth"}
    status = run_in_process("sweep.py", "status", "configs/113M/ablations/", cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    assert status.stdout.count("not started") == 43 and status.stdout.count(SHARED) == 1


def _configs(root, **folders):
    """One tiny config a name: {name: "RUN_NAME FOLDER [key: value]"}."""
    for name, text in folders.items():
        run, folder, *extra = text.split(" ", 2)
        (root / f"{name}.yaml").write_text(
            f"extends: {REPO / 'configs/demo/baseline.yaml'}\n"
            f"run: {{name: {run}, save_folder: {root / folder}}}\n{''.join(extra)}\n"
        )
    return [str(root / f"{name}.yaml") for name in folders]


@pytest.mark.parametrize(
    "folders, seeds, refused",
    [
        ({"a": "r runs/r", "b": "r runs/r train: {lr: 1.0e-3}"}, (0,), "run folder of"),
        ({"a": "r runs/a", "b": "r runs/b"}, (0,), "run.name: r is also the run name of"),
        ({"h": "h runs/h", "h-seed1": "h-seed1 runs/x"}, (0, 1), "run.name: h-seed1 is also"),
    ],
)
def test_two_runs_may_share_neither_folder_nor_name(tmp_path, folders, seeds, refused):
    paths = _configs(tmp_path, **folders)
    with pytest.raises(ConfigError, match=refused) as e:
        load_sweep(paths, [], Variants(seeds=seeds))
    assert all(p in str(e.value) for p in paths) and "\n" not in str(e.value)


def test_a_run_folder_of_another_config_is_refused_not_taken_for_done(tmp_path):
    """A folder whose recorded config is another config's (a key changed since it saved a
    checkpoint): load_sweep refuses it in one line naming the key, as train.py would, before a
    launch would skip it as done or a report pool it; its newest record (config.N.yaml, a change
    made on purpose) is the one compared. The records are as training writes them."""
    from olmo_patches.config import load_spec, spec_to_yaml

    (path,) = _configs(tmp_path, g="g runs/g")
    (tmp_path / "runs/g").mkdir(parents=True)
    (tmp_path / "runs/g/config.yaml").write_text(spec_to_yaml(load_spec(path)))
    assert [m.name for m in load_sweep([path])] == ["g"]  # the same config: its run
    # no checkpoint yet: train.py would replace the record, and the sweep takes it
    assert [m.name for m in load_sweep([path], ["model.d_model=64"])] == ["g"]
    (tmp_path / "runs/g/step10").mkdir()
    (tmp_path / "runs/g/step10/.metadata").touch()  # OLMo-core: a complete checkpoint
    with pytest.raises(ConfigError, match="runs/g holds a run with another config") as e:
        load_sweep([path], ["model.d_model=64"])
    assert "model.d_model: 128 -> 64" in str(e.value) and "\n" not in str(e.value)
    # a change made on purpose (--resume-from) is recorded beside it, and a rerun compares with it
    (tmp_path / "runs/g/config.1.yaml").write_text(spec_to_yaml(load_spec(path, ["train.lr=1e-3"])))
    assert [m.name for m in load_sweep([path], ["train.lr=1e-3"])] == ["g"]


def test_a_run_folder_locked_by_a_live_process_is_running(tmp_path):
    """A run started by hand (train.py holds SAVE/.lock) is "running" to the sweep, which would
    not start it a second time; once its process is gone, it is not."""
    import json
    import os
    import socket

    from olmo_patches.launch.sweep import SlurmInfo, run_status

    (path,) = _configs(tmp_path, g="g runs/g")
    (m,) = load_sweep([path])
    m.folder.mkdir(parents=True)
    lock = {"host": socket.gethostname(), "pid": os.getppid(), "slurm_job": None, "since": "now"}
    (m.folder / ".lock").write_text(json.dumps(lock))  # this test's parent: alive
    assert run_status(m, SlurmInfo({}, {})).state == "running"
    gone = 2**22 + 1  # above Linux's largest pid_max: no process has it
    (m.folder / ".lock").write_text(json.dumps({**lock, "pid": gone}))
    assert run_status(m, SlurmInfo({}, {})).state == "not started"
    # a sweep job's lock, left on a node SLURM killed, is no sign of life: the job's state is
    from olmo_patches.launch.sweep import CLAIM

    (m.folder / CLAIM).write_text(json.dumps({"slurm_job": "123", "since": 0}))
    (m.folder / ".lock").write_text(json.dumps({**lock, "host": "gpu07", "slurm_job": "123"}))
    status = run_status(m, SlurmInfo({}, {"123": "OUT_OF_MEMORY"}), tmp_path)
    assert (status.state, status.error.split(":")[0]) == ("failed", "SLURM OUT_OF_MEMORY")


def test_a_failed_attempt_is_named_by_its_own_lines(tmp_path):
    """sweep.log holds every attempt: a run killed without a word (rc -9) is named by the last line
    it wrote, not by the error of an attempt before it."""
    from olmo_patches.launch.sweep import last_error_line

    log = tmp_path / "sweep.log"
    log.write_text("Traceback (most recent call last):\nRuntimeError: out of memory\n")
    start = log.stat().st_size
    with log.open("a") as f:
        f.write("step 40/100 loss 3.2\n")
    assert last_error_line(log) == "RuntimeError: out of memory"
    assert last_error_line(log, start) == "step 40/100 loss 3.2"
