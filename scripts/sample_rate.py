"""Local training work per round and its rate, from finished runs' metrics.json (docs/results/shefl-fmnist-r30.md#timing).

    python scripts/sample_rate.py docs/results/shefl-fmnist-dir0.6-r30/runs/*/metrics.json

For each round: sample-epochs trained = sum over the round's sampled clients of partition size x local epochs x
models trained (`shefl_app.keys.client_work`: each role's epochs; SHEFL's HPCs train all M models, every other
client one), with partition sizes from the project's
own partitioner; the rate divides it by the round's wall time (training, communication and evaluation). The machine
(CPU model, family/model ids, the instruction set PyTorch used) is printed where metrics.json records it.
Epoch-based runs only (local-steps = 0).
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hetfl.common.results import load_metrics  # noqa: E402
from hetfl.methods import SCHEMA  # noqa: E402
from hetfl.data.load import load_partition  # noqa: E402
from hetfl.data.spec import DataSpec  # noqa: E402
from hetfl.shefl_app.core import hpc_partitions  # noqa: E402
from hetfl.shefl_app.keys import client_work  # noqa: E402


def main(paths: list[str]) -> int:
    for f in paths:
        m = load_metrics(f, SCHEMA)
        cfg = m["config"]
        per_client = {role: client_work(cfg, role) for role in (True, False)}  # HPC / other: (epochs, models)
        if None in per_client.values():
            print(f"{Path(f).parent.name}: skipped (step-based local work)")
            continue
        n = cfg["min-available-nodes"]
        spec = DataSpec.from_config(cfg, n)
        sizes = [len(load_partition(spec, p).y) for p in range(n)]
        shefl = cfg["method"] == "shefl"
        hpc = hpc_partitions(n, cfg.get("shefl-hpc-fraction", 0.0), cfg["seed"]) if shefl else set()
        rounds = [r for r in m["rounds"] if r["round"] > 0]  # round 0 trains nothing
        work = [sum(sizes[c] * math.prod(per_client[c in hpc]) for c in r["clients"]) for r in rounds]
        rates = [w / r["round_s"] for w, r in zip(work, rounds, strict=True)]
        where = "; ".join(f"from round {h.get('from_round', 0)}: {h.get('cpu')} ({h.get('cpu_id', '')}, "
                          f"{h.get('torch_cpu_capability', '')})" for h in m.get("machines", []))
        print(f"{Path(f).parent.name}: sample-epochs/round {statistics.mean(work):.0f}, "
              f"sample-epochs/s {statistics.mean(rates):.0f}, s/round {m['summary']['mean_round_s']:.1f}, "
              f"machine {where or 'not recorded'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
