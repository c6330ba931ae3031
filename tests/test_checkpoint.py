"""Checkpoints (hetfl/common/checkpoint.py, rounds.py): exact split/join, every strategy's state, atomic pairs, no code on load."""

from __future__ import annotations

import json
import logging
import math
import pickle
import random

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

from hetfl.common import checkpoint as ckpt
from hetfl.common.checkpoint import CheckpointError, join_state, read_checkpoint, split_state, write_checkpoint
from hetfl.common.results import RunRecorder
from hetfl.common.strategy import StrategyBase
from hetfl.common.rounds import CHECKPOINT, LEGACY_CHECKPOINT, load_checkpoint, run_rounds, save_checkpoint

# --- exact comparison -------------------------------------------------------------------------

from .conftest import identity_map, replies_to


def same(a, b, path="root") -> None:
    """a and b are identical: types, dict order, dtypes, shapes, bits (nan == nan, -0.0 != 0.0)."""
    assert type(a) is type(b), (path, type(a), type(b))
    if isinstance(a, (np.ndarray, np.generic)):
        assert a.dtype == b.dtype and a.shape == b.shape, (path, a.dtype, b.dtype, a.shape, b.shape)
        assert a.tobytes() == b.tobytes(), path
    elif isinstance(a, ArrayRecord):
        assert list(a.keys()) == list(b.keys()), path
        for k in a:
            same(a[k].numpy(), b[k].numpy(), f"{path}/{k}")
    elif isinstance(a, dict):
        assert list(a.keys()) == list(b.keys()), path
        for (ka, va), kb in zip(a.items(), b.keys(), strict=True):
            same(ka, kb, f"{path}/<key>")
            same(va, b[kb], f"{path}/{ka!r}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{path}/{i}")
    elif isinstance(a, float):
        assert (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b)), (path, a, b)
    else:
        assert a == b, (path, a, b)


def through_json(state):
    """split -> strict JSON text (no NaN literals) -> join."""
    tree, tensors = split_state(state)
    text = json.dumps(tree, allow_nan=False)
    return join_state(json.loads(text), {k: np.array(v) for k, v in tensors.items()})


DTYPES = [np.float64, np.float32, np.float16, np.int64, np.uint64, np.int32, np.uint32, np.int16, np.uint16, np.int8,
          np.uint8, np.bool_, np.complex64, np.complex128, ">f4", ">i8", "<U3", "S2", "M8[s]", "m8[ms]", np.longdouble]


def nasty_tree():
    gen = np.random.default_rng([7, 0x5A])
    gen.random(3)  # PCG64 state: two 128-bit ints
    py = random.Random(3)
    legacy = np.random.RandomState(5)
    legacy.standard_normal()  # has_gauss = 1 with a cached float
    arrays = {}
    for dt in DTYPES:
        name = np.dtype(dt).str
        arrays[name] = np.arange(6).reshape(2, 3).astype(dt)
        arrays[name + "/0d"] = np.array(1, dtype=dt)
        arrays[name + "/empty"] = np.zeros((0, 3), dtype=dt)
    return {
        "pcg64": gen.bit_generator.state,
        "python_random": py.getstate(),
        "numpy_random": legacy.get_state(),
        "floats": [float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 5e-324, 1.7976931348623157e308, 0.1],
        "ints": [0, -1, 2**53 - 1, 2**53, -(2**53), 2**64 - 1, -(2**200) + 7, True, False],
        "nested": ((), ((1,), [(), [()]]), {"t": (None, "x", (2.5,))}),
        "empty": [[], {}, (), ""],
        "keys": {1: "int", (2, "a"): "tuple", None: "none", "$tuple": "dollar", 2.5: "float", False: "bool"},
        "strings": ["", "ünïcödé ✓", "$array", '{"$tuple": []}', "a/b"],
        "arrays": arrays,
        "views": [np.arange(12.0).reshape(3, 4).T, np.arange(10)[::3], np.asfortranarray(np.ones((2, 3), np.int16))],
        "nan_array": np.array([np.nan, -np.inf, np.inf, -0.0], np.float32),
        "scalars": [np.float32(0.1), np.float64("nan"), np.float16(-0.0), np.int8(-128), np.uint64(2**64 - 1),
                    np.bool_(True), np.complex64(1 - 2j), np.datetime64("2024-02-29T12:00"), np.str_("s"), np.longdouble(1) / 3],
        "record": ArrayRecord({"conv.weight": Array(np.ones((2, 1, 3, 3), np.float32)), "bn.n": Array(np.array(3, np.int64)),
                               "empty": Array(np.zeros((0,), np.float16))}),
        "empty_record": ArrayRecord(),
        "same_path_twice": {"a/b": np.ones(2), "a": {"b": np.zeros(2)}},
        "__metadata__": np.ones(1),
    }


