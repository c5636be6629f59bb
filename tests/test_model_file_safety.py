"""Model files cannot run code, and a damaged file is a clear error.

* A format-1 file (pickled) whose pickle writes a marker file when unpickled, as the whole model and
  hidden as an extra attribute of a real, working model: `qbackend.load` and `qbackend explain FILE`
  refuse it by default and the marker is never written; with allow_pickle=True it is (so the
  payload is real and the tests can fail).
* Format-2 files edited to name what loading must not use (os.system, eval, torch.load, a class
  outside the allowlist, code in a node name, a private method), with their checksums recomputed
  so that only the allowlist stands between the file and the code: each one a ModelFileError.
* Damaged files (truncated, bit-flipped, spliced from two files): every case a ModelFileError,
  nothing else (bounded here; `slow` runs more).
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import struct

import pytest
import torch

import qbackend
from qbackend.cli import main as cli_main
from qbackend.serialization import ModelFileError

from .lowering.toy_models import MLP, ResidualCNN, init_bn

pytestmark = pytest.mark.filterwarnings("ignore::qbackend.lowering.convert.FP32FallbackWarning",
                                        "ignore::FutureWarning")


class Payload:
    """Unpickling this writes `marker` (the code a hostile file would run)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def _format1(path, model_object) -> None:
    """A format-1 file (a torch.save archive with the header and the pickled model), as qbackend
    before format 2 wrote them."""
    import io

    buf = io.BytesIO()
    torch.save(model_object, buf)
    header = {"format": "qbackend-model", "version": 1, "qbackend_version": "0.1.0", "torch_version": "2.13.0",
              "saved_on": {"isa_class": "avx512_vnni", "vendor": "x", "model": "x"}}
    torch.save({"header": header, "model": buf.getvalue()}, path)


@pytest.fixture(scope="module")
def cnn():
    torch.manual_seed(0)
    model = init_bn(ResidualCNN()).eval()
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    return qbackend.quantize(model, (x,), [x]), x


@pytest.mark.parametrize("where", ["whole_model", "hidden_in_real_model"])
def test_pickled_payload_never_runs_by_default(cnn, tmp_path, where, capsys):
    q, x = cnn
    marker = tmp_path / "marker"
    if where == "whole_model":
        obj = Payload(str(marker))
    else:
        obj = q
        q.extra = Payload(str(marker))  # load would succeed, outputs unchanged, and the code would have run
    try:
        _format1(tmp_path / "evil.qb", obj)
    finally:
        q.__dict__.pop("extra", None)
    with pytest.raises(ModelFileError, match="pickled model: loading it can run code"):
        qbackend.load(tmp_path / "evil.qb")
    assert cli_main(["explain", str(tmp_path / "evil.qb")]) == 2
    assert "allow_pickle=True" in capsys.readouterr().err
    assert cli_main(["info", str(tmp_path / "evil.qb")]) == 0  # the header only: no unpickling
    assert not marker.exists()
    # The payload is real: the explicit opt-in runs it (and says so).
    with pytest.warns(qbackend.serialization.PickleFileWarning):
        try:
            qbackend.load(tmp_path / "evil.qb", allow_pickle=True)
        except ModelFileError:
            pass  # the whole-model payload is not a QuantizedModel, after it ran
    assert marker.read_text() == "ran"


def _rewrite(src, dst, edit) -> None:
    """Copy a format-2 file with its JSON document edited by `edit(doc)`, checksums recomputed."""
    data = src.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    doc = json.loads(header["__metadata__"]["qbackend"])
    edit(doc)
    text = json.dumps(doc)
    header["__metadata__"]["qbackend"] = text
    header["__metadata__"]["qbackend_sha256"] = hashlib.sha256(text.encode()).hexdigest()
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    dst.write_bytes(struct.pack("<Q", len(head)) + head + data[8 + n:])


def _walk(value, fn):
    """Apply fn to every dict in a JSON tree (depth first); fn returns True to stop."""
    if isinstance(value, dict):
        if fn(value):
            return True
        return any(_walk(v, fn) for v in value.values())
    if isinstance(value, list):
        return any(_walk(v, fn) for v in value)
    return False


def _first_node(doc, op):
    """The first node of the first stored graph whose op is `op`."""
    found = []

    def graph(d):
        if "$graph_module" in d:
            found.append(d["$graph_module"])
            return True
        return False

    _walk(doc["model"], graph)
    return next(n for n in found[0]["nodes"] if n[1] == op)


def _set_function(name):
    def edit(doc):
        _first_node(doc, "call_function")[2] = {"$function": name}
    return edit


