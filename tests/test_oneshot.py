"""FENS's one-shot baselines FedKD, Fed-ET and Co-Boosting (hetfl/oneshot_app; docs/readings.md#oneshot).

Unit tests work small cases by hand; the end-to-end tests run each method through the real ServerApp/ClientApp
code on the in-process grid (digits, 4 clients, a few server epochs).
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hetfl.common.comm import record_nbytes
from hetfl.common.config import ConfigError
from hetfl.methods import validate
from hetfl.common.task import make_model, model_to_arrays
from hetfl.oneshot_app.core import (Generator, adversarial_loss, fedet_loss, fedet_targets, fedkd_loss, fedkd_teacher,
                                    fedkd_weights, hard_sample_loss, kd_kl, ods_perturb, reweight_step, weighted_logits)

from .inprocess import run_in_process


# ---- FedKD -------------------------------------------------------------------------------------------------------
def test_fedkd_teacher_weights_each_class_by_the_members_label_counts():
    counts = np.array([[3, 0], [1, 2]])  # member 0 holds 3 of class 0; member 1 one of class 0, two of class 1
    z = torch.tensor([[[2.0, 4.0], [6.0, 8.0]]])  # one sample (N=1, M=2, C=2)
    w = fedkd_weights(counts, "class-counts")
    assert torch.allclose(w, torch.tensor([[0.75, 0.0], [0.25, 1.0]]))
    assert torch.allclose(fedkd_teacher(z, w), torch.tensor([[0.75 * 2 + 0.25 * 6, 8.0]]))
    # data-size: both hold 3 samples, so the plain mean
    assert torch.allclose(fedkd_teacher(z, fedkd_weights(counts, "data-size")), torch.tensor([[4.0, 6.0]]))
    # the authors' L1Loss: mean absolute difference over batch and classes
    assert fedkd_loss(torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, 8.0]]), "l1").item() == pytest.approx(4.0)
    s, t = torch.tensor([[0.0, 0.0]]), torch.tensor([[math.log(3.0), 0.0]])
    p = torch.softmax(t / 3, 1)
    kl = float((p * torch.log(p / 0.5)).sum()) * 9
    assert fedkd_loss(s, t, "kl").item() == pytest.approx(kl, rel=1e-5)


# ---- Fed-ET --------------------------------------------------------------------------------------------------------
def test_fedet_consensus_and_diversity_targets_by_hand():
    probs = torch.tensor([
        [[0.9, 0.1], [0.6, 0.4], [0.2, 0.8]],  # votes 0, 0, 1: majority 0, member 2 dissents
        [[0.7, 0.3], [0.8, 0.2], [0.6, 0.4]],  # all vote 0: no diversity target
    ])
    cons, div, has = fedet_targets(torch.log(probs))
    # confidence = variance of the softmax over the classes = ((p0 - p1) / 2)^2 for two classes: 0.16, 0.01, 0.09
    expected = (0.16 * torch.tensor([0.9, 0.1]) + 0.01 * torch.tensor([0.6, 0.4])) / 0.17
    assert torch.allclose(cons[0], expected, atol=1e-5)
    assert torch.allclose(div[0], torch.tensor([0.2, 0.8]), atol=1e-5)
    assert has.tolist() == [True, False]
    v = torch.tensor([0.04, 0.09, 0.01])  # the second sample: all three agree
    assert torch.allclose(cons[1], (v[:, None] * probs[1]).sum(0) / v.sum(), atol=1e-5)
    # the loss: KL(consensus || student) + lam KL(diversity || student) on dissenting samples only
    student = torch.zeros(2, 2)  # q = (1/2, 1/2)

    def kl(p):
        return float((p * torch.log(p / 0.5)).sum())

    assert fedet_loss(student, cons, div, has, 0.0).item() == pytest.approx((kl(cons[0]) + kl(cons[1])) / 2, rel=1e-5)
    extra = fedet_loss(student, cons, div, has, 0.5).item() - fedet_loss(student, cons, div, has, 0.0).item()
    assert extra == pytest.approx(0.5 * kl(torch.tensor([0.2, 0.8])) / 2, rel=1e-4)


def test_fedet_majority_tie_and_uniform_members():
    # two members, one vote each: the tie goes to the smaller label; uniform outputs (confidence 0) still average
    z = torch.tensor([[[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], [[0.0, 1.0, 0.0], [2.0, 0.0, 0.0]]])
    cons, div, has = fedet_targets(z)
    assert torch.allclose(cons[0], torch.full((3,), 1 / 3)) and not has[0]
    assert torch.allclose(cons[1], torch.softmax(z[1, 1], 0)) and torch.allclose(div[1], torch.softmax(z[1, 0], 0))


# ---- Co-Boosting ---------------------------------------------------------------------------------------------------
def test_coboost_reweighting_step_and_weighted_ensemble():
    w = torch.tensor([0.5, 0.5])
    # one step of size mu wdc^epoch against the gradient's sign
    assert torch.allclose(reweight_step(w, w, torch.tensor([2.0, -0.1]), mu=0.1, wdc=0.5, epoch=1), torch.tensor([0.45, 0.55]))
    # kept in [0, 1]
    out = reweight_step(torch.tensor([0.02, 0.98]), w, torch.tensor([1.0, -1.0]), mu=0.1, wdc=0.99, epoch=0)
    assert torch.allclose(out, torch.tensor([0.0, 1.0]))
    logits = torch.tensor([[[1.0, 0.0]], [[0.0, 4.0]]])  # (M=2, B=1, C=2)
    assert torch.allclose(weighted_logits(logits, torch.tensor([0.25, 0.25])), torch.tensor([[0.5, 2.0]]))
    assert torch.allclose(weighted_logits(logits, torch.tensor([0.3, 0.1])), torch.tensor([[0.75, 1.0]]))


def test_coboost_hard_sample_and_adversarial_terms():
    t = torch.log(torch.tensor([[0.75, 0.25], [0.5, 0.5]])).requires_grad_(True)
    y = torch.tensor([0, 1])
    loss = hard_sample_loss(t, y, hs=1.0)
    # (1 - p_y) CE: 0.25 * -log 0.75 and 0.5 * -log 0.5
    assert loss.item() == pytest.approx((0.25 * -math.log(0.75) + 0.5 * -math.log(0.5)) / 2, rel=1e-5)
    # the hardness factor is a constant: the gradient is (1 - p_y) times the cross-entropy's
    (g,) = torch.autograd.grad(loss, t)
    (g_ce,) = torch.autograd.grad(F.cross_entropy(t, y, reduction="none").mean(), t)
    assert torch.allclose(g, g_ce * torch.tensor([[0.25], [0.5]]), atol=1e-6)
    assert hard_sample_loss(t, y, hs=0.0).item() == pytest.approx(F.cross_entropy(t, y).item(), rel=1e-6)
    a, b = torch.randn(5, 3), torch.randn(5, 3)
    assert adversarial_loss(a, a).item() == pytest.approx(0.0, abs=1e-6)
    assert adversarial_loss(a, b).item() == pytest.approx(-kd_kl(a, b, 3.0).item()) and adversarial_loss(a, b).item() < 0


def test_coboost_ods_and_generator():
    W = torch.randn(6, 3)
    x = torch.randn(4, 6)
    out = ods_perturb(x, lambda v: v @ W, 0.1, torch.Generator().manual_seed(0))
    assert torch.allclose((out - x).abs(), torch.full_like(x, 0.1), atol=1e-6)  # every input moves by eta
    assert torch.equal(out, ods_perturb(x, lambda v: v @ W, 0.1, torch.Generator().manual_seed(0)))
    g = Generator(nz=16, channels=1, size=28, ngf=8)
    g.reset(torch.Generator().manual_seed(1))
    img = g(torch.randn(3, 16))
    assert img.shape == (3, 1, 28, 28) and img.min() >= 0 and img.max() <= 1
    w = g.l1.weight.clone()
    assert w.std().item() == pytest.approx(0.02, rel=0.1)
    g.reset(torch.Generator().manual_seed(1))
    assert torch.equal(g.l1.weight, w)


# ---- config ----------------------------------------------------------------------------------------------------
def test_fedkd_and_fedet_need_the_auxiliary_set():
    for method in ("fedkd", "fedet"):
        with pytest.raises(ConfigError, match="'server-holdout' = 0"):
            validate({"method": method})
    validate({"method": "fedkd", "server-holdout": 100})
    validate({"method": "coboost"})
    with pytest.raises(ConfigError, match="fedkd-epochs"):
        validate({"method": "fedet", "server-holdout": 100, "fedkd-epochs": 3})
    for method in ("coboost", "fedcvae"):  # no checkpoint to go on from: FedKD and Fed-ET keep one
        with pytest.raises(ConfigError, match="'resume'"):
            validate({"method": method, "resume": True})
        with pytest.raises(ConfigError, match="'stop-after-round' = 2"):
            validate({"method": method, "stop-after-round": 2})
    validate({"method": "fedkd", "server-holdout": 100, "resume": True, "stop-after-round": 2})


# ---- end to end ----------------------------------------------------------------------------------------------------
BASE = {"dataset": "digits", "data-source": "local", "partitioner": "dirichlet", "dirichlet-alpha": 1.0,
        "min-available-nodes": 4, "local-steps": 0, "local-epochs": 10, "batch-size": 32, "lr": 0.1,
        "max-test-samples": 0, "checkpoint": False, "seed": 1}
E2E = {
    "fedkd": ({"server-holdout": 400, "fedkd-epochs": 8, "fedkd-batch-size": 32, "fedkd-lr": 1e-2, "fedkd-lr-min": 1e-2}, 8, 0.2),
    "fedet": ({"server-holdout": 400, "fedet-epochs": 8, "fedet-batch-size": 32, "fedet-lr": 1e-2}, 8, 0.3),
    "coboost": ({"coboost-epochs": 8, "coboost-g-steps": 10, "coboost-batch-size": 64, "coboost-kd-lr": 0.1}, 8, 0.2),
}


@pytest.mark.parametrize("method", sorted(E2E))
def test_oneshot_method_end_to_end(method, tmp_path, task_identity, hetfl_lines):
    """Phase 1 on 4 clients, then the server's epochs: above chance (10%), rows per epoch, the bytes of one upload."""
    over, epochs, floor = E2E[method]
    cfg = {**BASE, "method": method, **over}
    m = run_in_process(cfg, 4, tmp_path, method)
    rows = m["rounds"]
    assert [r["round"] for r in rows] == list(range(epochs + 1))
    # the progress line counts the server's epochs, not num-server-rounds (3 by default, unused here)
    assert any(line.startswith(f"[round {epochs}/{epochs}] ") for line in hetfl_lines), [x for x in hetfl_lines if "[round" in x]
    assert rows[-1]["accuracy"] > floor, [r["accuracy"] for r in rows]
    ph = m["phases"]
    assert ph["num_models"] == 4 and ph["member_client_ids"] == [0, 1, 2, 3] and ph["teacher_test_accuracy"] > 0.3
    # what travels: the initial model down and the trained model up, once per client, and nothing after round 0
    model_bytes = record_nbytes(model_to_arrays(make_model(validate(cfg))))
    assert 4 * model_bytes <= ph["upload_bytes"] <= 4 * (model_bytes + 2048)
    assert 4 * model_bytes <= ph["phase1_request_bytes"] <= 4 * (model_bytes + 2048)
    assert rows[0]["bytes_up"] >= ph["upload_bytes"] and rows[0]["bytes_down"] >= ph["phase1_request_bytes"]
    assert rows[0]["clients"] == [0, 1, 2, 3]
    assert all(r["bytes_up"] == 0 and r["bytes_down"] == 0 for r in rows[1:])
    if method == "coboost":
        w = ph["member_weights"]
        assert len(w) == 4 and all(0 <= v <= 1 for v in w) and w != [0.25] * 4  # re-weighted from uniform
    else:
        assert ph["auxiliary_samples"] == 400


