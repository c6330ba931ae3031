"""A verdict as a declared study: one TOML file, committed before its runs, says what is compared and how; one
runner tunes, trains what is missing, reuses what ran, and writes the verdict (docs/verdicts.md).

    hetfl study run experiments/shefl-table1.toml               # tune, train, decide, write the page
    hetfl study run experiments/shefl-table1.toml --tune-only   # the tuning studies only (no scored run trained)
    hetfl study table experiments/shefl-table1.toml             # the page from what ran, nothing trained

The file declares the methods (a preset each, and ``overrides`` common to all), the search space and budget (trials
x rounds, the same for every method: ``[tune]``), the seeds and rounds of the scored runs (``[final]``), the
statistic each seed contributes, the one primary comparison that decides the verdict, the paper's claimed margin
and the kind of claim ("superiority", or "parity" with an equivalence margin). Each method is tuned with
:mod:`hetfl.tune` on validation (the first half of the test split), then run at every seed with the chosen values
and scored on the test half, which tuning never read. The verdict follows :func:`hetfl.stats.label` on the paired
differences of the primary pair; the other pairs are Holm-corrected.

Everything lands under ``docs/results/studies/<name>/`` (``<method>/tune/``, ``<method>/runs/s<seed>/``,
``verdict.json``) and the page ``docs/results/studies/<name>.md``; committed files name paths relative to the
repository. A run or trial that finished is never run again (same config and seed, same run).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import re
import signal
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("hetfl")

ROOT = Path(__file__).resolve().parent.parent
STUDIES = ROOT / "docs" / "results" / "studies"
KINDS = ("superiority", "parity")
STATISTICS = {
    "mean-last-5": "the mean test accuracy of the last 5 rounds",
    "final": "the test accuracy after the last round",
}
FAILED_SEEDS = {  # how a seed whose run stopped counts (``final.failed-seeds``; docs/verdicts.md says why)
    "last-model": "scored by the model it stopped with, held to the last round",
    "leave-out": "left out of the pairs",
}
TOP_KEYS = {"name", "claim", "kind", "claimed-margin", "equivalence-margin", "primary", "statistic", "methods",
            "overrides", "tune", "final", "sweep", "also", "others"}


class StudyError(ValueError):
    """A study file that cannot run: one line naming the key, the value and what is allowed."""


@dataclass(frozen=True)
class Study:
    """A parsed study file (module docstring)."""

    name: str
    claim: str
    kind: str
    margin: float  # the claimed margin (superiority) or the equivalence margin (parity), points of accuracy
    primary: tuple[str, str]  # (the method the paper favours, the one it is compared with)
    statistic: str
    methods: dict[str, str]  # method label -> preset path (relative to the repository)
    space: str  # the search space of every method without its own (``by_method``)
    sampler: str
    trials: int
    rounds: int
    seeds: tuple[int, ...]
    final_rounds: int  # of every method not in `rounds_by_method`
    overrides: dict[str, Any] = field(default_factory=dict)
    by_method: dict[str, dict[str, Any]] = field(default_factory=dict)  # method -> its own space, sampler, trials or
    # rounds (``[tune.by-method]``)
    why: str = ""  # why a method tunes otherwise (``tune.why``: required with ``by-method``)
    earlier: dict[str, tuple[str, ...]] = field(default_factory=dict)  # method -> committed tune folders to reuse
    earlier_runs: dict[str, tuple[str, ...]] = field(default_factory=dict)  # method -> committed run folders to reuse
    rounds_by_method: dict[str, int] = field(default_factory=dict)  # ``final.rounds-by-method`` (needs ``final.why``)
    why_rounds: str = ""
    sweep: tuple[str, tuple[Any, ...], Any] | None = None  # (run-config key, its values, the value that decides)
    file: str = ""  # the study file, for the page (a sweep's cells name their parent's)
    also: tuple[dict[str, Any], ...] = ()  # ``[[also]]``: further claims decided on the same scored runs
    sets: dict[str, dict[str, Any]] = field(default_factory=dict)  # method -> its own run-config keys (``set``)
    others: tuple[str, ...] | None = None  # the methods compared with the favoured one, Holm-corrected (None: all)
    failed_seeds: str = "last-model"  # ``final.failed-seeds``: how a seed that stopped (diverged) counts: FAILED_SEEDS
    out: Path = STUDIES

    @classmethod
    def from_file(cls, path: str | Path, out: Path | None = None) -> Study:
        path = Path(path)
        if not path.is_file():
            raise StudyError(f"study file {str(path)!r} does not exist; expected a TOML file such as "
                             "experiments/shefl-table1.toml")
        try:
            d = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as err:
            raise StudyError(f"study file {str(path)!r} is not valid TOML: {err}") from None
        unknown = sorted(set(d) - TOP_KEYS)
        if unknown:
            raise StudyError(f"study key {unknown[0]!r} is not known; expected one of {sorted(TOP_KEYS)}")
        for key in ("name", "claim", "kind", "primary", "statistic", "methods", "tune", "final"):
            if key not in d:
                raise StudyError(f"study file {str(path)!r} lacks {key!r}")
        kind = d["kind"]
        if kind not in KINDS:
            raise StudyError(f"study key 'kind' = {kind!r} is not allowed; expected one of {KINDS}")
        mkey = "claimed-margin" if kind == "superiority" else "equivalence-margin"
        margin = d.get(mkey)
        if not isinstance(margin, (int, float)) or isinstance(margin, bool) or margin <= 0:
            raise StudyError(f"study key {mkey!r} = {margin!r} is not allowed; expected a positive number of points "
                             f"(a {kind} study needs it)")
        methods, sets = _methods(d["methods"])
        primary = tuple(d["primary"])
        if len(primary) != 2 or any(m not in methods for m in primary) or primary[0] == primary[1]:
            raise StudyError(f"study key 'primary' = {list(primary)!r} is not allowed; expected two different methods "
                             f"of {sorted(methods)}")
        if describe(d["statistic"]) is None:
            raise StudyError(f"study key 'statistic' = {d['statistic']!r} is not allowed; expected one of "
                             f"{sorted(STATISTICS)}, mean-last:<k> or mean-rounds:<a>-<b> (each with an optional "
                             "@<row key>)")
        t, f = d["tune"], d["final"]
        for sec, keys in (("tune", ("space", "trials", "rounds")), ("final", ("seeds", "rounds"))):
            for k in keys:
                if k not in d[sec]:
                    raise StudyError(f"study file {str(path)!r} lacks '{sec}.{k}'")
        rounds_by = _rounds_by_method(f, methods)
        own = _by_method(t, methods)
        earlier = _earlier(t, "tune", methods, "trials", "a committed hetfl.tune folder")
        earlier_runs = _earlier(f, "final", methods, "metrics.json", "a committed run folder")
        seeds = tuple(int(s) for s in f["seeds"])
        if len(seeds) < 2 or len(set(seeds)) != len(seeds):
            raise StudyError(f"study key 'final.seeds' = {list(seeds)!r} is not allowed; expected at least 2 distinct "
                             "seeds (a paired interval needs 2)")
        _seed_rule("", kind, float(margin), d["statistic"], seeds)
        also = _also(d.get("also", []), methods)
        for k, e in enumerate(also):
            _seed_rule(f"also[{k}]", e["kind"], e["margin"], e["statistic"], seeds)
        return cls(name=d["name"], claim=d["claim"], kind=kind, margin=float(margin), primary=primary,  # type: ignore[arg-type]
                   statistic=d["statistic"], methods=methods, space=t["space"], sampler=t.get("sampler", "grid"),
                   trials=int(t["trials"]), rounds=int(t["rounds"]), seeds=seeds, final_rounds=int(f["rounds"]),
                   overrides=dict(d.get("overrides", {})), by_method=own, why=str(t.get("why", "")), earlier=earlier,
                   earlier_runs=earlier_runs, rounds_by_method=rounds_by,
                   why_rounds=str(f.get("why", "")), sets=sets, also=also,
                   others=_others(d, "others", methods, primary), failed_seeds=_failed_seeds(f),
                   sweep=_sweep(d.get("sweep")), file=f"experiments/{d['name']}.toml",
                   out=out or STUDIES)

    @property
    def folder(self) -> Path:
        return self.out / self.name

    def base(self, method: str) -> dict[str, Any]:
        """The method's preset, the study's ``overrides``, then the method's own ``set`` keys."""
        return {**tomllib.loads((ROOT / self.methods[method]).read_text()), **self.overrides, **self.sets.get(method, {})}

    def rounds_of(self, method: str) -> int:
        """The scored runs' rounds of `method`."""
        return self.rounds_by_method.get(method, self.final_rounds)

    def tuning_of(self, method: str) -> dict[str, Any]:
        """The method's space, sampler, trials and rounds: ``[tune]``'s, each replaced by its ``by-method`` entry."""
        return {"space": self.space, "sampler": self.sampler, "trials": self.trials, "rounds": self.rounds,
                **self.by_method.get(method, {})}

    def tune_spec(self, method: str):
        from hetfl.tune import TuneSpec, parse_space

        base, t = self.base(method), self.tuning_of(method)
        return TuneSpec(base=base, space=tuple(parse_space(t["space"])), trials=int(t["trials"]),
                        rounds=int(t["rounds"]), nodes=int(base.get("min-available-nodes", 2)), sampler=t["sampler"],
                        seed=0)

    def final_config(self, method: str, values: dict[str, Any], seed: int) -> dict[str, Any]:
        from hetfl.tune import resumable

        base = self.base(method)
        return {**base, **values, "seed": seed, "num-server-rounds": self.rounds_of(method),
                "eval-split": "test-half", **resumable(base)}


