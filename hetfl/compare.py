"""Which method for my fleet: every heterogeneous method on one federation of simulated devices, tuned the same way,
scored by accuracy against client bytes, client FLOPs and simulated time on the devices (docs/compare.md).

    python -m hetfl.compare fleets/aiot-wifi.toml comparisons/fmnist-dir0.6.toml --seeds 0 1 2

The comparison preset names the federation every method shares (``[run]``: dataset, partition, model, rounds, local
work), the tuning budget that every method gets (``[tune]``: trials x rounds, a grid over ``space``), the width each
capacity tier holds (``[widths]``) and, per method, a paper preset and its own keys (``[method.<name>]``). The fleet
file gives every client a tier (run-config ``fleet``): SHEFL's device class and AdaptiveFL's capacity follow from it,
and every round's row carries the simulated wall clock on those devices (FedScale's model; hetfl.common.fleet).

* **Models that fit.** A device trains only a model its tier holds: FedAvg, SHEFL and FENS train the width of the
  weakest tier (``[widths]``); AdaptiveFL and HeteroFL send each device a submodel that fits it; All-Large runs
  only where every tier holds the full model, otherwise the page says why it is left out.
* **The same tuning budget.** Each method's ``space`` is searched with ``hetfl.tune`` (grid, trials x rounds on the
  validation half of the test split, seed 0); the chosen values run for the preset's rounds at every seed.
* **What the page reports.** Final test accuracy (mean +- std over seeds), and the accuracy each method had reached
  when it had spent the budget the cheapest method spent in all (client bytes, client FLOPs, simulated seconds);
  Pareto plots of accuracy against each cost. Finished runs are reused (a stopped comparison goes on where it was).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("hetfl")

METHODS = ("fedavg", "shefl", "fens", "adaptivefl", "heterofl", "all-large")
FIXED_WIDTH = ("fedavg", "shefl", "fens")  # one model width on every device: the weakest tier's
SUBMODELS = ("adaptivefl", "heterofl", "all-large")  # AdaptiveFL's code: a (sub)model fitted to each device's capacity
FEDERATION = ("dataset", "input-column", "label-column", "num-classes", "server-data-path", "data-source", "partitioner",
              "dirichlet-alpha", "dirichlet-min-size", "dirichlet-balance", "dirichlet-max-draws", "shards-per-client",
              "server-holdout", "partition-seed", "max-test-samples", "eval-split", "model", "min-available-nodes",
              "num-clients", "fleet")
"""Keys that make the federation: every method gets [run]'s value or the default, never its paper preset's."""
COSTS = {"client_bytes": "client bytes (down + up)", "client_flops": "client FLOPs", "sim_s": "simulated seconds"}


class CompareError(ValueError):
    """Bad comparison input: one line naming the file, the key, the value and what is allowed."""


@dataclass(frozen=True)
class Plan:
    """One method of a comparison: its run config (before tuning), its tuning space, or why it is left out."""

    method: str
    config: dict[str, Any]
    space: str
    skipped: str = ""


def load_preset(path: Path) -> dict[str, Any]:
    """Read a comparison preset (module docstring) and check its tables; one CompareError line on bad input."""
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise CompareError(f"{path}: cannot be read as TOML ({err})") from None
    for table in ("run", "tune", "widths", "method"):
        if not isinstance(raw.get(table), dict):
            raise CompareError(f"{path}: expected a [{table}] table")
    unknown = sorted(set(raw["method"]) - set(METHODS))
    if unknown:
        raise CompareError(f"{path}: [method.{unknown[0]}] is not compared; expected one of {', '.join(METHODS)}")
    for key in ("trials", "rounds"):
        if not isinstance(raw["tune"].get(key), int) or raw["tune"][key] < 1:
            raise CompareError(f"{path}: [tune] key '{key}' = {raw['tune'].get(key)!r}; expected an integer >= 1")
    for tier, width in raw["widths"].items():
        if isinstance(width, bool) or not isinstance(width, int | float) or not 0 < width <= 1:
            raise CompareError(f"{path}: [widths] key '{tier}' = {width!r}; expected a number in (0, 1]")
    return raw


def plans(fleet_path: Path, preset: dict[str, Any], preset_path: Path) -> list[Plan]:
    """Each compared method's run config on the fleet (module docstring: models that fit), in :data:`METHODS` order."""
    from hetfl.common.fleet import load_fleet

    fleet = load_fleet(fleet_path)
    widths = preset["widths"]
    missing = sorted({str(t.capacity) for t in fleet.tiers} - set(widths))
    if missing:
        raise CompareError(f"{preset_path}: [widths] lacks tier capacity {missing[0]!r} of fleet {fleet_path}; the "
                           "comparison needs a width for every capacity the fleet declares (weak, medium, strong)")
    weakest = min(float(widths[str(t.capacity)]) for t in fleet.tiers)
    out = []
    for method in METHODS:
        spec = dict(preset["method"].get(method, {}))
        if method not in preset["method"]:
            continue
        base = tomllib.loads(_method_preset(preset_path, method, spec.pop("preset")).read_text()) if "preset" in spec else {}
        space = spec.pop("space", "")
        own = sorted(set(spec) & set(FEDERATION))
        if own:
            raise CompareError(f"{preset_path}: [method.{method}] sets '{own[0]}', a key of the federation every method "
                               "shares; set it in [run]")
        base = {k: v for k, v in base.items() if k not in FEDERATION}  # a paper preset's split is not this federation's
        cfg = {**base, **preset["run"], **spec, "method": method, "fleet": str(fleet_path.resolve())}
        cfg["num-clients"] = cfg.get("min-available-nodes", 2)  # one device per SuperNode, the fleet dealt over them
        skipped = ""
        if method in FIXED_WIDTH:
            cfg["width"] = weakest  # every device trains (and FENS's devices run) models the weakest tier holds
        else:  # a device of the fleet holds its tier's level, not a capacity drawn per request (AdaptiveFL's Gaussian)
            cfg["adaptivefl-tier-capacity"] = "fixed"
        if method == "all-large" and weakest < 1.0:
            skipped = (f"not every tier holds the full model (the weakest holds width {weakest:g}): All-Large needs "
                       "a fleet of strong devices")
        out.append(Plan(method, cfg, space, skipped))
    return out


