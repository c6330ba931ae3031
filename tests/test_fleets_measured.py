"""`hetfl fleet measure` and `hetfl fleet check` (issue #77), hand-worked on a two-client run's rows."""

from __future__ import annotations

import json

import pytest

from hetfl.common.fleet import load_fleet
from hetfl.fleets import check, main, measured_fleet

METRICS = {
    "config": {"run-name": "r"},
    "measured_devices": {"0": {"flops-per-s": 9e9}, "1": {"flops-per-s": 1e9}},
    "roles": {"measured": {"0": "hpc", "1": "lpc"}},
    "rounds": [
        {"round": 0},
        {"round": 1, "comm_s": 5.0, "reply_s_by_client": {"0": 2.0, "1": 5.0}, "train_s_by_client": {"0": 1.0, "1": 3.0},
         "flops_by_client": {"0": 4e9, "1": 3e9}, "bytes_down_by_client": {"0": 500_000, "1": 500_000},
         "bytes_up_by_client": {"0": 500_000, "1": 500_000}},
        {"round": 2, "comm_s": 6.0, "reply_s_by_client": {"0": 2.0, "1": 6.0}, "train_s_by_client": {"0": 1.0, "1": 4.0},
         "flops_by_client": {"0": 4e9, "1": 4e9}, "bytes_down_by_client": {"0": 500_000, "1": 250_000},
         "bytes_up_by_client": {"0": 500_000, "1": 250_000}},
    ],
}


def test_a_measured_fleet_takes_each_clients_observed_speed_and_link(tmp_path):
    path = tmp_path / "f.toml"
    path.write_text(measured_fleet(METRICS, "mine"))
    fleet = load_fleet(path)
    t0, t1 = fleet.tiers
    assert (t0.name, t0.device_class, t1.device_class) == ("client-0", "hpc", "lpc")
    assert t0.speed.flops_per_s == pytest.approx(8e9 / 2.0)  # 8e9 FLOPs over 2 s of reported training
    assert t1.speed.flops_per_s == pytest.approx(7e9 / 7.0)
    # client 1 moved 1.5 MB in (5 - 3) + (6 - 4) = 4 s of communication: 3 Mbit/s both ways
    assert t1.speed.down_bps == pytest.approx(8 * 1.5e6 / 4.0) == t1.speed.up_bps
    assert t0.capacity == "strong" and t1.capacity == "weak"  # by speed, with no capacity recorded


def test_the_check_sets_the_simulated_clock_against_the_real_rounds(tmp_path, capsys):
    path = tmp_path / "f.toml"
    path.write_text(measured_fleet(METRICS))
    rows = check(path, METRICS)
    # round 1, client 1 (the slowest): 1 MB at 3 Mbit/s = 8/3 s, 3e9 FLOPs at 1e9 = 3 s
    assert rows[0]["real_s"] == 5.0 and rows[0]["simulated_s"] == pytest.approx(8 * 1e6 / 3e6 + 3.0)
    (tmp_path / "m.json").write_text(json.dumps(METRICS))
    assert main(["check", str(path), str(tmp_path / "m.json")]) == 0
    assert "mean absolute error" in capsys.readouterr().out


def test_the_check_never_puts_a_client_of_the_round_on_another_clients_tier(tmp_path):
    """A client with traffic in a round but no tier of its own in the fleet (client 2, which sent no reply) is one
    line; the simulated clock never substitutes another client's tier for it."""
    from hetfl.fleets import FleetError

    path = tmp_path / "f.toml"
    path.write_text(measured_fleet(METRICS))
    later = {**METRICS, "rounds": [*METRICS["rounds"][:2],
                                   {**METRICS["rounds"][2], "bytes_down_by_client": {"0": 500_000, "2": 250_000}}]}
    with pytest.raises(FleetError, match="no tier 'client-2' for client 2 of round 2"):
        check(path, later)


def test_a_run_without_measured_devices_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "m.json").write_text(json.dumps({"rounds": [{"round": 0}]}))
    assert main(["measure", str(tmp_path / "m.json"), "-o", str(tmp_path / "f.toml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: the run holds neither measured devices") and "\n" not in err
