"""FENS at its best before a verdict (docs/results/fens-fair.md): per alpha, seed 0, each step reusing what is done.

    python scripts/fens_fair.py --alphas 0.1 0.01 0.05 --steps base tune upper complete [--trials 8 --rounds 500]

Steps (each writes under results/fens-fair/dir<alpha>/ and is skipped when its output exists; the committed copies
live in docs/results/fens-fair/):

* ``base``: the preset as it stands (5 local epochs, Table 8's CIFAR-10 aggregator lrs, 500 rounds), on the in-process
  engine; it also saves the phase-1 ensemble that the next steps reuse.
* ``tune``: the NN aggregator's client and server lr chosen by ``hetfl.tune`` on the validation half (the ensemble
  reused, so every trial trains the aggregator only); the chosen values' final run reports the test half once.
* ``longer``: the chosen values to 1,000 aggregator rounds (kept where validation accuracy rises).
* ``upper``: the same aggregator network trained centrally with Adam on the pooled aggregator-split logits of every
  client (the federated aggregator's ceiling), early-stopped on the validation half, scored on the test half.
* ``complete``: members trained to completion (at most ``--max-epochs`` epochs, the epoch count chosen per client on
  10% of its own local split, patience 5) with the tuned aggregator lrs of ``tune``.
* ``iterative``: FedAdam and FedAvg (``--methods``) at the same alpha, their learning rate chosen by ``hetfl.tune`` on
  the same validation half with the budget the Dir(0.1) grids had (4 values x 10 rounds, every trial run in full),
  then the chosen value for the presets' 50 rounds, scored once on the test half.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # fens_runs.py

from hetfl.common.results import copy_files  # noqa: E402
from hetfl.tune import finished_trials  # noqa: E402
from fens_runs import DOCS, ITER_ROUNDS, SEEDS, complete_runs, tuned_iterative_run  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NODES = 20


def preset(alpha: str) -> dict:
    return tomllib.loads((ROOT / f"configs/fens/fmnist-dir{alpha}.toml").read_text())


def run(cfg: dict, out: Path, name: str) -> dict:
    """One run on the in-process engine, reused once it has completed all its rounds with this config; checkpointed
    after every round, so a stopped process (or session) continues it (a run of another config starts afresh)."""
    from hetfl.inprocess import finished_run, run_in_process

    cfg = {**cfg, "checkpoint": True, "resume": True}
    done = finished_run(out / name, cfg)
    if done is not None:
        print(f"reuse {out / name}")
        return done
    t0 = time.perf_counter()
    m = run_in_process(cfg, NODES, out, name)
    print(f"{out / name}: {m['summary']['final_accuracy']:.4f} in {time.perf_counter() - t0:.0f} s")
    return m


def step_base(alpha: str, out: Path) -> dict:
    return run(preset(alpha), out, "base")


def step_tune(alpha: str, out: Path, trials: int, rounds: int) -> dict:
    from hetfl.tune import TuneSpec, parse_space, tune

    space = "fens-agg-client-lr=log:0.01:10 fens-agg-server-lr=log:0.0001:0.1"
    spec = TuneSpec(base={**preset(alpha), "fens-reuse": str((out / "base").resolve())}, space=tuple(parse_space(space)),
                    trials=trials, rounds=rounds, nodes=NODES, sampler="tpe", seed=0, prune_after=50)
    return tune(spec, out / "tune-agg")


def step_longer(alpha: str, out: Path, rounds: int = 1000) -> dict:
    """The tuned values to `rounds` aggregator rounds (the protocol's limit), in tune-agg/chosen-r<rounds>: the page keeps
    them where validation accuracy rose over the study's horizon."""
    best = json.loads((out / "tune-agg" / "summary.json").read_text())["best"]["values"]
    cfg = {**preset(alpha), "fens-reuse": str((out / "base").resolve()), **best, "num-server-rounds": rounds,
           "eval-split": "test-half"}
    return run(cfg, out / "tune-agg", f"chosen-r{rounds}")


def step_upper(alpha: str, out: Path) -> dict:
    from scripts.fens_upper_bound import upper_bound

    path = out / "upper.json"
    if path.exists():
        return json.loads(path.read_text())
    res = upper_bound(out / "base", NODES)
    path.write_text(json.dumps(res, indent=2))
    print(f"{path}: {res}")
    return res


def seeded(name: str, seed: int) -> str:
    """A run's folder name at `seed`: seed 0 keeps the name it always had, seed s > 0 gets ``-s<s>``."""
    return name if seed == 0 else f"{name}-s{seed}"


def step_complete(alpha: str, out: Path, max_epochs: int, seed: int = 0) -> dict:
    """Members to completion with the aggregator lrs tuned at seed 0; another seed reruns the same values (the same
    partition: ``partition-seed`` is the preset's; ``seed`` moves initialisation, sampling and shuffling)."""
    study = out / "tune-agg" / "summary.json"
    study = study if study.exists() else DOCS / f"dir{alpha}" / "tune-agg" / "summary.json"  # a fresh clone: committed
    best = json.loads(study.read_text())["best"]["values"]
    cfg = {**preset(alpha), "local-epochs": max_epochs, "fens-member-val-fraction": 0.1, "fens-member-patience": 5,
           "eval-split": "test-half", **best, "seed": seed}
    return run(cfg, out, seeded(f"complete-e{max_epochs}", seed))


ITER_GRIDS = {"fedadam": "0.003,0.01,0.03,0.1", "fedavg": "0.01,0.03,0.1,0.3"}  # the Dir(0.1) grids (Makefile ITER_GRID)


def step_iterative(alpha: str, out: Path, methods: list[str], workers: int = 1, seed: int = 0) -> None:
    """Each method's lr grid at seed 0 (the study is reused at every seed), then the chosen lr at `seed`."""
    from hetfl.tune import TuneSpec, parse_space, tune

    for method in methods:
        base = tomllib.loads((ROOT / f"configs/{method}/fmnist-dir{alpha}.toml").read_text())
        spec = TuneSpec(base=base, space=tuple(parse_space(f"lr={ITER_GRIDS[method]}")), trials=4, rounds=10,
                        nodes=NODES, sampler="grid", seed=0, prune=False)
        best = tune(spec, out / f"iter-{method}", final=False, workers=workers)["best"]["values"]
        run({**base, **best, "num-server-rounds": ITER_ROUNDS, "eval-split": "test-half", "seed": seed},
            out / f"iter-{method}", seeded(f"chosen-r{ITER_ROUNDS}", seed))
        keep(out, alpha)  # each method's study and run committed-ready as soon as it is done


PAGE = ROOT / "docs/results/fens-fair.md"
BEGIN, END = "<!-- table: scripts/fens_fair.py --page -->", "<!-- end table -->"


def _finished(f: Path) -> bool:
    """A metrics.json of a run that completed its configured rounds; a study's trial that its summary counts."""
    if f.name != "metrics.json":
        return True
    if f.parent.parent.name == "trials":  # a study's trial: only those its summary lists (not one a stop cut short)
        summary = f.parent.parent.parent / "summary.json"
        numbers = {t.get("number") for t in json.loads(summary.read_text())["trials"]} if summary.exists() else set()
        return int(f.parent.name[1:]) in numbers
    m = json.loads(f.read_text())
    return m["summary"].get("rounds_completed") == m["config"]["num-server-rounds"]


def keep(out: Path, alpha: str) -> None:
    """Copy what a finished step measured (metrics.json, summary.json, upper.json) under docs/results/fens-fair/:
    runs that completed their rounds and the trials their studies count, nothing half done."""
    files = [out / "base/metrics.json", out / "upper.json", out / "tune-agg/summary.json",
             out / "tune-agg/chosen/metrics.json", out / "tune-agg/chosen-r1000/metrics.json",
             *finished_trials(out / "tune-agg"),
             *sorted(out.glob("complete-e*/metrics.json")), *sorted(out.glob("iter-*/summary.json")),
             *(f for d in sorted(out.glob("iter-*")) for f in finished_trials(d)),
             *sorted(out.glob("iter-*/chosen-r*/metrics.json"))]
    copy_files([f for f in files if f.exists() and _finished(f)], out, DOCS / f"dir{alpha}")


def _pct(x) -> str:
    return "" if x is None else f"{100 * x:.2f}"


def page_table() -> str:
    """The page's table, from the committed files only."""
    rows = [("| alpha | FENS as preset (Table 8 lrs, 500 rounds) | tuned aggregator (client lr, server lr) | "
            "central upper bound | members to completion + tuned aggregator (epochs kept: min / median / max) | "
            "weighted avg. | voting | study budget |"),
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for d in sorted(DOCS.glob("dir*"), key=lambda p: float(p.name[3:])):
        base = json.loads((d / "base/metrics.json").read_text()) if (d / "base/metrics.json").exists() else None
        summ = json.loads((d / "tune-agg/summary.json").read_text()) if (d / "tune-agg/summary.json").exists() else None
        up = json.loads((d / "upper.json").read_text()) if (d / "upper.json").exists() else None
        comp = complete_runs(d)
        cells = [d.name[3:]]
        cells.append(_pct(base["rounds"][-1]["accuracy"]) if base else "not run")
        if summ and "chosen" in summ:
            v = summ["best"]["values"]
            cell = f"{_pct(summ['chosen']['test_accuracy'])} ({v['fens-agg-client-lr']:.3g}, {v['fens-agg-server-lr']:.3g})"
            longer = d / "tune-agg/chosen-r1000/metrics.json"
            if longer.exists():  # the same values to 1,000 rounds: kept only if validation says so
                r = json.loads(longer.read_text())["rounds"]
                cell += (f"; 1,000 rounds: validation {_pct(r[500]['val_accuracy'])} -> {_pct(r[1000]['val_accuracy'])}, "
                         f"test {_pct(r[1000]['accuracy'])}")
            cells.append(cell)
        else:
            cells.append("not run")
        cells.append(f"{_pct(up['test_accuracy'])} (epoch {up['best_epoch']})" if up else "not run")
        if comp:
            m = json.loads(comp[-1].read_text())
            ep = sorted(m["phases"].get("phase1_member_epochs") or [0])
            cells.append(f"{_pct(m['rounds'][-1]['accuracy'])} ({ep[0]} / {statistics.median(ep):g} / {ep[-1]})")
        else:
            cells.append("not run")
        st = (base or {}).get("static_aggregators_test_accuracy", {})
        cells += [_pct(st.get("weighted-average")), _pct(st.get("voting"))]
        cells.append(f"{summ['budget']['trials']} x {summ['budget']['rounds_per_trial']} rounds "
                     f"({summ['pruned']} pruned)" if summ else "")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


ITER_BEGIN = "<!-- table: scripts/fens_fair.py --page (iterative) -->"


def iterative_table() -> str:
    """FedAdam and FedAvg through the protocol at each alpha, from the committed files only: every grid value's
    validation accuracy after its 10 rounds, the pick, and the pick's 50-round run on the test half."""
    rows = ["| alpha | method | validation accuracy after 10 rounds, per lr | lr chosen | test accuracy, 50 rounds | "
            "client traffic, 50 rounds (GB) | best FENS on the page (members to completion) |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for d in sorted(DOCS.glob("dir*"), key=lambda p: float(p.name[3:])):
        comp = complete_runs(d)
        fens = _pct(json.loads(comp[-1].read_text())["rounds"][-1]["accuracy"]) if comp else ""
        for method in ITER_GRIDS:
            summ = d / f"iter-{method}" / "summary.json"
            if not summ.exists():
                continue
            s = json.loads(summ.read_text())
            grid = ", ".join(f"{t['values']['lr']:g}: {_pct(t['val_accuracy'])}" for t in
                             sorted(s["trials"], key=lambda t: t["values"]["lr"]) if t["val_accuracy"] is not None)
            chosen = d / f"iter-{method}" / f"chosen-r{ITER_ROUNDS}" / "metrics.json"
            test, gb = "not run yet", ""
            if chosen.exists():
                last = json.loads(chosen.read_text())["rounds"][-1]
                test, gb = _pct(last["accuracy"]), f"{(last['cum_bytes_down'] + last['cum_bytes_up']) / 1e9:.2f}"
            rows.append(f"| {d.name[3:]} | {'FedAdam' if method == 'fedadam' else 'FedAvg'} | {grid} | "
                        f"{s['best']['values']['lr']:g} | {test} | {gb} | {fens} |")
    return "\n".join(rows)


SEEDS_BEGIN = "<!-- table: scripts/fens_fair.py --page (seeds) -->"


def seed_runs(d: Path) -> list[tuple[str, dict[int, Path]]]:
    """(method, {seed: metrics.json}) at one alpha: FENS at its best and the iterative baselines at their chosen lr."""
    out = [("FENS, members to completion + tuned aggregator",
            {seed: runs[-1] for seed in SEEDS if (runs := complete_runs(d, seed))})]
    for method, name in (("fedadam", "FedAdam"), ("fedavg", "FedAvg")):
        runs = {seed: f for seed in SEEDS
                if (f := d / f"iter-{method}" / seeded(f"chosen-r{ITER_ROUNDS}", seed) / "metrics.json").exists()}
        if not runs and (earlier := tuned_iterative_run(d.name[3:], method)) is not None:
            runs = {0: earlier[1]}  # Dir(0.1): the seven-baseline study's run at its chosen lr (seed 0 only)
        if runs:
            out.append((f"{name}, tuned lr, {ITER_ROUNDS} rounds", runs))
    return out


def seeds_table() -> str:
    """Final test accuracy per seed and its spread, from the committed files only (the values tuned at seed 0)."""
    rows = ["| alpha | method | " + " | ".join(f"seed {s}" for s in SEEDS) + " | mean ± std (n) | "
            "mean of the last 10 rounds, mean over seeds |", "| --- | --- | " + "--- | " * len(SEEDS) + "--- | --- |"]
    for d in sorted(DOCS.glob("dir*"), key=lambda p: float(p.name[3:])):
        for name, runs in seed_runs(d):
            if not runs:
                continue
            rounds = {seed: json.loads(f.read_text())["rounds"] for seed, f in runs.items()}
            final = [100 * r[-1]["accuracy"] for r in rounds.values()]
            last10 = [statistics.fmean(100 * x["accuracy"] for x in r[-10:]) for r in rounds.values()]
            spread = f"{statistics.fmean(final):.2f} ± {statistics.stdev(final):.2f}" if len(final) > 1 else f"{final[0]:.2f}"
            cells = [_pct(rounds[s][-1]["accuracy"]) if s in rounds else "not run" for s in SEEDS]
            rows.append(f"| {d.name[3:]} | {name} | " + " | ".join(cells) + f" | {spread} ({len(final)}) | "
                        f"{statistics.fmean(last10):.2f} |")
    return "\n".join(rows)


PLOT = ROOT / "docs/results/fens-fair-traffic.png"


def traffic_curves(d: Path) -> list[tuple[str, list[float], list[float]]]:
    """(label, client GB, test accuracy %) of each committed run at one alpha: FENS as preset and at its best, and the
    iterative baselines tuned under the protocol (or, where that study is not committed, FedAdam's run on record)."""
    def curve(path: Path) -> tuple[list[float], list[float]]:
        rows = json.loads(path.read_text())["rounds"]
        return ([(r["cum_bytes_down"] + r["cum_bytes_up"]) / 1e9 for r in rows], [100 * r["accuracy"] for r in rows])

    alpha = d.name[3:]
    out = []
    if (d / "base/metrics.json").exists():
        out.append(("FENS as preset", *curve(d / "base/metrics.json")))
    comp = complete_runs(d)
    if comp:
        out.append(("FENS: members to completion, tuned aggregator", *curve(comp[-1])))
    for method, name in (("fedadam", "FedAdam"), ("fedavg", "FedAvg")):
        tuned = tuned_iterative_run(alpha, method)
        if tuned is not None:
            lr, path, here = tuned
            out.append((f"{name}, lr {lr} ({'tuned' if here else 'tuned on the same validation half'})", *curve(path)))
    record = ROOT / "docs/results" / f"fens-fmnist-dir{alpha}/runs/fedadam-fmnist-dir{alpha}-s0/metrics.json"
    if not any(label.startswith("FedAdam") for label, *_ in out) and record.exists():
        out.append(("FedAdam, lr 0.01 (on record, not re-tuned)", *curve(record)))
    return out


def plot_traffic() -> None:
    """Test accuracy against client traffic, one panel per alpha (the page's figure), from the committed runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dirs = sorted(DOCS.glob("dir*"), key=lambda p: float(p.name[3:]))
    fig, axes = plt.subplots(1, len(dirs), figsize=(5.2 * len(dirs), 4.2))
    for ax, d in zip(axes, dirs, strict=True):
        for i, (label, gb, acc) in enumerate(traffic_curves(d)):
            ax.plot(gb, acc, color=f"C{i}", lw=1.4, marker="o" if len(gb) < 80 else None, markersize=2.5,
                    label=f"{label} (n=1)")
        ax.set_title(f"Dir({d.name[3:]}), seed 0")
        ax.set_xscale("log")
        ax.set_xlabel("client traffic, down + up (GB, cumulative)")
        ax.set_ylim(40, 92)
        ax.set_xlim(0.3, 30)  # round 0 of the iterative runs is discovery only (kB): off the axis
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=7)
    axes[0].set_ylabel("test accuracy (%), test half")
    fig.suptitle("FENS at its best against the iterative baselines, by client traffic (FMNIST, 20 clients)")
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)
    plt.close(fig)
    print(f"wrote {PLOT}")


def write_page() -> None:
    from fmt import write_between

    write_between(PAGE, BEGIN, END, page_table())
    text = PAGE.read_text()
    if ITER_BEGIN in text:
        write_between(PAGE, ITER_BEGIN, END, iterative_table())
    if SEEDS_BEGIN in text:
        write_between(PAGE, SEEDS_BEGIN, END, seeds_table())
    print(f"wrote {PAGE}")
    plot_traffic()


def main() -> int:
    from hetfl.common.task import setup_logging

    p = argparse.ArgumentParser(prog="python scripts/fens_fair.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--alphas", nargs="+", default=["0.1", "0.01", "0.05"])
    p.add_argument("--steps", nargs="+", default=["base", "tune", "longer", "upper", "complete", "iterative"],
                   choices=("base", "tune", "longer", "upper", "complete", "iterative"))
    p.add_argument("--methods", nargs="+", default=list(ITER_GRIDS), choices=list(ITER_GRIDS),
                   help="the iterative step's methods")
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--rounds", type=int, default=500)
    p.add_argument("--max-epochs", type=int, default=50)
    p.add_argument("--workers", type=int, default=1, help="the iterative step's grid trials run at once, one process "
                   "each (hetfl.tune --workers; a GPU machine's cores)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0], help="the complete and iterative steps' seeds (the "
                   "values tuned at seed 0 rerun; runs of seed s > 0 are named <run>-s<s>)")
    p.add_argument("--out", default="results/fens-fair")
    p.add_argument("--page", action="store_true", help="only rewrite the table of docs/results/fens-fair.md from "
                   "the committed runs (seconds)")
    a = p.parse_args()
    if a.page:
        write_page()
        return 0
    setup_logging()
    for alpha in a.alphas:
        out = Path(a.out) / f"dir{alpha}"
        for step in a.steps:
            t0 = time.perf_counter()
            if step == "base":
                step_base(alpha, out)
            elif step == "tune":
                step_tune(alpha, out, a.trials, a.rounds)
            elif step == "longer":
                step_longer(alpha, out)
            elif step == "upper":
                step_upper(alpha, out)
            elif step == "iterative":
                for seed in a.seeds:
                    step_iterative(alpha, out, a.methods, a.workers, seed)
            else:
                for seed in a.seeds:
                    step_complete(alpha, out, a.max_epochs, seed)
                    keep(out, alpha)  # each seed's run committed-ready as soon as it is done
            keep(out, alpha)
            print(f"=== dir{alpha} {step}: {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
