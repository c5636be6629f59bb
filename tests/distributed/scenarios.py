"""What each rank runs in the distributed calibration tests (launcher.py starts them): build a
model, calibrate on this rank's shard of a fixed list of batches, reduce, convert, and write the
converted model as data (qbackend.serialization.model_file.model_parts) and its outputs; rank 0
also writes the model one process gets from all the batches, as the reference. Failure scenarios
write the exception each surviving rank raised."""
from __future__ import annotations

import json
import os
import time
import warnings

import torch
from torch import nn

import qbackend
from qbackend import ObserverSpec, QuantConfig
from qbackend.serialization.model_file import model_parts

NUM_BATCHES = 6


class _ConvMLP(nn.Module):
    """A conv, a pool and two Linears: every kind of layer the observers sit on."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc1 = nn.Linear(8 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, 5)

    def forward(self, x):
        x = torch.relu(self.conv(x))
        x = torch.nn.functional.max_pool2d(x, 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class _Branchy(nn.Module):
    """Python control flow on a value: torch.export cannot capture it, so prepare swaps modules."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 8)

    def forward(self, x):
        h = torch.relu(self.a(x))
        if float(h.mean()) > 1e9:
            h = h * 2
        return self.b(h)


def _seeded_model(name: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    if name == "cnn":
        from qbackend.models.digits import DigitsCNN
        model = DigitsCNN()
        for bn in (model.bn1, model.bn2):  # non-trivial folded BatchNorms
            bn.running_mean.uniform_(-0.2, 0.2)
            bn.running_var.uniform_(0.5, 2.0)
        return model.eval()
    if name == "encoder":
        from qbackend.models.bert import transformer_outliers
        return transformer_outliers(seed=seed, num_hidden_layers=1, num_attention_heads=6, intermediate_size=512,
                                    vocab_size=1000)
    if name == "dlrm":
        from qbackend.models.dlrm import dlrm
        return dlrm(num_tables=2, rows=500, dim=16, seed=seed, bottom=(32, 16), top=(32, 16))
    if name == "convmlp":
        return _ConvMLP().eval()
    if name == "branchy":
        return _Branchy().eval()
    raise ValueError(name)


def _batch(name: str, i: int) -> tuple:
    g = torch.Generator().manual_seed(1000 + i)
    if name == "cnn":
        return (torch.randn(4 + i % 3, 1, 8, 8, generator=g),)
    if name == "encoder":
        from qbackend.models.bert import bert_inputs
        return bert_inputs(2 + i % 2, 16, g, vocab_size=1000)
    if name == "dlrm":
        from qbackend.models.dlrm import dlrm_inputs
        return dlrm_inputs(4 + i % 3, 2, 500, min_bag=2, max_bag=6, seed=1000 + i)
    if name == "convmlp":
        return (torch.randn(3 + i % 2, 3, 8, 8, generator=g) * (1 + i),)
    if name == "branchy":
        return (torch.randn(5, 16, generator=g) * (1 + i),)
    raise ValueError(name)


def _tensor(out) -> torch.Tensor:
    """A model's main output tensor (a Hugging Face encoder's last hidden state)."""
    return out if isinstance(out, torch.Tensor) else out[0]


def _config(kind: str | None) -> QuantConfig | None:
    return None if kind is None else QuantConfig(activation=ObserverSpec(kind, {"dtype": torch.uint8}))


def _converted(name: str, batches: list, kind: str | None, reduce: bool) -> tuple:
    prepared = qbackend.prepare(_seeded_model(name), _batch(name, 0), config=_config(kind))
    qbackend.calibrate(prepared, batches)
    info = {"method": prepared.method}
    if prepared.method == "graph":
        info["smoothed_values"] = len(prepared._prepared.smooth_groups)
        info["hessians"] = len(set(prepared._prepared.hessians.values()))
    if reduce:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            report = qbackend.reduce_calibration(prepared)
        info["warnings"] = [str(w.message) for w in caught if isinstance(w.message, qbackend.RankWithoutDataWarning)]
        info["ranks_without_data"] = report.ranks_without_data
        info["bytes_summed"] = report.bytes_summed
    qmodel = qbackend.convert(prepared)
    with torch.no_grad():
        outs = [_tensor(qmodel(*_batch(name, 100 + j))) for j in range(2)]
    tensors, meta = model_parts(qmodel)
    return {"tensors": tensors, "meta": meta, "outputs": outs}, info


def equal_to_one_process(rank: int, world: int, out: str, model: str, shards: list, kinds: list | None = None) -> None:
    """Calibrate on shards[rank] (batch indices), reduce, convert: for each observer kind in `kinds`
    (None: the default config)."""
    for kind in kinds or [None]:
        tag = f"{model}_{kind or 'default'}"
        mine = [_batch(model, i) for i in shards[rank]]
        parts, info = _converted(model, mine, kind, reduce=True)
        torch.save(parts, os.path.join(out, f"{tag}_rank{rank}.pt"))
        with open(os.path.join(out, f"{tag}_rank{rank}.json"), "w") as f:
            json.dump(info, f)
        if rank == 0:
            everything = [_batch(model, i) for shard in shards for i in shard]
            parts, info = _converted(model, everything, kind, reduce=False)
            torch.save(parts, os.path.join(out, f"{tag}_reference.pt"))


def one_call(rank: int, world: int, out: str, shards: list) -> None:
    """qbackend.quantize(..., distributed=True) on each rank's shard; rank 0 also quantizes from all."""
    name = "convmlp"

    def parts(qmodel):
        tensors, meta = model_parts(qmodel)
        with torch.no_grad():
            return {"tensors": tensors, "meta": meta, "outputs": [qmodel(*_batch(name, 100))]}

    qmodel = qbackend.quantize(_seeded_model(name), _batch(name, 0), [_batch(name, i) for i in shards[rank]],
                               distributed=True)
    torch.save(parts(qmodel), os.path.join(out, f"quantize_default_rank{rank}.pt"))
    if rank == 0:
        ref = qbackend.quantize(_seeded_model(name), _batch(name, 0), [_batch(name, i) for s in shards for i in s])
        torch.save(parts(ref), os.path.join(out, "quantize_default_reference.pt"))


def _error_record(out: str, rank: int, fn) -> None:
    start = time.monotonic()
    try:
        fn()
        record = {"error": None}
    except Exception as exc:  # noqa: BLE001  (the test checks which)
        record = {"error": type(exc).__name__, "message": str(exc)}
    record["seconds"] = time.monotonic() - start
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


def killed_rank(rank: int, world: int, out: str, victim: int = 1) -> None:
    """The victim ends in the middle of its calibration; the others reach the reduction."""
    prepared = qbackend.prepare(_seeded_model("convmlp"), _batch("convmlp", 0))
    for i in range(3):
        if rank == victim and i == 1:
            os._exit(17)
        prepared(*_batch("convmlp", rank * 3 + i))
    _error_record(out, rank, lambda: qbackend.reduce_calibration(prepared))


def mismatched(rank: int, world: int, out: str, what: str, odd: int = 1) -> None:
    """Rank `odd` prepares a model with other weights ("weights"), another config ("config") or
    another model ("model")."""
    name, seed, config = "convmlp", 0, None
    if rank == odd:
        if what == "weights":
            seed = 1
        elif what == "config":
            config = QuantConfig(weight_rounding="nearest")
        else:
            name = "cnn"
    prepared = qbackend.prepare(_seeded_model(name, seed), _batch(name, 0), config=config)
    qbackend.calibrate(prepared, [_batch(name, rank)])
    _error_record(out, rank, lambda: qbackend.reduce_calibration(prepared))


def order_dependent_observer(rank: int, world: int, out: str) -> None:
    """Every rank uses MovingAverageMinMaxObserver, whose merge cannot be exact."""
    prepared = qbackend.prepare(_seeded_model("convmlp"), _batch("convmlp", 0), config=_config("moving_average_minmax"))
    qbackend.calibrate(prepared, [_batch("convmlp", rank)])
    _error_record(out, rank, lambda: qbackend.reduce_calibration(prepared))


def llm_equal_to_one_process(rank: int, world: int, out: str, shards: list) -> None:
    """quantize_llm with 4-bit GPTQ, each rank on its shard of the calibration ids
    (distributed=True); rank 0 also quantizes from all of them in one process."""
    from tests.llm.test_quantize_llm import _ids, _llama

    batches = [_ids(n=2, t=16, seed=10 + i) for i in range(NUM_BATCHES)]
    config = qbackend.LLMConfig(weights="int4", group_size=32)
    probe = _ids(n=2, t=12, seed=99)

    def parts(model):
        with torch.no_grad():
            logits = model(probe).logits
        return {"tensors": dict(model.state_dict()), "meta": json.dumps(model.qbackend_llm["gptq"]), "outputs": [logits]}

    model = qbackend.quantize_llm(_llama(), config, calibration=[batches[i] for i in shards[rank]], distributed=True)
    assert len(model.qbackend_llm["gptq"]) >= 10, model.qbackend_llm["gptq"]
    torch.save(parts(model), os.path.join(out, f"llm_default_rank{rank}.pt"))
    if rank == 0:
        ref = qbackend.quantize_llm(_llama(), config, calibration=[batches[i] for shard in shards for i in shard])
        torch.save(parts(ref), os.path.join(out, "llm_default_reference.pt"))


def late_rank(rank: int, world: int, out: str, late: int = 1, delay: float = 12.0, wait: float = 3.0) -> None:
    """Rank `late` reaches the reduction `delay` seconds after the others, who wait `wait` seconds."""
    import datetime

    prepared = qbackend.prepare(_seeded_model("convmlp"), _batch("convmlp", 0))
    qbackend.calibrate(prepared, [_batch("convmlp", rank)])
    if rank == late:
        time.sleep(delay)
    _error_record(out, rank, lambda: qbackend.reduce_calibration(prepared,
                                                                 timeout=datetime.timedelta(seconds=wait)))
