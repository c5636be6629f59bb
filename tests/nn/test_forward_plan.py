"""Forward plans (qbackend/nn/forward_plan.py): a converted model's eager forward replayed as one
native call gives the graph's outputs bit for bit, on the zoo models and after save / load; from
several threads at once; it is dropped when the model changes; and forwards a replay could not
reproduce (data read into Python, random ops, writes into inputs, output sizes that depend on the
data, grad) run the graph instead."""
from __future__ import annotations

import threading

import pytest
import torch
from torch import nn
from torch.utils import _pytree as pytree

import qbackend
from qbackend.models import MODELS
from qbackend.nn import forward_plan
from qbackend.nn.forward_plan import ForwardPlans

FAST = ["digits_cnn", "dlrm", "lstm_classifier", "transformer_outliers", "resnet18"]
SLOW = ["mobilenet_v2", "resnet50", "bert_base"]


def _leaves(out):
    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def _assert_same(a, b):
    la, lb = _leaves(a), _leaves(b)
    assert len(la) == len(lb) and la
    for x, y in zip(la, lb):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert torch.equal(x, y)


class _GraphCalls:
    """Counts the calls that run the int8 graph: every call but a replay of a recorded plan."""

    def __init__(self, q):
        self.n, self.q = 0, q

    def __enter__(self):
        self.calls, self.replays = 0, 0
        self._forward, self._run = self.q.forward, forward_plan.Plan.run
        self._fast = forward_plan.ForwardPlans.fast
        self.fast_replays = 0

        def forward(*args, **kwargs):
            self.calls += 1
            return self._forward(*args, **kwargs)

        def run(plan, tensors):
            out = self._run(plan, tensors)
            self.replays += out is not None
            return out

        def fast(plans, args):
            out = self._fast(plans, args)
            self.replays += out is not None
            self.fast_replays += out is not None
            return out

        self.q.forward = forward
        forward_plan.Plan.run = run
        forward_plan.ForwardPlans.fast = fast
        return self

    def __exit__(self, *exc):
        del self.q.forward
        forward_plan.Plan.run = self._run
        forward_plan.ForwardPlans.fast = self._fast
        self.n = self.calls - self.replays


_converted = {}


def _converted_model(name: str):
    if name not in _converted:
        case = MODELS[name](batch_size=8)
        q = qbackend.quantize(case.model.eval(), case.example_inputs, case.calibration)
        _converted[name] = (case, q)
    return _converted[name]


def _inputs(case, name: str, batch: int):
    first = case.calibration[0]
    if name == "dlrm":
        return first  # offsets-based bags: the batch is the case's
    reps = (batch + 7) // 8
    return tuple(torch.cat([t] * reps)[:batch] for t in first)


def _check_plan_matches_graph(name: str, batch: int):
    case, q = _converted_model(name)
    x = _inputs(case, name, batch)
    q._plans.clear()  # the cached model may have seen this signature (DLRM's batch is fixed)
    with torch.no_grad():
        q.forward_plans = False
        ref = q(*x)
        q.forward_plans = True
        with _GraphCalls(q) as calls:
            first, second, third = q(*x), q(*x), q(*x)  # seen, recorded (runs the graph), replayed
    assert calls.n == 2, q.forward_plan_summary()
    assert any("one native call" in line for line in q.forward_plan_summary()), q.forward_plan_summary()
    for out in (first, second, third):
        _assert_same(ref, out)


@pytest.mark.parametrize("batch", [1, 7, 32])
def test_digits_cnn_plan_equals_graph(batch):
    _check_plan_matches_graph("digits_cnn", batch)


@pytest.mark.parametrize("name", [n for n in FAST if n != "digits_cnn"])
def test_zoo_plan_equals_graph_at_batch_1(name):
    _check_plan_matches_graph(name, 1)


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 7, 32])
@pytest.mark.parametrize("name", FAST + SLOW)
def test_zoo_plan_equals_graph(name, batch):
    _check_plan_matches_graph(name, batch)


