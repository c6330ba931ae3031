"""Same seed, same run: every method, twice with one seed and once with another (docs/architecture.md).

The runs go through the real ServerApp/ClientApp code on an in-process grid whose node ids are
random in every run and whose replies come back shuffled, as in Flower's engines; a slow test
(tests/test_e2e.py) repeats the check for FedAvg in the real Simulation Engine.
"""


import pytest

from hetfl import methods

from .conftest import require_fmnist
from .inprocess import run_in_process

BASE = {
    "dataset": "fashion_mnist", "data-source": "local", "partitioner": "dirichlet", "dirichlet-alpha": 0.6,
    "num-server-rounds": 2, "min-available-nodes": 8, "fraction-train": 0.5, "local-steps": 2, "local-epochs": 1,
    "batch-size": 16, "max-test-samples": 300, "checkpoint": False,
}
# Every registered method runs (hetfl.methods.METHODS); a method listed here runs with these settings instead of its
# name alone, and a name that is not a method is a second setting of one (its "method" key says which).
OVERRIDES = {
    # 2,000 clients hosted by the 8 SuperNodes (250 each, run-config num-clients): sampled from all by client id
    "fedavg-2000-clients": {"method": "fedavg", "num-clients": 2000, "partitioner": "iid", "fraction-train": 0.005},
    "fednova": {"method": "fednova", "momentum": 0.5},
    "fedavg-stc": {"method": "fedavg-stc", "stc-error-feedback": True},
    "fedbe": {"method": "fedbe", "dataset": "digits", "server-holdout": 300, "fedbe-epochs": 2, "fedbe-samples": 2,
              "local-steps": 10, "lr": 0.05, "fedbe-lr": 0.05},
    "shefl": {"method": "shefl", "shefl-models": 2, "shefl-hpc-per-round": 2},
    # 4 nodes: FENS trains every client once and its aggregator over all their logits, so its work grows with the
    # nodes while what the test checks (same seed, same run) does not; 8 cost 102 s of the suite's time
    "fens": {"method": "fens", "local-steps": 3, "fraction-train": 1.0, "fens-local-fraction": 0.98,
             "min-available-nodes": 4},
}
# FENS's one-shot baselines: round 0 = phase 1 (every client once), rounds 1..E = the server's epochs (no clients)
ONESHOT = {
    "fedkd": {"method": "fedkd", "server-holdout": 300, "fedkd-epochs": 2, "fedkd-batch-size": 64},
    "fedet": {"method": "fedet", "server-holdout": 300, "fedet-epochs": 2, "fedet-batch-size": 64},
    "coboost": {"method": "coboost", "coboost-epochs": 2, "coboost-g-steps": 2, "coboost-batch-size": 16},
    "fedcvae": {"method": "fedcvae", "optimizer": "adam", "lr": 1e-3, "fedcvae-samples": 64, "fedcvae-epochs": 2,
                "fedcvae-batch-size": 16},
}


_ONESHOT_SPEC = methods.spec_for("fedkd")  # the one-shot baselines' package: round 0 is phase 1
ONESHOT_NAMES = sorted(n for n in methods.METHODS if methods.spec_for(n) is _ONESHOT_SPEC)
ROUND_NAMES = sorted({*(n for n in methods.METHODS if n not in ONESHOT_NAMES), *OVERRIDES})
NAMES = sorted([*ROUND_NAMES, *ONESHOT_NAMES])


COMPARED = ("round", "accuracy", "loss", "bytes_down", "bytes_up", "clients")


def _rows(metrics: dict) -> list[tuple]:
    return [tuple(r.get(k) for k in COMPARED) for r in metrics["rounds"]]


