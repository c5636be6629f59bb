"""An LSTM text classifier: Embedding(5000, 128) -> LSTM(128, 256, num_layers=2, batch_first=True)
-> Linear(256, num_classes) on the last time step's output. Random (seeded) weights with PyTorch's
default init; inputs are int64 token ids [B, T] drawn uniformly from the vocabulary.

The model for dynamic quantization (weights int8, activations quantized on the fly): its
ModelCase has mode "dynamic". ``lstm_classifier()`` builds the model, ``lstm_classifier_case()``
the ModelCase.
"""
from __future__ import annotations

import torch
from torch import nn

from .case import ModelCase, check_sizes, generator, seeded


class LSTMClassifier(nn.Module):
    """A text classifier: token embeddings, an LSTM, a Linear head on its last output."""

    def __init__(self, vocab_size: int = 5000, embed_dim: int = 128, hidden_size: int = 256, num_layers: int = 2,
                 num_classes: int = 4):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.lstm = nn.LSTM(embed_dim, hidden_size, num_layers=num_layers, batch_first=True)
        self.fc = nn.Linear(hidden_size, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens)          # [B, T, embed_dim]
        out, _ = self.lstm(x)               # [B, T, hidden_size]
        return self.fc(out[:, -1])          # [B, num_classes]


def lstm_classifier(vocab_size: int = 5000, embed_dim: int = 128, hidden_size: int = 256, num_layers: int = 2,
                    num_classes: int = 4, seed: int = 0) -> LSTMClassifier:
    """Random-init LSTMClassifier, eval mode, weights drawn with `seed`."""
    with seeded(seed):
        return LSTMClassifier(vocab_size, embed_dim, hidden_size, num_layers, num_classes).eval()


def lstm_classifier_case(*, batch_size: int = 16, num_calibration_batches: int = 4, num_eval_batches: int = 2,
                         seq_len: int = 64, vocab_size: int = 5000, num_classes: int = 4, seed: int = 0) -> ModelCase:
    """LSTM classifier ModelCase: token batches [batch_size, seq_len] (calibration seed + 2, the first
    is also the example; evaluation seed + 3); dynamic mode; logits; no metric."""
    check_sizes("lstm_classifier", batch_size=batch_size, num_calibration_batches=num_calibration_batches,
                num_eval_batches=num_eval_batches, seq_len=seq_len)
    model = lstm_classifier(vocab_size=vocab_size, num_classes=num_classes, seed=seed)
    g_cal, g_eval = generator(seed + 2), generator(seed + 3)

    def tokens(g):
        return (torch.randint(0, vocab_size, (batch_size, seq_len), generator=g),)

    calibration = [tokens(g_cal) for _ in range(num_calibration_batches)]
    evaluation = [tokens(g_eval) for _ in range(num_eval_batches)]
    return ModelCase(name="lstm_classifier", model=model, example_inputs=calibration[0], calibration=calibration,
                     evaluation=evaluation, metric=None, mode="dynamic")