def _method_preset(preset_path: Path, method: str, name: str) -> Path:
    """A method block's ``preset``: relative to the current directory, else to the repository of `preset_path`."""
    for path in (Path(name), preset_path.resolve().parent.parent / name):
        if path.is_file():
            return path
    raise CompareError(f"{preset_path}: [method.{method}] key 'preset' = {name!r}: no such file")


def curve(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Accuracy and the cumulative costs after every round of a run's rows (:data:`COSTS`)."""
    out: dict[str, list[float]] = {"accuracy": [], **{k: [] for k in COSTS}}
    total = dict.fromkeys(COSTS, 0.0)
    for r in rows:
        total["client_bytes"] = float(r.get("cum_bytes_down", 0) + r.get("cum_bytes_up", 0))
        total["client_flops"] += float(r.get("client_flops", 0) or 0)
        total["sim_s"] += float(r.get("sim_round_s", 0) or 0)
        out["accuracy"].append(float(r["accuracy"]))
        for k in COSTS:
            out[k].append(total[k])
    return out


def accuracy_at(c: dict[str, list[float]], cost: str, budget: float) -> float | None:
    """The accuracy of the last round whose cumulative `cost` is within `budget`; None if not even the first row is
    (FENS's round 0 already holds its one-shot phase: it is not credited with accuracy bought above the budget)."""
    within = [a for a, spent in zip(c["accuracy"], c[cost], strict=True) if spent <= budget * (1 + 1e-9)]
    return within[-1] if within else None


def same_profiles(ran_on: str | Path, fleet_path: Path, what: str) -> None:
    """One CompareError line unless the fleet `what` ran on has `fleet_path`'s profiles (Fleet.profiles)."""
    from hetfl.common.fleet import load_fleet
    from hetfl.common.results import stored_path

    if load_fleet(stored_path(ran_on)).profiles() != load_fleet(fleet_path).profiles():
        raise CompareError(f"{what} ran on fleet {ran_on}, whose tiers' share, device-class, capacity or availability "
                           f"differ from {fleet_path}'s; only flops-per-s, down-mbps and up-mbps may differ")


def reclock(metrics: dict[str, Any], fleet_path: Path) -> dict[str, Any]:
    """A finished run's metrics as they read on `fleet_path`'s devices, for a run made on another fleet of the same
    profiles (:meth:`~hetfl.common.fleet.Fleet.profiles`: the same clients, device classes, capacities and
    availability, so the same training): the config names this fleet and every round's simulated seconds are
    recomputed from the round's per-client bytes and FLOPs at this fleet's speeds. A fleet whose profiles differ is
    one CompareError line."""
    from hetfl.common.fleet import simulated_round_seconds, tiers_of

    same_profiles(metrics["config"]["fleet"], fleet_path, "--reuse: a run there")
    cfg = {**metrics["config"], "fleet": str(fleet_path.resolve())}
    tiers = tiers_of(cfg)  # as the run's rows would have had them on this fleet
    rows = [{**r, "sim_round_s": simulated_round_seconds(tiers, r["bytes_down_by_client"], r["bytes_up_by_client"],
                                                         r["flops_by_client"])} if "sim_round_s" in r else r
            for r in metrics["rounds"]]
    return {**metrics, "config": cfg, "rounds": rows}


def _write(path: Path, metrics: dict[str, Any]) -> None:
    from hetfl.common.results import relative_paths

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(relative_paths(metrics), indent=1))


