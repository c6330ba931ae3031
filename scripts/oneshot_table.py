"""FENS Table 1 (FENS vs one-shot FL) from finished runs: per Dirichlet alpha, every method's test accuracy (mean ±
std over the seeds present), the client bytes it needs and its server time; and accuracy against client MB.

    python scripts/oneshot_table.py --name fens-table1-fmnist --alphas 0.01 0.05 0.1 --seeds 0 1 2 \\
        --runs 'results/reproduce/oneshot-fmnist-dir{alpha}/runs' 'docs/results/fens-fmnist-dir{alpha}/runs'

Reads ``<dir>/<run>/metrics.json`` of every directory (``{alpha}`` filled in; a run found twice is taken from the
first directory). A FENS run gives five rows on the same local models: one-shot FedAvg, FedENS, weighted averaging and
voting (its static aggregators) and FENS; every other method (FedKD, Fed-ET, Co-Boosting, ...) one row. Beside a
row: the seeds when some are missing, each run-config value that differs from the method's preset (``--presets``,
e.g. ``--set fedkd-epochs=50``), how many runs started from a reused phase 1, and which seeds ran on a GPU (through
``scripts/reproduce.py --engine inprocess``); server-step times are averaged per device (CPU and GPU apart). Writes
results/reproduce/<name>/{table.md,table.json,accuracy-vs-mb.png} (docs/readings.md#oneshot).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fmt import mean_std  # noqa: E402

from hetfl.methods import SCHEMA, validate  # noqa: E402
from hetfl.common.results import load_metrics  # noqa: E402
from hetfl.common.oneshot.artifacts import PHASE1_KEYS  # noqa: E402

# FENS Table 1's order; a method not listed here (a new one-shot baseline) follows them under its own name
LABELS = {"oneshot-fedavg": "one-shot FedAvg", "average": "FedENS", "weighted-average": "weighted averaging",
          "voting": "voting", "fedkd": "FedKD", "fedet": "Fed-ET", "fedcvae": "FedCVAE-Ens", "coboost": "Co-Boosting",
          "fens": "FENS"}
STATIC = ("oneshot-fedavg", "average", "weighted-average", "voting")  # reported by every FENS run
NOT_NOTED = {"seed", "dirichlet-alpha", "oneshot-reuse", "fens-reuse", "run-name", "results-dir", "resume"}
# what a static row depends on besides phase 1: FENS's split and the INT8 ensemble it is evaluated on
STATIC_KEYS = ("fens-local-fraction", "fens-diff-init", "fens-quantize")


@dataclass
class Row:
    """One method at one alpha: per-run values in seed order."""

    key: str  # LABELS key: a method name or a FENS static aggregator
    seeds: list[int] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)  # percent
    client_mb: list[float] = field(default_factory=list)  # up + down, MB
    server_s: list[float | None] = field(default_factory=list)
    configs: list[dict[str, Any]] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)  # where each run trained: "CPU" or the GPU's short name
    engines: list[str] = field(default_factory=list)  # "" = Flower's Simulation Engine, else the run's `engine`
    reused: int = 0  # runs whose phase 1 came from another run

    @property
    def label(self) -> str:
        return LABELS.get(self.key, self.key)

    def add(self, seed: int, accuracy: float, mb: float, server_s: float | None, cfg: dict, reused: bool,
            run: dict | None = None) -> None:
        self.devices.append(device(run or {}))
        self.engines.append((run or {}).get("engine", ""))
        self.seeds.append(seed)
        self.accuracy.append(100 * accuracy)
        self.client_mb.append(mb)
        self.server_s.append(server_s)
        self.configs.append(cfg)
        self.reused += bool(reused)


def device(run: dict) -> str:
    """Where a run trained: "CPU", or a GPU when its `torch-device` asked for CUDA or was "auto" on a machine that
    had one: the GPU's short name ("H100") where the run recorded it (the in-process engine does,
    docs/methods.md), else "GPU"."""
    dev = str(run.get("config", {}).get("torch-device", "cpu"))
    machines = run.get("machines", [])
    gpu = next((m["cuda_device"] for m in reversed(machines) if m.get("cuda_device")), None)
    on_gpu = dev.startswith("cuda") or (dev == "auto" and (gpu or any(m.get("cuda_devices") for m in machines)))
    if not on_gpu:
        return "CPU"
    return gpu.replace("NVIDIA ", "").split()[0] if gpu else "GPU"


def client_mb(run: dict) -> float:
    """Everything the run's clients sent and received (summary totals, MB): phase 1, and FENS's ensemble download and
    aggregator rounds. A run that reused a phase 1 carries the bytes measured by the run that trained it."""
    s = run["summary"]
    return (s["total_bytes_down"] + s["total_bytes_up"]) / 1e6


def static_mb(run: dict, name: str) -> float:
    """What a static aggregator's clients need from a FENS run: the initial model down and the local model up
    (phase 1), and for voting their confusion counts up; not the ensemble download or FENS's rounds (MB)."""
    ph = run["phases"]
    return (ph["phase1_request_bytes"] + ph["upload_bytes"] + (ph.get("confusion_upload_bytes", 0) if name == "voting" else 0)) / 1e6


