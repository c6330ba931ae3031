"""hetfl.study: a declared study file runs end to end on scikit-learn's digits (two methods tuned alike, two seeds
each, paired), resumes without rerunning anything, writes its page and verdict with paths relative to the
repository; bad study files are one line each."""

from __future__ import annotations

import json

import pytest

from hetfl import study as S

SMALL = '''name = "tiny"
claim = "FedProx is more accurate than FedAvg (a test)"
kind = "superiority"
claimed-margin = 5.0
primary = ["fedprox", "fedavg"]
statistic = "final"

[methods]
fedprox = "configs/fedprox/fmnist-iid.toml"
fedavg = "configs/quickstart.toml"

[overrides]
dataset = "digits"
partitioner = "iid"
min-available-nodes = 4
fraction-train = 1.0
local-steps = 5
local-epochs = 1
batch-size = 16
tracking = "none"

[tune]
space = "lr=0.03,0.1"
sampler = "grid"
trials = 2
rounds = 2

[final]
seeds = [0, 1]
rounds = 2
'''


def test_a_study_runs_resumes_and_writes_its_verdict(tmp_path, monkeypatch):
    f = tmp_path / "tiny.toml"
    f.write_text(SMALL)
    study = S.Study.from_file(f, out=tmp_path / "studies")
    v = S.run(study)
    assert v["n"] == 2 and v["primary"] == ["fedprox", "fedavg"] and v["label"]
    assert v["low"] <= v["mean"] <= v["high"]
    folder = tmp_path / "studies" / "tiny"
    for m in ("fedprox", "fedavg"):
        summary = json.loads((folder / m / "tune" / "summary.json").read_text())
        assert summary["on_edge"] == {}  # bracketed: the best lr is interior or the step past it was tried
        for seed in (0, 1):
            metrics = json.loads((folder / m / "runs" / f"s{seed}" / "metrics.json").read_text())
            assert metrics["config"]["seed"] == seed and metrics["config"]["eval-split"] == "test-half"
            assert metrics["config"]["lr"] == summary["best"]["values"]["lr"]
            assert not list((folder / m / "runs" / f"s{seed}").glob("checkpoint*"))  # finished: none kept
    page = (tmp_path / "studies" / "tiny.md").read_text()
    assert "fedprox - fedavg, paired by seed: n = 2" in page and v["label"] in page
    # every trial listed with its validation accuracy; the chosen one in bold, its values as a reader writes them
    for m in ("fedprox", "fedavg"):
        summary = json.loads((folder / m / "tune" / "summary.json").read_text())
        best = summary["best"]
        assert f"| {m} | `" in page and f"lr {best['values']['lr']:g} ({100 * best['val_accuracy']:.2f}%)" in page
        for t in summary["trials"]:
            name = t.get("folder") or f"t{t['number']:03d}"
            row = next(line for line in page.split(f"**{m}**'s trials")[1].splitlines() if name in line)
            assert f"lr {t['values']['lr']:g}" in row and (f"{100 * t['val_accuracy']:.2f}%" in row
                                                           if t["state"] == "complete" else "pruned at round" in row)
            assert row.startswith("| **") == (t["values"] == best["values"])
    # a second call reruns nothing (same config and seed, same run)
    from hetfl import inprocess, tune

    def no_training(*a, **k):
        raise AssertionError("a finished run or trial was run again")

    monkeypatch.setattr(inprocess, "run_in_process", no_training)
    monkeypatch.setattr(tune, "run_trial", no_training)
    assert S.run(study) == v
    # --tune-only trains no scored run, and its page and verdict still read the ones there (not "not run yet")
    assert S.run(study, tune_only=True) == v
    assert (tmp_path / "studies" / "tiny.md").read_text() == page


def test_a_study_reuses_the_committed_trials_and_runs_it_names_and_trains_only_what_differs(tmp_path, monkeypatch):
    """Another study (another folder) naming the first one's tuning folders and scored runs as ``earlier``: every
    trial and run of the same config is taken from there; a seed the first did not run trains."""
    first = tmp_path / "tiny.toml"
    first.write_text(SMALL)
    v = S.run(S.Study.from_file(first, out=tmp_path / "studies"))
    old = tmp_path / "studies" / "tiny"
    second = tmp_path / "again.toml"
    second.write_text(SMALL.replace('name = "tiny"', 'name = "again"')
                      .replace("rounds = 2\n\n[final]", f"rounds = 2\n\n[tune.earlier]\nfedprox = [\"{old}/fedprox/tune\"]\n"
                               f"fedavg = [\"{old}/fedavg/tune\"]\n\n[final]")
                      .replace("seeds = [0, 1]\nrounds = 2", "seeds = [0, 1, 2]\nrounds = 2\n\n[final.earlier]\n"
                               + "".join(f"{m} = [\"{old}/{m}/runs/s0\", \"{old}/{m}/runs/s1\"]\n"
                                         for m in ("fedprox", "fedavg"))))
    from hetfl import inprocess, tune

    real, trained = inprocess.run_in_process, []

    def counted(cfg, nodes, results_dir, name, **kw):
        trained.append((cfg["method"], cfg.get("seed"), cfg["num-server-rounds"]))
        return real(cfg, nodes, results_dir, name, **kw)

    monkeypatch.setattr(inprocess, "run_in_process", counted)
    monkeypatch.setattr(tune, "run_trial", lambda *a, **k: (_ for _ in ()).throw(AssertionError("a trial reran")))
    w = S.run(S.Study.from_file(second, out=tmp_path / "studies"))
    assert sorted(trained) == [("fedavg", 2, 2), ("fedprox", 2, 2)], trained  # only the new seed trained
    assert w["n"] == 3 and w["diffs"][:2] == v["diffs"]


