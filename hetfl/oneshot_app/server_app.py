"""Server of FENS's one-shot baselines: FENS's phase 1, then FedKD's, Fed-ET's, Co-Boosting's or FedCVAE-Ens's
server step.

Phase 1 is FENS's (``hetfl.common.oneshot.server.collect_local_models``): the server sends the initial model,
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
(docs/readings.md#fens-artifacts).

Rows in metrics.json: round 0 = the untrained student, carrying node discovery and phase 1's bytes; rounds 1..E =
the student after each server epoch (no traffic); ``phases.server_step_s`` is the server step's wall time without
the per-epoch evaluation and recording of the student. docs/readings.md#oneshot
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import Context

from hetfl.common.comm import MeteredGrid, Traffic
from hetfl.data.arrays import ArrayData
from hetfl.data.load import load_server_set
from hetfl.data.spec import DataSpec
from hetfl.common.models import set_state
from hetfl.common.nodes import discover_clients
from hetfl.common.oneshot.artifacts import save_ensemble, stored_phase1
from hetfl.common.oneshot.ensemble import Ensemble, build_members, ensemble_logits
from hetfl.common.oneshot.server import collect_local_models, phase1_traffic
from hetfl.common.results import RunRecorder, run_recorder
from hetfl.common.rounds import record_round
from hetfl.common.task import ServerEval, compute_options, log, make_model, model_to_arrays
from hetfl.common.rundata import model_input_shape, num_classes
from hetfl.common.train import Normalizer, train

from . import CVAE_PHASE1, METHOD, PHASE1
from .coboost import co_boost
from .core import fedet_loss, fedet_targets, fedkd_loss, fedkd_teacher, fedkd_weights
from .cvae import make_cvae, synthesize
from .keys import CoBoostParams, FedCVAEParams, FedETParams, FedKDParams


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


def _train_on_synthetic(student: torch.nn.Module, decoders: list[dict[str, np.ndarray]], label_counts: np.ndarray,
                        cfg: dict[str, Any], phases: dict[str, Any], epoch_end: Any) -> None:
    """FedCVAE-Ens's server (authors' ``ServerFedCVAEEns.train``): the decoders' synthetic set, then Adam on it from
    the initial classifier through the one training loop; `epoch_end` after every epoch (docs/readings.md#fedcvae)."""
    p = FedCVAEParams.from_config(cfg)
    shape = model_input_shape(cfg)
    models = []
    for st in decoders:
        dec = make_cvae(shape, num_classes(cfg), p.z_dim, seed=0).decoder
        set_state(dec, st)
        models.append(dec)
    opts = compute_options(cfg, server=True)
    gen = torch.Generator().manual_seed(cfg["seed"] * 7919 + 29)
    x, y = synthesize(models, label_counts, p.samples, p.z_dim, p.z_bound, tuple(shape[1:]), gen, opts["device"])
    phases.update(synthetic_samples=len(y), synthetic_label_counts=np.bincount(y.numpy(), minlength=num_classes(cfg)).tolist())
    synthetic = ArrayData((x * 255.0).numpy(), y.numpy())  # 0..255 floats: normalised as real images are
    train(student, synthetic, Normalizer(cfg["dataset"]), epochs=p.epochs, batch_size=p.batch_size, lr=p.lr,
          optimizer="adam", seed=cfg["seed"] * 7919 + 31, augment=cfg["augment"], epoch_end=epoch_end, **opts)


@dataclass
class StepContext:
    """What every server step reads: the run's config and recorder, the phase-1 ensemble, the evaluation data and
    the members' test logits (None for FedCVAE-Ens, whose uploads are decoders)."""

    cfg: dict[str, Any]
    params: Any  # the method's frozen parameter object (METHOD.params_for), read once
    ens: Ensemble
    members: list[torch.nn.Module] | None
    test_z: torch.Tensor | None
    test_y: torch.Tensor
    norm: Normalizer
    opts: dict[str, Any]
    phases: dict[str, Any]
    record: Callable[..., None]  # record(e + 1) after server epoch e


class ServerStep:
    """One one-shot baseline: how its phase 1 runs and how the server turns the uploads into one model (hooks)."""

    distills = True  # phase 1 uploads classifiers whose logits the step uses (FedCVAE-Ens: decoders)

    def phase1(self, grid: MeteredGrid, cmap: Any, clients: list[int], cfg: dict[str, Any], recorder: RunRecorder) -> Ensemble:
        """FENS's phase 1 on all of a client's data, or a reused one (an earlier run's, same settings): its bytes and
        times are this run's too; a trained ensemble is saved for later runs."""
        ens = stored_phase1(cfg, recorder, "oneshot-reuse", PHASE1, len(clients), keep_copy=False)
        if ens is None:
            ens = collect_local_models(grid, cmap, clients, cfg, PHASE1)
            save_ensemble(recorder.run_dir, ens)
        return ens

    def train(self, student: torch.nn.Module, c: StepContext) -> tuple[str, dict[str, float]]:
        """Train `student` in place; return its description and the references shown beside it."""
        raise NotImplementedError

    @staticmethod
    def teacher_step(student: torch.nn.Module, c: StepContext, held_x: np.ndarray, teacher: torch.Tensor,
                     targets: tuple, loss: Any, lr_min: float) -> tuple[str, dict[str, float]]:
        """FedKD's and Fed-ET's shared end: distil on the auxiliary images `held_x`, with the teacher's test accuracy
        recorded."""
        p = c.params
        c.phases["teacher_test_accuracy"] = float((teacher.argmax(1) == c.test_y).float().mean())
        _distill(student, held_x, targets, loss, epochs=p.epochs, batch_size=p.batch_size, lr=p.lr, lr_min=lr_min,
                 cfg=c.cfg, epoch_end=lambda e: c.record(e + 1))
        return ServerStep.student_description(c)

    @staticmethod
    def auxiliary_logits(c: StepContext) -> tuple[np.ndarray, torch.Tensor]:
        """The auxiliary unlabeled images ``server-holdout`` (their labels are never read) and the members' logits
        on them."""
        held = load_server_set(DataSpec.from_config(c.cfg, 1), c.cfg["cache-dir"])
        z = ensemble_logits(c.members, ArrayData(held.x, np.zeros(len(held.x), np.int64)), c.norm,
                            c.cfg["eval-batch-size"], **c.opts)
        c.phases["auxiliary_samples"] = len(held.x)
        return held.x, torch.as_tensor(z)

    @staticmethod
    def student_description(c: StepContext) -> tuple[str, dict[str, float]]:
        log.info("%s: ensemble of %d models, teacher %.4f on the test set", c.cfg["method"], len(c.ens.states),
                 c.phases["teacher_test_accuracy"])
        return (f"{c.cfg['method']} student (one model distilled on the server)",
                {"teacher (the clients' ensemble)": c.phases["teacher_test_accuracy"]})


class FedKDStep(ServerStep):
    """FedKD: distil the label-count-weighted teacher's logits on the auxiliary set (L1 on logits)."""

    def train(self, student: torch.nn.Module, c: StepContext) -> tuple[str, dict[str, float]]:
        held_x, z = self.auxiliary_logits(c)
        p: FedKDParams = c.params
        w = fedkd_weights(c.ens.label_counts, p.weighting)
        loss = lambda s, t: fedkd_loss(s, t, p.loss)  # noqa: E731
        return self.teacher_step(student, c, held_x, fedkd_teacher(c.test_z, w), (fedkd_teacher(z, w),), loss, p.lr_min)


class FedETStep(ServerStep):
    """Fed-ET: distil the members' weighted consensus with the diversity regularization on the auxiliary set."""

    def train(self, student: torch.nn.Module, c: StepContext) -> tuple[str, dict[str, float]]:
        held_x, z = self.auxiliary_logits(c)
        p: FedETParams = c.params
        loss = lambda s, cons, d, h: fedet_loss(s, cons, d, h, p.lam)  # noqa: E731
        return self.teacher_step(student, c, held_x, fedet_targets(c.test_z)[0], fedet_targets(z), loss, p.lr)


class CoBoostStep(ServerStep):
    """Co-Boosting: no data; synthesise hard samples with a generator, re-weight the members, distil."""

    def train(self, student: torch.nn.Module, c: StepContext) -> tuple[str, dict[str, float]]:
        p: CoBoostParams = c.params
        cfg = c.cfg
        c.phases["teacher_test_accuracy_uniform"] = float((c.test_z.mean(1).argmax(1) == c.test_y).float().mean())
        weights = co_boost(c.members, student, p, model_input_shape(cfg), num_classes(cfg), c.norm,
                           cfg["seed"] * 7919 + 23, c.opts["device"], epoch_end=lambda e, _w: c.record(e + 1))
        weighted = (c.test_z * weights[None, :, None]).sum(1) / weights.sum()
        c.phases["teacher_test_accuracy"] = float((weighted.argmax(1) == c.test_y).float().mean())
        c.phases["member_weights"] = weights.tolist()
        return self.student_description(c)


class FedCVAEStep(ServerStep):
    """FedCVAE-Ens: the clients' CVAE decoders up (nothing goes down but the request; not saved), the classifier
    trained on their synthetic data."""

    distills = False

    def phase1(self, grid: MeteredGrid, cmap: Any, clients: list[int], cfg: dict[str, Any], recorder: RunRecorder) -> Ensemble:
        decoder = make_cvae(model_input_shape(cfg), num_classes(cfg), FedCVAEParams.from_config(cfg).z_dim, seed=0).decoder
        return collect_local_models(grid, cmap, clients, cfg, CVAE_PHASE1, diff_init=True, template=decoder)

    def train(self, student: torch.nn.Module, c: StepContext) -> tuple[str, dict[str, float]]:
        _train_on_synthetic(student, c.ens.states, c.ens.label_counts, c.cfg, c.phases, epoch_end=lambda e: c.record(e + 1))
        log.info("fedcvae: classifier trained on %d samples from %d decoders", c.phases["synthetic_samples"],
                 len(c.ens.states))
        return "fedcvae classifier (trained on the client decoders' synthetic data)", {}


STEPS: dict[str, type[ServerStep]] = {"fedkd": FedKDStep, "fedet": FedETStep, "coboost": CoBoostStep,
                                      "fedcvae": FedCVAEStep}
"""run-config ``method`` -> its server step."""


def run(grid: MeteredGrid, context: Context, cfg: dict[str, Any]) -> dict[str, Any]:
    """Run FedKD, Fed-ET, Co-Boosting or FedCVAE-Ens end to end and return the summary."""
    step = STEPS[cfg["method"]]()
    recorder = run_recorder(cfg)
    params = METHOD.params_for(cfg)
    recorder.rows = params.epochs  # a row per server epoch ("[round e/E]" in the log), not rounds
    cmap = discover_clients(grid, cfg)
    clients = cmap.clients()
    discovery = grid.take()
    ens = step.phase1(grid, cmap, clients, cfg, recorder)
    round0 = phase1_traffic(ens.phase1).add(discovery)
    ev = ServerEval.of(cfg)
    test_y = torch.as_tensor(ev.test.y)
    members = build_members(cfg, ens.states, quantized=False) if step.distills else None
    test_z = torch.as_tensor(ensemble_logits(members, ev.test, ev.norm, ev.batch_size, **ev.opts)) if step.distills else None  # (N, M, C)
    student = make_model(cfg)  # the initial model phase 1 sent: FedKD's central model starts from it too

    def evaluate_fn(_round: int, _arrays: Any) -> dict[str, Any]:
        loss, acc = ev.evaluate(student)
        return {"accuracy": acc, "loss": loss, "val_accuracy": ev.val_accuracy(student)}

    recording_s = [0.0]  # the per-epoch evaluation and row inside the server step (recording, not the method's work)

    def record(server_round: int, also: Traffic | None = None) -> None:
        t0 = time.perf_counter()
        record_round(grid, None, recorder, server_round, model_to_arrays(student), evaluate_fn, also)
        recording_s[0] += time.perf_counter() - t0 if server_round else 0.0

    phases = {**ens.phase1, "num_models": len(ens.states), "member_client_ids": ens.client_ids,
              "phase1_local_epochs": cfg["local-epochs"], "phase1_local_steps": cfg["local-steps"]}
    if test_z is not None:
        phases["member_test_accuracy"] = (test_z.argmax(2) == test_y[:, None]).float().mean(0).tolist()
    recorder.extra["phases"] = phases
    if "phase1_reused_from" in recorder.extra:
        phases["phase1_reused_from"] = recorder.extra["phase1_reused_from"]
    recorder.stage(clients=list(ens.client_ids))
    record(0, round0)
    t_step = time.perf_counter()
    description, references = step.train(student, StepContext(cfg, params, ens, members, test_z, test_y, ev.norm, ev.opts, phases, record))
    phases["server_step_s"] = time.perf_counter() - t_step - recording_s[0]
    phases["server_step_recording_s"] = recording_s[0]
    before = "phase 1 (one-shot upload)" if step.distills else "phase 1 (one-shot decoder upload)"
    recorder.describe(description, references=references or None, before=before)
    return recorder.finish(model_to_arrays(student))
