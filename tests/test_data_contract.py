"""Data that does not fit the run, refused before anything is written: token ids at or above the
vocabulary anywhere in a token file (the whole file read, the result cached by size and mtime), a
tokenizer file that is not a tokenizers JSON or has more ids than the model, a token file URL that
does not answer, a model that cannot fit any card, and the data-order and shape-search scripts'
inputs that cannot give a result. Each: one line, exit 2, the run folder not created."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _http_server import FileServer  # noqa: E402

from olmo_patches.config import ConfigError, load_spec, spec_to_yaml  # noqa: E402
from olmo_patches.data import contract  # noqa: E402
from olmo_patches.launch.data_files import check_data_files, check_validation_files  # noqa: E402
from olmo_patches.launch.layout import load_and_resolve  # noqa: E402

from .conftest import REPO, run_in_process, tiny_overrides  # noqa: E402
from .conftest import run as run_command  # noqa: E402

BASELINE = str(REPO / "configs" / "demo" / "baseline.yaml")
SEQ, BATCH = 32, 4  # TINY's data.sequence_length and train.global_batch_size: 128 tokens at least
DEMO_VOCAB = 4096  # the demo tokenizer's ids (configs/demo/base.yaml's data.demo_vocab_size)


def _smallest_dtype(vocab: int) -> np.dtype:
    """OLMo-core's NumpyDatasetConfig.get_dtype: the smallest unsigned type holding ids below
    ``vocab``."""
    return np.dtype(np.uint8 if vocab <= 2**8 else np.uint16 if vocab <= 2**16 else np.uint32)


def _numpy_run(tmp_path: Path, *paths: str, extra: tuple = ()) -> list[str]:
    run = tmp_path / "run"
    listed = ",".join(paths)
    work = f"data.work_dir={tmp_path / 'work'}"  # the scan's cache: outside the run folder
    return tiny_overrides(
        run, "data.source=numpy", f"data.paths=[{listed}]", "train.max_steps=1", work, *extra
    )


def _check_data(overrides: list[str]) -> None:
    """What a launch checks of the data (cli.load_or_exit(..., data=True), train()'s rank 0)."""
    check_data_files(load_spec(BASELINE, overrides))


def _refused_in_one_line(r, run: Path, *named: str) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    for part in named:
        assert part in lines[0], lines[0]
    assert not run.exists(), sorted(p.name for p in run.iterdir())  # nothing written
    return lines[0]


# ---- token ids against the vocabulary ------------------------------------------------------------


def test_an_id_beyond_the_vocabulary_after_the_first_4096_tokens_is_refused_before_the_run(
    tmp_path,
):
    tokens = np.arange(6000, dtype=np.uint16) % DEMO_VOCAB
    tokens[5000] = 4000  # a legal id
    tokens[5500] = (
        60000  # beyond the 4096 ids of the demo tokenizer: the embedding would index past its rows
    )
    tokens.tofile(tmp_path / "bad.npy")
    overrides = _numpy_run(tmp_path, str(tmp_path / "bad.npy"))
    r = run_in_process("train.py", BASELINE, *overrides, cwd=tmp_path)
    line = _refused_in_one_line(
        r, tmp_path / "run", "data.paths", "bad.npy", "60000", "at token 5500", "4096"
    )
    assert line.startswith("config error: command line: ")


def test_a_mixture_source_with_an_id_beyond_the_vocabulary_is_named(tmp_path):
    good = np.arange(512, dtype=np.uint16) % DEMO_VOCAB
    good.tofile(tmp_path / "web.npy")
    bad = good.copy()
    bad[300] = DEMO_VOCAB  # the first id out of range
    bad.tofile(tmp_path / "code.npy")
    run = tmp_path / "run"
    mixture = [
        "data.source=numpy",
        f"data.mixture.web.paths=[{tmp_path / 'web.npy'}]",
        "data.mixture.web.ratio=1",
        f"data.mixture.code.paths=[{tmp_path / 'code*.npy'}]",  # a glob
        "data.mixture.code.ratio=1",
        "train.max_steps=1",
        f"data.work_dir={tmp_path / 'work'}",
    ]
    r = run_in_process("train.py", BASELINE, *tiny_overrides(run, *mixture), cwd=tmp_path)
    _refused_in_one_line(
        r, run, "data.mixture.code.paths", "code.npy", f"token id {DEMO_VOCAB} at token 300"
    )


def test_a_bad_token_file_is_refused_before_torch_is_imported(tmp_path):
    tokens = np.zeros(512, dtype=np.uint16)
    tokens[-1] = DEMO_VOCAB
    tokens.tofile(tmp_path / "t.npy")
    overrides = _numpy_run(tmp_path, str(tmp_path / "t.npy"))
    code = (
        "import sys\n"
        "from olmo_patches.cli import load_or_exit\n"
        f"try:\n    load_or_exit({BASELINE!r}, {overrides!r}, data=True)\n"
        "except SystemExit as e:\n    print(e.code, 'torch' in sys.modules)\n"
    )
    r = run_command([sys.executable, "-c", code], timeout=300)
    assert r.stdout.split() == ["2", "False"], (r.stdout, r.stderr[-2000:])
    assert f"token id {DEMO_VOCAB} at token 511" in r.stderr


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(vocab=st.integers(2, 70_000), n=st.integers(SEQ * BATCH, 600), data=st.data())
def test_a_token_file_is_refused_exactly_when_its_largest_id_reaches_the_vocabulary(
    tmp_path_factory, vocab, n, data
):
    dtype = _smallest_dtype(vocab)
    top = data.draw(st.integers(0, int(np.iinfo(dtype).max)), label="largest id")
    where = data.draw(st.integers(0, n - 1), label="its position")
    tokens = np.zeros(n, dtype=dtype)
    tokens[where] = top
    folder = tmp_path_factory.mktemp("ids")
    tokens.tofile(folder / "t.npy")
    overrides = _numpy_run(
        folder,
        str(folder / "t.npy"),
        extra=(f"data.demo_vocab_size={vocab}", "model.vocab_size=null"),
    )
    if top < vocab:
        _check_data(overrides)
    else:
        first = int(np.flatnonzero(tokens == top)[0])
        with pytest.raises(
            ConfigError, match=rf"token id {top} at token {first} >= the vocabulary's {vocab} "
        ):
            _check_data(overrides)


@given(ids=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=300), chunk=st.integers(1, 64))
@settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_the_chunked_scan_finds_the_largest_id_and_its_first_position(
    tmp_path_factory, monkeypatch, ids, chunk
):
    monkeypatch.setattr(contract, "CHUNK_TOKENS", chunk)
    path = tmp_path_factory.mktemp("scan") / "t.npy"
    np.array(ids, dtype=np.uint32).tofile(path)
    found = contract.scan(path, np.dtype(np.uint32))
    assert (found.max, found.position) == (
        max(ids),
        ids.index(max(ids)),
    )  # Python's own max and index


