"""A QuantizedModel's inputs are checked at its forward entry against the example inputs' rank and
dtype class (floating or not): a wrong one is a ValueError / TypeError naming the input and what
was expected, also after qbackend.save / qbackend.load; the batch and other sizes may vary."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import qbackend

pytestmark = pytest.mark.filterwarnings("ignore::qbackend.lowering.convert.FP32FallbackWarning")


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.relu = nn.ReLU()
        self.flat = nn.Flatten()
        self.fc = nn.Linear(8 * 6 * 6, 4)

    def forward(self, image):
        return self.fc(self.flat(self.relu(self.conv(image))))


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 4)

    def forward(self, x, ids):
        return self.fc(x) + ids.float().unsqueeze(-1)


def _images(n=4, seed=0):
    return torch.randn(n, 3, 6, 6, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def cnn():
    torch.manual_seed(0)
    model = SmallCNN().eval()
    return model, qbackend.quantize(model, (_images(),), [(_images(8, s),) for s in range(3)])


def test_rank_is_checked_naming_the_input(cnn):
    model, q = cnn
    with pytest.raises(ValueError, match=r"image.*4-D.*3-D"):
        q(torch.randn(3, 6, 6))
    with pytest.raises(ValueError, match=r"image.*4-D.*0-D"):
        q(torch.tensor(1.0))


def test_dtype_class_is_checked_naming_the_input(cnn):
    _, q = cnn
    with pytest.raises(TypeError, match=r"image.*floating.*torch.int64"):
        q(torch.zeros(2, 3, 6, 6, dtype=torch.int64))


def test_batch_and_other_floating_dtypes_pass(cnn):
    model, q = cnn
    for n in (1, 4, 7):
        x = _images(n, seed=10 + n)
        y = q(x)
        assert y.shape == (n, 4)
        assert torch.allclose(y, model(x), atol=0.2)


def test_keyword_call_is_checked():
    torch.manual_seed(0)
    model = TwoInputs().eval()
    x, ids = torch.randn(4, 16), torch.arange(4)
    q = qbackend.quantize(model, (x, ids), [(x, ids)])
    torch.testing.assert_close(q(x, ids=ids), q(x, ids), rtol=0, atol=0)
    with pytest.raises(TypeError, match=r"ids.*non-floating.*torch.float32"):
        q(x, ids=ids.float())
    with pytest.raises(ValueError, match=r"'x'.*2-D.*1-D"):
        q(torch.randn(16), ids)


def test_check_survives_save_and_load(cnn, tmp_path):
    _, q = cnn
    path = tmp_path / "cnn.qb"
    qbackend.save(q, path)
    loaded = qbackend.load(path)
    x = _images(3, seed=5)
    assert torch.equal(loaded(x), q(x))
    with pytest.raises(ValueError, match=r"image.*4-D.*3-D"):
        loaded(torch.randn(3, 6, 6))
    with pytest.raises(TypeError, match=r"image.*floating"):
        loaded(torch.zeros(2, 3, 6, 6, dtype=torch.uint8))
