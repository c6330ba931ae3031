"""FENS's iterative baselines FedNova, Scaffold, FedAvg-STC and FedYogi (docs/readings.md#fens-iterative).

The math on small examples worked out by hand (FedNova, FedYogi), on a two-client quadratic where FedAvg drifts (Scaffold),
and against an independent top-k (STC); then the strategies on fake replies, and the real ServerApp/ClientApp code
in-process: Scaffold's control variates in the node state, across rounds and after a resume, and the bytes each
method moves.
"""

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from hetfl.baselines.client_app import gradient_correction
from hetfl.baselines.core import (
    CI_ROUND_STATE,
    CI_STATE,
    apply_delta,
    data_weights,
    fednova_direction,
    fednova_normalizer,
    fednova_step,
    scaffold_control_delta,
    scaffold_correction,
    scaffold_model,
    scaffold_server_control,
    stc_decode,
    stc_encode,
)
from hetfl.baselines.params import FedNovaParams, ScaffoldParams
from hetfl.baselines.strategy import SeededFedNova, SeededScaffold
from hetfl.common.clientstore import ClientStateStore
from hetfl.common.params import LocalSGDParams
from hetfl.common.checkpoint import read_checkpoint
from hetfl.common.config import ConfigError
from hetfl.methods import validate
from hetfl.common.nodes import ClientMap
from hetfl.common.hosting import state_key
from hetfl.inprocess import InProcessGrid, run_in_process

from .conftest import require_fmnist
from .test_determinism import BASE
from .test_nodes import Grid, one

# --- FedNova ----------------------------------------------------------------------------------------------------


def test_fednova_normalizer_is_steps_for_sgd_and_the_papers_sum_with_momentum():
    assert fednova_normalizer(7, 0.0) == 7.0
    assert fednova_normalizer(3, 0.5) == pytest.approx(1 + 1.5 + 1.75)  # counter 1, 1.5, 1.75
    rho, tau = 0.9, 40  # Wang et al. 2020: ||a||_1 = [tau - rho (1 - rho^tau) / (1 - rho)] / (1 - rho)
    assert fednova_normalizer(tau, rho) == pytest.approx((tau - rho * (1 - rho**tau) / (1 - rho)) / (1 - rho))


def test_fednova_update_equals_the_normalized_average_by_hand():
    """Two clients: n = 10 and 30 (p = 1/4, 3/4), 4 and 6 local steps. tau_eff = 1/4 * 4 + 3/4 * 6 = 5.5;
    scales p_i tau_eff / a_i = 0.34375 and 0.6875; x - y_1 = (1, 1), x - y_2 = (-1, -2):
    d = (0.34375 - 0.6875, 0.34375 - 1.375) = (-0.34375, -1.03125) and x - d = (1.34375, 3.03125)
    (FedAvg would give (1.5, 3.25))."""
    x = {"w": np.array([1.0, 2.0], np.float32)}
    ys = [{"w": np.array([0.0, 1.0], np.float32)}, {"w": np.array([2.0, 4.0], np.float32)}]
    p = data_weights([10, 30])
    d, tau_eff = fednova_direction(x, ys, p, [4.0, 6.0], ["w"])
    assert tau_eff == 5.5
    np.testing.assert_allclose(d["w"], [-0.34375, -1.03125])
    new, buf = fednova_step(x, d, lr=0.1, gmf=0.0, buf=None)
    np.testing.assert_allclose(new["w"], [1.34375, 3.03125])
    assert buf is None
    new, buf = fednova_step(x, d, lr=0.1, gmf=0.9, buf=None)  # the first round with global momentum: buf = d / lr
    np.testing.assert_allclose(new["w"], [1.34375, 3.03125])
    new2, _ = fednova_step(new, d, lr=0.1, gmf=0.9, buf=buf)  # then x - lr (0.9 buf + d / lr) = x - 1.9 d
    np.testing.assert_allclose(new2["w"], np.array([1.34375, 3.03125]) + 1.9 * np.array([0.34375, 1.03125]))


