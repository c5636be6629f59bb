"""A model for `qbackend compare` (run from the repository root):

    qbackend compare examples.digits_case:case [--json result.json] [--plot sqnr.png] [--max-drop 0.5]

`qbackend compare package.module:function` imports the module (the current directory is on
sys.path; add others with --path DIR), calls the function with no arguments, and expects
(model, example_inputs, calibration_data, eval_data, metric_or_None):

- model: an FP32 nn.Module in eval mode;
- example_inputs: one batch (a tensor, or a tuple of the model's positional inputs);
- calibration_data / eval_data: iterables of batches (tensors, tuples of positional inputs, or
  dicts of keyword inputs), e.g. a list or a DataLoader that yields inputs only;
- metric: model -> float, higher is better (here top-1 % on the test split), or None.

Here: the small CNN of qbackend.models.digits, trained in ~3 s on scikit-learn's bundled 8x8
digits (no download).
"""
from __future__ import annotations

import torch

from qbackend.models.digits import top1_percent, train_digits_cnn

BATCH = 32


def case():
    model, split, _ = train_digits_cnn()          # eval mode; train / calibration / test split
    calibration = [split.x_calib[i:i + BATCH] for i in range(0, len(split.x_calib), BATCH)]
    evaluation = [split.x_test[i:i + BATCH] for i in range(0, len(split.x_test), BATCH)]

    @torch.no_grad()
    def top1(m: torch.nn.Module) -> float:
        return top1_percent(m, split.x_test, split.y_test, batch_size=BATCH)

    return model, (calibration[0],), calibration, evaluation, top1
