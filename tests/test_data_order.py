"""The exact OLMo-2 1B data order and the ordered prefix, checked offline.

A synthetic mix of raw uint32 token files is served by a local HTTP server (Range support,
scripted faults). References are written here in plain numpy from the documented definition
(docs/data_order.md) (section 4), independent of the code under test.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _http_server import FileServer  # noqa: E402

from .conftest import REPO, run_script  # noqa: E402
from olmo_patches.data import order as order_mod  # noqa: E402
from olmo_patches.data.order import (  # noqa: E402
    PINNED_LIST,
    DataOrderError,
    Layout,
    load_pinned_list,
    read_paths_file,
    write_global_indices,
    shuffled_indices,
)
from olmo_patches.data.prefix import (  # noqa: E402
    PrefixSpec,
    instances_for_tokens,
    materialize,
    part_name,
    prefix_dataset,
    verify_prefix,
)
from olmo_patches.data.remote import (  # noqa: E402
    RangeReader,
    RetryPolicy,
    fetch_sizes,
    load_manifest,
    save_manifest,
)

# The recipe's seed (the OLMo-2 recipe, docs/papers.md, allenai/OLMo
# configs/official-0425/OLMo2-1B-stage1.yaml), and OLMo-core's loader seed for the same order: it
# shuffles with PCG64(seed + epoch) from epoch 1, the old trainer from epoch 0
# (olmo_core/data/data_loader.py: get_rng(seed + epoch), reshuffle() starts at epoch 1).
OLD_TRAINER_SEED = 6198
OLMO_CORE_SEED = 6197
SEQ = 64  # tokens per instance in these tests (4096 for real)
BATCH = 4  # instances per global batch in these tests (512 for real)
# Tokens per file: remainders, a file too short for one instance, and a repeated entry
# (the real list repeats five files too).
FILE_TOKENS = {
    "a/p0.npy": SEQ * 9 + 5,
    "a/p1.npy": SEQ * 4,
    "b/tiny.npy": 40,
    "b/p2.npy": SEQ * 11 + 63,
    "c/p3.npy": SEQ * 6,
}
LISTED = ["a/p0.npy", "a/p1.npy", "b/tiny.npy", "b/p2.npy", "a/p1.npy", "c/p3.npy"]
FAST_RETRY = RetryPolicy(attempts=3, backoff_s=0.01, timeout_s=10)


# -- independent reference (the OLMo-2 recipe, docs/papers.md, plain numpy) ------------------------


def ref_order(token_files: list[np.ndarray], seq: int, seed: int) -> np.ndarray:
    n = sum(len(t) * 4 // (4 * seq) for t in token_files)
    idx = np.arange(n, dtype=np.uint32)
    np.random.Generator(np.random.PCG64(seed + 0)).shuffle(idx)
    return idx


def ref_instance(token_files: list[np.ndarray], seq: int, g: int) -> np.ndarray:
    for tokens in token_files:
        n = len(tokens) // seq
        if g < n:
            return tokens[g * seq : (g + 1) * seq]
        g -= n
    raise IndexError(g)


@pytest.fixture(scope="module")
def files() -> dict[str, bytes]:
    rng = np.random.default_rng(1234)
    return {
        name: rng.integers(0, 100278, size=n, dtype=np.uint32).tobytes()
        for name, n in FILE_TOKENS.items()
    }


@pytest.fixture
def server(files):
    with FileServer(files) as srv:
        yield srv


@pytest.fixture(scope="module")
def tokens(files) -> list[np.ndarray]:
    return [np.frombuffer(files[name], dtype=np.uint32) for name in LISTED]


@pytest.fixture(scope="module")
def expected(tokens) -> tuple[np.ndarray, np.ndarray]:
    """(reference order, reference instances in that order) for the listed mix."""
    order = ref_order(tokens, SEQ, OLD_TRAINER_SEED)
    return order, np.stack([ref_instance(tokens, SEQ, int(g)) for g in order])


def make_spec(server: FileServer, files, n: int, chunk: int = 5) -> PrefixSpec:
    paths = tuple(server.url(name) for name in LISTED)
    sizes = tuple(len(files[name]) for name in LISTED)
    return PrefixSpec(paths, sizes, SEQ, OLD_TRAINER_SEED, n, chunk)


def read_prefix(out: Path, spec: PrefixSpec) -> np.ndarray:
    parts = [np.fromfile(out / part_name(k), dtype=np.uint32) for k in range(spec.num_chunks)]
    return np.concatenate(parts).reshape(-1, SEQ)


def assert_no_corrupt_output(out: Path) -> None:
    """Every part file on disk is whole and recorded; no temporary file is left."""
    assert not list(out.glob(".*tmp*"))
    problems = verify_prefix(out)
    recorded_bad = [p for p in problems if "missing" not in p and "did not finish" not in p]
    assert recorded_bad == []
    chunks = json.loads((out / "index.json").read_text())["chunks"]
    assert sorted(p.name for p in out.glob("part-*.npy")) == sorted(chunks)


# -- the pinned list ---------------------------------------------------------------------


def test_pinned_list_is_olmo_core_mix_and_checksummed(tmp_path):
    from olmo_core.data import DataMix, TokenizerName

    pinned = load_pinned_list()
    shipped, _ = DataMix.OLMoE_mix_0824.build("http://olmo-data.org", TokenizerName.dolma2)
    assert len(pinned) == 1122 and pinned == shipped
    assert len(set(pinned)) == 1117  # five dclm files are listed twice, back to back

    # A changed list is caught, with a one-line error naming the file.
    copy = tmp_path / PINNED_LIST.name
    copy.write_text(PINNED_LIST.read_text().replace("part-00-00000", "part-99-00000", 1))
    (tmp_path / (PINNED_LIST.name + ".sha256")).write_text(
        (REPO / "data_order" / (PINNED_LIST.name + ".sha256")).read_text()
    )
    with pytest.raises(DataOrderError, match="file list changed") as err:
        read_paths_file(copy)
    assert "\n" not in str(err.value) and copy.name in str(err.value)


# -- the order ---------------------------------------------------------------------------


def test_layout_locates_every_instance(files, tokens):
    layout = Layout.from_sizes(LISTED, [len(files[n]) for n in LISTED], SEQ)
    assert layout.num_instances == 9 + 4 + 0 + 11 + 4 + 6
    file_idx, offset = layout.locate(np.arange(layout.num_instances))
    for g, (fi, off) in enumerate(zip(file_idx, offset)):
        np.testing.assert_array_equal(tokens[fi][off : off + SEQ], ref_instance(tokens, SEQ, g))
    assert not np.any(file_idx == LISTED.index("b/tiny.npy"))
    with pytest.raises(DataOrderError):
        layout.locate(np.array([layout.num_instances]))


def test_blockwise_fill_then_shuffle_equals_reference(monkeypatch):
    monkeypatch.setattr(order_mod, "_FILL_BLOCK", 7)  # exercise the block-wise fill
    n = 100_003
    ref = np.arange(n, dtype=np.uint32)
    np.random.Generator(np.random.PCG64(11)).shuffle(ref)
    np.testing.assert_array_equal(shuffled_indices(n, 11), ref)


def run_cli(*args: str):
    return run_script("data_order.py", *args, "--quiet", timeout=120)


@pytest.mark.slow
def test_indices_cli_writes_the_old_trainers_global_indices(tmp_path, server, files, tokens):
    # The same list as local paths and as URLs.
    local = tmp_path / "local.txt"
    for name, data in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    local.write_text("".join(f"{tmp_path / n}\n" for n in LISTED))
    urls = tmp_path / "urls.txt"
    urls.write_text("# a comment\n" + "".join(f"{server.url(n)}\n" for n in LISTED))

    def indices(paths_file: Path, name: str, *flags: str) -> bytes:
        out = tmp_path / name
        proc = run_cli(
            "indices",
            "--paths-file",
            str(paths_file),
            "--seq-len",
            str(SEQ),
            *flags,
            "--out",
            str(out),
        )
        assert proc.returncode == 0, proc.stderr
        return out.read_bytes()

    ref = ref_order(tokens, SEQ, 6198)
    for paths_file in (local, urls):
        # The old trainer writes np.memmap(uint32, "w+"): raw bytes, no header.
        assert indices(paths_file, f"{paths_file.stem}.npy", "--seed", "6198") == ref.tobytes()

    # drop_last with a world size that does not divide N keeps (N // W) * W entries.
    assert len(ref) % 4 != 0
    assert indices(local, "w4.npy", "--world-size", "4") == ref[: (len(ref) // 4) * 4].tobytes()

    indices(local, "header.npy", "--npy-header")
    np.testing.assert_array_equal(np.load(tmp_path / "header.npy"), ref)


def test_cli_errors_are_one_line_and_write_nothing(tmp_path, server):
    out = tmp_path / "o.npy"
    proc = run_cli("indices", "--paths-file", str(tmp_path / "nope.txt"), "--out", str(out))
    assert (
        proc.returncode != 0 and proc.stderr.strip().count("\n") == 0 and "nope.txt" in proc.stderr
    )

    server.missing.add("a/p1.npy")
    bad = tmp_path / "bad.txt"
    bad.write_text(f"{server.url('a/p0.npy')}\n{server.url('a/p1.npy')}\n")
    proc = run_cli("indices", "--paths-file", str(bad), "--out", str(out), "--retries", "1")
    assert proc.returncode != 0 and proc.stderr.strip().count("\n") == 0
    assert "404" in proc.stderr and "a/p1.npy" in proc.stderr
    assert list(tmp_path.iterdir()) == [bad]  # nothing half-written


# -- the manifest ------------------------------------------------------------------------


def test_manifest_sizes_and_staleness(tmp_path, server, files):
    paths = [server.url(n) for n in LISTED]
    sizes = fetch_sizes(paths, RangeReader(FAST_RETRY), workers=4, progress=False)
    assert sizes == [len(files[n]) for n in LISTED]
    assert server.count("HEAD") == len(set(LISTED))  # the repeated file is asked once
    save_manifest(tmp_path / "m.json", paths, sizes)
    assert load_manifest(tmp_path / "m.json", paths) == sizes
    with pytest.raises(DataOrderError, match="does not match the file list"):
        load_manifest(tmp_path / "m.json", paths[:-1] + [server.url("x.npy")])


def test_redirect_is_an_error_not_a_wrong_size(server):
    server.moved.add("a/p0.npy")  # a redirect's Content-Length is not the file's size
    with pytest.raises(DataOrderError, match="HTTP 301"):
        fetch_sizes([server.url("a/p0.npy")], RangeReader(FAST_RETRY), progress=False)


# -- the prefix --------------------------------------------------------------------------


def test_materialize_equals_direct_reads(tmp_path, server, files, expected):
    order, instances = expected
    spec = make_spec(server, files, n=len(order), chunk=5)  # last part is partial
    index = materialize(tmp_path, spec, reader=RangeReader(FAST_RETRY), workers=3, progress=False)
    assert index["complete"] and len(index["chunks"]) == 7
    np.testing.assert_array_equal(np.load(tmp_path / "order.npy"), order)
    np.testing.assert_array_equal(read_prefix(tmp_path, spec), instances)
    assert verify_prefix(tmp_path, reader=RangeReader(FAST_RETRY), sample=6) == []
    assert server.count("GET") == len(order) + 6


def olmo_core_batches(dataset, work_dir: Path, seed: int, shuffle: bool) -> list[np.ndarray]:
    from olmo_core.data import DataCollator, NumpyDataLoaderBase

    loader = NumpyDataLoaderBase.wrap_numpy_dataset(
        dataset,
        global_batch_size=BATCH * SEQ,
        collator=DataCollator(pad_token_id=100277),
        work_dir=work_dir,
        seed=seed,
        dp_world_size=1,
        dp_rank=0,
        fs_local_rank=0,
        target_device_type="cpu",
        shuffle=shuffle,
    )
    loader.reshuffle(epoch=1)
    return [batch["input_ids"].numpy() for batch in loader]


def test_olmo_core_loader_matches_order_and_local_prefix(tmp_path, server, files, expected):
    from olmo_core.data import NumpyFSLDataset

    order, instances = expected
    token_ids = dict(pad_token_id=100277, eos_token_id=100257, vocab_size=100278)
    remote = NumpyFSLDataset(
        *[server.url(n) for n in LISTED], sequence_length=SEQ, dtype=np.uint32, **token_ids
    )
    remote_batches = olmo_core_batches(remote, tmp_path / "w1", OLMO_CORE_SEED, shuffle=True)

    n_batches = len(order) // BATCH  # OLMo-core drops the last partial batch
    assert len(remote_batches) == n_batches
    for k, batch in enumerate(remote_batches):
        np.testing.assert_array_equal(batch, instances[k * BATCH : (k + 1) * BATCH])

    # The local prefix, read in order with shuffling off, gives the same batches.
    spec = make_spec(
        server, files, n=instances_for_tokens(n_batches * BATCH * SEQ, SEQ, BATCH), chunk=6
    )
    materialize(
        tmp_path / "prefix", spec, reader=RangeReader(FAST_RETRY), workers=2, progress=False
    )
    local = prefix_dataset(tmp_path / "prefix", **token_ids)
    local_batches = olmo_core_batches(local, tmp_path / "w2", OLMO_CORE_SEED, shuffle=False)
    assert len(local_batches) == n_batches
    for a, b in zip(local_batches, remote_batches):
        np.testing.assert_array_equal(a, b)


# -- faults ------------------------------------------------------------------------------


def test_404_is_a_clear_error_and_leaves_no_corrupt_part(tmp_path, server, files, expected):
    server.missing.add("b/p2.npy")
    spec = make_spec(server, files, n=len(expected[0]))
    with pytest.raises(DataOrderError, match="404") as err:
        materialize(tmp_path, spec, reader=RangeReader(FAST_RETRY), workers=2, progress=False)
    assert "b/p2.npy" in str(err.value) and "\n" not in str(err.value)
    assert_no_corrupt_output(tmp_path)


@pytest.mark.parametrize("fault", ["fail", "drop", "short"])
def test_transient_faults_are_retried(tmp_path, server, files, expected, fault):
    getattr(server, fault)["b/p2.npy"] = 2  # two bad replies, then good ones (3 attempts)
    spec = make_spec(server, files, n=len(expected[0]))
    materialize(tmp_path, spec, reader=RangeReader(FAST_RETRY), workers=2, progress=False)
    np.testing.assert_array_equal(read_prefix(tmp_path, spec), expected[1])
    assert server.count("GET") == len(expected[0]) + 2
    assert verify_prefix(tmp_path) == []


def test_persistently_truncated_replies_fail_cleanly(tmp_path, server, files, expected):
    server.short["a/p0.npy"] = 10**6  # the server always returns fewer bytes than asked
    spec = make_spec(server, files, n=len(expected[0]))
    with pytest.raises(
        DataOrderError, match=r"failed after 3 attempts.*got 128 of 256 bytes"
    ) as err:
        materialize(tmp_path, spec, reader=RangeReader(FAST_RETRY), workers=2, progress=False)
    assert "a/p0.npy" in str(err.value)
    assert_no_corrupt_output(tmp_path)


def test_size_differing_from_manifest_is_an_error(tmp_path, server, files, expected):
    spec = make_spec(server, files, n=len(expected[0]))
    server.files["c/p3.npy"] = files["c/p3.npy"] + bytes(
        4 * SEQ
    )  # the file grew since the manifest
    with pytest.raises(DataOrderError, match="manifest says") as err:
        materialize(tmp_path, spec, reader=RangeReader(FAST_RETRY), workers=2, progress=False)
    assert "c/p3.npy" in str(err.value)
    assert_no_corrupt_output(tmp_path)


class _Interrupting(RangeReader):
    """Dies like a killed process after ``limit`` reads."""

    def __init__(self, limit: int):
        super().__init__(FAST_RETRY)
        self.left = limit

    def read(self, *args, **kwargs) -> bytes:
        self.left -= 1
        if self.left < 0:
            raise KeyboardInterrupt
        return super().read(*args, **kwargs)


def test_interrupted_materialize_resumes_without_refetching(tmp_path, server, files, expected):
    spec = make_spec(server, files, n=len(expected[0]), chunk=5)
    with pytest.raises(KeyboardInterrupt):
        materialize(tmp_path, spec, reader=_Interrupting(12), workers=1, progress=False)
    assert sorted(p.name for p in tmp_path.glob("part-*.npy")) == [part_name(0), part_name(1)]
    assert_no_corrupt_output(tmp_path)

    # A finished part that got damaged on disk is fetched again; the intact one is not.
    damaged = tmp_path / part_name(1)
    damaged.write_bytes(b"\0" * damaged.stat().st_size)
    assert any("part-00001" in p for p in verify_prefix(tmp_path))

    before = server.count("GET")
    materialize(tmp_path, spec, reader=RangeReader(FAST_RETRY), workers=2, progress=False)
    assert server.count("GET") - before == len(expected[0]) - 5  # all but part 0
    np.testing.assert_array_equal(read_prefix(tmp_path, spec), expected[1])
    assert verify_prefix(tmp_path) == []

    # Resuming with a different order into the same directory is refused.
    other = PrefixSpec(
        spec.paths, spec.sizes, SEQ, spec.seed + 1, spec.num_instances, spec.chunk_instances
    )
    with pytest.raises(DataOrderError, match="different seed"):
        materialize(tmp_path, other, reader=RangeReader(FAST_RETRY), progress=False)


def test_cli_manifest_materialize_verify(tmp_path, server, expected, capsys):
    # Loaded by path: the name 'data_order' is also the repo's data directory.
    module_spec = importlib.util.spec_from_file_location(
        "data_order_cli", REPO / "scripts" / "data_order.py"
    )
    cli = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(cli)
    main = cli.main

    paths_file = tmp_path / "urls.txt"
    paths_file.write_text("".join(f"{server.url(n)}\n" for n in LISTED))
    manifest, out = tmp_path / "sizes.json", tmp_path / "prefix"
    common = [
        "--paths-file",
        str(paths_file),
        "--manifest",
        str(manifest),
        "--quiet",
        "--retries",
        "2",
    ]
    assert (
        main(["manifest", "--paths-file", str(paths_file), "--out", str(manifest), "--quiet"]) == 0
    )
    # 3 batches of tokens -> 12 instances (the test's 'global batch' is 4 instances of 64 tokens).
    args = [
        "--tokens",
        str(3 * BATCH * SEQ - 1),
        "--seq-len",
        str(SEQ),
        "--batch-instances",
        str(BATCH),
    ]
    assert main(["materialize", *common, *args, "--chunk-instances", "5", "--out", str(out)]) == 0
    spec = PrefixSpec((), (), SEQ, OLD_TRAINER_SEED, 12, 5)
    np.testing.assert_array_equal(read_prefix(out, spec), expected[1][:12])
    assert main(["verify", "--out", str(out), "--sample", "3", "--quiet"]) == 0

    (out / part_name(2)).write_bytes(b"junk")
    capsys.readouterr()
    assert main(["verify", "--out", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "part-00002.npy" in err


def test_tokens_round_up_to_whole_batches():
    # The 113M run: 2.5B tokens at 512 x 4096 per batch -> 1193 batches.
    assert instances_for_tokens(2_500_000_000, 4096, 512) == 1193 * 512
    assert instances_for_tokens(BATCH * SEQ, SEQ, BATCH) == BATCH


def test_training_config_reads_the_same_batches_from_prefix_and_remote(
    tmp_path, server, files, expected
):
    """Through the training config (build_experiment): data.source=prefix and the remote files
    give the same batches, equal to the reference order's instances."""
    from olmo_patches.launch.layout import load_and_resolve
    from olmo_patches.train import build_experiment, resolve_data

    order, instances = expected
    n_batches = len(order) // BATCH
    materialize(
        tmp_path / "prefix",
        make_spec(server, files, n=n_batches * BATCH, chunk=7),
        reader=RangeReader(FAST_RETRY),
        workers=2,
        progress=False,
    )

    def batches(source: str, data: str) -> list[np.ndarray]:
        spec = load_and_resolve(
            REPO / "configs" / "113M" / "baseline.yaml",
            [
                f"data.source={source}",
                data,
                f"data.sequence_length={SEQ}",
                f"data.work_dir={tmp_path / source}",
                f"train.global_batch_size={BATCH}",
                f"train.micro_batch_size={BATCH}",
                # what the prefix holds (checked at load)
                f"train.max_tokens={n_batches * BATCH * SEQ}",
            ],
        )
        exp = build_experiment(spec, resolve_data(spec))
        loader = exp.data_loader.build(exp.dataset.build())
        loader.reshuffle(epoch=1)
        return [b["input_ids"].numpy() for b in loader]

    remote = batches("numpy", f"data.paths=[{','.join(server.url(n) for n in LISTED)}]")
    local = batches("prefix", f"data.prefix_dir={tmp_path / 'prefix'}")
    assert len(remote) == len(local) == n_batches
    for k, (a, b) in enumerate(zip(remote, local)):
        np.testing.assert_array_equal(a, instances[k * BATCH : (k + 1) * BATCH])
        np.testing.assert_array_equal(b, a)


