"""One tuning protocol for every method: hyper-parameters chosen on validation data, the same budget for all.

    python -m hetfl.tune configs/fedavg/fmnist-dir0.1.toml --space "lr=log:0.003:0.3 momentum=0,0.9" \
        --trials 12 --rounds 20 --study results/tune/fedavg-dir0.1

Each trial is one whole run of the method (the real ServerApp and ClientApp code on the in-process grid of
:mod:`hetfl.inprocess`, byte metering included) with the preset, the ``--set`` overrides and the trial's values.
Every trial runs with ``eval-split = "test-half"``: the server's evaluation set is split in two, the first half is
the validation set that the objective and the pruner read (``val_accuracy`` of each round's row), and the second
half is the test set, which the tuner never reads. The objective is the validation accuracy after the last round.

* **Sampler**: Optuna's TPE seeded with ``--seed`` (``--sampler tpe``), or the full grid of ``--space`` choices in
  the order written (``--sampler grid``: every value of every key must be a list).
* **Pruning**: after each round the trial reports its validation accuracy; Optuna's median pruner stops a trial
  whose accuracy is below the median of earlier trials at the same round, only after a warm-up: at least
  :data:`PRUNE_STARTUP` completed trials, and from round max(``--prune-after``, half the rounds) on.
* **Brackets** (:func:`bracket`): a choice must not sit on the edge of what was searched. Once the budget is spent,
  a numeric list whose best value is its first or last gets one more value one step past that edge (the grid's own
  spacing: x ratio where it is multiplicative, + difference otherwise; 1 significant digit), with the other keys at
  their best; again while the new value is best, until the best is interior or the step past it diverged (its run
  failed, or reached under half the best's validation accuracy). A range whose best value lies within a tenth of
  its width (log-width for ``log``) of an edge is widened past that edge by half its width and searched again
  (``--trials`` // 2 more trials, at least 3). At most :data:`MAX_EXTENSIONS` steps a key; each one is in the
  summary (``extensions``), with the trials it added.
* **Resume**: the study lives in a SQLite file (``<study>/study.db``) and every trial keeps its own
  ``<study>/trials/t<k>/metrics.json`` and a checkpoint after each round. A stopped process leaves its running trial
  behind: the next call marks it failed, queues its values again and continues that trial from its last checkpoint
  (:func:`adopt_stopped`; a resumed run ends as an uninterrupted one), then goes on until ``--trials`` trials have
  finished (completed or pruned). A trial longer than a working session therefore still finishes.
* **The chosen values** are run once more from scratch with ``--final`` (the default): that run must give the best
  trial's validation accuracy again (same seed, same run), and its test accuracy is the one number reported
  (``<study>/summary.json``, ``<study>/chosen/metrics.json``).

The budget of a study is trials x rounds; a comparison gives every method the same (docs/tuning.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
import sys
import time
import tomllib
from dataclasses import asdict, dataclass
from itertools import product
from pathlib import Path
from typing import Any

log = logging.getLogger("hetfl")

OBJECTIVE = "val_accuracy"
PRUNE_STARTUP = 3  # completed trials before the pruner may stop one
MAX_EXTENSIONS = 4  # bracket steps past an edge, per key
SAMPLERS = ("tpe", "grid")


class TuneError(ValueError):
    """Bad tuning input: one line naming the option or key, the value and what is allowed."""


class StudyMismatch(TuneError):
    """A study directory that holds a study of other settings (preset, space, budget): it is never resumed."""


@dataclass(frozen=True)
class Dim:
    """One searched key: a float or int range (``log`` for a log-uniform float) or a list of choices."""

    key: str
    kind: str  # "log", "float", "int" or "choice"
    low: float = 0.0
    high: float = 0.0
    choices: tuple = ()

    def suggest(self, trial) -> Any:
        if self.kind == "choice":
            return trial.suggest_categorical(self.key, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(self.key, int(self.low), int(self.high))
        return trial.suggest_float(self.key, self.low, self.high, log=self.kind == "log")

    def ends(self) -> list[Any]:
        """The values at the edges of the range (or every choice): what validation is run on before a trial."""
        if self.kind == "choice":
            return list(self.choices)
        if self.kind == "int":
            return [int(self.low), int(self.high)]
        return [float(self.low), float(self.high)]


def _typed(key: str, text: str) -> Any:
    """`text` as the run-config key's type (the schema's), e.g. '0.9' -> 0.9 for a float key."""
    from hetfl.methods import SCHEMA

    typ = SCHEMA[key].type
    try:
        if typ is bool:
            if text.lower() not in ("true", "false"):
                raise ValueError(text)
            return text.lower() == "true"
        return typ(text) if typ is not int else int(float(text)) if float(text).is_integer() else int(text)
    except ValueError:
        raise TuneError(f"--space: {key}={text!r} is not a {typ.__name__}") from None


def parse_space(text: str) -> list[Dim]:
    """``"lr=log:0.001:0.3 momentum=0,0.9 local-epochs=int:1:10 optimizer=sgd,adam"`` -> the searched dimensions.

    Raises
    ------
    TuneError
        An unknown key (with a suggestion), a malformed range, or a value of the wrong type.
    """
    import difflib

    from hetfl.methods import SCHEMA

    dims: list[Dim] = []
    for token in text.split():
        key, eq, spec = token.partition("=")
        if not eq or not key or not spec:
            raise TuneError(f"--space: {token!r} is not key=<range or choices>; expected e.g. lr=log:0.001:0.3, "
                            "local-epochs=int:1:10 or momentum=0,0.5,0.9")
        if key not in SCHEMA:
            close = difflib.get_close_matches(key, SCHEMA, n=2)
            hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else "; see python -m hetfl.launch --keys"
            raise TuneError(f"--space: unknown run-config key {key!r}{hint}")
        if key in (d.key for d in dims):
            raise TuneError(f"--space: key {key!r} is given twice")
        m = re.fullmatch(r"(log|float|int):([^:]+):([^:]+)", spec)
        if m:
            kind, lo, hi = m.group(1), m.group(2), m.group(3)
            try:
                low, high = float(lo), float(hi)
            except ValueError:
                raise TuneError(f"--space: {key}={spec!r}: bounds must be numbers") from None
            if not low < high or (kind == "log" and low <= 0):
                raise TuneError(f"--space: {key}={spec!r}: expected low < high" + (" and low > 0 for log" if kind == "log" else ""))
            if kind == "int" and not (low.is_integer() and high.is_integer()):
                raise TuneError(f"--space: {key}={spec!r}: int bounds must be integers")
            if SCHEMA[key].type not in (int, float) or (kind != "int" and SCHEMA[key].type is int):
                raise TuneError(f"--space: {key}={spec!r}: key {key!r} is {'an' if SCHEMA[key].type is int else 'a'} {SCHEMA[key].type.__name__}; "
                                + ("use int:<low>:<high> or choices" if SCHEMA[key].type is int else "use choices a,b,c"))
            dims.append(Dim(key, kind, low, high))
        else:
            dims.append(Dim(key, "choice", choices=tuple(_typed(key, v) for v in spec.split(","))))
    if not dims:
        raise TuneError("--space: empty; expected at least one key=<range or choices>")
    return dims


def grid(dims: list[Dim]) -> list[dict[str, Any]]:
    """Every combination of the choices, in the order written (the first key varies slowest)."""
    if any(d.kind != "choice" for d in dims):
        raise TuneError("--sampler grid: every --space key must list its values (a,b,c), not a range")
    return [dict(zip((d.key for d in dims), values)) for values in product(*(d.choices for d in dims))]


@dataclass(frozen=True)
class TuneSpec:
    """Everything a study is: the base run config, the space, the budget and the protocol's settings."""

    base: dict[str, Any]
    space: tuple[Dim, ...]
    trials: int
    rounds: int
    nodes: int
    sampler: str = "tpe"
    seed: int = 0
    prune_after: int = 1
    prune: bool = True
    bracket: bool = True  # search past an edge the best value sits on (:func:`bracket`)

    def trial_config(self, values: dict[str, Any], run_dir: Path, name: str) -> dict[str, Any]:
        return {**self.base, **values, "num-server-rounds": self.rounds, "eval-split": "test-half",
                **resumable(self.base), "results-dir": str(run_dir), "run-name": name}


