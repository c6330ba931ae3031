import json
import os

import pytest
import torch

from hetfl.common.results import RunRecorder, convergence_round, machine_info


def test_convergence_round():
    accs = [(0, 0.1), (1, 0.5), (2, 0.81), (3, 0.79), (4, 0.9)]
    assert convergence_round(accs, 0.8) == 2
    assert convergence_round(accs, 0.95) is None
    assert convergence_round([(0, 0.99), (1, 0.5)], 0.9) is None  # the initial model does not count


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


def _reproduce_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / "reproduce.py"
    spec = importlib.util.spec_from_file_location("reproduce_script", path)
    mod = importlib.util.module_from_spec(spec)
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
    assert cells == ["not recorded", "25.00 ± 0.00 (1 of 2 runs)"]


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
