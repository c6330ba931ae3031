"""Results pages answer first: each opens with a summary table generated from the committed runs, no page cites an
issue number, and the comparison plots name methods, say over how many seeds a line is and keep one-shot rounds off
the iterative methods' round axis."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _script(name: str):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        return __import__(name)
    finally:
        sys.path.pop(0)


def test_summary_tables_are_generated_from_the_committed_runs_and_open_each_page():
    summaries = _script("summaries")
    assert summaries.main(["--check"]) == 0, "run: python scripts/summaries.py"
    for name in summaries.PAGES:
        lines = [x for x in (ROOT / "docs/results" / name).read_text().splitlines() if x.strip()]
        assert lines[0].startswith("# ") and lines[1] == summaries.BEGIN, f"{name}: title, then the summary table"
        table = lines[2:lines.index(summaries.END)]
        assert any(x.startswith("| ") for x in table) and not table[0].startswith("|"), name  # setting line, then table


def test_the_comparison_page_is_generated_from_the_committed_comparisons():
    compare_page = _script("compare_page")
    assert compare_page.main(["--check"]) == 0, "run: python scripts/compare_page.py"
    text = (ROOT / "docs/compare.md").read_text()
    for folder in sorted((ROOT / "docs/results/compare").glob("*/summary.json")):  # one section per committed comparison
        assert f"committed runs in `docs/results/compare/{folder.parent.name}/`" in text, folder.parent.name


def test_readme_winner_lines_say_ties_leads_and_too_few_methods():
    compare_page = _script("compare_page")

    def lead(col, a, b, margin, spread):
        return {"column": col, "leader": a, "next": b, "margin": margin, "spread": spread,
                "tie": spread is not None and margin <= spread}

    line = compare_page.winner_text("wifi** (p", [0, 1, 2], [lead("final", "fedavg", "shefl", 0.3, 0.5),
                                                             lead("sim_s", "fens", "fedavg", 2.0, 0.5)],
                                    ["fedavg", "shefl", "fens"], ["heterofl"])
    assert line.startswith("- **wifi** (p, seeds 0, 1, 2): final accuracy: FedAvg and SHEFL tie (0.30 points apart, "
                           "seed spread 0.50); equal simulated seconds: FENS by 2.00 over FedAvg, beyond the seed "
                           "spread (0.50)"), line
    assert "spread yet" not in line and line.endswith("not yet committed: HeteroFL; [table](docs/compare.md))")
    one = compare_page.winner_text("w** (p", [0], [lead("client_bytes", "fedavg", "fens", 1.0, None)], ["fedavg", "fens"], [])
    assert "equal client bytes: FedAvg by 1.00 over FENS (points of test accuracy; no seed spread yet where a method has one seed;" in one
    assert compare_page.winner_text("w** (p", [0], [], ["fedavg"], ["fens"]).endswith(
        "fewer than two methods committed yet (FedAvg)")


@pytest.mark.parametrize("page", ["README.md", "docs/results/README.md",
                                  *(f"docs/results/{n}" for n in ("shefl-fmnist-r30.md", "fens-fmnist.md",
                                                                  "adaptivefl-fmnist-r30.md", "bench.md"))])
def test_pages_cite_no_issue_numbers_or_sessions(page):
    text = (ROOT / page).read_text()
    assert not re.findall(r"(?<![\w/&(])#\d+\b", text), page
    assert not re.search(r"\b(session|lent to)\b", text), page


def _run(acc: list[float], mb_per_round: float, seed: int, phases: dict | None = None) -> dict:
    rows = [{"round": i, "accuracy": a, "cum_bytes_down": i * mb_per_round * 5e5 + (1e9 if phases else 0),
             "cum_bytes_up": i * mb_per_round * 5e5} for i, a in enumerate(acc)]
    run = {"config": {"seed": seed}, "rounds": rows}
    if phases:
        run["phases"] = phases
    return run


def test_plot_names_methods_and_keeps_fens_rounds_off_the_fl_round_axis(tmp_path, monkeypatch):
    plots = _script("plots")
    assert plots.display_name("fedavg/fmnist-dir0.1-lr0.1") == "FedAvg (lr 0.1)"
    assert plots.display_name("adaptivefl/fmnist-dir0.6-greed") == "AdaptiveFL +Greed"
    assert plots.display_name("shefl/fmnist-dir0.1-r3-k0.02") == "SHEFL (1:3, k = 0.02)"
    assert plots.display_name("fedavg/fmnist-dir0.6-literal-local-steps0-local-epochs5") == \
        "FedAvg (literal local work, 5 local epochs)"
    assert plots.run_label("fedavg-stc-fmnist-dir0.1-lr0.1-s0") == "fedavg-stc/fmnist-dir0.1-lr0.1"
    assert plots.legend_label("FENS", 3) == "FENS (mean ± std over 3 seeds)" and plots.legend_label("FedAdam", 1) == "FedAdam (n=1)"
    assert plots.legend_title([3, 3]).endswith("over 3 seeds (n=3)") and plots.legend_title([3, 1]) is None

    drawn = {}
    import matplotlib.figure

    real = matplotlib.figure.Figure.savefig

    def keep(fig, *a, **k):
        drawn["fig"] = fig
        return real(fig, *a, **k)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    fens = [_run([0.1] + [0.5 + 0.001 * i for i in range(500)], 1.4, s, {"upload_bytes": 1}) for s in (0, 1, 2)]
    fedadam = [_run([0.1] + [0.6 + 0.005 * i for i in range(50)], 276, 0)]
    out = plots.plot_comparison({"fens/fmnist-dir0.1": fens, "fedadam/fmnist-dir0.1": fedadam}, tmp_path / "p.png", "t")
    assert out.stat().st_size > 10_000
    fig = drawn["fig"]
    titles = {ax.get_title(): ax for ax in fig.axes}
    rounds = titles["by round (iterative methods)"]
    assert max(x for line in rounds.get_lines() for x in line.get_xdata()) <= 50  # FENS's 500 rounds are not here
    assert max(titles["FENS by aggregator round"].get_lines()[0].get_xdata()) == 500
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[:2] == ["FENS (mean ± std over 3 seeds)", "FedAdam (n=1)"]
    assert legend[2].startswith("FENS final 99.9%, mean of 3 seeds") and "dotted level" in legend[2]
    zoom = next(ax for t, ax in titles.items() if t.startswith("rounds 25-50"))
    assert zoom.get_ylim()[0] > 60  # the zoom's y-range comes from the last half's data, not from round 0