def server_seconds(run: dict) -> float | None:
    """The server's work after phase 1: a one-shot method's server step (``phases.server_step_s``, without its
    per-epoch evaluation), FENS's aggregator rounds (wall time of rounds 1..R, clients' steps included); None for a
    run recorded before the server step was timed."""
    if run["config"]["method"] == "fens":
        return sum(r["round_s"] for r in run["rounds"] if r["round"] > 0)
    return run.get("phases", {}).get("server_step_s")


def one_shot(run: dict) -> bool:
    """A run of a one-shot method: its clients uploaded once (``phases.upload_bytes``: FENS and the baselines on its
    phase 1); iterative runs (FedAdam, ...) are not in Table 1."""
    return "upload_bytes" in run.get("phases", {})


def reused_phase1(run: dict) -> bool:
    """Whether the run started from another run's phase 1 (``phase1_reused_from`` naming another run's ensemble). A
    resumed FENS run recorded before resumes stopped setting it names its own directory: that is no reuse."""
    source = run.get("phase1_reused_from")
    if not source:
        return False
    cfg = run["config"]
    return not (cfg.get("resume") and Path(source).parent.name == cfg.get("run-name"))


def collect(runs: list[dict], alpha: float, seeds: list[int]) -> dict[str, Row]:
    """The rows of one alpha from metrics.json contents (runs of other alphas or seeds, and iterative runs, are
    skipped)."""
    rows: dict[str, Row] = {}
    for run in sorted(runs, key=lambda r: r["config"]["seed"]):
        cfg = run["config"]
        if float(cfg.get("dirichlet-alpha", -1)) != alpha or cfg["seed"] not in seeds or not one_shot(run):
            continue
        method, seed, reused = cfg["method"], cfg["seed"], reused_phase1(run)
        if method == "fens":
            for name in STATIC:
                acc = run.get("static_aggregators_test_accuracy", {}).get(name)
                if acc is not None:
                    rows.setdefault(name, Row(name)).add(seed, acc, static_mb(run, name), None, cfg, reused, run)
        rows.setdefault(method, Row(method)).add(seed, run["summary"]["final_accuracy"], client_mb(run),
                                                 server_seconds(run), cfg, reused, run)
    return rows


def noted_keys(key: str) -> tuple[str, ...]:
    """The run-config keys whose values a row shows when they differ from the preset: phase 1's, and the method's
    own (FENS: also its rounds); a static aggregator's: phase 1's and FENS's split and quantization."""
    if key in STATIC:
        return (*PHASE1_KEYS, *STATIC_KEYS)
    own = tuple(k for k, spec in SCHEMA.items() if key in spec.methods)
    return (*PHASE1_KEYS, *own, *(("num-server-rounds",) if key == "fens" else ()))


