"""Run several methods x seeds on one preset family and write a table (mean +- std) and a plot.

    python scripts/reproduce.py --name shefl-fmnist-dir0.6 \
        --presets configs/shefl/fmnist-dir0.6.toml configs/fedensemble/fmnist-dir0.6.toml \
                  configs/fedavg/fmnist-dir0.6.toml configs/fedprox/fmnist-dir0.6.toml \
        --seeds 0 1 2 --supernodes 100

Writes results/reproduce/<name>/{table.md,table.json,accuracy.png}; each run keeps its own
results/reproduce/<name>/runs/<preset>-s<seed>/metrics.json. Runs that already finished with
the same preset values and overrides are not repeated, an interrupted one resumes from its
checkpoint (so a long reproduction can span sessions); ``--reuse DIR`` also takes finished runs
from DIR/<preset>-s<seed>/metrics.json (e.g. the ones committed under docs/results/<name>/runs);
``--extend DIR`` continues a shorter run of the same config from DIR/<preset>-s<seed>/ (its metrics.json and
checkpoint) to this reproduction's num-server-rounds: a 50-round run picks up where the 10-round run of a
learning-rate grid stopped (``extendable`` says which runs can; docs/checkpoints.md#extending-a-run).

One-shot baselines (methods that read ``oneshot-reuse``: FedKD, Fed-ET, Co-Boosting) share phase 1: a run to train
starts from the ensemble saved by an earlier run of the same seed in this reproduction whose phase-1 settings equal
its own (``oneshot-reuse``; FedKD's and Fed-ET's presets train the same local models, Co-Boosting's, without the
auxiliary hold-out, its own), and reports that run's phase-1 bytes and times (docs/readings.md#fens-artifacts).

``--engine inprocess`` runs each ServerApp and its ClientApps in this one process over ``hetfl.inprocess``'s grid
instead of the Simulation Engine (the same app code and byte metering; clients one after another): for a machine
without Ray, such as a GPU box that only has PyTorch (``--set 'torch-device="cuda"'``). Its metrics.json says so
(``engine``, and the GPU's name), and its wall times are not comparable with the Simulation Engine's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # plots.py

from fmt import mean_std  # noqa: E402
from hetfl import launch  # noqa: E402
from hetfl.common.config import ConfigError  # noqa: E402
from hetfl.methods import SCHEMA, validate  # noqa: E402
from hetfl.common.results import load_metrics  # noqa: E402
from hetfl.adaptivefl_app.core import TIERS, Capacity, largest_affordable  # noqa: E402
from hetfl.common.results import convergence_round  # noqa: E402
from hetfl.fens_app.aggregators import STATIC_LABELS  # noqa: E402
from hetfl.shefl_app.keys import client_work  # noqa: E402


def split_preset(spec: str) -> tuple[Path, dict, str]:
    """``path[@k=v,k=v]`` -> (path, its own overrides, a name suffix)."""
    path, _, own = spec.partition("@")
    over = launch.parse_set([kv for kv in own.split(",") if kv])
    return Path(path), over, "".join(f"-{k}{v}" for k, v in over.items())


def label(preset: Path, suffix: str = "") -> str:
    return f"{preset.parent.name}/{preset.stem}{suffix}"


_NOT_COMPARED = ("run-name", "results-dir", "resume", "oneshot-reuse")  # a reused phase 1 gives the same run


def shared_phase1(wanted: dict, sources: list[Path]) -> Path | None:
    """The first run directory in `sources` whose saved phase-1 ensemble a run of config `wanted` may start from
    (``oneshot-reuse``, the check its ServerApp makes: same phase-1 settings); None for a method that reads no
    ``oneshot-reuse``, or when none fits."""
    from hetfl.common.oneshot.artifacts import ENSEMBLE, check_reuse

    cfg = validate(wanted)
    if cfg["method"] not in SCHEMA["oneshot-reuse"].methods:
        return None
    from hetfl.oneshot_app import PHASE1

    for src in sources:
        if not (src / ENSEMBLE).is_file():
            continue
        try:
            check_reuse({**cfg, "oneshot-reuse": str(src.resolve())}, "oneshot-reuse", PHASE1)
        except ConfigError:
            continue
        return src.resolve()
    return None


def _same(m: dict, wanted: dict | None) -> bool:
    """Whether a run's metrics.json was made with the wanted config values."""
    from hetfl.common.results import relative_paths  # a path under the checkout as a metrics.json stores it

    return all(relative_paths(m["config"].get(k)) == relative_paths(v) for k, v in (wanted or {}).items()
               if k not in _NOT_COMPARED)