def resumable(base: dict[str, Any]) -> dict[str, bool]:
    """A trial's or scored run's checkpoint keys: a checkpoint every round and resume from it, so a stopped study
    goes on where it stopped (FedKD's and Fed-ET's: every server epoch); unless the preset turns checkpoints off
    (Co-Boosting, FedCVAE-Ens: no resume)."""
    keep = bool(base.get("checkpoint", True))
    return {"checkpoint": keep, "resume": keep}


def check_spec(spec: TuneSpec) -> None:
    """Validate the base config and both ends of every range before any trial starts (one line each)."""
    from hetfl.common.config import ConfigError
    from hetfl.methods import validate

    if spec.trials < 1 or spec.rounds < 1 or spec.nodes < 1:
        raise TuneError(f"--trials {spec.trials}, --rounds {spec.rounds}, --nodes {spec.nodes}: each must be >= 1")
    if spec.sampler not in SAMPLERS:
        raise TuneError(f"--sampler {spec.sampler!r} is not allowed; expected one of {SAMPLERS}")
    if spec.base.get("eval-split", "test-half") != "test-half":
        raise TuneError(f"run-config key 'eval-split' = {spec.base['eval-split']!r}: a study needs 'test-half' (its first "
                        "half is the validation set the tuner reads; the second half is never read)")
    try:
        for d in spec.space:
            for v in d.ends():
                validate(spec.trial_config({d.key: v}, Path("."), "check"))
    except ConfigError as err:
        raise TuneError(str(err)) from None


def _storage(path: Path):
    import optuna

    path.parent.mkdir(parents=True, exist_ok=True)
    return optuna.storages.RDBStorage(f"sqlite:///{path.resolve()}")


def _finished(study) -> list:
    """Trials that used budget: completed, pruned, or failed by their run (a diverged value; not a stopped process)."""
    from optuna.trial import TrialState

    return [t for t in study.get_trials(deepcopy=False) if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
            or (t.state == TrialState.FAIL and "run_error" in t.user_attrs)]


def _recover(study) -> int:
    """Mark trials left RUNNING by a stopped process as failed and queue their values again; how many."""
    from optuna.trial import TrialState

    stale = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.RUNNING]
    for t in stale:
        study.tell(t.number, state=TrialState.FAIL)
        study.enqueue_trial(t.params, skip_if_exists=False)
        log.warning("trial %d was left running by a stopped process: marked failed, its values queued again", t.number)
    return len(stale)


