"""FENS as the authors run it: their FedAdam step, aggregator starts, voting, ResNet-8, resume and reuse.

docs/readings.md#fens
"""

import json

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from hetfl.common.hosting import state_key
from hetfl.common.fedopt import SeededFedAdam, adam_server_step
from hetfl.common.config import ConfigError
from hetfl.methods import validate
from hetfl.common.models import build_model, count_parameters
from hetfl.common.rounds import CHECKPOINT, load_checkpoint
from hetfl.fens_app.aggregators import competencies, confusion_counts, make_aggregator

from .inprocess import run_in_process

from .conftest import identity_map, replies_to


def test_adam_server_step_hand_worked():
    x, m, v = np.array([1.0]), np.array([0.1]), np.array([0.04])
    # authors: no bias correction, x + eta m / (sqrt v + tau) = 1 + 0.5 * 0.1 / (0.2 + 0.05)
    assert np.allclose(adam_server_step(x, m, v, 0.5, 0.05, 0.9, 0.99), 1.2)
    # Flower: eta_t = eta sqrt(1 - b2^(t+1)) / (1 - b1^(t+1)); t = 1: 0.5 * sqrt(1 - 0.99^2) / (1 - 0.9^2)
    eta_t = 0.5 * np.sqrt(1 - 0.99**2) / (1 - 0.9**2)
    assert np.allclose(adam_server_step(x, m, v, 0.5, 0.05, 0.9, 0.99, server_round=1), 1 + eta_t * 0.1 / 0.25)
    assert not np.allclose(eta_t, 0.5)  # the two updates differ


def _content(arrays: dict, n: int) -> RecordDict:
    return RecordDict({"arrays": ArrayRecord({k: Array(np.asarray(v, np.float32)) for k, v in arrays.items()}),
                       "metrics": MetricRecord({"num-examples": n})})


@pytest.mark.parametrize("update", ["authors", "flower"])
def test_fedadam_strategy_applies_the_chosen_step_with_weighted_deltas(update, task_identity):
    x0 = {"w": np.array([0.0, 1.0], np.float32)}
    s = SeededFedAdam(eta=0.1, eta_l=1.0, beta_1=0.9, beta_2=0.99, tau=1e-3, bias_correction=update == "flower")
    s.current_arrays = {k: v.copy() for k, v in x0.items()}
    s._reference = {"w": (2,)}  # what configure_train records for the reply validator
    s.bind(identity_map([0, 1]), 0).sampled = [0, 1]
    replies = replies_to(s.map, {0: _content({"w": [1.0, 1.0]}, 3), 1: _content({"w": [0.0, 3.0]}, 1)})  # mean [0.75, 1.5]
    out, _ = s.aggregate_train(1, replies)
    delta = np.array([0.75, 0.5])
    m, v = 0.1 * delta, 0.01 * delta**2
    expected = adam_server_step(x0["w"], m, v, 0.1, 1e-3, 0.9, 0.99, None if update == "authors" else 1)
    assert np.allclose(out["w"].numpy(), expected, atol=1e-6)
    assert out["w"].numpy().dtype == np.float32


@pytest.mark.parametrize("method", ["fedadam", "fedyogi"])
def test_server_optimizers_average_batchnorm_statistics_and_step_the_weights(method, task_identity):
    """FedAdam's and FedYogi's adaptive step moves the parameters; BatchNorm's running mean/var and batch count become
    the clients' weighted mean, as in FedAvg (docs/training.md#server-optimizers-batchnorm-statistics-are-averaged)."""
    from hetfl.common.fedopt import SeededFedYogi, is_buffer

    assert is_buffer("features.1.running_var") and is_buffer("bn.num_batches_tracked") and not is_buffer("bn.weight")
    x0 = {"w": np.array([0.0, 1.0], np.float32), "bn.running_var": np.array([1.0, 1.0], np.float32),
          "bn.num_batches_tracked": np.array(4, np.int64)}
    kw = dict(eta=0.1, eta_l=1.0, beta_1=0.9, beta_2=0.99, tau=1e-3)
    s = SeededFedAdam(**kw, bias_correction=False) if method == "fedadam" else SeededFedYogi(**kw)
    s.current_arrays = {k: v.copy() for k, v in x0.items()}
    s._reference = {k: np.shape(v) for k, v in x0.items()}
    s.bind(identity_map([0, 1]), 0).sampled = [0, 1]

    def content(w, var, n):
        return RecordDict({"arrays": ArrayRecord({"w": Array(np.asarray(w, np.float32)),
                                                  "bn.running_var": Array(np.asarray(var, np.float32)),
                                                  "bn.num_batches_tracked": Array(np.array(10, np.int64))}),
                           "metrics": MetricRecord({"num-examples": n})})

    # weighted (3:1) means: w [0.75, 1.5], running_var [0.4, 2.2]
    out, _ = s.aggregate_train(1, replies_to(s.map, {0: content([1.0, 1.0], [0.2, 2.0], 3),
                                                     1: content([0.0, 3.0], [1.0, 2.8], 1)}))
    assert np.allclose(out["bn.running_var"].numpy(), [0.4, 2.2], atol=1e-6)  # the mean, not a step towards it
    assert out["bn.running_var"].numpy().dtype == np.float32
    assert int(out["bn.num_batches_tracked"].numpy()) == 10 and out["bn.num_batches_tracked"].numpy().dtype == np.int64
    w = out["w"].numpy()
    assert not np.allclose(w, [0.75, 1.5], atol=1e-3) and np.all(np.sign(w - x0["w"]) == [1, 1])  # stepped, not averaged