def partial(metrics: Path, wanted: dict) -> bool:
    """A run interrupted after a checkpoint, with the wanted config: it continues (resume) instead of restarting."""
    if not (metrics.exists() and (metrics.parent / "checkpoint.json").exists()):
        return False
    return _same(load_metrics(metrics, SCHEMA), wanted)


# runs that are not the same when extended: what they do depends on num-server-rounds, or their clients keep state
# that a resumed run (a new Flower run, new node state) loses; (method, config key that must be false or None)
NOT_EXTENDABLE = {
    ("scalefl", None): "its self-distillation starts after 25% of num-server-rounds",
    ("fedavg-stc", "stc-error-feedback"): "its clients' error-feedback residuals live in the node state, which a new run starts empty",
}


def extendable(src: Path, wanted: dict) -> str | None:
    """Why the run in ``src`` cannot be continued to the wanted config, or None when it can.

    It can when it stopped after a checkpoint, with every wanted value but num-server-rounds, fewer rounds than
    wanted, and a method that does not read num-server-rounds or keep client state a new run loses.
    """
    metrics = src / "metrics.json"
    if not (metrics.exists() and (src / "checkpoint.json").exists()):
        return f"{src} has no metrics.json and checkpoint.json"
    m = load_metrics(metrics, SCHEMA)
    if not _same(m, {k: v for k, v in wanted.items() if k != "num-server-rounds"}):
        return f"{src} was made with other config values"
    if m["summary"]["rounds_completed"] >= wanted.get("num-server-rounds", m["config"]["num-server-rounds"]):
        return f"{src} has as many rounds as wanted already"
    c = m["config"]
    why = next((w for (method, k), w in NOT_EXTENDABLE.items() if c["method"] == method and (k is None or c.get(k))), None)
    return f"{c['method']}: {why}" if why else None


def start_from(src: Path, dest: Path) -> None:
    """Copy a run's metrics.json and checkpoint (JSON, the tensor file it names, its row log) to ``dest`` for a resume."""
    from hetfl.common.checkpoint import checkpoint_files

    dest.mkdir(parents=True, exist_ok=True)
    for f in [src / "metrics.json", *checkpoint_files(src / "checkpoint.json")]:  # the JSON last: the commit point
        (dest / f.name).write_bytes(f.read_bytes())


def finished(metrics: Path, wanted: dict | None = None) -> bool:
    """A run whose metrics.json shows all configured rounds, or that the server stopped (``stopped``: no client update
    accepted for max-idle-rounds rounds, e.g. a diverged method: its outcome, not an interruption; rerunning the same
    seed stops the same way), and, if given, the wanted config values."""
    if not metrics.exists():
        return False
    m = load_metrics(metrics, SCHEMA)
    done = m["summary"]["rounds_completed"] >= m["config"]["num-server-rounds"] or bool(m.get("stopped"))
    return _same(m, wanted) and done


GRID_LAST = 3  # a grid point's score: the mean over its last 3 rounds (one round swings by 3-5 points under skew)


def grid_score(run: dict, column: str) -> float | None:
    """Mean of ``column`` (accuracy or val_accuracy) over the run's last GRID_LAST rounds, in %; None if unrecorded."""
    last = [r.get(column) for r in run["rounds"][-GRID_LAST:]]
    return None if any(v is None for v in last) else 100 * statistics.mean(last)


