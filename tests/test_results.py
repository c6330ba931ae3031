import json
import os
import sys
from pathlib import Path

import pytest
import torch

from hetfl.common.results import RunRecorder, convergence_round, copy_files, machine_info


def test_convergence_round():
    accs = [(0, 0.1), (1, 0.5), (2, 0.81), (3, 0.79), (4, 0.9)]
    assert convergence_round(accs, 0.8) == 2
    assert convergence_round(accs, 0.95) is None
    assert convergence_round([(0, 0.99), (1, 0.5)], 0.9) is None  # the initial model does not count


def test_copy_files_keeps_relative_paths_and_only_the_files_named(tmp_path):
    src, dst = tmp_path / "results", tmp_path / "docs"
    for rel, text in {"a/s0/metrics.json": "0", "a/tune/trials/t1/metrics.json": "1", "a/s0/checkpoint.pt": "x"}.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    (dst / "a/s0").mkdir(parents=True)
    (dst / "a/s0/metrics.json").write_text("old")
    out = copy_files(sorted(src.glob("a/**/metrics.json")), src, dst)
    assert sorted(p.relative_to(dst).as_posix() for p in out) == ["a/s0/metrics.json", "a/tune/trials/t1/metrics.json"]
    assert (dst / "a/s0/metrics.json").read_text() == "0" and (dst / "a/tune/trials/t1/metrics.json").read_text() == "1"
    assert not (dst / "a/s0/checkpoint.pt").exists()
    with pytest.raises(ValueError):  # a file outside src has no place under dst
        copy_files([tmp_path / "elsewhere.json"], src, dst)