def test_a_sweep_runs_each_value_as_a_study_and_decides_by_its_primary_cell_with_a_trend(tmp_path):
    f = tmp_path / "sweep.toml"
    f.write_text(SMALL.replace('name = "tiny"', 'name = "vol"') + "\n[sweep]\ntrain-fraction = [0.5, 1.0]\nprimary = 1.0\n")
    study = S.Study.from_file(f, out=tmp_path / "studies")
    v = S.run(study)
    folder = tmp_path / "studies" / "vol"
    half = json.loads((folder / "train-fraction-0.5" / "verdict.json").read_text())
    whole = json.loads((folder / "train-fraction-1.0" / "verdict.json").read_text())
    assert v["label"] == whole["label"] and v["diffs"] == whole["diffs"]  # the primary cell decides
    m = json.loads((folder / "train-fraction-0.5" / "fedavg" / "runs" / "s0" / "metrics.json").read_text())
    assert m["config"]["train-fraction"] == 0.5
    assert v["cells"]["0.5"]["n"] == 2 and v["cells"]["0.5"]["p_holm"] >= v["cells"]["0.5"]["p"]
    # the trend: per seed, the paired difference at 1.0 minus that at 0.5
    want = [b - a for a, b in zip(half["diffs"], whole["diffs"])]
    assert v["trend"]["mean"] == pytest.approx(sum(want) / 2) and v["trend"]["label"]
    assert "Trend from train-fraction = 0.5 to 1.0" in (tmp_path / "studies" / "vol.md").read_text()
    with pytest.raises(S.StudyError, match="'sweep.primary' = 0.7"):
        f.write_text(SMALL + "\n[sweep]\ntrain-fraction = [0.5, 1.0]\nprimary = 0.7\n")
        S.Study.from_file(f)


@pytest.mark.parametrize("rule, idle", [("last-model", 1), ("leave-out", 1), ("last-model", 0)])
def test_a_seed_that_diverges_counts_as_its_study_declares_and_is_not_run_again(tmp_path, monkeypatch, rule, idle):
    """It stops in round 1 (max-idle-rounds 1), or with every round played (0: the run ends, then stops)."""
    from hetfl import inprocess

    real = inprocess.run_in_process
    trained = []

    def diverges_at_seed_1(cfg, nodes, results_dir, name, **kw):  # a real divergence: an lr no model survives
        trained.append((cfg["method"], cfg.get("seed")))
        if cfg["method"] == "fedprox" and cfg.get("seed") == 1 and "resume" in cfg:
            try:
                return real({**cfg, "lr": 1e30, "max-idle-rounds": idle}, nodes, results_dir, name, **kw)
            finally:  # recorded under the declared config, as a run that diverged at it would be
                path = results_dir / name / "metrics.json"
                m = json.loads(path.read_text())
                path.write_text(json.dumps({**m, "config": {**m["config"], "lr": cfg["lr"],
                                                            "max-idle-rounds": cfg.get("max-idle-rounds", 3)}}))
        return real(cfg, nodes, results_dir, name, **kw)

    monkeypatch.setattr(inprocess, "run_in_process", diverges_at_seed_1)
    f = tmp_path / "tiny.toml"
    f.write_text(SMALL + f'failed-seeds = "{rule}"\n')
    v = S.run(S.Study.from_file(f, out=tmp_path / "studies"))
    run = json.loads((tmp_path / "studies" / "tiny" / "fedprox" / "runs" / "s1" / "metrics.json").read_text())
    last = 1 if idle else 2
    assert run["stopped"]["round"] == last and [r["round"] for r in run["rounds"]] == list(range(3 - 2 * idle))
    assert list(v["failed"]) == ["fedprox"] and v["failed"]["fedprox"][1].startswith(f"stopped in round {last}: no ")
    page = (tmp_path / "studies" / "tiny.md").read_text()
    assert f"fedprox seed 1: stopped in round {last}" in page and f'`final.failed-seeds` = "{rule}"' in page
    fedprox_row = [line for line in page.splitlines() if line.startswith("| fedprox |")][-1]  # the scored runs
    assert fedprox_row.split(" | ")[2].endswith("*") == (rule == "last-model")  # seed 1's cell: marked only if scored
    if rule == "last-model":  # scored as the model it stopped with (the initial one), held to round 2
        assert v["n"] == 2 and v["seeds"] == [0, 1]
        held = 100 * run["rounds"][0]["accuracy"]
        assert S.statistic(run, "final") == pytest.approx(held) and S.statistic(run, "mean-last:2") == pytest.approx(held)
        avg = json.loads((tmp_path / "studies" / "tiny" / "fedavg" / "runs" / "s1" / "metrics.json").read_text())
        assert v["diffs"][1] == pytest.approx(held - S.statistic(avg, "final"))
        assert v["label"].endswith("seeds that stopped, scored by the model it stopped with, held to the last round: "
                                   "fedprox seed 1")
        assert v["without_failed"]["n"] == 1 and v["without_failed"]["mean"] == pytest.approx(v["diffs"][0])
        assert "the primary pair without them: n = 1" in page
    else:
        assert v["n"] == 1 and v["seeds"] == [0]
        assert v["label"].endswith("seeds that stopped, left out of the pairs: fedprox seed 1")
    trained.clear()
    again = S.run(S.Study.from_file(f, out=tmp_path / "studies"))  # the stopped seed is its outcome: not rerun
    assert trained == [] and again["diffs"] == v["diffs"] and again["failed"] == v["failed"]
    # the partner's seed 1 not run (yet): the stopped seed is named on the page, not in the label, and no pair is
    # held out for it
    import shutil

    shutil.rmtree(tmp_path / "studies" / "tiny" / "fedavg" / "runs" / "s1")
    alone = S.run(S.Study.from_file(f, out=tmp_path / "studies"), train=False)
    assert alone["n"] == 1 and "seeds that stopped" not in alone["label"] and "without_failed" not in alone
    assert f"fedprox seed 1: stopped in round {last}" in (tmp_path / "studies" / "tiny.md").read_text()


