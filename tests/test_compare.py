"""hetfl.compare and the fleet in a run (docs/compare.md, docs/fleets.md): FLOPs reported by clients, the simulated
clock of every row, a fleet's device profiles and availability, and a tiny comparison end to end on digits."""

import json
import tomllib
from pathlib import Path

import pytest

from hetfl.common.fleet import available, load_fleet, simulated_round_seconds
from hetfl.compare import CompareError, accuracy_at, curve, load_preset, main, plans, table

from .inprocess import run_in_process

ROOT = Path(__file__).resolve().parent.parent

TINY_FLEET = """
name = "tiny"
[[tier]]
name = "weak"
share = 2
device-class = "lpc"
flops-per-s = 1.0e9
down-mbps = 1.0
up-mbps = 0.5
availability = {avail}
[[tier]]
name = "strong"
share = 1
device-class = "hpc"
flops-per-s = 1.0e11
down-mbps = 100.0
up-mbps = 100.0
"""

DIGITS = {"dataset": "digits", "partitioner": "dirichlet", "dirichlet-alpha": 0.5, "dirichlet-min-size": 5,
          "min-available-nodes": 6, "num-clients": 6, "model": "cnn", "local-steps": 3, "batch-size": 16,
          "tracking": "none"}


def _fleet(tmp_path: Path, avail: float = 1.0) -> Path:
    path = tmp_path / f"tiny-{avail}.toml"
    path.write_text(TINY_FLEET.format(avail=avail))
    return path


def test_curve_and_accuracy_at_by_hand():
    rows = [{"accuracy": 0.1, "cum_bytes_down": 10, "cum_bytes_up": 0},
            {"accuracy": 0.5, "cum_bytes_down": 20, "cum_bytes_up": 10, "client_flops": 100, "sim_round_s": 2.0},
            {"accuracy": 0.7, "cum_bytes_down": 30, "cum_bytes_up": 20, "client_flops": 100, "sim_round_s": 3.0}]
    c = curve(rows)
    assert c["client_bytes"] == [10, 30, 50] and c["client_flops"] == [0, 100, 200] and c["sim_s"] == [0, 2, 5]
    assert accuracy_at(c, "sim_s", 4.9) == 0.5  # round 2 ends at 5 s: not within 4.9
    assert accuracy_at(c, "client_flops", 200) == 0.7
    assert accuracy_at(c, "client_bytes", 5) is None  # not even the first row within: no accuracy is credited


def test_simulated_round_is_its_slowest_client(tmp_path):
    tiers = load_fleet(_fleet(tmp_path)).tiers
    weak, strong = tiers
    # weak: 1e6 bytes down at 1 Mbit/s = 8 s, 1e9 FLOPs at 1e9 = 1 s, 1e5 bytes up at 0.5 Mbit/s = 1.6 s
    s = simulated_round_seconds([weak, strong], {"0": 1_000_000, "1": 1_000_000}, {0: 100_000, "1": 100_000},
                                {"0": 10**9, "1": 10**9, "99": 10**15})  # 99: not a client of this federation
    assert s == pytest.approx(8 + 1 + 1.6)


def test_availability_is_seeded_and_near_its_share(tmp_path):
    weak = load_fleet(_fleet(tmp_path, 0.3)).tiers[0]
    draws = [available(weak, c, r, 0) for c in range(50) for r in range(1, 41)]
    assert draws == [available(weak, c, r, 0) for c in range(50) for r in range(1, 41)]
    assert 0.25 < sum(draws) / len(draws) < 0.35
    assert draws != [available(weak, c, r, 1) for c in range(50) for r in range(1, 41)]


def test_a_fleet_run_reports_flops_simulated_time_and_samples_only_available_clients(tmp_path, task_identity):
    fleet = _fleet(tmp_path, 0.5)
    cfg = {**DIGITS, "method": "fedavg", "fleet": str(fleet), "num-server-rounds": 3, "fraction-train": 1.0,
           "checkpoint": False}
    m = run_in_process(cfg, 6, tmp_path, "fedavg")
    tiers = load_fleet(fleet).assign(6, 0)
    for r in m["rounds"][1:]:
        assert r["clients"] == [c for c in range(6) if available(tiers[c], c, r["round"], 0)]
        assert set(r["flops_by_client"]) == {str(c) for c in r["clients"]}
        assert all(f > 0 for f in r["flops_by_client"].values()) and r["client_flops"] == sum(r["flops_by_client"].values())
        assert r["sim_round_s"] == pytest.approx(simulated_round_seconds(
            tiers, r["bytes_down_by_client"], r["bytes_up_by_client"], r["flops_by_client"]))
        assert r["sim_round_s"] > 0


