"""The hourglass's stacked weights under FSDP2 at shapes no rank count divides: the demo hourglass
with d_h = 63 over 2 gloo ranks trains as one process does; a checkpoint whose stacked weights are
(K, out, in) tensors (an earlier layout: the same elements in another shape) is refused in one line
that says so, before anything is written."""

import re
import shutil

import pytest
import torch

from olmo_patches.launch.layout import load_and_resolve
from olmo_patches.train import train
from olmo_patches.launch.run_folder import RunFolderError, read_metrics

from .conftest import REPO, TINY, train_each

# end to end: runs trained, processes or ranks started (make test-fast leaves them out)
pytestmark = pytest.mark.slow

HOURGLASS = REPO / "configs" / "demo" / "hourglass.yaml"
K = 8  # the demo hourglass's
DATA = [o for o in TINY if not o.startswith("model.")]
ODD = [
    "model.d_h=63",
    "model.n_layers=2",
    *DATA,
    "run.save_interval=2",
    "run.ephemeral_save_interval=null",
]


def _overrides(folder, *extra):
    return [*ODD, f"run.save_folder={folder}", f"data.work_dir={folder.parent / 'cache'}", *extra]


def _losses(folder):
    return {s: m["train/CE loss"] for s, m in read_metrics(folder).items() if "train/CE loss" in m}


def _to_earlier_layout(step_dir, pattern=r"feed_forward\.w[123]\.weight"):
    """Rewrite a checkpoint's stacked hourglass tensors (weights and AdamW moments) as (K, out, in),
    the earlier layout's shape: every entry read back whole (OLMo-core's reader, DCP's
    load-everything planner) and saved again by torch's distributed checkpoint."""
    import torch.distributed.checkpoint as dcp

    from olmo_patches.train.checkpoints import write_manifest
    from olmo_core.distributed.checkpoint.filesystem import RemoteFileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    path = step_dir / "model_and_optim"
    state: dict = {}
    _load_state_dict(
        state,
        storage_reader=RemoteFileSystemReader(path),
        planner=_EmptyStateDictLoadPlanner(),
        no_dist=True,
    )
    folded = []

    def walk(d, prefix):
        for key, v in d.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{key}.")
            elif (
                isinstance(v, torch.Tensor) and re.search(pattern, f"{prefix}{key}") and v.ndim == 2
            ):
                d[key] = v.reshape(K, v.shape[0] // K, v.shape[1]).clone()
                folded.append(f"{prefix}{key}")

    walk(state, "")
    shutil.rmtree(path)
    dcp.save(state, storage_writer=dcp.FileSystemWriter(path), no_dist=True)
    write_manifest(
        step_dir
    )  # as the version that wrote that layout recorded it: the resume verifies it
    return folded


@pytest.fixture(scope="module")
def runs(tmp_path_factory, demo_corpus):
    root = tmp_path_factory.mktemp("odd")
    train(
        load_and_resolve(HOURGLASS, _overrides(root / "one", "train.max_steps=4"))
    )  # the reference, straight
    train(
        load_and_resolve(
            HOURGLASS, _overrides(root / "cut", "train.max_steps=4", "run.stop_at_step=2")
        )
    )
    folded = _to_earlier_layout(root / "cut" / "step2")
    fsdp = _overrides(root / "fsdp", "train.max_steps=4", "train.data_parallel=fsdp")
    return root, folded, train_each([[str(HOURGLASS), *fsdp]])


def test_an_odd_bottleneck_trains_over_two_fsdp_ranks_as_one_process(runs):
    """d_h = 63: no dimension of the (K, 63, 128) stack divides by 2; the (K 63, 128) matrix's rows
    are padded by FSDP2 as any matrix's are, and the run trains as one process does."""
    root, _, r = runs
    assert r.returncode == 0, r.stderr[-3000:]
    one, two = _losses(root / "one"), _losses(root / "fsdp")
    assert sorted(one) == sorted(two) == [1, 2, 3, 4]
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=1e-5), step


def test_a_checkpoint_of_an_earlier_layout_is_refused_in_one_line(runs):
    root, folded, _ = runs
    assert len(folded) == 2 * 3 * 3, (
        folded
    )  # 2 layers x (w1, w3, w2) x (weight, exp_avg, exp_avg_sq)
    with pytest.raises(RunFolderError) as e:
        train(load_and_resolve(HOURGLASS, _overrides(root / "cut", "train.max_steps=4")))
    line = str(e.value)
    assert line.startswith(f"{root / 'cut'}: its newest checkpoint step2: written by ")
    assert line.endswith(
        "first differing weight blocks.0.feed_forward.w1.weight: [8, 63, 128] there, [504, 128] "
        "in this config's model; a checkpoint of an earlier layout (CHANGELOG.md)"
    )
    assert "\n" not in line and sorted(_losses(root / "cut")) == [1, 2]  # nothing written
