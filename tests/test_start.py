"""A Flower user's own ClientApp with this project's strategies (issue #78): ``Strategy.start`` on a Grid that is not
hetfl's, with a ClientApp of Flower's quickstart shape (softmax regression on scikit-learn's digits, in NumPy) that
knows nothing of hetfl but, where said, registers its discovery handler in one line."""

from __future__ import annotations

import logging
import random
import uuid

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.app.error import Error
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode

from hetfl.baselines.strategy import SeededFedAvg
from hetfl.common.hosting import register_discovery
from hetfl.common.results import NoClientSucceeded
from hetfl.inprocess import task_identity

NODES = 6


def _digits():
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return x / 16.0, y


X, Y = _digits()
TEST = slice(1500, None)


def _logits(w, b, x):
    return x @ w + b


def _softmax_sgd(w, b, x, y, lr, steps=10):
    for _ in range(steps):
        z = _logits(w, b, x)
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        p[np.arange(len(y)), y] -= 1.0
        w -= lr * x.T @ p / len(y)
        b -= lr * p.mean(0)
    return w, b


def user_app(discovery: bool = False, poison: bool = False) -> ClientApp:
    """A quickstart-style ClientApp: reads "arrays" and "config", returns "arrays" and "metrics" (num-examples)."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid, n = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
        x, y = X[:1500][pid::n], Y[:1500][pid::n]
        lr = float(msg.content["config"]["lr"])
        w, b = _softmax_sgd(msg.content["arrays"]["w"].numpy().copy(), msg.content["arrays"]["b"].numpy().copy(), x, y, lr)
        if poison:
            w[0, 0] = np.nan
        return Message(RecordDict({"arrays": ArrayRecord({"w": Array(w), "b": Array(b)}),
                                   "metrics": MetricRecord({"num-examples": len(y), "lr": lr})}), reply_to=msg)

    if discovery:
        register_discovery(app)
    return app


class UserGrid:
    """What Flower's engines do, in one process: fresh random node ids in every run, replies in shuffled order, and
    a ClientApp's exception (such as a message type it does not handle) as an error reply."""

    def __init__(self, app: ClientApp, n: int = NODES, run_config: dict | None = None,
                 node_config: dict | None = None) -> None:
        self.app = app
        ids = random.sample(range(1, 1 << 62), n)
        self.contexts = {nid: Context(run_id=1, node_id=nid, node_config={"partition-id": i, "num-partitions": n,
                                                                          **(node_config or {})},
                                      state=RecordDict(), run_config=dict(run_config or {})) for i, nid in enumerate(ids)}

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages, *, timeout=None) -> list[Message]:
        out = []
        for m in messages:
            m.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            try:
                out.append(self.app(m, self.contexts[m.metadata.dst_node_id]))
            except Exception as ex:  # noqa: BLE001 - as Flower's engines do
                out.append(Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=str(ex)), reply_to=m))
        random.shuffle(out)
        return out


def _initial() -> ArrayRecord:
    return ArrayRecord({"w": Array(np.zeros((64, 10))), "b": Array(np.zeros(10))})


def _accuracy(rnd: int, arrays: ArrayRecord) -> MetricRecord:
    w, b = arrays["w"].numpy(), arrays["b"].numpy()
    return MetricRecord({"accuracy": float((_logits(w, b, X[TEST]).argmax(1) == Y[TEST]).mean())})


def _start(app: ClientApp, **kw):
    strategy = SeededFedAvg(fraction_train=0.5, fraction_evaluate=0.0, min_available_nodes=1, min_train_nodes=1)
    with task_identity():
        return strategy.start(UserGrid(app), _initial(), num_rounds=3, timeout=60,
                              train_config=ConfigRecord({"lr": 0.5}), evaluate_fn=_accuracy, **kw), strategy