@pytest.mark.parametrize("name", ROUND_NAMES)
def test_same_seed_same_run_other_seed_other_clients(name, tmp_path, task_identity):
    require_fmnist()
    cfg, nodes = setting(name)
    a = run_in_process({**cfg, "seed": 3}, nodes, tmp_path, "a")
    b = run_in_process({**cfg, "seed": 3}, nodes, tmp_path, "b")
    c = run_in_process({**cfg, "seed": 4}, nodes, tmp_path, "c")
    assert [r["round"] for r in a["rounds"]] == [0, 1, 2]
    assert _rows(a) == _rows(b)  # accuracy, loss, bytes and sampled clients, bit for bit
    trained = [r["clients"] for r in a["rounds"][1:]]
    assert all(trained), trained
    if cfg["fraction-train"] < 1.0:
        assert trained != [r["clients"] for r in c["rounds"][1:]]
    assert [r["accuracy"] for r in a["rounds"][1:]] != [r["accuracy"] for r in c["rounds"][1:]]


def setting(name: str) -> tuple[dict, int]:
    """A method's determinism run: its config (without the seed) and its number of nodes (also what
    scripts/determinism_snapshot.py runs)."""
    if name in ONESHOT_NAMES:
        return {**BASE, "fraction-train": 1.0, "local-steps": 3, "min-available-nodes": 4,
                **ONESHOT.get(name, {"method": name})}, 4
    cfg = {**BASE, **OVERRIDES.get(name, {"method": name})}
    return cfg, int(cfg["min-available-nodes"])


@pytest.mark.parametrize("name", ONESHOT_NAMES)
def test_oneshot_same_seed_same_run(name, tmp_path, task_identity):
    require_fmnist()
    cfg, nodes = setting(name)
    a = run_in_process({**cfg, "seed": 3}, nodes, tmp_path, "a")
    b = run_in_process({**cfg, "seed": 3}, nodes, tmp_path, "b")
    c = run_in_process({**cfg, "seed": 4}, nodes, tmp_path, "c")
    assert [r["round"] for r in a["rounds"]] == [0, 1, 2]
    assert _rows(a) == _rows(b)  # accuracy, loss, bytes and clients, bit for bit
    for key in ("teacher_test_accuracy", "synthetic_label_counts"):  # FedCVAE-Ens has no teacher, the others no synthetic labels
        assert a["phases"].get(key) == b["phases"].get(key)
    assert a["rounds"][0]["clients"] == list(range(4))
    assert [r["accuracy"] for r in a["rounds"][1:]] != [r["accuracy"] for r in c["rounds"][1:]]


def test_server_evaluates_on_its_own_thread_count_whatever_ran_before(tmp_path, task_identity, monkeypatch):
    """A float32 evaluation's last bits depend on torch's thread count (oneDNN and MKL split work by it), so the
    server sets `server-threads` once and every evaluation runs on it: not on the thread count the process had before
    (a pytest worker's, OMP_NUM_THREADS) nor on an in-process client's `client-threads`. Without it the Simulation
    Engine and the in-process engine once gave one round's loss 1 ulp apart (tests/test_e2e.py failed on it)."""
    import torch

    from hetfl.common import task

    seen = []
    real = task.ServerEval.evaluate

    def spy(self, *a, **kw):
        seen.append(torch.get_num_threads())
        return real(self, *a, **kw)

    monkeypatch.setattr(task.ServerEval, "evaluate", spy)
    cfg = {"method": "fedavg", "dataset": "digits", "num-server-rounds": 2, "min-available-nodes": 3,
           "local-steps": 2, "batch-size": 16, "checkpoint": False, "tracking": "none",
           "client-threads": 1, "server-threads": 2}
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # what an earlier test (or OMP_NUM_THREADS=1) leaves behind
        a = run_in_process(cfg, 3, tmp_path, "a")
        torch.set_num_threads(2)
        b = run_in_process(cfg, 3, tmp_path, "b")
    finally:
        torch.set_num_threads(before)
    assert seen and set(seen) == {2}, seen  # rounds 0, 1, 2 of both runs, each after the clients' 1-thread training
    assert _rows(a) == _rows(b)
