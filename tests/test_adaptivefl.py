"""AdaptiveFL: pool slicing, client-side pruning, Algorithm 2, RL tables and selection, strategy checks, e2e."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict

from .conftest import require_fmnist
from hetfl.adaptivefl_app import core
from hetfl.adaptivefl_app.core import ClientSelector, SubmodelPool, aggregate_submodels, slice_state
from hetfl.adaptivefl_app.strategy import LEVELS, AdaptiveFL
from hetfl.adaptivefl_app.keys import AdaptiveFLParams
from hetfl.common.params import FederationParams
from hetfl.adaptivefl_app.simulate import simulate_selection, summarize
from hetfl.adaptivefl_app.task import pool_of
from hetfl.common.config import ConfigError
from hetfl.methods import validate
from hetfl.common.models import build_model, get_state, set_state
from hetfl.common.task import pack_models, unpack_models

CNN = ("cnn", 10, (1, 28, 28))
ADAPTIVE_FL = {"method": "adaptivefl", "dataset": "fashion_mnist", "model": "cnn"}


@pytest.fixture(scope="module")
def cnn_pool():
    return SubmodelPool(*CNN)


# --- pool and slicing -------------------------------------------------------------------------

def test_vgg16_pool_matches_table1():
    pool = SubmodelPool("vgg16", 10, (3, 32, 32), (0.66, 0.40), (8, 6, 4))
    got = {e.name: e.size for e in pool.entries}
    table1 = {"L1": 33.65, "M1": 16.81, "M2": 15.41, "M3": 14.84, "S1": 8.39, "S2": 6.48, "S3": 5.67}  # millions
    for name, millions in table1.items():  # the paper rounds some and truncates others (S1 = 8,397,xxx)
        assert abs(got[name] / 1e6 - millions) < 0.01, (name, got[name])
    assert [e.name for e in pool.entries] == ["S3", "S2", "S1", "M3", "M2", "M1", "L1"]


# parameter counts of the authors' own models (models/vgg.py vgg_16_bn(10, False, 1, I, r) and models/resnet.py
# ResNet18_cifar(slim_idx, scale)), measured by building them; S3 .. L1
AUTHORS_SIZES = {
    ("vgg16", (1, 28, 28)): [2661580, 3477472, 5391538, 6675937, 7246705, 8651125, 14921674],
    ("resnet18-afl", (3, 32, 32)): [2102535, 2627906, 4629290, 5129201, 5497657, 6915161, 11378186],
}


@pytest.mark.parametrize("model,shape", list(AUTHORS_SIZES))
def test_pools_match_the_authors_models(model, shape):
    pool = SubmodelPool(model, 10, shape, batch_stats=True)
    assert [e.size for e in pool.entries] == AUTHORS_SIZES[model, shape]
    with torch.no_grad():  # and the smallest member runs on that input
        assert pool.build(0).eval()(torch.zeros(2, *shape)).shape == (2, 10)


@pytest.mark.parametrize("model,shape", [("cnn", (1, 28, 28)), ("resnet18", (3, 32, 32)), ("vgg16", (3, 32, 32)),
                                         ("vgg16", (1, 28, 28)), ("resnet18-afl", (3, 32, 32))])
def test_sizes_strictly_increase_along_pool(model, shape):
    pool = SubmodelPool(model, 10, shape)
    sizes = [e.size for e in pool.entries]
    assert all(a < b for a, b in zip(sizes, sizes[1:]))
    assert pool.entries[-1].size == sum(p.numel() for p in build_model(model, 10, shape).parameters())


@pytest.mark.parametrize("model,shape", [("cnn", (1, 28, 28)), ("resnet18", (3, 16, 16))])
def test_submodels_are_leading_slices_and_run(model, shape):
    torch.manual_seed(0)
    pool = SubmodelPool(model, 10, shape)
    full = get_state(build_model(model, 10, shape))
    x = torch.randn(2, *shape)
    for i, entry in enumerate(pool.entries):
        sub = pool.build(i)  # a real smaller nn.Module
        st = slice_state(full, pool.shapes(i))
        set_state(sub, st)  # keys and shapes match the module
        for k, v in get_state(sub).items():
            assert np.array_equal(v, full[k][tuple(slice(0, s) for s in v.shape)]), (entry.name, k)
        sub.eval()
        assert sub(x).shape == (2, 10)
        assert sum(p.numel() for p in sub.parameters()) == entry.size
    assert pool.entries[-1].widths == pool.full


def test_shallow_layers_never_pruned(cnn_pool):
    for e in cnn_pool.entries:
        assert e.widths[: cnn_pool.tau] == cnn_pool.full[: cnn_pool.tau]
        assert all(w == d for w, d in zip(e.widths[: e.start], cnn_pool.full))
    with pytest.raises(ValueError, match="tau"):
        SubmodelPool(*CNN, starts=(2, 0), tau=1)


def test_unordered_pool_is_rejected():
    with pytest.raises(ValueError, match="strictly increasing"):
        SubmodelPool(*CNN, starts=(3, 1))  # S1 (I=3) is larger than M2 (I=1)


# --- Algorithm 2 ------------------------------------------------------------------------------

def test_aggregation_of_full_models_equals_fedavg():
    rng = np.random.default_rng(0)
    g = {"w": rng.normal(size=(4, 3)).astype(np.float32), "b": rng.normal(size=4).astype(np.float32)}
    clients = [{k: rng.normal(size=v.shape).astype(np.float32) for k, v in g.items()} for _ in range(3)]
    n = [10.0, 30.0, 60.0]
    out = aggregate_submodels(g, clients, n)
    for k in g:
        assert np.allclose(out[k], sum(c[k] * w for c, w in zip(clients, n)) / sum(n), atol=1e-6)


def test_uncovered_parameters_keep_their_values_and_overlaps_are_weighted():
    g = {"w": np.full((4, 4), 7.0, np.float32), "n": np.array(3, np.int64)}
    small = {"w": np.ones((1, 2), np.float32), "n": np.array(5, np.int64)}
    mid = {"w": np.full((2, 3), 4.0, np.float32), "n": np.array(9, np.int64)}
    out = aggregate_submodels(g, [small, mid], [1.0, 3.0])
    assert out["w"][0, 0] == pytest.approx((1 * 1 + 4 * 3) / 4)  # covered by both
    assert out["w"][1, 2] == pytest.approx(4.0)  # only mid
    assert np.all(out["w"][2:, :] == 7.0) and np.all(out["w"][:, 3:] == 7.0)  # nobody: unchanged
    assert out["n"] == 8 and out["n"].dtype == np.int64
    assert out["w"].dtype == np.float32


# --- client-side pruning (Sec. 3.2) -------------------------------------------------------------

def test_fit_picks_the_largest_contained_model_that_fits(cnn_pool):
    sizes = [e.size for e in cnn_pool.entries]
    caps = sorted(set(sizes) | {s - 1 for s in sizes} | {s + 1 for s in sizes} | {0, 10**9})
    for sent in range(len(cnn_pool)):
        for cap in caps:
            ok = [i for i, e in enumerate(cnn_pool.entries) if e.size <= cap and cnn_pool[sent].contains(e)]
            want = max(ok, key=lambda i: sizes[i]) if ok else None
            assert cnn_pool.fit(sent, cap) == want
    assert cnn_pool.fit(cnn_pool.largest, sizes[-1]) == cnn_pool.largest  # fits: no pruning
    assert cnn_pool.fit(cnn_pool.largest, cnn_pool.tier_capacity("weak")) == cnn_pool.index("S1")
    assert cnn_pool.fit(cnn_pool.index("M2"), cnn_pool.tier_capacity("weak")) == cnn_pool.index("S2")  # S1 not inside M2


def test_client_prunes_to_its_capacity_and_server_learns_only_from_the_reply(task_identity):
    require_fmnist()
    run_config = {**ADAPTIVE_FL, "data-source": "local", "local-steps": 2, "batch-size": 8, "adaptivefl-tier-capacity": "fixed"}
    cfg = validate(run_config)
    pool = pool_of(cfg)
    full = get_state(build_model("cnn", 10, (1, 28, 28)))
    m2 = pool.index("M2")
    jobs = [pool.largest, m2]  # two jobs in one message (as Decoupled sends): each is fitted on its own
    msg = Message(RecordDict({"arrays": pack_models([full, slice_state(full, pool.shapes(m2))]),
                              "config": ConfigRecord({"server-round": 1, "pool-index": jobs, "slot": [0, 0], "prune": True})}),
                  message_type="train.adaptivefl", dst_node_id=1)
    from hetfl.adaptivefl_app import client_app

    for capacity, want in (("weak", ("S1", "S2")), ("medium", ("M1", "M2")), ("strong", ("L1", "M2")),
                           (str(pool.entries[0].size - 1), (None, None))):
        ctx = Context(1, 1, {"partition-id": 0, "num-partitions": 10, "capacity": capacity}, RecordDict(), run_config)
        reply = client_app.train(msg, ctx, validate(run_config))
        backs = [None if b == -1 else pool[b].name for b in reply.content["metrics"]["pool-index"]]
        assert backs == list(want), capacity
        got = unpack_models(reply.content["arrays"], 2)
        for state, name in zip(got, want):
            assert {k: v.shape for k, v in state.items()} == ({} if name is None else pool.shapes(pool.index(name)))


# --- RL tables and selection (Alg. 1 lines 12-26, Sec. 3.3) ----------------------------------

P3_TYPES = [0, 0, 0, 1, 1, 1, 2]  # S3 S2 S1 M3 M2 M1 L1


def test_table_update_when_trained_as_sent():
    Tc, Tr = core.init_tables(2, 3)
    core.update_tables(Tc, Tr, 1, sent=4, back=4, p=3, type_of=P3_TYPES)  # M2 trained as M2
    assert Tc[:, 1].tolist() == [1, 3, 1]  # type M counted for sent and back
    assert Tr[:, 1].tolist() == [1, 1, 1, 1, 2, 2, 2]  # +1 from M2 up to L1; no bonus below L1
    assert Tr[:, 0].tolist() == [1] * 7 and Tc[:, 0].tolist() == [1, 1, 1]
    core.update_tables(Tc, Tr, 1, sent=6, back=6, p=3, type_of=P3_TYPES)  # L1 trained as L1: +1, then +p
    assert Tr[:, 1].tolist() == [1, 1, 1, 1, 2, 2, 2 + 1 + 3]
    assert Tc[:, 1].tolist() == [1, 3, 3]


def test_table_update_when_pruned():
    Tc, Tr = core.init_tables(1, 3)
    Tr[:, 0] = [1, 1, 1, 5, 5, 5, 5]
    core.update_tables(Tc, Tr, 0, sent=6, back=2, p=3, type_of=P3_TYPES)  # L1 sent, S1 back
    assert Tc[:, 0].tolist() == [2, 1, 2]
    # Tr[S1] += p -> 4, then penalties 0, 1, 2, 3, 4 from S1 up to L1, floored at 0
    assert Tr[:, 0].tolist() == [1, 1, 4 - 0, 5 - 1, 5 - 2, 5 - 3, 5 - 4]
    Tr[:, 0] = [1, 1, 1, 1, 1, 1, 1]
    core.update_tables(Tc, Tr, 0, sent=6, back=2, p=3, type_of=P3_TYPES)
    assert Tr[:, 0].tolist() == [1, 1, 4, 0, 0, 0, 0]


def test_rewards_by_hand():
    Tc, Tr = core.init_tables(1, 3)
    # all ones: S numerator 7 + 6 + 5, M 4 + 3 + 2 over 3 * 7 = 21; L has one member: 1 / 7
    assert core.resource_reward(Tr, 0, P3_TYPES)[0] == pytest.approx(18 / 21)
    assert core.resource_reward(Tr, 4, P3_TYPES)[0] == pytest.approx(9 / 21)
    assert core.resource_reward(Tr, 6, P3_TYPES)[0] == pytest.approx(1 / 7)
    Tr[:, 0] = [0, 1, 2, 3, 4, 5, 6]  # total 21; S: (21 + 21 + 20) / 63, M: (18 + 15 + 11) / 63, L: 6 / 21
    assert core.resource_reward(Tr, 1, P3_TYPES)[0] == pytest.approx(62 / 63)
    assert core.resource_reward(Tr, 3, P3_TYPES)[0] == pytest.approx(44 / 63)
    assert core.resource_reward(Tr, 6, P3_TYPES)[0] == pytest.approx(6 / 21)
    Tc[:, 0] = [1, 4, 9]
    assert core.rewards(Tc, Tr, 6, P3_TYPES)[0] == pytest.approx((6 / 21) / 3)
    assert core.rewards(Tc, Tr, 4, P3_TYPES)[0] == pytest.approx(0.5 / 2)  # R_s capped at 0.5, R_c = 1/sqrt(4)
    assert core.rewards(Tc, Tr, 4, P3_TYPES, "curiosity")[0] == pytest.approx(0.5)
    assert core.rewards(Tc, Tr, 4, P3_TYPES, "resource")[0] == pytest.approx(44 / 63)  # +S: uncapped, no R_c


def test_selection_probabilities_sum_to_one_and_skip_zero_rewards():
    R = np.array([0.2, 0.0, 0.5, 0.3])
    P = core.selection_probabilities(R, excluded=[3])
    assert P.sum() == pytest.approx(1.0) and P[1] == 0 and P[3] == 0
    assert core.selection_probabilities(np.zeros(3)) is None


def test_selector_never_picks_zero_reward_or_repeats(cnn_pool):
    sel = ClientSelector(cnn_pool, "rl", seed=1)
    nodes = [11, 12, 13, 14]
    L1 = cnn_pool.largest
    for n in (11, 12):  # weak devices: L1 came back as S1 -> no resource score for L1 left
        sel.update(n, L1, cnn_pool.index("S1"))
    assert core.rewards(sel.Tc, sel.Tr, L1, sel.type_of)[:2].tolist() == [0.0, 0.0]
    picks = [sel.select(L1, nodes) for _ in range(300)]
    assert set(picks) == {13, 14}
    assert sel.select(L1, nodes, chosen=[13, 14]) is None  # only zero-reward clients left
    assert sel.select(0, nodes, chosen=[11, 12, 13]) == 14  # a client is chosen at most once per round


def test_plan_round_redraws_a_member_no_client_can_take_and_fills_each_slot_once(cnn_pool):
    sel = ClientSelector(cnn_pool, "rl", seed=1)
    L1, S1 = cnn_pool.largest, cnn_pool.index("S1")
    nodes = [11, 12, 13, 14]
    for n in nodes[:3]:  # three weak devices: L1 came back as S1, so only 14 has a resource score for L1 left
        sel.update(n, L1, S1)
    greedy = core.plan_round(cnn_pool, sel, np.random.default_rng(0), nodes, 4, "largest")
    assert [m for _, m in greedy] == [L1] and greedy[0][0] == 14  # one slot: nobody else can take L1
    rng = np.random.default_rng(0)
    for _ in range(50):
        plan = core.plan_round(cnn_pool, sel, rng, nodes, 4)
        assert sorted(c for c, _ in plan) == nodes  # every slot filled (another member is redrawn), no client twice
        assert all(m != L1 or c == 14 for c, m in plan)
    assert len(core.plan_round(cnn_pool, sel, rng, nodes, 9)) == 4  # at most one job per client
    with pytest.raises(ValueError, match="dispatch"):
        core.plan_round(cnn_pool, sel, rng, nodes, 4, "smallest")


def test_strategy_and_simulator_plan_with_the_same_function(cnn_pool):
    """The simulator's rounds are the strategy's plans: same seed, same RNG streams, same jobs."""
    cfg = validate({**ADAPTIVE_FL, "fraction-train": 0.1, "seed": 3})
    strat = AdaptiveFL(AdaptiveFLParams.from_config(cfg), FederationParams.from_config(cfg), pool=pool_of(cfg))
    sel = ClientSelector(pool_of(cfg), "rl", 3)
    rng = core.planning_rng(3)
    for _ in range(5):
        plan = strat.plan(list(range(100)))
        assert [(c, m) for c, _, m in plan] == core.plan_round(sel.pool, sel, rng, range(100), 10)
        for c, _, m in plan:  # both learn the same replies
            strat.selector.update(c, m, 0)
            sel.update(c, m, 0)


# --- devices (Sec. 4.1: the authors' uncertain environment) -------------------------------------

VGG = ("vgg16", 10, (3, 32, 32))


def test_gaussian_devices_are_the_authors_numbers_scaled_to_the_pool():
    vgg = SubmodelPool(*VGG)
    caps = core.tier_capacities(vgg)
    authors = {"weak": (8, 1, 6, 11), "medium": (16, 1, 13, 19), "strong": (35, 2, 25, 40)}  # millions, VGG16
    for tier, numbers in authors.items():  # VGG16's own pool gives back the authors' numbers
        got = (caps[tier].loc, caps[tier].scale, caps[tier].low, caps[tier].high)
        assert [g / 1e6 for g in got] == pytest.approx(numbers, rel=2e-3), tier
    fixed = core.tier_capacities(vgg, "fixed")
    rng = np.random.default_rng(0)
    assert [fixed[t].draw(rng) for t in core.TIERS] == [vgg[vgg.index(n)].size for n in ("S1", "M1", "L1")]


def test_no_draw_lets_a_tier_train_a_larger_type(cnn_pool):
    caps = core.tier_capacities(cnn_pool)
    smallest_m = min(e.size for e in cnn_pool.entries if e.type == "M")
    # the authors' weak limit scaled to the CNN (11 / 8.39 x S1 = 0.92M) would reach M2 (0.76M): capped below it
    assert 11 / 8.39 * cnn_pool[cnn_pool.index("S1")].size > smallest_m > caps["weak"].high
    assert caps["medium"].high < cnn_pool[cnn_pool.largest].size
    for tier, top in (("weak", "S"), ("medium", "M"), ("strong", "L")):
        draws = [core.request_capacity(caps[tier], 0, r, 7) for r in range(2000)]
        assert caps[tier].low <= min(draws) and max(draws) <= caps[tier].high
        types = {cnn_pool[cnn_pool.fit(cnn_pool.largest, d)].type for d in draws}
        assert max(types, key=core.TYPES.index) == top, (tier, types)  # never above its type, and it does reach it
    assert types == {"M", "L"}  # a strong device sometimes affords only M1 (its draw fell below L1)
    c = caps["medium"]
    assert core.request_capacity(c, 0, 3, 7) == core.request_capacity(c, 0, 3, 7)
    assert len({core.request_capacity(c, 0, 3, 7, j) for j in range(3)}) == 3  # a new draw at every request


def test_largest_affordable_is_the_expected_size_a_perfect_selector_gets_back(cnn_pool):
    fixed = core.Capacity(1.0, 0.0, 0.0, 0.0)
    assert core.largest_affordable(fixed, [2.0, 0.5, 1.0]) == 1.0  # fits 0.5 and 1.0, not 2.0
    half = core.Capacity(10.0, 1.0, 5.0, 15.0)
    assert half.p_fits(4.0) == 1.0 and half.p_fits(16.0) == 0.0 and half.p_fits(10.0) == pytest.approx(0.5)
    assert half.p_fits(11.0) == pytest.approx(0.158655, abs=1e-6)  # 1 - Phi(1)
    # hand-worked: P(>= 11) x 11 + P(10 <= c < 11) x 10 + P(c < 10) x 3
    assert core.largest_affordable(half, [3.0, 10.0, 11.0]) == pytest.approx(
        0.158655 * 11 + (0.5 - 0.158655) * 10 + 0.5 * 3, abs=1e-5)
    caps = core.tier_capacities(cnn_pool)  # the CNN's tiers against Monte Carlo draws of the same capacities
    sizes = [e.size for e in cnn_pool.entries]
    for tier in core.TIERS:
        draws = [core.request_capacity(caps[tier], 0, r, 3) for r in range(4000)]
        mc = np.mean([max([x for x in sizes if x <= d], default=0) for d in draws])
        assert core.largest_affordable(caps[tier], sizes) == pytest.approx(mc, rel=0.02), tier


def _simulate(pool, mode, rounds=300, seed=0):
    """Alg. 1 against simulated uncertain devices, without training: (waste rate, share of L1 sent to strong devices)."""
    s = summarize(simulate_selection(pool, mode, rounds, seed))
    return s["waste"], s["l1_to_strong"]


@pytest.mark.parametrize("pool_args", [VGG, CNN], ids=["vgg16", "cnn"])
def test_rl_selection_wastes_less_than_random_and_sends_l1_to_strong_devices(pool_args):
    pool = SubmodelPool(*pool_args)
    rl, rand, greed, s = (_simulate(pool, mode) for mode in ("rl", "random", "greed", "resource"))
    assert rl[0] < 0.7 * rand[0] and rand[0] < greed[0], (rl, rand, greed)  # measured: 0.17-0.18 / 0.30-0.33 / 0.48-0.52
    assert s[0] < 0.7 * rand[0]
    assert rl[1] > 0.55 and rand[1] < 0.45, (rl, rand)  # 30% of the devices are strong; RL: 65-68% of L1 go there
    g = summarize(simulate_selection(pool, "greed", rounds=20))
    assert g["l1_sent_per_round"] == 10 and 0 < g["l1_back_per_round"] < 10  # +Greed: only L1 is sent


@pytest.mark.parametrize("run, mode", [("adaptivefl-fmnist-dir0.6-r30/runs/adaptivefl-fmnist-dir0.6-s1", "rl"),
                                       ("adaptivefl-fmnist-dir0.6-ablations-r30/runs/adaptivefl-fmnist-dir0.6-greed-s0",
                                        "greed")])
def test_simulator_replays_the_committed_training_runs_selection_exactly(cnn_pool, run, mode):
    """Parameters sent and returned per round depend only on planning, selection and capacity draws, not on
    training: the simulator must give a committed 30-round run's numbers to the parameter."""
    rounds = json.loads((Path(__file__).parents[1] / "docs/results" / run / "metrics.json").read_text())["rounds"]
    rounds = [r for r in rounds if r["round"] >= 1]
    sim = simulate_selection(cnn_pool, mode, len(rounds), seed=int(run[-1]))
    assert [(r["params_sent"], r["params_back"]) for r in rounds] == [(x["sent"], x["back"]) for x in sim]


