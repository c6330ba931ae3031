"""Server of FENS's one-shot baselines: FENS's phase 1, then FedKD's, Fed-ET's, Co-Boosting's or FedCVAE-Ens's
server step.

Each is a strategy of :mod:`.strategy` run through its ``start`` with the run's callbacks. Phase 1 is
FENS's: the server sends the initial model,
every client trains it on all its data and uploads it once with its label counts (FP32: FedKD without inference quantization, as FENS
runs it). The server then trains one model (the student, starting from that initial model) from the ensemble:

- FedKD: distil the label-count-weighted teacher's logits on the auxiliary set ``server-holdout`` (L1 on logits);
- Fed-ET: distil the members' weighted consensus with the diversity regularization on the same set;
- Co-Boosting: no data; synthesise hard samples with a generator, re-weight the members, distil.
- FedCVAE-Ens: the clients train CVAEs and upload only their decoders (no model goes down); the server decodes a
  synthetic labelled set (labels per client's label counts, z from a truncated N(0, I)) and trains the model on it.

A FedKD, Fed-ET or Co-Boosting run that trains its phase 1 saves the ensemble (``<run-dir>/ensemble.json``, as FENS
does); a run with ``oneshot-reuse`` starts from one saved by an earlier run with the same phase-1 settings (FedKD's
and Fed-ET's phase 1 are the same), saves no copy, and reports that run's phase-1 bytes and times, with
``phase1_reused_from`` naming it. FedCVAE-Ens saves nothing (its decoders are no classifier ensemble)
(docs/readings.md#fens-artifacts). FedKD and Fed-ET checkpoint the student and the distillation's state after every
server epoch (``checkpoint``) and a run with ``resume`` goes on from there with its own or its reused ensemble
(docs/checkpoints.md#server-epochs); Co-Boosting and FedCVAE-Ens run to the end in one go.

Rows in metrics.json: round 0 = the untrained student, carrying node discovery and phase 1's bytes; rounds 1..E =
the student after each server epoch (no traffic); ``phases.server_step_s`` is the server step's wall time without
the per-epoch evaluation and recording of the student. docs/readings.md#oneshot
"""

from __future__ import annotations

from typing import Any

import torch
from flwr.app import Context

from hetfl.common.comm import MeteredGrid, Traffic
from hetfl.common.nodes import discover_clients
from hetfl.common.oneshot.artifacts import phase1_settings, save_ensemble, stored_phase1
from hetfl.common.oneshot.server import phase1_traffic
from hetfl.common.results import run_recorder
from hetfl.common.rounds import Checkpointing, Evaluation
from hetfl.common.task import ServerEval, arrays_to_model, log, make_model, model_to_arrays

from . import CVAE_PHASE1, METHOD, PHASE1
from .strategy import CoBoosting, FedCVAEEns, FedET, FedKD, OneShotStrategy

STRATEGIES: dict[str, type[OneShotStrategy]] = {"fedkd": FedKD, "fedet": FedET, "coboost": CoBoosting,
                                                "fedcvae": FedCVAEEns}
"""run-config ``method`` -> its strategy."""


