"""Alg. 1's selection against simulated uncertain devices, without training (docs/readings.md#adaptivefl-rewards).

Every round plans K jobs with `core.plan_round`, the strategy's own planner (a random pool member per slot,
or always L1 for +Greed, then ClientSel), draws each chosen client's capacity for the request
(`core.request_capacity`, as the client does) and feeds the pool index that fits back into the tables, as
the strategy does with real replies. It answers how fast the RL tables
learn and how many full models come back per round, which a training run cannot show cheaply:

    python -m hetfl.adaptivefl_app.simulate --seeds 0 1 2 --windows 30 100 300
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from . import core
from .core import ClientSelector, SubmodelPool

MODES = ("rl", "curiosity", "resource", "random", "greed")


def simulate_selection(pool: SubmodelPool, mode: str = "rl", rounds: int = 300, seed: int = 0, k: int = 10,
                       clients: int = 100, proportions: Sequence[float] = (4, 3, 3)) -> list[dict[str, int]]:
    """Per round: params sent and returned, and how many L1 were sent, sent to strong devices and returned as L1.

    Parameters
    ----------
    mode : one of MODES; "greed" is random selection with L1 always dispatched (+Greed).
    k : clients per round; `clients` devices in tiers by `proportions` (weak:medium:strong).
    """
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}; expected one of {MODES}")
    tiers = core.assign_tiers(clients, proportions, seed)
    caps = core.tier_capacities(pool)
    sel = ClientSelector(pool, "random" if mode == "greed" else mode, seed)
    rng = core.planning_rng(seed)  # the strategy's planning stream
    rows = []
    for r in range(1, rounds + 1):
        row = dict.fromkeys(("sent", "back", "l1_sent", "l1_strong", "l1_back"), 0)
        jobs = core.plan_round(pool, sel, rng, range(clients), k, "largest" if mode == "greed" else "random")
        for c, m in jobs:  # as the strategy: plan the whole round, then update the tables with the replies
            b = pool.fit(m, core.request_capacity(caps[tiers[c]], seed, r, c))
            sel.update(c, m, b)
            row["sent"] += pool[m].size
            row["back"] += 0 if b is None else pool[b].size
            if m == pool.largest:
                row["l1_sent"] += 1
                row["l1_strong"] += tiers[c] == "strong"
                row["l1_back"] += b == m
        rows.append(row)
    return rows


def summarize(rows: list[dict[str, int]]) -> dict[str, float]:
    """Waste rate (Sec. 4), share of L1 sent to strong devices, L1 sent and returned per round."""
    tot = {key: sum(r[key] for r in rows) for key in rows[0]}
    return {"waste": core.waste_rate([tot["sent"]], [tot["back"]]),
            "l1_to_strong": tot["l1_strong"] / tot["l1_sent"] if tot["l1_sent"] else float("nan"),
            "l1_sent_per_round": tot["l1_sent"] / len(rows), "l1_back_per_round": tot["l1_back"] / len(rows)}


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="cnn", help="pool model (cnn: FMNIST 1x28x28; vgg16 / resnet18: 3x32x32)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--modes", nargs="+", default=["rl", "random", "greed"], choices=MODES)
    p.add_argument("--windows", nargs="+", type=int, default=[30, 100, 300], help="round windows ending here")
    a = p.parse_args(argv)
    pool = SubmodelPool(a.model, 10, (1, 28, 28) if a.model == "cnn" else (3, 32, 32))
    print("| mode | rounds | waste (%) | L1 sent to strong (%) | L1 sent / round | L1 returned / round |")
    print("| --- | --- | --- | --- | --- | --- |")
    for mode in a.modes:
        runs = [simulate_selection(pool, mode, max(a.windows), seed) for seed in a.seeds]
        for lo, hi in zip([0, *a.windows], a.windows, strict=False):
            s = summarize([r for run in runs for r in run[lo:hi]])
            print(f"| {mode} | {lo + 1}-{hi} | {100 * s['waste']:.1f} | {100 * s['l1_to_strong']:.0f} | "
                  f"{s['l1_sent_per_round']:.2f} | {s['l1_back_per_round']:.2f} |")


if __name__ == "__main__":
    main()
