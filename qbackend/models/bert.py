"""BERT-base: ``transformers.BertModel(BertConfig())`` with random (seeded) weights, eval mode, and
its inputs: input_ids [B, seq_len] and an attention_mask with varied real lengths, so some rows are
padded and the mask is a real input, not all ones.

``bert_base(**config_overrides)`` builds the model (overrides go to BertConfig, e.g.
``num_hidden_layers=2`` for a quick test); ``bert_inputs()`` builds one batch; ``bert_base_case()``
builds a ModelCase (static mode; its output function picks ``last_hidden_state``).

``transformer_outliers_case()``: a 6-layer, 384-wide pre-LayerNorm encoder (transformers'
RobertaPreLayerNormModel, the block layout of GPT-style LLMs) with the activation outliers of
trained transformers injected without changing its FP32 function: in each block's two
LayerNorms a few channels' weight and bias are scaled 30-100x and the Linears reading that
LayerNorm (query/key/value; the FFN's first Linear) get those input columns divided by the same
factor. Per-tensor ranges of those LayerNorm outputs are then set by the outlier channels.
``sentence_embeddings()`` is the sentence-embedding head (mean pooling over the real tokens, then
L2 normalisation).
transformers is imported only when a BERT model is built.
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
    return encoder_case("bert_base", model, batch_size, num_calibration_batches, num_eval_batches, seq_len, seed)


def encoder_case(name: str, model: nn.Module, batch_size: int, num_calibration_batches: int, num_eval_batches: int,
                 seq_len: int, seed: int) -> ModelCase:
    """A static ModelCase for a transformers encoder taking (input_ids, attention_mask):
    calibration (seed + 2; the first batch is also the example) and evaluation (seed + 3) batches
    from bert_inputs, output last_hidden_state, no metric."""
    vocab = model.config.vocab_size
    g_cal, g_eval = generator(seed + 2), generator(seed + 3)
    calibration = [bert_inputs(batch_size, seq_len, g_cal, vocab) for _ in range(num_calibration_batches)]
    evaluation = [bert_inputs(batch_size, seq_len, g_eval, vocab) for _ in range(num_eval_batches)]
    return ModelCase(name=name, model=model, example_inputs=calibration[0], calibration=calibration,
                     evaluation=evaluation, output=last_hidden_state, metric=None, mode="static")


# transformer_outliers: the channels whose LayerNorm parameters are scaled, and by how much
OUTLIER_CHANNELS = (7, 101, 202, 333)
OUTLIER_FACTORS = (30.0, 50.0, 75.0, 100.0)


def inject_outliers(model: nn.Module, channels=OUTLIER_CHANNELS, factors=OUTLIER_FACTORS) -> nn.Module:
    """In place, on a pre-LayerNorm encoder (RobertaPreLayerNormModel): scale `channels` of each
    block's attention and FFN LayerNorm weight and bias by `factors` and divide the same input
    columns of the Linears reading them; the FP32 function is unchanged up to rounding."""
    scale = torch.ones(model.config.hidden_size)
    scale[list(channels)] = torch.tensor(factors)
    with torch.no_grad():
        for layer in model.encoder.layer:
            pairs = ((layer.attention.LayerNorm, [layer.attention.self.query, layer.attention.self.key,
                                                  layer.attention.self.value]),
                     (layer.intermediate.LayerNorm, [layer.intermediate.dense]))
            for ln, readers in pairs:
                ln.weight.mul_(scale)
                ln.bias.mul_(scale)
                for lin in readers:
                    lin.weight.div_(scale)
    return model


def transformer_outliers(seed: int = 0, inject: bool = True, **config_overrides) -> nn.Module:
    """Random-init RobertaPreLayerNormModel (6 layers, hidden 384, 6 heads, FFN 1536, vocab 30522,
    pad id 0 unless overridden), eval mode, with outliers injected (inject=False: without)."""
    from transformers import RobertaPreLayerNormConfig, RobertaPreLayerNormModel

    config = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=6, intermediate_size=1536,
                  vocab_size=30522, pad_token_id=PAD_ID)
    config.update(config_overrides)
    with seeded(seed):
        model = RobertaPreLayerNormModel(RobertaPreLayerNormConfig(**config)).eval()
    if max(OUTLIER_CHANNELS) >= model.config.hidden_size:
        raise ValueError(f"transformer_outliers: hidden_size must exceed {max(OUTLIER_CHANNELS)}")
    return inject_outliers(model) if inject else model


def transformer_outliers_case(*, batch_size: int = 8, num_calibration_batches: int = 4, num_eval_batches: int = 2,
                              seq_len: int = 128, seed: int = 0, **config_overrides) -> ModelCase:
    """The outlier encoder's ModelCase (module docstring); inputs and seeds as bert_base_case."""
    check_sizes("transformer_outliers", batch_size=batch_size, num_calibration_batches=num_calibration_batches,
                num_eval_batches=num_eval_batches, seq_len=seq_len)
    model = transformer_outliers(seed, **config_overrides)
    if seq_len + 2 > model.config.max_position_embeddings:
        raise ValueError(f"transformer_outliers: seq_len {seq_len} too long for max_position_embeddings "
                         f"{model.config.max_position_embeddings}")
    return encoder_case("transformer_outliers", model, batch_size, num_calibration_batches, num_eval_batches,
                        seq_len, seed)


def sentence_embeddings(last_hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean over the real tokens (attention_mask 1) of each row, L2-normalised: [B, hidden]."""
    m = attention_mask.to(last_hidden.dtype).unsqueeze(-1)
    pooled = (last_hidden * m).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)
    return torch.nn.functional.normalize(pooled, dim=-1)
