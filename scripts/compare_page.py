"""docs/compare.md's results, from the committed comparisons (docs/results/compare/<fleet>-<preset>/): per fleet, the
table of every method with finished runs (hetfl.compare.table: final accuracy and accuracy at equal client bytes,
client FLOPs and simulated time, mean ± std over the committed seeds), its Pareto plot, and which method leads at
each budget, by how much, with a paired t interval by seed (Holm-corrected over a fleet's budgets). Nothing is trained: a method or seed not yet committed is listed
as missing.

    python scripts/compare_page.py           # rewrite the page's results and README's winner lines (between their
                                             # markers) and each folder's table
    python scripts/compare_page.py --check   # exit 1 if either differs from what the committed runs give
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hetfl.compare import COSTS, accuracy_at, curve, kept_runs, load_preset, table, write_comparison  # noqa: E402
from hetfl.methods import title  # noqa: E402

KEPT = ROOT / "docs/results/compare"
PAGE = ROOT / "docs/compare.md"
BEGIN, END = "<!-- results: scripts/compare_page.py -->", "<!-- end results -->"
README = ROOT / "README.md"
README_BEGIN, README_END = "<!-- fleet winners: scripts/compare_page.py -->", "<!-- end fleet winners -->"
COLUMNS = {"final": "final accuracy", **{k: f"accuracy at equal {v.split(' (')[0]}" for k, v in COSTS.items()}}


def kept_results(folder: Path) -> dict[str, Any]:
    """One comparison folder, read once: its committed runs (hetfl.compare.kept_runs), the methods left out (and
    why), its summary.json with the fleet and preset it names, and the table, budgets and leads of those runs."""
    said = json.loads((folder / "summary.json").read_text())
    fleet, preset = ROOT / said["fleet"], ROOT / said["preset"]
    results, skipped = kept_runs(folder, fleet, preset)
    text, budget = table(results, skipped)
    return {"folder": folder, "results": results, "skipped": skipped, "fleet": fleet, "preset": preset, "said": said,
            "text": text, "budget": budget, "lead": leaders(results, budget),
            "seeds": sorted({s for r in results.values() for s in r["runs"]})}


def leaders(results: dict[str, dict[str, Any]], budget: dict[str, float]) -> list[dict[str, Any]]:
    """Per column: the leading method (highest mean), its mean, the runner-up and the paired comparison of the two on
    the seeds both ran (hetfl.stats: n, mean difference, 95% t interval, paired t p), the p-values Holm-corrected over
    the columns of this fleet. The leader is "ahead" only where the corrected p is below 0.05; one common seed: no
    interval, said so."""
    from hetfl import stats

    out = []
    for col, label in COLUMNS.items():
        per = {}
        for m, res in results.items():
            cs = {s: curve(r["rounds"]) for s, r in res["runs"].items()}
            xs = {s: c["accuracy"][-1] if col == "final" else accuracy_at(c, col, budget[col]) for s, c in cs.items()}
            if all(x is not None for x in xs.values()):
                per[m] = {s: 100 * x for s, x in xs.items()}
        if len(per) < 2:
            continue
        ranked = sorted(per, key=lambda m: -statistics.mean(per[m].values()))
        a, b = ranked[0], ranked[1]
        seeds = sorted(set(per[a]) & set(per[b]))
        row = {"column": col, "label": label, "leader": a, "mean": statistics.mean(per[a].values()), "next": b,
               "margin": statistics.mean(per[a].values()) - statistics.mean(per[b].values()), "n": len(seeds)}
        if len(seeds) >= 2:
            diffs = stats.paired_differences([per[a][s] for s in seeds], [per[b][s] for s in seeds])
            iv = stats.paired_interval(diffs)
            row.update(diff=iv.mean, low=iv.low, high=iv.high, p=stats.paired_p_value(diffs))
        out.append(row)
    tested = [x for x in out if "p" in x]
    for x, p_adj in zip(tested, stats.holm([x["p"] for x in tested])):
        x["p_holm"] = p_adj
        x["ahead"] = p_adj < 0.05
    return out


def _paired(x: dict[str, Any]) -> str:
    if "p" not in x:
        return f"{x['n']} common seed{'s' if x['n'] != 1 else ''}: no interval"
    return (f"n = {x['n']}, paired {x['diff']:+.2f}, 95% CI [{x['low']:.2f}, {x['high']:.2f}], "
            f"Holm p = {x['p_holm']:.3f}")


def lead_line(x: dict[str, Any]) -> str:
    word = "ahead" if x.get("ahead") else "not resolved"
    return (f"{x['label']}: **{title(x['leader'])}** {x['mean']:.2f}%, {x['margin']:.2f} points over {title(x['next'])} "
            f"({word}: {_paired(x)})")


def winner_line(c: dict[str, Any]) -> str:
    """README's one line for one comparison (:func:`winner_text` of its committed runs)."""
    missing = [m for m, why in c["skipped"].items() if why == "not committed yet"]
    return winner_text(f"{c['fleet'].stem}** ({c['preset'].stem}", c["seeds"], c["lead"], list(c["results"]), missing)


