"""Fast unit tests of data/order.py, one function at a time (with test_data_order.py's in-process
tests, the mutation-testing set of that module: `bash tests/mutation.sh order`). References are
written here: the old OLMo trainer's order is arange(N, uint32) shuffled by numpy's
PCG64(seed + epoch) (the OLMo-2 recipe, docs/papers.md), its seed 6198 (allenai/OLMo
configs/official-0425/OLMo2-1B-stage1.yaml)."""

import hashlib

import numpy as np
import pytest

from olmo_patches.data.order import (
    DataOrderError,
    Layout,
    instance_counts,
    load_pinned_list,
    olmo_core_seed,
    read_paths_file,
    rebase,
    sha256_file,
    shuffled_indices,
    write_global_indices,
)

SEED = 6198  # the old trainer's data seed for OLMo-2 1B Stage 1
ORIGIN = "http://olmo-data.org"  # where every pinned path lives


def _reference(n, seed, epoch=0):
    idx = np.arange(n, dtype=np.uint32)
    np.random.Generator(np.random.PCG64(seed + epoch)).shuffle(idx)
    return idx


def test_olmo_core_seed_counts_epochs_from_one():
    # OLMo-core shuffles epoch 1 with PCG64(seed + 1); the old trainer epoch 0 with PCG64(6198 + 0).
    assert olmo_core_seed(SEED) == 6197
    assert olmo_core_seed(0) == -1


def test_sha256_file_is_the_files_digest(tmp_path):
    data = np.random.default_rng(0).bytes(3 * 1000 + 7)
    f = tmp_path / "blob"
    f.write_bytes(data)
    assert sha256_file(f) == hashlib.sha256(data).hexdigest()
    assert (
        sha256_file(f, block=1000) == hashlib.sha256(data).hexdigest()
    )  # several blocks, a short last one
    (tmp_path / "empty").write_bytes(b"")
    assert sha256_file(tmp_path / "empty") == hashlib.sha256(b"").hexdigest()


def test_paths_file_checked_against_its_sha256sum(tmp_path):
    listed = tmp_path / "list.txt"
    listed.write_text("a.npy\n  # indented comment\n\nb.npy\n")
    digest = hashlib.sha256(listed.read_bytes()).hexdigest()
    (tmp_path / "list.txt.sha256").write_text(f"{digest}  list.txt\n")  # sha256sum's format
    assert read_paths_file(str(listed)) == ["a.npy", "b.npy"]
    listed.write_text("a.npy\nc.npy\n")
    changed = hashlib.sha256(listed.read_bytes()).hexdigest()
    with pytest.raises(DataOrderError) as e:
        read_paths_file(listed)
    assert (
        str(e.value) == f"{listed} has sha256 {changed}, but list.txt.sha256 pins {digest}: "
        "the file list changed"
    )
    with pytest.raises(DataOrderError) as e:
        read_paths_file(tmp_path / "nope.txt")
    assert str(e.value) == f"paths file not found: {tmp_path / 'nope.txt'}"
    (tmp_path / "list.txt.sha256").unlink()
    (tmp_path / "list.txt.SHA256").write_text(
        "0" * 64 + "  list.txt\n"
    )  # only the exact name counts
    assert read_paths_file(listed) == ["a.npy", "c.npy"]


def test_paths_file_of_blanks_and_comments_lists_no_files(tmp_path):
    listed = tmp_path / "list.txt"
    listed.write_text("\n   \n# a\n  # b\n")
    with pytest.raises(DataOrderError) as e:
        read_paths_file(listed)
    assert str(e.value) == f"paths file {listed} lists no files"


def test_rebase_onto_a_url_or_a_folder(tmp_path):
    paths = [f"{ORIGIN}/a/p0.npy", f"{ORIGIN}/b/c/p1.npy"]
    assert rebase(paths, None) == paths and rebase(paths, None) is not paths
    assert rebase(paths, "http://127.0.0.1:8000/mirrorX/") == [
        "http://127.0.0.1:8000/mirrorX/a/p0.npy",
        "http://127.0.0.1:8000/mirrorX/b/c/p1.npy",
    ]
    assert rebase(paths, "s3://bucket/olmo") == [
        "s3://bucket/olmo/a/p0.npy",
        "s3://bucket/olmo/b/c/p1.npy",
    ]
    local = tmp_path / "mirror"
    assert rebase(paths, f"{local}/../mirror/") == [
        f"{local}/a/p0.npy",
        f"{local}/b/c/p1.npy",
    ]  # resolved
    # The origin with or without its trailing slash; an origin ending in X keeps its X.
    assert rebase(["http://dataX/a.npy"], "http://m", origin="http://dataX/") == ["http://m/a.npy"]
    assert rebase(["http://dataX/a.npy"], "http://m", origin="http://dataX") == ["http://m/a.npy"]
    with pytest.raises(DataOrderError) as e:
        rebase([*paths, "http://elsewhere.org/x.npy"], "http://m/")
    assert (
        str(e.value)
        == f"http://elsewhere.org/x.npy is not under {ORIGIN}/: cannot rebase it onto http://m"
    )
    with pytest.raises(
        DataOrderError
    ):  # a sibling host sharing the origin's prefix is not under it
        rebase(["http://olmo-data.org.evil/x.npy"], "http://m")