# ---- phase 1 saved and reused (docs/readings.md#fens-artifacts) ----------------------------------------------------
KD = {**BASE, "method": "fedkd", "server-holdout": 400, "fedkd-epochs": 2, "fedkd-batch-size": 64, "fedkd-lr": 1e-2}
ET = {**BASE, "method": "fedet", "server-holdout": 400, "fedet-epochs": 2, "fedet-batch-size": 64, "fedet-lr": 1e-2}


def test_reused_phase1_gives_the_fresh_run_and_reports_the_training_runs_bytes(tmp_path, task_identity, monkeypatch):
    """FedKD and Fed-ET train the same local models (same keys, same seeds); a Fed-ET run that starts from FedKD's
    saved ensemble equals a fresh Fed-ET run row for row and reports the phase-1 bytes and times of FedKD's run."""
    from hetfl.common.oneshot.artifacts import ENSEMBLE, load_ensemble

    kd = run_in_process(KD, 4, tmp_path, "kd")
    fresh = run_in_process(ET, 4, tmp_path, "et")
    a, b = load_ensemble(tmp_path / "kd" / ENSEMBLE), load_ensemble(tmp_path / "et" / ENSEMBLE)
    assert a.client_ids == b.client_ids == [0, 1, 2, 3] and a.settings == b.settings
    assert all(np.array_equal(x[k], y[k]) for x, y in zip(a.states, b.states, strict=True) for k in x)
    assert np.array_equal(a.label_counts, b.label_counts) and a.num_examples == b.num_examples

    import hetfl.common.oneshot.client as fc

    monkeypatch.setattr(fc, "local_train", lambda *a, **k: pytest.fail("phase 1 trained again"))
    reused = run_in_process({**ET, "oneshot-reuse": str(tmp_path / "kd")}, 4, tmp_path, "et-reused")
    rows = lambda m: [(r["round"], r["accuracy"], r["loss"], r["val_accuracy"]) for r in m["rounds"]]  # noqa: E731
    assert rows(reused) == rows(fresh) and len(rows(fresh)) == 3
    assert fresh["phases"]["teacher_test_accuracy"] > 0.3 and len({r[1] for r in rows(fresh)}) == 3  # it learns
    for k in ("teacher_test_accuracy", "member_test_accuracy", "auxiliary_samples"):
        assert reused["phases"][k] == fresh["phases"][k], k
    # honest accounting: phase 1's bytes and times are those measured by the run that trained the ensemble
    for k in ("upload_bytes", "phase1_request_bytes", "phase1_wall_s", "phase1_client_train_s", "phase1_comm_s"):
        assert reused["phases"][k] == kd["phases"][k], k
    assert reused["phases"]["upload_bytes"] > 0 and reused["phases"]["phase1_wall_s"] > 0
    assert reused["phase1_reused_from"] == reused["phases"]["phase1_reused_from"] == str(tmp_path / "kd" / ENSEMBLE)
    assert "phase1_reused_from" not in fresh
    r0 = lambda m: m["rounds"][0]["bytes_up"] - m["phases"]["upload_bytes"]  # noqa: E731  (node discovery)
    assert reused["rounds"][0]["bytes_up"] >= reused["phases"]["upload_bytes"] and 0 <= r0(reused) < 4096
    assert abs(reused["summary"]["total_bytes_up"] - fresh["summary"]["total_bytes_up"]) < 4096  # discovery differs by node-id varints
    assert abs(reused["summary"]["total_bytes_down"] - fresh["summary"]["total_bytes_down"]) < 4096
    assert all(m["phases"]["server_step_s"] > 0 for m in (kd, fresh, reused))
    assert not list((tmp_path / "et-reused").glob("ensemble*"))  # a reusing run keeps no copy
    # a source with other phase-1 settings is refused at pre-flight in one line naming the setting
    from hetfl.launch import preflight

    src = str(tmp_path / "kd")
    with pytest.raises(ConfigError, match=r"^run-config key 'oneshot-reuse' = '.*kd': its ensemble was trained with "
                                          r"run-config key 'server-holdout' = 400 and this run has 0; expected"):
        preflight({**BASE, "method": "coboost", "oneshot-reuse": src})
    for k, v in (("seed", 2), ("local-epochs", 3), ("lr", 0.05), ("dirichlet-alpha", 0.5), ("batch-size", 16),
                 ("partition-seed", 1), ("model", "resnet8")):
        with pytest.raises(ConfigError, match=f"trained with run-config key '{k}' = "):
            preflight({**ET, k: v, "oneshot-reuse": src})
    with pytest.raises(ConfigError, match="trained with 'clients' = 4 and this run has 3"):  # known after discovery
        run_in_process({**ET, "oneshot-reuse": src, "min-available-nodes": 3}, 3, tmp_path, "three")
    with pytest.raises(ConfigError, match="'oneshot-reuse' = .*: no ensemble there"):
        preflight({**ET, "oneshot-reuse": str(tmp_path / "nowhere")})
    with pytest.raises(ConfigError, match="'oneshot-reuse' = .* is not read by method 'fens'"):
        validate({"method": "fens", "oneshot-reuse": src}, given=["method", "oneshot-reuse"])