def winner_text(name: str, seeds: list[int], lead: list[dict[str, Any]], committed: list[str],
                missing: list[str]) -> str:
    """Who leads at each budget, with the paired comparison by seed of the leader and the runner-up (:func:`leaders`):
    "ahead" where the Holm-corrected paired t test rejects equality at 0.05, else "not resolved"; fewer than two
    committed methods: said so."""
    head = f"- **{name}, seeds {', '.join(map(str, seeds)) or 'none'}): "
    if not lead:
        return head + f"fewer than two methods committed yet ({', '.join(map(title, committed)) or 'none'})"
    parts = []
    for x in lead:
        what = "final accuracy" if x["column"] == "final" else "equal " + COSTS[x["column"]].split(" (")[0]
        if x.get("ahead"):
            parts.append(f"{what}: {title(x['leader'])} ahead of {title(x['next'])} ({_paired(x)})")
        else:
            parts.append(f"{what}: {title(x['leader'])} over {title(x['next'])} not resolved ({_paired(x)})")
    tail = f"; not yet committed: {', '.join(map(title, missing))}" if missing else ""
    return head + "; ".join(parts) + f" (points of test accuracy, paired by seed{tail}; [table](docs/compare.md))"


def section(c: dict[str, Any], write: bool = True) -> str:
    """One comparison's part of the page; with `write`, its folder's table.md, pareto.png and summary.json of the same
    runs (hetfl.compare.write_comparison, with the paths as the summary gives them)."""
    folder, fleet, preset, budget, said = c["folder"], c["fleet"], c["preset"], c["budget"], c["said"]
    if write:
        write_comparison(folder, Path(said["fleet"]), Path(said["preset"]), load_preset(preset), c["results"],
                         c["skipped"], said.get("failed", {}))
    rel = folder.relative_to(ROOT / "docs")
    lines = [f"### {fleet.stem} x {preset.stem}", "",
             f"Fleet `{fleet.relative_to(ROOT)}`, preset `{preset.relative_to(ROOT)}`; committed runs in `docs/{rel}/` "
             f"(seeds {', '.join(map(str, c['seeds']))}). Equal budgets (the least any listed method needed for all its seeds): "
             f"{budget['client_bytes'] / 1e9:.3g} GB of client traffic, {budget['client_flops'] / 1e15:.3g} PFLOP of "
             f"client compute, {budget['sim_s'] / 3600:.3g} simulated hours.", "", c["text"], "",
             f"![accuracy against each cost]({rel}/pareto.png)", ""]
    if c["lead"]:
        lines += ["Who leads, among the methods listed:", "", *[f"- {lead_line(x)}" for x in c["lead"]], ""]
    return "\n".join(lines)


def render(comparisons: list[dict[str, Any]], write: bool = True) -> str:
    body = "\n".join(section(c, write) for c in comparisons) if comparisons else "No comparison is committed yet.\n"
    return f"{BEGIN}\n{body}{END}"


def render_readme(comparisons: list[dict[str, Any]]) -> str:
    body = "\n".join(winner_line(c) for c in comparisons) if comparisons else "No comparison is committed yet."
    return f"{README_BEGIN}\n{body}\n{README_END}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true",
                   help="exit 1 if docs/compare.md or README.md's winner lines differ from the committed runs")
    a = p.parse_args(argv)
    comparisons = [kept_results(f.parent) for f in sorted(KEPT.glob("*/summary.json"))]  # each folder read once
    targets = [(PAGE, BEGIN, END, lambda: render(comparisons, write=not a.check)),
               (README, README_BEGIN, README_END, lambda: render_readme(comparisons))]
    for path, begin, end, _ in targets:  # every file's markers checked before anything is written
        if begin not in path.read_text() or end not in path.read_text():
            print(f"{path}: no {begin} ... {end} markers", file=sys.stderr)
            return 2
    stale = []
    for path, begin, end, make in targets:
        text = path.read_text()
        new = text[: text.index(begin)] + make() + text[text.index(end) + len(end):]
        if new == text:
            continue
        if a.check:
            stale.append(path.name)
        else:
            path.write_text(new)
            print(f"wrote {path}")
    if stale:
        print(f"{', '.join(stale)} differ(s) from the committed comparisons: run python scripts/compare_page.py",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