def test_recorder_writes_metrics_and_plot(tmp_path):
    cfg = {"method": "fedavg", "dataset": "digits", "partitioner": "iid", "seed": 0,
           "results-dir": str(tmp_path), "run-name": "r1"}
    rec = RunRecorder(cfg, threshold=0.5)
    rec.record(0, 0.1, 2.3)
    rec.record(1, 0.6, 1.0, bytes_down=1000, bytes_up=400, acc_m0=0.55)
    rec.record(2, 0.7, 0.8, bytes_down=1000, bytes_up=400, acc_m0=0.6)
    s = rec.finish()
    data = json.loads((tmp_path / "r1" / "metrics.json").read_text())
    assert data["config"]["method"] == "fedavg" and len(data["rounds"]) == 3
    assert data["rounds"][2]["cum_bytes_down"] == 2000 and data["rounds"][2]["cum_bytes_up"] == 800
    assert s["convergence_round"] == 1 and s["total_bytes_up"] == 800 and s["rounds_completed"] == 2
    assert all(r["round_s"] >= 0 for r in data["rounds"])
    assert (tmp_path / "r1" / "accuracy.png").stat().st_size > 10_000
    (machine,) = data["machines"]  # where it ran, so that wall times from different sessions can be compared
    assert machine["cpu_count"] == os.cpu_count() and machine["from_round"] == 0 and machine["cpu"]
    assert machine["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert machine["cuda_devices"] == torch.cuda.device_count()


def test_a_stopped_run_records_why_writes_its_plot_and_closes_its_trackers(tmp_path):
    """RunRecorder.stop: the reason is the run's outcome (``stopped``), metrics.json and the plot are written, and the
    TensorBoard writer is closed (its events flushed to disk), then NoClientSucceeded is raised with the reason."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from hetfl.common.results import NoClientSucceeded

    cfg = {"method": "fedavg", "dataset": "digits", "partitioner": "iid", "seed": 0, "tracking": "tensorboard",
           "results-dir": str(tmp_path), "run-name": "s"}
    rec = RunRecorder(cfg, threshold=0.5)
    rec.record(0, 0.1, 2.3)
    rec.record(1, 0.2, 2.0, clients=[0, 1], accepted=0)
    with pytest.raises(NoClientSucceeded, match="every update was NaN; the server log"):
        rec.stop(2, "every update was NaN")
    data = json.loads((tmp_path / "s" / "metrics.json").read_text())
    assert data["stopped"] == {"round": 2, "reason": "every update was NaN"} and len(data["rounds"]) == 2
    assert (tmp_path / "s" / "accuracy.png").exists() and rec._trackers is None
    events = EventAccumulator(str(tmp_path / "s" / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars(events.Tags()["scalars"][0])] == [0, 1]


def test_every_resume_adds_the_machine_from_its_first_round(tmp_path):
    here = {**machine_info(), "from_round": 0}
    elsewhere = {**here, "cpu": "some other CPU", "torch_cpu_capability": "AVX2"}
    first = RunRecorder({"run-name": "a", "results-dir": str(tmp_path)}, threshold=0.5)
    assert first.extra["machines"] == [here]
    first.record(0, 0.1, 2.0)
    first.record(1, 0.5, 1.0)
    st = first.state_dict()
    st["extra"]["machines"] = [elsewhere]  # as if rounds 0-1 had run on another machine
    resumed = RunRecorder({"run-name": "b", "results-dir": str(tmp_path)}, threshold=0.5)
    resumed.load_state_dict(st)
    resumed.record(2, 0.6, 0.9)
    st2 = resumed.state_dict()
    again = RunRecorder({"run-name": "c", "results-dir": str(tmp_path)}, threshold=0.5)
    again.load_state_dict(st2)  # a second resume on this machine is listed too, with its own first round
    data = json.loads(again.write().read_text())
    assert data["machines"] == [elsewhere, {**here, "from_round": 2}, {**here, "from_round": 3}]
    assert [r["round"] for r in data["rounds"]] == [0, 1, 2]
    del st["extra"]["machines"]  # a checkpoint written before machines were recorded
    old = RunRecorder({"run-name": "d", "results-dir": str(tmp_path)}, threshold=0.5)
    old.load_state_dict(st)
    assert old.extra["machines"] == [{"cpu": None, "from_round": 0}, {**here, "from_round": 2}]


def _reproduce_script(name: str = "reproduce"):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_script", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_trained_per_round_and_its_bound_on_a_hand_made_run():
    rep = _reproduce_script()
    fixed = {"loc": 0.0, "scale": 0.0, "low": 0.0, "high": 0.0}
    run = {"pool": [{"params": 50}, {"params": 100}],
           "config": {"adaptivefl-tier-proportions": "1:1:2", "adaptivefl-tier-capacity": "gaussian"},
           "devices": {"weak": {**fixed, "loc": 60.0}, "medium": {**fixed, "loc": 99.0},
                       "strong": {**fixed, "loc": 150.0}},
           "rounds": [{"round": 0, "params_back": 0, "clients": []},  # discovery round: not counted
                      {"round": 1, "params_back": 450, "clients": list(range(10))},
                      {"round": 2, "params_back": 650, "clients": list(range(10))}]}
    assert rep.trained_per_round(run) == 5.5  # (450 + 650) / 100 / 2 rounds
    # per request: weak and medium afford only the 50, strong the 100 -> (50 + 50 + 2 x 100) / 4 = 75; x 10 clients
    assert rep.affordable_per_round(run) == 7.5


def test_authors_pick_is_the_round_with_the_best_avg_plus_full():
    rep = _reproduce_script()
    rows = [{"round": 0, "acc_avg": 0.9, "acc_L1": 0.9},  # the initial model never counts
            {"round": 1, "acc_avg": 0.50, "acc_L1": 0.70},
            {"round": 2, "acc_avg": 0.70, "acc_L1": 0.60},  # best sum (1.30), neither best avg alone nor best full
            {"round": 3, "acc_avg": 0.40, "acc_L1": 0.80},
            {"round": 4, "acc_avg": 0.66, "acc_L1": 0.64}]  # ties with round 2: the earlier one is kept
    assert rep.authors_pick({"rounds": rows})["round"] == 2


def test_ensemble_members_on_a_hand_made_run():
    rep = _reproduce_script()
    run = {"rounds": [{"round": 0, "accuracy": 0.1, "acc_m0": 0.1, "acc_m1": 0.1},  # initial model: not counted
                      {"round": 1, "accuracy": 0.60, "acc_m0": 0.40, "acc_m1": 0.50},
                      {"round": 2, "accuracy": 0.70, "acc_m0": 0.72, "acc_m1": 0.60},
                      {"round": 3, "accuracy": 0.90, "acc_m0": 0.80, "acc_m1": 0.80}]}
    s = rep.ensemble_members(run, 1, 2)
    # ensemble (60 + 70) / 2 = 65; member mean (45 + 66) / 2 = 55.5; best (50 + 72) / 2 = 61; gain 65 - 61 = 4
    got = [s[k] for k in ("ensemble", "member_mean", "member_best", "gain_over_best")]
    assert got == pytest.approx([65.0, 55.5, 61.0, 4.0]) and s["rounds"] == (1, 2)
    late = rep.ensemble_members(run, 2, None)  # to the last round: best (72 + 80) / 2 = 76, gain (-2 + 10) / 2 = 4
    assert late["rounds"] == (2, 3) and [late["member_best"], late["gain_over_best"]] == pytest.approx([76.0, 4.0])
    assert rep.ensemble_members(run, 4, None) is None  # no such rounds
    assert rep.ensemble_members({"rounds": [{"round": 1, "accuracy": 0.5}]}, 1, None) is None  # not an ensemble
    assert s["disagreement"] is None  # made before metrics.json recorded it
    for x, d in zip(run["rounds"], (0.5, 0.30, 0.20, 0.10), strict=True):
        x["disagreement"] = d
    assert rep.ensemble_members(run, 1, 2)["disagreement"] == pytest.approx(25.0)  # (30 + 20) / 2, in percent
    cells = [rep.disagreement_cell(x) for x in ([s], [s, rep.ensemble_members(run, 1, 2)])]
    assert cells == ["not recorded", "25.00 (1 of 2 runs)"]  # one value: no "± 0.00" it does not have
    assert rep.mean_std([1.0, 3.0]) == "2.00 ± 1.41" and rep.mean_std([None]) == "n/a"


def test_local_work_counts_each_role_at_its_own_epochs():
    rep = _reproduce_script()
    base = {"local-steps": 0, "local-epochs": 5, "shefl-hpc-local-steps": 0, "shefl-lpc-local-steps": 0, "shefl-hpc-local-epochs": 0,
            "shefl-lpc-local-epochs": 0, "shefl-models": 2, "shefl-hpc-models": "all"}  # as metrics.json records every key
    straggler = {**base, "shefl-hpc-local-epochs": 10, "shefl-lpc-local-epochs": 1}
    zero = {"round": 0, "clients": [], "H_m0": 0, "L_m0": 0, "H_m1": 0, "L_m1": 0}  # discovery round: not counted
    shefl = {"config": {**straggler, "shefl-hpc-models": "all"},
             "rounds": [zero, {"round": 1, "H_m0": 2, "L_m0": 1, "H_m1": 2, "L_m1": 1}]}
    # HPCs: 2 x 2 models x 10 epochs = 40; LPCs: 2 x 1 epoch = 2; one HPC trains both models: 20 model-epochs
    assert rep.local_work(shefl) == (42, 20)
    restricted = {"config": {**straggler, "shefl-hpc-models": "one"},
                  "rounds": [zero, {"round": 1, "H_m0": 1, "L_m0": 0, "H_m1": 0, "L_m1": 1},
                             {"round": 2, "H_m0": 0, "L_m0": 1, "H_m1": 0, "L_m1": 1}]}
    assert rep.local_work(restricted) == (6.5, 10)  # (10 + 1 + 1 + 1) / 2 rounds; one HPC with one model: 10
    plain = {"config": {**base, "shefl-hpc-local-epochs": 0, "shefl-lpc-local-epochs": 0, "shefl-hpc-models": "all"},
             "rounds": [zero, {"round": 1, "H_m0": 0, "L_m0": 2, "H_m1": 0, "L_m1": 2}]}
    assert rep.local_work(plain) == (20, 5)  # no per-role work: every client at the run's 5 local epochs
    fedavg = {"config": base, "rounds": [{"round": 0, "clients": []}, {"round": 1, "clients": [3, 7, 9]}]}
    assert rep.local_work(fedavg) == (15, 5)
    assert rep.local_work({"config": {**base, "local-steps": 10}, "rounds": fedavg["rounds"]}) is None  # step-based


def test_grid_picks_on_validation_over_the_last_rounds_and_says_when_it_cannot():
    rep = _reproduce_script()

    def run(test, val):
        return {"rounds": [{"round": i, "accuracy": t, "val_accuracy": v} for i, (t, v) in enumerate(zip(test, val))],
                "summary": {"rounds_completed": len(test) - 1}}

    # round 0 is outside the last 3: a's test mean is (0.6 + 0.8 + 0.7) / 3 = 70, b's 69; validation ranks b first
    a = run([0.9, 0.6, 0.8, 0.7], [0.9, 0.5, 0.5, 0.5])
    b = run([0.1, 0.69, 0.69, 0.69], [0.1, 0.6, 0.6, 0.6])
    picks = rep.grid_picks({"m": [("m-lr0.1", {"lr": 0.1}, a), ("m-lr0.01", {"lr": 0.01}, b)]})
    assert [p["picked"] for p in picks] == [False, True] and {p["picked_on"] for p in picks} == {"val"}
    assert [p["test"] for p in picks] == pytest.approx([70.0, 69.0]) and picks[1]["val"] == pytest.approx(60.0)
    b["rounds"][-1]["val_accuracy"] = None  # one point without validation: the grid picks on test, and says so
    picks = rep.grid_picks({"m": [("m-lr0.1", {"lr": 0.1}, a), ("m-lr0.01", {"lr": 0.01}, b)]})
    assert [p["picked"] for p in picks] == [True, False] and picks[0]["picked_on"] == "test"


# ---- FENS Table 1 (scripts/oneshot_table.py) on hand-made runs ---------------------------------------------------------
def _preset_run(method, alpha, seed, acc, down, up, *, phases=None, rounds=None, reused=False, **config):
    """A metrics.json as a finished run of the method's FMNIST preset writes it (every key, the preset's values)."""
    import tomllib
    from pathlib import Path

    from hetfl.methods import validate

    root = Path(__file__).resolve().parent.parent
    cfg = validate({**tomllib.loads((root / f"configs/{method}/fmnist-dir{alpha}.toml").read_text()), "seed": seed, **config})
    run = {"config": cfg, "summary": {"final_accuracy": acc, "total_bytes_down": down, "total_bytes_up": up},
           "rounds": rounds or [{"round": 0, "round_s": 50.0}], "phases": phases or {}}
    if reused:
        run["phase1_reused_from"] = "/elsewhere/ensemble.json"
    return run


def _write(runs_dir, name, run):
    (runs_dir / name).mkdir(parents=True)
    (runs_dir / name / "metrics.json").write_text(json.dumps(run))


def test_oneshot_table_on_hand_made_runs(tmp_path):
    """Rows in Table 1's order from FENS runs (five rows each) and one-shot runs; missing seeds, values that differ
    from the preset and reused phase 1s beside the row; iterative runs and other alphas left out; bytes and server
    seconds as documented."""
    tab = _reproduce_script("oneshot_table")
    a = tmp_path / "oneshot-0.1"
    f = tmp_path / "fens-0.1"
    fens_phases = {"upload_bytes": 2_000_000, "phase1_request_bytes": 1_000_000, "confusion_upload_bytes": 30_000}
    rounds = [{"round": 0, "round_s": 100.0}, {"round": 1, "round_s": 2.0}, {"round": 2, "round_s": 3.0}]
    statics = [{"oneshot-fedavg": 0.10, "average": 0.30, "weighted-average": 0.40, "voting": 0.50},
               {"oneshot-fedavg": 0.20, "average": 0.30, "weighted-average": 0.50, "voting": 0.50},
               {"oneshot-fedavg": 0.30, "average": 0.30, "weighted-average": 0.60, "voting": 0.50}]
    for seed in (0, 1, 2):
        run = _preset_run("fens", 0.1, seed, 0.70 + 0.01 * seed, 9_000_000, 6_000_000, phases=fens_phases,
                          rounds=rounds, **({"num-server-rounds": 100} if seed == 2 else {}),
                          **({"resume": True, "run-name": "fens-s1"} if seed == 1 else {}))
        if seed == 1:  # resumed, recorded when a resume named its own ensemble as "reused": no reuse
            run["phase1_reused_from"] = "/elsewhere/results/fens-0.1/fens-s1/ensemble.json"
        _write(f, f"fens-s{seed}", {**run, "static_aggregators_test_accuracy": statics[seed]})
    _write(f, "fedadam-s0", _preset_run("fedadam", 0.1, 0, 0.9, 10**9, 10**9))  # iterative: not in Table 1
    kd_phases = {"upload_bytes": 3_000_000, "phase1_request_bytes": 3_000_000}
    for seed, acc in ((0, 0.50), (1, 0.60)):  # seed 2 missing; a scaled server step
        _write(a, f"fedkd-s{seed}", _preset_run("fedkd", 0.1, seed, acc, 3_000_100, 3_000_200,
                                                phases={**kd_phases, "server_step_s": 10.0 * (seed + 1)}, **{"fedkd-epochs": 50}))
    for seed in (0, 1, 2):  # every run started from FedKD's phase 1; seed 2 at 20 epochs; seed 0 made before timing
        _write(a, f"fedet-s{seed}", _preset_run("fedet", 0.1, seed, 0.55, 3_000_100, 3_000_200, reused=True,
                                                phases={**kd_phases, **({"server_step_s": 4.0} if seed else {})},
                                                **({"fedet-epochs": 20} if seed == 2 else {})))
    _write(f, "fedkd-s0", _preset_run("fedkd", 0.1, 0, 0.99, 1, 1, phases=kd_phases))  # the same run name: first dir wins
    _write(a, "fedkd-dir0.01-s0", _preset_run("fedkd", 0.01, 0, 0.3, 1, 1, phases=kd_phases))  # another alpha
    for seed, secs in ((0, 3000.0), (1, 80.0), (2, 90.0)):  # seed 0 on the CPU (Simulation Engine), 1 and 2 on a GPU
        run = _preset_run("coboost", 0.1, seed, 0.5, 1, 1, phases={**kd_phases, "server_step_s": secs},
                          **({"torch-device": "cuda"} if seed else {}))
        if seed:
            run.update(engine="in-process (20 nodes ...)", machines=[{"cpu": "x", "cuda_device": "NVIDIA H100 80GB HBM3"}])
        _write(a, f"coboost-s{seed}", run)
    root = Path(__file__).resolve().parent.parent
    assert tab.main(["--name", "t1", "--alphas", "0.1", "--seeds", "0", "1", "2", "--out", str(tmp_path / "out"),
                     "--runs", str(tmp_path / "oneshot-{alpha}"), str(tmp_path / "fens-{alpha}"),
                     "--presets", str(root / "configs/{method}/fmnist-dir{alpha}.toml")]) == 0
    text = (tmp_path / "out" / "t1" / "table.md").read_text()
    body = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| method") and "---" not in line]
    assert [line.split(" | ")[0][2:] for line in body] == ["one-shot FedAvg", "FedENS", "weighted averaging", "voting",
                                                           "FedKD", "Fed-ET", "FedCVAE-Ens", "Co-Boosting", "FENS"]
    cells = {line.split(" | ")[0][2:]: line.split(" | ")[1:] for line in body}
    # static rows: phase 1 only, (1 + 2) MB; voting adds its confusion counts; no server time
    assert cells["one-shot FedAvg"][:4] == ["20.00 ± 10.00", "3", "3.00 ± 0.00", "n/a"]
    assert cells["FedENS"][0] == "30.00 ± 0.00" and cells["weighted averaging"][0] == "50.00 ± 10.00"
    assert cells["voting"][2] == "3.03 ± 0.00"
    # FENS: everything its clients moved (15 MB), its aggregator rounds' wall time (2 + 3 s), the shorter seed noted
    assert cells["FENS"][:4] == ["71.00 ± 1.00", "3", "15.00 ± 0.00", "5.00 ± 0.00"]
    assert "num-server-rounds = 100 (seed 2) (preset: 500)" in cells["FENS"][4]
    assert "num-server-rounds" not in cells["voting"][4]  # a static aggregator does not depend on phase 2
    assert not any("reused" in cells[k][4] for k in ("FENS", "voting", "FedENS"))  # seed 1 resumed its own phase 1
    # FedKD: two seeds (the docs copy of seed 0 ignored), 6.0003 MB per run, server step 10 / 20 s, scaled epochs noted
    assert cells["FedKD"][:4] == ["55.00 ± 7.07", "2", "6.00 ± 0.00", "15.00 ± 7.07"]
    assert cells["FedKD"][4].startswith("seeds 0, 1 only; fedkd-epochs = 50 (preset: 200)")
    assert "H100" not in cells["FedKD"][4] and "(CPU)" not in cells["FedKD"][3]  # all on the CPU: no device named
    assert tab.device({"config": {"torch-device": "auto"}, "machines": [{"cuda_devices": 1}]}) == "GPU"  # no name kept
    assert tab.device({"config": {"torch-device": "auto"}, "machines": [{"cuda_devices": 0}]}) == "CPU"
    assert tab.device({"config": {"torch-device": "cpu"}, "machines": [{"cuda_device": "NVIDIA H100 80GB HBM3"}]}) == "CPU"
    assert cells["Fed-ET"][3] == "4.00 ± 0.00 (2 of 3)"  # seed 0 recorded no server step time
    assert cells["Fed-ET"][4] == ("fedet-epochs = 20 (seed 2) (preset: 200); phase 1 reused in 3 of 3 runs "
                                  "(its bytes and time counted) |")
    # Co-Boosting: server seconds averaged per device, never a CPU's with a GPU's; the GPU seeds named
    assert cells["Co-Boosting"][3] == "3000.00 (CPU); 85.00 ± 7.07 (H100)"
    assert cells["Co-Boosting"][4] == "seeds 1, 2 on one H100 (in-process engine) |"
    assert cells["FedCVAE-Ens"][:2] == ["not run", "0"]
    assert "fedadam" not in text.lower()
    data = json.loads((tmp_path / "out" / "t1" / "table.json").read_text())["0.1"]
    assert [r["seeds"] for r in data if r["method"] == "FedKD"] == [[0, 1]]
    assert (tmp_path / "out" / "t1" / "accuracy-vs-mb.png").stat().st_size > 10_000


def test_reproduce_shares_phase1_between_oneshot_runs_of_the_same_settings(tmp_path):
    """The driver points a one-shot run at an earlier run's saved phase 1 when the settings match (FedKD -> Fed-ET),
    never across seeds, to Co-Boosting (no auxiliary hold-out) or to FENS."""
    import tomllib

    import numpy as np

    from hetfl.methods import validate
    from hetfl.common.oneshot.artifacts import phase1_settings, save_ensemble
    from hetfl.common.oneshot.ensemble import Ensemble
    from hetfl.oneshot_app import PHASE1

    rep = _reproduce_script()
    root = Path(__file__).resolve().parent.parent
    preset = lambda m: tomllib.loads((root / f"configs/{m}/fmnist-dir0.1.toml").read_text())  # noqa: E731
    kd = tmp_path / "fedkd-s0"
    kd.mkdir()
    save_ensemble(kd, Ensemble([{"w": np.zeros(2, np.float32)}], [0], np.ones((1, 10), np.int64), [10], {},
                               phase1_settings(validate({**preset("fedkd"), "seed": 0}), PHASE1, 20)))
    empty = tmp_path / "fedadam-s0"  # a run without a saved ensemble is skipped
    empty.mkdir()
    sources = [empty, kd]
    assert rep.shared_phase1({**preset("fedet"), "seed": 0}, sources) == kd.resolve()
    assert rep.shared_phase1({**preset("fedet"), "seed": 0, "fedet-epochs": 5}, sources) == kd.resolve()
    assert rep.shared_phase1({**preset("fedet"), "seed": 1}, sources) is None
    assert rep.shared_phase1({**preset("coboost"), "seed": 0}, sources) is None
    assert rep.shared_phase1({**preset("fens"), "seed": 0}, sources) is None


def test_grid_table_of_the_committed_fens_iterative_grids():
    """scripts/grid_table.py on the committed grid runs gives the doc's rows: picks on validation (FedNova's and
    Scaffold's on test: no validation recorded) and where each reaches FENS's seed-0 final accuracy."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    tab = _reproduce_script("grid_table")
    lines = tab.table(root / "docs/results/fens-iterative-fmnist-dir0.1-lrgrid-r10/runs", 0.763)
    picked = {line.split(" | ")[0][2:]: line.split(" | ")[1] for line in lines[2:] if "**" in line.split(" | ")[1]}
    assert picked == {"FedAvg": "**0.1**", "FedProx": "**0.1**", "FedNova": "**0.01**", "Scaffold": "**0.03**",
                      "FedYogi": "**0.1**", "FedAdam": "**0.1**", "FedAvg-STC": "**0.1**"}
    # the 50-round runs of `make reproduce-fens-iterative` are at these picks
    make = (root / "Makefile").read_text()
    picks = next(line for line in make.splitlines() if line.startswith("ITER_PICKS ?="))
    assert {tab.NAMES[p.split("@lr=")[0]]: f"**{p.split('@lr=')[1]}**" for p in picks.split("=", 1)[1].split()} == picked
    stc = next(line for line in lines if line.startswith("| FedAvg-STC | **0.1**"))
    assert "| 6 (1,062) | 1,770 |" in stc and "| n/r |" not in stc