# --- sampling plans of the baselines (docs/readings.md#adaptivefl-baselines) ---------------------

def _planner(variant, tiers):
    cfg = validate({**ADAPTIVE_FL, "method": variant, "fraction-train": 0.1})
    return AdaptiveFL(AdaptiveFLParams.from_config(cfg), FederationParams.from_config(cfg), pool=pool_of(cfg), tiers=tiers)


def test_sampling_plans_of_the_baselines():
    tiers = dict(enumerate(core.assign_tiers(100, (4, 3, 3), 0)))
    rank = {n: core.TIERS.index(t) for n, t in tiers.items()}  # 0 weak: S1, 1 medium: up to M1, 2 strong: up to L1
    nodes = list(range(100))
    dec, repeated = _planner("decoupled", tiers), 0
    for _ in range(50):  # each model its own 10 affordable clients; the draws are independent
        plan = dec.plan(nodes)
        for slot, level in enumerate(LEVELS):
            got = [(c, m) for c, s, m in plan if s == slot]
            assert len(got) == len({c for c, _ in got}) == 10
            assert all(rank[c] >= slot and m == dec.pool.index(level) for c, m in got)
        repeated += len(plan) - len({c for c, _, _ in plan})
    assert repeated > 0  # some client trained two models in one round
    for variant in ("heterofl", "scalefl"):
        het, levels = _planner(variant, tiers), []
        for _ in range(300):  # a uniform level, then a client that affords it
            plan = het.plan(nodes)
            assert len({c for c, _, _ in plan}) == 10 and {s for _, s, _ in plan} == {0}
            for c, _, m in plan:
                level = LEVELS.index(het.pool[m].name)
                assert level <= rank[c]
                levels.append(level)
        assert np.bincount(levels) / len(levels) == pytest.approx([1 / 3] * 3, abs=0.04), variant
    large = _planner("all-large", tiers).plan(nodes)
    assert len({c for c, _, _ in large}) == 10 and {m for _, _, m in large} == {len(pool_of(validate(ADAPTIVE_FL))) - 1}
    afl = _planner("adaptivefl", None).plan(nodes)
    assert len({c for c, _, _ in afl}) == 10


