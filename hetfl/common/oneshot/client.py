"""One-shot phase 1, client side (FENS Sec. 3.1): train the received (or an own random) model once on local data and
upload it with the label counts; FENS and the one-shot baselines answer their phase-1 messages with it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from hetfl.data.arrays import ArrayData, label_histogram
from hetfl.common.models import get_state, set_state
from hetfl.common.task import arrays_to_model, compute_options, local_train, make_model, model_to_arrays
from hetfl.common.hosting import state_key
from hetfl.common.rundata import dataset_info, num_classes
from hetfl.common.train import Normalizer, TrainResult, evaluate

from .ensemble import split_indices, subset

OWN = "fens-own-model"  # the node-state entry of a client's own trained model (FENS's logits step reads it)


def phase1_reply(msg: Message, fit: Callable[[ArrayRecord | None, ConfigRecord], tuple[Mapping[str, Any],
                                                                                     Mapping[str, Any]]]) -> Message:
    """Phase 1's reply from a user's `fit` (FENS Sec. 3.1): ``fit(arrays or None, config) -> (state, metrics)``, the
    state (tensors or arrays) as ``arrays`` and the metrics (``num-examples``, ``label_counts``) as ``metrics``."""
    state, metrics = fit(msg.content["arrays"] if "arrays" in msg.content else None, msg.content["config"])
    arrays = ArrayRecord({k: v if isinstance(v, Array) else Array(v.detach().cpu().numpy() if hasattr(v, "detach")
                                                                  else np.asarray(v)) for k, v in state.items()})
    return Message(RecordDict({"arrays": arrays, "metrics": MetricRecord(dict(metrics))}), reply_to=msg)


def client_init_seed(cfg: dict, pid: int) -> int:
    """The seed of client `pid`'s own random initial model in phase 1 (``fens-diff-init``; FedCVAE-Ens's CVAEs)."""
    return cfg["seed"] * 1_000_003 + 7 * pid + 1


def train_and_upload(msg: Message, context: Context, cfg: dict, pid: int, local_data: ArrayData,
                     val_fraction: float = 0.0, patience: int = 0) -> Message:
    """Train the received (or, without one, this client's own random) model on `local_data`; reply with it and the
    label counts. FENS's phase 1 and the one-shot baselines' (docs/readings.md#oneshot).

    With `val_fraction` > 0 the model is trained to completion: that share of `local_data` (a seeded draw) is held
    out, the best epoch on it is kept (:func:`best_epoch_training`: accuracy, then loss), and the label counts are
    those of the rows it trained on."""
    if "arrays" in msg.content:  # the common initial model from the server
        model = arrays_to_model(make_model(cfg), msg.content["arrays"])
    else:  # fens-diff-init: this client's own random start (authors' diff_init)
        model = make_model(cfg, seed=client_init_seed(cfg, pid))
    epochs = None
    fit_idx, val_idx = (split_indices(len(local_data), 1.0 - val_fraction, cfg["seed"] * 100_019 + pid)
                        if val_fraction > 0 else ((), ()))
    if len(val_idx) and len(fit_idx):  # a client too small for a carve-out trains local-epochs
        local_data, val = subset(local_data, fit_idx), subset(local_data, val_idx)
        res, epochs = best_epoch_training(model, local_data, val, cfg, pid, patience)
    else:
        res = local_train(model, local_data, cfg, server_round=1, seed_offset=pid)
    arrays = model_to_arrays(model)
    context.state[state_key(pid, OWN)] = arrays
    return upload(msg, arrays, res, local_data, cfg, epochs)


def better_epoch(acc: float, loss: float, best_acc: float, best_loss: float) -> bool:
    """Whether an epoch scoring (`acc`, `loss`) on the held-out rows beats the best so far: higher accuracy, or equal
    accuracy and lower loss. The loss breaks ties because at strong label skew a client's held-out rows are one or
    two classes, its accuracy reaches 1.0 after one epoch and stays there while the model keeps improving
    (docs/readings.md#fens-members)."""
    return acc > best_acc or (acc == best_acc and loss < best_loss)


def best_epoch_training(model: torch.nn.Module, fit: ArrayData, val: ArrayData, cfg: dict, pid: int,
                        patience: int = 0) -> tuple[TrainResult, int]:
    """Train for at most local-epochs, score `val` after each epoch and leave `model` at the best epoch
    (:func:`better_epoch`: validation accuracy, then loss); stop after `patience` epochs without a better one
    (0: never). Returns the training result and the number of epochs kept."""
    norm = Normalizer(dataset_info(cfg))
    best = {"acc": -1.0, "loss": float("inf"), "epoch": -1, "state": None}

    def epoch_end(epoch: int) -> bool:
        loss, acc = evaluate(model, val, norm, cfg["eval-batch-size"], **compute_options(cfg)) if len(val) else (0.0, 0.0)
        if better_epoch(acc, loss, best["acc"], best["loss"]):
            best.update(acc=acc, loss=loss, epoch=epoch, state={k: v.copy() for k, v in get_state(model).items()})
        return bool(patience) and epoch - best["epoch"] >= patience

    res = local_train(model, fit, cfg, server_round=1, seed_offset=pid, epoch_end=epoch_end)
    if best["state"] is not None:
        set_state(model, best["state"])
    return res, best["epoch"] + 1


def upload(msg: Message, arrays: ArrayRecord, res: TrainResult, local_data: ArrayData, cfg: dict,
           epochs: int | None = None) -> Message:
    """Phase 1's reply: the trained `arrays` with the local data's size, label counts and training loss/time (and
    the epochs kept, for a model trained to completion): hetfl's own :func:`phase1_reply`."""
    counts = label_histogram(local_data.y, num_classes(cfg)).tolist()
    metrics = {"num-examples": len(local_data), "train_loss": res.loss, "train_s": res.seconds,
               "train_flops": res.flops, "label_counts": counts, **({"epochs": int(epochs)} if epochs is not None else {})}
    return phase1_reply(msg, lambda _arrays, _config: (arrays, metrics))
