"""hetfl.tune: the one tuning protocol (docs/tuning.md). A small study on scikit-learn's digits prunes, is
interrupted and resumes from its SQLite file, and its chosen values rerun to the same result; the space syntax and
bad input give one line each."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from hetfl import tune as T
from hetfl.common.rounds import RoundCallback
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
    ("local-epochs=float:1:5", "key 'local-epochs' is an int; use int:<low>:<high> or choices"),
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


def test_a_grid_study_runs_its_values_and_its_choice_reruns_to_the_same_result(tmp_path):
    out = T.tune(spec("lr=0.1,0.0001,0.00001", sampler="grid", bracket=False), tmp_path / "grid")
    states = [(t["values"]["lr"], t["state"], t["rounds"]) for t in out["trials"]]
    # fewer than 3 completed trials before each: none may be pruned (the pruner's warm-up)
    assert states == [(0.1, "complete", 3), (0.0001, "complete", 3), (0.00001, "complete", 3)], states
    assert out["pruned"] == 0 and out["budget"] == {"trials": 3, "rounds_per_trial": 3, "trial_rounds": 9,
                                                    "rounds_run": 9, "extension_trials": 0}
    assert out["on_edge"] == {"lr": 0.1}  # not bracketed: the summary says so
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


def test_a_trial_stopped_mid_run_continues_from_its_checkpoint_to_the_uninterrupted_result(tmp_path, monkeypatch):
    """A process stopped in round 2 of a 3-round trial (its checkpoint holds round 1): the next call queues the
    values again, takes the stopped trial's folder and trains rounds 2 and 3 only; the study ends as one never
    stopped (same rows, same choice)."""
    s = spec("lr=0.1,0.01", sampler="grid", trials=2, rounds=3, prune=False, bracket=False)
    whole = T.tune(s, tmp_path / "whole", final=False)
    real = T.run_trial

    def stopped_after_round_2_of_the_second(spec_, values, run_dir, name, report=None):
        def rep(rnd, val):
            if values["lr"] == 0.01 and rnd == 2:
                raise KeyboardInterrupt  # round 2's row is reported before its checkpoint is written
            report(rnd, val)
        return real(spec_, values, run_dir, name, rep)

    monkeypatch.setattr(T, "run_trial", stopped_after_round_2_of_the_second)
    with pytest.raises(KeyboardInterrupt):
        T.tune(s, tmp_path / "cut", final=False)
    from hetfl.common.checkpoint import read_checkpoint_entry

    assert read_checkpoint_entry(tmp_path / "cut" / "trials" / "t001" / "checkpoint.json", "round") == 1
    monkeypatch.setattr(T, "run_trial", real)
    rounds_run = []
    import hetfl.inprocess as ip
    real_run = ip.run_in_process

    def counted(cfg, nodes, results, name, callbacks=()):
        class Count(RoundCallback):
            def on_row(self, row):
                rounds_run.append(row["round"])
        return real_run(cfg, nodes, results, name, callbacks=[*callbacks, Count()])

    monkeypatch.setattr(ip, "run_in_process", counted)
    out = T.tune(s, tmp_path / "cut", final=False)
    assert rounds_run == [2, 3], rounds_run  # only the rounds after the checkpoint trained
    assert not (tmp_path / "cut" / "trials" / "t001").exists()  # taken over by the queued trial t002
    rows = lambda d, t: [(r["round"], r["val_accuracy"], r["accuracy"]) for r in  # noqa: E731
                         json.loads((tmp_path / d / "trials" / t / "metrics.json").read_text())["rounds"]]
    assert rows("cut", "t002") == rows("whole", "t001")
    assert [t["val_accuracy"] for t in out["trials"]] == [t["val_accuracy"] for t in whole["trials"]]
    assert out["best"]["values"] == whole["best"]["values"]


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
    out = T.tune(spec("lr=0.1,0.01", sampler="grid", trials=2, rounds=2, bracket=False), tmp_path / "f", final=False)
    assert [(t["values"]["lr"], t["state"]) for t in out["trials"]] == [(0.1, "fail"), (0.01, "complete")]
    assert "no client update was accepted" in out["trials"][0]["error"] and out["best"]["values"] == {"lr": 0.01}


def test_a_grown_grid_reruns_none_of_the_values_it_ran(tmp_path, monkeypatch):
    """A grid grown by a value is a study of another spec (a new folder); each value the earlier study ran to its end
    with the same config is taken from there (its rows reported as if run) and only the new value trains. A trial of
    another config (more rounds) is not taken."""
    first = T.tune(spec("lr=0.01,0.1", sampler="grid", trials=2, rounds=2, prune=False, bracket=False), tmp_path / "a",
                   final=False)
    real, ran = T.run_trial, []

    def counted(spec_, values, run_dir, name, report=None):
        ran.append(values["lr"])
        return real(spec_, values, run_dir, name, report)

    monkeypatch.setattr(T, "run_trial", counted)
    grown = T.tune(spec("lr=0.01,0.1,0.3", sampler="grid", trials=3, rounds=2, prune=False, bracket=False), tmp_path / "b",
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


@pytest.mark.parametrize("values,high,expected", [
    ([0.01, 0.03, 0.1], True, 0.3),  # multiplicative: 0.1 x 0.1 / 0.03 = 0.33 -> 0.3
    ([0.01, 0.03, 0.1], False, 0.003),
    ([1, 5, 10], True, 20),  # ints, not evenly spaced: x 2
    ([2, 4, 6], True, 8),  # evenly spaced: + 2
    ([0.0, 0.5, 0.9], True, 1.3),  # holds 0: additive
    ([1, 2], False, 0),  # ints: / 2 = 0.5 -> 0 (the schema then decides)
])
def test_the_step_past_an_edge_follows_the_grids_own_spacing(values, high, expected):
    assert T.step_past(values, high) == pytest.approx(expected)


def _synthetic(peak: float, diverge_at: float):
    """A stand-in for a trial's run: validation accuracy 0.9 - 0.1 (log10 lr - log10 peak)^2, each round the same;
    a run at lr >= diverge_at fails as a diverged run does."""
    import math

    from hetfl.common.results import NoClientSucceeded

    def run(spec_, values, run_dir, name, report=None):
        lr = values["lr"]
        if lr >= diverge_at:
            raise NoClientSucceeded("no client update was accepted in the last 2 rounds")
        val = 0.9 - 0.1 * (math.log10(lr) - math.log10(peak)) ** 2
        rows = [{"round": r, "val_accuracy": val, "accuracy": val} for r in range(1, spec_.rounds + 1)]
        for row in rows:
            if report:
                report(row["round"], val)
        (run_dir / name).mkdir(parents=True, exist_ok=True)
        (run_dir / name / "metrics.json").write_text(json.dumps({"rounds": rows, "summary": {}}))
        return {"rounds": rows}

    return run


def test_a_best_value_on_the_grids_edge_is_bracketed(tmp_path, monkeypatch):
    """lr's best grid value 0.01 is the top edge: 0.03 and 0.09 (better each time), then 0.3 (worse): the best, 0.09,
    is interior; the steps, their trials and the budget they added are in the summary."""
    monkeypatch.setattr(T, "run_trial", _synthetic(peak=0.1, diverge_at=10.0))
    out = T.tune(spec("lr=0.001,0.003,0.01", sampler="grid", trials=3, rounds=2), tmp_path / "g", final=False)
    assert [st["value"] for st in out["extensions"]] == [0.03, 0.09, 0.3]
    assert [st["folder"] for st in out["extensions"]] == ["e000", "e001", "e002"]
    assert out["budget"]["extension_trials"] == 3 and out["best"]["folder"] == "e001"
    assert [p.parent.name for p in T.finished_trials(tmp_path / "g")][-3:] == ["e000", "e001", "e002"]
    assert out["best"]["values"] == {"lr": 0.09} and out["on_edge"] == {}
    # a resumed study repeats no step
    again = T.tune(spec("lr=0.001,0.003,0.01", sampler="grid", trials=3, rounds=2), tmp_path / "g", final=False)
    assert again["extensions"] == out["extensions"] and len(again["trials"]) == 6


def test_bracketing_stops_where_the_next_step_diverges(tmp_path, monkeypatch):
    monkeypatch.setattr(T, "run_trial", _synthetic(peak=10.0, diverge_at=2.0))
    out = T.tune(spec("lr=0.1,0.3", sampler="grid", trials=2, rounds=2), tmp_path / "d", final=False)
    assert [(st["value"], st.get("stop")) for st in out["extensions"]] == [(0.9, None), (3.0, "diverged")]
    assert out["best"]["values"] == {"lr": 0.9} and out["on_edge"] == {}  # bracketed by the diverged step
    no = T.tune(spec("lr=0.1,0.3", sampler="grid", trials=2, rounds=2, bracket=False), tmp_path / "n", final=False)
    assert no["extensions"] == [] and no["on_edge"] == {"lr": 0.3}  # what the summary says without brackets


def test_a_best_value_near_a_ranges_edge_widens_the_range(tmp_path, monkeypatch):
    monkeypatch.setattr(T, "run_trial", _synthetic(peak=0.2, diverge_at=10.0))
    s = spec("lr=log:0.001:0.01", trials=4, rounds=2)
    T.open_study(s, tmp_path / "r").enqueue_trial({"lr": 0.0095})  # the first draw: near the top edge
    out = T.tune(s, tmp_path / "r", final=False)
    ranges = [st["range"] for st in out["extensions"]]
    assert ranges and ranges[0] == pytest.approx([0.001, 0.01 * 10 ** 0.5])  # past the top by half the log-width
    assert all(b[1] > a[1] and b[0] == a[0] for a, b in zip(ranges, ranges[1:]))
    assert out["best"]["values"]["lr"] > 0.01  # found past the first range's edge


def test_the_pruner_waits_for_three_completed_trials_and_half_the_rounds(tmp_path, monkeypatch):
    monkeypatch.setattr(T, "run_trial", _synthetic(peak=0.1, diverge_at=10.0))
    out = T.tune(spec("lr=0.001,0.0001,0.00001,0.1,0.01", sampler="grid", trials=5, rounds=4, bracket=False),
                 tmp_path / "p", final=False)
    states = [(t["values"]["lr"], t["state"], t["rounds"]) for t in out["trials"]]
    # the three bad values run first and complete (no pruning before 3 completed trials); 0.1 and 0.01 are better
    # than their median and complete too
    assert [s[1] for s in states] == ["complete"] * 5, states
    worse = T.tune(spec("lr=0.1,0.01,0.03,0.00001,0.000001", sampler="grid", trials=5, rounds=4, bracket=False),
                   tmp_path / "q", final=False)
    # the two bad values come after three completed trials: pruned at round 2 = half the rounds, not round 1
    assert [(t["state"], t["rounds"]) for t in worse["trials"]][3:] == [("pruned", 2), ("pruned", 2)]


FENS = {"method": "fens", "dataset": "digits", "data-source": "local", "partitioner": "dirichlet",
        "dirichlet-alpha": 0.3, "min-available-nodes": 4, "fraction-train": 1.0, "local-steps": 4, "local-epochs": 1,
        "batch-size": 16, "max-test-samples": 400, "fens-local-fraction": 0.9, "fens-agg-server-lr": 0.01,
        "tracking": "none"}


def test_a_search_over_fens_aggregator_trains_phase_1_once_and_every_trial_starts_from_it(tmp_path, monkeypatch):
    import hetfl.common.oneshot.client as fc

    calls = []
    real = fc.local_train
    monkeypatch.setattr(fc, "local_train", lambda *a, **k: calls.append(1) or real(*a, **k))
    study = TuneSpec(base=FENS, space=tuple(parse_space("fens-agg-client-lr=0.1,1.0")), trials=2, rounds=2, nodes=4,
                     sampler="grid", bracket=False)
    out = T.tune(study, tmp_path / "agg", final=False)
    assert len(calls) == 4  # the 4 clients' members, trained once for both trials (not 8)
    trials = [json.loads((tmp_path / "agg" / "trials" / f"t00{k}" / "metrics.json").read_text()) for k in (0, 1)]
    assert all(m["phase1_reused_from"] == str((tmp_path / "agg" / "phase1" / "ensemble.json").resolve()) for m in trials)
    assert trials[0]["static_aggregators_test_accuracy"] == trials[1]["static_aggregators_test_accuracy"]  # same members
    assert [t["values"] for t in out["trials"]] == [{"fens-agg-client-lr": 0.1}, {"fens-agg-client-lr": 1.0}]
    assert not list((tmp_path / "agg" / "trials").rglob("checkpoint*"))  # finished trials keep no checkpoint
    # a space that phase 1 reads (the members' lr) is searched as it is: each trial trains its own members
    assert T.phase1_once(TuneSpec(base=FENS, space=tuple(parse_space("lr=0.01,0.1")), trials=2, rounds=2, nodes=4),
                         tmp_path / "lr").base == FENS
    assert not (tmp_path / "lr").exists()
    # a method without a one-shot phase 1 is left alone
    assert T.phase1_once(spec("lr=0.1,0.01", sampler="grid"), tmp_path / "fedavg").base == BASE


def test_a_one_shot_baselines_search_over_its_server_step_runs_without_checkpoints_on_one_phase_1(tmp_path, monkeypatch):
    """FedKD as fens-dir0.05 tunes it: members to completion (oneshot-member-*), its distillation lr searched, phase 1
    trained once; a trial's rows are its server epochs and, checkpoints turned off, none is written."""
    import hetfl.common.oneshot.client as fc

    calls = []
    real = fc.best_epoch_training
    monkeypatch.setattr(fc, "best_epoch_training", lambda *a, **k: calls.append(1) or real(*a, **k))
    base = {**{k: v for k, v in FENS.items() if not k.startswith("fens-")}, "method": "fedkd", "server-holdout": 300,
            "local-steps": 0, "local-epochs": 3, "oneshot-member-val-fraction": 0.25, "oneshot-member-patience": 1,
            "fedkd-epochs": 2, "checkpoint": False}
    study = TuneSpec(base=base, space=tuple(parse_space("fedkd-lr=0.001,0.01")), trials=2, rounds=2, nodes=4,
                     sampler="grid", bracket=False)
    out = T.tune(study, tmp_path / "kd", final=False)
    assert len(calls) == 4  # each client's member, trained to completion once for both trials
    assert [t["state"] for t in out["trials"]] == ["complete", "complete"]
    for k in (0, 1):
        m = json.loads((tmp_path / "kd" / "trials" / f"t00{k}" / "metrics.json").read_text())
        assert m["config"]["checkpoint"] is False and m["summary"]["rounds_completed"] == 2
        assert m["phase1_reused_from"] == str((tmp_path / "kd" / "phase1" / "ensemble.json").resolve())
    assert not list((tmp_path / "kd").rglob("checkpoint*"))
    # Fed-ET's members are FedKD's (the same phase-1 settings): its search starts from FedKD's phase 1 and trains none;
    # a shared run without an ensemble, or with other phase-1 settings, is passed over
    kd = tmp_path / "kd" / "phase1"
    et = replace(study, base={**{k: v for k, v in base.items() if k != "fedkd-epochs"}, "method": "fedet",
                              "fedet-epochs": 2}, space=tuple(parse_space("fedet-lr=0.001,0.01")))
    assert T.phase1_once(et, tmp_path / "et", shared=(tmp_path / "none",)).base["oneshot-reuse"] == \
        str((tmp_path / "et" / "phase1").resolve())
    T.tune(et, tmp_path / "et", final=False, shared=(tmp_path / "none", kd))
    assert len(calls) == 4 and not (tmp_path / "et" / "phase1").exists()
    for k in (0, 1):
        m = json.loads((tmp_path / "et" / "trials" / f"t00{k}" / "metrics.json").read_text())
        assert m["phase1_reused_from"] == str((kd / "ensemble.json").resolve())
    seed1 = replace(et, base={**et.base, "seed": 1})
    assert T.phase1_once(seed1, tmp_path / "et1", shared=(kd,)).base["oneshot-reuse"] == \
        str((tmp_path / "et1" / "phase1").resolve())
    # the phase-1 run is there for its ensemble: its server step is cut to one epoch, not the trials' distillation
    first = tmp_path / "kd" / "phase1" / "metrics.json"
    m = json.loads(first.read_text())
    assert (m["config"]["fedkd-epochs"], m["summary"]["rounds_completed"]) == (1, 1)
    # a phase-1 run whose server step differs (made before that cut: the trials' epochs) still holds the members the
    # trials start from: it is not trained again; one of other phase-1 settings (the members' epochs) is
    m["config"]["fedkd-epochs"] = 200
    first.write_text(json.dumps(m))
    T.ensure_phase1(T.phase1_once(study, tmp_path / "kd"))
    assert len(calls) == 4
    T.ensure_phase1(T.phase1_once(replace(study, base={**base, "local-epochs": 2}), tmp_path / "kd"))
    assert len(calls) == 8