# --- ScaleFL baseline (docs/readings.md#adaptivefl-scalefl) ---------------------------------------

def test_scalefl_levels_are_width_and_depth_slices_that_fit_the_tiers():
    cfg = validate({**ADAPTIVE_FL, "method": "scalefl"})
    ref, pool = pool_of(validate(ADAPTIVE_FL)), pool_of(cfg)
    assert [(e.name, e.depth) for e in pool.entries] == [("S1", 1), ("M1", 2), ("L1", 3)]
    assert pool[0].size <= ref.tier_capacity("weak") and pool[1].size <= ref.tier_capacity("medium")
    assert pool[1].ratio < 1.0  # M1 (layers 1-3 and two exits) must be narrowed to fit a medium device
    full = pool.shapes(pool.largest)
    x = torch.randn(3, 1, 28, 28)
    for i, e in enumerate(pool.entries):
        shapes = pool.shapes(i)
        assert all(k in full and all(a <= b for a, b in zip(v, full[k], strict=True)) for k, v in shapes.items())
        net = pool.build(i)
        outs = net.exit_logits(x)
        assert len(outs) == e.depth and torch.equal(net(x), outs[-1])  # evaluated: the deepest exit
    assert pool[2].contains(pool[1]) and not pool[1].contains(pool[2])


