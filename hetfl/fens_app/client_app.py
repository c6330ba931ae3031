"""FENS client: phase 1 local training (once), caching the ensemble's logits, phase 2 aggregator steps."""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict

from hetfl.common.compression import quantize_state
from hetfl.common.data import ArrayData, label_histogram
from hetfl.common.task import arrays_to_model, client_data, client_device, compute_options, config_of, dataset_info, local_train, make_model, message_client, model_to_arrays, num_classes, state_key, unpack_models
from hetfl.common.train import Normalizer, TrainResult, train

from .aggregators import confusion_counts, make_aggregator
from .core import build_members, cached_logits, split_indices, states_digest, subset
from .keys import FENSParams

OWN, CACHE = "fens-own-model", "fens-logits"


def _splits(context: Context, cfg: dict, pid: int) -> tuple[ArrayData, ArrayData]:
    data = client_data(context, cfg, pid)
    local_idx, agg_idx = split_indices(len(data), FENSParams.from_config(cfg).local_fraction, cfg["seed"] * 100_003 + pid)
    return subset(data, local_idx), subset(data, agg_idx)


def client_init_seed(cfg: dict, pid: int) -> int:
    """The seed of client `pid`'s own random initial model in phase 1 (``fens-diff-init``; FedCVAE-Ens's CVAEs)."""
    return cfg["seed"] * 1_000_003 + 7 * pid + 1


def local(msg: Message, context: Context) -> Message:
    """Phase 1: train the local model to completion on the 90% split; upload it once with label counts."""
    cfg = config_of(context)
    pid = message_client(msg, context, cfg)
    return train_and_upload(msg, context, cfg, pid, _splits(context, cfg, pid)[0],
                            FENSParams.from_config(cfg).member_val_fraction)


def train_and_upload(msg: Message, context: Context, cfg: dict, pid: int, local_data: ArrayData,
                     val_fraction: float = 0.0) -> Message:
    """Train the received (or, without one, this client's own random) model on `local_data`; reply with it and the
    label counts. FENS's phase 1 and the one-shot baselines' (docs/readings.md#oneshot).

    With `val_fraction` > 0 the model is trained to completion: that share of `local_data` (a seeded draw) is held
    out, the epoch of best accuracy on it is kept (:func:`best_epoch_training`), and the label counts are those of
    the rows it trained on."""
    if "arrays" in msg.content:  # the common initial model from the server
        model = arrays_to_model(make_model(cfg), msg.content["arrays"])
    else:  # fens-diff-init: this client's own random start (authors' diff_init)
        model = make_model(cfg, seed=client_init_seed(cfg, pid))
    epochs = None
    fit_idx, val_idx = split_indices(len(local_data), 1.0 - val_fraction, cfg["seed"] * 100_019 + pid)
    if val_fraction > 0 and len(val_idx) and len(fit_idx):  # a client too small for a carve-out trains local-epochs
        local_data, val = subset(local_data, fit_idx), subset(local_data, val_idx)
        res, epochs = best_epoch_training(model, local_data, val, cfg, pid)
    else:
        res = local_train(model, local_data, cfg, server_round=1, seed_offset=pid)
    arrays = model_to_arrays(model)
    context.state[state_key(pid, OWN)] = arrays
    return upload(msg, arrays, res, local_data, cfg, epochs)


def best_epoch_training(model: torch.nn.Module, fit: ArrayData, val: ArrayData, cfg: dict, pid: int) -> tuple[TrainResult, int]:
    """Train for at most local-epochs, score `val` after each epoch and leave `model` at the epoch of best validation
    accuracy (the earliest on ties); stop after fens-member-patience epochs without a better one (0: never).
    Returns the training result and the number of epochs kept."""
    from hetfl.common.models import get_state, set_state
    from hetfl.common.train import evaluate

    patience = FENSParams.from_config(cfg).member_patience
    norm = Normalizer(dataset_info(cfg))
    best = {"acc": -1.0, "epoch": -1, "state": None}

    def epoch_end(epoch: int) -> bool:
        acc = evaluate(model, val, norm, cfg["eval-batch-size"], **compute_options(cfg))[1] if len(val) else 0.0
        if acc > best["acc"]:
            best.update(acc=acc, epoch=epoch, state={k: v.copy() for k, v in get_state(model).items()})
        return bool(patience) and epoch - best["epoch"] >= patience

    res = local_train(model, fit, cfg, server_round=1, seed_offset=pid, epoch_end=epoch_end)
    if best["state"] is not None:
        set_state(model, best["state"])
    return res, best["epoch"] + 1


