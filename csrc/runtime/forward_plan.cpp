// ForwardPlan (qbackend._C.ForwardPlan): a recorded sequence of op calls that replays a converted
// model's forward for one input signature without Python between the ops.
//
// The recorder (qbackend/nn/forward_plan.py) runs the int8 graph once under a dispatch mode and
// adds each op call it sees as a step: the operator, its arguments in schema order (constants:
// weights, qparams, shapes of this signature; tensors the forward computes are slots), the slots
// its returned tensors fill, their sizes as recorded, and the slots no later step reads. `run`
// calls the same operators with the same arguments through the dispatcher's boxed entry, below
// autograd (the recorder refuses forwards where anything requires grad), so its outputs are the
// graph's bit for bit. Slots 0..num_inputs-1 are the inputs.
//
// A step whose returned tensor has other sizes than recorded (an op whose output shape depends on
// the data) stops the replay: `run` returns None and the caller runs the graph. Steps may write
// into slots (a residual conv writing its result into its residual input) but never into inputs or
// constants (the recorder refuses those), so a stopped replay has changed nothing the caller sees.
//
// `run` releases the GIL; a plan holds no per-call state (beyond the last replay's wall time, kept
// for profilers), so threads may replay it at once.
//
// `run_if_matches`, called through the plan's `entry` (a plain CPython callable), is the eager fast
// path: given the recorded inputs' signature (`expect_inputs`: each input's dtype, sizes and
// strides, and the grad mode), it checks a call's positional arguments against it in C++ (plain
// CPU tensors, nothing requiring grad with grad mode on, no tracer, no CPU autocast, no dispatch
// mode: what nn/forward_plan.py's `signature` and
// `plans_apply` check), that the dicts given to `expect_empty` (the hook tables of the modules
// the plan stands for) are empty and that the values given to `expect_same` are still the objects
// they were (the model's generation, the graph's forward), and replays, or returns
// None for the caller's full path. Those checks in C++ cost less than in Python on the eager fast
// path, which runs right after the previous forward's kernels with the caches cold.
#include "runtime/forward_plan.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ScalarOps.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/SmallVector.h>
#include <structmember.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace qbackend {
namespace {

struct ListRef {  // a slot read as element `elem` of a Tensor[] / Tensor?[] argument
  int64_t elem;
  int64_t slot;
};

struct Output {
  int64_t ret;   // index among the op's returns
  int64_t elem;  // element of a Tensor[] return, or -1
  int64_t slot;
  std::vector<int64_t> sizes;
};

struct Step {
  c10::OperatorHandle op;
  std::string name;
  std::vector<c10::IValue> args;                    // schema order; placeholders where slots go
  std::vector<std::pair<size_t, int64_t>> refs;     // (argument, slot) read whole
  std::vector<std::pair<size_t, std::vector<ListRef>>> list_refs;
  std::vector<Output> outputs;
  std::vector<int64_t> frees;
};

class ForwardPlan {
 public:
  explicit ForwardPlan(int64_t num_inputs) : num_inputs_(num_inputs), num_slots_(num_inputs) {
    TORCH_CHECK_VALUE(num_inputs >= 0, "num_inputs must be >= 0, got ", num_inputs);
  }

