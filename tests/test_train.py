import numpy as np
import torch

from hetfl.common.data import ArrayData
from hetfl.common.models import CNN
from hetfl.common.train import Normalizer, _batches, evaluate, evaluate_ensemble, num_steps, predict_proba, train


def tiny_data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    return ArrayData(rng.integers(0, 256, (n, 1, 28, 28), dtype=np.uint8), rng.integers(0, 10, n).astype(np.int64))


def test_loss_decreases_on_a_tiny_batch():
    torch.manual_seed(0)
    model, data, norm = CNN(10, 1, 28), tiny_data(32), Normalizer("fashion_mnist")
    before, _ = evaluate(model, data, norm)
    res = train(model, data, norm, steps=100, batch_size=32, lr=0.01, momentum=0.9)
    after, acc = evaluate(model, data, norm)
    assert res.steps == 100 and res.num_examples == 32
    assert after < 0.5 * before and acc > 0.9


def test_steps_and_epochs_counting():
    gen = torch.Generator().manual_seed(0)
    assert len(list(_batches(10, 4, steps=7, epochs=0, gen=gen))) == 7
    batches = list(_batches(10, 4, steps=0, epochs=2, gen=gen))
    assert len(batches) == 6 == num_steps(10, 4, 0, 2)
    assert sorted(torch.cat(batches[:3]).tolist()) == list(range(10))  # one epoch sees every sample once


def test_training_is_seeded():
    data, norm = tiny_data(), Normalizer("fashion_mnist")
    outs = []
    for _ in range(2):
        torch.manual_seed(1)
        m = CNN(10, 1, 28)
        train(m, data, norm, steps=5, batch_size=8, seed=3)
        outs.append(torch.cat([p.flatten() for p in m.parameters()]))
    assert torch.equal(outs[0], outs[1])


def test_fedprox_term_pulls_towards_the_global_model():
    data, norm = tiny_data(), Normalizer("fashion_mnist")
    dist = {}
    for mu in (0.0, 10.0):
        torch.manual_seed(1)
        m = CNN(10, 1, 28)
        w0 = torch.cat([p.detach().flatten().clone() for p in m.parameters()])
        train(m, data, norm, steps=20, batch_size=16, lr=0.05, proximal_mu=mu, seed=2)
        dist[mu] = (torch.cat([p.detach().flatten() for p in m.parameters()]) - w0).norm().item()
    assert dist[10.0] < 0.8 * dist[0.0], dist


def test_ensemble_is_mean_of_softmax():
    torch.manual_seed(0)
    models, data, norm = [CNN(10, 1, 28) for _ in range(3)], tiny_data(40), Normalizer("fashion_mnist")
    probs = predict_proba(models, data, norm, batch_size=16)
    assert probs.shape == (3, 40, 10)
    mean = probs.mean(0)
    loss, acc = evaluate_ensemble(models, data, norm)
    y = torch.from_numpy(data.y)
    assert abs(acc - (mean.argmax(1) == y).float().mean().item()) < 1e-6
    assert abs(loss - torch.nn.functional.nll_loss(mean.log(), y).item()) < 1e-5
    # an ensemble of one model is that model
    assert np.allclose(evaluate_ensemble(models[:1], data, norm), evaluate(models[0], data, norm))