def test_a_method_with_no_scored_seed_leaves_the_other_pairs_empty_instead_of_failing(tmp_path):
    f = tmp_path / "three.toml"
    f.write_text(SMALL.replace('fedavg = "configs/quickstart.toml"',
                               'fedavg = "configs/quickstart.toml"\nfedavgm = "configs/quickstart.toml"'))
    study = S.Study.from_file(f, out=tmp_path / "studies")
    v = S.decide(study, {"fedprox": {0: 60.0, 1: 62.0}, "fedavg": {0: 50.0, 1: 51.0}})  # fedavgm: nothing yet
    assert v["n"] == 2 and v["others"] == []
    assert S.decide(study, {"fedprox": {0: 60.0}, "fedavg": {}})["label"] == "not run yet"


def test_a_stopped_run_is_held_at_its_last_row_to_its_configured_last_round():
    m = {"config": {"num-server-rounds": 6}, "stopped": {"round": 4, "reason": "no update"},
         "rounds": [{"round": k, "accuracy": a} for k, a in enumerate([0.1, 0.5, 0.7, 0.2])]}
    assert S.statistic(m, "final") == pytest.approx(20.0)  # rounds 4-6 hold round 3's model
    assert S.statistic(m, "mean-last-5") == pytest.approx(100 * (0.7 + 0.2 * 4) / 5)  # rounds 2-6
    assert S.statistic(m, "round-to:0.6") == 2.0
    assert S.statistic({**m, "stopped": None}, "final") == pytest.approx(20.0)  # not stopped: its rows as they are
    assert S.statistic({**m, "stopped": None}, "mean-last-5") == pytest.approx(100 * (0.5 + 0.7 + 0.2) / 3)