def test_aggregator_starts_like_the_authors():
    M, C = 20, 10
    pc = make_aggregator("per-class", M, C, seed=1)
    bound = (6 / (M + C)) ** 0.5  # Xavier on an (M, C) matrix
    w = pc.weight.detach()
    assert w.abs().max() <= bound and w.std() > bound / 3  # spread over the whole range, not 1/M
    assert torch.equal(w, make_aggregator("per-class", M, C, seed=1).weight.detach())  # seeded
    assert not torch.equal(w, make_aggregator("per-class", M, C, seed=2).weight.detach())
    lin = make_aggregator("linear", M, C, seed=1)
    assert lin.weight.abs().max() <= (6 / (M + 1)) ** 0.5 and lin.bias.item() == 1.0
    z = torch.randn(4, M, C)
    assert torch.allclose(lin(z), torch.einsum("nmc,m->nc", z, lin.weight) + 1.0)


def test_voting_hand_made_case():
    # 3 classes, 2 clients. Client 0 confuses classes 0 and 1 (predicts 0 for both); client 1 tells them apart
    # but never saw class 2.
    conf0 = np.array([[10, 0, 0], [10, 0, 0], [0, 0, 10]])
    conf1 = np.array([[9, 1, 0], [1, 9, 0], [0, 0, 0]])
    comp = competencies(np.stack([conf0, conf1]))
    assert np.allclose(comp[0], [[1, 0, 0], [1, 0, 0], [0, 0, 1]])
    assert np.allclose(comp[1], [[0.9, 0.1, 0], [0.1, 0.9, 0], [0.5, 0.5, 0]])  # unseen class: 1/(seen classes)
    agg = make_aggregator("voting", 2, 3, confusion=np.stack([conf0, conf1]))

    def logits(*preds):  # member i predicts preds[i]
        z = torch.full((1, 2, 3), -5.0)
        for i, p in enumerate(preds):
            z[0, i, p] = 5.0
        return z

    # client 0 says 0, client 1 says 1: P(0,1 | 0) = 1 * 0.1, P(0,1 | 1) = 1 * 0.9, P(0,1 | 2) = 0 -> class 1
    assert agg(logits(0, 1)).argmax().item() == 1
    assert agg(logits(0, 0)).argmax().item() == 0  # 0.9 vs 0.1
    # client 0 says 2 (competent there), client 1 says 0: P(.|0) = 0, P(.|1) = 0, P(.|2) = 1 * 0.5 -> class 2
    assert agg(logits(2, 0)).argmax().item() == 2
    assert np.array_equal(confusion_counts(np.array([[0.0, 2.0], [3.0, 1.0]]), np.array([1, 1]), 2), [[0, 0], [1, 1]])


def test_resnet8_is_fedkd_network():
    m = build_model("resnet8", 10, (3, 32, 32))
    assert 4.85e6 < count_parameters(m) < 4.95e6  # 128-256-512 channels, 2048-wide head
    assert m.fc.in_features == 2048 and m.conv1.out_channels == 128


def test_train_aggregator_weights_by_samples_seen(task_identity):
    from hetfl.fens_app.client_app import CACHE, train_aggregator

    for update, expected in (("authors", 32), ("flower", 100)):
        cfg = validate({"method": "fens", "dataset": "digits", "fens-agg-batch-size": 32, "fens-agg-local-steps": 1, "fedadam-update": update})
        ctx = Context(run_id=1, node_id=1, node_config={"partition-id": 0, "num-partitions": 1}, state=RecordDict(),
                      run_config=cfg)
        rng = np.random.default_rng(0)
        ctx.state[state_key(0, CACHE)] = ArrayRecord({"z": Array(rng.normal(size=(100, 3, 10)).astype(np.float32)),
                                        "y": Array(rng.integers(0, 10, 100))})
        agg = make_aggregator("nn", 3, 10, seed=0)
        msg = Message(RecordDict({"arrays": ArrayRecord({k: Array(v.detach().numpy()) for k, v in agg.state_dict().items()}),
                                  "config": ConfigRecord({"server-round": 1})}), dst_node_id=1, message_type="train")
        out = train_aggregator(msg, ctx, cfg)
        assert out.content["metrics"]["num-examples"] == expected, update  # authors: min(n_i, batch x steps)