def grid_picks(grids: dict[str, list[tuple[str, dict, dict]]]) -> list[dict]:
    """Per preset run at several overrides (``path@k=v``): each point's scores and the pick.

    The pick is the highest mean validation accuracy over the last GRID_LAST rounds (``val_accuracy``: the first
    half of the test split under ``eval-split = "test-half"``); a grid with a point that recorded no validation
    accuracy picks on the reported test accuracy instead and says so (``picked_on``).
    """
    out = []
    for base, points in grids.items():
        scored = [{"method": base, "overrides": own, "label": lab, "test": grid_score(run, "accuracy"),
                   "val": grid_score(run, "val_accuracy"), "rounds": run["summary"]["rounds_completed"]}
                  for lab, own, run in points]
        on = "val" if all(p["val"] is not None for p in scored) else "test"
        best = max(scored, key=lambda p: p[on])
        for p in scored:
            out.append({**p, "picked": p is best, "picked_on": on})
    return out


def client_mb(record: dict, kind: str = "cum") -> float:
    """Client traffic up + down in MB: `kind` 'cum' for a round row (cumulative), 'total' for a run's summary."""
    return (record[f"{kind}_bytes_down"] + record[f"{kind}_bytes_up"]) / 1e6


def training_rounds(run: dict) -> list[dict]:
    """A run's round rows after round 0 (node discovery and the initial model's evaluation: nothing trained)."""
    return [x for x in run["rounds"] if x["round"] > 0]


def trained_per_round(run: dict) -> float:
    """Parameters the clients returned per round (AdaptiveFL family), in units of the full model L1."""
    full = max(e["params"] for e in run["pool"])
    rounds = training_rounds(run)
    return sum(x["params_back"] for x in rounds) / full / len(rounds)


def authors_pick(run: dict) -> dict:
    """The round row the AdaptiveFL authors report: the one maximising avg + full accuracy on the test set
    (docs/readings.md#adaptivefl-evaluation); the first such round on ties."""
    return max(training_rounds(run), key=lambda x: (round(x["acc_avg"] + x["acc_L1"], 9), -x["round"]))


def affordable_per_round(run: dict) -> float:
    """Upper bound of `trained_per_round` under uncertain devices: K clients of the run's tier shares, each sent the
    largest pool model its request affords (core.largest_affordable), in units of L1."""
    sizes = [e["params"] for e in run["pool"]]
    shares = [float(x) for x in run["config"]["adaptivefl-tier-proportions"].split(":")]
    per = sum(w * largest_affordable(Capacity(**run["devices"][t]), sizes)
              for w, t in zip(shares, TIERS, strict=True)) / sum(shares)
    k = statistics.median(len(x["clients"]) for x in training_rounds(run))
    return k * per / max(sizes)


def local_work(run: dict) -> tuple[float, int] | None:
    """Local training of an epoch-based run (straggler study, SHEFL Fig. 7) in model-epochs (one model trained for
    one epoch on one client's partition): the mean per round over the run, and the most one client did in a round,
    which bounds a round's wall time on real devices. Ensemble rounds count the schedule the run recorded (H_m HPCs
    and L_m LPCs trained model m, each at its role's epochs); other rounds count clients x local-epochs. None for a
    run with step-based local work. Server-side work (FedBE's distillation) is not counted."""
    cfg = run["config"]
    hpc, lpc = client_work(cfg, True), client_work(cfg, False)  # (epochs, models) of one client of each role
    if hpc is None or lpc is None:
        return None
    per_round, most = [], 0
    for x in training_rounds(run):
        if "H_m0" in x:
            h = sum(x[k] for k in x if k.startswith("H_m"))
            l_ = sum(x[k] for k in x if k.startswith("L_m"))
            per_round.append(hpc[0] * h + lpc[0] * l_)
            most = max(most, hpc[0] * hpc[1] if h else 0, lpc[0] if l_ else 0)
        else:
            per_round.append(lpc[0] * len(x["clients"]))
            most = max(most, lpc[0] if x["clients"] else 0)
    return statistics.mean(per_round), most


MEMBER_WINDOWS = ((1, 3), (4, 10), (11, None))  # early, middle, late rounds (None: to the last round)