def test_scalefl_vgg16_is_the_authors_model():
    from hetfl.adaptivefl_app.scalefl import ScaleFLNet
    from hetfl.common.models import hidden_widths

    # the authors' vgg_16_scaleFL(10, False, channels, 1.0) (models/vgg2.py, exits after convs 8 and 10), measured
    for shape, authors in (((3, 32, 32), 71_493_726), ((1, 28, 28), 15_321_054)):
        net = ScaleFLNet("vgg16", 10, shape, hidden_widths("vgg16", shape), (8, 10), 3, batch_stats=True)
        assert sum(p.numel() for p in net.parameters()) == authors


class _Exits(torch.nn.Module):
    def __init__(self, logits):
        super().__init__()
        self.logits = logits

    def exit_logits(self, x):
        return self.logits


def test_scalefl_loss_by_hand():
    from hetfl.adaptivefl_app.scalefl import scalefl_loss

    y = torch.tensor([0, 1])
    z1, z2 = torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([[0.5, 0.0], [3.0, 0.0]])
    ce = torch.nn.functional.cross_entropy
    model = _Exits([z1, z2])
    assert scalefl_loss()(model, None, y).item() == pytest.approx(((1 * ce(z1, y) + 2 * ce(z2, y)) / 3).item())
    T = 3.0  # distillation from the deepest exit into the shallower one only
    p2 = torch.softmax(z2 / T, 1)
    kl = (p2 * (p2.log() - torch.log_softmax(z1 / T, 1))).sum(1).mean()
    want = (1 * (ce(z1, y) + 0.5 * T**2 * kl) + 2 * ce(z2, y)) / 3
    assert scalefl_loss(0.5)(model, None, y).item() == pytest.approx(want.item())
    assert scalefl_loss(0.5)(_Exits([z2]), None, y).item() == pytest.approx(ce(z2, y).item())


