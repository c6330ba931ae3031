"""FENS voting under both competence rules, same members (docs/readings.md#fens-voting).

    python scripts/fens_voting_rule.py results/fens-fair/dir0.1/complete-e50-s1

Reads a finished FENS run (its metrics.json config and its saved ensemble.json), rebuilds every client's 10%
aggregator split and the server's test half exactly as the run does (``client_app._splits``, ``ServerEval``), and
scores polychotomous voting on the test half with the competence of each member measured

* (a) on its own client's 10% split, by the INT8 member (this project's rule; must reproduce the run's recorded
  ``static_aggregators_test_accuracy.voting``, checked with the run's other static aggregators);
* (b) on the union of every client's 10% split, INT8 members (the authors' rule, our members);
* (c) as (a) and (b) with the FP32 members (the authors' code votes with FP32 models).

With every class present in the union, the authors' normalisation of a row equals ours (their difference concerns
unseen classes only), so (b) with FP32 members is their rule. Logits go through the run's content-keyed cache
(``cached_logits``): the INT8 ones are usually those the run computed. Exits 1 when (a) misses the recorded value.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def voting_rules(run_dir: Path) -> dict:
    import numpy as np
    import torch
    from flwr.app import Context, RecordDict

    from hetfl.common.compression import quantize_state
    from hetfl.common.oneshot.artifacts import ENSEMBLE, load_ensemble
    from hetfl.common.oneshot.ensemble import build_members, cached_logits, states_digest
    from hetfl.common.results import load_metrics
    from hetfl.common.rundata import dataset_info, num_classes
    from hetfl.common.task import ServerEval, compute_options
    from hetfl.common.train import Normalizer, evaluate
    from hetfl.fens_app import PHASE1
    from hetfl.fens_app.aggregators import confusion_counts, make_aggregator
    from hetfl.fens_app.client_app import _splits
    from hetfl.fens_app.keys import FENSParams
    from hetfl.fens_app.server_app import server_logits, static_baselines
    from hetfl.methods import SCHEMA, validate

    t0 = time.perf_counter()
    torch.set_num_threads(1)  # as an in-process client (client-threads); the INT8 logits come from the cache anyway
    metrics = load_metrics(run_dir / "metrics.json", SCHEMA)
    cfg = validate(metrics["config"])
    if cfg["method"] != "fens":
        raise SystemExit(f"{run_dir}: a {cfg['method']!r} run; expected a FENS run")
    recorded = metrics["static_aggregators_test_accuracy"]
    nodes = int(metrics["federation"]["nodes"])  # the in-process engine: node i holds partition i of `nodes`
    p = FENSParams.from_config(cfg)
    ens = load_ensemble(run_dir / ENSEMBLE, PHASE1)
    M, C = len(ens.states), num_classes(cfg)
    member_of = {c: j for j, c in enumerate(ens.client_ids)}
    ev = ServerEval.of(cfg)
    norm = Normalizer(dataset_info(cfg))
    splits = []  # (client id, its 10% aggregator split), as the ClientApp's logits handler draws it
    for pid in range(nodes):
        ctx = Context(run_id=1, node_id=pid + 1, node_config={"partition-id": pid, "num-partitions": nodes},
                      state=RecordDict(), run_config=cfg)
        splits.append((pid, _splits(ctx, cfg, pid)[1]))

    def confusions(models: list, states: list) -> tuple[np.ndarray, np.ndarray]:
        """(own, union) confusion counts (M, C, C): each member on its client's split / on every client's split."""
        own, union = np.zeros((M, C, C), np.int64), np.zeros((M, C, C), np.int64)
        digest = states_digest(states)
        for pid, agg_data in splits:
            z = cached_logits(models, digest, agg_data, norm, cfg["cache-dir"], **compute_options(cfg)).x
            for i in range(M):
                union[i] += confusion_counts(z[:, i], agg_data.y, C)
            if pid in member_of:
                own[member_of[pid]] = confusion_counts(z[:, member_of[pid]], agg_data.y, C)
        return own, union

    def voting(confusion: np.ndarray, test_z) -> float:  # as static_baselines scores it
        return evaluate(make_aggregator("voting", M, C, confusion=confusion), test_z, torch.as_tensor,
                        device=ev.opts["device"])[1]

    out: dict = {"run": str(run_dir), "members": M, "clients": nodes, "recorded": recorded}
    sent = [quantize_state(s) for s in ens.states] if p.quantize else ens.states
    variants = [("INT8" if p.quantize else "FP32", sent, p.quantize)] + ([("FP32", ens.states, False)] if p.quantize else [])
    for label, states, quantized in variants:
        models = build_members(cfg, states, quantized)
        own, union = confusions(models, states)
        if quantized == p.quantize:  # the run's own members: its server's test logits and all its static aggregators
            test_z = server_logits(models, states, cfg, ev)[0]
            out["replayed"] = static_baselines(ens, own, test_z, cfg, ev)
        else:
            test_z = cached_logits(models, states_digest(states), ev.test, ev.norm, cfg["cache-dir"], ev.batch_size,
                                   **ev.opts)
        out[label] = {"own": voting(own, test_z), "union": voting(union, test_z),
                      "member_acc_mean": float((test_z.x.argmax(2) == test_z.y[:, None]).mean()),
                      "union_classes_missing": int((union.sum(axis=(0, 2)) == 0).sum()),
                      "own_classes_seen": [int(k) for k in (own.sum(axis=2) > 0).sum(axis=1)]}
    out["seconds"] = time.perf_counter() - t0
    return out


def main() -> int:
    ap = argparse.ArgumentParser(prog="python scripts/fens_voting_rule.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path, help="a finished FENS run directory (metrics.json + ensemble.json)")
    r = voting_rules(ap.parse_args().run_dir)
    rec, rep = r["recorded"], r["replayed"]
    ok = all(abs(rep[k] - rec[k]) < 1e-6 for k in rec)
    print(f"{r['run']}: {r['members']} members, {r['clients']} clients, {r['seconds']:.0f} s")
    print("static aggregators, recorded / replayed: " + ", ".join(f"{k} {100 * rec[k]:.2f} / {100 * rep[k]:.2f}"
                                                                 for k in rec) + (" (match)" if ok else " (MISMATCH)"))
    for label in ("INT8", "FP32"):
        if label in r:
            v = r[label]
            print(f"{label} members (mean test acc {100 * v['member_acc_mean']:.2f}%; own splits' classes seen "
                  f"{min(v['own_classes_seen'])}-{max(v['own_classes_seen'])}, classes missing from the union "
                  f"{v['union_classes_missing']}): voting own split {100 * v['own']:.2f}%, union {100 * v['union']:.2f}%,"
                  f" union - own {100 * (v['union'] - v['own']):+.2f} points")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
