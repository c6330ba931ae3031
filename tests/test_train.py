import math
from typing import ClassVar

import numpy as np
import pytest
import torch

from hetfl.common import task
from hetfl.common import train as T
from hetfl.common.config import ConfigError
from hetfl.methods import validate
from hetfl.data.arrays import ArrayData
from hetfl.common.checkpoint import join_state, split_state
from hetfl.common.models import CNN, get_state
from hetfl.common.train import (Normalizer, _batches, augment_batch, autocast, cosine_epoch_lr, crop_flip, evaluate,
                                evaluate_ensemble, member_disagreement, member_logits, num_steps, predict_proba,
                                resolve_device, train)

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def tiny_data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    return ArrayData(rng.integers(0, 256, (n, 1, 28, 28), dtype=np.uint8), rng.integers(0, 10, n).astype(np.int64))


def learnable_data(n=64, seed=0):
    """Each class is a fixed random template plus noise: a small CNN learns it in a few steps."""
    rng = np.random.default_rng(seed)
    templates, y = rng.integers(0, 256, (10, 1, 28, 28)), rng.integers(0, 10, n)
    x = np.clip(templates[y] + rng.integers(-30, 31, (n, 1, 28, 28)), 0, 255).astype(np.uint8)
    return ArrayData(x, y.astype(np.int64))


def flat(model):
    return torch.cat([p.detach().flatten().cpu() for p in model.parameters()])


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
    assert [e for e, _ in batches] == [0, 0, 0, 1, 1, 1]
    assert sorted(torch.cat([b for _, b in batches[:3]]).tolist()) == list(range(10))  # one epoch sees every sample once


def test_training_is_seeded():
    data, norm = tiny_data(), Normalizer("fashion_mnist")
    outs = []
    for _ in range(2):
        torch.manual_seed(1)
        m = CNN(10, 1, 28)
        train(m, data, norm, steps=5, batch_size=8, seed=3)
        outs.append(flat(m))
    assert torch.equal(outs[0], outs[1])


def test_fedprox_term_pulls_towards_the_global_model():
    data, norm = tiny_data(), Normalizer("fashion_mnist")
    dist = {}
    for mu in (0.0, 10.0):
        torch.manual_seed(1)
        m = CNN(10, 1, 28)
        w0 = flat(m).clone()
        train(m, data, norm, steps=20, batch_size=16, lr=0.05, proximal_mu=mu, seed=2)
        dist[mu] = (flat(m) - w0).norm().item()
    assert dist[10.0] < 0.8 * dist[0.0], dist


def test_proximal_step_is_the_gradient_and_value_of_the_proximal_term():
    """mu/2 ||w - w_g||^2 through autograd and through proximal_step give the same gradients and value, also for a
    parameter the loss does not reach (grad None before the term)."""
    from hetfl.common.train import proximal_step

    torch.manual_seed(0)
    w = [torch.randn(3, 4, requires_grad=True), torch.randn(5, requires_grad=True)]
    g = [torch.randn(3, 4), torch.randn(5)]
    mu = 0.3
    ((w[0] ** 3).sum() + 0.5 * mu * sum(((p - q) ** 2).sum() for p, q in zip(w, g))).backward()
    want = [p.grad.clone() for p in w]
    value = 0.5 * mu * sum(((p - q) ** 2).sum() for p, q in zip(w, g)).item()
    for p in w:
        p.grad = None
    (w[0] ** 3).sum().backward()  # w[1] gets no gradient from the loss
    got = proximal_step(w, g, mu)
    for a, b in zip(want, (p.grad for p in w)):
        torch.testing.assert_close(a, b)
    assert got.item() == pytest.approx(value, rel=1e-6)
    torch.testing.assert_close(w[1].grad, mu * (w[1].detach() - g[1]))  # its sign: towards the global model


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


