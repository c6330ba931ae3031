"""hetfl.tune: the one tuning protocol (docs/tuning.md). A small study on scikit-learn's digits prunes, is
interrupted and resumes from its SQLite file, and its chosen values rerun to the same result; the space syntax and
bad input give one line each."""

from __future__ import annotations

import json

import pytest

from hetfl import tune as T
from hetfl.tune import Dim, TuneError, TuneSpec, parse_space

BASE = {"method": "fedavg", "dataset": "digits", "partitioner": "dirichlet", "dirichlet-alpha": 0.5,
        "dirichlet-min-size": 5, "min-available-nodes": 4, "fraction-train": 1.0, "local-steps": 10,
        "batch-size": 16, "lr": 0.1, "model": "cnn", "tracking": "none"}


def spec(space: str, **kw) -> TuneSpec:
    args = {"base": BASE, "space": tuple(parse_space(space)), "trials": 3, "rounds": 3, "nodes": 4, **kw}
    return TuneSpec(**args)


def test_space_syntax():
    assert parse_space("lr=log:0.001:0.3 momentum=0,0.9 local-epochs=int:1:10 optimizer=sgd,adam") == [
        Dim("lr", "log", 0.001, 0.3), Dim("momentum", "choice", choices=(0.0, 0.9)), Dim("local-epochs", "int", 1, 10),
        Dim("optimizer", "choice", choices=("sgd", "adam"))]
    assert T.grid(parse_space("lr=0.1,0.01 momentum=0,0.9")) == [
        {"lr": 0.1, "momentum": 0.0}, {"lr": 0.1, "momentum": 0.9}, {"lr": 0.01, "momentum": 0.0}, {"lr": 0.01, "momentum": 0.9}]


@pytest.mark.parametrize("space,fragment", [
    ("lr-decai=0.9,0.99", "unknown run-config key 'lr-decai'; did you mean 'lr-decay'"),
    ("lr=log:0:0.1", "expected low < high and low > 0 for log"),
    ("lr=float:0.3:0.1", "expected low < high"),
    ("local-epochs=float:1:5", "key 'local-epochs' is a int; use int:<low>:<high> or choices"),
    ("momentum=fast", "momentum='fast' is not a float"),
    ("lr", "is not key=<range or choices>"),
    ("lr=0.1 lr=0.2", "given twice"),
])
def test_bad_space_is_one_line(space, fragment):
    with pytest.raises(TuneError) as err:
        parse_space(space)
    assert fragment in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_a_range_end_outside_a_keys_range_fails_before_any_trial(tmp_path):
    with pytest.raises(TuneError, match="'momentum' = 1.5"):
        T.tune(spec("momentum=float:0:1.5"), tmp_path / "s")
    assert not (tmp_path / "s").exists()
    with pytest.raises(TuneError, match="'eval-split' = 'all': a study needs 'test-half'"):
        T.tune(TuneSpec(base={**BASE, "eval-split": "all"}, space=(Dim("lr", "log", 0.01, 0.1),), trials=1, rounds=1,
                        nodes=4), tmp_path / "s")


def test_a_grid_study_prunes_the_bad_values_and_its_choice_reruns_to_the_same_result(tmp_path):
    out = T.tune(spec("lr=0.1,0.0001,0.00001", sampler="grid"), tmp_path / "grid")
    states = [(t["values"]["lr"], t["state"], t["rounds"]) for t in out["trials"]]
    # the good value runs first and completes; both bad ones fall below its validation accuracy after round 1
    assert states == [(0.1, "complete", 3), (0.0001, "pruned", 1), (0.00001, "pruned", 1)], states
    assert out["pruned"] == 2 and out["budget"] == {"trials": 3, "rounds_per_trial": 3, "trial_rounds": 9, "rounds_run": 5}
    assert out["best"]["values"] == {"lr": 0.1}
    # the chosen values, run once more from scratch, give the same validation accuracy; test accuracy reported
    assert out["chosen"]["same_as_trial"] and 0.0 < out["chosen"]["test_accuracy"] <= 1.0
    # the tuner read validation rows only: every trial row has both halves, and the objective is the validation one
    rows = json.loads((tmp_path / "grid" / "trials" / "t000" / "metrics.json").read_text())["rounds"]
    assert rows[-1]["val_accuracy"] == pytest.approx(out["best"]["val_accuracy"])
    assert rows[-1]["accuracy"] == pytest.approx(out["chosen"]["test_accuracy"])  # the test half: reported, never chosen on
    assert json.loads((tmp_path / "grid" / "summary.json").read_text())["best"] == out["best"]