  // arguments: name -> Python value for every argument the call gave that is not read from a slot;
  // refs: (argument name, element or -1, slot); outputs: (return, element or -1, slot, sizes);
  // frees: slots no later step reads.
  void add_step(const std::string& qualified_name, const std::string& overload, const py::dict& arguments,
                const std::vector<std::tuple<std::string, int64_t, int64_t>>& refs,
                const std::vector<std::tuple<int64_t, int64_t, int64_t, std::vector<int64_t>>>& outputs,
                const std::vector<int64_t>& frees) {
    auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(qualified_name.c_str(), overload.c_str());
    const c10::FunctionSchema& schema = handle.schema();
    Step s{handle, qualified_name + (overload.empty() ? "" : "." + overload), {}, {}, {}, {}, {}};
    std::unordered_map<std::string, size_t> index;
    for (size_t i = 0; i < schema.arguments().size(); ++i) index[schema.arguments()[i].name()] = i;
    std::vector<bool> whole_ref(schema.arguments().size(), false);
    for (const auto& [arg, elem, slot] : refs) {
      auto it = index.find(arg);
      TORCH_CHECK_VALUE(it != index.end(), s.name, " has no argument ", arg);
      check_slot(slot, "refs");
      if (elem < 0) {
        s.refs.emplace_back(it->second, slot);
        whole_ref[it->second] = true;
      } else {
        auto lr = std::find_if(s.list_refs.begin(), s.list_refs.end(),
                               [&](const auto& p) { return p.first == it->second; });
        if (lr == s.list_refs.end()) {
          s.list_refs.emplace_back(it->second, std::vector<ListRef>{});
          lr = s.list_refs.end() - 1;
        }
        lr->second.push_back({elem, slot});
      }
    }
    for (size_t i = 0; i < schema.arguments().size(); ++i) {
      const c10::Argument& a = schema.arguments()[i];
      if (whole_ref[i]) {
        s.args.emplace_back();
      } else if (arguments.contains(a.name())) {
        s.args.push_back(argument(arguments[a.name().c_str()], a.type()));
      } else {
        TORCH_CHECK_VALUE(a.default_value().has_value(), s.name, ": argument ", a.name(), " is missing");
        s.args.push_back(*a.default_value());
      }
    }
    for (const auto& [list_arg, elems] : s.list_refs) {
      TORCH_CHECK_VALUE(s.args[list_arg].isList(), s.name, ": argument ", schema.arguments()[list_arg].name(),
                        " is not a list");
      const int64_t n = static_cast<int64_t>(s.args[list_arg].toListRef().size());
      for (const ListRef& r : elems)
        TORCH_CHECK_VALUE(r.elem < n, s.name, ": element ", r.elem, " of a list of ", n);
    }
    for (const auto& [ret, elem, slot, sizes] : outputs) {
      TORCH_CHECK_VALUE(ret >= 0 && ret < static_cast<int64_t>(schema.returns().size()), s.name,
                        " has no return ", ret);
      TORCH_CHECK_VALUE(slot >= 0, "output slots must be >= 0");
      num_slots_ = std::max(num_slots_, slot + 1);
      s.outputs.push_back({ret, elem, slot, sizes});
    }
    for (int64_t f : frees) check_slot(f, "frees");
    s.frees = frees;
    steps_.push_back(std::move(s));
  }

  void set_outputs(const std::vector<int64_t>& slots) {
    for (int64_t s : slots) check_slot(s, "outputs");
    outputs_ = slots;
  }

  // The outputs' tensors, or nullopt where a step's output sizes differ from the recording.
  std::optional<std::vector<at::Tensor>> run(const std::vector<at::Tensor>& inputs) const {
    return as_vector(replay(inputs, nullptr));
  }

  // run(), with each step's wall time in ns (the step's dispatcher call and its output checks; the
  // clock read between steps is the only cost added) and the whole replay's, the last element.
  std::pair<std::optional<std::vector<at::Tensor>>, std::vector<int64_t>> run_timed(
      const std::vector<at::Tensor>& inputs) const {
    std::vector<int64_t> ns(steps_.size() + 1, 0);
    auto out = as_vector(replay(inputs, ns.data()));
    return {std::move(out), std::move(ns)};
  }

  // The signature run_if_matches accepts: these tensors' dtypes, sizes and strides, with grad mode
  // `grad_mode`.
  void expect_inputs(const std::vector<at::Tensor>& inputs, bool grad_mode) {
    TORCH_CHECK_VALUE(static_cast<int64_t>(inputs.size()) == num_inputs_, "the plan takes ", num_inputs_,
                      " tensors, got ", inputs.size());
    expected_.clear();
    for (const at::Tensor& t : inputs)
      expected_.push_back({t.scalar_type(), t.sizes().vec(), t.strides().vec()});
    expected_grad_ = grad_mode;
    has_expected_ = true;
  }

  // run_if_matches returns None while any of these dicts is not empty.
  void expect_empty(const std::vector<py::object>& dicts) {
    for (const py::object& d : dicts)
      TORCH_CHECK_TYPE(PyDict_Check(d.ptr()), "expect_empty takes dicts, got ", Py_TYPE(d.ptr())->tp_name);
    empty_dicts_ = dicts;
  }

