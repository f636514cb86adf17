"""Where a run's tokens come from: the tokenizer and the token files of ``data.source``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
from olmo_core.data import TokenizerConfig
from olmo_core.distributed.utils import barrier, get_rank, is_distributed

from ..config import ExperimentSpec
from ..config.spec import demo_cache

__all__ = ["DataSources", "resolve_data"]


@dataclass
class DataSources:
    """Where the tokens come from, and how to read them."""

    tokenizer: TokenizerConfig
    train_paths: list[str]  # empty when a named mix is used
    val_paths: list[str]
    dtype: Optional[str] = None  # numpy dtype of the token files (None: OLMo-core infers it)


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
    tok = TokenizerConfig.dolma2()
    if d.source == "olmo2_stage1":
        from ..data.order import TOKEN_DTYPE, load_pinned_list

        return DataSources(tok, load_pinned_list(d.base), [], np.dtype(TOKEN_DTYPE).name)
    if d.source == "prefix":
        from ..data.prefix import prefix_paths

        assert d.prefix_dir is not None  # validate() checked its sequence length
        return DataSources(tok, prefix_paths(Path(d.prefix_dir)), [], "uint32")
    return DataSources(tok, list(d.paths), [])