# -- a mirror of the pinned list ----------------------------------------------------------


# the pinned list's host in the mirror tests, never contacted: every read goes to the mirror
ORIGIN = "http://olmo-data.org"


def _pinned_list(tmp_path, monkeypatch):
    """The pinned list of LISTED under ORIGIN, with its checksum, in place of the shipped one."""
    import hashlib

    pinned = tmp_path / "pinned.txt"
    pinned.write_text("".join(f"{ORIGIN}/{n}\n" for n in LISTED))
    (tmp_path / "pinned.txt.sha256").write_text(
        hashlib.sha256(pinned.read_bytes()).hexdigest() + "  pinned.txt\n"
    )
    monkeypatch.setattr(order_mod, "PINNED_LIST", pinned)
    return pinned


def _check_training_batches(tmp_path, base: str, k: int, instances) -> None:
    """The training config with data.base=base reads the reference order's batches."""
    from olmo_patches.launch.layout import load_and_resolve
    from olmo_patches.train import build_experiment, resolve_data

    spec = load_and_resolve(
        REPO / "configs" / "113M" / "baseline.yaml",
        [
            "data.source=olmo2_stage1",
            f"data.base={base}",
            f"data.sequence_length={SEQ}",
            f"data.work_dir={tmp_path / f'cache{k}'}",
            f"train.global_batch_size={BATCH}",
            f"train.micro_batch_size={BATCH}",
        ],
    )
    data = resolve_data(spec)
    assert data.train_paths == [f"{base}/{n}" for n in LISTED]
    exp = build_experiment(spec, data)
    loader = exp.data_loader.build(exp.dataset.build())
    loader.reshuffle(epoch=1)
    batches = [b["input_ids"].numpy() for b in loader]
    assert len(batches) == len(instances) // BATCH
    for j, batch in enumerate(batches):
        np.testing.assert_array_equal(batch, instances[j * BATCH : (j + 1) * BATCH])


