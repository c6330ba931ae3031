import numpy as np
import pytest

from hetfl.common.comm import decode_sparse, encode_sparse, put_sparse, record_nbytes
from hetfl.common.compression import StateLayout, topk_count, topk_sparsify
from hetfl.common.task import make_model, model_to_arrays
from hetfl.methods import validate
from hetfl.common.params import FederationParams
from hetfl.shefl_app.keys import SHEFLParams
from hetfl.shefl_app.core import (
    PermutationSchedule, aggregate_deltas, hpc_partitions, make_clusters, sample_from_clusters,
    topk_densities, workload_weights,
)
from hetfl.common.task import pack_models, unpack_models
from flwr.app import Array, ArrayRecord

from .conftest import LoopbackGrid, identity_map, replies_to, require_fmnist


# --- permutation schedule -------------------------------------------------------------
@pytest.mark.parametrize("M,slots", [(5, 5), (5, 10), (3, 7), (5, 3), (1, 4), (4, 0)])
def test_schedule_rows_are_permutations_and_columns_balanced(M, slots):
    sched = PermutationSchedule(M, slots, seed=3)
    for block in range(4):
        P = sched.matrix(block)
        assert P.shape == (slots, M)
        for row in P:
            assert sorted(row.tolist()) == list(range(M))  # each slot trains every model once per block
        for col in P.T:
            counts = np.bincount(col, minlength=M)
            assert counts.max() - counts.min() <= 1  # balanced: C_l/M per model
            if slots % M == 0:
                assert set(counts.tolist()) <= {slots // M}


def test_schedule_changes_every_M_rounds_and_is_seeded():
    M, slots = 5, 5
    s1, s2, s3 = PermutationSchedule(M, slots, 0), PermutationSchedule(M, slots, 0), PermutationSchedule(M, slots, 1)
    rounds = {t: s1.models_for_round(t) for t in range(1, 4 * M + 1)}
    assert all(np.array_equal(rounds[t], s2.models_for_round(t)) for t in rounds)  # deterministic
    assert any(not np.array_equal(rounds[t], s3.models_for_round(t)) for t in rounds)  # seed matters
    for b in range(4):  # within a block of M rounds, every slot sees every model
        block = np.stack([rounds[t] for t in range(b * M + 1, (b + 1) * M + 1)], axis=1)
        assert all(sorted(r.tolist()) == list(range(M)) for r in block)
    blocks = [np.stack([rounds[t] for t in range(b * M + 1, (b + 1) * M + 1)]) for b in range(4)]
    assert any(not np.array_equal(blocks[0], b) for b in blocks[1:])  # regenerated


# --- sampling and roles --------------------------------------------------------------
def test_clusters_and_sampling():
    nodes = [2**63 + 17 * i for i in range(50)]  # uint64-sized ids must survive exactly
    clusters = make_clusters(nodes, 5, seed=1)
    assert sorted(n for c in clusters for n in c) == sorted(nodes) and {len(c) for c in clusters} == {10}
    rng = np.random.default_rng(0)
    picks = sample_from_clusters(clusters, rng)
    assert all(p in c for p, c in zip(picks, clusters))
    assert make_clusters(nodes, 5, seed=1) == clusters
    assert len(hpc_partitions(100, 0.5, 0)) == 50 and hpc_partitions(100, 0.5, 0) == hpc_partitions(100, 0.5, 0)


def test_sampling_draws_among_the_available_clients_of_each_cluster():
    """RandSelect(S_c) over the clients that can be sampled this round (a fleet's availability, a node that is gone):
    only available ones are drawn; all available gives the same draws as no filter; a cluster with none available
    keeps a draw (its slot stays empty), so later clusters' draws do not shift."""
    clusters = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    every = sample_from_clusters(clusters, np.random.default_rng(3))
    assert sample_from_clusters(clusters, np.random.default_rng(3), set(range(10))) == every
    for seed in range(20):
        picks = sample_from_clusters(clusters, np.random.default_rng(seed), {1, 2, 6})
        assert picks[0] in (1, 2) and picks[1] == 6 and picks[2] in (8, 9)


# --- coefficients (Eq. 2) --------------------------------------------------------------
def test_balanced_equals_paper_full_at_default_setting():
    # C_h = C_l = M = 5: each model is trained by H = 5 HPCs and L = C_l / M = 1 LPC
    assert workload_weights(5, 1, "balanced") == pytest.approx(workload_weights(5, 1, "paper-full", M=5, C_h=5, C_l=5))
    assert workload_weights(5, 1, "balanced") == pytest.approx((0.6, 3.0))


@pytest.mark.parametrize("H,L", [(5, 1), (1, 5), (3, 2), (7, 3), (1, 1), (10, 4)])
def test_balanced_gives_hpc_and_lpc_means_equal_weight(H, L):
    a_h, a_l = workload_weights(H, L, "balanced")
    # weight of the HPC mean and of the LPC mean in 1/(H+L) * sum a_i delta_i
    assert a_h * H / (H + L) == pytest.approx(0.5) and a_l * L / (H + L) == pytest.approx(0.5)
    rng = np.random.default_rng(H * 10 + L)
    hpc, lpc = [rng.standard_normal(6) for _ in range(H)], [rng.standard_normal(6) for _ in range(L)]
    out = aggregate_deltas(hpc, lpc, a_h, a_l)
    assert np.allclose(out, 0.5 * np.mean(hpc, 0) + 0.5 * np.mean(lpc, 0), atol=1e-6)


def test_missing_group_and_uniform():
    rng = np.random.default_rng(0)
    d = [rng.standard_normal(4) for _ in range(3)]
    for H, L, hpc, lpc in ((3, 0, d, []), (0, 3, [], d)):
        a_h, a_l = workload_weights(H, L, "balanced")
        assert np.allclose(aggregate_deltas(hpc, lpc, a_h, a_l), np.mean(d, 0), atol=1e-6)
    assert aggregate_deltas([], [], 1.0, 1.0) is None
    assert workload_weights(4, 2, "uniform") == (1.0, 1.0)
    assert workload_weights(5, 1, "paper-icassp", M=5) == pytest.approx((6 / 10 * 1 / 5, 3.0))
    with pytest.raises(ValueError):
        workload_weights(1, 1, "nope")


def test_densities():
    assert topk_densities(0.1, 5, 5) == (0.1, pytest.approx(0.1))  # 1:5, M=5: same density
    assert topk_densities(0.1, 1, 5) == (0.1, pytest.approx(0.02))  # 1:1: k/M
    assert topk_densities(0.5, 10, 5) == (0.5, 1.0)  # capped at dense


# --- top-k and bytes ------------------------------------------------------------------------
def test_topk_keeps_exactly_the_k_largest():
    rng = np.random.default_rng(0)
    v = rng.standard_normal(10_000).astype(np.float32)
    idx, val = topk_sparsify(v, 0.1)
    assert len(idx) == 1000 == topk_count(10_000, 0.1)
    assert np.abs(v[idx]).min() >= np.abs(np.delete(v, idx)).max()
    assert np.array_equal(val, v[idx])
    # ties resolved deterministically, exact k
    t = np.ones(100, np.float32)
    assert len(topk_sparsify(t, 0.1)[0]) == 10 and topk_sparsify(t, 0.1)[0].tolist() == list(range(10))
    # per-tensor: density applied to each segment
    idx2, _ = topk_sparsify(v, 0.1, segments=[1000, 9000])
    assert (idx2 < 1000).sum() == 100 and (idx2 >= 1000).sum() == 900


def test_upload_bytes_at_k_01_are_at_most_02_of_dense():
    cfg = validate({"dataset": "fashion_mnist", "model": "cnn"})
    state = {k: v.numpy() for k, v in model_to_arrays(make_model(cfg)).items()}
    layout = StateLayout.of(state)
    delta = np.random.default_rng(0).standard_normal(layout.size).astype(np.float32)
    dense = ArrayRecord({k: Array(v) for k, v in layout.unflatten(delta, state).items()})
    sparse = ArrayRecord()
    put_sparse(sparse, "m0", encode_sparse(*topk_sparsify(delta, 0.1), layout.size))
    ratio = record_nbytes(sparse) / record_nbytes(dense)
    assert ratio <= 0.2, ratio
    idx, val, size = decode_sparse({k.split(".")[1]: v.numpy() for k, v in sparse.items()})
    assert size == layout.size and len(idx) == topk_count(layout.size, 0.1)


def test_pack_unpack_models():
    cfg = validate({"dataset": "digits", "model": "resnet8"})
    states = [{k: v.numpy() for k, v in model_to_arrays(make_model(cfg, seed=s)).items()} for s in range(3)]
    back = unpack_models(pack_models(states), 3)
    assert all(np.array_equal(a[k], b[k]) for a, b in zip(states, back) for k in a)
    assert not np.array_equal(back[0]["conv1.weight"], back[1]["conv1.weight"])  # distinct inits
    skipped = unpack_models(pack_models(states, skip=1), 3)  # FENS: a client's own model is not sent
    assert skipped[1] == {} and all(np.array_equal(skipped[2][k], states[2][k]) for k in states[2])
    layout = StateLayout.of(states[0])
    assert "bn1.num_batches_tracked" not in layout.keys and "bn1.running_mean" in layout.keys
    v = layout.flatten(states[0])
    assert all(np.array_equal(x, states[0][k]) for k, x in layout.unflatten(v, states[0]).items())


# --- per-role local work (straggler study, Fig. 7) ------------------------------------------------
def test_role_work_and_its_check():
    from hetfl.common.config import ConfigError
    from hetfl.shefl_app.keys import role_work

    cfg = validate({"method": "shefl", "shefl-hpc-local-epochs": 10, "shefl-lpc-local-epochs": 1})
    assert role_work(cfg, "hpc") == (0, 10) and role_work(cfg, "lpc") == (0, 1)
    cfg = validate({"method": "shefl", "shefl-lpc-local-steps": 3})
    assert role_work(cfg, "lpc") == (3, None) and role_work(cfg, "hpc") == (None, None)
    with pytest.raises(ConfigError, match="'shefl-hpc-local-steps' = 5 and 'shefl-hpc-local-epochs' = 2"):
        validate({"method": "shefl", "shefl-hpc-local-steps": 5, "shefl-hpc-local-epochs": 2})


@pytest.mark.parametrize("role,want", [("hpc", (0, 10)), ("lpc", (0, 1))])
def test_straggler_work_reaches_local_training(role, want, monkeypatch, task_identity):
    from types import SimpleNamespace

    from flwr.app import ConfigRecord, Context, Message, RecordDict

    from hetfl.data.arrays import ArrayData
    from hetfl.shefl_app import client_app

    run_config = {"method": "shefl", "dataset": "digits", "shefl-models": 2, "shefl-hpc-local-epochs": 10, "shefl-lpc-local-epochs": 1}
    cfg = validate(run_config)
    seen = []

    def fake_train(model, data, cfg, rnd, *, steps=None, epochs=None, seed_offset=0):
        seen.append((steps, epochs))
        return SimpleNamespace(loss=0.0, seconds=0.0, flops=0)

    monkeypatch.setattr(client_app, "local_train", fake_train)
    monkeypatch.setattr(client_app, "client_data", lambda ctx, cfg, client: ArrayData(np.zeros((4, 1, 8, 8), np.uint8), np.zeros(4, np.int64)))
    arrays = model_to_arrays(make_model(cfg))
    models = [0, 1] if role == "hpc" else [1]
    content = RecordDict({**{f"model.{m}": arrays for m in models},
                          "config": ConfigRecord({"server-round": 1, "role": role, "models": models, "density": 1.0})})
    msg = Message(content, message_type="train.shefl", dst_node_id=1)
    ctx = Context(1, 1, {"partition-id": 0, "num-partitions": 4}, RecordDict(), run_config)
    client_app.train(msg, ctx, validate(run_config))
    assert seen == [want] * len(models)


# --- Algorithm 1 on hand-made replies -------------------------------------------------------------
def _shefl(**over):
    from hetfl.shefl_app.strategy import SHEFL

    cfg = validate({"method": "shefl", "shefl-models": 2, "shefl-hpc-per-round": 2, "fraction-train": 1.0, **over})
    roles = {1: "hpc", 2: "hpc", 3: "lpc", 4: "lpc", 5: "lpc"}
    return SHEFL(SHEFLParams.from_config(cfg), FederationParams.from_config(cfg), device_class=roles, client_map=identity_map(roles))


def _delta_content(deltas):
    from flwr.app import MetricRecord, RecordDict

    rec = ArrayRecord()
    for m, d in deltas.items():
        idx = np.flatnonzero(d)
        put_sparse(rec, f"m{m}", encode_sparse(idx, d[idx].astype(np.float32), d.size))
    return RecordDict({"deltas": rec, "metrics": MetricRecord({"train_loss": 0.1})})


def test_aggregation_by_hand_with_unequal_hpc_and_lpc_counts(task_identity):
    strat = _shefl()  # balanced coefficients: the HPC mean and the LPC mean of each model weigh 1/2 each
    states = [{"w": np.zeros(4, np.float32)}, {"w": np.ones(4, np.float32)}]
    strat._states, strat.layout = states, StateLayout.of(states[0])
    strat.sent = {1: ("hpc", [0, 1]), 2: ("hpc", [0, 1]), 3: ("lpc", [0]), 4: ("lpc", [1]), 5: ("lpc", [1])}
    e = np.eye(4, dtype=np.float32)
    replies = replies_to(strat.map, {
        1: _delta_content({0: 1 * e[0], 1: 2 * e[2]}), 2: _delta_content({0: 3 * e[0], 1: 4 * e[2]}),  # HPCs
        3: _delta_content({0: 4 * e[1]}), 4: _delta_content({1: 8 * e[3]}), 5: _delta_content({1: 4 * e[3]}),  # LPCs
    })
    arrays, _ = strat.aggregate_train(1, replies)
    new = unpack_models(arrays, 2)
    # model 0: H = 2 (mean 2 e0), L = 1 (4 e1) -> + (2 e0 + 4 e1) / 2; swapping a_h and a_l gives (1, 2) the other way
    assert new[0]["w"].tolist() == [1.0, 2.0, 0.0, 0.0]
    # model 1: H = 2 (mean 3 e2), L = 2 (mean 6 e3) -> 1 + (3 e2 + 6 e3) / 2
    assert new[1]["w"].tolist() == [1.0, 1.0, 2.5, 4.0]
    assert strat.last_round["H_m0"] == 2 and strat.last_round["L_m0"] == 1 and strat.last_round["L_m1"] == 2


def test_hpc_and_lpc_densities_reach_the_clients(task_identity):
    from flwr.app import ConfigRecord

    strat = _shefl(**{"shefl-topk-density": 0.1, "shefl-resource-ratio": 10.0})  # k_h = min(1, k r / M) = 0.5
    states = [{"w": np.full(4, float(m), np.float32)} for m in range(2)]
    messages = strat.configure_train(1, pack_models(states), ConfigRecord(), LoopbackGrid(strat.map.hosted, None))
    got = {str(m.content["config"]["role"]): float(m.content["config"]["density"]) for m in messages}
    assert got == {"hpc": 0.5, "lpc": 0.1}
    for m in messages:  # each model travels with its own global weights
        for j in m.content["config"]["models"]:
            assert m.content[f"model.{j}"]["w"].numpy().tolist() == [float(j)] * 4


def test_hpcs_train_each_model_from_its_own_global_weights(monkeypatch, task_identity):
    from types import SimpleNamespace

    from flwr.app import ConfigRecord, Context, Message, RecordDict

    from hetfl.data.arrays import ArrayData
    from hetfl.shefl_app import client_app

    run_config = {"method": "shefl", "dataset": "digits", "shefl-models": 3}
    cfg = validate(run_config)
    starts = []

    def fake_train(model, data, cfg, rnd, **kw):
        starts.append(float(next(model.parameters()).detach().sum()))
        return SimpleNamespace(loss=0.0, seconds=0.0, flops=0)

    monkeypatch.setattr(client_app, "local_train", fake_train)
    monkeypatch.setattr(client_app, "client_data", lambda ctx, cfg, client: ArrayData(np.zeros((4, 1, 8, 8), np.uint8), np.zeros(4, np.int64)))
    per_model = [model_to_arrays(make_model(cfg, seed=s)) for s in range(3)]
    content = RecordDict({**{f"model.{m}": per_model[m] for m in range(3)},
                          "config": ConfigRecord({"server-round": 1, "role": "hpc", "models": [0, 1, 2], "density": 1.0})})
    client_app.train(Message(content, message_type="train.shefl", dst_node_id=1),
                     Context(1, 1, {"partition-id": 0, "num-partitions": 4}, RecordDict(), run_config), validate(run_config))
    first = next(iter(per_model[0].keys()))
    assert starts == pytest.approx([float(per_model[m][first].numpy().sum()) for m in range(3)], rel=1e-4)
    assert len(set(starts)) == 3


def test_lr_decay_and_weight_decay_reach_the_optimizer(monkeypatch):
    from hetfl.common import task
    from hetfl.data.arrays import ArrayData

    seen = {}
    monkeypatch.setattr(task, "train", lambda model, data, norm, **kw: seen.update(kw))
    cfg = validate({"dataset": "digits", "lr": 0.01, "lr-decay": 0.99, "lr-decay-every": 10, "weight-decay": 1e-3})
    task.local_train(make_model(cfg), ArrayData(np.zeros((2, 1, 8, 8), np.uint8), np.zeros(2, np.int64)), cfg, 21)
    assert seen["lr"] == pytest.approx(0.01 * 0.99**2) and seen["weight_decay"] == 1e-3


def test_fedensemble_preset_runs(tmp_path, task_identity):
    import tomllib
    from pathlib import Path

    from .inprocess import run_in_process

    require_fmnist()
    preset = tomllib.loads((Path(__file__).resolve().parent.parent / "configs/fedensemble/fmnist-dir0.6.toml").read_text())
    over = {"data-source": "local", "num-server-rounds": 1, "min-available-nodes": 10, "fraction-train": 0.5,
            "local-steps": 2, "max-test-samples": 300, "checkpoint": False}
    m = run_in_process({**preset, **over}, 10, tmp_path, "fedens")
    last = m["rounds"][-1]
    assert last["round"] == 1 and last["replies"] == 5 and last["bytes_up"] > 0
    assert sum(last[f"H_m{j}"] for j in range(5)) == 0 and sum(last[f"L_m{j}"] for j in range(5)) == 5  # C_h = 0


def test_restricted_fedensemble_samples_every_device_for_one_model_with_its_own_work(task_identity):
    from flwr.app import ConfigRecord

    from hetfl.common.config import ConfigError
    from hetfl.shefl_app.strategy import SHEFL

    cfg = validate({"method": "shefl", "shefl-models": 2, "shefl-hpc-per-round": 0, "fraction-train": 0.5, "shefl-hpc-models": "one",
                    "shefl-topk-density": 1.0, "shefl-coefficients": "uniform"})
    roles = {n: ("hpc" if n < 6 else "lpc") for n in range(12)}
    strat = SHEFL(SHEFLParams.from_config(cfg), FederationParams.from_config(cfg), device_class=roles, client_map=identity_map(roles))
    states = [{"w": np.zeros(4, np.float32)} for _ in range(2)]
    seen_hpc = set()
    for rnd in range(1, 9):
        for m in strat.configure_train(rnd, pack_models(states), ConfigRecord(), LoopbackGrid(strat.map.hosted, None)):
            conf, c = m.content["config"], int(m.content["client"]["client-id"])
            assert len(conf["models"]) == 1 and float(conf["density"]) == 1.0
            assert str(conf["role"]) == roles[c]  # the device's own work
            seen_hpc |= {c} if roles[c] == "hpc" else set()
    assert seen_hpc  # HPC devices are sampled too (plain Fed-Ensemble with shefl-hpc-per-round = 0 never samples them)
    with pytest.raises(ConfigError, match="'shefl-hpc-per-round' = 5 must be 0"):
        validate({"method": "shefl", "shefl-hpc-models": "one"})
