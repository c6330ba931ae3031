"""Tracking files (metrics.csv, TensorBoard events, W&B offline, MLflow local), progress lines, the plot, the summary
and the final model (docs/tracking.md, docs/inference.md)."""

from __future__ import annotations

import csv
import importlib.util
import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from hetfl.common.config import ConfigError

from hetfl.methods import SCHEMA, validate
from hetfl.common.progress import duration, heartbeat, round_line
from hetfl.common.results import RunRecorder, plot_figure, summary_lines
from hetfl.common.tracking import parse_tracking

CFG = {"method": "fedavg", "dataset": "digits", "partitioner": "dirichlet", "dirichlet-alpha": 0.3, "seed": 7,
       "model": "cnn", "num-server-rounds": 3}


def event_scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] of the event files in `logdir`, read by TensorBoard's own EventAccumulator."""
    pytest.importorskip("tensorboard", reason="reading event files back needs tensorboard (pip install 'hetfl[dev]')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def _record_three_rounds(rec: RunRecorder) -> None:
    rec.stage(clients=[3, 1])
    rec.record(0, 0.1, 2.3)
    rec.stage(clients=[0, 2])
    rec.record(1, 0.6, 1.0, bytes_down=1000, bytes_up=400, acc_m0=0.55, val_accuracy=None)
    rec.record(2, 0.85, 0.8, bytes_down=1000, bytes_up=400, acc_m0=0.6, val_accuracy=0.5)


def test_event_file_holds_each_round_as_soon_as_it_is_recorded(tmp_path):
    """A run that dies after round 1 (no finish, no close) leaves rounds 0 and 1 readable by TensorBoard."""
    rec = RunRecorder({**CFG, "run-name": "r", "results-dir": str(tmp_path)}, threshold=0.8)
    rec.record(0, 0.1, 2.3)
    rec.record(1, 0.6, 1.0, bytes_down=1000, bytes_up=400)
    assert event_scalars(tmp_path / "r" / "tensorboard")["accuracy/accuracy"] == [(0, pytest.approx(0.1)),
                                                                                 (1, pytest.approx(0.6))]


def test_metrics_csv_and_event_file_hold_every_round(tmp_path):
    rec = RunRecorder({**CFG, "run-name": "r", "results-dir": str(tmp_path)}, threshold=0.8)
    _record_three_rounds(rec)
    rec.finish()
    run = tmp_path / "r"
    data = json.loads((run / "metrics.json").read_text())
    with open(run / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["round"]) for r in rows] == [0, 1, 2]
    assert [float(r["accuracy"]) for r in rows] == [r["accuracy"] for r in data["rounds"]]
    assert [r["clients"] for r in rows] == ["3 1", "0 2", ""]  # a list as space-separated ids; a missing column empty
    assert rows[0]["acc_m0"] == "" and float(rows[2]["acc_m0"]) == 0.6  # columns that appear later are in the header
    assert rows[1]["val_accuracy"] == "" and int(rows[2]["cum_bytes_up"]) == 800
    scalars = event_scalars(run / "tensorboard")
    assert scalars["accuracy/accuracy"] == [(0, pytest.approx(0.1)), (1, pytest.approx(0.6)), (2, pytest.approx(0.85))]
    assert [v for _, v in scalars["accuracy/acc_m0"]] == pytest.approx([0.55, 0.6])
    assert scalars["bytes/cum_bytes_down"][-1] == (2, 2000.0) and "loss/loss" in scalars and "time/round_s" in scalars
    assert scalars["summary/final_accuracy"] == [(2, pytest.approx(0.85))]
    assert "accuracy/val_accuracy" in scalars and len(scalars["accuracy/val_accuracy"]) == 1  # None is left out


