"""FENS's one-shot baselines as Flower strategies (issue #78): FedKD, Fed-ET, Co-Boosting and FedCVAE-Ens through
``start`` on a Grid that is not hetfl's, with a user's ClientApp (a torch MLP on scikit-learn's digits; for
FedCVAE-Ens a small CVAE of its own) that answers phase 1 with ``hetfl.oneshot_local_train``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord
from flwr.clientapp import ClientApp
from torch import nn

import hetfl
from hetfl.inprocess import task_identity

from .test_start import UserGrid

NODES = 4
Z = 4  # the CVAE's latent size


def _digits():
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return (x * 16.0).reshape(-1, 1, 8, 8).astype(np.float32), y  # pixels in 0..256, images (1, 8, 8)


X, Y = _digits()
TRAIN, AUX, TEST = slice(0, 1200), slice(1200, 1500), slice(1500, None)


def normalize(t: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(t).float() / 255.0


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def decoder() -> nn.Module:
    return _Decoder()


class _Decoder(nn.Module):
    """z and a one-hot label -> the logits of an (1, 8, 8) image."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(Z + 10, 64), nn.ReLU(), nn.Linear(64, 64))

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([z, y], 1)).view(-1, 1, 8, 8)


def accuracy(_rnd: int, arrays: ArrayRecord) -> MetricRecord:
    model = mlp()
    model.load_state_dict(arrays.to_torch_state_dict())
    with torch.no_grad():
        pred = model(normalize(torch.as_tensor(X[TEST]))).argmax(1).numpy()
    return MetricRecord({"accuracy": float((pred == Y[TEST]).mean())})


def user_app() -> ClientApp:
    app = ClientApp()
    hetfl.register_discovery(app)

    def data(context: Context):
        pid, n = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
        return pid, torch.as_tensor(X[TRAIN][pid::n]), torch.as_tensor(Y[TRAIN][pid::n])

    def counts(y: torch.Tensor) -> list[int]:
        return np.bincount(y.numpy(), minlength=10).tolist()

    @app.train("oneshot_local")
    def local(msg: Message, context: Context) -> Message:
        pid, x, y = data(context)

        def fit(arrays, config):
            model = mlp()
            model.load_state_dict(arrays.to_torch_state_dict())
            torch.manual_seed(int(config["seed"]) + pid)
            opt = torch.optim.SGD(model.parameters(), lr=0.5)
            for _ in range(int(config["steps"])):
                opt.zero_grad()
                nn.functional.cross_entropy(model(normalize(x)), y).backward()
                opt.step()
            return model.state_dict(), {"num-examples": len(y), "label_counts": counts(y)}

        return hetfl.oneshot_local_train(msg, fit)

    @app.train("fedcvae_local")
    def cvae(msg: Message, context: Context) -> Message:
        pid, x, y = data(context)

        def fit(arrays, config):
            assert arrays is None  # FedCVAE-Ens sends no model
            torch.manual_seed(pid)
            enc, dec = nn.Linear(64 + 10, 2 * Z), decoder()
            opt = torch.optim.Adam([*enc.parameters(), *dec.parameters()], lr=0.01)
            xs, onehot = normalize(x).flatten(1), nn.functional.one_hot(y, 10).float()
            for _ in range(int(config["steps"])):
                mu, logvar = enc(torch.cat([xs, onehot], 1)).chunk(2, 1)
                z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
                rec = nn.functional.binary_cross_entropy_with_logits(dec(z, onehot).flatten(1), xs, reduction="sum")
                kl = -0.5 * (1 + logvar - mu**2 - logvar.exp()).sum()
                opt.zero_grad()
                ((rec + kl) / len(y)).backward()
                opt.step()
            return dec.state_dict(), {"num-examples": len(y), "label_counts": counts(y)}

        return hetfl.oneshot_local_train(msg, fit)

    return app


COMMON = {"num_classes": 10, "model": mlp, "normalize": normalize, "seed": 1, "epochs": 4}
STRATEGIES = {
    "FedKD": lambda: hetfl.FedKD(auxiliary=X[AUX], batch_size=32, lr=0.01, lr_min=0.0, **COMMON),
    "FedET": lambda: hetfl.FedET(auxiliary=X[AUX], batch_size=32, lr=0.01, **COMMON),
    "CoBoosting": lambda: hetfl.CoBoosting(input_shape=(1, 8, 8), g_steps=5, batch_size=128, kd_lr=0.1, lr_g=0.03,
                                           **{**COMMON, "epochs": 6}),
    "FedCVAEEns": lambda: hetfl.FedCVAEEns(decoder=decoder, input_shape=(1, 8, 8), z_dim=Z, samples=600,
                                           batch_size=32, lr=0.01, **COMMON),
}


def _start(name: str):
    strategy = STRATEGIES[name]()
    initial = ArrayRecord(mlp().state_dict())
    with task_identity():
        result = strategy.start(UserGrid(user_app(), NODES), initial, num_rounds=1, timeout=60,
                                train_config=hetfl_config(name), evaluate_fn=accuracy)
    return result, strategy


def hetfl_config(name: str):
    from flwr.app import ConfigRecord

    return ConfigRecord({"seed": 1, "steps": 200 if name == "FedCVAEEns" else 30})


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_a_one_shot_strategy_trains_a_student_from_a_users_clientapp_the_same_at_other_node_ids(name):
    (a, sa), (b, _) = _start(name), _start(name)  # each run: other random node ids, replies shuffled
    acc = {r: m["accuracy"] for r, m in a.evaluate_metrics_serverapp.items()}
    assert sorted(acc) == list(range(sa.params.epochs + 1)), acc  # phase 1 (the untrained student), each server epoch
    assert max(acc.values()) > acc[0] + 0.25, acc  # the server step trained the student
    assert a.evaluate_metrics_serverapp == b.evaluate_metrics_serverapp
    assert set(a.arrays.keys()) == set(mlp().state_dict()) and sa.ensemble.client_ids == list(range(NODES))
    assert sa.ensemble.label_counts.sum() == len(Y[TRAIN])  # every client's label counts arrived


def test_a_one_shot_strategy_refuses_more_than_one_round_and_a_missing_auxiliary_set_in_one_line():
    with pytest.raises(ValueError, match=r"^FedKD: num_rounds=3 is not allowed; expected 1 \(one-shot"):
        STRATEGIES["FedKD"]().start(UserGrid(user_app(), NODES), ArrayRecord(mlp().state_dict()), num_rounds=3)
    with pytest.raises(ValueError, match=r"^FedET: auxiliary has 0 samples"):
        hetfl.FedET(auxiliary=X[:0], **COMMON)
    with pytest.raises(TypeError, match=r"FedKD.*no_such_key"):
        hetfl.FedKD(auxiliary=X[AUX], no_such_key=1, **COMMON)