def test_a_method_with_its_own_space_is_tuned_over_it_with_the_same_budget(tmp_path):
    f = tmp_path / "own.toml"
    f.write_text(SMALL.replace("rounds = 2\n\n[final]", 'rounds = 2\nby-method = { fedprox = { space = "lr=0.1 '
                               'fedprox-mu=0.01,0.1" } }\nwhy = "FedProx has its own key"\n\n[final]'))
    study = S.Study.from_file(f, out=tmp_path / "studies")
    prox, avg = study.tune_spec("fedprox"), study.tune_spec("fedavg")
    assert [d.key for d in prox.space] == ["lr", "fedprox-mu"] and [d.key for d in avg.space] == ["lr"]
    assert (prox.trials, prox.rounds) == (avg.trials, avg.rounds) == (2, 2)
    f.write_text(f.read_text().replace("seeds = [0, 1]\nrounds = 2", 'seeds = [0, 1]\nrounds = 2\nrounds-by-method = '
                                       '{ fedprox = 4 }\nwhy = "FedProx needs longer"'))
    longer = S.Study.from_file(f, out=tmp_path / "studies")
    fixed = S.Study.from_file(f.parent / "own.toml", out=tmp_path / "studies")
    fixed = S.Study(**{**fixed.__dict__, "by_method": {"fedprox": {"space": "lr=0.1 fedprox-mu=0.01"}}})
    s = S.tuned(fixed, "fedprox")  # one value each: returned as the choice, nothing trained, no folder
    assert s["fixed"] and s["best"]["values"] == {"lr": 0.1, "fedprox-mu": 0.01} and s["trials"] == []
    assert not (tmp_path / "studies" / "tiny" / "fedprox" / "tune").exists()
    assert longer.final_config("fedprox", {}, 0)["num-server-rounds"] == 4
    assert longer.final_config("fedavg", {}, 0)["num-server-rounds"] == 2
    page = S.page(study, {}, {}, {"label": "not run yet"})
    assert "Tuned otherwise: fedprox: space `lr=0.1 fedprox-mu=0.01,0.1`. Why: FedProx" in page
    f.write_text(f.read_text().replace('fedprox-mu=0.01,0.1" }', 'fedprox-mu=0.01,0.1", sampler = "tpe", trials = 3, '
                                       'rounds = 5 }'))
    own = S.Study.from_file(f, out=tmp_path / "studies").tune_spec("fedprox")
    assert (own.sampler, own.trials, own.rounds) == ("tpe", 3, 5)  # its own budget; the other method keeps [tune]'s
    assert (study.tune_spec("fedavg").sampler, study.tune_spec("fedavg").trials) == ("grid", 2)


def test_an_also_claim_on_rounds_to_a_level_pairs_fewer_rounds_as_the_papers_side_and_names_censored_seeds(tmp_path):
    f = tmp_path / "tiny.toml"
    also = """
[[also]]
claim = "FedProx reaches 50% sooner"
kind = "direction"
statistic = "round-to:0.5"
primary = ["fedprox", "fedavg"]
"""
    f.write_text(SMALL + also)
    with pytest.raises(S.StudyError, match="the also\\[0\\] convergence claim \\(round-to:0.5\\) needs at least 3 seeds"):
        S.Study.from_file(f)
    f.write_text(SMALL.replace("seeds = [0, 1]", "seeds = [0, 1, 2]") + also)
    study = S.Study.from_file(f, out=tmp_path / "studies")
    assert study.also[0]["kind"] == "direction" and study.also[0]["margin"] is None

    def run(accs):
        return {"rounds": [{"round": k, "accuracy": a} for k, a in enumerate([0.1, *accs])]}

    # FedProx reaches 0.5 at rounds 3, never, 2; FedAvg at 5, 4, 3: pairs at seeds 0 and 2, b - a = +2, +1
    scored = {"fedprox": {0: run([0.2, 0.3, 0.6]), 1: run([0.2, 0.3, 0.4]), 2: run([0.3, 0.5, 0.6])},
              "fedavg": {0: run([0.1, 0.2, 0.3, 0.4, 0.5]), 1: run([0.1, 0.2, 0.3, 0.5]), 2: run([0.1, 0.2, 0.7])}}
    v = S.also_verdict(study, study.also[0], scored)
    assert v["seeds"] == [0, 2] and v["censored"] == [1] and v["diffs"] == [2.0, 1.0]
    assert v["label"] == "inconclusive at 2 seeds (no margin claimed)"  # [1.5 -+ 6.35] holds 0
    page = S.page(study, {}, {}, {"label": "x", "also": [v]})
    assert "**Also: FedProx reaches 50% sooner**" in page and "censored seeds [1]" in page
    assert "n = 2, mean +1.50 [-4.85, +7.85]" in page  # both ends signed, as the README's rows print them
    rounds = {**study.also[0], "kind": "superiority", "margin": 5.0}  # a margin in rounds is named in rounds
    w = S.also_verdict(study, rounds, scored)
    assert w["label"].startswith("inconclusive at 2 seeds (") and "for a 5-round margin at SD 0.71)" in w["label"]
    with pytest.raises(S.StudyError, match="'also\\[0\\].kind' = 'better'"):
        f.write_text(SMALL + '[[also]]\nclaim = "x"\nkind = "better"\nstatistic = "final"\nprimary = ["fedprox", "fedavg"]\n')
        S.Study.from_file(f)


