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


class PooledCNN(nn.Module):
    """Takes any image size: conv, then a global average pool before the classifier."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 4)

    def forward(self, image):
        return self.fc(torch.relu(self.conv(image)).mean(dim=(2, 3)))


class SequenceModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc(x).softmax(dim=1)


def test_image_sizes_are_fixed_by_default_and_checked_naming_the_dim(cnn):
    _, q = cnn
    assert q._input_signature == [["image", 4, True, [None, 3, 6, 6]]]
    with pytest.raises(ValueError, match=r"'image'.*size 6 in dim 2 \(a spatial size\).*\(\*, 3, 6, 6\).*"
                                         r"\(2, 3, 8, 6\).*dynamic_dims='all'"):
        q(torch.randn(2, 3, 8, 6))
    with pytest.raises(ValueError, match=r"'image'.*size 3 in dim 1 \(its channels\)"):
        q(torch.randn(2, 4, 6, 6))


@pytest.mark.parametrize("dynamic_dims", ["auto", "all"])
def test_dynamic_dims_all_takes_other_image_sizes(dynamic_dims):
    torch.manual_seed(0)
    model = PooledCNN().eval()
    q = qbackend.quantize(model, (_images(),), [(_images(8, s),) for s in range(3)],
                          qbackend.QuantConfig(dynamic_dims=dynamic_dims))
    x = torch.randn(3, 3, 9, 11, generator=torch.Generator().manual_seed(7))
    if dynamic_dims == "auto":
        with pytest.raises(ValueError, match=r"size 6 in dim 2"):
            q(x)
        return
    q.forward_plans = False
    graph = q(x)
    q.forward_plans = True
    q(x)
    assert torch.equal(q(x), graph)  # the plan recorded at this size replays the graph's result
    assert torch.allclose(graph, model(x), atol=0.1)


def test_sequence_lengths_stay_free_under_auto():
    torch.manual_seed(0)
    model = SequenceModel().eval()
    x = torch.randn(2, 5, 16)
    q = qbackend.quantize(model, (x,), [(torch.randn(2, 5, 16),)])
    assert q._input_signature == [["x", 3, True, [None, None, 16]]]
    y = torch.randn(3, 9, 16)
    assert q(y).shape == (3, 9, 4)
    assert torch.allclose(q(y), model(y), atol=0.05)
    with pytest.raises(ValueError, match=r"'x'.*size 16 in dim 2 \(shape \(\*, \*, 16\)"):
        q(torch.randn(2, 5, 15))


def test_signatures_without_sizes_check_rank_and_dtype_only():
    from qbackend.nn.inputs import check_inputs

    check_inputs([["image", 4, True]], [torch.randn(2, 3, 7, 7)])
    with pytest.raises(ValueError, match=r"'image' must be 4-D"):
        check_inputs([["image", 4, True]], [torch.randn(3, 7, 7)])


def test_config_rejects_unknown_dynamic_dims():
    with pytest.raises(ValueError, match=r"dynamic_dims must be one of auto, all, batch, got 'spatial'"):
        qbackend.QuantConfig(dynamic_dims="spatial")