def _round(s, cmap, nodes, rnd, x, updates):
    """One round of strategy `s` on fake replies: client c answers y = updates[c][0] with its steps and example count."""
    msgs = list(s.configure_train(rnd, ArrayRecord({k: Array(v) for k, v in x.items()}), ConfigRecord(), Grid(nodes)))

    def train(m):
        y, steps, n = updates[int(m.content["client"]["client-id"])]
        return Message(RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in y.items()}),
                                   "metrics": MetricRecord({"num-examples": n, "steps": steps, "train_loss": 1.0})}),
                       reply_to=m)

    arrays, _ = s.aggregate_train(rnd, s.order_replies(cmap.send_and_receive(Grid(nodes, train), msgs, timeout=5)))
    return {k: v.numpy() for k, v in arrays.items()}


def test_fednova_strategy_normalizes_by_each_clients_steps_with_momentum(task_identity):
    """Three clients with different data sizes and steps (the steps a fixed number of epochs gives), local momentum
    0.5 and global momentum 0.9: the strategy's two rounds equal the formula applied by hand; a bias (a buffer, not
    a trainable parameter) gets the weighted mean; a reply without a valid step count is rejected."""
    nodes = {40 + c: one(c) for c in range(4)}
    cmap = ClientMap(nodes)
    s = SeededFedNova(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=1).bind(cmap, 0)
    s.setup({"w": np.zeros(3, np.float32)}, FedNovaParams(gmf=0.9, sgd=LocalSGDParams(lr=0.1, momentum=0.5)))
    x = {"w": np.array([1.0, -1.0, 0.5], np.float32), "b": np.array([2.0], np.float32)}
    rng = np.random.default_rng(0)
    work = {0: (3, 48), 1: (10, 160), 2: (1, 16), 3: (0, 64)}  # (steps, examples); client 3: malformed (0 steps)
    buf = None
    for rnd in (1, 2):
        updates = {c: ({"w": (x["w"] - rng.normal(size=3)).astype(np.float32), "b": np.array([float(c)], np.float32)},
                       steps, n) for c, (steps, n) in work.items()}
        got = _round(s, cmap, nodes, rnd, x, updates)
        assert s.rejected == 1
        good = [updates[c] for c in (0, 1, 2)]
        p = np.array([48, 160, 16]) / 224
        a = np.array([fednova_normalizer(st, 0.5) for _, st, _ in good])
        tau_eff = float(p @ a)
        d = sum(pi * tau_eff / ai * (x["w"].astype(np.float64) - y["w"]) for pi, ai, (y, _, _) in zip(p, a, good))
        buf = d / 0.1 if buf is None else 0.9 * buf + d / 0.1
        np.testing.assert_allclose(got["w"], x["w"] - 0.1 * buf, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got["b"], p @ np.array([0.0, 1.0, 2.0]), rtol=1e-6)
        assert s.train_metrics["fednova_tau_eff"] == pytest.approx(tau_eff)
        x = got
    assert {k: np.asarray(v) for k, v in s.state_dict()["buf"].items()}.keys() == {"w"}


# --- FedYogi -----------------------------------------------------------------------------------------------------


