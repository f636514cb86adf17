"""Tokenize text into OLMo-core token files (docs/your_data.md).

    python scripts/tokenize_data.py INPUT... --out DIR --config CONFIG [--set key=value ...]
    python scripts/tokenize_data.py INPUT... --out DIR --tokenizer tokenizer.json
                                    [--eos TOKEN] [--bos TOKEN]

INPUT: .jsonl / .jsonl.gz files (one JSON object a line, the text in --text-field), .parquet files
(the --text-field column), a Hugging Face datasets folder (save_to_disk; needs the datasets
package), a plain text file or a folder of them (each file one document).

The tokenizer is the config's (data.tokenizer: the demo BPE, or dolma2 from the local file
data.tokenizer_file), of the size the config names, or any local tokenizers JSON. Each
document is written as its ids then the EOS id, in the smallest unsigned dtype for the vocabulary,
into DIR/part-NNNNN.npy shards of about --shard-tokens tokens, and DIR/manifest.json (files,
token counts, SHA-256 checksums, the tokenizer's id) last. Ctrl-C or SIGTERM ends it in one line
(exit 130 or 143); until the manifest is written, training refuses the folder as unfinished. A rerun
skips the finished shards.

A bad input (an empty file, text that is not UTF-8, a line that is not JSON, a missing text field)
or a tokenizer that does not fit the model: one line naming the file (and line), exit 2, nothing
written.
"""

import argparse
import os
import signal
import sys
import time

from olmo_patches.cli import ArgumentParser, at_least, out_arg, refuse, refuse_alike
from olmo_patches.config import ConfigError, load_spec
from olmo_patches.config.spec import demo_cache, tokenizer_vocab
from olmo_patches.data.tokenize import InputError, TokenizerInfo, find_inputs, tokenize
from olmo_patches.resources import find_config


def config_tokenizer(args) -> tuple:
    """(tokenizers JSON, name) of the config's tokenizer, checked against its model's vocabulary."""
    try:
        spec = load_spec(find_config(args.config), args.set)
    except ConfigError as e:
        refuse_alike(f"config error: {e}")
    d = spec.data
    if d.tokenizer == "demo":
        from olmo_patches.data.demo import prepare_demo_corpus

        file = prepare_demo_corpus(demo_cache(spec), vocab_size=d.demo_vocab_size).tokenizer_file
    elif d.tokenizer_file:
        file = d.tokenizer_file
    else:
        refuse_alike(
            f"{args.config}: data.tokenizer_file: dolma2 needs a local tokenizer.json (nothing is "
            "downloaded)"
        )
    # model.vocab_size holds it (checked at load)
    return file, str(d.tokenizer), tokenizer_vocab(spec)


def _parser() -> ArgumentParser:
    parser = ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help="jsonl / jsonl.gz / parquet files, datasets or text folders",
    )
    parser.add_argument(
        "--out", required=True, metavar="DIR", help="folder for the shards and manifest.json"
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--config", metavar="CONFIG", help="use this config's tokenizer (data.tokenizer)"
    )
    which.add_argument("--tokenizer", metavar="FILE", help="any local tokenizers JSON")
    parser.add_argument(
        "--set",
        action="extend",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="--config: key=value overrides",
    )
    parser.add_argument(
        "--eos", default="<|endoftext|>", metavar="TOKEN", help="the token that ends each document"
    )
    parser.add_argument(
        "--bos",
        metavar="TOKEN",
        help="a token that starts each document (default: none, as OLMo-2)",
    )
    parser.add_argument(
        "--text-field", default="text", help="the jsonl field / parquet column holding the text"
    )
    _output_args(parser)
    return parser


def _output_args(parser: ArgumentParser) -> None:
    """The shards and the workers that write them."""
    parser.add_argument(
        "--shard-tokens",
        type=at_least(1),
        default=100_000_000,
        help="tokens per output shard, about",
    )
    parser.add_argument(
        "--workers", type=at_least(1), default=os.cpu_count() or 1, help="tokenizer processes"
    )
    parser.add_argument(
        "--batch-docs", type=at_least(1), default=256, help="documents per worker task"
    )


def _tokenizer_and_inputs(args) -> tuple:
    """(tokenizer, its name, inputs), checked before anything is written: one line, exit 2."""
    if args.config:
        file, name, expected = config_tokenizer(args)
    else:
        file, name, expected = args.tokenizer, "file", None
    try:
        info = TokenizerInfo.from_file(file, args.eos, args.bos)
        if expected is not None and info.vocab_size != expected:
            raise InputError(
                f"{file}: {info.vocab_size} tokens, but data.tokenizer={name} has {expected}"
            )
        return info, name, find_inputs(args.inputs)
    except InputError as e:
        refuse_alike(str(e))


def _progress():
    """A rich progress bar on stderr: documents done of all, tokens and tokens/s, time left."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        TextColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text

    class TokensPerSecond(ProgressColumn):
        def render(self, task) -> Text:
            tokens, elapsed = task.fields.get("tokens", 0), task.elapsed or 0
            return Text(f"{tokens:,} tokens, {tokens / elapsed if elapsed else 0:,.0f} tokens/s")

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TokensPerSecond(),
        TimeRemainingColumn(),
    )
    return Progress(*columns, console=Console(stderr=True))


def main() -> None:
    args = _parser().parse_args()
    out = out_arg("--out", args.out)
    info, name, inputs = _tokenizer_and_inputs(args)
    start = time.perf_counter()
    signal.signal(signal.SIGTERM, _stop)
    try:
        manifest = tokenize(
            inputs,
            out,
            info,
            name=name,
            field=args.text_field,
            shard_tokens=args.shard_tokens,
            workers=args.workers,
            batch_docs=args.batch_docs,
            progress=_progress(),
        )
    except InputError as e:
        refuse_alike(str(e))
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (_stop): the finished shards stay
        name = signal.Signals(e.args[0] if e.args else signal.SIGINT)
        refuse(
            f"{out}: interrupted ({name.name}), unfinished: rerun the same command to resume",
            128 + name,
        )
    seconds = time.perf_counter() - start
    print(
        f"{out}: {manifest['tokens']:,} tokens, {manifest['documents']:,} documents in "
        f"{len(manifest['files'])} shards ({manifest['dtype']}, tokenizer "
        f"{manifest['tokenizer']['sha256'][:12]}); {seconds:.1f} s",
        file=sys.stderr,
    )


def _stop(signum, frame) -> None:
    raise KeyboardInterrupt(signum)


if __name__ == "__main__":
    main()