def test_nasty_tree_round_trips_exactly():
    state = nasty_tree()
    back = through_json(state)
    same(state, back)
    # the consumers accept what comes back
    g = np.random.default_rng()
    g.bit_generator.state = back["pcg64"]
    assert g.random() == np.random.default_rng([7, 0x5A]).random(4)[-1]
    r = random.Random()
    r.setstate(back["python_random"])  # needs tuples, not lists
    assert r.random() == random.Random(3).random()
    legacy = np.random.RandomState()
    legacy.set_state(back["numpy_random"])
    ref = np.random.RandomState(5)
    ref.standard_normal()
    assert legacy.standard_normal() == ref.standard_normal()  # the cached Gaussian survived
    assert all(a.flags.writeable for a in back["arrays"].values())


def random_tree(rng: np.random.Generator, depth: int = 0):
    kind = int(rng.integers(0, 12 if depth < 4 else 7))
    if kind == 0:
        return None
    if kind == 1:
        return bool(rng.integers(2))
    if kind == 2:
        return int(rng.integers(-(2**62), 2**62)) * int(rng.choice([1, 2**70, 3]))
    if kind == 3:
        return float(rng.choice([np.nan, np.inf, -np.inf, -0.0, rng.standard_normal() * 10.0 ** rng.integers(-300, 300)]))
    if kind == 4:
        return "".join(rng.choice(list("ab$/ é"), size=int(rng.integers(0, 5))))
    if kind == 5:
        dt = np.dtype(DTYPES[int(rng.integers(len(DTYPES)))])
        shape = tuple(int(n) for n in rng.integers(0, 3, size=rng.integers(0, 4)))
        return (rng.standard_normal(shape) * 50).astype(dt)
    if kind == 6:
        return np.dtype(DTYPES[int(rng.integers(11))]).type(rng.integers(0, 100))
    n = int(rng.integers(0, 4))
    items = [random_tree(rng, depth + 1) for _ in range(n)]
    if kind == 7:
        return items
    if kind == 8:
        return tuple(items)
    if kind == 9:
        return {f"k{i}": v for i, v in enumerate(items)}
    if kind == 10:
        return {(i, "$") if i % 2 else i: v for i, v in enumerate(items)}
    return ArrayRecord({f"w{i}": Array(np.full((i, 2), i, np.float32)) for i in range(n)})


def test_random_trees_round_trip_exactly():
    rng = np.random.default_rng(0)
    for _ in range(300):
        tree = random_tree(rng)
        same(tree, through_json(tree))


def test_json_tree_is_plain_readable_data():
    tree, tensors = split_state({"s": np.random.default_rng(1).bit_generator.state, "x": float("nan"), "w": np.ones(3)})
    assert tree["s"]["state"]["state"]["$int"].startswith("0x")  # 128-bit ints exact in any JSON reader
    assert tree["x"] == {"$float": "nan"} and tree["w"] == {"$array": "w"} and list(tensors) == ["w"]


@pytest.mark.parametrize("bad", [{1, 2}, np.array([object()], dtype=object), object(), b"bytes",
                                 np.zeros(2, dtype=[("a", "f4")]), lambda: 0])
def test_unsupported_values_fail_with_their_path(bad):
    with pytest.raises(TypeError, match="strategy/x"):
        split_state({"strategy": {"x": bad}})


# --- load safety ------------------------------------------------------------------------------

W = {"w": np.ones(2, np.float32)}


