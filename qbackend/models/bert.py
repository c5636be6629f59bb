"""BERT-base: ``transformers.BertModel(BertConfig())`` with random (seeded) weights, eval mode, and
its inputs: input_ids [B, seq_len] and an attention_mask with varied real lengths, so some rows are
padded and the mask is a real input, not all ones.

``bert_base(**config_overrides)`` builds the model (overrides go to BertConfig, e.g.
``num_hidden_layers=2`` for a quick test); ``bert_inputs()`` builds one batch; ``bert_base_case()``
builds a ModelCase (static mode; its output function picks ``last_hidden_state``). transformers is
imported only when a BERT model is built.
"""
from __future__ import annotations

import torch
from torch import nn

from .case import ModelCase, check_sizes, generator, seeded

CLS_ID, SEP_ID, PAD_ID = 101, 102, 0  # bert-base-uncased's special tokens


def bert_base(seed: int = 0, **config_overrides) -> nn.Module:
    """Random-init ``BertModel(BertConfig(**config_overrides))`` (BERT-base by default: 12 layers,
    hidden 768, 12 heads, vocab 30522), eval mode, weights drawn with `seed`."""
    from transformers import BertConfig, BertModel

    with seeded(seed):
        return BertModel(BertConfig(**config_overrides)).eval()


def bert_inputs(batch_size: int, seq_len: int, g: torch.Generator, vocab_size: int = 30522,
                min_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), both int64 [batch_size, seq_len]. Row 0 is full length, the
    others have real lengths drawn uniformly from [min_len, seq_len] (default min_len seq_len // 4,
    at least 2): [CLS] random tokens [SEP] then [PAD] (id 0, mask 0)."""
    min_len = max(2, seq_len // 4) if min_len is None else min_len
    if not 2 <= min_len <= seq_len:
        raise ValueError(f"bert_inputs: need 2 <= min_len <= seq_len, got min_len={min_len}, seq_len={seq_len}")
    lengths = torch.randint(min_len, seq_len + 1, (batch_size,), generator=g)
    lengths[0] = seq_len
    low = min(1000, vocab_size // 2)  # ordinary word pieces start at 1000 in bert-base-uncased
    ids = torch.randint(low, vocab_size, (batch_size, seq_len), generator=g)
    pos = torch.arange(seq_len).expand(batch_size, seq_len)
    mask = (pos < lengths[:, None]).long()
    ids[:, 0] = CLS_ID if vocab_size > CLS_ID else 1
    ids[pos == (lengths[:, None] - 1)] = SEP_ID if vocab_size > SEP_ID else 2
    ids[mask == 0] = PAD_ID
    return ids, mask


def last_hidden_state(out) -> torch.Tensor:
    """BertModel output -> last_hidden_state (also accepts a dict or a tuple, as exported or traced
    models may return)."""
    if hasattr(out, "last_hidden_state"):
        return out.last_hidden_state
    if isinstance(out, dict):
        return out["last_hidden_state"]
    if isinstance(out, (tuple, list)):
        return out[0]
    return out


def bert_base_case(*, batch_size: int = 8, num_calibration_batches: int = 4, num_eval_batches: int = 2,
                   seq_len: int = 128, seed: int = 0, **config_overrides) -> ModelCase:
    """BERT-base ModelCase: calibration (seed + 2; the first batch is also the example) and
    evaluation (seed + 3) batches of (input_ids, attention_mask); static mode; output
    last_hidden_state; no metric (random weights)."""
    check_sizes("bert_base", batch_size=batch_size, num_calibration_batches=num_calibration_batches,
                num_eval_batches=num_eval_batches, seq_len=seq_len)
    model = bert_base(seed, **config_overrides)
    if seq_len > model.config.max_position_embeddings:
        raise ValueError(f"bert_base: seq_len {seq_len} > max_position_embeddings "
                         f"{model.config.max_position_embeddings}")
    vocab = model.config.vocab_size
    g_cal, g_eval = generator(seed + 2), generator(seed + 3)
    calibration = [bert_inputs(batch_size, seq_len, g_cal, vocab) for _ in range(num_calibration_batches)]
    evaluation = [bert_inputs(batch_size, seq_len, g_eval, vocab) for _ in range(num_eval_batches)]
    return ModelCase(name="bert_base", model=model, example_inputs=calibration[0], calibration=calibration,
                     evaluation=evaluation, output=last_hidden_state, metric=None, mode="static")
