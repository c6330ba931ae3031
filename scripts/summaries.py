"""The summary table at the top of each results page, computed from the runs committed under docs/results/ (one
source for the numbers; a test fails when a page's table drifts from the runs).

    python scripts/summaries.py           # rewrite the tables between the markers of every page in PAGES (seconds)
    python scripts/summaries.py --check   # exit 1 if a page's table differs from what the runs give

A page's table sits between ``<!-- summary: scripts/summaries.py -->`` and ``<!-- end summary -->``, right under
its title: one line with the setting, then the answer (final or late-round accuracy, rounds to 80%, traffic).
Numbers are rounded as in the page's own tables: accuracy in % with two decimals, mean ± sample std over the seeds
(one seed: the value alone), traffic in MB.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RES = ROOT / "docs/results"
BEGIN, END = "<!-- summary: scripts/summaries.py -->", "<!-- end summary -->"


def runs(page_dir: str, prefix: str, seeds: list[int] | None = None) -> list[dict]:
    """The committed runs ``<page_dir>/runs/<prefix>-s<seed>/metrics.json``, in seed order."""
    from hetfl.common.results import load_metrics
    from hetfl.methods import SCHEMA

    out = []
    for m in sorted((RES / page_dir / "runs").glob(f"{prefix}-s*/metrics.json")):
        seed = re.fullmatch(re.escape(prefix) + r"-s(\d+)", m.parent.name)
        if seed and (seeds is None or int(seed.group(1)) in seeds):
            out.append((int(seed.group(1)), load_metrics(m, SCHEMA)))
    if not out:
        raise FileNotFoundError(f"no committed runs {RES / page_dir / 'runs' / prefix}-s*/metrics.json")
    return [r for _, r in sorted(out, key=lambda x: x[0])]


def pm(xs: list[float], nd: int = 2) -> str:
    """mean ± sample std; one value, or values equal at this precision, alone."""
    if len(xs) == 1 or max(xs) - min(xs) < 0.5 * 10 ** -nd:
        return f"{statistics.mean(xs):.{nd}f}"
    return f"{statistics.mean(xs):.{nd}f} ± {statistics.stdev(xs):.{nd}f}"


def mb(xs: list[float]) -> str:
    """Traffic in MB: thousands separated, one decimal under 100 MB; ± std only where the runs differ."""
    m = statistics.mean(xs)
    nd = 1 if m < 100 else 0
    if len(xs) == 1 or max(xs) - min(xs) < 0.5:
        return f"{m:,.{nd}f}"
    return f"{m:,.{nd}f} ± {statistics.stdev(xs):,.{nd}f}"


def final(rs: list[dict]) -> list[float]:
    return [100 * r["summary"]["final_accuracy"] for r in rs]


def best(rs: list[dict]) -> list[float]:
    return [100 * r["summary"]["best_accuracy"] for r in rs]


def last5(rs: list[dict], column: str = "accuracy") -> list[float]:
    """Per run, the mean test accuracy over its last five rounds (%)."""
    return [100 * statistics.mean(x[column] for x in r["rounds"][-5:]) for r in rs]


def traffic(rs: list[dict]) -> list[float]:
    return [(r["summary"]["total_bytes_down"] + r["summary"]["total_bytes_up"]) / 1e6 for r in rs]


def upload_per_round(rs: list[dict]) -> list[float]:
    return [r["summary"]["total_bytes_up"] / 1e6 / r["summary"]["rounds_completed"] for r in rs]


def first_round(r: dict, level: float = 0.8) -> int | None:
    return next((x["round"] for x in r["rounds"] if x["round"] > 0 and x["accuracy"] is not None
                 and x["accuracy"] >= level), None)


def round_to(rs: list[dict], level: float = 0.8, within: str = "") -> str:
    """The first round at or above `level`: mean ± std with the per-seed rounds, or which seeds never got there."""
    got = [first_round(r, level) for r in rs]
    seeds = [r["config"]["seed"] for r in rs]
    if all(g is None for g in got):
        return f"never{within}" if len(rs) == 1 else f"never{within} (at any seed)"
    if len(rs) == 1:
        return str(got[0])
    if all(g is not None for g in got):
        return f"{statistics.mean(got):.1f} ± {statistics.stdev(got):.1f} ({' / '.join(map(str, got))})"
    reached = "; ".join(f"seed {s}: round {g}" for s, g in zip(seeds, got, strict=True) if g is not None)
    never = ", ".join(str(s) for s, g in zip(seeds, got, strict=True) if g is None)
    return f"never at seed{'s' if ',' in never else ''} {never}{within} ({reached})"


def table(head: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows])


def seeds_of(rs: list[dict]) -> str:
    s = [r["config"]["seed"] for r in rs]
    return str(s[0]) if len(s) == 1 else f"{len(s)} ({', '.join(map(str, s))})"


# ---- the pages ----------------------------------------------------------------------------------------------------
SHEFL_METHODS = (("SHEFL", "shefl"), ("Fed-Ensemble", "fedensemble"), ("FedAvg", "fedavg"), ("FedProx (mu 0.01)", "fedprox"),
                 ("FedBE (S = 5)", "fedbe"))


def shefl_r30() -> str:
    rows = []
    for name, m in SHEFL_METHODS:
        d, p = runs("shefl-fmnist-dir0.6-r30", f"{m}-fmnist-dir0.6"), runs("shefl-fmnist-path4-r30", f"{m}-fmnist-path4")
        rows.append([name, pm(last5(d)), round_to(d), pm(last5(p)), round_to(p), mb(traffic(d)), str(len(d))])
    return "\n".join([
        "FMNIST, 100 clients (10 a round), CNN, 10 local epochs, 30 rounds; test accuracy (%) of the ensemble (SHEFL, "
        "Fed-Ensemble) or the global model; mean ± std over seeds 0-2, per-seed rounds in brackets.", "",
        table(["method", "Dir(0.6): mean of rounds 26-30", "Dir(0.6): round to 80%", "4 shards: mean of rounds 26-30",
               "4 shards: round to 80%", "client traffic, 30 rounds (MB)", "seeds"], rows)])


STRAGGLER = (("SHEFL, constrained LPCs", "shefl-fmnist-dir0.6-straggler-r30", "shefl-fmnist-dir0.6-straggler"),
             ("restricted Fed-Ensemble", "shefl-fmnist-dir0.6-straggler-r30", "fedensemble-fmnist-dir0.6-straggler"),
             ("FedAvg (LPC work)", "shefl-fmnist-dir0.6-straggler-r30", "fedavg-fmnist-dir0.6-lpcwork"),
             ("FedAvg (HPC)", "shefl-fmnist-dir0.6-r30", "fedavg-fmnist-dir0.6"),
             ("FedEns (HPC)", "shefl-fmnist-dir0.6-r30", "fedensemble-fmnist-dir0.6"),
             ("*for reference:* SHEFL, every client 10 epochs", "shefl-fmnist-dir0.6-r30", "shefl-fmnist-dir0.6"))


def _work(xs: list[float]) -> str:
    return f"{xs[0]:g}" if len(set(xs)) == 1 else f"{statistics.mean(xs):.1f} ± {statistics.stdev(xs):.1f}"


def straggler() -> str:
    sys.path.insert(0, str(ROOT / "scripts"))
    from reproduce import local_work

    rows = []
    for name, page, prefix in STRAGGLER:
        rs = runs(page, prefix)
        work = [local_work(r) for r in rs]
        rows.append([name, pm(last5(rs)), round_to(rs), _work([w[0] for w in work]), str(max(w[1] for w in work)),
                     pm(upload_per_round(rs))])
    return "\n".join([
        "FMNIST Dir(0.6), 100 clients (10 a round), 30 rounds; HPCs 10 local epochs, LPCs 1 (the paper's Fig. 7 on "
        "Fashion-MNIST); test accuracy (%), mean ± std over seeds 0-2.", "",
        table(["row", "mean of rounds 26-30 (%)", "round to 80%", "local work per round (model-epochs)",
               "most by one client in a round", "upload MB/round"], rows)])


def ratio() -> str:
    rows = []
    for k in ("0.1", "0.02"):
        for r in (1, 3, 5):
            rs = runs("shefl-fmnist-dir0.1-ratio-r30", f"shefl-fmnist-dir0.1-r{r}-k{k}")
            rows.append([f"1:{r}, k = {k}", pm(last5(rs)), pm(final(rs)), round_to(rs, within=" in 30"),
                         pm(upload_per_round(rs))])
    return "\n".join([
        "SHEFL on FMNIST Dir(0.1), 100 clients (5 HPCs + 5 LPCs a round), M = 5, 10 local epochs, 30 rounds, seed 0; "
        "LPC:HPC resource ratio and top-k density k varied (ICASSP Table 1b's cells).", "",
        table(["cell (ratio, k)", "mean of rounds 26-30 (%)", "round 30 (%)", "round to 80%", "upload MB/round"], rows)])


CALIBRATION = (("10 steps (literal)", "local-steps10"), ("1 epoch", "local-steps0-local-epochs1"),
               ("5 epochs", "local-steps0-local-epochs5"), ("10 epochs (kept)", "local-steps0-local-epochs10"))


def calibration() -> str:
    rows = []
    for name, suffix in CALIBRATION:
        r = runs("shefl-calibration-fmnist-dir0.6", f"fedavg-fmnist-dir0.6-literal-{suffix}")
        rows.append([name, f"{100 * r[0]['rounds'][-1]['accuracy']:.1f}", f"{best(r)[0]:.1f}",
                     round_to(r, within=" in 10")])
    return "\n".join([
        "FedAvg on FMNIST Dir(0.6), 100 clients (10 a round), CNN, batch 16, SGD lr 0.01, 10 rounds, seed 0; the "
        "local work per round varied. Paper's FedAvg: 80% at round 5.4.", "",
        table(["local work per round", "accuracy after round 10 (%)", "best, rounds 1-10 (%)", "round to 80%"], rows)])


def fens() -> str:
    sys.path.insert(0, str(ROOT / "scripts"))
    import oneshot_table
    from reproduce import passes_fens

    alphas = ("0.01", "0.05", "0.1")
    table1 = {}
    for a in alphas:
        found = oneshot_table.load_runs([RES / f"oneshot-fmnist-dir{a}/runs", RES / f"fens-fmnist-dir{a}/runs"])
        table1[a] = oneshot_table.collect(found, float(a), [0, 1, 2])
    rows = []
    for key, name in (("fens", "FENS (one shot with 5-epoch members + 500 aggregator rounds, as preset; the authors train members to completion)"),
                      ("fedcvae", "FedCVAE-Ens (best one-shot baseline)"), ("coboost", "Co-Boosting"),
                      ("weighted-average", "weighted averaging of FENS's members (a static rule)")):
        rs = [table1[a][key] for a in alphas]
        rows.append([name, *(f"{pm(r.accuracy)} ({len(r.seeds)})" for r in rs), mb([x for r in rs for x in r.client_mb])])
    adam = [runs(f"fens-fmnist-dir{a}", f"fedadam-fmnist-dir{a}") for a in alphas]
    rows.append(["FedAdam, iterative (client lr 0.01, 50 rounds, seed 0)", *(f"{pm(final(r))} (1)" for r in adam),
                 mb([x for r in adam for x in traffic(r)])])
    import fens_runs  # FENS at its best and the tuned baselines (fens-fair.md), committed

    best = [[json.loads(f.read_text()) for seed in fens_runs.SEEDS
             if (f := (fens_runs.complete_runs(fens_runs.DOCS / f"dir{a}", seed) or [None])[-1])] for a in alphas]
    rows.append(["FENS at its best: members to completion, aggregator tuned ([fens-fair.md](fens-fair.md))",
                 *(f"{pm(final(r))} ({len(r)})" if r else "not run" for r in best), mb([x for r in best for x in traffic(r)])])
    tuned = [fens_runs.tuned_iterative_run(a, "fedadam") for a in alphas]
    tuned_runs = [[json.loads(t[1].read_text())] if t else [] for t in tuned]
    rows.append(["FedAdam at its tuned lr (" + " / ".join(t[0] if t else "—" for t in tuned) + "; 50 rounds, seed 0)",
                 *(f"{pm(final(r))} (1)" if r else "not run" for r in tuned_runs),
                 mb([x for r in tuned_runs for x in traffic(r)])])
    cross = []
    for a, r in zip(alphas, adam, strict=True):
        c = passes_fens("fens", runs(f"fens-fmnist-dir{a}", f"fens-fmnist-dir{a}", [0]), "fedadam", r)[0]
        cross.append(f"round {c['passes_at_round']}, {c['passes_at_mb']:,.0f} MB ({c['passes_at_mb'] / c['fens_comm_mb']:.1f}x)"
                     if c["passes_at_round"] else "never")
    rows.append(["FedAdam (lr 0.01) passes FENS's seed-0 accuracy at", *cross, ""])
    return "\n".join([
        "FMNIST, 20 clients, Dirichlet partitions drawn as the FENS authors draw them, CNN; test accuracy (%) on the "
        "test half after the last round, mean ± std over the seeds in brackets; client traffic up + down, all clients.",
        "", table(["method", "Dir(0.01)", "Dir(0.05)", "Dir(0.1)", "client traffic (MB)"], rows)])


def fens_v1() -> str:
    rows = []
    for name, key in (("FENS (NN aggregator, 100 rounds)", "fens"), ("FedENS (averaging)", "average"),
                      ("weighted averaging", "weighted-average"), ("one-shot FedAvg", "oneshot-fedavg")):
        cells = []
        for a in ("0.01", "0.05", "0.1"):
            rs = runs(f"fens-fmnist-v1-dir{a}", f"fens-fmnist-dir{a}")
            acc = final(rs) if key == "fens" else [100 * r["static_aggregators_test_accuracy"][key] for r in rs]
            cells.append(pm(acc))
        rows.append([name, *cells])
    rows.append(["FedAdam, 4 rounds x 2 local epochs", *(pm(final(runs(f"fens-fmnist-v1-dir{a}",
                 f"fedadam-fmnist-dir{a}-num-server-rounds4"))) for a in ("0.01", "0.05", "0.1"))])
    return "\n".join([
        "FMNIST, 20 clients, flwr-datasets' Dirichlet partitioner, CNN, 5 local epochs, Flower's FedAdam for FENS's "
        "aggregator; test accuracy (%) after the last round, mean ± std over seeds 0-2.", "",
        table(["method", "Dir(0.01)", "Dir(0.05)", "Dir(0.1)"], rows)])


AFL = (("AdaptiveFL (RL)", "adaptivefl"), ("HeteroFL", "heterofl"), ("ScaleFL", "scalefl"), ("All-Large", "all-large"),
       ("Decoupled", "decoupled"))


def adaptivefl() -> str:
    sys.path.insert(0, str(ROOT / "scripts"))
    from reproduce import authors_pick

    rows = []
    for name, m in AFL:
        rs = runs("adaptivefl-fmnist-dir0.6-r30", f"{m}-fmnist-dir0.6")
        picks = [authors_pick(r) for r in rs]
        waste = [100 * r["rounds"][-1]["cum_waste_rate"] for r in rs]
        d3 = runs("adaptivefl-fmnist-dir0.3-r30", f"{m}-fmnist-dir0.3")
        rows.append([name, pm([100 * r["rounds"][-1]["acc_L1"] for r in rs]), pm([100 * x["acc_L1"] for x in picks]),
                     pm([100 * r["rounds"][-1]["acc_avg"] for r in rs]), "0" if not any(waste) else pm(waste),
                     mb(traffic(rs)), pm([100 * authors_pick(r)["acc_L1"] for r in d3])])
    return "\n".join([
        "FMNIST CNN, 100 clients (10% a round), 4:3:3 uncertain devices, 5 local epochs, 30 rounds; test accuracy (%) "
        "of the full model; Dir(0.6): mean ± std over seeds 0-2; \"authors' pick\": the round maximising avg + full, "
        "which the authors' code reports.", "",
        table(["method", "Dir(0.6): full, round 30", "Dir(0.6): full at the authors' pick",
               "Dir(0.6): avg of L1/M1/S1, round 30", "comm. waste (%)", "client traffic, 30 rounds (MB)",
               "Dir(0.3), seed 0: full at the authors' pick"], rows)])


def bf16() -> str:
    rows = []
    for name, prefix in (("fp32", "configs-quickstart"), ("bf16", "configs-quickstart-precisionbf16")):
        rs = runs("bf16-parity-quickstart", prefix)
        rows.append([name, pm(final(rs)), pm(best(rs)), " / ".join(f"{x:.2f}" for x in final(rs))])
    return "\n".join([
        "FedAvg at the quickstart setting (FMNIST Dir(0.6), 20 clients, 10 rounds), seeds 0-2, 2,000 test images; "
        "only `precision` differs.", "",
        table(["precision", "final acc. (%)", "best acc. (%)", "final, seeds 0 / 1 / 2 (%)"], rows)])


PAGES = {
    "shefl-fmnist-r30.md": shefl_r30,
    "shefl-fmnist-dir0.6-straggler-r30.md": straggler,
    "shefl-fmnist-dir0.1-ratio-r30.md": ratio,
    "shefl-calibration.md": calibration,
    "fens-fmnist.md": fens,
    "fens-fmnist-v1.md": fens_v1,
    "adaptivefl-fmnist-r30.md": adaptivefl,
    "bf16-parity-quickstart.md": bf16,
}


def render(page: Path, text: str) -> str:
    old = page.read_text()
    a, b = old.index(BEGIN) + len(BEGIN), old.index(END)
    return old[:a] + "\n" + text + "\n" + old[b:]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/summaries.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="only check that every page holds today's table")
    a = p.parse_args(argv)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    stale = []
    for name, make in PAGES.items():
        page = RES / name
        new = render(page, make())
        if new != page.read_text():
            stale.append(page)
            if not a.check:
                page.write_text(new)
                print(f"wrote {page.relative_to(ROOT)}")
    if a.check:
        for page in stale:
            print(f"{page.relative_to(ROOT)}: its summary table differs from the committed runs; run python scripts/summaries.py")
        return 1 if stale else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