def test_each_claim_compares_only_its_own_others_holm_corrected(tmp_path):
    """Two claims on one set of runs (FENS against the iterative methods, and against the one-shot ones): each
    claim's ``others`` is its Holm family; without it every other method is."""
    f = tmp_path / "tiny.toml"
    three = SMALL.replace('fedavg = "configs/quickstart.toml"', 'fedavg = "configs/quickstart.toml"\n'
                          'fedadam = "configs/fedadam/fmnist-dir0.05.toml"\nscaffold = "configs/scaffold/fmnist-dir0.05.toml"')
    f.write_text(three.replace('statistic = "final"', 'statistic = "final"\nothers = ["fedadam"]', 1) + """
[[also]]
claim = "FedProx beats SCAFFOLD"
kind = "direction"
statistic = "final"
primary = ["fedprox", "scaffold"]
others = []
""")
    study = S.Study.from_file(f, out=tmp_path / "studies")
    assert study.others == ("fedadam",) and study.also[0]["others"] == ()
    # per seed, points: fedprox - fedadam = +1, +2, +3 (p = 0.074); fedprox - scaffold = +10, +11, +13
    scores = {"fedprox": {0: 80.0, 1: 81.0, 2: 83.0}, "fedavg": {0: 70.0, 1: 71.0, 2: 72.0},
              "fedadam": {0: 79.0, 1: 79.0, 2: 80.0}, "scaffold": {0: 70.0, 1: 70.0, 2: 70.0}}
    v = S.decide(study, scores)
    assert [r["pair"] for r in v["others"]] == [["fedprox", "fedadam"]]
    assert v["others"][0]["mean"] == pytest.approx(2.0) and v["others"][0]["p_holm"] == pytest.approx(0.0741, abs=1e-3)
    scored = {m: {s: {"rounds": [{"round": 1, "accuracy": a / 100}]} for s, a in by.items()} for m, by in scores.items()}
    also = S.also_verdict(study, study.also[0], scored)
    assert also["primary"] == ["fedprox", "scaffold"] and also["others"] == []
    assert also["diffs"] == pytest.approx([10.0, 11.0, 13.0])
    everyone = S.decide(S.Study.from_file(f.write_text(three) and f, out=tmp_path / "studies"), scores)
    assert sorted(r["pair"][1] for r in everyone["others"]) == ["fedadam", "scaffold"]
    with pytest.raises(S.StudyError, match="'others' = \\['fedavg'\\] is not allowed"):
        f.write_text(three.replace('statistic = "final"', 'statistic = "final"\nothers = ["fedavg"]', 1))
        S.Study.from_file(f)


def test_statistics_by_hand():
    m = {"rounds": [{"round": 0, "accuracy": 0.1, "acc_S1": 0.0}, *({"round": k, "accuracy": k / 10, "acc_S1": k / 20}
                                                                    for k in range(1, 8))],
         "static_aggregators_test_accuracy": {"average": 0.3, "voting": 0.45}}
    assert S.statistic(m, "final") == pytest.approx(70.0) and S.statistic(m, "final@acc_S1") == pytest.approx(35.0)
    assert S.statistic(m, "mean-last-5") == pytest.approx(50.0)  # rounds 3-7
    assert S.statistic(m, "mean-last:2") == pytest.approx(65.0)
    assert S.statistic(m, "mean-rounds:2-4") == pytest.approx(30.0)
    assert S.statistic(m, "round-to:0.45") == 5.0 and S.statistic(m, "round-to:0.95") is None  # never: censored
    assert S.statistic(m, "best-static") == pytest.approx(45.0)
    with pytest.raises(S.StudyError, match="of rounds 5-9"):
        S.statistic(m, "mean-rounds:5-9")
    with pytest.raises(S.StudyError, match="'median' is not allowed"):
        S.statistic(m, "median")


def test_a_method_may_set_keys_of_its_own_over_its_preset_and_the_overrides(tmp_path):
    f = tmp_path / "own.toml"
    f.write_text(SMALL.replace('fedprox = "configs/fedprox/fmnist-iid.toml"',
                               'fedprox = { preset = "configs/fedprox/fmnist-iid.toml", set = { fedprox-mu = 0.5, '
                               'local-steps = 7 } }'))
    study = S.Study.from_file(f)
    assert study.methods["fedprox"] == "configs/fedprox/fmnist-iid.toml"
    prox, avg = study.base("fedprox"), study.base("fedavg")
    assert (prox["fedprox-mu"], prox["local-steps"], avg["local-steps"]) == (0.5, 7, 5)  # set wins over overrides
    f.write_text(SMALL.replace('fedprox = "configs/fedprox/fmnist-iid.toml"',
                               'fedprox = { preset = "configs/fedprox/fmnist-iid.toml", sett = {} }'))
    with pytest.raises(S.StudyError, match="'methods.fedprox.sett' is not known"):
        S.Study.from_file(f)


def test_committed_files_name_paths_relative_to_the_repository():
    from hetfl.common.results import relative_paths

    assert relative_paths({"a": f"{S.ROOT}/docs/x", "b": [f"{S.ROOT}/y"], "c": 3}) == {"a": "docs/x", "b": ["y"], "c": 3}
    import subprocess

    tracked = subprocess.run(["git", "ls-files", "docs/results"], cwd=S.ROOT, capture_output=True, text=True).stdout
    here = [f for f in tracked.split() if f.endswith(".json") and f"{S.ROOT}/" in (S.ROOT / f).read_text()]
    assert not here, here[:5]  # committed runs name no machine's paths (a run config's compared paths included)


