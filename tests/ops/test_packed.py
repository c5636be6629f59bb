"""PackedLinearWeight / PackedConv2dWeight: pickling, copying, repacking, validation.

The packed weights pickle (and deep-copy) as the int8 weight, its scales, the bias and metadata,
never as a provider's packed bytes (FBGEMM's handle owns a C++ object; oneDNN's is an opaque mkldnn
tensor), and repack when loaded: for the saved provider, or another one (from_state,
with_provider). Loaded weights must give bit-identical outputs to the originals.
"""
from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch

from qbackend.ops import PackedConv2dWeight, PackedLinearWeight
from qbackend.ops import packed as packed_mod

PROVIDERS = ["fbgemm", "onednn"]
OUT, IN = 96, 256  # linear weight: 24 KiB of int8
OC, IC, K = 64, 32, 3  # conv weight: 18 KiB of int8


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def linear_args(bias=True):
    g = _gen(0)
    w = torch.randint(-127, 128, (OUT, IN), dtype=torch.int8, generator=g)
    s = torch.rand(OUT, generator=g) * 0.01 + 0.001
    b = torch.randn(OUT, generator=g) if bias else None
    return w, s, b


def conv_args(groups=1):
    g = _gen(1)
    w = torch.randint(-127, 128, (OC, IC // groups, K, K), dtype=torch.int8, generator=g)
    s = torch.rand(OC, generator=g) * 0.01 + 0.001
    b = torch.randn(OC, generator=g)
    return w, s, b


def make_linear(provider, bias=True, **kw):
    w, s, b = linear_args(bias)
    return PackedLinearWeight(w, s, b, provider=provider, **kw)


def make_conv(provider, groups=1, **kw):
    w, s, b = conv_args(groups)
    return PackedConv2dWeight(w, s, b, stride=(2, 1), padding=1, dilation=(1, 2), groups=groups, provider=provider,
                              **kw)


# 7-bit uint8 activations: exact on every CPU (see qbackend/ops/saturation.h)
X_LIN = torch.randint(0, 128, (5, IN), dtype=torch.uint8, generator=_gen(2))
XF_LIN = torch.randn(5, IN, generator=_gen(3))
X_CONV = torch.randint(0, 128, (2, IC, 9, 10), dtype=torch.uint8, generator=_gen(4)).contiguous(
    memory_format=torch.channels_last)


def linear_outputs(pw: PackedLinearWeight) -> list[torch.Tensor]:
    return [pw.linear(X_LIN, 0.02, 7, 0.05, 3, torch.uint8, "relu"),
            pw.linear(X_LIN, 0.02, 7, output_dtype=torch.float32),
            pw.linear_dynamic(XF_LIN)]


def conv_outputs(pw: PackedConv2dWeight) -> list[torch.Tensor]:
    y = pw.conv2d(X_CONV, 0.02, 7, 0.1, 5, torch.uint8, "relu")
    accum = torch.randint(0, 128, y.shape, dtype=torch.uint8, generator=_gen(5))
    return [y, pw.conv2d(X_CONV, 0.02, 7, output_dtype=torch.float32),
            pw.conv2d(X_CONV, 0.02, 7, 0.1, 5, torch.uint8, "relu", accum, 0.07, 4)]


def assert_same_outputs(a: list[torch.Tensor], b: list[torch.Tensor]):
    assert len(a) == len(b)
    for i, (u, v) in enumerate(zip(a, b)):
        assert u.dtype == v.dtype and u.shape == v.shape, i
        assert torch.equal(u, v), f"output {i} differs"


KINDS = {"linear": (make_linear, linear_outputs), "conv2d": (make_conv, conv_outputs)}


def _pickle(pw):
    return pickle.loads(pickle.dumps(pw))


def _torch_save(pw):
    buf = io.BytesIO()
    torch.save(pw, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


# ----------------------------------------------------------------------------- round trips

@pytest.mark.parametrize("how", ["pickle", "torch_save", "deepcopy"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_round_trip_identical_outputs(provider, kind, how):
    make, outputs = KINDS[kind]
    pw = make(provider)
    expected = outputs(pw)
    loaded = {"pickle": _pickle, "torch_save": _torch_save, "deepcopy": copy.deepcopy}[how](pw)
    assert type(loaded) is type(pw) and loaded is not pw
    assert loaded.provider_name == provider
    assert loaded.packed is not pw.packed  # repacked, not shared
    assert torch.equal(loaded.weight, pw.weight) and torch.equal(loaded.w_scales, pw.w_scales)
    assert torch.equal(loaded.bias, pw.bias)
    assert repr(loaded) == repr(pw)
    assert_same_outputs(outputs(loaded), expected)
    assert_same_outputs(outputs(pw), expected)  # the original still works


@pytest.mark.parametrize("provider", PROVIDERS)
def test_round_trip_without_bias_and_with_x_shape(provider):
    pw = make_linear(provider, bias=False, x_shape=[5, IN])
    loaded = _torch_save(pw)
    assert loaded.bias is None and loaded.x_shape == [5, IN]
    assert_same_outputs(linear_outputs(loaded), linear_outputs(pw))
    pc = make_conv(provider, groups=4, x_shape=[2, IC, 9, 10])
    loaded = _pickle(pc)
    assert loaded.groups == 4 and loaded.x_shape == [2, IC, 9, 10]
    assert (loaded.stride, loaded.padding, loaded.dilation) == ([2, 1], [1, 1], [1, 2])
    assert_same_outputs(conv_outputs(loaded), conv_outputs(pc))


@pytest.mark.parametrize("kind", KINDS)
def test_deepcopy_does_not_share_tensors(kind):
    pw = KINDS[kind][0]("fbgemm")
    clone = copy.deepcopy(pw)
    shared = [name for name in ("weight", "w_scales", "bias")
              if getattr(clone, name).untyped_storage().data_ptr() == getattr(pw, name).untyped_storage().data_ptr()]
    assert not shared, f"the deep copy shares {shared} with the original"


def test_deepcopy_packs_its_own_handle():
    pw = make_linear("fbgemm")
    expected = linear_outputs(pw)
    clone = copy.deepcopy(pw)
    assert clone.packed.data_ptr() != pw.packed.data_ptr()
    del pw  # the clone's packed form is its own (a live FBGEMM object of its own)
    assert_same_outputs(linear_outputs(clone), expected)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_pickle_in_a_container(provider):
    """Several weights in one structure (as in a model's state), with shared references kept."""
    pw, pc = make_linear(provider), make_conv(provider)
    obj = pickle.loads(pickle.dumps({"a": pw, "b": pc, "a_again": pw}))
    assert obj["a"] is obj["a_again"]
    assert_same_outputs(linear_outputs(obj["a"]), linear_outputs(pw))
    assert_same_outputs(conv_outputs(obj["b"]), conv_outputs(pc))


# ----------------------------------------------------------------------------- what the pickle holds

def test_conv_activation_qparams_hint_survives_pickling_and_is_only_a_hint():
    """x_qparams steers oneDNN's weight format (a mismatch costs a reorder per call, not accuracy):
    outputs with other activation qparams stay right, and the hint is kept through pickling."""
    g = torch.Generator().manual_seed(5)
    w = torch.randint(-127, 128, (8, 4, 3, 3), dtype=torch.int8, generator=g)
    s = torch.rand(8, generator=g) * 0.01 + 0.001
    x = torch.randint(0, 128, (1, 4, 6, 6), dtype=torch.uint8, generator=g).contiguous(memory_format=torch.channels_last)
    plain = PackedConv2dWeight(w, s, None, 1, 1, 1, 1, "onednn")
    hinted = PackedConv2dWeight(w, s, None, 1, 1, 1, 1, "onednn", x_qparams=(0.05, 100))
    for zp in (0, 100, 7):
        assert torch.equal(hinted.conv2d(x, 0.05, zp), plain.conv2d(x, 0.05, zp))
    again = pickle.loads(pickle.dumps(hinted))
    assert again.x_qparams == (0.05, 100)
    assert torch.equal(again.conv2d(x, 0.05, 100), hinted.conv2d(x, 0.05, 100))



LINEAR_KEYS = {"format_version", "weight", "w_scales", "bias", "provider", "x_shape", "batch_routes"}
CONV_KEYS = LINEAR_KEYS | {"stride", "padding", "dilation", "groups", "x_qparams"}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_state_holds_only_weight_scales_bias_metadata(provider, kind):
    pw = KINDS[kind][0](provider)
    state = pw.__getstate__()
    assert set(state) == (LINEAR_KEYS if kind == "linear" else CONV_KEYS)
    assert state["format_version"] == packed_mod.FORMAT_VERSION
    assert state["provider"] == provider
    assert state["weight"].dtype == torch.int8 and torch.equal(state["weight"], pw.weight)
    assert state["w_scales"].dtype == torch.float32 and state["bias"].dtype == torch.float32
    tensors = {k for k, v in state.items() if isinstance(v, torch.Tensor)}
    assert tensors == {"weight", "w_scales", "bias"}
    for k, v in state.items():  # metadata: plain Python values
        if k not in tensors:
            assert v is None or isinstance(v, (int, str, list, tuple)), (k, v)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_pickle_size_is_the_weight_not_the_packed_bytes(provider, kind):
    pw = KINDS[kind][0](provider)
    weight_bytes = pw.weight.numel()
    extra = (pw.w_scales.numel() + pw.bias.numel()) * 4
    for data in (pickle.dumps(pw), _torch_save_bytes(pw)):
        # the int8 weight once, plus scales, bias and a few KiB of pickle / zip framing; a copy of
        # the packed form (at least as large as the weight) would double it
        assert weight_bytes <= len(data) <= 1.15 * weight_bytes + extra + 4096, (len(data), weight_bytes)


def _torch_save_bytes(pw) -> bytes:
    buf = io.BytesIO()
    torch.save(pw, buf)
    return buf.getvalue()


def test_pickle_size_scales_with_the_weight():
    small, big = make_linear("fbgemm"), PackedLinearWeight(
        torch.ones(4 * OUT, IN, dtype=torch.int8), torch.full((4 * OUT,), 0.01), provider="fbgemm")
    grow = len(pickle.dumps(big)) - len(pickle.dumps(small))
    assert abs(grow - 3 * OUT * IN) < 0.05 * OUT * IN + 8 * 4 * OUT  # +3x the int8 weight (+ scales)


# ----------------------------------------------------------------------------- other providers

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("src,dst", [("fbgemm", "onednn"), ("onednn", "fbgemm"), ("fbgemm", "reference"),
                                     ("reference", "onednn")])
def test_with_provider_and_from_state_repack(kind, src, dst):
    make, outputs = KINDS[kind]
    pw = make(src)
    fresh = make(dst)
    cls = type(pw)
    for other in (pw.with_provider(dst), cls.from_state(pw.__getstate__(), provider=dst),
                  cls.from_state(pickle.loads(pickle.dumps(pw.__getstate__())), provider=dst)):
        assert type(other) is cls and other.provider_name == dst
        assert repr(other) == repr(fresh)
        if dst == "onednn":
            assert other.packed.is_mkldnn
        elif dst == "fbgemm":
            assert other.packed.dtype == torch.uint8 and not other.packed.is_mkldnn
        else:
            assert other.packed is other.weight
        assert_same_outputs(outputs(other), outputs(fresh))
    assert pw.provider_name == src  # the original is unchanged and still works
    assert_same_outputs(outputs(pw), outputs(make(src)))


@pytest.mark.parametrize("kind", KINDS)
def test_from_state_defaults_to_the_saved_provider(kind):
    pw = KINDS[kind][0]("onednn")
    other = type(pw).from_state(pw.__getstate__())
    assert other.provider_name == "onednn"
    assert_same_outputs(KINDS[kind][1](other), KINDS[kind][1](pw))


@pytest.mark.parametrize("kind", KINDS)
def test_with_provider_unknown(kind):
    with pytest.raises(ValueError, match="unknown provider 'tpu'"):
        KINDS[kind][0]("fbgemm").with_provider("tpu")


# ----------------------------------------------------------------------------- format version

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("version", [0, 2])
def test_other_format_version_raises(kind, version):
    pw = KINDS[kind][0]("fbgemm")
    state = dict(pw.__getstate__(), format_version=version)
    with pytest.raises(ValueError, match=rf"format_version {version}; this qbackend reads version "
                                         rf"{packed_mod.FORMAT_VERSION}"):
        type(pw).from_state(state)
    with pytest.raises(ValueError, match="format_version"):
        type(pw).from_state(state, provider="onednn")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("version,shown", [(None, "no value"), ("1", r"'1' \(str\)"), (True, r"True \(bool\)"),
                                           (1.0, r"1\.0 \(float\)")])
def test_malformed_format_version_is_not_a_version_mismatch(kind, version, shown):
    pw = KINDS[kind][0]("fbgemm")
    state = pw.__getstate__()
    if version is None:
        del state["format_version"]
    else:
        state["format_version"] = version
    with pytest.raises(ValueError, match=rf"state is malformed: its 'format_version' field must be an int, got {shown}$"):
        type(pw).from_state(state)


@pytest.mark.parametrize("kind", KINDS)
def test_unpickling_a_future_version_raises(kind, monkeypatch):
    pw = KINDS[kind][0]("onednn")
    monkeypatch.setattr(packed_mod, "FORMAT_VERSION", 99)
    data = pickle.dumps(pw)
    monkeypatch.undo()
    with pytest.raises(ValueError, match="format_version 99"):
        pickle.loads(data)


# ----------------------------------------------------------------------------- constructor validation

@pytest.mark.parametrize("provider", PROVIDERS)
def test_linear_constructor_validation(provider):
    w, s, b = linear_args()
    with pytest.raises(ValueError, match=f"w_scales must have {OUT} elements"):
        PackedLinearWeight(w, s[:-1], b, provider=provider)
    with pytest.raises(ValueError, match=f"w_scales must have {OUT} elements"):
        PackedLinearWeight(w, torch.cat([s, s]), b, provider=provider)
    for bad in (0.0, -0.01, float("nan"), float("inf")):
        s2 = s.clone()
        s2[3] = bad
        with pytest.raises(ValueError, match="w_scales must be finite and positive"):
            PackedLinearWeight(w, s2, b, provider=provider)
    with pytest.raises(TypeError, match="w_scales must be float32"):
        PackedLinearWeight(w, torch.ones(OUT, dtype=torch.int64), b, provider=provider)
    for bad_w in (w.float(), w.to(torch.uint8), w.to(torch.int32), w.tolist()):
        with pytest.raises(TypeError, match="weight must be an int8 tensor"):
            PackedLinearWeight(bad_w, s, b, provider=provider)
    for bad_shape in (w[0], w[None], w[:0]):
        with pytest.raises(ValueError, match="weight must be a non-empty 2-D"):
            PackedLinearWeight(bad_shape, s, b, provider=provider)
    with pytest.raises(ValueError, match=f"bias must have {OUT} elements, got {OUT - 1}"):
        PackedLinearWeight(w, s, b[:-1], provider=provider)
    with pytest.raises(TypeError, match="bias must be a float tensor"):
        PackedLinearWeight(w, s, b.to(torch.int32), provider=provider)
    with pytest.raises(ValueError, match="unknown provider"):
        PackedLinearWeight(w, s, b, provider="fbgemm2")


@pytest.mark.parametrize("provider", PROVIDERS)
def test_linear_constructor_accepts(provider):
    """Scales as float64 or a list, bias as float64, a non-contiguous weight: all normalized
    (float32, contiguous) with the same results."""
    w, s, b = linear_args()
    ref = PackedLinearWeight(w, s, b, provider=provider)
    for kw in (dict(w_scales=s.double()), dict(w_scales=s.tolist()), dict(bias=b.double()),
               dict(weight=w.t().contiguous().t())):
        pw = PackedLinearWeight(**{**dict(weight=w, w_scales=s, bias=b, provider=provider), **kw})
        assert pw.w_scales.dtype == torch.float32 and pw.weight.is_contiguous()
        assert_same_outputs(linear_outputs(pw), linear_outputs(ref))


@pytest.mark.parametrize("provider", PROVIDERS)
def test_conv_constructor_validation(provider):
    w, s, b = conv_args()
    with pytest.raises(ValueError, match=f"w_scales must have {OC} elements"):
        PackedConv2dWeight(w, s[:5], b, provider=provider)
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="w_scales must be finite and positive"):
            PackedConv2dWeight(w, torch.full((OC,), bad), b, provider=provider)
    for bad_w in (w.float(), w.to(torch.uint8)):
        with pytest.raises(TypeError, match="weight must be an int8 tensor"):
            PackedConv2dWeight(bad_w, s, b, provider=provider)
    for bad_shape in (w[0], w.flatten(), w[:0]):
        with pytest.raises(ValueError, match="weight must be a non-empty 4-D"):
            PackedConv2dWeight(bad_shape, s, b, provider=provider)
    with pytest.raises(ValueError, match=f"bias must have {OC} elements"):
        PackedConv2dWeight(w, s, torch.zeros(OC + 1), provider=provider)
    with pytest.raises(ValueError, match="groups"):
        PackedConv2dWeight(w, s, b, groups=3, provider=provider)
    with pytest.raises(ValueError, match="stride"):
        PackedConv2dWeight(w, s, b, stride=(1, 2, 3), provider=provider)
    with pytest.raises(ValueError, match="padding"):
        PackedConv2dWeight(w, s, b, padding=-1, provider=provider)