def test_the_scan_is_cached_by_size_and_mtime_and_a_changed_file_is_scanned_again(
    tmp_path, monkeypatch
):
    path = tmp_path / "t.npy"
    np.array([1, 7, 3], dtype=np.uint16).tofile(path)
    scans = []
    real = contract.scan
    monkeypatch.setattr(contract, "scan", lambda *a, **k: scans.append(a[0]) or real(*a, **k))
    cache = tmp_path / "work"
    contract.max_token([str(path)], np.dtype(np.uint16), cache)  # no work folder yet: none made
    assert not cache.exists() and len(scans) == 1
    cache.mkdir()
    first = contract.max_token([str(path)], np.dtype(np.uint16), cache)
    again = contract.max_token([str(path)], np.dtype(np.uint16), cache)
    assert (
        first == again and first[str(path)].max == 7 and len(scans) == 2
    )  # the second read the cache
    assert (cache / contract.CACHE).is_file()
    np.array([1, 9, 3], dtype=np.uint16).tofile(path)  # the same size, rewritten
    st_ = path.stat()
    os.utime(
        path, ns=(st_.st_atime_ns, st_.st_mtime_ns + 1_000_000)
    )  # a later mtime, whatever the clock's grain
    changed = contract.max_token([str(path)], np.dtype(np.uint16), cache)
    assert changed[str(path)].max == 9 and len(scans) == 3
    os.utime(path)  # touched: scanned again
    contract.max_token([str(path)], np.dtype(np.uint16), cache)
    assert len(scans) == 4
    contract.max_token(
        [str(path)], np.dtype(np.uint8), cache
    )  # read as another dtype: another scan
    assert len(scans) == 5


