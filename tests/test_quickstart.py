"""The front door: one short preset per method (README "Quickstart"), and `make reproduce-*` that tabulate the
committed runs unless asked to train (README "Experimental setup")."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from hetfl import launch

from .conftest import require_fmnist

ROOT = Path(__file__).resolve().parent.parent
QUICKSTARTS = {"shefl": "configs/quickstart-shefl.toml", "fens": "configs/quickstart-fens.toml",
               "adaptivefl": "configs/quickstart-adaptivefl.toml"}
LIMIT_S = 120  # each quickstart finishes in under 2 minutes on the project's 2-core machines


def _measured_s(preset: str) -> int:
    """The wall time the preset's header states (``# Measured: N s ...``)."""
    m = re.search(r"^# Measured: (\d+) s\b", (ROOT / preset).read_text(), re.M)
    assert m, f"{preset}: no '# Measured: N s' line in its header"
    return int(m.group(1))


@pytest.mark.parametrize("method", sorted(QUICKSTARTS))
def test_quickstart_is_a_short_real_run_of_its_method(method):
    """Each quickstart is its method on real Fashion-MNIST from local files (offline), passes pre-flight with as
    many SuperNodes as the launcher gives it by default, and is small: few rounds, few clients, step-based local
    work; its header states the time it took, under 2 minutes, and the README's quickstart table says the same."""
    require_fmnist()
    preset = QUICKSTARTS[method]
    raw = tomllib.loads((ROOT / preset).read_text())
    cfg = launch.preflight(raw, raw["min-available-nodes"])  # the launcher's default --supernodes
    assert cfg["method"] == method and cfg["dataset"] == "fashion_mnist" and cfg["data-source"] == "auto"
    assert cfg["num-server-rounds"] <= 20 and cfg["min-available-nodes"] <= 20
    assert cfg["local-steps"] > 0  # not epochs: a quickstart's local work does not grow with the partition
    measured = _measured_s(preset)
    assert 0 < measured < LIMIT_S, (preset, measured)
    readme = (ROOT / "README.md").read_text()
    row = next((line for line in readme.splitlines() if line.startswith(f"| [`{preset}`]")), None)
    assert row is not None, f"README's quickstart table has no row for {preset}"
    assert f"{measured} s" in row, (row, measured)
    assert f"make quickstart-{method}" in readme


def test_make_quickstart_targets_run_the_presets():
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    for method, preset in QUICKSTARTS.items():
        out = subprocess.run(["make", *MAKE_DRY, f"quickstart-{method}"], cwd=ROOT, env=MAKE_ENV,
                             capture_output=True, text=True, check=True).stdout
        assert f"-m hetfl.launch {preset}" in out, out


# a dry run of one target, its prerequisites install/data taken as done; as a top-level make even when the suite runs
# under `make test` (a nested make prints "Entering directory" lines and inherits MAKEFLAGS)
MAKE_DRY = ("-n", "--no-print-directory", "-o", "install", "-o", "data")
MAKE_ENV = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")}
REPRODUCE = ("reproduce-shefl", "reproduce-shefl-studies", "calibrate-shefl", "reproduce-fens", "reproduce-fens-iterative",
             "reproduce-oneshot", "reproduce-adaptivefl")


@pytest.mark.parametrize("target", REPRODUCE)
def test_make_reproduce_tabulates_unless_asked_to_train_and_says_how_long_training_takes(target):
    """By default every reproduce.py call of the target is --table-only (seconds, from docs/results runs); TRAIN=1
    drops that (except the final tabulation of reproduce-fens), and both say how long training takes."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")

    def dry(*extra: str) -> list[str]:
        out = subprocess.run(["make", *MAKE_DRY, target, *extra], cwd=ROOT, env=MAKE_ENV,
                             capture_output=True, text=True, check=True).stdout
        return [c for c in re.split(r"(?<!\\)\n", out) if c.strip()]

    for commands, training in ((dry(), False), (dry("TRAIN=1"), True)):
        echo = commands[0]
        assert echo.startswith("echo ") and re.search(r"~\d+(\.\d+)? (h|min)\b", echo), echo
        assert ("training the missing runs" in echo) == training, echo
        calls = [c for part in commands[1:] for c in part.split("scripts/reproduce.py")[1:]]
        assert calls, commands
        table_only = ["--table-only" in c.split("--presets")[0] for c in calls]
        if not training:
            assert all(table_only), calls
            assert all("docs/results/" in c.partition("--reuse")[2] for c in calls), calls  # the committed runs
            assert "fens_sweep" not in " ".join(commands)  # the sweep needs an ensemble that is not committed
        else:
            assert not all(table_only), calls


def test_make_reproduce_oneshot_runs_the_four_baselines_and_tabulates_them_with_the_fens_runs():
    """Per alpha one reproduce.py call with FedKD first (its phase 1 is the one Fed-ET starts from), Fed-ET,
    Co-Boosting and FedCVAE-Ens, then Table 1 from those runs and the committed FENS runs; ONESHOT_EPOCHS scales the
    distilling methods' own epochs keys (FedCVAE-Ens's preset is passed as it is)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    out = subprocess.run(["make", *MAKE_DRY, "reproduce-oneshot", "TRAIN=1", "ONESHOT_EPOCHS=50", "SEEDS=0"], cwd=ROOT,
                         env=MAKE_ENV, capture_output=True, text=True, check=True).stdout
    call = out[out.index("scripts/reproduce.py"):]
    presets = re.findall(r'"?(configs/[^"\s]+)"?', call.partition("--presets")[2].partition("--reuse")[0])
    assert presets == [*(f"configs/{m}/fmnist-dir$a.toml@{m}-epochs=50" for m in ("fedkd", "fedet", "coboost")),
                       "configs/fedcvae/fmnist-dir$a.toml"], out
    table = out[out.index("scripts/oneshot_table.py"):]
    assert "--alphas 0.01 0.05 0.1 --seeds 0" in table and "docs/results/fens-fmnist-dir{alpha}/runs" in table
    assert table.index("results/reproduce/oneshot-fmnist-dir{alpha}/runs") < table.index("docs/results/oneshot-fmnist")