def _earlier(sec: dict[str, Any], name: str, methods: dict[str, str], holds: str, what: str) -> dict[str, tuple[str, ...]]:
    """``<name>.earlier``: method -> committed folders (relative to the repository) whose finished trials or runs of
    the same config are reused instead of run again (same config and seed, same run)."""
    out = {m: tuple(v) for m, v in dict(sec.get("earlier", {})).items()}
    for m, folders in out.items():
        if m not in methods:
            raise StudyError(f"study key '{name}.earlier.{m}' names no method; expected one of {sorted(methods)}")
        for folder in folders:
            if not (ROOT / folder / holds).exists():
                raise StudyError(f"study key '{name}.earlier.{m}' = {folder!r}: no {holds} there; expected {what}")
    return out


def _methods(sec: dict[str, Any]) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """``[methods]``: a label -> a preset, or -> ``{ preset = "...", set = { key = value } }`` (run-config keys of that
    method alone, over its preset and the study's ``overrides``)."""
    methods, sets = {}, {}
    for label, v in dict(sec).items():
        preset = v.get("preset") if isinstance(v, dict) else v
        if isinstance(v, dict) and (unknown := sorted(set(v) - {"preset", "set"})):
            raise StudyError(f"study key 'methods.{label}.{unknown[0]}' is not known; expected preset and set")
        if not isinstance(preset, str) or not (ROOT / preset).is_file():
            raise StudyError(f"study key 'methods.{label}' = {preset!r}: no such preset")
        methods[label] = preset
        if isinstance(v, dict) and v.get("set"):
            sets[label] = dict(v["set"])
    return methods, sets


def _seed_rule(where: str, kind: str, margin: float | None, statistic_: str, seeds: tuple[int, ...]) -> None:
    """The seeds a claim needs (issue rule, docs/verdicts.md): a convergence claim (``round-to:``) at least 3; a
    superiority or parity margin under 2 points at least 5."""
    claim = f"{where} " if where else ""
    if statistic_.startswith("round-to"):
        if len(seeds) < 3:
            raise StudyError(f"study key 'final.seeds' = {list(seeds)!r}: the {claim}convergence claim "
                             f"({statistic_}) needs at least 3 seeds")
    elif kind in KINDS and margin is not None and margin < 2 and len(seeds) < 5:
        what = "a claimed" if kind == "superiority" else "an equivalence"
        raise StudyError(f"study key 'final.seeds' = {list(seeds)!r}: {claim + 'has ' if claim else ''}{what} margin "
                         f"under 2 points ({margin:g}), which needs at least 5 seeds")


