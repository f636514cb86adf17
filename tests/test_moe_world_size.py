"""The load-balancing loss at any world size and micro-batch size, on gloo through OLMo-core's train
module: a tiny variable-width MoE (SwiGLU experts, and hourglass experts with K=2) trained on the
same 8 sequences a step at 1, 2 and 4 ranks, each at micro-batches of 1 and 2 sequences.

With model.moe.load_balance=global_batch the step-1 load-balancing loss and every gradient agree to
1e-6 and the losses of 3 steps to the dense configs' tolerance (test_world_size.py); with
micro_batch (OLMo-core's local_batch) and data_parallel (lm-engine) they differ at step 1. The
reference for the global-batch loss is its equation, E sum_e f_e P_e over the 256 tokens, from the
routers' logits on one process."""

import socket
from pathlib import Path

import pytest
import torch

from .conftest import REPO, spawn, tiny_overrides

# end to end: runs trained, processes or ranks started (make test-fast leaves them out)
pytestmark = pytest.mark.slow

SEQUENCES, SEQ = 8, 32
# Steps a case trains: global_batch's losses must still agree after the optimizer has moved the
# weights (steps 2-3); the per-micro-batch cases are asserted on step 1's loss and gradients alone.
STEPS = {"global_batch": 3, "micro_batch": 1, "data_parallel": 1}
MICRO = (1, 2)  # sequences a rank's micro-batch (4 ranks take 2 each: one micro-batch, or two)
EXPERTS = {
    "swiglu": ["model.moe.expert_hidden=32"],
    "hourglass": ["model.moe.experts=hourglass", "model.K=2", "model.d_h=16"],
}
CASES = [
    ("swiglu", "global_batch"),
    ("hourglass", "global_batch"),
    ("swiglu", "micro_batch"),
    ("swiglu", "data_parallel"),
]


def _spec(tmp, experts: str, balance: str):
    from olmo_patches.launch.layout import Layout, load_and_resolve

    moe = [
        "model.moe.num_experts=4",
        "model.moe.top_k=2",
        f"model.moe.load_balance={balance}",
        *EXPERTS[experts],
    ]
    widths = ["model.widths.schedule=list", "model.widths.values=[48,32]"]
    return load_and_resolve(
        REPO / "configs" / "demo" / "variable-width.yaml",
        tiny_overrides(tmp, *moe, *widths),
        layout=Layout.plan(1),
    )


def _batch(step: int, vocab: int) -> torch.Tensor:
    return torch.randint(
        0, vocab, (SEQUENCES, SEQ), generator=torch.Generator().manual_seed(100 + step)
    )


def _train_module(config, micro: int, world: int):
    """OLMo-core's train module for ``config`` (FSDP over ``world`` ranks, fp32), its weights those
    of one seeded CPU build, the experts counted first."""
    from olmo_core.config import DType
    from olmo_core.distributed import parallel
    from olmo_core.distributed.parallel import DataParallelType
    from olmo_core.optim import AdamWConfig
    from olmo_core.train.train_module import (
        TransformerDataParallelConfig,
        TransformerTrainModuleConfig,
    )
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    from olmo_patches.nn.moe import count_experts_first

    torch.manual_seed(0)
    reference = config.build(init_device="cpu")
    reference.init_weights(max_seq_len=SEQ, device=torch.device("cpu"))
    parallel._WORLD_MESH = None  # OLMo-core builds one world mesh a process (tests/_ranks.py)
    dp = None
    if world > 1:
        dp = TransformerDataParallelConfig(
            name=DataParallelType.fsdp, param_dtype=DType.float32, reduce_dtype=DType.float32
        )
    module = TransformerTrainModuleConfig(
        rank_microbatch_size=micro * SEQ,
        max_sequence_length=SEQ,
        optim=AdamWConfig(lr=3e-3),
        dp_config=dp,
    ).build(config.build(init_device="meta"), device=torch.device("cpu"))
    set_model_state_dict(
        module.model, reference.state_dict(), options=StateDictOptions(full_state_dict=True)
    )
    count_experts_first(module)
    return module