def test_start_trains_a_plain_clientapp_and_says_sampling_follows_node_ids(caplog):
    with caplog.at_level(logging.WARNING, logger="hetfl"):
        result, strategy = _start(user_app())
    acc = {r: m["accuracy"] for r, m in result.evaluate_metrics_serverapp.items()}
    assert sorted(acc) == [0, 1, 2, 3] and acc[3] > acc[0] + 0.4, acc  # it trained
    assert all(result.train_metrics_clientapp[r]["lr"] == 0.5 for r in (1, 2, 3))  # train_config reached the clients
    assert len(strategy.sampled) == NODES // 2 and result.arrays["w"].numpy().any()
    assert "do not answer hetfl's discovery query" in caplog.text  # one line says why a run is not repeatable


def test_with_the_discovery_handler_the_same_seed_gives_the_same_run_at_other_node_ids():
    runs = [_start(user_app(discovery=True)) for _ in range(2)]  # each run: other random node ids
    (a, sa), (b, sb) = runs
    assert sa.sampled == sb.sampled
    assert a.evaluate_metrics_serverapp == b.evaluate_metrics_serverapp
    assert all(np.array_equal(a.arrays[k].numpy(), b.arrays[k].numpy()) for k in ("w", "b"))


def test_a_run_that_accepts_no_update_raises_with_the_count_and_the_reason():
    with pytest.raises(NoClientSucceeded, match=r"no client update was accepted in any of the 3 round\(s\): 9 train "
                                                r"message\(s\) sent, 0 error repl\(ies\), 9 repl\(ies\) rejected"):
        _start(user_app(poison=True))


def test_federated_evaluation_samples_by_client_id_and_averages_the_clients_metrics():
    app = user_app(discovery=True)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        acc = _accuracy(0, msg.content["arrays"])["accuracy"]
        return Message(RecordDict({"metrics": MetricRecord({"num-examples": 10 + pid, "acc": acc, "node": pid})}),
                       reply_to=msg)

    strategy = SeededFedAvg(fraction_train=0.5, fraction_evaluate=0.5, min_available_nodes=1, min_train_nodes=1,
                            min_evaluate_nodes=1)
    with task_identity():
        result = strategy.start(UserGrid(app), _initial(), num_rounds=2, timeout=60,
                                train_config=ConfigRecord({"lr": 0.5}), evaluate_fn=_accuracy)
    fed = result.evaluate_metrics_clientapp
    assert sorted(fed) == [1, 2]  # every round, through the client map (one message in flight per node)
    for rnd in (1, 2):  # the clients' mean of the same global model's accuracy is the server's on the same data
        assert fed[rnd]["acc"] == pytest.approx(result.evaluate_metrics_serverapp[rnd]["accuracy"])


def test_with_an_idle_stop_the_run_decides_itself_whether_it_trained(tmp_path):
    """IdleStop judges the whole run (a resumed run's earlier rounds, stop-after-round): ``start`` with it does not
    raise for rounds 1-2 of a 3-round run that accepted nothing (the run is stopped early, not finished untrained)."""
    from hetfl.common.results import RunRecorder
    from hetfl.common.rounds import IdleStop

    cfg = {"run-name": "r", "results-dir": str(tmp_path), "num-server-rounds": 3, "max-idle-rounds": 0}
    strategy = SeededFedAvg(fraction_train=0.5, fraction_evaluate=0.0, min_available_nodes=1, min_train_nodes=1)
    with task_identity():
        result = strategy.start(UserGrid(user_app(poison=True)), _initial(), num_rounds=2, timeout=60,
                                train_config=ConfigRecord({"lr": 0.5}),
                                callbacks=[IdleStop(RunRecorder(cfg, threshold=0.5), cfg)])
    assert not result.arrays["w"].numpy().any()  # nothing was accepted, and nothing raised


# --- SHEFL in a user's app: the client function and the device classes --------------------------------------------


