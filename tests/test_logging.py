"""Logging of real tiny CPU runs: the console progress line (loss, tokens/s, time left) and wandb
offline (a run folder with the loss history; the same wandb run id after a stop and a resume).

One run, stopped at step 3 (run.stop_at_step, a checkpoint), then resumed to step 80 by the same
command, as scripts/train.py runs it. References: the metrics file (metrics.jsonl, written by
another callback), the log lines' own timestamps, and wandb's offline run files read back with
wandb's own reader.
"""

import json
import re

import pytest


from olmo_patches.launch.run_folder import read_metrics  # noqa: E402

from .conftest import REPO, run_script, tiny_overrides  # noqa: E402

# end to end: runs trained, processes or ranks started (make test-fast leaves them out)
pytestmark = pytest.mark.slow

BASELINE = REPO / "configs" / "demo" / "baseline.yaml"
STEPS, STOP = 80, 3
PROGRESS = re.compile(
    r"^(?P<time>\S+ \S+)\s.*\bstep (?P<step>\d+)/(?P<total>\d+) \| loss (?P<loss>[\d.]+)"
    r"(?: \| val [\d.]+)? \| (?P<tps>[\d,]+) tok/s(?: \| "
    r"(?:(?P<h>\d+)h(?P<hm>\d\d)m|(?P<m>\d+)m(?P<s>\d\d)s) left)?$"
)


@pytest.fixture(scope="module")
def stopped_and_resumed(tmp_path_factory):
    run = tmp_path_factory.mktemp("logging") / "run"
    args = [
        str(BASELINE),
        *tiny_overrides(run, f"train.max_steps={STEPS}", "run.wandb_project=hourglass-test"),
    ]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv(
            "WANDB_BASE_URL", "http://127.0.0.1:9"
        )  # any network call would fail: there must be none
        mp.delenv("WANDB_API_KEY", raising=False)
        first = run_script("train.py", *args, f"run.stop_at_step={STOP}")
        assert first.returncode == 0, first.stderr[-3000:]
        second = run_script("train.py", *args)
        assert second.returncode == 0, second.stderr[-3000:]
    return run, first, second


def _progress(result):
    lines = (result.stdout + result.stderr).splitlines()
    return [m.groupdict() for line in lines if (m := PROGRESS.match(line))]


def _seconds_left(p) -> float | None:
    if p["m"] is not None:
        return int(p["m"]) * 60 + int(p["s"])
    if p["h"] is not None:
        return int(p["h"]) * 3600 + int(p["hm"]) * 60
    return None


def test_console_progress_line(stopped_and_resumed):
    run, _, resumed = stopped_and_resumed
    metrics = read_metrics(run)
    lines = _progress(resumed)
    assert [int(p["step"]) for p in lines] == list(
        range(STOP + 2, STEPS + 1)
    )  # step STOP+1 has no speed yet
    for p in lines:
        assert int(p["total"]) == STEPS
        assert float(p["loss"]) == pytest.approx(metrics[int(p["step"])]["train/CE loss"], abs=1e-4)
    # tokens/s and time left are present and positive, and the time left counts down (wall-clock
    # accuracy is not asserted: this machine is shared).
    assert all(int(p["tps"].replace(",", "")) > 0 for p in lines)
    shown = [(p, s) for p in lines if (s := _seconds_left(p)) is not None]
    assert shown, "no time-left field in any progress line"
    p0, left = shown[0]
    assert shown[-1][1] <= left and int(shown[-1][0]["step"]) > int(p0["step"])


def _records(run_file):
    """The records of a wandb run file, read by the format it is written in, not by wandb's code
    (its Python reader, wandb.sdk.internal.datastore, is in 0.22.3 and gone in 0.31.0; the file is
    the same): a 7-byte header (":W&B", magic, version), then LevelDB's log format
    (github.com/google/leveldb/blob/main/doc/log_format.md): 32 KiB blocks of chunks, each a
    little-endian crc32, length and type (1 full, 2 first, 3 middle, 4 last) and its data; a block's
    last 6 bytes or fewer are zero padding. The crc32 is zlib's, seeded with the type byte's, as
    wandb writes it."""
    import struct
    import zlib

    data = run_file.read_bytes()
    assert data[:4] == b":W&B" and struct.unpack("<H", data[4:6])[0] == 0xBEE1
    i, parts = 7, b""
    while i < len(data):
        if 32768 - i % 32768 < 7:  # the block's trailer
            i += 32768 - i % 32768
            continue
        checksum, length, kind = struct.unpack("<IHB", data[i : i + 7])
        chunk = data[i + 7 : i + 7 + length]
        if length == 0 and kind == 0:  # zeros to the end of a block being written
            i += 32768 - i % 32768
            continue
        assert checksum == zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF
        i += 7 + length
        parts += chunk
        if kind in (1, 4):
            yield parts
            parts = b""


def _history(run_file):
    """Every logged step's metrics, decoded with wandb's own protobuf messages."""
    from wandb.proto import wandb_internal_pb2 as pb

    history, run_id = {}, None
    for data in _records(run_file):
        record = pb.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_id = record.run.run_id
        elif kind == "history":
            items = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json)
                for i in record.history.item
            }
            history[items.pop("_step")] = items
    return run_id, history


def test_wandb_offline_history_and_resume(stopped_and_resumed):
    run, _, _ = stopped_and_resumed
    run_id = (run / "wandb_id").read_text().strip()
    folders = sorted((run / "wandb" / "wandb").glob("offline-run-*"))
    assert [f.name.rsplit("-", 1)[1] for f in folders] == [
        run_id,
        run_id,
    ]  # the resumed run kept its id
    metrics = read_metrics(run)
    logged = {}
    for folder in folders:
        (run_file,) = folder.glob("run-*.wandb")
        ids, history = _history(run_file)
        assert ids == run_id
        logged.update({s: m["train/CE loss"] for s, m in history.items() if "train/CE loss" in m})
    # Both parts together: the loss of every step, as the metrics file has it.
    assert sorted(logged) == list(range(1, STEPS + 1))
    for step, loss in logged.items():
        assert loss == pytest.approx(metrics[step]["train/CE loss"], rel=1e-6)