  // run_if_matches returns None unless `obj.<name>` (a str key) or `obj[<key>]` (an int key, obj a
  // list) is `value`, the same object. Each call adds one expectation.
  void expect_same(const py::object& obj, const py::object& key, const py::object& value) {
    if (py::isinstance<py::int_>(key)) {
      TORCH_CHECK_TYPE(PyList_Check(obj.ptr()), "expect_same with an int key takes a list, got ",
                       Py_TYPE(obj.ptr())->tp_name);
      const Py_ssize_t i = key.cast<Py_ssize_t>();
      TORCH_CHECK_VALUE(i >= 0 && i < PyList_GET_SIZE(obj.ptr()), "expect_same: index ", i, " out of range");
    } else {
      TORCH_CHECK_TYPE(py::isinstance<py::str>(key), "expect_same's key must be an attribute name or a list index");
    }
    same_.push_back({obj, key, value, py::isinstance<py::int_>(key) ? key.cast<Py_ssize_t>() : -1});
  }

  // The outputs' tensors where `args` (nargs of them) match expect_inputs's signature, every
  // expect_empty dict is empty, every expect_same value is the same and the replay completes; None
  // otherwise (the caller runs its full path). A new reference to the outputs' list or to None, or
  // nullptr with a Python error set. Called through the plan's entry (below) with the GIL held; it
  // holds the GIL only while checking.
  PyObject* run_if_matches(PyObject* const* args, size_t nargs) const {
    if (!has_expected_ || static_cast<int64_t>(nargs) != num_inputs_) Py_RETURN_NONE;
    for (const py::object& d : empty_dicts_)
      if (PyDict_GET_SIZE(d.ptr()) != 0) Py_RETURN_NONE;
    for (const Same& e : same_) {
      if (e.index >= 0) {
        if (PyList_GET_SIZE(e.obj.ptr()) <= e.index || PyList_GET_ITEM(e.obj.ptr(), e.index) != e.value.ptr())
          Py_RETURN_NONE;
        continue;
      }
      PyObject* now = PyObject_GetAttr(e.obj.ptr(), e.key.ptr());
      if (!now) return nullptr;
      const bool same = now == e.value.ptr();
      Py_DECREF(now);
      if (!same) Py_RETURN_NONE;
    }
    const bool grad = at::GradMode::is_enabled();
    if (grad != expected_grad_ || torch::jit::tracer::isTracing() ||
        at::autocast::is_autocast_enabled(at::kCPU) || c10::impl::TorchDispatchModeTLS::any_modes_set())
      Py_RETURN_NONE;
    c10::SmallVector<at::Tensor, 8> inputs;  // on the stack: a call runs with the caches cold
    for (size_t i = 0; i < expected_.size(); ++i) {
      PyObject* obj = args[i];
      if (!THPVariable_CheckExact(obj)) Py_RETURN_NONE;
      const at::Tensor& t = THPVariable_Unpack(obj);
      const InputMeta& m = expected_[i];
      if (!t.defined() || t.layout() != at::kStrided || !t.device().is_cpu() || t.scalar_type() != m.dtype ||
          t.sizes() != c10::IntArrayRef(m.sizes) || t.strides() != c10::IntArrayRef(m.strides) ||
          (grad && t.requires_grad()))
        Py_RETURN_NONE;
      inputs.push_back(t);
    }
    std::optional<Outputs> out;
    {
      py::gil_scoped_release release;
      out = replay(inputs, nullptr);
    }
    if (!out) Py_RETURN_NONE;
    PyObject* result = PyList_New(static_cast<Py_ssize_t>(out->size()));
    if (!result) return nullptr;
    for (size_t i = 0; i < out->size(); ++i) {
      PyObject* t = THPVariable_Wrap((*out)[i]);
      if (!t) {
        Py_DECREF(result);
        return nullptr;
      }
      PyList_SET_ITEM(result, static_cast<Py_ssize_t>(i), t);
    }
    return result;
  }

  std::vector<std::string> step_names() const {
    std::vector<std::string> names;
    for (const Step& s : steps_) names.push_back(s.name);
    return names;
  }

  int64_t num_inputs() const { return num_inputs_; }

  // The wall time of the last completed replay (any thread's), in ns: a profiler subtracts it from
  // the whole call around it to get the caller's own cost on the same call.
  int64_t last_replay_ns() const { return last_replay_ns_.load(std::memory_order_relaxed); }

 private:
  // step_ns: nullptr, or steps_.size() + 1 entries for the steps' times and the total.
  // A replay's outputs, on the stack where they are few: the eager fast path runs with the caches cold.
  using Outputs = c10::SmallVector<at::Tensor, 4>;

  static std::optional<std::vector<at::Tensor>> as_vector(std::optional<Outputs> out) {
    if (!out) return std::nullopt;
    return std::vector<at::Tensor>(std::make_move_iterator(out->begin()), std::make_move_iterator(out->end()));
  }