def shefl_user_app(seen: list | None = None) -> ClientApp:
    """A ClientApp of one's own that answers SHEFL with hetfl's client function and its own NumPy training."""
    import hetfl

    app = ClientApp()

    @app.train("shefl")
    def train(msg: Message, context: Context) -> Message:
        pid, n = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
        x, y = X[:1500][pid::n], Y[:1500][pid::n]

        def fit(m, arrays, config):
            if seen is not None:
                seen.append((pid, str(config["role"]), float(config["lr"])))
            w, b = _softmax_sgd(arrays["w"].numpy().copy(), arrays["b"].numpy().copy(), x, y, float(config["lr"]))
            return {"w": w, "b": b}, {"train_loss": 0.0, "num-examples": len(y)}

        return hetfl.shefl_train(msg, fit)

    hetfl.register_discovery(app)
    return app


def _ensemble_accuracy(members: int):
    import hetfl

    def fn(rnd: int, arrays: ArrayRecord) -> MetricRecord:
        probs = 0
        for st in hetfl.unpack_models(arrays, members):
            z = _logits(st["w"], st["b"], X[TEST])
            p = np.exp(z - z.max(1, keepdims=True))
            probs = probs + p / p.sum(1, keepdims=True)
        return MetricRecord({"accuracy": float((probs.argmax(1) == Y[TEST]).mean())})

    return fn


def _shefl_start(seen=None, **kw):
    import hetfl

    strategy = hetfl.SHEFL(num_models=2, topk_density=0.5, hpc_per_round=1, fraction_train=0.5, seed=1,
                           device_class=lambda c: "hpc" if c < 2 else "lpc", **kw)
    initial = hetfl.pack_models([{"w": np.full((64, 10), 0.01 * m), "b": np.zeros(10)} for m in range(2)])
    with task_identity():
        result = strategy.start(UserGrid(shefl_user_app(seen)), initial, num_rounds=3, timeout=60,
                                train_config=ConfigRecord({"lr": 0.5}), evaluate_fn=_ensemble_accuracy(2))
    return result, strategy


def test_shefl_from_keywords_trains_a_users_clientapp_the_same_at_other_node_ids():
    seen: list = []
    (a, sa), (b, _) = _shefl_start(seen), _shefl_start()
    acc = {r: m["accuracy"] for r, m in a.evaluate_metrics_serverapp.items()}
    assert acc[3] > acc[0] + 0.3, acc  # it trained
    assert sa.C_h == 1 and sa.C_l == 2 and sa.roles == {0: "hpc", 1: "hpc", 2: "lpc", 3: "lpc", 4: "lpc", 5: "lpc"}
    assert {lr for _, _, lr in seen} == {0.5}  # train_config reached every client
    assert {(pid < 2, role) for pid, role, _ in seen} == {(True, "hpc"), (False, "lpc")}  # the classes given
    hpc_fits = [pid for pid, role, _ in seen if role == "hpc"]
    assert len(hpc_fits) == 3 * 2  # one HPC a round trains both members
    assert a.evaluate_metrics_serverapp == b.evaluate_metrics_serverapp  # other node ids, the same run
    assert all(np.array_equal(a.arrays[k].numpy(), b.arrays[k].numpy()) for k in a.arrays)


def test_shefl_takes_the_device_classes_that_nodes_declare():
    import hetfl

    grid = UserGrid(shefl_user_app())
    for ctx in grid.contexts.values():
        ctx.node_config["device-class"] = "hpc" if int(ctx.node_config["partition-id"]) % 3 == 0 else "lpc"
    strategy = hetfl.SHEFL(num_models=2, hpc_per_round=1, fraction_train=0.5)
    initial = hetfl.pack_models([{"w": np.zeros((64, 10)), "b": np.zeros(10)}] * 2)
    with task_identity():
        strategy.start(grid, initial, num_rounds=1, timeout=60, train_config=ConfigRecord({"lr": 0.5}))
    assert strategy.roles == {c: "hpc" if c % 3 == 0 else "lpc" for c in range(NODES)}


def test_shefl_refuses_an_unknown_keyword_and_a_value_out_of_range_in_one_line():
    import hetfl

    with pytest.raises(TypeError, match=r"SHEFL: unknown keyword argument 'models' = 3; allowed: .*num_models"):
        hetfl.SHEFL(models=3)
    with pytest.raises(ValueError, match=r"SHEFL: num_models=0 is not allowed; expected an int in \[1, 64\]"):
        hetfl.SHEFL(num_models=0)