def test_fedyogi_strategy_takes_the_authors_step_over_two_rounds(task_identity):
    """The strategy `method = "fedyogi"` runs, by hand over two rounds (eta 1, beta_1 = beta_2 = 0.5, tau 0.01):
    delta = data-weighted mean of y_i - x; m = 0.5 m + 0.5 delta from 0; v = 0.5 delta^2 in round 1, then
    v - 0.5 delta^2 sign(v - delta^2); x + m / (sqrt(v) + tau), no bias correction (docs/readings.md#fens-fedyogi).
    Entry 0 has v > delta^2 in round 2, where Yogi lowers v and Adam's rule would not give it; Reddi et al.'s
    v_{-1} = tau^2 start would change round 1. An integer buffer keeps its dtype."""
    from hetfl.baselines.server_app import make_strategy
    from hetfl.common.fedopt import SeededFedYogi
    from hetfl.common.params import FederationParams
    from hetfl.methods import params_for

    cfg = validate({"method": "fedyogi", "fedadam-server-lr": 1.0, "fedadam-beta1": 0.5, "fedadam-beta2": 0.5,
                    "fedadam-tau": 0.01, "fraction-train": 1.0})
    nodes = {40 + c: one(c) for c in range(2)}
    cmap = ClientMap(nodes)
    s = make_strategy(params_for(cfg), FederationParams.from_config(cfg), cmap)
    assert type(s) is SeededFedYogi
    f32 = lambda v: np.array(v, np.float32)  # noqa: E731
    n = np.array([5], np.int64)
    x0 = {"w": f32([0.0, 0.0]), "n": n}
    # round 1: client 0 (3 examples) and client 1 (1 example): delta = [1, (3 * 0.2 - 0.2) / 4] = [1.0, 0.1]
    x1 = _round(s, cmap, nodes, 1, x0, {0: ({"w": f32([1.0, 0.2]), "n": n}, 1, 3),
                                         1: ({"w": f32([1.0, -0.2]), "n": n}, 1, 1)})
    m1, v1 = np.array([0.5, 0.05]), np.array([0.5, 0.005])  # 0.5 delta, 0.5 delta^2 (from v = 0: sign(0 - d^2) = -1)
    want1 = m1 / (np.sqrt(v1) + 0.01)  # [0.6983, 0.6195]
    np.testing.assert_allclose(x1["w"], want1, rtol=1e-5)
    reddi = m1 / (np.sqrt(0.01**2 + v1) + 0.01)  # v_{-1} = tau^2: round 1 would differ
    assert np.abs(reddi - want1).max() > 3e-3
    assert x1["w"].dtype == np.float32 and x1["n"].dtype == np.int64
    # round 2: delta = [0.2, (3 * 1.2 + 0.4) / 4] = [0.2, 1.0]
    x2 = _round(s, cmap, nodes, 2, x1, {0: ({"w": x1["w"] + f32([0.2, 1.2]), "n": n}, 1, 3),
                                         1: ({"w": x1["w"] + f32([0.2, 0.4]), "n": n}, 1, 1)})
    d2 = np.array([0.2, 1.0])
    m2 = 0.5 * m1 + 0.5 * d2  # [0.35, 0.525]
    v2 = np.array([0.5 - 0.5 * 0.04, 0.005 + 0.5 * 1.0])  # entry 0: v > d^2, sign +1, v falls; entry 1: sign -1
    np.testing.assert_allclose(v2, v1 - 0.5 * d2**2 * np.sign(v1 - d2**2))
    want2 = x1["w"] + m2 / (np.sqrt(v2) + 0.01)
    np.testing.assert_allclose(x2["w"], want2, rtol=1e-5)
    np.testing.assert_allclose(s.v_t["w"], v2, rtol=1e-5)
    np.testing.assert_allclose(s.m_t["w"], m2, rtol=1e-5)
    adam = x1["w"] + m2 / (np.sqrt(0.5 * v1 + 0.5 * d2**2) + 0.01)  # Adam's second moment: [0.27, 0.5025]
    assert abs(adam[0] - want2[0]) > 0.1


# --- Scaffold -----------------------------------------------------------------------------------------------------


def _quadratic_run(scaffold: bool, rounds=30, steps=10, lr=0.05):
    """Two clients, f_i(w) = h_i / 2 ||w - a_i||^2 with different curvatures: the joint optimum of f_1 + f_2 is
    (h_1 a_1 + h_2 a_2) / (h_1 + h_2); FedAvg's fixed point with several local steps is not."""
    h, a = [1.0, 10.0], [np.array([0.0, 0.0]), np.array([1.0, -2.0])]
    x = {"w": np.array([3.0, 3.0], np.float32)}
    c = {"w": np.zeros(2, np.float32)}
    cs = [{"w": np.zeros(2, np.float32)} for _ in h]
    for _ in range(rounds):
        ys, deltas = [], []
        for i in range(2):
            corr = scaffold_correction(c, cs[i]) if scaffold else {"w": np.zeros(2, np.float32)}
            y = x["w"].astype(np.float64)
            for _ in range(steps):
                y = y - lr * (h[i] * (y - a[i]) + corr["w"])
            ys.append({"w": y.astype(np.float32)})
            deltas.append(scaffold_control_delta(x, ys[-1], c, steps, lr))
            cs[i] = apply_delta(cs[i], deltas[-1])
        if scaffold:
            c = scaffold_server_control(c, deltas, 2)
        x = {k: v.astype(np.float32) for k, v in scaffold_model(x, ys, data_weights([1, 1]), ["w"], 1.0).items()}
    optimum = (h[0] * a[0] + h[1] * a[1]) / (h[0] + h[1])
    return float(np.linalg.norm(x["w"] - optimum))


