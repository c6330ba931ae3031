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


COMMANDS = ("python -m hetfl.", ".venv/bin/python -m hetfl.", "hetfl run", "hetfl compare", "make ", ".venv/bin/python examples/")


def _doc_commands() -> list[tuple[str, str, str | None]]:
    """(file, command, the error line the docs show right below it, or None) of every hetfl or make command in the
    bash blocks of the README and docs/*.md, continuation lines joined; commands with a <placeholder> are left out."""
    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        blocks, block, lang = [], None, ""
        for line in path.read_text().splitlines():
            fence = re.match(r"\s*```(\w*)", line)
            if fence and block is None:
                block, lang = [], fence.group(1)
            elif fence:
                if lang in ("", "bash", "sh", "console"):
                    blocks.append("\n".join(block))
                block = None
            elif block is not None:
                block.append(line)
        split = [[ln.strip().removeprefix("$ ") for ln in re.sub(r"\\\n\s*", " ", t).splitlines()] for t in blocks]
        for k, lines in enumerate(split):
            # the output shown below a command: its next line, or the first line of the next block
            after = [*lines[1:], (split[k + 1][:1] or [""])[0] if k + 1 < len(split) else ""]
            for line, below in zip(lines, after, strict=True):
                line = re.split(r"\s+#|\s{3,}", line)[0].strip()  # a comment, or a diagram's second column
                if line.startswith(COMMANDS) and not re.search(r"[<>$]|\.\.\.", line):
                    out.append((path.relative_to(ROOT).as_posix(), line, below if below.startswith("error:") else None))
    return out


class _Parsed(Exception):
    """Raised by the stand-ins once a command has been parsed and its config validated: nothing runs."""


def test_every_documented_command_parses_and_its_config_validates(monkeypatch, capsys, tmp_path):
    """In the order the docs give them (their /tmp/ paths under a fresh directory): each `python -m hetfl.launch` /
    `hetfl run` command parses and passes the launcher's whole pre-flight (config, data, model), or, where the docs
    show an error below it, exits 2 with exactly that line; the same for `python -m hetfl.tune` (its space checked);
    each `python -m hetfl.cluster` command parses; each `make` target exists; the examples' data scripts run.
    No simulation starts."""
    import shlex

    from hetfl import cluster, launch
    from hetfl import tune as tune_mod
    import subprocess

    def fake_run(config, overrides, supernodes, *args, **kwargs):
        launch.preflight({**launch.load_preset(config), **overrides}, supernodes)
        raise _Parsed

    def fake_tune(spec, study_dir, final=True, workers=1):
        tune_mod.check_spec(spec)
        raise _Parsed

    monkeypatch.setattr(launch, "run", fake_run)
    monkeypatch.setattr(tune_mod, "tune", fake_tune)
    from hetfl import compare as compare_mod

    def fake_run_plan(*_args, **_kw):
        raise _Parsed

    monkeypatch.setattr(compare_mod, "run_plan", fake_run_plan)
    monkeypatch.chdir(ROOT)
    targets = {t for rule in re.findall(r"^([\w][\w -]*):", (ROOT / "Makefile").read_text(), re.M) for t in rule.split()}
    seen = {"launch": 0, "tune": 0, "compare": 0, "cluster": 0, "make": 0}
    for where, line, shown in _doc_commands():
        argv = shlex.split(line.removeprefix(".venv/bin/").replace("/tmp/", f"{tmp_path}/"))
        shown = shown and shown.replace("/tmp/", f"{tmp_path}/")
        if argv[:2] == ["python", "examples/byo/make_digits.py"]:
            subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, check=True, capture_output=True)
            continue
        if argv[:3] == ["python", "-m", "hetfl.launch"] or argv[:2] == ["hetfl", "run"]:
            rest = argv[3:] if argv[0] == "python" else argv[2:]
            if shown:  # a documented bad input: exit 2 with the error line the docs show
                capsys.readouterr()
                assert launch.main(rest) == 2, (where, line)
                assert capsys.readouterr().err.strip() == shown, (where, line)
            else:
                with pytest.raises(_Parsed):
                    assert launch.main(rest) == 0, (where, line)  # a config error returns 2 instead of raising _Parsed
            seen["launch"] += 1
        elif argv[:3] == ["python", "-m", "hetfl.tune"]:
            if shown:
                capsys.readouterr()
                assert tune_mod.main(argv[3:]) == 2, (where, line)
                assert capsys.readouterr().err.strip() == shown, (where, line)
            else:
                with pytest.raises(_Parsed):
                    tune_mod.main(argv[3:])
            seen["tune"] += 1
        elif argv[:3] == ["python", "-m", "hetfl.compare"] or argv[:2] == ["hetfl", "compare"]:
            with pytest.raises(_Parsed):  # every method's config checked, then the first run stops it
                compare_mod.main(argv[3:] if argv[0] == "python" else argv[2:])
            seen["compare"] += 1
        elif argv[:3] == ["python", "-m", "hetfl.cluster"]:
            cluster._parser().parse_args(argv[3:])
            seen["cluster"] += 1
        elif argv[0] == "make":
            assert not set(a for a in argv[1:] if "=" not in a) - targets, (where, line)
            seen["make"] += 1
    assert all(seen.values()), seen  # the docs still hold commands of each kind