def _also(entries: list[dict[str, Any]], methods: dict[str, str]) -> tuple[dict[str, Any], ...]:
    """``[[also]]``: further claims on the same runs, each with ``claim``, ``kind`` ("superiority", "parity" or
    "direction": a reading no paper gives a margin for), its margin, ``statistic`` (``round-to:<level>`` allowed: fewer
    rounds is the paper's side) and ``primary``; checked like the study's own."""
    out = []
    for k, e in enumerate(entries):
        where = f"also[{k}]"
        if unknown := sorted(set(e) - {"claim", "kind", "claimed-margin", "equivalence-margin", "statistic", "primary",
                                       "others"}):
            raise StudyError(f"study key '{where}.{unknown[0]}' is not known")
        kind = e.get("kind")
        if kind not in (*KINDS, "direction"):
            raise StudyError(f"study key '{where}.kind' = {kind!r} is not allowed; expected one of "
                             f"{(*KINDS, 'direction')}")
        margin = None if kind == "direction" else e.get("claimed-margin" if kind == "superiority" else "equivalence-margin")
        if kind != "direction" and (not isinstance(margin, (int, float)) or margin <= 0):
            raise StudyError(f"study key '{where}' needs a positive {'claimed' if kind == 'superiority' else 'equivalence'}"
                             f"-margin for a {kind} claim; got {margin!r}")
        primary = tuple(e.get("primary", ()))
        if len(primary) != 2 or any(m not in methods for m in primary) or primary[0] == primary[1]:
            raise StudyError(f"study key '{where}.primary' = {list(primary)!r} is not allowed; expected two different "
                             f"methods of {sorted(methods)}")
        if describe(str(e.get("statistic", ""))) is None:
            raise StudyError(f"study key '{where}.statistic' = {e.get('statistic')!r} is not allowed")
        out.append({"claim": str(e.get("claim", "")), "kind": kind, "margin": margin, "statistic": e["statistic"],
                    "primary": primary, "others": _others(e, f"{where}.others", methods, primary)})
    return tuple(out)


def _others(sec: dict[str, Any], where: str, methods: dict[str, str], primary: tuple[str, ...]) -> tuple[str, ...] | None:
    """``others``: the methods a claim compares with its favoured one besides the primary pair (its Holm family);
    absent: every other method of the study. A study that holds two claims on one set of runs (FENS against the
    iterative methods and against the one-shot ones) keeps each family to its own methods."""
    if "others" not in sec:
        return None
    others = tuple(sec["others"])
    if any(m not in methods or m in primary for m in others) or len(set(others)) != len(others):
        raise StudyError(f"study key {where!r} = {list(others)!r} is not allowed; expected distinct methods of "
                         f"{sorted(methods)} outside primary {list(primary)}")
    return others


def _failed_seeds(f: dict[str, Any]) -> str:
    """``[final] failed-seeds``: one of :data:`FAILED_SEEDS` (default "last-model")."""
    rule = f.get("failed-seeds", "last-model")
    if rule not in FAILED_SEEDS:
        raise StudyError(f"study key 'final.failed-seeds' = {rule!r} is not allowed; expected one of "
                         f"{sorted(FAILED_SEEDS)}")
    return rule


def _rounds_by_method(f: dict[str, Any], methods: dict[str, str]) -> dict[str, int]:
    """``[final]``'s keys checked, and its ``rounds-by-method`` (method -> rounds), which needs a ``why``."""
    if unknown := sorted(set(f) - {"seeds", "rounds", "earlier", "rounds-by-method", "why", "failed-seeds"}):
        raise StudyError(f"study key 'final.{unknown[0]}' is not known; expected seeds, rounds, earlier, "
                         "rounds-by-method, why, failed-seeds")
    by_method = {m: int(r) for m, r in dict(f.get("rounds-by-method", {})).items()}
    if any(m not in methods for m in by_method) or (by_method and not str(f.get("why", "")).strip()):
        raise StudyError(f"study key 'final.rounds-by-method' = {by_method!r}: expected methods of "
                         f"{sorted(methods)} and 'final.why' saying why their rounds differ")
    return by_method


def _sweep(sec: dict[str, Any] | None) -> tuple[str, tuple[Any, ...], Any] | None:
    """``[sweep]``: one run-config key over a list of values (each value a cell: the whole study at that value), and
    ``primary``, the value whose cell decides the verdict; the others are Holm-corrected and the trend from the first
    to the last value is its own interval."""
    if sec is None:
        return None
    keys = [k for k in sec if k != "primary"]
    if len(keys) != 1 or not isinstance(sec[keys[0]], list) or len(sec[keys[0]]) < 2:
        raise StudyError(f"study key 'sweep' = {sec!r} is not allowed; expected one run-config key with a list of at "
                         "least 2 values, and 'primary' (the value that decides), e.g. train-fraction = [0.1, 1.0]")
    key, values = keys[0], tuple(sec[keys[0]])
    if sec.get("primary") not in values:
        raise StudyError(f"study key 'sweep.primary' = {sec.get('primary')!r} is not allowed; expected one of "
                         f"{list(values)}")
    return key, values, sec["primary"]


def cells(study: Study) -> list[tuple[Any, Study]]:
    """A sweep's cells, (value, the study at that value: its folder ``<name>/<key>-<value>``); [] without a sweep."""
    from dataclasses import replace

    if study.sweep is None:
        return []
    key, values, _ = study.sweep
    return [(v, replace(study, name=f"{study.name}/{key}-{v}", overrides={**study.overrides, key: v}, sweep=None))
            for v in values]


OWN_TUNING = ("space", "sampler", "trials", "rounds")  # what ``[tune.by-method]`` may give a method of its own


def _by_method(t: dict[str, Any], methods: dict[str, str]) -> dict[str, dict[str, Any]]:
    """``[tune]``'s keys checked, and its ``by-method`` (method -> its own ``space``, ``sampler``, ``trials`` or
    ``rounds``: FedAdam's server lr, FENS's aggregator searched by TPE over its own rounds), which needs a ``why``."""
    unknown = sorted(set(t) - {"space", "sampler", "trials", "rounds", "by-method", "why", "earlier"})
    if unknown:
        raise StudyError(f"study key 'tune.{unknown[0]}' is not known; expected space, sampler, trials, rounds, "
                         "by-method, why, earlier")
    own = {}
    for label, v in dict(t.get("by-method", {})).items():
        if label not in methods:
            raise StudyError(f"study key 'tune.by-method.{label}' names no method; expected one of {sorted(methods)}")
        if not isinstance(v, dict) or not v or (bad := sorted(set(v) - set(OWN_TUNING))):
            raise StudyError(f"study key 'tune.by-method.{label}' = {v!r} is not allowed; expected a table of "
                             f"{', '.join(OWN_TUNING)}" + (f" (not {bad[0]!r})" if isinstance(v, dict) and v else ""))
        own[label] = dict(v)
    if own and not str(t.get("why", "")).strip():
        raise StudyError("study key 'tune.why' is missing: a method tuned otherwise than the others "
                         f"({sorted(own)}) needs the file to say why")
    return own