@pytest.mark.parametrize("tree,tensors,match", [
    ({"$pickle": "gASV..."}, {}, "unknown or malformed tag"),
    ({"$eval": "__import__('os').system('touch x')"}, {}, "unknown or malformed tag"),
    ({"$tuple": [], "x": 1}, {}, "exactly one key"),
    ({"$tuple": {"a": 1}}, {}, "malformed tag"),
    ({"$int": "__import__('os')"}, {}, "malformed tag"),
    ({"$float": "1e999"}, {}, "malformed tag"),
    ({"$array": "missing"}, {}, "not in the tensor file"),
    ({"a": 1}, W, "not referenced"),
    ({"$raw": {"tensor": "w", "dtype": "|O", "shape": [2]}}, {"w": np.zeros(16, np.uint8)}, "not allowed"),
    ({"$raw": {"tensor": "w", "dtype": "[('a', 'O')]", "shape": [1]}}, {"w": np.zeros(8, np.uint8)}, "dtype"),
    ({"$raw": {"tensor": "w", "dtype": "<c16", "shape": [3]}}, {"w": np.zeros(16, np.uint8)}, "raw tensor of 16 bytes"),
    ({"$raw": {"tensor": "w", "dtype": "<c16", "shape": [-1]}}, {"w": np.zeros(16, np.uint8)}, "malformed shape"),
    ({"$scalar": {"dtype": "|O", "value": 1}}, {}, "not allowed"),
    ({"$scalar": {"dtype": "<f4", "value": "os.system"}}, {}, "malformed \\$scalar"),
    ({"$arrayrecord": [["w", {"$tuple": []}]]}, {}, "unknown array tag"),
    ({"$dict": [[[1, 2], 3]]}, {}, "unhashable"),
])
def test_join_rejects_anything_it_does_not_know(tree, tensors, match):
    with pytest.raises(CheckpointError, match=match):
        join_state(tree, tensors)


def test_read_rejects_malformed_files(tmp_path):
    path = tmp_path / "checkpoint.json"
    write_checkpoint(path, {"w": np.arange(3.0)})
    doc = json.loads(path.read_text())

    def rewrite(**over):
        path.write_text(json.dumps({**doc, **over}))

    for text, match in (('{"format": "hetfl-checkpoint", "version": 1, "x": NaN}', "non-standard JSON constant"),
                        ('{"format": 1, "format": 2}', "duplicate JSON keys"), ("{", "not valid JSON"),
                        ('{"format": "pickle"}', "not a hetfl-checkpoint")):
        path.write_text(text)
        with pytest.raises(CheckpointError, match=match):
            read_checkpoint(path)
    rewrite(version=2)
    with pytest.raises(CheckpointError, match="unsupported version"):
        read_checkpoint(path)
    for name in ("../outside.safetensors", "/etc/passwd", "checkpoint.pkl"):
        rewrite(tensors={**doc["tensors"], "file": name})
        with pytest.raises(CheckpointError, match="plain"):
            read_checkpoint(path)
    rewrite(state={"$tuple": [{"$pickle": "x"}]})
    with pytest.raises(CheckpointError, match="unknown or malformed tag '\\$pickle'"):
        read_checkpoint(path)


class _Marker:
    """Unpickling this creates a marker file: proof that a loader ran code from the checkpoint."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


class _FakeGrid:
    """No nodes; every round's traffic period holds 7 bytes down (so cumulative bytes must survive a resume)."""

    def send_and_receive(self, messages, timeout=None):
        return []

    def take(self):
        from hetfl.common.comm import Traffic

        return Traffic(down={0: 7})


class _RngStrategy(StrategyBase):
    """A strategy whose every round draws from its own Generator, NumPy's legacy RNG and Python's random."""

    def __init__(self, seed: int):
        from hetfl.common.nodes import ClientMap

        self.rng = np.random.default_rng([seed, 1])
        self.map, self.sampled = ClientMap(), []
        self.map.asked = {0}  # a discovered map (of no clients): start does not discover again

    def configure_train(self, server_round, arrays, config, grid):
        return []

    def aggregate_train(self, server_round, replies):
        w = arrays_of(self.current)["w"]
        step = self.rng.standard_normal(w.shape) + np.random.standard_normal(w.shape) + random.random()
        self.current = ArrayRecord({"w": Array((w + step).astype(np.float32))})
        return self.current, None

    def state_dict(self):
        return {"rng": self.rng.bit_generator.state, "current": self.current}

    def load_state_dict(self, st):
        self.rng.bit_generator.state, self.current = st["rng"], st["current"]


def arrays_of(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in record.items()}


def _run(tmp_path, rounds, resume=False, stop=0, name="run"):
    cfg = {"run-name": name, "results-dir": str(tmp_path), "resume": resume, "num-server-rounds": rounds,
           "stop-after-round": stop, "checkpoint": True, "round-timeout": 1.0}
    if not resume:
        random.seed(0)
        np.random.seed(0)
    else:  # a fresh process: the RNGs are wherever they are; resume must restore them
        random.seed(99)
        np.random.seed(99)
    recorder = RunRecorder(cfg, threshold=0.5)
    strategy = _RngStrategy(seed=0)
    initial = ArrayRecord({"w": Array(np.zeros(4, np.float32))})
    strategy.current = initial
    seen = []

    def evaluate(rnd, arrays):
        seen.append(rnd)
        return {"accuracy": float(arrays_of(arrays)["w"].sum()), "loss": float("nan"), "extra": np.float32(rnd)}

    final = run_rounds(_FakeGrid(), strategy, initial, cfg, recorder, evaluate)
    return final, recorder, seen