def test_a_distillation_stopped_after_an_epoch_resumes_to_the_uninterrupted_run(tmp_path, task_identity, monkeypatch):
    """FedKD and Fed-ET checkpoint after every server epoch: a run ended after epoch 2 (``stop-after-round``) and
    resumed ends with the uninterrupted run's rows and student, bit for bit, without training phase 1 again (its own
    ensemble, or the one it reused)."""
    from safetensors.numpy import load_file

    kd = {**KD, "fedkd-epochs": 5, "fedkd-lr-min": 1e-3, "checkpoint": True}
    whole = run_in_process(kd, 4, tmp_path, "whole")
    part = run_in_process({**kd, "stop-after-round": 2}, 4, tmp_path, "part")
    assert [r["round"] for r in part["rounds"]] == [0, 1, 2] and (tmp_path / "part" / "checkpoint.json").exists()

    import hetfl.common.oneshot.client as fc

    monkeypatch.setattr(fc, "local_train", lambda *a, **k: pytest.fail("phase 1 trained again"))
    resumed = run_in_process({**kd, "resume": True}, 4, tmp_path, "part")
    rows = lambda m: [(r["round"], r["accuracy"], r["loss"], r["val_accuracy"]) for r in m["rounds"]]  # noqa: E731
    assert rows(resumed) == rows(whole) and len({r[1] for r in rows(whole)}) > 2  # it learns
    final = lambda d: load_file(tmp_path / d / "final_model.safetensors")  # noqa: E731
    assert all(np.array_equal(final("whole")[k], v) for k, v in final("part").items())
    assert resumed["phases"]["server_step_s"] > part["phases"]["server_step_s"] > 0  # both starts' seconds
    assert [m["from_round"] for m in resumed["machines"]] == [0, 3]

    # Fed-ET from FedKD's ensemble (oneshot-reuse: no copy in its folder) goes on from that one
    et = {**ET, "fedet-epochs": 4, "checkpoint": True, "oneshot-reuse": str(tmp_path / "whole")}
    et_whole = run_in_process(et, 4, tmp_path, "et-whole")
    run_in_process({**et, "stop-after-round": 1}, 4, tmp_path, "et-part")
    et_resumed = run_in_process({**et, "resume": True}, 4, tmp_path, "et-part")
    assert rows(et_resumed) == rows(et_whole) and len(rows(et_whole)) == 5