# --- AdaptiveFL in a user's app: a model of one's own as a width-prunable builder ---------------------------------


def _mlp(widths):
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, widths[0]), nn.ReLU(), nn.Linear(widths[0], widths[1]), nn.ReLU(),
                         nn.Linear(widths[1], 10))


def _mlp_accuracy(rnd: int, arrays: ArrayRecord) -> MetricRecord:
    """The packed full MLP's accuracy on the test split (AdaptiveFL's arrays: one member, m0.<name>)."""
    import torch

    import hetfl

    model = _mlp((32, 32))
    model.load_state_dict({k: torch.tensor(v) for k, v in hetfl.unpack_models(arrays, 1)[0].items()})
    with torch.no_grad():
        pred = model(torch.tensor(X[TEST], dtype=torch.float32)).argmax(1).numpy()
    return MetricRecord({"accuracy": float((pred == Y[TEST]).mean())})


def adaptivefl_user_app(pool, capacity_of) -> ClientApp:
    import torch

    import hetfl

    app = ClientApp()

    @app.train("adaptivefl")
    def train(msg: Message, context: Context) -> Message:
        pid, n = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
        x = torch.tensor(X[:1500][pid::n], dtype=torch.float32)
        y = torch.tensor(Y[:1500][pid::n])

        def fit(model, config, job):
            opt = torch.optim.SGD(model.parameters(), lr=float(config["lr"]))
            for _ in range(20):
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
            return {"train_loss": float(loss)}

        return hetfl.adaptivefl_train(msg, pool, fit, len(y), capacity_of(pid))

    hetfl.register_discovery(app)
    return app


def test_adaptivefl_prunes_a_users_own_model_on_the_devices_and_trains_it():

    import hetfl

    pool = hetfl.SubmodelPool(_mlp, widths=(32, 32))
    assert [e.name for e in pool.entries] == ["S1", "M1", "L1"] and pool[0].widths == (32, 12)
    small = pool[pool.index("S1")].size
    strategy = hetfl.AdaptiveFL(pool=pool, fraction_train=0.5, seed=2)

    accuracy = _mlp_accuracy

    initial = hetfl.pack_models([{k: v.detach().numpy() for k, v in _mlp((32, 32)).state_dict().items()}])
    app = adaptivefl_user_app(pool, lambda pid: small if pid < 3 else 1e9)  # three weak devices, three strong ones
    with task_identity():
        result = strategy.start(UserGrid(app), initial, num_rounds=4, timeout=60,
                                train_config=ConfigRecord({"lr": 0.5}), evaluate_fn=accuracy)
    acc = {r: m["accuracy"] for r, m in result.evaluate_metrics_serverapp.items()}
    assert acc[4] > acc[0] + 0.3, acc
    assert strategy.total_back < strategy.total_sent  # the weak devices pruned what they were sent
    assert sum(strategy.last_round[f"back_{e.name}"] for e in pool.entries) == len(strategy.sent)


def test_a_model_without_widths_is_refused_in_one_line_naming_the_protocol():
    import hetfl

    with pytest.raises(ValueError, match=r"a model builder needs its full model's hidden widths"):
        hetfl.SubmodelPool(_mlp)
    with pytest.raises(ValueError, match=r"has no per-layer widths; .*SubmodelPool\(build, widths=\(\.\.\.\)\)"):
        hetfl.SubmodelPool("my_module:build", 10, (1, 28, 28))


