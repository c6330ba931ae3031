"""Devices that measure themselves (issue #77): the measurement, the memory a cgroup leaves, the rules that turn
measured profiles into SHEFL's device class and AdaptiveFL's capacity, and the per-client reply times a round keeps.
The cgroup-capped SuperNode is tests/test_measured_devices.py."""

from __future__ import annotations

import time

import pytest
import torch
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from torch import nn

from hetfl.adaptivefl_app.core import budget_capacity
from hetfl.common.comm import CLIENT, MeteredGrid
from hetfl.common.profile import cgroup_memory_left, measure_training
from hetfl.shefl_app.core import measured_classes

from .conftest import require_fmnist


class _Slow(nn.Module):
    """A linear model whose forward pass takes at least `delay` seconds."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay, self.lin = delay, nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delay)
        return self.lin(x)


def test_a_measurement_times_steps_after_the_warm_up_for_at_least_its_window():
    x, y = torch.randn(8, 4), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    model = _Slow(0.05)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    p = measure_training(model, x, y, seconds=0.5, warmup=2, label="slow")
    assert p.seconds >= 0.5 and p.steps >= 1
    assert p.samples_per_s == pytest.approx(8 * p.steps / p.seconds)
    assert p.samples_per_s <= 8 / 0.05  # a step cannot be faster than its forward's sleep
    assert p.steps <= 0.5 / 0.05 + 1  # the warm-up steps are not counted
    assert p.flops_per_s > 0 and p.memory_bytes > 0 and p.model == "slow"
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # it trained a copy


def test_the_memory_a_cgroup_leaves_is_its_limit_less_its_usage_v1_and_v2(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/dev1\n3:cpu,cpuacct:/dev1\n")
    (tmp_path / "memory" / "dev1").mkdir(parents=True)
    (tmp_path / "memory" / "dev1" / "memory.limit_in_bytes").write_text("1000000\n")
    (tmp_path / "memory" / "dev1" / "memory.usage_in_bytes").write_text("250000\n")
    assert cgroup_memory_left(proc, tmp_path) == 750_000
    (tmp_path / "memory" / "dev1" / "memory.limit_in_bytes").write_text(f"{(1 << 63) - 4096}\n")  # v1's "no limit"
    assert cgroup_memory_left(proc, tmp_path) is None
    proc.write_text("0::/dev2\n")  # v2
    (tmp_path / "dev2").mkdir()
    (tmp_path / "dev2" / "memory.max").write_text("max\n")
    assert cgroup_memory_left(proc, tmp_path) is None
    (tmp_path / "dev2" / "memory.max").write_text("4096\n")
    (tmp_path / "dev2" / "memory.current").write_text("1024\n")
    assert cgroup_memory_left(proc, tmp_path) == 3072


def test_measured_classes_rank_by_speed_or_take_a_threshold():
    speeds = {0: 100.0, 1: 20.0, 2: 50.0, 3: 50.0}
    assert measured_classes(speeds, 0.5) == {0: "hpc", 1: "lpc", 2: "hpc", 3: "lpc"}  # a tie goes to the lower id
    assert measured_classes(speeds, 0.0) == dict.fromkeys(speeds, "lpc")
    assert measured_classes(speeds, 0.5, hpc_speed=40.0) == {0: "hpc", 1: "lpc", 2: "hpc", 3: "hpc"}


def test_a_budget_gives_the_largest_submodel_that_fits_else_the_smallest():
    sizes, seconds = [10, 20, 30], [1.0, 2.0, 3.0]
    assert budget_capacity(sizes, seconds, 2.5) == 20
    assert budget_capacity(sizes, seconds, 3.0) == 30
    assert budget_capacity(sizes, seconds, 0.5) == 10


def test_shefl_takes_declared_classes_first_then_ranks_the_measured_speeds():
    from hetfl.common.nodes import ClientMap
    from hetfl.shefl_app.strategy import SHEFL

    cmap = ClientMap()
    for c in range(4):
        cmap.node[c], cmap.hosted[c + 100] = c + 100, [c]
    cmap.info = {0: {"samples-per-s": 10.0}, 1: {"samples-per-s": 500.0}, 2: {"samples-per-s": 400.0},
                 3: {"samples-per-s": 900.0, "device-class": "lpc"}}  # 3 is the fastest but declares LPC
    s = SHEFL(num_models=2, hpc_per_round=1, hpc_fraction=0.5, fraction_train=1.0, seed=0, client_map=cmap)
    # of the measured 0-2, the fastest round(3 x 0.5) = 2; the declared class wins over the fastest speed
    assert s.roles == {0: "lpc", 1: "hpc", 2: "hpc", 3: "lpc"}
    assert s.measured_roles == {0: "lpc", 1: "hpc", 2: "hpc"}


class _PollingGrid:
    """A Grid with push and pull whose replies come in over several pulls (client c's at pull c + 1)."""

    pull_interval = 0.01

    def __init__(self) -> None:
        self.pulls = 0
        self.pushed: list[Message] = []

    def push_messages(self, messages):
        ids = []
        for i, m in enumerate(messages):
            m.metadata.__dict__["_message_id"] = f"id{i}"
            ids.append(f"id{i}")
        self.pushed = list(messages)
        return ids

    def pull_messages(self, ids):
        self.pulls += 1
        out = []
        for m in self.pushed:
            c = int(m.content[CLIENT]["client-id"])
            if c + 1 == self.pulls and m.metadata.message_id in ids:
                time.sleep(0.02)
                out.append(Message(RecordDict({"metrics": MetricRecord({"train_s": 0.5 * c})}), reply_to=m))
        return out


def test_a_round_keeps_when_each_clients_reply_was_seen_and_the_training_time_it_reported(task_identity):
    grid = MeteredGrid(_PollingGrid())
    msgs = [Message(RecordDict({CLIENT: ConfigRecord({"client-id": c})}), dst_node_id=10 + c, message_type="train")
            for c in range(3)]
    replies = list(grid.send_and_receive(msgs, timeout=10))
    t = grid.take()
    assert len(replies) == 3 and t.replies == 3
    assert t.reply_s[0] < t.reply_s[1] < t.reply_s[2] <= t.comm_s  # seen pull after pull
    assert dict(t.train_s) == {0: 0.0, 1: 0.5, 2: 1.0}


def test_in_a_simulation_measured_devices_are_recorded_and_decide_nothing(tmp_path):
    require_fmnist()
    from hetfl.inprocess import run_in_process, task_identity

    from .test_determinism import COMPARED, setting

    cfg, nodes = setting("shefl")
    with task_identity():
        plain = run_in_process({**cfg, "seed": 3}, nodes, tmp_path, "plain")
        measured = run_in_process({**cfg, "seed": 3, "measure-devices": True, "measure-seconds": 0.5}, nodes,
                                  tmp_path, "measured")
    rows = lambda m: [[r.get(k) for k in COMPARED] for r in m["rounds"]]  # noqa: E731
    # the same classes and clients: timing decided nothing; only discovery's answers (round 0's upload) are larger,
    # by the profiles they carry
    assert rows(measured)[1:] == rows(plain)[1:]
    assert rows(measured)[0][:4] == rows(plain)[0][:4] and rows(measured)[0][4] > rows(plain)[0][4]
    assert measured["roles"] == plain["roles"]
    devices = measured["measured_devices"]
    assert sorted(devices, key=int) == [str(c) for c in range(nodes)], devices
    assert all(d["samples-per-s"] > 0 and d["flops-per-s"] > 0 and d["memory-bytes"] > 0 for d in devices.values())
    assert "cnn" in devices["0"]["measured-on"] and "measured_devices" not in plain
    row = measured["rounds"][1]
    assert set(row["reply_s_by_client"]) == set(map(str, row["clients"])) == set(row["train_s_by_client"])
    assert all(row["reply_s_by_client"][c] >= row["train_s_by_client"][c] > 0 for c in row["reply_s_by_client"])