def test_pinned_list_is_1122_files_under_the_origin_and_rebases():
    pinned = load_pinned_list()
    assert len(pinned) == 1122 and all(p.startswith(ORIGIN + "/preprocessed/") for p in pinned)
    mirrored = load_pinned_list("http://127.0.0.1:9/m")
    assert mirrored == ["http://127.0.0.1:9/m/" + p[len(ORIGIN) + 1 :] for p in pinned]


def test_instance_counts_drop_each_files_remainder():
    seq = 8  # 4-byte tokens: 32 bytes an instance
    counts = instance_counts([0, 31, 32, 63, 64, 32 * 5 + 1], seq)
    assert counts.tolist() == [0, 0, 1, 1, 2, 5] and counts.dtype == np.int64
    assert instance_counts([10, 20, 21], 5, itemsize=2).tolist() == [1, 2, 2]
    # int64 whatever the sizes' dtype (a uint64 array, as from a binary table, would make the starts
    # float)
    assert instance_counts(np.array([64, 96], dtype=np.uint64), seq).dtype == np.int64


def test_layout_locates_ids_at_file_boundaries_and_skips_empty_files():
    seq = 8
    # 2, 0, 3 and 1 instances (remainders dropped)
    layout = Layout.from_sizes(["a", "b", "c", "d"], [32 * 2 + 5, 31, 32 * 3, 32], seq)
    assert layout.paths == ("a", "b", "c", "d") and layout.seq_len == 8
    assert layout.counts.tolist() == [2, 0, 3, 1] and layout.num_instances == 6
    assert layout.starts.tolist() == [0, 2, 2, 5, 6]
    files, offsets = layout.locate([0, 1, 2, 3, 4, 5])
    assert files.tolist() == [0, 0, 2, 2, 2, 3]
    assert offsets.tolist() == [0, 8, 0, 8, 16, 0] and offsets.dtype == np.int64
    files, offsets = layout.locate(
        np.array([4, 0], dtype=np.uint64)
    )  # exact integers whatever the ids' dtype
    assert files.tolist() == [2, 0] and offsets.tolist() == [16, 0] and offsets.dtype == np.int64
    files, offsets = layout.locate(np.array([], dtype=np.uint32))
    assert files.size == 0 and offsets.size == 0
    for bad in ([6], [-1], [0, 6], [-1, 3]):
        with pytest.raises(DataOrderError) as e:
            layout.locate(bad)
        assert str(e.value) == "instance id out of range [0, 6)"


def test_layout_needs_a_size_per_path():
    with pytest.raises(DataOrderError) as e:
        Layout.from_sizes(["a", "b", "c"], [1, 2], 8)
    assert str(e.value) == "3 paths but 2 sizes"
    assert Layout.from_sizes(["a"], [64], 8).counts.tolist() == [2]


def test_shuffled_indices_default_epoch_and_sizes():
    np.testing.assert_array_equal(shuffled_indices(1000, SEED), _reference(1000, SEED))
    np.testing.assert_array_equal(shuffled_indices(1000, SEED, epoch=2), _reference(1000, SEED, 2))
    assert shuffled_indices(1000, SEED).dtype == np.uint32
    assert shuffled_indices(0, SEED).size == 0
    with pytest.raises(DataOrderError) as e:
        shuffled_indices(2**32, SEED)
    assert str(e.value) == f"{2**32} instances do not fit the trainers' uint32 indices"


def test_write_global_indices_defaults_are_the_old_trainers(tmp_path):
    """Epoch 0, one process (no cut), raw uint32 without a .npy header; parents created; rewriting
    an existing file in an existing folder replaces it and leaves no temporary behind."""
    out = tmp_path / "a" / "b" / "global_indices.npy"
    assert write_global_indices(out, 1001, SEED) == 1001
    raw = out.read_bytes()
    assert len(raw) == 1001 * 4  # no header
    np.testing.assert_array_equal(np.frombuffer(raw, dtype=np.uint32), _reference(1001, SEED))
    assert write_global_indices(str(out), 10, SEED) == 10
    np.testing.assert_array_equal(np.fromfile(out, dtype=np.uint32), _reference(10, SEED))
    sibling = out.with_name("other.npy")  # the folder exists already
    assert write_global_indices(sibling, 9, SEED, world_size=4, npy_header=True) == 8
    np.testing.assert_array_equal(np.load(sibling), _reference(9, SEED)[:8])
    assert sorted(p.name for p in out.parent.iterdir()) == ["global_indices.npy", "other.npy"]
