"""The README's verdict table, recomputed from the committed runs that docs/results/verdicts.toml names: per row, each
cell's paired differences by seed (hetfl.stats), the primary cell's 95% t interval and its label by the rule of
docs/verdicts.md, the other cells Holm-corrected. Nothing is trained.

    python scripts/verdict_table.py           # rewrite the table between README.md's markers
    python scripts/verdict_table.py --check   # exit 1 if the README's table differs from what the runs give
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hetfl import stats  # noqa: E402
from hetfl.study import interval, statistic  # noqa: E402

LEDGER = ROOT / "docs/results/verdicts.toml"
README = ROOT / "README.md"
BEGIN, END = "<!-- verdicts: scripts/verdict_table.py -->", "<!-- end verdicts -->"
KINDS = ("superiority", "parity", "direction")


def _by_seed(paths: list[str], spec: str) -> dict[int, float | None]:
    out = {}
    for p in paths:
        m = json.loads((ROOT / p).read_text())
        seed = int(m["config"].get("seed", 0))
        if seed in out:
            raise ValueError(f"{p}: seed {seed} is listed twice in one cell")
        out[seed] = statistic(m, spec)
    return out


def cell_result(cell: dict[str, Any], kind: str, margin: float | None) -> dict[str, Any]:
    """One cell: the pairs (seeds both sides ran; a side that never reached a ``round-to`` level is censored and
    left out, counted), the differences in the paper's direction (b - a for ``round-to``, fewer rounds being
    better), the interval, the paired t p and the label."""
    sa, sb = cell["statistic"], cell.get("b-statistic", cell["statistic"])
    a, b = _by_seed(cell["a"], sa), _by_seed(cell["b"], sb)
    seeds = sorted(s for s in set(a) & set(b) if a[s] is not None and b[s] is not None)
    censored = sorted(s for s in set(a) & set(b) if a[s] is None or b[s] is None)
    lower_better = sa.startswith("round-to")
    diffs = [(b[s] - a[s]) if lower_better else (a[s] - b[s]) for s in seeds]
    out: dict[str, Any] = {"name": cell["name"], "seeds": seeds, "censored": censored, "diffs": diffs,
                           "margin": cell.get("margin", margin)}
    if not diffs:
        out["label"] = "no pair yet"
        return out
    out.update(stats.verdict(diffs, kind, out["margin"], "round" if lower_better else "point"))
    if len(diffs) >= 2:  # what Holm's correction takes: the p of the claim's own test (TOST's for parity)
        out["claim_p"] = stats.claim_p(diffs, kind, out["margin"])
    return out


def study_verdict(row: dict[str, Any]) -> dict[str, Any] | None:
    """The row's (or a cell's) declared study's verdict (``study = "experiments/<name>.toml"``) once every seed it
    declares ran, as a cell; None before (the committed cells stand until then)."""
    if "study" not in row:
        return None
    from hetfl.study import Study

    study = Study.from_file(ROOT / row["study"])
    path = study.folder / "verdict.json"
    if not path.exists():
        return None
    v = json.loads(path.read_text())
    failed, scores = v.get("failed", {}), v.get("scores", {})  # method -> {seed: ...} (JSON keys are strings)
    a, b = study.primary
    if "study-also" in row:  # one of the study's [[also]] claims
        v = v.get("also", [])[row["study-also"]] if len(v.get("also", [])) > row["study-also"] else {}
        a, b = v.get("primary", (a, b))
    if "study-other" in row:  # the primary method against another of the study's methods (its Holm family)
        v = next((o for o in v.get("others", []) if o["pair"][1] == row["study-other"] and "low" in o), {})
        b = row["study-other"]
    left_out = {int(x) for m in (a, b) for x in failed.get(m, {}) if x not in scores.get(m, {})}  # stopped, unscored
    if v.get("n", 0) + len(v.get("censored", [])) + len(left_out) < len(study.seeds):
        return None
    # an [[also]] claim carries its own kind, margin and statistic; the study's others share the primary claim's
    kind, margin = v.get("kind", study.kind), v.get("margin", study.margin)
    spec = v.get("statistic", study.statistic)
    pair = f"{a} - {b}"
    if spec.startswith("round-to:"):  # fewer rounds is the paper's side: the difference is b - a
        pair = f"rounds to {float(spec.split(':')[1].split('@')[0]):.0%}: {b} - {a}"
    out = {"name": f"{pair} (declared study [{study.name}](docs/results/studies/{study.name}.md))",
           "margin": margin, "censored": v.get("censored", []), **{k: v[k] for k in ("n", "mean", "low", "high",
                                                                                    "label")}}
    if len(v.get("diffs", [])) >= 2:  # what Holm's correction takes where the study's verdict is one cell of a row
        out["claim_p"] = stats.claim_p(v["diffs"], kind, margin)
    return out


def _declared_cell(cell: dict[str, Any]) -> dict[str, Any] | None:
    """A cell that names its own declared study (``study = ...`` on the cell: another alpha's study of the row's
    claim) reads that study's verdict once every seed ran; its committed runs stand until then."""
    v = study_verdict(cell)
    return None if v is None else {**v, "name": f"{cell['name']}: {v['name']}"}


