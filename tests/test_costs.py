"""Costs measured, not assumed: FLOPs counted by PyTorch, the simulated clock, and fleet files."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hetfl.common.costs import ClientCost, DeviceSpeed, client_seconds, round_seconds, step_flops
from hetfl.common.fleet import FleetError, load_fleet


def test_step_flops_by_hand():
    """Linear(4, 3) then Linear(3, 2), batch 2: forward 2*4*3*2 + 2*3*2*2 = 72; backward: the second layer's weight
    and input gradients (24 + 24) and the first layer's weight gradient (48; its input needs none) = 96."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert step_flops(model, (4,), 2, train=False) == 72
    assert step_flops(model, (4,), 2, train=True) == 72 + 96
    assert step_flops(model, (4,), 4, train=False) == 144  # linear in the batch
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the model is untouched
    assert all(p.grad is None for p in model.parameters())


def test_counting_leaves_batchnorm_statistics_and_the_rng_as_they_were():
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    assert step_flops(model, (4,), 3) > 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # running mean/var, batch count
    assert torch.equal(torch.get_rng_state(), rng)


def test_local_training_reports_the_flops_of_the_steps_it_took():
    """10 examples, batch 4, 2 epochs: 2 x (4 + 4 + 2) = 4 steps of 4 and 2 steps of 2 examples; the Linear pair
    costs (72 + 96) / 2 = 84 FLOPs per example and step: 4 x 336 + 2 x 168 = 1,680."""
    import numpy as np

    from hetfl.common.train import train
    from hetfl.data.arrays import ArrayData

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    data = ArrayData(np.random.default_rng(0).normal(size=(10, 4)).astype(np.float32), np.arange(10) % 2)
    res = train(model, data, torch.as_tensor, epochs=2, steps=0, batch_size=4)
    assert res.steps == 6 and res.flops == 4 * step_flops(model, (4,), 4) + 2 * step_flops(model, (4,), 2) == 1680
    assert train(model, data, torch.as_tensor, epochs=2, steps=0, batch_size=4, drop_last=True).flops == 4 * 336


def test_a_wider_model_costs_more_flops():
    from hetfl.common.models import build_model

    small = step_flops(build_model("cnn", 10, (1, 28, 28), width=0.5), (1, 28, 28), 16)
    full = step_flops(build_model("cnn", 10, (1, 28, 28)), (1, 28, 28), 16)
    assert 2.5 < full / small < 4.5  # conv and dense costs scale with in x out channels: about 4x at half width


def test_the_clock_by_hand():
    """1 MB down at 8 Mbit/s = 1 s, 1 GFLOP at 1 GFLOP/s = 1 s, 1 MB up at 1 Mbit/s = 8 s: 10 s; a round is its
    slowest client."""
    slow = DeviceSpeed(flops_per_s=1e9, down_bps=8e6, up_bps=1e6)
    fast = DeviceSpeed(flops_per_s=1e10, down_bps=8e7, up_bps=8e7)
    cost = ClientCost(bytes_down=1_000_000, bytes_up=1_000_000, flops=1_000_000_000)
    assert client_seconds(cost, slow) == pytest.approx(10.0)
    assert client_seconds(cost, fast) == pytest.approx(0.1 + 0.1 + 0.1)
    assert round_seconds([(cost, fast), (cost, slow)]) == pytest.approx(10.0)
    assert round_seconds([]) == 0.0


FLEET = """
name = "boards"
source = "test"
[[tier]]
name = "weak"
share = 4
device-class = "lpc"
flops-per-s = 1e9
down-mbps = 10
up-mbps = 2
[[tier]]
name = "medium"
share = 3
device-class = "lpc"
flops-per-s = 4e9
down-mbps = 20
up-mbps = 5
availability = 0.5
[[tier]]
name = "strong"
share = 3
device-class = "hpc"
capacity = 2000000
flops-per-s = 2e10
down-mbps = 50
up-mbps = 20
"""


def test_a_fleet_assigns_tiers_by_share_seeded_and_declares_the_device_profile(tmp_path):
    (tmp_path / "f.toml").write_text(FLEET)
    fleet = load_fleet(tmp_path / "f.toml")
    assert [t.name for t in fleet.tiers] == ["weak", "medium", "strong"] and fleet.name == "boards"
    assert fleet.counts(10) == [4, 3, 3]
    assert fleet.counts(17) == [7, 5, 5]  # 6.8 / 5.1 / 5.1: floors 6, 5, 5, the largest remainder goes to weak
    a, b, c = fleet.assign(17, seed=0), fleet.assign(17, seed=0), fleet.assign(17, seed=1)
    assert a == b and a != c and [sum(t.name == n for t in a) for n in ("weak", "medium", "strong")] == [7, 5, 5]
    weak, medium, strong = fleet.tiers
    assert weak.node_config() == {"device-class": "lpc", "capacity": "weak"}
    assert strong.node_config() == {"device-class": "hpc", "capacity": 2000000}
    assert medium.availability == 0.5 and weak.availability == 1.0
    assert weak.speed == DeviceSpeed(1e9, 10e6, 2e6)


@pytest.mark.parametrize("change, fragment", [
    (("share = 4", "share = 0"), "tier 'weak': key 'share' = 0; expected a number > 0"),
    (('device-class = "lpc"', 'device-class = "fast"'), "key 'device-class' = 'fast'; expected one of ('hpc', 'lpc')"),
    (("availability = 0.5", "availability = 1.5"), "key 'availability' = 1.5; expected a number in (0, 1]"),
    (("capacity = 2000000", 'capacity = "huge"'), "key 'capacity' = 'huge'; expected one of ('weak', 'medium', 'strong')"),
    (("up-mbps = 2\n", "up-mbps = 2\nuplink = 3\n"), "unknown key 'uplink'"),
    (('name = "medium"', 'name = "weak"'), "repeat; expected each once"),
])
def test_a_bad_fleet_is_one_line_naming_the_key(tmp_path, change, fragment):
    (tmp_path / "f.toml").write_text(FLEET.replace(*change, 1))
    with pytest.raises(FleetError) as err:
        load_fleet(tmp_path / "f.toml")
    assert fragment in str(err.value) and "\n" not in str(err.value), str(err.value)

