"""FENS server: one-shot local training, INT8 ensemble download, FedAdam training of the aggregator.

Phases (FENS Sec. 2, Alg. 1-2): (1) the server sends the initial model (unless
``fens-diff-init``), every client trains it on 90% of its data and uploads it once; the server
saves the ensemble (``<run-dir>/ensemble.json``, FP32 models, label counts, client ids, phase-1
bytes) and quantizes the models FP32 -> INT8 (per-output-channel symmetric weights, biases/BN in
FP32); (2) it sends the ensemble to every client, which caches the ensemble's logits on its 10%
split and returns its model's confusion matrix there (for voting); (3) FedAdam trains the
aggregator for num-server-rounds rounds on those cached logits.

A resumed run (``resume = true``) and a run with ``fens-reuse`` load the saved ensemble and never
train phase 1 again; a reused one must have this run's phase-1 settings (:mod:`.artifacts`,
docs/readings.md#fens-artifacts). Rounds in metrics.json: round 0 = after
phases 1-2 (its bytes are the initial download, the upload and the ensemble download), rounds
1..R = aggregator rounds. Accuracy is reported on the test half (``eval-split``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from hetfl.common.comm import MeteredGrid, Traffic
from hetfl.common.compression import quantize_state
from hetfl.common.models import get_state, set_state
from hetfl.common.nodes import discover_clients
from hetfl.common.params import FederationParams
from hetfl.common.progress import heartbeat
from hetfl.common.results import run_recorder
from hetfl.common.rounds import record_round, run_rounds
from hetfl.common.strategy import validate_replies, weighted_mean
from hetfl.common.task import ServerEval, arrays_to_model, log, make_model, model_to_arrays, pack_models
from hetfl.common.rundata import num_classes
from hetfl.common.train import evaluate

from . import LOGITS, PHASE1
from .aggregators import STATIC, make_aggregator
from hetfl.common.oneshot.artifacts import save_ensemble, stored_phase1
from hetfl.common.oneshot.ensemble import Ensemble, build_members, cached_logits, states_digest
from hetfl.common.oneshot.server import collect_local_models, phase1_traffic
from .keys import FENSParams
from .strategy import make_strategy

def download_ensemble(grid: MeteredGrid, cmap, clients: list[int], ens: Ensemble, p: FENSParams,
                      cfg: dict[str, Any]) -> tuple[list, list, np.ndarray, Traffic, list]:
    """Phase 2's start (FENS Sec. 3.2): the (INT8) ensemble to every client, which caches its logits on its
    aggregator split and returns its own member's confusion counts there (for voting). Returns the server's copies of
    the members as sent, the states sent, the (M, C, C) confusion counts, the download's traffic and the ready
    replies."""
    M, C = len(ens.states), num_classes(cfg)
    member_of = {c: j for j, c in enumerate(ens.client_ids)}  # client id -> its model's index in the ensemble
    sent = [quantize_state(s) for s in ens.states] if p.quantize else ens.states
    ens_models = build_members(cfg, sent, p.quantize)
    msgs = []
    shared = pack_models(sent)  # one record for every client that receives all M models
    for c in clients:
        own = member_of.get(c, -1)
        rec = pack_models(sent, skip=own) if p.exclude_own and own >= 0 else shared
        conf = ConfigRecord({"num-models": M, "own-index": own, "quantized": p.quantize})
        msgs.append(cmap.message(c, RecordDict({"ensemble": rec, "config": conf}), LOGITS))

    def check_logits(r: Message) -> tuple[int, np.ndarray]:
        """The client's own member index (as sent) and its confusion counts on the aggregator split (C x C, >= 0)."""
        own = int(r.content["metrics"]["own-index"])
        if own != member_of.get(cmap.client_of(r), -1):
            raise ValueError(f"own-index {own}: this client's member is {member_of.get(cmap.client_of(r), -1)}")
        counts = r.content["confusion"]["counts"].numpy()
        if counts.shape != (C, C) or not np.issubdtype(counts.dtype, np.integer) or (counts < 0).any():
            raise ValueError(f"confusion counts of shape {counts.shape} / dtype {counts.dtype}; expected ({C}, {C}) "
                             "non-negative integers")
        return own, counts

    log.info("FENS: sending the %d-model ensemble to %d clients (they cache its logits for the aggregator)", M, len(clients))
    with heartbeat(f"FENS: ensemble download and logits on {len(clients)} clients", cfg["progress-interval"]):
        replies = cmap.send_and_receive(grid, msgs, cfg["round-timeout"])
    ready, _, _ = validate_replies(replies, check_logits, 0, cmap, set(clients))
    download = grid.take()
    confusion = np.zeros((M, C, C), np.int64)
    for _, (own, counts) in ready:
        if own >= 0:
            confusion[own] = counts
    return ens_models, sent, confusion, download, ready


def server_logits(ens_models: list, sent: list, cfg: dict[str, Any], ev: ServerEval):
    """The members' logits on the server's test (and validation) half, cached by content: every trial of a study on
    one ensemble computes them once."""
    with heartbeat(f"FENS: the {len(ens_models)} models' logits on the server's evaluation data", cfg["progress-interval"]):
        digest = states_digest(sent)
        test_z = cached_logits(ens_models, digest, ev.test, ev.norm, cfg["cache-dir"], ev.batch_size, **ev.opts)
        val_z = cached_logits(ens_models, digest, ev.val, ev.norm, cfg["cache-dir"], ev.batch_size, **ev.opts) if ev.val is not None else None
    return test_z, val_z