def test_batchnorm_uses_batch_statistics_unless_asked():
    cifar = {**ADAPTIVE_FL, "model": "resnet18", "dataset": "cifar10"}
    pool = pool_of(validate(cifar))
    assert not any("running" in k or "num_batches" in k for k in pool.shapes(pool.largest))
    running = pool_of(validate({**cifar, "adaptivefl-bn": "running"}))
    assert any("running_mean" in k for k in running.shapes(running.largest))
    model = pool.build(0).eval()  # evaluation also normalises by the batch's own statistics
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        assert not torch.allclose(model(x)[:1], model(torch.cat([x[:1], 5 * x[1:]]))[:1])


# --- strategy ---------------------------------------------------------------------------------

def _reply(task_identity_node, content):
    msg = Message(RecordDict({"config": ConfigRecord({})}), message_type="train.adaptivefl", dst_node_id=task_identity_node)
    return Message(content, reply_to=msg)


def _content(state, index, n=10):
    return RecordDict({"arrays": pack_models([state]),
                       "metrics": MetricRecord({"num-examples": n, "pool-index": [index], "train_loss": 0.1})})


def test_strategy_rejects_malformed_updates(task_identity, cnn_pool):
    strat = AdaptiveFL(AdaptiveFLParams(), FederationParams(), pool=cnn_pool)
    full = get_state(build_model(*CNN))
    m1 = cnn_pool.index("M1")
    good = slice_state(full, cnn_pool.shapes(m1))
    assert strat.check_reply(_reply(1, _content(good, m1)), [cnn_pool.largest])[0] == [m1]
    assert strat.check_reply(_reply(1, _content({}, -1)), [cnn_pool.largest])[0] == [None]  # nothing fit
    bad_shape = {**good, "classifier.1.bias": np.zeros(3, np.float32)}
    nan = {k: v.copy() for k, v in good.items()}
    nan["classifier.1.weight"][0, 0] = np.nan
    for content, sent, match in (
        (_content(bad_shape, m1), cnn_pool.largest, "shape"),
        (_content(nan, m1), cnn_pool.largest, "NaN"),
        (_content(good, m1), cnn_pool.index("M2"), "not a submodel"),  # bigger than what was sent
        (_content(good, 99), cnn_pool.largest, "out of range"),
        (_content({k: v for k, v in good.items() if k != "classifier.1.bias"}, m1), cnn_pool.largest, "keys"),
        (_content(good, -1), cnn_pool.largest, "keys"),  # "nothing fit" with arrays attached
    ):
        with pytest.raises(ValueError, match=match):
            strat.check_reply(_reply(1, content), [sent])
    with pytest.raises(ValueError, match="2 jobs"):
        strat.check_reply(_reply(1, _content(good, m1)), [cnn_pool.largest, m1])