def notes(row: Row, wanted_seeds: list[int], reference: dict[str, Any] | None) -> str:
    """What the reader must know beside a row: missing seeds, values that differ from the preset, reused phase 1."""
    out = []
    if row.seeds != sorted(wanted_seeds):
        out.append(f"seed{'s' if len(row.seeds) > 1 else ''} {', '.join(map(str, row.seeds))} only")
    if reference is not None:
        for k in noted_keys(row.key):
            if k in NOT_NOTED or k not in reference:
                continue
            differ = [(s, c[k]) for s, c in zip(row.seeds, row.configs, strict=True) if k in c and c[k] != reference[k]]
            for value in dict.fromkeys(v for _, v in differ):
                which = [s for s, v in differ if v == value]
                scope = "" if len(which) == len(row.seeds) else f" (seed{'s' if len(which) > 1 else ''} {', '.join(map(str, which))})"
                out.append(f"{k} = {value}{scope} (preset: {reference[k]})")
    if row.reused:
        out.append(f"phase 1 reused in {row.reused} of {len(row.seeds)} runs (its bytes and time counted)")
    for dev in dict.fromkeys(d for d in row.devices if d != "CPU"):
        which = [s for s, d in zip(row.seeds, row.devices, strict=True) if d == dev]
        inproc = any(e for d, e in zip(row.devices, row.engines, strict=True) if d == dev)
        out.append(f"seed{'s' if len(which) > 1 else ''} {', '.join(map(str, which))} on one {dev}"
                   + (" (in-process engine)" if inproc else ""))
    return "; ".join(out)


def order(rows: dict[str, Row], expected: list[str]) -> list[Row]:
    """Rows in Table 1's order; expected methods without runs as empty rows."""
    for m in expected:
        rows.setdefault(m, Row(m))
    known = [k for k in LABELS if k in rows]
    return [rows[k] for k in known + sorted(set(rows) - set(known))]


def cell(xs: list[float | None], devices: list[str] | None = None) -> str:
    """Mean ± std of the timed runs, one group per device (a GPU's seconds are not a CPU's): "3,098 (CPU); 80 ± 4
    (H100)"; the device is named unless every run was on the CPU."""
    devices = devices or ["CPU"] * len(xs)
    groups: dict[str, list[float | None]] = {}
    for x, d in zip(xs, devices, strict=True):
        groups.setdefault(d, []).append(x)
    parts = []
    for d, group in groups.items():
        have = [x for x in group if x is not None]
        if not have:
            continue
        parts.append(mean_std(have) + (f" ({len(have)} of {len(group)})" if len(have) < len(group) else "")
                     + ("" if set(groups) == {"CPU"} else f" ({d})"))
    return "; ".join(parts) or "n/a"