def describe(spec: str) -> str | None:
    """A scored run's statistic in words, or None if a study cannot use `spec` (:func:`statistic`; ``best-static`` is
    for verdict tables, not for a study's seeds)."""
    what, _, key = spec.partition("@")
    on = f" ({key})" if key else ""
    if what in STATISTICS:
        return STATISTICS[what] + on
    if m := re.fullmatch(r"mean-last:(\d+)", what):
        return f"the mean test accuracy of the last {m[1]} rounds{on}"
    if m := re.fullmatch(r"mean-rounds:(\d+)-(\d+)", what):
        return f"the mean test accuracy of rounds {m[1]}-{m[2]}{on}"
    if m := re.fullmatch(r"round-to:(0?\.\d+|1(\.0*)?)", what):
        return (f"the first round whose test accuracy{on} reaches {m[1]} (fewer is better; a seed where a method "
                "never does is left out of the pairs, named as censored)")
    return None


def statistic(metrics: dict[str, Any], name: str) -> float | None:
    """A run's statistic, in points of test accuracy: one of :data:`STATISTICS`, or a spec ``<what>[@<row key>]``
    (the row key defaults to ``accuracy``) where ``<what>`` is ``final``, ``mean-last:<k>`` (the last k rounds),
    ``mean-rounds:<first>-<last>``, ``round-to:<level>`` (the first round whose accuracy reaches `level`, a count of
    rounds, lower is better; None if no round does) or ``best-static`` (FENS: the best static rule on the same
    members, ``static_aggregators_test_accuracy``)."""
    what, _, key = name.partition("@")
    key = key or "accuracy"
    if what == "best-static":
        return 100.0 * max(float(v) for v in metrics["static_aggregators_test_accuracy"].values())
    rows = [r for r in _held_to_end(metrics["rounds"], metrics) if r["round"] >= 1]
    if not rows:
        raise StudyError("a run without rounds has no statistic")
    kind, _, arg = what.partition(":")
    try:
        if what == "final":
            return 100.0 * float(rows[-1][key])
        if what == "mean-last-5" or kind == "mean-last":
            last = rows[-(int(arg) if arg else 5):]
        elif kind == "mean-rounds":
            lo, hi = (int(x) for x in arg.split("-"))
            last = [r for r in rows if lo <= r["round"] <= hi]
            if len(last) != hi - lo + 1:
                raise StudyError(f"statistic {name!r}: the run has {len(last)} of rounds {lo}-{hi}")
        elif kind == "round-to":
            return next((float(r["round"]) for r in rows if float(r[key]) >= float(arg)), None)
        else:
            raise ValueError(what)
    except (ValueError, KeyError) as err:
        raise StudyError(f"statistic {name!r} is not allowed (or the run lacks its key: {err}); expected one of "
                         f"{sorted(STATISTICS)}, final, mean-last:<k>, mean-rounds:<a>-<b>, round-to:<level>, "
                         "best-static, each with an optional @<row key>") from None
    return 100.0 * sum(float(r[key]) for r in last) / len(last)


