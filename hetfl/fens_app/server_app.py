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
from flwr.app import ArrayRecord, Context

from hetfl.common.comm import MeteredGrid, Traffic
from hetfl.common.models import get_state, set_state
from hetfl.common.nodes import discover_clients
from hetfl.common.progress import heartbeat
from hetfl.common.results import run_recorder
from hetfl.common.rounds import run_rounds
from hetfl.common.strategy import weighted_mean
from hetfl.common.task import ServerEval, arrays_to_model, log, make_model, pack_models
from hetfl.common.rundata import num_classes
from hetfl.common.train import evaluate

from . import PHASE1
from .aggregators import STATIC, make_aggregator
from hetfl.common.oneshot.artifacts import save_ensemble, stored_phase1
from hetfl.common.oneshot.ensemble import Ensemble, build_members, cached_logits, states_digest
from hetfl.common.oneshot.server import collect_local_models, phase1_traffic
from .keys import FENSParams
from .strategy import FENS

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
    """Run FENS end to end (:meth:`FENS.start <hetfl.fens_app.strategy.FENS.start>` with the run's callbacks) and
    return the summary."""
    p = FENSParams.from_config(cfg)
    recorder = run_recorder(cfg)
    strategy = FENS.from_run_config(cfg, client_map=discover_clients(grid, cfg))
    clients = strategy.map.clients()  # by client id: the ensemble's member order is run-independent
    discovery = grid.take()
    # ---- phase 1: one-shot local training, or the saved ensemble -----------------------------
    ens = stored_phase1(cfg, recorder, "fens-reuse", PHASE1, len(clients), keep_copy=True)  # a resume finds its copy
    if ens is None:
        ens = collect_local_models(grid, strategy.map, clients, cfg, PHASE1, diff_init=p.diff_init, label="FENS phase 1")
        save_ensemble(recorder.run_dir, ens)
    # round 0 carries discovery and phase 1 as measured by the run that trained the ensemble
    # (this run, or the one a reused ensemble comes from, so totals stay comparable), and the download
    round0, taken = phase1_traffic(ens.phase1).add(discovery), Traffic().add(discovery)
    ev = ServerEval.of(cfg)  # models: server-torch-device + precision; the aggregator: server-torch-device, fp32
    agg_dev = ev.opts["device"]
    logits: dict[str, Any] = {}

    def on_ensemble(s: FENS) -> None:
        """After the download: the members' and the static aggregators' accuracy, before the aggregator's rounds."""
        round0.add(s.download)
        taken.add(s.download)  # a resumed run's traffic before its rounds
        ens_models = build_members(cfg, s.sent, p.quantize)
        logits["models"] = ens_models
        logits["test"], logits["val"] = server_logits(ens_models, s.sent, cfg, ev)
        member_acc = (logits["test"].x.argmax(2) == logits["test"].y[:, None]).mean(0)
        recorder.extra["phases"] = {
            **ens.phase1, "ensemble_download_bytes": s.download.bytes_down, "confusion_upload_bytes": s.download.bytes_up,
            "clients_ready": len(s.ready), "num_models": len(ens.states), "member_client_ids": ens.client_ids,
            "member_test_accuracy": member_acc.tolist(),
            "phase1_local_epochs": cfg["local-epochs"], "phase1_local_steps": cfg["local-steps"],
        }
        baselines = static_baselines(ens, s.confusion, logits["test"], cfg, ev)
        recorder.extra["static_aggregators_test_accuracy"] = baselines
        log.info("FENS: members' test accuracy %.3f-%.3f; FedENS (average) %.4f, weighted average %.4f, voting %.4f, "
                 "one-shot FedAvg %.4f", member_acc.min(), member_acc.max(), baselines["average"],
                 baselines["weighted-average"], baselines["voting"], baselines["oneshot-fedavg"])
        # as the paper compares them: the aggregator beside FedENS, voting and one-shot FedAvg on the same local models
        names = {"average": "FedENS (average)", "weighted-average": "weighted average", "voting": "voting",
                 "oneshot-fedavg": "one-shot FedAvg"}
        recorder.describe(f"ensemble + {p.aggregator} aggregator",
                          references={names.get(k, k): v for k, v in baselines.items() if k != p.aggregator},
                          before="phase 1 + ensemble download")
        recorder.federation(len(clients), len(s.map.hosted))

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> dict[str, Any]:
        agg = arrays_to_model(strategy.aggregator, arrays)
        loss, acc = evaluate(agg, logits["test"], torch.as_tensor, device=agg_dev)
        val_acc = evaluate(agg, logits["val"], torch.as_tensor, device=agg_dev)[1] if logits["val"] is not None else None
        return {"accuracy": acc, "loss": loss, "val_accuracy": val_acc}

    result = run_rounds(grid, strategy, ArrayRecord(), cfg, recorder, evaluate_fn, taken=taken, round0=round0,
                        start={"ensemble": ens, "on_ensemble": on_ensemble})
    # the members as the server built them from the download, and the aggregator FENS.start returned beside them
    final = {**pack_models([get_state(m) for m in logits["models"]]),
             **{k: v for k, v in result.items() if k.startswith("agg.")}}
    return recorder.finish(final, builder="hetfl.fens_app.core:inference_model", members=len(ens.states))