def test_federated_evaluation_of_shefl_and_adaptivefl_averages_the_clients_metrics():
    """fraction_evaluate > 0: clients sampled by id get the global arrays (SHEFL's M members, AdaptiveFL's packed full
    model) in an evaluate message; the weighted mean of their accuracy on the server's test data is the server's."""

    import hetfl

    seen: list = []
    app = shefl_user_app()

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        seen.append((int(context.node_config["partition-id"]), int(msg.content["config"]["server-round"])))
        acc = _ensemble_accuracy(2)(0, msg.content["arrays"])["accuracy"]
        return Message(RecordDict({"metrics": MetricRecord({"num-examples": 5, "acc": acc})}), reply_to=msg)

    strategy = hetfl.SHEFL(num_models=2, topk_density=0.5, hpc_per_round=1, fraction_train=0.5, seed=1,
                           fraction_evaluate=0.5, device_class=lambda c: "hpc" if c < 2 else "lpc")
    initial = hetfl.pack_models([{"w": np.full((64, 10), 0.01 * m), "b": np.zeros(10)} for m in range(2)])
    with task_identity():
        result = strategy.start(UserGrid(app), initial, num_rounds=2, timeout=60, train_config=ConfigRecord({"lr": 0.5}),
                                evaluate_fn=_ensemble_accuracy(2))
    fed = result.evaluate_metrics_clientapp
    assert sorted(fed) == [1, 2] and len(seen) == 2 * (NODES // 2)
    for rnd in (1, 2):
        assert fed[rnd]["acc"] == pytest.approx(result.evaluate_metrics_serverapp[rnd]["accuracy"])
        assert fed[rnd]["num-examples"] == 5 * (NODES // 2)

    pool = hetfl.SubmodelPool(_mlp, widths=(32, 32))
    app = adaptivefl_user_app(pool, lambda pid: None)

    accuracy = _mlp_accuracy

    @app.evaluate()
    def evaluate_full(msg: Message, context: Context) -> Message:
        acc = accuracy(0, msg.content["arrays"])["accuracy"]
        return Message(RecordDict({"metrics": MetricRecord({"num-examples": 3, "acc": acc})}), reply_to=msg)

    strategy = hetfl.AdaptiveFL(pool=pool, fraction_train=0.5, seed=2, fraction_evaluate=1.0)
    initial = hetfl.pack_models([{k: v.detach().numpy() for k, v in _mlp((32, 32)).state_dict().items()}])
    with task_identity():
        result = strategy.start(UserGrid(app), initial, num_rounds=2, timeout=60,
                                train_config=ConfigRecord({"lr": 0.5}), evaluate_fn=accuracy)
    for rnd in (1, 2):
        assert result.evaluate_metrics_clientapp[rnd]["acc"] == pytest.approx(
            result.evaluate_metrics_serverapp[rnd]["accuracy"])
        assert result.evaluate_metrics_clientapp[rnd]["num-examples"] == 3 * NODES


def test_federated_evaluation_weights_each_clients_metrics_by_its_examples_and_drops_a_reply_to_no_message():
    """StrategyBase.aggregate_evaluate, hand-worked: acc 0.5 on 1 example and 0.8 on 3 -> (0.5 + 2.4) / 4 = 0.725; a
    reply from a client that was not asked is dropped, a reply with NaN is rejected."""
    import hetfl
    from hetfl.common.nodes import ClientMap

    strategy = hetfl.SHEFL(num_models=1, fraction_evaluate=1.0)
    cmap = ClientMap()
    with task_identity():
        msgs = [Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=10 + c, message_type="evaluate")
                for c in range(4)]
        for c, m in enumerate(msgs):
            m.metadata.__dict__["_message_id"] = f"id{c}"
            cmap.node[c], cmap._sender[f"id{c}"] = 10 + c, c
        strategy.map, strategy._evaluating = cmap, [0, 1, 3]
        values = {0: (0.5, 1), 1: (0.8, 3), 2: (0.0, 100), 3: (float("nan"), 5)}
        replies = [Message(RecordDict({"metrics": MetricRecord({"num-examples": n, "acc": a})}), reply_to=msgs[c])
                   for c, (a, n) in values.items()]
    out = strategy.aggregate_evaluate(1, replies)
    assert out["num-examples"] == 4 and out["acc"] == pytest.approx(0.725)
