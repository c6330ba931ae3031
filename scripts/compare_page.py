"""docs/compare.md's results, from the committed comparisons (docs/results/compare/<fleet>-<preset>/): per fleet, the
table of every method with finished runs (hetfl.compare.table: final accuracy and accuracy at equal client bytes,
client FLOPs and simulated time, mean ± std over the committed seeds), its Pareto plot, and which method leads at
each budget, by how much, against the seed spread. Nothing is trained: a method or seed not yet committed is listed
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
    """Per column: the leading method, its mean, the runner-up, the margin and whether it exceeds the seed spread (the
    larger std of the two; one seed: no spread, said so)."""
    out = []
    for col, label in COLUMNS.items():
        per = {}
        for m, res in results.items():
            cs = [curve(r["rounds"]) for r in res["runs"].values()]
            xs = [c["accuracy"][-1] if col == "final" else accuracy_at(c, col, budget[col]) for c in cs]
            if all(x is not None for x in xs):
                per[m] = [100 * x for x in xs]
        if len(per) < 2:
            continue
        ranked = sorted(per, key=lambda m: -statistics.mean(per[m]))
        a, b = ranked[0], ranked[1]
        margin = statistics.mean(per[a]) - statistics.mean(per[b])
        # a spread only where both have several seeds: one method's spread says nothing of the other's
        spreads = [statistics.stdev(per[m]) for m in (a, b)] if min(len(per[a]), len(per[b])) > 1 else []
        if not spreads:
            verdict = "one seed each: no spread yet" if max(len(per[a]), len(per[b])) == 1 else \
                f"{title(a if len(per[a]) == 1 else b)} has one seed: no spread yet"
        elif margin > max(spreads):
            verdict = f"beyond the seed spread ({max(spreads):.2f})"
        else:
            verdict = f"within the seed spread ({max(spreads):.2f}): a tie"
        out.append({"column": col, "label": label, "leader": a, "mean": statistics.mean(per[a]), "next": b,
                    "margin": margin, "verdict": verdict, "spread": max(spreads) if spreads else None,
                    "tie": bool(spreads) and margin <= max(spreads)})
    return out


def lead_line(x: dict[str, Any]) -> str:
    return (f"{x['label']}: **{title(x['leader'])}** {x['mean']:.2f}%, {x['margin']:.2f} points over {title(x['next'])} "
            f"({x['verdict']})")


def winner_line(c: dict[str, Any]) -> str:
    """README's one line for one comparison (:func:`winner_text` of its committed runs)."""
    missing = [m for m, why in c["skipped"].items() if why == "not committed yet"]
    return winner_text(f"{c['fleet'].stem}** ({c['preset'].stem}", c["seeds"], c["lead"], list(c["results"]), missing)


def winner_text(name: str, seeds: list[int], lead: list[dict[str, Any]], committed: list[str],
                missing: list[str]) -> str:
    """Who leads at each budget and by how much, or who ties within the seed spread; fewer than two committed
    methods: said so."""
    head = f"- **{name}, seeds {', '.join(map(str, seeds)) or 'none'}): "
    if not lead:
        return head + f"fewer than two methods committed yet ({', '.join(map(title, committed)) or 'none'})"
    parts = []
    for x in lead:
        what = "final accuracy" if x["column"] == "final" else "equal " + COSTS[x["column"]].split(" (")[0]
        if x["tie"]:
            parts.append(f"{what}: {title(x['leader'])} and {title(x['next'])} tie ({x['margin']:.2f} points apart, "
                         f"seed spread {x['spread']:.2f})")
        else:
            spread = "" if x["spread"] is None else f", beyond the seed spread ({x['spread']:.2f})"
            parts.append(f"{what}: {title(x['leader'])} by {x['margin']:.2f} over {title(x['next'])}{spread}")
    tail = "; no seed spread yet where a method has one seed" if any(x["spread"] is None for x in lead) else ""
    tail += f"; not yet committed: {', '.join(map(title, missing))}" if missing else ""
    return head + "; ".join(parts) + f" (points of test accuracy{tail}; [table](docs/compare.md))"


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
