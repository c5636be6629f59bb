"""Check every int8 layer of a converted model against the fp64 reference on the integers it
really received (qbackend.ops.reference): forward hooks capture each layer's inputs and output."""
from __future__ import annotations

import torch

from qbackend.nn import QuantizedConv2d, QuantizedLinear, TokenQuantizedLinear
from qbackend.ops import reference


def _reference(m, args):
    p = m.packed
    post = "relu" if m.post_op == "relu6" else m.post_op
    if isinstance(m, TokenQuantizedLinear):  # float in, each row quantized over its own range
        return reference.token_linear_fp64(args[0], p.weight, p.w_scales, m.bias, m.qmax, post), None
    if isinstance(m, QuantizedLinear):
        y = reference.linear_fp64(args[0], m.x_scale, m.x_zero_point, p.weight, p.w_scales, p.bias, post)
    else:
        acc = args[1] if len(args) > 1 else None
        y = reference.conv2d_fp64(args[0], m.x_scale, m.x_zero_point, p.weight, p.w_scales, p.bias, p.stride,
                                  p.padding, p.dilation, p.groups, acc, m.accum_scale, m.accum_zero_point, post)
    if m.post_op == "relu6":
        y = y.clamp_max(6.0)
    if m.out_dtype == torch.float32:
        return y, None
    q = reference.quantize(y, m.out_scale, m.out_zero_point, m.out_dtype)
    if m.out_qmax is not None:  # 7-bit outputs
        q = q.clamp_max(m.out_qmax)
    return y, q


def check_layers(qmodel: torch.nn.Module, *inputs) -> int:
    """Run qmodel(*inputs); assert each int8 layer's output is within 1 LSB of the reference
    (integer outputs) or within float32 rounding of it (float outputs). Returns the layers checked."""
    calls, inputs_seen = [], {}
    layers = [m for m in qmodel.modules() if isinstance(m, (QuantizedConv2d, QuantizedLinear, TokenQuantizedLinear))]
    # the inputs are copied before the call: a residual conv may write its result into its accum ...
    handles = [m.register_forward_pre_hook(lambda m, a: inputs_seen.__setitem__(id(m), tuple(t.clone() for t in a)))
               for m in layers]
    # ... and the output too: a later residual conv may write into it (it is that conv's accum)
    handles += [m.register_forward_hook(lambda m, a, out: calls.append((m, inputs_seen.pop(id(m)), out.clone())))
                for m in layers]
    try:
        qmodel(*inputs)
    finally:
        for h in handles:
            h.remove()
    assert calls, "no int8 layer ran"
    for m, args, out in calls:
        y, q = _reference(m, args)
        if q is None:
            tol = 1e-5 * float(y.abs().max()) + 1e-5
            assert torch.allclose(out.double(), y, atol=tol, rtol=1e-5), (m, float((out.double() - y).abs().max()))
        else:
            diff = (out.int() - q.int()).abs()
            assert int(diff.max()) <= 1, (m, int(diff.max()))
            assert float((diff > 0).float().mean()) < 0.01, (m, "too many 1-LSB differences")
    return len(calls)
