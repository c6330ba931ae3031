"""A saved phase-1 ensemble: one place to write it, read it, and decide whether another run may start from it.

FENS (``fens-reuse``, resume, the aggregator sweep) and the one-shot baselines (``oneshot-reuse``) save the local
models of their phase 1 as ``<run-dir>/ensemble.json`` (+ safetensors; :class:`~.ensemble.Ensemble`) with
the phase-1 settings of the run that trained them. A run may reuse an ensemble only if its own phase 1 would have
trained the same models: the same partition, seed, model, local training, clients and phase-1 message (FENS's 90%
split or all of a client's data). The check reads only the settings in ``ensemble.json`` (no tensor) and runs where
the ensemble is read: at pre-flight (the launcher's host) and in the ServerApp, never in a ClientApp.
docs/readings.md#fens-artifacts
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hetfl.common.checkpoint import read_checkpoint, read_checkpoint_entry, write_checkpoint
from hetfl.common.config import COMMON, ConfigError
from hetfl.common.results import RunRecorder, load_metrics, stored_path
from hetfl.common.task import log

from . import Phase1
from .ensemble import Ensemble

ENSEMBLE = "ensemble.json"  # in the run directory; names its safetensors file
CLIENTS = "clients"  # the settings entry known only after discovery: how many clients the run found

# run-config keys that decide which models phase 1 trains (data, partition, model, seed, local training); not:
# devices, threads, where the data is read from (same rows), dirichlet-max-draws (a draw that succeeds is the same)
PHASE1_KEYS = (
    "dataset", "input-column", "label-column", "num-classes", "partitioner", "dirichlet-alpha", "dirichlet-min-size",
    "dirichlet-balance", "shards-per-client", "server-holdout", "train-fraction", "partition-seed", "num-clients",
    "model", "width", "text-model", "text-max-length", "seed",
    "local-steps", "local-epochs", "batch-size", "optimizer", "lr", "momentum", "weight-decay", "lr-decay",
    "lr-decay-every", "lr-schedule", "lr-min", "drop-last", "augment", "precision",
)


def phase1_settings(cfg: dict[str, Any], phase1: Phase1, clients: int | None = None) -> dict[str, Any]:
    """What decides the models phase 1 trains: the phase-1 message type, the method's phase-1 keys and
    :data:`PHASE1_KEYS`.

    Parameters
    ----------
    phase1 : Phase1
        The method's phase 1 (its message type and keys).
    clients : int, optional
        Clients found by discovery (known in the ServerApp, not at pre-flight); None leaves it out.
    """
    out: dict[str, Any] = {"phase1-message": phase1.message}
    out.update({k: cfg[k] for k in (*PHASE1_KEYS, *phase1.key_names) if k in cfg})
    if clients is not None:
        out[CLIENTS] = int(clients)
    return out


def mismatch(ours: dict[str, Any], theirs: dict[str, Any], phase1: Phase1) -> tuple[str, Any, Any] | None:
    """The first setting (``phase1-message``, a run-config key, or ``clients``) in which two phase-1 settings of
    `phase1` differ, as (name, ours, theirs); None if they agree. A setting one side lacks (``clients`` at pre-flight)
    is skipped."""
    defaults = {**COMMON.defaults(), **phase1.defaults()}
    for name in ours:
        # a run-config key the saved side predates counts at its default (how that ensemble was trained)
        value = theirs[name] if name in theirs else defaults.get(name, ours[name])
        if ours[name] != value:
            return name, ours[name], value
    return None


def ensemble_path(value: str) -> Path:
    """A reuse key's value: a run directory (its ensemble.json) or the ensemble.json file itself."""
    p = Path(value)
    return p / ENSEMBLE if p.is_dir() else p


def save_ensemble(run_dir: Path, ens: Ensemble) -> Path:
    """Write `ens` as ``<run_dir>/ensemble.json`` (+ safetensors; the checkpoint format of docs/checkpoints.md)."""
    return write_checkpoint(Path(run_dir) / ENSEMBLE, ens.to_state(), label="ensemble")


def load_ensemble(path: Path, phase1: Phase1 | None = None) -> Ensemble:
    """Read a saved ensemble, models included; one saved before the phase-1 settings were stored takes them from
    the run that trained it (:func:`ensemble_settings`, with `phase1` the reader's)."""
    ens = Ensemble.from_state(read_checkpoint(path))
    if not ens.settings and phase1 is not None:
        ens.settings = _settings_of_run(Path(path).parent, (Path(path).resolve(),), phase1)
    return ens


def ensemble_settings(path: Path, phase1: Phase1) -> dict[str, Any]:
    """The phase-1 settings a saved ensemble records, read from its JSON alone (no tensor is read or checked).

    An ensemble saved before the settings were stored takes them from the config of the run that trained it: the
    ``metrics.json`` beside it, or, when that run reused another run's ensemble (its ``phase1_reused_from`` names
    another file; the copy FENS kept), that ensemble's settings, followed the same way. Empty (refused by
    :func:`check_reuse`) when that run cannot be read here or is not a run of `phase1`'s ``legacy_method`` (only
    FENS saved ensembles then).
    """
    settings = read_checkpoint_entry(path, "settings", {})
    return dict(settings) if settings else _settings_of_run(Path(path).parent, (Path(path).resolve(),), phase1)


