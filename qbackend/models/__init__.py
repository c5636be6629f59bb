"""The model zoo: torchvision-style ResNet-18/50 and MobileNetV2, HF BERT-base, an LSTM text
classifier, a small CNN trained on scikit-learn's digits, a DLRM-style recommendation model and the
real-weight sentence encoder all-MiniLM-L6-v2 (from an optional PyPI package), each wrapped as a ModelCase (model,
example/calibration/evaluation batches, output selector, metric, quantization mode) for the tests,
the benchmarks and the CLI demo. Everything is deterministic given `seed`.

    from qbackend.models import MODELS
    case = MODELS["resnet18"](batch_size=2, image_size=64)

MODELS maps a name to its case builder; every builder takes keyword arguments only:
batch_size, num_calibration_batches, num_eval_batches, seed, plus image_size (resnet18, resnet50,
mobilenet_v2), seq_len (bert_base, transformer_outliers, lstm_classifier) and config overrides
(bert_base; transformer_outliers, a 6-layer 384-wide pre-LN encoder with injected outliers).
transformers and scikit-learn are imported only by the BERT, MiniLM and digits builders.
"""
from __future__ import annotations

from typing import Callable

from .bert import bert_base, bert_base_case, bert_inputs, sentence_embeddings, transformer_outliers_case
from .case import ModelCase
from .dlrm import DLRM, dlrm, dlrm_case, dlrm_inputs
from .digits import DigitsCNN, digits_cnn_case, train_digits_cnn
from .minilm import english_sentences, minilm_case
from .lstm import LSTMClassifier, lstm_classifier, lstm_classifier_case
from .mobilenet import MobileNetV2, mobilenet_v2, mobilenet_v2_case
from .resnet import ResNet, resnet18, resnet18_case, resnet50, resnet50_case

MODELS: dict[str, Callable[..., ModelCase]] = {
    "resnet18": resnet18_case,
    "resnet50": resnet50_case,
    "mobilenet_v2": mobilenet_v2_case,
    "bert_base": bert_base_case,
    "transformer_outliers": transformer_outliers_case,
    "lstm_classifier": lstm_classifier_case,
    "digits_cnn": digits_cnn_case,
    "dlrm": dlrm_case,
    "minilm": minilm_case,
}

__all__ = [
    "MODELS", "ModelCase",
    "ResNet", "resnet18", "resnet50", "MobileNetV2", "mobilenet_v2", "bert_base", "bert_inputs",
    "transformer_outliers_case", "sentence_embeddings",
    "LSTMClassifier", "lstm_classifier", "DigitsCNN", "train_digits_cnn",
    "resnet18_case", "resnet50_case", "mobilenet_v2_case", "bert_base_case", "lstm_classifier_case",
    "digits_cnn_case", "DLRM", "dlrm", "dlrm_case", "dlrm_inputs", "minilm_case", "english_sentences",
]