def test_plan_after_save_and_load(tmp_path):
    case, q = _converted_model("digits_cnn")
    x = _inputs(case, "digits_cnn", 3)
    path = tmp_path / "digits.qb"
    with torch.no_grad():
        q(*x), q(*x)  # a plan recorded before saving is not part of the file
        qbackend.save(q, path)
        loaded = qbackend.load(path)
        assert loaded.forward_plan_summary()[0].startswith("no call yet")
        q.forward_plans = False
        ref = q(*x)
        q.forward_plans = True
        with _GraphCalls(loaded) as calls:
            outs = [loaded(*x) for _ in range(3)]
    assert calls.n == 2
    for out in outs:
        _assert_same(ref, out)


def test_switched_off_by_config():
    case = MODELS["digits_cnn"](batch_size=8)
    q = qbackend.quantize(case.model.eval(), case.example_inputs, case.calibration,
                          config=qbackend.QuantConfig(forward_plans=False))
    with torch.no_grad(), _GraphCalls(q) as calls:
        for _ in range(3):
            q(*case.example_inputs)
    assert calls.n == 3
    assert q.forward_plan_summary() == ["forward plans are off: every call runs the graph"]
    assert "forward plans are off" in qbackend.explain(q).to_markdown()
    with pytest.raises(TypeError, match="forward_plans"):
        qbackend.QuantConfig(forward_plans=1)


def test_concurrent_replays_equal_serial_ones():
    case, q = _converted_model("digits_cnn")
    xs = [_inputs(case, "digits_cnn", b) for b in (1, 5)]
    with torch.no_grad():
        q.forward_plans = False
        refs = [q(*x) for x in xs]
        q.forward_plans = True
        for x in xs:
            q(*x), q(*x)
        results, errors = {}, []

        def work(i):
            try:
                torch.set_num_threads(1)
                for j in range(20):
                    results[(i, j)] = q(*xs[(i + j) % 2])
            except Exception as e:  # noqa: BLE001  (reported below)
                errors.append(e)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors
    for (i, j), out in results.items():
        _assert_same(refs[(i + j) % 2], out)


def _fresh_model_with_a_plan():
    """A digits CNN of its own (the test changes it), its input, and its output through a replay."""
    case = MODELS["digits_cnn"](batch_size=8)
    q = qbackend.quantize(case.model.eval(), case.example_inputs, case.calibration)
    x = _inputs(case, "digits_cnn", 2)
    with torch.no_grad():
        q(*x), q(*x)
        return q, x, q(*x)


def test_changed_qparams_drop_the_plan():
    q, x, before = _fresh_model_with_a_plan()
    with torch.no_grad():
        conv = q.layer("conv2")
        conv.set_output_qparams(conv.out_scale * 2, conv.out_zero_point)
        after = q(*x)
        q.forward_plans = False
        ref = q(*x)
    assert not torch.equal(before, ref)  # the change matters
    _assert_same(ref, after)


def test_replaced_module_drops_the_plan():
    q, x, before = _fresh_model_with_a_plan()
    with torch.no_grad():
        fc_path = q.qbackend_layers["fc"].module
        old = q.inner.get_submodule(fc_path)
        new = type(old)(old.packed, (old.x_scale, old.x_zero_point), old.x_dtype, post_op="relu")
        setattr(q.inner, fc_path, new)
        out = q(*x)
        q.forward_plans = False
        ref = q(*x)
    assert (ref >= 0).all() and not torch.equal(ref, before)  # the new head's ReLU changed the logits
    _assert_same(ref, out)