def test_invalid_adaptivefl_config_names_the_key():
    with pytest.raises(ConfigError, match="adaptivefl-ratios"):
        validate({**ADAPTIVE_FL, "adaptivefl-ratios": "0.4,0.66"})
    with pytest.raises(ConfigError, match="adaptivefl-tier-proportions"):
        validate({**ADAPTIVE_FL, "adaptivefl-tier-proportions": "4:3"})
    with pytest.raises(ConfigError, match="model"):
        validate({**ADAPTIVE_FL, "model": "mobilenetv2", "dataset": "cifar10"})


def test_tiers_follow_proportions():
    tiers = core.assign_tiers(100, (4, 3, 3), seed=0)
    assert [tiers.count(t) for t in core.TIERS] == [40, 30, 30]
    assert core.assign_tiers(100, (4, 3, 3), seed=1) != tiers


def test_heterofl_levels_fit_the_tiers():
    cfg = validate({**ADAPTIVE_FL, "method": "heterofl"})
    ref, pool = pool_of(validate(ADAPTIVE_FL)), pool_of(cfg)
    assert pool.p == 1 and all(e.start == 0 for e in pool.entries[:-1])
    assert pool[pool.index("S1")].size <= ref.tier_capacity("weak")
    assert pool[pool.index("M1")].size <= ref.tier_capacity("medium")


