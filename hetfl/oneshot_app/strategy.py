"""FENS's one-shot baselines as Flower strategies (FENS Sec. 4.1): FedKD, Fed-ET, Co-Boosting and FedCVAE-Ens.

Each is one round of communication, FENS's phase 1 (Sec. 3.1: every client trains the model once and uploads it with
its label counts; FedCVAE-Ens: a CVAE, and only its decoder goes up), then the paper's server step that turns the
uploads into one model, the *student*, which starts from ``start``'s `initial_arrays` (docs/readings.md#oneshot):

- :class:`FedKD`: distil the label-count-weighted teacher's logits on an auxiliary set (L1 on logits);
- :class:`FedET`: distil the members' weighted consensus with the diversity regularization on the same set;
- :class:`CoBoosting`: no data; synthesise hard samples with a generator, re-weight the members, distil;
- :class:`FedCVAEEns`: decode a synthetic labelled set from the clients' decoders and train the student on it.

Clients answer phase 1 with :func:`~hetfl.oneshot_app.client_app.oneshot_local_train` (the contract:
docs/api.md#the-one-shot-baselines).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from hetfl.common.models import set_state
from hetfl.common.oneshot.ensemble import Ensemble, ensemble_logits
from hetfl.common.oneshot.server import phase1_ensemble, phase1_messages
from hetfl.common.params import FederationParams, apply_options
from hetfl.common.progress import heartbeat
from hetfl.common.strategy import StrategyBase
from hetfl.common.task import arrays_to_model, model_to_arrays
from hetfl.common.train import TrainCursor, train
from hetfl.data.arrays import ArrayData

from . import CVAE_LOCAL, LOCAL
from .coboost import co_boost
from .core import fedet_loss, fedet_targets, fedkd_loss, fedkd_teacher, fedkd_weights
from .cvae import synthesize
from .keys import CoBoostParams, FedCVAEParams, FedETParams, FedKDParams

log = logging.getLogger("hetfl")


def _as_float(x: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(x).float()


class OneShotStrategy(StrategyBase):
    """The shared half of the one-shot baselines: phase 1 as the one round's ``configure_train`` /
    ``aggregate_train``, then the method's ``server_step`` from ``start``.

    Construct a subclass with keyword arguments, each a field of its parameter object (for instance
    :class:`~hetfl.oneshot_app.keys.FedKDParams`) or of :class:`~hetfl.common.params.FederationParams`, plus the
    pieces below; or from hetfl's run config with ``from_run_config``. ``start`` runs one round
    (``num_rounds=1``); its `evaluate_fn` gets the student's arrays after phase 1 (key 0) and after each server
    epoch ``e`` (key ``e``), and so do the callbacks' ``on_begin`` and ``on_round_end``. ``Result.arrays`` is the
    student.

    Parameters
    ----------
    num_classes : int
        Classes of the task (the label counts' length).
    model : callable
        ``model() -> nn.Module``: the model the clients train (the members are built with it and given their
        uploaded states) and the student's architecture.
    normalize : callable, optional
        Raw input batch -> the model's input tensor (default: as float). Images of hetfl's data pipeline are uint8.
    device, precision, augment : str
        Where and how the server trains (``"cpu"``, ``"fp32"``, no augmentation by default).
    eval_batch_size : int
        The batch of the members' logits.
    """

    params_class: ClassVar[type] = FedKDParams
    message_type: ClassVar[str] = LOCAL
    distills: ClassVar[bool] = True  # phase 1 uploads classifiers whose logits the step uses (FedCVAE-Ens: decoders)
    salt: ClassVar[int] = 17  # the server step's seed: seed * 7919 + salt
    resumable: ClassVar[bool] = False  # a checkpoint after each server epoch continues it (FedKD, Fed-ET)

    def __init__(self, params: Any = None, federation: FederationParams | None = None, *, num_classes: int,
                 model: Callable[[], torch.nn.Module], client_map: Any = None,
                 normalize: Callable[[torch.Tensor], torch.Tensor] | None = None, device: str = "cpu",
                 precision: str = "fp32", augment: str = "none", eval_batch_size: int = 256,
                 **options: Any) -> None:
        self.params, self.fed = apply_options(type(self).__name__, options, params or self.params_class(),
                                              federation or FederationParams())
        self.num_classes, self.model, self.map = int(num_classes), model, client_map
        self.normalize = _as_float if normalize is None else normalize
        self.device, self.precision, self.augment, self.eval_batch_size = device, precision, augment, eval_batch_size
        self.seed, self.sampled, self.rejected = self.fed.seed, [], 0
        self.ensemble: Ensemble | None = None
        self.members: list[torch.nn.Module] | None = None  # the uploaded classifiers as modules (not FedCVAE-Ens)
        self.step_s = self.recording_s = 0.0  # the server step's seconds without / in evaluation and callbacks,
        # over every start of the run (a resumed run adds to what its checkpoint holds)
        self._initial: ArrayRecord | None = None
        self._grid: Grid | None = None
        self._t0 = 0.0

    @classmethod
    def from_run_config(cls, cfg: Mapping[str, Any], **kwargs: Any) -> OneShotStrategy:
        """The strategy of a validated hetfl run config: its method's keys, seed, round-timeout, model and data."""
        from hetfl.common.rundata import num_classes
        from hetfl.common.task import compute_options, make_model
        from hetfl.common.train import Normalizer

        cfg = dict(cfg)
        opts = compute_options(cfg, server=True)
        return cls(cls.params_class.from_config(cfg), FederationParams.from_config(cfg), num_classes=num_classes(cfg),
                   model=lambda: make_model(cfg), normalize=Normalizer(cfg["dataset"]), augment=cfg["augment"],
                   eval_batch_size=cfg["eval-batch-size"], **opts, **cls.run_config_extras(cfg), **kwargs)

    @classmethod
    def run_config_extras(cls, cfg: dict[str, Any]) -> dict[str, Any]:
        """The method's own constructor arguments from a hetfl run config (its data, shapes)."""
        return {}

    # --- the one round: phase 1 ---------------------------------------------------------------------------------

    def template(self, initial_arrays: ArrayRecord) -> ArrayRecord:
        """The state the uploads must match (keys, shapes, dtypes): the initial model."""
        return initial_arrays

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        """Phase 1 (FENS Sec. 3.1): every client is sent the initial model (FedCVAE-Ens: only the request)."""
        self._initial, self._grid, self._t0 = arrays, grid, time.perf_counter()
        self.sampled = self.map.clients()
        return phase1_messages(self.map, self.sampled, arrays, self.message_type, send_init=self.distills,
                               train_config=config)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The checked uploads become ``ensemble`` (raises when not one is usable); no global arrays yet."""
        self.ensemble = phase1_ensemble(self._grid, list(replies), self.map, self.sampled, self.template(self._initial),
                                        num_classes=self.num_classes, label=f"{type(self).__name__} phase 1",
                                        started=self._t0)
        return None, MetricRecord({"num-models": len(self.ensemble.states)})

    def build_members(self, states: Sequence[Mapping[str, np.ndarray]]) -> list[torch.nn.Module]:
        """The uploaded states as modules of ``model``'s architecture."""
        members = []
        for st in states:
            m = self.model()
            set_state(m, dict(st))
            members.append(m)
        return members

    def member_logits(self, x: np.ndarray) -> torch.Tensor:
        """Every member's logits on inputs `x`, (N, M, C)."""
        z = ensemble_logits(self.members, ArrayData(x, np.zeros(len(x), np.int64)), self.normalize,
                            self.eval_batch_size, device=self.device, precision=self.precision)
        return torch.as_tensor(z)

    # --- the server step ------------------------------------------------------------------------------------------

    def server_step(self, student: torch.nn.Module, epoch_end: Callable[[int], bool]) -> None:
        """Train `student` in place from ``ensemble``; `epoch_end(e)` after server epoch `e` (0-based); a
        ``resumable`` step stops where it returns True."""
        raise NotImplementedError

    def teacher(self, z: torch.Tensor) -> torch.Tensor:
        """The teacher's logits (N, C) from the members' logits `z` (N, M, C), as the step distils it."""
        return z.mean(1)

    def summary(self) -> None:
        log.info("%s: one-shot, %d server epochs from %d uploads", type(self).__name__, self.params.epochs,
                 len(self.ensemble.states) if self.ensemble is not None else 0)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint after a server epoch holds besides the student (``resumable`` strategies)."""
        return {"step_s": self.step_s, "recording_s": self.recording_s}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step_s, self.recording_s = float(state["step_s"]), float(state["recording_s"])

    def _resume(self, callbacks: Sequence[Any], initial_arrays: ArrayRecord) -> tuple[ArrayRecord, int]:
        """The student's arrays and the first epoch to run (1-based, as rows): a ``resumable`` strategy's callbacks
        may restore a checkpoint (``on_start``); otherwise `initial_arrays` and 1."""
        arrays, first = initial_arrays, 1
        self.step_s = self.recording_s = 0.0
        if not self.resumable:
            return arrays, first
        for cb in callbacks:
            arrays, first = cb.on_start(self, arrays, first)
        if first == 1:
            self.cursor = TrainCursor()  # a new run (or this strategy's second start) distils from epoch 0
        elif self.cursor.epoch != first - 1:
            raise ValueError(f"{type(self).__name__}: the checkpoint's student is after epoch {first - 1} and its "
                             f"training state at epoch {self.cursor.epoch}; a checkpoint holds both of one epoch")
        return arrays, first

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 1, timeout: float = 3600,
              train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None, *,
              callbacks: Sequence[Any] = (), progress: float = 10.0, ensemble: Ensemble | None = None,
              on_ensemble: Callable[[OneShotStrategy], None] | None = None, stop_after: int = 0) -> Result:
        """Phase 1 (unless an `ensemble` is given: an earlier run's), then the server step; Flower's ``Result``.

        Parameters
        ----------
        num_rounds : int
            Must be 1: a one-shot method communicates once (its server epochs are the ``epochs`` parameter).
        callbacks : sequence of RoundCallback
            Each server epoch is a round for them (``on_round_end(e)`` after epoch e). A ``resumable`` strategy
            also takes a resume from their ``on_start`` (:class:`~hetfl.common.rounds.Checkpointing`: the student
            after epoch e and :meth:`state_dict`), after phase 1 or the `ensemble` given, and goes on at epoch e + 1.
        ensemble : Ensemble, optional
            Start from this phase-1 result (a saved one) instead of training phase 1.
        on_ensemble : callable, optional
            Called with the strategy after phase 1 (``ensemble`` and ``members`` are set), before the server step.
        stop_after : int
            A ``resumable`` strategy ends its server step after this epoch, its checkpoint kept to go on from
            (run-config ``stop-after-round``; 0: every epoch).
        """
        if num_rounds != 1:
            raise ValueError(f"{type(self).__name__}: num_rounds={num_rounds} is not allowed; expected 1 (one-shot: "
                             f"one upload; the server's epochs are epochs={self.params.epochs})")
        if stop_after and not self.resumable:
            raise ValueError(f"{type(self).__name__}: stop_after={stop_after} is not allowed; its server step keeps no "
                             "checkpoint to go on from (expected 0)")
        self.ensure_map(grid, timeout)
        if ensemble is None:
            messages = list(self.configure_train(1, initial_arrays, ConfigRecord(dict(train_config or {})), grid))
            with heartbeat(f"{type(self).__name__} phase 1: {len(messages)} clients training locally", progress):
                self.aggregate_train(1, self.map.send_and_receive(grid, messages, timeout))
        else:
            self.ensemble = ensemble
        self.members = self.build_members(self.ensemble.states) if self.distills else None
        if on_ensemble is not None:
            on_ensemble(self)
        arrays, first = self._resume(callbacks, initial_arrays)
        student = arrays_to_model(self.model(), arrays)  # after the members: model() may seed torch's RNG
        arrays = model_to_arrays(student)
        self.summary()
        result = Result(arrays=arrays)
        if first == 1:
            for cb in callbacks:
                cb.on_sampled(1, list(self.ensemble.client_ids))
        for cb in callbacks:
            cb.on_begin(self, arrays, first)
        if evaluate_fn is not None and first == 1 and (res := evaluate_fn(0, arrays)) is not None:
            result.evaluate_metrics_serverapp[0] = res
        self._timed_step(student, callbacks, evaluate_fn, result, stop_after)
        for cb in callbacks:
            cb.on_end(self.params.epochs)
        result.arrays = model_to_arrays(student)
        return result

    def _timed_step(self, student: torch.nn.Module, callbacks: Sequence[Any],
                    evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None, result: Result,
                    stop_after: int) -> None:
        """``server_step`` with the student evaluated and the callbacks called after every epoch; ``step_s`` and
        ``recording_s`` add this start's seconds without and in them."""
        t_step, step0, recording0 = time.perf_counter(), self.step_s, self.recording_s

        def epoch_end(e: int) -> bool:
            t0 = time.perf_counter()
            self.step_s = step0 + (t0 - t_step) - (self.recording_s - recording0)  # a checkpoint holds it
            now = model_to_arrays(student)
            if evaluate_fn is not None and (res := evaluate_fn(e + 1, now)) is not None:
                result.evaluate_metrics_serverapp[e + 1] = res
            for cb in callbacks:
                cb.on_round_end(e + 1, now)
            self.recording_s += time.perf_counter() - t0
            return 0 < stop_after <= e + 1  # True ends the step (train's epoch_end)

        self.server_step(student, epoch_end)
        self.step_s = step0 + (time.perf_counter() - t_step) - (self.recording_s - recording0)


class _Distillation(OneShotStrategy):
    """FedKD's and Fed-ET's server loop: Adam over the auxiliary inputs, per-epoch cosine lr, the targets of each
    sample looked up by its row."""

    resumable: ClassVar[bool] = True

    def __init__(self, params: Any = None, federation: FederationParams | None = None, *, auxiliary: np.ndarray,
                 **kwargs: Any) -> None:
        super().__init__(params, federation, **kwargs)
        self.cursor = TrainCursor()  # where the distillation stands: a checkpoint after an epoch holds it
        self.auxiliary = np.asarray(auxiliary)
        if len(self.auxiliary) == 0:
            raise ValueError(f"{type(self).__name__}: auxiliary has 0 samples; expected unlabeled inputs to distil on")

    @classmethod
    def run_config_extras(cls, cfg: dict[str, Any]) -> dict[str, Any]:
        from hetfl.data.load import load_server_set
        from hetfl.data.spec import DataSpec

        return {"auxiliary": load_server_set(DataSpec.from_config(cfg, 1), cfg["cache-dir"]).x}

    def targets(self, z: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """What each auxiliary sample is distilled towards, from the members' logits on it."""
        raise NotImplementedError

    def loss(self, student_logits: torch.Tensor, *targets: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    lr_min_of: ClassVar[str] = "lr_min"

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "cursor": self.cursor.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.cursor = TrainCursor.from_state_dict(state["cursor"])

    def server_step(self, student: torch.nn.Module, epoch_end: Callable[[int], bool]) -> None:
        p = self.params
        targets = self.targets(self.member_logits(self.auxiliary))
        index = ArrayData(self.auxiliary, np.arange(len(self.auxiliary), dtype=np.int64))

        def loss_fn(model: torch.nn.Module, xb: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
            r = rows.cpu()
            return self.loss(model(xb).float(), *(t[r].to(xb.device) for t in targets))

        train(student, index, self.normalize, epochs=p.epochs, batch_size=p.batch_size, lr=p.lr, optimizer="adam",
              lr_schedule="cosine-epoch", lr_min=getattr(p, self.lr_min_of), seed=self.seed * 7919 + self.salt,
              augment=self.augment, loss_fn=loss_fn, epoch_end=epoch_end, device=self.device, precision=self.precision,
              cursor=self.cursor)


class FedKD(_Distillation):
    """FedKD as FENS runs it: distil the label-count-weighted teacher's logits on the auxiliary set, L1 on logits
    (FENS Sec. 4.1; docs/readings.md#oneshot). Keywords: :class:`~hetfl.oneshot_app.keys.FedKDParams`' fields and
    `auxiliary`, the unlabeled inputs distilled on."""

    params_class = FedKDParams

    def teacher(self, z: torch.Tensor) -> torch.Tensor:
        return fedkd_teacher(z, fedkd_weights(self.ensemble.label_counts, self.params.weighting))

    def targets(self, z: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (self.teacher(z),)

    def loss(self, student_logits: torch.Tensor, *targets: torch.Tensor) -> torch.Tensor:
        return fedkd_loss(student_logits, targets[0], self.params.loss)


class FedET(_Distillation):
    """Fed-ET: distil the members' weighted consensus with the diversity regularization on the auxiliary set (FENS
    Sec. 4.1; docs/readings.md#oneshot). Keywords: :class:`~hetfl.oneshot_app.keys.FedETParams`' fields and
    `auxiliary`."""

    params_class = FedETParams
    lr_min_of = "lr"  # a constant lr

    def teacher(self, z: torch.Tensor) -> torch.Tensor:
        return fedet_targets(z)[0]

    def targets(self, z: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return fedet_targets(z)

    def loss(self, student_logits: torch.Tensor, *targets: torch.Tensor) -> torch.Tensor:
        return fedet_loss(student_logits, *targets, self.params.lam)


class CoBoosting(OneShotStrategy):
    """Co-Boosting: no data on the server; a generator synthesises hard samples, the members are re-weighted and
    distilled into the student each epoch (FENS Sec. 4.1; docs/readings.md#coboost). Keywords:
    :class:`~hetfl.oneshot_app.keys.CoBoostParams`' fields and `input_shape` (C, H, W) of the model's inputs.
    After ``start``, ``weights`` holds the members' final weights."""

    params_class = CoBoostParams
    salt = 23

    def __init__(self, params: Any = None, federation: FederationParams | None = None, *,
                 input_shape: Sequence[int], **kwargs: Any) -> None:
        super().__init__(params, federation, **kwargs)
        self.input_shape = tuple(int(s) for s in input_shape)
        if len(self.input_shape) != 3:
            raise ValueError(f"CoBoosting: input_shape={self.input_shape} is not allowed; expected (C, H, W): its "
                             "generator synthesises images")
        self.weights: torch.Tensor | None = None

    @classmethod
    def run_config_extras(cls, cfg: dict[str, Any]) -> dict[str, Any]:
        from hetfl.common.rundata import model_input_shape

        return {"input_shape": model_input_shape(cfg)}

    def teacher(self, z: torch.Tensor) -> torch.Tensor:
        if self.weights is None:
            return z.mean(1)
        return (z * self.weights[None, :, None]).sum(1) / self.weights.sum()

    def server_step(self, student: torch.nn.Module, epoch_end: Callable[[int], bool]) -> None:
        self.weights = co_boost(self.members, student, self.params, self.input_shape, self.num_classes,
                                self.normalize, self.seed * 7919 + self.salt, self.device,
                                epoch_end=lambda e, _w: epoch_end(e))


class FedCVAEEns(OneShotStrategy):
    """FedCVAE-Ens: every client trains a conditional VAE on its data and uploads only the decoder (nothing goes down
    but the request); the server decodes a synthetic labelled set (labels by each client's label counts, z from a
    truncated N(0, I)) and trains the student on it with Adam (docs/readings.md#fedcvae). Keywords:
    :class:`~hetfl.oneshot_app.keys.FedCVAEParams`' fields, `decoder` (``decoder() -> nn.Module``, called as
    ``decoder(z, one_hot_labels)`` -> image logits; the uploads must match its state) and `input_shape` (C, H, W)
    of the student's inputs. ``synthetic_label_counts`` holds the synthetic set's labels after ``start``."""

    params_class = FedCVAEParams
    message_type = CVAE_LOCAL
    distills = False
    salt = 31

    def __init__(self, params: Any = None, federation: FederationParams | None = None, *,
                 decoder: Callable[[], torch.nn.Module], input_shape: Sequence[int], **kwargs: Any) -> None:
        super().__init__(params, federation, **kwargs)
        self.decoder, self.input_shape = decoder, tuple(int(s) for s in input_shape)
        self.synthetic_label_counts: list[int] = []

    @classmethod
    def run_config_extras(cls, cfg: dict[str, Any]) -> dict[str, Any]:
        from hetfl.common.rundata import model_input_shape, num_classes

        from .cvae import make_cvae

        shape, p = model_input_shape(cfg), FedCVAEParams.from_config(cfg)
        return {"decoder": lambda: make_cvae(shape, num_classes(cfg), p.z_dim, seed=0).decoder, "input_shape": shape}

    def template(self, initial_arrays: ArrayRecord) -> ArrayRecord:
        return model_to_arrays(self.decoder())

    def server_step(self, student: torch.nn.Module, epoch_end: Callable[[int], bool]) -> None:
        p = self.params
        decoders = []
        for st in self.ensemble.states:
            dec = self.decoder()
            set_state(dec, st)
            decoders.append(dec)
        gen = torch.Generator().manual_seed(self.seed * 7919 + 29)
        x, y = synthesize(decoders, self.ensemble.label_counts, p.samples, p.z_dim, p.z_bound, self.input_shape[1:],
                          gen, self.device)
        self.synthetic_label_counts = np.bincount(y.numpy(), minlength=self.num_classes).tolist()
        log.info("fedcvae: classifier trained on %d samples from %d decoders", len(y), len(decoders))
        synthetic = ArrayData((x * 255.0).numpy(), y.numpy())  # 0..255 floats: normalised as real images are
        train(student, synthetic, self.normalize, epochs=p.epochs, batch_size=p.batch_size, lr=p.lr, optimizer="adam",
              seed=self.seed * 7919 + self.salt, augment=self.augment, epoch_end=epoch_end, device=self.device,
              precision=self.precision)
