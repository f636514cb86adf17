"""Every rank reads the same token files: a file missing on one rank, of another size there, or the
data given under another spelling on one node (OLMo-core names its index caches by a hash of the
paths) stops every rank with one line naming the file and the rank
(olmo_patches/launch/shared_fs.py); a file that goes after the start is named in the run's last line
(exit 2)."""

import socket

import pytest
from olmo_core.exceptions import OLMoThreadError

from olmo_patches.config import ConfigError
from olmo_patches.train import exit_line
from olmo_patches.launch.shared_fs import require_data

from .conftest import ranks


def test_a_missing_file_is_named_with_the_rank(tmp_path):
    with pytest.raises(ConfigError) as e:
        require_data([str(tmp_path / "part-0.npy")])
    assert (
        str(e.value) == f"data file {tmp_path / 'part-0.npy'}: missing on rank 0 (node 0, "
        f"{socket.gethostname()})"
    )


def test_a_file_gone_after_the_start_is_named(monkeypatch):
    # OLMo-core's data thread re-raises the reader's error (olmo_core.utils: "raise
    # OLMoThreadError(...) from x").
    monkeypatch.setenv("RANK", "3")
    try:
        try:
            open("/data/gone/part-7.npy", "rb")
        except OSError as x:
            raise OLMoThreadError("generator thread data thread 1 failed") from x
    except OLMoThreadError as e:
        assert exit_line(e) == (
            "rank 3 cannot read /data/gone/part-7.npy (FileNotFoundError: "
            "No such file or directory)",
            2,
        )


def test_a_bookkeeping_threads_error_is_named_by_its_cause(monkeypatch):
    """OLMo-core's Trainer re-raises a background bookkeeping op's error as RuntimeError("An error
    occurred") from it (olmo_core/train/trainer.py, ``is_canceled``); the line, which a peer waiting
    for a lost rank's own line reads, names the cause."""
    monkeypatch.setenv("RANK", "0")
    try:
        try:
            raise RuntimeError("[gloo/transport/tcp/pair.cc:538] Connection closed by peer")
        except RuntimeError as x:
            raise RuntimeError("An error occurred") from x
    except RuntimeError as e:
        assert exit_line(e) == (
            "rank 0 failed: RuntimeError: [gloo/transport/tcp/pair.cc:538] Connection closed by "
            "peer",
            1,
        )


@pytest.mark.slow
def test_every_rank_must_read_the_same_files(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.npy").write_bytes(b"\0" * 64)
    (data / "b.npy").write_bytes(b"\0" * 32)
    (tmp_path / "link").symlink_to(data)  # the same files, spelled another way
    a, b, link_a = data / "a.npy", data / "b.npy", tmp_path / "link" / "a.npy"
    r = ranks(
        2,
        "tests/_require_data.py",
        f"same={a},{b};{a},{b}",
        f"missing={a},{b};{a},{data / 'c.npy'}",
        f"spelling={a};{link_a}",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    host = socket.gethostname()
    assert [
        l for l in r.stdout.splitlines() if l.split(":")[0] in ("same", "missing", "spelling")
    ] == [
        "same: ok",
        f"missing: data file {data / 'c.npy'}: missing on rank 1 (node 0, {host})",
        "spelling: data paths differ between ranks: rank 1 (node 0, "
        f"{host}) reads {link_a} where rank 0 reads {a}; "
        "give every node the same data paths, spelled the same",
    ]