def _train(tmp, experts: str, balance: str, micro: int, world: int, rank: int) -> dict:
    """Steps 1..STEPS[balance] through OLMo-core's train module (FSDP over ``world`` gloo ranks):
    the step-1 load-balancing loss (summed over layers) and full gradients, and each step's CE
    loss."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    config = _spec(tmp, experts, balance).model_config()
    module = _train_module(config, micro, world)
    metrics: dict = {}
    module.record_metric = lambda name, value, *a, **k: metrics.__setitem__(name, value)
    module.record_ce_loss = lambda value, *a, **k: metrics.__setitem__("CE", value)

    def mean(value) -> float:
        value = torch.as_tensor(value, dtype=torch.float64).clone()
        if world > 1:
            dist.all_reduce(value)
        return value.item() / world

    out: dict = {"ce": []}
    per_rank = SEQUENCES // world
    for step in range(1, STEPS[balance] + 1):
        batch = _batch(step, config.vocab_size)[rank * per_rank : (rank + 1) * per_rank]
        metrics.clear()
        module.zero_grads()
        module.train_batch({"input_ids": batch})
        out["ce"].append(mean(metrics["CE"]))
        if step == 1:
            out["lb"] = mean(
                sum(
                    v
                    for k, v in metrics.items()
                    if k.startswith("block ") and k.endswith("balancing loss unscaled")
                )
            )
            out["grads"] = {
                n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).clone()
                for n, p in module.model.named_parameters()
            }
        module.optim.step()
    return out


def _rank(rank: int, world: int, port: int, tmp: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    results = {(e, b, m): _train(Path(tmp), e, b, m, world, rank) for e, b in CASES for m in MICRO}
    if rank == 0:
        torch.save(results, f"{tmp}/results.{world}.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{world: {(experts, load_balance, micro): results}} for 1, 2 and 4 ranks."""
    tmp = tmp_path_factory.mktemp("moe-world")
    out = {1: {(e, b, m): _train(tmp, e, b, m, 1, 0) for e, b in CASES for m in MICRO}}
    for world in (2, 4):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        spawn(_rank, world, world, port, str(tmp))
        out[world] = torch.load(tmp / f"results.{world}.pt")
    return out


def _spread(runs, experts: str, balance: str) -> dict:
    """The largest differences from 1 process at micro-batch 2 over the other layouts:
    load-balancing loss, gradients (max abs), each step's loss (relative)."""
    ref = runs[1][(experts, balance, 2)]
    worst = {"lb": 0.0, "grad": 0.0, "ce": 0.0}
    for world in (1, 2, 4):
        for micro in MICRO:
            r = runs[world][(experts, balance, micro)]
            worst["lb"] = max(worst["lb"], abs(r["lb"] - ref["lb"]))
            worst["grad"] = max(
                worst["grad"],
                *((r["grads"][n] - g).abs().max().item() for n, g in ref["grads"].items()),
            )
            worst["ce"] = max(worst["ce"], *(abs(a - b) / b for a, b in zip(r["ce"], ref["ce"])))
    return worst


@pytest.mark.parametrize("experts", ["swiglu", "hourglass"])
def test_global_batch_balance_is_the_same_at_any_world_size_and_micro_batch(runs, experts):
    worst = _spread(runs, experts, "global_batch")
    print(f"{experts} global_batch: {worst}")
    assert worst["lb"] <= 1e-6 and worst["grad"] <= 1e-6, worst
    assert worst["ce"] <= 1e-5, worst  # the dense configs' tolerance (test_world_size.py: rel 1e-5)
    assert runs[1][(experts, "global_batch", 2)]["lb"] > 1.0  # E sum f P >= 1, a real loss


@pytest.mark.parametrize(
    "experts, balance", [("swiglu", "micro_batch"), ("swiglu", "data_parallel")]
)
def test_per_micro_batch_balance_depends_on_the_split(runs, experts, balance):
    worst = _spread(runs, experts, balance)
    print(f"{experts} {balance}: {worst}")
    assert worst["lb"] > 1e-3 and worst["grad"] > 1e-5, worst


def test_global_batch_loss_is_its_equation_over_the_step(tmp_path, runs):
    """E sum_e f_e P_e with f_e the fraction of the k T assignments to e and P_e the mean softmax
    probability over the step's 8 x 32 tokens, per layer, from the routers' own logits (one
    process)."""
    config = _spec(tmp_path, "swiglu", "global_batch").model_config()
    torch.manual_seed(0)
    model = config.build(init_device="cpu")
    model.init_weights(max_seq_len=SEQ, device=torch.device("cpu"))
    logits = []
    for block in model.blocks.values():
        router = block.feed_forward_moe.router
        router.register_forward_hook(
            lambda m, i, o: logits.append(
                torch.nn.functional.linear(i[0], m.weight.view(m.num_experts, -1))
            )
        )
    model.eval()
    with torch.no_grad():
        model(_batch(1, config.vocab_size))
    total = 0.0
    for z in logits:
        z = z.reshape(-1, z.shape[-1]).double()
        E, k = z.shape[-1], 2
        top = z.topk(k, dim=-1).indices
        f = torch.bincount(top.flatten(), minlength=E).double() / top.numel()
        total += E * (f * z.softmax(-1).mean(0)).sum().item()
    assert runs[1][("swiglu", "global_batch", 2)]["lb"] == pytest.approx(total, rel=1e-6)