def run(grid: MeteredGrid, context: Context, cfg: dict[str, Any]) -> dict[str, Any]:
    """Run FedKD, Fed-ET, Co-Boosting or FedCVAE-Ens end to end (the strategy's ``start`` with the run's
    evaluation callback) and return the summary."""
    method = cfg["method"]
    cls = STRATEGIES[method]
    recorder = run_recorder(cfg)
    recorder.rows = METHOD.params_for(cfg).epochs  # a row per server epoch ("[round e/E]" in the log), not rounds
    strategy = cls.from_run_config(cfg, client_map=discover_clients(grid, cfg))
    clients = strategy.map.clients()
    round0 = Traffic().add(grid.take())  # discovery, then phase 1's (this run's or the reused run's)
    phase1 = PHASE1 if strategy.distills else CVAE_PHASE1
    # FedKD's, Fed-ET's and Co-Boosting's phase 1 may be an earlier run's; FedCVAE-Ens's decoders are never saved
    reused = stored_phase1(cfg, recorder, "oneshot-reuse", PHASE1, len(clients), keep_copy=False) if strategy.distills else None
    ev = ServerEval.of(cfg)
    test_y = torch.as_tensor(ev.test.y)
    test: dict[str, torch.Tensor] = {}
    phases: dict[str, Any] = {}

    def on_ensemble(s: OneShotStrategy) -> None:
        """After phase 1: save a trained ensemble, record phase 1, the members' test logits."""
        ens = s.ensemble
        if reused is None and s.distills:
            ens.settings = phase1_settings(cfg, phase1, len(clients))
            save_ensemble(recorder.run_dir, ens)
        round0.add(phase1_traffic(ens.phase1))
        phases.update(**ens.phase1, num_models=len(ens.states), member_client_ids=ens.client_ids,
                      phase1_local_epochs=cfg["local-epochs"], phase1_local_steps=cfg["local-steps"])
        if s.members is not None:
            test["z"] = torch.as_tensor(s.member_logits(ev.test.x))  # (N, M, C)
            phases["member_test_accuracy"] = (test["z"].argmax(2) == test_y[:, None]).float().mean(0).tolist()
        if "phase1_reused_from" in recorder.extra:
            phases["phase1_reused_from"] = recorder.extra["phase1_reused_from"]
        recorder.extra["phases"] = phases

    student = make_model(cfg)  # the initial model phase 1 sends; the student starts from it too

    def evaluate_fn(_round: int, arrays: Any) -> dict[str, Any]:
        arrays_to_model(student, arrays)
        loss, acc = ev.evaluate(student)
        return {"accuracy": acc, "loss": loss, "val_accuracy": ev.val_accuracy(student)}

    # the rows are server epochs: hetfl.tune's pruner (grid.callbacks) is not given them; FedKD and Fed-ET write a
    # checkpoint after each (checkpoint = true) and resume from it (resume = true), as an iterative run's rounds
    callbacks = [Evaluation(grid, strategy, recorder, evaluate_fn, round0)]
    if strategy.resumable:
        callbacks.append(Checkpointing(grid, strategy, recorder, cfg))
    with recorder.flushing():
        result = strategy.start(grid, model_to_arrays(student), num_rounds=1, timeout=cfg["round-timeout"],
                                callbacks=callbacks, progress=cfg["progress-interval"], ensemble=reused,
                                on_ensemble=on_ensemble, stop_after=cfg["stop-after-round"])  # 0 but for FedKD / Fed-ET (keys.check)
    _describe(strategy, method, test.get("z"), test_y, phases, recorder)
    return recorder.finish(result.arrays)


def _describe(strategy: OneShotStrategy, method: str, test_z: torch.Tensor | None, test_y: torch.Tensor,
              phases: dict[str, Any], recorder: Any) -> None:
    """The server step's phases in metrics.json (times, the teacher's test accuracy or the synthetic set) and the
    run's description."""
    phases.update(server_step_s=strategy.step_s, server_step_recording_s=strategy.recording_s)
    references = None
    if strategy.distills:
        if isinstance(strategy, CoBoosting):
            phases["teacher_test_accuracy_uniform"] = float((test_z.mean(1).argmax(1) == test_y).float().mean())
            phases["member_weights"] = strategy.weights.tolist()
        else:
            phases["auxiliary_samples"] = len(strategy.auxiliary)
        phases["teacher_test_accuracy"] = float((strategy.teacher(test_z).argmax(1) == test_y).float().mean())
        log.info("%s: ensemble of %d models, teacher %.4f on the test set", method, len(strategy.ensemble.states),
                 phases["teacher_test_accuracy"])
        description = f"{method} student (one model distilled on the server)"
        references = {"teacher (the clients' ensemble)": phases["teacher_test_accuracy"]}
    else:
        phases.update(synthetic_samples=sum(strategy.synthetic_label_counts),
                      synthetic_label_counts=strategy.synthetic_label_counts)
        description = "fedcvae classifier (trained on the client decoders' synthetic data)"
    before = "phase 1 (one-shot upload)" if strategy.distills else "phase 1 (one-shot decoder upload)"
    recorder.describe(description, references=references, before=before)