def _set_first_obj(cls_name):
    def edit(doc):
        def obj(d):
            if "$obj" in d:
                d["$obj"] = cls_name
                return True
            return False
        _walk(doc["model"], obj)
    return edit


def _node_name(doc):
    node = _first_node(doc, "call_function")
    node[0] = "x = __import__('os').system('touch MARKER') #"


def _method(doc):
    node = _first_node(doc, "call_function")
    node[1], node[2] = "call_method", "__init__"


ATTACKS = {
    "os_system": (_set_function("os:system"), "may not use"),
    "eval": (_set_function("builtins:eval"), "may not use"),
    "exec": (_set_function("builtins:exec"), "may not use"),
    "torch_load": (_set_function("torch.serialization:load"), "may not use"),
    "torch_load_via_torch": (_set_function("torch:load"), "may not use"),
    "aten_from_file": (_set_function("torch.ops.aten.from_file.default"), "may not use"),
    "main_module": (_set_first_obj("qbackend.__main__:main"), "program, not a library|does not rebuild"),
    "popen_class": (_set_first_obj("subprocess:Popen"), "does not rebuild from data"),
    "os_class": (_set_first_obj("os:system"), "does not rebuild from data"),
    "code_in_node_name": (_node_name, "not a Python identifier"),
    "private_method": (_method, "not a public tensor method"),
    "needs_untrusted_class": (lambda doc: doc.__setitem__("classes", ["subprocess:Popen"]),
                              r"classes outside qbackend and torch.nn \(subprocess:Popen\)"),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_edited_file_cannot_name_code(cnn, tmp_path, attack):
    q, x = cnn
    qbackend.save(q, tmp_path / "good.qb")
    edit, match = ATTACKS[attack]
    _rewrite(tmp_path / "good.qb", tmp_path / "bad.qb", edit)
    with pytest.raises(ModelFileError, match=match):
        qbackend.load(tmp_path / "bad.qb")
    assert not (tmp_path / "MARKER").exists() and not os.path.exists("MARKER")
    # The rewrite itself keeps a file loadable: an identity edit loads and runs the same.
    _rewrite(tmp_path / "good.qb", tmp_path / "same.qb", lambda doc: None)
    assert torch.equal(qbackend.load(tmp_path / "same.qb")(x), q(x))


def test_version_is_an_integer(cnn, tmp_path):
    q, _ = cnn
    qbackend.save(q, tmp_path / "good.qb")
    _rewrite(tmp_path / "good.qb", tmp_path / "v.qb", lambda doc: doc.__setitem__("version", "2"))
    with pytest.raises(ModelFileError, match=r"format version must be an integer, the file has '2' \(str\)"):
        qbackend.load(tmp_path / "v.qb")
    _rewrite(tmp_path / "good.qb", tmp_path / "v.qb", lambda doc: doc.__setitem__("version", True))
    with pytest.raises(ModelFileError, match=r"format version must be an integer, the file has True \(bool\)"):
        qbackend.load(tmp_path / "v.qb")
    _rewrite(tmp_path / "good.qb", tmp_path / "v.qb", lambda doc: doc.__setitem__("version", 99))
    with pytest.raises(ModelFileError, match="format version 99 .*reads version 2"):
        qbackend.load(tmp_path / "v.qb")


def _set_format_versions(value):
    """An edit setting every stored state's format_version field (packed weights) to `value`."""
    def edit(doc):
        seen = []

        def visit(d):
            if "format_version" in d:
                d["format_version"] = value
                seen.append(d)
            return False

        _walk(doc["model"], visit)
        assert seen  # the file stores its packed weights' states with the field
    return edit


@pytest.mark.parametrize("value,shown", [("1", r"'1' \(str\)"), (True, r"True \(bool\)"), (1.0, r"1\.0 \(float\)")])
def test_format_version_of_a_weight_state_is_an_int(cnn, tmp_path, value, shown):
    q, _ = cnn
    qbackend.save(q, tmp_path / "good.qb")
    _rewrite(tmp_path / "good.qb", tmp_path / "v.qb", _set_format_versions(value))
    with pytest.raises(ModelFileError, match=rf"state is malformed: its 'format_version' field must be an int, "
                                             rf"got {shown}") as err:
        qbackend.load(tmp_path / "v.qb")
    assert "reads version" not in str(err.value)
    _rewrite(tmp_path / "good.qb", tmp_path / "v.qb", _set_format_versions(7))
    with pytest.raises(ModelFileError, match="format_version 7; this qbackend reads version 1"):
        qbackend.load(tmp_path / "v.qb")


@pytest.mark.parametrize("value,shown", [("1", r"'1' \(str\)"), (True, r"True \(bool\)")])
def test_format1_header_version_is_an_int(tmp_path, value, shown):
    import io

    buf = io.BytesIO()
    torch.save({"not": "read"}, buf)
    header = {"format": "qbackend-model", "version": value, "qbackend_version": "0.1.0"}
    torch.save({"header": header, "model": buf.getvalue()}, tmp_path / "old.qb")
    with pytest.raises(ModelFileError, match=rf"format version must be an integer, the file has {shown}"):
        qbackend.load(tmp_path / "old.qb", allow_pickle=True)


def test_other_files_are_clear_errors(tmp_path):
    (tmp_path / "g.qb").write_bytes(b"\x00not a model" * 50)
    with pytest.raises(ModelFileError, match="header length"):
        qbackend.load(tmp_path / "g.qb")
    torch.save({"weights": torch.zeros(3)}, tmp_path / "t.pt")  # a zip, but not ours
    with pytest.raises(ModelFileError, match="format 1|not a qbackend model file"):
        qbackend.load(tmp_path / "t.pt", allow_pickle=True)
    try:
        from safetensors.torch import save_file
    except ImportError:
        return
    save_file({"w": torch.zeros(3)}, str(tmp_path / "s.safetensors"))  # a safetensors file, not ours
    with pytest.raises(ModelFileError, match="not a qbackend model file"):
        qbackend.load(tmp_path / "s.safetensors")


def test_file_is_plain_safetensors(cnn, tmp_path):
    """Any safetensors reader opens the file: the tensors and the metadata document."""
    safetensors = pytest.importorskip("safetensors")
    q, _ = cnn
    qbackend.save(q, tmp_path / "m.qb")
    with safetensors.safe_open(str(tmp_path / "m.qb"), "pt") as f:
        meta = f.metadata()
        names = list(f.keys())
        doc = json.loads(meta["qbackend"])
        assert meta["format"] == "qbackend-model" and doc["version"] == 2
        assert set(names) == set(doc["tensors"])
        for name in names:
            t = f.get_tensor(name)
            assert hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest() == \
                doc["tensors"][name]["sha256"]


def _damaged(data: bytes, other: bytes, rng: random.Random):
    """One damaged copy of `data`: (kind, bytes)."""
    kind = rng.choice(["truncate", "flip", "flip", "splice", "swap_header"])
    if kind == "truncate":
        return kind, data[:rng.randrange(len(data))]
    if kind == "flip":
        b = bytearray(data)
        for _ in range(rng.choice([1, 1, 2, 8])):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        return kind, bytes(b)
    if kind == "splice":
        cut = rng.randrange(1, len(data))
        return kind, data[:cut] + other[min(cut, len(other) - 1):]
    (n,) = struct.unpack("<Q", data[:8])
    (m,) = struct.unpack("<Q", other[:8])
    return kind, data[:8 + n] + other[8 + m:]


def fuzz_damaged_files(tmp_path, cases: int, seed: int = 0) -> dict[str, int]:
    """Load `cases` damaged files; each must raise ModelFileError. Returns counts per damage kind."""
    torch.manual_seed(0)
    x = torch.randn(4, 32)
    a = qbackend.quantize(MLP().eval(), (x,), [x])
    other_model = MLP().eval()
    with torch.no_grad():
        for p in other_model.parameters():
            p.mul_(1.5)
    b = qbackend.quantize(other_model, (x,), [x])  # the same structure, other weights
    qbackend.save(a, tmp_path / "a.qb")
    qbackend.save(b, tmp_path / "b.qb")
    data, other = (tmp_path / "a.qb").read_bytes(), (tmp_path / "b.qb").read_bytes()
    rng = random.Random(seed)
    counts: dict[str, int] = {}
    for i in range(cases):
        kind, bad = _damaged(data, other, rng)
        if bad in (data, other):  # a splice cut before the files' first difference is the other, intact file
            continue
        path = tmp_path / "bad.qb"
        path.write_bytes(bad)
        try:
            qbackend.load(path)
        except ModelFileError:
            counts[kind] = counts.get(kind, 0) + 1
            continue
        raise AssertionError(f"case {i} ({kind}): a damaged file loaded")
    return counts


def test_damaged_files_are_clear_errors(tmp_path):
    counts = fuzz_damaged_files(tmp_path, 300)
    assert sum(counts.values()) >= 290 and set(counts) == {"truncate", "flip", "splice", "swap_header"}


@pytest.mark.slow
def test_damaged_files_are_clear_errors_long(tmp_path):
    counts = fuzz_damaged_files(tmp_path, 20000, seed=1)
    assert sum(counts.values()) >= 19000
