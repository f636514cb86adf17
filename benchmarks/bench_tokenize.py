"""hourglass-tokenize's rate against the tokenizers library's own batch encoding, side by side.

    python benchmarks/bench_tokenize.py [--megabytes 8] [--workers N] [--repeats 3]

The text is the demo corpus's (the interpreter's standard library source, one document a file, as a
jsonl) and the tokenizer the demo BPE (4096 tokens; built once into the demo cache). The reference
is ``Tokenizer.encode_batch`` over all the documents in memory (Rust threads on every core), without
EOS or writing; hourglass-tokenize is the whole job: reading and checking the jsonl, encoding in
--workers processes, EOS, shards with checksums, the manifest. Printed: tokens/s of each (the best
of --repeats) and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from olmo_patches.config.spec import default_demo_cache  # noqa: E402
from olmo_patches.data.demo import prepare_demo_corpus  # noqa: E402
from olmo_patches.data.tokenize import TokenizerInfo, find_inputs, tokenize  # noqa: E402


def _documents(megabytes: float) -> list[str]:
    docs, size = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        docs.append(text)
        size += len(text.encode())
        if size >= megabytes * 2**20:
            break
    return docs


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--megabytes", type=float, default=8, help="text to tokenize")
    parser.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1, help="hourglass-tokenize's processes"
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs of each (the best is printed)")
    args = parser.parse_args()

    from tokenizers import Tokenizer

    corpus = prepare_demo_corpus(default_demo_cache(), vocab_size=4096)
    docs = _documents(args.megabytes)
    tok = Tokenizer.from_file(corpus.tokenizer_file)
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "docs.jsonl"
        source.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
        info = TokenizerInfo.from_file(corpus.tokenizer_file)
        library, ours = [], []
        for i in range(args.repeats):
            start = time.perf_counter()
            tokens = sum(len(e.ids) for e in tok.encode_batch(docs, add_special_tokens=False))
            library.append(tokens / (time.perf_counter() - start))
            start = time.perf_counter()
            manifest = tokenize(
                find_inputs([str(source)]),
                Path(tmp) / f"out{i}",
                info,
                name="demo",
                workers=args.workers,
            )
            ours.append(manifest["tokens"] / (time.perf_counter() - start))
    mb = sum(len(d.encode()) for d in docs) / 2**20
    print(
        f"{len(docs):,} documents, {mb:.1f} MiB, {tokens:,} tokens (+{len(docs):,} EOS);"
        f" {os.cpu_count()} cores"
    )
    print(
        f"tokenizers encode_batch (in memory, every core):        {max(library):>12,.0f} tokens/s"
    )
    print(
        f"hourglass-tokenize, {args.workers} workers (jsonl in, shards out):"
        f" {max(ours):>12,.0f} tokens/s"
    )
    print(f"ratio: {max(ours) / max(library):.2f}")


if __name__ == "__main__":
    main()
