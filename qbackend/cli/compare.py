"""`qbackend compare FUNCTION`: import a user function returning (model, example_inputs,
calibration_data, eval_data, metric_or_None), quantize the model (calibration with a progress
bar; with --max-drop the accuracy-budgeted fallback keeps the most sensitive layers in FP32) and
print qbackend.compare's per-layer SQNR, output error and metric (rich tables, or markdown),
optionally as JSON and a plot."""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib
import importlib.util
import json
import os
import sys
import warnings

import torch

from ..api import quantize
from ..lowering.convert import FP32FallbackWarning
from ..report import BudgetWarning, compare
from .common import TRACEBACK_HINT, CliError, describe, quiet_torch

CASE_SHAPE = "(model, example_inputs, calibration_data, eval_data, metric_or_None)"


def _import_user_module(module: str, paths: list[str]):
    for p in [os.getcwd(), *paths][::-1]:
        p = os.path.abspath(p)
        if p in sys.path:
            sys.path.remove(p)
        sys.path.insert(0, p)
    if module.endswith(".py") or os.sep in module:
        if not os.path.isfile(module):
            raise CliError(f"cannot import {module}: no such file")
        name = "_qbackend_user_" + os.path.splitext(os.path.basename(module))[0].replace("-", "_")
        spec = importlib.util.spec_from_file_location(name, module)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except Exception as exc:
            raise CliError(f"importing {module} failed: {describe(exc)}") from exc
        return mod
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
            where = ", ".join(["the current directory", *(f"--path {p}" for p in paths)])
            raise CliError(f"cannot import {module}: no module named {exc.name!r} (looked in {where} and "
                           f"sys.path)") from exc
        raise CliError(f"importing {module} failed: {describe(exc)}") from exc
    except Exception as exc:
        raise CliError(f"importing {module} failed: {describe(exc)}") from exc


def _is_batches(obj) -> bool:
    return obj is not None and not isinstance(obj, (torch.Tensor, str, bytes, dict)) and hasattr(obj, "__iter__")


