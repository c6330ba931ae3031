"""The ceiling of FENS's federated aggregator: the same network trained centrally on the pooled aggregator splits.

    python scripts/fens_upper_bound.py results/fens-fair/dir0.1/base [--nodes 20] [--epochs 300]

Reads a FENS run (its metrics.json config and its saved ensemble.json), rebuilds every client's 10% aggregator split
exactly as the ClientApp does, computes the INT8 ensemble's logits on them (what the clients cache), pools them and
trains the run's aggregator (same class, width and seeded initialisation) with Adam (lr 1e-3, batch 128) for up to
``--epochs`` epochs, keeping the epoch of best accuracy on the validation half of the server's evaluation set and
scoring it once on the test half. No data leaves what a FENS client would see, except that it is pooled.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def upper_bound(run_dir: Path, nodes: int, epochs: int = 300, lr: float = 1e-3, batch_size: int = 128,
                patience: int = 30) -> dict:
    import numpy as np
    import torch
    from flwr.app import Context, RecordDict

    from hetfl.common.compression import quantize_state
    from hetfl.methods import validate
    from hetfl.data.arrays import ArrayData
    from hetfl.common.rundata import eval_splits, num_classes
    from hetfl.common.train import Normalizer, evaluate
    from hetfl.fens_app.aggregators import make_aggregator
    from hetfl.common.oneshot.artifacts import ENSEMBLE, load_ensemble
    from hetfl.common.oneshot.ensemble import build_members, ensemble_logits
    from hetfl.fens_app.client_app import _splits
    from hetfl.fens_app.keys import FENSParams

    t0 = time.perf_counter()
    cfg = validate({k: v for k, v in json.loads((run_dir / "metrics.json").read_text())["config"].items()})
    p = FENSParams.from_config(cfg)
    ens = load_ensemble(run_dir / ENSEMBLE)
    sent = [quantize_state(s) for s in ens.states] if p.quantize else ens.states
    members = build_members(cfg, sent, p.quantize)
    norm = Normalizer(cfg["dataset"])
    zs, ys = [], []
    for pid in range(nodes):  # the clients' aggregator splits, as the ClientApp draws them
        ctx = Context(run_id=1, node_id=pid + 1, node_config={"partition-id": pid, "num-partitions": nodes},
                      state=RecordDict(), run_config=cfg)
        agg_data = _splits(ctx, cfg, pid)[1]
        zs.append(ensemble_logits(members, agg_data, norm, cfg["eval-batch-size"]))
        ys.append(agg_data.y)
    train_z = ArrayData(np.concatenate(zs), np.concatenate(ys))
    val, test = eval_splits(cfg)
    val_z = ArrayData(ensemble_logits(members, val, norm, cfg["eval-batch-size"]), val.y)
    test_z = ArrayData(ensemble_logits(members, test, norm, cfg["eval-batch-size"]), test.y)
    M, C = len(members), num_classes(cfg)
    agg = make_aggregator(p.aggregator, M, C, p.aggregator_hidden, label_counts=ens.label_counts,
                          init=p.aggregator_init, seed=cfg["seed"])
    opt = torch.optim.Adam(agg.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(cfg["seed"])
    x, y = torch.as_tensor(train_z.x), torch.as_tensor(train_z.y)
    best = (-1.0, -1, None)
    for epoch in range(epochs):
        agg.train()
        for idx in torch.randperm(len(y), generator=gen).split(batch_size):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(agg(x[idx]), y[idx]).backward()
            opt.step()
        acc = evaluate(agg, val_z, torch.as_tensor)[1]
        if acc > best[0]:
            best = (acc, epoch, {k: v.clone() for k, v in agg.state_dict().items()})
        elif epoch - best[1] >= patience:
            break
    agg.load_state_dict(best[2])
    return {"aggregator": p.aggregator, "train_rows": int(len(y)), "epochs_run": epoch + 1, "best_epoch": best[1] + 1,
            "val_accuracy": float(best[0]), "test_accuracy": float(evaluate(agg, test_z, torch.as_tensor)[1]),
            "optimizer": f"Adam lr {lr}, batch {batch_size}, patience {patience} epochs on the validation half",
            "seconds": time.perf_counter() - t0}


def main() -> int:
    p = argparse.ArgumentParser(prog="python scripts/fens_upper_bound.py", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path, help="a FENS run directory (metrics.json + ensemble.json)")
    p.add_argument("--nodes", type=int, default=20, help="the run's clients")
    p.add_argument("--epochs", type=int, default=300)
    a = p.parse_args()
    print(json.dumps(upper_bound(a.run_dir, a.nodes, a.epochs), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