def tuned_values(plan: Plan, preset: dict[str, Any], out: Path, keep: Path | None = None,
                 reuse: Path | None = None) -> dict[str, Any]:
    """`plan`'s tuning study (seed 0, the preset's budget, a grid over its space) and the values it chose: the study
    committed in `keep` if its spec is the same, else `reuse`'s of the same training (clocked here), else run (and
    copied to `keep`), taking each trial that an earlier study (committed in `keep`, or set aside here) ran with the
    same config from there; :func:`run_plan` says more."""
    from hetfl.common.results import copy_files
    from hetfl.tune import StudyMismatch, TuneSpec, finished_trials, parse_space, tune

    nodes = int(plan.config["min-available-nodes"])
    spec = TuneSpec(base={**plan.config, "seed": 0}, space=tuple(parse_space(plan.space)),
                    trials=preset["tune"]["trials"], rounds=preset["tune"]["rounds"], nodes=nodes, sampler="grid",
                    seed=0, prune=False)
    study = out / plan.method / "tune"
    said = json.dumps({"base": spec.base, "space": plan.space, "trials": spec.trials, "rounds": spec.rounds,
                       "sampler": spec.sampler, "seed": spec.seed, "nodes": nodes}, indent=1, sort_keys=True)
    kept = keep / plan.method / "tune" if keep else None
    other = reuse / plan.method / "tune" if reuse else None
    if kept and (kept / "spec.json").exists() and (kept / "spec.json").read_text() == said:
        values = json.loads((kept / "summary.json").read_text())["best"]["values"]
        log.info("%s: the committed study in %s chose %s", plan.method, kept, values)
        return values
    if other and (other / "spec.json").exists() and _but_fleet(other / "spec.json") == _but_fleet(said):
        for f in finished_trials(other):  # the same trials, clocked on this fleet
            _write(study / f.relative_to(other), reclock(json.loads(f.read_text()), Path(plan.config["fleet"])))
        shutil.copy2(other / "summary.json", study / "summary.json")
        (study / "spec.json").write_text(said)
        values = json.loads((study / "summary.json").read_text())["best"]["values"]
        log.info("%s: the study in %s (a fleet of the same profiles) chose %s", plan.method, other, values)
    else:
        # a study of another spec (a grid grown by a value, say), committed or local, lends the trials whose runs
        # are the same (hetfl.tune.earlier_trial): only what is new trains
        earlier = tuple(p for p in (kept, *sorted(study.parent.glob("tune.replaced-*")))
                        if p and p.exists() and p.resolve() != study.resolve())
        try:
            values = tune(spec, study, final=False, earlier=earlier)["best"]["values"]
        except StudyMismatch:  # the preset changed since: that study is kept aside, and this one starts afresh
            k = 0
            while study.with_name(f"tune.replaced-{k}").exists():
                k += 1
            study.rename(study.with_name(f"tune.replaced-{k}"))
            values = tune(spec, study, final=False, earlier=(*earlier, study.with_name(f"tune.replaced-{k}")))["best"]["values"]
        if kept:
            (study / "spec.json").write_text(said)
    if kept:
        copy_files([study / "spec.json", study / "summary.json", *finished_trials(study)], study, kept)
    return values


def seed_config(plan: Plan, values: dict[str, Any], seed: int) -> dict[str, Any]:
    """The run config of `plan`'s final run at `seed` with the study's chosen `values`."""
    return {**plan.config, **values, "seed": seed, "checkpoint": True, "resume": True, "eval-split": "test-half"}


