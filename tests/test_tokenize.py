"""hourglass-tokenize (scripts/tokenize_data.py): text -> OLMo-core token files. The references are
the tokenizers library's own encoding of each document plus the EOS id, read back through
OLMo-core's numpy dataset, and OLMo-core's own choice of dtype; a killed run resumed is
byte-identical to one that ran through; each bad input is one line naming the file (and line), exit
2, nothing written."""

import gzip
import json
import os
import random
import re
import signal
import time

import numpy as np
import pytest

from .conftest import REPO, finish, run_in_process, start

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _docs(n: int, seed: int = 0) -> list:
    rng = random.Random(seed)
    words = ["".join(rng.choice(LETTERS) for _ in range(rng.randint(2, 7))) for _ in range(400)]
    return [
        " ".join(rng.choice(words) for _ in range(rng.randint(3, 60)))
        + rng.choice(["", ".", " é\n"])
        for _ in range(n)
    ]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A byte-level BPE of 400 tokens (ids above 255: uint16 files) trained here, and its texts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    root = tmp_path_factory.mktemp("corpus")
    docs = _docs(600)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|pad|>"])
    tok.train_from_iterator(docs, trainer)
    tok.save(str(root / "tokenizer.json"))
    return root, docs, Tokenizer.from_file(str(root / "tokenizer.json"))