def test_bad_inputs_still_raise_clear_errors():
    case, q = _converted_model("digits_cnn")
    x = _inputs(case, "digits_cnn", 2)
    with torch.no_grad():
        q(*x), q(*x)
        for bad, match in ((x[0][:, :, :, :5], "w|width|W|size|shape"),
                           (x[0].to(torch.int64), "float|dtype"),
                           (torch.cat([x[0], x[0]], 1), "channel"),
                           (x[0][0], "4-D")):
            for _ in range(3):
                with pytest.raises((ValueError, TypeError, RuntimeError), match=match):
                    q(bad)
        empty = x[0][:0]
        q.forward_plans = False
        try:
            ref = q(empty)
        except (ValueError, RuntimeError) as e:
            ref = e
        q.forward_plans = True
        for _ in range(3):
            if isinstance(ref, Exception):
                with pytest.raises(type(ref)):
                    q(empty)
            else:
                _assert_same(ref, q(empty))


# ForwardPlans on small float modules: what a replay could not reproduce runs the module.

class _ReadsData(nn.Module):
    def forward(self, x):
        return (x * x.abs().max().item(),)


class _Random(nn.Module):
    def forward(self, x):
        return (x + torch.rand_like(x),)


class _WritesInput(nn.Module):
    def forward(self, x):
        return (x.add_(1.0) * 2,)


class _DataShape(nn.Module):
    def forward(self, x):
        y = x[x > 0]
        return y * 2, y.new_zeros(y.shape[0] + 1)


class _Scalars(nn.Module):
    def forward(self, x):
        return (torch.ops.aten.mul.Tensor(x, 2.5) + torch.ops.aten.add.Tensor(x, 3),)


def _run(plans, m, x):
    """m's flat outputs (m returns a tuple, as a GraphModule does) through `plans`."""
    out = plans(m, [x])
    return list(m(x) if out is None else out)


@pytest.mark.parametrize("module, why", [(_ReadsData(), "computed from the data"), (_Random(), "random"),
                                         (_WritesInput(), "writes into an input")])
def test_unreplayable_forwards_run_the_module(module, why):
    plans = ForwardPlans()
    for _ in range(3):
        x = torch.randn(4, 3)
        expected = module(x.clone())[0]
        got = _run(plans, module, x.clone())[0]
        if not isinstance(module, _Random):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert not plans.plans and any(why in line for line in plans.describe()), plans.describe()


def test_data_dependent_output_sizes_fall_back_to_the_module():
    m, plans = _DataShape(), ForwardPlans()
    x = torch.tensor([[1.0, -1.0, 2.0]])
    _run(plans, m, x), _run(plans, m, x)
    assert plans.plans  # recorded: every op's arguments were constants of the signature
    for x in (torch.tensor([[1.0, 1.0, 2.0]]), torch.tensor([[1.0, -1.0, 2.0]]), torch.tensor([[-1.0, -1.0, 2.0]])):
        got = _run(plans, m, x)
        for g, e in zip(got, m(x)):
            assert torch.equal(g, e)
    assert any("depend on the data" in line for line in plans.describe())


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int32, torch.float32])
def test_python_scalars_promote_as_in_eager(dtype):
    m, plans = _Scalars(), ForwardPlans()
    x = torch.arange(6, dtype=dtype).reshape(2, 3)
    expected = m(x)[0]
    outs = [_run(plans, m, x)[0] for _ in range(3)]
    assert plans.plans
    for out in outs:
        assert out.dtype == expected.dtype and torch.equal(out, expected)


class _Linear(nn.Linear):
    def forward(self, x):
        return (super().forward(x),)


def test_grad_mode_with_inputs_requiring_grad_runs_the_module():
    lin, plans = _Linear(3, 2), ForwardPlans()
    x = torch.randn(4, 3, requires_grad=True)
    for _ in range(3):
        assert plans(lin, [x]) is None
    with torch.no_grad():
        outs = [_run(plans, lin, x) for _ in range(3)]
    assert plans.plans and outs[-1][0].grad_fn is None
    torch.testing.assert_close(outs[-1][0], lin(x)[0].detach(), rtol=0, atol=0)


