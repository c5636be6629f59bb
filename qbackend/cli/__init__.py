"""The `qbackend` command line (also `python -m qbackend`): `info`, `explain`, `upgrade`, `demo`,
`compare` and `llm`, one module per command (each with `add_parser(subparsers)` and `run(args) -> exit code`).

    qbackend info                                   # CPU features and the provider each op kind would use
    qbackend info model.qb                          # a saved model's file: versions, CPU, layers (not built)
    qbackend explain model.qb                       # per layer of a saved model: provider and why here
    qbackend upgrade old.qb new.qb                  # a format-1 (pickled) model file rewritten as format 2
    qbackend demo [--json FILE]                     # digits CNN: FP32 vs INT8 top-1, latency, size
    qbackend compare examples.digits_case:case [--json FILE] [--plot FILE.png] [--max-drop X]
    qbackend llm [--model DIR | --random] [--weights int4] [--activations int8]   # a causal LM, in place

`compare` imports a user function (``package.module:function``, or ``path/to/file.py:function``;
the current directory and every ``--path`` are put on sys.path first) returning
``(model, example_inputs, calibration_data, eval_data, metric_or_None)``, quantizes the model
(calibration with a progress bar; with ``--max-drop`` the accuracy-budgeted fallback keeps the
most sensitive layers in FP32), and prints ``qbackend.compare``'s per-layer SQNR, output error and
metric as a table. Exit codes: 0 done, 2 bad arguments or a failing user function (one line on
stderr; ``--traceback`` for the whole traceback), 3 the ``--max-drop`` budget was not met (the
best model found is still reported).
"""
from __future__ import annotations

import argparse
import sys

from . import compare, demo, explain, info, llm, upgrade
from .common import CliError

COMMANDS = {"info": info, "explain": explain, "upgrade": upgrade, "demo": demo, "compare": compare, "llm": llm}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="qbackend", description="x86 INT8 quantization backend for PyTorch")
    sub = p.add_subparsers(dest="command", required=True)
    for command in COMMANDS.values():
        command.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command].run(args)
    except (CliError, ValueError, TypeError, FileNotFoundError) as exc:
        if getattr(args, "traceback", False):
            raise
        print(f"qbackend {args.command}: error: {exc}", file=sys.stderr)
        return 2