def test_member_disagreement_on_a_hand_worked_case():
    def onehot(labels):  # (M, N) predicted labels -> (M, N, 3) probabilities peaked on them
        return torch.nn.functional.one_hot(torch.tensor(labels), 3).float() * 0.8 + 0.2 / 3

    # pairs (0,1): differ on samples 2, 3 -> 2/4; (0,2): differ on 3 -> 1/4; (1,2): differ on 2 -> 1/4
    probs = onehot([[0, 1, 2, 0], [0, 1, 0, 1], [0, 1, 2, 1]])
    assert member_disagreement(probs) == pytest.approx((2 / 4 + 1 / 4 + 1 / 4) / 3)
    assert member_disagreement(onehot([[0, 1, 2, 0]] * 3)) == 0.0  # identical members
    assert member_disagreement(onehot([[0, 0], [1, 1]])) == 1.0
    assert member_disagreement(probs[:1]) is None  # one member has nobody to disagree with
    assert member_disagreement(probs[:, :0]) is None  # no samples


# ---- devices --------------------------------------------------------------------------------------


def test_resolve_device_cpu_and_auto(monkeypatch):
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")


def test_resolve_device_errors_name_the_key(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="'server-torch-device' = 'cuda'.*not available"):
        resolve_device("cuda", "server-torch-device")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match="'torch-device' = 'cuda:1'.*1 CUDA device"):
        resolve_device("cuda:1")
    assert resolve_device("cuda:0") == torch.device("cuda:0")
    with pytest.raises(ConfigError, match="'torch-device' = 'gpu'"):
        resolve_device("gpu")


def test_config_devices_reach_training_and_evaluation(monkeypatch):
    cfg = validate({"torch-device": "cpu"})
    assert task.compute_options(cfg) == {"device": torch.device("cpu"), "precision": "fp32"}
    assert task.server_device(cfg) == torch.device("cpu")  # '' = device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="'server-torch-device'"):
        task.server_device(validate({"torch-device": "cpu", "server-torch-device": "cuda"}))
    # local_train passes device, precision, augment, drop-last and the lr schedule to the one loop
    seen = {}
    monkeypatch.setattr(task, "train", lambda *a, **kw: seen.update(kw))
    cfg = validate({"torch-device": "cpu", "precision": "bf16", "augment": "crop", "drop-last": True,
                    "lr-schedule": "cosine-epoch", "lr-min": 0.001, "lr-decay": 0.998, "lr-decay-every": 1})
    task.local_train(CNN(10, 1, 28), tiny_data(8), cfg, server_round=3)
    assert seen["device"] == torch.device("cpu") and seen["precision"] == "bf16" and seen["augment"] == "crop"
    assert seen["drop_last"] is True and seen["lr_schedule"] == "cosine-epoch" and seen["lr_min"] == 0.001
    assert seen["lr"] == pytest.approx(0.01 * 0.998**2)


def test_server_eval_uses_server_device_and_precision(monkeypatch):
    seen = {}
    monkeypatch.setattr(task, "eval_splits", lambda cfg: (None if cfg["eval-split"] == "all" else tiny_data(4), tiny_data(4)))
    monkeypatch.setattr(task, "evaluate", lambda *a, **kw: seen.update(kw) or (0.0, 1.0))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    ev = task.ServerEval.of(validate({"torch-device": "cuda:1", "server-torch-device": "cpu", "precision": "bf16",
                                      "eval-split": "test-half"}))
    ev.evaluate(CNN(10, 1, 28))
    assert seen == {"device": torch.device("cpu"), "precision": "bf16"}
    assert ev.val_accuracy(CNN(10, 1, 28)) == 1.0  # the validation half, on the same device
    task.ServerEval.of(validate({"torch-device": "cuda:1"})).evaluate(CNN(10, 1, 28))
    assert seen["device"] == torch.device("cuda:1")  # server-torch-device '' = torch-device
    no_val = task.ServerEval.of(validate({"eval-split": "all"}))
    assert no_val.val_accuracy(CNN(10, 1, 28)) is None