@pytest.mark.slow
def test_shefl_quickstart_runs_end_to_end_in_process(tmp_path, task_identity):
    """The SHEFL quickstart preset as written, through the real ServerApp and ClientApp code on the in-process grid
    (the launcher's Simulation Engine adds only process start-up; SHEFL on Ray: tests/test_ray_cluster.py, on
    SuperNodes: tests/test_multihost.py): 10 nodes, 4 HPCs and 4 LPCs sampled a round. Every round trains
    C_h = 2 HPC clusters on all M = 3 models and C_l = 4 LPC clusters on one each, spread over the models by the
    balanced schedule (2/1/1), with top-k sparse uploads, and the ensemble learns. ~40 CPU-seconds (94 s of wall
    time on 2 cores shared with other work)."""
    from .inprocess import run_in_process

    require_fmnist()
    raw = tomllib.loads((ROOT / QUICKSTARTS["shefl"]).read_text())
    m = run_in_process(raw, raw["min-available-nodes"], tmp_path, "quickstart-shefl")
    rows = m["rounds"]
    assert [r["round"] for r in rows] == list(range(raw["num-server-rounds"] + 1))
    assert m["roles"]["C_h"] == 2 and m["roles"]["C_l"] == 4
    for r in rows[1:]:
        assert r["replies"] == 6 and r["failures"] == 0 and r["rejected"] == 0
        # HPCs receive all M = 3 models, LPCs one
        assert r["bytes_down_hpc_mean"] == pytest.approx(3 * r["bytes_down_lpc_mean"], rel=0.01)
        # every model: both HPCs; the 4 LPC slots spread over 3 models as 2/1/1 (balanced)
        assert all(r[f"H_m{j}"] == 2 for j in range(3)) and sorted(r[f"L_m{j}"] for j in range(3)) == [1, 1, 2]
        # sparse upload, k = 0.1 for both roles (k_h = 0.1 * 3.0 / 3): <= 0.2 of the dense models sent
        assert r["bytes_up"] <= 0.2 * r["bytes_down"]
        # members from distinct inits disagree somewhere; if they disagreed everywhere no two could be right at once
        assert 0.0 < r["disagreement"] < 1.0, r["disagreement"]
    assert all(f"acc_m{j}" in rows[-1] for j in range(3))
    # chance: 0.1; the run ends at 49.15% (the README's table); 0.45 is the bound of the SHEFL end-to-end test
    # whose checks moved here
    assert rows[-1]["accuracy"] > 0.45, [r["accuracy"] for r in rows]


def test_make_run_away_from_debian_fails_at_preflight_naming_both_ways_to_get_the_data(tmp_path):
    """`make run` on a machine without Debian's dataset package and without the hub: /usr/share/datasets is an empty
    tmpfs in a mount namespace of the command alone, HF_HUB_OFFLINE is unset and huggingface.co unreachable (no
    network here). `make data` says the hub will be used and does not fail; the run stops at pre-flight with one
    line that names both ways to get Fashion-MNIST, and nothing starts."""
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("make") is None:
        pytest.skip("needs root, unshare and make to hide /usr/share/datasets in a mount namespace")
    env = {k: v for k, v in MAKE_ENV.items() if k != "HF_HUB_OFFLINE"}
    env["HETFL_CACHE"] = str(tmp_path / "cache")  # no partition cached from another run
    # installed already; APT_GET: a machine without apt-get (here dpkg would say the package is installed)
    script = "mount -t tmpfs none /usr/share/datasets && exec make -s -o install run APT_GET=no-apt-get-here"
    out = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode != 0, text[-2000:]
    assert "the runs will read it from the Hugging Face hub" in text, text[-2000:]
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, text[-2000:]
    assert "apt-get install dataset-fashion-mnist" in errors[0] and "reach huggingface.co" in errors[0], errors[0]
    assert "Starting" not in text and "SuperLink" not in text  # failed before any process started
