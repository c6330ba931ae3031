import json

from hetfl.common.results import RunRecorder, convergence_round


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