def ensemble_members(run: dict, lo: int, hi: int | None) -> dict | None:
    """Ensemble runs (SHEFL, Fed-Ensemble: rows with acc_m0, acc_m1, ...), rounds lo..hi: mean over those rounds of
    the ensemble's accuracy, its members' mean and best accuracy, the ensemble's gain over its best member
    (how much the members' diversity adds) and the members' pairwise disagreement (None for runs made before
    metrics.json recorded it), in percent. None if the run has no such rounds."""
    rows = [x for x in training_rounds(run) if lo <= x["round"] and (hi is None or x["round"] <= hi)]
    if not rows or "acc_m0" not in rows[0]:
        return None
    members = [[x[k] for k in sorted(x) if k.startswith("acc_m") and k[5:].isdigit()] for x in rows]
    ens = statistics.mean(100 * x["accuracy"] for x in rows)
    mean_m = statistics.mean(100 * statistics.mean(m) for m in members)
    best_m = statistics.mean(100 * max(m) for m in members)
    disagree = statistics.mean(100 * x["disagreement"] for x in rows) if all("disagreement" in x for x in rows) else None
    return {"ensemble": ens, "member_mean": mean_m, "member_best": best_m, "gain_over_best": ens - best_m,
            "disagreement": disagree, "rounds": (rows[0]["round"], rows[-1]["round"])}


def disagreement_cell(stats: list[dict]) -> str:
    """Mean ± std of the runs' member disagreement, and over how many runs when some did not record it."""
    have = [s["disagreement"] for s in stats if s["disagreement"] is not None]
    if not have:
        return "not recorded"
    return mean_std(have) + (f" ({len(have)} of {len(stats)} runs)" if len(have) < len(stats) else "")


