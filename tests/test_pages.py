"""Results pages answer first: each opens with a summary table generated from the committed runs, no page cites an
issue number, and the comparison plots name methods, say over how many seeds a line is and keep one-shot rounds off
the iterative methods' round axis."""

from __future__ import annotations

import json
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


def test_readme_winner_lines_say_leads_unresolved_cells_and_too_few_methods():
    compare_page = _script("compare_page")
    # hand-worked: leader - runner-up by seed (+1, +2, +3): mean 2, SD 1, t_{0.975,2} = 4.303, half-width 2.484;
    # paired t p = 0.0742. Three equal differences of +2: SD 0, p = 0. Holm over the two: 0 and 0.0742.
    results = {"fedavg": {"runs": {s: {"rounds": []} for s in (0, 1, 2)}},
               "fens": {"runs": {s: {"rounds": []} for s in (0, 1, 2)}}}
    final = {"fedavg": {0: 0.80, 1: 0.82, 2: 0.84}, "fens": {0: 0.79, 1: 0.80, 2: 0.81}}
    at_time = {"fedavg": {0: 0.70, 1: 0.71, 2: 0.72}, "fens": {0: 0.72, 1: 0.73, 2: 0.74}}
    for m, res in results.items():  # each run's "curve" names its method and seed; the two columns read those
        for s, run in res["runs"].items():
            run["rounds"] = {"accuracy": [final[m][s]], "m": m, "s": s}
    old = compare_page.curve, compare_page.accuracy_at, compare_page.COLUMNS
    compare_page.curve = lambda rows: rows
    compare_page.accuracy_at = lambda c, col, b: at_time[c["m"]][c["s"]]
    compare_page.COLUMNS = {"final": "final accuracy", "sim_s": "accuracy at equal simulated seconds"}
    try:
        lead = compare_page.leaders(results, {"sim_s": 1.0})
    finally:
        compare_page.curve, compare_page.accuracy_at, compare_page.COLUMNS = old
    fin, tim = lead
    assert (fin["leader"], fin["next"], fin["n"]) == ("fedavg", "fens", 3)
    assert fin["diff"] == pytest.approx(2.0) and fin["high"] - fin["diff"] == pytest.approx(4.3027 / 3 ** 0.5, abs=1e-3)
    assert fin["p"] == pytest.approx(0.0742, abs=1e-3) and not fin["ahead"]  # Holm: the larger p stays 0.0742
    assert (tim["leader"], tim["diff"], tim["p"], tim["ahead"]) == ("fens", pytest.approx(2.0), 0.0, True)
    line = compare_page.winner_text("wifi** (p", [0, 1, 2], lead, ["fedavg", "fens"], ["heterofl"])
    assert line.startswith("- **wifi** (p, seeds 0, 1, 2): final accuracy: FedAvg over FENS not resolved (n = 3, "
                           "paired +2.00, 95% CI [-0.48, 4.48], Holm p = 0.074); equal simulated seconds: FENS ahead "
                           "of FedAvg (n = 3, paired +2.00, 95% CI [2.00, 2.00], Holm p = 0.000)"), line
    assert line.endswith("paired by seed; not yet committed: HeteroFL; [table](docs/compare.md))")
    one = compare_page.winner_text("w** (p", [0], [{"column": "client_bytes", "leader": "fedavg", "next": "fens",
                                                    "margin": 1.0, "n": 1}], ["fedavg", "fens"], [])
    assert "equal client bytes: FedAvg over FENS not resolved (1 common seed: no interval)" in one
    assert compare_page.winner_text("w** (p", [0], [], ["fedavg"], ["fens"]).endswith(
        "fewer than two methods committed yet (FedAvg)")


def test_the_readme_verdicts_are_recomputed_from_the_committed_runs():
    assert _script("verdict_table").main(["--check"]) == 0, "run: python scripts/verdict_table.py"