def test_forward_hooks_run_the_graph():
    case, q = _converted_model("digits_cnn")
    x = _inputs(case, "digits_cnn", 4)
    seen = []
    with torch.no_grad():
        q(*x), q(*x), q(*x)
        handle = q.layer("conv2").register_forward_hook(lambda m, i, o: seen.append(o.clone()))
        outs = [q(*x) for _ in range(3)]
        handle.remove()
        q(*x)
    assert len(seen) == 3 and all(torch.equal(seen[0], t) for t in seen)
    for out in outs:
        _assert_same(outs[0], out)
    with torch.no_grad(), _GraphCalls(q) as calls:
        q(*x), q(*x)
    assert calls.n == 0  # without the hook: replays again


def test_fast_path_checks_every_input_and_mode():
    """The last call's plan replays from C++ checks alone; any other signature, grad state, autocast
    or dispatch mode takes the full path, with the graph's outputs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    case, q = _converted_model("digits_cnn")
    x = _inputs(case, "digits_cnn", 3)[0]
    q._plans.clear()
    with torch.no_grad():
        q.forward_plans = False
        ref = q(x)
        ref1 = q(x[:1])
        q.forward_plans = True
        q(x), q(x)
        with _GraphCalls(q) as calls:
            _assert_same(ref, q(x))
        assert calls.fast_replays == 1 and q._plans.last is not None

        strided = torch.empty(x.shape[0], x.shape[1], x.shape[2], x.shape[3] * 2)[..., ::2]
        strided.copy_(x)  # the same values with other strides: another signature
        class _Sub(torch.Tensor):
            pass

        with _GraphCalls(q) as calls:
            _assert_same(ref, q(strided))
            _assert_same(ref1, q(x[:1]))
            _assert_same(ref, q(x.as_subclass(_Sub)))  # not a plain tensor
        assert calls.fast_replays == 0

        class _Counting(TorchDispatchMode):
            ops = 0

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                _Counting.ops += 1
                return func(*args, **(kwargs or {}))

        with _GraphCalls(q) as calls:
            with _Counting():
                _assert_same(ref, q(x))
            with torch.autocast("cpu"):
                _assert_same(ref, q(x))
        assert calls.fast_replays == 0 and _Counting.ops > 0

    out = q(x.clone().requires_grad_(True))  # grad mode on: the graph, never a replay
    _assert_same(ref, out)
    with torch.no_grad(), _GraphCalls(q) as calls:
        _assert_same(ref, q(x))
    assert calls.fast_replays == 1


def test_steps_know_their_modules():
    case, q = _converted_model("digits_cnn")
    x = _inputs(case, "digits_cnn", 2)
    with torch.no_grad():
        q(*x), q(*x)
        plan, tensors = q.recorded_plan(*x)
    assert plan is not None and len(tensors) == 1
    modules = {q.qbackend_layers[name].module: name for name in ("conv1", "conv2", "fc")}
    ran = [m for m, op in zip(plan.step_modules, plan.step_names) if "conv2d" in op or "linear" in op]
    assert [modules.get(m) for m in ran] == ["conv1", "conv2", "fc"], plan.step_modules
    summary = " ".join(q.forward_plan_summary())
    assert "3 of 3 layers (conv1, conv2, fc)" in summary and "between them quantize_per_tensor" in summary, summary
    assert "3 of 3 layers" in qbackend.explain(q).to_markdown()


class _EntryCalls:
    """Counts the calls of the last plan's native entry that replayed (QuantizedModel.__call__'s and
    forward's fast path)."""

    def __init__(self, q):
        self.plan, self.n = q._plans.last, 0
        assert self.plan is not None and self.plan.entry is not None

    def __enter__(self):
        entry = self._entry = self.plan.entry

        def counting(*args):
            out = entry(*args)
            self.n += out is not None
            return out

        self.plan.entry = counting
        return self

    def __exit__(self, *exc):
        self.plan.entry = self._entry


