"""``liver data prepare``: local text files as one byte-level token file (``prepare.py``)."""

from __future__ import annotations

import argparse

def _data_prepare(args: argparse.Namespace) -> int:
    from liver.data.prepare import prepare

    meta = prepare(args.files, args.out)
    print(f"{args.out}: {meta['tokens']:,} tokens ({meta['tokenizer']}, vocabulary {meta['vocab_size']}) from "
          f"{meta['file_count']} files; train on it with --set job.train.data={args.out}")
    return 0



def add_parsers(sub) -> None:
    """``liver data ...``."""
    dt = sub.add_parser("data", help="training data: a corpus for job.train.data")
    dsub = dt.add_subparsers(dest="data", required=True)
    dp = dsub.add_parser("prepare", help="local text files (or directories of them) as one byte-level token file")
    dp.add_argument("files", nargs="+", metavar="FILES")
    dp.add_argument("--out", required=True, metavar="DIR")
    dp.set_defaults(fn=_data_prepare)


__all__ = ["add_parsers"]
