"""A finished run re-run (in process and from the command line) is a no-op that exits 0, and
--resume-from works from the command line. Compared with an uninterrupted in-process run."""

import pytest
import torch

from olmo_patches.launch.layout import load_and_resolve
from olmo_patches.train import train
from olmo_patches.launch.run_folder import METRICS_FILE, read_metrics

from .conftest import REPO, load_weights, run_in_process, run_script, tiny_overrides

# end to end: runs trained, processes or ranks started (make test-fast leaves them out)
pytestmark = pytest.mark.slow

BASELINE = REPO / "configs" / "demo" / "baseline.yaml"
RUN = ["train.max_steps=4", "run.save_interval=2", "run.ephemeral_save_interval=null"]


def _snapshot(folder):
    """Every file of a run folder, with its bytes' size and mtime, but train.log (each start appends
    its log there) and the lock's empty guard file (each start locks it): checkpoints, metrics, the
    recorded config.yaml (written once)."""
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name not in ("train.log", ".lock.guard")
    }


def _losses(folder):
    return {
        step: m["train/CE loss"] for step, m in read_metrics(folder).items() if "train/CE loss" in m
    }


@pytest.fixture(scope="module")
def finished(tmp_path_factory, demo_corpus):
    folder = tmp_path_factory.mktemp("finished")
    train(load_and_resolve(BASELINE, tiny_overrides(folder, *RUN)))
    assert sorted(_losses(folder)) == [1, 2, 3, 4] and (folder / "step4").is_dir()
    return folder


def test_rerunning_a_finished_run_is_a_noop(finished):
    before, metrics = _snapshot(finished), (finished / METRICS_FILE).read_text()
    train(
        load_and_resolve(BASELINE, tiny_overrides(finished, *RUN))
    )  # in process: no FileExistsError saving step4 again
    assert _snapshot(finished) == before
    r = run_script("train.py", str(BASELINE), *tiny_overrides(finished, *RUN))
    assert r.returncode == 0, r.stderr[-3000:]
    assert _snapshot(finished) == before and (finished / METRICS_FILE).read_text() == metrics


def test_rerunning_a_run_stopped_at_a_saved_step_saves_nothing(tmp_path, demo_corpus):
    """A run resumed at the step it stops at (run.stop_at_step) does not save that step again:
    ResumeCheckpointerCallback knows the step it loaded (OLMo-core's would raise
    FileExistsError)."""
    overrides = tiny_overrides(tmp_path, *RUN, "run.stop_at_step=2")
    train(load_and_resolve(BASELINE, overrides))
    assert (tmp_path / "step2").is_dir() and not (tmp_path / "step4").exists()
    before = _snapshot(tmp_path / "step2")
    train(load_and_resolve(BASELINE, overrides))
    assert _snapshot(tmp_path / "step2") == before and sorted(_losses(tmp_path)) == [1, 2]


def test_resume_from_on_the_command_line(tmp_path, finished):
    r = run_in_process(
        "train.py",
        str(BASELINE),
        *tiny_overrides(tmp_path, *RUN),
        "--resume-from",
        str(finished / "step2"),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert _losses(tmp_path) == {step: loss for step, loss in _losses(finished).items() if step > 2}
    a, b = load_weights(finished / "step4"), load_weights(tmp_path / "step4")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