def _held_to_end(rows: list[dict[str, Any]], metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of a run that stopped (``stopped``: no update accepted) carried to its configured last round with
    its last row's figures: the model it stopped with is what the server would hold at every later round."""
    if not metrics.get("stopped") or not rows:
        return rows
    last = int(metrics.get("config", {}).get("num-server-rounds", rows[-1]["round"]))
    return rows + [{**rows[-1], "round": r} for r in range(int(rows[-1]["round"]) + 1, last + 1)]


def _normalise(folder: Path) -> None:
    """Paths relative to the repository in every metrics.json and summary.json under `folder` (the reuse checks
    compare configs with such paths made relative on both sides: hetfl.inprocess.same_config)."""
    from hetfl.common.results import metrics_text, relative_paths

    for path in list(folder.rglob("metrics.json")) + list(folder.rglob("summary.json")):
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError:  # cut short by a kill while written: the run's resume rewrites it
            log.warning("%s does not parse (cut short while written?); left as it is", path)
            continue
        rel = relative_paths(data)
        if rel != data:
            path.write_text(metrics_text(rel) if path.name == "metrics.json" else json.dumps(rel, indent=2))


def fixed(spec) -> bool:
    """Whether a tuning spec is no search: one value for each key (:func:`tuned` takes those values, no trial run)."""
    return all(d.kind == "choice" and len(d.choices) == 1 for d in spec.space)


def tuned(study: Study, method: str, train: bool = True) -> dict[str, Any] | None:
    """The method's tuning summary: its study run (or resumed) when `train`, else read from disk (None if absent); a
    space of one value per key is not a search: those values, no trial run (``fixed``)."""
    from hetfl.tune import tune

    spec = study.tune_spec(method)
    if fixed(spec):
        return {"best": {"values": {d.key: d.choices[0] for d in spec.space}, "val_accuracy": None}, "trials": [],
                "budget": {"trials": 0, "extension_trials": 0}, "on_edge": {}, "fixed": True}
    folder = study.folder / method / "tune"
    if train:
        out = tune(spec, folder, final=False, earlier=(folder, *(ROOT / f for f in study.earlier.get(method, ()))),
                   shared=phase1_runs(study, method, study.seeds))
        _normalise(folder)
        return out
    path = folder / "summary.json"
    return json.loads(path.read_text()) if path.exists() else None


def _reused_run(study: Study, method: str, cfg: dict[str, Any], run_dir: Path) -> dict[str, Any] | None:
    """A committed run of ``final.earlier`` that finished with this config and seed (every key, apart from where it
    is kept), copied to `run_dir` (metrics.json and its plot); None if there is none."""
    from hetfl.common.config import ConfigError
    from hetfl.common.results import copy_files
    from hetfl.inprocess import same_config
    from hetfl.methods import validate

    want = validate(cfg)
    for folder in study.earlier_runs.get(method, ()):
        path = ROOT / folder / "metrics.json"
        m = json.loads(path.read_text())
        try:
            ok = (m["summary"].get("rounds_completed") == study.rounds_of(method)
                  and same_config(m, cfg, every_key=True, want=want))
        except (KeyError, ConfigError):
            ok = False
        if ok:
            src = ROOT / folder
            copy_files([src / n for n in ("metrics.json", "accuracy.png") if (src / n).exists()], src, run_dir)
            log.info("%s seed %s: the committed run %s, reused", method, cfg["seed"], folder)
            return m
    return None


def phase1_runs(study: Study, method: str, seeds: tuple[int, ...]) -> tuple[Path, ...]:
    """The other methods' run folders whose saved phase 1 `method` may start from, in the study's method order: each
    one's ``tune/phase1`` and its scored runs at `seeds` (:func:`hetfl.tune.has_phase1` picks one with this run's
    phase-1 settings, seed included: FedKD's and Fed-ET's members are the same, FENS's and Co-Boosting's not)."""
    return tuple(p for m in study.methods if m != method
                 for p in (study.folder / m / "tune" / "phase1", *(study.folder / m / "runs" / f"s{s}" for s in seeds)))


def shared_phase1(study: Study, method: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """`cfg` starting from a phase 1 already trained with this run's phase-1 settings, where its ensemble is here:
    the one the method's tuning trained once (``<method>/tune/phase1``, :func:`hetfl.tune.phase1_once`: the scored
    run at the tuning's seed), else another method's at this seed (:func:`phase1_runs`). The same members, not
    trained a second time; its bytes and times are the training run's (docs/readings.md#fens-artifacts). Any other
    run comes back as it is."""
    from hetfl.methods import phase1_of
    from hetfl.tune import PHASE1_RUN, saved_phase1

    phase1 = phase1_of(str(cfg.get("method", "")))
    if phase1 is None or not phase1.reuse_key or cfg.get(phase1.reuse_key):
        return cfg
    own = study.folder / method / "tune" / PHASE1_RUN
    src = saved_phase1((own, *phase1_runs(study, method, (int(cfg["seed"]),))), cfg, phase1)
    return cfg if src is None else {**cfg, phase1.reuse_key: str(src.resolve())}


def scored_runs(study: Study, method: str, values: dict[str, Any], train: bool = True,
                failed: dict[int, str] | None = None) -> dict[int, dict[str, Any]]:
    """Seed -> the scored run's metrics (each trained here when missing and `train`). A seed whose run stopped
    because no update was accepted (``stopped`` in its metrics.json: a diverged lr) is not run again: it goes to
    `failed` (seed -> why), and with ``final.failed-seeds = "last-model"`` also to the result, scored by
    :func:`statistic` as the model it stopped with."""
    from hetfl.common.checkpoint import discard_checkpoint
    from hetfl.common.results import NoClientSucceeded
    from hetfl.inprocess import finished_run, run_in_process

    out = {}
    failed = {} if failed is None else failed
    runs = study.folder / method / "runs"
    nodes = int(study.base(method).get("min-available-nodes", 2))

    def stopped(seed: int) -> dict[str, Any] | None:
        path = runs / f"s{seed}" / "metrics.json"
        m = json.loads(path.read_text()) if path.exists() else {}
        return m if m.get("stopped") else None

    for seed in study.seeds:
        cfg = shared_phase1(study, method, study.final_config(method, values, seed))
        m = finished_run(runs / f"s{seed}", cfg)
        if m is None and not (runs / f"s{seed}" / "metrics.json").exists():
            m = _reused_run(study, method, cfg, runs / f"s{seed}")
        why = None
        if m is None and stopped(seed) is None and train:
            try:
                m = run_in_process(cfg, nodes, runs, f"s{seed}")
            except NoClientSucceeded as err:  # its metrics.json names paths relative to the checkout (the writer's)
                why = str(err)
        if (s := stopped(seed)) is not None:  # also one that stopped in its last round (all its rows there)
            failed[seed] = f"stopped in round {s['stopped']['round']}: {s['stopped']['reason']}"
            discard_checkpoint(runs / f"s{seed}" / "checkpoint.json")  # its outcome: nothing to resume
            if study.failed_seeds == "last-model":
                out[seed] = s
            continue
        if why is not None:  # stopped without its rows (nothing to score it by)
            failed[seed] = f"not scored (no metrics.json kept): {why}"
            continue
        if m is not None and m["summary"].get("rounds_completed") == study.rounds_of(method):
            out[seed] = m
            discard_checkpoint(runs / f"s{seed}" / "checkpoint.json")  # finished: nothing to resume
    return out


def decide(study: Study, scores: dict[str, dict[int, float]]) -> dict[str, Any]:
    """The verdict from each method's per-seed statistic: the primary pair by :func:`hetfl.stats.label` (or TOST for
    parity) on the seeds both have, every other pair with the primary method Holm-corrected (:func:`hetfl.stats.claim_p`:
    TOST's p for a parity claim, else the paired t test's)."""
    from hetfl import stats

    a, b = study.primary
    lower_better = study.statistic.startswith("round-to")  # rounds to a level: fewer is the paper's side

    def pairs(x: str, y: str) -> tuple[list[int], list[float], list[int]]:
        both = sorted(set(scores.get(x, {})) & set(scores.get(y, {})))
        ok = [s for s in both if scores[x][s] is not None and scores[y][s] is not None]
        if not ok:  # a method with no scored seed yet (not run, or every seed left out)
            return [], [], both
        d = stats.paired_differences([scores[y][s] for s in ok], [scores[x][s] for s in ok]) if lower_better else \
            stats.paired_differences([scores[x][s] for s in ok], [scores[y][s] for s in ok])
        return ok, d, [s for s in both if s not in ok]

    seeds, diffs, censored = pairs(a, b)
    out: dict[str, Any] = {"primary": [a, b], "kind": study.kind, "margin": study.margin, "seeds": seeds}
    if censored:
        out["censored"] = censored  # a seed where one of the two never reached the level: no pair
    if len(seeds) < 1:
        out["label"] = "not run yet"
        return out
    unit = "round" if lower_better else "point"  # the margin's unit, as the label names it
    out.update(stats.verdict(diffs, study.kind, study.margin, unit), diffs=diffs)
    others = []
    for m in study.methods if study.others is None else study.others:
        if m in (a, b):
            continue
        ok, d, _ = pairs(a, m)
        if len(d) >= 2:
            others.append({**stats.verdict(d, study.kind, study.margin, unit), "pair": [a, m], "n": len(d), "seeds": ok,
                           "mean": sum(d) / len(d), "diffs": d,
                           "p": stats.claim_p(d, study.kind, study.margin)})  # parity: TOST's p, else paired t's
    for row, p_adj in zip(others, stats.holm([r["p"] for r in others])):
        row["p_holm"] = p_adj
    out["others"] = others
    return out


def also_verdict(study: Study, claim: dict[str, Any], scored: dict[str, dict[int, dict[str, Any]]]) -> dict[str, Any]:
    """One ``[[also]]`` claim decided on the study's scored runs (:func:`decide` with its kind, margin, statistic and
    pair)."""
    from dataclasses import replace

    sub = replace(study, kind=claim["kind"], margin=claim["margin"], statistic=claim["statistic"],
                  primary=claim["primary"], others=claim.get("others"), also=())
    scores = {m: {s: statistic(r, claim["statistic"]) for s, r in runs.items()} for m, runs in scored.items()}
    return {"claim": claim["claim"], "statistic": claim["statistic"], **decide(sub, scores)}


def _own(key: str, value: Any) -> str:
    return f"space `{value}`" if key == "space" else f"{key} {value}"


def _fmt(x: float | None, nd: int = 2, sign: str = "") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:{sign}.{nd}f}"


def interval(low: float | None, high: float | None) -> str:
    """A 95% interval of a paired difference, signed as the README's rows print it: ``[-0.48, +0.79]``."""
    return f"[{_fmt(low, sign='+')}, {_fmt(high, sign='+')}]"


def _values(values: dict[str, Any]) -> str:
    """Run-config values as a reader writes them: ``lr 0.1, local-epochs 20``."""
    return ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in values.items())


