"""Server of FENS's one-shot baselines: FENS's phase 1, then FedKD's, Fed-ET's or Co-Boosting's server step.

Phase 1 is FENS's (``hetfl.fens_app.server_app.collect_local_models``): the server sends the initial model,
every client trains it on all its data and uploads it once with its label counts (FP32: FedKD without inference quantization, as FENS
runs it). The server then trains one model (the student, starting from that initial model) from the ensemble:

- FedKD: distil the label-count-weighted teacher's logits on the auxiliary set ``server-holdout`` (L1 on logits);
- Fed-ET: distil the members' weighted consensus with the diversity regularization on the same set;
- Co-Boosting: no data; synthesise hard samples with a generator, re-weight the members, distil.

The server saves the ensemble (``<run-dir>/ensemble.json``, as FENS does); a run with ``oneshot-reuse`` starts from
one saved by an earlier run with the same phase-1 settings (FedKD's and Fed-ET's phase 1 are the same) and reports
that run's phase-1 bytes and times, with ``phase1_reused_from`` naming it (docs/readings.md#fens-artifacts).

Rows in metrics.json: round 0 = the untrained student, carrying node discovery and phase 1's bytes; rounds 1..E =
the student after each server epoch (no traffic); ``phases.server_step_s`` is the server step's wall time without
the per-epoch evaluation and recording of the student. docs/readings.md#oneshot
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from flwr.app import Context

from hetfl.common.comm import MeteredGrid, Traffic
from hetfl.common.data import ArrayData, DataSpec, load_server_set
from hetfl.common.nodes import discover_clients
from hetfl.common.results import RunRecorder
from hetfl.common.rounds import record_round
from hetfl.common.task import (compute_options, dataset_threshold, eval_splits, log, make_model, model_input_shape,
                               model_to_arrays, num_classes)
from hetfl.common.train import Normalizer, evaluate, train
from hetfl.fens_app.artifacts import save_ensemble
from hetfl.fens_app.core import build_members, ensemble_logits
from hetfl.fens_app.server_app import collect_local_models, saved_ensemble

from . import LOCAL
from .coboost import co_boost
from .core import fedet_loss, fedet_targets, fedkd_loss, fedkd_teacher, fedkd_weights
from .keys import CoBoostParams, FedETParams, FedKDParams


def _distill(student: torch.nn.Module, x: np.ndarray, targets: tuple[torch.Tensor, ...], loss: Any, *, epochs: int,
             batch_size: int, lr: float, lr_min: float, cfg: dict[str, Any], epoch_end: Any) -> None:
    """FedKD's and Fed-ET's server loop: Adam over the auxiliary images through the one training loop, per-epoch
    cosine lr, targets indexed by each sample's row (``loss(student_logits, *targets_of_the_batch)``)."""
    index = ArrayData(x, np.arange(len(x), dtype=np.int64))

    def loss_fn(model: torch.nn.Module, xb: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        r = rows.cpu()
        return loss(model(xb).float(), *(t[r].to(xb.device) for t in targets))

    train(student, index, Normalizer(cfg["dataset"]), epochs=epochs, batch_size=batch_size, lr=lr, optimizer="adam",
          lr_schedule="cosine-epoch", lr_min=lr_min, seed=cfg["seed"] * 7919 + 17, augment=cfg["augment"],
          loss_fn=loss_fn, epoch_end=epoch_end, **compute_options(cfg, server=True))


def run(grid: MeteredGrid, context: Context, cfg: dict[str, Any]) -> dict[str, Any]:
    """Run FedKD, Fed-ET or Co-Boosting end to end and return the summary."""
    method = cfg["method"]
    recorder = RunRecorder(cfg, dataset_threshold(cfg))
    cmap = discover_clients(grid, cfg)
    clients = cmap.clients()
    discovery = grid.take()
    saved = saved_ensemble(cfg, recorder.run_dir, "oneshot-reuse", LOCAL, len(clients))
    if saved is None:
        ens = collect_local_models(grid, cmap, clients, cfg, message_type=LOCAL)
        save_ensemble(recorder.run_dir, ens)
    else:  # the phase 1 of an earlier run with the same settings: its bytes and times are this run's too
        ens, source = saved
        log.info("%s: phase 1 skipped; %d-model ensemble loaded from %s (trained by an earlier run)", method,
                 len(ens.states), source)
        recorder.extra["phase1_reused_from"] = str(source)
    round0 = Traffic(down={0: ens.phase1["phase1_request_bytes"]}, up={0: ens.phase1["upload_bytes"]}).add(discovery)
    members = build_members(cfg, ens.states, quantized=False)
    val, test = eval_splits(cfg)
    norm = Normalizer(cfg["dataset"])
    opts = compute_options(cfg, server=True)
    bs = cfg["eval-batch-size"]
    test_z = torch.as_tensor(ensemble_logits(members, test, norm, bs, **opts))  # (N, M, C)
    test_y = torch.as_tensor(test.y)
    student = make_model(cfg)  # the initial model phase 1 sent: FedKD's central model starts from it too

    def evaluate_fn(_round: int, _arrays: Any) -> dict[str, Any]:
        loss, acc = evaluate(student, test, norm, bs, **opts)
        return {"accuracy": acc, "loss": loss,
                "val_accuracy": evaluate(student, val, norm, bs, **opts)[1] if val is not None else None}

    recording_s = [0.0]  # the per-epoch evaluation and row inside the server step (recording, not the method's work)

    def record(server_round: int, also: Traffic | None = None) -> None:
        t0 = time.perf_counter()
        record_round(grid, None, recorder, server_round, model_to_arrays(student), evaluate_fn, also)
        recording_s[0] += time.perf_counter() - t0 if server_round else 0.0

    phases = {**ens.phase1, "num_models": len(ens.states), "member_client_ids": ens.client_ids,
              "member_test_accuracy": (test_z.argmax(2) == test_y[:, None]).float().mean(0).tolist(),
              "phase1_local_epochs": cfg["local-epochs"], "phase1_local_steps": cfg["local-steps"]}
    recorder.extra["phases"] = phases
    if "phase1_reused_from" in recorder.extra:
        phases["phase1_reused_from"] = recorder.extra["phase1_reused_from"]
    recorder.stage(clients=list(ens.client_ids))
    record(0, round0)
    t_step = time.perf_counter()
    if method in ("fedkd", "fedet"):
        held = load_server_set(DataSpec.from_config(cfg, 1), cfg["cache-dir"])  # its labels are never read
        z = torch.as_tensor(ensemble_logits(members, ArrayData(held.x, np.zeros(len(held.x), np.int64)), norm, bs, **opts))
        phases["auxiliary_samples"] = len(held.x)
        if method == "fedkd":
            p = FedKDParams.from_config(cfg)
            w = fedkd_weights(ens.label_counts, p.weighting)
            teacher = fedkd_teacher(test_z, w)
            targets: tuple[torch.Tensor, ...] = (fedkd_teacher(z, w),)
            loss = lambda s, t: fedkd_loss(s, t, p.loss)  # noqa: E731
            epochs, batch, lr, lr_min = p.epochs, p.batch_size, p.lr, p.lr_min
        else:
            p = FedETParams.from_config(cfg)
            teacher = fedet_targets(test_z)[0]
            targets = fedet_targets(z)
            loss = lambda s, c, d, h: fedet_loss(s, c, d, h, p.lam)  # noqa: E731
            epochs, batch, lr, lr_min = p.epochs, p.batch_size, p.lr, p.lr
        phases["teacher_test_accuracy"] = float((teacher.argmax(1) == test_y).float().mean())
        _distill(student, held.x, targets, loss, epochs=epochs, batch_size=batch, lr=lr, lr_min=lr_min, cfg=cfg,
                 epoch_end=lambda e: record(e + 1))
    else:
        p = CoBoostParams.from_config(cfg)
        phases["teacher_test_accuracy_uniform"] = float((test_z.mean(1).argmax(1) == test_y).float().mean())
        weights = co_boost(members, student, p, model_input_shape(cfg), num_classes(cfg), norm, cfg["seed"] * 7919 + 23,
                           opts["device"], epoch_end=lambda e, _w: record(e + 1))
        weighted = (test_z * weights[None, :, None]).sum(1) / weights.sum()
        phases["teacher_test_accuracy"] = float((weighted.argmax(1) == test_y).float().mean())
        phases["member_weights"] = weights.tolist()
    phases["server_step_s"] = time.perf_counter() - t_step - recording_s[0]
    phases["server_step_recording_s"] = recording_s[0]
    log.info("%s: ensemble of %d models, teacher %.4f on the test set", method, len(ens.states), phases["teacher_test_accuracy"])
    recorder.describe(f"{method} student (one model distilled on the server)",
                      references={"teacher (the clients' ensemble)": phases["teacher_test_accuracy"]},
                      before="phase 1 (one-shot upload)")
    return recorder.finish(model_to_arrays(student))
