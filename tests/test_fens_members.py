"""FENS members trained to completion (fens-member-val-fraction / fens-member-patience): the epoch count each client
keeps is chosen on a carve-out of its own local split, never on the server's data."""

from __future__ import annotations

import numpy as np

from hetfl.common.models import build_model
from hetfl.common.train import Normalizer, evaluate, train
from hetfl.data.arrays import ArrayData
from hetfl.data.load import local_arrays


def _digits(n: int) -> ArrayData:
    train_split = local_arrays("digits")[0]
    return ArrayData(train_split.x[:n], train_split.y[:n])


def test_a_true_epoch_end_stops_training_after_that_epoch():
    data, seen = _digits(64), []
    model = build_model("cnn", 10, (1, 8, 8))

    def stop_after_second(epoch: int) -> bool:
        seen.append(epoch)
        return epoch == 1

    res = train(model, data, Normalizer("digits"), epochs=5, batch_size=16, epoch_end=stop_after_second)
    assert seen == [0, 1] and res.steps == 2 * 4  # 64 rows / 16 = 4 steps an epoch, two epochs


def test_best_epoch_training_keeps_the_best_validation_epoch(monkeypatch):
    from hetfl.methods import validate
    from hetfl.common.oneshot import client as client_app

    cfg = validate({"method": "fens", "dataset": "digits", "model": "cnn", "local-steps": 0, "local-epochs": 6,
                    "batch-size": 16, "lr": 0.05, "fens-member-val-fraction": 0.25, "fens-member-patience": 2})
    fit, val = _digits(200), ArrayData(_digits(300).x[200:], _digits(300).y[200:])
    scores: list[tuple[float, float]] = []  # (accuracy, loss) after each epoch
    real = client_app.local_train

    def spy(model, data, cfg_, server_round, **kw):
        hook = kw["epoch_end"]

        def wrapped(epoch):
            loss, acc = evaluate(model, val, Normalizer("digits"), 256)
            scores.append((acc, loss))
            return hook(epoch)

        return real(model, data, cfg_, server_round, **{**kw, "epoch_end": wrapped})

    monkeypatch.setattr(client_app, "local_train", spy)
    model = build_model("cnn", 10, (1, 8, 8))
    _, epochs = client_app.best_epoch_training(model, fit, val, cfg, pid=0, patience=2)
    assert 1 <= epochs <= 6 and len(scores) <= 6
    best = max(range(len(scores)), key=lambda e: (scores[e][0], -scores[e][1], -e))  # accuracy, then loss, then earliest
    assert epochs == best + 1
    assert evaluate(model, val, Normalizer("digits"), 256)[1] == scores[best][0]  # the model is that epoch's
    # patience 2: training stopped two epochs after the best one, or at the last epoch
    assert len(scores) == min(6, best + 3)


def test_a_tie_in_validation_accuracy_goes_to_the_lower_loss():
    """At Dir(0.01) a client's held-out rows are one class: accuracy is 1.0 from the first epoch on, and only the
    loss tells a better-trained model (hand-worked: the third epoch's 1.0 / 0.05 beats the first's 1.0 / 0.4)."""
    from hetfl.common.oneshot.client import better_epoch

    history = [(1.0, 0.40), (1.0, 0.10), (1.0, 0.05), (1.0, 0.07), (0.9, 0.01)]
    best = (-1.0, float("inf"), -1)
    for e, (acc, loss) in enumerate(history):
        if better_epoch(acc, loss, best[0], best[1]):
            best = (acc, loss, e)
    assert best == (1.0, 0.05, 2)
    assert better_epoch(0.8, 9.0, 0.7, 0.1)  # accuracy first
    assert not better_epoch(1.0, 0.05, 1.0, 0.05)  # an equal epoch does not replace the earlier one


def test_ensemble_logits_are_cached_by_content(tmp_path, monkeypatch):
    """A study's trials on one saved ensemble compute the same logits once: cached by the ensemble's and the data's
    content; another ensemble or other data is another entry."""
    import torch

    from hetfl.common.models import get_state
    from hetfl.common.oneshot import ensemble as core

    torch.manual_seed(0)
    models = [build_model("cnn", 10, (1, 8, 8)) for _ in range(2)]
    data, norm = _digits(50), Normalizer("digits")
    digest = core.states_digest([get_state(m) for m in models])
    want = core.ensemble_logits(models, data, norm)
    first = core.cached_logits(models, digest, data, norm, str(tmp_path))
    assert np.array_equal(first.x, want) and np.array_equal(first.y, data.y) and first.x.shape == (50, 2, 10)
    calls = []
    monkeypatch.setattr(core, "ensemble_logits", lambda *a, **k: calls.append(1) or want)
    assert np.array_equal(core.cached_logits(models, digest, data, norm, str(tmp_path)).x, want) and not calls
    other = core.states_digest([get_state(models[1]), get_state(models[0])])  # another ensemble (order matters)
    assert other != digest
    core.cached_logits(models, other, data, norm, str(tmp_path))
    core.cached_logits(models, digest, _digits(60), norm, str(tmp_path))  # other data
    assert len(calls) == 2 and len(list((tmp_path / "fens-logits").glob("*.npz"))) == 3


def test_the_one_shot_baselines_train_their_members_to_completion_as_fens_does(monkeypatch):
    """FedKD / Fed-ET / Co-Boosting's phase 1 reads oneshot-member-val-fraction and -patience (FENS's budget for its
    members, given to the baselines it is compared with) and passes them to the shared phase-1 handler; a saved
    ensemble trained otherwise is a different phase 1 (not reused)."""
    from hetfl.methods import validate
    from hetfl.common.oneshot.artifacts import mismatch, phase1_settings
    from hetfl.oneshot_app import PHASE1, client_app

    seen = []
    monkeypatch.setattr(client_app, "message_client", lambda msg, context, cfg: 3)
    monkeypatch.setattr(client_app, "client_data", lambda context, cfg, pid: "data")
    monkeypatch.setattr(client_app, "train_and_upload", lambda *a: seen.append(a[3:]) or "reply")
    base = {"dataset": "digits", "model": "cnn", "server-holdout": 300}
    done = validate({**base, "method": "fedkd", "oneshot-member-val-fraction": 0.1, "oneshot-member-patience": 5})
    plain = validate({**base, "method": "fedet"})
    assert client_app.local(None, None, done) == "reply" and client_app.local(None, None, plain) == "reply"
    assert seen == [(3, "data", 0.1, 5), (3, "data", 0.0, 0)]
    assert mismatch(phase1_settings(done, PHASE1), phase1_settings({**done, "oneshot-member-patience": 0}, PHASE1),
                    PHASE1) == ("oneshot-member-patience", 5, 0)