def test_scaffold_corrects_the_drift_that_keeps_fedavg_from_the_joint_optimum():
    fedavg, scaffold = _quadratic_run(False), _quadratic_run(True)
    assert fedavg > 0.1  # FedAvg settles away from the optimum
    assert scaffold < 1e-3 < fedavg / 100, (scaffold, fedavg)


def test_scaffold_control_variate_is_option_ii_and_the_server_control_is_the_sum_over_n():
    x, y = {"w": np.array([1.0, 1.0], np.float32)}, {"w": np.array([0.5, 2.0], np.float32)}
    c = {"w": np.array([0.1, -0.1], np.float32)}
    d = scaffold_control_delta(x, y, c, steps=5, lr=0.1)  # (x - y) / (K lr) - c
    np.testing.assert_allclose(d["w"], [0.5 / 0.5 - 0.1, -1.0 / 0.5 + 0.1], rtol=1e-6)
    assert not scaffold_control_delta(x, y, c, steps=0, lr=0.1)["w"].any()  # no step, no change
    new_c = scaffold_server_control(c, [d, d], num_clients=4)  # c + (1/N) sum_{i in S} Delta c_i
    np.testing.assert_allclose(new_c["w"], c["w"] + 2 * d["w"] / 4, rtol=1e-6)


def test_scaffold_resends_c_i_to_a_client_whose_reply_was_dropped(task_identity):
    """A node updates its c_i before replying; when the server drops that reply, its copy is of an older round, so
    the client's next message carries that copy (and its round); a client in sync gets only c."""
    nodes = {70 + c: one(c) for c in range(2)}
    cmap = ClientMap(nodes)
    s = SeededScaffold(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=1).bind(cmap, 0)
    s.setup({"w": np.zeros(2, np.float32)}, ScaffoldParams.from_config(validate({"method": "scaffold"})))
    x = ArrayRecord({"w": Array(np.zeros(2, np.float32))})

    def play(rnd, bad):
        msgs = list(s.configure_train(rnd, x, ConfigRecord(), Grid(nodes)))
        sent = {int(m.content["client"]["client-id"]): m for m in msgs}

        def train(m):
            c = int(m.content["client"]["client-id"])
            dc = np.full(2, np.nan if c in bad else c + 1.0, np.float32)
            return Message(RecordDict({"arrays": ArrayRecord({"w": Array(np.ones(2, np.float32))}),
                                       "control": ArrayRecord({"w": Array(dc)}),
                                       "metrics": MetricRecord({"num-examples": 5})}), reply_to=m)

        s.aggregate_train(rnd, s.order_replies(cmap.send_and_receive(Grid(nodes, train), msgs, timeout=5)))
        return sent

    sent = play(1, set())
    assert all("control-own" not in m.content for m in sent.values()) and s.rejected == 0
    sent = play(2, {1})  # client 1's Delta c_i holds a NaN: dropped
    assert all("control-own" not in m.content for m in sent.values()) and s.rejected == 1
    sent = play(3, set())
    assert "control-own" not in sent[0].content and sent[0].content["scaffold"]["ci-round"] == 2
    assert sent[1].content["scaffold"]["ci-round"] == 1
    np.testing.assert_array_equal(sent[1].content["control-own"]["w"].numpy(), [2.0, 2.0])  # its c_i of round 1
    np.testing.assert_array_equal(sent[1].content["control"]["w"].numpy(), [2.0, 2.0])  # c: (1 + 2) / 2, then + 1 / 2