def test_reuse_check_reads_the_settings_only_at_preflight_and_never_in_a_clientapp(tmp_path, monkeypatch):
    """The check reads ensemble.json's settings, not its tensors (here deleted, and reading them fails the test), at
    pre-flight; a ClientApp parses the config on every message on a host that may lack the path: no check there."""
    from flwr.app import Context, RecordDict

    import hetfl.common.checkpoint as ckpt
    import hetfl.common.oneshot.artifacts as art
    from hetfl.common.task import config_of
    from hetfl.methods import SCHEMA
    from hetfl.common.oneshot.ensemble import Ensemble
    from hetfl.launch import preflight
    from hetfl.oneshot_app import PHASE1

    ens = Ensemble([{"w": np.ones((2, 3), np.float32)}], [0], np.ones((1, 10), np.int64), [1], {"upload_bytes": 1},
                   art.phase1_settings(validate(ET), PHASE1, 4))
    (tmp_path / "src").mkdir()
    art.save_ensemble(tmp_path / "src", ens)
    for f in (tmp_path / "src").glob("*.safetensors"):
        f.unlink()
    for mod in (ckpt, art):
        monkeypatch.setattr(mod, "read_checkpoint", lambda *a, **k: pytest.fail("the ensemble's tensors were read"))
    reuse = {**ET, "oneshot-reuse": str(tmp_path / "src")}
    assert preflight(reuse)["oneshot-reuse"] == str(tmp_path / "src")
    with pytest.raises(ConfigError, match=r"'oneshot-reuse' = .*src': its ensemble was trained with run-config key "
                                          r"'seed' = 1 and this run has 5"):
        preflight({**reuse, "seed": 5})
    elsewhere = {**ET, "oneshot-reuse": str(tmp_path / "on-the-server-host-only")}
    with pytest.raises(ConfigError, match="no ensemble there"):
        preflight(elsewhere)
    for run_config in (elsewhere, {**reuse, "seed": 5}):  # what a ClientApp and the ServerApp's parse see: no check
        ctx = Context(run_id=1, node_id=1, node_config={"partition-id": 0, "num-partitions": 4}, state=RecordDict(),
                      run_config=run_config)
        assert config_of(ctx, SCHEMA)["oneshot-reuse"] == run_config["oneshot-reuse"]
        assert validate(run_config)["oneshot-reuse"] == run_config["oneshot-reuse"]


