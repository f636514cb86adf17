"""Where a run's tokens come from: the tokenizer and the token files of ``data.source``; the token
files of hourglass-tokenize through their manifests (checked against the config's tokenizer), and
``data.mixture``'s sources mixed by ratio through OLMo-core's source-mixture dataset."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Tuple

import numpy as np
from olmo_core.data import TokenizerConfig
from olmo_core.distributed.utils import barrier, get_rank, is_distributed
from olmo_core.io import deterministic_glob_directory, get_file_size, is_url

from ..config import ConfigError, ExperimentSpec, tokenizer_config
from ..config.spec import demo_cache
from ..data.tokenize import dtype_for
from ..launch.data_files import token_files

__all__ = ["DataSources", "MixtureSource", "resolve_data", "mixture_plan"]


@dataclass
class MixtureSource:
    """One source of data.mixture, resolved: its files, their tokens, its share of the run's
    tokens."""

    name: str
    paths: List[str]
    tokens: int  # in its files
    ratio: float  # normalized: the sources' ratios sum to 1
    max_repetition: float


@dataclass
class DataSources:
    """Where the tokens come from, and how to read them."""

    tokenizer: TokenizerConfig
    train_paths: list[str]  # empty when a named mix is used
    val_paths: list[str]
    dtype: Optional[str] = None  # numpy dtype of the token files (None: OLMo-core infers it)
    # data.mixture's sources (train_paths empty)
    mixture: List[MixtureSource] = field(default_factory=list)


def resolve_data(spec: ExperimentSpec) -> DataSources:
    """The demo corpus is built on first use (rank 0 first, the other ranks then read its cache)."""
    d = spec.data
    if d.source == "demo":
        from ..data.demo import prepare_demo_corpus

        if is_distributed() and get_rank() != 0:
            barrier()
        corpus = prepare_demo_corpus(demo_cache(spec), vocab_size=d.demo_vocab_size)
        if is_distributed() and get_rank() == 0:
            barrier()
        tok = TokenizerConfig(
            vocab_size=corpus.vocab_size,
            eos_token_id=corpus.eos_token_id,
            pad_token_id=corpus.pad_token_id,
            identifier=corpus.tokenizer_file,
        )
        return DataSources(tok, list(corpus.train_paths), list(corpus.val_paths), corpus.dtype)
    if d.source == "olmo2_stage1":
        from ..data.order import TOKEN_DTYPE, load_pinned_list

        return DataSources(
            TokenizerConfig.dolma2(), load_pinned_list(d.base), [], np.dtype(TOKEN_DTYPE).name
        )
    if d.source == "prefix":
        from ..data.prefix import prefix_paths

        assert d.prefix_dir is not None  # validate() checked its sequence length
        return DataSources(TokenizerConfig.dolma2(), prefix_paths(Path(d.prefix_dir)), [], "uint32")
    tok = tokenizer_config(spec)
    if d.mixture:
        sources, dtype = _mixture_sources(spec)
        return DataSources(tok, [], [], dtype, sources)
    paths, dtype = token_files(spec, "data.paths", list(d.paths))
    return DataSources(tok, paths, [], dtype)


def _mixture_sources(spec: ExperimentSpec) -> Tuple[List[MixtureSource], Optional[str]]:
    """data.mixture's sources: files (globs expanded), tokens, normalized ratios."""
    total = sum(s.ratio for s in spec.data.mixture.values())
    sources, dtypes = [], set()
    for name, s in spec.data.mixture.items():
        key = f"data.mixture.{name}"
        entries = [s.manifest] if s.manifest else list(s.paths)
        files, dtype = token_files(spec, f"{key}.{'manifest' if s.manifest else 'paths'}", entries)
        if dtype:
            dtypes.add(dtype)
        expanded: List[str] = []
        for f in files:
            matches = deterministic_glob_directory(f) if "*" in f else [f]
            if not matches or (not is_url(f) and not all(Path(m).is_file() for m in matches)):
                raise ConfigError(f"{key}.paths: {f}: no such token file")
            expanded.extend(str(m) for m in matches)
        dtype = np.dtype(dtype or dtype_for(tokenizer_config(spec).vocab_size))
        tokens = sum(get_file_size(f) // dtype.itemsize for f in expanded)
        sources.append(MixtureSource(name, expanded, tokens, s.ratio / total, s.max_repetition))
    if len(dtypes) > 1:
        raise ConfigError(
            f"data.mixture: sources of different dtypes ({', '.join(sorted(dtypes))}): tokenize "
            "them alike"
        )
    return sources, dtypes.pop() if dtypes else None


def mixture_plan(
    spec: ExperimentSpec, sources: List[MixtureSource]
) -> List[Tuple[MixtureSource, int, float]]:
    """(source, tokens the run reads from it, passes over it) for the run's length; ConfigError, one
    line, for a source that cannot supply its share within its max_repetition."""
    steps = spec.steps or 0
    requested = steps * spec.train.global_batch_size * spec.data.sequence_length
    plan = []
    for s in sources:
        needed = int(requested * s.ratio)
        passes = needed / s.tokens if s.tokens else float("inf")
        if passes > s.max_repetition:
            raise ConfigError(
                f"data.mixture.{s.name}.ratio: {s.ratio:.3g} of {requested:,} tokens is "
                f"{needed:,}, {passes:.2f} passes over its {s.tokens:,}; "
                f"max_repetition={s.max_repetition:g} (raise it, lower the ratio or add data)"
            )
        plan.append((s, needed, passes))
    return plan


def check_sources(spec: ExperimentSpec) -> Optional[List[Tuple[MixtureSource, int, float]]]:
    """What resolve_data and the mixture would refuse, before a run writes anything (a ConfigError):
    manifests against the tokenizer, the mixture's sources against their ratios. The mixture's
    plan."""
    if spec.data.source != "numpy":
        return None
    data = resolve_data(spec)
    return mixture_plan(spec, data.mixture) if data.mixture else None