def test_tracking_key(tmp_path):
    assert parse_tracking("tensorboard, wandb") == ["tensorboard", "wandb"] and parse_tracking("none") == []
    for bad in ("tensorbord", "none,wandb"):
        with pytest.raises(ConfigError, match=r"run-config key 'tracking' = .* expected a comma list of"):
            validate({"tracking": bad})
    for name in ("wandb", "mlflow"):
        if importlib.util.find_spec(name) is None:
            with pytest.raises(ConfigError, match=rf"needs the {name} package.*hetfl\[{name}\]"):
                validate({"tracking": name})
    with pytest.raises(ConfigError, match="progress-interval"):
        validate({"progress-interval": 0.0})
    rec = RunRecorder({**CFG, "run-name": "quiet", "results-dir": str(tmp_path), "tracking": "none"}, threshold=0.8)
    rec.record(0, 0.1, 2.3)
    rec.finish()
    assert not (tmp_path / "quiet" / "tensorboard").exists() and (tmp_path / "quiet" / "metrics.csv").exists()


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="W&B not installed (pip install 'hetfl[wandb]')")
def test_wandb_offline_run_under_the_run_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    rec = RunRecorder({**CFG, "run-name": "w", "results-dir": str(tmp_path), "tracking": "wandb"}, threshold=0.8)
    _record_three_rounds(rec)
    assert [t.name for t in rec._trackers.active] == ["wandb"]
    rec.finish()
    (log_file,) = (tmp_path / "w" / "wandb").glob("offline-run-*/run-*.wandb")  # offline: nothing left the machine
    raw = log_file.read_bytes()
    assert raw.count(b"accuracy/accuracy") >= 3 and b"summary/final_accuracy" in raw and b"0.85" in raw


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="MLflow not installed (pip install 'hetfl[mlflow]')")
def test_mlflow_local_file_store_under_the_run_dir(tmp_path):
    from mlflow.tracking import MlflowClient

    rec = RunRecorder({**CFG, "run-name": "m", "results-dir": str(tmp_path), "tracking": "mlflow"}, threshold=0.8)
    _record_three_rounds(rec)
    rec.finish()
    client = MlflowClient(tracking_uri=(tmp_path / "m" / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("hetfl").experiment_id])
    assert run.info.run_name == "m" and run.info.status == "FINISHED" and run.data.params["seed"] == "7"
    history = client.get_metric_history(run.info.run_id, "accuracy/accuracy")
    assert [(m.step, m.value) for m in history] == [(0, 0.1), (1, 0.6), (2, 0.85)]
    assert run.data.metrics["summary/final_accuracy"] == pytest.approx(0.85)


def test_round_lines_and_heartbeat(tmp_path, hetfl_lines):
    assert [duration(x) for x in (5.04, 62, 7500)] == ["5.0s", "1m02s", "2h05m"]
    line = round_line(2, 10, 0.8123, 0.52, 1.5, 0.5, 12.3, 62.0)
    assert line == "[round 2/10] acc 0.8123 loss 0.5200 | 1.50 MB down, 0.50 MB up | 12.3 s/round, elapsed 1m02s, left ~1m38s"
    rec = RunRecorder({**CFG, "run-name": "p", "results-dir": str(tmp_path)}, threshold=0.8)
    _record_three_rounds(rec)
    rows = [x for x in hetfl_lines if x.startswith("[round")]
    assert [x.split("]")[0] for x in rows] == ["[round 0/3", "[round 1/3", "[round 2/3"]
    assert "initial model" in rows[0] and "left ~" in rows[2] and "acc 0.8500" in rows[2]
    with heartbeat("FENS phase 1: 4 clients training locally", every=0.05):
        time.sleep(0.23)
    beats = [x for x in hetfl_lines if x.startswith("FENS phase 1")]
    assert len(beats) >= 3 and "still running" in beats[0] and beats[-1].startswith("FENS phase 1: 4 clients training locally: done in")
    hetfl_lines.clear()
    with heartbeat("short", every=5.0):
        pass
    assert hetfl_lines == []  # a phase shorter than the interval stays silent


def _fig_texts(fig) -> dict:
    axes = fig.axes
    return {"legends": [[t.get_text() for t in ax.get_legend().get_texts()] if ax.get_legend() else [] for ax in axes],
            "ticks": [[t.get_text() for t in ax.get_xticklabels()] for ax in axes], "title": fig._suptitle.get_text(),
            "xlim": [ax.get_xlim() for ax in axes], "titles": [ax.get_title() for ax in axes]}


