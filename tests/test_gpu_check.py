"""`make gpu-check` on a machine without a GPU: one line, exit 0 (the script itself runs where a GPU is)."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the script runs the whole check (make gpu-check)")
def test_gpu_check_without_a_gpu_says_so_in_one_line_and_exits_0():
    p = subprocess.run([sys.executable, "scripts/gpu_check.py"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines() == [
        "gpu-check: no CUDA device on this machine (torch.cuda.is_available() is False); nothing to check"]