def _tokenize(*args, cwd=None):
    r = run_in_process("tokenize_data.py", *map(str, args), cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def _jsonl_and_parquet(docs: list, tmp_path):
    """The first 300 documents as JSON lines, the rest as parquet (row groups of 64)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl, parquet = tmp_path / "a.jsonl", tmp_path / "b.parquet"
    jsonl.write_text(
        "".join(json.dumps({"id": i, "text": d}) + "\n" for i, d in enumerate(docs[:300]))
    )
    pq.write_table(
        pa.table({"text": docs[300:], "n": list(range(300))}), parquet, row_group_size=64
    )
    return jsonl, parquet


def _check_instances(config, manifest: dict, reference: list) -> None:
    """OLMo-core's fixed-length instances: each file's documents, then EOS, in 16-token rows."""
    dataset = config.build()
    dataset.prepare()
    instances = [dataset[i]["input_ids"].tolist() for i in range(len(dataset))]
    expected, start_doc = [], 0
    for f in manifest["files"]:
        flat = [t for d in reference[start_doc : start_doc + f["documents"]] for t in d]
        assert len(flat) == f["tokens"]
        expected += [flat[i : i + 16] for i in range(0, len(flat) - 15, 16)]
        start_doc += f["documents"]
    assert instances == expected


@pytest.mark.slow
def test_jsonl_and_parquet_read_back_through_olmo_core(corpus, tmp_path):
    from olmo_core.data import NumpyFSLDatasetConfig, TokenizerConfig
    from olmo_core.data.utils import iter_document_indices

    root, docs, tok = corpus
    jsonl, parquet = _jsonl_and_parquet(docs, tmp_path)
    out = tmp_path / "tokens"
    _tokenize(
        jsonl,
        parquet,
        "--out",
        out,
        "--tokenizer",
        root / "tokenizer.json",
        "--shard-tokens",
        3000,
        "--workers",
        2,
    )

    manifest = json.loads((out / "manifest.json").read_text())
    vocab, eos = tok.get_vocab_size(), tok.token_to_id("<|endoftext|>")
    tokenizer = TokenizerConfig(
        vocab_size=vocab, eos_token_id=eos, pad_token_id=tok.token_to_id("<|pad|>")
    )
    config = NumpyFSLDatasetConfig(
        paths=[str(out / f["path"]) for f in manifest["files"]],
        sequence_length=16,
        tokenizer=tokenizer,
        work_dir=str(tmp_path / "w"),
    )
    assert (
        manifest["dtype"] == np.dtype(config.get_dtype()).name == "uint16"
    )  # OLMo-core's choice for 400 tokens

    # the library's ids of each document, then EOS: the reference
    reference = [tok.encode(d, add_special_tokens=False).ids + [eos] for d in docs]
    files = [out / f["path"] for f in manifest["files"]]
    assert len(files) > 3 and sum(f["documents"] for f in manifest["files"]) == len(docs)
    read_docs = []
    # OLMo-core's document boundaries (EOS) over each file, as its datasets find them
    for f in files:
        array = np.fromfile(f, dtype=np.uint16)
        read_docs += [
            array[s:e].tolist()
            for s, e in iter_document_indices(f, eos_token_id=eos, dtype=np.uint16)
        ]
    assert read_docs == reference
    _check_instances(config, manifest, reference)


def _interrupt(command: list, out, sig: int, shards: int, group: bool) -> None:
    """``sig`` once ``out`` holds ``shards`` finished shards and a cut-off one: to the process group
    (a terminal's Ctrl-C reaches the workers too) or to the process alone (a job scheduler's kill);
    it ends in one line naming the signal, exit 128 + ``sig``."""
    proc = start(command)
    deadline = time.time() + 120
    while time.time() < deadline and not (
        len(list(out.glob("part-*.npy"))) >= shards and list(out.glob("*.npy.tmp"))
    ):
        time.sleep(0.005)
    (os.killpg if group else os.kill)(proc.pid, sig)
    r = finish(proc)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 128 + sig and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert last == f"{out}: interrupted ({signal.Signals(sig).name}), unfinished: rerun the " + (
        "same command to resume"
    ), last


def _refused_as_unfinished(out) -> None:
    """Every way a config names token files (a folder, its manifest, a file, a glob), through the
    check data.paths and data.mixture's sources share; and a mixture glob as a run resolves it."""
    from olmo_patches.config import ConfigError, load_spec
    from olmo_patches.launch.data_files import token_files
    from olmo_patches.train.sources import resolve_data

    numpy = ["data.source=numpy"]
    spec = load_spec(REPO / "configs" / "demo" / "baseline.yaml", [*numpy, f"data.paths=[{out}]"])
    for entry in (out, out / "manifest.json", out / "part-00000.npy", out / "part-*.npy"):
        with pytest.raises(ConfigError, match=rf"{re.escape(str(out))}: an unfinished tokeniz"):
            token_files(spec, "data.paths", [str(entry)])
    glob = [f"data.mixture.web.paths=[{out}/part-*.npy]", "data.mixture.web.ratio=1"]
    with pytest.raises(ConfigError, match="unfinished tokenization"):
        resolve_data(load_spec(REPO / "configs" / "demo" / "baseline.yaml", [*numpy, *glob]))


@pytest.mark.slow
def test_an_interrupted_run_is_refused_then_resumes_to_the_same_bytes(corpus, tmp_path):
    root, _, _ = corpus
    source = tmp_path / "big.jsonl.gz"
    with gzip.open(source, "wt") as f:
        for d in _docs(4000, seed=1):
            f.write(json.dumps({"text": d}) + "\n")
    common = ["--tokenizer", root / "tokenizer.json", "--shard-tokens", 6000, "--batch-docs", 16]
    cut = tmp_path / "cut"
    command = [*_python(), source, "--out", cut, *common, "--workers", 1]
    _interrupt(command, cut, signal.SIGINT, 2, group=True)
    first = {p.name: p.read_bytes() for p in cut.glob("part-*.npy")}
    _interrupt(command, cut, signal.SIGTERM, len(first) + 1, group=False)  # resumed, cut again
    assert not (cut / "manifest.json").exists()
    _refused_as_unfinished(cut)
    _tokenize(source, "--out", cut, *common, "--workers", 1)  # the rerun
    whole = tmp_path / "whole"
    _tokenize(source, "--out", whole, *common, "--workers", 2)
    names = sorted(p.name for p in whole.iterdir())
    assert names == sorted(p.name for p in cut.iterdir()) and not any(
        n.endswith(".tmp") for n in names
    )
    for name in names:
        assert (whole / name).read_bytes() == (cut / name).read_bytes(), name
    assert all(
        first[n] == (whole / n).read_bytes() for n in first
    )  # finished shards were kept as they were
    r = _tokenize(source, "--out", cut, *common)  # a third run: nothing to do, nothing changed
    assert (
        "tokens" in r.stderr
        and (cut / "manifest.json").read_bytes() == (whole / "manifest.json").read_bytes()
    )


def _python() -> list:
    import sys

    return [sys.executable, str(REPO / "scripts" / "tokenize_data.py")]


BAD = [
    # (file name, bytes, what the one line names beyond the file)
    ("empty.jsonl", b"", "empty input file"),
    ("latin1.jsonl", b'{"text": "ok"}\n{"text": "caf\xe9"}\n', ":2: not UTF-8"),
    ("broken.jsonl", b'{"text": "ok"}\n{"text": "ok"}\n{"text": oops}\n', ":3: not a JSON line"),
    ("nofield.jsonl", b'{"text": "ok"}\n{"body": "no text here"}\n', ":2: no 'text' field"),
    ("latin1.txt", b"line one\nline two \xff\n", ":2: not UTF-8"),
    ("empty.txt", b"", "empty input file"),
]


@pytest.mark.parametrize("name,content,why", BAD, ids=[b[0] for b in BAD])
def test_a_bad_input_is_one_line_and_nothing_written(corpus, tmp_path, name, content, why):
    root, docs, _ = corpus
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"text": docs[0]}) + "\n")
    (tmp_path / name).write_bytes(content)
    out = tmp_path / "out"
    r = run_in_process(
        "tokenize_data.py",
        good,
        tmp_path / name,
        "--out",
        out,
        "--tokenizer",
        root / "tokenizer.json",
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith(str(tmp_path / name)) and why in lines[0], lines[0]
    assert not out.exists()


def test_an_input_given_twice_and_json_that_is_no_tokenizer_are_refused(corpus, tmp_path):
    root, docs, _ = corpus
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"text": docs[0]}) + "\n")
    (tmp_path / "config.json").write_text('{"model_type": "gpt2", "vocab_size": 50257}')
    out = tmp_path / "out"
    for inputs, tokenizer, why in (
        ([good, tmp_path], root / "tokenizer.json", f"given twice (also as {good})"),
        ([good], tmp_path / "config.json", "not a tokenizers JSON file (no model.vocab"),
    ):
        r = run_in_process("tokenize_data.py", *inputs, "--out", out, "--tokenizer", tokenizer)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and why in lines[0], r.stderr
        assert not out.exists()