@pytest.mark.parametrize("edit,fragment", [
    (("kind = \"superiority\"", "kind = \"better\""), "'kind' = 'better' is not allowed"),
    (("claimed-margin = 5.0", "claimed-margin = 0"), "'claimed-margin' = 0 is not allowed"),
    (("primary = [\"fedprox\", \"fedavg\"]", "primary = [\"fedprox\", \"shefl\"]"), "'primary'"),
    (("statistic = \"final\"", "statistic = \"best\""), "'statistic' = 'best' is not allowed"),
    (("claimed-margin = 5.0", "claimed-margin = 1.0"), "a claimed margin under 2 points (1), which needs at least 5 seeds"),
    (("kind = \"superiority\"\nclaimed-margin = 5.0", "kind = \"parity\"\nequivalence-margin = 1.5"),
     "an equivalence margin under 2 points (1.5), which needs at least 5 seeds"),
    (("statistic = \"final\"", "statistic = \"round-to:0.5\""), "the convergence claim (round-to:0.5) needs at least 3"),
    (("configs/quickstart.toml", "configs/nope.toml"), "'methods.fedavg' = 'configs/nope.toml': no such preset"),
    (("name = \"tiny\"", "name = \"tiny\"\nseeds = 3"), "study key 'seeds' is not known"),
    (("rounds = 2\n\n[final]", "rounds = 2\nby-method = { fedprox = { space = \"lr=0.1 fedprox-mu=0.01,0.1\" } }\n\n"
      "[final]"), "study key 'tune.why' is missing"),
    (("rounds = 2\n\n[final]", "rounds = 2\nby-method = { fedyogi = { space = \"lr=0.1\" } }\nwhy = \"x\"\n\n[final]"),
     "'tune.by-method.fedyogi' names no method"),
    (("rounds = 2\n\n[final]", "rounds = 2\nby-method = { fedprox = { budget = 3 } }\nwhy = \"x\"\n\n[final]"),
     "'tune.by-method.fedprox' = {'budget': 3} is not allowed; expected a table of space, sampler, trials, rounds"),
    (("rounds = 2\n\n[final]", "rounds = 2\nbudget = 3\n\n[final]"), "study key 'tune.budget' is not known"),
    (("seeds = [0, 1]\nrounds = 2", "seeds = [0, 1]\nrounds = 2\nrounds-by-method = { fedprox = 4 }"),
     "'final.why' saying why their rounds differ"),
])
def test_a_bad_study_file_is_one_line(tmp_path, edit, fragment):
    f = tmp_path / "bad.toml"
    f.write_text(SMALL.replace(*edit))
    with pytest.raises(S.StudyError) as err:
        S.Study.from_file(f)
    assert fragment in str(err.value) and "\n" not in str(err.value), str(err.value)


TINY_OVERRIDES = '''dataset = "digits"
data-source = "local"
partitioner = "iid"
min-available-nodes = 4
fraction-train = 1.0
local-steps = 4
local-epochs = 1
batch-size = 16
max-test-samples = 400
tracking = "none"
'''  # a small federation on local data, for the studies below

FENS_STUDY = '''name = "tinyfens"
claim = "FENS is more accurate than FedAvg (a test)"
kind = "superiority"
claimed-margin = 5.0
primary = ["fens", "fedavg"]
statistic = "final"

[methods]
fens = "configs/fens/fmnist-dir0.05.toml"
fedavg = "configs/quickstart.toml"

[overrides]
''' + TINY_OVERRIDES + '''
[tune]
space = "lr=0.1"
sampler = "grid"
trials = 2
rounds = 2
why = "FENS searches its aggregator"

[tune.by-method]
fens = { space = "fens-agg-client-lr=0.1,1.0" }

[final]
seeds = [0, 1]
rounds = 2
'''


def test_the_scored_run_at_the_tuning_seed_starts_from_the_phase_1_the_tuning_trained(tmp_path, monkeypatch):
    """FENS's tuning trains phase 1 once (hetfl.tune.phase1_once); the scored run at that seed starts from it (the same
    members, not trained twice) and the other seed trains its own. Where the run comes from a saved phase 1 is not
    what it computes: with the ensemble gone (an ignored file, lost between checkouts), nothing reruns."""
    import hetfl.common.oneshot.client as fc

    calls = []
    real = fc.local_train
    monkeypatch.setattr(fc, "local_train", lambda *a, **k: calls.append(1) or real(*a, **k))
    f = tmp_path / "tinyfens.toml"
    f.write_text(FENS_STUDY)
    study = S.Study.from_file(f, out=tmp_path / "studies")
    v = S.run(study)
    assert v["n"] == 2
    assert len(calls) == 2 * 4  # the tuning's phase 1 (4 clients) and seed 1's; seed 0's is the tuning's
    runs = tmp_path / "studies" / "tinyfens" / "fens" / "runs"
    phase1 = tmp_path / "studies" / "tinyfens" / "fens" / "tune" / "phase1"
    s0, s1 = (json.loads((runs / f"s{k}" / "metrics.json").read_text()) for k in (0, 1))
    assert s0["phase1_reused_from"] == str((phase1 / "ensemble.json").resolve()) and "phase1_reused_from" not in s1
    for p in phase1.glob("ensemble*"):
        p.unlink()
    from hetfl import inprocess, tune

    def no_training(*a, **k):
        raise AssertionError("a finished run or trial was run again")

    monkeypatch.setattr(inprocess, "run_in_process", no_training)
    monkeypatch.setattr(tune, "run_trial", no_training)
    assert S.run(study)["diffs"] == v["diffs"]