def test_phase1_settings_name_what_trains_the_models():
    """FENS's phase 1 (90% split) and the one-shot baselines' (all data) never stand for each other; keys outside
    phase 1 (the server step, devices) do not matter; `clients` is compared only when both sides know it."""
    from hetfl.common.oneshot.artifacts import mismatch, phase1_settings
    from hetfl.fens_app import LOCAL as FENS_LOCAL, PHASE1 as FENS_PHASE1
    from hetfl.oneshot_app import LOCAL, PHASE1

    kd = validate(KD)
    ours = phase1_settings(kd, PHASE1, clients=4)
    assert mismatch(ours, phase1_settings(validate(ET), PHASE1), PHASE1) is None  # clients: unknown at pre-flight
    assert mismatch(ours, phase1_settings(validate({**KD, "fedkd-epochs": 9, "torch-device": "cpu"}), PHASE1, 4), PHASE1) is None
    fens = phase1_settings(validate({**KD, "method": "fens", "server-holdout": 400} | {k: v for k, v in KD.items()
                                    if not k.startswith("fedkd")}), FENS_PHASE1, 4)
    assert mismatch(ours, fens, PHASE1) == ("phase1-message", LOCAL, FENS_LOCAL)
    assert "fens-local-fraction" in fens and "fens-local-fraction" not in ours
    assert mismatch(ours, {**ours, "clients": 5}, PHASE1) == ("clients", 4, 5)
    assert mismatch(ours, {k: v for k, v in ours.items() if k != "augment"}, PHASE1) is None  # a key an old run did not store