# --- resume ------------------------------------------------------------------------------------

def test_resume_after_round_2_equals_uninterrupted_run(tmp_path, task_identity):
    """Stop after round 2, resume to round 4 == 4 rounds straight: models, RL tables and history (on the in-process
    grid, whose node ids are new in every run; FedAvg's resume through the real Simulation Engine: tests/test_e2e.py)."""
    from hetfl.common.rounds import CHECKPOINT, load_checkpoint

    from .inprocess import run_in_process
    from .test_checkpoint import same
    from .test_determinism import _rows

    require_fmnist()
    base = {**ADAPTIVE_FL, "data-source": "local", "batch-size": 32, "lr": 0.05, "momentum": 0.9,
            "fraction-train": 0.5, "min-available-nodes": 6, "local-steps": 5, "num-server-rounds": 4,
            "max-test-samples": 500}
    full = run_in_process(base, 6, tmp_path, "full")
    assert run_in_process({**base, "stop-after-round": 2}, 6, tmp_path, "part")["summary"]["rounds_completed"] == 2
    part = run_in_process({**base, "resume": True}, 6, tmp_path, "part")
    a, b = (load_checkpoint(tmp_path / n / CHECKPOINT) for n in ("full", "part"))  # checkpoint.json + safetensors
    assert a["round"] == b["round"] == 4
    for k in ("arrays", "strategy", "python_random", "numpy_random"):  # models, RL tables, selector and sampling rngs
        same(a[k], b[k], k)
    for t in ("Tc", "Tr"):
        assert (a["strategy"]["selector"][t] != 1).any()  # the tables (all ones at the start) learnt in 4 rounds
    assert _rows(part) == _rows(full)  # accuracy, loss, bytes and sampled clients of every round
    assert [r["params_back"] for r in full["rounds"][1:]] == [r["params_back"] for r in part["rounds"][1:]]
    assert part["resume_download_bytes"] > 0 and "resume_download_bytes" not in full  # node discovery, in no round


# --- end to end -------------------------------------------------------------------------------

