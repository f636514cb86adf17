"""A run's data files against its config, before anything is written: local token files whole
tokens of the tokenizer's dtype, at least a sequence each and a global batch in all, every id of
every token file (data.paths, data.mixture's sources, local validation sets) below the vocabulary
(a full scan, cached: data/contract.py), every HTTP(S) token file answering a HEAD, token files of
hourglass-tokenize (a folder, its manifest, a file or glob of its files) of a finished tokenization
with the config's tokenizer, data.tokenizer_file a tokenizers JSON whose ids fit the model, and
train.init_from a folder (a Hugging Face one of an OLMo-2 model).

Only what reads the data runs it: ``cli.load_or_exit(..., data=True)`` in scripts/train.py and
scripts/demo.py (the first rank of each node, before torch is imported), and ``train.train`` (rank
0, before anything is written) for a spec whose launch did not; scripts/evaluate.py checks what it
reads (:func:`check_validation_files`). Loading, resolving, counting and searching configs read no
data file."""

from __future__ import annotations

import json
from pathlib import Path

from ..config.load import where_set
from ..config.spec import ExperimentSpec, failer, tokenizer_vocab, vocab_size
from ..data.contract import (
    HEAD_TIMEOUT_S,
    max_token,
    tokenizer_vocab as tokenizer_file_ids,
    unreachable,
)
from ..data.tokenize import (
    MANIFEST,
    InputError,
    dtype_for,
    other_tokenizer,
    read_manifest,
    tokenize_folder,
)

__all__ = ["check_data_files", "check_validation_files", "token_files"]


def check_data_files(spec: ExperimentSpec) -> None:
    """What the data files must agree with (the module's list): a ConfigError in one line."""
    fail = failer(where_set(spec))
    if spec.data.tokenizer_file is not None:
        _check_tokenizer_file(spec, fail)
    if spec.data.source == "numpy":
        _check_token_files(spec, fail)
    if spec.train.init_from:
        _check_init_from(spec.train.init_from, fail)


def check_validation_files(spec: ExperimentSpec) -> None:
    """What an evaluation reads of a run's data: data.tokenizer_file and every id of the local
    validation sets (the training files are not read there)."""
    fail = failer(where_set(spec))
    if spec.data.tokenizer_file is not None:
        _check_tokenizer_file(spec, fail)
    if spec.data.source == "numpy" and (files := _validation_files(spec)):
        _check_token_ids(spec, fail, files, dtype_for(tokenizer_vocab(spec)))


def _check_token_files(spec: ExperimentSpec, fail) -> None:
    """Each local token file readable, whole tokens of the dtype OLMo-core will read it as (the
    smallest unsigned type holding the tokenizer's ids, NumpyDatasetConfig.get_dtype), at least one
    sequence; together at least one global batch: an empty dataset would have OLMo-core enumerate
    epochs without end. Then every id of every file of the run below the vocabulary
    (:func:`_check_token_ids`)."""
    d, t = spec.data, spec.train
    dtype = dtype_for(tokenizer_vocab(spec))
    instances, local = 0, True
    files = token_files(spec, "data.paths", list(d.paths))[0]
    for path in files:
        if "://" in path:
            local = False
            continue
        file = Path(path)
        if file.is_dir():
            fail("data.paths", path, "a folder, not a token file")
        if not file.is_file():
            fail("data.paths", path, "no such file")
        size = file.stat().st_size
        if size % dtype.itemsize:
            fail(
                "data.paths",
                path,
                f"{size} bytes is not a whole number of {dtype.name} tokens (this tokenizer's ids "
                f"are read as {dtype.name})",
            )
        if size // dtype.itemsize < d.sequence_length:
            fail(
                "data.paths",
                path,
                f"{size // dtype.itemsize} tokens, fewer than one sequence of "
                f"data.sequence_length={d.sequence_length}",
            )
        instances += size // dtype.itemsize // d.sequence_length
    if local and d.paths and instances < t.global_batch_size:
        fail(
            "data.paths",
            d.paths,
            f"{instances} instances of {d.sequence_length} tokens, fewer than one global batch of "
            f"{t.global_batch_size}",
        )
    keyed = [("data.paths", p) for p in files] + _mixture_files(spec) + _validation_files(spec)
    _check_token_ids(spec, fail, keyed, dtype)


def _mixture_files(spec: ExperimentSpec) -> list[tuple[str, str]]:
    """(key, path) of data.mixture's token files: its manifests' files, its paths with local globs
    expanded; a missing file is train/sources.py's to refuse, later."""
    import glob

    out = []
    for name, s in spec.data.mixture.items():
        key = f"data.mixture.{name}.{'manifest' if s.manifest else 'paths'}"
        files = token_files(spec, key, [s.manifest] if s.manifest else list(s.paths))[0]
        entries = [g for p in files for g in ([p] if "://" in p else sorted(glob.glob(p)))]
        out += [(key, p) for p in entries if "://" in p or Path(p).is_file()]
    return out


