"""Tests for the embedded demo corpus (olmo_patches.data.demo)."""

from __future__ import annotations

import json
import random
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from olmo_patches.data import demo
from olmo_patches.data.demo import DemoCorpus, load_tokenizer, prepare_demo_corpus

VOCAB = 320  # small enough to train on the tiny fake stdlib in milliseconds
VAL_FRACTION = 0.2  # the fake stdlib has few files


def _fake_source(i: int, rng: random.Random) -> str:
    words = ["alpha", "beta", "gamma", "naïve", "café", "日本語", "self", "value", "return"]
    lines = [f'"""Module {i}: {rng.choice(words)} — unicode ✓."""', "", "import os", ""]
    for j in range(rng.randint(3, 12)):
        a, b = rng.choice(words), rng.choice(words)
        lines += [
            f"def {a.encode('ascii', 'ignore').decode() or 'f'}_{i}_{j}(x, y={j}):",
            f"    # {a} {b}\t{rng.random():.6f}  ",
            f"    return x * {rng.randint(0, 999)} + len({b!r})",
            "",
        ]
    return "\n".join(lines) + "\n"


def make_fake_stdlib(root: Path, reverse: bool = False) -> dict[str, str]:
    """A small stdlib-like folder; returns the relative paths and texts that count."""
    rng = random.Random(0)
    texts = {
        (f"pkg{i % 4}/sub/mod{i}.py" if i % 3 else f"mod{i}.py"): _fake_source(i, rng)
        for i in range(60)
    }
    texts["crlf.py"] = "x = 1\r\ny = 2\r\n"
    texts["special.py"] = 'EOS = "<|endoftext|>"  # a literal special token is text\n'
    items = sorted(texts.items(), reverse=reverse)  # creation order must not matter
    for rel, text in items:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(text.encode())
    # Files that do not count: undecodable, inside site-packages, not *.py, empty.
    (root / "latin1.py").write_bytes(b"# caf\xe9\n")
    (root / "site-packages" / "foo").mkdir(parents=True)
    (root / "site-packages" / "foo" / "bar.py").write_text("print('no')\n")
    (root / "README.txt").write_text("not python\n")
    (root / "empty.py").write_text("")
    return texts


