#!/usr/bin/env python
"""The OLMo-2 1B data order: size manifest, global indices, and the ordered prefix on disk.

  manifest     byte size of every listed file (parallel HEAD), cached as JSON
  indices      the global order, byte-identical to the old trainer's global_indices.npy
  materialize  the first N instances (or T tokens) in training order, to local part files
  verify       re-hash a materialized prefix; optionally compare samples with the remote files

Without --paths-file the pinned list data_order/olmo2-1b-stage1.txt is used (and its
sha256 checked). --base reads the files from a mirror: the same relative paths under a local
folder or URL instead of http://olmo-data.org; manifests and prefixes stay mirror-independent.
Errors are one line on stderr and a non-zero exit.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from olmo_patches.cli import ArgumentParser, at_least, folder_arg, out_arg, refuse  # noqa: E402
from olmo_patches.data.order import (  # noqa: E402
    GLOBAL_BATCH_INSTANCES,
    OLD_TRAINER_SEED,
    PINNED_LIST,
    PINNED_MANIFEST,
    PINNED_ORIGIN,
    SEQ_LEN,
    DataOrderError,
    Layout,
    read_paths_file,
    rebase,
    write_global_indices,
)
from olmo_patches.data.prefix import (  # noqa: E402
    PrefixSpec,
    instances_for_tokens,
    materialize,
    verify_prefix,
)
from olmo_patches.data.remote import (
    RangeReader,
    RetryPolicy,
    fetch_sizes,
    load_manifest,
    save_manifest,
)  # noqa: E402


def _sizes(args: argparse.Namespace, paths: list[str], reader: RangeReader) -> list[int]:
    """Sizes from --manifest; for the pinned list, from its cached manifest (built on first
    use); otherwise asked for now (from the mirror under --base if given). A manifest lists
    the paths as the list names them, so it serves every mirror."""
    if args.manifest is not None:
        return load_manifest(Path(args.manifest), paths)
    pinned = Path(args.paths_file).resolve() == PINNED_LIST.resolve()
    if pinned and PINNED_MANIFEST.is_file():
        return load_manifest(PINNED_MANIFEST, paths)
    sizes = fetch_sizes(
        rebase(paths, args.base), reader, workers=args.workers, progress=not args.quiet
    )
    if pinned:
        save_manifest(PINNED_MANIFEST, paths, sizes)
    return sizes


def cmd_manifest(args: argparse.Namespace, reader: RangeReader) -> None:
    paths = args.paths
    out = Path(args.out) if args.out else PINNED_MANIFEST
    sizes = fetch_sizes(
        rebase(paths, args.base), reader, workers=args.workers, progress=not args.quiet
    )
    save_manifest(out, paths, sizes)
    n = Layout.from_sizes(paths, sizes, SEQ_LEN).num_instances
    print(f"{out}: {len(paths)} files, {sum(sizes) // 4:,} tokens, {n:,} instances of {SEQ_LEN}")


def cmd_indices(args: argparse.Namespace, reader: RangeReader) -> None:
    paths = args.paths
    layout = Layout.from_sizes(paths, _sizes(args, paths, reader), args.seq_len)
    written = write_global_indices(
        Path(args.out),
        layout.num_instances,
        args.seed,
        world_size=args.world_size,
        npy_header=args.npy_header,
    )
    print(f"{args.out}: {written:,} of {layout.num_instances:,} instances, seed {args.seed}")


def cmd_materialize(args: argparse.Namespace, reader: RangeReader) -> None:
    paths = args.paths
    sizes = _sizes(args, paths, reader)
    # --instances is >= 1
    n = args.instances or instances_for_tokens(int(args.tokens), args.seq_len, args.batch_instances)
    spec = PrefixSpec(tuple(paths), tuple(sizes), args.seq_len, args.seed, n, args.chunk_instances)
    materialize(
        Path(args.out),
        spec,
        reader=reader,
        workers=args.workers,
        progress=not args.quiet,
        base=args.base,
    )
    print(f"{args.out}: {n:,} instances ({n * args.seq_len:,} tokens) in {spec.num_chunks} parts")


def cmd_verify(args: argparse.Namespace, reader: RangeReader) -> None:
    problems = verify_prefix(Path(args.out), reader=reader, sample=args.sample, base=args.base)
    if problems:
        raise DataOrderError(f"{args.out}: {len(problems)} problem(s), first: {problems[0]}")
    print(f"{args.out}: ok")


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("manifest", help="byte size of every file")
    _common(p)
    p.add_argument("--out", default=None, help=f"default: {PINNED_MANIFEST}")
    _indices_args(sub.add_parser("indices", help="the global order as the old trainer writes it"))
    _materialize_args(
        sub.add_parser("materialize", help="the first instances in training order, to local disk")
    )
    p = sub.add_parser("verify", help="check a materialized prefix")
    _common(p, paths=False)
    p.add_argument(
        "--sample",
        type=at_least(0),
        default=0,
        help="also compare this many instances with the remote files",
    )
    p.add_argument("--out", required=True)
    return parser


def _common(p: argparse.ArgumentParser, paths: bool = True) -> None:
    """Every command's options: the listed files (``paths``), the mirror and the requests."""
    if paths:
        p.add_argument(
            "--paths-file", default=str(PINNED_LIST), help="token files, one path or URL a line"
        )
        p.add_argument(
            "--manifest", default=None, help="size manifest (JSON) to use instead of asking"
        )
    p.add_argument(
        "--base",
        default=None,
        help=f"a mirror (local folder or URL) replacing {PINNED_ORIGIN} in the listed paths",
    )
    p.add_argument("--workers", type=at_least(1), default=32, help="parallel connections")
    p.add_argument("--retries", type=at_least(1), default=5, help="attempts per request")
    p.add_argument(
        "--timeout", type=at_least(0.001, float), default=60.0, help="seconds per request"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _indices_args(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument("--seq-len", type=at_least(1), default=SEQ_LEN)
    p.add_argument(
        "--seed",
        type=at_least(0, most=2**32 - 1),
        default=OLD_TRAINER_SEED,
        help="old-trainer seed (OLMo-core seed + 1)",
    )
    p.add_argument(
        "--world-size",
        type=at_least(1),
        default=1,
        help="the run's world size (drop_last truncation)",
    )
    p.add_argument(
        "--npy-header",
        action="store_true",
        help="standard .npy instead of the trainer's raw uint32",
    )
    p.add_argument("--out", required=True)


def _materialize_args(p: argparse.ArgumentParser) -> None:
    _common(p)
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument(
        "--tokens",
        type=at_least(1, float),
        help="tokens to cover (e.g. 2.5e9); rounded up to whole global batches",
    )
    size.add_argument("--instances", type=at_least(1), help="exact number of instances")
    p.add_argument("--seq-len", type=at_least(1), default=SEQ_LEN)
    p.add_argument("--seed", type=at_least(0, most=2**32 - 1), default=OLD_TRAINER_SEED)
    p.add_argument("--batch-instances", type=at_least(1), default=GLOBAL_BATCH_INSTANCES)
    p.add_argument(
        "--chunk-instances", type=at_least(1), default=2048, help="instances per part file"
    )
    p.add_argument("--out", required=True)


def check_paths(args: argparse.Namespace) -> None:
    """The files and folders the command reads and writes, before any request: one line, exit 2."""
    for name, path in (
        ("--paths-file", getattr(args, "paths_file", None)),
        ("--manifest", getattr(args, "manifest", None)),
    ):
        # /dev/null is a file to read
        if path is not None and (Path(path).is_dir() or not Path(path).exists()):
            refuse(
                f"data_order.py {args.command}: {name} {path}: "
                f"{'a folder, not a file' if Path(path).is_dir() else 'no such file'}"
            )
    if getattr(args, "paths_file", None) is not None:
        try:
            # an empty or changed list: before any request
            args.paths = read_paths_file(Path(args.paths_file))
        except (DataOrderError, OSError, UnicodeDecodeError) as e:
            refuse(f"data_order.py {args.command}: --paths-file: {' '.join(str(e).split())}")
    # local files: there
    if getattr(args, "paths", None) and getattr(args, "manifest", None) is None:
        try:
            local = [p for p in rebase(args.paths, args.base) if "://" not in p]
        except DataOrderError as e:
            refuse(f"data_order.py {args.command}: --base: {e}")
        if (missing := next((p for p in local if not Path(p).is_file()), None)) is not None:
            refuse(
                f"data_order.py {args.command}: --paths-file: token file {missing}: no such file"
            )
    if args.base is not None and "://" not in args.base:
        folder_arg(f"data_order.py {args.command}: --base", args.base)
    if args.command == "verify":
        folder_arg("data_order.py verify: --out", args.out)
    elif args.out is not None:
        out_arg(
            f"data_order.py {args.command}: --out", args.out, folder=args.command == "materialize"
        )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    check_paths(args)
    reader = RangeReader(RetryPolicy(attempts=args.retries, timeout_s=args.timeout))
    command = {
        "manifest": cmd_manifest,
        "indices": cmd_indices,
        "materialize": cmd_materialize,
        "verify": cmd_verify,
    }
    try:
        command[args.command](args, reader)
    except (DataOrderError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