def _only_under(paths: list[str], folder: str) -> bool:
    """Whether a cell is made only of runs under `folder` (a cell with no runs is not)."""
    return bool(paths) and all(p.startswith(folder) for p in paths)


def row_result(row: dict[str, Any]) -> dict[str, Any]:
    """A row's cells; exactly one is primary, the others carry Holm-adjusted p-values. A row whose declared study has
    finished every seed takes the study's verdict as its primary cell; the committed cells then print as others (those
    made of the study's own runs left out: they are the verdict). The p a cell gives Holm's correction is its claim's
    test's (:func:`hetfl.stats.claim_p`: TOST's for a parity row)."""
    kind = row["kind"]
    if kind not in KINDS:
        raise ValueError(f"verdicts.toml: kind = {kind!r} is not allowed; expected one of {KINDS}")
    primaries = [c for c in row["cell"] if c.get("primary")]
    if len(primaries) != 1:
        raise ValueError(f"verdicts.toml: row {row['claim']!r} has {len(primaries)} primary cells; expected 1")
    cells = [_declared_cell(c) or cell_result(c, kind, row.get("margin")) for c in row["cell"]]
    primary = cells[[c.get("primary", False) for c in row["cell"]].index(True)]
    others = [c for c in cells if c is not primary]
    if (declared := study_verdict(row)) is not None:  # the committed cells print as others, but not the study's own runs
        own = f"docs/results/studies/{Path(row['study']).stem}/"
        primary = declared
        others = [c for c, spec in zip(cells, row["cell"]) if not _only_under(spec["a"] + spec["b"], own)]
    tested = [c for c in others if "claim_p" in c]
    for c, p in zip(tested, stats.holm([c["claim_p"] for c in tested])):
        c["p_holm"] = p
    return {"row": row, "primary": primary, "others": others}


def _iv(c: dict[str, Any]) -> str:
    if "n" not in c:
        return "no pair yet"
    if c["n"] < 2:
        return f"{c['mean']:+.2f}, n = 1"
    return f"{c['mean']:+.2f} {interval(c['low'], c['high'])}, n = {c['n']}"


def verdict_cell(r: dict[str, Any]) -> str:
    p, kind = r["primary"], r["row"]["kind"]
    unit = " rounds" if r["row"]["cell"][0]["statistic"].startswith("round-to") else ""
    claimed = ("no margin claimed" if kind == "direction" or p["margin"] is None else
               f"parity within +-{p['margin']:g}{unit}" if kind == "parity" else f"claimed {p['margin']:+g}{unit}")
    text = f"**{p['label']}**: {p['name']}: {_iv(p)} ({claimed})"
    if p["censored"]:
        text += f"; seeds {p['censored']} never reached the level (left out)"
    if r["others"]:
        text += "; other cells: " + "; ".join(
            f"{c['name']} {_iv(c)}" + (f", Holm {'TOST ' if kind == 'parity' else ''}p {c['p_holm']:.2f}" if "p_holm" in c else "") for c in r["others"])
    return text


def ran(r: dict[str, Any]) -> bool:
    """Whether a row has at least one pair (its primary cell or another): a row with none is a declared study only."""
    return any("n" in c for c in [r["primary"], *r["others"]])


def render(results: list[dict[str, Any]]) -> str:
    lines = [BEGIN, "| paper's claim | verdict here: the primary cell's mean paired difference [95% t interval], n "
             "seeds | budget (the same for the methods compared unless said) | what moved it |",
             "| --- | --- | --- | --- |"]
    for r in results:
        row = r["row"]
        if not ran(r):  # declared, nothing run yet: docs/verdicts.md lists it; the table gives only measured verdicts
            continue
        lines.append(f"| {row['claim']} | {verdict_cell(r)} | {row['budget']} | {row['moved']} |")
    return "\n".join(lines + [END])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if README.md's verdict table differs from the runs")
    a = p.parse_args(argv)
    rows = tomllib.loads(LEDGER.read_text())["row"]
    text = README.read_text()
    if BEGIN not in text or END not in text:
        print(f"{README}: no {BEGIN} ... {END} markers", file=sys.stderr)
        return 2
    new = text[: text.index(BEGIN)] + render([row_result(r) for r in rows]) + text[text.index(END) + len(END):]
    if new == text:
        return 0
    if a.check:
        print("README.md's verdict table differs from the committed runs: run make verdicts",
              file=sys.stderr)
        return 1
    README.write_text(new)
    print(f"wrote {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
