"""Own image folders on devices, one device holding a subset of the classes: the labels trial (docs/node-data.md#labels).

    python scripts/labels_trial.py --out /tmp/labels-trial [--subset] [--rounds 5]

Writes Fashion-MNIST as PNG image folders named after its classes: the server's evaluation folder (1,000 test
images) and three devices (1,500 training images each, Dirichlet-free: device 0 and 1 hold all ten classes, device 2
with --subset only coat, bag, sandal and trouser), starts a real SuperLink and 3 SuperNodes on this machine (one
`data-path` each), runs FedAvg with ``dataset = "dir:<server folder>"`` and prints the final accuracy. Run it with and
without --subset, on this code and on an older checkout, to see what matching classes by name changes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

NAMES = ["T-shirt_top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


def folders(out: Path, subset: bool, seed: int = 0) -> tuple[Path, list[Path]]:
    from PIL import Image

    from hetfl.data.load import local_arrays

    train, test = local_arrays("fashion_mnist")
    rng = np.random.default_rng(seed)

    def write(root: Path, x: np.ndarray, y: np.ndarray) -> Path:
        for k in np.unique(y):
            (root / NAMES[k]).mkdir(parents=True, exist_ok=True)
        for i, (img, k) in enumerate(zip(x, y)):
            Image.fromarray(img[0]).save(root / NAMES[k] / f"{i:05d}.png")
        return root

    server = write(out / "server", test.x[:1000], test.y[:1000])
    idx = rng.permutation(len(train.y))
    devices = []
    for d in range(3):
        take = idx[d * 6000:(d + 1) * 6000]
        if subset and d == 2:
            take = take[np.isin(train.y[take], [4, 8, 5, 1])]
        take = take[:1500]
        devices.append(write(out / f"device-{d}", train.x[take], train.y[take]))
    return server, devices


def main() -> int:
    p = argparse.ArgumentParser(prog="python scripts/labels_trial.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--subset", action="store_true", help="device 2 holds 4 of the 10 classes")
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    from hetfl import cluster

    server, devices = folders(a.out, a.subset)
    configs = [{"client-id": i, "data-path": str(d)} for i, d in enumerate(devices)]
    over = {"dataset": f"dir:{server}", "server-data-path": str(server), "num-classes": 10, "model": "cnn",
            "batch-size": 32, "lr": 0.05, "momentum": 0.9, "fraction-train": 1.0, "local-steps": 30,
            "num-server-rounds": a.rounds, "round-timeout": 600.0, "run-name": "subset" if a.subset else "all"}
    with cluster.local_cluster(3, a.out / "flwr", configs=configs) as c:
        run_dir = cluster.submit(c, None, over, results_dir=a.out / "results", timeout=1800)
    m = json.loads((run_dir / "metrics.json").read_text())
    print(json.dumps({"subset": a.subset, "final_accuracy": m["rounds"][-1]["accuracy"],
                      "per_round": [round(r["accuracy"], 4) for r in m["rounds"]],
                      "failures": [r["failures"] for r in m["rounds"]]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
