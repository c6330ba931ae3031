"""The comparison plots of docs/results/, drawn from the committed runs (nothing is trained or rerun).

    python scripts/plots.py                 # redraw every docs/results/*.png listed in PLOTS (seconds)
    python scripts/plots.py --only fens     # the ones whose file name contains "fens"
    python scripts/plots.py --list          # which PNG comes from which runs

``plot_comparison`` is also what ``scripts/reproduce.py`` draws into results/reproduce/<name>/accuracy.png, so a
reproduction and the committed page show the same figure. What every figure does:

- legends name the methods (SHEFL, FedAvg (lr 0.1), ...), not preset paths, and sit below the axes;
- a line over several seeds is the mean with a band of ± one sample std, and its legend entry says "mean ± std over n
  seeds"; a single run is a bare line marked "n=1";
- methods differ in colour, line style and (staggered) markers, and later entries are drawn thinner on top, so two
  curves that coincide (FedAvg and FedProx) both stay visible;
- one-shot methods (FENS: aggregator rounds after one upload; distillation baselines: server epochs) get their own
  panel and are never put on the iterative methods' round axis; on the round axes their final accuracy is a dotted
  level, and every method shares the client-traffic axis (MB, up + down, all clients);
- a second round panel zooms on the last half of the rounds, its y-range set from the data there, so differences
  of a point stay visible.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs/results"
sys.path.insert(0, str(ROOT))

from hetfl.methods import METHODS, title  # noqa: E402

# every method by the name its package gives it (hetfl.methods.title), and configs/fedensemble/: SHEFL's
# restricted mode, a preset folder of its own
METHOD_NAMES = {**{m: title(m) for m in METHODS}, "fedensemble": "Fed-Ensemble"}
# preset-name endings (after the dataset and split) and run-config overrides, as words
VARIANT_WORDS = {"literal": "literal local work", "random": "+Random", "greed": "+Greed", "c": "+C", "s": "+S",
                 "coarse": "coarse pool", "lpcwork": "LPC work", "straggler": "stragglers"}
SPECIAL = {("shefl", "straggler"): "SHEFL, constrained LPCs", ("fedensemble", "straggler"): "restricted Fed-Ensemble",
           ("fedavg", "lpcwork"): "FedAvg (LPC work)"}
_SPLIT = re.compile(r"(fmnist|mnist|cifar10|cifar100|svhn|agnews|dir[\d.]+|path\d+|iid)$")
_PATTERNS = ((r"local-steps0-local-epochs(\d+)", r"\1 local epochs"), (r"local-steps(\d+)", r"\1 local steps"),
             (r"num-server-rounds(\d+)", r"\1 rounds"), (r"^r(\d+)-k([\d.]+)", r"1:\1, k = \2"),
             (r"\b[a-z]+-epochs(\d+)", r"\1 server epochs"), (r"\blr([\d.e]+)", r"lr \1"), (r"precision\W*bf16\W*", "bf16"))
LINESTYLES = ("-", "--", "-.", ":")
MARKERS = "osD^vP<X>h"


def display_name(label: str) -> str:
    """``method/preset-stem[-override...]`` (scripts/reproduce.py's label) as a reader would name it:
    ``fedavg/fmnist-dir0.1-lr0.1`` -> "FedAvg (lr 0.1)", ``adaptivefl/fmnist-dir0.6-greed`` -> "AdaptiveFL +Greed"."""
    method, _, rest = label.partition("/")
    tokens = rest.split("-") if rest else []
    while tokens and _SPLIT.match(tokens[0]):
        tokens.pop(0)
    variant = "-".join(tokens)
    if (method, variant) in SPECIAL:
        return SPECIAL[(method, variant)]
    for pattern, words in _PATTERNS:  # each phrase between NULs, so that splitting on "-" leaves it whole
        variant = re.sub(pattern, "\0" + words + "\0", variant)
    chunks = variant.split("\0")
    parts = [VARIANT_WORDS.get(p, p) for i, c in enumerate(chunks) for p in ([c] if i % 2 else c.split("-")) if p]
    name = METHOD_NAMES.get(method, method)
    plus = [p for p in parts if p.startswith("+")]
    rest_ = [p for p in parts if not p.startswith("+")]
    return " ".join([name, *plus]) + (f" ({', '.join(rest_)})" if rest_ else "")


def run_label(run_name: str) -> str:
    """A run directory's name (``<method>-<preset>[-overrides]-s<seed>``) as reproduce.py's ``method/preset`` label."""
    name = re.sub(r"-s\d+$", "", run_name)
    method = max((m for m in METHOD_NAMES if name.startswith(m + "-")), key=len, default=name.split("-")[0])
    return f"{method}/{name[len(method) + 1:]}"


def is_oneshot(run: dict) -> bool:
    """FENS and the one-shot baselines: one upload (``phases``), then aggregator rounds or server epochs."""
    return "upload_bytes" in run.get("phases", {})


def _mb(row: dict) -> float:
    return (row["cum_bytes_down"] + row["cum_bytes_up"]) / 1e6


def legend_label(name: str, seeds: int, every: int | None = None) -> str:
    """A legend entry: the method, and over how many seeds its line is (said once in the title when all agree)."""
    if every is not None and seeds == every:
        return name
    return f"{name} (mean ± std over {seeds} seeds)" if seeds > 1 else f"{name} (n=1)"


def legend_title(seeds: list[int]) -> str | None:
    """The legend's title when every line is over the same number of seeds, else None (each entry says it)."""
    if len(set(seeds)) != 1:
        return None
    return (f"line: mean, band: ± 1 sample std, over {seeds[0]} seeds (n={seeds[0]})" if seeds[0] > 1
            else "one run each (n=1), no band")


@dataclass
class Curve:
    label: str
    name: str
    seeds: int
    x: list[int]
    mean: list[float]
    std: list[float] | None  # None for one run
    mb: list[float]
    style: dict = field(default_factory=dict)


def curves(results: dict[str, list[dict]], names: dict[str, str] | None = None) -> list[Curve]:
    """Per label: accuracy (%) per round, mean and sample std over its runs (rounds all of them reached)."""
    import numpy as np

    out = []
    for i, (lab, runs) in enumerate(results.items()):
        n = min(len(r["rounds"]) for r in runs)
        acc = np.array([[100 * float("nan" if row["accuracy"] is None else row["accuracy"]) for row in r["rounds"][:n]]
                        for r in runs])
        mb = np.array([[_mb(row) for row in r["rounds"][:n]] for r in runs]).mean(0)
        style = {"color": f"C{i % 10}", "ls": LINESTYLES[i % len(LINESTYLES)], "marker": MARKERS[i % len(MARKERS)],
                 "lw": max(2.6 - 0.35 * i, 1.1), "ms": 5, "zorder": 3 + i}
        out.append(Curve(lab, (names or {}).get(lab) or display_name(lab), len(runs),
                         [row["round"] for row in runs[0]["rounds"][:n]], list(acc.mean(0)),
                         list(acc.std(0, ddof=1)) if len(runs) > 1 else None, list(mb), style))
    return out


def _draw(ax, c: Curve, x: list[float], lo: int = 0, k: int = 0, of: int = 1):
    """One curve (from index lo on) with its band; markers staggered between the curves so none hides another."""
    import numpy as np

    xs, m = np.array(x[lo:]), np.array(c.mean[lo:])
    every = max(1, len(xs) // 8)
    line, = ax.plot(xs, m, markevery=(min(len(xs) - 1, k * every // max(of, 1)), every), label=c.name, **c.style)
    if c.std is not None:
        s = np.array(c.std[lo:])
        ax.fill_between(xs, m - s, m + s, color=c.style["color"], alpha=0.15, lw=0, zorder=1)
    return line


def plot_comparison(results: dict[str, list[dict]], out: Path | str, title: str,
                    names: dict[str, str] | None = None) -> Path:
    """Test accuracy of several methods (label -> its runs, one per seed) in one figure: by round (iterative methods),
    by aggregator round / server epoch (one-shot methods, their own panel), the last half of the rounds zoomed, and
    against cumulative client traffic (every method). Written to ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cs = curves(results, names)
    oneshot = [c for c in cs if is_oneshot(results[c.label][0])]
    iterative = [c for c in cs if c not in oneshot]
    kinds = (["oneshot"] if oneshot else []) + (["rounds", "zoom"] if iterative else []) + ["mb"]
    if len(kinds) == 4:
        fig, grid = plt.subplots(2, 2, figsize=(13, 9.5), layout="constrained")
        axes = dict(zip(kinds, grid.flat, strict=True))
    else:
        fig, grid = plt.subplots(1, len(kinds), figsize=(5.6 * len(kinds), 5), layout="constrained", squeeze=False)
        axes = dict(zip(kinds, grid[0], strict=True))
    handles: dict[str, object] = {}
    levels: list[tuple[object, str]] = []  # one-shot methods' final accuracy drawn on the FL round axes
    if oneshot:
        ax = axes["oneshot"]
        for k, c in enumerate(oneshot):
            handles[c.label] = _draw(ax, c, c.x, k=k, of=len(oneshot))
        fens_only = all(c.label.startswith("fens/") for c in oneshot)
        ax.set_xlabel("FENS aggregator round (phase 2, after the one upload)" if fens_only
                      else "aggregator round (FENS) / server epoch (distillation)")
        ax.set_title("FENS by aggregator round" if fens_only else "one-shot methods by their own rounds")
    if iterative:
        ax, zx = axes["rounds"], axes["zoom"]
        last = max(c.x[-1] for c in iterative)
        start = max(1, last // 2)
        inside = []
        for k, c in enumerate(iterative):
            handles[c.label] = _draw(ax, c, c.x, k=k, of=len(iterative))
            lo = next((i for i, r in enumerate(c.x) if r >= start), len(c.x))
            if lo < len(c.x):
                _draw(zx, c, c.x, lo, k=k, of=len(iterative))
                m = np.array(c.mean[lo:])
                s = np.array(c.std[lo:]) if c.std is not None else 0 * m
                inside.append((m - s, m + s))
        for c in oneshot:  # FENS's final accuracy as a level on the FL round axes, not as a curve over its rounds
            for a in (ax, zx):
                level = a.axhline(c.mean[-1], color=c.style["color"], ls=":", lw=1.4, zorder=2)
            over = f", mean of {c.seeds} seeds" if c.seeds > 1 else ""
            levels.append((level, f"{c.name} final {c.mean[-1]:.1f}%{over} (dotted level on the FL round axes)"))
        thresholds = {results[c.label][0].get("summary", {}).get("convergence_threshold") for c in iterative}
        if len(thresholds) == 1 and None not in thresholds:  # the "round to 80%" the pages give
            thr = 100 * thresholds.pop()
            level = ax.axhline(thr, color="grey", ls="--", lw=0.9, zorder=2)
            levels.append((level, f"{thr:.0f}%: the level of \"round to {thr:.0f}%\""))
        ax.set_xlabel("FL round" if oneshot else "round")
        ax.set_title("by round" + (" (iterative methods)" if oneshot else ""))
        if inside:  # the lower limit from the data of the last half, not from round 0
            lows = np.concatenate([lo_ for lo_, _ in inside])
            lows = lows[np.isfinite(lows)]
            highs = np.concatenate([hi for _, hi in inside])
            highs = highs[np.isfinite(highs)]
            if lows.size and highs.size:
                ylo, yhi = float(np.percentile(lows, 5)), float(highs.max())
                pad = max(0.4, 0.06 * (yhi - ylo))
                zx.set_ylim(ylo - pad, yhi + pad)
        zx.set_xlim(start - 0.5, last + 0.5)
        zx.set_xlabel(ax.get_xlabel())
        zx.set_title(f"rounds {start}-{last}, y-axis zoomed on them")
    bx = axes["mb"]
    for c in cs:
        bx.plot(c.mb, c.mean, **{**c.style, "marker": None})
        if c in oneshot:  # its final accuracy at its whole run's traffic (what the crossing table uses)
            bx.plot(c.mb[-1], c.mean[-1], "*", ms=15, color=c.style["color"], zorder=20, mec="black", mew=0.6)
            bx.annotate(f"{c.name} {c.mean[-1]:.1f}%, {c.mb[-1]:,.0f} MB", (c.mb[-1], c.mean[-1]), textcoords="offset points",
                        xytext=(8, -14), fontsize=8, zorder=21)
    first = [c.mb[1] for c in cs if len(c.mb) > 1 and c.mb[1] > 0]
    if first and max(c.mb[-1] for c in cs) > 20 * min(first):  # FENS's one shot vs rounds of iterative FL
        bx.set_xscale("log")
        bx.set_xlim(left=0.5 * min(first))  # from round 1 on (round 0 has sent nothing)
    bx.set_xlabel("cumulative client traffic (MB, up + down, all clients)")
    bx.set_title("by client traffic")
    for a in axes.values():
        a.set_ylabel("test accuracy (%)")
        a.grid(alpha=0.3)
    shown = [c for c in cs if c.label in handles]
    every = legend_title([c.seeds for c in shown])
    fig.legend([handles[c.label] for c in shown] + [h for h, _ in levels],
               [legend_label(c.name, c.seeds, shown[0].seeds if every else None) for c in shown] + [t for _, t in levels],
               loc="outside lower center", ncol=min(3, len(shown) + len(levels)), fontsize=9, frameon=False,
               title=every, title_fontsize=9)
    fig.suptitle(title)
    out = Path(out)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


# ---- the committed plots ------------------------------------------------------------------------------------------
@dataclass
class Spec:
    """One committed PNG: the run directories (under docs/results) and which runs, in legend order, under which name."""

    png: str
    title: str
    runs: list[str]
    groups: list[tuple[str, str]]  # (run name without -s<seed>, display name)
    seeds: dict[str, list[int]] = field(default_factory=dict)  # only these seeds of a group


def _shefl(split: str, title: str) -> Spec:
    return Spec(f"shefl-fmnist-{split}-r30.png", title, [f"shefl-fmnist-{split}-r30/runs"],
                [(f"{m}-fmnist-{split}", n) for m, n in (("shefl", "SHEFL"), ("fedensemble", "Fed-Ensemble"),
                 ("fedavg", "FedAvg"), ("fedprox", "FedProx (mu 0.01)"), ("fedbe", "FedBE (S = 5)"))])


def _afl(split: str, title: str) -> Spec:
    return Spec(f"adaptivefl-fmnist-{split}-r30.png", title, [f"adaptivefl-fmnist-{split}-r30/runs"],
                [(f"{m}-fmnist-{split}", METHOD_NAMES[m]) for m in ("adaptivefl", "heterofl", "scalefl", "all-large", "decoupled")])


def _fens(a: str) -> Spec:
    return Spec(f"fens-fmnist-dir{a}-vs-fedadam.png", f"FENS vs iterative FedAdam, FMNIST Dir({a}), 20 clients",
                [f"fens-fmnist-dir{a}/runs"], [(f"fens-fmnist-dir{a}", "FENS"), (f"fedadam-fmnist-dir{a}", "FedAdam (lr 0.01)")])


def _fens_v1(a: str) -> Spec:
    groups = [(f"fens-fmnist-dir{a}", "FENS (100 aggregator rounds)"),
              (f"fedadam-fmnist-dir{a}-num-server-rounds4", "FedAdam, 4 rounds")]
    if a == "0.1":
        groups.append((f"fedadam-fmnist-dir{a}-num-server-rounds12", "FedAdam, 12 rounds"))
    return Spec(f"fens-fmnist-v1-dir{a}.png", f"First FENS table (superseded): FMNIST Dir({a}), 20 clients",
                [f"fens-fmnist-v1-dir{a}/runs"], groups)


ITERATIVE = (("fedavg", "0.1"), ("fedprox", "0.1"), ("fednova", "0.01"), ("fedyogi", "0.1"), ("fedadam", "0.1"),
             ("fedavg-stc", "0.1"), ("scaffold", "0.03"), ("scaffold", "0.01"))
PLOTS = [
    _shefl("dir0.6", "SHEFL vs baselines, FMNIST Dir(0.6), 100 clients, 10 local epochs, 30 rounds"),
    _shefl("path4", "SHEFL vs baselines, FMNIST 4 shards (pathological), 100 clients, 10 local epochs, 30 rounds"),
    Spec("shefl-fmnist-dir0.6-straggler-r30.png", "SHEFL straggler study (Fig. 7), FMNIST Dir(0.6), 30 rounds",
         ["shefl-fmnist-dir0.6-straggler-r30/runs", "shefl-fmnist-dir0.6-r30/runs"],
         [("shefl-fmnist-dir0.6-straggler", "SHEFL, constrained LPCs"),
          ("fedensemble-fmnist-dir0.6-straggler", "restricted Fed-Ensemble"),
          ("fedavg-fmnist-dir0.6-lpcwork", "FedAvg (LPC work)"), ("fedavg-fmnist-dir0.6", "FedAvg (HPC)"),
          ("fedensemble-fmnist-dir0.6", "FedEns (HPC)")]),
    Spec("shefl-fmnist-dir0.1-ratio-r30.png", "SHEFL resource ratio and top-k density, FMNIST Dir(0.1), 30 rounds",
         ["shefl-fmnist-dir0.1-ratio-r30/runs"],
         [(f"shefl-fmnist-dir0.1-r{r}-k{k}", f"SHEFL 1:{r}, k = {k}") for k in ("0.1", "0.02") for r in (1, 3, 5)]),
    Spec("shefl-fmnist-dir0.6-r100.png", "SHEFL vs baselines at the literal local work (10 SGD steps), FMNIST Dir(0.6), "
         "100 rounds (committed runs: seeds 1-2)", ["shefl-fmnist-dir0.6-r100/runs"],
         [(f"{m}-fmnist-dir0.6", METHOD_NAMES[m]) for m in ("shefl", "fedensemble", "fedavg", "fedprox")]),
    *(_fens(a) for a in ("0.01", "0.05", "0.1")),
    Spec("fens-iterative-fmnist.png", "FENS vs seven iterative baselines at their picked client lr, FMNIST Dir(0.1), seed 0",
         ["fens-fmnist-dir0.1/runs", "fens-iterative-fmnist-dir0.1/runs"],
         [("fens-fmnist-dir0.1", "FENS"),
          *((f"{m}-fmnist-dir0.1-lr{lr}", f"{METHOD_NAMES[m]} (lr {lr}{', diverged' if (m, lr) == ('scaffold', '0.03') else ''})")
            for m, lr in ITERATIVE)],
         seeds={"fens-fmnist-dir0.1": [0]}),
    *(_fens_v1(a) for a in ("0.01", "0.05", "0.1")),
    _afl("dir0.6", "AdaptiveFL vs baselines, FMNIST Dir(0.6), full model, 30 rounds"),
    Spec("adaptivefl-fmnist-dir0.6-ablations-r30.png", "AdaptiveFL ablations (Fig. 5, Table 4), FMNIST Dir(0.6), seed 0, "
         "full model", ["adaptivefl-fmnist-dir0.6-r30/runs", "adaptivefl-fmnist-dir0.6-ablations-r30/runs"],
         [("adaptivefl-fmnist-dir0.6", "AdaptiveFL (+CS, RL)"), *((f"adaptivefl-fmnist-dir0.6-{v}", n) for v, n in
          (("random", "+Random"), ("greed", "+Greed"), ("c", "+C"), ("s", "+S"), ("coarse", "coarse pool (p = 1)")))],
         seeds={"adaptivefl-fmnist-dir0.6": [0]}),
    _afl("dir0.3", "AdaptiveFL vs baselines, FMNIST Dir(0.3), seed 0, full model, 30 rounds"),
    Spec("bf16-parity-quickstart.png", "bf16 autocast vs fp32, FedAvg quickstart setting (FMNIST Dir(0.6), 20 clients)",
         ["bf16-parity-quickstart/runs"], [("configs-quickstart", "fp32"), ("configs-quickstart-precisionbf16", "bf16")]),
]
TABLE1 = "fens-table1-fmnist.png"  # scripts/oneshot_table.py's figure (accuracy against client MB per alpha)


def load(spec: Spec) -> tuple[dict[str, list[dict]], dict[str, str]]:
    """The spec's runs, label -> runs in seed order, and label -> display name."""
    from hetfl.common.results import load_metrics
    from hetfl.methods import SCHEMA

    results, names = {}, {}
    for prefix, name in spec.groups:
        found = {}
        for d in spec.runs:
            for m in sorted((DOCS / d).glob(f"{prefix}-s*/metrics.json")):
                seed = re.fullmatch(re.escape(prefix) + r"-s(\d+)", m.parent.name)
                if seed and int(seed.group(1)) not in found and int(seed.group(1)) in spec.seeds.get(prefix, [int(seed.group(1))]):
                    found[int(seed.group(1))] = load_metrics(m, SCHEMA)
        if not found:
            raise FileNotFoundError(f"{spec.png}: no committed runs {prefix}-s*/metrics.json under {spec.runs}")
        lab = run_label(prefix)
        results[lab] = [found[s] for s in sorted(found)]
        names[lab] = name
    return results, names


def table1(out: Path) -> Path:
    import oneshot_table

    tmp = ROOT / "results/plots"
    oneshot_table.main(["--name", "fens-table1-fmnist", "--alphas", "0.01", "0.05", "0.1", "--out", str(tmp),
                        "--runs", str(DOCS / "oneshot-fmnist-dir{alpha}/runs"), str(DOCS / "fens-fmnist-dir{alpha}/runs"),
                        "--presets", str(ROOT / "configs/{method}/fmnist-dir{alpha}.toml")])
    out.write_bytes((tmp / "fens-table1-fmnist" / "accuracy-vs-mb.png").read_bytes())
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/plots.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="", help="only the PNGs whose name contains this")
    p.add_argument("--list", action="store_true", help="print which PNG comes from which runs, draw nothing")
    p.add_argument("--out", type=Path, default=DOCS, help="where to write the PNGs (default: docs/results)")
    a = p.parse_args(argv)
    for spec in PLOTS:
        if a.only in spec.png:
            if a.list:
                print(f"{spec.png}: {', '.join(spec.runs)}: {', '.join(g for g, _ in spec.groups)}")
                continue
            results, names = load(spec)
            print(f"wrote {plot_comparison(results, a.out / spec.png, spec.title, names)}")
    if a.only in TABLE1:
        if a.list:
            print(f"{TABLE1}: scripts/oneshot_table.py on docs/results/oneshot-fmnist-dir*/runs and fens-fmnist-dir*/runs")
        else:
            print(f"wrote {table1(a.out / TABLE1)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "scripts"))
    sys.exit(main())
