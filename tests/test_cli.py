"""The `hetfl` console command ([project.scripts]): every subcommand's --help, a real short run through it, and
Flower's --run-config syntax for overrides (docs: README "Running the experiments")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hetfl import cli

from .conftest import require_fmnist

ROOT = Path(__file__).resolve().parent.parent
HETFL = Path(sys.executable).parent / "hetfl"  # installed by `pip install -e .` (make install)


def test_the_console_command_is_installed_and_lists_its_commands():
    assert HETFL.is_file(), f"{HETFL}: run make install (pip install -e '.[dev]')"
    out = subprocess.run([str(HETFL), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and all(f"  {name} " in out.stdout for name in cli.SUBCOMMANDS), out.stdout


@pytest.mark.parametrize("sub", sorted(cli.SUBCOMMANDS))
def test_every_subcommand_documents_every_option_under_its_own_name(sub, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main([sub, "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: hetfl {sub}"), text[:80]
    options = [line.split()[0] for line in text.splitlines() if line.startswith("  -")]
    assert options, text
    # argparse prints an option without help on a line of its own followed by nothing indented: every one has help
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("  -") and len(line.split("  ")) < 3 and "-h, --help" not in line:
            assert i + 1 < len(lines) and lines[i + 1].startswith(" " * 10), f"{sub}: {line.strip()} has no help"
    assert ":class:" not in text and "``" not in text  # no RST markup in what a user reads


def test_unknown_command_is_one_line_and_exit_2(capsys):
    assert cli.main(["train"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: hetfl 'train': no such command; expected one of run, cluster, export, tables, tune, fleet, compare, study, keys, presets (hetfl --help)"]


def test_presets_name_what_each_runs(capsys):
    assert cli.main(["presets", "--method", "fens"]) == 0
    out = capsys.readouterr().out
    assert "configs/fens/fmnist-dir0.1.toml\n    FENS" in out and "configs/shefl/" not in out


SECOND_SIGNAL = """
import os, signal, time
from hetfl import launch
launch.setup_signals()
done = []
try:
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # a stop request: the run's clean-up starts
        time.sleep(30)
    finally:
        os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C while cleaning up
        os.kill(os.getpid(), signal.SIGTERM)  # and `timeout` passing on its SIGTERM
        time.sleep(0.2)
        done.append("cleaned up")
except KeyboardInterrupt:
    print("stopped", done)
"""


def test_a_second_signal_does_not_cut_the_clean_up_short():
    """The first SIGTERM/SIGINT stops a run (hetfl.launch, hetfl.cluster); the ones after it are ignored, so the
    clean-up that stops the SuperNodes runs to its end instead of leaving them orphaned."""
    out = subprocess.run([sys.executable, "-c", SECOND_SIGNAL], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "stopped ['cleaned up']", (out.stdout, out.stderr[-2000:])


@pytest.mark.slow
def test_a_real_run_through_the_console_command_and_sigterm_stops_its_whole_process_tree(tmp_path):
    """`hetfl run` with Flower's --run-config string (strings quoted) starts a simulation that writes its metrics.json
    with that config; SIGTERM (a scheduler, `kill PID`) then stops it with exit code 130 and takes its SuperLink,
    executors and Ray with it. (One Simulation-Engine launch for both: a run to its end through `python -m
    hetfl.launch` is tests/test_e2e.py's, through plain `flwr run` tests/test_flwr_run.py's.)"""
    import signal
    import time

    from hetfl import launch

    require_fmnist()
    over = ('num-server-rounds=50 min-available-nodes=4 local-steps=1 max-test-samples=200 checkpoint=false '
            'run-name="cli" tracking="none"')
    proc = subprocess.Popen([str(HETFL), "run", "configs/quickstart.toml", "--supernodes", "4", "--results-dir",
                             str(tmp_path), "--run-config", over], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    metrics = tmp_path / "cli" / "metrics.json"
    deadline = time.monotonic() + 300
    while not metrics.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)  # round 0 evaluated: SuperLink, SuperExec, simulation and Ray are all up
    tree = launch.process_tree({proc.pid})
    assert metrics.exists() and len(tree) > 3, (proc.poll(), tree)
    m = json.loads(metrics.read_text())
    assert m["config"]["tracking"] == "none" and m["config"]["num-server-rounds"] == 50, m["config"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 130
    time.sleep(1)
    assert launch.process_tree(set(tree)) == []