def load_case(spec: str, paths: list[str] | None = None) -> tuple:
    """Import `package.module:function` (or `file.py:function`), call it, check that it returned
    (model, example_inputs, calibration_data, eval_data, metric_or_None). Raises CliError with a
    one-line message otherwise."""
    module, sep, fn_name = spec.rpartition(":")
    if not sep or not module or not fn_name or not fn_name.isidentifier():
        raise CliError(f"{spec!r}: expected package.module:function (e.g. examples.digits_case:case), the "
                       f"function returning {CASE_SHAPE}")
    mod = _import_user_module(module, list(paths or []))
    fn = getattr(mod, fn_name, None)
    if fn is None:
        names = [n for n, v in vars(mod).items() if callable(v) and not n.startswith("_")]
        close = difflib.get_close_matches(fn_name, names, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise CliError(f"module {module} has no function {fn_name!r}{hint}")
    if not callable(fn):
        raise CliError(f"{spec} is not callable (a {type(fn).__name__} object)")
    try:
        out = fn()
    except Exception as exc:
        raise CliError(f"{spec}() raised {describe(exc)}") from exc
    if not isinstance(out, (tuple, list)):
        raise CliError(f"{spec}() returned a {type(out).__name__}; expected a tuple {CASE_SHAPE}")
    if len(out) != 5:
        raise CliError(f"{spec}() returned {len(out)} values; expected 5: {CASE_SHAPE}")
    model, example_inputs, calibration, evaluation, metric = out
    if not isinstance(model, torch.nn.Module):
        raise CliError(f"{spec}(): model (value 1 of 5) must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(example_inputs, (torch.Tensor, tuple, list)):
        raise CliError(f"{spec}(): example_inputs (value 2 of 5) must be a tensor or a tuple of the model's "
                       f"positional inputs, got {type(example_inputs).__name__}")
    for i, (what, data) in enumerate((("calibration_data", calibration), ("eval_data", evaluation)), start=3):
        if not _is_batches(data):
            hint = " (wrap one batch in a list: [tensor])" if isinstance(data, torch.Tensor) else ""
            raise CliError(f"{spec}(): {what} (value {i} of 5) must be an iterable of batches (tensors, tuples "
                           f"or dicts), got {type(data).__name__}{hint}")
    if metric is not None and not callable(metric):
        raise CliError(f"{spec}(): metric (value 5 of 5) must be None or a function model -> float, got "
                       f"{type(metric).__name__}")
    return model, example_inputs, calibration, evaluation, metric


class _Progress:
    """Iterate `data` with a tqdm bar on stderr (a new bar on every pass; no bar if disabled)."""

    def __init__(self, data, desc: str, enabled: bool):
        self.data, self.desc, self.enabled = data, desc, enabled

    def __len__(self):
        return len(self.data)

    def __iter__(self):
        if not self.enabled:
            yield from self.data
            return
        from tqdm import tqdm

        total = len(self.data) if hasattr(self.data, "__len__") else None
        with tqdm(self.data, desc=self.desc, total=total, unit="batch", file=sys.stderr, dynamic_ncols=True,
                  leave=False) as bar:
            yield from bar


def _fmt_db(x) -> str:
    if x is None:
        return "-"
    x = float(x)
    return "inf" if x == float("inf") else f"{x:.1f}"


def _layer_rows(result, kept: list[str], model=None) -> list[dict]:
    """One row per layer in graph order; rank 1 = most sensitive; FP32-kept layers marked (and
    added, without SQNR, if the result does not list them, at their place in the model's module
    order)."""
    rank = {l.name: i for i, l in enumerate(result.ranked(), start=1)}
    rows = []
    for l in result.layers:
        rows.append({"layer": l.name, "kind": l.kind, "provider": l.provider, "sqnr_db": l.sqnr_db,
                     "local_sqnr_db": l.local_sqnr_db, "rank": rank.get(l.name), "kept_fp32": l.name in kept})
    listed = {r["layer"] for r in rows}
    extra = [{"layer": n, "kind": "-", "provider": "fp32", "sqnr_db": None, "local_sqnr_db": None, "rank": None,
              "kept_fp32": True} for n in kept if n not in listed]
    if not extra:
        return rows
    order = {n: i for i, (n, _) in enumerate(model.named_modules())} if model is not None else {}
    if not all(r["layer"].split("@")[0] in order for r in rows + extra):
        return rows + extra
    return sorted(rows + extra, key=lambda r: order[r["layer"].split("@")[0]])  # stable: calls of one module


def _print_rich(result, rows: list[dict], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(100, Console().width), highlight=False)
    console.print(f"[bold]{title}[/bold]: INT8 vs FP32 per layer, graph order (dB, higher is better; rank 1 = "
                  "most sensitive)", soft_wrap=True)
    t = Table()
    for col, kw in (("layer", {}), ("op", {}), ("provider", {}), ("SQNR vs FP32", {"justify": "right"}),
                    ("layer's own SQNR", {"justify": "right"}), ("rank", {"justify": "right"})):
        t.add_column(col, **kw)
    for r in rows:
        t.add_row(r["layer"] + (" (kept FP32)" if r["kept_fp32"] else ""), r["kind"], r["provider"],
                  _fmt_db(r["sqnr_db"]), _fmt_db(r["local_sqnr_db"]), str(r["rank"] or "-"),
                  style="dim" if r["kept_fp32"] else None)
    console.print(t)
    o = result.output
    cols = {"output SQNR (dB)": _fmt_db(o.sqnr_db), "max abs error": f"{o.max_abs_error:.4g}",
            "cosine": f"{o.cosine:.6f}"}
    if o.nonfinite_fp32 or o.nonfinite_int8:
        cols.update({"non-finite FP32": str(o.nonfinite_fp32), "non-finite INT8": str(o.nonfinite_int8)})
    if result.metric:
        m = result.metric
        cols.update({"metric FP32": f"{m['fp32']:.4g}", "metric INT8": f"{m['int8']:.4g}",
                     "metric drop": f"{m['drop']:.4g}"})
    t = Table()
    for col in cols:
        t.add_column(col, justify="right")
    t.add_row(*cols.values())
    console.print(t)


def _plot(result, rows: list[dict], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["layer"] for r in rows]
    finite = [float(r[k]) for r in rows for k in ("sqnr_db", "local_sqnr_db")
              if r[k] is not None and float(r[k]) != float("inf")]
    top = max(finite + [1.0]) * 1.1
    fig, ax = plt.subplots(figsize=(9, max(2.5, 0.28 * len(rows) + 1.6)))
    y = list(range(len(rows)))
    for i, r in enumerate(rows):
        if r["kept_fp32"]:
            ax.barh(i, top, color="0.85", hatch="//", edgecolor="0.5",
                    label="kept FP32" if "kept FP32" not in ax.get_legend_handles_labels()[1] else None)
            ax.text(top * 0.02, i, "kept FP32", va="center", fontsize=8)
            continue
        s = r["sqnr_db"]
        ax.barh(i, top if s is None or float(s) == float("inf") else float(s), color="tab:blue",
                label="SQNR vs FP32 at the layer" if "SQNR vs FP32 at the layer" not in
                ax.get_legend_handles_labels()[1] else None)
        if r["local_sqnr_db"] is not None and float(r["local_sqnr_db"]) != float("inf"):
            ax.plot(float(r["local_sqnr_db"]), i, "o", color="tab:orange", markersize=4,
                    label="the layer's own SQNR" if "the layer's own SQNR" not in
                    ax.get_legend_handles_labels()[1] else None)
    ax.set_yticks(y, names, fontsize=8 if len(rows) < 40 else 6)
    ax.invert_yaxis()
    ax.set_xlabel("SQNR vs FP32 (dB, higher is better)")
    o = result.output
    ax.set_title(f"{title}: per-layer SQNR (output {_fmt_db(o.sqnr_db)} dB)", fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _print_warnings(caught, fallback_mode: bool) -> None:
    """The warnings of quantize, one line each on stderr, each message once. With --max-drop, the
    budget warning and the lists of ops left in FP32 by the fallback's conversions are left out:
    the result line says both (without --max-drop, the list names the ops with no INT8 kernel)."""
    seen = set()
    for w in caught:
        if fallback_mode and issubclass(w.category, (BudgetWarning, FP32FallbackWarning)):
            continue
        text = str(w.message)
        if text not in seen:
            seen.add(text)
            print(f"warning: {text}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise CliError("--plot needs matplotlib: pip install matplotlib (or install qbackend with its 'cli' "
                           "extra)") from None
    if args.max_drop is not None and not args.max_drop >= 0:
        raise CliError(f"--max-drop must be >= 0 (metric points the INT8 model may lose), got {args.max_drop}")
    if args.threads is not None:
        if args.threads < 1:
            raise CliError(f"--threads must be positive, got {args.threads}")
        torch.set_num_threads(args.threads)

    model, example_inputs, calibration, evaluation, metric = load_case(args.function, args.path)
    if args.max_drop is not None and metric is None:
        raise CliError(f"--max-drop needs a metric: {args.function}() returned metric_or_None = None")

    progress = not args.no_progress
    kwargs = {"eval_fn": metric, "max_drop": args.max_drop} if args.max_drop is not None else {}
    try:
        with quiet_torch(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)  # torch's, not ours
            qmodel = quantize(model, example_inputs, _Progress(calibration, "calibrating", progress),
                                       **kwargs)
    except (CliError, KeyboardInterrupt):
        raise
    except Exception as exc:
        raise CliError(f"quantizing failed: {describe(exc)}{TRACEBACK_HINT}") from exc
    _print_warnings(caught, fallback_mode=args.max_drop is not None)
    fallback = getattr(qmodel, "qbackend_fallback", None) if args.max_drop is not None else None
    kept = list(fallback.kept_fp32) if fallback is not None else []

    try:
        with quiet_torch():
            result = compare(model, qmodel, evaluation, metric=metric, progress=progress)
    except Exception as exc:
        raise CliError(f"comparing failed: {describe(exc)}{TRACEBACK_HINT}") from exc

    rows = _layer_rows(result, kept, model)
    if args.markdown:
        print(result.to_markdown())
    else:
        try:
            _print_rich(result, rows, args.function)
        except ImportError:
            print(result.to_markdown())
    ranked = [l for l in result.ranked() if l.local_sqnr_db is not None][:3]
    if ranked:
        print("most sensitive (the layer's own SQNR): " +
              ", ".join(f"{l.name} ({_fmt_db(l.local_sqnr_db)} dB)" for l in ranked))
    for note in getattr(result, "notes", None) or []:
        print(f"note: {note}")
    status = 0
    if fallback is not None:
        print(f"fallback (--max-drop {args.max_drop:g}): metric FP32 {fallback.fp32_metric:.4g}, INT8 "
              f"{fallback.int8_metric:.4g} (drop {fallback.fp32_metric - fallback.int8_metric:.4g}) with "
              f"{len(kept)} layer{'s' if len(kept) != 1 else ''} kept in FP32{': ' + ', '.join(kept) if kept else ''}; "
              f"budget {'met' if fallback.met else 'NOT met (the best model found is reported)'}")
        lat = getattr(fallback, "latency_ms", None) or {}
        if "fp32" in lat and "returned" in lat:
            print(f"latency on the example inputs: FP32 {lat['fp32']:.3f} ms, returned model {lat['returned']:.3f} ms "
                  f"({lat['fp32'] / lat['returned']:.2f}x)")
        status = 0 if fallback.met else 3

    if args.json:
        payload = json.loads(result.to_json())
        if fallback is not None:
            payload["fallback"] = dataclasses.asdict(fallback)
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=2, default=str)
        print(f"wrote {args.json}")
    if args.plot:
        _plot(result, rows, args.plot, args.function)
        print(f"wrote {args.plot}")
    return status


def add_parser(sub) -> None:
    c = sub.add_parser("compare", help="quantize a model named as package.module:function and report INT8 vs "
                                       "FP32 per layer and on the user's metric",
                       description="FUNCTION (package.module:function or file.py:function) takes no arguments "
                                   f"and returns {CASE_SHAPE}; batches are tensors, tuples of positional inputs "
                                   "or dicts of keyword inputs; the metric maps a model to a float, higher is "
                                   "better. The current directory is put on sys.path.")
    c.add_argument("function", metavar="FUNCTION", help="e.g. examples.digits_case:case")
    c.add_argument("--path", action="append", default=[], metavar="DIR",
                   help="also import from DIR (before the current directory; repeatable)")
    c.add_argument("--max-drop", type=float, default=None, metavar="X",
                   help="accuracy budget: keep the most sensitive layers in FP32 until the metric drops by at "
                        "most X (needs a metric); exit code 3 if it cannot be met")
    c.add_argument("--json", metavar="FILE", help="write the result to FILE (qbackend.compare(...).to_json(); with --max-drop "
                                                    "also the fallback's report under \"fallback\")")
    c.add_argument("--plot", metavar="FILE.png", help="draw the per-layer SQNR (needs matplotlib)")
    c.add_argument("--markdown", action="store_true", help="print markdown tables (the default is rich's, "
                                                           "when rich is installed)")
    c.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    c.add_argument("--no-progress", action="store_true", help="no progress bars")
    c.add_argument("--traceback", action="store_true", help="on errors, show the whole traceback")
