"""One-shot baselines' client: the shared phase-1 handler on all of the client's data (no 90/10 split); FedCVAE-Ens's
handler trains a conditional VAE instead and uploads its decoder."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message

from hetfl.common.oneshot.client import client_init_seed, phase1_reply, train_and_upload, upload
from hetfl.common.task import local_train, model_to_arrays
from hetfl.common.hosting import message_client
from hetfl.common.rundata import client_data, dataset_info, model_input_shape, num_classes

from .cvae import batch_loss, make_cvae, unit_normalizer
from .keys import FedCVAEParams, OneShotParams


def local(msg: Message, context: Context, cfg: dict[str, Any]) -> Message:
    """Train the received initial model on the whole partition (FedKD, Fed-ET, Co-Boosting clients), to completion
    on a held-out share when ``oneshot-member-val-fraction`` asks; upload it once."""
    pid = message_client(msg, context, cfg)
    p = OneShotParams.from_config(cfg)
    return train_and_upload(msg, context, cfg, pid, client_data(context, cfg, pid), p.member_val_fraction,
                            p.member_patience)


def cvae_local(msg: Message, context: Context, cfg: dict[str, Any]) -> Message:
    """FedCVAE-Ens client (authors' ``UserFedCVAE.train``): train this client's own randomly initialised CVAE on all
    its data, pixels in [0, 1], with the run's local-training keys; upload the decoder and the label counts once."""
    p = FedCVAEParams.from_config(cfg)
    pid = message_client(msg, context, cfg)
    data = client_data(context, cfg, pid)
    model = make_cvae(model_input_shape(cfg), num_classes(cfg), p.z_dim, seed=client_init_seed(cfg, pid))
    gen = torch.Generator().manual_seed(cfg["seed"] * 7919 + 13 * pid + 5)  # the reparameterisation noise
    res = local_train(model, data, cfg, server_round=1, seed_offset=pid, normalize=unit_normalizer(dataset_info(cfg)),
                      loss_fn=lambda m, x, y: batch_loss(m, x, y, p.beta, gen))
    return upload(msg, model_to_arrays(model.decoder), res, data, cfg)


def oneshot_local_train(msg: Message, fit: Callable[[ArrayRecord | None, ConfigRecord], tuple[Mapping[str, Any],
                                                                                            Mapping[str, Any]]]) -> Message:
    """A one-shot baseline's client reply (FENS Sec. 3.1, on all of the client's data): its model trained once by
    `fit` and uploaded with its label counts (:func:`~hetfl.common.oneshot.client.phase1_reply`). The message
    contract is docs/api.md#the-one-shot-baselines.

    Parameters
    ----------
    msg : Message
        A ``train.oneshot_local`` message (FedKD, Fed-ET, Co-Boosting): ``arrays`` (the initial model) and ``config``
        (``start``'s ``train_config`` and ``server-round`` 0); or a ``train.fedcvae_local`` one (FedCVAE-Ens):
        ``config`` only, the client trains its own CVAE.
    fit : callable
        ``fit(arrays or None, config) -> (trained state, metrics)``: the trained model's state (FedCVAE-Ens: its
        decoder's) and metrics with ``num-examples`` and ``label_counts`` (one count per class).
    """
    return phase1_reply(msg, fit)