def test_a_verdict_cell_pairs_by_seed_turns_rounds_to_the_papers_direction_and_leaves_out_censored_seeds(tmp_path,
                                                                                                      monkeypatch):
    vt = _script("verdict_table")

    def run(name, seed, accs):
        path = tmp_path / f"{name}-s{seed}.json"
        path.write_text(json.dumps({"config": {"seed": seed},
                                    "rounds": [{"round": k + 1, "accuracy": a} for k, a in enumerate(accs)]}))
        return str(path)

    monkeypatch.setattr(vt, "ROOT", tmp_path)
    # rounds to 0.8: A reaches it at rounds 2, 3, never; B at 4, 4, 2. Paper direction b - a: +2, +1; seed 2 censored
    a = [run("a", 0, [0.5, 0.8, 0.9]), run("a", 1, [0.5, 0.6, 0.85]), run("a", 2, [0.5, 0.6, 0.7])]
    b = [run("b", 2, [0.5, 0.9, 0.9, 0.9]), run("b", 0, [0.1, 0.2, 0.3, 0.8]), run("b", 1, [0.1, 0.2, 0.3, 0.8])]
    c = vt.cell_result({"name": "x", "statistic": "round-to:0.8", "a": a, "b": b}, "superiority", 1.0)
    assert c["seeds"] == [0, 1] and c["censored"] == [2] and c["diffs"] == [2.0, 1.0]
    # mean 1.5, SD 0.7071, t(0.975, 1) = 12.706: half-width 6.353; contains 0, reaches the margin 1: inconclusive
    assert c["low"] == pytest.approx(1.5 - 6.353, abs=1e-3) and c["label"].startswith("inconclusive at 2 seeds")
    # final accuracy, a parity claim within 5 points: diffs (0.9-0.8, 0.85-0.8) * 100 = +10, +5: not shown
    c = vt.cell_result({"name": "y", "statistic": "final", "a": a[:2], "b": b[1:]}, "parity", 5.0)
    assert c["diffs"] == pytest.approx([10.0, 5.0]) and c["label"].startswith("not shown: parity within +-5")
    with pytest.raises(ValueError, match="2 primary cells"):
        vt.row_result({"claim": "z", "kind": "direction", "cell": [{"primary": True}, {"primary": True}]})


def test_a_verdict_row_takes_its_declared_studys_verdict_once_every_seed_ran(tmp_path, monkeypatch):
    import json as _json

    from hetfl import study as S

    vt = _script("verdict_table")
    f = tmp_path / "tiny.toml"
    f.write_text(_study_file())
    monkeypatch.setattr(S, "STUDIES", tmp_path / "studies")
    row = {"claim": "c", "kind": "superiority", "study": str(f),
           "cell": [{"name": "old", "primary": True, "statistic": "final", "a": [], "b": []}]}
    assert vt.study_verdict(row) is None  # not run
    (tmp_path / "studies" / "tiny").mkdir(parents=True)
    done = {"n": 1, "mean": 1.0, "low": float("nan"), "high": float("nan"), "label": "inconclusive at 1 seed"}
    (tmp_path / "studies" / "tiny" / "verdict.json").write_text(_json.dumps(done))
    assert vt.study_verdict(row) is None  # one of its two seeds: the committed cells stand
    a, b = S.Study.from_file(f).primary
    why = "stopped in round 3: no client update was accepted"
    left = {**done, "seeds": [0], "scores": {a: {"0": 80.0, "1": 81.0}, b: {"0": 79.0}}, "failed": {b: {"1": why}}}
    (tmp_path / "studies" / "tiny" / "verdict.json").write_text(_json.dumps(left))
    assert vt.study_verdict(row)["n"] == 1  # the other seed stopped and was left out: every seed ran
    scored = {**done, "seeds": [0], "scores": {a: {"0": 80.0}, b: {"0": 12.0}}, "failed": {b: {"0": why}}}
    (tmp_path / "studies" / "tiny" / "verdict.json").write_text(_json.dumps(scored))
    assert vt.study_verdict(row) is None  # the stopped seed was scored (last-model) and is in n: seed 1 is still to run
    other = {"pair": [a, "ghost"], "n": 1, "mean": 68.0, "low": 1.0, "high": 2.0, "label": "x"}  # an others entry
    (tmp_path / "studies" / "tiny" / "verdict.json").write_text(_json.dumps(
        {**done, "scores": {a: {"0": 80.0, "1": 81.0}, "ghost": {"0": 12.0}}, "failed": {"ghost": {"0": why}},
         "others": [other]}))
    assert vt.study_verdict({**row, "study-other": "ghost"}) is None  # its scored stopped seed is counted once
    (tmp_path / "studies" / "tiny" / "verdict.json").write_text(_json.dumps({**done, "n": 2, "low": 0.5, "high": 1.5,
                                                                            "label": "held, smaller than claimed"}))
    r = vt.row_result(row)
    assert r["primary"]["label"] == "held, smaller than claimed" and "declared study [tiny]" in r["primary"]["name"]
    assert [c["name"] for c in r["others"]] == ["old"]
    from hetfl import stats

    # an [[also]] convergence claim: its own margin (rounds, not the study's points) and its difference b - a
    also = {"claim": "fewer rounds", "kind": "superiority", "margin": 2.1, "statistic": "round-to:0.8",
            "primary": [a, b], "n": 2, "mean": 1.5, "low": 0.5, "high": 2.5, "label": "held", "diffs": [1.0, 2.0]}
    (tmp_path / "studies" / "tiny" / "verdict.json").write_text(_json.dumps({**done, "n": 2, "also": [also]}))
    c = vt.study_verdict({**row, "study-also": 0})
    assert c["margin"] == 2.1 and c["name"].startswith(f"rounds to 80%: {b} - {a} ")
    assert c["claim_p"] == pytest.approx(stats.claim_p([1.0, 2.0], "superiority", 2.1))


