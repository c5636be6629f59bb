"""Embedding tables through prepare / convert: a DLRM-style model converts in one pass (tables
rowwise weight-only, MLPs int8), the config picks bits per table (by name, by size, globally) or
keeps tables FP32, odd bags stay FP32 with the reason, the quantized modules match nn.Embedding /
nn.EmbeddingBag on the dequantized table, and the model saves, loads and explains."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import qbackend
from qbackend import EmbeddingConfig, QuantConfig
from qbackend.lowering.convert import FP32FallbackWarning
from qbackend.models import dlrm_case
from qbackend.nn import QuantizedEmbedding, QuantizedEmbeddingBag, QuantizedLinear
from qbackend.ops.embedding import dequantize_rowwise

from .toy_models import sqnr

pytestmark = pytest.mark.usefixtures("one_thread")
ALL_TABLES = EmbeddingConfig(min_weights=0)


def _convert(case, config):
    p = qbackend.prepare(case.model, case.example_inputs, config=config)
    for b in case.calibration:
        p(*b)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FP32FallbackWarning)
        return qbackend.convert(p)


@pytest.fixture(scope="module")
def small_dlrm():
    return dlrm_case(batch_size=32, num_tables=3, rows=500, dim=16, num_calibration_batches=3, min_bag=2,
                     max_bag=9)


def _output_sqnr(case, q):
    with torch.no_grad():
        return min(sqnr(case.model(*b), q(*b)) for b in case.evaluation)


def test_dlrm_converts_in_one_pass(small_dlrm):
    q = _convert(small_dlrm, QuantConfig(embedding=ALL_TABLES))
    kinds = {n: info.kind for n, info in q.qbackend_layers.items()}
    assert [n for n, k in kinds.items() if k == "embedding_bag"] == ["tables.0", "tables.1", "tables.2"]
    assert sum(k == "linear" for k in kinds.values()) == 6
    for i in range(3):
        m = q.layer(f"tables.{i}")
        assert isinstance(m, QuantizedEmbeddingBag) and m.bits == 8 and m.mode == "sum"
    assert isinstance(q.layer("top.0"), QuantizedLinear)
    # the float tables are gone from the converted model
    assert not any(p.numel() >= 500 * 16 for p in q.parameters())
    assert _output_sqnr(small_dlrm, q) > 25


def test_bits_by_name_and_threshold(small_dlrm):
    cfg = QuantConfig(embedding=ALL_TABLES, by_name={"tables.1": QuantConfig(embedding=EmbeddingConfig(bits=4,
                                                                                                       min_weights=0)),
                                                      "tables.2": QuantConfig(embedding=None)})
    q = _convert(small_dlrm, cfg)
    assert q.layer("tables.0").bits == 8 and q.layer("tables.1").bits == 4
    assert "tables.2" not in q.qbackend_layers  # kept FP32 by the config
    assert _output_sqnr(small_dlrm, q) > 20
    # the default threshold (1M values) leaves these small tables in FP32
    q_default = _convert(small_dlrm, QuantConfig())
    assert not any(info.kind == "embedding_bag" for info in q_default.qbackend_layers.values())


class _Bags(nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.tok = nn.Embedding(50, 8, padding_idx=0)
        self.mean = nn.EmbeddingBag(50, 8, mode="mean", padding_idx=2)
        self.max = nn.EmbeddingBag(50, 8, mode="max")
        self.weighted = nn.EmbeddingBag(50, 8, mode="sum")
        for m in (self.tok, self.mean, self.max, self.weighted):
            nn.init.normal_(m.weight, generator=g)

    def forward(self, ids, idx, off, w):
        return torch.cat([self.tok(ids).sum(1), self.mean(idx, off), self.max(idx, off),
                          self.weighted(idx, off, per_sample_weights=w)], 1)


def _bag_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, 50, (12,), generator=g)
    idx[::4] = 2  # padding rows inside the mean bags
    return (torch.randint(0, 50, (4, 5), generator=g), idx, torch.tensor([0, 3, 3, 8]),
            torch.rand(12, generator=g))


def test_modes_padding_and_weights_match_the_dequantized_float_model():
    model = _Bags().eval()
    p = qbackend.prepare(model, _bag_inputs(0), config=QuantConfig(embedding=ALL_TABLES))
    p(*_bag_inputs(1))
    with pytest.warns(FP32FallbackWarning, match=r"max \(max bags are not quantized"):
        q = qbackend.convert(p)
    assert isinstance(q.layer("tok"), QuantizedEmbedding) and isinstance(q.layer("mean"), QuantizedEmbeddingBag)
    assert "max" not in q.qbackend_layers
    # the reference: the float model with each quantized table replaced by its dequantized values
    ref = _Bags().eval()
    for name in ("tok", "mean", "weighted"):
        packed = q.layer(name).packed
        getattr(ref, name).weight.data = dequantize_rowwise(packed.table(), packed.dim, packed.bits)
    x = _bag_inputs(2)
    with torch.no_grad():
        assert torch.allclose(q(*x), ref(*x), rtol=1e-6, atol=1e-6)


def test_save_load_and_explain(small_dlrm, tmp_path):
    q = _convert(small_dlrm, QuantConfig(embedding=EmbeddingConfig(bits=4, min_weights=0)))
    path = tmp_path / "dlrm.qb"
    qbackend.save(q, path)
    q2 = qbackend.load(path)
    b = small_dlrm.evaluation[0]
    with torch.no_grad():
        assert torch.equal(q(*b), q2(*b))
    rows = [r for r in qbackend.explain(q2) if r["op"] == "embedding_bag"]
    assert len(rows) == 3 and all("4-bit rowwise" in r["shape"] for r in rows)
    assert all(r["provider"] == "fbgemm" and r["why"].startswith("rule") for r in rows)


def test_forced_embedding_provider(small_dlrm):
    q = _convert(small_dlrm, QuantConfig(embedding=EmbeddingConfig(min_weights=0, provider="builtin")))
    assert {q.layer(f"tables.{i}").provider for i in range(3)} == {"builtin"}
    with pytest.raises(ValueError, match="fbgemm_gpu"):
        _convert(small_dlrm, QuantConfig(embedding=EmbeddingConfig(min_weights=0, qparams_dtype=torch.float32,
                                                                   provider="fbgemm_gpu")))


def test_embedding_config_errors():
    with pytest.raises(ValueError, match="bits must be 8 or 4"):
        EmbeddingConfig(bits=2)
    with pytest.raises(ValueError, match="qparams_dtype"):
        EmbeddingConfig(qparams_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="min_weights"):
        EmbeddingConfig(min_weights=-1)
    with pytest.raises(ValueError, match="provider"):
        EmbeddingConfig(provider="onednn")
    with pytest.raises(TypeError, match="EmbeddingConfig or None"):
        QuantConfig(embedding=8)


def test_saved_with_fbgemm_gpu_loads_where_it_is_missing(small_dlrm, tmp_path):
    """A model routed to fbgemm_gpu re-routes on a machine without it (same tables, same outputs)."""
    from qbackend.ops.embedding import _fbgemm_gpu_available

    if not _fbgemm_gpu_available():
        pytest.skip("fbgemm-gpu-cpu is not installed")
    q = _convert(small_dlrm, QuantConfig(embedding=EmbeddingConfig(min_weights=0, provider="fbgemm_gpu")))
    assert q.layer("tables.0").provider == "fbgemm_gpu"
    path = tmp_path / "m.qb"
    qbackend.save(q, path)
    b = small_dlrm.evaluation[0]
    torch.save(b, tmp_path / "batch.pt")
    with torch.no_grad():
        torch.save(q(*b), tmp_path / "expected.pt")
    code = f"""