def run_plan(plan: Plan, preset: dict[str, Any], out: Path, seeds: list[int], keep: Path | None = None,
             reuse: Path | None = None) -> dict[str, Any]:
    """Tune `plan` once (seed 0, the preset's budget), then run the chosen values at every seed; finished runs are
    reused. Returns {"values": chosen values, "runs": {seed: metrics}}.

    With `keep` (a committed folder, e.g. under docs/results/), what finished is copied there as it finishes (the
    study's summary, its spec and its trials' metrics.json; each seed's metrics.json once it ran all its rounds,
    never checkpoints), and what is there is reused: a study whose spec is the same, a seed's run of the same config
    (finished_run judges it).

    With `reuse` (another fleet's kept comparison of this preset, its fleet of the same profiles), its study and its
    finished runs are this comparison's too, their clock recomputed (:func:`reclock`): nothing is trained twice."""
    from hetfl.common.results import NoClientSucceeded, copy_files
    from hetfl.inprocess import finished_run, run_in_process

    nodes = int(plan.config["min-available-nodes"])
    values = tuned_values(plan, preset, out, keep, reuse) if plan.space else {}
    runs, failed = {}, {}
    for seed in seeds:
        cfg = seed_config(plan, values, seed)
        # reused only if run to its end with this config: here (a run of another config is moved aside), else
        # committed in `keep`, else made on `reuse`'s fleet
        done = finished_run(out / plan.method / f"s{seed}", cfg) or _borrowed(plan, cfg, seed, out, keep, reuse)
        try:
            runs[seed] = done if done is not None else run_in_process(cfg, nodes, out / plan.method, f"s{seed}")
        except NoClientSucceeded as err:  # a diverged run: recorded, the comparison goes on
            failed[seed] = str(err).splitlines()[0]
        if keep and seed in runs:
            copy_files([out / plan.method / f"s{seed}" / "metrics.json"], out, keep)
    return {"values": values, "runs": runs, "failed": failed,
            "width": plan.config["width"] if plan.method in FIXED_WIDTH else None}


def _borrowed(plan: Plan, cfg: dict[str, Any], seed: int, out: Path, keep: Path | None,
              reuse: Path | None) -> dict[str, Any] | None:
    """`plan`'s run at `seed` finished with `cfg` in `keep` (copied as it is) or in `reuse` (clocked on this fleet,
    :func:`reclock`), written to `out` as this comparison's; None where neither has one (an old value's run, say)."""
    from hetfl.common.results import copy_files
    from hetfl.inprocess import same_config

    name = Path(plan.method) / f"s{seed}" / "metrics.json"
    for folder, clocked in ((keep, False), (reuse, True)):
        if folder is None or not (folder / name).exists():
            continue
        m = json.loads((folder / name).read_text())
        if clocked:
            m = reclock(m, Path(plan.config["fleet"]))
        if m["summary"].get("rounds_completed") == cfg["num-server-rounds"] and same_config(m, cfg):
            if clocked:
                _write(out / name, m)
            else:
                copy_files([folder / name], folder, out)
            return m
    return None


def _but_fleet(spec: Path | str) -> dict[str, Any]:
    """A study's spec (its spec.json, or that text) without the fleet: what its trials trained."""
    d = json.loads(spec.read_text() if isinstance(spec, Path) else spec)
    d["base"] = {k: v for k, v in d["base"].items() if k != "fleet"}
    return d


def table(results: dict[str, dict[str, Any]], skipped: dict[str, str]) -> tuple[str, dict[str, float]]:
    """The page's table (markdown) and the equal budgets: for each cost the least any method needed to finish every
    one of its seeds (its costliest seed), so the cheapest method is scored at all its seeds."""
    curves = {m: [curve(r["rounds"]) for r in res["runs"].values()] for m, res in results.items() if res["runs"]}
    budget = {k: min((max(c[k][-1] for c in cs) for cs in curves.values()), default=0.0) for k in COSTS}

    def pm(xs: list[float | None]) -> str:
        if any(x is None for x in xs):  # some seed had spent more than the budget before its first row
            return "—"
        return f"{100 * statistics.mean(xs):.2f} ± {100 * statistics.stdev(xs):.2f}" if len(xs) > 1 else \
            f"{100 * xs[0]:.2f}"

    from hetfl.methods import title

    lines = ["| method | model on the devices | tuned values | seeds | final accuracy (%) | at equal client bytes | at equal client FLOPs | "
             "at equal simulated time | client GB | client PFLOP | simulated hours |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for m, cs in curves.items():
        vals = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in results[m]["values"].items())
        at = [pm([accuracy_at(c, k, budget[k]) for c in cs]) for k in COSTS]
        spent = [statistics.mean(c[k][-1] for c in cs) for k in COSTS]
        width = results[m]["width"]
        model = f"width {width:g} on every device" if width is not None else "a submodel fitted to each device"
        lines.append(f"| {title(m)} | {model} | {vals or 'preset'} | {len(cs)} | {pm([c['accuracy'][-1] for c in cs])} | {' | '.join(at)} | "
                     f"{spent[0] / 1e9:.3g} | {spent[1] / 1e15:.3g} | {spent[2] / 3600:.3g} |")
    for m, why in skipped.items():
        lines.append(f"| {title(m)} | left out: {why} | | | | | | | | | |")
    for m, res in results.items():
        for seed, why in res.get("failed", {}).items():
            lines.append(f"| {title(m)} | seed {seed} stopped: {why} | | | | | | | | | |")
    return "\n".join(lines), budget