def test_reproduce_inprocess_engine_runs_once_and_says_so(tmp_path, monkeypatch, task_identity):
    """scripts/reproduce.py --engine inprocess: the run goes through hetfl.inprocess (no SuperLink, no Ray), its
    metrics.json names that engine, and a second call finds it finished instead of running it again."""
    from pathlib import Path

    from .conftest import require_fmnist

    require_fmnist()
    root = Path(__file__).resolve().parent.parent
    rep = _reproduce_script()
    monkeypatch.chdir(tmp_path)
    argv = ["reproduce.py", "--name", "t", "--engine", "inprocess", "--seeds", "0", "--supernodes", "4",
            "--presets", str(root / "configs/quickstart.toml"), "--set", "num-server-rounds=1", "min-available-nodes=4",
            "local-steps=1", "max-test-samples=200", "checkpoint=false"]
    monkeypatch.setattr(sys, "argv", argv)
    assert rep.main() == 0
    metrics = tmp_path / "results/reproduce/t/runs/configs-quickstart-s0/metrics.json"
    m = json.loads(metrics.read_text())
    assert m["engine"].startswith("in-process (4 nodes") and m["summary"]["rounds_completed"] == 1
    assert len(m["rounds"][1]["clients"]) == 2  # fraction-train 0.5 of the 4 nodes: the preset's own values ran
    before = metrics.stat().st_mtime_ns
    monkeypatch.setattr(rep.launch, "preflight", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran again")))
    assert rep.main() == 0 and metrics.stat().st_mtime_ns == before


def test_no_committed_result_names_a_path_on_the_machine_that_made_it():
    """Committed JSON under docs/results/ carries paths relative to the repository (or to the tool's own folder), so
    a run recorded on another machine matches and reads the same: no absolute path of a checkout or scratch folder."""
    import re
    import subprocess

    root = Path(__file__).resolve().parent.parent
    files = subprocess.run(["git", "ls-files", "docs/results/*.json", "docs/results/**/*.json"], cwd=root,
                           capture_output=True, text=True, check=True).stdout.split()
    assert len(files) > 100  # the committed runs are there to be read
    pattern = re.compile(r'"(?:/work|/tmp|/root|/home|%s)/[^"]*"' % re.escape(str(root)))
    bad = [(f, m.group(0)) for f in files for m in [pattern.search((root / f).read_text())] if m]
    assert not bad, bad[:5]


def test_every_committed_checkpoint_has_the_files_it_names_committed_too():
    """A study commits a stopped run's checkpoint so that a fresh checkout resumes it: the tensor file and the row log
    its JSON names must be committed with it (docs/verdicts.md, "Reuse")."""
    import subprocess

    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout

    tracked = set(git("ls-files", "docs/results").split())
    missing = []
    for f in sorted(t for t in tracked if t.endswith("/checkpoint.json")):
        doc = json.loads(git("show", f":{f}"))  # as committed (a run in progress rewrites the file on disk)
        mark = doc["state"].get("recorder", {}).get("rows")
        named = [doc["tensors"]["file"], *([mark["file"]] if mark else [])]
        missing += [f"{f}: {n}" for n in named if str(Path(f).parent / n) not in tracked]
    assert not missing, missing


# --- per-round writes whose cost does not grow with the run -------------------------------------------


def test_csv_log_appends_and_is_byte_for_byte_the_whole_rewrite(tmp_path, monkeypatch):
    from hetfl.common import tracking
    from hetfl.common.tracking import CsvLog, write_csv

    whole = []
    real = tracking.write_csv
    monkeypatch.setattr(tracking, "write_csv", lambda p, rows: (whole.append(len(rows)), real(p, rows))[1])
    log = CsvLog(tmp_path / "metrics.csv")
    rows = []
    for i in range(7):
        row = {"round": i, "accuracy": 0.1 * i, "clients": [i, i + 1], "by": {"b": i, "a": None}}
        if i >= 4:
            row["acc_m0"] = i / 3  # a column that appears later: the one rewrite after the first
        if i == 5:
            del row["clients"]  # a column a row lacks: an empty cell, appended
        rows.append(row)
        log.update(rows)
        real(tmp_path / "whole.csv", rows)
        assert (tmp_path / "metrics.csv").read_bytes() == (tmp_path / "whole.csv").read_bytes(), i
    assert whole == [1, 5]
    log.reset()  # the rows were replaced (a resume): rewritten whole
    rows = rows[:3]
    log.update(rows)
    write_csv(tmp_path / "whole.csv", rows)
    assert (tmp_path / "metrics.csv").read_bytes() == (tmp_path / "whole.csv").read_bytes() and whole[-1] == 3


class _Clock:
    """perf_counter for a recorder whose metrics.json rewrite takes `cost` seconds of this clock."""

    def __init__(self) -> None:
        self.now, self.cost, self.writes = 1000.0, 0.0, 0

    def perf_counter(self) -> float:
        return self.now

    def relative_paths(self, obj):
        self.now += self.cost
        self.writes += 1
        return obj


@pytest.mark.parametrize("cost,round_s,expect_every_round", [(0.001, 1.0, True), (0.5, 0.13, False)])
def test_metrics_json_rewrites_take_at_most_their_share_and_a_flush_catches_up(tmp_path, monkeypatch, cost, round_s,
                                                                              expect_every_round):
    import types

    from hetfl.common import results

    clock = _Clock()
    monkeypatch.setattr(results, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    monkeypatch.setattr(results, "relative_paths", clock.relative_paths)
    rec = RunRecorder({"run-name": "share", "results-dir": str(tmp_path), "tracking": "none"}, threshold=0.5)
    clock.cost = cost
    start = clock.now
    for rnd in range(400):
        clock.now += round_s
        rec.record(rnd, 0.5, 1.0)
        assert sum(1 for _ in open(rec.run_dir / "metrics.csv")) == rnd + 2  # the header and every row, always
    spent, total = clock.writes * cost, clock.now - start
    if expect_every_round:
        assert clock.writes == 400
    else:
        assert 0.03 * total < spent <= RunRecorder.JSON_SHARE * total + cost  # near the share, never past it
        assert len(json.loads((rec.run_dir / "metrics.json").read_text())["rounds"]) < 400
    rec.flush()
    assert [r["round"] for r in json.loads((rec.run_dir / "metrics.json").read_text())["rounds"]] == list(range(400))
    writes = clock.writes
    rec.flush()
    assert clock.writes == writes  # nothing new: no rewrite


def test_metrics_text_is_json_with_one_line_per_row():
    from hetfl.common.results import metrics_text

    data = {"config": {"a": [1, 2], "b": {"c": None}}, "rounds": [{"round": 0, "x": {"0": 1.5}}, {"round": 1, "x": {}}],
            "summary": {"final_accuracy": 0.5}, "machines": [{"cpu": "x"}]}
    text = metrics_text(data)
    assert json.loads(text) == data and list(json.loads(text)) == list(data)
    lines = text.splitlines()
    assert lines[lines.index('  "rounds": [') + 1:][:3] == ['    {"round": 0, "x": {"0": 1.5}},', '    {"round": 1, "x": {}}', "  ],"]
    rest = {k: v for k, v in data.items() if k != "rounds"}
    assert metrics_text(rest) == json.dumps(rest, indent=2)  # everything else indented as before
    assert metrics_text({**rest, "rounds": []}) == json.dumps({**rest, "rounds": []}, indent=2) and metrics_text({}) == "{}"
