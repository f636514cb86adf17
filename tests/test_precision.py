"""bf16 and compile on CPU as on the cluster, through OLMo-core's Trainer, for the project's
blocks (OLMo-core's own SwiGLU block is OLMo-core's to test).

bf16: one process trains under bf16 autocast (its Linear layers return bf16), with losses that
differ from fp32 by less than 2%; the hourglass's checkpoints hold fp32 weights and resume
bit-exactly. compile: OLMo-core's per-block compile runs on CPU (no "Skipping model compilation"),
with eager's losses within 1e-4, through dynamo, AOT autograd and, for the hourglass, inductor's
decompositions and min-cut partitioner (``aot_eager_decomp_partition``: what OLMo-core's budget
activation checkpointing, which needs compile, acts on), without inductor's C++ builds (minutes of
CPU; inductor's kernels run in tests/test_hourglass.py, and each kind's blocks trace without a
graph break in tests/test_performance.py); the MoE's global-batch routing pass included. Two gloo
ranks under FSDP2's bf16 policy: tests/test_training.py.
"""

import logging
from dataclasses import dataclass, field

import pytest
import torch
from olmo_core.train.callbacks import Callback

from olmo_patches.launch.layout import load_and_resolve
from olmo_patches.train import train
from olmo_patches.launch.run_folder import read_metrics

from .conftest import REPO, Records, load_weights, tiny_overrides

# end to end: runs trained, processes or ranks started (make test-fast leaves them out)
pytestmark = pytest.mark.slow

BASELINE = REPO / "configs" / "demo" / "baseline.yaml"
VARIABLE_WIDTH = [
    "model.block=variable_width",
    "model.widths.schedule=list",
    "model.widths.values=[48,48]",
]
BLOCKS = {
    "hourglass": ["model.block=hourglass", "model.K=2", "model.d_h=16"],
    "variable_width": VARIABLE_WIDTH,
    "moe": [
        *VARIABLE_WIDTH,
        "model.moe.num_experts=4",
        "model.moe.top_k=2",
        "model.moe.expert_hidden=16",
    ],
}
RUN = ["train.max_steps=3", "run.save_interval=2", "run.ephemeral_save_interval=null"]
BF16_TOLERANCE = 0.02  # relative
COMPILE_TOLERANCE = 1e-4  # absolute
# The compiled runs, each with the backend it compiles with: the hourglass's also checkpoints in
# OLMo-core's budget mode, which needs compile (its train module refuses budget without
# compile_model): the min-cut recomputes, the losses stay eager's.
COMPILED = {
    "hourglass": ("aot_eager_decomp_partition", ["train.activation_checkpointing=budget:0.5"]),
    "moe": ("aot_eager", []),
}
RESUMED = ("hourglass",)  # bf16 resumed from its step 2


@dataclass
class Probe(Callback):
    """Inside the Trainer: the dtypes the model's Linear layers return (eager runs only: a hook's
    side effect has no place in a compiled graph), and whether every block was compiled."""

    hook_dtypes: bool = True
    linear_out: set = field(default_factory=set)
    compiled: bool = False

    def pre_train(self):
        model = self.trainer.train_module.model
        self.compiled = all(
            getattr(b, "_compiled_call_impl", None) is not None for b in model.blocks.values()
        )
        if self.hook_dtypes:
            for m in model.modules():
                if isinstance(m, torch.nn.Linear):
                    m.register_forward_hook(lambda mod, args, out: self.linear_out.add(out.dtype))


def _train(
    folder, block, *extra, resume_from=None, hook_dtypes=True
) -> tuple[dict, Probe, list[str]]:
    """(CE loss per step, the probe, OLMo-core's log lines) of one run; no in-loop evaluation (under
    compile it would compile every block again, for no_grad)."""
    probe, records = Probe(hook_dtypes=hook_dtypes), Records()
    olmo_core_log = logging.getLogger("olmo_core")
    olmo_core_log.addHandler(records)
    try:
        train(
            load_and_resolve(BASELINE, tiny_overrides(folder, *RUN, *BLOCKS[block], *extra)),
            resume_from=resume_from,
            callbacks={"probe": probe, "lm_evaluator": Callback()},
        )
    finally:
        olmo_core_log.removeHandler(records)
    losses = {
        s: m["train/CE loss"] for s, m in read_metrics(folder).items() if "train/CE loss" in m
    }
    return losses, probe, records.messages