def plot(results: dict[str, dict[str, Any]], path: Path) -> None:
    """Pareto plots: test accuracy against each cumulative cost, one line per method (its seeds' mean)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from hetfl.methods import title

    fig, axes = plt.subplots(1, len(COSTS), figsize=(5 * len(COSTS), 4), sharey=True)
    for m, res in results.items():
        cs = [curve(r["rounds"]) for r in res["runs"].values()]
        if not cs:
            continue
        n = min(len(c["accuracy"]) for c in cs)
        acc = 100 * np.mean([c["accuracy"][:n] for c in cs], axis=0)
        for ax, k in zip(axes, COSTS, strict=True):
            x = np.mean([c[k][:n] for c in cs], axis=0)
            ax.plot(np.maximum(x, 1e-9), acc, marker=".", markersize=3, label=f"{title(m)} (mean over {len(cs)} seeds)")
    for ax, (k, label) in zip(axes, COSTS.items(), strict=True):
        ax.set_xscale("log")
        ax.set_xlabel(label + " (cumulative)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy (%)")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=3, frameon=False)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def compare(fleet_path: Path, preset_path: Path, out: Path, seeds: list[int], methods: list[str] | None = None,
            keep: Path | None = None, reuse: Path | None = None) -> dict[str, Any]:
    """Run (or reuse) the whole comparison and write ``out/summary.json``, ``out/table.md`` and ``out/pareto.png``
    of this call's runs; into `keep` the finished studies and runs (:func:`run_plan`) and the same three files of
    every run kept there (:func:`kept_runs`), so a call with some ``--methods`` or ``--seeds`` adds to them."""
    from hetfl.common.config import ConfigError
    from hetfl.methods import validate

    preset = load_preset(preset_path)
    chosen = [p for p in plans(fleet_path, preset, preset_path) if methods is None or p.method in methods]
    for p in chosen:  # every config checked before any run starts (one line)
        try:
            validate({**p.config, "seed": seeds[0]})
        except ConfigError as err:
            raise CompareError(f"{preset_path}: [method.{p.method}]: {err}") from None
    skipped = {p.method: p.skipped for p in chosen if p.skipped}
    if reuse is not None:  # its fleets checked before anything runs
        if not reuse.is_dir():
            raise CompareError(f"--reuse {reuse}: no such folder; expected a kept comparison (--keep) of this preset")
        for ran_on in sorted({json.loads(f.read_text())["config"]["fleet"] for f in reuse.glob("*/s*/metrics.json")}):
            same_profiles(ran_on, fleet_path, f"--reuse {reuse}: its runs")
    results = {p.method: run_plan(p, preset, out, seeds, keep, reuse) for p in chosen if not p.skipped}
    summary = write_comparison(out, fleet_path, preset_path, preset, results, skipped)
    if keep:  # the kept folder's table, plot and summary cover every run kept there, not only this call's
        failed = {m: r["failed"] for m, r in results.items() if r["failed"]}
        write_comparison(keep, fleet_path, preset_path, preset, *kept_runs(keep, fleet_path, preset_path), failed)
    return summary


def write_comparison(folder: Path, fleet_path: Path, preset_path: Path, preset: dict[str, Any],
                      results: dict[str, dict[str, Any]], skipped: dict[str, str],
                      failed: dict[str, dict[int, str]] | None = None) -> dict[str, Any]:
    """``table.md``, ``pareto.png`` and ``summary.json`` of `results` in `folder`."""
    text, budget = table(results, skipped)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "table.md").write_text(text + "\n")
    plot(results, folder / "pareto.png")
    failed = failed if failed is not None else {m: r["failed"] for m, r in results.items() if r["failed"]}
    summary = {"fleet": str(fleet_path), "preset": str(preset_path),
               "seeds": sorted({s for r in results.values() for s in r["runs"]}), "budget": budget,
               "tune": preset["tune"], "skipped": skipped, "failed": failed,
               "methods": {m: {"values": r["values"],
                               "final_accuracy": {str(s): run["summary"]["final_accuracy"] for s, run in r["runs"].items()}}
                           for m, r in results.items()}}
    (folder / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def kept_runs(folder: Path, fleet_path: Path, preset_path: Path) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Every finished run kept in `folder` (a ``--keep`` folder, whatever calls made it) of the config the kept study
    now chooses, as :func:`table` takes them, and the methods left out with why (a method without a kept study and
    run of that config: "not committed yet"). A run of other values (a study since grown and choosing anew) is not
    this comparison's and is left out. The fleet is the folder's, not compared: a kept run names the absolute path
    of the fleet it trained on (the other fleet's, for runs taken with ``--reuse``), and a clone lives elsewhere."""
    from hetfl.inprocess import same_config

    results, skipped, missing = {}, {}, []
    for plan in plans(fleet_path, load_preset(preset_path), preset_path):
        if plan.skipped:
            skipped[plan.method] = plan.skipped
            continue
        tune = folder / plan.method / "tune" / "summary.json"
        values = json.loads(tune.read_text())["best"]["values"] if tune.exists() else None
        runs = {}
        for f in sorted((folder / plan.method).glob("s[0-9]*/metrics.json")) if values is not None else []:
            m, seed = json.loads(f.read_text()), int(f.parent.name[1:])
            if (m["summary"].get("rounds_completed") == m["config"]["num-server-rounds"]
                    and same_config(m, {k: v for k, v in seed_config(plan, values, seed).items() if k != "fleet"})):
                runs[seed] = m
        if runs:
            results[plan.method] = {"values": values, "runs": runs, "failed": {},
                                    "width": plan.config["width"] if plan.method in FIXED_WIDTH else None}
        else:
            missing.append(plan.method)
    return results, {**skipped, **{m: "not committed yet" for m in missing}}