def _validation_files(spec: ExperimentSpec) -> list[tuple[str, str]]:
    """(key, path) of the local files of eval.validation_sets (token files of the run's tokenizer
    too: the evaluator reads them with the run's model); none for the demo (its own split). Those at
    a URL are not HEAD-checked: data.mix_base_dir's default is a public server."""
    e = spec.eval
    base = e.validation_base_dir or spec.data.mix_base_dir
    if spec.data.source == "demo" or not e.validation_sets or "://" in base:
        # none local (a URL base: not asked; the table of sets needs OLMo-core, hence torch)
        return []
    from ..eval.evaluators import validation_files

    paths, _ = validation_files(list(e.validation_sets), base)
    return [
        ("eval.validation_sets", p) for p in paths if Path(p).is_file()
    ]  # URLs: not HEAD-checked


def _check_token_ids(spec: ExperimentSpec, fail, files: list[tuple[str, str]], dtype) -> None:
    """Every id of every local token file (``(key, path)``) below the vocabulary, the whole file
    read (data/contract.py: cached in data.work_dir by size and modification time); every HTTP(S)
    one answering a HEAD."""
    d, vocab = spec.data, tokenizer_vocab(spec)  # <= model.vocab_size (config/spec.py)
    if (bad := unreachable([p for _, p in files])) is not None:
        key = next(k for k, p in files if p == bad[0])
        fail(key, bad[0], f"{bad[1]} (a HEAD within {HEAD_TIMEOUT_S:g} s)")
    local = [(k, p) for k, p in files if "://" not in p]
    cache = None if "://" in d.work_dir else Path(d.work_dir)
    try:
        found = max_token([p for _, p in local], dtype, cache)
    except OSError as e:
        fail(
            next((k for k, p in local if p == e.filename), "data.paths"),
            e.filename,
            f"cannot read: {e.strerror}",
        )
    for key, path in local:
        if (top := found[path]).max >= vocab:
            fail(
                key,
                path,
                f"token id {top.max} at token {top.position} >= the vocabulary's {vocab} "
                f"(data.tokenizer={d.tokenizer}, model.vocab_size={vocab_size(spec)}; {dtype.name} "
                "tokens)",
            )


def _check_tokenizer_file(spec: ExperimentSpec, fail) -> None:
    """data.tokenizer_file: a tokenizers JSON whose ids fit the model's vocabulary."""
    file = spec.data.tokenizer_file
    if not Path(file).is_file():
        fail(
            "data.tokenizer_file",
            file,
            "a folder, not a tokenizer JSON" if Path(file).is_dir() else "no such file",
        )
    try:
        ids = tokenizer_file_ids(file)
    except (OSError, ValueError) as e:
        fail("data.tokenizer_file", file, getattr(e, "strerror", None) or str(e))
    if ids > vocab_size(spec):
        fail(
            "data.tokenizer_file",
            file,
            f"{ids} token ids, more than model.vocab_size={vocab_size(spec)}",
        )


def token_files(spec: ExperimentSpec, key: str, entries: list[str]) -> tuple[list[str], str | None]:
    """``entries`` (files, globs, URLs, hourglass-tokenize folders or their manifest.json) with each
    tokenize folder replaced by its token files, and the dtype its manifests record (None: none
    read). A tokenize folder, or a file or glob of its files, is refused unless its tokenization
    finished with the config's tokenizer (its manifest's record); manifests of two dtypes too."""
    d, fail, out, dtypes = spec.data, failer(where_set(spec)), [], set()
    for entry in entries:
        if "://" in entry or (folder := tokenize_folder(entry)) is None:
            out.append(entry)
            continue
        try:
            manifest, files = read_manifest(str(folder))
        except InputError as e:
            fail(key, entry, str(e))
        from ..config.spec import tokenizer_config  # OLMo-core's special ids (torch): a manifest

        tok = tokenizer_config(spec)
        ids = (tok.vocab_size, tok.eos_token_id, tok.bos_token_id)
        if why := other_tokenizer(
            manifest, f"data.tokenizer={d.tokenizer}", *ids, d.tokenizer_file
        ):
            fail(key, entry, why)
        dtypes.add(manifest["dtype"])
        out.extend(files if Path(entry) in (folder, folder / MANIFEST) else [entry])
    if len(dtypes) > 1:
        fail(
            key,
            entries,
            f"manifests of different dtypes ({', '.join(sorted(dtypes))}): tokenize alike",
        )
    return out, dtypes.pop() if dtypes else None


def _check_init_from(source: str, fail) -> None:
    """train.init_from, before torch: a folder, and a Hugging Face model there (its config.json's
    model_type; a run checkpoint's config.json has none) an OLMo-2 one. Its weights:
    train/init_from.py."""
    path = Path(source)
    if not path.is_dir():
        fail(
            "train.init_from", source, "a file, not a folder" if path.exists() else "no such folder"
        )
    try:
        kind = json.loads((path / "config.json").read_text()).get("model_type", "olmo2")
    except (OSError, ValueError, AttributeError):  # none, or unreadable: train/init_from.py's
        return
    if kind != "olmo2":
        fail("train.init_from", source, f"a Hugging Face {kind} model, not an OLMo-2 one")