def test_an_interrupted_study_resumes_from_its_file(tmp_path, monkeypatch):
    study = tmp_path / "tpe"
    s = spec("lr=log:0.01:0.3", trials=3, rounds=2, prune=False)
    real, calls = T.run_trial, []

    def stopped_in_trial_2(spec_, values, run_dir, name, report=None):
        calls.append(values)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the process is stopped in the middle of the second trial
        return real(spec_, values, run_dir, name, report)

    monkeypatch.setattr(T, "run_trial", stopped_in_trial_2)
    with pytest.raises(KeyboardInterrupt):
        T.tune(s, study, final=False)
    monkeypatch.setattr(T, "run_trial", real)
    import optuna

    storage = f"sqlite:///{study / 'study.db'}"
    left = optuna.load_study(study_name="hetfl", storage=storage)
    # Ctrl-C: the trial is failed and its values queued again
    assert [t.state.name for t in left.trials] == ["COMPLETE", "FAIL", "WAITING"]
    # then a hard kill (SIGKILL, power loss) in the middle of that queued trial: it stays "running" in the file
    killed = left.ask()
    assert killed.suggest_float("lr", 0.01, 0.3, log=True) == calls[1]["lr"]  # the queued values
    assert left.trials[-1].state.name == "RUNNING"
    out = T.tune(s, study, final=True)  # a new process: the running trial is failed, its values queued and run
    again = optuna.load_study(study_name="hetfl", storage=storage)
    assert [t.state.name for t in again.trials] == ["COMPLETE", "FAIL", "FAIL", "COMPLETE", "COMPLETE"]
    assert again.trials[3].params == calls[1]  # the interrupted values ran in full
    finished = [t.params["lr"] for t in again.trials if t.state.name == "COMPLETE"]
    assert len(set(finished)) == 3, finished  # a resumed sampler does not redraw the first values
    assert len(out["trials"]) == 3 and out["chosen"]["same_as_trial"]
    assert out["trial_seconds"] > out["seconds_this_call"]  # 3 trials, one of them run by the interrupted call
    with pytest.raises(TuneError, match="holds a study with other settings"):
        T.tune(spec("lr=log:0.01:0.3", trials=3, rounds=5, prune=False), study)


def test_a_trial_whose_run_fails_uses_its_budget_and_the_study_goes_on(tmp_path, monkeypatch):
    """A value that makes the run fail (NoClientSucceeded: every update diverged) is a failed trial with its reason,
    counted in the budget; the study continues with the next values."""
    from hetfl.common.results import NoClientSucceeded

    real = T.run_trial

    def diverges_at_large_lr(spec_, values, run_dir, name, report=None):
        if values["lr"] > 0.05:
            raise NoClientSucceeded("no client update was accepted in the last 2 rounds")
        return real(spec_, values, run_dir, name, report)

    monkeypatch.setattr(T, "run_trial", diverges_at_large_lr)
    out = T.tune(spec("lr=0.1,0.01", sampler="grid", trials=2, rounds=2), tmp_path / "f", final=False)
    assert [(t["values"]["lr"], t["state"]) for t in out["trials"]] == [(0.1, "fail"), (0.01, "complete")]
    assert "no client update was accepted" in out["trials"][0]["error"] and out["best"]["values"] == {"lr": 0.01}


def test_a_grown_grid_reruns_none_of_the_values_it_ran(tmp_path, monkeypatch):
    """A grid grown by a value is a study of another spec (a new folder); each value the earlier study ran to its end
    with the same config is taken from there (its rows reported as if run) and only the new value trains. A trial of
    another config (more rounds) is not taken."""
    first = T.tune(spec("lr=0.01,0.1", sampler="grid", trials=2, rounds=2, prune=False), tmp_path / "a", final=False)
    real, ran = T.run_trial, []

    def counted(spec_, values, run_dir, name, report=None):
        ran.append(values["lr"])
        return real(spec_, values, run_dir, name, report)

    monkeypatch.setattr(T, "run_trial", counted)
    grown = T.tune(spec("lr=0.01,0.1,0.3", sampler="grid", trials=3, rounds=2, prune=False), tmp_path / "b",
                   final=False, earlier=(tmp_path / "a",))
    assert ran == [0.3]  # 0.01 and 0.1 ran in the earlier study
    assert [(t["values"], t["val_accuracy"], t["rounds"]) for t in grown["trials"][:2]] == \
        [(t["values"], t["val_accuracy"], t["rounds"]) for t in first["trials"]]
    for k in (0, 1):  # the earlier run's rows, as this study's trial
        assert (json.loads((tmp_path / "b" / "trials" / f"t00{k}" / "metrics.json").read_text())["rounds"]
                == json.loads((tmp_path / "a" / "trials" / f"t00{k}" / "metrics.json").read_text())["rounds"])
    # not taken: a key set now and not then (momentum), set then and not now, or another number of nodes
    ran.clear()
    T.tune(TuneSpec(base={**BASE, "momentum": 0.5}, space=tuple(parse_space("lr=0.01")), trials=1, rounds=2, nodes=4,
                    sampler="grid", prune=False), tmp_path / "c", final=False, earlier=(tmp_path / "a",))
    T.tune(spec("lr=0.01", sampler="grid", trials=1, rounds=2, prune=False), tmp_path / "d", final=False,
           earlier=(tmp_path / "c",))
    T.tune(spec("lr=0.01", sampler="grid", trials=1, rounds=2, nodes=5, prune=False), tmp_path / "e", final=False,
           earlier=(tmp_path / "a",))
    assert ran == [0.01, 0.01, 0.01]


def test_a_grid_study_with_parallel_workers_runs_and_chooses_as_the_serial_one(tmp_path):
    """--workers 2: the trials run two at a time in their own processes, reporting to the one study file; every
    trial's validation accuracy, its rounds and the choice equal the serial study's (same seed, same run)."""
    s = spec("lr=0.1,0.03,0.3", sampler="grid", trials=3, rounds=2, prune=False)
    serial = T.tune(s, tmp_path / "serial", final=False)
    parallel = T.tune(s, tmp_path / "parallel", final=False, workers=2)

    def rows(out):
        return sorted((t["values"]["lr"], t["state"], t["rounds"], t["val_accuracy"]) for t in out["trials"])

    assert rows(parallel) == rows(serial) and len(rows(serial)) == 3
    assert parallel["best"] == serial["best"] and parallel["budget"] == serial["budget"]
    assert len({t["values"]["lr"] for t in parallel["trials"]}) == 3  # no value run twice, none skipped
    with pytest.raises(TuneError, match="--workers 0: must be >= 1"):
        T.tune(s, tmp_path / "zero", workers=0)