@pytest.fixture(scope="module", params=list(BLOCKS))
def runs(request, tmp_path_factory, demo_corpus):
    """Per block type: fp32 and bf16; for RESUMED, bf16 resumed from the bf16 run's step 2; for
    COMPILED, fp32 compiled (in fp32 inductor's fusions leave eager's losses within about 1e-6; in
    bf16, where a fused kernel skips eager's roundings to bf16 between ops, within 7.1e-5 here: too
    near the tolerance for a test)."""
    block, root = request.param, tmp_path_factory.mktemp(request.param)
    out = {"block": block, "root": root}
    out["fp32"] = _train(root / "fp32", block, "train.precision=fp32")
    out["bf16"] = _train(root / "bf16", block, "train.precision=bf16")
    if block in RESUMED:
        out["resumed"] = _train(
            root / "resumed",
            block,
            "train.precision=bf16",
            resume_from=str(root / "bf16" / "step2"),
        )
    if block in COMPILED:
        backend, extra = COMPILED[block]
        compile_ = torch.nn.Module.compile
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(
                torch.nn.Module, "compile", lambda self, **kw: compile_(self, backend=backend, **kw)
            )
            out["compiled"] = _train(
                root / "compiled",
                block,
                "train.precision=fp32",
                "train.compile=true",
                *extra,
                hook_dtypes=False,
            )
    return out


def test_bf16_computes_in_bf16_within_2_percent_of_fp32(runs):
    (fp32, p32, _), (bf16, p16, _) = runs["fp32"], runs["bf16"]
    assert p32.linear_out == {torch.float32} and p16.linear_out == {torch.bfloat16}, runs["block"]
    assert sorted(fp32) == sorted(bf16) == [1, 2, 3]
    assert fp32 != bf16  # bf16 really ran
    for step in fp32:
        assert bf16[step] == pytest.approx(fp32[step], rel=BF16_TOLERANCE), step


@pytest.mark.parametrize("runs", RESUMED, indirect=True)
def test_bf16_checkpoints_hold_fp32_weights_and_resume_exactly(runs):
    root = runs["root"]
    straight, resumed = (
        load_weights(root / "bf16" / "step3"),
        load_weights(root / "resumed" / "step3"),
    )
    assert straight.keys() == resumed.keys()
    assert {w.dtype for w in straight.values()} == {torch.float32}
    for key in straight:
        assert torch.equal(straight[key], resumed[key]), key
    assert runs["resumed"][0][3] == runs["bf16"][0][3]  # the resumed run trains step 3 only


@pytest.mark.parametrize("runs", list(COMPILED), indirect=True)
def test_compile_runs_on_cpu_with_eager_losses(runs):
    (eager, _, _), (compiled, probe, log) = runs["fp32"], runs["compiled"]
    assert probe.compiled, runs["block"]
    assert not any("Skipping model compilation" in line for line in log)
    if COMPILED[runs["block"]][1]:
        assert "Applied 'budget' activation checkpointing to the model" in log
    # OLMo-core set the partitioner's budget for the process; the run put back torch's default
    assert torch._functorch.config.activation_memory_budget == 1.0
    assert sorted(compiled) == [1, 2, 3]
    for step in eager:
        assert compiled[step] == pytest.approx(eager[step], abs=COMPILE_TOLERANCE), step


@pytest.mark.parametrize(
    "overrides, world_size, want",
    [
        (
            ["train.precision=bf16"],
            1,
            {
                "precision": "bf16 compute (torch.autocast), no gradient reduction",
                "compile": "off (eager)",
            },
        ),
        (
            ["train.precision=fp32", "train.compile=true"],
            1,
            {"precision": "fp32 compute", "compile": "torch.compile per block (inductor)"},
        ),
        (
            ["train.precision=bf16", "train.data_parallel=fsdp", "train.compile=true"],
            2,
            {
                "precision": "bf16 compute (FSDP mixed precision), fp32 gradient reduction",
                "compile": "inductor), before FSDP",
            },
        ),
        (
            ["train.precision=bf16", "train.data_parallel=ddp"],
            2,
            {"precision": "bf16 compute (torch.autocast), fp32 gradient reduction"},
        ),
        (["train.hardware=h100"], 1, {"ignored": "train.hardware=h100 (train.device=cpu"}),
    ],
)
def test_dry_run_says_what_the_cpu_run_does(tmp_path, overrides, world_size, want):
    """The dry run's rows for this CPU: the dtypes and compile the runs above measured (bf16 Linear
    outputs under autocast, compiled blocks), where it used to print train.compile=true for an eager
    run."""
    from olmo_patches.launch.layout import Layout
    from olmo_patches.report.plan import device_rows

    spec = load_and_resolve(
        BASELINE, tiny_overrides(tmp_path, "train.device=cpu", *overrides), Layout.plan(world_size)
    )
    rows = {label.split(" (")[0]: value for label, value in device_rows(spec, world_size)}
    assert rows["attention backend"].startswith("torch")
    for key, text in want.items():
        assert text in rows[key], (key, rows[key])
