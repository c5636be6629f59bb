"""`qbackend upgrade OLD NEW`: rewrite a format-1 model file (a pickled model) as format 2, which
loads without running code. Unpickles OLD: run it only on files you trust."""
from __future__ import annotations

import argparse
import warnings

from ..serialization import PickleFileWarning, inspect_file, upgrade_file


def run(args: argparse.Namespace) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PickleFileWarning)  # the command's own help says it unpickles
        upgrade_file(args.old, args.new)
    info = inspect_file(args.new)
    print(f"{args.old} -> {args.new}: model format {info['version']}, {info['tensors']} tensors "
          f"({info['tensor_bytes']:,} bytes), {len(info['layers'] or [])} layers")
    return 0


def add_parser(sub) -> None:
    u = sub.add_parser("upgrade", help="rewrite a format-1 (pickled) model file as format 2 (loads without running "
                                       "code); unpickles OLD, so only for files you trust")
    u.add_argument("old", help="a model file written by qbackend before model format 2")
    u.add_argument("new", help="where to write the format-2 file")