# ---- the tokenizer file --------------------------------------------------------------------------


def _word_level(path: Path, n: int) -> None:
    """A tokenizers JSON of ``n`` ids, written by the tokenizers library itself."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    Tokenizer(WordLevel({f"w{i}": i for i in range(n)}, unk_token="w0")).save(str(path))


@pytest.mark.parametrize(
    "content", [b"not json at all", b'{"model": {"type": "BPE"}}', b"\xff\xfe", b"[]"]
)
def test_a_tokenizer_file_that_is_not_a_tokenizers_json_is_refused(tmp_path, content):
    tokens = np.arange(512, dtype=np.uint16)
    tokens.tofile(tmp_path / "t.npy")
    (tmp_path / "tok.json").write_bytes(content)
    overrides = _numpy_run(
        tmp_path, str(tmp_path / "t.npy"), extra=(f"data.tokenizer_file={tmp_path / 'tok.json'}",)
    )
    r = run_in_process("train.py", BASELINE, *overrides, cwd=tmp_path)
    _refused_in_one_line(
        r, tmp_path / "run", "data.tokenizer_file", "tok.json", "not a tokenizers JSON file"
    )


def test_a_tokenizer_with_more_ids_than_the_model_is_refused_and_one_that_fits_passes(tmp_path):
    tokens = np.arange(512, dtype=np.uint16)
    tokens.tofile(tmp_path / "t.npy")
    _word_level(tmp_path / "big.json", DEMO_VOCAB + 1)
    _word_level(tmp_path / "fits.json", DEMO_VOCAB)
    vocab = ("model.vocab_size=4096",)
    big = _numpy_run(
        tmp_path,
        str(tmp_path / "t.npy"),
        extra=(*vocab, f"data.tokenizer_file={tmp_path / 'big.json'}"),
    )
    with pytest.raises(
        ConfigError,
        match=r"data.tokenizer_file=.*big.json: 4097 token ids, more than model.vocab_size=4096",
    ):
        _check_data(big)
    fits = _numpy_run(
        tmp_path,
        str(tmp_path / "t.npy"),
        extra=(*vocab, f"data.tokenizer_file={tmp_path / 'fits.json'}"),
    )
    _check_data(fits)


def test_tokenizer_ids_are_counted_as_the_tokenizers_library_counts_them(tmp_path, demo_corpus):
    from tokenizers import Tokenizer

    file = demo_corpus.tokenizer_file
    assert contract.tokenizer_vocab(file) == Tokenizer.from_file(file).get_vocab_size(
        with_added_tokens=True
    )


# ---- token files at a URL ------------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on return: nothing listens there


def test_a_token_file_url_nothing_listens_on_is_refused_before_the_run(tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}/t.npy"
    r = run_in_process("train.py", BASELINE, *_numpy_run(tmp_path, url), cwd=tmp_path)
    _refused_in_one_line(r, tmp_path / "run", "data.paths", url, "unreachable", "HEAD")


def test_a_token_file_url_that_answers_404_is_refused_and_one_that_answers_passes(tmp_path):
    tokens = (np.arange(512) % DEMO_VOCAB).astype(np.uint16).tobytes()
    with FileServer({"good.npy": tokens}) as server:
        server.missing.add("gone.npy")
        r = run_in_process(
            "train.py",
            BASELINE,
            *_numpy_run(tmp_path, server.url("good.npy"), server.url("gone.npy")),
            cwd=tmp_path,
        )
        _refused_in_one_line(r, tmp_path / "run", "data.paths", server.url("gone.npy"), "HTTP 404")
        heads = server.count("HEAD")
        _check_data(_numpy_run(tmp_path, server.url("good.npy")))
        assert server.count("HEAD") == heads + 1  # one HEAD, no GET: nothing read to check it
        assert server.count("GET") == 0


def test_urls_are_asked_at_once_and_other_schemes_are_not_asked(monkeypatch):
    asked = []
    monkeypatch.setattr(contract, "_head", lambda url, timeout: asked.append(url))
    urls = [f"http://127.0.0.1:1/{i}.npy" for i in range(100)]
    assert (
        contract.unreachable(
            [*urls, urls[0], "s3://bucket/a.npy", "gs://b/c.npy", "/local/file.npy"]
        )
        is None
    )
    assert sorted(asked) == sorted(urls)  # each once; s3, gs and local paths not asked


# ---- who reads the data checks it ---------------------------------------------------------------


def _beyond_the_vocabulary(tmp_path: Path) -> Path:
    tokens = np.arange(512, dtype=np.uint16) % DEMO_VOCAB
    tokens[100] = DEMO_VOCAB  # the first id out of range
    tokens.tofile(tmp_path / "bad.npy")
    return tmp_path / "bad.npy"


def test_loading_resolving_and_counting_read_no_data_file(tmp_path):
    """A config's data is the business of what reads it: resolving a config (the dry run's plan for
    each card, search, config_table) and count_params take a token file that would be refused and a
    URL nothing listens on, and answer."""
    url = f"http://127.0.0.1:{_closed_port()}/t.npy"
    overrides = _numpy_run(tmp_path, str(_beyond_the_vocabulary(tmp_path)), url)
    load_and_resolve(BASELINE, overrides)  # neither scanned nor asked
    r = run_in_process("count_params.py", BASELINE, *overrides, "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert not (tmp_path / "run").exists()


def test_the_dry_run_refuses_bad_data_and_asks_each_url_once_for_all_cards(tmp_path):
    bad = _beyond_the_vocabulary(tmp_path)
    r = run_in_process("train.py", BASELINE, *_numpy_run(tmp_path, str(bad)), "--dry-run")
    _refused_in_one_line(r, tmp_path / "run", "data.paths", "bad.npy", f"token id {DEMO_VOCAB}")
    tokens = (np.arange(512) % DEMO_VOCAB).astype(np.uint16).tobytes()
    with FileServer({"good.npy": tokens}) as server:
        overrides = _numpy_run(tmp_path, server.url("good.npy"))
        plan = ["--dry-run", "--nproc-per-node", "2"]  # a plan row for every GPU preset
        r = run_in_process("train.py", BASELINE, *overrides, *plan, cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "train.hardware=h100" in r.stdout  # the per-card rows were made
        assert (server.count("HEAD"), server.count("GET")) == (1, 0)
    assert not (tmp_path / "run").exists()


def test_only_the_first_rank_of_a_node_checks_the_data_at_launch(tmp_path, monkeypatch):
    """Under torchrun every rank loads the config; the first of each node alone reads the data
    files (its refusal ends the node's other ranks, tests/test_multinode.py)."""
    from olmo_patches.cli import load_or_exit
    from olmo_patches.launch.ranks import Layout

    overrides = _numpy_run(tmp_path, str(_beyond_the_vocabulary(tmp_path)))
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert load_or_exit(BASELINE, overrides, Layout.plan(2), data=True).data.paths
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(SystemExit) as exit:
        load_or_exit(BASELINE, overrides, Layout.plan(2), data=True)
    assert exit.value.code == 2


def test_train_checks_the_data_of_a_spec_its_launch_did_not(tmp_path):
    from olmo_patches.train import train

    spec = load_and_resolve(BASELINE, _numpy_run(tmp_path, str(_beyond_the_vocabulary(tmp_path))))
    with pytest.raises(
        ConfigError, match=rf"data.paths=.*bad.npy: token id {DEMO_VOCAB} at token 100"
    ):
        train(spec)
    assert not (tmp_path / "run").exists()


def test_evaluate_checks_the_validation_sets_it_reads_not_the_training_files(tmp_path):
    """An evaluation reads the run's local validation sets (dolma2 ids, uint32): an id beyond the
    vocabulary deep in one is one line naming the set's file, before any model loads; the run's
    training files, which it does not read, are not asked for (here: one that is gone)."""
    val = tmp_path / "eval-data/perplexity/v3_small_dolma2-tokenizer/c4_en/val/part-0-00000.npy"
    val.parent.mkdir(parents=True)
    tokens = np.arange(20_000, dtype=np.uint32) % 100_278
    tokens[17_000] = 100_352  # OLMo-2's padded vocabulary, model.vocab_size of the 113M configs
    tokens.tofile(val)
    overrides = [
        "data.source=numpy",
        f"data.paths=[{tmp_path / 'gone.npy'}]",
        "eval.validation_sets=[c4_en]",
        f"eval.validation_base_dir={tmp_path}",
        f"data.work_dir={tmp_path / 'work'}",
    ]
    spec = load_spec(REPO / "configs/113M/baseline.yaml", overrides)
    with pytest.raises(ConfigError) as e:
        check_validation_files(spec)
    assert "eval.validation_sets" in str(e.value) and str(val) in str(e.value)
    assert "token id 100352 at token 17000" in str(e.value)
    run = tmp_path / "run"  # evaluate.py on a checkpoint of that run: refused before any model
    (run / "step1").mkdir(parents=True)
    (run / "config.yaml").write_text(spec_to_yaml(spec))
    r = run_in_process("evaluate.py", str(run / "step1"))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and str(val) in lines[0], r.stderr[-2000:]
    val.write_bytes(tokens[:16_000].tobytes())  # every id below the vocabulary now
    check_validation_files(load_spec(REPO / "configs/113M/baseline.yaml", overrides))
    with pytest.raises(ConfigError, match="gone.npy: no such file"):
        check_data_files(spec)  # what a training run would refuse


# ---- sizes ---------------------------------------------------------------------------------------


def test_an_impossible_layer_count_is_refused_at_load_without_torch():
    code = (
        "import sys\n"
        "from olmo_patches.config import ConfigError, load_spec\n"
        f"try:\n    load_spec({BASELINE!r}, ['model.n_layers=99999999999'])\n"
        "except ConfigError as e:\n    print(e)\n"
        "assert 'torch' not in sys.modules\n"
    )
    r = run_command([sys.executable, "-c", code], timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith(
        "command line: model.n_layers=99999999999: 99,999,999,999 layers keep "
    ), r.stdout


@pytest.mark.parametrize(
    "config,override,named",
    [
        ("demo/baseline.yaml", "model.n_layers=99999999999", "model.n_layers=99999999999"),
        ("demo/variable-width.yaml", "model.n_layers=99999999999", "model.n_layers=99999999999"),
        ("demo/hourglass.yaml", "model.n_layers=1000000", "parameters need"),
        ("8B/baseline-revised.yaml", "model.n_layers=100000", "model.n_layers=100000"),
    ],
)
def test_a_model_that_fits_no_card_is_refused_in_one_line(tmp_path, config, override, named):
    run = tmp_path / "run"
    r = run_in_process(
        "train.py", str(REPO / "configs" / config), override, f"run.save_folder={run}", cwd=tmp_path
    )
    _refused_in_one_line(r, run, named, "over the largest card's 180 GiB")


@pytest.mark.parametrize(
    "config",
    [
        "demo/baseline.yaml",
        "demo/hourglass.yaml",
        "demo/variable-width.yaml",
        "8B/hourglass-revised.yaml",
    ],
)
def test_the_size_check_counts_no_more_parameters_than_olmo_core_builds(config):
    """A lower bound (the check refuses only what cannot fit), and a tight one for constant-width
    blocks: OLMo-core's model, built on the meta device, has at most its norms' weights more."""
    from olmo_patches.config import load_spec, vocab_size
    from olmo_patches.config.spec import counted_params
    from olmo_patches.report.counts import count

    spec = load_spec(REPO / "configs" / config)
    built = count(spec)
    counted = counted_params(spec.model, vocab_size(spec))
    assert counted <= built.total
    if spec.model.block != "variable_width":
        assert counted == built.total - built.norm


def test_the_size_rule_at_8b(tmp_path):
    """16 bytes a parameter over the global batch's GPUs, plus 2 bytes a token a layer a unit of
    width: 8B (about 8.0e9 parameters, 32 layers of 4096) on one GPU is 119 GiB + 1 GiB and loads;
    twice as deep it is 2 x 119 + 2 GiB and is refused."""
    from olmo_patches.config import load_spec

    config = REPO / "configs" / "8B" / "baseline-revised.yaml"
    load_spec(config, ["train.global_batch_size=1"])
    with pytest.raises(
        ConfigError,
        match=r"model.n_layers=64: 15,\d{3},\d{3},\d{3} parameters need "
        r"2\d\d GiB a GPU even on 1 GPUs",
    ):
        load_spec(config, ["train.global_batch_size=1", "model.n_layers=64"])


# ---- the data-order and search scripts -----------------------------------------------------------


@pytest.mark.parametrize(
    "args,named",
    [
        (["indices", "--paths-file", "{empty}", "--out", "{work}/i.npy"], "lists no files"),
        (
            ["indices", "--paths-file", "/dev/null", "--out", "{work}/i.npy"],
            "/dev/null lists no files",
        ),
        (
            ["materialize", "--paths-file", "{comments}", "--instances", "1", "--out", "{work}/p"],
            "lists no files",
        ),
    ],
)
def test_data_order_refuses_an_empty_paths_file_in_one_line(tmp_path, args, named):
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "comments.txt").write_text("# nothing\n\n")
    places = {
        "work": str(work),
        "empty": str(tmp_path / "empty.txt"),
        "comments": str(tmp_path / "comments.txt"),
    }
    r = run_in_process("data_order.py", *[a.format(**places) for a in args], cwd=work)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and named in lines[0], r.stderr
    assert list(work.iterdir()) == []


@pytest.mark.parametrize(
    "args",
    [
        ["1"],  # no hourglass has one parameter
        ["113M", "--K", "4", "--layers", "6", "--attention", "1"],  # one attention parameter
        ["113M", "--K", "4", "--layers", "6", "--d-h-ratio", "0.5", "--tolerance", "0"],
    ],
)
def test_search_without_a_shape_exits_2_in_one_line(tmp_path, args):
    r = run_in_process("search.py", *args, cwd=tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout[-2000:])
    assert len(lines) == 1 and lines[0].startswith(f"search: BUDGET={args[0]}: no shape within"), (
        r.stderr
    )
    assert list(tmp_path.iterdir()) == []


def test_the_size_checks_card_is_the_largest_listed():
    from olmo_patches.config.spec import LARGEST_CARD
    from olmo_patches.launch.cards import CARDS, MODELS

    assert LARGEST_CARD == max(c.memory_gib for c in [*CARDS.values(), *MODELS.values()]) * 2**30