ONESHOT_STUDY = '''name = "tinyoneshot"
claim = "Fed-ET is more accurate than FedKD (a test)"
kind = "superiority"
claimed-margin = 5.0
primary = ["fedet", "fedkd"]
statistic = "final"

[methods]
fedkd = { preset = "configs/fedkd/fmnist-dir0.05.toml", set = { fedkd-epochs = 2 } }
fedet = { preset = "configs/fedet/fmnist-dir0.05.toml", set = { fedet-epochs = 2 } }

[overrides]
server-holdout = 300
''' + TINY_OVERRIDES + '''
[tune]
space = "lr=0.1"
sampler = "grid"
trials = 1
rounds = 2

[final]
seeds = [0, 1]
rounds = 2
'''


def test_methods_with_the_same_phase_1_train_it_once_per_seed(tmp_path, monkeypatch):
    """FedKD's and Fed-ET's members are the same (hetfl.study.shared_phase1): Fed-ET's scored run at each seed starts
    from FedKD's ensemble at that seed and trains none (a seed's own, not the other seed's)."""
    import hetfl.common.oneshot.client as fc

    calls = []
    real = fc.local_train
    monkeypatch.setattr(fc, "local_train", lambda *a, **k: calls.append(1) or real(*a, **k))
    f = tmp_path / "tinyoneshot.toml"
    f.write_text(ONESHOT_STUDY)
    study = S.Study.from_file(f, out=tmp_path / "studies")
    assert S.run(study)["n"] == 2
    assert len(calls) == 2 * 4  # FedKD's members at 2 seeds, 4 clients; none for Fed-ET
    runs = tmp_path / "studies" / "tinyoneshot"
    for k in (0, 1):
        et = json.loads((runs / "fedet" / "runs" / f"s{k}" / "metrics.json").read_text())
        assert et["phase1_reused_from"] == str((runs / "fedkd" / "runs" / f"s{k}" / "ensemble.json").resolve())


