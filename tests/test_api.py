"""The public API: what hetfl.__all__ names resolves, is documented (a docstring and a row of docs/api.md), and
`import hetfl` alone stays light (no torch, no Flower) for a device that only needs its version."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import hetfl

ROOT = Path(__file__).resolve().parent.parent


def test_every_public_name_resolves_and_has_a_docstring():
    missing = [n for n in hetfl.__all__ if n != "__version__" and not (getattr(hetfl, n).__doc__ or "").strip()]
    assert missing == [], missing


def test_every_public_name_is_on_the_api_page():
    page = (ROOT / "docs" / "api.md").read_text()
    absent = [n for n in hetfl.__all__ if n != "__version__" and f"`{n}`" not in page]
    assert absent == [], absent


def test_import_hetfl_is_light():
    out = subprocess.run([sys.executable, "-c", "import sys, hetfl; print(hetfl.__version__); "
                          "print(sorted(m for m in ('torch', 'flwr', 'numpy') if m in sys.modules))"],
                         capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.splitlines()[1] == "[]", out.stdout
