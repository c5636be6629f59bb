"""Synthetic inputs for the random-init image models, and the BatchNorm statistics that go with them.

Random-init CNNs have unrealistic activations: with BatchNorm's default running statistics (mean 0,
var 1) every layer's output drifts in scale with depth, nothing like a trained network. So the
builders, after a torchvision-style init (Kaiming-normal fan_out convs, BatchNorm weight 1 bias 0),
run a few batches of synthetic images through the model in train mode under torch.no_grad() with
cumulative averaging (momentum None), which sets each BatchNorm's running mean/var to the
statistics it actually sees; in eval mode every BatchNorm then normalizes its input to roughly zero
mean and unit variance, as in a trained network.

Caveat: these random networks remain chaotic: every block amplifies noise relative to signal, so
quantization noise too, and output SQNRs are lower than a trained network's (benchmarks/results/
design_measurements.md, "Random-init zoo models amplify noise"). A ``residual_gamma`` below 1 (the
weight of each residual branch's last BatchNorm, set before the statistics pass; torchvision's
``zero_init_residual`` is 0) calms them. The default stays 1.0
(torchvision's init); compare SQNRs between flows on the same case, not against trained-model
figures.

The images are not white noise: low-frequency random fields (Gaussian noise at 1/8 of the
resolution, upsampled bicubically, plus a little pixel-level noise), squashed into [0, 1] pixels
and normalized with the ImageNet mean/std, like torchvision's preprocessing of real photos.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .case import ModelCase, check_sizes, generator

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def synthetic_images(batch_size: int, image_size: int, g: torch.Generator, channels: int = 3) -> torch.Tensor:
    """[batch_size, channels, image_size, image_size] ImageNet-normalized low-frequency images."""
    coarse = max(2, image_size // 8)
    field = torch.randn(batch_size, channels, coarse, coarse, generator=g)
    field = F.interpolate(field, size=(image_size, image_size), mode="bicubic", align_corners=False)
    field = field + 0.1 * torch.randn(batch_size, channels, image_size, image_size, generator=g)
    # Per-image brightness/contrast, then a sigmoid squashes into [0, 1] pixels (most mass mid-range).
    brightness = 0.5 * torch.randn(batch_size, 1, 1, 1, generator=g)
    contrast = 1.0 + 0.3 * torch.rand(batch_size, 1, 1, 1, generator=g)
    pixels = torch.sigmoid(field * contrast + brightness)
    mean = torch.tensor(IMAGENET_MEAN[:channels]).view(1, -1, 1, 1)
    std = torch.tensor(IMAGENET_STD[:channels]).view(1, -1, 1, 1)
    return ((pixels - mean) / std).contiguous()


def torchvision_init(model: nn.Module, linear_std: float | None = None) -> None:
    """Kaiming-normal (fan_out, relu) convs with zero bias, BatchNorm weight 1 bias 0; Linear layers
    N(0, linear_std) with zero bias when linear_std is given (MobileNetV2), else left at PyTorch's
    default (ResNet)."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear) and linear_std is not None:
            nn.init.normal_(m.weight, 0.0, linear_std)
            nn.init.zeros_(m.bias)


@torch.no_grad()
def set_batchnorm_stats(model: nn.Module, batches: list[torch.Tensor]) -> nn.Module:
    """Reset every BatchNorm's running statistics and set them to the cumulative average over
    `batches` run in train mode (no gradients); returns the model in eval mode with the original
    momentum restored."""
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    momenta = [m.momentum for m in bns]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None  # cumulative moving average: exact mean of the per-batch statistics
    model.train()
    for x in batches:
        model(x)
    for m, momentum in zip(bns, momenta):
        m.momentum = momentum
    return model.eval()


def image_model_case(name: str, model: nn.Module, *, batch_size: int, num_calibration_batches: int,
                     num_eval_batches: int, image_size: int, seed: int, bn_batches: int = 2,
                     bn_batch_size: int = 8):
    """A ModelCase for a random-init image classifier: BatchNorm statistics from `bn_batches`
    synthetic batches of `bn_batch_size` (their own generator, seed + 1), then calibration batches
    (seed + 2; the first is also the example) and evaluation batches (seed + 3), all synthetic
    images of `image_size`. Mode static, output the logits, no metric (random weights)."""

    check_sizes(name, batch_size=batch_size, num_calibration_batches=num_calibration_batches,
                num_eval_batches=num_eval_batches, image_size=image_size)
    g_bn = generator(seed + 1)
    set_batchnorm_stats(model, [synthetic_images(bn_batch_size, image_size, g_bn) for _ in range(bn_batches)])
    g_cal, g_eval = generator(seed + 2), generator(seed + 3)
    calibration = [(synthetic_images(batch_size, image_size, g_cal),) for _ in range(num_calibration_batches)]
    evaluation = [(synthetic_images(batch_size, image_size, g_eval),) for _ in range(num_eval_batches)]
    return ModelCase(name=name, model=model, example_inputs=calibration[0], calibration=calibration,
                     evaluation=evaluation, mode="static")