def open_study(spec: TuneSpec, study_dir: Path):
    """The study of `study_dir` (created, or loaded and recovered); its settings must be those of `spec`."""
    import optuna

    from hetfl.common.results import relative_paths

    settings = {"space": [asdict(d) for d in spec.space], "rounds": spec.rounds, "sampler": spec.sampler,
                "seed": spec.seed, "nodes": spec.nodes, "base": spec.base}
    # paths under the checkout relative (a phase-1 run's, phase1_once): the study resumes from another checkout
    settings = relative_paths(json.loads(json.dumps(settings, default=list)))
    study = optuna.create_study(study_name="hetfl", storage=_storage(study_dir / "study.db"), direction="maximize",
                                pruner=_pruner(spec), load_if_exists=True)
    old = study.user_attrs.get("settings")
    if old is None:
        if spec.sampler == "grid":  # the grid first, then the settings: a study with settings has its whole grid
            for values in grid(list(spec.space)):
                study.enqueue_trial(values)
        study.set_user_attr("settings", settings)
    elif relative_paths(old) != settings:
        raise StudyMismatch(f"{study_dir / 'study.db'} holds a study with other settings; use another --study directory")
    else:
        _recover(study)
    # seeded by the study's seed and how many trials it holds: a resumed study does not redraw its first values
    seed = spec.seed * 100_003 + len(study.trials)
    startup = min(10, max(3, spec.trials // 3))  # random draws before TPE models the results
    study.sampler = (optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup) if spec.sampler == "tpe"
                     else optuna.samplers.RandomSampler(seed=seed))
    return study


def run_trial(spec: TuneSpec, values: dict[str, Any], run_dir: Path, name: str, report=None) -> dict[str, Any]:
    """One run of the method with `values` on the in-process grid; its metrics.json. `report(round, val)` is called
    after every round (it may raise optuna.TrialPruned)."""
    from hetfl.common.rounds import RoundCallback
    from hetfl.inprocess import run_in_process

    class Report(RoundCallback):
        def on_row(self, row: dict[str, Any]) -> None:
            if report is not None and row["round"] >= 1 and row.get(OBJECTIVE) is not None:
                report(row["round"], float(row[OBJECTIVE]))

    ensure_phase1(spec)
    return run_in_process(spec.trial_config(values, run_dir, name), spec.nodes, run_dir, name, callbacks=[Report()])


def _objective(row: dict[str, Any]) -> float:
    if row.get(OBJECTIVE) is None:
        raise TuneError("a trial's rows hold no val_accuracy: the method does not evaluate on eval-split = 'test-half'")
    return float(row[OBJECTIVE])


def _pruner(spec: TuneSpec):
    import optuna

    # rounds start at 1: a trial can be pruned from round max(prune-after, rounds / 2) on, once PRUNE_STARTUP trials
    # have completed (Optuna prunes once step >= warm-up)
    return (optuna.pruners.MedianPruner(n_startup_trials=PRUNE_STARTUP,
                                        n_warmup_steps=max(spec.prune_after, -(-spec.rounds // 2)))
            if spec.prune else optuna.pruners.NopPruner())


def finished_trials(study: Path) -> list[Path]:
    """The metrics.json of each trial the study's summary.json lists: those that used budget (complete, pruned, or
    failed by their run). A trial left by a stopped process keeps a partial metrics.json in its folder and is not
    listed: not a result, never kept (its values were queued again). A study without a summary has none."""
    if not (study / "summary.json").exists():
        return []
    summary = json.loads((study / "summary.json").read_text())
    return [study / "trials" / (t["folder"] if "folder" in t else f"t{t['number']:03d}") / "metrics.json"
            for t in summary["trials"]]


def earlier_trial(spec: TuneSpec, values: dict[str, Any], earlier: tuple[Path, ...]) -> Path | None:
    """The metrics.json of a trial with these values that already ran to its last round with this config on as many
    nodes in one of the `earlier` study folders (``<folder>/trials/t*/``), else None: a grid grown by a value, or a
    study whose spec changed in what its trials do not read, reruns nothing it ran (same config and seed, same run).
    Every key of both configs counts (as validated, defaults filled), apart from :data:`hetfl.inprocess.RUN_CONTROL`."""
    from hetfl.common.config import ConfigError
    from hetfl.inprocess import same_config
    from hetfl.methods import validate

    cfg = spec.trial_config(values, Path("."), "earlier")
    want = validate(cfg)
    for path in sorted(p for folder in earlier for p in Path(folder).glob("trials/*/metrics.json")):
        try:
            m = json.loads(path.read_text())
            ran = (m["summary"].get("rounds_completed") == spec.rounds
                   and m.get("engine", "").startswith(f"in-process ({spec.nodes} nodes")
                   and same_config(m, cfg, every_key=True, want=want))
        except (ValueError, KeyError, TypeError, AttributeError, ConfigError):  # unreadable, or of another schema
            continue
        if ran:
            log.info("%s: ran before in %s, reused", values, path.parent)
            return path
    return None


def _replayed(path: Path, run_dir: Path, report) -> dict[str, Any]:
    """An earlier trial's metrics.json (`path`) as this trial's, its rounds reported as if they ran; copied to
    `run_dir` as it is once every round was reported (a pruned replay leaves no file)."""
    import shutil

    m = json.loads(path.read_text())
    for row in m["rounds"]:
        if row["round"] >= 1 and row.get(OBJECTIVE) is not None:
            report(row["round"], float(row[OBJECTIVE]))
    run_dir.mkdir(parents=True, exist_ok=True)
    if path.resolve() != (run_dir / "metrics.json").resolve():
        shutil.copy2(path, run_dir / "metrics.json")
    return m


def _attempt(spec: TuneSpec, trial, values: dict[str, Any], trials_dir: Path, name: str,
             earlier: tuple[Path, ...] = ()) -> tuple[str, Any]:
    """Run one trial (or take its run from an `earlier` study, :func:`earlier_trial`), reporting every round to
    `trial` (which may prune it); its outcome: ("complete", objective), ("pruned", why) or ("fail", why: the values
    made the run fail, e.g. it diverged). Anything else propagates."""
    import optuna

    from hetfl.common.checkpoint import discard_checkpoint
    from hetfl.common.results import NoClientSucceeded

    def report(rnd: int, val: float) -> None:
        trial.report(val, rnd)
        if spec.prune and trial.should_prune():
            raise optuna.TrialPruned(f"round {rnd}: validation accuracy {val:.4f} below the median")

    try:
        ran = earlier_trial(spec, values, earlier)
        if ran is None and _resumable(trials_dir / name):
            _replay_checkpointed(trials_dir / name, report)
        m = _replayed(ran, trials_dir / name, report) if ran is not None else run_trial(spec, values, trials_dir, name, report)
    except optuna.TrialPruned as why:
        discard_checkpoint(trials_dir / name / "checkpoint.json")  # pruned: final, nothing to continue
        return "pruned", str(why)
    except (NoClientSucceeded, FloatingPointError) as why:
        return "fail", " ".join(str(why).split())[:300]
    finally:
        _relative(trials_dir / name / "metrics.json")
    discard_checkpoint(trials_dir / name / "checkpoint.json")  # finished: only a stopped trial continues from one
    return "complete", _objective(m["rounds"][-1])


def _relative(path: Path) -> None:
    """A trial's metrics.json with paths under the checkout made relative, as committed files name them."""
    from hetfl.common.results import metrics_text, relative_paths

    if path.exists() and (data := json.loads(path.read_text())) != (rel := relative_paths(data)):
        path.write_text(metrics_text(rel))


def _attempt_in_child(spec: TuneSpec, study_db: str, trial_id: int, values: dict[str, Any], trials_dir: Path,
                      name: str, earlier: tuple[Path, ...] = ()) -> tuple[str, Any]:
    """:func:`_attempt` in a worker process (``--workers``): the trial is the study file's, reached by its id."""
    import optuna

    from hetfl.common.task import setup_logging

    setup_logging()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name="hetfl", storage=_storage(Path(study_db)), pruner=_pruner(spec))
    return _attempt(spec, optuna.trial.Trial(study, trial_id), values, trials_dir, name, earlier)


def _tell(study, trial, outcome: tuple[str, Any]) -> None:
    import optuna

    state, value = outcome
    if state == "complete":
        study.tell(trial, value)
        log.info("trial %d: validation accuracy %.4f", trial.number, value)
    elif state == "pruned":
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        log.info("trial %d pruned: %s", trial.number, value)
    else:  # the values made the run fail: the trial used its budget
        trial.set_user_attr("run_error", value)
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        log.warning("trial %d failed: %s", trial.number, value)


def _stopped(study, trial, values: dict[str, Any]) -> None:
    """A stopped process or a bug, not the values: the trial is failed and its values queued again for next time."""
    import optuna

    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    study.enqueue_trial(values, skip_if_exists=False)


def _next(spec: TuneSpec, study, dims: tuple[Dim, ...] | None = None):
    """The study's next trial and its values (over `dims`, default the spec's space), or None once a grid has no
    values left to run."""
    import optuna

    if spec.sampler == "grid" and not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
        return None
    trial = study.ask()
    values = {d.key: d.suggest(trial) for d in (dims or spec.space)}
    log.info("trial %d: %s", trial.number, values)
    return trial, values


def tune(spec: TuneSpec, study_dir: Path, final: bool = True, workers: int = 1,
         earlier: tuple[Path, ...] = (), shared: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Run (or resume) the study until `spec.trials` trials have finished; returns the summary (also written to
    ``<study_dir>/summary.json``). With `workers` > 1, that many trials run at once, each in its own process (a GPU
    machine's cores, or a machine with cores to spare); a grid study's trials and choice are the same at any number
    of workers, a TPE study's later draws depend on which trials finished first. A trial that already ran with the
    same config in one of the `earlier` study folders is taken from there (:func:`earlier_trial`); a phase 1 trained
    once may be one of the `shared` runs' (:func:`phase1_once`)."""
    import optuna

    check_spec(spec)
    if workers < 1:
        raise TuneError(f"--workers {workers}: must be >= 1")
    spec = phase1_once(spec, study_dir, shared)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = open_study(spec, study_dir)
    trials_dir = study_dir / "trials"
    t0 = time.perf_counter()
    if workers == 1:
        while len(_finished(study)) < spec.trials:
            nxt = _next(spec, study)
            if nxt is None:
                log.info("the grid is exhausted after %d trials", len(_finished(study)))
                break
            _run_one(spec, study, *nxt, trials_dir, earlier)
    else:
        _tune_parallel(spec, study, study_dir, trials_dir, workers, earlier)
    if spec.bracket:
        bracket(spec, study, trials_dir, earlier)
    return summarize(spec, study, study_dir, final, time.perf_counter() - t0)


PHASE1_RUN = "phase1"  # <study>/phase1: the one run whose phase 1 every trial starts from (phase1_once)


def phase1_once(spec: TuneSpec, study_dir: Path, shared: tuple[Path, ...] = ()) -> TuneSpec:
    """A one-shot method's search over keys its phase 1 does not read (FENS's aggregator; FENS Sec. 3.1-3.2): phase 1
    is trained once, at the study's seed, by the run ``<study>/phase1`` (one round after it), and every trial starts
    from that ensemble through the method's reuse key (``fens-reuse``), so all trials score the same members and
    none trains them again. The run is made when a trial first needs it (:func:`ensure_phase1`), so a study whose
    trials are all done trains nothing. Where ``<study>/phase1`` holds no such ensemble and one of the `shared` run
    folders does (another method's run with the same phase-1 settings: FedKD's and Fed-ET's members are the same;
    :func:`has_phase1`), the trials start from that one and nothing is trained. Any other spec comes back as it is:
    another method, a reuse key already set, or a space with a key phase 1 reads (each of its values is checked)."""
    from dataclasses import replace

    from hetfl.common.oneshot.artifacts import phase1_settings
    from hetfl.methods import phase1_of, validate

    phase1 = phase1_of(str(spec.base.get("method", "")))
    if phase1 is None or not phase1.reuse_key or spec.base.get(phase1.reuse_key):
        return spec
    cfg = spec.trial_config({}, study_dir, PHASE1_RUN)
    ref = phase1_settings(validate(cfg), phase1)
    for d in spec.space:
        for v in d.ends():
            if phase1_settings(validate(spec.trial_config({d.key: v}, study_dir, PHASE1_RUN)), phase1) != ref:
                return spec
    own = study_dir / PHASE1_RUN
    src = (saved_phase1((own, *shared), cfg, phase1) if shared else None) or own  # else trained there
    return replace(spec, base={**spec.base, phase1.reuse_key: str(src.resolve())})


def ensure_phase1(spec: TuneSpec) -> None:
    """Train the phase 1 that :func:`phase1_once` named (``<study>/phase1``), unless its ensemble is there from this
    study's settings; its ensemble is an ignored file, so a fresh checkout trains it again (the same members: same
    config and seed). Nothing for a spec without it."""
    from dataclasses import replace

    from hetfl.common.oneshot.artifacts import ENSEMBLE
    from hetfl.inprocess import finished_run, run_in_process
    from hetfl.methods import phase1_of

    phase1 = phase1_of(str(spec.base.get("method", "")))
    run_dir = Path(str(spec.base.get(phase1.reuse_key, ""))) if phase1 is not None and phase1.reuse_key else None
    if run_dir is None or run_dir.name != PHASE1_RUN:
        return
    own = replace(spec, base={k: v for k, v in spec.base.items() if k != phase1.reuse_key})
    cfg = least_server_step(own.trial_config({}, run_dir.parent, PHASE1_RUN))
    metrics = run_dir / "metrics.json"
    if metrics.is_file() and has_phase1(run_dir, cfg, phase1):
        return  # its ensemble is saved after phase 1, before the server's step: that need not have finished
    if metrics.is_file() and not (run_dir / ENSEMBLE).is_file():
        metrics.unlink()  # its ensemble is not here (not committed): trained again, the same
    finished_run(run_dir, cfg)  # a run of other settings there is moved aside
    log.info("phase 1 once for every trial (no key of the space changes it): %s", run_dir)
    run_in_process(cfg, spec.nodes, run_dir.parent, PHASE1_RUN)


def least_server_step(cfg: dict[str, Any]) -> dict[str, Any]:
    """The phase-1 run's config (:func:`ensure_phase1`): its server step cut to one round, and to one server epoch
    where the method counts its step in epochs (a one-shot baseline's ``epochs`` field, which its ServerApp runs:
    fedkd-epochs, coboost-epochs, ...). The run is there for the ensemble it saves after phase 1."""
    from dataclasses import fields

    from hetfl.methods import params_for, validate

    epochs = next((f.metadata["key"] for f in fields(params_for(validate(cfg))) if f.name == "epochs"), None)
    return {**cfg, "num-server-rounds": 1, **({epochs: 1} if epochs else {})}


def has_phase1(run_dir: Path, cfg: dict[str, Any], phase1: Any) -> bool:
    """Whether `run_dir` holds an ensemble saved with `cfg`'s phase-1 settings (the check a run that reuses it makes,
    :func:`~hetfl.common.oneshot.artifacts.check_reuse`: the settings the ensemble records, not the server step's)."""
    from hetfl.common.config import ConfigError
    from hetfl.common.oneshot.artifacts import check_reuse
    from hetfl.methods import validate

    try:
        return check_reuse({**validate(cfg), phase1.reuse_key: str(run_dir)}, phase1.reuse_key, phase1) is not None
    except ConfigError:
        return False


def saved_phase1(run_dirs: tuple[Path, ...], cfg: dict[str, Any], phase1: Any) -> Path | None:
    """The first of `run_dirs` holding an ensemble saved with `cfg`'s phase-1 settings (:func:`has_phase1`); None if
    none does."""
    return next((d for d in run_dirs if has_phase1(d, cfg, phase1)), None)


def _resumable(run_dir: Path) -> bool:
    return (run_dir / "checkpoint.json").is_file() and (run_dir / "metrics.json").is_file()


def _replay_checkpointed(run_dir: Path, report) -> None:
    """Report the rounds a stopped trial's checkpoint holds (its resumed run reports only the rounds after them)."""
    from hetfl.common.rounds import catch_up_metrics, checkpoint_rows

    catch_up_metrics(run_dir)  # a trial killed outright: its metrics.json may lag (RunRecorder.sync); pruned now, it stays
    for row in checkpoint_rows(run_dir / "checkpoint.json"):
        if row["round"] >= 1 and row.get(OBJECTIVE) is not None:
            report(row["round"], float(row[OBJECTIVE]))


def adopt_stopped(study, values: dict[str, Any], trials_dir: Path, name: str) -> Path | None:
    """The folder of the newest trial with these `values` that a stopped process left with a checkpoint (failed
    without a run error: :func:`_stopped`, :func:`_recover`), renamed to `name`, so that this trial continues it
    (same config and seed: the resumed run ends as an uninterrupted one, docs/checkpoints.md); None if there is none."""
    from optuna.trial import TrialState

    target = trials_dir / name
    if target.exists():
        return None
    for t in sorted(study.get_trials(deepcopy=False, states=(TrialState.FAIL,)), key=lambda t: -t.number):
        old = trials_dir / f"t{t.number:03d}"
        if "run_error" not in t.user_attrs and t.params == values and _resumable(old):
            old.rename(target)
            log.info("%s: continues trial %d's run from its checkpoint (%s)", name, t.number, target)
            return target
    return None


def _run_one(spec: TuneSpec, study, trial, values: dict[str, Any], trials_dir: Path, earlier: tuple[Path, ...]) -> None:
    adopt_stopped(study, values, trials_dir, f"t{trial.number:03d}")
    try:
        outcome = _attempt(spec, trial, values, trials_dir, f"t{trial.number:03d}", earlier)
    except BaseException:
        _stopped(study, trial, values)
        raise
    _tell(study, trial, outcome)


# --- brackets: a choice on the edge of its grid or range is searched past it ------------------------------------


def _round1(x: float) -> float:
    """`x` to one significant digit (0.333 -> 0.3, 0.0033 -> 0.003, 20 -> 20)."""
    if x == 0:
        return 0.0
    digits = -int(math.floor(math.log10(abs(x))))
    return round(x, digits)


def step_past(values: list[Any], high: bool) -> Any:
    """The value one step past the high (or low) edge of a numeric list, in the list's own spacing: multiplicative
    (the edge x edge / its neighbour, rounded to 1 significant digit) where the two edge values differ by a factor of
    1.5 or more, all are positive and the list is not evenly spaced, else additive (edge + (edge - neighbour)); an int
    for a list of ints."""
    vals = sorted(set(values))
    if len(vals) < 2:
        raise TuneError(f"a step past the edge needs two values; got {vals}")
    edge, nb = (vals[-1], vals[-2]) if high else (vals[0], vals[1])
    ratio = edge / nb if nb else math.inf
    gaps = [b - a for a, b in zip(vals, vals[1:])]
    evenly = len(vals) >= 3 and max(gaps) - min(gaps) <= 1e-9 * max(abs(v) for v in vals)
    if not evenly and all(v > 0 for v in vals) and (ratio >= 1.5 or ratio <= 1 / 1.5):
        nxt = _round1(edge * ratio)
    else:
        nxt = edge + (edge - nb)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
        nxt = int(round(nxt))
        if nxt == edge:
            nxt = edge + (1 if high else -1)
    return nxt


def _numeric_choice(d: Dim) -> bool:
    return d.kind == "choice" and len(d.choices) >= 2 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in d.choices)


def _valid(spec: TuneSpec, values: dict[str, Any]) -> bool:
    from hetfl.common.config import ConfigError
    from hetfl.methods import validate

    try:
        validate(spec.trial_config(values, Path("."), "check"))
        return True
    except ConfigError:
        return False


class _Unpruned:
    """The trial a bracket step runs as: it reports to no study and is never pruned."""

    def report(self, value: float, step: int) -> None:
        pass

    def should_prune(self) -> bool:
        return False


def _results(study, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every finished trial of the study and every bracket step that ran, as summary rows (in the order they ran)."""
    from optuna.trial import TrialState

    def row(t) -> dict[str, Any]:
        rounds = max(t.intermediate_values, default=0)
        return {"number": t.number, "state": t.state.name.lower(), "values": t.params,
                "val_accuracy": t.value if t.state == TrialState.COMPLETE else None, "rounds": rounds,
                # a pruned trial: the validation accuracy the pruner judged it by (a continued run's metrics.json
                # may hold rounds past it: its checkpoint's)
                **({"pruned_val_accuracy": t.intermediate_values[rounds]} if t.state == TrialState.PRUNED and rounds
                   else {}),
                **({"error": t.user_attrs["run_error"]} if "run_error" in t.user_attrs else {})}

    rows = [row(t) for t in _finished(study)]
    rows += [{k: st[k] for k in ("folder", "state", "values", "val_accuracy", "rounds", "error") if k in st}
             for st in steps if "folder" in st]
    return rows


def _best(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    complete = [(k, r) for k, r in enumerate(rows) if r["state"] == "complete"]
    return max(complete, key=lambda kr: (kr[1]["val_accuracy"], -kr[0]))[1] if complete else None


def bracket(spec: TuneSpec, study, trials_dir: Path, earlier: tuple[Path, ...] = ()) -> list[dict[str, Any]]:
    """Search past every edge the best value sits on (module docstring, "Brackets"); the steps taken, also kept in
    the study file (user attribute ``extensions``), so that a resumed study repeats none."""
    steps: list[dict[str, Any]] = list(study.user_attrs.get("extensions", []))
    ranges = {d.key: [d.low, d.high] for d in spec.space if d.kind != "choice"}
    for st in steps:  # a resumed study: the ranges as widened before
        if "range" in st:
            ranges[st["key"]] = st["range"]
    for st in steps:  # a widening stopped part-way: its missing trials first
        if "extra" in st:
            _widened_trials(spec, study, ranges, st, steps, trials_dir, earlier)
    while (best := _best(rows := _results(study, steps))) is not None:
        done_before = len(steps)
        for d in spec.space:
            taken = [st for st in steps if st["key"] == d.key]
            if len(taken) >= MAX_EXTENSIONS or (taken and taken[-1].get("stop")):
                continue
            if _numeric_choice(d):
                step = _grid_step(spec, d, best, rows, steps, trials_dir, earlier)
            elif d.kind in ("log", "float", "int"):
                step = _range_step(spec, d, best, ranges)
            else:
                step = None
            if step is not None:
                steps.append(step)  # kept in the study file before a widening's trials run: a stopped one is topped up
                study.set_user_attr("extensions", steps)
                if "extra" in step:
                    _widened_trials(spec, study, ranges, step, steps, trials_dir, earlier)
                break  # the best may have moved: every key is judged again against it
        if len(steps) == done_before:
            break
    return steps


def _grid_step(spec: TuneSpec, d: Dim, best: dict[str, Any], rows: list[dict[str, Any]], steps: list[dict[str, Any]],
               trials_dir: Path, earlier: tuple[Path, ...]) -> dict[str, Any] | None:
    """One value past the edge of a numeric list that the best value sits on, run as trial ``e<k>``; None if the best
    is interior."""
    tried = sorted({r["values"][d.key] for r in rows} | set(d.choices))
    b = best["values"][d.key]
    if b not in (tried[0], tried[-1]):
        return None
    nxt = step_past(tried, high=b == tried[-1])
    values = {**best["values"], d.key: nxt}
    if not _valid(spec, values):
        return {"key": d.key, "value": nxt, "edge": b, "stop": "outside the key's allowed range"}
    # run beside the Optuna study (a categorical's choices cannot grow there), never pruned
    name = f"e{sum('folder' in st for st in steps):03d}"
    log.info("bracket: %s = %r is on the edge of %s; %s tries %r", d.key, b, tried, name, nxt)
    state, value = _attempt(spec, _Unpruned(), values, trials_dir, name, earlier)
    diverged = state != "complete" or value < 0.5 * best["val_accuracy"]
    return {"key": d.key, "value": nxt, "edge": b, "folder": name, "values": values, "state": state,
            "val_accuracy": value if state == "complete" else None, "rounds": spec.rounds if state == "complete" else 0,
            **({"error": value} if state == "fail" else {}), **({"stop": "diverged"} if diverged else {})}


def _range_step(spec: TuneSpec, d: Dim, best: dict[str, Any], ranges: dict[str, list[float]]) -> dict[str, Any] | None:
    """A range widened past the edge the best value lies within a tenth of its width of (`ranges` updated), with the
    number of trials to search it with (``extra``; :func:`_widened_trials` runs them); None if the best is far
    enough inside."""
    lo, hi = ranges[d.key]
    b = float(best["values"][d.key])
    width = math.log(hi / lo) if d.kind == "log" else hi - lo
    pos = (math.log(b / lo), math.log(hi / b)) if d.kind == "log" else (b - lo, hi - b)
    if min(pos) >= width / 10:
        return None
    high = pos[1] < pos[0]
    if d.kind == "log":
        new = [lo, hi * math.exp(width / 2)] if high else [lo / math.exp(width / 2), hi]
    else:
        new = [lo, hi + width / 2] if high else [lo - width / 2, hi]
    if d.kind == "int":
        new = [int(math.floor(new[0])), int(math.ceil(new[1]))]
    if not _valid(spec, {**best["values"], d.key: new[1] if high else new[0]}):
        return {"key": d.key, "range": [lo, hi], "edge": b, "stop": "outside the key's allowed range"}
    ranges[d.key] = new
    step = {"key": d.key, "range": new, "edge": b, "trials": [], "extra": max(3, spec.trials // 2)}
    log.info("bracket: %s = %g lies within a tenth of the edge of [%g, %g]; %d trials over [%g, %g]",
             d.key, b, lo, hi, step["extra"], *new)
    return step


def _widened_trials(spec: TuneSpec, study, ranges: dict[str, list[float]], step: dict[str, Any],
                    steps: list[dict[str, Any]], trials_dir: Path, earlier: tuple[Path, ...]) -> None:
    """Run a widening's trials over the widened ranges until it has its ``extra``, keeping each in the study file."""
    dims = tuple(Dim(x.key, x.kind, *ranges[x.key]) if x.key in ranges else x for x in spec.space)
    while len(step["trials"]) < step["extra"]:
        trial, values = _next(spec, study, dims)
        _run_one(spec, study, trial, values, trials_dir, earlier)
        step["trials"].append(trial.number)
        study.set_user_attr("extensions", steps)


def _tune_parallel(spec: TuneSpec, study, study_dir: Path, trials_dir: Path, workers: int,
                   earlier: tuple[Path, ...] = ()) -> None:
    """Keep `workers` trials running (one process each) until the budget is met or the grid is exhausted."""
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    running: dict = {}  # future -> (trial, values)
    if len(_finished(study)) < spec.trials:
        ensure_phase1(spec)  # here, before the workers, so that none of them trains it beside another
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            while True:
                while len(running) < workers and len(_finished(study)) + len(running) < spec.trials:
                    nxt = _next(spec, study)
                    if nxt is None:
                        break
                    trial, values = nxt
                    adopt_stopped(study, values, trials_dir, f"t{trial.number:03d}")
                    fut = pool.submit(_attempt_in_child, spec, str(study_dir / "study.db"), trial._trial_id, values,
                                      trials_dir, f"t{trial.number:03d}", earlier)
                    running[fut] = (trial, values)
                if not running:
                    break
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in done:
                    trial, values = running.pop(fut)
                    try:
                        outcome = fut.result()
                    except BaseException:
                        _stopped(study, trial, values)
                        raise
                    _tell(study, trial, outcome)
        except BaseException:
            for fut, (trial, values) in running.items():  # the other trials in flight: failed, queued again
                fut.cancel()
                _stopped(study, trial, values)
            pool.shutdown(wait=False, cancel_futures=True)
            raise


def on_edge(spec: TuneSpec, rows: list[dict[str, Any]], best: dict[str, Any]) -> dict[str, Any]:
    """The numeric grid keys whose best value is the lowest or highest value any finished trial tried (a failed
    trial counts: a step past the edge that diverged brackets it), each with that value: what :func:`bracket` could
    not move inside."""
    out = {}
    for d in spec.space:
        if not _numeric_choice(d):  # a range's edges: the extensions say how it was widened
            continue
        tried = sorted({r["values"][d.key] for r in rows if d.key in r["values"]})
        if len(tried) >= 2 and best["values"][d.key] in (tried[0], tried[-1]):
            out[d.key] = best["values"][d.key]
    return out


def summarize(spec: TuneSpec, study, study_dir: Path, final: bool, seconds: float) -> dict[str, Any]:
    """The study's outcome; with `final`, the chosen values run once more and their test accuracy is reported."""
    done = _finished(study)
    steps = study.user_attrs.get("extensions", [])
    rows = _results(study, steps)
    best = _best(rows)
    if best is None:
        raise TuneError(f"{study_dir}: no trial completed (all {len(rows)} pruned or failed)")
    out: dict[str, Any] = {
        "protocol": "hetfl.tune: objective = validation accuracy (first half of the server's evaluation set) after the "
                    "last round; the test half is read once, by the chosen values' final run",
        "budget": {"trials": spec.trials, "rounds_per_trial": spec.rounds, "trial_rounds": spec.trials * spec.rounds,
                   "rounds_run": sum(r["rounds"] for r in rows),
                   "extension_trials": sum(1 for st in steps if "folder" in st) + sum(len(st.get("trials", []))
                                                                                    for st in steps)},
        "space": {d.key: (list(d.choices) if d.kind == "choice" else f"{d.kind}:{d.low:g}:{d.high:g}") for d in spec.space},
        "sampler": spec.sampler, "seed": spec.seed, "nodes": spec.nodes,
        "trials": rows,
        "pruned": sum(r["state"] == "pruned" for r in rows),
        "extensions": steps,
        "on_edge": on_edge(spec, rows, best),
        "best": {**({"trial": best["number"]} if "number" in best else {"folder": best["folder"]}),
                 "values": best["values"], "val_accuracy": best["val_accuracy"]},
        "seconds_this_call": seconds,
        # each finished trial's own wall time, from the study file: what the study took over all its calls (trials
        # run side by side with --workers overlap, so their sum is more than the wall time)
        "trial_seconds": sum((t.datetime_complete - t.datetime_start).total_seconds() for t in done
                             if t.datetime_complete and t.datetime_start),
    }
    if final:
        m = run_trial(spec, best["values"], study_dir, "chosen")
        last = m["rounds"][-1]
        out["chosen"] = {"val_accuracy": _objective(last), "test_accuracy": float(last["accuracy"]),
                         "same_as_trial": abs(_objective(last) - best["val_accuracy"]) < 1e-9,
                         "metrics": str(study_dir / "chosen" / "metrics.json")}
        if not out["chosen"]["same_as_trial"]:
            log.warning("the chosen values' final run gave validation accuracy %.4f, the best trial gave %.4f: not the "
                        "same run", _objective(last), best["val_accuracy"])
    _write_summary(study_dir / "summary.json", out)
    return out


def _write_summary(path: Path, out: dict[str, Any]) -> None:
    """Write summary.json unless it already says the same apart from ``seconds_this_call``: a call that only re-read a
    finished study keeps the file (and the seconds of the call that last changed it), so a committed summary is not
    dirtied by every later read."""
    text = json.dumps(out, indent=2, default=str)
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except ValueError:
            old = None
        if isinstance(old, dict) and "seconds_this_call" in old:
            from hetfl.common.results import relative_paths  # a study stores the summary with relative paths

            new = json.loads(text)
            old.pop("seconds_this_call"), new.pop("seconds_this_call")
            if relative_paths(old) == relative_paths(new):
                return
    path.write_text(text)


# --- command line ----------------------------------------------------------------------------------------------


def _parser(prog: str = "python -m hetfl.tune") -> argparse.ArgumentParser:
    from hetfl.launch import add_run_config_args

    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="The protocol: docs/tuning.md. Example: python -m hetfl.tune configs/fedavg/"
                                       "fmnist-dir0.1.toml --space \"lr=log:0.003:0.3\" --trials 8 --rounds 10 "
                                       "--study results/tune/fedavg")
    p.add_argument("preset", help="a preset TOML (configs/<method>/<name>.toml) whose method is tuned")
    p.add_argument("--space", required=True, help="the searched keys, space-separated: key=log:<lo>:<hi> (log-uniform), "
                   "key=float:<lo>:<hi>, key=int:<lo>:<hi>, or key=a,b,c (choices)")
    p.add_argument("--trials", type=int, required=True, help="trials to finish (completed or pruned); the budget with --rounds")
    p.add_argument("--rounds", type=int, required=True, help="num-server-rounds of every trial")
    p.add_argument("--study", required=True, help="directory of the study: study.db (SQLite), trials/, chosen/, summary.json")
    p.add_argument("--nodes", type=int, help="clients of every trial (default: the preset's min-available-nodes)")
    p.add_argument("--sampler", choices=SAMPLERS, default="tpe", help="seeded TPE, or the grid of listed values")
    p.add_argument("--seed", type=int, default=0, help="the sampler's seed (the runs' seed is run-config 'seed')")
    p.add_argument("--prune-after", type=int, default=1, help="rounds before a trial can be pruned (default 1)")
    p.add_argument("--no-prune", action="store_true", help="run every trial to its last round")
    p.add_argument("--no-bracket", action="store_true", help="do not search past an edge the best value sits on")
    p.add_argument("--no-final", action="store_true", help="do not rerun the chosen values (no test accuracy)")
    p.add_argument("--workers", type=int, default=1, help="trials run at once, one process each (default 1; a grid "
                   "study chooses the same at any number)")
    add_run_config_args(p)  # overrides for every trial
    return p


def main(argv: list[str] | None = None, prog: str = "python -m hetfl.tune") -> int:
    from hetfl import launch
    from hetfl.common.task import setup_logging

    a = _parser(prog).parse_args(argv)
    setup_logging()
    try:
        import optuna  # noqa: F401
    except ImportError:
        print("error: hetfl.tune needs Optuna: pip install 'hetfl[tune]' (or pip install optuna)", file=sys.stderr)
        return 2
    try:
        path = Path(a.preset)
        if not path.is_file():
            raise TuneError(f"preset {a.preset!r}: no such file")
        base = {**tomllib.loads(path.read_text()), **launch.overrides_of(a)}
        spec = TuneSpec(base=base, space=tuple(parse_space(a.space)), trials=a.trials, rounds=a.rounds,
                        nodes=a.nodes or int(base.get("min-available-nodes", 2)), sampler=a.sampler, seed=a.seed,
                        prune_after=a.prune_after, prune=not a.no_prune, bracket=not a.no_bracket)
        out = tune(spec, Path(a.study), final=not a.no_final, workers=a.workers)
    except (TuneError, launch.PreflightError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    best = out["best"]
    print(f"best of {len(out['trials'])} trials ({out['pruned']} pruned): {'trial ' + str(best['trial']) if 'trial' in best else best['folder']} {best['values']} "
          f"validation accuracy {best['val_accuracy']:.4f}")
    if "chosen" in out:
        print(f"chosen values rerun: validation {out['chosen']['val_accuracy']:.4f} (same run: "
              f"{out['chosen']['same_as_trial']}), test {out['chosen']['test_accuracy']:.4f}")
    for key, value in out["on_edge"].items():
        print(f"warning: {key} = {value!r} is on the edge of what was tried (--no-bracket, or the key's allowed range)",
              file=sys.stderr)
    print(f"summary: {Path(a.study) / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