def test_a_distillation_trial_stopped_after_an_epoch_continues_from_its_checkpoint(tmp_path, monkeypatch):
    """FedKD's trials checkpoint after every server epoch (its presets): a process stopped after epoch 1 of a 3-epoch
    trial leaves that checkpoint; the next call queues the values again and the queued trial distils epochs 2 and 3
    only, on the same phase 1, ending as the trial that was never stopped."""
    import hetfl.common.rounds as R

    base = {**{k: v for k, v in FENS.items() if not k.startswith("fens-")}, "method": "fedkd", "server-holdout": 300,
            "local-steps": 0, "local-epochs": 2, "fedkd-epochs": 3, "checkpoint": True}
    study = TuneSpec(base=base, space=tuple(parse_space("fedkd-lr=0.01")), trials=1, rounds=3, nodes=4,
                     sampler="grid", bracket=False)
    whole = T.tune(study, tmp_path / "whole", final=False)
    real = R.save_checkpoint
    saved = []

    def killed_after_epoch_1(path, rnd, *a, **k):
        rows = real(path, rnd, *a, **k)
        saved.append(rnd)
        if "trials" in path.parts and rnd == 1:
            raise KeyboardInterrupt  # the process dies with epoch 1's checkpoint written
        return rows

    monkeypatch.setattr(R, "save_checkpoint", killed_after_epoch_1)
    with pytest.raises(KeyboardInterrupt):
        T.tune(study, tmp_path / "cut", final=False)
    saved.clear()
    out = T.tune(study, tmp_path / "cut", final=False)
    assert saved == [2, 3], saved  # only the epochs after the checkpoint were distilled
    assert not (tmp_path / "cut" / "trials" / "t000").exists()  # taken over by the queued trial t001
    rows = lambda d, t: [(r["round"], r["val_accuracy"], r["accuracy"], r["loss"]) for r in  # noqa: E731
                         json.loads((tmp_path / d / "trials" / t / "metrics.json").read_text())["rounds"]]
    assert rows("cut", "t001") == rows("whole", "t000") and len(rows("whole", "t000")) == 4
    assert [t["val_accuracy"] for t in out["trials"]] == [t["val_accuracy"] for t in whole["trials"]]


def test_a_summary_that_says_the_same_is_not_rewritten(tmp_path):
    """Re-reading a finished study keeps its committed summary.json (only seconds_this_call would differ, and a
    study stores paths relative to the repository); any other change rewrites it."""
    from hetfl.common.results import REPO

    path = tmp_path / "summary.json"
    T._write_summary(path, {"best": {"values": {"lr": 0.1}}, "chosen": {"metrics": "docs/x/metrics.json"},
                            "seconds_this_call": 2745.3})
    first = path.read_text()
    T._write_summary(path, {"best": {"values": {"lr": 0.1}}, "chosen": {"metrics": f"{REPO}/docs/x/metrics.json"},
                            "seconds_this_call": 0.006})
    assert path.read_text() == first  # same apart from the seconds and an absolute path: kept
    T._write_summary(path, {"best": {"values": {"lr": 0.3}}, "chosen": {"metrics": "docs/x/metrics.json"},
                            "seconds_this_call": 0.006})
    assert json.loads(path.read_text()) == {"best": {"values": {"lr": 0.3}}, "chosen": {"metrics": "docs/x/metrics.json"},
                                            "seconds_this_call": 0.006}