def _check_cli_prefix(cli, tmp_path, pinned, base: str, k: int, instances) -> None:
    """data_order.py manifest, materialize and verify with --base: the list's own paths, and the
    reference order's first 12 instances."""
    manifest, out = tmp_path / f"sizes{k}.json", tmp_path / f"prefix{k}"
    common = ["--paths-file", str(pinned), "--base", base, "--quiet", "--retries", "2"]
    assert cli.main(["manifest", *common, "--out", str(manifest)]) == 0
    assert [f[0] for f in json.loads(manifest.read_text())["files"]] == [
        f"{ORIGIN}/{n}" for n in LISTED
    ]
    sizing = ["--seq-len", str(SEQ), "--batch-instances", str(BATCH), "--chunk-instances", "5"]
    assert (
        cli.main(
            [
                "materialize",
                *common,
                "--manifest",
                str(manifest),
                "--instances",
                "12",
                *sizing,
                "--out",
                str(out),
            ]
        )
        == 0
    )
    np.testing.assert_array_equal(
        read_prefix(out, PrefixSpec((), (), SEQ, OLD_TRAINER_SEED, 12, 5)), instances[:12]
    )
    assert cli.main(["verify", "--base", base, "--out", str(out), "--sample", "4", "--quiet"]) == 0


def test_mirror_base_keeps_paths_checksum_and_order(tmp_path, server, files, expected, monkeypatch):
    """data.base / --base: the pinned list's files read from a local folder and from a loopback HTTP
    mirror give the reference order's batches through the training config, and the same prefix
    through data_order.py; the list's checksum is still checked."""
    from olmo_patches.config import ConfigError
    from olmo_patches.launch.layout import load_and_resolve

    pinned = _pinned_list(tmp_path, monkeypatch)
    local = tmp_path / "mirror"
    for name, data in files.items():
        (local / name).parent.mkdir(parents=True, exist_ok=True)
        (local / name).write_bytes(data)
    _, instances = expected
    module_spec = importlib.util.spec_from_file_location(
        "data_order_cli", REPO / "scripts" / "data_order.py"
    )
    cli = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(cli)

    for k, base in enumerate((str(local), server.base_url)):
        _check_training_batches(tmp_path, base, k, instances)
        _check_cli_prefix(cli, tmp_path, pinned, base, k, instances)
    assert server.count("GET") > 0

    with pytest.raises(DataOrderError, match="is not under https://elsewhere.org/"):
        order_mod.rebase([f"{ORIGIN}/a/p0.npy"], str(local), origin="https://elsewhere.org")
    with pytest.raises(ConfigError, match=r"data\.base=.*nowhere: no such folder"):
        load_and_resolve(
            REPO / "configs" / "113M" / "baseline.yaml", [f"data.base={tmp_path / 'nowhere'}"]
        )
    with pytest.raises(
        ConfigError, match=r"data\.base=.*applies to data\.source=olmo2_stage1, not demo"
    ):
        load_and_resolve(REPO / "configs" / "demo" / "baseline.yaml", [f"data.base={local}"])
    pinned.write_text(
        pinned.read_text() + f"{ORIGIN}/c/p3.npy\n"
    )  # the list changed: refused, mirror or not
    with pytest.raises(DataOrderError, match="the file list changed"):
        order_mod.load_pinned_list(str(local))


