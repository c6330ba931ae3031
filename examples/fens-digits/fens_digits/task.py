"""The model and data: an MLP on scikit-learn's digits, each node a strided share of the first 1500 images."""

import torch
from sklearn.datasets import load_digits
from torch import nn

X, Y = load_digits(return_X_y=True)
X = torch.tensor(X / 16.0, dtype=torch.float32)
Y = torch.tensor(Y)
TEST = slice(1500, None)


def net(widths: tuple[int, int] = (32, 32)) -> nn.Module:
    return nn.Sequential(nn.Linear(64, widths[0]), nn.ReLU(), nn.Linear(widths[0], widths[1]), nn.ReLU(),
                         nn.Linear(widths[1], 10))


def partition(pid: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return X[:1500][pid::n], Y[:1500][pid::n]


def train(model: nn.Module, x, y, epochs: int, lr: float, seed: int) -> float:
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(epochs):
        for idx in torch.randperm(len(y), generator=g).split(32):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
    return loss.item()


def probabilities(model: nn.Module) -> torch.Tensor:
    torch.set_num_threads(1)
    with torch.no_grad():
        return model(X[TEST]).softmax(1)


def accuracy(probs: torch.Tensor) -> float:
    return float((probs.argmax(1) == Y[TEST]).float().mean())


def member_logits(states: list, x: torch.Tensor) -> torch.Tensor:
    members = [net() for _ in states]
    for model, state in zip(members, states):
        model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    with torch.no_grad():
        return torch.stack([model(x) for model in members], 1)