def table(sections: dict[float, list[Row]], seeds: list[int], references: dict[tuple[float, str], dict | None]) -> str:
    """The markdown of Table 1: one section per alpha."""
    lines = [f"FENS Table 1 (FENS vs one-shot FL): test accuracy, mean ± std over seeds {', '.join(map(str, seeds))} "
             "(those present).", "",
             "Client MB: everything a client of the method sends and receives (up + down, summed over clients): phase 1 "
             "(initial model down, local model up; FedCVAE-Ens: a request down, the CVAE's decoder up); FENS adds the "
             "INT8 ensemble download and its "
             "aggregator rounds; voting its confusion counts. A run that started from a reused phase 1 counts the bytes "
             "measured by the run that trained it. Server step: the one-shot methods' server work after phase 1 "
             "(distillation, synthesis), without the per-epoch evaluation; for FENS the wall time of its aggregator "
             "rounds (clients' steps included); static aggregators and one-shot FedAvg take under a second and are not "
             "timed. FedKD, Fed-ET and the FENS rows are scored on the same test half; one-shot FedAvg, FedENS, "
             "weighted averaging and voting are FENS's local models (90% of each client's data, INT8 for the "
             "aggregators) as every FENS run reports them."]
    for alpha, rows in sections.items():
        lines += ["", f"## Dir({alpha})", "", "| method | accuracy (%) | seeds | client MB | server step (s) | notes |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            if not r.seeds:
                lines.append(f"| {r.label} | not run | 0 | | | |")
                continue
            lines.append(f"| {r.label} | {mean_std(r.accuracy)} | {len(r.seeds)} | {mean_std(r.client_mb)} | "
                         f"{cell(r.server_s, r.devices)} | {notes(r, seeds, references.get((alpha, r.key)))} |")
    return "\n".join(lines) + "\n"


def plot(sections: dict[float, list[Row]], path: Path, title: str) -> Path:
    """Accuracy (mean ± sample std over seeds) against client MB (log x), one panel per alpha; one legend below the
    panels with each method's number of seeds. Methods at the same traffic (the 276 MB of one upload) are spread a
    little sideways so that their markers and error bars do not cover one another."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(sections), figsize=(5.2 * len(sections), 5), squeeze=False, layout="constrained")
    markers = "osD^v<>pX*h"
    handles = {}
    for ax, (alpha, rows) in zip(axes[0], sections.items(), strict=True):
        for i, r in enumerate(rows):  # a method keeps its marker and colour in every panel, run or not
            if not r.seeds:
                continue
            mb = statistics.mean(r.client_mb)
            same = [j for j, o in enumerate(rows) if o.seeds and abs(statistics.mean(o.client_mb) / mb - 1) < 0.05]
            shift = 1.07 ** (same.index(i) - (len(same) - 1) / 2)  # dodge within a group at one traffic
            n = len(r.seeds)
            handles[r.label] = ax.errorbar(mb * shift, statistics.mean(r.accuracy),
                                           yerr=statistics.stdev(r.accuracy) if n > 1 else 0.0, fmt=markers[i % len(markers)],
                                           color=f"C{i % 10}", capsize=3, ms=7,
                                           label=f"{r.label} (n={n})" + (", no error bar" if n == 1 else ""))
        ax.set_xscale("log")
        ax.margins(x=0.15)
        ax.set_xlabel("client MB (up + down, all clients)")
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(f"Dir({alpha})")
        ax.grid(alpha=0.3, which="both")
    fig.legend(list(handles.values()), [h.get_label() for h in handles.values()], loc="outside lower center",
               ncol=min(5, len(handles)), fontsize=9, frameon=False,
               title="marker: mean, error bar: ± 1 sample std over the method's n seeds; "
                     "methods at the same traffic are drawn slightly apart", title_fontsize=9)
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def load_runs(dirs: list[Path]) -> list[dict]:
    """Every ``<dir>/<run>/metrics.json``; a run name found in several directories is read from the first."""
    seen, out = set(), []
    for d in dirs:
        for m in sorted(d.glob("*/metrics.json")) if d.is_dir() else []:
            if m.parent.name not in seen:
                seen.add(m.parent.name)
                out.append(load_metrics(m, SCHEMA))
    return out


def reference(preset: Path) -> dict | None:
    """A preset's whole config (defaults filled in), or None when there is no such preset."""
    return validate(tomllib.loads(preset.read_text())) if preset.is_file() else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", required=True)
    p.add_argument("--alphas", nargs="+", type=float, required=True)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--runs", nargs="+", required=True, metavar="DIR", help="run directories; {alpha} is filled in")
    p.add_argument("--presets", default="configs/{method}/fmnist-dir{alpha}.toml",
                   help="each method's preset ({method}, {alpha}): values that differ from it are shown beside a row")
    p.add_argument("--methods", nargs="*", default=["fedkd", "fedet", "fedcvae", "coboost", "fens"],
                   help="methods listed even without runs ('not run')")
    p.add_argument("--out", type=Path, default=Path("results/reproduce"))
    a = p.parse_args(argv)
    sections, refs, data = {}, {}, {}
    for alpha in a.alphas:
        runs = load_runs([Path(d.format(alpha=alpha)) for d in a.runs])
        rows = order(collect(runs, alpha, a.seeds), [*a.methods, *(STATIC if "fens" in a.methods else ())])
        sections[alpha] = rows
        for r in rows:
            method = "fens" if r.key in STATIC else r.key
            refs[(alpha, r.key)] = reference(Path(a.presets.format(method=method, alpha=alpha)))
        data[str(alpha)] = [{"method": r.label, "seeds": r.seeds, "accuracy": r.accuracy, "client_mb": r.client_mb,
                             "server_s": r.server_s, "devices": r.devices, "notes": notes(r, a.seeds, refs[(alpha, r.key)]) if r.seeds else ""}
                            for r in rows]
    out = a.out / a.name
    out.mkdir(parents=True, exist_ok=True)
    text = table(sections, a.seeds, refs)
    (out / "table.md").write_text(text)
    (out / "table.json").write_text(json.dumps(data, indent=2))
    png = plot(sections, out / "accuracy-vs-mb.png", f"{a.name}: FENS vs one-shot FL, test accuracy against client traffic")
    print(text)
    print(f"table: {out / 'table.md'}\nplot:  {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