# the mechanics (resume, reuse, initial model) on scikit-learn's digits: each member's logits over a client's data are
# the cost of a FENS run, and on FMNIST they made these three tests take ~2 min instead of ~12 s
FENS = {"method": "fens", "dataset": "digits", "data-source": "local", "partitioner": "dirichlet",
        "dirichlet-alpha": 0.3, "min-available-nodes": 4, "fraction-train": 1.0, "local-steps": 4, "local-epochs": 1,
        "batch-size": 16, "max-test-samples": 400, "eval-split": "test-half", "num-server-rounds": 4,
        "fens-local-fraction": 0.9, "fens-agg-server-lr": 0.01}


def test_resume_continues_phase2_on_the_same_ensemble(tmp_path, task_identity):
    """Stop after aggregator round 2, resume: the same rows as an uninterrupted run, and phase 1 never runs again."""
    full = run_in_process(FENS, 4, tmp_path, "full")
    run_in_process({**FENS, "stop-after-round": 2}, 4, tmp_path, "part")
    # a resumed run that trained phase 1 again would fail: local training is switched off here
    import hetfl.common.oneshot.client as fc

    calls = []
    real = fc.local_train
    fc.local_train = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        part = run_in_process({**FENS, "resume": True}, 4, tmp_path, "part")
    finally:
        fc.local_train = real
    assert calls == []
    assert "phase1_reused_from" not in part  # its own phase 1, trained by its first start: no reuse
    rows = lambda m: [(r["round"], r["accuracy"], r["loss"], r["bytes_down"], r["bytes_up"]) for r in m["rounds"]]  # noqa: E731
    assert rows(part) == rows(full)
    assert part["resume_download_bytes"] > 0  # the ensemble was sent again, outside the aggregator rounds
    a, b = (load_checkpoint(tmp_path / n / CHECKPOINT) for n in ("full", "part"))
    for k in a["arrays"]:
        assert np.array_equal(a["arrays"][k], b["arrays"][k]), k


def test_legacy_ensemble_artifact_takes_its_settings_from_the_run_that_trained_it(tmp_path):
    """An ensemble saved without settings (before they were stored) is judged by the config of the run that trained
    it: the metrics.json beside it, or, for the copy a reusing run kept (its phase1_reused_from names another file),
    the ensemble it names; refused when that one is not there. Only the JSON is read."""
    from hetfl.common.oneshot.artifacts import ENSEMBLE, check_reuse, ensemble_settings, phase1_settings, save_ensemble
    from hetfl.common.oneshot.ensemble import Ensemble
    from hetfl.fens_app import PHASE1

    def ensemble(settings: dict) -> Ensemble:
        return Ensemble([{"w": np.ones(3, np.float32)}], [0], np.ones((1, 10), np.int64), [1], {}, settings)

    def run(name: str, settings: dict, metrics: dict | None) -> None:
        (tmp_path / name).mkdir()
        save_ensemble(tmp_path / name, ensemble(settings))
        if metrics is not None:
            (tmp_path / name / "metrics.json").write_text(json.dumps(metrics))

    trained = validate({**FENS, "seed": 0})
    run("train", {}, {"config": trained})  # the legacy training run: its settings from its own config
    # the legacy copy of a run that reused "train" with another seed (no check then): not its own config
    run("copy", {}, {"config": {**trained, "seed": 7}, "phase1_reused_from": str(tmp_path / "train" / ENSEMBLE)})
    run("copy2", {}, {"config": {**trained, "seed": 8}, "phase1_reused_from": str(tmp_path / "copy" / ENSEMBLE)})
    run("lost", {}, {"config": trained, "phase1_reused_from": str(tmp_path / "gone" / ENSEMBLE)})
    run("resumed", {}, {"config": trained, "phase1_reused_from": str(tmp_path / "resumed" / ENSEMBLE)})  # its own
    want = phase1_settings(trained, PHASE1)
    for name in ("train", "copy", "copy2", "resumed"):
        assert ensemble_settings(tmp_path / name / ENSEMBLE, PHASE1) == want, name
        assert check_reuse({**trained, "fens-reuse": str(tmp_path / name)}, "fens-reuse", PHASE1) == tmp_path / name / ENSEMBLE
    with pytest.raises(ConfigError, match="'seed' = 0 and this run has 7"):
        check_reuse({**trained, "seed": 7, "fens-reuse": str(tmp_path / "copy")}, "fens-reuse", PHASE1)
    assert ensemble_settings(tmp_path / "lost" / ENSEMBLE, PHASE1) == {}
    with pytest.raises(ConfigError, match="records no phase-1 settings"):
        check_reuse({**trained, "fens-reuse": str(tmp_path / "lost")}, "fens-reuse", PHASE1)