def _choice_lines(study: Study, summaries: dict[str, Any]) -> list[str]:
    """The page's table of each method's preset (with its own ``set`` keys), chosen values and tuning budget."""
    lines = ["| method | preset | chosen (validation accuracy) | trials finished (bracket steps) | on the grid's edge |",
             "| --- | --- | --- | --- | --- |"]
    for m, preset in study.methods.items():
        preset = preset + ("` + `" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in study.sets[m].items())
                           if m in study.sets else "")
        s = summaries.get(m)
        if s is None:
            lines.append(f"| {m} | `{preset}` | not tuned yet | - | - |")
        elif s.get("fixed"):
            lines.append(f"| {m} | `{preset}` | {_values(s['best']['values'])} (fixed: one value, not tuned here) | 0 "
                         "| - |")
        else:
            lines.append(f"| {m} | `{preset}` | {_values(s['best']['values'])} ({100 * s['best']['val_accuracy']:.2f}%)"
                         f" | {len(s['trials'])} ({s['budget'].get('extension_trials', 0)}) | "
                         f"{_values(s.get('on_edge') or {}) or 'none'} |")
    return lines


def _trial_lines(study: Study, summaries: dict[str, Any]) -> list[str]:
    """Every tuning trial of each method, in the order run: its values and its validation accuracy after its rounds,
    or the round the pruner stopped it at with its accuracy at that round (the summary's, else that round's row of the
    trial's metrics.json, which for a run continued from a checkpoint may go on past it); the steps past an edge
    (``hetfl.tune`` brackets) named; the chosen trial in bold."""
    lines = []
    for m, s in summaries.items():
        if s.get("fixed") or not s.get("trials"):
            continue
        steps = {e["folder"]: e for e in s.get("extensions", []) if "folder" in e}
        lines += ["", f"**{m}**'s trials (validation accuracy after the trial's rounds):", "",
                  "| trial | values | validation accuracy |", "| --- | --- | --- |"]
        for t in s["trials"]:
            name = t.get("folder") or f"t{int(t['number']):03d}"
            if t["state"] == "pruned":
                value = t.get("pruned_val_accuracy")
                if value is None:
                    path = study.folder / m / "tune" / "trials" / name / "metrics.json"
                    rows = json.loads(path.read_text())["rounds"] if path.exists() else []
                    at = next((r for r in rows if r["round"] == t["rounds"] and r["round"]), None)
                    value = at.get("val_accuracy", at["accuracy"]) if at else None
                then = f" ({100 * float(value):.2f}% then)" if value is not None else ""
                acc = f"pruned at round {t['rounds']}{then}"
            elif t.get("val_accuracy") is None:
                acc = t["state"]  # a trial that failed (diverged): its state
            else:
                acc = f"{100 * float(t['val_accuracy']):.2f}%"
            if name in steps:
                name += f" (bracket step past {steps[name]['key']} {steps[name]['edge']:g})"
            chosen = t["state"] == "complete" and t.get("values") == s["best"]["values"]
            cells = [name, _values(t["values"]), acc]
            lines.append("| " + " | ".join(f"**{c}**" if chosen else c for c in cells) + " |")
    return lines


def _stopped_lines(study: Study, verdict: dict[str, Any]) -> list[str]:
    """The page's lines on the seeds that stopped: the rule that counts them, each seed, the primary pair without."""
    if not verdict.get("failed"):
        return []
    lines = ["", f"A seed that stopped (no client update accepted: diverged) is {FAILED_SEEDS[study.failed_seeds]}; "
                 f"`final.failed-seeds` = \"{study.failed_seeds}\""
                 f"{', marked *' if study.failed_seeds == 'last-model' else ''}:"]
    lines += [f"- {m} seed {x}: {why}" for m, f in verdict["failed"].items() for x, why in sorted(f.items())]
    if (w := verdict.get("without_failed")) and w.get("n"):
        lines.append(f"- the primary pair without them: n = {w['n']}, mean {w['mean']:+.2f} "
                     f"{interval(w['low'], w['high'])}: {w['label']}")
    return lines


