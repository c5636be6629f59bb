"""PT2E with torchao's X86InductorQuantizer as a peer (benchmarks only; an optional dependency:
``pip install torchao``, see the ``bench`` extra in setup.py).

The flow of the PyTorch "PT2E quantization with X86 backend through Inductor" tutorial:

- ``export_model(model, example_inputs)``: ``torch.export.export(..., strict=True)`` with a dynamic
  batch dimension, ``.module()``. Strict (TorchDynamo) export because with the default non-strict
  export the quantizer's annotation fails on models that call ONE nn.ReLU module at several sites
  (torchvision's ResNet blocks do): "ValueError: Input partition has more than one output node".
  Dead code is removed from the graph (see export_model).
- ``quantize_exported(gm, calibration)``: ``prepare_pt2e`` with ``X86InductorQuantizer`` and
  ``get_default_x86_inductor_quantization_config()`` (static, per-channel int8 weights, u8
  activations with HistogramObserver), one forward per calibration batch, ``convert_pt2e``,
  ``move_exported_model_to_eval``.
- ``compile_model(gm)``: ``torch.compile`` with Inductor and freezing. The int8 lowering (qconv /
  qlinear with fused post-ops through oneDNN) consists of Inductor *freezing* patterns, which
  torchao registers when its quantizer module is imported; it needs
  ``torch._inductor.config.freezing = True`` set GLOBALLY (``enable_freezing()``): with
  ``torch.compile(options={"freezing": True})`` compilation fails on torch 2.13 + torchao 0.18
  ("UnsupportedOperatorException: onednn.qconv_prepack.default"). Run it under ``torch.no_grad()``.
"""
from __future__ import annotations

import warnings

import torch
from torch import nn

REQUIRES = "torchao"


def version() -> str:
    import torchao

    return torchao.__version__


def enable_freezing() -> None:
    """Inductor freezing for every later torch.compile of this process (the int8 patterns need it)."""
    import torch._inductor.config as inductor_config

    inductor_config.freezing = True


def _quietly_import_quantizer():
    # torchao prints "Failed to load ..." for its CUDA extensions on a CPU-only machine; harmless.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq
        from torchao.quantization.pt2e import move_exported_model_to_eval
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    return xiq, prepare_pt2e, convert_pt2e, move_exported_model_to_eval


def dynamic_batch_shapes(example_inputs: tuple, max_batch: int = 4096) -> tuple:
    """dynamic_shapes for torch.export: dimension 0 of every input is one shared batch dimension."""
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    return tuple({0: batch} for _ in example_inputs)


@torch.no_grad()
def export_model(model: nn.Module, example_inputs: tuple) -> torch.fx.GraphModule:
    """The model captured by strict torch.export with a dynamic batch dimension (a GraphModule)."""
    ep = torch.export.export(model.eval(), tuple(example_inputs), dynamic_shapes=dynamic_batch_shapes(example_inputs),
                             strict=True)
    gm = ep.module()
    # Unused outputs stay in the exported graph (BERT's pooler, Linear + Tanh, when only
    # last_hidden_state is returned); the quantizer then fails on a Linear+unary partition with no
    # output node ("IndexError: list index out of range" in _get_output_nodes_of_partitions).
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


@torch.no_grad()
def quantize_exported(gm: torch.fx.GraphModule, calibration: list[tuple]) -> tuple[torch.fx.GraphModule, str]:
    """prepare_pt2e (X86InductorQuantizer, default config) + one forward per calibration batch +
    convert_pt2e. Returns (converted GraphModule, info). Modifies `gm`."""
    xiq, prepare_pt2e, convert_pt2e, move_to_eval = _quietly_import_quantizer()
    quantizer = xiq.X86InductorQuantizer()
    quantizer.set_global(xiq.get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(gm, quantizer)
    for batch in calibration:
        prepared(*batch)
    converted = convert_pt2e(prepared)
    move_to_eval(converted)
    return converted, (f"PT2E static, X86InductorQuantizer default config, {len(calibration)} calibration "
                       "batches; strict export")


def compile_model(gm: nn.Module):
    """torch.compile (Inductor) of a converted model; freezing must be on (enable_freezing)."""
    import torch._inductor.config as inductor_config

    if not inductor_config.freezing:
        raise RuntimeError("PT2E x86 lowering needs torch._inductor.config.freezing = True (call enable_freezing())")
    return torch.compile(gm, dynamic=False)