def upload(msg: Message, arrays: ArrayRecord, res: TrainResult, local_data: ArrayData, cfg: dict,
           epochs: int | None = None) -> Message:
    """Phase 1's reply: the trained `arrays` with the local data's size, label counts and training loss/time (and
    the epochs kept, for a model trained to completion)."""
    counts = label_histogram(local_data.y, num_classes(cfg)).tolist()
    metrics = MetricRecord({"num-examples": len(local_data), "train_loss": res.loss, "train_s": res.seconds,
                            "label_counts": counts, **({"epochs": int(epochs)} if epochs is not None else {})})
    return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)


def logits(msg: Message, context: Context) -> Message:
    """Receive the (INT8) ensemble, compute its logits on the 10% split once and cache them in the node state.

    Replies with the confusion counts of this client's own member on the 10% split (for voting).
    """
    cfg = config_of(context)
    pid = message_client(msg, context, cfg)
    conf = msg.content["config"]
    M, own = int(conf["num-models"]), int(conf["own-index"])
    states = unpack_models(msg.content["ensemble"], M)
    if own >= 0 and not states[own]:  # not sent (fens-exclude-own): use the local copy, quantized like the others
        st = {k: v.numpy() for k, v in context.state[state_key(pid, OWN)].items()}
        states[own] = quantize_state(st) if bool(conf["quantized"]) else st
    models = build_members(cfg, states, bool(conf["quantized"]))
    _, agg_data = _splits(context, cfg, pid)
    torch.set_num_threads(cfg["client-threads"])
    z = cached_logits(models, states_digest(states), agg_data, Normalizer(dataset_info(cfg)), cfg["cache-dir"],
                      **compute_options(cfg)).x  # once per ensemble and split (a study's trials reuse them)
    context.state[state_key(pid, CACHE)] = ArrayRecord({"z": Array(z), "y": Array(agg_data.y)})
    C = num_classes(cfg)
    counts = confusion_counts(z[:, own], agg_data.y, C) if own >= 0 else np.zeros((C, C), np.int64)
    return Message(RecordDict({"metrics": MetricRecord({"num-examples": len(agg_data), "own-index": own}),
                               "confusion": ArrayRecord({"counts": Array(counts)})}), reply_to=msg)


def train_aggregator(msg: Message, context: Context) -> Message:
    """Phase 2 (one FedAdam round): a few SGD steps of the aggregator on the cached logits."""
    cfg = config_of(context)
    p = FENSParams.from_config(cfg)
    pid = message_client(msg, context, cfg)
    cache = context.state[state_key(pid, CACHE)]
    data = ArrayData(cache["z"].numpy(), cache["y"].numpy())
    _, M, C = data.x.shape
    agg = arrays_to_model(make_aggregator(p.aggregator, M, C, p.aggregator_hidden), msg.content["arrays"])
    rnd = int(msg.content["config"]["server-round"])
    res = train(agg, data, torch.as_tensor, steps=p.agg_local_steps, batch_size=p.agg_batch_size,
                lr=p.agg_client_lr, seed=cfg["seed"] * 7919 + rnd * 31 + pid,
                device=client_device(cfg))  # the aggregator stays fp32 (docs/training.md)
    # the authors weight a client by the samples it saw this round: min(n_i, batch x steps) (docs/readings.md#fens-phase2)
    seen = len(data) if p.adam.update == "flower" else min(len(data), p.agg_batch_size * p.agg_local_steps)
    metrics = MetricRecord({"num-examples": seen, "train_loss": res.loss})
    return Message(RecordDict({"arrays": model_to_arrays(agg), "metrics": metrics}), reply_to=msg)
