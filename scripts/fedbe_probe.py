"""Replay one FedBE round from a run's checkpoints and score every stage on the test set (docs/readings.md#fedbe).

    python scripts/fedbe_probe.py results/reproduce/shefl-fmnist-path4-r30/runs/fedbe-fmnist-path4-s0

A FedBE run keeps the tensor files of its last two rounds (docs/checkpoints.md). This loads the global model
saved after round r-1 (r = the last round), retrains round r's sampled clients (metrics.json `clients`) with the
run's seeds through the clients' own training call, averages them as Flower's FedAvg does, and runs FedBE's server
step (`fedbe_round`, the strategy's own code). It prints the test accuracy of the FedAvg mean before distillation,
of the client models, of the Gaussian samples, of the teacher (the members' mean softmax) and of the distilled
student, which must match the accuracy the run recorded for round r (the replay check); and, on the held-out
server set, the accuracy of the teacher's pseudo-labels and the student's agreement with them. The held-out
labels are read here only, for the diagnosis: the method never sees them.
Checkpoints are not committed (tens of MB a run), so this reads a local results directory. On the 2-core machine: 139 s
alone (path4 run), 11 min while sharing the cores with a training run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict  # noqa: E402
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402
from hetfl.baselines.fedbe import fedbe_round  # noqa: E402
from hetfl.baselines.params import FedBEParams  # noqa: E402
from hetfl.baselines.fedbe import server_inputs  # noqa: E402
from hetfl.common.results import load_metrics  # noqa: E402
from hetfl.methods import SCHEMA  # noqa: E402
from hetfl.data.load import load_partition  # noqa: E402
from hetfl.data.spec import DataSpec  # noqa: E402
from hetfl.common.task import compute_options, local_train, make_model, model_to_arrays, received_model
from hetfl.common.rundata import test_data
from hetfl.common.train import Normalizer, ensemble_metrics, evaluate, predict_proba  # noqa: E402


def main(run_dir: str) -> int:
    d = Path(run_dir)
    doc = load_metrics(d / "metrics.json", SCHEMA)
    cfg, last = doc["config"], doc["rounds"][-1]
    if cfg["method"] != "fedbe":
        print(f"{d}: method {cfg['method']!r}, expected 'fedbe'")
        return 1
    r = last["round"]
    prev = sorted(d.glob(f"checkpoint-r{r - 1:05d}-*.safetensors"))
    if not prev:
        print(f"{d}: no tensor file of round {r - 1} (checkpoint-r{r - 1:05d}-*.safetensors)")
        return 1
    global_arrays = ArrayRecord({k.split("/", 1)[1]: Array(v) for k, v in load_file(prev[0]).items() if k.startswith("arrays/")})
    # the federation size is not in the config; the reproduction runs as many SuperNodes as min-available-nodes.
    # A wrong size gives other partitions, which the replay check (student vs recorded accuracy) shows.
    n = cfg["min-available-nodes"]
    spec = DataSpec.from_config(cfg, n)
    threads = torch.get_num_threads()  # the ServerApp's; local_train sets the clients' `client-threads`
    replies, clients, weights = [], [], []
    for pid in sorted(last["clients"]):  # the strategy orders replies by client id
        model = received_model(cfg, global_arrays)
        data = load_partition(spec, pid, cfg["cache-dir"])
        res = local_train(model, data, cfg, r, seed_offset=pid)
        arrays = model_to_arrays(model)
        replies.append(RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": res.num_examples})}))
        clients.append({k: v.numpy() for k, v in arrays.items()})
        weights.append(float(res.num_examples))
    torch.set_num_threads(threads)
    mean = {k: v.numpy() for k, v in aggregate_arrayrecords(replies, "num-examples").items()}
    held, opts = server_inputs(cfg, FedBEParams.from_config(cfg))  # the server app's own; `held.y` is read below for the diagnosis only
    norm = Normalizer(cfg["dataset"])
    compute = compute_options(cfg, server=True)
    step = fedbe_round(lambda: make_model(cfg), mean, clients, weights, held.x, norm, cfg["fedbe-samples"], opts,
                       cfg["seed"], r, **compute)
    test = test_data(cfg)
    probs = predict_proba(step.members, test, norm, cfg["eval-batch-size"], **compute)
    _, teacher, accs = ensemble_metrics(probs, test.y)
    _, student = evaluate(step.student, test, norm, cfg["eval-batch-size"], **compute)
    k = len(clients)
    labels = step.targets.argmax(dim=1).numpy()
    fidelity = float(np.mean(predict_proba([step.student], held, norm, cfg["eval-batch-size"], **compute)[0]
                             .argmax(dim=1).numpy() == labels))
    pct = lambda xs: " ".join(f"{100 * x:.1f}" for x in xs)  # noqa: E731
    print(f"{d.name}, round {r} replayed from round {r - 1}'s global model (run recorded {100 * last['accuracy']:.2f}%)")
    print(f"  test accuracy: FedAvg mean {100 * accs[0]:.2f}% | teacher (mean softmax of {len(accs)}) "
          f"{100 * teacher:.2f}% | distilled student {100 * student:.2f}%")
    print(f"  clients ({k}): {pct(accs[1:k + 1])}% (mean {100 * np.mean(accs[1:k + 1]):.2f}); "
          f"Gaussian samples ({len(accs) - k - 1}): {pct(accs[k + 1:])}%")
    print(f"  held-out set ({len(held)} images): pseudo-label accuracy {100 * np.mean(labels == held.y):.2f}%, "
          f"student agrees with the pseudo-labels on {100 * fidelity:.2f}%")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