@pytest.mark.slow
def test_adaptivefl_fmnist_end_to_end(tmp_path):
    """AdaptiveFL on FMNIST through the real ServerApp and ClientApp code on the in-process grid (10 nodes, 4:3:3
    tiers): the pool, the per-member counts and accuracies, pruning on weak devices, and learning. The engines add
    nothing method-specific: AdaptiveFL runs on real SuperNodes in tests/test_multihost.py, and the Simulation
    Engine itself is tested with FedAvg (tests/test_e2e.py, tests/test_flwr_run.py)."""
    from .inprocess import run_in_process

    require_fmnist()
    over = {
        **ADAPTIVE_FL, "data-source": "local", "dirichlet-alpha": 1.0, "fraction-train": 0.5, "min-available-nodes": 10,
        "local-steps": 20, "batch-size": 32, "lr": 0.05, "momentum": 0.9, "max-test-samples": 2000,
        "num-server-rounds": 3, "adaptivefl-tier-proportions": "4:3:3",
    }
    m = run_in_process(over, 10, tmp_path, "adaptivefl")
    run_dir = tmp_path / "adaptivefl"
    rows = m["rounds"]
    assert [p["name"] for p in m["pool"]] == ["S2", "S1", "M2", "M1", "L1"]
    assert rows[-1]["accuracy"] > 0.3 and rows[-1]["acc_avg"] > 0.25, rows[-1]  # chance: 0.1
    for r in rows[1:]:
        assert r["replies"] == 5 and r["rejected"] == 0 and r["failed"] == 0
        assert 0.0 <= r["waste_rate"] < 1.0
        assert r["params_back"] <= r["params_sent"]
        assert r["params_back"] == sum(r[f"back_{e['name']}"] * e["params"] for e in m["pool"])  # per-member counts
        assert r["acc_avg"] == pytest.approx((r["acc_L1"] + r["acc_M1"] + r["acc_S1"]) / 3)
    # 4 weak devices of 10: over 3 rounds something came back pruned
    assert sum(r["pruned"] for r in rows[1:]) > 0
    assert (run_dir / "accuracy.png").exists()


def test_a_declared_capacity_below_the_smallest_submodel_is_named_at_discovery():
    """The README's example capacity=300000 cannot hold any submodel of a 32x32 RGB CNN: the node says so at
    discovery with the client and both sizes (the server logs it), instead of an empty slot every round."""
    from flwr.app import Context, RecordDict

    from hetfl.adaptivefl_app.client_app import capacity_warning
    from hetfl.adaptivefl_app.task import pool_of
    from hetfl.methods import validate

    cfg = validate({"method": "adaptivefl", "dataset": "cifar10", "model": "cnn"})
    smallest = min(e.size for e in pool_of(cfg).entries)

    def ctx(capacity):
        return Context(run_id=1, node_id=5, node_config={"capacity": capacity, "partition-id": 0, "num-partitions": 1},
                       state=RecordDict(), run_config=cfg)

    line = capacity_warning(ctx(300000), cfg, 7)["capacity-warning"]
    assert smallest > 300000, smallest
    assert line.startswith("client 7: node config capacity = 300,000 parameters is below the smallest submodel") and \
        f"{smallest:,} parameters of model 'cnn' for inputs (3, 32, 32)" in line, line
    assert capacity_warning(ctx(smallest), cfg, 7) == {"capacity-warning": ""}
    assert capacity_warning(ctx("weak"), cfg, 7) == {}  # a tier always fits: no field


def test_a_measured_devices_capacity_counts_each_members_flops_once_per_node(monkeypatch):
    """measured_capacity keeps each pool member's step FLOPs in the node's state: the next round's capacity
    re-predicts from the device's new speed without building the pool again (a deployed ClientApp is a new process
    every round), and gives what a fresh count gives."""
    from hetfl.adaptivefl_app import task
    from hetfl.common import costs
    from hetfl.common.profile import PROFILE

    cfg = validate({"method": "adaptivefl", "dataset": "digits", "model": "cnn", "local-steps": 4, "batch-size": 8,
                    "adaptivefl-round-budget-s": 0.05})
    ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config=cfg)
    ctx.state[PROFILE] = ConfigRecord({"flops-per-s": 2e9})
    real, counted = costs.step_flops, []
    monkeypatch.setattr(costs, "step_flops", lambda *a: counted.append(1) or real(*a))
    first = task.measured_capacity(ctx, cfg, 0)
    assert len(counted) == len(pool_of(cfg))  # every member counted once
    task.remember_speed(ctx, 1e9, 1.0)  # a slower last round: 1 GFLOP/s
    slower = task.measured_capacity(ctx, cfg, 0)
    assert len(counted) == len(pool_of(cfg))  # nothing counted again
    fresh = Context(run_id=1, node_id=2, node_config={}, state=RecordDict(), run_config=cfg)
    fresh.state[PROFILE] = ConfigRecord({"flops-per-s": 1e9})
    assert task.measured_capacity(fresh, cfg, 0) == slower and slower <= first