  std::optional<Outputs> replay(c10::ArrayRef<at::Tensor> inputs, int64_t* step_ns) const {
    TORCH_CHECK_VALUE(static_cast<int64_t>(inputs.size()) == num_inputs_, "the plan takes ", num_inputs_,
                      " tensors, got ", inputs.size());
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    c10::SmallVector<c10::IValue, 64> slots(static_cast<size_t>(num_slots_));
    for (size_t i = 0; i < inputs.size(); ++i) slots[i] = inputs[i];
    torch::jit::Stack stack;
    using clock = std::chrono::steady_clock;
    const clock::time_point start = clock::now();
    clock::time_point last = start;
    for (const Step& s : steps_) {
      stack.assign(s.args.begin(), s.args.end());
      for (const auto& [arg, slot] : s.refs) stack[arg] = slots[static_cast<size_t>(slot)];
      for (const auto& [arg, elems] : s.list_refs) {
        c10::List<c10::IValue> list = stack[arg].toList().copy();
        for (const ListRef& r : elems) list.set(static_cast<size_t>(r.elem), slots[static_cast<size_t>(r.slot)]);
        stack[arg] = c10::IValue(list);
      }
      s.op.callBoxed(stack);
      for (const Output& o : s.outputs) {
        if (o.ret >= static_cast<int64_t>(stack.size())) return std::nullopt;
        c10::IValue v = stack[static_cast<size_t>(o.ret)];
        if (o.elem >= 0) {
          if (!v.isTensorList() || o.elem >= static_cast<int64_t>(v.toTensorList().size())) return std::nullopt;
          v = c10::IValue(v.toTensorList().get(static_cast<size_t>(o.elem)));
        }
        if (!v.isTensor() || v.toTensor().sizes() != c10::IntArrayRef(o.sizes)) return std::nullopt;
        slots[static_cast<size_t>(o.slot)] = std::move(v);
      }
      for (int64_t f : s.frees) slots[static_cast<size_t>(f)] = c10::IValue();
      if (step_ns) {
        const clock::time_point now = clock::now();
        *step_ns++ = std::chrono::duration_cast<std::chrono::nanoseconds>(now - last).count();
        last = now;
      }
    }
    Outputs out;
    for (int64_t s : outputs_) out.push_back(slots[static_cast<size_t>(s)].toTensor());
    const int64_t total = std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - start).count();
    last_replay_ns_.store(total, std::memory_order_relaxed);
    if (step_ns) *step_ns = total;
    return out;
  }

  // A Python number given for a Tensor argument becomes a wrapped-number tensor, as torch's
  // argument parser makes it (it takes part in type promotion as a Python scalar does).
  static c10::IValue argument(const py::handle& obj, const c10::TypePtr& type) {
    if (type->kind() == c10::TypeKind::TensorType &&
        (py::isinstance<py::bool_>(obj) || py::isinstance<py::int_>(obj) || py::isinstance<py::float_>(obj))) {
      at::Tensor t = py::isinstance<py::bool_>(obj)  ? c10::scalar_to_tensor(c10::Scalar(obj.cast<bool>()))
                     : py::isinstance<py::int_>(obj) ? c10::scalar_to_tensor(c10::Scalar(obj.cast<int64_t>()))
                                                     : c10::scalar_to_tensor(c10::Scalar(obj.cast<double>()));
      t.unsafeGetTensorImpl()->set_wrapped_number(true);
      return t;
    }
    return torch::jit::toIValue(obj, type);
  }

  void check_slot(int64_t slot, const char* what) const {
    TORCH_CHECK_VALUE(slot >= 0 && slot < num_slots_, what, ": slot ", slot, " is not filled by an input or an "
                      "earlier step (", num_slots_, " slots)");
  }

  struct InputMeta {
    at::ScalarType dtype;
    std::vector<int64_t> sizes;
    std::vector<int64_t> strides;
  };

  int64_t num_inputs_;
  int64_t num_slots_;
  std::vector<InputMeta> expected_;
  bool expected_grad_ = false;
  bool has_expected_ = false;
  std::vector<py::object> empty_dicts_;
  struct Same {
    py::object obj, key, value;
    Py_ssize_t index;  // obj[index] (a list), or -1: getattr(obj, key)
  };
  std::vector<Same> same_;
  mutable std::atomic<int64_t> last_replay_ns_{0};
  std::vector<Step> steps_;
  std::vector<int64_t> outputs_;
};

