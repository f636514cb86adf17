"""Two torchrun "nodes" on this machine (c10d rendezvous on 127.0.0.1), as docs/running.md launches
them, with no extra environment: HSDP trains as a 2x2 mesh with one process's losses, and resumes on
FSDP x2 and then in one process; a folder not every node sees, bad data, and a refusal on one rank
alone after start-up, end every process promptly, the line printed on every node; so do a rank
killed outright (2 ranks a node, on the store's node or the other) and a node lost mid-run (its
torchrun killed outright), under python -m olmo_patches.launch.torchrun."""

import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from olmo_patches.launch.layout import load_and_resolve
from olmo_patches.train import train
from olmo_patches.train.batch_trace import read_batch_trace
from olmo_patches.launch.run_folder import read_metrics

from .conftest import REPO, child_env, finish, ranks, start, tiny_overrides

# end to end: runs trained, processes or ranks started (make test-fast leaves them out)
pytestmark = pytest.mark.slow

HOURGLASS = REPO / "configs" / "demo" / "hourglass.yaml"
# 6 steps of 4 sequences; a checkpoint at each stop; every rank records its instances.
RUN = [
    "train.max_steps=6",
    "run.save_interval=2",
    "run.ephemeral_save_interval=null",
    "run.trace_batches=true",
]
# The collectives' timeout (OLMo-core's process group): what a rank left waiting for a peer waited.
COLLECTIVE_TIMEOUT_S = 900
MICRO = "train.micro_batch_size=1"  # divides every rank's batch: no info line lowering it


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_nodes(per_node: int, args0: list, args1: list, timeout: int = 600):
    """Two torchruns side by side, one a node, on one rendezvous: each one's result and the seconds
    from the first one's exit to the last one's."""
    port = _free_port()
    procs = [
        start(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--nproc-per-node",
                per_node,
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                *args,
            ]
        )
        for args in (args0, args1)
    ]
    results, ended = [None, None], [0.0, 0.0]

    def wait(i):
        results[i] = finish(procs[i], timeout)
        ended[i] = time.monotonic()

    threads = [threading.Thread(target=wait, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, max(ended) - min(ended)


def _losses(run_dir):
    return {
        step: m["train/CE loss"]
        for step, m in read_metrics(run_dir).items()
        if "train/CE loss" in m
    }


def _train_args(folder, *extra):
    return [
        "scripts/train.py",
        str(HOURGLASS),
        *tiny_overrides(folder, *RUN, *extra, block="hourglass"),
    ]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, demo_corpus):
    """The reference: 6 steps in one process, uninterrupted."""
    folder = tmp_path_factory.mktemp("one")
    train(load_and_resolve(HOURGLASS, tiny_overrides(folder, *RUN, block="hourglass")))
    return folder


@pytest.fixture(scope="module")
def resumed(tmp_path_factory, demo_corpus):
    """One run, three launches: steps 1-2 as HSDP on two torchrun nodes x 2 ranks, 3-4 as FSDP on
    2 ranks, 5-6 in one process."""
    folder = tmp_path_factory.mktemp("resumed")
    node = _train_args(folder, "train.data_parallel=hsdp", "run.stop_at_step=2")
    (hsdp0, hsdp1), _ = _two_nodes(2, node, node)
    log = (folder / "train.log").read_text() if (folder / "train.log").is_file() else ""
    fsdp = ranks(2, *_train_args(folder, "train.data_parallel=fsdp", "run.stop_at_step=4"))
    one = load_and_resolve(HOURGLASS, tiny_overrides(folder, *RUN, block="hourglass"))
    train(one)
    return folder, hsdp0, hsdp1, log, fsdp


def test_no_extra_environment():
    env = child_env()
    assert "OLMO_SHARED_FS" not in env and "FS_LOCAL_RANK" not in env


def test_two_nodes_train_hsdp_as_a_2x2_mesh_with_one_process_losses(resumed, one_process):
    folder, hsdp0, hsdp1, log, _ = resumed
    assert hsdp0.returncode == 0, hsdp0.stderr[-3000:]
    assert hsdp1.returncode == 0, hsdp1.stderr[-3000:]
    assert "Built 2D device mesh with shape (dp_replicate=2, dp_shard=2)" in log
    want, got = _losses(one_process), _losses(folder)
    assert sorted(want) == [1, 2, 3, 4, 5, 6]
    for step in (1, 2):
        assert got[step] == pytest.approx(want[step], abs=1e-5), step


def test_hsdp_resumes_on_fsdp_x2_and_then_in_one_process(resumed, one_process):
    """4 ranks -> 2 (HSDP 2x2 -> FSDP 2) -> 1: the same instances every step, the same losses."""
    folder, *_, fsdp = resumed
    assert fsdp.returncode == 0, fsdp.stderr[-3000:]
    # Every step's 4 instances and their tokens.
    assert read_batch_trace(folder) == read_batch_trace(one_process)
    want, got = _losses(one_process), _losses(folder)
    assert sorted(got) == sorted(want)
    for step in want:
        assert got[step] == pytest.approx(want[step], abs=1e-5), step


def _one_line_on_every_node(results, line: str):
    for r in results:
        assert r.returncode != 0
        assert r.stderr.splitlines().count(line) == 1, r.stderr[-3000:]


def test_a_folder_not_every_node_sees_is_refused_on_every_node(tmp_path):
    """Each node given its own folder: what rank 0 writes there, node 1 does not see (one rank a
    node, forked: the check is the run's, on any launcher)."""
    folder0, folder1 = tmp_path / "node0" / "run", tmp_path / "node1" / "run"
    args = [_train_args(folder)[1:] for folder in (folder0, folder1)]
    # ended well within the collectives' timeout, or killed (-9)
    r = ranks(2, "train.py", nodes=2, node_args=args, timeout=COLLECTIVE_TIMEOUT_S // 10)
    line = (
        f"config error: run.save_folder={folder0}: not shared by every node: node 1 "
        f"({socket.gethostname()}) does not see what rank 0 writes there; use a folder on a "
        f"filesystem every node mounts"
    )
    assert r.returncode == 2 and r.stderr.splitlines() == [line, line], r.stderr[-3000:]
    # Nothing written.
    assert not (tmp_path / "node0").exists() and not (tmp_path / "node1").exists()


def test_bad_data_is_refused_on_every_node_in_one_line(tmp_path):
    """The first rank of each node reads the data files at launch (before torch) and refuses them;
    the node's other rank, on its way to the rendezvous, ends with it, silent."""
    import numpy as np

    tokens = np.arange(512, dtype=np.uint16)
    tokens[100] = 4096  # the demo tokenizer's 4096 ids: the first out of range
    tokens.tofile(tmp_path / "bad.npy")
    folder = tmp_path / "run"
    node = _train_args(folder, "data.source=numpy", f"data.paths=[{tmp_path / 'bad.npy'}]")
    results, gap = _two_nodes(2, node, node)
    for r in results:
        lines = [x for x in r.stderr.splitlines() if x.startswith("config error: ")]
        assert r.returncode != 0 and len(lines) == 1, r.stderr[-3000:]
        assert "data.paths=" in lines[0] and "token id 4096 at token 100" in lines[0], lines[0]
    assert gap < COLLECTIVE_TIMEOUT_S / 10
    assert not folder.exists()  # nothing written


def test_a_refusal_on_rank_1_alone_ends_rank_0(tmp_path):
    """Rank 1 alone refuses once the run is built; rank 0 is then in a collective waiting for it."""
    node = ["tests/_fail_on_rank.py", "1", *_train_args(tmp_path)[1:]]
    results, gap = _two_nodes(1, node, node)
    _one_line_on_every_node(results, "error: refused on rank 1 (test)")
    assert gap < COLLECTIVE_TIMEOUT_S / 10


def test_a_refusal_on_rank_1_ends_rank_0_through_the_process_groups_store(tmp_path):
    """The same under a launcher whose store is the process group's (rank 0's), not torchrun's:
    the ranks' own environment (conftest.ranks)."""
    r = ranks(2, "tests/_fail_on_rank.py", "1", *_train_args(tmp_path)[1:])
    assert r.returncode == 2
    # Printed by rank 1 (local rank 1): only the store tells it that it is the first on its node,
    # and rank 0 then ends on that line, not on its own error (a collective cut off).
    lines = r.stderr.splitlines()
    assert lines.count("error: refused on rank 1 (test)") == 1, r.stderr[-3000:]
    assert not [x for x in lines if x.startswith("rank 0 failed")], r.stderr[-3000:]


def _children(pid: int) -> list:
    """A process's children (Linux: /proc/PID/task/*/children)."""
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _environ(pid: int) -> dict:
    raw = open(f"/proc/{pid}/environ", "rb").read()
    return dict(e.decode().split("=", 1) for e in raw.split(b"\0") if b"=" in e)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _two_wrapped_nodes(tmp_path, per_node: int):
    """Two ``python -m olmo_patches.launch.torchrun`` nodes mid-run (step 2 logged): the first one
    started holds the rendezvous store. Returns (store's torchrun, the other, their workers)."""
    port = _free_port()
    args = [
        sys.executable,
        "-m",
        "olmo_patches.launch.torchrun",
        "--nnodes",
        "2",
        "--nproc-per-node",
        str(per_node),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        *_train_args(tmp_path, "train.max_steps=1000", "run.save_interval=1000", MICRO),
    ]
    store = start(args)
    deadline = time.monotonic() + 120
    while not _listening(port):
        assert time.monotonic() < deadline and store.poll() is None
        time.sleep(0.2)
    other = start(args)
    log = tmp_path / "train.log"
    while not (log.is_file() and "step 2/" in log.read_text()):
        if (
            time.monotonic() > deadline + 300
            or store.poll() is not None
            or other.poll() is not None
        ):
            for p in (store, other):
                os.killpg(p.pid, 9)
            pytest.fail(f"no run: {finish(store).stderr[-2000:]} {finish(other).stderr[-2000:]}")
        time.sleep(0.2)
    return store, other, _children(store.pid) + _children(other.pid)


def _all_end_within_60_s(torchruns, workers, killed: float) -> list:
    results = [finish(p, timeout=120) for p in torchruns]
    while any(_alive(w) for w in workers) and time.monotonic() < killed + 60:
        time.sleep(0.2)
    assert time.monotonic() - killed < 60 and not any(_alive(w) for w in workers)
    print(f"every process ended {time.monotonic() - killed:.1f} s after the kill")  # pytest -s
    return results


def _one_line_each(results, line: str) -> None:
    for r in results:
        assert [x for x in r.stderr.splitlines() if x.strip()] == [line], r.stderr[-3000:]
        assert r.returncode != 0


@pytest.mark.parametrize("on, per_node", [("the store's node", 2), ("the other node", 1)])
def test_a_rank_killed_outright_ends_every_process_one_line_a_node(
    tmp_path, demo_corpus, on, per_node
):
    """One rank SIGKILLed (an out-of-memory kill, say) mid-run, on the store's node beside a rank
    that goes on, or alone on the other: every process ends within 60 s, each node printing one
    line naming the rank, its node and its pid."""
    store, other, workers = _two_wrapped_nodes(tmp_path, per_node=per_node)
    node = store if on == "the store's node" else other
    victim = max(_children(node.pid))  # one of the node's ranks
    env = _environ(victim)
    os.kill(victim, 9)
    results = _all_end_within_60_s((store, other), workers, time.monotonic())
    line = (
        f"rank {env['RANK']} (node {env['GROUP_RANK']}, {socket.gethostname()}, pid {victim}) "
        "was killed by SIGKILL; every rank stops"
    )
    _one_line_each(results, line)


def test_a_lost_node_ends_every_process_within_60_s_one_line_a_node(tmp_path, demo_corpus):
    """Node 1's torchrun killed outright mid-run (a lost machine): its orphaned rank and node 0's
    both end, each node printing one line that names the lost node and rank."""
    host, lost, workers = _two_wrapped_nodes(tmp_path, per_node=1)
    (orphan,) = _children(lost.pid)
    env = _environ(orphan)
    os.kill(lost.pid, 9)
    results = _all_end_within_60_s((host, lost), workers, time.monotonic())
    line = (
        f"node {env['GROUP_RANK']} ({socket.gethostname()}) lost: its torchrun (pid {lost.pid}) "
        f"ended; its rank {env['RANK']} stop"
    )
    _one_line_each(results, line)
    assert results[0].returncode == 1  # node 0's torchrun: its rank exited 1