def _metrics(rows, report=None, **extra):
    return {"config": CFG, "rounds": rows, "summary": {"convergence_threshold": 0.8}, **({"report": report} if report else {}),
            **extra}


def _row(rnd, acc, mb, **cols):
    return {"round": rnd, "accuracy": acc, "loss": 1.0, "cum_bytes_down": mb * 1e6 / 2, "cum_bytes_up": mb * 1e6 / 2, **cols}


def test_plots_say_what_each_curve_is():
    import matplotlib.pyplot as plt

    # AdaptiveFL: levels S1/M1/L1, L1 is the accuracy itself (drawn once), and a waste-rate panel
    rows = [_row(r, 0.2 + 0.1 * r, 2.0 * r, acc_S1=0.1 * r, acc_M1=0.15 * r, acc_L1=0.2 + 0.1 * r,
                 **({"waste_rate": 0.3, "cum_waste_rate": 0.25} if r else {})) for r in range(4)]
    fig = plot_figure(_metrics(rows, {"accuracy": "L1 (full model)", "panels": {"waste rate": ["waste_rate", "cum_waste_rate"]},
                                      "same_as": "acc_L1"}, federation={"clients": 20, "nodes": 4}))
    t = _fig_texts(fig)
    assert len(fig.axes) == 3 and t["titles"][2] == "waste rate"
    assert t["legends"][0] == ["L1 (full model)", "S1", "M1", "convergence threshold 80%"]
    assert all(x.lstrip("−-").isdigit() for x in t["ticks"][0] if x)  # whole rounds only
    assert t["title"] == "fedavg on digits (Dirichlet \u03b1=0.3), cnn, seed 7, 20 clients on 4 nodes"
    plt.close(fig)
    # FENS: round 0 carries phase 1; the bytes axis starts at 0 and the static aggregators stand beside it
    rows = [_row(0, 0.7, 30.0), _row(1, 0.75, 30.5), _row(2, 0.8, 31.0)]
    fig = plot_figure(_metrics(rows, {"accuracy": "ensemble + nn aggregator", "references": {"voting": 0.66},
                                      "before": "phase 1 + ensemble download"}))
    t = _fig_texts(fig)
    assert t["xlim"][1][0] == 0 and "phase 1 + ensemble download: 30.0 MB" in t["legends"][1]
    assert "voting 66.0%" in t["legends"][0] and "voting 66.0%" in t["legends"][1]
    plt.close(fig)
    # SHEFL: the ensemble and its members
    fig = plot_figure(_metrics([_row(0, 0.1, 0, acc_m0=0.1, acc_m1=0.1), _row(1, 0.5, 1, acc_m0=0.4, acc_m1=0.45)],
                               {"accuracy": "ensemble"}))
    assert _fig_texts(fig)["legends"][0][:3] == ["ensemble", "member 0", "member 1"]
    plt.close(fig)


def test_summary_says_not_reached_and_the_methods_figures(tmp_path):
    rec = RunRecorder({**CFG, "run-name": "s", "results-dir": str(tmp_path)}, threshold=0.9)
    rec.describe("ensemble + nn aggregator", references={"FedENS (average)": 0.61, "voting": 0.58},
                 panels={"waste rate": ["waste_rate"]})
    rec.record(0, 0.1, 2.3)
    rec.record(1, 0.6, 1.0, acc_S1=0.5, waste_rate=0.25)
    s = rec.finish()
    assert s["convergence_round"] is None and s["final_members"] == {"S1": 0.5} and s["references"]["voting"] == 0.58
    lines = summary_lines(json.loads((tmp_path / "s" / "metrics.json").read_text()), tmp_path / "s")
    assert lines[0] == ("final accuracy (ensemble + nn aggregator): 60.00% (best 60.00%); "
                        "convergence round at 90%: not reached")
    assert "  beside the ensemble + nn aggregator: FedENS (average) 61.00%, voting 58.00%" in lines
    assert "  last round, per member/level: S1 50.00%" in lines and "  waste rate, last round: waste_rate 25.00%" in lines
    assert lines[-1] == f"results: {tmp_path / 's'} (metrics.json, metrics.csv, accuracy.png, tensorboard/)"