def test_model_call_replays_only_where_module_call_would_only_call_forward():
    """QuantizedModel.__call__ replays the last plan without nn.Module.__call__, but a hook on the
    model (forward, pre-forward, backward), a global hook, a forward set on the instance, a compiled
    call and a call while compiling all get what nn.Module.__call__ gives them."""
    case, q = _converted_model("digits_cnn")
    x = _inputs(case, "digits_cnn", 2)
    module = torch.nn.modules.module
    with torch.no_grad():
        q._plans.clear()
        ref = [q(*x) for _ in range(3)][-1]
        with _EntryCalls(q) as entry:
            _assert_same(ref, q(*x))
        assert entry.n == 1

        seen = []
        hooks = [(lambda: q.register_forward_pre_hook(lambda m, i: seen.append("pre")), "pre"),
                 (lambda: q.register_forward_hook(lambda m, i, o: seen.append("post")), "post"),
                 (lambda: q.register_full_backward_hook(lambda m, gi, go: None), None),
                 (lambda: module.register_module_forward_hook(lambda m, i, o: seen.append(type(m).__name__)),
                  "QuantizedModel"),
                 (lambda: module.register_module_full_backward_hook(lambda m, gi, go: None), None)]
        for register, expected in hooks:
            seen.clear()
            handle = register()
            try:
                with _EntryCalls(q) as entry:
                    _assert_same(ref, q(*x))
            finally:
                handle.remove()
            assert entry.n == 0, expected
            assert (expected in seen) if expected else not seen
        with _EntryCalls(q) as entry:
            q(*x)
        assert entry.n == 1

        calls = []
        forward = q.forward
        q.forward = lambda *a: calls.append("forward") or forward(*a)
        try:
            _assert_same(ref, q(*x))
        finally:
            del q.forward
        q._compiled_call_impl = lambda *a: calls.append("compiled") or q._call_impl(*a)
        try:
            _assert_same(ref, q(*x))
        finally:
            q._compiled_call_impl = None
        assert calls == ["forward", "compiled"]

        flag = torch.compiler._is_compiling_flag  # what torch.compiler.is_compiling() returns
        torch.compiler._is_compiling_flag = True
        try:
            with _EntryCalls(q) as entry:
                _assert_same(ref, q(*x))
        finally:
            torch.compiler._is_compiling_flag = flag
        assert entry.n == 0
        with _EntryCalls(q) as entry:
            _assert_same(ref, q(*x))
        assert entry.n == 1  # nothing left behind: replays again


def test_plan_entry_checks_its_arguments():
    """The native entry replays the recorded signature only: other counts or types of arguments get
    None (the caller's full path), keywords a TypeError."""
    case, q = _converted_model("digits_cnn")
    x = _inputs(case, "digits_cnn", 2)
    with torch.no_grad():
        q._plans.clear()
        ref = [q(*x) for _ in range(3)][-1]
        entry = q._plans.last.entry
        out = entry(*x)
        assert isinstance(out, list) and len(out) == 1
        _assert_same(ref, out[0])
        assert entry() is None and entry(*x, x[0]) is None and entry(1.0) is None
        assert entry(x[0].double()) is None and entry(x[0][:1]) is None
        with pytest.raises(TypeError, match="positional"):
            entry(x=x[0])


def test_plan_entry_refuses_after_a_bump_or_a_recompiled_graph():
    """The native entry checks the generation and the graph's forward itself: after a bump or a
    recompile of the graph it replays nothing, and the call runs the graph (then records anew)."""
    from qbackend.core import generation

    case, q = _converted_model("digits_cnn")
    x = _inputs(case, "digits_cnn", 2)
    with torch.no_grad():
        q._plans.clear()
        ref = [q(*x) for _ in range(3)][-1]
        plan = q._plans.last
        assert plan.entry(*x) is not None
        generation.bump()
        assert plan.entry(*x) is None
        with _EntryCalls(q) as entry:
            _assert_same(ref, q(*x))
        assert entry.n == 0
        ref = [q(*x) for _ in range(3)][-1]  # recorded again
        plan = q._plans.last
        assert plan.entry(*x) is not None
        q.inner.recompile()  # the graph's class gets a new forward
        assert plan.entry(*x) is None
        _assert_same(ref, q(*x))
