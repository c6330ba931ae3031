"""Collect the authors' reported numbers from one run_authors.sh run into a JSON file.

    python tools/collect_results.py --run-dir runs/alpha0.1 --local NAME --logits DIR --agg NAME --size 20 \
        --out runs/alpha0.1/results.json [--meta k=v ...]

Their numbers (what their scripts write, accuracies in %):
  * per client: test accuracy of the local model they report (train_LocalSGD.py evaluates `best_model`, the epoch
    with the best accuracy on the client's slice of the test half, on the test half: r<i>_n<size>_test.csv), and the
    per-epoch local validation accuracies (r<i>_n<size>_val.csv);
  * static aggregators (aggregations.py:evaluate_all_aggregations, run by rank 0 after local training on the FP32
    models, for the final-epoch models and for the best-epoch models): averaging, weighted_averaging, voting, and
    their two centralised trained baselines (linear_mapping, neural_networks, best test accuracy seen);
  * FENS: the FedAdam-trained SmallNN aggregator on the INT8 ensemble's logits, test accuracy every `evalafter`
    rounds and after the last round (aggregator r0_n<size>_test.csv): final and best.
Extras computed here (not printed by their code, marked "extra"): each member's INT8 test accuracy and INT8
averaging, from their saved test logits (logit_testset.pth), comparable to hetfl's member_test_accuracy.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle

import torch


def rows(path, header=True):
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        if header:
            next(f, None)
        for line in f:
            parts = line.strip().split(",")
            if len(parts) >= 2 and parts[0] != "":
                out.append([float(p) for p in parts])
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--run-dir", required=True)
    p.add_argument("--local", required=True, help="local_training/<name>")
    p.add_argument("--logits", required=True, help="logits dir")
    p.add_argument("--agg", required=True, help="aggregator/<name>")
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--out", required=True)
    p.add_argument("--meta", nargs="*", default=[])
    a = p.parse_args()
    n, C = a.size, a.num_classes
    res = {"meta": dict(kv.split("=", 1) for kv in a.meta)}
    timing = os.path.join(a.run_dir, "timing.txt")
    if os.path.exists(timing):
        res["timing_s"] = {}
        for line in open(timing):
            stage, wall, user, sys_ = line.split()
            res["timing_s"][stage] = {"wall": float(wall), "cpu_user": float(user), "cpu_sys": float(sys_)}

    clients = []
    for r in range(n):
        test = rows(os.path.join(a.local, f"r{r}_n{n}_test.csv"))
        val = rows(os.path.join(a.local, f"r{r}_n{n}_val.csv"))
        lab = os.path.join(a.local, f"{r}_label.pk")
        counts = pickle.load(open(lab, "rb")) if os.path.exists(lab) else None
        clients.append({"client": r,
                        "train_label_counts": [int(c) for c in counts] if counts is not None else None,
                        "test_acc_reported": test[-1][1] if test else None,
                        "local_val_acc_per_epoch": [v[1] for v in val]})
    res["per_client"] = clients

    agg_json = os.path.join(a.local, "0_agg_result.json")
    if os.path.exists(agg_json):
        d = json.load(open(agg_json))
        res["static_aggregators_fp32"] = {k: {m: 100.0 * v for m, v in d[k].items()} for k in d}

    curve = rows(os.path.join(a.agg, f"r0_n{n}_test.csv"))
    if curve:
        res["fens_nn"] = {"final_test_acc": curve[-1][1], "final_round": int(curve[-1][0]),
                          "best_test_acc": max(c[1] for c in curve),
                          "best_round": int(max(curve, key=lambda c: c[1])[0]),
                          "curve": [[int(c[0]), c[1]] for c in curve]}
        val = rows(os.path.join(a.agg, f"r0_n{n}_global_val.csv"), header=False)  # validation half (--val_set); no header
        if val:
            i = max(range(len(val)), key=lambda j: val[j][1])  # first round with the best validation accuracy
            res["fens_nn"]["val_curve"] = [[int(v[0]), v[1]] for v in val]
            res["fens_nn"]["test_acc_at_best_val"] = {"round": int(val[i][0]), "val_acc": val[i][1],
                                                      "test_acc": dict((int(c[0]), c[1]) for c in curve).get(int(val[i][0]))}

    tl = os.path.join(a.logits, "logit_testset.pth")
    if os.path.exists(tl):
        data = torch.load(tl)
        X = torch.stack([x for x, _ in data]).view(-1, n, C)
        y = torch.stack([torch.as_tensor(t) for _, t in data]).view(-1)
        member = (X.argmax(2) == y[:, None]).float().mean(0) * 100
        res["extra_int8"] = {"member_test_acc": member.tolist(),
                             "averaging": float((X.mean(1).argmax(1) == y).float().mean() * 100),
                             "test_rows": int(len(y))}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    json.dump(res, open(a.out, "w"), indent=1)
    summ = {"fens_nn": {k: v for k, v in res.get("fens_nn", {}).items() if not k.endswith("curve")},
            "static_fp32": res.get("static_aggregators_fp32"),
            "clients_test_acc_reported": [c["test_acc_reported"] for c in clients]}
    print(json.dumps(summ, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
