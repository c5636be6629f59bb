"""`qbackend explain FILE`: per layer of a saved model, what it is, where it runs here and why."""
from __future__ import annotations

import argparse
import warnings

from ..dispatch import cpu_features
from ..report import explain
from ..serialization import load


def run(args: argparse.Namespace) -> int:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        qmodel = load(args.path, allow_pickle=args.allow_pickle)
    saved = getattr(qmodel, "qbackend_saved_on", None) or {}
    f = cpu_features()
    print(f"{args.path}: saved on {saved.get('model') or '?'} ({saved.get('isa_class', '?')}); "
          f"routed here for {f.model_name or '?'} ({f.isa_class})")
    for w in caught:
        if type(w.message).__module__.startswith("qbackend"):
            print(f"note: {w.message}")
    print(explain(qmodel).to_markdown())
    return 0


def add_parser(sub) -> None:
    e = sub.add_parser("explain", help="per layer of a saved model (qbackend.save): op, shapes, provider, why")
    e.add_argument("path", help="a file written by qbackend.save")
    e.add_argument("--allow-pickle", action="store_true",
                   help="also read format-1 files, which unpickle a model (can run code from the file)")
