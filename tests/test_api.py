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


def _docs_flags() -> list[str]:
    import re

    return re.search(r"^DOCS_FLAGS = (.*)$", (ROOT / "Makefile").read_text(), re.M).group(1).split()


def test_make_docs_builds_the_reference_without_a_warning_or_a_broken_reference(tmp_path):
    """`make docs`' build (its flags read from the Makefile): exit 0, and every public name has its entry."""
    out = subprocess.run([sys.executable, "-m", "sphinx", *_docs_flags(), str(ROOT / "docs" / "reference"),
                          str(tmp_path / "html")], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    page = (tmp_path / "html" / "api.html").read_text()
    absent = [n for n in hetfl.__all__ if n != "__version__" and f'id="{hetfl._API[n]}.{n}"' not in page]
    assert absent == [], absent


def test_a_broken_cross_reference_fails_the_docs_build(tmp_path):
    """`make docs`' configuration and flags on a one-line page (the reference itself excluded: a second full build
    would show nothing more)."""
    import shutil

    src = tmp_path / "src"
    shutil.copytree(ROOT / "docs" / "reference", src, ignore=shutil.ignore_patterns("_build", "api.rst"))
    (src / "conf.py").write_text((src / "conf.py").read_text().replace("HERE.parent.parent", repr(str(ROOT))))
    (src / "index.rst").write_text("hetfl\n=====\n\nSee :func:`hetfl.common.nodes.no_such_function`.\n")
    out = subprocess.run([sys.executable, "-m", "sphinx", *_docs_flags(), "-D", "exclude_patterns=_build,api.rst",
                          str(src), str(tmp_path / "html")], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode != 0 and "no_such_function" in out.stdout + out.stderr