// ForwardPlanEntry: a ForwardPlan's run_if_matches as a plain CPython callable (vectorcall), called
// as `entry(*args)`. The eager fast path calls it right after the previous forward's kernels, with
// the caches cold, where pybind11's argument and return handling around a method cost several
// microseconds; this entry has none of it. It holds a reference to the ForwardPlan object.
struct EntryObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  const ForwardPlan* plan;
  PyObject* owner;  // the Python ForwardPlan that `plan` belongs to
};

PyTypeObject* entry_type = nullptr;

PyObject* entry_call(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  HANDLE_TH_ERRORS
  if (kwnames && PyTuple_GET_SIZE(kwnames) != 0) {
    PyErr_SetString(PyExc_TypeError, "a forward plan's entry takes positional tensors only");
    return nullptr;
  }
  return reinterpret_cast<EntryObject*>(self)->plan->run_if_matches(args, PyVectorcall_NARGS(nargsf));
  END_HANDLE_TH_ERRORS
}

void entry_dealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  Py_XDECREF(reinterpret_cast<EntryObject*>(self)->owner);
  type->tp_free(self);
  Py_DECREF(type);
}

PyMemberDef entry_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(EntryObject, vectorcall), READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr}};

PyType_Slot entry_slots[] = {
    {Py_tp_dealloc, reinterpret_cast<void*>(entry_dealloc)},
    {Py_tp_call, reinterpret_cast<void*>(PyVectorcall_Call)},
    {Py_tp_members, entry_members},
    {Py_tp_doc, const_cast<char*>("a forward plan's run_if_matches as a plain callable: entry(*tensors)")},
    {0, nullptr}};

PyType_Spec entry_spec = {"qbackend._C.ForwardPlanEntry", sizeof(EntryObject), 0,
                          Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL, entry_slots};

py::object make_entry(const py::object& owner) {
  const ForwardPlan& plan = owner.cast<const ForwardPlan&>();
  PyObject* obj = entry_type->tp_alloc(entry_type, 0);
  if (!obj) throw py::error_already_set();
  auto* e = reinterpret_cast<EntryObject*>(obj);
  e->vectorcall = entry_call;
  e->plan = &plan;
  e->owner = owner.ptr();
  Py_INCREF(e->owner);
  return py::reinterpret_steal<py::object>(obj);
}

}  // namespace

void register_forward_plan(py::module_& m) {
  entry_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&entry_spec));
  if (!entry_type) throw py::error_already_set();
  py::class_<ForwardPlan>(m, "ForwardPlan", "a recorded op sequence that replays a forward (forward_plan.cpp)")
      .def(py::init<int64_t>(), py::arg("num_inputs"))
      .def("add_step", &ForwardPlan::add_step, py::arg("qualified_name"), py::arg("overload"),
           py::arg("arguments"), py::arg("refs"), py::arg("outputs"), py::arg("frees"))
      .def("set_outputs", &ForwardPlan::set_outputs, py::arg("slots"))
      .def("run", &ForwardPlan::run, py::arg("inputs"), py::call_guard<py::gil_scoped_release>(),
           "the outputs' tensors, or None where a step's output sizes differ from the recording")
      .def("expect_inputs", &ForwardPlan::expect_inputs, py::arg("inputs"), py::arg("grad_mode"))
      .def("expect_empty", &ForwardPlan::expect_empty, py::arg("dicts"),
           "dicts that run_if_matches expects empty (it returns None while one is not)")
      .def("entry", &make_entry,
           "run_if_matches as a plain callable, entry(*tensors), without pybind11's call overhead")
      .def("expect_same", &ForwardPlan::expect_same, py::arg("obj"), py::arg("key"), py::arg("value"),
           "run_if_matches returns None unless obj.key (a str key) or obj[key] (an int key) is value")
      .def("run_timed", &ForwardPlan::run_timed, py::arg("inputs"), py::call_guard<py::gil_scoped_release>(),
           "(run's result, each step's wall time in ns followed by the whole replay's)")
      .def_property_readonly("step_names", &ForwardPlan::step_names)
      .def_property_readonly("num_inputs", &ForwardPlan::num_inputs)
      .def_property_readonly("last_replay_ns", &ForwardPlan::last_replay_ns,
                             "the wall time of the last completed replay in ns");
}

}  // namespace qbackend