def passes_fens(fens_label: str, fens_runs: list[dict], fl_label: str, fl_runs: list[dict]) -> list[dict]:
    """Per seed: FENS's final accuracy and total client bytes, and the first round (with its cumulative client
    bytes, up + down) at which the iterative FL run reaches that accuracy (FENS paper, Fig. 1; None if never).
    Accuracies in percent, bytes in MB; runs are paired by their config's seed."""
    by_seed = {r["config"]["seed"]: r for r in fens_runs}
    out = []
    for r in fl_runs:
        f = by_seed.get(r["config"]["seed"])
        if f is None:
            continue
        target = f["summary"]["final_accuracy"]
        at = convergence_round([(x["round"], x["accuracy"]) for x in r["rounds"]], target)
        mb = next((client_mb(x) for x in r["rounds"] if x["round"] == at), None)
        out.append({"method": f"{fl_label} vs {fens_label}", "seed": r["config"]["seed"], "fens_final": 100 * target,
                    "fens_comm_mb": client_mb(f["summary"], "total"),
                    "passes_at_round": at, "passes_at_mb": mb, "fl_final": 100 * r["summary"]["final_accuracy"],
                    "fl_best": 100 * r["summary"]["best_accuracy"]})
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", required=True)
    p.add_argument("--presets", nargs="+", required=True)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--supernodes", type=int, default=100)
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides for every run")
    p.add_argument("--table-only", action="store_true", help="only tabulate the runs that already finished")
    p.add_argument("--reuse", nargs="*", default=[], metavar="DIR", help="directories with finished runs to reuse")
    p.add_argument("--extend", nargs="*", default=[], metavar="DIR",
                   help="directories with shorter checkpointed runs of the same config to continue (see extendable)")
    p.add_argument("--engine", choices=("simulation", "inprocess"), default="simulation",
                   help="simulation: Flower's Simulation Engine (default); inprocess: hetfl.inprocess, no Ray")
    a = p.parse_args()
    launch.setup_signals()  # a killed reproduction stops its current run's SuperLink tree too
    out = Path("results/reproduce") / a.name
    runs_dir = out / "runs"
    results: dict[str, list[dict]] = {}
    grids: dict[str, list[tuple[str, dict, dict]]] = {}  # preset -> its runs at other values (first seed)
    out.mkdir(parents=True, exist_ok=True)
    for seed in a.seeds:  # seed-major: every method gets seed 0 before any gets seed 1
        trained: list[Path] = []  # this seed's run directories, in order: one-shot runs may start from their phase 1
        for preset, own, suffix in map(split_preset, a.presets):
            name = f"{preset.parent.name}-{preset.stem}{suffix}-s{seed}"
            metrics = runs_dir / name / "metrics.json"
            overrides = {**launch.parse_set(a.set), **own, "seed": seed, "run-name": name}
            wanted = {**tomllib.loads(preset.read_text()), **overrides}
            if not finished(metrics, wanted):
                src = next((s for s in (Path(d) / name / "metrics.json" for d in a.reuse) if finished(s, wanted)), None)
                if src is not None:
                    metrics.parent.mkdir(parents=True, exist_ok=True)
                    metrics.write_text(src.read_text())
            if not finished(metrics, wanted):
                if a.table_only:
                    continue
                extended = False
                if not partial(metrics, wanted):
                    for d in a.extend:
                        why = extendable(Path(d) / name, wanted)
                        if why is None:
                            print(f"extending {Path(d) / name} to {wanted['num-server-rounds']} rounds", flush=True)
                            start_from(Path(d) / name, runs_dir / name)
                            extended = True
                            break
                        print(f"not extending {Path(d) / name}: {why}", flush=True)
                if extended or partial(metrics, wanted):  # a run cut off by the end of a session goes on where it stopped
                    overrides["resume"] = True
                source = shared_phase1(wanted, trained)
                if source is not None:
                    print(f"{name}: phase 1 from {source} (same phase-1 settings)")
                    overrides["oneshot-reuse"] = str(source)
                try:
                    if a.engine == "inprocess":
                        from hetfl.inprocess import run_in_process

                        run_config = {**launch.load_preset(str(preset)), **overrides}  # as launch.run reads it
                        launch.preflight(run_config, a.supernodes)
                        run_in_process(run_config, a.supernodes, runs_dir.resolve(), name)
                    else:
                        launch.run(str(preset), overrides, num_supernodes=a.supernodes, results_dir=runs_dir)
                except Exception:
                    if not finished(metrics, wanted):  # a crash or an interruption: the batch stops here
                        raise
                    print(f"{name}: stopped in round {load_metrics(metrics, SCHEMA)['stopped']['round']}, kept as its outcome; "
                          "going on", flush=True)
            trained.append(metrics.parent)
            results.setdefault(label(preset, suffix), []).append(load_metrics(metrics, SCHEMA))
            if own and seed == a.seeds[0]:
                grids.setdefault(label(preset), []).append((label(preset, suffix), own, results[label(preset, suffix)][0]))
    rows, table = [], ["| method | final acc. (%) | best acc. (%) | conv. round (per seed) | upload MB/round | total client comm. (MB) | s/round | seeds |",
                       "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for lab, runs in results.items():
        final = [100 * r["summary"]["final_accuracy"] for r in runs]
        best = [100 * r["summary"]["best_accuracy"] for r in runs]
        conv = [r["summary"]["convergence_round"] for r in runs]
        up = [r["summary"]["total_bytes_up"] / 1e6 / r["summary"]["rounds_completed"] for r in runs]
        sec = [r["summary"]["mean_round_s"] for r in runs]
        total = [client_mb(r["summary"], "total") for r in runs]
        never = sum(c is None for c in conv)
        conv_s = (mean_std([float(c) for c in conv if c is not None]) + (f", {never} never" if never else "")
                  + " (" + " / ".join("never" if c is None else str(c) for c in conv) + ")")  # per seed, in seed order
        stops = [f"s{r['config']['seed']} stopped in round {r['stopped']['round']}" for r in runs if r.get("stopped")]
        table.append(f"| {lab} | {mean_std(final)} | {mean_std(best)} | {conv_s} | {mean_std(up)} | {mean_std(total)} | "
                     f"{mean_std(sec)} | {len(runs)}{' (' + '; '.join(stops) + ')' if stops else ''} |")
        rows.append({"method": lab, "final": final, "best": best, "convergence_round": conv, "upload_mb_per_round": up,
                     "total_comm_mb": total, "s_per_round": sec, "threshold": runs[0]["summary"]["convergence_threshold"]})
        # FENS runs also evaluate the one-shot baselines on the same local models; their clients only upload
        for name in sorted(runs[0].get("static_aggregators_test_accuracy", {})):
            acc = [100 * r["static_aggregators_test_accuracy"][name] for r in runs]
            upload = [r["phases"]["upload_bytes"] / 1e6 for r in runs]
            label_ = STATIC_LABELS[name]
            table.append(f"| {lab}: {label_} | {mean_std(acc)} | {mean_std(acc)} | n/a | n/a | {mean_std(upload)} | n/a | {len(runs)} |")
            rows.append({"method": f"{lab}: {label_}", "final": acc, "total_comm_mb": upload})
    # FENS: wall time of one phase-2 round relative to one local epoch of phase 1 (all clients, as the run saw it)
    # only runs whose phase 1 was epoch-based (local-steps = 0; with steps > 0 the epoch count is ignored)
    per_epoch = [(lab, r) for lab, runs in results.items() for r in runs
                 if "phase1_wall_s" in r.get("phases", {}) and r["phases"]["phase1_local_steps"] == 0]
    timed: dict[str, list[dict]] = {}
    for lab, r in per_epoch:
        timed.setdefault(lab, []).append(r)
    if timed:
        table += ["", "| method | phase 1: s per local epoch (wall, all clients) | client s per local epoch | phase 2: s per round | ratio | seeds |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for lab, runs in timed.items():
            epoch = [r["phases"]["phase1_wall_s"] / r["phases"]["phase1_local_epochs"] for r in runs]
            client = [statistics.mean(r["phases"]["phase1_client_train_s"]) / r["phases"]["phase1_local_epochs"] for r in runs]
            rnd = [r["summary"]["mean_round_s"] for r in runs]
            ratio = [100 * x / e for x, e in zip(rnd, epoch, strict=True)]
            table.append(f"| {lab} | {mean_std(epoch)} | {mean_std(client)} | {mean_std(rnd)} | {mean_std(ratio)} % | {len(runs)} |")
            rows.append({"method": f"{lab}: timing", "phase1_epoch_s": epoch, "client_epoch_s": client, "phase2_round_s": rnd})
    # FENS paper, Fig. 1/4: the communication at which iterative FL passes FENS's final accuracy (same seed paired)
    fens = {lab: runs for lab, runs in results.items() if "upload_bytes" in runs[0].get("phases", {})}
    iterative = {lab: runs for lab, runs in results.items() if lab not in fens}
    crossing = [c for f in fens.items() for i in iterative.items() for c in passes_fens(*f, *i)]
    if crossing:
        table += ["", "| FL method vs FENS | seed | FENS final (%) | FENS client comm. (MB) | FL passes FENS at round | "
                      "FL comm. then (MB) | FL final (%) | FL best (%) | FL final - FENS final (points) |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for c in crossing:
            mb = "n/a" if c["passes_at_mb"] is None else f"{c['passes_at_mb']:.0f}"
            table.append(f"| {c['method']} | {c['seed']} | {c['fens_final']:.2f} | {c['fens_comm_mb']:.0f} | "
                         f"{c['passes_at_round'] or 'never'} | {mb} | {c['fl_final']:.2f} | {c['fl_best']:.2f} | "
                         f"{c['fl_final'] - c['fens_final']:+.2f} |")
        rows += crossing
    # AdaptiveFL family: full (L1) and avg (L1, M1, S1) accuracy, communication waste (Table 2, Sec. 4.4)
    hetero = {lab: runs for lab, runs in results.items() if "acc_avg" in runs[0]["rounds"][-1]}
    if hetero:
        table += ["", "| method | full acc. (%) | avg acc. (%) | L1 / M1 / S1 (%) | full / avg at the authors' pick (%) | "
                      "comm. waste (%) | trained per round (L1 = 1) | seeds |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for lab, runs in hetero.items():
            last = [r["rounds"][-1] for r in runs]
            full = [100 * x["acc_L1"] for x in last]
            avg = [100 * x["acc_avg"] for x in last]
            levels = " / ".join(f"{statistics.mean(100 * x[f'acc_{k}'] for x in last):.2f}" for k in ("L1", "M1", "S1"))
            waste = [100 * x["cum_waste_rate"] for x in last]
            trained = [trained_per_round(r) for r in runs]
            picks = [authors_pick(r) for r in runs]
            pick_full, pick_avg = [100 * x["acc_L1"] for x in picks], [100 * x["acc_avg"] for x in picks]
            table.append(f"| {lab} | {mean_std(full)} | {mean_std(avg)} | {levels} | {mean_std(pick_full)} / "
                         f"{mean_std(pick_avg)} | {mean_std(waste)} | {mean_std(trained)} | {len(runs)} |")
            rows.append({"method": lab, "full": full, "avg": avg, "waste": waste, "trained_l1_per_round": trained,
                         "pick_round": [x["round"] for x in picks], "pick_full": pick_full, "pick_avg": pick_avg})
        bound = next((affordable_per_round(r) for runs in hetero.values() for r in runs
                      if r["config"].get("adaptivefl-tier-capacity") == "gaussian" and r.get("devices")), None)
        if bound is not None:
            table.append(f"\nTrained per round: parameters returned by the clients per round, in units of the full model (L1). "
                         f"A selector that sent every request the largest pool model it affords would get back {bound:.2f} "
                         "(the expected size under the devices' capacity distribution and tier shares).")
    # ensemble methods: the members' accuracy and the ensemble's gain over its best member, by phase of the run
    ensembles = {lab: runs for lab, runs in results.items() if "acc_m0" in runs[0]["rounds"][-1]}
    if ensembles:
        table += ["", "| ensemble method | rounds | ensemble acc. (%) | member mean (%) | best member (%) | "
                      "ensemble - best member (points) | member disagreement (%) | seeds |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for lab, runs in ensembles.items():
            for lo, hi in MEMBER_WINDOWS:
                stats = [s for s in (ensemble_members(r, lo, hi) for r in runs) if s is not None]
                if not stats:
                    continue
                span = f"{lo}-{hi if hi is not None else max(s['rounds'][1] for s in stats)}"
                table.append(f"| {lab} | {span} | {mean_std([s['ensemble'] for s in stats])} | "
                             f"{mean_std([s['member_mean'] for s in stats])} | {mean_std([s['member_best'] for s in stats])} | "
                             f"{mean_std([s['gain_over_best'] for s in stats])} | {disagreement_cell(stats)} | {len(stats)} |")
                rows.append({"method": f"{lab}: members rounds {span}", **{k: [s[k] for s in stats]
                             for k in ("ensemble", "member_mean", "member_best", "gain_over_best", "disagreement")}})
    # straggler study (SHEFL Fig. 7): how much local training each method spends, when some run sets per-role work
    if any(r["config"].get("shefl-hpc-local-epochs") or r["config"].get("shefl-lpc-local-epochs") for runs in results.values()
           for r in runs):
        table += ["", "| method | local work per round (model-epochs) | most by one client in a round (model-epochs) | seeds |",
                  "| --- | --- | --- | --- |"]
        for lab, runs in results.items():
            work = [w for w in map(local_work, runs) if w is not None]
            if work:
                table.append(f"| {lab} | {mean_std([w[0] for w in work])} | {max(w[1] for w in work)} | {len(work)} |")
                rows.append({"method": f"{lab}: local work", "model_epochs_per_round": [w[0] for w in work],
                             "most_per_client": [w[1] for w in work]})
    # a preset at several values (path@k=v): a grid; each point's mean over its last rounds and the pick
    picks = grid_picks({b: p for b, p in grids.items() if len(p) > 1})
    if picks:
        table += ["", f"| grid | values | test acc., mean of the last {GRID_LAST} rounds (%) | validation acc., same rounds (%) | "
                      "rounds | pick |", "| --- | --- | --- | --- | --- | --- |"]
        for p in picks:
            val = "not recorded" if p["val"] is None else f"{p['val']:.2f}"
            pick = f"**picked** (on {'validation' if p['picked_on'] == 'val' else 'test: no validation recorded'})" if p["picked"] else ""
            table.append(f"| {p['method']} | {', '.join(f'{k}={v}' for k, v in p['overrides'].items())} | {p['test']:.2f} | "
                         f"{val} | {p['rounds']} | {pick} |")
        rows += [{"grid": p["method"], **{k: p[k] for k in ("overrides", "test", "val", "picked", "picked_on")}} for p in picks]
    (out / "table.md").write_text("\n".join(table) + "\n")
    (out / "table.json").write_text(json.dumps(rows, indent=2))
    from plots import plot_comparison  # every method's accuracy by round, zoomed, and by client MB

    plot_comparison(results, out / "accuracy.png", f"{a.name}: test accuracy")
    print("\n".join(table))
    print(f"\ntable: {out / 'table.md'}\nplot:  {out / 'accuracy.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