@CUDA
def test_cuda_training_matches_cpu_and_returns_cpu_state():
    data, norm = tiny_data(64), Normalizer("fashion_mnist")
    models = []
    for dev in ("cpu", "cuda"):
        torch.manual_seed(0)
        m = CNN(10, 1, 28)
        res = train(m, data, norm, steps=3, batch_size=16, lr=0.01, seed=1, device=dev, augment="crop-flip", drop_last=True)
        assert res.steps == 3 and math.isfinite(res.loss)
        models.append(m)
    assert next(models[1].parameters()).device.type == "cuda"
    assert all(isinstance(v, np.ndarray) for v in get_state(models[1]).values())  # states come back as CPU numpy
    assert torch.allclose(flat(models[0]), flat(models[1]), atol=1e-4)  # same batches and draws on either device
    logits = member_logits(models, data, norm, device=torch.device("cuda"))
    assert logits.device.type == "cpu" and logits.dtype == torch.float32
    assert torch.allclose(logits[0], logits[1], atol=1e-2)


@CUDA
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_cuda_loss_falls(precision):
    data, norm = learnable_data(), Normalizer("fashion_mnist")
    torch.manual_seed(0)
    m = CNN(10, 1, 28, width=0.25)
    before, _ = evaluate(m, data, norm, device="cuda", precision=precision)
    train(m, data, norm, steps=30, batch_size=16, lr=0.05, momentum=0.9, device="cuda", precision=precision)
    after, acc = evaluate(m, data, norm, device="cuda", precision=precision)
    assert after < 0.5 * before and acc > 0.8, (before, after, acc)


# ---- bf16 autocast ---------------------------------------------------------------------------------


def test_autocast_context_casts_matmuls_to_bf16_only_for_bf16():
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    with autocast("cpu", "bf16"):
        assert (a @ b).dtype == torch.bfloat16
    with autocast(torch.device("cpu"), "fp32"):
        assert (a @ b).dtype == torch.float32
    with pytest.raises(ValueError):
        autocast("cpu", "fp16")


def _record_dtypes(model):
    seen = []
    model.classifier[1].register_forward_hook(lambda mod, inp, out: seen.append(out.dtype))
    return seen