def page(study: Study, summaries: dict[str, Any], scores: dict[str, dict[int, float]], verdict: dict[str, Any]) -> str:
    """The study's results page (markdown)."""
    lines = [f"# Study {study.name}", "", f"**Claim.** {study.claim}", "",
             f"Declared in `{study.file}` before its runs; run with `hetfl study run "
             f"{study.file}`, this page rebuilt from the committed runs by `hetfl study table "
             f"{study.file}`. Tuning reads validation only (the first half of the test split); "
             f"each seed's statistic is {describe(study.statistic)} on the test half, which tuning never read.", "",
             "## Budget and choices", "",
             f"Every method{' not tuned otherwise below' if study.by_method else ''}: the space `{study.space}` ({study.sampler}), {study.trials} trials x {study.rounds} rounds "
             f"at seed 0, steps past an edge as `hetfl.tune` brackets them; then seeds {list(study.seeds)} x "
             f"{study.final_rounds} rounds with the chosen values"
             + (f" ({', '.join(f'{m}: {r}' for m, r in study.rounds_by_method.items())} rounds: "
                f"{study.why_rounds})" if study.rounds_by_method else "") + ".", "",
             *(["Tuned otherwise: " + "; ".join(f"{m}: " + ", ".join(_own(k, v) for k, v in own.items())
                                                for m, own in study.by_method.items())
                + f". Why: {study.why}", ""] if study.by_method else []),
             *_choice_lines(study, summaries), *_trial_lines(study, summaries)]
    lines += ["", "## Scored runs", "", "| method | " + " | ".join(f"seed {x}" for x in study.seeds) + " | mean |",
              "| --- |" + " --- |" * (len(study.seeds) + 1)]
    for m in study.methods:
        row = scores.get(m, {})
        vals = [row.get(x) for x in study.seeds]
        done = [v for v in vals if v is not None]
        stopped = verdict.get("failed", {}).get(m, {})  # a stopped seed that was scored is marked *
        lines.append(f"| {m} | " + " | ".join(_fmt(v) + ("*" if v is not None and x in stopped else "")
                                              for x, v in zip(study.seeds, vals))
                     + f" | {_fmt(sum(done) / len(done)) if done else '-'} |")
    lines += _stopped_lines(study, verdict)
    a, b = study.primary
    lines += ["", "## Verdict", ""]
    if "n" in verdict:
        lines.append(f"{a} - {b}, paired by seed: n = {verdict['n']}, mean {verdict['mean']:+.2f} points, 95% t interval "
                     f"{interval(verdict['low'], verdict['high'])} (paired SD {_fmt(verdict['sd'])}); claimed "
                     f"{'margin' if study.kind == 'superiority' else 'parity within'} {study.margin:g}: "
                     f"**{verdict['label']}**.")
    else:
        lines.append(f"**{verdict['label']}**.")
    for o in verdict.get("others", []):
        test = "TOST p" if study.kind == "parity" else "paired t p"
        lines.append(f"- {o['pair'][0]} - {o['pair'][1]}: n = {o['n']}, mean {o['mean']:+.2f}, {test} = "
                     f"{_fmt(o['p'], 3)}, Holm-corrected {_fmt(o['p_holm'], 3)}")
    for x in verdict.get("also", []):
        a2, b2 = x["primary"]
        got = (f"n = {x['n']}, mean {x['mean']:+.2f} {interval(x['low'], x['high'])}" if "n" in x else "no pair")
        lines += ["", f"**Also: {x['claim']}** ({describe(x['statistic'])}; {a2} - {b2} in the paper's direction): "
                      f"{got}{'; censored seeds ' + str(x['censored']) if x.get('censored') else ''}: **{x['label']}**."]
    return "\n".join(lines) + "\n"


def run_sweep(study: Study, train: bool = True, tune_only: bool = False,
              methods: list[str] | None = None) -> dict[str, Any]:
    """Every cell of a sweep as a study of its own (:func:`run`), then the sweep's verdict: the primary value's
    cell decides; every other cell's primary pair carries the p of its claim's test (TOST's for parity, else the
    paired t's), Holm-corrected; the trend (per seed, the
    last value's paired difference minus the first's) has its own interval and the direction rule."""
    from hetfl import stats

    key, values, first = study.sweep
    verdicts = {v: run(cell, train, tune_only, methods) for v, cell in cells(study)}
    out: dict[str, Any] = {"sweep": key, "primary_value": first, **verdicts[first], "cells": {}}
    others = [v for v in values if v != first]
    ps = [stats.claim_p(verdicts[v]["diffs"], study.kind, study.margin) if verdicts[v].get("n", 0) >= 2 else math.nan
          for v in others]
    for v, p, p_adj in zip(others, ps, stats.holm(ps)):
        out["cells"][str(v)] = {k: verdicts[v].get(k) for k in ("n", "mean", "low", "high", "label")} | {
            "p": p, "p_holm": p_adj}
    lo, hi = verdicts[values[0]], verdicts[values[-1]]
    common = sorted(set(lo.get("seeds", [])) & set(hi.get("seeds", [])))
    if "diffs" in lo and "diffs" in hi and common:
        d_lo, d_hi = dict(zip(lo["seeds"], lo["diffs"])), dict(zip(hi["seeds"], hi["diffs"]))
        trend = [d_hi[s] - d_lo[s] for s in common]
        iv = stats.paired_interval(trend)
        out["trend"] = {"from": values[0], "to": values[-1], "n": iv.n, "mean": iv.mean, "low": iv.low,
                        "high": iv.high, "label": stats.direction_label(iv)}
    study.folder.mkdir(parents=True, exist_ok=True)
    (study.folder / "verdict.json").write_text(json.dumps(out, indent=2, default=str))
    lines = [f"# Study {study.name}", "", f"**Claim.** {study.claim}", "", f"Declared in `{study.file}`; one cell per "
             f"value of `{key}`, each a study of its own (its page under `{study.name}/`).", "",
             f"**Verdict** ({key} = {first}, the primary cell): **{out['label']}**.", "",
             "| value | n | mean paired difference [95% interval] | label | Holm-corrected p |", "| --- | --- | --- | --- | --- |"]
    for v in values:
        c = verdicts[v]
        held = "-" if v == first else _fmt(out["cells"][str(v)]["p_holm"], 3)
        lines.append(f"| {v} | {c.get('n', 0)} | {_fmt(c.get('mean'), sign='+')} {interval(c.get('low'), c.get('high'))} | "
                     f"{c['label']} | {held} |")
    if "trend" in out:
        t = out["trend"]
        lines += ["", f"Trend from {key} = {t['from']} to {t['to']} (per seed, the paired difference at the last value "
                      f"minus that at the first): n = {t['n']}, mean {t['mean']:+.2f} "
                      f"{interval(t['low'], t['high'])}: **{t['label']}**."]
    (study.out / f"{study.name}.md").write_text("\n".join(lines) + "\n")
    return out