def test_a_fleet_gives_shefl_its_device_classes(tmp_path, task_identity):
    fleet = _fleet(tmp_path)
    cfg = {**DIGITS, "method": "shefl", "fleet": str(fleet), "num-server-rounds": 1, "fraction-train": 1.0,
           "shefl-models": 2, "shefl-hpc-per-round": 1, "checkpoint": False}
    m = run_in_process(cfg, 6, tmp_path, "shefl")
    tiers = load_fleet(fleet).assign(6, 0)
    hpc = {c for c, t in enumerate(tiers) if t.device_class == "hpc"}
    row = m["rounds"][1]
    # an HPC trains both models (FLOPs twice an LPC's at the same local work)
    per = {int(c): f for c, f in row["flops_by_client"].items()}
    assert {c for c in per if per[c] == max(per.values())} <= hpc and min(per.values()) < max(per.values())


PRESET = """
[run]
dataset = "digits"
partitioner = "dirichlet"
dirichlet-alpha = 0.5
dirichlet-min-size = 5
model = "cnn"
min-available-nodes = 6
num-server-rounds = 2
fraction-train = 1.0
local-steps = 3
batch-size = 16
tracking = "none"
eval-split = "test-half"
[tune]
trials = 2
rounds = 1
[widths]
weak = 0.5
strong = 1.0
[method.fedavg]
space = "lr=0.05,0.1"
[method.shefl]
space = "lr=0.05,0.1"
shefl-models = 2
shefl-hpc-per-round = 1
[method.fens]
space = "lr=0.05,0.1"
num-server-rounds = 2
[method.adaptivefl]
space = "lr=0.05,0.1"
[method.all-large]
space = "lr=0.05,0.1"
"""


