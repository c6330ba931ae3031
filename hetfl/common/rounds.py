"""The one federated round loop: train, aggregate, evaluate, checkpoint - and resume from a checkpoint.

Flower's ``Strategy.start`` always begins at round 1 and keeps nothing on disk. Every method
here runs its Strategy (Flower's FedAvg/FedProx/FedAdam or SHEFL/AdaptiveFL/FENS's own)
through :func:`run_rounds`, which after each round writes ``<run-dir>/checkpoint.json`` plus the
safetensors file it names (:mod:`hetfl.common.checkpoint`: atomic, and loading runs no code):
the global arrays, the strategy's state (``state_dict()`` where the strategy has one: SHEFL's
sampling RNG, AdaptiveFL's RL tables and RNG, FedAdam's moments), Python/NumPy RNG states,
the round number and the results recorder's history. With ``resume = true`` a run whose
``run-name`` has a checkpoint continues from the round after it, so an interrupted run ends
in the same state as an uninterrupted one (same seed). An old-format ``checkpoint.pkl``
(pickle) is never unpickled: resume ignores it with a warning. Format: docs/checkpoints.md.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord

from .checkpoint import CheckpointError, RowLog, read_checkpoint, read_checkpoint_entry, row_logs, write_checkpoint
from .comm import UNATTRIBUTED, Traffic, take_traffic
from .fleet import available, simulated_round_seconds, tiers_of
from .nodes import error_line
from .progress import heartbeat
from .results import NoClientSucceeded, RunRecorder
from .strategy import StrategyBase

log = logging.getLogger("hetfl")
CHECKPOINT = "checkpoint.json"  # names its tensor file, checkpoint-r<round>-<random>.safetensors
LEGACY_CHECKPOINT = "checkpoint.pkl"  # the old pickle format: never loaded
_CHECKPOINT_KEYS = {"round", "arrays", "strategy", "python_random", "numpy_random", "recorder"}


def zero_weight(reply) -> bool:
    """Whether a reply's aggregation weight (``num-examples`` of its metric record) is 0: a client without data,
    whose update changes nothing and so is not an accepted update (``max-idle-rounds``)."""
    for rec in reply.content.values():
        if isinstance(rec, MetricRecord) and "num-examples" in rec:
            return float(rec["num-examples"]) == 0.0
    return False


def _arrays_to_numpy(arrays: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in arrays.items()}


def _numpy_to_arrays(state: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(np.asarray(v)) for k, v in state.items()})


def save_checkpoint(path: Path, server_round: int, arrays: ArrayRecord, strategy: StrategyBase, recorder: RunRecorder,
                    rows: RowLog | None = None) -> RowLog:
    """Atomically write everything needed to continue after `server_round` (`path`: the checkpoint.json).

    The recorder's rows go to the checkpoint's row log (``checkpoint-<random>-rows.jsonl``,
    :class:`~hetfl.common.checkpoint.RowLog`): `rows`, the log an earlier save of this run returned, gets only the
    rows recorded since (a save's cost does not grow with the run); without it a fresh log gets them all, and the
    other logs go once this checkpoint is committed. Returns the log, for the next save.
    """
    rec = recorder.state_dict()
    history = rec.pop("rounds")
    fresh = rows is None
    if fresh:
        rows = RowLog.fresh(path)
    rows.extend(history[rows.rows:])
    state = {
        "round": server_round,
        "arrays": _arrays_to_numpy(arrays),
        "strategy": strategy.state_dict(),
        "python_random": random.getstate(),
        "numpy_random": np.random.get_state(),
        "recorder": {**rec, "rows": rows.mark()},
    }
    write_checkpoint(path, state, label=f"r{server_round:05d}")
    if fresh:  # the logs of an earlier checkpoint in this folder: none marks them now
        for old in row_logs(path):
            if old != rows.path:
                old.unlink(missing_ok=True)
    return rows


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (JSON + safetensors; runs no code).

    Returns {round, arrays ({name: ndarray}), strategy, python_random, numpy_random, recorder}, the recorder's
    state with its rows read from the row log (``rounds``; a checkpoint written before the log held them in its
    JSON); CheckpointError if the pair or the log is malformed.
    """
    return _load(Path(path))[0]


def _load(path: Path) -> tuple[dict[str, Any], RowLog | None]:
    """:func:`load_checkpoint`, and the row log positioned after its rows (None for a checkpoint without one)."""
    ck = read_checkpoint(path)
    if not isinstance(ck, dict) or set(ck) != _CHECKPOINT_KEYS:
        raise CheckpointError(f"{path}: expected the keys {sorted(_CHECKPOINT_KEYS)}")
    if type(ck["round"]) is not int or ck["round"] < 0 or not isinstance(ck["arrays"], dict):
        raise CheckpointError(f"{path}: malformed round {ck['round']!r} or arrays")
    ck["recorder"], log = _recorder_state(path, ck["recorder"])
    return ck, log


def checkpoint_rows(path: Path | str) -> list[dict[str, Any]]:
    """The recorder rows a checkpoint holds (every round up to its own), without reading its tensors."""
    return _recorder_entry(Path(path))["rounds"]


def catch_up_metrics(run_dir: Path | str) -> bool:
    """Rewrite a run's metrics.json and metrics.csv from its checkpoint where the checkpoint holds more rows: a run
    killed outright (kill -9) may leave metrics.json behind (:meth:`RunRecorder.sync`), and one that is not resumed
    (a tuning trial pruned on its checkpoint's rows) would keep it so. Whether it rewrote them."""
    run_dir = Path(run_dir)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    state = _recorder_entry(run_dir / CHECKPOINT)
    if len(state["rounds"]) <= len(metrics["rounds"]):
        return False
    rec = RunRecorder({**metrics["config"], "results-dir": str(run_dir.parent), "run-name": run_dir.name},
                      threshold=metrics["summary"]["convergence_threshold"])
    rec.extra = {k: v for k, v in metrics.items() if k not in ("config", "rounds", "summary")}
    rec.load_state_dict(state)
    rec.extra["machines"] = state["extra"].get("machines", metrics.get("machines"))  # no machine of its own: no round
    rec.cfg = metrics["config"]
    rec.write()
    return True


def _recorder_entry(path: Path) -> dict[str, Any]:
    """The recorder's state a checkpoint holds, its rows read from the row log, without reading its tensors."""
    return _recorder_state(path, read_checkpoint_entry(path, "recorder"))[0]


def _recorder_state(path: Path, rec: Any) -> tuple[dict[str, Any], RowLog | None]:
    if not isinstance(rec, dict) or ("rows" in rec) == ("rounds" in rec):
        raise CheckpointError(f"{path}: the recorder's state needs its rows (a row-log mark) or its inline rounds")
    if "rounds" in rec:  # written before 2026-12-06: the rows in the JSON
        return rec, None
    log, rounds = RowLog.open(path.parent, rec["rows"])
    return {**{k: v for k, v in rec.items() if k != "rows"}, "rounds": rounds}, log


def record_round(grid, strategy: StrategyBase | None, recorder: RunRecorder, server_round: int, arrays: ArrayRecord,
                 evaluate_fn: Callable[[int, ArrayRecord], dict[str, Any]], also: Traffic | None = None) -> dict[str, Any]:
    """Evaluate, close the round's traffic period and record one row: the same columns for every method.

    ``evaluate_fn(round, arrays)`` returns ``accuracy``, ``loss`` and any method-specific columns
    (member or level accuracies). The row adds the evaluation's seconds, the round's bytes, replies,
    failures (``errors``: {Flower error code name: count}) and rejected replies (:class:`~hetfl.common.comm.MeteredGrid`), the replies per host that
    computed them (``hosts``: {host: replies}, docs/ray-cluster.md), and after round 0 the bytes up and down per
    client (``bytes_up_by_client``, ``bytes_down_by_client``), the FLOPs each client reported computing
    (``flops_by_client``, their sum ``client_flops``; hetfl.common.costs), with a ``fleet`` the round's simulated
    wall clock on its devices (``sim_round_s``; hetfl.common.fleet) and the strategy's own columns
    (``round_metrics(traffic)``). `also` is traffic of earlier phases that
    this row carries (FENS's round 0: discovery, phase 1 and the ensemble download).
    """
    t0 = time.perf_counter()
    with heartbeat(f"round {server_round}: evaluating", recorder.cfg.get("progress-interval", 10.0)):
        metrics = dict(evaluate_fn(server_round, arrays))
    eval_s = time.perf_counter() - t0
    traffic = take_traffic(grid)
    if also is not None:
        traffic.add(also)
    own = strategy.round_metrics(traffic) if server_round and strategy is not None else {}
    acc, loss = metrics.pop("accuracy"), metrics.pop("loss")
    columns = {"eval_s": eval_s, "comm_s": traffic.comm_s, "replies": traffic.replies, "failures": traffic.failures,
               "errors": dict(sorted(traffic.errors.items())),
               "rejected": strategy.rejected if server_round and strategy is not None else 0,
               "hosts": dict(sorted(traffic.hosts.items())), **metrics, **own}
    if server_round or traffic.flops:  # who answered, what each sent, got and computed (FENS's phase 1: round 0)
        # round 0 also carries discovery, counted per node: there only the clients that reported work are listed
        who = (lambda c: True) if server_round else traffic.flops.__contains__
        columns["bytes_up_by_client"] = {str(c): b for c, b in sorted(traffic.up.items()) if who(c)}
        columns["bytes_down_by_client"] = {str(c): b for c, b in sorted(traffic.down.items()) if who(c)}
        columns["flops_by_client"] = {str(c): f for c, f in sorted(traffic.flops.items())}
        columns["client_flops"] = sum(traffic.flops.values())
        # when each client's reply was seen (from its message's send, Flower's polling included) and the training
        # seconds it reported: their difference estimates its communication time (docs/fleets.md#observed)
        columns["reply_s_by_client"] = {str(c): round(v, 3) for c, v in sorted(traffic.reply_s.items()) if who(c)}
        columns["train_s_by_client"] = {str(c): round(v, 3) for c, v in sorted(traffic.train_s.items()) if who(c)}
        tiers = tiers_of(recorder.cfg)
        if tiers and UNATTRIBUTED not in traffic.up:  # the round on the fleet's devices (FedScale's clock: its slowest client's download + work + upload)
            columns["sim_round_s"] = simulated_round_seconds(tiers, columns["bytes_down_by_client"],
                                                             columns["bytes_up_by_client"], columns["flops_by_client"])
    return recorder.record(server_round, acc, loss, traffic.bytes_down, traffic.bytes_up, **columns)


class RoundCallback:
    """One job of the round loop besides the round itself, called at fixed points of every round (pfl-research's
    style): what :meth:`StrategyBase.start <hetfl.common.strategy.StrategyBase.start>` takes in ``callbacks``.

    The loop's own callbacks: :class:`Evaluation` (evaluate, record the row), :class:`IdleStop` (``max-idle-rounds``,
    and a run that never trained) and :class:`Checkpointing` (write after each round, restore on resume). Tracking
    is the recorder's: every row it records goes to its trackers (:class:`~hetfl.common.results.RunRecorder`).
    Every hook is called on every callback in the order given: give ``Evaluation`` before ``Checkpointing`` (the
    checkpoint then holds the round's row), as :func:`run_rounds` does.
    """

    def on_start(self, strategy: StrategyBase, arrays: ArrayRecord, first: int) -> tuple[ArrayRecord, int]:
        """Before anything runs: may replace the arrays and the first round (a resume); returns both."""
        return arrays, first

    def on_begin(self, strategy: StrategyBase, arrays: ArrayRecord, first: int) -> None:
        """After every :meth:`~RoundCallback.on_start`, before round `first` (round 0's evaluation)."""

    def on_sampled(self, rnd: int, clients: list[int]) -> None:
        """After the round's ``configure_train``: the client ids sent work."""

    def on_accepted(self, rnd: int, sent: int, accepted: int) -> None:
        """After the round's aggregation: `sent` train messages, `accepted` client updates kept."""

    def on_round_end(self, rnd: int, arrays: ArrayRecord) -> None:
        """After the round, with the new global arrays (in callback order)."""

    def on_end(self, last: int) -> None:
        """After the loop's last round `last`."""

    def on_row(self, row: dict[str, Any]) -> None:
        """After :class:`Evaluation` recorded a round's row (metrics.json's), for the callbacks it was given as
        `observers`: how :mod:`hetfl.tune` reports each round's validation accuracy to its pruner (an exception
        raised here ends the run, such as Optuna's ``TrialPruned``)."""


class Evaluation(RoundCallback):
    """Evaluate the global arrays and record the round's row (:func:`record_round`), round 0 included; the run's
    federation, a simulated fleet's availability and the nodes left out at discovery go to the recorder first.
    `round0`: traffic of earlier phases that the round-0 row carries (FENS); `observers`: callbacks whose
    :meth:`~RoundCallback.on_row` gets every row recorded."""

    def __init__(self, grid, strategy: StrategyBase, recorder: RunRecorder,
                 evaluate_fn: Callable[[int, ArrayRecord], dict[str, Any]], round0: Traffic | None = None,
                 observers: Sequence[RoundCallback] = ()) -> None:
        self.grid, self.strategy, self.recorder, self.evaluate_fn = grid, strategy, recorder, evaluate_fn
        self.round0, self.observers = round0, tuple(observers)

    def _record(self, rnd: int, arrays: ArrayRecord, also: Traffic | None = None) -> None:
        row = record_round(self.grid, self.strategy, self.recorder, rnd, arrays, self.evaluate_fn, also)
        for cb in self.observers:
            cb.on_row(row)

    def on_begin(self, strategy: StrategyBase, arrays: ArrayRecord, first: int) -> None:
        cfg = self.recorder.cfg
        if "federation" not in self.recorder.extra:
            self.recorder.federation(len(strategy.map.clients()), len(strategy.map.hosted))
        if (tiers := tiers_of(cfg)) is not None:  # a simulated fleet's availability
            strategy.map.available = lambda c, rnd: c < len(tiers) and available(tiers[c], c, rnd, cfg["seed"])
        _note_left_out(self.recorder, strategy.map)
        _note_devices(self.recorder, strategy.map)
        if first == 1:
            self._record(0, arrays, self.round0)

    def on_sampled(self, rnd: int, clients: list[int]) -> None:
        self.recorder.stage(clients=clients)  # client ids of this round, in metrics.json

    def on_accepted(self, rnd: int, sent: int, accepted: int) -> None:
        self.recorder.stage(accepted=accepted)

    def on_round_end(self, rnd: int, arrays: ArrayRecord) -> None:
        _note_left_out(self.recorder, self.strategy.map)  # nodes that connected later and were refused too
        self._record(rnd, arrays)


class IdleStop(RoundCallback):
    """Stop a run in which no client update was accepted for ``max-idle-rounds`` rounds in a row, or in any round."""

    def __init__(self, recorder: RunRecorder, cfg: dict[str, Any]) -> None:
        self.recorder, self.max_idle, self.rounds = recorder, cfg.get("max-idle-rounds", 0), cfg["num-server-rounds"]
        self.idle = 0  # consecutive rounds in which work was sent and no client's update was accepted

    def on_accepted(self, rnd: int, sent: int, accepted: int) -> None:
        self.idle = self.idle + 1 if sent and accepted <= 0 else 0
        if self.idle >= self.max_idle > 0:
            # the outcome of the run (a diverged method, unusable data), kept with its rows: not an interrupted run
            self.recorder.stop(rnd, f"no client update was accepted in the last {self.idle} rounds (run-config "
                               f"'max-idle-rounds' = {self.max_idle}): every sampled client failed or sent a malformed "
                               "update")  # rows end at round - 1

    def on_end(self, last: int) -> None:
        trained = [r for r in self.recorder.rounds if r["round"] >= 1 and r.get("clients")]
        if last == self.rounds and trained and not any(
                r.get("accepted", r.get("replies", 0) - r.get("rejected", 0)) > 0 for r in trained):
            self.recorder.stop(trained[-1]["round"], f"no client update was accepted in any of the run's {len(trained)} "
                               "round(s): every sampled client failed or sent a malformed update, so the model was "
                               "never trained")


class Checkpointing(RoundCallback):
    """``<run-dir>/checkpoint.json`` after every round (``checkpoint = true``), and the resume from it."""

    def __init__(self, grid, strategy: StrategyBase, recorder: RunRecorder, cfg: dict[str, Any],
                 taken: Traffic | None = None) -> None:
        """`taken`: traffic before the rounds, counted in a resumed run (FENS: its phases; :meth:`restore`)."""
        self.grid, self.strategy, self.recorder, self.cfg, self.taken = grid, strategy, recorder, cfg, taken
        self.path = recorder.run_dir / CHECKPOINT
        self.rows: RowLog | None = None  # the row log this run's saves append to

    def on_start(self, strategy: StrategyBase, arrays: ArrayRecord, first: int) -> tuple[ArrayRecord, int]:
        return self.restore(arrays, self.taken) if first == 1 else (arrays, first)

    def restore(self, arrays: ArrayRecord, taken: Traffic | None) -> tuple[ArrayRecord, int]:
        """With ``resume = true`` and a checkpoint: its arrays, strategy, RNGs and rows; returns (arrays, first round).

        `taken` and what is still pending on the grid are counted as the run's ``resume_download_bytes`` /
        ``resume_upload_bytes``: real traffic of no round, since round 0 is not evaluated again.
        """
        if not self.cfg["resume"]:
            return arrays, 1
        legacy = self.recorder.run_dir / LEGACY_CHECKPOINT
        if legacy.exists():
            log.warning("ignoring %s: old pickle checkpoint format, never loaded (unpickling can run code); "
                        "resume reads %s only", legacy, CHECKPOINT)
        if not self.path.exists():
            log.warning("resume = true but %s does not exist: starting at round 1", self.path)
            return arrays, 1
        ck, self.rows = _load(self.path)
        if ck["strategy"] is not None:  # None in a checkpoint of a strategy without state
            self.strategy.load_state_dict(ck["strategy"])
        random.setstate(ck["python_random"])
        np.random.set_state(ck["numpy_random"])
        self.recorder.load_state_dict(ck["recorder"])
        before = Traffic().add(taken or Traffic()).add(take_traffic(self.grid))
        for key, n in (("resume_download_bytes", before.bytes_down), ("resume_upload_bytes", before.bytes_up)):
            self.recorder.extra[key] = self.recorder.extra.get(key, 0) + n  # summed over every resume of the run
        log.info("resumed from %s after round %d", self.path, ck["round"])
        return _numpy_to_arrays(ck["arrays"]), ck["round"] + 1

    def on_round_end(self, rnd: int, arrays: ArrayRecord) -> None:
        if self.cfg["checkpoint"]:
            self.rows = save_checkpoint(self.path, rnd, arrays, self.strategy, self.recorder, self.rows)


def train_round(grid, strategy: StrategyBase, rnd: int, last: int, arrays: ArrayRecord, timeout: float,
                config: ConfigRecord | None = None, callbacks: Sequence[RoundCallback] = (), progress: float = 10.0
                ) -> tuple[ArrayRecord, int, int, MetricRecord | None, list[str]]:
    """One round's training: plan, send (at most one message in flight per node), check and aggregate.

    Returns (the new global arrays, train messages sent, client updates accepted, the aggregated train metrics, the
    error lines of the failed replies). A client without data (weight 0) trains nothing: not an accepted update; a
    rejected reply may weigh 0 too and is never counted twice. `config` (``start``'s ``train_config``) is the
    ConfigRecord ``configure_train`` gets, which the strategy sends to every client it samples.
    """
    messages = list(strategy.configure_train(rnd, arrays, ConfigRecord(dict(config or {})), grid))
    for cb in callbacks:
        cb.on_sampled(rnd, list(strategy.sampled))
    with heartbeat(f"round {rnd}/{last}: {len(messages)} client(s) training", progress):
        replies = strategy.order_replies(strategy.map.send_and_receive(grid, messages, timeout))
    failed = [error_line(r) for r in replies if r.has_error()]
    if len(replies) < len(messages) or failed:
        log.warning("round %d: %d of %d clients replied, %d with errors; aggregating what arrived",
                    rnd, len(replies), len(messages), len(failed))
    new, metrics = strategy.aggregate_train(rnd, replies)
    weighted = sum(1 for r in replies if not r.has_error() and not zero_weight(r))
    accepted = max(0, min(len(replies) - len(failed) - strategy.rejected, weighted))
    return (arrays if new is None else new), len(messages), accepted, metrics, failed


def run_strategy(strategy: StrategyBase, grid, initial_arrays: ArrayRecord, num_rounds: int, timeout: float,
                 train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
                 evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
                 callbacks: Sequence[RoundCallback] = (), progress: float = 10.0):
    """The one round loop (:meth:`StrategyBase.start <hetfl.common.strategy.StrategyBase.start>`): rounds 1..num_rounds
    (or from where a callback's ``on_start`` resumes), each ``train_round``, then federated evaluation where the
    strategy configures one, then Flower's `evaluate_fn`, then the callbacks' ``on_round_end``; Flower's ``Result``.

    Raises
    ------
    NoClientSucceeded
        Rounds ran and not one client update was accepted in any of them: how many replies were dropped and why.
    """
    from flwr.serverapp.strategy import Result

    arrays, first = initial_arrays, 1
    for cb in callbacks:
        arrays, first = cb.on_start(strategy, arrays, first)
    strategy.summary()
    for cb in callbacks:
        cb.on_begin(strategy, arrays, first)
    result = Result(arrays=arrays)
    if evaluate_fn is not None and first == 1 and (res := evaluate_fn(0, arrays)) is not None:
        result.evaluate_metrics_serverapp[0] = res
    sent_all = accepted_all = rejected_all = 0
    failures: list[str] = []
    for rnd in range(first, num_rounds + 1):
        t0 = time.perf_counter()
        arrays, sent, accepted, metrics, failed = train_round(grid, strategy, rnd, num_rounds, arrays, timeout,
                                                              train_config, callbacks, progress)
        sent_all, accepted_all, rejected_all = sent_all + sent, accepted_all + accepted, rejected_all + strategy.rejected
        failures += failed
        if metrics is not None:
            result.train_metrics_clientapp[rnd] = metrics
        for cb in callbacks:
            cb.on_accepted(rnd, sent, accepted)
        log.debug("round %d trained in %.2fs", rnd, time.perf_counter() - t0)
        evaluations = list(strategy.configure_evaluate(rnd, arrays, ConfigRecord(dict(evaluate_config or {})), grid))
        if evaluations:
            agg = strategy.aggregate_evaluate(rnd, strategy.map.send_and_receive(grid, evaluations, timeout))
            if agg is not None:
                result.evaluate_metrics_clientapp[rnd] = agg
        if evaluate_fn is not None and (res := evaluate_fn(rnd, arrays)) is not None:
            result.evaluate_metrics_serverapp[rnd] = res
        for cb in callbacks:
            cb.on_round_end(rnd, arrays)
    for cb in callbacks:
        cb.on_end(num_rounds)
    result.arrays = arrays
    # IdleStop, where given, judges the whole run (a resumed run's earlier rounds, stop-after-round) and records why
    if sent_all and not accepted_all and not any(isinstance(cb, IdleStop) for cb in callbacks):
        why = f"; the first error: {failures[0]}" if failures else ""
        raise NoClientSucceeded(
            f"no client update was accepted in any of the {num_rounds - first + 1} round(s): {sent_all} train "
            f"message(s) sent, {len(failures)} error repl(ies), {rejected_all} repl(ies) rejected by the strategy's checks "
            f"(malformed, or answering no message of the round; the log names each){why}")
    return result


def run_rounds(grid, strategy: StrategyBase, initial_arrays: ArrayRecord, cfg: dict[str, Any], recorder: RunRecorder,
               evaluate_fn: Callable[[int, ArrayRecord], dict[str, Any]],
               taken: Traffic | None = None, round0: Traffic | None = None,
               start: dict[str, Any] | None = None) -> ArrayRecord:
    """A hetfl run's rounds: ``strategy.start`` with the run's callbacks, :class:`IdleStop` after aggregation,
    :class:`Evaluation` (the row) and :class:`Checkpointing` after the round (restoring first with ``resume``).
    ``stop-after-round`` ends the loop early (the checkpoint of that round stays): how a scheduler with a time budget,
    or the resume test, interrupts a run cleanly. Callbacks of the caller's own come with the grid
    (``grid.callbacks``, an :class:`~hetfl.inprocess.InProcessGrid`'s, given by :mod:`hetfl.tune`): they run after
    these and observe every recorded row.

    Parameters
    ----------
    evaluate_fn : callable
        ``(round, arrays) -> {"accuracy", "loss", ...}``: the centralized evaluation of the global arrays.
    taken : Traffic, optional
        Traffic of this run before the rounds that the caller has already taken from the grid (FENS:
        node discovery and the ensemble download), counted in a resumed run (:meth:`Checkpointing.restore`).
    round0 : Traffic, optional
        Traffic that the round-0 row carries besides what is pending on the grid (FENS's phases).

    """
    checkpointing = Checkpointing(grid, strategy, recorder, cfg, taken)
    extra = list(getattr(grid, "callbacks", None) or ())
    # in this order: the row is recorded before the checkpoint that holds it is written
    callbacks: list[RoundCallback] = [IdleStop(recorder, cfg),
                                      Evaluation(grid, strategy, recorder, evaluate_fn, round0, observers=extra),
                                      checkpointing, *extra]
    with recorder.flushing():
        return strategy.start(grid, initial_arrays, num_rounds=recorder.last_round, timeout=cfg["round-timeout"],
                              callbacks=callbacks, progress=cfg.get("progress-interval", 10.0), **(start or {})).arrays


def _note_devices(recorder: RunRecorder, cmap) -> None:
    """The profiles that nodes measured at discovery (measure-devices), per client, with the run's record."""
    from .profile import PROFILE_KEYS

    fields = {k: cmap.field(k) for k in PROFILE_KEYS} if cmap is not None else {}
    clients = sorted({c for v in fields.values() for c in v})
    if clients and "measured_devices" not in recorder.extra:
        recorder.extra["measured_devices"] = {str(c): {k: fields[k][c] for k in PROFILE_KEYS if c in fields[k]}
                                              for c in clients}
        for c in clients:
            d = recorder.extra["measured_devices"][str(c)]
            log.info("client %d measured itself: %.1f training samples/s, %.3g FLOP/s, %.0f MiB free (%s)", c,
                     d.get("samples-per-s", 0.0), d.get("flops-per-s", 0.0), d.get("memory-bytes", 0) / 2**20,
                     d.get("measured-on", ""))


def _note_left_out(recorder: RunRecorder, cmap) -> None:
    """Keep the nodes refused at discovery, and why (their one line), with the run's record."""
    if cmap is not None and getattr(cmap, "left_out", None):
        recorder.extra["left_out"] = {str(n): why for n, why in sorted(cmap.left_out.items())}
