"""FSDP2 shards of the K-stacked weights: 4 gloo ranks, the demo hourglass with K=2 and hourglass
experts with K=2. Each rank's local share of every FFN parameter is checked (a K-wise split would
leave ranks 2 and 3 with nothing), and the sharded model computes the unsharded model's loss."""

import json
import socket

import pytest
import torch

from .conftest import REPO, spawn
from .test_hourglass_moe import _blocks, _transformer

# end to end: runs trained, processes or ranks started (make test-fast leaves them out)
pytestmark = pytest.mark.slow

WORLD = 4


def _models():
    from olmo_patches.config import vocab_size
    from olmo_patches.launch.layout import load_and_resolve

    spec = load_and_resolve(
        REPO / "configs" / "demo" / "hourglass.yaml", ["model.K=2", "model.n_layers=2"]
    )
    dense = spec.model.build(vocab_size(spec))
    return {
        "hourglass": (dense, dense.vocab_size),
        "hourglass-experts": (_transformer(_blocks(K=2)[1]), 128),
    }


def _rank(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist
    from olmo_core.distributed.utils import get_local_tensor
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD
    )
    result = {}
    for name, (config, vocab) in _models().items():
        torch.manual_seed(0)
        model = config.build()
        model.init_weights(device=torch.device("cpu"))
        ids = torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(1))
        model.eval()  # no MoE aux losses: the loss is the logits'
        with torch.no_grad():
            reference = model(ids).float().square().mean().item()
        model.apply_fsdp(dp_mesh=init_device_mesh("cpu", (WORLD,)))
        loss = model(ids).float().square().mean()
        loss.backward()
        ffn = {
            n: (get_local_tensor(p).numel(), p.numel())
            for n, p in model.named_parameters()
            if ".feed_forward" in n
        }
        result[name] = {"ffn": ffn, "loss": loss.item(), "reference": reference}
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


def test_every_rank_holds_an_even_share_of_the_stacked_weights(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path / "shards")
    spawn(_rank, WORLD, port, out)
    ranks = [json.loads(open(f"{out}.{r}").read()) for r in range(WORLD)]
    for name in ("hourglass", "hourglass-experts"):
        params = ranks[0][name]["ffn"]
        assert any("w1" in p for p in params), (name, sorted(params))
        for p, (_, numel) in params.items():
            shares = [r[name]["ffn"][p][0] for r in ranks]
            assert sum(shares) == numel, (name, p, shares)  # no element twice, none lost
            assert max(shares) <= 1.1 * numel / WORLD and min(shares) >= 0.9 * numel / WORLD, (
                name,
                p,
                shares,
            )
        for r in ranks:  # the sharded model computes what the whole model does
            assert abs(r[name]["loss"] - r[name]["reference"]) <= 1e-5 * abs(
                r[name]["reference"]
            ), (name, r[name])