def test_a_tiny_comparison_runs_end_to_end_and_reuses_its_runs(tmp_path, task_identity, capsys, monkeypatch):
    fleet, preset = _fleet(tmp_path), tmp_path / "tiny-preset.toml"
    preset.write_text(PRESET)
    out, kept = tmp_path / "cmp", tmp_path / "docs" / "cmp"
    assert main([str(fleet), str(preset), "--out", str(out), "--keep", str(kept)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["methods"]) == {"fedavg", "shefl", "fens", "adaptivefl"}
    assert "weakest holds width 0.5" in summary["skipped"]["all-large"]
    for method in summary["methods"]:
        assert summary["methods"][method]["values"]["lr"] in (0.05, 0.1)
        rows = json.loads((out / method / "s0" / "metrics.json").read_text())["rounds"]
        assert sum(r.get("client_flops", 0) for r in rows) > 0 and sum(r.get("sim_round_s", 0) for r in rows) > 0
        assert json.loads((out / method / "s0" / "metrics.json").read_text())["config"]["width"] == (
            0.5 if method in ("fedavg", "shefl", "fens") else 1.0)
    table = (out / "table.md").read_text()
    assert "| FedAvg | width 0.5 on every device |" in table and "| AdaptiveFL | a submodel fitted" in table
    assert table.count("\n| ") == 5 + 1 and (out / "pareto.png").stat().st_size > 0  # 4 methods, 1 left out, separator
    before = (out / "fedavg" / "s0" / "metrics.json").stat().st_mtime_ns
    assert main([str(fleet), str(preset), "--out", str(out), "--methods", "fedavg"]) == 0
    assert (out / "fedavg" / "s0" / "metrics.json").stat().st_mtime_ns == before  # reused, not rerun
    # the committed copy: small files only (no checkpoint), and a fresh clone reuses it without training anything
    assert sorted(f.name for f in kept.rglob("*") if f.is_file()) and not list(kept.rglob("checkpoint*"))
    assert (kept / "fedavg" / "tune" / "spec.json").exists() and (kept / "fedavg" / "s0" / "metrics.json").exists()

    def trains(*a, **kw):
        raise AssertionError("trained again, though the committed study and run hold this config")

    monkeypatch.setattr("hetfl.inprocess.run_in_process", trains)
    monkeypatch.setattr("hetfl.tune.tune", trains)
    again = tmp_path / "fresh-clone"
    assert main([str(fleet), str(preset), "--out", str(again), "--keep", str(kept), "--methods", "fedavg"]) == 0
    assert json.loads((again / "summary.json").read_text())["methods"]["fedavg"] == summary["methods"]["fedavg"]
    # the kept summary still covers every kept method, though this call compared one
    assert json.loads((kept / "summary.json").read_text())["methods"] == summary["methods"]
    assert set(json.loads((again / "summary.json").read_text())["methods"]) == {"fedavg"}
    # a committed run of another config is not reused: here the preset's lr grid changed, so the study runs again
    preset.write_text(PRESET.replace('[method.fedavg]\nspace = "lr=0.05,0.1"', '[method.fedavg]\nspace = "lr=0.05,0.2"'))
    with pytest.raises(AssertionError, match="trained again"):
        main([str(fleet), str(preset), "--out", str(tmp_path / "other"), "--keep", str(kept), "--methods", "fedavg"])


def test_bad_comparison_input_is_one_line(tmp_path, capsys):
    fleet, preset = _fleet(tmp_path), tmp_path / "p.toml"
    preset.write_text(PRESET.replace("[widths]\nweak = 0.5\n", "[widths]\n"))
    assert main([str(fleet), str(preset), "--out", str(tmp_path / "x")]) == 2
    assert "[widths] lacks tier capacity 'weak'" in capsys.readouterr().err
    preset.write_text(PRESET.replace("[method.fedavg]", "[method.fedprox]"))
    with pytest.raises(CompareError, match=r"\[method.fedprox\] is not compared"):
        load_preset(preset)
    preset.write_text(PRESET.replace('space = "lr=0.05,0.1"\nshefl-models = 2', 'space = "lr=0.05,0.1"\nshefl-models = 0'))
    assert main([str(fleet), str(preset), "--out", str(tmp_path / "y")]) == 2
    assert "[method.shefl]" in capsys.readouterr().err and not (tmp_path / "y").exists()


@pytest.mark.parametrize("fleet", sorted((ROOT / "fleets").glob("*.toml")), ids=lambda p: p.name)
def test_shipped_fleets_and_comparisons_plan_and_validate(fleet):
    from hetfl.methods import validate

    for path in sorted((ROOT / "comparisons").glob("*.toml")):
        preset = load_preset(path)
        for p in plans(fleet, preset, path):
            validate(p.config)
            assert p.method in tomllib.loads(path.read_text())["method"]


def test_fens_round_zero_carries_phase_one_per_client(tmp_path, task_identity):
    """FENS's round 0 is its one-shot phase: every client's upload, ensemble download and FLOPs (training plus the
    ensemble's logits on its 10% split) are listed per client, and the simulated clock counts them."""
    fleet = _fleet(tmp_path)
    cfg = {**DIGITS, "method": "fens", "fleet": str(fleet), "num-server-rounds": 1, "fraction-train": 1.0,
           "checkpoint": False}
    m = run_in_process(cfg, 6, tmp_path, "fens")
    r0 = m["rounds"][0]
    assert set(r0["flops_by_client"]) == set(r0["bytes_up_by_client"]) == {str(c) for c in range(6)}
    model_bytes = m["rounds"][1]["bytes_up_by_client"]["0"]  # an aggregator update: far smaller than a model
    assert all(b > 10 * model_bytes for b in r0["bytes_up_by_client"].values())
    assert r0["sim_round_s"] == pytest.approx(simulated_round_seconds(
        load_fleet(fleet).assign(6, 0), r0["bytes_down_by_client"], r0["bytes_up_by_client"], r0["flops_by_client"]))


def test_a_fleet_needs_num_clients_and_travels_as_an_absolute_path(tmp_path):
    from hetfl.common.config import ConfigError
    from hetfl.methods import validate
    from hetfl.launch import absolute_paths

    fleet = _fleet(tmp_path)
    with pytest.raises(ConfigError, match="run-config key 'fleet' = .* needs 'num-clients' > 0"):
        validate({"fleet": str(fleet)})
    validate({"fleet": str(fleet), "num-clients": 6})
    assert absolute_paths({"fleet": "fleets/aiot-wifi.toml"}, ROOT) == {"fleet": str(ROOT / "fleets/aiot-wifi.toml")}


def test_adaptivefl_reads_each_clients_capacity_from_the_fleet(tmp_path):
    """Without a declared capacity, a client of a fleet run gets its tier's (the server and every node agree: the
    tiers follow from the config alone); a node that declares one keeps it."""
    from flwr.app import Context, RecordDict

    from hetfl.adaptivefl_app.task import device_capacity
    from hetfl.methods import validate

    fleet = _fleet(tmp_path)
    cfg = validate({"method": "adaptivefl", "fleet": str(fleet), "num-clients": 6, "seed": 2})
    tiers = load_fleet(fleet).assign(6, 2)
    for c in range(6):
        ctx = Context(run_id=1, node_id=c, node_config={"partition-id": c, "num-partitions": 6}, state=RecordDict(),
                      run_config={})
        assert device_capacity(ctx, cfg, c)[0] == tiers[c].name
    declared = Context(run_id=1, node_id=9, node_config={"partition-id": 0, "num-partitions": 6, "capacity": "medium"},
                       state=RecordDict(), run_config={})
    assert device_capacity(declared, cfg, 0)[0] == "medium"


def test_a_malformed_flops_report_counts_nothing(task_identity):
    from flwr.app import Message, MetricRecord, RecordDict

    from hetfl.common.comm import reported_flops

    def reply(**metrics):
        return Message(RecordDict({"metrics": MetricRecord(metrics)}), dst_node_id=1, message_type="train")

    assert reported_flops(reply(train_flops=10, infer_flops=5)) == 15
    assert reported_flops(reply(train_flops=float("nan"), infer_flops=5)) == 5
    assert reported_flops(reply(train_flops=[1, 2], infer_flops=-3)) == 0


def test_every_method_of_a_comparison_shares_one_split(tmp_path):
    """A paper preset's split keys (FENS's balanced Dirichlet draw) do not reach the comparison: every method gets
    [run]'s federation; a method block that sets a federation key is refused in one line."""
    path = ROOT / "comparisons/fmnist-dir0.6.toml"
    ps = plans(ROOT / "fleets/aiot-wifi.toml", load_preset(path), path)
    for key in ("dirichlet-balance", "dirichlet-max-draws", "dirichlet-alpha", "partitioner", "num-clients", "eval-split"):
        assert len({repr(p.config.get(key)) for p in ps}) == 1, key
    assert {p.config["adaptivefl-tier-capacity"] for p in ps if p.method in ("adaptivefl", "heterofl", "all-large")} \
        == {"fixed"}
    bad = tmp_path / "bad.toml"
    bad.write_text(PRESET.replace('[method.fedavg]\nspace = "lr=0.05,0.1"', '[method.fedavg]\nspace = "lr=0.05,0.1"\n'
                                  'dirichlet-alpha = 0.1'))
    with pytest.raises(CompareError, match=r"\[method.fedavg\] sets 'dirichlet-alpha', a key of the federation"):
        plans(_fleet(tmp_path), load_preset(bad), bad)


def test_a_final_run_of_another_config_is_moved_aside_and_run_again(tmp_path, task_identity):
    fleet, preset = _fleet(tmp_path), tmp_path / "p.toml"
    preset.write_text(PRESET)
    out = tmp_path / "cmp"
    assert main([str(fleet), str(preset), "--out", str(out), "--methods", "fedavg"]) == 0
    preset.write_text(PRESET.replace("local-steps = 3", "local-steps = 2"))
    assert main([str(fleet), str(preset), "--out", str(out), "--methods", "fedavg"]) == 0
    assert json.loads((out / "fedavg" / "s0" / "metrics.json").read_text())["config"]["local-steps"] == 2
    assert json.loads((out / "fedavg" / "s0.replaced-0" / "metrics.json").read_text())["config"]["local-steps"] == 3
    assert (out / "fedavg" / "tune.replaced-0" / "study.db").exists()  # the tuning of the old preset, kept aside


def test_an_ensemble_saved_without_per_client_counts_charges_no_client():
    from hetfl.common.comm import UNATTRIBUTED
    from hetfl.common.oneshot.server import phase1_traffic

    legacy = phase1_traffic({"phase1_request_bytes": 100, "upload_bytes": 200})
    assert dict(legacy.up) == {UNATTRIBUTED: 200} and dict(legacy.down) == {UNATTRIBUTED: 100}
    per = phase1_traffic({"phase1_request_bytes": 100, "upload_bytes": 200,
                          "phase1_by_client": {"down": {"0": 60, "1": 40}, "up": {"0": 120, "1": 80},
                                               "flops": {"0": 7, "1": 9}}})
    assert dict(per.up) == {0: 120, 1: 80} and dict(per.flops) == {0: 7, 1: 9}


def test_a_fleet_of_the_same_profiles_reuses_the_runs_with_its_own_clock(tmp_path, task_identity, monkeypatch):
    """--reuse: the 5G fleet's comparison is the Wi-Fi fleet's training clocked at other speeds; a fleet whose devices
    differ in anything else (here availability) is refused in one line before anything runs."""
    wifi, preset = _fleet(tmp_path), tmp_path / "tiny-preset.toml"
    preset.write_text(PRESET)
    fast = tmp_path / "tiny-fast.toml"  # the same tiers, 10x the speed and bandwidth
    fast.write_text(TINY_FLEET.format(avail=1.0).replace("1.0e9", "1.0e10").replace("down-mbps = 1.0", "down-mbps = 10.0")
                    .replace("up-mbps = 0.5", "up-mbps = 5.0"))
    kept = tmp_path / "docs" / "wifi"
    assert main([str(wifi), str(preset), "--out", str(tmp_path / "wifi"), "--keep", str(kept), "--methods", "fedavg"]) == 0

    def trains(*a, **kw):
        raise AssertionError("trained again, though the reused comparison holds the same training")

    monkeypatch.setattr("hetfl.inprocess.run_in_process", trains)
    monkeypatch.setattr("hetfl.tune.tune", trains)
    out, kept_fast = tmp_path / "fast", tmp_path / "docs" / "fast"
    # here already: a finished run of another lr (the study chose anew since): set aside, and the reused run taken
    stale = json.loads((kept / "fedavg" / "s0" / "metrics.json").read_text())
    stale["config"] = {**stale["config"], "lr": stale["config"]["lr"] * 3, "fleet": str(fast.resolve())}
    (out / "fedavg" / "s0").mkdir(parents=True)
    (out / "fedavg" / "s0" / "metrics.json").write_text(json.dumps(stale))
    assert main([str(fast), str(preset), "--out", str(out), "--reuse", str(kept), "--keep", str(kept_fast),
                 "--methods", "fedavg"]) == 0
    assert (out / "fedavg" / "s0.replaced-0" / "metrics.json").exists()
    before, after = (json.loads((d / "fedavg" / "s0" / "metrics.json").read_text()) for d in (kept, out))
    assert after["config"]["fleet"] == str(fast.resolve()) and before["config"]["fleet"] == str(wifi.resolve())
    tiers = load_fleet(fast).assign(6, 0)
    for b, a in zip(before["rounds"], after["rounds"], strict=True):
        assert a["accuracy"] == b["accuracy"] and a.get("flops_by_client") == b.get("flops_by_client")
        if "sim_round_s" in b:  # recomputed at the fast fleet's speeds, by hand: each client's down + work + up
            by_hand = max(8 * a["bytes_down_by_client"].get(c, 0) / tiers[int(c)].speed.down_bps
                          + a["flops_by_client"].get(c, 0) / tiers[int(c)].speed.flops_per_s
                          + 8 * a["bytes_up_by_client"].get(c, 0) / tiers[int(c)].speed.up_bps
                          for c in {*a["bytes_down_by_client"], *a["flops_by_client"]})
            assert a["sim_round_s"] == pytest.approx(by_hand)
    assert sum(a.get("sim_round_s", 0) for a in after["rounds"]) < sum(b.get("sim_round_s", 0) for b in before["rounds"])
    assert (kept_fast / "fedavg" / "tune" / "spec.json").exists() and (kept_fast / "fedavg" / "s0" / "metrics.json").exists()
    assert json.loads((out / "summary.json").read_text())["methods"]["fedavg"]["values"] == \
        json.loads((tmp_path / "wifi" / "summary.json").read_text())["methods"]["fedavg"]["values"]
    scarce = _fleet(tmp_path, avail=0.5)
    with pytest.raises(CompareError, match="only flops-per-s, down-mbps and up-mbps may differ"):
        from hetfl.compare import compare
        compare(scarce, preset, tmp_path / "scarce", [0], ["fedavg"], reuse=kept)
    assert not (tmp_path / "scarce").exists()


def test_equal_budgets_let_the_cheapest_method_score_every_seed():
    """The budget is the least any method needed for all its seeds (its costliest seed), not the cheapest single run:
    FENS-like seeds costing 10 and 20 simulated seconds set a 20-s budget, at which both of its seeds count."""
    def run(*rows):  # (accuracy, simulated seconds of the round)
        return {"rounds": [{"accuracy": a, "sim_round_s": t, "cum_bytes_down": 1, "cum_bytes_up": 1, "client_flops": 1}
                           for a, t in rows]}

    results = {"fens": {"values": {}, "width": 0.5, "runs": {0: run((0.8, 10.0)), 1: run((0.9, 20.0))}},
               "fedavg": {"values": {}, "width": 0.5, "runs": {0: run((0.5, 15.0), (0.85, 15.0))}}}
    text, budget = table(results, {})
    assert budget["sim_s"] == 20.0
    fens = next(x for x in text.splitlines() if x.startswith("| FENS "))
    fedavg = next(x for x in text.splitlines() if x.startswith("| FedAvg "))
    assert fens.split(" | ")[7] == "85.00 ± 7.07" and fedavg.split(" | ")[7] == "50.00", (fens, fedavg)


def test_kept_runs_leave_out_a_seed_of_values_the_study_no_longer_chooses(tmp_path):
    """A study that grew and chose anew (FENS's lr went from 0.1 to 0.3): the kept seeds run at the old value are not
    this comparison's runs, and the page and table leave them out until they are run again; a run of the chosen
    value counts whatever fleet path it names (a clone lives elsewhere)."""
    from hetfl.compare import kept_runs

    src = ROOT / "docs" / "results" / "compare" / "aiot-wifi-fmnist-dir0.6" / "fedavg"
    chosen = json.loads((src / "tune" / "summary.json").read_text())["best"]["values"]["lr"]
    m = json.loads((src / "s0" / "metrics.json").read_text())
    (tmp_path / "fedavg" / "tune").mkdir(parents=True)
    (tmp_path / "fedavg" / "tune" / "summary.json").write_text((src / "tune" / "summary.json").read_text())
    for seed, lr, fleet in ((0, chosen, "/elsewhere/fleets/aiot-wifi.toml"), (1, chosen * 10, None), (2, chosen, None)):
        run = {**m, "config": {**m["config"], "seed": seed, "lr": lr, **({"fleet": fleet} if fleet else {})}}
        (tmp_path / "fedavg" / f"s{seed}").mkdir()
        (tmp_path / "fedavg" / f"s{seed}" / "metrics.json").write_text(json.dumps(run))
    results, left = kept_runs(tmp_path, ROOT / "fleets" / "aiot-wifi.toml", ROOT / "comparisons" / "fmnist-dir0.6.toml")
    assert sorted(results["fedavg"]["runs"]) == [0, 2] and results["fedavg"]["values"] == {"lr": chosen}
    assert left["fens"] == "not committed yet"


def test_only_trials_the_summary_lists_are_kept(tmp_path):
    """A trial left by a stopped process (its folder has a partial metrics.json; the study's summary lists only the
    trials that used budget) is not a result: never kept."""
    import json

    from hetfl.tune import finished_trials

    for n in (0, 1, 2, 3):
        (tmp_path / "trials" / f"t{n:03d}").mkdir(parents=True)
        (tmp_path / "trials" / f"t{n:03d}" / "metrics.json").write_text("{}")
    (tmp_path / "summary.json").write_text(json.dumps({"trials": [  # t001 was stopped: not listed
        {"number": 0, "state": "complete"}, {"number": 2, "state": "pruned"}, {"number": 3, "state": "fail"}]}))
    assert finished_trials(tmp_path) == [tmp_path / "trials" / f"t{n:03d}" / "metrics.json" for n in (0, 2, 3)]
    (tmp_path / "summary.json").unlink()  # a study that never finished a trial
    assert finished_trials(tmp_path) == []