def static_baselines(ens: Ensemble, confusion: np.ndarray, test_z, cfg: dict[str, Any], ev: ServerEval) -> dict[str, float]:
    """FedENS (averaging), weighted averaging and voting on the same logits, and one-shot FedAvg (the data-size
    weighted average of the members' weights) on the test half: the paper's one-shot comparison points."""
    M, C = len(ens.states), num_classes(cfg)
    baselines = {}
    for name in STATIC:
        agg = make_aggregator(name, M, C, label_counts=ens.label_counts, confusion=confusion)
        baselines[name] = evaluate(agg, test_z, torch.as_tensor, device=ev.opts["device"])[1]
    oneshot = make_model(cfg)
    set_state(oneshot, weighted_mean(ens.states, ens.num_examples))
    baselines["oneshot-fedavg"] = float(ev.evaluate(oneshot)[1])
    return baselines


def run(grid: MeteredGrid, context: Context, cfg: dict[str, Any]) -> dict[str, Any]:
    """Run FENS end to end and return the summary."""
    p = FENSParams.from_config(cfg)
    recorder = run_recorder(cfg)
    cmap = discover_clients(grid, cfg)
    clients = cmap.clients()  # by client id: the ensemble's member order is run-independent
    discovery = grid.take()
    # ---- phase 1: one-shot local training, or the saved ensemble -----------------------------
    ens = stored_phase1(cfg, recorder, "fens-reuse", PHASE1, len(clients), keep_copy=True)  # a resume finds its copy
    if ens is None:
        ens = collect_local_models(grid, cmap, clients, cfg, PHASE1, diff_init=p.diff_init, label="FENS phase 1")
        save_ensemble(recorder.run_dir, ens)
    # round 0 carries discovery and phase 1 as measured by the run that trained the ensemble
    # (this run, or the one a reused ensemble comes from, so totals stay comparable)
    phase1 = phase1_traffic(ens.phase1).add(discovery)
    M, C = len(ens.states), num_classes(cfg)
    ens_models, sent, confusion, download, ready = download_ensemble(grid, cmap, clients, ens, p, cfg)
    ev = ServerEval.of(cfg)  # models: server-torch-device + precision; the aggregator: server-torch-device, fp32
    agg_dev = ev.opts["device"]
    test_z, val_z = server_logits(ens_models, sent, cfg, ev)
    member_acc = (test_z.x.argmax(2) == test_z.y[:, None]).mean(0)
    recorder.extra["phases"] = {
        **ens.phase1, "ensemble_download_bytes": download.bytes_down, "confusion_upload_bytes": download.bytes_up,
        "clients_ready": len(ready), "num_models": M, "member_client_ids": ens.client_ids,
        "member_test_accuracy": member_acc.tolist(),
        "phase1_local_epochs": cfg["local-epochs"], "phase1_local_steps": cfg["local-steps"],
    }
    baselines = static_baselines(ens, confusion, test_z, cfg, ev)
    recorder.extra["static_aggregators_test_accuracy"] = baselines
    log.info("FENS: members' test accuracy %.3f-%.3f; FedENS (average) %.4f, weighted average %.4f, voting %.4f, one-shot FedAvg %.4f",
             member_acc.min(), member_acc.max(), baselines["average"], baselines["weighted-average"], baselines["voting"],
             baselines["oneshot-fedavg"])
    # ---- phase 2: FedAdam on the aggregator --------------------------------------------------
    agg = make_aggregator(p.aggregator, M, C, p.aggregator_hidden, label_counts=ens.label_counts,
                          init=p.aggregator_init, seed=cfg["seed"], confusion=confusion)

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> dict[str, Any]:
        arrays_to_model(agg, arrays)
        loss, acc = evaluate(agg, test_z, torch.as_tensor, device=agg_dev)
        val_acc = evaluate(agg, val_z, torch.as_tensor, device=agg_dev)[1] if val_z is not None else None
        return {"accuracy": acc, "loss": loss, "val_accuracy": val_acc}

    arrays = model_to_arrays(agg)
    round0 = Traffic().add(phase1).add(download)  # the round-0 row carries phases 1-2
    # as the paper compares them: the aggregator beside FedENS, voting and one-shot FedAvg on the same local models
    names = {"average": "FedENS (average)", "weighted-average": "weighted average", "voting": "voting",
             "oneshot-fedavg": "one-shot FedAvg"}
    recorder.describe(f"ensemble + {p.aggregator} aggregator",
                      references={names.get(k, k): v for k, v in baselines.items() if k != p.aggregator},
                      before="phase 1 + ensemble download")
    recorder.federation(len(clients), len(cmap.hosted))
    if p.aggregator in STATIC or not agg.trainable:
        record_round(grid, None, recorder, 0, arrays, evaluate_fn, round0)
    else:
        arrays = run_rounds(grid, make_strategy(p, FederationParams.from_config(cfg), cmap), arrays, cfg, recorder, evaluate_fn, round0=round0,
                            taken=Traffic().add(discovery).add(download))  # a resumed run's traffic before its rounds
    final = {**pack_models([get_state(m) for m in ens_models]), **{f"agg.{k}": v for k, v in arrays.items()}}
    return recorder.finish(final, builder="hetfl.fens_app.core:inference_model", members=M)
