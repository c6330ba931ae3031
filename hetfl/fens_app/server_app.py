"""FENS server: one-shot local training, INT8 ensemble download, FedAdam training of the aggregator.

Phases (FENS Sec. 2, Alg. 1-2): (1) every client trains its model (initialised from the
run seed, so nothing is downloaded) on 90% of its data and uploads it once; the server quantizes the models FP32 -> INT8 (per-output-channel
symmetric weights, biases/BN in FP32) and (2) sends the ensemble to every client, which
caches the ensemble's logits on its 10% split; (3) Flower's FedAdam trains the
aggregator for num-server-rounds rounds on those cached logits. The central test split
is halved into validation and test; accuracy is reported on the test half.
Rounds in metrics.json: round 0 = after phases 1-2 (its bytes are the upload and the
ensemble download), rounds 1..R = aggregator rounds.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from hetfl.common.comm import MeteredGrid
from hetfl.common.compression import quantize_state
from hetfl.common.data import ArrayData
from hetfl.common.models import get_state, set_state
from hetfl.common.nodes import discover_nodes
from hetfl.common.strategy import check_arrays, check_weight, validate_replies
from hetfl.common.results import RunRecorder
from hetfl.common.rounds import run_rounds
from hetfl.common.task import arrays_to_model, compute_options, dataset_threshold, log, make_model, model_to_arrays, num_classes, pack_models, test_data
from hetfl.common.train import Normalizer, evaluate

from . import LOCAL, LOGITS
from .aggregators import STATIC, make_aggregator
from .core import build_members, ensemble_logits
from .strategy import AggregatorFedAdam


def run(grid: MeteredGrid, context: Context, cfg: dict[str, Any]) -> dict[str, Any]:
    """Run FENS end to end and return the summary."""
    recorder = RunRecorder(cfg, dataset_threshold(cfg))
    directory = discover_nodes(grid, cfg)
    nodes = directory.order(list(directory.info))  # by client id: the ensemble's member order is run-independent
    timeout = cfg["round-timeout"]
    # ---- phase 1: one-shot local training ---------------------------------------------
    t0 = time.perf_counter()
    init = RecordDict({"config": ConfigRecord({"server-round": 0})})  # clients build the seeded initial model
    raw = grid.send_and_receive([Message(init, message_type=LOCAL, dst_node_id=n) for n in nodes], timeout=timeout)
    expected = {k: tuple(v.shape) for k, v in get_state(make_model(cfg)).items()}

    def check(r: Message) -> tuple[dict[str, np.ndarray], float]:  # a diverged model would make every prediction NaN
        return check_arrays(r.content["arrays"], expected), check_weight(r.content["metrics"]["num-examples"])

    valid, _, rejected = validate_replies(raw, check, 0)
    valid.sort(key=lambda pair: directory.client_of(pair[0].metadata.src_node_id))
    for r, (_, n) in valid:
        if n == 0:  # e.g. Dir(0.01) leaves some clients without data
            log.warning("FENS: node %d has no local training data; its (untrained) model is left out", r.metadata.src_node_id)
    rejected += sum(n == 0 for _, (_, n) in valid)
    replies = [r for r, (_, n) in valid if n > 0]
    states = [st for _, (st, n) in valid if n > 0]
    if not replies:
        raise RuntimeError("FENS: no client returned a usable local model")
    counts = np.array([r.content["metrics"]["label_counts"] for r in replies], dtype=np.int64)
    members = [r.metadata.src_node_id for r in replies]
    M, C = len(states), num_classes(cfg)
    phase1 = grid.take()
    phase1_s = time.perf_counter() - t0
    log.info("FENS phase 1: %d local models in %.1fs (%.1f MB up)", M, phase1_s, phase1.bytes_up / 1e6)
    # ---- ensemble download (INT8) and logit caching ------------------------------------------
    sent = [quantize_state(s) for s in states] if cfg["fens-quantize"] else states
    ens_models = build_members(cfg, sent, cfg["fens-quantize"])
    msgs = []
    for n in nodes:
        own = members.index(n) if n in members else -1
        rec = pack_models(sent, skip=own if cfg["fens-exclude-own"] and own >= 0 else None)
        conf = ConfigRecord({"num-models": M, "own-index": own if cfg["fens-exclude-own"] else -1,
                             "quantized": cfg["fens-quantize"]})
        msgs.append(Message(RecordDict({"ensemble": rec, "config": conf}), message_type=LOGITS, dst_node_id=n))
    ready = [r for r in grid.send_and_receive(msgs, timeout=timeout) if not r.has_error()]
    download = grid.take()
    # ---- server-side evaluation data: logits of the ensemble on validation / test halves ------
    data, norm = test_data(cfg), Normalizer(cfg["dataset"])
    half = len(data) // 2
    opts = compute_options(cfg, server=True)  # models: server-device + precision; the aggregator: server-device, fp32
    agg_dev = opts["device"]
    z_all = ensemble_logits(ens_models, data, norm, cfg["eval-batch-size"], **opts)
    val_z, test_z = ArrayData(z_all[:half], data.y[:half]), ArrayData(z_all[half:], data.y[half:])
    member_acc = (test_z.x.argmax(2) == test_z.y[:, None]).mean(0)
    recorder.extra["phases"] = {
        "upload_bytes": phase1.bytes_up, "phase1_request_bytes": phase1.bytes_down,
        "ensemble_download_bytes": download.bytes_down, "clients_ready": len(ready), "num_models": M, "rejected_models": rejected,
        "member_test_accuracy": member_acc.tolist(),
        # timing of phase 1 (local training of all clients, upload included) vs phase 2 (mean_round_s in the summary)
        "phase1_wall_s": phase1_s, "phase1_local_epochs": cfg["local-epochs"], "phase1_local_steps": cfg["local-steps"],
        "phase1_client_train_s": [float(r.content["metrics"]["train_s"]) for r in replies],
    }
    baselines = {}
    for name in STATIC:
        agg = make_aggregator(name, M, C, label_counts=counts)
        baselines[name] = evaluate(agg, test_z, torch.as_tensor, device=agg_dev)[1]
    # one-shot FedAvg on the same local models: the data-size-weighted average of their weights
    sizes = np.array([float(r.content["metrics"]["num-examples"]) for r in replies])
    avg_state = {k: (sum(w * st[k].astype(np.float64) for w, st in zip(sizes / sizes.sum(), states, strict=True))).astype(states[0][k].dtype)
                 for k in states[0]}
    oneshot = make_model(cfg)
    set_state(oneshot, avg_state)
    baselines["oneshot-fedavg"] = float(evaluate(oneshot, ArrayData(data.x[half:], data.y[half:]), norm, cfg["eval-batch-size"],
                                                 **opts)[1])
    recorder.extra["static_aggregators_test_accuracy"] = baselines
    log.info("FENS: members' test accuracy %.3f-%.3f; FedENS (average) %.4f, weighted average %.4f, one-shot FedAvg %.4f",
             member_acc.min(), member_acc.max(), baselines["average"], baselines["weighted-average"], baselines["oneshot-fedavg"])
    # ---- phase 2: FedAdam on the aggregator --------------------------------------------------
    agg = make_aggregator(cfg["aggregator"], M, C, cfg["aggregator-hidden"], label_counts=counts)

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        arrays_to_model(agg, arrays)
        loss, acc = evaluate(agg, test_z, torch.as_tensor, device=agg_dev)
        _, val_acc = evaluate(agg, val_z, torch.as_tensor, device=agg_dev)
        traffic = grid.take()
        if server_round == 0:  # this row carries phases 1-2
            traffic.add(phase1).add(download)
        recorder.record(server_round, acc, loss, traffic.bytes_down, traffic.bytes_up, val_accuracy=val_acc,
                        comm_s=traffic.comm_s, replies=traffic.replies, failures=traffic.failures)
        return MetricRecord({"accuracy": acc, "loss": loss})

    arrays = model_to_arrays(agg)
    if cfg["aggregator"] in STATIC or not agg.trainable:
        evaluate_fn(0, arrays)
    else:
        strategy = AggregatorFedAdam(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=1,
                           min_available_nodes=1, eta=cfg["agg-server-lr"],  # nodes were awaited in phase 1
                           eta_l=cfg["agg-client-lr"], beta_1=0.9, beta_2=0.99, tau=1e-9).bind(directory, cfg["seed"], timeout)
        run_rounds(grid, strategy, arrays, cfg, recorder, evaluate_fn)
    return recorder.finish()