@pytest.mark.parametrize("precision,dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_training_and_logits_run_under_the_requested_precision(precision, dtype):
    torch.manual_seed(0)
    model, data, norm = CNN(10, 1, 28), tiny_data(16), Normalizer("fashion_mnist")
    seen = _record_dtypes(model)
    train(model, data, norm, steps=2, batch_size=8, precision=precision)
    assert seen == [dtype, dtype]
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights stay fp32
    seen.clear()
    logits = member_logits([model], data, norm, batch_size=16, precision=precision)
    assert seen == [dtype] and logits.dtype == torch.float32


def test_bf16_trains_and_evaluates_like_fp32():
    data, norm = learnable_data(), Normalizer("fashion_mnist")
    torch.manual_seed(0)
    model = CNN(10, 1, 28, width=0.25)  # bf16 is emulated (slow) on CPUs without bf16 instructions
    before, _ = evaluate(model, data, norm, precision="bf16")
    res = train(model, data, norm, steps=30, batch_size=16, lr=0.05, momentum=0.9, precision="bf16")
    after, acc = evaluate(model, data, norm, precision="bf16")
    assert math.isfinite(res.loss) and after < 0.5 * before and acc > 0.8, (before, after, acc)
    loss32, acc32 = evaluate(model, data, norm)
    assert abs(after - loss32) < 0.05 * loss32 + 0.02 and abs(acc - acc32) <= 2 / 64


# ---- augmentation ----------------------------------------------------------------------------------

IMG = torch.arange(1, 10, dtype=torch.uint8).view(1, 1, 3, 3)  # [[1,2,3],[4,5,6],[7,8,9]]


def test_crop_flip_hand_worked():
    one = torch.tensor([1])
    # offset (dy, dx) = (0, 2) into the 1-padded image: the image moves down 1 and left 1, zeros fill in
    out = crop_flip(IMG, 0 * one, 2 * one, None, pad=1)
    assert out[0, 0].tolist() == [[0, 0, 0], [2, 3, 0], [5, 6, 0]]
    # offset (pad, pad) = no shift
    assert torch.equal(crop_flip(IMG, one, one, None, pad=1), IMG)
    # crop, then mirror left-right
    out = crop_flip(IMG, 0 * one, 2 * one, torch.tensor([True]), pad=1)
    assert out[0, 0].tolist() == [[0, 0, 0], [0, 3, 2], [0, 6, 5]]
    # flip only
    assert crop_flip(IMG, None, None, torch.tensor([True]), pad=1)[0, 0].tolist() == [[3, 2, 1], [6, 5, 4], [9, 8, 7]]
    assert torch.equal(crop_flip(IMG, None, None, torch.tensor([False]), pad=1), IMG)


def test_crop_flip_per_sample_and_per_channel():
    x = torch.arange(2 * 2 * 4 * 4, dtype=torch.uint8).view(2, 2, 4, 4) + 1
    out = crop_flip(x, torch.tensor([4, 8]), torch.tensor([4, 0]), torch.tensor([True, False]))
    assert torch.equal(out[0], x[0].flip(-1))  # sample 0: no shift, flipped
    assert torch.equal(out[1], torch.zeros(2, 4, 4, dtype=torch.uint8))  # sample 1: shifted 4 up and 4 right: all zero


def _identify(orig, out, pad=4):
    """All (dy, dx, flip) that map `orig` to `out` (one sample, C x H x W)."""
    hits = []
    for dy in range(2 * pad + 1):
        for dx in range(2 * pad + 1):
            for f in (False, True):
                cand = crop_flip(orig[None], torch.tensor([dy]), torch.tensor([dx]), torch.tensor([f]), pad)[0]
                if torch.equal(cand, out):
                    hits.append((dy, dx, f))
    return hits


def test_augment_batch_moves_pixels_by_a_drawn_shift_and_fills_zeros():
    x = (torch.arange(64, dtype=torch.int32).view(1, 1, 8, 8).repeat(32, 1, 1, 1) + 1).to(torch.uint8)  # distinct pixels
    for mode in ("crop", "crop-flip", "flip"):
        out = augment_batch(x, mode, torch.Generator().manual_seed(0))
        found = [_identify(x[i], out[i]) for i in range(len(x))]
        assert all(len(h) == 1 for h in found)  # every output is exactly one shift (and flip) of its input
        shifts = {(dy, dx) for ((dy, dx, _),) in found}
        flips = {f for ((_, _, f),) in found}
        if mode == "flip":
            assert shifts == {(4, 4)} and flips == {False, True}
        else:
            assert len(shifts) > 5 and all(0 <= dy <= 8 and 0 <= dx <= 8 for dy, dx in shifts)
            assert flips == ({False} if mode == "crop" else {False, True})  # crop-only never flips
        shifted = [i for i, ((dy, dx, _),) in enumerate(found) if (dy, dx) != (4, 4)]
        assert all((out[i] == 0).any() for i in shifted)  # uncovered pixels are zero (inputs have none)


def test_augment_batch_is_seeded():
    x = tiny_data(16).x
    xt = torch.from_numpy(x)
    a = augment_batch(xt, "crop-flip", torch.Generator().manual_seed(1))
    b = augment_batch(xt, "crop-flip", torch.Generator().manual_seed(1))
    c = augment_batch(xt, "crop-flip", torch.Generator().manual_seed(2))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert augment_batch(xt, "none", torch.Generator()) is xt


def test_training_applies_augmentation_and_stays_seeded():
    data, norm = tiny_data(32), Normalizer("fashion_mnist")
    zero = float((0.0 - norm.mean.flatten()[0]) / norm.std.flatten()[0])  # a padded pixel after normalisation

    def run(augment, seed):
        torch.manual_seed(0)
        m = CNN(10, 1, 28)
        batches = []
        m.features[0].register_forward_pre_hook(lambda mod, inp: batches.append(inp[0].detach().clone()))
        train(m, data, norm, steps=4, batch_size=16, seed=seed, augment=augment)
        return flat(m), torch.cat(batches)

    def full_zero_rows(xb):  # images with a whole row of padding
        return int(((xb == zero).all(dim=-1).any(dim=-1)).sum())

    w_none, x_none = run("none", 0)
    w_aug, x_aug = run("crop", 0)
    assert full_zero_rows(x_none) == 0 and full_zero_rows(x_aug) > 10
    assert not torch.equal(w_none, w_aug)
    w_again, x_again = run("crop", 0)
    assert torch.equal(w_aug, w_again) and torch.equal(x_aug, x_again)  # same seed, same run
    _, x_other = run("crop", 1)
    assert not torch.equal(x_aug, x_other)


# ---- learning-rate schedules -----------------------------------------------------------------------


def test_round_lr_step_decay_and_exponential():
    shefl = validate({"lr": 0.01, "lr-decay": 0.99, "lr-decay-every": 10})
    assert [task.round_lr(shefl, r) for r in (1, 10, 11, 20, 21)] == pytest.approx([0.01, 0.01, 0.0099, 0.0099, 0.009801])
    # AdaptiveFL authors: lr * 0.998 ** r with r counted from 0, so round 1 trains at exactly lr
    afl = validate({"lr": 0.01, "lr-decay": 0.998, "lr-decay-every": 1})
    assert task.round_lr(afl, 1) == 0.01
    assert [task.round_lr(afl, r) for r in (2, 3, 101)] == pytest.approx([0.00998, 0.00996004, 0.01 * 0.998**100])
    assert task.round_lr(validate({}), 50) == 0.01  # default: constant


def test_cosine_epoch_lr_hand_worked():
    lrs = [cosine_epoch_lr(0.01, 0.001, e, 4) for e in range(4)]
    assert lrs == pytest.approx([0.01, 0.0086820, 0.0055, 0.0023180], abs=1e-7)
    assert cosine_epoch_lr(0.01, 0.001, 4, 4) == pytest.approx(0.001)  # the floor, reached after the last epoch
    assert min(cosine_epoch_lr(0.01, 0.001, e, 50) for e in range(50)) > 0.001


class RecordingSGD(torch.optim.SGD):
    """SGD that records the lr of every step."""

    lrs: ClassVar[list[float]] = []

    def step(self, closure=None):
        RecordingSGD.lrs.append(self.param_groups[0]["lr"])
        return super().step(closure)


def _lrs(monkeypatch, n, **kw):
    RecordingSGD.lrs = []
    monkeypatch.setattr(T, "make_optimizer", lambda params, name, lr, momentum, wd: RecordingSGD(params, lr=lr))
    torch.manual_seed(0)
    res = train(CNN(10, 1, 28), tiny_data(n), Normalizer("fashion_mnist"), lr=0.01, **kw)
    assert res.steps == len(RecordingSGD.lrs)
    return RecordingSGD.lrs


def test_train_steps_the_cosine_per_epoch_with_floor(monkeypatch):
    e = [cosine_epoch_lr(0.01, 0.001, k, 4) for k in range(4)]
    lrs = _lrs(monkeypatch, 10, epochs=4, batch_size=4, lr_schedule="cosine-epoch", lr_min=0.001)
    assert lrs == pytest.approx([e[0]] * 3 + [e[1]] * 3 + [e[2]] * 3 + [e[3]] * 3)
    # steps mode: 7 steps of 3 per epoch touch 3 epochs
    e3 = [cosine_epoch_lr(0.01, 0.001, k, 3) for k in range(3)]
    lrs = _lrs(monkeypatch, 10, steps=7, batch_size=4, lr_schedule="cosine-epoch", lr_min=0.001)
    assert lrs == pytest.approx([e3[0]] * 3 + [e3[1]] * 3 + [e3[2]])
    # drop-last: 2 steps per epoch
    lrs = _lrs(monkeypatch, 10, epochs=4, batch_size=4, lr_schedule="cosine-epoch", lr_min=0.001, drop_last=True)
    assert lrs == pytest.approx([e[0]] * 2 + [e[1]] * 2 + [e[2]] * 2 + [e[3]] * 2)


def test_train_per_step_cosine_and_constant(monkeypatch):
    lrs = _lrs(monkeypatch, 10, epochs=2, batch_size=4, lr_schedule="cosine")
    assert lrs == pytest.approx([0.01 * (1 + math.cos(math.pi * k / 6)) / 2 for k in range(6)], abs=1e-9)
    lrs = _lrs(monkeypatch, 10, epochs=2, batch_size=4, lr_schedule="cosine", lr_min=0.002)
    assert lrs == pytest.approx([0.002 + 0.008 * (1 + math.cos(math.pi * k / 6)) / 2 for k in range(6)], abs=1e-9)
    assert _lrs(monkeypatch, 10, epochs=2, batch_size=4) == [0.01] * 6


# ---- drop-last -------------------------------------------------------------------------------------


def test_drop_last_batches():
    gen = torch.Generator().manual_seed(0)
    full = list(_batches(10, 4, steps=0, epochs=2, gen=gen, drop_last=True))
    assert [len(b) for _, b in full] == [4, 4, 4, 4] and num_steps(10, 4, 0, 2, drop_last=True) == 4
    assert len(set(full[0][1].tolist() + full[1][1].tolist())) == 8  # distinct samples within an epoch
    stepped = list(_batches(10, 4, steps=7, epochs=0, gen=gen, drop_last=True))
    assert [len(b) for _, b in stepped] == [4] * 7 and [e for e, _ in stepped] == [0, 0, 1, 1, 2, 2, 3]
    # a partition smaller than one batch still trains: its one batch is all of it
    small = list(_batches(3, 4, steps=0, epochs=2, gen=gen, drop_last=True))
    assert [sorted(b.tolist()) for _, b in small] == [[0, 1, 2], [0, 1, 2]] and num_steps(3, 4, 0, 2, drop_last=True) == 2
    assert [len(b) for _, b in _batches(3, 4, steps=3, epochs=0, gen=gen, drop_last=True)] == [3, 3, 3]
    # without drop-last the last batch is short (unchanged default)
    assert [len(b) for _, b in _batches(10, 4, steps=0, epochs=1, gen=gen)] == [4, 4, 2]


def test_drop_last_step_counts_through_train():
    norm = Normalizer("fashion_mnist")
    for n, drop, want in ((50, False, 2 * 4), (50, True, 2 * 3), (10, True, 2)):
        torch.manual_seed(0)
        res = train(CNN(10, 1, 28), tiny_data(n), norm, epochs=2, batch_size=16, drop_last=drop)
        assert res.steps == want, (n, drop, res.steps)


def test_received_model_reuses_one_structure_and_holds_exactly_the_arrays():
    from hetfl.methods import validate
    from hetfl.common.models import get_state
    from hetfl.common.task import make_model, model_to_arrays, received_model

    cfg = validate({})
    a, b = model_to_arrays(make_model(cfg, seed=1)), model_to_arrays(make_model(cfg, seed=2))
    first = received_model(cfg, a)
    with torch.no_grad():
        next(first.parameters()).add_(1.0)  # what local training leaves behind must not leak into the next message
    second = received_model(cfg, b)
    assert second is first
    got = get_state(second)
    assert set(got) == set(b.keys())
    for k, v in b.items():
        np.testing.assert_array_equal(got[k], v.numpy())
    assert any(not np.array_equal(got[k], a[k].numpy()) for k in got)


def _flushed() -> bool:
    """Whether this thread flushes subnormals now: 1e-39 (subnormal in float32) times 1 reads as 0 then."""
    return (torch.tensor([1e-39]) * 1.0).item() == 0.0


def test_no_denormals_flushes_in_its_block_nests_and_the_training_and_evaluation_loops_run_in_one():
    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU cannot flush subnormals (torch.set_flush_denormal)")
    assert not _flushed()
    with T.no_denormals():
        assert _flushed()
        with T.no_denormals():
            assert _flushed()
        assert _flushed()  # an inner block's end leaves the outer one flushing
    assert not _flushed()  # and the outermost end turns it off again
    seen = []

    def loss_fn(model, x, y):
        seen.append(_flushed())
        return torch.nn.functional.cross_entropy(model(x), y)

    model, data, norm = CNN(10, 1, 28), tiny_data(8), Normalizer("fashion_mnist")
    train(model, data, norm, steps=2, batch_size=4, loss_fn=loss_fn, epoch_end=lambda e: seen.append(_flushed()))
    assert len(seen) >= 3 and all(seen) and not _flushed()  # 2 steps, the epoch end (and a FLOPs count)
    T.member_logits([model], data, norm)
    assert not _flushed()


class DropoutCNN(CNN):
    """The CNN with dropout before its output: a draw from torch's RNG every step, which a resume must restore."""

    def forward(self, x):
        return torch.nn.functional.dropout(super().forward(x), 0.3, self.training)


@pytest.mark.parametrize("optimizer,schedule", [("adam", "cosine-epoch"), ("sgd", "cosine")])
def test_training_stopped_after_an_epoch_and_continued_from_its_cursor_ends_bit_for_bit_as_the_uninterrupted(
        optimizer, schedule):
    """Adam's moments, the per-step scheduler, the batch order and augmentation draws (the seeded generator) and
    dropout (torch's RNG) all carry over: the cursor is taken through a checkpoint's plain data, as a resume reads it."""
    data, norm = learnable_data(40), Normalizer("fashion_mnist")
    kw = dict(epochs=4, batch_size=16, lr=0.01, momentum=0.9 if optimizer == "sgd" else 0.0, optimizer=optimizer,
              lr_schedule=schedule, lr_min=0.001, augment="crop-flip", seed=3)

    def model():
        torch.manual_seed(0)
        return DropoutCNN(10, 1, 28)

    whole, cursor = model(), T.TrainCursor()
    torch.manual_seed(11)
    train(whole, data, norm, cursor=cursor, **kw)
    assert cursor.epoch == 4

    saved = {}

    def stop_after_1(e):
        if e == 1:  # what a checkpoint after epoch 1 holds, then the process dies
            saved.update(weights=get_state(first), cursor=join_state(*split_state(cursor1.state_dict())))
            return True

    first, cursor1 = model(), T.TrainCursor()
    torch.manual_seed(11)
    res1 = train(first, data, norm, cursor=cursor1, epoch_end=stop_after_1, **kw)
    assert saved["cursor"]["epoch"] == 2 and res1.steps == 2 * 3
    torch.manual_seed(999)  # the new process's torch RNG: the cursor puts the old one back
    second = model()
    second.load_state_dict({k: torch.from_numpy(v) for k, v in saved["weights"].items()})
    res2 = train(second, data, norm, cursor=T.TrainCursor.from_state_dict(saved["cursor"]), **kw)
    assert res2.steps == 2 * 3
    assert torch.equal(flat(second), flat(whole))

    # the cursor matters: continuing without it (a fresh optimiser and generator) does not end there
    third = model()
    third.load_state_dict({k: torch.from_numpy(v) for k, v in saved["weights"].items()})
    train(third, data, norm, **{**kw, "epochs": 2})
    assert not torch.equal(flat(third), flat(whole))


def test_a_cursor_needs_epoch_based_training():
    with pytest.raises(ValueError, match="steps=5"):
        train(CNN(10, 1, 28), tiny_data(8), Normalizer("fashion_mnist"), steps=5, cursor=T.TrainCursor())