def test_a_tokenizer_that_does_not_fit_the_config_is_refused(corpus, tmp_path):
    root, docs, tok = corpus
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"text": docs[0]}) + "\n")
    out = tmp_path / "out"
    base = REPO / "configs" / "113M" / "baseline.yaml"
    r = run_in_process(
        "tokenize_data.py",
        good,
        "--out",
        out,
        "--config",
        base,
        "--set",
        f"data.tokenizer_file={root / 'tokenizer.json'}",
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert (
        "tokenizer.json" in lines[0]
        and f"{tok.get_vocab_size()} tokens" in lines[0]
        and "100278" in lines[0]
    ), lines[0]
    assert not out.exists()


def test_training_checks_the_manifest_against_the_config_tokenizer(corpus, tmp_path):
    from olmo_patches.config import ConfigError, load_spec
    from olmo_patches.train.sources import check_sources, resolve_data

    root, docs, tok = corpus
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[:50]))
    out = tmp_path / "tokens"
    _tokenize(tmp_path / "a.jsonl", "--out", out, "--tokenizer", root / "tokenizer.json")
    base = REPO / "configs" / "demo" / "baseline.yaml"
    fits = load_spec(
        base,
        [
            "data.source=numpy",
            f"data.paths=[{out}]",
            f"data.demo_vocab_size={tok.get_vocab_size()}",
        ],
    )
    data = resolve_data(fits)
    assert data.dtype == "uint16" and data.train_paths == [str(out / "part-00000.npy")]
    check_sources(fits)
    other = load_spec(
        base, ["data.source=numpy", f"data.paths=[{out}]", "data.demo_vocab_size=512"]
    )
    with pytest.raises(
        ConfigError,
        match=r"tokenized with file \(400 tokens, eos 0\), "
        r"not the config's data.tokenizer=demo \(512",
    ):
        check_sources(other)
    glob = [f"data.mixture.web.paths=[{out}/part-*.npy]", "data.mixture.web.ratio=1"]
    with pytest.raises(ConfigError, match=r"part-\*.npy: tokenized with file \(400 tokens"):
        # its files by a glob: the folder's manifest speaks for them
        check_sources(load_spec(base, ["data.source=numpy", "data.demo_vocab_size=512", *glob]))
    from olmo_patches.launch.data_files import check_data_files
    from olmo_patches.launch.layout import Layout, load_and_resolve

    overrides = [
        "data.source=numpy",
        f"data.paths=[{out}]",
        "data.demo_vocab_size=512",
        f"run.save_folder={tmp_path / 'r'}",
    ]
    with pytest.raises(
        ConfigError, match=rf"^command line: data.paths={out}: tokenized with file \(400 tokens"
    ):
        # as a launch checks its data, before anything runs
        check_data_files(load_and_resolve(base, overrides, Layout.plan(1, 1)))


def test_a_datasets_folder_and_a_text_folder_give_the_jsonl_tokens(corpus, tmp_path):
    import datasets

    root, docs, _ = corpus
    docs = docs[:40]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    datasets.Dataset.from_dict({"text": docs}).save_to_disk(str(tmp_path / "ds"))
    (tmp_path / "texts").mkdir()
    for i, d in enumerate(docs):  # one document a file, read in sorted order
        (tmp_path / "texts" / f"{i:03d}.txt").write_text(d)
    outs = {}
    for name in ("a.jsonl", "ds", "texts"):
        _tokenize(
            tmp_path / name,
            "--out",
            tmp_path / f"out-{name}",
            "--tokenizer",
            root / "tokenizer.json",
        )
        outs[name] = (tmp_path / f"out-{name}" / "part-00000.npy").read_bytes()
    assert outs["ds"] == outs["a.jsonl"] == outs["texts"] and len(outs["ds"]) > 0
