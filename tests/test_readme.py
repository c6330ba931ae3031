"""The front door: the README's shape, the papers cited, one source for the result numbers, links that resolve, and
the version written once."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()

PAPERS = {  # BibTeX key -> the paper's title as the paper itself gives it (../shared/papers)
    "ryum2025shefl": "Resource-Aware Aggregation and Sparsification in Heterogeneous Ensemble Federated Learning",
    "allouah2024fens": "Revisiting Ensembling in One-Shot Federated Learning",
    "jia2024adaptivefl": "Adaptive Heterogeneous Federated Learning for Resource-Constrained",
}


def test_readme_is_short_and_its_first_screen_reads_as_a_table_not_paragraphs():
    lines = README.splitlines()
    assert len(lines) <= 250, len(lines)
    long = [(i + 1, len(x)) for i, x in enumerate(lines[:60]) if len(x) > 200]
    assert long == [], long
    first = "\n".join(lines[:12])
    assert "make run" in first and "make test" in first  # the whole set-up, on the first screen
    for section in ("## Environment setup", "## Running the experiments", "## Expected results", "## Methods"):
        assert section in README, section
    assert README.index("## Environment setup") < README.index("## Running the experiments")


@pytest.mark.parametrize("key", sorted(PAPERS))
def test_each_paper_is_cited_with_bibtex(key):
    block = re.search(r"```bibtex\n(@\w+\{" + key + r",.*?)```", README, re.S)
    assert block, f"no BibTeX entry {key} in the README"
    entry = " ".join(block.group(1).split())
    assert PAPERS[key].lower() in entry.replace("{", "").replace("}", "").lower(), entry
    assert re.search(r"author\s*=", entry) and re.search(r"year\s*=\s*\{20\d\d\}", entry), entry


def test_result_tables_are_generated_from_the_committed_runs():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import headline
    finally:
        sys.path.pop(0)
    assert headline.main(["--check"]) == 0, "run: python scripts/headline.py"
    assert headline.headline() in README  # the README holds the generated tables, not a hand-typed copy


def test_every_relative_link_of_the_readme_and_docs_resolves():
    missing = []
    for doc in [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = target.split("#")[0]
            if path and not (doc.parent / path).exists():
                missing.append(f"{doc.relative_to(ROOT)} -> {target}")
    assert missing == [], missing


def test_the_version_is_written_once():
    import hetfl

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert hetfl.__version__ == project["version"]
    assert f"version: {project['version']}" in (ROOT / "CITATION.cff").read_text()
    assert "__version__ = \"" not in (ROOT / "hetfl" / "__init__.py").read_text()  # derived, not a second copy