@pytest.fixture(scope="module")
def fake_stdlib(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("fake-stdlib")
    return root, make_fake_stdlib(root)


def build(cache: Path, source: Path, **kwargs) -> DemoCorpus:
    kwargs = {"vocab_size": VOCAB, "val_fraction": VAL_FRACTION, **kwargs}
    return prepare_demo_corpus(cache, source_dir=source, **kwargs)


def manifest(corpus: DemoCorpus) -> dict:
    return json.loads((corpus.root / "manifest.json").read_text())


def read_tokens(path: str, corpus: DemoCorpus) -> np.ndarray:
    return np.fromfile(path, dtype=np.dtype(corpus.dtype).newbyteorder("<"))


def count_builds(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = demo._build

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(demo, "_build", counting)
    return calls


def test_split_is_by_file_and_deterministic(tmp_path, fake_stdlib):
    source, texts = fake_stdlib
    a = build(tmp_path / "a", source)
    # Same files created in another order, in another folder: same build, byte for byte.
    other = tmp_path / "other-src"
    make_fake_stdlib(other, reverse=True)
    b = build(tmp_path / "b", other)
    assert a.root.name == b.root.name
    for name in [p.name for p in a.root.iterdir()]:
        assert (a.root / name).read_bytes() == (b.root / name).read_bytes(), name

    m = manifest(a)
    train = [rel for rel, _ in m["train"]["documents"]]
    val = [rel for rel, _ in m["val"]["documents"]]
    assert train and val and not set(train) & set(val)
    assert set(train) | set(val) == set(texts)  # skipped: undecodable, site-packages, empty
    assert all((demo._path_hash(rel) < VAL_FRACTION) == (rel in val) for rel in texts)
    assert a.n_train_tokens == sum(n for _, n in m["train"]["documents"])
    assert a.n_val_tokens == sum(n for _, n in m["val"]["documents"])


def test_token_files_decode_to_sources(tmp_path, fake_stdlib):
    source, texts = fake_stdlib
    corpus = build(tmp_path, source)
    tokenizer = load_tokenizer(corpus)
    assert tokenizer.get_vocab_size() == corpus.vocab_size
    assert tokenizer.token_to_id("<|endoftext|>") == corpus.eos_token_id
    assert tokenizer.token_to_id("<|pad|>") == corpus.pad_token_id
    assert corpus.dtype == "uint16"
    m = manifest(corpus)
    for split, paths in (("train", corpus.train_paths), ("val", corpus.val_paths)):
        tokens = np.concatenate([read_tokens(p, corpus) for p in paths])
        assert tokens.max() < corpus.vocab_size
        docs = np.split(tokens, np.flatnonzero(tokens == corpus.eos_token_id) + 1)[:-1]
        assert len(docs) == len(m[split]["documents"])
        for doc, (rel, n) in zip(docs, m[split]["documents"]):
            assert len(doc) == n and doc[-1] == corpus.eos_token_id
            assert tokenizer.decode(doc[:-1].tolist(), skip_special_tokens=False) == texts[rel]
    assert "special.py" in [rel for s in ("train", "val") for rel, _ in m[s]["documents"]]


def test_cache_is_reused_and_rebuilt_on_change(tmp_path, monkeypatch):
    source = tmp_path / "src"
    make_fake_stdlib(source)
    builds = count_builds(monkeypatch)
    first = build(tmp_path / "cache", source)
    mtime = Path(first.train_paths[0]).stat().st_mtime_ns
    again = build(tmp_path / "cache", source)
    assert (len(builds), again) == (1, first)
    assert Path(first.train_paths[0]).stat().st_mtime_ns == mtime

    (source / "mod0.py").write_text("changed = True\n")
    changed = build(tmp_path / "cache", source)
    assert len(builds) == 2 and changed.root != first.root

    bigger = build(tmp_path / "cache", source, vocab_size=VOCAB + 16)
    assert len(builds) == 3 and bigger.vocab_size > changed.vocab_size


def test_interrupted_build_leaves_no_cache(tmp_path, monkeypatch, fake_stdlib):
    source, _ = fake_stdlib
    cache = tmp_path / "cache"
    real = demo._write_split

    def crash_on_val(folder, name, docs):
        if name == "val":  # the train files are written by now
            raise RuntimeError("killed mid-build")
        return real(folder, name, docs)

    monkeypatch.setattr(demo, "_write_split", crash_on_val)
    with pytest.raises(RuntimeError, match="killed mid-build"):
        build(cache, source)
    assert list(cache.rglob("manifest.json")) == []
    assert list(cache.iterdir()) == []  # the temp folder is gone too

    monkeypatch.setattr(demo, "_write_split", real)
    builds = count_builds(monkeypatch)
    corpus = build(cache, source)
    assert len(builds) == 1 and (corpus.root / "manifest.json").is_file()


def test_incomplete_cache_folder_is_rebuilt(tmp_path, fake_stdlib):
    source, _ = fake_stdlib
    corpus = build(tmp_path, source)
    Path(corpus.train_paths[0]).write_bytes(b"\0\0")  # truncated token file
    assert build(tmp_path, source) == corpus
    assert read_tokens(corpus.train_paths[0], corpus).size == corpus.n_train_tokens


def test_max_train_tokens_caps_the_train_split(tmp_path, fake_stdlib):
    source, _ = fake_stdlib
    full = build(tmp_path / "full", source)
    capped = build(tmp_path / "capped", source, max_train_tokens=1000)
    assert full.n_train_tokens > 1000 and capped.n_train_tokens == 1000
    assert capped.n_val_tokens == full.n_val_tokens
    full_tokens = read_tokens(full.train_paths[0], full)
    assert np.array_equal(read_tokens(capped.train_paths[0], capped), full_tokens[:1000])


def test_olmo_core_reads_the_token_files(tmp_path, fake_stdlib):
    from olmo_core.data import NumpyDatasetDType, NumpyFSLDatasetConfig, TokenizerConfig

    source, _ = fake_stdlib
    corpus = build(tmp_path / "cache", source)
    dataset = NumpyFSLDatasetConfig(
        paths=corpus.train_paths,
        sequence_length=64,
        tokenizer=TokenizerConfig(
            vocab_size=corpus.vocab_size,
            eos_token_id=corpus.eos_token_id,
            pad_token_id=corpus.pad_token_id,
        ),
        dtype=NumpyDatasetDType(corpus.dtype),
        work_dir=str(tmp_path / "work"),
    ).build()
    dataset.prepare()
    assert len(dataset) == corpus.n_train_tokens // 64
    first = read_tokens(corpus.train_paths[0], corpus)[:64]
    assert np.array_equal(np.asarray(dataset[0]["input_ids"]), first)


@pytest.mark.slow
def test_real_stdlib_build(tmp_path):
    corpus = prepare_demo_corpus(tmp_path, max_train_tokens=300_000)
    assert corpus.vocab_size == 4096 and corpus.dtype == "uint16"
    assert (corpus.eos_token_id, corpus.pad_token_id) == (0, 1)
    assert corpus.n_train_tokens == 300_000
    assert corpus.n_val_tokens >= 200_000
    m = manifest(corpus)
    rels = [rel for s in ("train", "val") for rel, _ in m[s]["documents"]]
    assert len(m["val"]["documents"]) > 20 and not any("site-packages" in r for r in rels)
    tokenizer = load_tokenizer(corpus)
    rel, n = m["val"]["documents"][0]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    val = read_tokens(corpus.val_paths[0], corpus)[: n - 1]
    assert tokenizer.decode(val.tolist()) == (stdlib / rel).read_text(encoding="utf-8")