def _stopped_pairs(study: Study, scores: dict[str, dict[int, Any]],
                   failed: dict[str, dict[int, str]]) -> list[tuple[str, int]]:
    """(method, seed) of each primary method's stopped seed where both primary methods have an outcome for that
    seed (scored, or stopped): only such a seed changes the primary pair; one whose partner has not run yet is named
    on the page, not in the label."""
    both = set.intersection(*({*scores.get(m, {}), *failed.get(m, {})} for m in study.primary))
    return [(m, x) for m in study.primary for x in sorted(failed.get(m, {})) if x in both]


def run(study: Study, train: bool = True, tune_only: bool = False, methods: list[str] | None = None) -> dict[str, Any]:
    """Tune (and with `train`, train what is missing), decide, and write verdict.json and the page; the verdict (a
    sweep: :func:`run_sweep`)."""
    if study.sweep is not None:
        return run_sweep(study, train, tune_only, methods)
    if study.folder.is_dir():  # a run killed outright (kill -9, a lost machine) left its files as it ran: read them clean
        _normalise(study.folder)
    summaries, scores, failed, scored = {}, {}, {}, {}
    # the methods this process trains first: the others are read from disk after them, so that runs another process
    # finished meanwhile (a second `--methods` stream) are in the verdict
    for m in sorted(study.methods, key=lambda m: bool(methods) and m not in methods):
        if methods and m not in methods:
            s = tuned(study, m, train=False)
        else:
            s = tuned(study, m, train=train)
        if s is None:
            continue
        summaries[m] = s
        failed[m] = {}  # --tune-only trains no scored run, but the page and verdict read those already there
        runs = scored_runs(study, m, s["best"]["values"], train=train and not tune_only and (not methods or m in methods),
                           failed=failed[m])
        scored[m] = runs
        scores[m] = {seed: statistic(metrics, study.statistic) for seed, metrics in runs.items()}
    summaries, scores, failed, scored = ({m: d[m] for m in study.methods if m in d} for d in (summaries, scores, failed,
                                                                                             scored))
    verdict = decide(study, scores)
    verdict["also"] = [also_verdict(study, a, scored) for a in study.also]
    verdict["failed"] = {m: f for m, f in failed.items() if f}
    verdict["failed_seeds"] = study.failed_seeds
    stopped = _stopped_pairs(study, scores, verdict["failed"])
    gone = {x for _, x in stopped}
    if gone and study.failed_seeds == "last-model":  # the same pairs without the stopped seeds, for the reader
        rest = decide(study, {m: {x: v for x, v in row.items() if x not in gone} for m, row in scores.items()})
        verdict["without_failed"] = {k: rest.get(k) for k in ("n", "mean", "low", "high", "label")}
    if gone:  # a diverged seed is a result, not a missing pair
        verdict["label"] += (f"; seeds that stopped, {FAILED_SEEDS[study.failed_seeds]}: "
                             + ", ".join(f"{m} seed {x}" for m, x in stopped))
    study.folder.mkdir(parents=True, exist_ok=True)
    (study.folder / "verdict.json").write_text(json.dumps({"scores": scores, **verdict}, indent=2, default=str))
    (study.out / f"{study.name}.md").write_text(page(study, summaries, scores, verdict))
    return verdict


@contextlib.contextmanager
def _stop_as_interrupt() -> Iterator[None]:
    """SIGTERM (a shell's `kill`, a session that ends) stops a study as Ctrl-C does (:func:`hetfl.launch.setup_signals`):
    the run in hand stops between steps, its ``finally`` writes its files with relative paths, the command exits 130;
    the handlers before it are put back."""
    from hetfl.launch import setup_signals

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    setup_signals()
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: a handler set from C


def main(argv: list[str] | None = None, prog: str = "hetfl study") -> int:
    from hetfl.common.task import setup_logging

    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=("run", "table", "check"), help="run: tune, train what is missing, decide; "
                   "table: decide from what ran (nothing trained); check: parse the file and its tuning specs")
    p.add_argument("file", help="a study file, e.g. experiments/shefl-table1.toml")
    p.add_argument("--tune-only", action="store_true",
                   help="run the tuning studies only; the page and verdict read the scored runs already there")
    p.add_argument("--methods", nargs="*", help="train only these methods (the others are read from disk)")
    a = p.parse_args(argv)
    setup_logging()
    try:
        study = Study.from_file(a.file)
        from hetfl.tune import check_spec

        for _, cell in cells(study) or [(None, study)]:
            for m in cell.methods:
                check_spec(cell.tune_spec(m))
        if a.action == "check":
            print(f"{study.name}: {len(study.methods)} methods, seeds {list(study.seeds)}")
            for m in study.methods:
                t = study.tuning_of(m)
                search = (f"fixed at {t['space']!r} (one value each: no trial)" if fixed(study.tune_spec(m)) else
                          f"{t['trials']} {t['sampler']} trials x {t['rounds']} rounds over {t['space']!r}")
                print(f"  {m}: {search}, then {study.rounds_of(m)} rounds a seed")
            return 0
        with _stop_as_interrupt():
            verdict = run(study, train=a.action == "run", tune_only=a.tune_only, methods=a.methods)
    except (StudyError, ValueError) as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{a.file}: stopped; the run in hand keeps its checkpoint (where its preset checkpoints) and its "
              f"files name paths relative to the repository: `{prog} {a.action} {a.file}` resumes", file=sys.stderr)
        return 130
    print(f"{study.name}: {verdict['label']}; page {study.out / (study.name + '.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