import sys
sys.modules["fbgemm_gpu"] = None  # not installed here
import torch, qbackend
q = qbackend.load({str(path)!r})
b = torch.load({str(tmp_path / 'batch.pt')!r})
with torch.no_grad():
    out = q(*b)
assert torch.equal(out, torch.load({str(tmp_path / 'expected.pt')!r}))
print(q.layer("tables.0").provider, q.qbackend_layers["tables.0"].why)
"""
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    provider, why = proc.stdout.strip().split(" ", 1)
    assert provider != "fbgemm_gpu" and "re-routed" in why


class _Uncapturable(nn.Module):
    """Data-dependent Python control flow (torch.export fails): the module-swap fallback runs."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.bag = nn.EmbeddingBag(300, 16, mode="mean")
        self.emb = nn.Embedding(300, 16)
        nn.init.normal_(self.bag.weight, generator=g)
        nn.init.normal_(self.emb.weight, generator=g)
        self.fc = nn.Linear(16, 4)

    def forward(self, idx, off):
        h = self.bag(idx, off)
        if float(h.sum()) > 1e9:  # never true; export cannot trace the branch on a value
            h = h * 2
        return self.fc(h + self.emb(idx[: h.shape[0]]))


def test_module_swap_fallback_quantizes_tables_too():
    from qbackend.api import CaptureFallbackWarning

    model = _Uncapturable().eval()
    g = torch.Generator().manual_seed(2)
    idx, off = torch.randint(0, 300, (40,), generator=g), torch.arange(0, 40, 5)
    with pytest.warns(CaptureFallbackWarning):
        p = qbackend.prepare(model, (idx, off), config=QuantConfig(embedding=ALL_TABLES))
    assert p.method == "module_swap"
    p(idx, off)
    q = qbackend.convert(p)
    assert isinstance(q.layer("bag"), QuantizedEmbeddingBag) and isinstance(q.layer("emb"), QuantizedEmbedding)
    assert q.qbackend_layers["bag"].kind == "embedding_bag" and q.qbackend_layers["bag"].why
    with torch.no_grad():
        assert sqnr(model(idx, off), q(idx, off)) > 25
    # quantize_dynamic goes through the same swap: its tables are quantized by the same config
    qd = qbackend.quantize_dynamic(model, QuantConfig(mode="dynamic", embedding=ALL_TABLES))
    assert isinstance(qd.layer("bag"), QuantizedEmbeddingBag)
