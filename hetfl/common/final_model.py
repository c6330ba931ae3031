"""The run's final model, for inference: ``<run-dir>/final_model.safetensors``.

After the last round the results writer saves the final global arrays (a single model; every member
of an ensemble as ``m<j>.<name>``; FENS: the members and the aggregator as ``agg.<name>``) in one
safetensors file whose metadata says how to rebuild it: ``format`` (``hetfl-final-model``),
``method``, ``model``, ``dataset``, ``num-classes``, ``round``, ``builder`` (the ``hetfl.*`` function that
rebuilds the module from the tensors), ``normalize`` (the input statistics) and ``config`` (the run config,
JSON). Loading reads plain tensors and JSON and imports only a ``hetfl.*`` builder. docs/inference.md
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

if TYPE_CHECKING:
    from .config import Schema

FINAL_MODEL = "final_model.safetensors"
FORMAT = "hetfl-final-model"


class Predictor(nn.Module):
    """Raw inputs as the dataset stores them (uint8 NCHW images, or token ids) -> class scores (N, C); argmax = class.

    ``net`` gets normalized inputs; ``meta`` is the file's metadata (``config`` parsed).
    """

    def __init__(self, net: nn.Module, normalize: dict[str, Any], meta: dict[str, Any]) -> None:
        super().__init__()
        self.net, self.meta, self.text = net, meta, bool(normalize.get("text"))
        c = max(1, len(normalize.get("mean") or [0.0]))
        self.register_buffer("mean", torch.tensor(normalize.get("mean") or [0.0], dtype=torch.float32).view(1, c, 1, 1) * 255)
        self.register_buffer("std", torch.tensor(normalize.get("std") or [1.0], dtype=torch.float32).view(1, c, 1, 1) * 255)

    def forward(self, x: torch.Tensor | np.ndarray) -> torch.Tensor:
        x = torch.as_tensor(x, device=self.mean.device)
        return self.net(x if self.text else (x.float() - self.mean) / self.std)


class MeanSoftmax(nn.Module):
    """An ensemble's prediction: the mean of its members' softmax outputs (SHEFL's ensemble, FENS's FedENS)."""

    def __init__(self, members: list[nn.Module]) -> None:
        super().__init__()
        self.members = nn.ModuleList(members)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([m(x).float().softmax(-1) for m in self.members]).mean(0)


def split_members(tensors: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """``m<j>.<name>`` tensors (:func:`hetfl.common.task.pack_models`) -> one state per member j (in order); other
    keys (FENS's ``agg.*``) are left out."""
    from .task import packed_key

    states: dict[int, dict[str, np.ndarray]] = {}
    for key, arr in tensors.items():
        parsed = packed_key(key)
        if parsed is not None:
            states.setdefault(parsed[0], {})[parsed[1]] = arr
    return [states[j] for j in sorted(states)]


def single_model(cfg: dict[str, Any], tensors: dict[str, np.ndarray]) -> nn.Module:
    """Builder of a single global model (FedAvg, FedProx, FedAdam, FedBE)."""
    from .models import set_state
    from .task import make_model

    model = make_model(cfg)
    set_state(model, tensors)
    return model


def mean_softmax(cfg: dict[str, Any], tensors: dict[str, np.ndarray]) -> nn.Module:
    """Builder of an ensemble of the configured model (``m<j>.*``) averaged in probability."""
    return MeanSoftmax([single_model(cfg, st) for st in split_members(tensors)])


def _metadata(arrays_meta: dict[str, Any]) -> dict[str, str]:
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in arrays_meta.items()}


def save_final_model(run_dir: Path, tensors: dict[str, np.ndarray], cfg: dict[str, Any], rnd: int,
                     builder: str = "hetfl.common.final_model:single_model", **meta: Any) -> Path:
    """Write ``final_model.safetensors`` atomically; `builder` is the ``hetfl.*`` function rebuilding the module."""
    from safetensors.numpy import save_file

    from .rundata import dataset_info
    from .train import Normalizer

    if not builder.startswith("hetfl."):
        raise ValueError(f"builder {builder!r}: expected a 'hetfl.<module>:<function>' entry point")
    info = dataset_info(cfg)
    norm = Normalizer(info)
    normalize = {"text": norm.text, "mean": list(info.mean or ()), "std": list(info.std or ())}
    header = {"format": FORMAT, "method": cfg["method"], "model": cfg["model"], "dataset": cfg["dataset"],
              "num-classes": info.num_classes, "round": rnd, "builder": builder, "normalize": normalize,
              "config": {k: v for k, v in cfg.items() if isinstance(v, (int, float, str, bool))}, **meta}
    path = Path(run_dir) / FINAL_MODEL
    tmp = path.with_name(path.name + ".tmp")
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(tmp), metadata=_metadata(header))
    os.replace(tmp, path)
    return path


def read_final_model(path: str | Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The tensors and the parsed metadata of a final-model file (ValueError if it is not one)."""
    from safetensors import safe_open
    from safetensors.numpy import load_file

    with safe_open(str(path), framework="numpy") as f:
        raw = f.metadata() or {}
    if raw.get("format") != FORMAT:
        raise ValueError(f"{path}: not a hetfl final model (metadata format {raw.get('format')!r}, expected {FORMAT!r})")
    meta: dict[str, Any] = {}
    for k, v in raw.items():
        try:
            meta[k] = json.loads(v)
        except json.JSONDecodeError:
            meta[k] = v
    return load_file(str(path)), meta


def load_final_model(path: str | Path, device: str | torch.device = "cpu", schema: Schema | None = None) -> Predictor:
    """The run's final model (or ensemble) as a :class:`Predictor` in eval mode: raw inputs -> class scores.

    The builder reads the run's config as stored in the file; `schema` (``hetfl.methods.SCHEMA``; default
    :data:`~hetfl.common.config.COMMON`) upgrades its old key names and gives the keys a file from an older version
    lacks their defaults."""
    from .config import COMMON
    from .registry import load

    tensors, meta = read_final_model(path)
    builder = str(meta["builder"])
    if not builder.startswith("hetfl."):
        raise ValueError(f"{path}: builder {builder!r} is not a hetfl entry point; refusing to import it")
    schema = COMMON if schema is None else schema
    cfg = {**schema.defaults(), **schema.upgrade(meta["config"])}  # as the run had it
    net = load(builder)(cfg, tensors)
    return Predictor(net, meta["normalize"], meta).to(device).eval()