def test_resume_equals_uninterrupted_run(tmp_path):
    full, rec_full, _ = _run(tmp_path, 4, name="full")
    _run(tmp_path, 4, stop=2, name="part")
    part, rec_part, seen = _run(tmp_path, 4, resume=True, name="part")
    assert seen == [3, 4]  # no round-0 evaluation, continues after the checkpointed round
    same(arrays_of(full), arrays_of(part))
    key = ("round", "accuracy", "loss", "bytes_down", "cum_bytes_down", "extra")
    same([{k: r[k] for k in key} for r in rec_full.rounds], [{k: r[k] for k in key} for r in rec_part.rounds])
    a, b = (load_checkpoint(tmp_path / n / CHECKPOINT) for n in ("full", "part"))
    assert a["round"] == b["round"] == 4
    for k in ("arrays", "strategy", "python_random", "numpy_random"):
        same(a[k], b[k])
    same([{k: r[k] for k in key} for r in a["recorder"]["rounds"]], [{k: r[k] for k in key} for r in b["recorder"]["rounds"]])
    assert sorted(p.suffix for p in (tmp_path / "part").iterdir() if p.name.startswith("checkpoint")) == [
        ".json", ".jsonl", ".safetensors", ".safetensors"]  # the current pair + the previous tensor file + the row log


def test_old_pickle_checkpoint_is_never_loaded(tmp_path, caplog):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    marker = tmp_path / "code-ran"
    (run_dir / LEGACY_CHECKPOINT).write_bytes(pickle.dumps({"round": 3, "payload": _Marker(marker)}))
    with caplog.at_level(logging.WARNING, logger="hetfl"):
        _, _, seen = _run(tmp_path, 2, resume=True)
    assert not marker.exists()
    assert seen == [0, 1, 2]  # started over at round 1
    assert any("old pickle checkpoint" in r.message for r in caplog.records)
    assert (run_dir / CHECKPOINT).exists()


def test_resume_from_a_tampered_checkpoint_fails_clearly(tmp_path):
    _run(tmp_path, 1)
    path = tmp_path / "run" / CHECKPOINT
    doc = json.loads(path.read_text())
    doc["state"]["recorder"] = {"$pickle": "Y29zCnN5c3RlbQ=="}
    path.write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match="\\$pickle"):
        _run(tmp_path, 2, resume=True)


# --- atomic pair ------------------------------------------------------------------------------


def test_tensor_file_must_match_what_the_json_records(tmp_path):
    a, b = tmp_path / "a" / "checkpoint.json", tmp_path / "b" / "checkpoint.json"
    a.parent.mkdir()
    b.parent.mkdir()
    ta = write_checkpoint(a, {"w": np.zeros(3)})
    tb = write_checkpoint(b, {"w": np.ones(3)})
    ta.write_bytes(tb.read_bytes())  # same size, same names inside: only the hash tells them apart
    with pytest.raises(CheckpointError, match="SHA-256"):
        read_checkpoint(a)
    ta.unlink()
    with pytest.raises(CheckpointError, match="missing"):
        read_checkpoint(a)