def test_gradient_correction_adds_to_each_gradient_and_is_removed_after():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    x = torch.randn(4, 3)

    def grads():
        model.zero_grad()
        model(x).pow(2).sum().backward()
        return {k: p.grad.clone() for k, p in model.named_parameters()}

    plain = grads()
    corr = {"weight": np.full((2, 3), 0.25, np.float32), "bias": np.array([1.0, -1.0], np.float32)}
    with gradient_correction(model, corr):
        corrected = grads()
    for k in plain:
        torch.testing.assert_close(corrected[k], plain[k] + torch.from_numpy(corr[k]))
    for k, g in grads().items():
        torch.testing.assert_close(g, plain[k])


class _KeptGrid(InProcessGrid):
    """The in-process grid, remembered so that a test can read its nodes' states afterwards."""

    made: list = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _KeptGrid.made.append(self)


SCAFFOLD = {**BASE, "method": "scaffold", "min-available-nodes": 4, "fraction-train": 1.0, "local-steps": 3,
            "num-server-rounds": 3, "checkpoint": True, "seed": 2, "lr": 0.05}


def test_scaffold_control_variates_live_in_the_node_state_and_come_back_after_a_resume(tmp_path, task_identity,
                                                                                       monkeypatch):
    """An uninterrupted 3-round run, and one stopped after round 2 and resumed in fresh nodes (new node state, as a
    new Flower run has): each node's c_i is the server's copy, round 3 is the same in both, and the resumed run
    sent every client its c_i once (more bytes down in round 3)."""
    require_fmnist()
    monkeypatch.setattr("hetfl.inprocess.InProcessGrid", _KeptGrid)
    _KeptGrid.made = []
    full = run_in_process(SCAFFOLD, 4, tmp_path, "full")
    state = read_checkpoint(tmp_path / "full" / "checkpoint.json")["strategy"]
    nodes = _KeptGrid.made[-1].contexts.values()
    # the server's copies of the c_i are one file per client beside the checkpoint, not in it (bounded memory)
    store = ClientStateStore(tmp_path / "full" / "scaffold-ci")
    assert "c_i" not in state and sorted(int(c) for c in state["ci_round"]) == [0, 1, 2, 3]
    assert all(v == 3 for v in state["ci_round"].values()) and all(store.rounds(c) == [2, 3] for c in range(4))
    assert any(np.abs(v).max() > 0 for v in state["c"].values())
    for ctx in nodes:
        client = int(ctx.node_config["partition-id"])
        kept = ctx.state[state_key(client, CI_STATE)]
        assert int(ctx.state[state_key(client, CI_ROUND_STATE)]["round"]) == 3
        for k, v in store.get(client, 3).items():
            np.testing.assert_array_equal(kept[k].numpy(), v)  # node and server agree bit for bit
        assert any(np.abs(kept[k].numpy()).max() > 0 for k in kept.keys())

    run_in_process({**SCAFFOLD, "stop-after-round": 2}, 4, tmp_path, "part")
    part = run_in_process({**SCAFFOLD, "resume": True}, 4, tmp_path, "part")
    a, b = full["rounds"], part["rounds"]
    assert [r["round"] for r in b] == [0, 1, 2, 3]
    assert (a[3]["accuracy"], a[3]["loss"], a[3]["bytes_up"]) == (b[3]["accuracy"], b[3]["loss"], b[3]["bytes_up"])
    assert b[3]["bytes_down"] > a[3]["bytes_down"] * 1.4  # c_i resent: 3x the parameters instead of 2x
    assert b[3]["failures"] == 0 and b[3]["rejected"] == 0


