"""Glue from a validated run config to data, models, local training and evaluation.

Shared by every method's ServerApp and ClientApp so that each app only adds what its
paper adds. Nothing here talks to the network.
"""

from __future__ import annotations

import logging
import os
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context
from torch import nn

from hetfl.data import info as data_info
from hetfl.data.arrays import ArrayData
from hetfl.data.byo import is_byo

from .config import Schema
from .costs import step_flops
from .models import build_model, get_state, set_state
from .hosting import node_data_where
from .nodeconfig import NodeProfile
from .params import LocalSGDParams
from .rundata import dataset_info, eval_splits, model_input_shape
from .train import Normalizer, TrainResult, evaluate, resolve_device, train

log = logging.getLogger("hetfl")


def setup_logging() -> None:
    """INFO-level progress lines from the 'hetfl' logger (once per process)."""
    if not log.handlers:
        h = logging.StreamHandler(sys.stdout)
        h.setFormatter(logging.Formatter("%(levelname)s %(asctime)s hetfl: %(message)s", "%H:%M:%S"))
        log.addHandler(h)
        log.setLevel(logging.INFO)
        log.propagate = False


def seed_everything(seed: int) -> None:
    """Seed Python (Flower's node sampling uses `random`), NumPy and torch."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


_VALIDATED: dict[tuple, dict[str, Any]] = {}


def _validated(run_id: int, run_config: Any, schema: Schema) -> dict[str, Any]:
    """The run config validated once per run and process (a simulated ClientApp answers many messages of one run;
    a deployed one is a process per message): a copy of the first validation of the same run id and values."""
    items = dict(run_config)
    memo = (run_id, id(schema), tuple(sorted((k, repr(v)) for k, v in items.items())))
    if memo not in _VALIDATED:
        if len(_VALIDATED) >= 8:  # a few runs at a time; the oldest goes
            _VALIDATED.pop(next(iter(_VALIDATED)))
        _VALIDATED[memo] = schema.validate(items)
    return dict(_VALIDATED[memo])


def config_of(context: Context, schema: Schema, msg=None) -> dict[str, Any]:
    """The run config of a ServerApp/ClientApp context, validated against the app's `schema`
    (``hetfl.methods.SCHEMA``): the top-level apps call it once per message and hand the result to the method.

    On a SuperNode with a ``data-path`` whose run brings its own dataset (``hub:``/``dir:``), the node does not read
    the server's reference: the run's classes (by name), input shape and normalisation come with the message
    (`msg`'s :data:`~hetfl.data.info.RUN_DATA` record) and the node's own data is described for them, so that
    the model, the labels and the data checks of this process follow the run (docs/node-data.md#labels).

    Raises
    ------
    LocalDataError
        That node's data cannot be read or describes no classification dataset.
    """
    cfg = _validated(context.run_id, context.run_config, schema)
    path = NodeProfile(context.node_config).data_path
    if path and is_byo(cfg["dataset"]):
        run = None
        if msg is not None and data_info.RUN_DATA in msg.content:
            run = data_info.from_run_description(dict(msg.content[data_info.RUN_DATA]))
        data_info.describe_from_directory(str(path), cfg["dataset"], cfg["input-column"], cfg["label-column"],
                                          cfg["num-classes"], node_data_where(str(path), context), run=run)
    return cfg


def inference_flops(model: nn.Module, cfg: dict[str, Any], n: int) -> int:
    """FLOPs of `model` predicting `n` examples of the run's dataset: one forward pass each
    (:func:`~hetfl.common.costs.step_flops` of one example, times `n`: matmuls and convolutions are linear in the batch)."""
    dtype = torch.long if dataset_info(cfg).kind == "text" else torch.float32
    return n * step_flops(model, model_input_shape(cfg), 1, train=False, dtype=dtype)


def make_model(cfg: dict[str, Any], width: float | None = None, seed: int | None = None) -> nn.Module:
    """The configured model, initialised deterministically from `seed` (default: the config's).

    ``model`` is a registry name or an import path ``package.module:function`` called as
    ``function(num_classes, input_shape)`` (:func:`model_input_shape`; docs/bring-your-own.md).
    """
    seed = cfg["seed"] if seed is None else seed
    info = dataset_info(cfg)
    if cfg["model"] == "text":
        from .text import build_text_model

        return build_text_model(cfg["text-model"], info.num_classes, seed)
    torch.manual_seed(seed)
    return build_model(cfg["model"], info.num_classes, model_input_shape(cfg), cfg["width"] if width is None else width)


_RECEIVED: dict[tuple, nn.Module] = {}


def received_model(cfg: dict[str, Any], arrays: ArrayRecord) -> nn.Module:
    """The configured model holding the received `arrays` (every parameter and buffer comes from them).

    Building and initialising a model only to overwrite it costs about 15 ms for the FMNIST CNN, a
    quarter of a light round's local training, so each process builds the structure once per
    (model, dataset, width) and reloads it for every message. The global torch RNG (dropout) is
    reseeded with the run's seed, as building the model did.
    """
    key = (cfg["model"], cfg["dataset"], cfg["width"], cfg["text-model"], cfg["input-column"], cfg["label-column"],
           cfg["num-classes"], cfg["text-max-length"])
    if key not in _RECEIVED:
        _RECEIVED[key] = make_model(cfg)
    torch.manual_seed(cfg["seed"])
    return arrays_to_model(_RECEIVED[key], arrays)


def model_to_arrays(model: nn.Module) -> ArrayRecord:
    """Model state (parameters and buffers) as an ArrayRecord."""
    return ArrayRecord({k: Array(v) for k, v in get_state(model).items()})


def arrays_to_model(model: nn.Module, arrays: ArrayRecord) -> nn.Module:
    """Load an ArrayRecord into `model` (keys and shapes must match)."""
    set_state(model, {k: v.numpy() for k, v in arrays.items()})
    return model


def pack_models(states: list[dict[str, np.ndarray]], skip: int | None = None) -> ArrayRecord:
    """Several model states -> one ArrayRecord with keys m<j>.<name> (model `skip` left out)."""
    return ArrayRecord({f"m{j}.{k}": Array(np.asarray(v)) for j, st in enumerate(states) if j != skip for k, v in st.items()})


def packed_key(key: str) -> tuple[int, str] | None:
    """(model j, parameter name) of a :func:`pack_models` key ``m<j>.<name>``; None for any other key."""
    head, dot, name = key.partition(".")
    return (int(head[1:]), name) if dot and head[:1] == "m" and head[1:].isdigit() else None


def unpack_models(arrays: ArrayRecord, num_models: int) -> list[dict[str, np.ndarray]]:
    """Inverse of :func:`pack_models`; a model that was left out comes back as an empty dict."""
    states: list[dict[str, np.ndarray]] = [{} for _ in range(num_models)]
    for key, arr in arrays.items():
        parsed = packed_key(key)
        if parsed is None:
            raise ValueError(f"array {key!r} is not a packed model's m<j>.<name>")
        states[parsed[0]][parsed[1]] = arr.numpy()
    return states


def round_lr(cfg: dict[str, Any], server_round: int) -> float:
    """Local lr in a round (1-based): lr * lr-decay ** floor((round - 1) / lr-decay-every).

    SHEFL: x0.99 every 10 rounds; AdaptiveFL authors: lr x 0.998^r with r counted from 0, i.e.
    lr-decay = 0.998, lr-decay-every = 1 (round 1 trains at lr). docs/training.md
    """
    return LocalSGDParams.from_config(cfg).lr_at(server_round)


def client_device(cfg: dict[str, Any]) -> torch.device:
    """The device of local training and of client-side logits (run-config `torch-device`; docs/training.md)."""
    return resolve_device(cfg["torch-device"], "torch-device")


def server_device(cfg: dict[str, Any]) -> torch.device:
    """The device of server-side evaluation (run-config `server-torch-device`, '' = `torch-device`)."""
    return resolve_device(cfg["server-torch-device"], "server-torch-device") if cfg["server-torch-device"] else client_device(cfg)


def server_threads(cfg: dict[str, Any]) -> int:
    """The ServerApp's torch threads (`server-threads`; 0: the CPUs this process may run on). Set explicitly because
    a float32 evaluation's last bits depend on the thread count (oneDNN and MKL split their work by it), and the
    count a process inherits differs by engine (OMP_NUM_THREADS, an in-process client's `client-threads`)."""
    return cfg["server-threads"] or len(os.sched_getaffinity(0))


def compute_options(cfg: dict[str, Any], server: bool = False) -> dict[str, Any]:
    """Keyword arguments `device` and `precision` for evaluate / predict_proba / member_logits / train."""
    return {"device": server_device(cfg) if server else client_device(cfg), "precision": cfg["precision"]}


def local_train(model: nn.Module, data: ArrayData, cfg: dict[str, Any], server_round: int, *,
                steps: int | None = None, epochs: int | None = None, proximal_mu: float = 0.0,
                seed_offset: int = 0, loss_fn: Callable[..., torch.Tensor] | None = None,
                normalize: Normalizer | None = None, epoch_end: Callable[[int], bool | None] | None = None) -> TrainResult:
    """Run the one training loop with the config's hyper-parameters (overridable steps/epochs) on `torch-device`;
    batches normalised with the dataset's statistics unless `normalize` says otherwise."""
    torch.set_num_threads(cfg["client-threads"])
    return train(
        model, data, Normalizer(dataset_info(cfg)) if normalize is None else normalize,
        steps=cfg["local-steps"] if steps is None else steps,
        epochs=cfg["local-epochs"] if epochs is None else epochs,
        batch_size=cfg["batch-size"], lr=round_lr(cfg, server_round), momentum=cfg["momentum"],
        weight_decay=cfg["weight-decay"], optimizer=cfg["optimizer"], lr_schedule=cfg["lr-schedule"],
        lr_min=cfg["lr-min"], proximal_mu=proximal_mu, seed=cfg["seed"] * 1_000_003 + server_round * 1009 + seed_offset,
        augment=cfg["augment"], drop_last=cfg["drop-last"], loss_fn=loss_fn, epoch_end=epoch_end, **compute_options(cfg),
    )


@dataclass(frozen=True)
class ServerEval:
    """What every method's server evaluates on, loaded once a run: the test split, its validation half (None when
    ``eval-split = "all"`` leaves none; :func:`eval_splits`), the dataset's normaliser, and the server's compute
    options (`server-torch-device`, `precision`; docs/training.md)."""

    test: ArrayData
    val: ArrayData | None
    norm: Normalizer
    opts: dict[str, Any]
    batch_size: int

    @classmethod
    def of(cls, cfg: dict[str, Any]) -> ServerEval:
        val, test = eval_splits(cfg)
        return cls(test, val, Normalizer(dataset_info(cfg)), compute_options(cfg, server=True), cfg["eval-batch-size"])

    def evaluate(self, model: nn.Module, data: ArrayData | None = None) -> tuple[float, float]:
        """(loss, accuracy) of `model` on `data` (default: the test split)."""
        return evaluate(model, self.test if data is None else data, self.norm, self.batch_size, **self.opts)

    def val_accuracy(self, model: nn.Module) -> float | None:
        """Accuracy on the validation half (what a tuner chooses on; hetfl.tune), None without one."""
        return None if self.val is None else self.evaluate(model, self.val)[1]