def test_launcher_drops_flowers_noise_and_ray_future_warning(tmp_path):
    from hetfl.launch import flwr_env, relayed

    assert not relayed(b"\x1b[93mWARNING \x1b[0m:   Since flwr 1.32, default simulated SuperNodes changed from 10 to 2.\n")
    assert not relayed(b"INFO :      \tflwr federation simulation-config @none/default <superlink> --num-supernodes <N>\n")
    assert relayed(b"INFO :      Federation `@none/default` (4 simulated SuperNodes)\n")
    assert "ignore::FutureWarning:ray._private.worker" in flwr_env(tmp_path)["PYTHONWARNINGS"].split(",")


# one short real run per method (in process, scikit-learn's digits): the files, the progress lines, and a final model
# that, loaded as the docs show, scores what the run reported
RUN = {"dataset": "digits", "data-source": "local", "partitioner": "dirichlet", "dirichlet-alpha": 0.5, "num-server-rounds": 2,
       "min-available-nodes": 4, "fraction-train": 1.0, "local-steps": 20, "batch-size": 16, "lr": 0.05,
       "momentum": 0.9, "max-test-samples": 300, "checkpoint": False}  # final accuracies 19-63%, chance 10%
METHODS = {"fedavg": {"method": "fedavg"}, "shefl": {"method": "shefl", "shefl-models": 2, "shefl-hpc-per-round": 2},
           "fens": {"method": "fens", "eval-split": "test-half", "fens-local-fraction": 0.9, "fens-aggregator": "per-class",
                    "fens-aggregator-init": "average"},
           "adaptivefl": {"method": "adaptivefl"}, "decoupled": {"method": "decoupled"},
           "scalefl": {"method": "scalefl"}}


@pytest.mark.parametrize("name", sorted(METHODS))
def test_a_run_leaves_csv_events_progress_and_a_final_model_that_scores_as_reported(name, tmp_path, task_identity,
                                                                                      hetfl_lines):
    from hetfl.common.final_model import load_final_model
    from hetfl.common.rundata import test_data

    from .inprocess import run_in_process

    m = run_in_process({**RUN, **METHODS[name]}, 4, tmp_path, name)
    run = tmp_path / name
    with open(run / "metrics.csv", newline="") as f:
        assert [float(r["accuracy"]) for r in csv.DictReader(f)] == [r["accuracy"] for r in m["rounds"]]
    scalars = event_scalars(run / "tensorboard")
    assert [s for s, _ in scalars["accuracy/accuracy"]] == [0, 1, 2]
    assert [x.split("]")[0] for x in hetfl_lines if x.startswith("[round")] == ["[round 0/2", "[round 1/2", "[round 2/2"]
    assert any(x.startswith("results: ") and "final_model.safetensors" in x for x in hetfl_lines)
    if name == "fens":
        assert any(x.startswith("FENS phase 1: 4 clients train") for x in hetfl_lines)
        assert set(m["summary"]["references"]) >= {"FedENS (average)", "voting", "one-shot FedAvg"}
    if METHODS[name]["method"] == "adaptivefl":
        assert set(m["summary"]["final_members"]) >= {"S1", "M1", "L1"} and "waste_rate" in m["summary"]["final_panels"]
    # docs/inference.md: load, predict
    model = load_final_model(run / "final_model.safetensors", schema=SCHEMA)
    data = test_data(validate({**RUN, **METHODS[name]}))
    with torch.no_grad():
        pred = model(data.x).argmax(1).numpy()
    assert model.meta["method"] == METHODS[name]["method"] and model.meta["round"] == 2
    # trained, not a constant guess (chance: 0.1), so that a model loaded wrongly would not score the same
    assert m["summary"]["final_accuracy"] > 0.15 and len(set(pred.tolist())) >= 2
    assert np.mean(pred == data.y) == pytest.approx(m["summary"]["final_accuracy"], abs=1.5 / len(data.y))