def _parser(prog: str = "python -m hetfl.compare") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="docs/compare.md. Example: python -m hetfl.compare fleets/aiot-wifi.toml "
                                       "comparisons/fmnist-dir0.6.toml --seeds 0 1 2")
    p.add_argument("fleet", help="a fleet file (fleets/*.toml: tiers with share, device profile, speed, bandwidth)")
    p.add_argument("preset", help="a comparison preset (comparisons/*.toml: [run], [tune], [widths], [method.*])")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds of the final runs (default: 0)")
    p.add_argument("--methods", nargs="+", choices=METHODS, help="compare only these (default: every [method.*])")
    p.add_argument("--out", help="results directory (default: results/compare/<fleet>-<preset>)")
    p.add_argument("--keep", help="a folder to commit (e.g. docs/results/compare/<fleet>-<preset>): finished studies' "
                   "summaries and runs' metrics.json are copied there as they finish, and reused from there")
    p.add_argument("--reuse", help="another fleet's kept comparison of this preset (its --keep folder), the fleets "
                   "differing only in flops-per-s and bandwidths: its studies and finished runs are reused, their "
                   "simulated clock recomputed for this fleet")
    return p


def main(argv: list[str] | None = None, prog: str = "python -m hetfl.compare") -> int:
    from hetfl.common.fleet import FleetError
    from hetfl.common.task import setup_logging

    a = _parser(prog).parse_args(argv)
    fleet, preset = Path(a.fleet), Path(a.preset)
    out = Path(a.out) if a.out else Path("results/compare") / f"{fleet.stem}-{preset.stem}"
    setup_logging()
    try:
        summary = compare(fleet, preset, out, a.seeds, a.methods, Path(a.keep) if a.keep else None,
                          Path(a.reuse) if a.reuse else None)
    except (CompareError, FleetError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print((out / "table.md").read_text())
    print(f"equal budgets: {', '.join(f'{k} {v:.4g}' for k, v in summary['budget'].items())}")
    print(f"wrote {out / 'summary.json'}, {out / 'table.md'}, {out / 'pareto.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