def test_a_cell_takes_its_own_declared_studys_verdict_and_holm_counts_it(tmp_path, monkeypatch):
    """A row over several alphas: the other alpha's cell names its own study; once its seeds ran, the cell is that
    study's verdict (its primary pair, or with ``study-other`` the primary method against another), Holm-corrected
    with the row's other cells by the claim's own test."""
    import json as _json

    from hetfl import study as S

    vt = _script("verdict_table")
    f = tmp_path / "tiny.toml"
    f.write_text(_study_file())
    monkeypatch.setattr(S, "STUDIES", tmp_path / "studies")
    a, b = S.Study.from_file(f).primary
    row = {"claim": "c", "kind": "superiority", "margin": 5.0, "budget": "-", "moved": "-",
           "cell": [{"name": "main", "primary": True, "statistic": "final", "a": [], "b": []},
                    {"name": "other alpha", "statistic": "final", "a": [], "b": [], "study": str(f)},
                    {"name": "other method", "statistic": "final", "a": [], "b": [], "study": str(f),
                     "study-other": "ghost"}]}
    r = vt.row_result(row)
    assert [c["label"] for c in r["others"]] == ["no pair yet", "no pair yet"]  # not run: the committed cells stand
    assert not vt.ran(r) and "| c |" not in vt.render([r])  # a row with no pair at all is not in the table yet
    (tmp_path / "studies" / "tiny").mkdir(parents=True)
    # per seed +1, +3: mean 2, SD 1.414, t(0.975, 1) = 12.706: [2 - 12.71, 2 + 12.71]; paired t p = 0.295
    other = {"pair": [a, "ghost"], "n": 2, "mean": -4.0, "low": -9.0, "high": 1.0, "label": "x", "diffs": [-3.0, -5.0]}
    (tmp_path / "studies" / "tiny" / "verdict.json").write_text(_json.dumps(
        {"n": 2, "mean": 2.0, "low": -10.7, "high": 14.7, "label": "inconclusive at 2 seeds", "diffs": [1.0, 3.0],
         "others": [other]}))
    r = vt.row_result(row)
    alpha, method = r["others"]
    assert vt.ran(r) and "| c |" in vt.render([r])
    assert alpha["name"].startswith("other alpha: ") and "declared study [tiny]" in alpha["name"]
    assert alpha["mean"] == 2.0 and alpha["claim_p"] == pytest.approx(0.2952, abs=1e-3)
    assert method["name"].startswith("other method: ") and f"{a} - ghost" in method["name"] and method["mean"] == -4.0
    # Holm over p = 0.295 (the alpha) and the method's paired t p (mean -4, SD 1.414: t = -4, p = 0.156):
    # sorted 0.156 x 2 = 0.312, then max(0.312, 0.295) = 0.312
    assert [c["p_holm"] for c in r["others"]] == pytest.approx([0.312, 0.312], abs=2e-3)


def _study_file() -> str:
    from .test_study import SMALL

    return SMALL


def test_every_script_the_docs_tell_a_reader_to_run_exists():
    """A page line that runs `python scripts/<name>.py` names a script that is there (a removed one-off script is
    cited with the commit that holds it, `git show <sha>:scripts/<name>.py`, never as a command)."""
    pages = [ROOT / "README.md", ROOT / "Makefile", *sorted((ROOT / "docs").rglob("*.md"))]
    missing = sorted({(p.relative_to(ROOT).as_posix(), name) for p in pages
                      for name in re.findall(r"python3? (scripts/[\w/]+\.py)", p.read_text())
                      if not (ROOT / name).exists()})
    assert not missing, missing


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