def test_paths_file_skips_blanks_and_comments_and_names_its_errors(tmp_path):
    listed = tmp_path / "list.txt"
    listed.write_text("a.npy\n\n   # an indented comment\nb.npy  \n#c.npy\n")
    assert read_paths_file(listed) == ["a.npy", "b.npy"]
    with pytest.raises(DataOrderError, match="paths file not found: .*missing.txt"):
        read_paths_file(tmp_path / "missing.txt")
    listed.write_text("# nothing\n\n")
    with pytest.raises(DataOrderError, match=f"paths file {listed} lists no files"):
        read_paths_file(listed)


def test_layout_keeps_its_paths_and_names_a_size_mismatch():
    layout = Layout.from_sizes(LISTED, [SEQ * 4 * 2] * len(LISTED), SEQ)
    assert layout.paths == tuple(LISTED)
    with pytest.raises(DataOrderError, match="6 paths but 2 sizes"):
        Layout.from_sizes(LISTED, [1, 2], SEQ)


@pytest.mark.parametrize(
    "epoch,world_size,npy_header", [(0, 1, False), (1, 3, False), (0, 2, True)]
)
def test_global_indices_file_as_the_old_trainer_writes_it(tmp_path, epoch, world_size, npy_header):
    """Raw uint32 (or a .npy), arange(N) shuffled by PCG64(seed + epoch), cut to whole multiples of
    the world size."""
    n = 1001
    ref = np.arange(n, dtype=np.uint32)
    np.random.Generator(np.random.PCG64(OLD_TRAINER_SEED + epoch)).shuffle(ref)
    ref = ref[: n // world_size * world_size]
    out = tmp_path / "sub" / "global_indices.npy"
    assert write_global_indices(
        out, n, OLD_TRAINER_SEED, epoch=epoch, world_size=world_size, npy_header=npy_header
    ) == len(ref)
    got = np.load(out) if npy_header else np.fromfile(out, dtype=np.uint32)
    assert got.dtype == np.uint32
    np.testing.assert_array_equal(got, ref)
    assert [p.name for p in out.parent.iterdir()] == ["global_indices.npy"]  # no temporary left
