"""The hourglass's stacked weights under FSDP2 at shapes no rank count divides: the demo hourglass
with d_h = 63 over 2 gloo ranks trains as one process does, and a checkpoint whose stacked weights
are (K, out, in) tensors (the earlier layout) resumes, in one process bit for bit and over 2 FSDP
ranks within 1e-5 of the run it was cut from; so does one of a tiny MoE whose hourglass experts'
weights are (K, E d_h, d_model) tensors (their earlier layout; global-batch load balancing)."""

import re
import shutil

import pytest
import torch

from olmo_patches.launch.layout import load_and_resolve
from olmo_patches.train import train
from olmo_patches.launch.run_folder import read_metrics

from .conftest import REPO, TINY, train_each
from .test_hourglass_moe import HOURGLASS_EXPERTS

HOURGLASS = REPO / "configs" / "demo" / "hourglass.yaml"
VARIABLE = REPO / "configs" / "demo" / "variable-width.yaml"
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


def _to_earlier_layout(step_dir, pattern=r"feed_forward\.w[123]\.weight", k=K):
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
                d[key] = v.reshape(k, v.shape[0] // k, v.shape[1]).clone()
                folded.append(f"{prefix}{key}")

    walk(state, "")
    shutil.rmtree(path)
    dcp.save(state, storage_writer=dcp.FileSystemWriter(path), no_dist=True)
    write_manifest(
        step_dir
    )  # as the version that wrote that layout recorded it: the resume verifies it
    return folded


def _moe(folder, *extra):
    """A tiny variable-width MoE of hourglass experts (4 experts, K=2, d_h=16), the demo's data."""
    run = ["run.save_interval=2", "run.ephemeral_save_interval=null", "train.max_steps=4"]
    return [
        *TINY,
        *HOURGLASS_EXPERTS,
        *run,
        f"run.save_folder={folder}",
        f"data.work_dir={folder.parent / 'cache'}",
        *extra,
    ]


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
    shutil.copytree(root / "cut", root / "cut-2")
    train(
        load_and_resolve(HOURGLASS, _overrides(root / "cut", "train.max_steps=4"))
    )  # resumes step2, one process
    # The hourglass-expert MoE: straight, cut at step 2 and folded to (K, E d_h, d_model), resumed.
    train(load_and_resolve(VARIABLE, _moe(root / "moe-one")))
    train(load_and_resolve(VARIABLE, _moe(root / "moe-cut", "run.stop_at_step=2")))
    moe_folded = _to_earlier_layout(
        root / "moe-cut" / "step2", r"feed_forward_moe\.experts\.mlp\.w[123](\.|$)", 2
    )
    shutil.copytree(root / "moe-cut", root / "moe-cut-2")
    train(load_and_resolve(VARIABLE, _moe(root / "moe-cut")))
    r = train_each(
        [
            [
                str(HOURGLASS),
                *_overrides(root / "fsdp", "train.max_steps=4", "train.data_parallel=fsdp"),
            ],
            [
                str(HOURGLASS),
                *_overrides(root / "cut-2", "train.max_steps=4", "train.data_parallel=fsdp"),
            ],
            [str(VARIABLE), *_moe(root / "moe-cut-2", "train.data_parallel=fsdp")],
        ]
    )
    return root, folded, moe_folded, r


def test_an_odd_bottleneck_trains_over_two_fsdp_ranks_as_one_process(runs):
    """d_h = 63: no dimension of the (K, 63, 128) stack divides by 2; the (K 63, 128) matrix's rows
    are padded by FSDP2 as any matrix's are, and the run trains as one process does."""
    root, _, _, r = runs
    assert r.returncode == 0, r.stderr[-3000:]
    one, two = _losses(root / "one"), _losses(root / "fsdp")
    assert sorted(one) == sorted(two) == [1, 2, 3, 4]
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=1e-5), step


def test_a_checkpoint_of_the_earlier_layout_resumes(runs):
    root, folded, _, r = runs
    assert len(folded) == 2 * 3 * 3, (
        folded
    )  # 2 layers x (w1, w3, w2) x (weight, exp_avg, exp_avg_sq)
    one = _losses(root / "one")
    assert (
        not (root / "cut" / "rejected").exists() and not (root / "cut-2" / "rejected").exists()
    )  # step2 resumed
    assert _losses(root / "cut") == one  # one process: bit for bit
    assert r.returncode == 0, r.stderr[-3000:]
    two = _losses(root / "cut-2")
    assert sorted(two) == [1, 2, 3, 4]
    for step in (3, 4):  # resumed over 2 FSDP ranks
        assert two[step] == pytest.approx(one[step], rel=1e-5), step


def test_a_checkpoint_of_the_earlier_expert_layout_resumes_at_another_world_size(runs):
    """Hourglass experts saved as (K, E d_h, d_model) tensors resume into (K E d_h, d_model)
    matrices: in one process bit for bit, over 2 FSDP ranks within the dense configs' 1e-5
    (global-batch balance)."""
    root, _, folded, r = runs
    assert len(folded) == 2 * 3 * 3, (
        folded
    )  # 2 layers x (w1, w2, w3) x (weight, exp_avg, exp_avg_sq)
    one = _losses(root / "moe-one")
    assert (
        not (root / "moe-cut" / "rejected").exists()
        and not (root / "moe-cut-2" / "rejected").exists()
    )
    assert _losses(root / "moe-cut") == one
    assert r.returncode == 0, r.stderr[-3000:]
    two = _losses(root / "moe-cut-2")
    assert sorted(two) == [1, 2, 3, 4]
    for step in (3, 4):
        assert two[step] == pytest.approx(one[step], rel=1e-5), step
