"""FedBE baseline: the Gaussian over client models, the distillation, the held-out server set, the config check."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hetfl.baselines.fedbe import DistillOptions, distill, fedbe_round, gaussian_samples, soft_labels
from hetfl.common.strategy import weighted_mean
from hetfl.common.config import ConfigError
from hetfl.methods import validate
from hetfl.data.load import load_partition, load_server_set
from hetfl.data.spec import DataSpec
from hetfl.common.models import build_model, get_state
from hetfl.common.train import Normalizer


def test_gaussian_samples_match_the_weighted_client_moments():
    rng = np.random.default_rng(0)
    clients = [{"w": rng.normal(size=(3, 4)).astype(np.float32), "n": np.array(7, np.int64)} for _ in range(4)]
    weights = [1.0, 2.0, 3.0, 4.0]
    p = np.array(weights) / 10
    mu = sum(pi * c["w"].astype(np.float64) for pi, c in zip(p, clients))
    var = sum(pi * (c["w"] - mu) ** 2 for pi, c in zip(p, clients))
    assert weighted_mean(clients, weights)["w"] == pytest.approx(mu.astype(np.float32), abs=1e-6)
    samples = gaussian_samples(clients, weights, 4000, np.random.default_rng(1))
    drawn = np.stack([s["w"] for s in samples]).astype(np.float64)
    assert drawn.mean(0) == pytest.approx(mu, abs=0.05)
    assert drawn.var(0) == pytest.approx(var, rel=0.1, abs=1e-3)
    assert all(s["w"].dtype == np.float32 and s["n"] == 7 for s in samples[:3])  # integer buffers copied


def test_distillation_moves_the_student_towards_the_ensembles_labels():
    torch.manual_seed(0)
    norm = Normalizer("fashion_mnist")
    x = np.random.default_rng(0).integers(0, 256, size=(96, 1, 28, 28), dtype=np.uint8)
    teachers = [build_model("cnn", 10, (1, 28, 28)) for _ in range(3)]
    with torch.no_grad():  # make the teachers agree on something a fresh model does not predict
        for t in teachers:
            t.classifier[-1].bias[3] += 4.0
    targets = soft_labels(teachers, x, norm)
    assert torch.allclose(targets.sum(1), torch.ones(96)) and (targets.argmax(1) == 3).float().mean() > 0.9
    student = build_model("cnn", 10, (1, 28, 28))

    def xent() -> float:
        return float(-(targets * torch.log(soft_labels([student], x, norm).clamp_min(1e-12))).sum(1).mean())

    before = xent()
    opts = DistillOptions(epochs=4, batch_size=32, lr=0.5, momentum=0.9, swa_start=6)  # 3 steps per epoch
    distill(student, x, targets, norm, opts, seed=1)
    assert xent() < 0.5 * before


def test_fedbe_round_ensembles_mean_clients_and_samples_and_distills_from_the_mean():
    """Members are {mean, clients, S samples} in that order, the targets are their mean softmax, the student starts
    from the FedAvg mean (no epochs: it is the mean), and a replay with the same (seed, round) is identical."""
    norm = Normalizer("fashion_mnist")
    x = np.random.default_rng(0).integers(0, 256, size=(40, 1, 28, 28), dtype=np.uint8)

    def make():
        return build_model("cnn", 10, (1, 28, 28))

    torch.manual_seed(0)
    clients = [get_state(make()) for _ in range(3)]
    weights = [1.0, 1.0, 2.0]
    mean = weighted_mean(clients, weights)

    def run(epochs: int, seed: int = 4):
        return fedbe_round(make, mean, clients, weights, x, norm, 2, DistillOptions(epochs=epochs, batch_size=20,
                           swa_start=0), seed=seed, server_round=7)

    still = run(0)
    states = [get_state(m) for m in still.members]
    assert len(states) == 1 + 3 + 2
    for got, want in zip(states[:4], [mean, *clients]):
        assert all(np.array_equal(got[k], want[k]) for k in want)
    assert all(not np.array_equal(s["features.0.weight"], mean["features.0.weight"]) for s in states[4:])
    assert torch.allclose(still.targets, soft_labels(still.members, x, norm))
    assert all(np.array_equal(v, mean[k]) for k, v in get_state(still.student).items())
    a, b, other = run(2), run(2), run(2, seed=5)
    assert all(np.array_equal(v, get_state(b.student)[k]) for k, v in get_state(a.student).items())
    assert not np.array_equal(get_state(a.student)["classifier.5.weight"], get_state(still.student)["classifier.5.weight"])
    assert not np.array_equal(get_state(other.members[4])["features.0.weight"], states[4]["features.0.weight"])


def test_the_held_out_server_set_never_reaches_a_client(tmp_path):
    spec = DataSpec(dataset="digits", source="local", partitioner="dirichlet", num_partitions=5, alpha=1.0,
                    server_holdout=300)
    held = load_server_set(spec, str(tmp_path))
    parts = [load_partition(spec, i, str(tmp_path)) for i in range(5)]
    plain = DataSpec(**{**spec.__dict__, "server_holdout": 0})  # the same split without a holdout
    n_train = sum(len(load_partition(plain, i, str(tmp_path))) for i in range(5))
    assert len(held) == 300 and sum(len(p) for p in parts) == n_train - 300
    seen = {x.tobytes() for p in parts for x in p.x}
    assert not any(x.tobytes() in seen for x in held.x)
    assert plain.key() != spec.key()


def test_fedbe_needs_a_server_set():
    with pytest.raises(ConfigError, match="server-holdout"):
        validate({"method": "fedbe"})
    assert validate({"method": "fedbe", "server-holdout": 5000})["fedbe-samples"] == 5


def test_swa_averages_the_end_of_epoch_weights_after_swa_start(monkeypatch):
    from hetfl.baselines import fedbe

    seen = []

    def fake_train(model, data, normalize, **kw):  # each "epoch" sets the weight to 1, 2, 3, 4 and takes 10 steps
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(len(seen) + 1.0)
        seen.append(kw["seed"])
        return SimpleNamespace(steps=10)

    monkeypatch.setattr(fedbe, "train", fake_train)
    student = torch.nn.Linear(2, 2)
    x = np.zeros((4, 2), np.float32)
    fedbe.distill(student, x, torch.full((4, 2), 0.5), None, DistillOptions(epochs=4, swa_start=20))
    assert len(seen) == 4 and torch.all(student.weight == 3.0)  # snapshots after steps 20, 30, 40: mean of 2, 3, 4