def test_scaffold_sends_twice_the_model_each_way_and_stc_uploads_a_quarter(tmp_path, task_identity):
    """Bytes as the MeteredGrid counts them from the serialised messages, one round, 4 clients."""
    require_fmnist()
    cfg = {**BASE, "min-available-nodes": 4, "fraction-train": 1.0, "num-server-rounds": 1, "seed": 1}
    rows = {m: run_in_process({**cfg, "method": m}, 4, tmp_path, m)["rounds"][1] for m in ("fedavg", "scaffold",
                                                                                           "fedavg-stc")}
    fedavg = rows["fedavg"]
    assert 1.95 < rows["scaffold"]["bytes_down"] / fedavg["bytes_down"] < 2.05
    assert 1.95 < rows["scaffold"]["bytes_up"] / fedavg["bytes_up"] < 2.05
    ratio = rows["fedavg-stc"]["bytes_up"] / fedavg["bytes_up"]
    assert 0.25 < ratio < 0.29, ratio  # 16-bit values of half the entries (1/4) + a bitmap of positions (1/32)
    assert rows["fedavg-stc"]["bytes_down"] == pytest.approx(fedavg["bytes_down"], rel=0.01)  # downloads stay dense


# --- FedAvg-STC ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("segments", [None, [300, 500, 200]])
def test_stc_update_is_the_top_half_by_magnitude_in_16_bits(segments):
    rng = np.random.default_rng(3)
    delta = (rng.normal(size=1000) * np.exp(rng.normal(size=1000))).astype(np.float32)
    enc = stc_encode(delta, 0.5, segments)
    assert enc["val"].dtype == np.float16 and len(enc["val"]) == 500
    expected = np.zeros_like(delta)
    start = 0
    for n in segments or [1000]:  # an independent top-k: sort each segment by |value|
        seg = delta[start:start + n]
        top = np.argsort(-np.abs(seg), kind="stable")[: n // 2] + start
        expected[top] = delta[top].astype(np.float16).astype(np.float32)
        start += n
    np.testing.assert_array_equal(stc_decode(enc), expected)
    with pytest.raises(ValueError, match="float16"):
        stc_decode({**enc, "val": enc["val"].astype(np.float32)})


def test_stc_error_feedback_keeps_what_was_not_sent_on_the_client(tmp_path, task_identity, monkeypatch):
    """With stc-error-feedback the node keeps delta - decoded(upload); without it nothing."""
    require_fmnist()
    monkeypatch.setattr("hetfl.inprocess.InProcessGrid", _KeptGrid)
    cfg = {**BASE, "method": "fedavg-stc", "min-available-nodes": 2, "fraction-train": 1.0, "num-server-rounds": 1}
    for feedback in (False, True):
        _KeptGrid.made = []
        run_in_process({**cfg, "stc-error-feedback": feedback}, 2, tmp_path, f"ef{feedback}")
        for ctx in _KeptGrid.made[-1].contexts.values():
            rest = ctx.state.get(state_key(int(ctx.node_config["partition-id"]), "stc-residual"))
            assert (rest is not None) == feedback
            if feedback:
                r = rest["r"].numpy()
                assert np.count_nonzero(r) >= r.size // 2 - 1  # the half not sent (+ the 16-bit rounding of the rest)


# --- configuration ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg, fragment", [
    ({"method": "scaffold", "momentum": 0.9}, "'momentum' = 0.9"),
    ({"method": "fednova", "optimizer": "adam"}, "'optimizer' = 'adam'"),
    ({"method": "scaffold", "lr-schedule": "cosine"}, "'lr-schedule' = 'cosine'"),
    ({"method": "fedavg-stc", "stc-density": 0.0}, "stc-density"),
    ({"method": "fedyogi", "fedadam-update": "flower"}, "'fedadam-update' = 'flower' is not read by method 'fedyogi'"),
])
def test_bad_settings_name_the_key(cfg, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(")):
        validate(cfg)


def test_presets_are_the_fens_iterative_setting():
    from pathlib import Path
    import tomllib

    root = Path(__file__).resolve().parents[1] / "configs"
    for method in ("fednova", "scaffold", "fedavg-stc", "fedyogi"):
        presets = sorted((root / method).glob("fmnist-dir*.toml"))
        assert [p.stem for p in presets] == ["fmnist-dir0.01", "fmnist-dir0.05", "fmnist-dir0.1"]
        for p in presets:
            cfg = validate(tomllib.loads(p.read_text()))
            assert (cfg["method"], cfg["min-available-nodes"], cfg["fraction-train"], cfg["local-epochs"],
                    cfg["local-steps"], cfg["batch-size"], cfg["eval-split"]) == (method, 20, 1.0, 2, 0, 16, "test-half")
    for alpha in ("0.01", "0.05", "0.1"):  # FedYogi: the FedAdam presets but for the method (Table 6: lr 0.01 / 0.01)
        yogi, adam = (validate(tomllib.loads((root / m / f"fmnist-dir{alpha}.toml").read_text())) for m in ("fedyogi", "fedadam"))
        assert yogi == {**adam, "method": "fedyogi"}
        assert (yogi["lr"], yogi["fedadam-server-lr"], yogi["momentum"], yogi["num-server-rounds"]) == (0.01, 0.01, 0.0, 50)


def test_a_run_extended_from_its_checkpoint_equals_the_longer_run(tmp_path, task_identity):
    """scripts/reproduce.py --extend: a 2-round FedNova run (server momentum in the checkpoint) continued to 4 rounds
    is the 4-round run; runs of another config, with enough rounds, or of a method that cannot be extended are not
    continued."""
    require_fmnist()
    from .test_results import _reproduce_script

    rep = _reproduce_script()
    cfg = {**SCAFFOLD, "method": "fednova", "num-server-rounds": 4, "fednova-gmf": 0.9, "momentum": 0.9}
    full = run_in_process(cfg, 4, tmp_path, "full")
    run_in_process({**cfg, "num-server-rounds": 2}, 4, tmp_path / "grid", "short")
    assert rep.extendable(tmp_path / "grid" / "short", {**cfg, "lr": 0.1}) == f"{tmp_path / 'grid' / 'short'} was made with other config values"
    assert "as many rounds" in rep.extendable(tmp_path / "grid" / "short", {**cfg, "num-server-rounds": 2})
    assert rep.extendable(tmp_path / "grid" / "short", cfg) is None
    rep.start_from(tmp_path / "grid" / "short", tmp_path / "long")
    long = run_in_process({**cfg, "resume": True}, 4, tmp_path, "long")
    assert [r["round"] for r in long["rounds"]] == [0, 1, 2, 3, 4] and long["config"]["num-server-rounds"] == 4
    assert [m["from_round"] for m in long["machines"]] == [0, 3]  # rounds 3-4 played by the continued run
    for a, b in zip(full["rounds"], long["rounds"], strict=True):
        assert (a["accuracy"], a["loss"], a["bytes_up"]) == (b["accuracy"], b["loss"], b["bytes_up"])
    stc = {**SCAFFOLD, "method": "fedavg-stc", "num-server-rounds": 1, "stc-error-feedback": True}
    run_in_process(stc, 4, tmp_path / "grid", "stc")
    assert "error-feedback" in rep.extendable(tmp_path / "grid" / "stc", {**stc, "num-server-rounds": 2})


def test_scaffold_server_memory_does_not_grow_with_the_clients_it_has_seen(tmp_path):
    """10,000 clients, 5 rounds of 100 distinct clients with a CNN-sized c_i each: with the store the server's
    Python heap stays at c and the ci_round table (each c_i is written to its file and dropped), where the in-memory
    copy grows by one c_i per client seen."""
    import tracemalloc

    from hetfl.baselines.strategy import SeededScaffold

    params = {"w": np.zeros((256, 1024), np.float32)}  # 1 MiB per c_i
    mem = {}
    for where in ("memory", "store"):
        s = SeededScaffold(fraction_train=0.01).setup(params, ScaffoldParams())
        if where == "store":
            s.keep_state_in(tmp_path / where)
        rng = np.random.default_rng(0)
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        for rnd in range(1, 6):
            for client in range((rnd - 1) * 100, rnd * 100):
                s._set_c_i(client, rnd, {"w": rng.standard_normal((256, 1024)).astype(np.float32)})
        mem[where] = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        assert len(s.ci_round) == 500 and np.array_equal(s.c_i(250)["w"].shape, (256, 1024))
    assert mem["memory"] > 500 * 2**20 * 0.95, mem  # every c_i seen stays in memory
    assert mem["store"] < 2 * 2**20, mem  # a table of rounds: bounded by one c_i, whatever the clients seen
