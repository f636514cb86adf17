"""Compile per block as the trainer does (OLMo-core's apply_compile: inductor; in a rehearsal
aot_eager stands in, inductor's C++ build taking minutes on a CPU) for the three block families,
against eager: logits, gradients, the loss after 3 AdamW steps; the graphs dynamo compiled and its
graph breaks over the first two steps (a block compiles twice: its RoPE cache is empty on the first
call; a variable-width model once more per width), and the graphs compiled in the 3 training steps
after them (steady state: judged 0; a graph compiled there is a guard failing step after step, and
past dynamo's recompile limit a block runs eager). And what compile changes in memory: the trainer
section's shapes run eager, their peaks against the memory model's eager estimate (the trainer
section judges the compiled ones)."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

from ._common import BF16_TOL, BLOCK_TYPES, build, compare, forward_backward, small_spec, token_ids
from .test_trainer import SCALES, eager_peaks

pytestmark = pytest.mark.gpu
FAMILIES = ("baseline pre", "hourglass pre", "variable width learned")


def _compile(model: torch.nn.Module, device: torch.device) -> None:
    if device.type == "cuda":
        model.apply_compile()  # type: ignore[operator]
        return
    for block in model.blocks.values():  # type: ignore[union-attr]
        block.compile(backend="aot_eager", fullgraph=False)
    model.lm_head.compile(backend="aot_eager", fullgraph=False)  # type: ignore[union-attr]


def _graphs() -> tuple[int, int]:
    return int(counters["stats"]["unique_graphs"]), sum(counters["graph_break"].values())


def _train(model, ids, steps: int, bf16: bool) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        forward_backward(model, ids, bf16)
        opt.step()


def _loss(model, ids, bf16: bool) -> float:
    with torch.no_grad(), torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = model(ids[:, :-1])
    return float(F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten()))


@pytest.mark.parametrize("block", FAMILIES)
def test_compiled_block_against_eager(block, env, rows):
    bf16 = env.cuda
    spec = small_spec(BLOCK_TYPES[block], env.device)
    eager = build(spec, env.device)
    compiled = copy.deepcopy(eager)
    torch._dynamo.reset()
    counters.clear()
    _compile(compiled, env.device)
    ids = token_ids(spec, env.device, 64 if env.rehearse else 1024, seed=3)
    backend = "inductor" if env.cuda else "aot_eager (CPU stand-in for inductor)"
    compare(
        rows,
        f"{block}: compiled vs eager",
        forward_backward(compiled, ids, bf16),
        forward_backward(eager, ids, bf16),
        backend,
    )
    forward_backward(compiled, ids, bf16)  # the second call: every block's RoPE cache is filled now
    graphs, breaks = _graphs()
    rows.judge(
        f"{block}: graph breaks (first 2 steps)",
        str(breaks),
        breaks == 0,
        "0",
        f"{graphs} graphs compiled",
    )
    _train(compiled, ids, 3, bf16)
    recompiled = _graphs()[0] - graphs
    rows.judge(
        f"{block}: graphs compiled in 3 more training steps",
        str(recompiled),
        recompiled == 0,
        "0 (steady state)",
    )
    _train(eager, ids, 3, bf16)
    loss, ref_loss = _loss(compiled, ids, bf16), _loss(eager, ids, bf16)
    err = abs(loss - ref_loss) / ref_loss
    rows.judge(
        f"{block}: loss after 3 AdamW steps, compiled vs eager",
        f"{err:.2e}",
        err <= BF16_TOL,
        f"<= {BF16_TOL:.2e}",
        f"{loss:.4f} vs {ref_loss:.4f}",
    )
    rows.check()


@pytest.mark.parametrize("scale", SCALES)
def test_eager_peaks_against_the_estimate(scale, env, rows):
    eager_peaks(env, rows, scale)
    rows.check()