def test_check_prints_each_methods_own_budget(tmp_path, capsys):
    f = tmp_path / "tiny.toml"
    f.write_text(SMALL.replace('rounds = 2\n\n[final]', 'rounds = 2\nwhy = "a test"\n\n[tune.by-method]\n'
                               'fedprox = { space = "lr=0.01,0.03,0.1", trials = 3, rounds = 4 }\n\n[final]', 1))
    assert S.main(["check", str(f)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["tiny: 2 methods, seeds [0, 1]",
                   "  fedprox: 3 grid trials x 4 rounds over 'lr=0.01,0.03,0.1', then 2 rounds a seed",
                   "  fedavg: 2 grid trials x 2 rounds over 'lr=0.03,0.1', then 2 rounds a seed"]
    # one value per key is no search (S.tuned trains nothing): check says so, not "N trials"
    f.write_text(f.read_text().replace('space = "lr=0.01,0.03,0.1", trials = 3, rounds = 4', 'space = "lr=0.1"'))
    assert S.main(["check", str(f)]) == 0
    assert capsys.readouterr().out.splitlines()[1] == ("  fedprox: fixed at 'lr=0.1' (one value each: no trial), "
                                                      "then 2 rounds a seed")


def test_a_killed_runs_files_read_clean_and_sigterm_stops_a_study_as_ctrl_c(tmp_path, monkeypatch, capsys):
    """A run killed outright (kill -9) leaves a metrics.json naming this machine's paths: the next `table` makes it
    relative. SIGTERM during a study stops it as Ctrl-C does: exit 130, a line that says the same command resumes,
    and the signal handlers as they were."""
    import os
    import signal
    import time

    from hetfl import tune

    monkeypatch.setattr(S, "STUDIES", tmp_path / "studies")
    f = tmp_path / "tiny.toml"
    f.write_text(SMALL)
    killed = tmp_path / "studies" / "tiny" / "fedavg" / "runs" / "s0" / "metrics.json"
    killed.parent.mkdir(parents=True)
    killed.write_text(json.dumps({"config": {"fleet": f"{S.ROOT}/fleets/aiot-wifi.toml"}, "rounds": []}))
    assert S.main(["table", str(f)]) == 0
    assert json.loads(killed.read_text())["config"]["fleet"] == "fleets/aiot-wifi.toml"

    def terminated(*a, **k):  # the study's process gets SIGTERM while a trial trains
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
        raise AssertionError("SIGTERM did not stop the study")

    monkeypatch.setattr(tune, "run_trial", terminated)
    before = signal.getsignal(signal.SIGTERM)
    assert S.main(["run", str(f)]) == 130
    assert f"`hetfl study run {f}` resumes" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_stored_config_with_relative_paths_matches_from_any_working_directory(tmp_path, monkeypatch):
    """A metrics.json names the fleet relative to the checkout (the results writer stores it so); reuse checks
    validate it, which reads the fleet, so it must resolve against the checkout, not the current directory."""
    from hetfl.common.results import relative_paths
    from hetfl.inprocess import same_config, stored_config

    fleet = S.ROOT / "fleets" / "aiot-wifi.toml"
    cfg = {**S.Study.from_file(_tiny(tmp_path)).base("fedavg"), "fleet": str(fleet), "num-clients": 20, "seed": 0}
    stored = {"config": relative_paths(cfg)}
    assert stored["config"]["fleet"] == "fleets/aiot-wifi.toml"
    monkeypatch.chdir(tmp_path)  # not the checkout: "fleets/aiot-wifi.toml" does not exist here
    assert stored_config(stored["config"])["fleet"] == str(fleet)
    assert same_config(stored, cfg, every_key=True)
    assert not same_config(stored, {**cfg, "seed": 1}, every_key=True)


def _tiny(tmp_path):
    f = tmp_path / "tiny.toml"
    f.write_text(SMALL)
    return f


def test_a_methods_stream_reads_the_other_methods_runs_after_training_its_own(tmp_path, monkeypatch):
    """Two `--methods` streams side by side: the one that trains fedavg must read fedprox's runs after its own
    training, so that a fedprox seed the other stream finished meanwhile is in the verdict."""
    study = S.Study.from_file(_tiny(tmp_path), out=tmp_path / "studies")
    trained = []

    def scored_runs(study, m, values, train, failed):
        if train:
            trained.append(m)
            return {0: 80.0, 1: 81.0}
        return {0: 85.0, 1: 88.0} if trained else {0: 85.0}  # fedprox's seed 1 lands while fedavg trains

    monkeypatch.setattr(S, "tuned", lambda study, m, train: {"best": {"values": {"lr": 0.1}}})
    monkeypatch.setattr(S, "scored_runs", scored_runs)
    monkeypatch.setattr(S, "statistic", lambda metrics, spec: metrics)
    monkeypatch.setattr(S, "page", lambda *a: "")
    v = S.run(study, methods=["fedavg"])
    assert trained == ["fedavg"] and v["n"] == 2 and v["diffs"] == [5.0, 7.0]


def test_a_pruned_trial_is_listed_with_the_accuracy_the_pruner_judged_it_by(tmp_path):
    """A trial continued from a checkpoint that held round 6 and then pruned at round 5 (the pruner replays the
    checkpoint's rows): its page row gives round 5's validation accuracy, not the last row's; the summary records
    it (hetfl.tune._results), so the page does not need the uncommitted trial folder."""
    import optuna

    from hetfl import tune

    f = tmp_path / "tiny.toml"
    f.write_text(SMALL)
    study = S.Study.from_file(f, out=tmp_path / "studies")
    trial_dir = study.folder / "fedavg" / "tune" / "trials" / "t004"
    trial_dir.mkdir(parents=True)
    vals = [0.06, 0.17, 0.29, 0.49, 0.57, 0.6054, 0.6504]
    (trial_dir / "metrics.json").write_text(json.dumps({"rounds": [{"round": r, "accuracy": 0.0, "val_accuracy": v}
                                                                   for r, v in enumerate(vals)]}))
    best = {"values": {"lr": 0.1}, "val_accuracy": 0.8228}
    pruned = {"number": 4, "state": "pruned", "values": {"lr": 0.01}, "val_accuracy": None, "rounds": 5}

    def row(summary_trial):
        lines = S._trial_lines(study, {"fedavg": {"best": best, "trials": [summary_trial]}})
        return next(line for line in lines if line.startswith("| t004"))

    assert "pruned at round 5 (60.54% then)" in row(pruned)  # that round's row of its metrics.json
    assert "pruned at round 5 (61.00% then)" in row({**pruned, "pruned_val_accuracy": 0.61})  # the summary's first
    (trial_dir / "metrics.json").unlink()
    assert row(pruned).endswith("| pruned at round 5 |")  # nothing to read: no number made up

    s = optuna.create_study(direction="maximize")
    t = s.ask()
    for r, v in enumerate(vals[:6]):
        if r:
            t.report(v, r)
    s.tell(t, state=optuna.trial.TrialState.PRUNED)
    (res,) = tune._results(s, [])
    assert res["state"] == "pruned" and res["rounds"] == 5 and res["pruned_val_accuracy"] == 0.6054