def test_reuse_trains_other_aggregators_on_a_saved_ensemble(tmp_path, task_identity):
    first = run_in_process({**FENS, "num-server-rounds": 1}, 4, tmp_path, "first")
    second = run_in_process({**FENS, "fens-aggregator": "per-class", "fens-reuse": str(tmp_path / "first")}, 4, tmp_path, "second")
    assert second["phase1_reused_from"].endswith("ensemble.json")
    assert second["static_aggregators_test_accuracy"] == first["static_aggregators_test_accuracy"]  # same models
    assert second["phases"]["upload_bytes"] == first["phases"]["upload_bytes"]  # the training run's measured bytes
    assert second["config"]["fens-aggregator"] == "per-class" and len(second["rounds"]) == 5
    assert (tmp_path / "second" / "ensemble.json").is_file()  # FENS keeps a copy: a resume of "second" finds it
    from hetfl.launch import preflight

    with pytest.raises(ConfigError, match="fens-reuse"):
        preflight({"method": "fens", "fens-reuse": str(tmp_path / "nowhere")})
    validate({"method": "fens", "fens-reuse": str(tmp_path / "nowhere")})  # a ClientApp's parse: not checked there
    # another phase 1 is refused in one line (the check the one-shot baselines' oneshot-reuse shares)
    with pytest.raises(ConfigError, match=r"'fens-reuse' = .*: its ensemble was trained with run-config key "
                                          r"'fens-local-fraction' = 0.9 and this run has 0.8; expected"):
        preflight({**FENS, "fens-local-fraction": 0.8, "fens-reuse": str(tmp_path / "first")})
    # an ensemble saved before the settings were stored takes them from its run's metrics.json
    from hetfl.common.oneshot.artifacts import ENSEMBLE, load_ensemble, save_ensemble

    old = load_ensemble(tmp_path / "first" / ENSEMBLE)
    assert old.settings["phase1-message"] == "train.fens_local" and old.settings["clients"] == 4
    old.settings = {}
    (tmp_path / "old").mkdir()
    save_ensemble(tmp_path / "old", old)
    with pytest.raises(ConfigError, match="records no phase-1 settings"):
        preflight({**FENS, "fens-reuse": str(tmp_path / "old")})
    (tmp_path / "old" / "metrics.json").write_text((tmp_path / "first" / "metrics.json").read_text())
    preflight({**FENS, "fens-reuse": str(tmp_path / "old")})
    with pytest.raises(ConfigError, match="'seed' = 0 and this run has 3"):
        preflight({**FENS, "seed": 3, "fens-reuse": str(tmp_path / "old")})
    # the sweep command: other aggregators on the same ensemble, one table
    from scripts.fens_sweep import main as sweep_main

    assert sweep_main([str(tmp_path / "first"), "--aggregators", "linear", "nn", "--set", "num-server-rounds=2"]) == 0
    rows = json.loads((tmp_path / "first" / "sweep" / "table-num-server-rounds2.json").read_text())
    assert [r["aggregator"] for r in rows[:2]] == ["linear", "nn"] and all(r["rounds"] == 2 for r in rows[:2])
    assert {r["aggregator"] for r in rows[2:]} >= {"FedENS (averaging)", "polychotomous voting"}
    statics = {r["aggregator"]: r["final"] for r in rows[2:]}
    assert statics["FedENS (averaging)"] == first["static_aggregators_test_accuracy"]["average"]
    assert sweep_main([str(tmp_path / "first"), "--set", "fens-agg-server-lr=-1"]) == 2  # one line, nothing runs


def test_phase1_sends_the_initial_model_unless_diff_init(tmp_path, task_identity):
    common = run_in_process({**FENS, "num-server-rounds": 1, "fens-aggregator": "average"}, 4, tmp_path, "common")
    diff = run_in_process({**FENS, "num-server-rounds": 1, "fens-aggregator": "average", "fens-diff-init": True}, 4, tmp_path, "diff")
    model_bytes = common["phases"]["upload_bytes"] / 4
    assert common["phases"]["phase1_request_bytes"] > 4 * 0.99 * model_bytes  # counted: 4 initial downloads
    assert diff["phases"]["phase1_request_bytes"] < 0.01 * model_bytes
    assert common["rounds"][0]["bytes_down"] - diff["rounds"][0]["bytes_down"] == pytest.approx(
        common["phases"]["phase1_request_bytes"] - diff["phases"]["phase1_request_bytes"])
    json.dumps(diff)
