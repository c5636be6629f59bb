#!/usr/bin/env python
"""Behaviour check for refactors: every zoo model (small sizes) converted under several configs,
its outputs, int8 weights, routes and saved-file round trip recorded, so that two commits can be
compared bit for bit on one machine.

    python tools/zoo_outputs.py --save before.pt      # on the commit before the change
    python tools/zoo_outputs.py --compare before.pt   # on the commit after it: exit 1 on any difference

Recorded per case: the outputs on the evaluation batches (the quantized model and, after
qbackend.save / qbackend.load, the reloaded one), each layer's provider, and every tensor of the
converted model's state (int8 weights, scales, biases). Routes and outputs depend on the CPU and
QBACKEND_ISA, so compare files written on the same machine with the same environment.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings

import torch

import qbackend
from qbackend.models import MODELS

TINY_BERT = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128, vocab_size=1000)
CASES = {
    "resnet18": dict(batch_size=2, image_size=64, num_calibration_batches=2, num_eval_batches=1, residual_gamma=0.3),
    "resnet50": dict(batch_size=1, image_size=32, num_calibration_batches=1, num_eval_batches=1, residual_gamma=0.3),
    "mobilenet_v2": dict(batch_size=2, image_size=64, num_calibration_batches=2, num_eval_batches=1,
                         residual_gamma=0.3),
    "bert_base": dict(batch_size=3, seq_len=16, num_calibration_batches=2, num_eval_batches=1, **TINY_BERT),
    "transformer_outliers": dict(batch_size=2, seq_len=16, num_calibration_batches=2, num_eval_batches=1),
    "lstm_classifier": dict(batch_size=4, seq_len=12, num_calibration_batches=2, num_eval_batches=1),
    "digits_cnn": dict(),
    "dlrm": dict(batch_size=16, rows=2000, num_calibration_batches=2, num_eval_batches=1),
}
# (label, config keyword arguments or None for the case's own mode, which models)
CONFIGS = [
    ("default", {}, None),
    ("one_provider", {"route_by_batch": False}, ("resnet18", "mobilenet_v2", "bert_base")),
    ("nearest_fused", {"weight_rounding": "nearest", "attention": "fused"}, ("bert_base", "transformer_outliers")),
    ("dynamic", {"mode": "dynamic"}, ("bert_base", "resnet18")),
    ("weight_only", {"mode": "weight_only"}, ("resnet18", "bert_base")),
    ("onednn", {"provider": "onednn"}, ("resnet18",)),
]


def _flat(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in _flat(v)]
    if hasattr(out, "to_tuple"):
        return [t for v in out.to_tuple() for t in _flat(v)]
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in _flat(v)]
    return []


def _outputs(model, batches) -> list[torch.Tensor]:
    with torch.no_grad():
        return [t.detach().clone() for b in batches for t in _flat(model(*b))]


def _state(qmodel) -> dict[str, torch.Tensor]:
    state = {}
    for name, m in qmodel.named_modules():
        packed = getattr(m, "packed", None)
        if packed is not None and hasattr(packed, "weight"):
            for attr in ("weight", "w_scales", "bias"):
                v = getattr(packed, attr, None)
                if isinstance(v, torch.Tensor):
                    state[f"{name}.packed.{attr}"] = v.clone()
        for attr, v in vars(m).items():
            if attr in ("x_scale", "x_zero_point", "out_scale", "out_zero_point", "scale", "zero_point"):
                state[f"{name}.{attr}"] = torch.tensor(float(v))
    for name, t in qmodel.state_dict().items():
        state[f"state.{name}"] = t.clone()
    return state


def _providers(qmodel) -> dict[str, str]:
    return {row["layer"]: row["provider"] for row in qbackend.explain(qmodel)}


def run_case(name: str, label: str, overrides: dict) -> dict:
    case = MODELS[name](**CASES[name])
    base = {"mode": case.mode} if case.mode != "static" else {}
    config = qbackend.QuantConfig(**{**base, **overrides})
    if config.mode == "static":
        qmodel = qbackend.quantize(case.model, case.example_inputs, case.calibration, config=config)
    else:
        qmodel = qbackend.quantize_dynamic(case.model, config=config) if config.mode == "dynamic" else \
            qbackend.quantize(case.model, case.example_inputs, case.calibration, config=config)
    outputs = _outputs(qmodel, case.evaluation)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.qb")
        qbackend.save(qmodel, path)
        loaded = qbackend.load(path)
    return {"outputs": outputs, "loaded": _outputs(loaded, case.evaluation), "state": _state(qmodel),
            "providers": _providers(qmodel)}


def collect() -> dict:
    results = {}
    for label, overrides, models in CONFIGS:
        for name in CASES:
            if models is not None and name not in models:
                continue
            key = f"{name}/{label}"
            print(f"  {key}", file=sys.stderr, flush=True)
            results[key] = run_case(name, label, overrides)
    return results


def _diff(a, b, where: str, out: list[str]) -> None:
    if isinstance(a, dict):
        if set(a) != set(b):
            out.append(f"{where}: keys differ: only before {sorted(set(a) - set(b))[:5]}, "
                       f"only after {sorted(set(b) - set(a))[:5]}")
        for k in sorted(set(a) & set(b)):
            _diff(a[k], b[k], f"{where}/{k}", out)
    elif isinstance(a, list):
        if len(a) != len(b):
            out.append(f"{where}: {len(a)} vs {len(b)} entries")
        for i, (x, y) in enumerate(zip(a, b)):
            _diff(x, y, f"{where}[{i}]", out)
    elif isinstance(a, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
            out.append(f"{where}: tensors differ ({a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)})")
    elif a != b:
        out.append(f"{where}: {a!r} vs {b!r}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--save", help="write the results to this file")
    group.add_argument("--compare", help="compare with the results in this file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    results = collect()
    if args.save:
        torch.save(results, args.save)
        print(f"wrote {args.save}: {len(results)} cases")
        return 0
    before = torch.load(args.compare, weights_only=True)
    problems: list[str] = []
    _diff(before, results, "", problems)
    for line in problems:
        print(line)
    print(f"{len(results)} cases: " + ("bit-identical" if not problems else f"{len(problems)} differences"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