def test_a_crash_mid_write_leaves_the_previous_pair(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.json"
    write_checkpoint(path, {"round": 1, "w": np.full(3, 1.0)})

    def crash(*args, **kwargs):
        raise OSError("disk full")

    # 1) dies while writing the tensors
    real_save = ckpt.save_file

    def half_save(tensors, filename, metadata=None):
        real_save(tensors, filename)
        with open(filename, "r+b") as f:
            f.truncate(10)
        raise OSError("killed")

    monkeypatch.setattr(ckpt, "save_file", half_save)
    with pytest.raises(OSError):
        write_checkpoint(path, {"round": 2, "w": np.full(3, 2.0)})
    monkeypatch.setattr(ckpt, "save_file", real_save)
    same(read_checkpoint(path), {"round": 1, "w": np.full(3, 1.0)})
    # 2) dies after the tensors, before the JSON is replaced (the commit point)
    monkeypatch.setattr(ckpt.os, "replace", crash)
    with pytest.raises(OSError):
        write_checkpoint(path, {"round": 3, "w": np.full(3, 3.0)})
    monkeypatch.undo()
    same(read_checkpoint(path), {"round": 1, "w": np.full(3, 1.0)})
    assert len(list(tmp_path.glob("checkpoint-*.safetensors"))) == 3 and list(tmp_path.glob("*.tmp"))
    # the next successful write commits and sweeps the orphans of both crashes
    for r in (4, 5):
        write_checkpoint(path, {"round": r, "w": np.full(3, float(r))}, label=f"r{r}")
    same(read_checkpoint(path), {"round": 5, "w": np.full(3, 5.0)})
    left = sorted(p.name.split("-")[1] for p in tmp_path.glob("checkpoint-*.safetensors"))
    assert left == ["r4", "r5"] and not list(tmp_path.glob("*.tmp"))


def test_save_checkpoint_names_a_fresh_tensor_file_each_time(tmp_path):
    rec = RunRecorder({"run-name": "x", "results-dir": str(tmp_path)}, threshold=0.5)
    path = rec.run_dir / CHECKPOINT
    arrays = ArrayRecord({"w": Array(np.ones(2, np.float32))})
    names, strategy = [], _RngStrategy(seed=0)
    strategy.current = arrays
    for rnd in (1, 1, 2):  # the same round twice (a re-run without resume) must not overwrite the named file
        save_checkpoint(path, rnd, arrays, strategy, rec)
        names.append(json.loads(path.read_text())["tensors"]["file"])
    assert len(set(names)) == 3 and names[0].startswith("checkpoint-r00001-") and names[2].startswith("checkpoint-r00002-")
    ck = load_checkpoint(path)
    assert ck["round"] == 2 and set(ck["strategy"]) == {"rng", "current"}
    same(ck["arrays"], {"w": np.ones(2, np.float32)})


# --- every state_dict that reaches the checkpoint ------------------------------------------------


def disk_round_trip(tmp_path, state):
    path = tmp_path / "checkpoint.json"
    write_checkpoint(path, state)
    back = read_checkpoint(path)
    same(state, back)
    return back


def test_shefl_state_round_trips(tmp_path):
    from hetfl.common.params import FederationParams
    from hetfl.shefl_app.keys import SHEFLParams
    from hetfl.shefl_app.strategy import SHEFL

    roles = {n: ("hpc" if n % 4 == 0 else "lpc") for n in range(1, 17)}
    a, b, fresh = (SHEFL(SHEFLParams(), FederationParams(fraction_train=0.5), device_class=roles) for _ in range(3))
    for r in range(1, 4):
        a.plan(r)
    b.load_state_dict(disk_round_trip(tmp_path, a.state_dict()))

    def plans(s):
        return [(p.hpc_nodes, p.lpc_nodes, p.lpc_models) for p in map(s.plan, range(4, 10))]

    pa = plans(a)
    assert pa == plans(b)
    assert pa != plans(fresh)  # the restored RNG state is what makes them equal


@pytest.mark.parametrize("selection", ["rl", "random"])
def test_adaptivefl_state_round_trips(tmp_path, selection):
    from hetfl.adaptivefl_app.core import SubmodelPool
    from hetfl.adaptivefl_app.keys import AdaptiveFLParams
    from hetfl.adaptivefl_app.strategy import AdaptiveFL
    from hetfl.common.params import FederationParams

    params = AdaptiveFLParams(selection=selection)
    pool = SubmodelPool("cnn", 10, (1, 28, 28))
    a, b = AdaptiveFL(params, FederationParams(), pool=pool), AdaptiveFL(params, FederationParams(), pool=pool)
    nodes = list(range(10))
    for _ in range(3):  # plan and feed back what "came back": the RL tables and both RNGs move
        for c, _, m in a.plan(nodes):
            a.selector.update(c, m, max(0, m - c % 3) if c % 4 else None)
    a.total_sent, a.total_back = 123456, 98765
    st = a.state_dict()
    assert st["selector"]["Tc"].any() and len(st["selector"]["nodes"])
    b.load_state_dict(disk_round_trip(tmp_path, st))
    same(a.state_dict(), b.state_dict())
    fresh = AdaptiveFL(params, FederationParams(), pool=pool)
    pa = [a.plan(nodes) for _ in range(4)]
    assert pa == [b.plan(nodes) for _ in range(4)]
    assert pa != [fresh.plan(nodes) for _ in range(4)]
    same(a.selector.Tc, b.selector.Tc)


@pytest.mark.parametrize("which", ["FedAdamF32", "AggregatorFedAdam", "SeededFedYogi"])
def test_fedadam_state_round_trips(tmp_path, task_identity, which):
    from hetfl.common.fedopt import FedAdamF32, SeededFedYogi
    from hetfl.fens_app.strategy import AggregatorFedAdam

    cls = {"FedAdamF32": FedAdamF32, "AggregatorFedAdam": AggregatorFedAdam, "SeededFedYogi": SeededFedYogi}[which]
    rng = np.random.default_rng(0)
    shapes = {"fc.weight": (3, 4), "fc.bias": (3,)}

    cmap = identity_map(range(3))

    def replies(n=3):
        return replies_to(cmap, {i: RecordDict({
            "arrays": ArrayRecord({k: Array(rng.standard_normal(s).astype(np.float32)) for k, s in shapes.items()}),
            "metrics": MetricRecord({"num-examples": 10 + i})}) for i in range(n)})

    a, b = cls(eta=0.1, eta_l=0.01), cls(eta=0.1, eta_l=0.01)
    for s in (a, b):
        if hasattr(s, "bind"):  # the seeded strategies check that each reply answers a message sent this round
            s.bind(cmap, 0).sampled = [0, 1, 2]
    a._reference = b._reference = dict(shapes)  # the reply check's shapes (configure_train sets them in a run)
    arrays = ArrayRecord({k: Array(np.zeros(s, np.float32)) for k, s in shapes.items()})
    for rnd in (1, 2):
        a.current_arrays = arrays_of(arrays)  # what configure_train records
        arrays, _ = a.aggregate_train(rnd, replies())
    st = a.state_dict()
    assert st["m_t"] is not None and st["v_t"] is not None
    b.load_state_dict(disk_round_trip(tmp_path, st))
    msgs = replies()
    a.current_arrays = b.current_arrays = arrays_of(arrays)
    ra, _ = a.aggregate_train(3, msgs)
    rb, _ = b.aggregate_train(3, msgs)
    same(arrays_of(ra), arrays_of(rb))
    same(a.m_t, b.m_t)
    same(a.v_t, b.v_t)


def test_fresh_fedadam_state_round_trips(tmp_path):
    from hetfl.common.fedopt import FedAdamF32

    st = FedAdamF32(eta=0.1, eta_l=0.01).state_dict()
    assert st == {"m_t": None, "v_t": None, "current": None}
    disk_round_trip(tmp_path, st)


def test_recorder_state_round_trips(tmp_path):
    cfg = {"run-name": "r", "results-dir": str(tmp_path)}
    a = RunRecorder(cfg, threshold=0.5)
    a.extra["pool"] = [{"name": "S1", "ratio": 0.4, "start": 2, "params": 10**6}]
    a.record(0, 0.1, float("nan"))
    a.record(1, np.float32(0.25), 2.0, bytes_down=2**40, bytes_up=7, acc_M1=np.float64(0.5), pruned=3, failed=0)
    st = a.state_dict()
    back = disk_round_trip(tmp_path, st)
    b = RunRecorder({**cfg, "run-name": "r2"}, threshold=0.5)
    b.load_state_dict(back)
    same(a.rounds, b.rounds)
    same(a.extra["pool"], b.extra["pool"])
    assert b.extra["machines"] == [*a.extra["machines"], {**a.extra["machines"][0], "from_round": 2}]  # resumed at 2
    assert b.summary()["total_bytes_down"] == 2**40 and b.summary()["final_accuracy"] == np.float32(0.25)


# --- the row log: a save costs the rows it adds, not the history ------------------------------------


def _rows_recorder(tmp_path, name="rl"):
    return RunRecorder({"run-name": name, "results-dir": str(tmp_path), "tracking": "none"}, threshold=0.5)


def _saving(tmp_path):
    """A recorder, its checkpoint path, and a strategy and arrays to save."""
    rec = _rows_recorder(tmp_path)
    strategy = _RngStrategy(seed=0)
    strategy.current = arrays = ArrayRecord({"w": Array(np.ones(2, np.float32))})
    return rec, rec.run_dir / CHECKPOINT, strategy, arrays


def _row(rec, rnd):
    rec.record(rnd, np.float32(0.1 * rnd), float("nan") if rnd == 2 else 1.0 / (rnd + 1), bytes_down=2**60 + rnd,
               clients=[rnd, rnd + 1], by_client={str(rnd): 0.5, "$odd": -0.0})


def test_each_save_encodes_and_appends_only_the_rows_recorded_since(tmp_path, monkeypatch):
    rec, path, strategy, arrays = _saving(tmp_path)
    calls = []
    real = ckpt.split_state
    monkeypatch.setattr(ckpt, "split_state", lambda s: (calls.append(1), real(s))[1])
    log, sizes, json_sizes = None, [], []
    for rnd in range(6):
        _row(rec, rnd)
        calls.clear()
        log = save_checkpoint(path, rnd, arrays, strategy, rec, log)
        assert len(calls) == 2, rnd  # the state's one split, and the one new row's: never the rows before it
        sizes.append(ckpt.row_logs(path)[0].stat().st_size)
        json_sizes.append(path.stat().st_size)
    lines = ckpt.row_logs(path)[0].read_bytes().splitlines(keepends=True)
    assert len(lines) == 6 and sizes == list(np.cumsum([len(x) for x in lines]))
    assert max(json_sizes) - min(json_sizes) < 200  # the JSON does not grow with the history
    mark = json.loads(path.read_text())["state"]["recorder"]["rows"]
    assert mark == {"file": ckpt.row_logs(path)[0].name, "rows": 6, "bytes": sizes[-1], "sha256": mark["sha256"]}
    back = load_checkpoint(path)["recorder"]
    same(back["rounds"], rec.rounds)  # nan, -0.0, float32, 2**60, a '$' key: exact
    from hetfl.common.rounds import checkpoint_rows
    same(checkpoint_rows(path), rec.rounds)


def test_rows_past_the_mark_are_ignored_and_the_resumed_run_writes_over_them(tmp_path):
    rec, path, strategy, arrays = _saving(tmp_path)
    log = None
    for rnd in range(3):
        _row(rec, rnd)
        log = save_checkpoint(path, rnd, arrays, strategy, rec, log)
    good = ckpt.row_logs(path)[0].read_bytes()
    with open(ckpt.row_logs(path)[0], "ab") as f:  # a save that crashed before its JSON
        f.write(b'{"round":3,"accuracy":0.99}\n{"round":4,"acc')
    assert [r["round"] for r in load_checkpoint(path)["recorder"]["rounds"]] == [0, 1, 2]
    resumed = _rows_recorder(tmp_path)
    ck, log = __import__("hetfl.common.rounds", fromlist=["_load"])._load(path)
    resumed.load_state_dict(ck["recorder"])
    _row(resumed, 3)
    save_checkpoint(path, 3, arrays, strategy, resumed, log)
    data = ckpt.row_logs(path)[0].read_bytes()
    assert data.startswith(good) and data.count(b"\n") == 4 and b"0.99" not in data
    assert [r["round"] for r in load_checkpoint(path)["recorder"]["rounds"]] == [0, 1, 2, 3]


@pytest.mark.parametrize("damage", ["flip", "short", "path", "rows"])
def test_a_row_log_that_does_not_match_its_mark_is_an_error(tmp_path, damage):
    rec, path, strategy, arrays = _saving(tmp_path)
    log = None
    for rnd in range(3):
        _row(rec, rnd)
        log = save_checkpoint(path, rnd, arrays, strategy, rec, log)
    rows = ckpt.row_logs(path)[0]
    if damage == "flip":
        data = bytearray(rows.read_bytes())
        data[5] ^= 1
        rows.write_bytes(bytes(data))
    elif damage == "short":
        rows.write_bytes(rows.read_bytes()[:-3])
    else:
        doc = json.loads(path.read_text())
        mark = doc["state"]["recorder"]["rows"]
        if damage == "path":
            mark["file"] = "../" + mark["file"]
        else:
            mark["rows"] = 2
        path.write_text(json.dumps(doc))
    with pytest.raises(CheckpointError):
        load_checkpoint(path)


def test_a_checkpoint_with_its_rows_inline_still_loads(tmp_path):
    """Checkpoints written before the row log (committed mid-way studies) hold the rows in the JSON."""
    rec = _rows_recorder(tmp_path)
    for rnd in range(3):
        _row(rec, rnd)
    path = rec.run_dir / CHECKPOINT
    state = {"round": 2, "arrays": {"w": np.ones(2, np.float32)}, "strategy": None, "python_random": random.getstate(),
             "numpy_random": np.random.get_state(), "recorder": rec.state_dict()}
    write_checkpoint(path, state)
    from hetfl.common.rounds import checkpoint_rows
    same(load_checkpoint(path)["recorder"]["rounds"], rec.rounds)
    same(checkpoint_rows(path), rec.rounds)


def test_discard_checkpoint_removes_the_row_log(tmp_path):
    rec, path, strategy, arrays = _saving(tmp_path)
    _row(rec, 0)
    save_checkpoint(path, 0, arrays, strategy, rec)
    ckpt.discard_checkpoint(path)
    assert sorted(p.name for p in rec.run_dir.iterdir() if p.name.startswith("checkpoint")) == []


def test_a_run_stopped_mid_way_flushes_the_rows_its_metrics_json_put_off(tmp_path, monkeypatch):
    monkeypatch.setattr(RunRecorder, "JSON_SHARE", 1e-12)  # every rewrite after the first is put off
    cfg = {"run-name": "cut", "results-dir": str(tmp_path), "resume": False, "num-server-rounds": 6,
           "stop-after-round": 0, "checkpoint": True, "round-timeout": 1.0, "tracking": "none"}
    recorder = RunRecorder(cfg, threshold=0.5)
    strategy = _RngStrategy(seed=0)
    strategy.current = initial = ArrayRecord({"w": Array(np.zeros(4, np.float32))})

    def evaluate(rnd, arrays):
        if rnd == 3:
            raise KeyboardInterrupt  # Ctrl-C / SIGTERM in round 3
        return {"accuracy": 0.1 * rnd, "loss": 1.0}

    with pytest.raises(KeyboardInterrupt):
        run_rounds(_FakeGrid(), strategy, initial, cfg, recorder, evaluate)
    rows = json.loads((recorder.run_dir / "metrics.json").read_text())["rounds"]
    assert [r["round"] for r in rows] == [0, 1, 2]
    assert [r["round"] for r in load_checkpoint(recorder.run_dir / CHECKPOINT)["recorder"]["rounds"]] == [0, 1, 2]


def test_a_run_started_over_leaves_the_old_checkpoint_readable_until_its_own_commits(tmp_path, monkeypatch):
    rec, path, strategy, arrays = _saving(tmp_path)
    for rnd in range(3):
        _row(rec, rnd)
    save_checkpoint(path, 2, arrays, strategy, rec)
    again = _rows_recorder(tmp_path)  # resume = false: the same folder, a new history
    _row(again, 0)

    def crash(*a, **k):
        raise OSError("killed before the commit")

    monkeypatch.setattr("hetfl.common.rounds.write_checkpoint", crash)
    with pytest.raises(OSError):
        save_checkpoint(path, 0, arrays, strategy, again)
    assert [r["round"] for r in load_checkpoint(path)["recorder"]["rounds"]] == [0, 1, 2]  # the old one still reads
    monkeypatch.undo()
    save_checkpoint(path, 0, arrays, strategy, again)
    assert [r["round"] for r in load_checkpoint(path)["recorder"]["rounds"]] == [0] and len(ckpt.row_logs(path)) == 1


def test_an_array_in_a_row_is_saved_as_the_list_metrics_json_shows(tmp_path):
    rec, path, strategy, arrays = _saving(tmp_path)
    rec.record(0, 0.5, 1.0, per_class=np.array([0.25, 0.75]))
    save_checkpoint(path, 0, arrays, strategy, rec)
    assert load_checkpoint(path)["recorder"]["rounds"][0]["per_class"] == [0.25, 0.75]


def test_metrics_json_behind_its_checkpoint_is_caught_up_from_it(tmp_path, monkeypatch):
    """A run killed outright may leave metrics.json behind the checkpoint (rewrites put off); the checkpoint's rows
    rebuild it, the summary included, when the run is not resumed (a trial pruned on them)."""
    from hetfl.common.rounds import catch_up_metrics

    monkeypatch.setattr(RunRecorder, "JSON_SHARE", 1e-12)  # every rewrite after the first is put off
    rec, path, strategy, arrays = _saving(tmp_path)
    rec.cfg["num-server-rounds"] = 4
    log = None
    for rnd in range(4):
        _row(rec, rnd)
        log = save_checkpoint(path, rnd, arrays, strategy, rec, log)
    behind = json.loads((rec.run_dir / "metrics.json").read_text())
    assert [r["round"] for r in behind["rounds"]] == [0]  # killed here, without a flush
    assert catch_up_metrics(rec.run_dir) and not catch_up_metrics(rec.run_dir)
    after = json.loads((rec.run_dir / "metrics.json").read_text())
    assert [r["round"] for r in after["rounds"]] == [0, 1, 2, 3] and after["summary"]["rounds_completed"] == 3
    assert after["machines"] == behind["machines"] and after["config"] == behind["config"]
    assert len((rec.run_dir / "metrics.csv").read_text().splitlines()) == 5