def _settings_of_run(run_dir: Path, seen: tuple[Path, ...], phase1: Phase1) -> dict[str, Any]:
    metrics = run_dir / "metrics.json"
    if not metrics.is_file():
        return {}
    m = load_metrics(metrics, COMMON)  # the phase-1 keys were never renamed
    source = m.get("phase1_reused_from")
    if source and stored_path(source).resolve() not in seen:  # a copy: the settings are those of the run that trained it
        src = stored_path(source)  # metrics.json names it relative to the checkout where it lies under it
        if not src.is_file():
            return {}
        settings = read_checkpoint_entry(src, "settings", {})
        return dict(settings) if settings else _settings_of_run(src.parent, (*seen, src.resolve()), phase1)
    cfg = m.get("config", {})
    legacy = phase1.legacy_method and cfg.get("method") == phase1.legacy_method  # only FENS saved them then
    return phase1_settings(cfg, phase1) if legacy else {}


def check_reuse(cfg: dict[str, Any], key: str, phase1: Phase1, clients: int | None = None) -> Path | None:
    """The saved ensemble (its ``ensemble.json``) that run-config `key` names, if this run may start from it; None
    when `key` is empty. Reads the settings the ensemble records, never its tensors.

    Raises ConfigError in one line naming the key, its value and what is allowed: no ensemble there, an ensemble
    without recorded phase-1 settings, or one trained with other phase-1 settings than this run's (the first
    difference is named). FENS's ``fens-reuse`` and the one-shot baselines' ``oneshot-reuse`` both end here, at
    pre-flight (`clients` None; the methods' ``MethodSpec.preflight``) and in the ServerApp after discovery
    (`clients` = the clients found; :func:`stored_phase1`). A ClientApp never runs it: the path may not exist on its
    host.
    """
    value = cfg[key]
    if not value:
        return None
    path = ensemble_path(value)
    where = f"run-config key '{key}' = {value!r}"
    if not path.is_file():
        raise ConfigError(f"{where}: no ensemble there; expected a run directory holding {ENSEMBLE} (saved by a run "
                          f"whose phase 1 sends {phase1.message!r}), or the {ENSEMBLE} file")
    settings = ensemble_settings(path, phase1)
    if not settings:
        raise ConfigError(f"{where}: the ensemble records no phase-1 settings and the run that trained it cannot be "
                          "read (no FENS metrics.json beside it, or the ensemble its phase1_reused_from names is not "
                          "there); expected an ensemble saved with its settings (any run of this version)")
    diff = mismatch(phase1_settings(cfg, phase1, clients), settings, phase1)
    if diff is not None:
        name, ours, theirs = diff
        what = "run-config key " if name not in ("phase1-message", CLIENTS) else ""
        raise ConfigError(f"{where}: its ensemble was trained with {what}'{name}' = {theirs!r} and this run has "
                          f"{ours!r}; expected an ensemble trained with this run's phase-1 settings (partition, seed, "
                          "model, local training, clients: artifacts.PHASE1_KEYS)")
    return path


def stored_phase1(cfg: dict[str, Any], recorder: RunRecorder, key: str, phase1: Phase1, clients: int, *,
                  keep_copy: bool) -> Ensemble | None:
    """The ensemble this run starts from instead of training phase 1; None = train it (and :func:`save_ensemble`).

    A resumed run (``resume`` with its own ``ensemble.json``) loads its own; its ``phase1_reused_from`` is the one
    its first start recorded (restored with its checkpoint), not set here. Otherwise the ensemble run-config `key`
    names, checked against this run's phase-1 settings and the `clients` found (:func:`check_reuse`), is loaded, logged
    and recorded as ``recorder.extra["phase1_reused_from"]``; `keep_copy` saves it in this run's directory too (FENS:
    a resume of this run finds it there; the one-shot baselines do not resume and save no copy). FENS
    (``fens-reuse``) and the one-shot baselines (``oneshot-reuse``) share it (docs/readings.md#fens-artifacts).
    """
    own = recorder.run_dir / ENSEMBLE
    if cfg["resume"] and own.exists():
        ens = load_ensemble(own, phase1)
        log.info("%s: phase 1 skipped; resumed with its own %d-model ensemble (%s)", cfg["method"], len(ens.states), own)
        return ens
    source = check_reuse(cfg, key, phase1, clients)
    if source is None:
        return None
    ens = load_ensemble(source, phase1)
    if keep_copy and source.resolve() != own.resolve():
        save_ensemble(recorder.run_dir, ens)
    log.info("%s: phase 1 skipped; %d-model ensemble loaded from %s (trained by an earlier run)", cfg["method"],
             len(ens.states), source)
    recorder.extra["phase1_reused_from"] = str(source)
    return ens
